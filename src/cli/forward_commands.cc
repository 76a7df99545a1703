// openshell forward start|stop|list: TCP from the host's BIND:PORT to
// 127.0.0.1:PORT inside a sandbox, relayed by its supervisor (so a forward
// outlives the gateway's restarts, and comes back when the sandbox starts
// again). Without -d, `forward start` stays, saying what happens to the
// forward, until Ctrl-C or SIGTERM, and then stops it.
#include <arpa/inet.h>
#include <signal.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/log.h"
#include "base/text.h"
#include "cli/commands.h"
#include "cli/forwards.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"
#include "cli/table.h"

namespace openshell::cli {

using nlohmann::json;

namespace {

// How a forward stands, as one line: "listening", "stopped: sandbox is Stopped".
std::string state_text(const json& f) {
  const std::string message = f.value("message", "");
  return f.value("state", "") + (message.empty() ? "" : ": " + message);
}

std::string describe(const json& f) {
  return f.value("address", "") + " -> sandbox '" + f.value("sandbox", "") + "' port " +
         std::to_string(f.value("port", 0));
}

std::string forward_target(const std::string& name, uint16_t port) {
  return target(name, "forwards/" + std::to_string(port));
}

// The sandbox's forward of this port, or null when there is none (any
// longer). Throws Error when the gateway cannot be asked.
json find_forward(GatewayClient& client, const std::string& name, uint16_t port) {
  json list = client.call("GET", target(name, "forwards")).value("forwards", json::array());
  for (const auto& f : list)
    if (f.value("port", 0) == port) return f;
  return nullptr;
}

// Until SIGINT, SIGTERM or SIGHUP (blocked by the caller), or the forward
// is gone: each change of its state said, once.
int stay_in_foreground(const std::string& name, const json& forward, const sigset_t& signals) {
  const uint16_t port = forward.value("port", 0);
  std::string last = state_text(forward);
  bool unreachable = false;
  for (;;) {
    timespec poll_interval{1, 0};
    const int sig = ::sigtimedwait(&signals, nullptr, &poll_interval);
    if (sig > 0) break;
    try {
      // A gateway that is down is not started from here: the forward goes
      // on in the supervisor meanwhile.
      GatewayClient client(false);
      json now = find_forward(client, name, port);
      unreachable = false;
      if (now.is_null()) {
        std::printf("The forward of port %u to sandbox '%s' was stopped elsewhere\n", port,
                    name.c_str());
        return 0;
      }
      if (std::string state = state_text(now); state != last) {
        std::printf("%s: %s\n", describe(now).c_str(), state.c_str());
        last = state;
      }
    } catch (const GatewayError& e) {
      if (e.status() == 404) {
        std::printf("Sandbox '%s' is gone, and its forwards with it\n", name.c_str());
        return 0;
      }
      log::warn(e.what());
    } catch (const Error& e) {
      if (!unreachable)
        log::warn(std::string("the gateway cannot be reached (the forward goes on): ") + e.what());
      unreachable = true;
    }
    std::fflush(stdout);
  }
  GatewayClient client;
  try {
    client.call("DELETE", forward_target(name, port));
  } catch (const GatewayError& e) {
    if (e.status() != 404) throw;
  }
  std::printf("Stopped forwarding %s\n", describe(forward).c_str());
  return 0;
}

int start(const std::string& given_name, const std::string& spec, bool detach) {
  json body = parse_forward(spec, "forward start " + spec);
  // Blocked from here: a Ctrl-C while the forward is being made stops it
  // once it is made, never leaves it behind.
  sigset_t signals;
  sigemptyset(&signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, sig);
  if (!detach) ::sigprocmask(SIG_BLOCK, &signals, nullptr);
  GatewayClient client;
  const std::string name = sandbox_name(client.paths(), given_name);
  json forward;
  try {
    forward = client.call("POST", target(name, "forwards"), body.dump());
  } catch (const GatewayError& e) {
    if (e.code() == "bind_failed")
      throw Error("cannot forward to sandbox '" + name + "': " + e.what());
    throw;
  }
  remember(client.paths(), name);
  const std::string state = forward.value("state", "");
  if (state == "stopped")
    log::warn("sandbox '" + name + "' is not running (" + forward.value("message", "") +
              "): the forward starts with it");
  else if (state == "pending")
    log::warn("the supervisor of sandbox '" + name +
              "' has not yet said that it listens; see 'openshell forward list'");
  const uint16_t port = forward.value("port", 0);
  if (detach) {
    std::printf("Forwarding %s (stop it with 'openshell forward stop %u %s')\n",
                describe(forward).c_str(), port, name.c_str());
    return 0;
  }
  std::printf("Forwarding %s (Ctrl-C stops it)\n", describe(forward).c_str());
  std::fflush(stdout);
  return stay_in_foreground(name, forward, signals);
}

void print_forwards(const json& list, const std::string& output) {
  if (output == "json") {
    std::printf("%s\n", list.dump(2).c_str());
    return;
  }
  std::vector<std::vector<std::string>> rows = {{"SANDBOX", "BIND", "PORT", "STATE"}};
  for (const auto& f : list)
    rows.push_back({f.value("sandbox", ""), f.value("bind", ""), std::to_string(f.value("port", 0)),
                    state_text(f)});
  print_table(rows);
}

}  // namespace

json parse_forward(const std::string& text, const std::string& what) {
  std::string bind = "127.0.0.1", port_text = text;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find("]:");
    if (close == std::string::npos)
      throw Error(what + ": expected [BIND:]PORT, with an IPv6 BIND in brackets ([::1]:8080)");
    bind = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
    bind = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  if (bind == "localhost") bind = "127.0.0.1";
  unsigned char bytes[16];
  if (::inet_pton(AF_INET, bind.c_str(), bytes) != 1 &&
      ::inet_pton(AF_INET6, bind.c_str(), bytes) != 1)
    throw Error(what + ": BIND '" + bind +
                "' is not an IP address (127.0.0.1, 0.0.0.0, [::1], or localhost)");
  auto port = text::parse_uint(port_text, 65535);
  if (!port || *port == 0)
    throw Error(what + ": PORT '" + port_text + "' is not a number from 1 to 65535");
  // Said every time: such a port is open to whoever reaches this host.
  unsigned char v4[4];
  const bool loopback =
      bind == "::1" || (::inet_pton(AF_INET, bind.c_str(), v4) == 1 && v4[0] == 127);
  if (!loopback)
    log::warn(what + ": " + bind +
              " is not loopback: the sandbox's port is open to every host that reaches it");
  return json{{"bind", bind}, {"port", *port}};
}

int warn_about_forwards(GatewayClient& client, const std::string& name) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    json list = client.call("GET", target(name, "forwards")).value("forwards", json::array());
    bool pending = false;
    for (const auto& f : list) pending = pending || f.value("state", "") == "pending";
    if (!pending || std::chrono::steady_clock::now() > deadline) {
      int bad = 0;
      for (const auto& f : list)
        if (f.value("state", "") != "listening") {
          log::warn("forward " + describe(f) + ": " + state_text(f));
          ++bad;
        }
      return bad;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void add_forward_commands(CLI::App& app, Action* action) {
  CLI::App* forward = app.add_subcommand(
      "forward", "Forward TCP ports of the host to ports of a sandbox (through its supervisor)");
  forward->require_subcommand(1);
  forward->footer(
      "A forward carries TCP from the host's BIND:PORT (default 127.0.0.1) to 127.0.0.1:PORT "
      "inside the sandbox. It survives the gateway's restarts, stops with its sandbox and "
      "comes back when it starts again; it is deleted with it. A BIND other than loopback "
      "(0.0.0.0) opens the port to every host that reaches this one.\nSee openshell-forward(1).");

  // start
  {
    auto spec = std::make_shared<std::string>();
    auto name = std::make_shared<std::string>();
    auto detach = std::make_shared<bool>(false);
    CLI::App* c = forward->add_subcommand("start", "Forward a port to a sandbox");
    c->add_option("port", *spec, "[BIND:]PORT: the host's address (default 127.0.0.1) and port")
        ->required();
    c->add_option("name", *name, "The sandbox (default: the last one named)");
    c->add_flag("-d,--detach", *detach,
                "Return at once; the forward stays until 'forward stop' (default: stay, and stop "
                "it at Ctrl-C)");
    c->footer(
        "Examples:\n  openshell forward start 8080 demo\n  openshell forward start -d "
        "0.0.0.0:3000 demo");
    c->callback([=] { *action = [=] { return start(*name, *spec, *detach); }; });
  }

  // stop
  {
    auto port = std::make_shared<std::string>();
    auto name = std::make_shared<std::string>();
    CLI::App* c = forward->add_subcommand("stop", "Stop a forward, closing its listener");
    c->add_option("port", *port, "The sandbox's port (as given to 'forward start')")->required();
    c->add_option("name", *name, "The sandbox (default: the last one named)");
    c->callback([=] {
      *action = [=] {
        auto number = text::parse_uint(*port, 65535);
        if (!number || *number == 0)
          throw Error("forward stop " + *port + ": PORT is not a number from 1 to 65535");
        GatewayClient client;
        const std::string sandbox = sandbox_name(client.paths(), *name);
        json answer =
            client.call("DELETE", forward_target(sandbox, static_cast<uint16_t>(*number)));
        std::printf("Stopped forwarding %s\n", describe(answer.value("deleted", json{})).c_str());
        return 0;
      };
    });
  }

  // list
  {
    auto output = std::make_shared<std::string>("table");
    auto all = std::make_shared<bool>(false);
    CLI::App* c = forward->add_subcommand("list", "List the forwards of your sandboxes");
    c->add_flag("--all", *all, "Every principal's (admins only)");
    add_output(c, output.get());
    c->callback([=] {
      *action = [=] {
        GatewayClient client;
        json list = client.call("GET", std::string("/v1/forwards") + (*all ? "?all=1" : ""))
                        .value("forwards", json::array());
        print_forwards(list, *output);
        return 0;
      };
    });
  }
}

}  // namespace openshell::cli
