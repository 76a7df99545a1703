// Who is asking: every API request's principal, from its connection's peer
// (net::PeerCredentials), and the rules of who may do what with a sandbox.
//
// - Unix socket: the peer uid's user name ("uid-N" when passwd has none).
//   Admin: uid 0, and the gateway's own user (whose gateway it is).
// - TLS: the client certificate's common name; admin when the certificate
//   was issued to an admin (organizational unit "admin").
// - Plain TCP (`--insecure-listen`, loopback only, opt-in): nobody is
//   authenticated there, so every such request is the gateway owner's
//   principal, but never an admin and never given host paths: whoever can
//   reach the port acts as the owner on the owner's sandboxes.
//
// So user "alice" is the same principal on the socket and with a
// certificate for "alice".
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/http.h"

namespace openshell::gateway {

struct Principal {
  std::string name;
  bool admin = false;
  std::string transport;  // "unix", "tls", "tcp"
  // kUnix: the peer's uid and gid (whose rights host paths are checked with).
  bool unix_peer = false;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The host's users and groups, read from /etc/passwd and /etc/group as
// files: NSS (getpwuid, getgrouplist) would load the host's shared
// libraries into this static binary, which crashes it.
//
// The user name of uid from passwd, or "uid-N".
std::string user_name(uid_t uid);
// The same from the text of a passwd file.
std::string user_name_in(std::string_view passwd, uid_t uid);
// The groups of the user (primary gid first, then every group that lists
// the user as a member), from the text of a group file.
std::vector<gid_t> groups_in(std::string_view group, const std::string& user, gid_t primary);
std::vector<gid_t> groups_of(uid_t uid, gid_t primary);
// The id of the group of this name in the text of a group file.
std::optional<gid_t> group_id_in(std::string_view group, const std::string& name);
std::optional<gid_t> group_id(const std::string& name);

// The principal of a request from this peer to a gateway running as
// gateway_euid.
Principal principal_of(const net::PeerCredentials& peer, uid_t gateway_euid);

// Whose a sandbox with this stored owner is: "" (a sandbox made before
// sandboxes had owners) is the gateway owner's.
std::string effective_owner(const std::string& stored_owner, uid_t gateway_euid);

// Whether the principal may see and act on a sandbox of this owner.
inline bool may_touch(const Principal& who, const std::string& owner) {
  return who.admin || who.name == owner;
}

}  // namespace openshell::gateway
