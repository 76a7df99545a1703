// openshell gateway run|status|stop, and the supervisor's hidden entry.
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/gateway_client.h"
#include "cli/gateway_view.h"
#include "cli/sandbox_common.h"
#include "gateway/gateway.h"
#include "supervisor/supervisor.h"

namespace openshell::cli {

using nlohmann::json;

void add_gateway_commands(CLI::App& app, Action* action) {
  CLI::App* gateway =
      app.add_subcommand("gateway", "The local control plane that keeps the sandboxes");
  gateway->require_subcommand(1);
  auto ready_fd = std::make_shared<int>(-1);
  CLI::App* run = gateway->add_subcommand(
      "run", "Run the gateway in the foreground (the CLI starts one when needed)");
  run->add_option("--ready-fd", *ready_fd, "")->group("");  // for the CLI's auto-start
  run->callback([action, ready_fd] { *action = [ready_fd] { return gateway::run(*ready_fd); }; });

  auto output = std::make_shared<std::string>("table");
  CLI::App* status = gateway->add_subcommand("status", "Say whether the gateway runs, and where");
  add_output(status, output.get());
  status->callback([output, action] {
    *action = [output] {
      json info;
      try {
        GatewayClient client(false);
        info = client.call("GET", "/v1/gateway");
      } catch (const Error& e) {
        if (*output == "json")
          std::printf("%s\n", json{{"running", false}, {"error", e.what()}}.dump(2).c_str());
        else
          std::printf("gateway: not running (%s)\n", e.what());
        return 1;
      }
      info["running"] = true;
      if (*output == "json") {
        std::printf("%s\n", info.dump(2).c_str());
      } else {
        std::printf("gateway: running (pid %d, version %s)\n", info.value("pid", 0),
                    info.value("version", "").c_str());
        std::printf("socket: %s\nstate: %s\nsandboxes: %d\nsince: %s\n",
                    info.value("socket", "").c_str(), info.value("state_dir", "").c_str(),
                    info.value("sandboxes", 0), info.value("started_at", "").c_str());
        print_gateway_config(info.value("config", json()));
      }
      return 0;
    };
  });

  gateway->add_subcommand("stop", "Stop the gateway (sandboxes keep running)")->callback([action] {
    *action = [] {
      int pid = 0;
      try {
        GatewayClient client(false);
        // Another host's pid is nothing to wait for here.
        if (!client.remote()) pid = client.call("GET", "/v1/gateway").value("pid", 0);
        client.call("POST", "/v1/gateway/stop");
      } catch (const Error& e) {
        std::printf("gateway: not running\n");
        return 0;
      }
      // Wait until it has exited (a pidfd says so even before it is reaped).
      int fd = pid > 0 ? static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)) : -1;
      if (fd >= 0) {
        pollfd p{fd, POLLIN, 0};
        ::poll(&p, 1, 10000);
        ::close(fd);
      }
      std::printf("gateway: stopped\n");
      return 0;
    };
  });

  // The supervisor: started by the gateway, not by people.
  auto launch = std::make_shared<std::string>();
  CLI::App* sup = app.add_subcommand("supervisor", "");
  sup->group("");  // hidden
  sup->add_option("--launch", *launch, "The launch file")->required();
  sup->callback([launch, action] { *action = [launch] { return supervisor::main(*launch); }; });
}

}  // namespace openshell::cli
