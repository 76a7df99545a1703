// The gateway's TLS certificates (OpenSSL): a CA of its own, the server's
// certificate, and client certificates whose subject is a principal.
//
// The set in a directory (`openshell gateway generate-certs`): ca.crt,
// ca.key, server.crt, server.key, client.crt, client.key, PEM, every key
// ECDSA P-256 and mode 0600, the directory 0700. Subjects: CN=<principal>,
// O=openshell, and OU=admin on an admin's certificate. The server's
// certificate names localhost, 127.0.0.1 and ::1, and the names and
// addresses asked for. The first client certificate is the owner's (the
// user who made the set) and an admin's.
#pragma once

#include <string>
#include <vector>

namespace openshell::auth {

// The files of a complete set, in the order they are listed.
const std::vector<std::string>& cert_set_files();

struct CertSetOptions {
  std::string dir;
  std::vector<std::string> server_sans;  // DNS names or IP addresses, beyond the defaults
  bool force = false;                    // replace whatever is there
  std::string owner;                     // the first client's name (CN)
};

struct CertSetResult {
  bool made = false;               // false: a complete set was there and is left alone
  std::vector<std::string> found;  // the files of the set that were there before
};

// Makes the set in options.dir. A complete set is left alone (made false);
// a partial one is refused, naming the files missing, unless options.force.
// Throws Error.
CertSetResult generate_cert_set(const CertSetOptions& options);

struct ClientCertOptions {
  std::string ca_dir;   // holds ca.crt and ca.key
  std::string out_dir;  // gets client.crt, client.key and a copy of ca.crt
  std::string name;     // the principal (CN)
  bool admin = false;   // OU=admin
  bool force = false;   // replace a certificate already in out_dir
};

// Issues a client certificate signed by the CA of ca_dir. Throws Error.
void issue_client_cert(const ClientCertOptions& options);

// What a client certificate says of itself, for `gateway info`.
struct CertSummary {
  std::string common_name;
  bool admin = false;     // OU=admin
  std::string not_after;  // "2029-03-05T12:00:00Z"
  bool expired = false;
};
// Throws Error naming the file when it is no PEM certificate.
CertSummary summarize_cert(const std::string& path);

// A principal's name as it goes into a certificate: 1 to 64 of letters,
// digits, '.', '_', '-' and '@', not starting with '-' or '.'. Throws Error.
void check_principal_name(const std::string& name);

// The user name of a uid from passwd; "uid-N" when it has none.
std::string principal_of_uid(unsigned uid);

}  // namespace openshell::auth
