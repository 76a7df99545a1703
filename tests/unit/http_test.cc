#include "net/http.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/steady_timer.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "test_util.h"

namespace openshell::net {
namespace {

using namespace std::chrono_literals;
using openshell::testing::path_exists;
using openshell::testing::read_file;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;
using ::testing::StartsWith;

// A fresh connection to path that has sent bytes: the fd, or -1 and why.
// Its reads and writes give up after 30 s (far past any deadline of the
// server's under test, however loaded the machine).
int raw_send(const std::string& path, const std::string& bytes, bool half_close,
             std::string* error) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = "<socket failed>";
    return -1;
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    *error = std::string("<connect failed: ") + std::strerror(errno) + ">";
    ::close(fd);
    return -1;
  }
  timeval timeout{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  for (size_t sent = 0; sent < bytes.size();) {
    ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early; read what it said
    sent += static_cast<size_t>(n);
  }
  if (half_close) ::shutdown(fd, SHUT_WR);
  return fd;
}

// Reads fd until the server closes it, and closes it; "<timeout>" is
// appended when it stays open for 30 s, "<reset>" on a reset.
std::string raw_read(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) out += "<timeout>";
    if (n < 0 && errno == ECONNRESET) out += "<reset>";
    break;
  }
  ::close(fd);
  return out;
}

// Sends bytes on a fresh connection to path and reads until the server
// closes it (see raw_read).
std::string raw_exchange(const std::string& path, const std::string& bytes, bool half_close) {
  std::string error;
  int fd = raw_send(path, bytes, half_close, &error);
  return fd < 0 ? error : raw_read(fd);
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A server on a loop that this thread runs; clients that block run on other
// threads beside it.
class NetFixture : public ::testing::Test {
 protected:
  ~NetFixture() override {
    server.reset();
    io.restart();
    io.poll();
  }

  std::string socket_path() const { return dir / "api.sock"; }

  void serve(Server::Handler handler) {
    server = std::make_unique<Server>(io, std::move(handler));
    server->listen(socket_path(), 0600);
  }

  // Runs the loop until done() or the limit; false on timeout.
  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit = 10s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      io.restart();
      if (io.run_for(10ms) == 0) std::this_thread::sleep_for(1ms);
    }
    return true;
  }

  // Runs every handler that is ready (what the kernel has already told, as
  // accepts, reads of an end of file, closes), until none is: what follows
  // sees the loop caught up, however slow the machine.
  void drain() {
    for (int i = 0; i < 100000; ++i) {
      io.restart();
      if (io.poll() == 0) return;
    }
    ADD_FAILURE() << "the loop never ran out of ready handlers";
  }

  // The sockets bound to the server's path, as /proc/net/unix lists them:
  // the listener and the server's end of each connection it holds.
  size_t sockets_at_path() const {
    std::ifstream table("/proc/net/unix");
    size_t count = 0;
    for (std::string line; std::getline(table, line);)
      if (line.size() > socket_path().size() &&
          line.compare(line.size() - socket_path().size(), std::string::npos, socket_path()) == 0)
        ++count;
    return count;
  }

  void run_for(std::chrono::milliseconds how_long) {
    run_until([] { return false; }, how_long);
  }

  // Runs each piece of work on its own thread while this thread runs the
  // loop; false when they did not all finish in time. An exception in one is
  // recorded in thread_errors.
  bool run_beside(std::vector<std::function<void()>> works, std::chrono::milliseconds limit = 60s) {
    auto finished = std::make_shared<std::atomic<size_t>>(0);
    auto errors = std::make_shared<std::vector<std::string>>(works.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < works.size(); ++i)
      threads.emplace_back([work = works[i], finished, errors, i] {
        try {
          work();
        } catch (const std::exception& e) {
          (*errors)[i] = e.what();
        }
        ++*finished;
      });
    auto all_done = [&] { return finished->load() == works.size(); };
    bool ok = run_until(all_done, limit);
    if (!ok) {
      // Unblock the clients: closing the server ends every connection.
      server.reset();
      if (!run_until(all_done, 3s)) {
        std::fprintf(stderr, "http_test: a client thread is stuck; aborting\n");
        std::abort();
      }
    }
    for (auto& thread : threads) thread.join();
    for (auto& error : *errors)
      if (!error.empty()) thread_errors.push_back(error);
    return ok;
  }
  bool run_beside(std::function<void()> work, std::chrono::milliseconds limit = 60s) {
    return run_beside(std::vector<std::function<void()>>{std::move(work)}, limit);
  }

  asio::io_context io;
  TempDir dir;
  std::unique_ptr<Server> server;
  std::vector<std::string> thread_errors;
};

class HttpServer : public NetFixture {
 protected:
  // Records each request and answers with its path (and the POST body).
  void serve_echo() {
    serve([this](std::shared_ptr<Exchange> exchange) {
      requests.push_back(exchange->request());
      const Request& request = exchange->request();
      if (request.method == "POST")
        exchange->respond({201, request.body});
      else if (request.path == "/text")
        exchange->respond({200, "plain words", "text/plain"});
      else
        exchange->respond({200, "{\"path\":\"" + request.path + "\"}"});
    });
  }

  std::vector<Request> requests;
};

class HttpClient : public NetFixture {};

// An upgrade request as a browser or Beast would send it.
std::string upgrade_request(const std::string& target) {
  return "GET " + target +
         " HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
         "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
}

// --- HTTP ------------------------------------------------------------------------

