#include "supervisor/exec_request.h"

#include "base/error.h"

namespace openshell::supervisor {

runtime::ExecRequest exec_request(const protocol::exec::Start& start, uint64_t id,
                                  const ExecDefaults& sandbox) {
  runtime::ExecRequest request;
  request.id = id;
  request.tty = start.tty;
  request.rows = start.rows;
  request.cols = start.cols;
  request.workdir = start.workdir.value_or(sandbox.workdir);
  request.argv = start.argv;
  if (start.user) {
    if (!sandbox.resolve_user) throw Error("--user " + *start.user + ": not in this sandbox");
    request.user = sandbox.resolve_user(*start.user);
  }
  // The sandbox's environment, then the caller's additions.
  request.env = sandbox.env;
  for (const auto& entry : start.env) {
    std::string key = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (auto& existing : request.env)
      if (existing.compare(0, key.size() + 1, key + "=") == 0) existing = entry, replaced = true;
    if (!replaced) request.env.push_back(entry);
  }
  return request;
}

}  // namespace openshell::supervisor
