#include "egress/ocsf.h"

#include <cstdint>

#include "base/text.h"
#include "base/time.h"

namespace openshell::egress::ocsf {

namespace {

using json = nlohmann::json;

constexpr int kCategoryNetwork = 4;
constexpr int kNetworkActivity = 4001, kHttpActivity = 4002, kDnsActivity = 4003;

std::string string_field(const json& line, const char* key) {
  auto it = line.find(key);
  return it != line.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t int_field(const json& line, const char* key) {
  auto it = line.find(key);
  return it != line.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

std::string base_name(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The path only: a query's values (tokens, exfiltrated secrets) stay out of
// every log.
std::string path_only(const std::string& target) { return target.substr(0, target.find('?')); }

struct Outcome {
  int disposition_id;
  std::string disposition;
  bool allowed;
};

// "allow" and the DNS stub's sources (local, cached, upstream) let the
// traffic through; "deny", "closed" and "rate_limited" stop it; "audit" (an
// endpoint in audit mode) let through what it would have refused, Logged.
Outcome outcome(const std::string& decision) {
  if (decision == "allow" || decision == "local" || decision == "cached" || decision == "upstream")
    return {1, "Allowed", true};
  if (decision == "deny" || decision == "closed" || decision == "rate_limited")
    return {2, "Blocked", false};
  if (decision == "audit") return {17, "Logged", true};
  return {99, decision, false};
}

struct Activity {
  int id;
  const char* name;
};

Activity http_activity(const std::string& method) {
  static const struct {
    const char* method;
    Activity activity;
  } kMethods[] = {
      {"CONNECT", {1, "Connect"}}, {"DELETE", {2, "Delete"}},   {"GET", {3, "Get"}},
      {"HEAD", {4, "Head"}},       {"OPTIONS", {5, "Options"}}, {"POST", {6, "Post"}},
      {"PUT", {7, "Put"}},         {"TRACE", {8, "Trace"}},     {"PATCH", {9, "Patch"}}};
  for (const auto& m : kMethods)
    if (text::iequals(method, m.method)) return m.activity;
  return {99, "Other"};
}

bool is_audit_line(const json& line) {
  return line.is_object() && line.contains("kind") && line["kind"].is_string() &&
         line.contains("decision") && line["decision"].is_string();
}

std::string authority(const std::string& host, int64_t port) {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return port ? h + ":" + std::to_string(port) : h;
}

}  // namespace

std::optional<json> event(const json& line) {
  if (!is_audit_line(line)) return std::nullopt;
  const std::string kind = string_field(line, "kind"), decision = string_field(line, "decision");
  const std::string host = string_field(line, "host"), binary = string_field(line, "binary");
  const std::string rule = string_field(line, "rule"), reason = string_field(line, "reason");
  const std::string method = string_field(line, "method");
  const int64_t port = int_field(line, "port"), pid = int_field(line, "pid");
  const Outcome o = outcome(decision);

  int class_uid;
  const char* class_name;
  Activity activity;
  if (!method.empty()) {
    class_uid = kHttpActivity;
    class_name = "HTTP Activity";
    activity = http_activity(method);
  } else if (kind == "dns") {
    class_uid = kDnsActivity;
    class_name = "DNS Activity";
    activity = {1, "Query"};
  } else {
    class_uid = kNetworkActivity;
    class_name = "Network Activity";
    activity = decision == "closed" ? Activity{2, "Close"}
               : o.allowed          ? Activity{1, "Open"}
                                    : Activity{5, "Refuse"};
  }

  auto ns = time::parse(string_field(line, "time"));
  json e = {
      {"class_uid", class_uid},
      {"class_name", class_name},
      {"category_uid", kCategoryNetwork},
      {"category_name", "Network Activity"},
      {"activity_id", activity.id},
      {"activity_name", activity.name},
      {"type_uid", class_uid * 100 + activity.id},
      {"time", ns ? *ns / 1000000 : 0},
      {"severity_id", o.disposition_id == 1 ? 1
                      : o.allowed           ? 2
                                            : 3},
      {"severity", o.disposition_id == 1 ? "Informational"
                   : o.allowed           ? "Low"
                                         : "Medium"},
      {"action_id", o.allowed ? 1 : 2},
      {"action", o.allowed ? "Allowed" : "Denied"},
      {"disposition_id", o.disposition_id},
      {"disposition", o.disposition},
      {"status_id", o.allowed ? 1 : 2},
      {"status", o.allowed ? "Success" : "Failure"},
  };
  json product = {{"name", "openshell"}, {"vendor_name", "openshell"}};
#ifdef OPENSHELL_VERSION
  product["version"] = OPENSHELL_VERSION;
#endif
  e["metadata"] = {{"version", kSchemaVersion}, {"product", product}};
  if (!reason.empty()) e["status_detail"] = reason;
  if (!rule.empty()) e["firewall_rule"] = {{"name", rule}};

  // The process inside the sandbox, as the proxy named it (none for a
  // query of the DNS stub, or a connection it could not attribute).
  if (pid > 0 || !binary.empty()) {
    json process = {{"pid", pid}};
    if (!binary.empty()) {
      process["name"] = base_name(binary);
      process["file"] = {{"path", binary}, {"name", base_name(binary)}};
    }
    e["actor"] = {{"process", process}};
  }
  // The sandbox is where the traffic comes from; its process is the actor
  // (an OCSF endpoint has no process of its own).
  e["src_endpoint"] = {{"name", string_field(line, "sandbox")}};

  json dst = json::object();
  if (!host.empty()) dst["hostname"] = host;
  if (port) dst["port"] = port;
  if (auto address = string_field(line, "address"); !address.empty()) dst["ip"] = address;
  if (kind != "dns") e["dst_endpoint"] = dst;

  if (class_uid == kHttpActivity) {
    json url = {{"path", path_only(string_field(line, "path"))}};
    if (!host.empty()) url["hostname"] = host;
    if (port) url["port"] = port;
    e["http_request"] = {{"http_method", method}, {"url", url}};
  }
  if (class_uid == kDnsActivity) {
    json query = {{"hostname", host}};
    if (auto type = string_field(line, "qtype"); !type.empty()) query["type"] = type;
    e["query"] = query;
    if (line.contains("answers")) e["answers_count"] = int_field(line, "answers");
    if (line.contains("refused")) e["count"] = int_field(line, "refused");
    e["unmapped"] = {{"source", decision}};
  }
  e["unmapped"]["decision"] = decision;
  e["unmapped"]["kind"] = kind;
  return e;
}

std::optional<std::string> text(const json& line) {
  if (!is_audit_line(line)) return std::nullopt;
  const std::string kind = string_field(line, "kind"), binary = string_field(line, "binary");
  const std::string time = string_field(line, "time");
  const int64_t pid = int_field(line, "pid");
  auto t = time.find('T');
  std::string out = t == std::string::npos ? time : time.substr(t + 1, 8);
  out += ' ';
  out += string_field(line, "decision");
  out += ' ';
  if (!binary.empty())
    out += base_name(binary) + "(pid " + std::to_string(pid) + ")";
  else if (pid > 0)
    out += "pid " + std::to_string(pid);
  else
    out += kind;
  out += " -> ";
  if (kind == "dns") {
    out += string_field(line, "host");
    if (auto type = string_field(line, "qtype"); !type.empty()) out += " " + type;
  } else {
    out += authority(string_field(line, "host"), int_field(line, "port"));
  }
  if (auto method = string_field(line, "method"); !method.empty())
    out += " " + method + " " + path_only(string_field(line, "path"));
  if (auto reason = string_field(line, "reason"); !reason.empty())
    out += "  " + reason;
  else if (auto rule = string_field(line, "rule"); !rule.empty())
    out += "  rule " + rule;
  return out;
}

std::string convert(std::string_view chunk, Format format, std::string* carry) {
  if (format == Format::kJson) return std::string(chunk);
  carry->append(chunk);
  std::string out;
  size_t start = 0;
  for (size_t end; (end = carry->find('\n', start)) != std::string::npos; start = end + 1) {
    std::string_view raw(carry->data() + start, end - start);
    json line = json::parse(raw, nullptr, false);
    std::optional<std::string> converted;
    if (format == Format::kOcsf) {
      if (auto e = event(line)) converted = e->dump(-1, ' ', false, json::error_handler_t::replace);
    } else {
      converted = text(line);
    }
    out += converted ? *converted : std::string(raw);
    out += '\n';
  }
  carry->erase(0, start);
  return out;
}

}  // namespace openshell::egress::ocsf