TEST_F(HttpServer, GetAndPostRoundTrip) {
  serve_echo();
  Response get, post, text;
  ASSERT_TRUE(run_beside([&] {
    Client client(socket_path());
    get = client.request("GET", "/v1/ping");
    post = client.request("POST", "/v1/sandboxes", "{\"name\":\"box\"}");
    text = client.request("GET", "/text");
  }));
  ASSERT_THAT(thread_errors, ::testing::IsEmpty());
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.body, "{\"path\":\"/v1/ping\"}");
  EXPECT_EQ(get.content_type, "application/json");
  EXPECT_EQ(post.status, 201);
  EXPECT_EQ(post.body, "{\"name\":\"box\"}");
  EXPECT_EQ(text.content_type, "text/plain");
  EXPECT_EQ(text.body, "plain words");

  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0].method, "GET");
  EXPECT_EQ(requests[0].body, "");
  EXPECT_FALSE(requests[0].websocket);
  EXPECT_EQ(requests[0].headers["host"], "localhost");
  EXPECT_EQ(requests[0].headers.count("content-type"), 0u);
  EXPECT_EQ(requests[1].method, "POST");
  EXPECT_EQ(requests[1].path, "/v1/sandboxes");
  EXPECT_EQ(requests[1].body, "{\"name\":\"box\"}");
  EXPECT_EQ(requests[1].headers["content-type"], "application/json");
  EXPECT_EQ(requests[1].headers["content-length"], "14");
  EXPECT_THAT(requests[1].raw, StartsWith("POST /v1/sandboxes HTTP/1.1\r\n"));
  EXPECT_THAT(requests[1].raw, ::testing::EndsWith("\r\n\r\n{\"name\":\"box\"}"));
}

TEST_F(HttpServer, DecodesPathAndQuery) {
  serve_echo();
  Response response;
  ASSERT_TRUE(run_beside([&] {
    Client client(socket_path());
    response = client.request(
        "GET", "/v1/sandboxes/my%20box/logs?follow=1&since=a%26b&flag&name=x%2Fy%3D&plus=a+b");
    client.request("GET", "/v1/a%2Fb//c/");
  }));
  ASSERT_THAT(thread_errors, ::testing::IsEmpty());
  ASSERT_EQ(requests.size(), 2u);
  const Request& first = requests[0];
  EXPECT_EQ(first.target,
            "/v1/sandboxes/my%20box/logs?follow=1&since=a%26b&flag&name=x%2Fy%3D&plus=a+b");
  EXPECT_EQ(first.path, "/v1/sandboxes/my box/logs");
  EXPECT_THAT(first.segments, ElementsAre("v1", "sandboxes", "my box", "logs"));
  EXPECT_THAT(first.query, ElementsAre(Pair("flag", ""), Pair("follow", "1"), Pair("name", "x/y="),
                                       Pair("plus", "a+b"), Pair("since", "a&b")));
  EXPECT_EQ(response.body, "{\"path\":\"/v1/sandboxes/my box/logs\"}");
  EXPECT_EQ(requests[1].path, "/v1/a/b//c/");
  EXPECT_THAT(requests[1].segments, ElementsAre("v1", "a/b", "c"));
}

TEST_F(HttpServer, MalformedTargetGets400) {
  serve_echo();
  Response bad_escape, encoded_nul, not_a_path;
  ASSERT_TRUE(run_beside([&] {
    bad_escape = Client(socket_path()).request("GET", "/v1/bad%zz");
    encoded_nul = Client(socket_path()).request("GET", "/v1/x?name=a%00b");
    not_a_path = Client(socket_path()).request("GET", "v1/x");
  }));
  ASSERT_THAT(thread_errors, ::testing::IsEmpty());
  EXPECT_EQ(bad_escape.status, 400);
  EXPECT_THAT(bad_escape.body, HasSubstr("\"error\""));
  EXPECT_EQ(encoded_nul.status, 400);
  EXPECT_EQ(not_a_path.status, 400);
  EXPECT_TRUE(requests.empty());
}

TEST_F(HttpServer, HeaderNamesAreLowerCase) {
  serve_echo();
  std::string reply;
  ASSERT_TRUE(run_beside([&] {
    reply = raw_exchange(socket_path(),
                         "GET /h HTTP/1.1\r\nHost: localhost\r\nX-Mixed-CASE: Value\r\n"
                         "x-mixed-case: Two\r\nAUTHORIZATION: Bearer AbC\r\n\r\n",
                         true);
  }));
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 200"));
  ASSERT_EQ(requests.size(), 1u);
  for (const auto& [name, value] : requests[0].headers)
    EXPECT_EQ(name.find_first_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ"), std::string::npos) << name;
  EXPECT_EQ(requests[0].headers["x-mixed-case"], "Value, Two");
  EXPECT_EQ(requests[0].headers["authorization"], "Bearer AbC");  // values keep their case
  EXPECT_EQ(requests[0].headers.count("X-Mixed-CASE"), 0u);
}

TEST_F(HttpServer, KeepAliveServesPipelinedRequestsOnOneConnection) {
  serve_echo();
  std::string reply;
  ASSERT_TRUE(run_beside([&] {
    reply = raw_exchange(socket_path(),
                         "GET /one HTTP/1.1\r\nHost: localhost\r\n\r\n"
                         "POST /two HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n\r\nabc"
                         "GET /three HTTP/1.1\r\nHost: localhost\r\n\r\n",
                         true);
  }));
  EXPECT_EQ(count(reply, "HTTP/1.1 20"), 3u) << reply;
  size_t one = reply.find("/one"), two = reply.find("abc"), three = reply.find("/three");
  ASSERT_NE(one, std::string::npos);
  ASSERT_NE(two, std::string::npos);
  ASSERT_NE(three, std::string::npos);
  EXPECT_LT(one, two);
  EXPECT_LT(two, three);
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[1].body, "abc");
  EXPECT_EQ(requests[1].raw,
            "POST /two HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n\r\nabc");
}

