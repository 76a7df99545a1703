// Capabilities: the sandbox runs with none, bounding set included, unless the
// caller adds some by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/child_failure.h"

namespace openshell::runtime::caps {

// Bit mask of capabilities; bit N is capability N.
using Set = uint64_t;

// "NET_ADMIN", "cap_net_admin", "ALL" -> mask. Throws Error naming a bad one.
Set parse(const std::vector<std::string>& names);

// "CAP_NET_ADMIN,CAP_SYS_PTRACE"
std::string describe(Set set);

// The highest capability the running kernel knows.
int last_cap();

// What an init that starts processes as other ids keeps for itself (see
// ContainerSpec::exec_as_others).
inline constexpr Set kInitOnly = (Set{1} << 6) | (Set{1} << 7);  // CAP_SETGID, CAP_SETUID

// Child side, step 0 (still privileged, before drop_bounding): adds `set` to
// the inheritable set, so that set_final can keep it though the bounding
// set no longer holds it.
bool add_inheritable(Set set, ChildFailure* failure) noexcept;

// Child side, step 1 (still privileged): drops every capability outside keep
// from the bounding set, and asks to keep permitted ones across setuid.
bool drop_bounding(Set keep, int last_cap, ChildFailure* failure) noexcept;

// Child side, step 2 (after setuid): permitted = effective = inheritable =
// keep, and keep raised into the ambient set so that it survives exec for a
// non-root user.
bool set_final(Set keep, int last_cap, ChildFailure* failure) noexcept;

}  // namespace openshell::runtime::caps
