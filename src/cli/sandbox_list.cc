// openshell sandbox list: your sandboxes (--all: everyone's), or those with labels.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/text.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"
#include "net/http.h"

namespace openshell::cli {

namespace {

struct ListOptions {
  std::vector<std::string> selectors;  // each "k=v[,k2=v2]"; all must match
  std::string output = "table";
  bool names = false;
  bool all = false;  // every principal's (admins), with an OWNER column
};

int list(const ListOptions& o) {
  GatewayClient client;
  std::string path = "/v1/sandboxes";
  // Repeated -l and commas alike: every term must match (AND).
  const std::string selector = text::join(o.selectors, ",");
  std::vector<std::string> query;
  if (!selector.empty()) query.push_back("selector=" + net::percent_encode(selector));
  if (o.all) query.push_back("all=1");
  if (!query.empty()) path += "?" + text::join(query, "&");
  json answer = client.call("GET", path, {},
                            o.output == "json" ? json::parser_callback_t() : only_table_fields);
  const json sandboxes = std::move(answer["sandboxes"]);  // not a copy of every sandbox's object
  if (o.names) {
    for (const auto& s : sandboxes) std::printf("%s\n", s.value("name", "").c_str());
    return 0;
  }
  print_sandboxes(sandboxes, o.output, o.all);
  return 0;
}

}  // namespace

void add_sandbox_list(CLI::App* sandbox, Action* action) {
  auto o = std::make_shared<ListOptions>();
  CLI::App* c = sandbox->add_subcommand("list", "List the sandboxes");
  c->alias("ls");
  repeatable(c->add_option("-l,--selector", o->selectors,
                           "Only those with these labels: KEY=VALUE or KEY (the label is there), "
                           "comma-separated or repeated; all must match"));
  c->add_flag("--all", o->all,
              "Every principal's sandboxes, with their owners (admins only: root on the socket, "
              "or an admin certificate); without it, only your own");
  CLI::Option* names =
      c->add_flag("--names", o->names, "Print only their names, one a line (for scripts)");
  add_output(c, &o->output)->excludes(names);
  c->footer(
      "Examples:\n  openshell sandbox list -l team=docs,tier=web    # both labels\n"
      "  openshell sandbox list -l team=docs -l tier      # the same AND, repeated\n"
      "  openshell sandbox list --names | xargs -r openshell sandbox stop\nSee "
      "openshell-sandbox(1).");
  c->callback([o, action] { *action = [o] { return list(*o); }; });
}

}  // namespace openshell::cli
