// The exec stream (docs/api.md, "Exec") spoken directly, as any WebSocket
// client would, over the gateway's socket: a client that gets a message
// wrong is told which field, in an "error" with code 125, and a correct one
// on the same path runs its command (so the refusal is the field's).
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include "harness.h"

using json = nlohmann::json;

namespace e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A client's text frame (masked, as RFC 6455 requires of clients).
std::string text_frame(const std::string& payload) {
  std::string frame = "\x81";
  if (payload.size() < 126) {
    frame += static_cast<char>(0x80 | payload.size());
  } else {
    frame += static_cast<char>(0x80 | 126);
    frame += static_cast<char>(payload.size() >> 8);
    frame += static_cast<char>(payload.size() & 0xff);
  }
  const char mask[4] = {0x12, 0x34, 0x56, 0x78};
  frame.append(mask, 4);
  for (size_t i = 0; i < payload.size(); ++i) frame += static_cast<char>(payload[i] ^ mask[i % 4]);
  return frame;
}

// The server's text messages among the frames in bytes (unmasked, unfragmented).
std::vector<std::string> text_messages(const std::string& bytes) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at + 2 <= bytes.size()) {
    const unsigned char op = static_cast<unsigned char>(bytes[at]) & 0x0f;
    size_t length = static_cast<unsigned char>(bytes[at + 1]) & 0x7f;
    size_t head = 2;
    if (length == 126) {
      if (at + 4 > bytes.size()) break;
      length = (static_cast<unsigned char>(bytes[at + 2]) << 8) |
               static_cast<unsigned char>(bytes[at + 3]);
      head = 4;
    } else if (length == 127) {
      break;  // nothing this large is expected
    }
    if (at + head + length > bytes.size()) break;
    if (op == 1) out.push_back(bytes.substr(at + head, length));
    at += head + length;
  }
  return out;
}

// Upgrades a connection to the exec path of `name` as the mode's user, sends
// `messages` once the upgrade is answered, and reads until the server closes
// (its close frame, 20 s at most): the bytes after the 101 head, or "" when none came. The
// child does only system calls: everything is built before the fork.
// `fields` are more header lines of the request ("Name: value\r\n" each);
// the answer's head goes to *head when given.
std::string exec_session(Mode mode, const std::string& socket_path, const std::string& name,
                         const std::vector<std::string>& messages, const std::string& fields = "",
                         std::string* head = nullptr) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) return "";
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size());
  const std::string upgrade =
      "GET /v1/sandboxes/" + name +
      "/exec HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
      "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
      "Sec-WebSocket-Version: 13\r\n" +
      fields + "\r\n";
  std::string frames;
  for (const auto& m : messages) frames += text_frame(m);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return "";
  const uid_t uid = uid_of(mode);
  const gid_t gid = gid_of(mode);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    if (::setgroups(0, nullptr) != 0 || ::setresgid(gid, gid, gid) != 0 ||
        ::setresuid(uid, uid, uid) != 0)
      ::_exit(121);
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) ::_exit(122);
    if (::send(fd, upgrade.data(), upgrade.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(upgrade.size()))
      ::_exit(123);
    static char got[1 << 16];  // the head, then the bytes after it
    size_t have = 0;
    bool upgraded = false;
    char tail[4] = {0, 0, 0, 0};  // the last four bytes of the head so far
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20000) != 1) ::_exit(124);
      if (!upgraded) {
        char c;
        if (::read(fd, &c, 1) != 1 || have == sizeof got) ::_exit(127);
        got[have++] = c;
        std::memmove(tail, tail + 1, 3);
        tail[3] = c;
        if (std::memcmp(tail, "\r\n\r\n", 4) == 0) {
          upgraded = true;
          if (::send(fd, frames.data(), frames.size(), MSG_NOSIGNAL) !=
              static_cast<ssize_t>(frames.size()))
            ::_exit(125);
        }
        continue;
      }
      ssize_t n = ::read(fd, got + have, sizeof got - have);
      if (n > 0) have += static_cast<size_t>(n);
      // Done at the server's close frame (or the connection's end).
      bool closed = n <= 0;
      size_t frames_at = 0;
      while (frames_at + 4 <= have && std::memcmp(got + frames_at, "\r\n\r\n", 4) != 0) ++frames_at;
      for (size_t at = frames_at + 4; !closed && at + 2 <= have;) {
        size_t length = static_cast<unsigned char>(got[at + 1]) & 0x7f, head = 2;
        if (length == 126) {
          if (at + 4 > have) break;
          length = (static_cast<unsigned char>(got[at + 2]) << 8) |
                   static_cast<unsigned char>(got[at + 3]);
          head = 4;
        }
        if (at + head + length > have) break;
        if ((static_cast<unsigned char>(got[at]) & 0x0f) == 8) closed = true;
        at += head + length;
      }
      if (closed || have == sizeof got) {
        if (::write(out[1], got, have) != static_cast<ssize_t>(have)) ::_exit(126);
        ::_exit(0);
      }
    }
  }
  ::close(out[1]);
  std::string bytes;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;)
    bytes.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the client ended with " << status << " (124: no close within 20 s)";
  const size_t end = bytes.find("\r\n\r\n");
  if (end == std::string::npos) return "";
  if (head) *head = bytes.substr(0, end + 4);
  return bytes.substr(end + 4);
}

