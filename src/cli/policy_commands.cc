// openshell policy set|get|list|update|validate.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/text.h"
#include "cli/commands.h"
#include "cli/gateway_client.h"
#include "net/http.h"
#include "policy/policy.h"

namespace openshell::cli {

using nlohmann::json;

namespace {

std::string policy_target(const std::string& name, const std::string& what = "policy") {
  return "/v1/sandboxes/" + net::percent_encode(name) + "/" + what;
}

std::string read_policy_file(const std::string& path) {
  std::string text;
  if (int err = files::read_into(path, &text)) throw_errno("policy " + path, err);
  return text;
}

// Sends a new revision and says what became of it.
int put_policy(const std::string& name, const std::string& text, const std::string& source,
               const std::string& output) {
  GatewayClient client;
  json result =
      client.call("PUT", policy_target(name), json{{"policy", text}, {"source", source}}.dump());
  if (output == "json") {
    std::printf("%s\n", result.dump(2).c_str());
  } else {
    long long revision = result.value("revision", 0LL);
    if (result.value("applied", false))
      std::printf(
          "%s: policy revision %lld applied to new connections; open ones it refuses are closed\n",
          name.c_str(), revision);
    else
      std::printf("%s: policy revision %lld saved; it applies when the sandbox next starts%s\n",
                  name.c_str(), revision,
                  result.contains("error") ? (" (" + result.value("error", "") + ")").c_str() : "");
  }
  return result.contains("error") ? exit_code::kFailure : 0;
}

// "host:port" -> host and port; IPv6 literals in brackets.
void parse_endpoint(const std::string& text, std::string* host, uint16_t* port) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw Error("endpoint " + text + ": expected HOST:PORT");
  *host = text.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']')
    *host = host->substr(1, host->size() - 2);
  auto value = text::parse_uint(text.substr(colon + 1), 65535);
  if (!value || *value == 0) throw Error("endpoint " + text + ": the port must be 1-65535");
  *port = static_cast<uint16_t>(*value);
  if (auto why = policy::check_host_pattern(*host); !why.empty())
    throw Error("endpoint " + text + ": host " + why);
}

}  // namespace

