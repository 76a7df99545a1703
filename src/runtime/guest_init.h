// The micro-VM's guest init: `openshell __guest-init`, PID 1 in the guest.
// It mounts /proc, /sys and /dev, the image's disk (read-only) and the
// sandbox's writable layer, an overlay of the two, moves into it, starts the
// main process and serves the host's requests on a vsock port.
//
// The channel is a byte stream (vsock carries no file descriptors), so the
// init's exec request (runtime/init_protocol.h's encode_exec) travels in a
// frame, and the command's stdin, stdout, stderr and exit travel beside it:
//
//   frame: TYPE (1 byte) LENGTH (4 bytes, big-endian, at most kMaxFrame) BYTES
//   host -> guest   exec (first, once: encode_exec's bytes), stdin, eof, kill,
//                   resize ("ROWS COLS", a terminal's new size)
//   guest -> host   started (the pid), stdout, stderr, then exited (the status,
//                   128+N for signal N) or failed (CODE "\n" MESSAGE) last
//
// An exec request with tty runs on a pseudo-terminal of its own (its
// controlling terminal, in a session of its own): stdout frames carry all
// the terminal shows (a terminal has one stream, no stderr frames), stdin
// frames are typed at it, eof types its end-of-file character, and resize
// sets its size. Without tty, resize does nothing.
//
// One connection is one command. serve_connection() is the whole server
// side of one, over any stream fd: the tests drive it over a socket pair.
//
// The init also keeps one connection to the host of its own, the status
// stream (to the host's status_port, text lines):
//
//   guest -> host   ready PID (the main process started; 0: there is none),
//                   exit STATUS (it ended: 128+N for signal N), or
//                   failed CODE REASON (it, or the guest, could not start)
//   host -> guest   stop GRACE_MS (SIGTERM to the main process's group,
//                   SIGKILL after GRACE_MS; then exit as above)
//
// and relays the sandbox's proxy connections and DNS queries to the host
// (runtime/guest_relay.h).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/caps.h"
#include "runtime/landlock.h"

namespace openshell::runtime::guest {

inline constexpr uint32_t kMaxFrame = 1024 * 1024;

enum class FrameType : uint8_t {
  kExec = 1,
  kStdin = 2,
  kEof = 3,
  kKill = 4,
  kResize = 5,
  kStarted = 16,
  kStdout = 17,
  kStderr = 18,
  kExited = 19,
  kFailed = 20,
};

struct Frame {
  FrameType type = FrameType::kExec;
  std::string bytes;
};

std::string encode_frame(FrameType type, std::string_view bytes);

// A resize frame's bytes ("ROWS COLS"), and back: nullopt for anything else.
std::string encode_size(uint16_t rows, uint16_t cols);
std::optional<std::pair<uint16_t, uint16_t>> decode_size(std::string_view bytes);

// Takes one whole frame off the front of *buffer. nullopt: more bytes are
// needed. Throws Error for a frame over kMaxFrame or of an unknown type.
std::optional<Frame> take_frame(std::string* buffer);

// The guest's configuration (/etc/openshell-guest.json in the initramfs).
struct Config {
  std::string disk;               // the image's disk ("/dev/vda"); empty: stay in the initramfs
  std::string layer;              // the writable layer ("/dev/vdb"); empty: a tmpfs upper layer
  std::vector<std::string> argv;  // the main process; empty: none
  std::vector<std::string> env;
  std::string workdir = "/";
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t port = 0;  // the vsock port served; 0: none
  // The host's vsock ports the init connects to; 0: none.
  uint32_t status_port = 0;  // the status stream
  uint32_t egress_port = 0;  // relayed from TCP 127.0.0.1:3128
  uint32_t dns_port = 0;     // relayed from UDP 127.0.0.1:53
  std::string hostname;      // the guest's, also in its /etc/hosts; empty: the kernel's
  // Landlock: the filesystem part of the sandbox's effective policy, as
  // policy::to_toml writes it (filesystem_policy and landlock), planned in
  // the guest for the guest kernel's ABI; empty: no Landlock, as for a
  // container whose effective policy has no filesystem part.
  std::string landlock_policy;
  bool landlock_warn_missing = true;  // say which of its paths the root lacks
  // Without a filesystem policy no Landlock rule covers /proc, where a
  // process could write another's memory: /proc is then read-only, as in a
  // container (spec::container_spec_for's fs.proc_read_only).
  bool proc_read_only = false;
  bool operator==(const Config&) const = default;
};

std::string encode_config(const Config& config);
// Throws Error("guest config: ...") naming what is wrong.
Config decode_config(std::string_view json_text);

// How each command the init starts is confined, as a container sandbox's
// (in runtime/container.cc's order): no capabilities (bounding set
// included) when the init is root, the command's ids, no_new_privs, the
// Landlock plan, the default seccomp profile last.
struct Confinement {
  bool seccomp = true;
  bool drop_capabilities = true;
  int last_cap = caps::last_cap();  // read before fork: the child allocates nothing for it
  landlock::Plan landlock;          // disabled by default
};

// The confinement config asks for, with its Landlock policy planned for
// config.workdir and the given ABI (landlock::abi_version(): the running
// kernel's). Throws Error for a policy that does not parse, or one whose
// hard_requirement the ABI cannot meet.
Confinement confinement_for(const Config& config, int landlock_abi);

// The plan's paths that do not exist (comma separated; "" when none).
std::string missing_landlock_paths(const landlock::Plan& plan);

// Serves one command on fd (a connected stream socket): reads its exec
// frame, runs it with pipes for stdin, stdout and stderr (or a
// pseudo-terminal, for tty: /dev/ptmx needs devpts on /dev/pts, which
// run_as_pid1 mounts), relays them, and
// ends with exited or failed. Returns the command's status (or the failure's
// code). Never throws for what the peer sends: a malformed frame is a
// failed frame and the end of the connection.
int serve_connection(int fd, const Config& config, const Confinement& confinement);

// Accepts connections on listener (a listening stream socket: vsock in the
// guest) and serves each in a process of its own, forever. For a process of
// its own (PID 1 forks one): it ignores SIGCHLD.
[[noreturn]] void serve_forever(int listener, const Config& config, const Confinement& confinement);

// The status stream's lines.
std::string status_ready(pid_t pid);
std::string status_exit(int status);
std::string status_failed(int code, std::string_view reason);  // the reason on one line

// Starts the configured main process (stdio: the init's own) and says so on
// status_fd (-1: no stream): `ready PID`, or `failed CODE REASON` (the CLI's
// codes: 127 not found, 126 not executable, 125 otherwise). Without argv,
// `ready 0` and 0. Returns the pid, or -1 after `failed`.
pid_t start_main(const Config& config, const Confinement& confinement, int status_fd);

// Until the main process ends (main_pid; 0: none, then until a stop):
// serves `stop GRACE_MS` from status_fd (-1: no stream), then sends
// `exit STATUS` there and returns the status. With reap_all (PID 1), every
// child that ends is reaped on the way (within a second).
int supervise_main(pid_t main_pid, int status_fd, bool reap_all);

// PID 1: everything above, then waits for the main process, and powers the
// guest off when it ends. Returns only on failure (the exit code).
int run_as_pid1(const std::string& config_path);

}  // namespace openshell::runtime::guest
