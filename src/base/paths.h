// Where openshell keeps its state and sockets.
//
// OPENSHELL_HOME, when set, relocates everything: state in $OPENSHELL_HOME,
// sockets in $OPENSHELL_HOME/run. Otherwise, as root: /var/lib/openshell and
// /run/openshell; rootless: $XDG_STATE_HOME/openshell (~/.local/state) and
// $XDG_RUNTIME_DIR/openshell, else the state directory's run/ (a place no
// other user can make first), else, when the sockets' paths would not fit
// there, /tmp/openshell-<uid>. Run directories are mode 0700.
#pragma once

#include <cstdint>
#include <string>

namespace openshell {

struct Paths {
  std::string state_dir;
  std::string run_dir;

  // Resolves from the environment (see above).
  static Paths resolve();

  // Creates the directories (mode 0700) and checks that a pre-existing
  // runtime directory belongs to us and is private. Throws Error.
  void ensure() const;

  // Before a client connects: the run directory (when it exists) is a real
  // directory of the caller's, mode 0700; the gateway's socket (when it
  // exists) a socket of the caller's, mode 0600. Throws Error saying what is
  // wrong and what to remove. The directory being private, what is in it
  // cannot change under us: the server's uid is checked after connecting.
  void check_private() const;

  std::string db() const { return state_dir + "/gateway.db"; }
  std::string lock() const { return state_dir + "/gateway.lock"; }
  // Optional settings of the gateway (TOML; see base/sandbox_limits.h).
  std::string gateway_config() const { return state_dir + "/gateway.toml"; }
  std::string gateway_log() const { return state_dir + "/gateway.log"; }
  std::string key() const { return state_dir + "/keys/gateway.key"; }
  std::string sandboxes() const { return state_dir + "/sandboxes"; }
  std::string sandbox(const std::string& id) const { return sandboxes() + "/" + id; }
  std::string launch_file(const std::string& id) const { return sandbox(id) + "/launch.cred"; }
  // The image store (see image/store.h).
  std::string images() const { return state_dir + "/images"; }
  std::string socket() const { return run_dir + "/gateway.sock"; }
  // The gateway's TLS files (`gateway generate-certs`): ca.crt, ca.key,
  // server.crt, server.key, and the first client's client.crt, client.key.
  std::string tls_dir() const { return state_dir + "/tls"; }
  // One per launch: an older generation's supervisor never touches a newer one's.
  std::string supervisor_socket(const std::string& id, int64_t generation) const {
    return run_dir + "/s/" + id + "." + std::to_string(generation) + ".sock";
  }
  // A copy supervisor's (supervisor/supervisor.h), and the lock it holds.
  std::string copy_socket(const std::string& id) const {
    return run_dir + "/s/" + id + ".copy.sock";
  }
  std::string copy_lock(const std::string& id) const { return sandbox(id) + "/copy.lock"; }
};

// The longest run directory whose sockets all fit a Unix socket address.
inline constexpr size_t kMaxRunDirLength = 67;

// What is wrong with a directory or a socket that should be the caller's own
// and private: "" when it is, or when it does not exist. Private: nobody
// else may write the directory (and so replace the socket), and only a
// group may reach in: a root gateway's socket opened to a group
// (`gateway run --socket-group`) is 0660 in a 0710 directory, still root's.
std::string private_dir_problem(const std::string& dir);
std::string private_dir_problem(const std::string& dir);
std::string private_socket_problem(const std::string& path);

}  // namespace openshell
