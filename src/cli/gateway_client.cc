#include "cli/gateway_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>

#include "auth/certs.h"
#include "base/error.h"
#include "base/files.h"
#include "base/process_name.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "net/http.h"

namespace openshell::cli {

using nlohmann::json;

namespace {

std::unique_ptr<net::Client> try_connect(const Paths& paths, int* err) {
  try {
    return std::make_unique<net::Client>(paths.socket());
  } catch (const net::ConnectError& e) {
    *err = e.err();
    return nullptr;
  }
}

}  // namespace

void start_gateway_in_background(const Paths& paths) {
  paths.ensure();
  // Everything the children need is made before fork: after it they only
  // make system calls.
  const std::string log_path = paths.gateway_log();
  // Named for ps (base/process_name.h): "openshell-gateway --ready-fd 3".
  static const char* const kArgv[] = {process_name::kGateway.data(), "--ready-fd", "3", nullptr};
  Pipe ready = Pipe::create();
  pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork");
  if (pid == 0) {
    // A daemon: its own session, no terminal, output to the gateway's log;
    // the middle child exits so the gateway is nobody's child. It says on
    // fd 3 whether it started; an exec that fails says so there itself.
    ::setsid();
    if (::fork() != 0) ::_exit(0);
    int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (null >= 0) ::dup2(null, 0);
    if (log >= 0) ::dup2(log, 1), ::dup2(log, 2);
    ::dup2(ready.write.get(), 3);
    ::close_range(4, ~0U, 0);
    ::execve("/proc/self/exe", const_cast<char* const*>(kArgv), environ);
    const int err = errno;
    static const char kPrefix[] = "error: exec /proc/self/exe: ";
    const char* name = ::strerrorname_np(err);
    if (!name) name = "unknown error";
    (void)!::write(3, kPrefix, sizeof kPrefix - 1);
    (void)!::write(3, name, std::strlen(name));
    (void)!::write(3, "\n", 1);
    ::_exit(127);
  }
  ready.write.reset();
  int status;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // Its answer: one line, "ok" or why it could not start. The line is
  // enough: the pipe's end may come later, or (from a gateway too old to
  // mark it close-on-exec) only when a sandbox it started ends.
  std::string answer;
  int waited_ms = 0;
  while (answer.find('\n') == std::string::npos && waited_ms < 10000) {
    pollfd p{ready.read.get(), POLLIN, 0};
    int ready_now = ::poll(&p, 1, 100);
    if (ready_now < 0 && errno != EINTR) break;
    if (ready_now <= 0) {
      waited_ms += 100;
      continue;
    }
    char buf[512];
    ssize_t n = ::read(ready.read.get(), buf, sizeof buf);
    if (n > 0)
      answer.append(buf, static_cast<size_t>(n));
    else if (n == 0 || errno != EINTR)
      break;
  }
  const bool answered = !answer.empty();
  while (!answer.empty() && answer.back() == '\n') answer.pop_back();
  if (answer == "ok") return;
  // Another gateway starting at the same time is as good as ours.
  if (answer.find("another gateway is running") != std::string::npos) {
    for (int i = 0; i < 2000; ++i) {
      int err = 0;
      if (try_connect(paths, &err)) return;
      timespec pause{0, 5000000};
      ::nanosleep(&pause, nullptr);
    }
  }
  std::string why = answer.rfind("error: ", 0) == 0 ? answer.substr(7)
                    : answered                      ? answer
                    : waited_ms >= 10000            ? "no answer within 10 s"
                                                    : "it ended before it was ready";
  throw Error("the gateway did not start" + (why.empty() ? "" : ": " + why) + " (see " +
              paths.gateway_log() + ")");
}

GatewayClient::GatewayClient(bool autostart) : GatewayClient(chosen_gateway(), autostart) {}

GatewayClient::GatewayClient(GatewayChoice choice, bool autostart)
    : paths_(Paths::resolve()), choice_(std::move(choice)), autostart_(autostart) {
  connect();
}

GatewayClient::GatewayClient(Deferred) : paths_(Paths::resolve()), choice_(chosen_gateway()) {}

void GatewayClient::connect() {
  if (client_) return;
  if (!choice_.local_default()) {
    // Asked for by name or URL: it is there or it is not; never started here.
    if (choice_.endpoint.kind == net::Endpoint::Kind::kTls && choice_.endpoint.tls.ca.empty())
      throw Error(choice_.describe() +
                  ": no credentials for it (register it with 'openshell gateway add " +
                  choice_.endpoint.url() +
                  " --ca FILE --cert FILE --key FILE', or make this user's with 'openshell "
                  "gateway generate-certs')");
    try {
      client_ = std::make_unique<net::Client>(choice_.endpoint);
    } catch (const net::ConnectError& e) {
      if (e.err() == ENOENT || e.err() == ECONNREFUSED)
        throw Error("no gateway listens at " + choice_.describe());
      throw;
    }
    return;
  }
  // Another user may have made the run directory, or put a socket there.
  paths_.check_private();
  int err = 0;
  client_ = try_connect(paths_, &err);
  if (client_) return;
  if (!autostart_ || (err != ENOENT && err != ECONNREFUSED))
    throw_errno("connect to the gateway at " + paths_.socket(), err);
  start_gateway_in_background(paths_);
  client_ = try_connect(paths_, &err);
  if (!client_) throw_errno("connect to the gateway at " + paths_.socket(), err);
}

net::Client& GatewayClient::connection() {
  connect();
  return *client_;
}

GatewayClient::~GatewayClient() = default;

void GatewayClient::check_before_connecting() const {
  if (choice_.local_default()) paths_.check_private();
}

json GatewayClient::call(const std::string& method, const std::string& target,
                         const std::string& body, const json::parser_callback_t& keep) {
  net::Response response = connection().request(method, target, body);
  const bool ok = response.status >= 200 && response.status < 300;
  json j = json::parse(response.body, ok ? keep : nullptr, false);
  if (ok) {
    if (j.is_discarded()) throw Error("the gateway answered with something that is not JSON");
    return j;
  }
  if (j.is_object() && j.contains("error") && j["error"].is_object())
    throw GatewayError(j["error"].value("message", "the gateway refused the request"),
                       response.status, j["error"].value("code", ""));
  throw GatewayError("the gateway answered " + std::to_string(response.status), response.status,
                     "");
}

net::Response GatewayClient::request(const std::string& method, const std::string& target) {
  return connection().request(method, target);
}

std::string GatewayClient::call_text(const std::string& method, const std::string& target) {
  net::Response response = connection().request(method, target);
  if (response.status >= 200 && response.status < 300) return response.body;
  json j = json::parse(response.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object())
    throw Error(j["error"].value("message", "the gateway refused the request"));
  throw Error("the gateway answered " + std::to_string(response.status));
}

GatewayProbe probe_gateway(GatewayClient& client) {
  GatewayProbe probe;
  probe.version = client.call("GET", "/v1/health").value("version", "");
  net::Response who = client.request("GET", "/v1/whoami");
  if (who.status == 404) return probe;
  json j = json::parse(who.body, nullptr, false);
  if (who.status >= 200 && who.status < 300 && j.is_object()) {
    probe.whoami = j;
    return probe;
  }
  if (j.is_object() && j.contains("error") && j["error"].is_object())
    throw Error(j["error"].value("message", "the gateway refused the request"));
  throw Error("GET /v1/whoami: the gateway answered " + std::to_string(who.status));
}

std::string connection_line(const GatewayClient& client, const GatewayProbe& probe) {
  switch (client.gateway().endpoint.kind) {
    case net::Endpoint::Kind::kTls:
      return "Connected / Authenticated (mTLS)";
    case net::Endpoint::Kind::kTcp:
      return "Connected (plain TCP, not authenticated)";
    case net::Endpoint::Kind::kUnix:
      break;
  }
  const std::string who =
      probe.whoami ? probe.whoami->value("principal", "") : auth::principal_of_uid(::geteuid());
  return "Connected (Unix socket, as " + who + ")";
}

}  // namespace openshell::cli
