// openshell sandbox logs (and openshell logs): a sandbox's main process
// output or its network log, once or followed.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/text.h"
#include "base/time.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"
#include "cli/streams.h"
#include "egress/ocsf.h"

namespace openshell::cli {

namespace {

struct LogsCommand {
  std::string name, lines = "all", since, source = "sandbox", output;
  bool follow = false, tail = false, timestamps = false;
};

// --since: a duration back from now ("5m", "1h30m") or an RFC 3339 time.
int64_t since_ns(const std::string& value) {
  if (auto ago = time::parse_duration(value)) return time::now_ns() - *ago;
  if (auto at = time::parse(value)) return *at < 0 ? 0 : *at;
  throw Error("--since " + value +
              ": not a duration (like 30s, 5m, 1h30m or 2d) or an RFC 3339 time (like "
              "2026-12-01T12:00:00Z)");
}

int logs(LogsCommand& o) {
  // docker's `--tail 5` is OpenShell's `-n 5`; here --tail follows, as there.
  if (o.tail && !o.name.empty() && text::parse_uint(o.name))
    throw Error("--tail " + o.name + ": --tail takes no number (it follows, as in OpenShell); -n " +
                o.name + " gives the last " + o.name + " lines");
  o.follow = o.follow || o.tail;
  if (o.lines != "all" && !text::parse_uint(o.lines, 1u << 30))
    throw Error("-n " + o.lines + ": not a number of lines");
  if (!o.output.empty() && o.source != "network")
    throw Error("-o " + o.output + ": only the network log (--source network) has formats");
  LogOptions options{o.lines, o.timestamps, o.source, std::nullopt,
                     o.output.empty() ? "json" : o.output};
  if (!o.since.empty()) options.since_ns = since_ns(o.since);
  GatewayClient client;
  o.name = sandbox_name(client.paths(), o.name);
  if (o.follow) {
    follow_logs(client, o.name, options);
    return 0;
  }
  std::string path = target(o.name, "logs") + "?source=" + o.source;
  if (o.lines != "all") path += "&tail=" + o.lines;
  if (options.since_ns) path += "&since=" + std::to_string(*options.since_ns);
  std::string body = client.call_text("GET", path);
  if (o.source == "network") {
    std::string carry;
    std::string out = egress::ocsf::convert(body, network_format(options.format), &carry);
    // The last line unfinished (written as it was read): shown as it is.
    if (!carry.empty()) out += egress::ocsf::convert("\n", network_format(options.format), &carry);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  std::string carry;
  print_records(body, o.timestamps, &carry);
  return 0;
}

}  // namespace

void add_logs_command(CLI::App* parent, const char* help, Action* action) {
  auto o = std::make_shared<LogsCommand>();
  CLI::App* c = parent->add_subcommand("logs", help);
  c->add_option("--source", o->source,
                "sandbox (the main process's output) or network (the egress decisions, JSON lines)")
      ->check(CLI::IsMember({"sandbox", "network"}))
      ->capture_default_str();
  c->add_option("-o,--output", o->output,
                "The network log's format: json (the proxy's lines, the default), ocsf (one OCSF "
                "event a line) or text (one human line each)")
      ->check(CLI::IsMember({"json", "ocsf", "text"}));
  c->add_option("name", o->name, "The sandbox (default: the last one named)");
  c->add_option("-n,--lines", o->lines, "Only the last N lines (default all)");
  c->add_option("--since", o->since,
                "Only lines from this time on: a duration back from now (30s, 5m, 1h30m, 2d) or "
                "an RFC 3339 time (2026-12-01T12:00:00Z)");
  c->add_flag("-f,--follow", o->follow, "Keep printing as the main process writes, until it ends");
  c->add_flag("--tail", o->tail, "The same as --follow (OpenShell's spelling; -n counts lines)");
  c->add_flag("--timestamps", o->timestamps, "Prefix each line with its time");
  c->footer(
      "Examples:\n  openshell logs agent -n 20            # the last 20 lines\n"
      "  openshell logs agent --since 5m --tail  # the last five minutes, then follow\n"
      "  openshell logs agent --source network --since 2026-12-01T12:00:00Z\n"
      "  openshell logs agent --source network -o text --follow\nSee "
      "openshell-logs(1).");
  c->callback([o, action] { *action = [o] { return logs(*o); }; });
}

}  // namespace openshell::cli