TEST_F(HttpServer, ClientKeepsItsConnectionAcrossRequests) {
  serve_echo();
  Response first, second;
  std::unique_ptr<Client> client;
  ASSERT_TRUE(run_beside([&] {
    client = std::make_unique<Client>(socket_path());
    first = client->request("GET", "/first");
  }));
  // With the socket file gone, only the open connection can carry the second.
  ASSERT_EQ(::unlink(socket_path().c_str()), 0);
  ASSERT_TRUE(run_beside([&] { second = client->request("GET", "/second"); }));
  ASSERT_THAT(thread_errors, ::testing::IsEmpty());
  EXPECT_EQ(first.body, "{\"path\":\"/first\"}");
  EXPECT_EQ(second.body, "{\"path\":\"/second\"}");
}

TEST_F(HttpServer, HandlerMayAnswerLater) {
  std::vector<std::shared_ptr<asio::steady_timer>> timers;
  serve([&](std::shared_ptr<Exchange> exchange) {
    auto timer = std::make_shared<asio::steady_timer>(io, 150ms);
    timers.push_back(timer);
    timer->async_wait([exchange](boost::system::error_code) {
      exchange->respond({200, "{\"late\":\"" + exchange->request().path + "\"}"});
    });
  });
  Response first, second;
  std::chrono::steady_clock::duration took{};
  ASSERT_TRUE(run_beside([&] {
    Client client(socket_path());
    auto start = std::chrono::steady_clock::now();
    first = client.request("GET", "/a");
    took = std::chrono::steady_clock::now() - start;
    second = client.request("GET", "/b");
  }));
  ASSERT_THAT(thread_errors, ::testing::IsEmpty());
  EXPECT_EQ(first.body, "{\"late\":\"/a\"}");
  EXPECT_EQ(second.body, "{\"late\":\"/b\"}");
  EXPECT_GE(took, 150ms);
}

TEST_F(HttpServer, SecondAnswerIsIgnored) {
  serve([](std::shared_ptr<Exchange> exchange) {
    exchange->respond({200, "{\"n\":1}"});
    exchange->respond({500, "{\"n\":2}"});
  });
  Response first, second;
  ASSERT_TRUE(run_beside([&] {
    Client client(socket_path());
    first = client.request("GET", "/a");
    second = client.request("GET", "/b");
  }));
  ASSERT_THAT(thread_errors, ::testing::IsEmpty());
  EXPECT_EQ(first.body, "{\"n\":1}");
  EXPECT_EQ(second.body, "{\"n\":1}");
}

TEST_F(HttpServer, GarbageGets400AndTheConnectionCloses) {
  int calls = 0;
  serve([&](std::shared_ptr<Exchange> exchange) {
    ++calls;
    exchange->respond({});
  });
  std::string garbage, huge_header, huge_body, early_end;
  ASSERT_TRUE(run_beside([&] {
    // Not half-closed: the server itself must end the connection.
    garbage = raw_exchange(socket_path(), std::string("\x01\x02 garbage\r\n\r\n", 15), false);
    huge_header =
        raw_exchange(socket_path(),
                     "GET / HTTP/1.1\r\nX-Big: " + std::string(70 << 10, 'a') + "\r\n\r\n", false);
    huge_body =
        raw_exchange(socket_path(), "POST / HTTP/1.1\r\nContent-Length: 16777217\r\n\r\n", false);
    early_end =
        raw_exchange(socket_path(), "POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", true);
  }));
  for (const std::string* reply : {&garbage, &huge_header, &huge_body, &early_end}) {
    EXPECT_THAT(*reply, StartsWith("HTTP/1.1 400 Bad Request\r\n"));
    EXPECT_THAT(*reply, HasSubstr("Connection: close"));
    EXPECT_THAT(*reply, ::testing::Not(HasSubstr("<timeout>")));
  }
  EXPECT_EQ(calls, 0);
}

TEST_F(HttpServer, PeerIsThisProcess) {
  std::vector<PeerCredentials> peers;
  serve([&](std::shared_ptr<Exchange> exchange) {
    peers.push_back(exchange->peer());
    exchange->respond({});
  });
  ASSERT_TRUE(run_beside([&] { Client(socket_path()).request("GET", "/"); }));
  ASSERT_EQ(peers.size(), 1u);
  EXPECT_EQ(peers[0].pid, ::getpid());
  EXPECT_EQ(peers[0].uid, ::getuid());
  EXPECT_EQ(peers[0].gid, ::getgid());
}

TEST_F(HttpServer, HandlerExceptionAnswers500) {
  serve([](std::shared_ptr<Exchange> exchange) {
    if (exchange->request().path == "/boom") throw std::runtime_error("boom");
    exchange->respond({200, "{}"});
  });
  Response boom, after;
  ASSERT_TRUE(run_beside([&] {
    Client client(socket_path());
    boom = client.request("GET", "/boom");
    after = client.request("GET", "/fine");
  }));
  ASSERT_THAT(thread_errors, ::testing::IsEmpty());
  EXPECT_EQ(boom.status, 500);
  EXPECT_THAT(boom.body, HasSubstr("boom"));
  EXPECT_EQ(after.status, 200);
}

TEST_F(HttpServer, DroppedExchangeClosesTheConnection) {
  serve([](std::shared_ptr<Exchange>) {});
  std::string error;
  ASSERT_TRUE(run_beside([&] {
    try {
      Client(socket_path()).request("GET", "/");
    } catch (const Error& e) {
      error = e.what();
    }
  }));
  EXPECT_EQ(error, "the gateway closed the connection");
}

