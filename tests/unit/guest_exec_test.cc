// A micro-VM's exec (supervisor/guest_exec.h): the translation between the
// exec stream's messages and the guest init's frames, alone; then the whole
// relay, a real WebSocket on one side and the guest init's
// serve_connection() on the other (over a socket pair, in a thread, running
// real commands).
#include "supervisor/guest_exec.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "base/unique_fd.h"
#include "net/http.h"
#include "protocol/exec_stream.h"
#include "runtime/guest_init.h"
#include "runtime/init_protocol.h"
#include "test_util.h"

namespace openshell::supervisor {
namespace {

namespace asio = boost::asio;
namespace exec = protocol::exec;
namespace frames = runtime::guest;
using namespace std::chrono_literals;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

ExecDefaults sandbox_defaults() {
  ExecDefaults d;
  d.env = {"PATH=/usr/bin:/bin", "HOME=/root", "LANG=C"};
  d.workdir = "/tmp";
  d.resolve_user = [](const std::string& user) -> std::optional<runtime::ExecUser> {
    if (user == "nobody") return runtime::ExecUser{65534, 65534};
    if (user == "me") return std::nullopt;
    throw Error("--user " + user + ": no such user in the sandbox");
  };
  return d;
}

// The exec request inside one exec frame.
runtime::ExecRequest request_in(std::string bytes) {
  auto frame = frames::take_frame(&bytes);
  EXPECT_TRUE(frame);
  EXPECT_EQ(bytes, "") << "one frame";
  if (!frame) return {};
  EXPECT_EQ(frame->type, frames::FrameType::kExec);
  auto request = runtime::decode_exec(runtime::parse_message(frame->bytes));
  EXPECT_TRUE(request);
  return request.value_or(runtime::ExecRequest{});
}

// ---- the translation ----------------------------------------------------------------

TEST(GuestExecFrames, StartIsTheExecFrameAsAContainersInitGetsIt) {
  exec::Start start;
  start.argv = {"sh", "-c", "echo hi"};
  start.env = {"LANG=C.UTF-8", "EXTRA=1"};
  start.user = "nobody";
  auto frame = guest_exec::exec_frame(start, 7, sandbox_defaults());
  ASSERT_TRUE(std::holds_alternative<std::string>(frame));
  runtime::ExecRequest request = request_in(std::get<std::string>(frame));
  EXPECT_EQ(request.id, 7u);
  EXPECT_FALSE(request.tty);
  EXPECT_THAT(request.argv, ElementsAre("sh", "-c", "echo hi"));
  // The sandbox's environment, the caller's replacing and adding.
  EXPECT_THAT(request.env,
              ElementsAre("PATH=/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8", "EXTRA=1"));
  EXPECT_EQ(request.workdir, "/tmp") << "the sandbox's, when Start names none";
  ASSERT_TRUE(request.user);
  EXPECT_EQ(request.user->uid, 65534u);
  EXPECT_EQ(request.user->gid, 65534u);

  start.workdir = "/work";
  start.user = "me";
  request = request_in(std::get<std::string>(guest_exec::exec_frame(start, 8, sandbox_defaults())));
  EXPECT_EQ(request.workdir, "/work");
  EXPECT_FALSE(request.user) << "the sandbox's own user";
}

TEST(GuestExecFrames, ATtyAndItsSizeGoInTheExecFrame) {
  exec::Start start;
  start.argv = {"sh"};
  start.tty = true;
  start.rows = 50;
  start.cols = 132;
  auto frame = guest_exec::exec_frame(start, 3, sandbox_defaults());
  ASSERT_TRUE(std::holds_alternative<std::string>(frame));
  runtime::ExecRequest request = request_in(std::get<std::string>(frame));
  EXPECT_TRUE(request.tty);
  EXPECT_EQ(request.rows, 50u);
  EXPECT_EQ(request.cols, 132u);
}

TEST(GuestExecFrames, AUserRefusedAndAnOversizedRequestAreFailures) {
  exec::Start start;
  start.argv = {"sh"};
  start.user = "mallory";
  auto user = guest_exec::exec_frame(start, 1, sandbox_defaults());
  ASSERT_TRUE(std::holds_alternative<exec::Failure>(user));
  EXPECT_EQ(std::get<exec::Failure>(user).message, "--user mallory: no such user in the sandbox");
  ExecDefaults no_users = sandbox_defaults();
  no_users.resolve_user = nullptr;
  EXPECT_TRUE(std::holds_alternative<exec::Failure>(guest_exec::exec_frame(start, 1, no_users)));

  start.user.reset();
  start.env = {"BIG=" + std::string(frames::kMaxFrame, 'x')};
  auto big = guest_exec::exec_frame(start, 1, sandbox_defaults());
  ASSERT_TRUE(std::holds_alternative<exec::Failure>(big));
  EXPECT_THAT(std::get<exec::Failure>(big).message, HasSubstr("the most is 1048576"));
}

TEST(GuestExecFrames, StdinEofSignalsAndResizesAreFrames) {
  std::string bytes = guest_exec::stdin_frames(std::string(frames::kMaxFrame * 2 + 10, 'a'));
  std::vector<size_t> sizes;
  while (auto frame = frames::take_frame(&bytes)) {
    EXPECT_EQ(frame->type, frames::FrameType::kStdin);
    sizes.push_back(frame->bytes.size());
  }
  EXPECT_THAT(sizes, ElementsAre(frames::kMaxFrame, frames::kMaxFrame, 10u));
  EXPECT_EQ(guest_exec::stdin_frames(""), "");
  EXPECT_EQ(guest_exec::frame_for(exec::Eof{}), frames::encode_frame(frames::FrameType::kEof, ""));
  EXPECT_EQ(guest_exec::frame_for(exec::Signal{15}),
            frames::encode_frame(frames::FrameType::kKill, "15"));
  EXPECT_EQ(guest_exec::frame_for(exec::Resize{40, 120}),
            frames::encode_frame(frames::FrameType::kResize, "40 120"));
  EXPECT_EQ(guest_exec::frame_for(exec::Start{}), "");
}

TEST(GuestExecFrames, TheGuestsFramesAreTheClientsMessages) {
  auto of = [](frames::FrameType type, std::string bytes) {
    return guest_exec::to_client(frames::Frame{type, std::move(bytes)});
  };
  auto started = of(frames::FrameType::kStarted, "123");
  ASSERT_TRUE(started.text);
  EXPECT_TRUE(std::holds_alternative<exec::Started>(*started.text));
  EXPECT_FALSE(started.last);

  auto out = of(frames::FrameType::kStdout, "hello");
  EXPECT_EQ(out.binary, std::string("\x01hello"));
  EXPECT_FALSE(out.text);
  EXPECT_EQ(of(frames::FrameType::kStderr, "oops").binary, std::string("\x02oops"));

  auto exited = of(frames::FrameType::kExited, "143");
  EXPECT_TRUE(exited.last);
  ASSERT_TRUE(exited.text && std::holds_alternative<exec::Exit>(*exited.text));
  EXPECT_EQ(std::get<exec::Exit>(*exited.text).code, 143);

  auto failed = of(frames::FrameType::kFailed, "127\nnope: No such file or directory");
  EXPECT_TRUE(failed.last);
  ASSERT_TRUE(failed.text && std::holds_alternative<exec::Failure>(*failed.text));
  EXPECT_EQ(std::get<exec::Failure>(*failed.text).code, 127);
  EXPECT_EQ(std::get<exec::Failure>(*failed.text).message, "nope: No such file or directory");

  // What the guest must not send ends the session with a Failure that says so.
  for (const auto& wrong :
       {of(frames::FrameType::kExited, "x"), of(frames::FrameType::kExited, "256"),
        of(frames::FrameType::kFailed, "127"), of(frames::FrameType::kFailed, "0\nfine"),
        of(frames::FrameType::kStdin, "x"), of(frames::FrameType::kExec, ""),
        of(frames::FrameType::kResize, "40 120")}) {
    EXPECT_TRUE(wrong.last);
    ASSERT_TRUE(wrong.text && std::holds_alternative<exec::Failure>(*wrong.text));
    EXPECT_EQ(std::get<exec::Failure>(*wrong.text).code, 125);
    EXPECT_THAT(std::get<exec::Failure>(*wrong.text).message, HasSubstr("guest stream: "));
  }
}

// ---- the relay, end to end ----------------------------------------------------------

// What the client end of the exec WebSocket saw.
struct ClientSaw {
  std::vector<std::string> texts;  // Started, Exit, Failure as JSON
  std::string out, err;
  bool closed = false;
};

class GuestExecRelay : public ::testing::Test {
 protected:
  // A WebSocket pair over a Unix socket: the client connects, the raw
  // connection is taken off the listener and handed to accept_handed_over as
  // the gateway hands an exec to the supervisor.
  void SetUp() override {
    path_ = dir_ / "exec.sock";
    listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(listener_.get(), 4), 0);
    std::promise<std::pair<int, std::string>> accepted;
    std::thread acceptor([&] {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      std::string raw;
      char c;
      while (fd >= 0 && raw.find("\r\n\r\n") == std::string::npos && ::read(fd, &c, 1) == 1)
        raw += c;
      accepted.set_value({fd, raw});
    });
    bool connected = false;
    net::WebSocket::connect(io_, path_, "/v1/exec",
                            [&](std::shared_ptr<net::WebSocket> ws, std::string error) {
                              EXPECT_TRUE(ws) << error;
                              client_ = std::move(ws);
                              connected = true;
                            });
    auto handed = accepted.get_future();
    ASSERT_TRUE(run_until([&] { return handed.wait_for(0s) == std::future_status::ready; }));
    acceptor.join();
    auto [fd, raw] = handed.get();
    std::string error;
    server_ = net::WebSocket::accept_handed_over(io_, fd, raw, &error);
    ASSERT_TRUE(server_) << error;
    ASSERT_TRUE(run_until([&] { return connected; }));
    ASSERT_TRUE(client_);
    auto saw = saw_;
    client_->start(
        [saw](std::string data, bool binary) {
          if (!binary) return saw->texts.push_back(data);
          ASSERT_FALSE(data.empty());
          (data[0] == exec::kStderr ? saw->err : saw->out) += data.substr(1);
        },
        [saw](const std::string&) { saw->closed = true; });
  }

