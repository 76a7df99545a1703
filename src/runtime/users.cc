#include "runtime/users.h"

#include "base/error.h"
#include "base/files.h"
#include "base/root_files.h"
#include "base/text.h"

namespace openshell::runtime {

namespace {

// passwd: name:x:uid:gid:gecos:home:shell; group: name:x:gid:members.
// A name matches the name field; a number matches the id field numerically
// ("01000" is 1000).
std::optional<std::vector<std::string>> find_entry(std::string_view text, std::string_view key,
                                                   size_t id_field, size_t min_fields) {
  auto number = text::parse_uint(key, 0xFFFFFFFE);
  for (const auto& raw : text::split(text, '\n')) {
    auto line = text::trim(raw);
    if (line.empty() || line[0] == '#') continue;
    auto fields = text::split(line, ':');
    if (fields.size() < min_fields) continue;
    if (number ? text::parse_uint(fields[id_field], 0xFFFFFFFE) == number : fields[0] == key)
      return fields;
  }
  return std::nullopt;
}

}  // namespace

ResolvedUser resolve_user(std::string_view spec, std::string_view passwd, std::string_view group,
                          const std::string& where) {
  std::string_view user_part = spec, group_part;
  if (auto colon = spec.find(':'); colon != std::string_view::npos) {
    user_part = spec.substr(0, colon);
    group_part = spec.substr(colon + 1);
    if (group_part.empty()) throw Error("user " + std::string(spec) + ": empty group");
  }
  if (user_part.empty()) throw Error("user " + std::string(spec) + ": empty user");

  ResolvedUser user{0, 0, "", "/", ""};
  auto entry = find_entry(passwd, user_part, 2, 7);
  if (auto number = text::parse_uint(user_part, 0xFFFFFFFE)) {
    user.uid = static_cast<uint32_t>(*number);
    user.gid = user.uid;
    if (entry) {
      user.name = (*entry)[0];
      user.gid =
          static_cast<uint32_t>(text::parse_uint((*entry)[3], 0xFFFFFFFE).value_or(user.uid));
      user.home = (*entry)[5].empty() ? "/" : (*entry)[5];
      user.shell = (*entry)[6];
    }
  } else {
    if (!entry)
      throw Error("user " + std::string(user_part) + ": no such user in " + where + "/etc/passwd");
    auto uid = text::parse_uint((*entry)[2], 0xFFFFFFFE);
    auto gid = text::parse_uint((*entry)[3], 0xFFFFFFFE);
    if (!uid || !gid) throw Error("user " + std::string(user_part) + ": malformed passwd entry");
    user = {static_cast<uint32_t>(*uid), static_cast<uint32_t>(*gid), (*entry)[0],
            (*entry)[5].empty() ? "/" : (*entry)[5], (*entry)[6]};
  }
  if (!group_part.empty()) {
    if (auto number = text::parse_uint(group_part, 0xFFFFFFFE)) {
      user.gid = static_cast<uint32_t>(*number);
    } else {
      auto g = find_entry(group, group_part, 2, 3);
      if (!g)
        throw Error("group " + std::string(group_part) + ": no such group in " + where +
                    "/etc/group");
      auto gid = text::parse_uint((*g)[2], 0xFFFFFFFE);
      if (!gid) throw Error("group " + std::string(group_part) + ": malformed group entry");
      user.gid = static_cast<uint32_t>(*gid);
    }
  }
  return user;
}

ResolvedUser resolve_user_in_root(std::string_view spec, const std::string& root) {
  std::string base = root == "/" ? "" : root;
  return resolve_user(spec, files::read_in_root(root, "etc/passwd").value_or(""),
                      files::read_in_root(root, "etc/group").value_or(""), base);
}

bool names_root(std::string_view spec, std::string_view passwd) {
  const std::string_view user_part = spec.substr(0, spec.find(':'));
  if (user_part == "root") return true;
  if (auto number = text::parse_uint(user_part, 0xFFFFFFFE)) return *number == 0;
  auto entry = find_entry(passwd, user_part, 2, 7);
  return entry && text::parse_uint((*entry)[2], 0xFFFFFFFE) == 0;
}

}  // namespace openshell::runtime
