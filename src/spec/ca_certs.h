// A sandbox's CA bundle: the host's roots, the sandbox's own CA (the one
// its egress proxy signs with, made afresh at each start by its
// supervisor; egress/tls.h) and the certificates of `sandbox create
// --ca-cert FILE`. It is mounted read-only over each of the bundle files
// its root has, and the usual variables point at it. A root with none gets
// it at kCaBundle only when --ca-cert asks for it (rootless, a missing
// mount point cannot always be made). Micro-VMs (spec.vm) get none yet.
#pragma once

#include <string>
#include <vector>

namespace openshell::spec {

// Where the bundle is in a root without one of its own.
inline constexpr const char* kCaBundle = "/etc/ssl/certs/ca-certificates.crt";

// The system bundles of images: Debian, Ubuntu and Alpine's
// ca-certificates, Alpine's own, Fedora's two.
inline constexpr const char* kCaBundlePaths[] = {
    kCaBundle,
    "/etc/ssl/cert.pem",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
};

// The variables that point programs at the bundle (at `path` in the
// sandbox): SSL_CERT_FILE (OpenSSL, Python's ssl), REQUESTS_CA_BUNDLE
// (requests, pip), CURL_CA_BUNDLE (curl), NODE_EXTRA_CA_CERTS (Node.js),
// GIT_SSL_CAINFO (git).
std::vector<std::string> ca_bundle_env(const std::string& path = kCaBundle);

// The certificates of a PEM text, each written out again as PEM; an Error
// naming `source` when it holds none, or something else than certificates:
// "--ca-cert FILE: not a PEM certificate (...)".
std::string pem_certificates(const std::string& text, const std::string& source);

// Reads a file for --ca-cert and checks it as above.
std::string read_ca_cert(const std::string& path);

// The line before the sandbox's own CA in its bundle.
inline constexpr const char* kSandboxCaLine = "# openshell: this sandbox's CA";

// The bundle: `base` (the host's, may be empty), the sandbox's CA (PEM, may
// be empty) and the certificates, each after a line naming where they come
// from.
std::string ca_bundle(const std::string& base, const std::vector<std::string>& certs,
                      const std::string& sandbox_ca = "");

}  // namespace openshell::spec
