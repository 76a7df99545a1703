// Who connected each socket of a sandbox, seen at connect(2) itself.
//
// The proxy's binaries rule looks at the processes that hold a client's
// socket, at accept and at the request. A process can hide from those looks:
// it sends its own copy of the socket to itself (SCM_RIGHTS, in flight in a
// socket pair, in no fd table) or hands it to a program the policy names and
// exits, and takes it back later. So the runtime also sends every connect(2)
// of the sandbox to a seccomp listener (runtime/seccomp.h), served here: for
// each, the socket is taken from the connecting process (pidfd_getfd), and
// when it is a TCP socket, its inode is recorded with the process, judged
// then by the crediting rules (identity.h). The kernel then performs the
// connect itself (SECCOMP_USER_NOTIF_FLAG_CONTINUE). The sockaddr's port is
// read only as a hint of whether the crediting rules are worth their cost: a
// process that changes it meanwhile gets a record that is never credited, so
// nothing it changes can mislead the decision towards allowing.
//
// Whatever fails, the connect goes on, only without a record; where a rule
// names binaries, the proxy refuses a connection whose connector it does
// not know.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/unique_fd.h"
#include "egress/identity.h"

namespace openshell::egress {

// Socket inode -> the process that connected it. Bounded: the oldest
// records go first beyond `capacity` records or `max_bytes` of them (the
// sandbox chooses its paths' lengths), and a record older than `lifetime`
// is gone (the proxy asks within milliseconds of the connect). Safe to use
// from several threads.
class ConnectLog {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kCapacity = 4096;
  static constexpr size_t kMaxBytes = 2 << 20;
  static constexpr std::chrono::seconds kLifetime{60};

  explicit ConnectLog(size_t capacity = kCapacity, Clock::duration lifetime = kLifetime,
                      size_t max_bytes = kMaxBytes)
      : capacity_(capacity), max_bytes_(max_bytes), lifetime_(lifetime) {}

  // A later connect of the same socket (after a failed one, or by another
  // process that holds it) adds its process to the record: each counts.
  // Beyond kMaxConnectors different ones, an unknown one stands for the rest.
  void record(uint64_t inode, Caller connector, Clock::time_point now = Clock::now());
  // The processes that connected that socket (none when it has no record),
  // taken out of the log.
  std::vector<Caller> take(uint64_t inode, Clock::time_point now = Clock::now());
  static constexpr size_t kMaxConnectors = 8;
  size_t size() const;
  size_t bytes() const;

 private:
  struct Entry {
    uint64_t inode;
    std::vector<Caller> connectors;
    Clock::time_point when;
    size_t bytes;
  };
  void expire(Clock::time_point now);
  void erase(std::list<Entry>::iterator entry);

  const size_t capacity_;
  const size_t max_bytes_;
  size_t bytes_ = 0;
  const Clock::duration lifetime_;
  mutable std::mutex mutex_;
  std::list<Entry> entries_;  // oldest first
  std::unordered_map<uint64_t, std::list<Entry>::iterator> by_inode_;
};

// Serves a sandbox's connect listener on a thread of its own, recording
// into `log`. When the kernel does not let this process take another's
// socket (pidfd_getfd refused: Yama's ptrace_scope 3, or an owner that is
// not the sandbox's), it says so once in the log and only answers the
// connects: active() is then false, and the proxy judges by the socket's
// holders alone, as without a listener.
class ConnectWatcher {
 public:
  // init_pid: the sandbox's PID 1, on which the kernel's consent is tried.
  // proxy_port: the proxy's; the crediting rules' reads are spent only on
  // connects whose address (as the process's memory says at the time)
  // names that port. Others are recorded as not examined, so that a
  // process that changes the address meanwhile is not credited. 0: every
  // connect is examined.
  ConnectWatcher(UniqueFd listener, pid_t init_pid, std::shared_ptr<ConnectLog> log,
                 uint16_t proxy_port = 0);
  ~ConnectWatcher();
  ConnectWatcher(const ConnectWatcher&) = delete;
  ConnectWatcher& operator=(const ConnectWatcher&) = delete;

  // Whether connects are recorded (else the proxy cannot ask for them).
  bool active() const { return active_; }
  // Whether connecting processes are judged by the crediting rules (their
  // environment and mappings read): only where a rule names binaries.
  void set_examine(bool examine) { examine_ = examine; }

  // Connects answered so far, and recorded among them (for tests).
  uint64_t answered() const { return answered_; }
  uint64_t recorded() const { return recorded_; }

 private:
  void loop();
  void handle();

  UniqueFd listener_;
  UniqueFd stop_;  // an eventfd
  std::shared_ptr<ConnectLog> log_;
  bool active_ = false;
  const uint16_t proxy_port_;
  std::atomic<bool> examine_{true};
  std::atomic<uint64_t> answered_{0}, recorded_{0};
  std::thread thread_;
};

}  // namespace openshell::egress
