// The HTTP API's contract (docs/api.md, "Errors"), spoken directly over the
// gateway's socket rather than through the command line: each documented
// status and code the gateway can be brought to answer, and the one shape of
// its error bodies, {"error":{"code":…,"message":…}}.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include "harness.h"

using testing::HasSubstr;
using testing::StartsWith;
using json = nlohmann::json;

namespace e2e {
namespace {

struct Reply {
  int status = 0;  // 0: no status line came back
  std::string raw;
  std::string body;
};

// Opens `hold` connections to the socket and keeps them, then sends `request`
// on one more and reads until the gateway closes it (at most 20 s); as the
// mode's user, from the host. The child does only system calls: the request
// is built before the fork.
Reply exchange(Mode mode, const std::string& socket_path, const std::string& request,
               int hold = 0) {
  Reply reply;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) return reply;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size());
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return reply;
  uid_t uid = uid_of(mode);
  gid_t gid = gid_of(mode);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    if (::setgroups(0, nullptr) != 0 || ::setresgid(gid, gid, gid) != 0 ||
        ::setresuid(uid, uid, uid) != 0)
      ::_exit(121);
    for (int i = 0; i <= hold; ++i) {
      int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
        ::_exit(122);
      if (i < hold) continue;
      // A gateway that refuses at accept has answered and closed before
      // the request goes: the send fails (EPIPE), and the answer is still
      // there to read.
      const ssize_t sent = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
      if (sent != static_cast<ssize_t>(request.size()) && !(sent < 0 && errno == EPIPE))
        ::_exit(123);
      char buf[4096];
      for (;;) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 20000) != 1) ::_exit(124);
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) ::_exit(0);
        if (::write(out[1], buf, static_cast<size_t>(n)) != n) ::_exit(125);
      }
    }
    ::_exit(126);
  }
  ::close(out[1]);
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;)
    reply.raw.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the client ended with " << status << " (124: no close within 20 s)";
  if (reply.raw.rfind("HTTP/1.1 ", 0) == 0 && reply.raw.size() >= 12)
    reply.status = std::atoi(reply.raw.substr(9, 3).c_str());
  size_t at = reply.raw.find("\r\n\r\n");
  if (at != std::string::npos) reply.body = reply.raw.substr(at + 4);
  return reply;
}

std::string request(const std::string& method, const std::string& target,
                    const std::string& body = "", bool with_body = false) {
  std::string r = method + " " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n";
  if (with_body || !body.empty())
    r +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

class ApiContract : public GatewayTest {
 protected:
  ApiContract() : GatewayTest("api", /*check_sandbox_files=*/false) {}
  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    socket_ = home_ + "/run/gateway.sock";
  }
  // Starts the gateway (the command line's auto-start) with `env`.
  void start_gateway(std::vector<std::string> env = {}) {
    Options o;
    o.env = std::move(env);
    o.env.push_back("OPENSHELL_HOME=" + home_);
    Result r = openshell(mode(), {"sandbox", "list"}, o);
    ASSERT_EQ(r.status, 0) << r.err;
  }
  Reply call(const std::string& method, const std::string& target, const std::string& body = "",
             bool with_body = false) {
    return exchange(mode(), socket_, request(method, target, body, with_body));
  }

  std::string socket_;
};
E2E_ALL_MODES(ApiContract);

// The error body: one object "error" holding exactly a string code and a
// non-empty string message.
void expect_error(const Reply& r, int status, const std::string& code,
                  const std::string& message_start = "") {
  SCOPED_TRACE(r.raw);
  EXPECT_EQ(r.status, status);
  EXPECT_THAT(r.raw, HasSubstr("\r\nContent-Type: application/json"));
  json body = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(body.is_object());
  ASSERT_EQ(body.size(), 1u);
  ASSERT_TRUE(body.contains("error") && body["error"].is_object());
  const json& error = body["error"];
  ASSERT_EQ(error.size(), 2u);
  ASSERT_TRUE(error.contains("code") && error["code"].is_string());
  ASSERT_TRUE(error.contains("message") && error["message"].is_string());
  EXPECT_EQ(error["code"], code);
  EXPECT_NE(error["message"].get<std::string>(), "");
  EXPECT_THAT(error["message"].get<std::string>(), StartsWith(message_start));
}

