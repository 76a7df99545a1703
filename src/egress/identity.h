// Who opened a connection: from a TCP connection to the sandbox's proxy to
// the process and its executable. First the client socket's inode, asked of
// the kernel with NETLINK_SOCK_DIAG (one hash lookup for the exact 4-tuple,
// on a netlink socket made in the sandbox's network namespace), then the
// sandbox process whose /proc/PID/fd holds that socket.
//
// Without sock_diag (no netlink socket, or a kernel without inet_diag), the
// inode comes from /proc/INIT/net/tcp instead, which makes the kernel walk
// the whole TCP hash table of the namespace (shared with the host's unless
// net.ipv4.tcp_child_ehash_entries is set): milliseconds per connection.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/exe_credit.h"
#include "base/unique_fd.h"
#include "egress/rules.h"

namespace openshell::egress {

struct Caller {
  pid_t pid = 0;    // host pid; 0 when not found
  std::string exe;  // the executable as the sandbox sees it ("/usr/bin/curl"); "" when unknown
  // Why the process is not credited as `exe` ("" when it is): code from
  // elsewhere may run in it, so what it does is not what `exe` would do.
  std::string untrusted;
};

// Every process that holds one socket, as one search found them. A search
// reads a bounded number of /proc entries (processes and their fds): when
// the sandbox has more, it stops and says so, and the caller fails closed.
struct Holders {
  std::vector<Caller> processes;  // oldest first (in the order of the process tree)
  bool budget_exceeded = false;
  size_t entries = 0;  // /proc entries read
  // Every process of the sandbox the search saw, (pid, start time) in pid
  // order, when it saw them all: a later search of the same socket looks
  // only at these holders and at processes that are new since.
  std::vector<std::pair<pid_t, uint64_t>> seen;
  uint64_t inode = 0;  // the socket's; 0 when it was not found
  // The processes that connected the socket, as the runtime saw them at
  // connect(2) (connect_watch.h), when the search asked; none when unknown.
  std::vector<Caller> connectors;
};

// The fd and process entries one search may read: a few hundred
// milliseconds of a core at most (see docs/policy.md).
inline constexpr size_t kIdentityBudget = 100000;

// The rules for crediting a process as its executable: base/exe_credit.h
// (credit::), shared with the micro-VM's guest init.

// One end of a TCP connection.
struct TcpEnd {
  Address address;
  uint16_t port = 0;
};

// The inet_diag messages (linux/inet_diag.h), built and read here so that
// they can be tested without a kernel.
namespace sock_diag {

// A SOCK_DIAG_BY_FAMILY request (without NLM_F_DUMP) for the one TCP socket
// whose own end is `local` and whose peer is `remote`: the kernel looks it up
// in its hash table like an arriving packet. A listening socket is found with
// a remote of 0.0.0.0:0 (or [::]:0). Both ends must be of one family.
std::string exact_request(const TcpEnd& local, const TcpEnd& remote, uint32_t sequence);

struct Reply {
  enum class Kind {
    kFound,      // inode (0 for a socket no file holds: TIME_WAIT, orphaned) and uid
    kError,      // the kernel's NLMSG_ERROR: `error` is the errno (ENOENT: no such socket)
    kOther,      // another socket: the listener of the local end answers when no
                 // connection has that tuple (any more)
    kStale,      // the answer to another request (another sequence number)
    kMalformed,  // not an answer to that request: `why`
  };
  Kind kind = Kind::kMalformed;
  uint64_t inode = 0;
  uint32_t uid = 0;  // as the netlink socket's user namespace numbers it
  int error = 0;
  std::string why;
};

// The kernel's answer to exact_request(local, remote, sequence): one
// netlink message, an inet_diag_msg for that socket or an NLMSG_ERROR.
Reply parse_reply(std::string_view bytes, uint32_t sequence, const TcpEnd& local,
                  const TcpEnd& remote);

}  // namespace sock_diag

// Finds the callers of one sandbox's proxy; one per proxy, used on its
// thread only.
class CallerFinder {
 public:
  // init_pid: the sandbox's PID 1 (a host pid); only it and its descendants
  // are searched. diag_socket: a NETLINK_SOCK_DIAG socket made in the
  // sandbox's network namespace (it queries the namespace it was made in,
  // wherever it is used later), or none for the /proc fallback.
  CallerFinder(pid_t init_pid, UniqueFd diag_socket);

  // The client of the connection whose proxy-side socket has the local end
  // `proxy` and the peer `client`: the newest of its holders.
  Caller find(const TcpEnd& client, const TcpEnd& proxy);
  // Every process holding the client's socket, each judged by the crediting
  // rules above; at most `budget` /proc entries are read. With `since` (an
  // earlier complete search of the same socket), the fds of a process it
  // saw that did not hold the socket then are not read again: such a
  // process can hold it now only if a holder sent it (SCM_RIGHTS; pidfd_getfd
  // is refused), and a holder then was credited as a program the rule names
  // (or it sent the socket to itself, in flight in no fd table while the
  // first search ran: the process seen at connect(2) closes that gap, see
  // connect_watch.h).
  // Without `examine`, the crediting rules are not applied (their reads are
  // saved where no rule names binaries): each holder is then untrusted.
  Holders holders(const TcpEnd& client, const TcpEnd& proxy, size_t budget = kIdentityBudget,
                  const Holders* since = nullptr, bool examine = true);

  // Whether inodes come from sock_diag (until a query shows it cannot).
  // Safe to ask from another thread than the one that searches.
  bool uses_sock_diag() const { return sock_diag_.load(); }

 private:
  enum class Lookup {
    kFound,        // that socket
    kOther,        // no such socket, but sock_diag sees the namespace's sockets
    kGone,         // ENOENT: no such socket, or no inet_diag in the kernel
    kUnavailable,  // sock_diag failed
  };
  Lookup diag_inode(const TcpEnd& local, const TcpEnd& remote, uint64_t* inode, std::string* why);
  uint64_t inode_of(const TcpEnd& client, const TcpEnd& proxy);
  void give_up_sock_diag(const std::string& why);

  pid_t init_pid_;
  UniqueFd diag_;
  std::atomic<bool> sock_diag_{false};
  uint32_t sequence_ = 0;
  bool warned_ = false;
};

// One process (a host pid) as the crediting rules judge it; without
// `examine`, not judged (untrusted says so).
Caller examine_process(pid_t pid, bool examine = true);

// An absolute path inside the sandbox's root with its symlinks resolved there
// (as the kernel would for a process of the sandbox); the path itself when it
// cannot be resolved.
std::string resolve_in_sandbox(pid_t init_pid, const std::string& path);

}  // namespace openshell::egress