// RFC 3986 percent-encoding of every byte but the unreserved ones.
std::string percent_encoded(const std::string& text) {
  static const char hex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

class ExecStream : public GatewayTest {
 protected:
  ExecStream() : GatewayTest("exec", /*check_sandbox_files=*/false) {}
  std::vector<std::string> session(const std::vector<std::string>& messages) {
    return text_messages(exec_session(mode(), home_ + "/run/gateway.sock", "ex", messages));
  }
};
E2E_ALL_MODES(ExecStream);

// A resize sent right behind the start, before the command's terminal
// exists, is its size all the same (the command sums rows and columns).
TEST_P(ExecStream, AResizeBeforeTheStartedMessageStillApplies) {
  Result created = os({"sandbox", "create", "--name", "ex", "--from", rootfs()});
  ASSERT_EQ(created.status, 0) << created.err;
  std::vector<std::string> got = session(
      {R"x({"type":"start","argv":["sh","-c","sleep 0.3; set -- $(stty size); exit $(($1 + $2))"],"tty":true,"rows":10,"cols":20})x",
       R"x({"type":"resize","rows":30,"cols":40})x"});
  ASSERT_EQ(got.size(), 2u) << testing::PrintToString(got);
  EXPECT_EQ(json::parse(got[1]), json::parse(R"({"type":"exit","code":70})"));
}

// The start message may come in the upgrade request (docs/api.md): the
// answer says it was taken, and the command runs with no message sent. A
// field that holds no start message is not taken, and the message is
// awaited as ever.
TEST_P(ExecStream, AStartInTheUpgradeRequestRunsWithoutTheMessage) {
  Result created = os({"sandbox", "create", "--name", "ex", "--from", rootfs()});
  ASSERT_EQ(created.status, 0) << created.err;
  const std::string socket = home_ + "/run/gateway.sock";
  const std::string start = R"({"type":"start","argv":["sh","-c","echo early; exit 7"]})";
  std::string head;
  std::string bytes = exec_session(
      mode(), socket, "ex", {}, "Openshell-Exec-Start: " + percent_encoded(start) + "\r\n", &head);
  EXPECT_THAT(head, HasSubstr("HTTP/1.1 101 "));
  EXPECT_THAT(head, HasSubstr("Openshell-Exec-Start: accepted\r\n"));
  EXPECT_THAT(bytes, HasSubstr("early\n"));
  std::vector<std::string> got = text_messages(bytes);
  ASSERT_EQ(got.size(), 2u) << testing::PrintToString(got);
  EXPECT_EQ(json::parse(got[0]), json::parse(R"({"type":"started"})"));
  EXPECT_EQ(json::parse(got[1]), json::parse(R"({"type":"exit","code":7})"));

  for (const std::string& field : {std::string("%7Bnot json"), percent_encoded(R"({"type":"eof"})"),
                                   percent_encoded(R"({"type":"start","argv":[]})")}) {
    head.clear();
    got = text_messages(exec_session(mode(), socket, "ex",
                                     {R"({"type":"start","argv":["sh","-c","exit 3"]})"},
                                     "Openshell-Exec-Start: " + field + "\r\n", &head));
    EXPECT_THAT(head, HasSubstr("HTTP/1.1 101 ")) << field;
    EXPECT_THAT(head, Not(HasSubstr("accepted"))) << field;
    ASSERT_EQ(got.size(), 2u) << field << " " << testing::PrintToString(got);
    EXPECT_EQ(json::parse(got[1]), json::parse(R"({"type":"exit","code":3})")) << field;
  }
}

TEST_P(ExecStream, AWrongMessageIsAnErrorNamingItsField) {
  Result created = os({"sandbox", "create", "--name", "ex", "--from", rootfs()});
  ASSERT_EQ(created.status, 0) << created.err;
  // The control: the same client, a correct start, runs the command.
  std::vector<std::string> good = session({R"({"type":"start","argv":["sh","-c","exit 3"]})"});
  ASSERT_EQ(good.size(), 2u) << testing::PrintToString(good);
  EXPECT_EQ(json::parse(good[0]), json::parse(R"({"type":"started"})"));
  EXPECT_EQ(json::parse(good[1]), json::parse(R"({"type":"exit","code":3})"));
  struct Case {
    std::string message, error;
  } cases[] = {
      {R"({"type":"start","argv":["sh","-c","exit 3"],"tyy":true})",
       R"(exec stream: "start" message: unknown field "tyy")"},
      {R"({"type":"start","env":[]})", R"(exec stream: "start" message: missing field "argv")"},
      {R"({"type":"start","argv":[]})", R"(exec stream: "start" message: field "argv" is empty)"},
      {R"({"type":"begin","argv":["true"]})", R"(exec stream: unknown message type "begin")"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> got = session({c.message});
    ASSERT_EQ(got.size(), 1u) << c.message << ": " << testing::PrintToString(got);
    EXPECT_EQ(json::parse(got[0]), (json{{"type", "error"}, {"code", 125}, {"message", c.error}}))
        << c.message;
  }
}

}  // namespace
}  // namespace e2e
