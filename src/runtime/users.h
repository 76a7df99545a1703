// Users and groups of a root file system (its /etc/passwd and /etc/group),
// for --user and the policy's run_as_user.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace openshell::runtime {

struct ResolvedUser {
  uint32_t uid;
  uint32_t gid;
  std::string name;   // empty for a bare number not in passwd
  std::string home;   // "/" when unknown
  std::string shell;  // its login shell; "" when unknown
};

// "1000", "1000:1000", "sandbox", "sandbox:staff", "1000:staff" against the
// text of passwd and group files. A number need not be listed; a name must.
// Throws Error naming what was not found.
ResolvedUser resolve_user(std::string_view spec, std::string_view passwd, std::string_view group,
                          const std::string& where);

// Reads <root>/etc/passwd and <root>/etc/group (missing files are empty)
// inside root, as files::read_in_root does: an untrusted root's symlinks
// never lead to the host's files, and a file over 4 MiB is an Error.
ResolvedUser resolve_user_in_root(std::string_view spec, const std::string& root);

// Whether the user part of spec is root once resolved in passwd's text: by
// its number ("0", "00", "0000"), as "root", or as a name that passwd maps to
// uid 0 ("toor:x:0:0:..."). An image whose User names root runs as the
// default sandbox user instead: a sandbox's process is never root unless the
// caller says so.
bool names_root(std::string_view spec, std::string_view passwd);

}  // namespace openshell::runtime
