// Extra CA certificates for a sandbox (`sandbox create --ca-cert FILE`): the
// sandbox's system bundle is its root's own with them added, mounted
// read-only over the root's file, and the usual variables point at it.
#pragma once

#include <string>
#include <vector>

namespace openshell::spec {

// Where the bundle is in the sandbox, and what the variables name.
inline constexpr const char* kCaBundle = "/etc/ssl/certs/ca-certificates.crt";

// The variables that point programs at the bundle: SSL_CERT_FILE (OpenSSL,
// Python's ssl), REQUESTS_CA_BUNDLE (requests, pip), NODE_EXTRA_CA_CERTS
// (Node.js), GIT_SSL_CAINFO (git).
std::vector<std::string> ca_bundle_env();

// The certificates of a PEM text, each written out again as PEM; an Error
// naming `source` when it holds none, or something else than certificates:
// "--ca-cert FILE: not a PEM certificate (...)".
std::string pem_certificates(const std::string& text, const std::string& source);

// Reads a file for --ca-cert and checks it as above.
std::string read_ca_cert(const std::string& path);

// The bundle: `base` (the root's own, may be empty) and the certificates,
// each after a line naming where they come from.
std::string ca_bundle(const std::string& base, const std::vector<std::string>& certs);

}  // namespace openshell::spec
