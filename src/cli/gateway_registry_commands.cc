// openshell gateway add|list|select|info|remove: the gateways this user
// knows by name (cli/gateway_registry.h).
#include <cctype>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "auth/certs.h"
#include "base/error.h"
#include "base/files.h"
#include "cli/commands.h"
#include "cli/gateway_client.h"
#include "cli/gateway_registry.h"
#include "cli/sandbox_common.h"
#include "cli/table.h"

namespace openshell::cli {

using nlohmann::json;

namespace {

struct AddOptions {
  std::string endpoint, name, ca, cert, key;
  bool local = false;
};

// The name a gateway gets without --name: "local" for a Unix socket, else
// its host ("127.0.0.1", "gw.example.org"; "::1" becomes "ip6-1").
std::string default_name(const net::Endpoint& endpoint) {
  if (endpoint.kind == net::Endpoint::Kind::kUnix) return "local";
  std::string name;
  for (char c : endpoint.host)
    name += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '-';
  while (!name.empty() && (name[0] == '-' || name[0] == '.')) name.erase(0, 1);
  if (endpoint.host.find(':') != std::string::npos) name = "ip6-" + name;
  return name.empty() ? "gateway" : name.substr(0, 63);
}

// The credentials to register, checked before anything connects.
net::TlsFiles credentials(const AddOptions& o, const net::Endpoint& endpoint) {
  const bool any_file = !o.ca.empty() || !o.cert.empty() || !o.key.empty();
  if (o.local && any_file)
    throw Error("--local takes the credentials: give it, or --ca/--cert/--key");
  if (endpoint.kind != net::Endpoint::Kind::kTls) {
    if (o.local || any_file)
      throw Error(endpoint.url() + ": only an https gateway takes certificates (" +
                  (endpoint.kind == net::Endpoint::Kind::kUnix ? "a Unix socket's peer is its uid"
                                                               : "plain HTTP has none") +
                  ")");
    return {};
  }
  net::TlsFiles files;
  if (o.local) {
    const std::string dir = Paths::resolve().tls_dir();
    files = {dir + "/ca.crt", dir + "/client.crt", dir + "/client.key"};
    for (const auto& f : {files.ca, files.cert, files.key})
      if (!files::exists(f))
        throw Error("--local: " + f +
                    ": no such file (make this user's with 'openshell gateway generate-certs')");
    return files;
  }
  if (o.ca.empty() || o.cert.empty() || o.key.empty())
    throw Error(endpoint.url() +
                ": a TLS gateway needs --local, or --ca, --cert and --key (its CA, your "
                "certificate and your key)");
  files = {o.ca, o.cert, o.key};
  for (const auto& [f, option] :
       {std::pair{files.ca, "--ca"}, {files.cert, "--cert"}, {files.key, "--key"}})
    if (!files::exists(f)) throw Error(std::string(option) + " " + f + ": no such file");
  return files;
}

int add(const AddOptions& o) {
  GatewayChoice choice;
  choice.endpoint = net::Endpoint::parse(o.endpoint);
  choice.source = GatewayChoice::Source::kFlagEndpoint;  // never started here
  choice.endpoint.tls = credentials(o, choice.endpoint);
  const std::string name = o.name.empty() ? default_name(choice.endpoint) : o.name;
  check_gateway_name(name);
  GatewayRegistry registry = GatewayRegistry::from_environment();
  if (auto existing = registry.find(name); existing && !existing->system)
    throw Error("gateway '" + name + "' is registered already (" + existing->endpoint.url() +
                "): 'openshell gateway remove " + name + "' first, or give another --name");
  // Registered only once it answered: a gateway that is not there, or
  // refuses us, leaves nothing behind.
  GatewayClient client(choice, false);
  const GatewayProbe probe = probe_gateway(client);
  std::printf("%s\n", connection_line(client, probe).c_str());
  const bool first = registry.active().empty();
  RegisteredGateway g = registry.add(name, choice.endpoint, choice.endpoint.tls);
  std::printf("Registered gateway '%s' (%s)%s\n", g.name.c_str(), g.endpoint.url().c_str(),
              first ? ", now the active one" : "");
  return 0;
}

json entry_json(const RegisteredGateway& g, const std::string& active) {
  json j = {{"name", g.name},
            {"endpoint", g.endpoint.url()},
            {"active", g.name == active},
            {"source", g.system ? "system" : "user"},
            {"dir", g.dir}};
  if (!g.endpoint.tls.ca.empty())
    j["tls"] = {
        {"ca", g.endpoint.tls.ca}, {"cert", g.endpoint.tls.cert}, {"key", g.endpoint.tls.key}};
  return j;
}

// The client certificate's principal and validity, or why it cannot be read.
json cert_json(const RegisteredGateway& g) {
  try {
    auth::CertSummary c = auth::summarize_cert(g.endpoint.tls.cert);
    return {{"principal", c.common_name},
            {"admin", c.admin},
            {"not_after", c.not_after},
            {"expired", c.expired}};
  } catch (const Error& e) {
    return {{"error", e.what()}};
  }
}

int list(const std::string& output) {
  GatewayRegistry registry = GatewayRegistry::from_environment();
  const std::string active = registry.active();
  const std::vector<RegisteredGateway> all = registry.list();
  if (output == "json") {
    json out = json::array();
    for (const auto& g : all) out.push_back(entry_json(g, active));
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  if (all.empty()) {
    std::printf(
        "No gateway is registered: commands use this user's local gateway. Add one with "
        "'openshell gateway add URL'.\n");
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"NAME", "ENDPOINT", "ACTIVE", "SOURCE"}};
  for (const auto& g : all)
    rows.push_back(
        {g.name, g.endpoint.url(), g.name == active ? "*" : "", g.system ? "system" : "user"});
  print_table(rows);
  return 0;
}

int info(const std::string& name, const std::string& output) {
  GatewayRegistry registry = GatewayRegistry::from_environment();
  std::string chosen = name;
  if (chosen.empty()) {
    GatewayChoice choice = chosen_gateway();
    if (choice.name.empty()) {
      // A URL or the local socket: nothing registered to show but where.
      if (output == "json")
        std::printf("%s\n",
                    json{{"name", nullptr}, {"endpoint", choice.endpoint.url()}}.dump(2).c_str());
      else
        std::printf("endpoint: %s (not registered)\n", choice.endpoint.url().c_str());
      return 0;
    }
    chosen = choice.name;
  }
  check_gateway_name(chosen);
  auto g = registry.find(chosen);
  if (!g) throw Error("gateway '" + chosen + "' is not registered (see 'openshell gateway list')");
  json j = entry_json(*g, registry.active());
  if (j.contains("tls")) j["tls"]["certificate"] = cert_json(*g);
  if (output == "json") {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("name: %s\nendpoint: %s\nactive: %s\nsource: %s\ndir: %s\n", g->name.c_str(),
              g->endpoint.url().c_str(), j["active"].get<bool>() ? "yes" : "no",
              g->system ? "system" : "user", g->dir.c_str());
  if (!g->endpoint.tls.ca.empty()) {
    std::printf("ca: %s\ncert: %s\nkey: %s\n", g->endpoint.tls.ca.c_str(),
                g->endpoint.tls.cert.c_str(), g->endpoint.tls.key.c_str());
    const json c = j["tls"]["certificate"];
    if (c.contains("error"))
      std::printf("certificate: %s\n", c.value("error", "").c_str());
    else
      std::printf("certificate: %s%s, %s %s\n", c.value("principal", "").c_str(),
                  c.value("admin", false) ? " (admin)" : "",
                  c.value("expired", false) ? "expired" : "valid until",
                  c.value("not_after", "").c_str());
  }
  return 0;
}

}  // namespace

void add_gateway_registry_commands(CLI::App* gateway, Action* action) {
  auto o = std::make_shared<AddOptions>();
  CLI::App* add_cmd =
      gateway->add_subcommand("add", "Register a gateway by its URL, once it answers");
  add_cmd
      ->add_option("endpoint", o->endpoint, "unix:///PATH, https://HOST:PORT or http://HOST:PORT")
      ->required();
  add_cmd
      ->add_option("--name", o->name,
                   "What to call it (default: its host, or 'local' for a Unix socket)")
      ->type_name("NAME");
  add_cmd->add_flag("--local", o->local,
                    "Use the credentials 'gateway generate-certs' made for this user");
  add_cmd->add_option("--ca", o->ca, "The CA that signed the gateway's certificate")
      ->type_name("FILE");
  add_cmd->add_option("--cert", o->cert, "Your client certificate")->type_name("FILE");
  add_cmd->add_option("--key", o->key, "Your client certificate's key")->type_name("FILE");
  add_cmd->footer(
      "Connects (GET /v1/health, then /v1/whoami) and says how: 'Connected / Authenticated "
      "(mTLS)', or the one line why not, and then registers nothing. The credentials are "
      "copied into the registry ($XDG_CONFIG_HOME/openshell, mode 0600). The first gateway "
      "added becomes the active one.\n"
      "Example: openshell gateway add https://127.0.0.1:17670 --local --name openshell\n"
      "See openshell-gateway(1).");
  add_cmd->callback([o, action] { *action = [o] { return add(*o); }; });

  auto output = std::make_shared<std::string>("table");
  CLI::App* list_cmd = gateway->add_subcommand("list", "List the registered gateways");
  add_output(list_cmd, output.get());
  list_cmd->footer(
      "SOURCE is user ($XDG_CONFIG_HOME/openshell) or system (/etc/openshell, "
      "$OPENSHELL_SYSTEM_CONFIG_DIR); a user entry shadows a system one of its name. ACTIVE "
      "marks the one commands use unless -g, --gateway-endpoint or OPENSHELL_GATEWAY says "
      "otherwise.\nExample: openshell gateway list -o json\nSee openshell-gateway(1).");
  list_cmd->callback([output, action] { *action = [output] { return list(*output); }; });

  auto select_name = std::make_shared<std::string>();
  CLI::App* select_cmd =
      gateway->add_subcommand("select", "Make a registered gateway the active one");
  select_cmd->add_option("name", *select_name, "The gateway")->required();
  select_cmd->footer("Example: openshell gateway select lab\nSee openshell-gateway(1).");
  select_cmd->callback([select_name, action] {
    *action = [select_name] {
      GatewayRegistry registry = GatewayRegistry::from_environment();
      registry.select(*select_name);
      std::printf("Active gateway: %s (%s)\n", select_name->c_str(),
                  registry.find(*select_name)->endpoint.url().c_str());
      return 0;
    };
  });

  auto info_name = std::make_shared<std::string>();
  auto info_output = std::make_shared<std::string>("table");
  CLI::App* info_cmd = gateway->add_subcommand("info", "Show a registered gateway");
  info_cmd->add_option("name", *info_name, "The gateway (default: the one commands would use)");
  add_output(info_cmd, info_output.get());
  info_cmd->footer(
      "Shows its endpoint, whether it is active, where its entry and credentials are, and "
      "whom its certificate names, and until when. It does "
      "not connect: 'openshell status' does.\nExample: openshell gateway info lab -o json\n"
      "See openshell-gateway(1).");
  info_cmd->callback([info_name, info_output, action] {
    *action = [info_name, info_output] { return info(*info_name, *info_output); };
  });

  auto remove_name = std::make_shared<std::string>();
  CLI::App* remove_cmd =
      gateway->add_subcommand("remove", "Forget a registered gateway and its credentials");
  remove_cmd->add_option("name", *remove_name, "The gateway")->required();
  remove_cmd->footer(
      "The gateway itself and its sandboxes are untouched. An entry of the system registry "
      "cannot be removed here.\nExample: openshell gateway remove lab\nSee openshell-gateway(1).");
  remove_cmd->callback([remove_name, action] {
    *action = [remove_name] {
      GatewayRegistry::from_environment().remove(*remove_name);
      std::printf("Removed gateway '%s'\n", remove_name->c_str());
      return 0;
    };
  });
}

}  // namespace openshell::cli
