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

// Throws Error (a bad policy, an unknown user...).
runtime::ContainerSpec container_spec_for(const SandboxSpec& spec, const std::string& sandbox_id,
                                          const std::string& sandbox_name, const Paths& paths);

}  // namespace openshell::supervisor
