// The process `oci create` leaves behind for a container: it starts the
// container (runtime::Container, the runtime `openshell run` uses) with the
// init as `create`'s own child (so that the engine that ran create reaps
// it, as it reaps runc's), holds the init's lifeline and control channel,
// and serves ROOT/ID/monitor.sock until the init ends:
//
//   client -> monitor (SOCK_SEQPACKET, one message each; init_protocol.h's
//   encoding)
//     start                        the main process (config.json's process)
//     exec ID ... (encode_exec)    another process; fds: stdin, stdout, stderr
//     kill SIGNAL                  to that exec, on the connection that made it
//   monitor -> client
//     ok | error CODE MESSAGE
//     started PID                  fds: the pty master, for a terminal
//     exited STATUS
#pragma once

#include <sys/un.h>

#include <functional>
#include <memory>
#include <string>

#include "base/logfile.h"
#include "base/unique_fd.h"
#include "oci/config.h"
#include "runtime/container.h"

namespace openshell::oci {

struct CreateOptions {
  std::string id;
  std::string root;  // the state root
  std::string console_socket;
  // --preserve-fds: the monitor holds them at 4, 5, ... until `start`
  // hands them to the main process as 3, 4, ...
  int preserve_fds = 0;
  // Serves the egress proxy of a container whose policy has a network part
  // (the CLI's: it owns the proxy thread), for as long as the result lives.
  std::function<std::shared_ptr<void>(runtime::Container&, const runtime::ContainerSpec&,
                                      const policy::Policy&,
                                      std::unique_ptr<logfile::RotatingFile>)>
      start_egress;
};

// In the forked monitor: starts the container, then writes "ok PID\n" or
// "error CODE MESSAGE\n" to report_fd (and closes it), then serves. Returns
// the exit status for the monitor (the main process's status when known).
int run_monitor(std::unique_ptr<Bundle> bundle, const CreateOptions& options, int report_fd);

// The client side: one connection to ID's monitor. Throws Error.
int connect_monitor(const std::string& root, const std::string& id);

// A unix socket's address. A path too long for sun_path (an engine's deep
// state directories) goes through its directory's fd, held open in *dir
// for as long as the address is used. Throws Error.
sockaddr_un unix_address(const std::string& path, UniqueFd* dir);

// Sends a pty master to an engine's console socket (SCM_RIGHTS), as runc
// does. Throws Error.
void send_console(const std::string& socket_path, int master_fd);

}  // namespace openshell::oci
