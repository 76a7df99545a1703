#include "cli/gateway_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <utility>

#include <nlohmann/json.hpp>

#include <cerrno>

#include "base/error.h"
#include "base/files.h"
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

std::string last_line(const std::string& path) {
  std::string text = files::try_read(path).value_or("");
  while (!text.empty() && text.back() == '\n') text.pop_back();
  auto nl = text.rfind('\n');
  return nl == std::string::npos ? text : text.substr(nl + 1);
}

}  // namespace

void start_gateway_in_background(const Paths& paths) {
  paths.ensure();
  Pipe ready = Pipe::create();
  pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork");
  if (pid == 0) {
    // A daemon: its own session, no terminal, output to the gateway's log;
    // the middle child exits so the gateway is nobody's child. It says on
    // fd 3 whether it started.
    ::setsid();
    if (::fork() != 0) ::_exit(0);
    int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    int log = ::open(paths.gateway_log().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (null >= 0) ::dup2(null, 0);
    if (log >= 0) ::dup2(log, 1), ::dup2(log, 2);
    ::dup2(ready.write.get(), 3);
    ::close_range(4, ~0U, 0);
    ::execl("/proc/self/exe", "openshell", "gateway", "run", "--ready-fd", "3",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ready.write.reset();
  int status;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // Its answer: "ok", or why it could not start.
  std::string answer;
  pollfd p{ready.read.get(), POLLIN, 0};
  long deadline_ms = 10000;
  while (deadline_ms > 0 && ::poll(&p, 1, 100) >= 0) {
    char buf[512];
    ssize_t n = ::read(ready.read.get(), buf, sizeof buf);
    if (n > 0) {
      answer.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) break;
    deadline_ms -= 100;
  }
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
  std::string why = answer.rfind("error: ", 0) == 0 ? answer.substr(7) : last_line(paths.gateway_log());
  throw Error("the gateway did not start" + (why.empty() ? "" : ": " + why) + " (see " +
              paths.gateway_log() + ")");
}

GatewayClient::GatewayClient(bool autostart) : paths_(Paths::resolve()) {
  int err = 0;
  client_ = try_connect(paths_, &err);
  if (client_) return;
  if (!autostart || (err != ENOENT && err != ECONNREFUSED))
    throw_errno("connect to the gateway at " + paths_.socket(), err);
  start_gateway_in_background(paths_);
  client_ = try_connect(paths_, &err);
  if (!client_) throw_errno("connect to the gateway at " + paths_.socket(), err);
}

GatewayClient::~GatewayClient() = default;

json GatewayClient::call(const std::string& method, const std::string& target,
                         const std::string& body) {
  net::Response response = client_->request(method, target, body);
  json j = json::parse(response.body, nullptr, false);
  if (response.status >= 200 && response.status < 300) {
    if (j.is_discarded()) throw Error("the gateway answered with something that is not JSON");
    return j;
  }
  if (j.is_object() && j.contains("error") && j["error"].is_object())
    throw Error(j["error"].value("message", "the gateway refused the request"));
  throw Error("the gateway answered " + std::to_string(response.status));
}

std::string GatewayClient::call_text(const std::string& method, const std::string& target) {
  net::Response response = client_->request(method, target);
  if (response.status >= 200 && response.status < 300) return response.body;
  json j = json::parse(response.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object())
    throw Error(j["error"].value("message", "the gateway refused the request"));
  throw Error("the gateway answered " + std::to_string(response.status));
}

}  // namespace openshell::cli
