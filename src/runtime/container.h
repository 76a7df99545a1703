// A running container: namespaces, mounts, limits and confinement set up by
// the runtime, with a small init as PID 1 that runs the main process.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <memory>
#include <string>

#include "base/unique_fd.h"
#include "namespaces/userns.h"
#include "runtime/cgroup.h"
#include "runtime/hooks.h"
#include "runtime/spec.h"

namespace openshell::runtime {

class Container {
 public:
  // Starts the container and returns once the main process has been
  // executed, or throws Error with the reason (exit code 125, or 126/127 when
  // the command cannot be executed or is not found).
  static std::unique_ptr<Container> start(const ContainerSpec& spec);

  Container(const Container&) = delete;
  Container& operator=(const Container&) = delete;
  // Kills what still runs, reaps it and removes the cgroups.
  ~Container();

  pid_t pid() const { return pid_; }  // the init, in the caller's pid namespace
  int pidfd() const { return pidfd_.get(); }
  // The pseudo-terminal's master side (spec.tty), else -1.
  int tty_master() const { return tty_master_.get(); }
  // The control channel to the init (runtime/init_protocol.h): exec more
  // processes in the sandbox, and hear of their exits.
  int control_fd() const { return control_.get(); }
  const namespaces::IdMap& id_map() const { return id_map_; }
  const CgroupSet& cgroups() const { return cgroups_; }
  // The cgroups outlive the container; their owner removes them (CgroupSet::keep).
  void keep_cgroups() noexcept { cgroups_.keep(); }

  // With spec.egress: the proxy's listening socket and the DNS stub's
  // socket, made inside the sandbox's network namespace (-1 otherwise). The
  // caller serves them (or closes them).
  UniqueFd take_proxy_listener() { return std::move(proxy_listener_); }
  UniqueFd take_dns_socket() { return std::move(dns_socket_); }
  // With spec.egress: a NETLINK_SOCK_DIAG socket of the sandbox's network
  // namespace, for the proxy to identify its callers (-1 when the kernel
  // gave none).
  UniqueFd take_diag_socket() { return std::move(diag_socket_); }
  // With spec.egress: the seccomp listener that hears every connect(2) of
  // the sandbox (runtime/seccomp.h), -1 when the kernel gave none. Each
  // connect waits until the holder answers: serve it at once (or close it).
  UniqueFd take_connect_listener() { return std::move(connect_listener_); }

  // Delivers a signal to the init, which passes it to the main process.
  void signal(int sig) const;
  // Blocks until the container ends; returns the main process's exit status
  // (its code, or 128+N for signal N). Removes the cgroups.
  int wait();
  // Non-blocking: the status if the container has ended.
  bool poll_exit(int* status);
  // Processes the kernel killed at the memory limit (known once ended).
  int oom_kills() const { return oom_kills_; }

 private:
  Container() = default;
  int finish(const siginfo_t& info);
  // The hooks of one stage, with the state of that moment: "" or the failure.
  std::string run_hooks(HookStage stage, const char* status) const;
  // The poststop hooks, once, after the end; then the bundle goes.
  void poststop() noexcept;

  pid_t pid_ = -1;
  UniqueFd pidfd_;
  UniqueFd tty_master_;
  UniqueFd lifeline_;  // closing it tells the init its owner is gone
  UniqueFd control_;
  UniqueFd proxy_listener_;
  UniqueFd dns_socket_;
  UniqueFd diag_socket_;
  UniqueFd connect_listener_;
  CgroupSet cgroups_;
  namespaces::IdMap id_map_;
  bool reaped_ = false;
  bool orphan_ = false;  // spec.orphan: not our child
  int status_ = 0;
  int oom_kills_ = 0;
  std::vector<Hook> hooks_;
  std::string hook_id_;  // the state's id: the cgroup name
  HookBundle bundle_;
  std::string hook_bundle_;  // spec.hook_bundle, else bundle_'s
  bool poststop_done_ = false;
};

}  // namespace openshell::runtime
