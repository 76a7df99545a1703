// The API's error body, as error_body writes it and as a client reads it.
#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "net/http.h"
#include "net/http_internal.h"
#include "test_util.h"

namespace openshell::net {
namespace {

using namespace std::chrono_literals;
using detail::error_body;
using openshell::testing::TempDir;

const std::string kReplacement = "\xef\xbf\xbd";  // U+FFFD

TEST(HttpErrorBody, HasTheApiShape) {
  EXPECT_EQ(error_body("not_found", "no sandbox x"),
            R"({"error":{"code":"not_found","message":"no sandbox x"}})");
  EXPECT_EQ(error_body("", ""), R"({"error":{"code":"","message":""}})");
}

TEST(HttpErrorBody, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(error_body("c", "say \"hi\" \\ /"),
            R"({"error":{"code":"c","message":"say \"hi\" \\ /"}})");
  EXPECT_EQ(error_body("c", "a\nb\rc\td\be\ff"),
            R"({"error":{"code":"c","message":"a\nb\rc\td\be\ff"}})");
  EXPECT_EQ(error_body("c", std::string("\x01\x1f\0z", 4)),
            R"({"error":{"code":"c","message":"\u0001\u001f\u0000z"}})");
  // DEL needs no escape in JSON.
  EXPECT_EQ(error_body("c", "\x7f"), "{\"error\":{\"code\":\"c\",\"message\":\"\x7f\"}}");
}

TEST(HttpErrorBody, KeepsValidUtf8AsItIs) {
  std::string text = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x93\xa6";  // café € 📦
  EXPECT_EQ(error_body("c", text), "{\"error\":{\"code\":\"c\",\"message\":\"" + text + "\"}}");
}

// A message may quote bytes a client sent: what is not UTF-8 becomes U+FFFD
// (one for each bad sequence), and the body is still JSON.
TEST(HttpErrorBody, ReplacesBytesThatAreNotUtf8) {
  struct Case {
    std::string bytes, shown;
  };
  for (const Case& c : {Case{"a\xff"
                             "b",
                             "a" + kReplacement + "b"},
                        Case{"\xc3", kReplacement},                     // cut short
                        Case{"\xc0\xaf", kReplacement + kReplacement},  // overlong '/'
                        Case{"\xed\xa0\x80", kReplacement + kReplacement + kReplacement}}) {
    std::string body = error_body("c\xfe", c.bytes);
    EXPECT_EQ(body,
              "{\"error\":{\"code\":\"c" + kReplacement + "\",\"message\":\"" + c.shown + "\"}}")
        << c.bytes;
    EXPECT_TRUE(nlohmann::json::accept(body)) << body;
  }
}

TEST(HttpErrorBody, ParsesBackToTheSameText) {
  std::string message = std::string("q\"\\\n\x01\0 caf\xc3\xa9", 14);
  auto parsed = nlohmann::json::parse(error_body("bad_request", message));
  EXPECT_EQ(parsed["error"]["code"], "bad_request");
  EXPECT_EQ(parsed["error"]["message"], message);
}

// What a client sees: a handler's exception text, with quotes and a byte
// that is not UTF-8 in it, comes back as a 500 whose body is valid JSON.
TEST(HttpErrorBody, AHandlersExceptionReachesTheClientAsJson) {
  TempDir dir;
  std::string path = dir / "api.sock";
  asio::io_context io;
  Server server(io,
                [](std::shared_ptr<Exchange>) { throw std::runtime_error("file \"x\xff\" gone"); });
  server.listen(path, 0600);
  Response response;
  std::string error;
  std::atomic<bool> done{false};
  std::thread client([&] {
    try {
      response = Client(path).request("GET", "/v1/x");
    } catch (const std::exception& e) {
      error = e.what();
    }
    done = true;
  });
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    io.restart();
    io.run_for(10ms);
  }
  if (!done) server.close();  // ends the connection, and so the client
  while (!done) {
    io.restart();
    io.run_for(10ms);
  }
  client.join();
  ASSERT_EQ(error, "");
  EXPECT_EQ(response.status, 500);
  EXPECT_EQ(response.content_type, "application/json");
  EXPECT_EQ(response.body,
            "{\"error\":{\"code\":\"internal\",\"message\":\"internal error: file "
            "\\\"x" +
                kReplacement + "\\\" gone\"}}");
}

}  // namespace
}  // namespace openshell::net
