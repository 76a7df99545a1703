#include "runtime/hooks.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/unique_fd.h"
#include "runtime/cleanup.h"

namespace openshell::runtime {

namespace {

constexpr const char* kOciVersion = "1.2.0";

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// One hook: "" when it exited 0, else why not.
std::string run_hook(const Hook& hook, const std::string& state) {
  const std::string shown = std::string(hook_stage_name(hook.stage)) + " hook " + hook.path;
  int in[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return errno_message(shown + ": pipe", errno);
  UniqueFd in_read(in[0]), in_write(in[1]);
  std::vector<std::string> args = hook.args;
  if (args.empty()) args.push_back(hook.path);
  std::vector<std::string> env = hook.env;
  std::vector<char*> argv = c_strings(args), envp = c_strings(env);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_read.get(), 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Default signal handling, whatever this process blocks (the runner
  // blocks the signals it forwards).
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  int err = ::posix_spawn(&pid, hook.path.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (err != 0) return errno_message(shown + ": start", err);
  in_read.reset();
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  // The state, then EOF; a hook that reads none of it is fine (SIGPIPE is
  // not ours to take: the write fails with EPIPE).
  {
    struct sigaction ignore {
    }, old{};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &old);
    (void)files::write_all(in_write.get(), state);
    ::sigaction(SIGPIPE, &old, nullptr);
  }
  in_write.reset();
  const int timeout_s = hook.timeout_s.value_or(kDefaultHookTimeoutS);
  bool timed_out = false;
  if (pidfd) {
    pollfd p{pidfd.get(), POLLIN, 0};
    int n;
    do n = ::poll(&p, 1, timeout_s * 1000);
    while (n < 0 && errno == EINTR);
    if (n == 0) {
      timed_out = true;
      ::kill(pid, SIGKILL);
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) return shown + ": still running after " + std::to_string(timeout_s) + " s, killed";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  if (WIFEXITED(status)) return shown + ": exited with " + std::to_string(WEXITSTATUS(status));
  return shown + ": killed by signal " + std::to_string(WTERMSIG(status));
}

}  // namespace

std::optional<HookStage> hook_stage(const std::string& name) {
  if (name == "createRuntime" || name == "prestart") return HookStage::kCreateRuntime;
  if (name == "createContainer") return HookStage::kCreateContainer;
  if (name == "startContainer") return HookStage::kStartContainer;
  if (name == "poststart") return HookStage::kPoststart;
  if (name == "poststop") return HookStage::kPoststop;
  return std::nullopt;
}

const char* hook_stage_name(HookStage stage) {
  switch (stage) {
    case HookStage::kCreateRuntime:
      return "createRuntime";
    case HookStage::kCreateContainer:
      return "createContainer";
    case HookStage::kStartContainer:
      return "startContainer";
    case HookStage::kPoststart:
      return "poststart";
    case HookStage::kPoststop:
      return "poststop";
  }
  return "?";
}

std::string hook_state_json(const std::string& id, const std::string& status, pid_t pid,
                            const std::string& bundle) {
  nlohmann::json state = {{"ociVersion", kOciVersion},
                          {"id", id},
                          {"status", status},
                          {"bundle", bundle},
                          {"annotations", nlohmann::json::object()}};
  if (pid > 0) state["pid"] = pid;
  return state.dump();
}

std::string run_hooks(const std::vector<Hook>& hooks, HookStage stage, const std::string& state) {
  for (const Hook& hook : hooks) {
    if (hook.stage != stage) continue;
    log::debug(std::string("running the ") + hook_stage_name(stage) + " hook " + hook.path);
    if (std::string why = run_hook(hook, state); !why.empty()) return why;
  }
  return "";
}

HookBundle& HookBundle::operator=(HookBundle&& other) noexcept {
  if (this != &other) {
    remove();
    dir_ = std::move(other.dir_);
    other.dir_.clear();
  }
  return *this;
}

HookBundle::~HookBundle() { remove(); }

void HookBundle::remove() noexcept {
  if (dir_.empty()) return;
  try {
    remove_tree(dir_);
  } catch (const std::exception& e) {
    log::warn(e.what());
  }
  dir_.clear();
}

HookBundle HookBundle::create(pid_t pid, const std::string& hostname) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp && tmp[0] == '/' ? tmp : "/tmp") + "/openshell-hooks-XXXXXX";
  if (!::mkdtemp(pattern.data())) throw_errno("create a bundle directory for the hooks " + pattern);
  HookBundle bundle;
  bundle.dir_ = pattern;
  nlohmann::json config = {
      {"ociVersion", kOciVersion},
      {"root", {{"path", "/proc/" + std::to_string(pid) + "/root"}, {"readonly", false}}},
      {"hostname", hostname}};
  files::write_atomically(bundle.dir_ + "/config.json", config.dump(2) + "\n", 0600);
  return bundle;
}

}  // namespace openshell::runtime