TEST_F(HttpServer, FiftyConcurrentClients) {
  serve_echo();
  constexpr int kClients = 50;
  std::vector<std::unique_ptr<Client>> clients;
  // All connect before the server accepts any: the backlog must hold them.
  auto connecting = std::async(std::launch::async, [&] {
    for (int i = 0; i < kClients; ++i) clients.push_back(std::make_unique<Client>(socket_path()));
  });
  bool connected = connecting.wait_for(5s) == std::future_status::ready;
  if (!connected) run_until([&] { return connecting.wait_for(0s) == std::future_status::ready; });
  EXPECT_TRUE(connected) << "connecting 50 clients blocked: backlog too small";
  ASSERT_NO_THROW(connecting.get());

  std::vector<std::vector<Response>> responses(kClients);
  std::vector<std::function<void()>> works;
  for (int i = 0; i < kClients; ++i)
    works.push_back([&, i] {
      for (int round = 0; round < 3; ++round)
        responses[i].push_back(clients[i]->request(
            "GET", "/client/" + std::to_string(i) + "/" + std::to_string(round)));
    });
  ASSERT_TRUE(run_beside(works, 20s));
  ASSERT_THAT(thread_errors, ::testing::IsEmpty());
  for (int i = 0; i < kClients; ++i) {
    ASSERT_EQ(responses[i].size(), 3u);
    for (int round = 0; round < 3; ++round)
      EXPECT_EQ(responses[i][round].body,
                "{\"path\":\"/client/" + std::to_string(i) + "/" + std::to_string(round) + "\"}");
  }
  EXPECT_EQ(requests.size(), 150u);
}