TEST_P(ApiContract, ErrorsOfRoutesNamesAndBodies) {
  start_gateway();
  // The routes that work answer 200, so the refusals below are theirs.
  Reply health = call("GET", "/v1/health");
  EXPECT_EQ(health.status, 200) << health.raw;
  Reply list = call("GET", "/v1/sandboxes");
  EXPECT_EQ(list.status, 200) << list.raw;
  EXPECT_EQ(json::parse(list.body, nullptr, false), json::parse(R"({"sandboxes":[]})"));

  expect_error(call("GET", "/v1/sandboxes/nope"), 404, "not_found", "no sandbox named 'nope'");
  expect_error(call("DELETE", "/v1/sandboxes/nope"), 404, "not_found", "no sandbox named 'nope'");
  expect_error(call("POST", "/v1/sandboxes/nope/start", "", true), 404, "not_found");
  expect_error(call("GET", "/v1/nonsense"), 404, "not_found");
  expect_error(call("GET", "/v2/sandboxes"), 404, "not_found");
  // An unknown method on a known path is 404 too, not 405.
  expect_error(call("PATCH", "/v1/sandboxes"), 404, "not_found");
  expect_error(call("DELETE", "/v1/health"), 404, "not_found");

  expect_error(call("POST", "/v1/sandboxes", "[1]"), 400, "bad_request");
  expect_error(call("POST", "/v1/sandboxes", "{\"name\":5}"), 400, "bad_request");
  expect_error(call("POST", "/v1/sandboxes", "{not json"), 400, "bad_request");
  // A batch delete names at least one sandbox, each by a string.
  expect_error(call("POST", "/v1/sandboxes:batchDelete", "{}"), 400, "bad_request",
               "the body must be {\"names\": [NAME, ...]}");
  expect_error(call("POST", "/v1/sandboxes:batchDelete", R"({"names":[]})"), 400, "bad_request");
  expect_error(call("POST", "/v1/sandboxes:batchDelete", R"({"names":["a",5]})"), 400,
               "bad_request");
  expect_error(call("POST", "/v1/sandboxes:batchDelete", "{not json"), 400, "bad_request");
  expect_error(call("POST", "/v1/sandboxes", R"({"name":"Bad_Name","spec":{"from":"host"}})"), 400,
               "invalid_name");
  expect_error(call("POST", "/v1/sandboxes", R"({"name":"x","spec":{"from":"./x"}})"), 400,
               "invalid_spec", "--from: image reference './x': '.' is not a registry host[:port]");
  expect_error(
      call("POST", "/v1/sandboxes", R"({"name":"x","spec":{"from":"host","memory_bytes":1024}})"),
      400, "invalid_spec", "--memory: ");
  expect_error(call("POST", "/v1/sandboxes", R"({"name":"x","spec":{"from":"host","env":5}})"), 400,
               "invalid_spec");
  expect_error(
      call("POST", "/v1/sandboxes", R"({"name":"x","spec":{"from":"host","storage":"copy"}})"), 400,
      "invalid_spec", "storage 'copy': chosen by the gateway");
  expect_error(call("POST", "/v1/sandboxes", R"({"name":"x","spec":{"from":"busybox"}})"), 404,
               "image_not_found", "image busybox is not in the image store");
  // None of the refused creates left a sandbox behind.
  EXPECT_EQ(json::parse(call("GET", "/v1/sandboxes").body, nullptr, false),
            json::parse(R"({"sandboxes":[]})"));

  // A request the HTTP layer cannot read at all: the same body, and closed.
  expect_error(exchange(mode(), socket_, "NOT HTTP\r\n\r\n"), 400, "bad_request", "bad request: ");
  expect_error(
      exchange(mode(), socket_,
               "GET /v1/health HTTP/1.1\r\nX: " + std::string(64 * 1024, 'a') + "\r\n\r\n"),
      400, "bad_request", "bad request: ");
}

