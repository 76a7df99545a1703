#include "net/endpoint.h"

#include <gtest/gtest.h>

#include "base/error.h"

namespace openshell::net {
namespace {

TEST(Endpoint, ParsesEachForm) {
  Endpoint u = Endpoint::parse("unix:///run/openshell/gateway.sock");
  EXPECT_EQ(u.kind, Endpoint::Kind::kUnix);
  EXPECT_EQ(u.socket_path, "/run/openshell/gateway.sock");
  EXPECT_EQ(Endpoint::parse("/tmp/g.sock").socket_path, "/tmp/g.sock");

  Endpoint t = Endpoint::parse("https://127.0.0.1:17670/");
  EXPECT_EQ(t.kind, Endpoint::Kind::kTls);
  EXPECT_EQ(t.host, "127.0.0.1");
  EXPECT_EQ(t.port, 17670);
  EXPECT_EQ(t.url(), "https://127.0.0.1:17670");

  Endpoint v6 = Endpoint::parse("https://[::1]:17670");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.url(), "https://[::1]:17670");

  Endpoint plain = Endpoint::parse("http://localhost:8080");
  EXPECT_EQ(plain.kind, Endpoint::Kind::kTcp);
  EXPECT_EQ(plain.host_port(), "localhost:8080");
}

void expect_refused(const std::string& text, const std::string& part) {
  try {
    Endpoint::parse(text);
    FAIL() << text << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Endpoint, RefusesWhatIsNotAnEndpoint) {
  expect_refused("ftp://x:1", "the scheme must be unix, https or http");
  expect_refused("https://127.0.0.1", "a port is required");
  expect_refused("https://127.0.0.1:0", "from 1 to 65535");
  expect_refused("https://127.0.0.1:70000", "from 1 to 65535");
  expect_refused("https://::1:17670", "[ADDRESS]:PORT");
  expect_refused("https://h:1/v1", "no path");
  expect_refused("unix://relative", "absolute");
  expect_refused("gateway", "expected unix:///PATH");
  expect_refused("", "empty");
}

}  // namespace
}  // namespace openshell::net
