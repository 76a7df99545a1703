// Downloads and uploads of sandboxes that are not running: a copy
// supervisor each (supervisor/supervisor.h), one at a time.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "base/log.h"
#include "gateway/service.h"

namespace openshell::gateway {

bool Gateway::copy_in_progress(const std::string& id) const {
  if (copies_.count(id)) return true;
  // A copy supervisor that a gateway before us started holds the lock.
  UniqueFd lock(::open(paths_.copy_lock(id).c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!lock) return false;
  return ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
}

bool Gateway::wait_for_copy(const std::shared_ptr<net::Exchange>& exchange,
                            const SandboxRecord& record, const std::string& verb) {
  if (copies_.count(record.id)) {
    // Ours ends within moments of its copy (at most its idle time): the
    // request is answered as if it came then.
    copy_waiters_[record.id].push_back([this, exchange] { handle(exchange); });
    return true;
  }
  if (copy_in_progress(record.id))
    throw ApiError(409, "busy",
                   "a copy into or out of sandbox '" + record.name + "' is in progress (" + verb +
                       " waits for it: try again when it ends)");
  return false;
}

void Gateway::copy_exec(const Call& call, const SandboxRecord& record) {
  const std::shared_ptr<net::Exchange>& exchange = call.exchange;
  if (wait_for_copy(exchange, record, "another copy")) return;
  // The copy mounts the sandbox's binds, as a start does: the caller's
  // rights again.
  check_host_paths(call, SandboxSpec::from_json(record.spec));
  const std::string id = record.id, name = record.name;
  const std::string file = paths_.sandbox(id) + "/copy.cred";
  mint_launch_file(record, file);
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) throw_errno("pipe");
  UniqueFd report_read(report[0]), report_write(report[1]);
  const pid_t pid = spawn_supervisor(record, file, {"--copy"}, report_write.get());
  report_write.reset();
  copies_[id] = pid;
  // Its end frees the sandbox for a start, a delete or the next copy.
  int fd = pidfd_open(pid);
  if (fd >= 0) {
    auto exited = std::make_shared<asio::posix::stream_descriptor>(io_, fd);
    exited->async_wait(asio::posix::descriptor_base::wait_read,
                       [this, id, pid, exited](const boost::system::error_code& ec) {
                         if (ec) return;
                         int status;
                         ::waitpid(pid, &status, 0);
                         if (auto it = copies_.find(id); it != copies_.end() && it->second == pid)
                           copies_.erase(it);
                         auto waiting = std::move(copy_waiters_[id]);
                         copy_waiters_.erase(id);
                         for (auto& then : waiting) then();
                       });
  }
  // Its report: "ready" once its container runs and its socket listens.
  auto pipe = std::make_shared<asio::posix::stream_descriptor>(io_, report_read.release());
  auto text = std::make_shared<std::string>();
  auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::seconds(30));
  timer->async_wait([pid, pipe](const boost::system::error_code& ec) {
    if (ec) return;
    ::kill(pid, SIGKILL);
    boost::system::error_code ignored;
    pipe->close(ignored);
  });
  asio::async_read(
      *pipe, asio::dynamic_buffer(*text),
      [this, exchange, pipe, text, timer, id, name](const boost::system::error_code&, size_t) {
        timer->cancel();
        std::string line = text->substr(0, text->find('\n'));
        try {
          if (line == "ready") return hand_exec_over(exchange, paths_.copy_socket(id), name);
          if (line.rfind("error ", 0) == 0) {
            line.erase(0, 6);
            const bool busy = line.find("in progress") != std::string::npos;
            throw ApiError(busy ? 409 : 500, busy ? "busy" : "copy_failed",
                           "copy for sandbox '" + name + "': " + line);
          }
          throw ApiError(500, "copy_failed",
                         "copy for sandbox '" + name +
                             "': its supervisor ended without starting (see " + paths_.sandbox(id) +
                             "/logs/supervisor.log)");
        } catch (const ApiError& e) {
          exchange->respond(error_response(e.status, e.code, e.what()));
        }
      });
}

}  // namespace openshell::gateway