void add_policy_commands(CLI::App& app, Action* action) {
  CLI::App* policy = app.add_subcommand(
      "policy", "See and change sandboxes' policies (the network part applies live)");
  policy->require_subcommand(1);

  // set
  {
    auto name = std::make_shared<std::string>();
    auto file = std::make_shared<std::string>();
    auto output = std::make_shared<std::string>("table");
    CLI::App* c = policy->add_subcommand("set", "Give a sandbox a new policy revision from a file");
    c->add_option("name", *name, "The sandbox")->required();
    c->add_option("--policy", *file, "The policy file (TOML)")->required();
    auto wait = std::make_shared<bool>(true);
    c->add_flag("--wait", *wait, "Wait until it applies (the default; kept for OpenShell's users)");
    c->add_option("-o,--output", *output, "Output format: table or json")
        ->check(CLI::IsMember({"table", "json"}));
    c->callback([=] {
      *action = [=] {
        std::string text = read_policy_file(*file);
        policy::parse(text, *file);  // a bad file stops here, with its line and field
        return put_policy(*name, text, *file, *output);
      };
    });
  }

  // get
  {
    auto name = std::make_shared<std::string>();
    auto revision = std::make_shared<std::string>();
    auto output = std::make_shared<std::string>("table");
    CLI::App* c = policy->add_subcommand(
        "get", "Print a sandbox's policy (the current revision, or --rev N)");
    c->add_option("name", *name, "The sandbox")->required();
    c->add_option("--rev", *revision, "A revision number");
    c->add_option("-o,--output", *output, "Output format: table (the TOML) or json")
        ->check(CLI::IsMember({"table", "json"}));
    c->callback([=] {
      *action = [=] {
        if (!revision->empty() && !text::parse_uint(*revision))
          throw Error("--rev " + *revision + ": not a number");
        GatewayClient client;
        json p = client.call("GET",
                             policy_target(*name) + (revision->empty() ? "" : "?rev=" + *revision));
        if (*output == "json")
          std::printf("%s\n", p.dump(2).c_str());
        else
          std::printf("# %s, policy revision %lld%s\n%s", p.value("sandbox", "").c_str(),
                      p.value("revision", 0LL),
                      p.value("default", false) ? " (the default policy)" : "",
                      p.value("policy", "").c_str());
        return 0;
      };
    });
  }

  // list
  {
    auto name = std::make_shared<std::string>();
    auto output = std::make_shared<std::string>("table");
    CLI::App* c = policy->add_subcommand("list", "List a sandbox's policy revisions");
    c->add_option("name", *name, "The sandbox")->required();
    c->add_option("-o,--output", *output, "Output format: table or json")
        ->check(CLI::IsMember({"table", "json"}));
    c->callback([=] {
      *action = [=] {
        GatewayClient client;
        json list = client.call("GET", policy_target(*name, "policies"));
        if (*output == "json") {
          std::printf("%s\n", list.dump(2).c_str());
          return 0;
        }
        std::printf("REVISION   CREATED                    CURRENT\n");
        for (const auto& r : list["revisions"])
          std::printf("%-10lld %-26s %s\n", r.value("revision", 0LL),
                      r.value("created_at", "").c_str(), r.value("current", false) ? "*" : "");
        return 0;
      };
    });
  }

  // update
  {
    auto name = std::make_shared<std::string>();
    auto add = std::make_shared<std::vector<std::string>>();
    auto remove = std::make_shared<std::vector<std::string>>();
    auto binaries = std::make_shared<std::vector<std::string>>();
    auto rule = std::make_shared<std::string>();
    auto output = std::make_shared<std::string>("table");
    CLI::App* c =
        policy->add_subcommand("update", "Add or remove network endpoints in a sandbox's policy");
    c->add_option("name", *name, "The sandbox")->required();
    c->add_option("--add-endpoint", *add, "HOST:PORT to allow (repeatable)")
        ->allow_extra_args(false);
    c->add_option("--remove-endpoint", *remove, "HOST:PORT to remove from every rule (repeatable)")
        ->allow_extra_args(false);
    c->add_option("--binary", *binaries,
                  "With --add-endpoint: only for this executable (repeatable)")
        ->allow_extra_args(false);
    c->add_option("--rule", *rule, "The network policy added endpoints go to (default: \"cli\")");
    c->add_option("-o,--output", *output, "Output format: table or json")
        ->check(CLI::IsMember({"table", "json"}));
    c->callback([=] {
      *action = [=] {
        if (add->empty() && remove->empty())
          throw Error("policy update: give --add-endpoint or --remove-endpoint");
        if (!binaries->empty() && add->empty())
          throw Error("policy update: --binary goes with --add-endpoint");
        for (const auto& b : *binaries)
          if (b.empty() || b[0] != '/') throw Error("--binary " + b + ": must be an absolute path");
        GatewayClient client;
        json current = client.call("GET", policy_target(*name));
        policy::Policy p = policy::parse(current.value("policy", ""), "the current policy");
        for (const auto& e : *remove) {
          std::string host;
          uint16_t port;
          parse_endpoint(e, &host, &port);
          bool found = false;
          for (auto& np : p.network)
            for (auto it = np.endpoints.begin(); it != np.endpoints.end();) {
              auto& ports = it->ports;
              bool same_host = text::iequals(it->host, host);
              auto port_it = std::find(ports.begin(), ports.end(), port);
              if (same_host && port_it != ports.end()) {
                found = true;
                ports.erase(port_it);
              }
              it = ports.empty() ? np.endpoints.erase(it) : it + 1;
            }
          if (!found) throw Error("--remove-endpoint " + e + ": the policy has no such endpoint");
          std::erase_if(p.network,
                        [](const policy::NetworkPolicy& np) { return np.endpoints.empty(); });
        }
        if (!add->empty()) {
          std::string rule_name = rule->empty() ? "cli" : *rule;
          policy::NetworkPolicy* target = nullptr;
          for (auto& np : p.network)
            if (np.name == rule_name) target = &np;
          if (!target) {
            p.network.push_back({rule_name, {}, {}});
            target = &p.network.back();
          }
          for (const auto& e : *add) {
            policy::Endpoint endpoint;
            parse_endpoint(e, &endpoint.host, &endpoint.ports.emplace_back());
            target->endpoints.push_back(endpoint);
          }
          for (const auto& b : *binaries) target->binaries.push_back({b});
        }
        std::string text = policy::to_toml(p);
        policy::parse(text, "the updated policy");
        return put_policy(*name, text, "policy update", *output);
      };
    });
  }

  // validate
  {
    auto file = std::make_shared<std::string>();
    CLI::App* c = policy->add_subcommand("validate", "Check a policy file without applying it");
    c->add_option("file", *file, "The policy file (TOML)")->required();
    c->callback([=] {
      *action = [=] {
        policy::Policy p = policy::parse(read_policy_file(*file), *file);
        size_t endpoints = 0;
        for (const auto& np : p.network) endpoints += np.endpoints.size();
        std::printf("%s: valid (%zu network policies, %zu endpoints%s)\n", file->c_str(),
                    p.network.size(), endpoints,
                    p.has_filesystem_policy ? ", a filesystem policy" : "");
        return 0;
      };
    });
  }
}

}  // namespace openshell::cli
