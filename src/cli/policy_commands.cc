// openshell policy set|get|list|update|validate.
#include <algorithm>
#include <cctype>
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
#include "policy/edit.h"
#include "policy/policy.h"
#include "spec/container_spec.h"
#include "supervisor/ssrf_warnings.h"

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
               const std::string& output, bool at_next_start = false) {
  GatewayClient client;
  json body{{"policy", text}, {"source", source}};
  if (at_next_start) body["at_next_start"] = true;
  json result = client.call("PUT", policy_target(name), body.dump());
  if (output == "json") {
    std::printf("%s\n", result.dump(2).c_str());
  } else {
    long long revision = result.value("revision", 0LL);
    std::string later;
    if (result.contains("at_next_start"))
      later = text::join(result["at_next_start"].get<std::vector<std::string>>(), ", ");
    if (result.value("applied", false) && !later.empty())
      std::printf(
          "%s: policy revision %lld: its network part applied to new connections; its %s "
          "applies when the sandbox next starts\n",
          name.c_str(), revision, later.c_str());
    else if (result.value("applied", false))
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
void parse_endpoint(const std::string& text, policy::EndpointRef* endpoint) {
  std::string* host = &endpoint->host;
  uint16_t* port = &endpoint->port;
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

// One warning line on stderr for each endpoint that can never connect,
// with the fix the caller can make.
void warn_refused_endpoints(const policy::Policy& p, const std::string& sandbox) {
  for (const auto& r : supervisor::ssrf_refused_endpoints(p)) {
    bool v6 = r.host.find(':') != std::string::npos;
    std::string endpoint = (v6 ? "[" + r.host + "]" : r.host) + ":" + std::to_string(r.port);
    std::string fix = sandbox.empty()
                          ? "add allowed_ips = [\"" + r.cidr + "\"] to " + r.field
                          : "openshell policy update " + sandbox +
                                (r.rule == "cli" ? "" : " --rule " + r.rule) + " --add-endpoint " +
                                endpoint + " --allowed-ip " + r.cidr;
    log::warn(supervisor::describe(r) + "; to allow it: " + fix);
  }
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
    auto later = std::make_shared<bool>(false);
    c->add_flag("--at-next-start", *later,
                "On a running sandbox, accept a change of filesystem_policy, landlock or "
                "process: it applies at the next start (the network part at once)");
    c->add_option("-o,--output", *output, "Output format: table or json")
        ->check(CLI::IsMember({"table", "json"}));
    c->callback([=] {
      *action = [=] {
        std::string text = read_policy_file(*file);
        // A bad file stops here, with its line and field.
        warn_refused_endpoints(policy::parse(text, *file), *name);
        return put_policy(*name, text, *file, *output, *later);
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
    auto full = std::make_shared<bool>(false);
    c->add_flag("--full", *full,
                "The effective policy: what the sandbox runs with, the parts the text leaves "
                "out (the default filesystem_policy) written out");
    c->add_option("-o,--output", *output, "Output format: table (the TOML) or json")
        ->check(CLI::IsMember({"table", "json"}));
    c->callback([=] {
      *action = [=] {
        if (!revision->empty() && !text::parse_uint(*revision))
          throw Error("--rev " + *revision + ": not a number");
        GatewayClient client;
        json p = client.call("GET",
                             policy_target(*name) + (revision->empty() ? "" : "?rev=" + *revision));
        if (*full) {
          // The one rule a sandbox's launch follows (a gateway's sandbox).
          SandboxSpec spec;
          spec.policy = p.value("policy", "");
          spec.policy_source = "revision " + std::to_string(p.value("revision", 0LL));
          p["policy"] = policy::to_toml(spec::effective_policy(spec, spec::Placement{}));
          p["full"] = true;
        }
        if (*output == "json")
          std::printf("%s\n", p.dump(2).c_str());
        else
          std::printf(
              "# %s, policy revision %lld%s%s\n%s", p.value("sandbox", "").c_str(),
              p.value("revision", 0LL), p.value("default", false) ? " (the default policy)" : "",
              *full ? ", in full as the sandbox runs with it" : "", p.value("policy", "").c_str());
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
    auto allowed_ips = std::make_shared<std::vector<std::string>>();
    auto add_allow = std::make_shared<std::vector<std::string>>();
    auto add_deny = std::make_shared<std::vector<std::string>>();
    auto remove_rule = std::make_shared<std::vector<std::string>>();
    auto rule = std::make_shared<std::string>();
    auto output = std::make_shared<std::string>("table");
    CLI::App* c = policy->add_subcommand(
        "update", "Add or remove network endpoints and HTTP rules in a sandbox's policy");
    c->add_option("name", *name, "The sandbox")->required();
    c->add_option("--add-endpoint", *add,
                  "HOST:PORT to allow (repeatable); one already in the rule is not added again")
        ->allow_extra_args(false);
    c->add_option("--remove-endpoint", *remove, "HOST:PORT to remove from every rule (repeatable)")
        ->allow_extra_args(false);
    c->add_option("--binary", *binaries,
                  "With --add-endpoint: only for this executable (repeatable)")
        ->allow_extra_args(false);
    c->add_option("--allowed-ip", *allowed_ips,
                  "With --add-endpoint or --add-allow: the addresses (CIDR) it may reach, which "
                  "opens a loopback or private address to it (repeatable)")
        ->allow_extra_args(false);
    c->add_option("--add-allow", *add_allow,
                  "HOST:PORT:METHOD:PATH_GLOB: allow these requests on the endpoints of HOST:PORT, "
                  "which become inspected (protocol = \"rest\"); adds the endpoint when missing "
                  "(repeatable)")
        ->allow_extra_args(false);
    c->add_option("--add-deny", *add_deny,
                  "HOST:PORT:METHOD:PATH_GLOB: deny these requests on the endpoints of HOST:PORT "
                  "(deny wins; repeatable)")
        ->allow_extra_args(false);
    c->add_option("--remove-rule", *remove_rule,
                  "HOST:PORT:METHOD:PATH_GLOB: remove that allow or deny rule from the endpoints "
                  "of HOST:PORT (repeatable)")
        ->allow_extra_args(false);
    c->add_option("--rule", *rule, "The network policy added endpoints go to (default: \"cli\")");
    c->add_option("-o,--output", *output, "Output format: table or json")
        ->check(CLI::IsMember({"table", "json"}));
    c->callback([=] {
      *action = [=] {
        if (!binaries->empty() && add->empty())
          throw Error("policy update: --binary goes with --add-endpoint");
        if (!allowed_ips->empty() && add->empty() && add_allow->empty())
          throw Error("policy update: --allowed-ip goes with --add-endpoint or --add-allow");
        if (add->empty() && remove->empty() && add_allow->empty() && add_deny->empty() &&
            remove_rule->empty())
          throw Error(
              "policy update: give --add-endpoint, --remove-endpoint, --add-allow, --add-deny "
              "or --remove-rule");
        for (const auto& b : *binaries)
          if (b.empty() || b[0] != '/') throw Error("--binary " + b + ": must be an absolute path");
        for (const auto& ip : *allowed_ips)
          if (auto why = policy::check_allowed_ip(ip); !why.empty())
            throw Error("--allowed-ip " + ip + ": " + why);
        policy::Update update;
        update.rule = rule->empty() ? "cli" : *rule;
        update.allowed_ips = *allowed_ips;
        update.binaries = *binaries;
        for (const auto& e : *remove) parse_endpoint(e, &update.remove.emplace_back());
        for (const auto& e : *add) parse_endpoint(e, &update.add.emplace_back());
        for (const auto& r : *add_allow)
          update.add_allow.push_back(policy::parse_rule_ref("--add-allow", r));
        for (const auto& r : *add_deny)
          update.add_deny.push_back(policy::parse_rule_ref("--add-deny", r));
        for (const auto& r : *remove_rule)
          update.remove_rules.push_back(policy::parse_rule_ref("--remove-rule", r));
        GatewayClient client;
        json current = client.call("GET", policy_target(*name));
        policy::Policy p = policy::parse(current.value("policy", ""), "the current policy");
        policy::UpdateResult result = policy::apply_update(&p, update);
        if (!result.changed) {
          // Nothing to store: no new revision.
          if (*output == "json")
            std::printf("%s\n", json{{"revision", current.value("revision", 0LL)},
                                     {"changed", false},
                                     {"notes", result.notes}}
                                    .dump(2)
                                    .c_str());
          else
            std::printf("%s: %s; policy revision %lld stays\n", name->c_str(),
                        text::join(result.notes, "; ").c_str(), current.value("revision", 0LL));
          return 0;
        }
        if (*output == "table")
          std::printf("%s: %s\n", name->c_str(), text::join(result.notes, "; ").c_str());
        std::string text = policy::to_toml(p);
        warn_refused_endpoints(policy::parse(text, "the updated policy"), *name);
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
        warn_refused_endpoints(p, "");
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
