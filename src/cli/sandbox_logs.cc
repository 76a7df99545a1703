// openshell sandbox logs (and openshell logs): a sandbox's main process
// output or its network log, once or followed.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/text.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"
#include "cli/streams.h"

namespace openshell::cli {

void add_logs_command(CLI::App* parent, const char* help, Action* action) {
  auto name = std::make_shared<std::string>();
  auto lines = std::make_shared<std::string>("all");
  auto follow = std::make_shared<bool>(false);
  auto timestamps = std::make_shared<bool>(false);
  auto source = std::make_shared<std::string>("sandbox");
  CLI::App* c = parent->add_subcommand("logs", help);
  c->add_option("--source", *source,
                "sandbox (the main process's output) or network (the egress decisions, JSON lines)")
      ->check(CLI::IsMember({"sandbox", "network"}))
      ->capture_default_str();
  c->add_option("name", *name, "The sandbox (default: the last one named)");
  c->add_option("-n,--tail", *lines, "Only the last N lines (default all)");
  c->add_flag("-f,--follow", *follow, "Keep printing as the main process writes, until it ends");
  c->add_flag("--timestamps", *timestamps, "Prefix each line with its time");
  c->callback([=] {
    *action = [=] {
      if (*lines != "all" && !text::parse_uint(*lines))
        throw Error("--tail " + *lines + ": not a number");
      GatewayClient client;
      *name = sandbox_name(client.paths(), *name);
      if (*follow) {
        follow_logs(client.paths(), *name, LogOptions{*lines, *timestamps, *source});
        return 0;
      }
      std::string path = target(*name, "logs") + "?source=" + *source;
      if (*lines != "all") path += "&tail=" + *lines;
      std::string body = client.call_text("GET", path);
      if (*source == "network") {
        std::fwrite(body.data(), 1, body.size(), stdout);
        return 0;
      }
      std::string carry;
      print_records(body, *timestamps, &carry);
      return 0;
    };
  });
}

}  // namespace openshell::cli