TEST_P(ApiContract, ErrorsOfAnExistingSandbox) {
  start_gateway();
  Result created = os({"sandbox", "create", "--name", "taken", "--from", "host"});
  ASSERT_EQ(created.status, 0) << created.err << created.out;
  Reply got = call("GET", "/v1/sandboxes/taken");
  ASSERT_EQ(got.status, 200) << got.raw;
  EXPECT_EQ(json::parse(got.body, nullptr, false).value("name", ""), "taken");

  expect_error(call("POST", "/v1/sandboxes", R"({"name":"taken","spec":{"from":"host"}})"), 409,
               "name_taken");
  // Start is allowed only from Stopped, Completed or Error: the message names the phase.
  Reply start = call("POST", "/v1/sandboxes/taken/start", "", true);
  expect_error(start, 409, "wrong_phase");
  EXPECT_THAT(start.body, HasSubstr("Ready"));
  expect_error(call("PUT", "/v1/sandboxes/taken/policy", R"({"policy":"version = 99\n"})"), 400,
               "invalid_policy");
  expect_error(call("PUT", "/v1/sandboxes/taken/policy", R"({"policy":5})"), 400, "bad_request");
  expect_error(call("GET", "/v1/sandboxes/taken/policy?rev=abc"), 400, "bad_request");
  // A change of a part fixed at start, on the running sandbox: refused
  // unless for the next start.
  const std::string hard =
      R"({"policy":"version = 1\n[landlock]\ncompatibility = \"hard_requirement\"\n")";
  expect_error(call("PUT", "/v1/sandboxes/taken/policy", hard + "}"), 409, "static_change",
               "sandbox 'taken' is running, and its landlock would change");
  Reply later = call("PUT", "/v1/sandboxes/taken/policy", hard + R"(,"at_next_start":true})");
  EXPECT_EQ(later.status, 200) << later.raw;
  EXPECT_EQ(json::parse(later.body, nullptr, false).value("at_next_start", json::array()),
            json::parse(R"(["landlock"])"));
  expect_error(call("POST", "/v1/sandboxes",
                    R"({"name":"x","spec":{"from":"host","ca_certs":["not a certificate"]}})"),
               400, "invalid_spec", "--ca-cert certificate 1: not a PEM certificate");
  expect_error(call("GET", "/v1/sandboxes/taken/logs?source=bogus"), 400, "bad_request");
  expect_error(call("GET", "/v1/sandboxes/taken/logs?since=5m"), 400, "bad_request");
  expect_error(call("GET", "/v1/sandboxes?selector=a%3D1%2C%2Cb"), 400, "bad_request");

  Reply deleted = call("DELETE", "/v1/sandboxes/taken");
  EXPECT_EQ(deleted.status, 200) << deleted.raw;
  EXPECT_EQ(json::parse(deleted.body, nullptr, false), json::parse(R"({"deleted":"taken"})"));
  expect_error(call("GET", "/v1/sandboxes/taken"), 404, "not_found");
}

// The deadlines and the per-uid limit, made short and small through the
// gateway's environment (the defaults are 10 s and 128).
TEST_P(ApiContract, SlowHeadsGet408AndOneConnectionTooManyGets503) {
  start_gateway(
      {"OPENSHELL_API_HEADER_TIMEOUT_MS=1000", "OPENSHELL_API_MAX_CONNECTIONS_PER_UID=4"});
  expect_error(exchange(mode(), socket_, "GET /v1/health HTTP/1.1\r\nHost: local"), 408,
               "request_timeout");
  // Three held and one more are the limit; the fifth is refused.
  Reply fourth = exchange(mode(), socket_, request("GET", "/v1/health"), 3);
  EXPECT_EQ(fourth.status, 200) << fourth.raw;
  expect_error(exchange(mode(), socket_, request("GET", "/v1/health"), 4), 503,
               "too_many_connections");
}

}  // namespace
}  // namespace e2e