  void TearDown() override {
    if (client_) client_->close();
    run_until([&] { return saw_->closed; }, 2s);
    // Once over, nothing holds the session (no cycle through the
    // WebSocket's handlers): it is gone when the loop has run its last.
    std::weak_ptr<GuestExec> session = session_;
    session_.reset();
    server_.reset();
    if (!ended_ids_.empty()) {
      EXPECT_TRUE(run_until([&] { return session.expired(); }, 10s)) << "the session is kept";
    }
    if (guest_thread_.joinable()) {
      if (guest_end_ >= 0) ::shutdown(guest_end_, SHUT_RDWR);
      guest_thread_.join();
    }
    if (guest_end_ >= 0) ::close(guest_end_);
  }

  // The guest init's side on a socket pair, in a thread; the session gets
  // the other end. on_end records the id.
  void start_session(ExecDefaults defaults = sandbox_defaults()) {
    int pair[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    guest_end_ = pair[1];
    guest_thread_ = std::thread([this] {
      // The relay is what is tested here, the confinement in
      // guest_init_test.cc; without the seccomp filter the test also runs
      // under valgrind, which has no seccomp(2).
      frames::Confinement confinement;
      confinement.seccomp = false;
      served_ = frames::serve_connection(guest_end_, frames::Config{}, confinement);
      served_done_ = true;
    });
    session_ =
        std::make_shared<GuestExec>(io_, server_, UniqueFd(pair[0]), std::move(defaults), 42);
    session_->start([this](uint64_t id) { ended_ids_.push_back(id); });
  }

  void send_text(const exec::Start& m) { client_->send(protocol::encode(m), false); }
  void send_text(const exec::Eof& m) { client_->send(protocol::encode(m), false); }
  void send_text(const exec::Signal& m) { client_->send(protocol::encode(m), false); }
  void send_text(const exec::Resize& m) { client_->send(protocol::encode(m), false); }

  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit = 30s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      io_.restart();
      io_.run_for(2ms);
    }
    return true;
  }
  bool texts_include(const std::string& type) const {
    for (const auto& t : saw_->texts)
      if (t.find("\"type\":\"" + type + "\"") != std::string::npos) return true;
    return false;
  }
  bool over() { return saw_->closed && !ended_ids_.empty(); }

