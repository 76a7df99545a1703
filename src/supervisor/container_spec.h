// From a sandbox's spec to the runtime's container spec: its root and
// workspace, user, environment, limits and policy.
#pragma once

#include <string>

#include "base/paths.h"
#include "base/sandbox_spec.h"
#include "runtime/spec.h"

namespace openshell::supervisor {

inline constexpr const char* kWorkspace = "/sandbox";
inline constexpr const char* kProxyUrl = "http://127.0.0.1:3128";

// A sandbox with storage "copy" gets its root as a copy of its image (or
// directory) before its first start: sandboxes/<id>/rootfs, kept across
// stops and starts like a writable layer. Nothing to do otherwise, or when
// the copy is there. Throws Error.
void prepare_root(const SandboxSpec& spec, const std::string& sandbox_id, const Paths& paths);

// Throws Error (a bad policy, an unknown user...).
runtime::ContainerSpec container_spec_for(const SandboxSpec& spec, const std::string& sandbox_id,
                                          const std::string& sandbox_name, const Paths& paths);

}  // namespace openshell::supervisor
