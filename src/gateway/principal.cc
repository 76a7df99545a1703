#include "gateway/principal.h"

#include <algorithm>

#include "base/files.h"
#include "base/text.h"

namespace openshell::gateway {

std::string user_name_in(std::string_view passwd, uid_t uid) {
  const std::string number = std::to_string(uid);
  for (const auto& line : text::split(passwd, '\n')) {
    auto fields = text::split(line, ':');
    if (fields.size() >= 3 && !fields[0].empty() && fields[2] == number) return fields[0];
  }
  return "uid-" + number;
}

std::string user_name(uid_t uid) {
  return user_name_in(files::try_read("/etc/passwd").value_or(""), uid);
}

std::vector<gid_t> groups_in(std::string_view group, const std::string& user, gid_t primary) {
  std::vector<gid_t> groups = {primary};
  for (const auto& line : text::split(group, '\n')) {
    auto fields = text::split(line, ':');
    if (fields.size() < 4) continue;
    auto gid = text::parse_uint(fields[2], UINT32_MAX);
    if (!gid) continue;
    auto members = text::split(fields[3], ',');
    if (std::find(members.begin(), members.end(), user) != members.end() &&
        std::find(groups.begin(), groups.end(), static_cast<gid_t>(*gid)) == groups.end())
      groups.push_back(static_cast<gid_t>(*gid));
  }
  return groups;
}

std::vector<gid_t> groups_of(uid_t uid, gid_t primary) {
  const std::string name = user_name(uid);
  if (name.starts_with("uid-")) return {primary};
  return groups_in(files::try_read("/etc/group").value_or(""), name, primary);
}

std::optional<gid_t> group_id_in(std::string_view group, const std::string& name) {
  for (const auto& line : text::split(group, '\n')) {
    auto fields = text::split(line, ':');
    if (fields.size() < 3 || fields[0] != name) continue;
    if (auto gid = text::parse_uint(fields[2], UINT32_MAX)) return static_cast<gid_t>(*gid);
  }
  return std::nullopt;
}

std::optional<gid_t> group_id(const std::string& name) {
  return group_id_in(files::try_read("/etc/group").value_or(""), name);
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
