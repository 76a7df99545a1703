// The command line's streams: a sandbox's log as it grows, and exec's stdio.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "base/error.h"
#include "egress/ocsf.h"
#include "net/http.h"

namespace openshell::cli {

class GatewayClient;

// The gateway answered a stream's upgrade with an error (a sandbox in the
// wrong phase, say): the reason holds its status and body.
class StreamRefused : public Error {
 public:
  using Error::Error;
};

// The stream's connection or its upgrade failed before the gateway
// answered it: nothing of the request reached a sandbox.
class StreamUnreachable : public Error {
 public:
  using Error::Error;
};

// A WebSocket stream of the client's gateway at target (on a connection of
// its own), opened on io. Throws StreamRefused, or StreamUnreachable.
std::shared_ptr<net::WebSocket> open_stream(boost::asio::io_context& io,
                                            const GatewayClient& client, const std::string& target,
                                            net::WebSocket::Headers headers = {});

struct LogOptions {
  std::string tail = "all";  // a number of records, or "all"
  bool timestamps = false;
  std::string source = "sandbox";   // or "network": the egress proxy's decisions (JSON lines)
  std::optional<int64_t> since_ns;  // only records from then on (since the epoch)
  std::string format = "json";      // the network log's: json, ocsf or text
};

// The network log's format by its name on the command line ("json" too
// for anything else: the proxy's lines as they are).
egress::ocsf::Format network_format(const std::string& name);

struct LogEnd {
  std::string phase;             // the sandbox's phase at the end
  std::optional<int> exit_code;  // the main process's, once it exited
};

// Prints the log's records (stdout records to stdout, stderr to stderr) and
// follows it until the sandbox's main process has ended. The streams go to
// the client's gateway, on a connection of their own. Throws Error.
LogEnd follow_logs(const GatewayClient& client, const std::string& name, const LogOptions& options);

// Prints records from a log's text (CRI lines); returns how many.
size_t print_records(const std::string& text, bool timestamps, std::string* carry);

struct ExecOptions {
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string workdir;  // empty: the sandbox's
  std::string user;     // UID[:GID] or NAME[:GROUP]; empty: the sandbox's
  bool tty = false;
  int timeout_s = 0;  // 0: none
  int stdin_fd = 0;   // where its input comes from (a pipe, a file, a terminal)
  int stdout_fd = 1;  // where its output goes
  int stderr_fd = 2;  // where its diagnostics go
  // A download's or an upload's tar: the sandbox may also be one that is not
  // running (Stopped, Completed, Error), which the gateway then starts a
  // copy of its container for (supervisor/supervisor.h).
  bool copy = false;
};

// Runs a command in a Ready sandbox (see `copy`) with stdin, stdout and stderr passed
// through; returns its exit status (126/127 when it cannot run). Throws Error.
int exec(const GatewayClient& client, const std::string& name, const ExecOptions& options);

}  // namespace openshell::cli
