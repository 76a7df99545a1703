// openshell gateway run|status|stop, its certificates (generate-certs,
// issue-client), the registry of gateways (add, list, select, info,
// remove: gateway_registry_commands.cc), and the supervisor's hidden entry.
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "auth/certs.h"
#include "base/error.h"
#include "cli/commands.h"
#include "cli/gateway_client.h"
#include "cli/gateway_view.h"
#include "cli/sandbox_common.h"
#include "gateway/gateway.h"
#include "supervisor/supervisor.h"

namespace openshell::cli {

using nlohmann::json;

namespace {

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : ", ") + w;
  return out;
}

void add_cert_commands(CLI::App* gateway, Action* action) {
  auto set = std::make_shared<auth::CertSetOptions>();
  CLI::App* generate = gateway->add_subcommand(
      "generate-certs", "Make the gateway's CA, server certificate and first client certificate");
  generate->add_option("--dir", set->dir, "Where (default: the gateway's tls directory)")
      ->type_name("DIR");
  repeatable(generate->add_option("--server-san", set->server_sans,
                                  "A further DNS name or IP address the server certificate names "
                                  "(localhost, 127.0.0.1 and ::1 always)"))
      ->type_name("NAME|IP");
  generate->add_flag("--force", set->force,
                     "Make a new set over whatever is there (clients of the old CA lose access)");
  generate->footer(
      "Writes ca.crt, ca.key, server.crt, server.key, client.crt and client.key (PEM, ECDSA "
      "P-256, keys 0600, the directory 0700). The client certificate is yours (CN = your user "
      "name) and an admin's. A complete set is left as it is; a partial one is refused unless "
      "--force.\n"
      "Example: openshell gateway generate-certs --server-san gw.example.org && openshell "
      "gateway run --listen 127.0.0.1:17670 && openshell gateway add https://127.0.0.1:17670 "
      "--local\nSee openshell-gateway(1).");
  generate->callback([set, action] {
    *action = [set] {
      auth::CertSetOptions o = *set;
      if (o.dir.empty()) o.dir = Paths::resolve().tls_dir();
      o.owner = auth::principal_of_uid(::geteuid());
      auth::CertSetResult r = auth::generate_cert_set(o);
      if (!r.made) {
        std::printf(
            "The certificates in %s are complete (%s): left as they are (--force makes "
            "a new set)\n",
            o.dir.c_str(), joined(r.found).c_str());
        return 0;
      }
      std::vector<std::string> sans = {"localhost", "127.0.0.1", "::1"};
      sans.insert(sans.end(), o.server_sans.begin(), o.server_sans.end());
      std::printf(
          "%s in %s: a CA, a server certificate for %s, and the client certificate of "
          "%s (admin)\n",
          r.found.empty() ? "Made" : "Replaced", o.dir.c_str(), joined(sans).c_str(),
          o.owner.c_str());
      return 0;
    };
  });

  auto client = std::make_shared<auth::ClientCertOptions>();
  CLI::App* issue = gateway->add_subcommand(
      "issue-client", "Issue a client certificate for a principal, signed by the gateway's CA");
  issue->add_option("--name", client->name, "The principal (the certificate's CN)")
      ->required()
      ->type_name("NAME");
  issue->add_flag("--admin", client->admin,
                  "An admin's certificate (OU=admin): sees and acts on every sandbox");
  issue
      ->add_option("--out", client->out_dir,
                   "Where client.crt, client.key and ca.crt go (default: DIR/clients/NAME)")
      ->type_name("OUT");
  issue
      ->add_option("--dir", client->ca_dir,
                   "The CA's directory (default: the gateway's tls directory)")
      ->type_name("DIR");
  issue->add_flag("--force", client->force, "Replace a certificate already in OUT");
  issue->footer(
      "The principal's sandboxes are those its certificate creates; a user of the same name on "
      "the gateway's Unix socket is the same principal.\n"
      "Example: openshell gateway issue-client --name alice --out ./alice && (on alice's "
      "machine) openshell gateway add https://gw.example.org:17670 --ca alice/ca.crt --cert "
      "alice/client.crt --key alice/client.key\nSee openshell-gateway(1).");
  issue->callback([client, action] {
    *action = [client] {
      auth::ClientCertOptions o = *client;
      if (o.ca_dir.empty()) o.ca_dir = Paths::resolve().tls_dir();
      if (o.out_dir.empty()) o.out_dir = o.ca_dir + "/clients/" + o.name;
      auth::issue_client_cert(o);
      std::printf("Issued a client certificate for %s%s in %s: client.crt, client.key, ca.crt\n",
                  o.name.c_str(), o.admin ? " (admin)" : "", o.out_dir.c_str());
      return 0;
    };
  });
}

}  // namespace

void add_gateway_commands(CLI::App& app, Action* action) {
  CLI::App* gateway =
      app.add_subcommand("gateway",
                         "The control plane that keeps the sandboxes: run it, give it "
                         "certificates, register the gateways commands talk to");
  gateway->require_subcommand(1);
  gateway->footer(
      "Examples:\n  openshell gateway status\n"
      "  openshell gateway generate-certs && openshell gateway run --listen 127.0.0.1:17670\n"
      "  openshell gateway add https://127.0.0.1:17670 --local --name openshell\n"
      "See openshell-gateway(1).");
  auto ready_fd = std::make_shared<int>(-1);
  CLI::App* run = gateway->add_subcommand(
      "run", "Run the gateway in the foreground (the CLI starts one when needed)");
  run->add_option("--ready-fd", *ready_fd, "")->group("");  // for the CLI's auto-start
  auto run_options = std::make_shared<gateway::RunOptions>();
  run->add_option("--socket-group", run_options->socket_group,
                  "As root: open the socket to this group (mode 0660), so that its users share "
                  "this gateway, each with their own sandboxes (api.socket_group in gateway.toml)");
  run->add_option("--listen", run_options->listen,
                  "Serve the API with mutual TLS at ADDRESS:PORT too (repeatable; 127.0.0.1:17670, "
                  "[::1]:17670)")
      ->type_name("ADDR");
  run->add_option("--insecure-listen", run_options->insecure_listen,
                  "Serve plain HTTP, unauthenticated, at a loopback ADDRESS:PORT (repeatable)")
      ->type_name("ADDR");
  run->add_option("--tls-dir", run_options->tls_dir,
                  "Where ca.crt, server.crt and server.key are (default: the state's tls/)")
      ->type_name("DIR");
  run->callback([action, ready_fd, run_options] {
    *action = [ready_fd, run_options] { return gateway::run(*ready_fd, *run_options); };
  });

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
        for (const auto& listener : info.value("listeners", json::array()))
          if (listener.value("kind", "") != "unix")
            std::printf("listening: %s %s\n",
                        listener.value("kind", "") == "tls" ? "https" : "http (insecure)",
                        listener.value("address", "").c_str());
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

  add_cert_commands(gateway, action);
  add_gateway_registry_commands(gateway, action);

  // The supervisor: started by the gateway, not by people.
  auto launch = std::make_shared<std::string>();
  CLI::App* sup = app.add_subcommand("supervisor", "");
  sup->group("");  // hidden
  sup->add_option("--launch", *launch, "The launch file")->required();
  sup->callback([launch, action] { *action = [launch] { return supervisor::main(*launch); }; });
}

}  // namespace openshell::cli
