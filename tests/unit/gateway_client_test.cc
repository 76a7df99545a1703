#include "cli/gateway_client.h"

#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "auth/certs.h"
#include "net/http.h"
#include "test_util.h"

namespace openshell::cli {
namespace {

using openshell::testing::error_of;
using openshell::testing::ScopedEnv;
using openshell::testing::TempDir;

// A gateway on a Unix socket, served from a thread of its own, that
// answers GET /v1/health, and GET /v1/whoami with whoami_status and
// whoami_body (404: a gateway from before principals).
class FakeGateway : public ::testing::Test {
 protected:
  FakeGateway() : home("OPENSHELL_HOME", tmp.path().c_str()) {}
  ~FakeGateway() override {
    io.stop();
    if (thread.joinable()) thread.join();
  }
  void start() {
    server = std::make_unique<net::Server>(io, [this](std::shared_ptr<net::Exchange> exchange) {
      const std::string& path = exchange->request().path;
      if (path == "/v1/health")
        exchange->respond({200, "{\"status\":\"ok\",\"version\":\"9.9.9\"}"});
      else if (path == "/v1/whoami")
        exchange->respond({whoami_status, whoami_body});
      else
        exchange->respond({404, "{\"error\":{\"code\":\"not_found\",\"message\":\"no\"}}"});
    });
    server->listen(socket(), 0600);
    thread = std::thread([this] {
      auto work = boost::asio::make_work_guard(io);
      io.run();
    });
  }
  std::string socket() const { return tmp.path() + "/api.sock"; }
  GatewayChoice choice() const {
    GatewayChoice c;
    c.endpoint = net::Endpoint::unix_socket(socket());
    c.source = GatewayChoice::Source::kFlagEndpoint;
    return c;
  }

  TempDir tmp;
  ScopedEnv home;
  boost::asio::io_context io;
  std::unique_ptr<net::Server> server;
  std::thread thread;
  int whoami_status = 404;
  std::string whoami_body = "{\"error\":{\"code\":\"not_found\",\"message\":\"no such path\"}}";
};

TEST_F(FakeGateway, AGatewayWithoutWhoamiIsConnectedAndWeAreUnknownToIt) {
  start();
  GatewayClient client(choice(), false);
  GatewayProbe probe = probe_gateway(client);
  EXPECT_EQ(probe.version, "9.9.9");
  EXPECT_FALSE(probe.whoami);
  // On the socket, the principal it would see: our user.
  EXPECT_EQ(connection_line(client, probe),
            "Connected (Unix socket, as " + auth::principal_of_uid(::geteuid()) + ")");
}

TEST_F(FakeGateway, WhoamiNamesThePrincipal) {
  whoami_status = 200;
  whoami_body = "{\"principal\":\"alice\",\"admin\":false,\"transport\":\"unix\"}";
  start();
  GatewayClient client(choice(), false);
  GatewayProbe probe = probe_gateway(client);
  ASSERT_TRUE(probe.whoami);
  EXPECT_EQ(probe.whoami->value("principal", ""), "alice");
  EXPECT_EQ(connection_line(client, probe), "Connected (Unix socket, as alice)");
}

TEST_F(FakeGateway, ARefusalIsTheGatewaysOwnLine) {
  whoami_status = 403;
  whoami_body = "{\"error\":{\"code\":\"forbidden\",\"message\":\"you may not ask\"}}";
  start();
  GatewayClient client(choice(), false);
  EXPECT_EQ(error_of([&] { probe_gateway(client); }), "you may not ask");
  // And a refused call carries its status and code.
  try {
    client.call("GET", "/v1/nothing");
    ADD_FAILURE() << "no GatewayError";
  } catch (const GatewayError& e) {
    EXPECT_EQ(e.status(), 404);
    EXPECT_EQ(e.code(), "not_found");
  }
}

TEST_F(FakeGateway, AnExplicitEndpointWithNothingThereIsNeverStarted) {
  EXPECT_EQ(error_of([&] { GatewayClient client(choice(), true); }),
            "no gateway listens at unix://" + socket());
}

}  // namespace
}  // namespace openshell::cli