  asio::io_context io_;
  openshell::testing::TempDir dir_;
  std::string path_;
  UniqueFd listener_;
  std::shared_ptr<net::WebSocket> client_, server_;
  std::shared_ptr<ClientSaw> saw_ = std::make_shared<ClientSaw>();
  std::shared_ptr<GuestExec> session_;
  int guest_end_ = -1;
  std::thread guest_thread_;
  std::atomic<int> served_{-1};
  std::atomic<bool> served_done_{false};
  std::vector<uint64_t> ended_ids_;
};

TEST_F(GuestExecRelay, StdinOutputAndTheExitStatusGoThroughInOrder) {
  start_session();
  exec::Start start;
  start.argv = {"sh", "-c", "read line; echo out:$line; echo err:$HOME >&2; exit 3"};
  client_->send("early\n", true);  // before Start: kept until the exec frame has gone
  send_text(start);
  send_text(exec::Eof{});
  ASSERT_TRUE(run_until([&] { return over(); })) << saw_->out << saw_->err;
  EXPECT_EQ(saw_->out, "out:early\n");
  EXPECT_EQ(saw_->err, "err:/root\n") << "the sandbox's environment";
  ASSERT_EQ(saw_->texts.size(), 2u);
  EXPECT_THAT(saw_->texts[0], HasSubstr("\"type\":\"started\""));
  EXPECT_THAT(saw_->texts[1], HasSubstr("\"type\":\"exit\""));
  EXPECT_THAT(saw_->texts[1], HasSubstr("\"code\":3"));
  EXPECT_THAT(ended_ids_, ElementsAre(42u));
  ASSERT_TRUE(run_until([&] { return served_done_.load(); }));
  EXPECT_EQ(served_, 3);
}