TEST_F(HttpServer, ListenReplacesAStaleSocket) {
  // A socket file nobody listens on, as a crashed server leaves it.
  int stale = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket_path().c_str(), sizeof address.sun_path - 1);
  ASSERT_EQ(::bind(stale, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ::close(stale);
  ASSERT_TRUE(path_exists(socket_path()));

  serve_echo();
  struct stat st;
  ASSERT_EQ(::stat(socket_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  Response response;
  ASSERT_TRUE(run_beside([&] { response = Client(socket_path()).request("GET", "/x"); }));
  EXPECT_EQ(response.status, 200);
}

TEST_F(HttpServer, ListenAppliesTheMode) {
  server = std::make_unique<Server>(io, [](std::shared_ptr<Exchange> e) { e->respond({}); });
  server->listen(socket_path(), 0660);
  struct stat st;
  ASSERT_EQ(::stat(socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
}

TEST_F(HttpServer, ListenRefusesToDeleteARegularFile) {
  write_file(socket_path(), "precious");
  Server refused(io, [](std::shared_ptr<Exchange> e) { e->respond({}); });
  try {
    refused.listen(socket_path(), 0600);
    ADD_FAILURE() << "listen over a regular file succeeded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a socket"));
  }
  EXPECT_EQ(read_file(socket_path()), "precious");
}

TEST_F(HttpServer, ListenRefusesASocketInUse) {
  serve_echo();
  Server second(io, [](std::shared_ptr<Exchange> e) { e->respond({500, "{}"}); });
  EXPECT_THROW(second.listen(socket_path(), 0600), Error);
  Response response;
  ASSERT_TRUE(run_beside([&] { response = Client(socket_path()).request("GET", "/still"); }));
  EXPECT_EQ(response.body, "{\"path\":\"/still\"}");
}

TEST_F(HttpServer, CloseStopsAcceptingAndRemovesTheSocket) {
  serve_echo();
  server->close();
  EXPECT_FALSE(path_exists(socket_path()));
  try {
    Client client(socket_path());
    ADD_FAILURE() << "connected after close()";
  } catch (const ConnectError& e) {
    EXPECT_EQ(e.err(), ENOENT);
  }
}

TEST_F(HttpServer, CloseLetsAnOpenExchangeFinish) {
  asio::steady_timer timer(io);
  bool removed = false;
  serve([&](std::shared_ptr<Exchange> exchange) {
    server->close();
    removed = !path_exists(socket_path());
    timer.expires_after(100ms);
    timer.async_wait([exchange](boost::system::error_code) {
      exchange->respond({200, "{\"done\":true}"});
    });
  });
  Response response;
  std::string second_error;
  ASSERT_TRUE(run_beside([&] {
    Client client(socket_path());
    response = client.request("GET", "/slow");
    // The server closed the connection after that answer, and listens no more.
    try {
      client.request("GET", "/again");
    } catch (const ConnectError& e) {
      second_error = e.what();
    }
  }));
  ASSERT_THAT(thread_errors, ::testing::IsEmpty());
  EXPECT_TRUE(removed);
  EXPECT_EQ(response.body, "{\"done\":true}");
  EXPECT_THAT(second_error, HasSubstr("No such file"));
}

TEST_F(HttpClient, ConnectToAMissingSocketThrowsEnoent) {
  std::string missing = dir / "missing.sock";
  try {
    Client client(missing);
    ADD_FAILURE() << "connected to a missing socket";
  } catch (const ConnectError& e) {
    EXPECT_EQ(e.err(), ENOENT);
    EXPECT_THAT(e.what(), StartsWith("connect " + missing + ": "));
    EXPECT_THAT(e.what(), HasSubstr("No such file or directory"));
  }
}

TEST_F(HttpClient, ConnectToANonListeningSocketThrowsConnrefused) {
  int stale = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket_path().c_str(), sizeof address.sun_path - 1);
  ASSERT_EQ(::bind(stale, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ::close(stale);
  try {
    Client client(socket_path());
    ADD_FAILURE() << "connected to a dead socket";
  } catch (const ConnectError& e) {
    EXPECT_EQ(e.err(), ECONNREFUSED);
  }
}

TEST_F(HttpClient, ServerGoneIsAnError) {
  serve([](std::shared_ptr<Exchange> e) { e->respond({}); });
  std::unique_ptr<Client> client;
  ASSERT_TRUE(run_beside([&] {
    client = std::make_unique<Client>(socket_path());
    client->request("GET", "/");
  }));
  server.reset();  // closes the idle connection
  drain();
  try {
    client->request("GET", "/");
    ADD_FAILURE() << "a request on a closed connection succeeded";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "the gateway closed the connection");
  }
}

TEST(NetPercentEncode, EncodesAllButUnreserved) {
  EXPECT_EQ(percent_encode("a b/c"), "a%20b%2Fc");
  EXPECT_EQ(percent_encode("AZaz09-._~"), "AZaz09-._~");
  EXPECT_EQ(percent_encode("?&=+%#"), "%3F%26%3D%2B%25%23");
  EXPECT_EQ(percent_encode("\xc3\xa9"), "%C3%A9");
  EXPECT_EQ(percent_encode(std::string("\0x", 2)), "%00x");
  EXPECT_EQ(percent_encode(""), "");
}

TEST_F(HttpServer, PercentEncodedTargetDecodesBack) {
  serve_echo();
  std::string name = "we/ird name?&=%+\xc3\xa9";
  ASSERT_TRUE(run_beside([&] {
    Client(socket_path())
        .request("GET", "/v1/" + percent_encode(name) + "?q=" + percent_encode(name));
  }));
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_THAT(requests[0].segments, ElementsAre("v1", name));
  EXPECT_EQ(requests[0].query["q"], name);
}

// --- WebSocket ------------------------------------------------------------------

// What one side of a WebSocket saw.
struct Seen {
  std::vector<std::pair<std::string, bool>> messages;
  std::vector<std::string> closes;
};

void start_recording(const std::shared_ptr<WebSocket>& ws, const std::shared_ptr<Seen>& seen) {
  ws->start([seen](std::string data,
                   bool binary) { seen->messages.emplace_back(std::move(data), binary); },
            [seen](const std::string& reason) { seen->closes.push_back(reason); });
}

// Echoes every message back on the same socket.
void start_echo(const std::shared_ptr<WebSocket>& ws, const std::shared_ptr<Seen>& seen) {
  std::weak_ptr<WebSocket> weak = ws;
  ws->start(
      [weak, seen](std::string data, bool binary) {
        seen->messages.emplace_back(data, binary);
        if (auto self = weak.lock()) self->send(std::move(data), binary);
      },
      [seen](const std::string& reason) { seen->closes.push_back(reason); });
}

struct Connected {
  bool done = false;
  std::shared_ptr<WebSocket> ws;
  std::string error;
};

class WebSocketEcho : public NetFixture {
 protected:
  void SetUp() override {
    serve([this](std::shared_ptr<Exchange> exchange) {
      const Request& request = exchange->request();
      if (!request.websocket) {
        exchange->respond({404, "{\"error\":\"not a stream\"}"});
      } else if (request.path == "/v1/refuse") {
        exchange->respond({403, "{\"error\":\"superseded\"}"});
      } else if (request.path == "/v1/handover") {
        handed_raw = request.raw;
        int fd = exchange->release();
        std::string error;
        auto ws = WebSocket::accept_handed_over(io, fd, request.raw, &error);
        if (!ws) {
          handover_error = error;
          return;
        }
        ws->send("hello before the handshake completed", false);
        server_ws = ws;
        start_echo(ws, server_seen);
      } else {
        server_ws = exchange->upgrade();
        start_echo(server_ws, server_seen);
      }
    });
  }

  std::shared_ptr<Connected> connect(const std::string& target) {
    auto state = std::make_shared<Connected>();
    WebSocket::connect(io, socket_path(), target,
                       [state](std::shared_ptr<WebSocket> ws, std::string error) {
                         state->ws = std::move(ws);
                         state->error = std::move(error);
                         state->done = true;
                       });
    EXPECT_TRUE(run_until([&] { return state->done; })) << "connect timed out";
    return state;
  }

  std::shared_ptr<WebSocket> connect_and_start(const std::string& target) {
    auto state = connect(target);
    if (!state->ws) {
      ADD_FAILURE() << "connect failed: " << state->error;
      return nullptr;
    }
    start_recording(state->ws, client_seen);
    return state->ws;
  }

  std::shared_ptr<WebSocket> server_ws;
  std::shared_ptr<Seen> server_seen = std::make_shared<Seen>();
  std::shared_ptr<Seen> client_seen = std::make_shared<Seen>();
  std::string handed_raw;
  std::string handover_error;
};

TEST_F(WebSocketEcho, TextAndBinaryEchoInOrder) {
  auto ws = connect_and_start("/v1/echo");
  ASSERT_TRUE(ws);
  std::vector<std::pair<std::string, bool>> sent;
  for (int i = 0; i < 100; ++i) {
    bool binary = i % 2 == 1;
    std::string data =
        (binary ? std::string("\0\xff", 2) : std::string("text ")) + std::to_string(i);
    sent.emplace_back(data, binary);
    ws->send(data, binary);
  }
  ASSERT_TRUE(run_until([&] { return client_seen->messages.size() >= 100; }));
  EXPECT_EQ(client_seen->messages, sent);
  EXPECT_EQ(server_seen->messages, sent);
  EXPECT_TRUE(client_seen->closes.empty());
  ASSERT_TRUE(server_ws);
  EXPECT_EQ(server_ws->peer().pid, ::getpid());
  EXPECT_EQ(ws->peer().pid, ::getpid());
  EXPECT_EQ(ws->peer().uid, ::getuid());
}

TEST_F(WebSocketEcho, FiveMegabyteBinaryMessage) {
  auto ws = connect_and_start("/v1/echo");
  ASSERT_TRUE(ws);
  std::string big(5 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 131 + i / 7) & 0xff);
  ws->send(big, true);
  EXPECT_EQ(ws->queued_bytes(), big.size());
  ASSERT_TRUE(run_until([&] { return !client_seen->messages.empty(); }, 20s));
  ASSERT_EQ(client_seen->messages.size(), 1u);
  EXPECT_TRUE(client_seen->messages[0].second);
  EXPECT_TRUE(client_seen->messages[0].first == big) << "the echo differs";
  EXPECT_EQ(ws->queued_bytes(), 0u);
  EXPECT_EQ(server_ws->queued_bytes(), 0u);
}

TEST_F(WebSocketEcho, OversizedMessageEndsTheStream) {
  auto ws = connect_and_start("/v1/echo");
  ASSERT_TRUE(ws);
  ws->send(std::string((16 << 20) + 1, 'x'), true);
  ASSERT_TRUE(
      run_until([&] { return !client_seen->closes.empty() && !server_seen->closes.empty(); }, 20s));
  EXPECT_TRUE(server_seen->messages.empty());
  EXPECT_EQ(server_seen->closes.size(), 1u);
  EXPECT_NE(server_seen->closes[0], "closed");
  EXPECT_EQ(client_seen->closes.size(), 1u);
}

TEST_F(WebSocketEcho, CloseHandshakeCallsOnCloseOnceOnEachSide) {
  auto ws = connect_and_start("/v1/echo");
  ASSERT_TRUE(ws);
  ws->send("last words", false);
  ws->close("done");
  ASSERT_TRUE(
      run_until([&] { return !client_seen->closes.empty() && !server_seen->closes.empty(); }));
  EXPECT_THAT(server_seen->messages, ElementsAre(Pair("last words", false)));
  EXPECT_THAT(client_seen->closes, ElementsAre("done"));
  EXPECT_THAT(server_seen->closes, ElementsAre("done"));

  // Sends and closes after the end are ignored, on both sides.
  ws->send("too late", false);
  ws->close("again");
  server_ws->send("too late", true);
  server_ws->close();
  EXPECT_EQ(ws->queued_bytes(), 0u);
  EXPECT_EQ(server_ws->queued_bytes(), 0u);
  drain();
  EXPECT_EQ(client_seen->closes.size(), 1u);
  EXPECT_EQ(server_seen->closes.size(), 1u);
  EXPECT_EQ(server_seen->messages.size(), 1u);
}

TEST_F(WebSocketEcho, ServerCloseDeliversQueuedMessagesFirst) {
  serve([this](std::shared_ptr<Exchange> exchange) {
    server_ws = exchange->upgrade();
    start_recording(server_ws, server_seen);
    for (int i = 0; i < 3; ++i) server_ws->send("message " + std::to_string(i), false);
    server_ws->close("bye");
    server_ws->send("after close", false);
  });
  auto ws = connect_and_start("/v1/anything");
  ASSERT_TRUE(ws);
  ASSERT_TRUE(run_until([&] { return !client_seen->closes.empty(); }));
  EXPECT_THAT(client_seen->messages, ElementsAre(Pair("message 0", false), Pair("message 1", false),
                                                 Pair("message 2", false)));
  EXPECT_THAT(client_seen->closes, ElementsAre("bye"));
  ASSERT_TRUE(run_until([&] { return !server_seen->closes.empty(); }));
  EXPECT_THAT(server_seen->closes, ElementsAre("bye"));
}

TEST_F(WebSocketEcho, PeerVanishingIsAnErrorClose) {
  std::string reply;
  ASSERT_TRUE(run_beside([&] {
    // The client upgrades, then goes away without a close frame.
    reply = raw_exchange(socket_path(), upgrade_request("/v1/echo"), true);
  }));
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 101"));
  ASSERT_TRUE(run_until([&] { return !server_seen->closes.empty(); }));
  drain();
  ASSERT_EQ(server_seen->closes.size(), 1u);
  EXPECT_NE(server_seen->closes[0], "closed");
}

TEST_F(WebSocketEcho, HandlerExceptionInOnMessageClosesTheStream) {
  serve([this](std::shared_ptr<Exchange> exchange) {
    server_ws = exchange->upgrade();
    auto seen = server_seen;
    server_ws->start([](std::string, bool) { throw std::runtime_error("bad message"); },
                     [seen](const std::string& reason) { seen->closes.push_back(reason); });
  });
  auto ws = connect_and_start("/v1/anything");
  ASSERT_TRUE(ws);
  ws->send("trigger", false);
  ASSERT_TRUE(
      run_until([&] { return !client_seen->closes.empty() && !server_seen->closes.empty(); }));
  EXPECT_THAT(server_seen->closes, ElementsAre(HasSubstr("exception")));
  EXPECT_EQ(client_seen->closes.size(), 1u);
}

TEST_F(WebSocketEcho, ConnectToAMissingSocketReportsTheReason) {
  server.reset();
  auto state = connect("/v1/echo");
  EXPECT_EQ(state->ws, nullptr);
  EXPECT_THAT(state->error, HasSubstr("No such file or directory"));
  EXPECT_THAT(state->error, HasSubstr(socket_path()));
}

TEST_F(WebSocketEcho, RefusedUpgradeReportsStatusAndBody) {
  auto state = connect("/v1/refuse");
  EXPECT_EQ(state->ws, nullptr);
  EXPECT_THAT(state->error, HasSubstr("403"));
  EXPECT_THAT(state->error, HasSubstr("superseded"));
}

TEST_F(WebSocketEcho, HandedOverConnectionWorks) {
  auto ws = connect_and_start("/v1/handover");
  ASSERT_TRUE(ws);
  EXPECT_EQ(handover_error, "");
  EXPECT_THAT(handed_raw, StartsWith("GET /v1/handover HTTP/1.1\r\n"));
  EXPECT_THAT(handed_raw, ::testing::EndsWith("\r\n\r\n"));
  ws->send("ping", false);
  ws->send(std::string("\x00\x01\x02", 3), true);
  ASSERT_TRUE(run_until([&] { return client_seen->messages.size() >= 3; }));
  EXPECT_THAT(client_seen->messages,
              ElementsAre(Pair("hello before the handshake completed", false), Pair("ping", false),
                          Pair(std::string("\x00\x01\x02", 3), true)));
  ASSERT_TRUE(server_ws);
  EXPECT_EQ(server_ws->peer().pid, ::getpid());
  ws->close();
  ASSERT_TRUE(
      run_until([&] { return !client_seen->closes.empty() && !server_seen->closes.empty(); }));
  EXPECT_THAT(client_seen->closes, ElementsAre("closed"));
  EXPECT_THAT(server_seen->closes, ElementsAre("closed"));
}

TEST_F(WebSocketEcho, ReleaseRefusesWhenBytesFollowTheRequest) {
  std::string release_error;
  serve([&](std::shared_ptr<Exchange> exchange) {
    try {
      int fd = exchange->release();
      ::close(fd);
      exchange->respond({200, "{}"});
    } catch (const Error& e) {
      release_error = e.what();
      exchange->respond({409, "{}"});
    }
  });
  std::string reply;
  ASSERT_TRUE(run_beside([&] {
    // One write: the request and a frame the client should not have sent yet.
    reply = raw_exchange(socket_path(), upgrade_request("/v1/handover") + "EXTRA", true);
  }));
  EXPECT_THAT(release_error, HasSubstr("5 bytes after the request"));
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 409"));
}

TEST_F(WebSocketEcho, AcceptHandedOverRejectsAPlainRequest) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  std::string error;
  auto ws = WebSocket::accept_handed_over(io, fds[0], "GET / HTTP/1.1\r\nHost: x\r\n\r\n", &error);
  EXPECT_EQ(ws, nullptr);
  EXPECT_THAT(error, HasSubstr("not a WebSocket upgrade"));
  EXPECT_EQ(::fcntl(fds[0], F_GETFD), -1) << "the fd was not closed";
  ::close(fds[1]);
  std::string garbage_error;
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  EXPECT_EQ(WebSocket::accept_handed_over(io, fds[0], "garbage", &garbage_error), nullptr);
  EXPECT_NE(garbage_error, "");
  ::close(fds[1]);
}

TEST_F(WebSocketEcho, PlainRequestToAStreamGets404) {
  Response response;
  ASSERT_TRUE(run_beside([&] { response = Client(socket_path()).request("GET", "/v1/echo"); }));
  EXPECT_EQ(response.status, 404);
}

// --- deadlines and the per-uid cap --------------------------------------------------

class HttpLimits : public NetFixture {
 protected:
  void serve_limited(ServerLimits limits) {
    server = std::make_unique<Server>(
        io,
        [this](std::shared_ptr<Exchange> exchange) {
          ++served;
          exchange->respond({200, "{\"path\":\"" + exchange->request().path + "\"}"});
        },
        limits);
    server->listen(socket_path(), 0600);
  }

  // raw_exchange, and how long the server kept the connection.
  std::string timed_exchange(const std::string& bytes, long* elapsed_ms) {
    auto start = std::chrono::steady_clock::now();
    std::string reply = raw_exchange(socket_path(), bytes, false);
    *elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
    return reply;
  }

  int served = 0;
};

ServerLimits short_limits() {
  ServerLimits limits;
  limits.header_timeout = 300ms;
  limits.body_timeout = 300ms;
  limits.idle_timeout = 300ms;
  return limits;
}

// A slow client holds half a request head: the server answers 408 and closes
// at the deadline, and serves another client meanwhile (one that connects
// after the slow one has sent its half, and is answered before it is read).
TEST_F(HttpLimits, HalfAHeadIsClosedAtTheHeaderDeadlineWhileOthersAreServed) {
  serve_limited(short_limits());
  std::string slow;
  long slow_ms = 0;
  Response fast;
  ASSERT_TRUE(run_beside([&] {
    auto start = std::chrono::steady_clock::now();
    std::string error;
    int fd = raw_send(socket_path(), "GET /slow HTTP/1.1\r\nHost: loc", false, &error);
    if (fd < 0) throw std::runtime_error(error);
    fast = Client(socket_path()).request("GET", "/fast");
    slow = raw_read(fd);
    slow_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
  }));
  ASSERT_THAT(thread_errors, ::testing::IsEmpty());
  EXPECT_THAT(slow, StartsWith("HTTP/1.1 408"));
  EXPECT_THAT(slow, HasSubstr("no complete request head within 300 ms"));
  EXPECT_THAT(slow, Not(HasSubstr("<timeout>"))) << "the server closed it";
  EXPECT_GE(slow_ms, 250);
  EXPECT_EQ(fast.status, 200);
  EXPECT_EQ(served, 1);
}

TEST_F(HttpLimits, AConnectionThatSendsNothingIsClosed) {
  serve_limited(short_limits());
  std::string reply;
  long ms = 0;
  ASSERT_TRUE(run_beside([&] { reply = timed_exchange("", &ms); }));
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 408"));
  EXPECT_THAT(reply, Not(HasSubstr("<timeout>"))) << "the server closed it";
  EXPECT_GE(ms, 250);
}

TEST_F(HttpLimits, AStalledBodyIsClosed) {
  serve_limited(short_limits());
  std::string reply;
  long ms = 0;
  ASSERT_TRUE(run_beside([&] {
    reply = timed_exchange("POST /x HTTP/1.1\r\nHost: l\r\nContent-Length: 10\r\n\r\nabc", &ms);
  }));
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 408"));
  EXPECT_THAT(reply, HasSubstr("the request body stalled for 300 ms"));
  EXPECT_THAT(reply, Not(HasSubstr("<timeout>"))) << "the server closed it";
  EXPECT_GE(ms, 250);
  EXPECT_EQ(served, 0);
}

// After an answer, a keep-alive connection left unused closes.
TEST_F(HttpLimits, AnIdleKeepAliveConnectionIsClosed) {
  ServerLimits limits = short_limits();
  limits.header_timeout = 10s;
  serve_limited(limits);
  std::string reply;
  long ms = 0;
  ASSERT_TRUE(
      run_beside([&] { reply = timed_exchange("GET /once HTTP/1.1\r\nHost: l\r\n\r\n", &ms); }));
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(reply, Not(HasSubstr("<timeout>")));
  EXPECT_GE(ms, 250);
}

// A client that was busy past the head deadline between connecting and its
// first request (or past the idle deadline between two) connects again.
TEST_F(HttpLimits, ClientReconnectsWhenTheServerClosedItsConnection) {
  serve_limited(short_limits());
  std::unique_ptr<Client> client;
  Response first, second;
  ASSERT_TRUE(run_beside([&] { client = std::make_unique<Client>(socket_path()); }));
  // The head deadline passes: the server answers 408 and closes its end
  // (only the listener is left at the path).
  ASSERT_TRUE(run_until([&] { return sockets_at_path() == 1; }, 30s));
  ASSERT_TRUE(run_beside([&] { first = client->request("GET", "/first"); }));
  ASSERT_TRUE(run_until([&] { return sockets_at_path() == 1; }, 30s));  // the idle deadline
  ASSERT_TRUE(run_beside([&] { second = client->request("GET", "/second"); }));
  ASSERT_THAT(thread_errors, ::testing::IsEmpty());
  EXPECT_EQ(first.status, 200);
  EXPECT_EQ(first.body, "{\"path\":\"/first\"}");
  EXPECT_EQ(second.status, 200);
  EXPECT_EQ(served, 2);
}

// A client looping on refused connections cannot fill the log.
TEST_F(HttpLimits, RefusalsAreLoggedAtMostTwentyAtATime) {
  serve_limited(ServerLimits{});
  server->set_admission([](int, const PeerCredentials&) -> std::optional<Refusal> {
    return Refusal{403, "peer_in_sandbox", "no"};
  });
  std::string log_path = dir / "stderr";
  int saved = ::dup(2);
  int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(log_fd, 0);
  ::dup2(log_fd, 2);
  std::vector<int> statuses;
  bool ok = run_beside([&] {
    for (int i = 0; i < 40; ++i)
      statuses.push_back(Client(socket_path()).request("GET", "/").status);
  });
  ::dup2(saved, 2);
  ::close(saved);
  ::close(log_fd);
  ASSERT_TRUE(ok);
  EXPECT_EQ(statuses, std::vector<int>(40, 403));
  EXPECT_EQ(count(read_file(log_path), "API: refused a connection"), 20u);
}

TEST(ServerLimitsFromEnvironment, ReadsAndChecksTheVariables) {
  openshell::testing::ScopedEnv header("OPENSHELL_API_HEADER_TIMEOUT_MS", "1500");
  openshell::testing::ScopedEnv cap("OPENSHELL_API_MAX_CONNECTIONS_PER_UID", "7");
  ServerLimits limits = ServerLimits::from_environment();
  EXPECT_EQ(limits.header_timeout, 1500ms);
  EXPECT_EQ(limits.max_connections_per_uid, 7u);
  EXPECT_EQ(limits.idle_timeout, 60000ms);
  openshell::testing::ScopedEnv bad("OPENSHELL_API_IDLE_TIMEOUT_MS", "soon");
  try {
    ServerLimits::from_environment();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "OPENSHELL_API_IDLE_TIMEOUT_MS=soon: expected a whole number from 1 to 86400000");
  }
}

