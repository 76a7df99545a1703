#include "gateway/principal.h"

#include <pwd.h>

#include <vector>

namespace openshell::gateway {

std::string user_name(uid_t uid) {
  std::vector<char> buf(16384);
  passwd entry{};
  passwd* found = nullptr;
  if (::getpwuid_r(uid, &entry, buf.data(), buf.size(), &found) == 0 && found)
    return found->pw_name;
  return "uid-" + std::to_string(uid);
}

Principal principal_of(const net::PeerCredentials& peer, uid_t gateway_euid) {
  Principal p;
  switch (peer.transport) {
    case net::PeerCredentials::Transport::kUnix:
      p.name = user_name(peer.uid);
      p.admin = peer.uid == 0 || peer.uid == gateway_euid;
      p.transport = "unix";
      p.unix_peer = true;
      p.uid = peer.uid;
      p.gid = peer.gid;
      break;
    case net::PeerCredentials::Transport::kTls:
      p.name = peer.subject;
      p.admin = peer.admin;
      p.transport = "tls";
      break;
    case net::PeerCredentials::Transport::kTcp:
      p.name = user_name(gateway_euid);
      p.admin = false;
      p.transport = "tcp";
      break;
  }
  return p;
}

std::string effective_owner(const std::string& stored_owner, uid_t gateway_euid) {
  return stored_owner.empty() ? user_name(gateway_euid) : stored_owner;
}

}  // namespace openshell::gateway