// A copy's VM takes only a tar: what the sandbox refuses never reaches the
// guest, and the client hears why.
TEST_F(GuestExecRelay, ACommandTheSandboxRefusesNeverReachesTheGuest) {
  ExecDefaults copy_only = sandbox_defaults();
  copy_only.refuse = [](const std::vector<std::string>& argv, bool) {
    return argv.at(0) == "tar" ? std::string() : "only a tar here";
  };
  start_session(copy_only);
  exec::Start start;
  start.argv = {"sh", "-c", "exit 0"};
  send_text(start);
  ASSERT_TRUE(run_until([&] { return over(); }));
  ASSERT_EQ(saw_->texts.size(), 1u);
  EXPECT_THAT(saw_->texts[0], HasSubstr("\"type\":\"error\""));
  EXPECT_THAT(saw_->texts[0], HasSubstr("only a tar here"));
  // The guest's side got no request: its connection closed unasked.
  ASSERT_TRUE(run_until([&] { return served_done_.load(); }));
  EXPECT_NE(served_, 0);
}

TEST_F(GuestExecRelay, ASignalReachesTheCommand) {
  start_session();
  exec::Start start;
  start.argv = {"sleep", "30"};
  send_text(start);
  ASSERT_TRUE(run_until([&] { return texts_include("started"); }));
  send_text(exec::Signal{SIGTERM});
  ASSERT_TRUE(run_until([&] { return over(); }, 10s)) << "the command outlived its SIGTERM";
  EXPECT_THAT(saw_->texts.back(), HasSubstr("\"code\":143"));
}

TEST_F(GuestExecRelay, ACommandThatIsNotThereIsAFailureWithItsCode) {
  start_session();
  exec::Start start;
  start.argv = {"/nonexistent/command"};
  send_text(start);
  ASSERT_TRUE(run_until([&] { return over(); }));
  ASSERT_EQ(saw_->texts.size(), 1u);
  EXPECT_THAT(saw_->texts[0], HasSubstr("\"type\":\"error\""));
  EXPECT_THAT(saw_->texts[0], HasSubstr("\"code\":127"));
  EXPECT_THAT(saw_->texts[0], HasSubstr("/nonexistent/command"));
}

