// Where Linux distributions keep their CA bundle (one PEM file of every
// trusted root). A static binary cannot rely on OpenSSL's compiled-in
// directory existing on the host, so the host's store is the first of these
// that it has.
#pragma once

#include <unistd.h>

#include <string>

namespace openshell::ca_bundles {

inline constexpr const char* kPaths[] = {
    "/etc/ssl/certs/ca-certificates.crt",                 // Debian, Ubuntu, Arch, Alpine
    "/etc/pki/tls/certs/ca-bundle.crt",                   // Fedora, RHEL
    "/etc/ssl/ca-bundle.pem",                             // openSUSE
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  // Fedora, CentOS, RHEL
    "/etc/ssl/cert.pem",                                  // Alpine
};

// The host's bundle: the first of kPaths it can read; "" when none.
inline std::string host_path() {
  for (const char* path : kPaths)
    if (::access(path, R_OK) == 0) return path;
  return "";
}

}  // namespace openshell::ca_bundles
