// The pieces of making an X.509 certificate with OpenSSL that the gateway's
// certificates (auth/certs.h) and a sandbox's CA (egress/tls.h) share.
#pragma once

#include <string>

#include <openssl/x509.h>

namespace openshell::x509 {

// Throws Error "what: OpenSSL's reason" (its error queue's first entry,
// which is then cleared).
[[noreturn]] void fail(const std::string& what);

// Adds the extension `nid` with its config text ("CA:TRUE,pathlen:0"),
// issuer and subject as the extension needs them. Throws via fail().
void add_extension(X509* cert, X509* issuer, int nid, const std::string& value);

// Adds FIELD=value (UTF-8) to a name. Throws via fail().
void add_name_entry(X509_NAME* name, const char* field, const std::string& value);

}  // namespace openshell::x509