TEST_F(GuestExecRelay, ATtyHasItsSizeAResizeAndOneStream) {
  start_session();
  exec::Start start;
  start.argv = {"sh", "-c", "tty; stty size; read line; stty size; echo err >&2; exit 4"};
  start.tty = true;
  start.rows = 30;
  start.cols = 100;
  send_text(start);
  ASSERT_TRUE(run_until([&] { return saw_->out.find("30 100\r\n") != std::string::npos; }))
      << saw_->out;
  send_text(exec::Resize{40, 120});
  client_->send("\n", true);
  ASSERT_TRUE(run_until([&] { return over(); })) << saw_->out;
  EXPECT_EQ(saw_->out.rfind("/dev/pts/", 0), 0u) << saw_->out;
  EXPECT_THAT(saw_->out, HasSubstr("40 120\r\n"));
  EXPECT_THAT(saw_->out, HasSubstr("err\r\n")) << "a terminal's one stream";
  EXPECT_EQ(saw_->err, "");
  ASSERT_FALSE(saw_->texts.empty());
  EXPECT_THAT(saw_->texts.back(), HasSubstr("\"code\":4"));
  ASSERT_TRUE(run_until([&] { return served_done_.load(); }));
  EXPECT_EQ(served_, 4);
}

TEST_F(GuestExecRelay, ATtysInputEchoesAndEofEndsIt) {
  start_session();
  exec::Start start;
  start.argv = {"cat"};
  start.tty = true;
  client_->send("typed\n", true);  // before Start: kept, then typed at the terminal
  send_text(start);
  ASSERT_TRUE(run_until([&] { return saw_->out.find("typed\r\ntyped\r\n") != std::string::npos; }))
      << saw_->out;
  send_text(exec::Eof{});
  ASSERT_TRUE(run_until([&] { return over(); })) << saw_->out;
  EXPECT_THAT(saw_->texts.back(), HasSubstr("\"type\":\"exit\""));
  EXPECT_THAT(saw_->texts.back(), HasSubstr("\"code\":0"));
}

TEST_F(GuestExecRelay, AClientThatGoesAwayEndsTheCommand) {
  start_session();
  exec::Start start;
  start.argv = {"sleep", "30"};
  send_text(start);
  ASSERT_TRUE(run_until([&] { return texts_include("started"); }));
  auto before = std::chrono::steady_clock::now();
  client_->close();
  ASSERT_TRUE(run_until([&] { return !ended_ids_.empty(); }, 10s));
  // The guest init kills what its host no longer reads.
  ASSERT_TRUE(run_until([&] { return served_done_.load(); }, 20s)) << "sleep 30 still runs";
  EXPECT_EQ(served_, 128 + SIGKILL);
  EXPECT_LT(std::chrono::steady_clock::now() - before, 20s);
}

TEST_F(GuestExecRelay, TheSandboxEndingUnderItIsExit137) {
  start_session();
  exec::Start start;
  start.argv = {"sleep", "30"};
  send_text(start);
  ASSERT_TRUE(run_until([&] { return texts_include("started"); }));
  session_->sandbox_gone();
  ASSERT_TRUE(run_until([&] { return over(); }));
  EXPECT_THAT(saw_->texts.back(), HasSubstr("\"code\":137"));
  ASSERT_TRUE(run_until([&] { return served_done_.load(); }, 20s));
}

TEST_F(GuestExecRelay, AGuestThatHangsUpIsAFailure) {
  start_session();
  // The guest's end closes under the session before any answer.
  ::shutdown(guest_end_, SHUT_RDWR);
  exec::Start start;
  start.argv = {"true"};
  send_text(start);
  ASSERT_TRUE(run_until([&] { return over(); }));
  ASSERT_FALSE(saw_->texts.empty());
  EXPECT_THAT(saw_->texts.back(), HasSubstr("the guest closed the connection"));
}

}  // namespace
}  // namespace openshell::supervisor
