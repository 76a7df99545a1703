// openshell provider create|list|get|update|delete|attach|detach: the
// credentials a sandbox's requests carry while the sandbox holds only
// placeholders (KEY=openshell:resolve:env:KEY). No value is ever printed.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/text.h"
#include "cli/commands.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"
#include "cli/table.h"
#include "net/http.h"

namespace openshell::cli {

using nlohmann::json;

namespace {

std::string provider_target(const std::string& name) {
  return "/v1/providers/" + net::percent_encode(name);
}

// --credential KEY=VALUE, or KEY for the caller's $KEY (which must be set).
json credentials_of(const std::vector<std::string>& given) {
  json out = json::object();
  for (const auto& entry : given) {
    auto eq = entry.find('=');
    std::string key = entry.substr(0, eq);
    if (key.empty()) throw Error("--credential '" + entry + "': expected KEY[=VALUE]");
    if (eq != std::string::npos) {
      out[key] = entry.substr(eq + 1);
      continue;
    }
    const char* value = std::getenv(key.c_str());
    if (!value)
      throw Error("--credential " + key + ": $" + key +
                  " is not set (give KEY=VALUE, or export it first)");
    out[key] = value;
  }
  return out;
}

void print_provider(const json& p, const std::string& output) {
  if (output == "json") {
    std::printf("%s\n", p.dump(2).c_str());
    return;
  }
  auto list = [](const json& items) {
    return items.empty() ? std::string("-")
                         : text::join(items.get<std::vector<std::string>>(), ", ");
  };
  std::printf("Name:         %s\n", p.value("name", "").c_str());
  std::printf("Type:         %s\n", p.value("type", "").c_str());
  std::printf("Credentials:  %s\n", list(p.value("credentials", json::array())).c_str());
  std::printf("Endpoints:    %s\n", list(p.value("endpoints", json::array())).c_str());
  std::printf("Sandboxes:    %s\n", list(p.value("sandboxes", json::array())).c_str());
  std::printf("Created:      %s\n", p.value("created_at", "").c_str());
  std::printf("Updated:      %s\n", p.value("updated_at", "").c_str());
}

}  // namespace

void add_provider_commands(CLI::App& app, Action* action) {
  CLI::App* provider = app.add_subcommand(
      "provider", "Credentials for sandboxes' requests, which the sandboxes never see");
  provider->require_subcommand(1);
  provider->footer(
      "A sandbox given a provider gets KEY=openshell:resolve:env:KEY in its environment for "
      "each of the provider's credentials; the value stays in the gateway (sealed at rest) and "
      "its supervisor.\nSee docs/providers.md.");

  // create
  {
    auto name = std::make_shared<std::string>();
    auto type = std::make_shared<std::string>();
    auto credentials = std::make_shared<std::vector<std::string>>();
    auto endpoints = std::make_shared<std::vector<std::string>>();
    auto output = std::make_shared<std::string>("table");
    CLI::App* c = provider->add_subcommand("create", "Create a provider");
    c->add_option("--name", *name, "Its name, a DNS label")->required();
    c->add_option("--type", *type,
                  "generic, github (api.github.com:443, github.com:443), anthropic "
                  "(api.anthropic.com:443) or openai (api.openai.com:443)")
        ->required();
    repeatable(c->add_option("--credential", *credentials,
                             "KEY=VALUE, or KEY for the caller's $KEY (repeatable)"))
        ->required();
    repeatable(c->add_option("--endpoint", *endpoints,
                             "HOST:PORT the credentials may go to, in place of the type's "
                             "(repeatable; a generic provider needs one)"));
    add_output(c, output.get());
    c->footer(
        "Examples:\n  openshell provider create --name gh --type github --credential GITHUB_TOKEN\n"
        "  openshell provider create --name svc --type generic --credential API_KEY=s3cr3t "
        "--endpoint api.example.com:443");
    c->callback([=] {
      *action = [=] {
        json body{{"name", *name}, {"type", *type}, {"credentials", credentials_of(*credentials)}};
        if (!endpoints->empty()) body["endpoints"] = *endpoints;
        GatewayClient client;
        print_provider(client.call("POST", "/v1/providers", body.dump()), *output);
        return 0;
      };
    });
  }

  // list
  {
    auto output = std::make_shared<std::string>("table");
    CLI::App* c = provider->add_subcommand("list", "List the providers (names, keys, endpoints)");
    add_output(c, output.get());
    c->callback([=] {
      *action = [=] {
        GatewayClient client;
        json result = client.call("GET", "/v1/providers");
        if (*output == "json") {
          std::printf("%s\n", result.dump(2).c_str());
          return 0;
        }
        std::vector<std::vector<std::string>> rows = {
            {"NAME", "TYPE", "CREDENTIALS", "ENDPOINTS", "SANDBOXES"}};
        for (const json& p : result.value("providers", json::array())) {
          auto list = [&](const char* field) {
            return text::join(p.value(field, json::array()).get<std::vector<std::string>>(), ",");
          };
          rows.push_back({p.value("name", ""), p.value("type", ""), list("credentials"),
                          list("endpoints"), list("sandboxes")});
        }
        print_table(rows);
        return 0;
      };
    });
  }

  // get
  {
    auto name = std::make_shared<std::string>();
    auto output = std::make_shared<std::string>("table");
    CLI::App* c = provider->add_subcommand("get", "Show a provider (never its values)");
    c->add_option("name", *name, "The provider")->required();
    add_output(c, output.get());
    c->callback([=] {
      *action = [=] {
        GatewayClient client;
        print_provider(client.call("GET", provider_target(*name)), *output);
        return 0;
      };
    });
  }

  // update
  {
    auto name = std::make_shared<std::string>();
    auto credentials = std::make_shared<std::vector<std::string>>();
    auto endpoints = std::make_shared<std::vector<std::string>>();
    auto output = std::make_shared<std::string>("table");
    CLI::App* c = provider->add_subcommand(
        "update", "Rotate credentials or replace endpoints; running sandboxes get them at once");
    c->add_option("name", *name, "The provider")->required();
    repeatable(c->add_option("--credential", *credentials,
                             "KEY=VALUE or KEY (the caller's $KEY): a new value, or a new key"));
    repeatable(c->add_option("--endpoint", *endpoints,
                             "HOST:PORT (repeatable): the endpoints, replacing the ones before"));
    add_output(c, output.get());
    c->footer("Example:\n  openshell provider update gh --credential GITHUB_TOKEN=ghp_new");
    c->callback([=] {
      *action = [=] {
        if (credentials->empty() && endpoints->empty())
          throw Error("provider update " + *name +
                      ": nothing to change (--credential, --endpoint)");
        json body = json::object();
        if (!credentials->empty()) body["credentials"] = credentials_of(*credentials);
        if (!endpoints->empty()) body["endpoints"] = *endpoints;
        GatewayClient client;
        print_provider(client.call("PATCH", provider_target(*name), body.dump()), *output);
        return 0;
      };
    });
  }

  // delete
  {
    auto name = std::make_shared<std::string>();
    CLI::App* c = provider->add_subcommand(
        "delete", "Delete a provider (refused while a sandbox has it: detach it first)");
    c->add_option("name", *name, "The provider")->required();
    c->callback([=] {
      *action = [=] {
        GatewayClient client;
        client.call("DELETE", provider_target(*name));
        std::printf("%s\n", name->c_str());
        return 0;
      };
    });
  }

  // attach, detach
  for (const bool attach : {true, false}) {
    auto sandbox = std::make_shared<std::string>();
    auto name = std::make_shared<std::string>();
    CLI::App* c = provider->add_subcommand(
        attach ? "attach" : "detach",
        attach ? "Give a sandbox a provider: a running one gets its credentials at once, "
                 "its placeholders at its next start"
               : "Take a provider from a sandbox: its credentials at once, its placeholders at "
                 "its next start");
    c->add_option("sandbox", *sandbox, "The sandbox")->required();
    c->add_option("name", *name, "The provider")->required();
    c->footer(attach ? "Example:\n  openshell provider attach demo gh"
                     : "Example:\n  openshell provider detach demo gh");
    c->callback([=] {
      *action = [=] {
        GatewayClient client;
        const std::string path = target(*sandbox, "providers");
        if (attach)
          client.call("POST", path, json{{"provider", *name}}.dump());
        else
          client.call("DELETE", path + "?provider=" + net::percent_encode(*name));
        std::printf("%s: provider %s %s\n", sandbox->c_str(), name->c_str(),
                    attach ? "attached" : "detached");
        return 0;
      };
    });
  }
}

}  // namespace openshell::cli