int connect_raw(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// cap connections held open by one uid: the next is refused with a 503 line,
// and once one closes the server serves again.
TEST_F(HttpLimits, ConnectionsPerUidAreCapped) {
  ServerLimits limits;
  limits.max_connections_per_uid = 3;
  serve_limited(limits);
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) held.push_back(connect_raw(socket_path()));
  for (int fd : held) ASSERT_GE(fd, 0);
  drain();  // the server accepts them
  std::string extra;
  Response refused;
  ASSERT_TRUE(run_beside([&] {
    extra = raw_exchange(socket_path(), "GET /extra HTTP/1.1\r\nHost: l\r\n\r\n", false);
    refused = Client(socket_path()).request("GET", "/extra");
  }));
  ASSERT_THAT(thread_errors, ::testing::IsEmpty());
  EXPECT_THAT(extra, StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(extra, HasSubstr("too_many_connections"));
  EXPECT_EQ(refused.status, 503);
  EXPECT_THAT(refused.body, HasSubstr("already has 3 connections open (the limit is 3)"));
  EXPECT_EQ(served, 0);
  ::close(held[0]);
  drain();  // the server reads its end of file
  Response again;
  ASSERT_TRUE(run_beside([&] { again = Client(socket_path()).request("GET", "/again"); }));
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(served, 1);
  for (size_t i = 1; i < held.size(); ++i) ::close(held[i]);
}

// An admission that refuses: the client reads the refusal, the handler never
// runs, and nothing of the request was read.
TEST_F(HttpLimits, AdmissionRefusesWithItsLine) {
  serve_limited(ServerLimits{});
  server->set_admission([](int, const PeerCredentials& peer) -> std::optional<Refusal> {
    return Refusal{403, "peer_in_sandbox", "not for uid " + std::to_string(peer.uid)};
  });
  Response response;
  std::string ws_error = "<none>";
  ASSERT_TRUE(run_beside([&] { response = Client(socket_path()).request("POST", "/v1/x", "{}"); }));
  WebSocket::connect(
      io, socket_path(), "/v1/stream",
      [&](std::shared_ptr<WebSocket> ws, std::string why) { ws_error = ws ? "<connected>" : why; });
  ASSERT_TRUE(run_until([&] { return ws_error != "<none>"; }));
  EXPECT_EQ(response.status, 403);
  EXPECT_EQ(response.body, "{\"error\":{\"code\":\"peer_in_sandbox\",\"message\":\"not for uid " +
                               std::to_string(::geteuid()) + "\"}}");
  EXPECT_THAT(ws_error, HasSubstr("refused: 403"));
  EXPECT_EQ(served, 0);
}

}  // namespace
}  // namespace openshell::net
