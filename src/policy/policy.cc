#include "policy/policy.h"

// clang-format off
#include <utility>

#include <toml++/toml.h>
// clang-format on

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>
#include <sstream>

#include "base/address.h"
#include "base/error.h"
#include "base/files.h"
#include "base/sandbox_limits.h"
#include "base/text.h"
#include "base/toml_file.h"
#include "policy/edit.h"
#include "policy/yaml.h"

namespace openshell::policy {

namespace {

class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const toml::node* node, const std::string& field,
                         const std::string& message) const {
    std::ostringstream out;
    out << source_;
    size_t line = node ? node->source().begin.line : 0;
    if (node && !line && yaml_lines_) {
      auto found = yaml_lines_->find(node);
      if (found != yaml_lines_->end()) line = found->second;
    }
    if (line > 0) out << ":" << line;
    out << ": " << field << ": " << message;
    throw Error(out.str());
  }

  void check_keys(const toml::table& table, const std::string& where,
                  std::initializer_list<std::string_view> allowed) const {
    for (const auto& [key, value] : table) {
      bool known = false;
      for (auto name : allowed) known = known || key.str() == name;
      if (!known) {
        std::string field =
            where.empty() ? std::string(key.str()) : where + "." + std::string(key.str());
        std::string hint;
        for (auto name : allowed) hint += (hint.empty() ? "" : ", ") + std::string(name);
        fail(&value, field, "unknown field (expected one of: " + hint + ")");
      }
    }
  }

  const toml::table& table_at(const toml::table& parent, std::string_view key,
                              const std::string& field) const {
    const toml::node* node = parent.get(key);
    if (!node->is_table()) fail(node, field, "must be a table");
    return *node->as_table();
  }

  bool boolean(const toml::node& node, const std::string& field) const {
    if (!node.is_boolean()) fail(&node, field, "must be true or false");
    return node.as_boolean()->get();
  }

  std::string string(const toml::node& node, const std::string& field) const {
    if (!node.is_string()) fail(&node, field, "must be a string");
    return node.as_string()->get();
  }

  std::vector<std::pair<const toml::node*, std::string>> string_array(
      const toml::node& node, const std::string& field) const {
    if (!node.is_array()) fail(&node, field, "must be an array of strings");
    std::vector<std::pair<const toml::node*, std::string>> out;
    size_t i = 0;
    for (const auto& item : *node.as_array()) {
      std::string item_field = field + "[" + std::to_string(i++) + "]";
      out.emplace_back(&item, string(item, item_field));
    }
    return out;
  }

  uint16_t port(const toml::node& node, const std::string& field) const {
    if (!node.is_integer()) fail(&node, field, "must be a port number");
    int64_t value = node.as_integer()->get();
    if (value < 1 || value > 65535) fail(&node, field, "must be between 1 and 65535");
    return static_cast<uint16_t>(value);
  }

  void filesystem(const toml::table& table, Policy* policy) const {
    const std::string where = "filesystem_policy";
    check_keys(table, where, {"include_workdir", "read_only", "read_write"});
    policy->has_filesystem_policy = true;
    FilesystemPolicy& fs = policy->filesystem;
    if (auto* node = table.get("include_workdir"))
      fs.include_workdir = boolean(*node, where + ".include_workdir");
    for (auto [key, list] :
         {std::pair{"read_only", &fs.read_only}, std::pair{"read_write", &fs.read_write}}) {
      const toml::node* node = table.get(key);
      if (!node) continue;
      std::string field = where + "." + key;
      size_t i = 0;
      for (auto& [item, path] : string_array(*node, field)) {
        std::string item_field = field + "[" + std::to_string(i++) + "]";
        if (auto why = text::check_absolute_path(path); !why.empty()) fail(item, item_field, why);
        std::string normal = text::normalize_path(path);
        if (list == &fs.read_write && normal == "/")
          fail(item, item_field, "/ cannot be read-write; name the directories that need writing");
        list->push_back(normal);
      }
    }
  }

  void landlock(const toml::table& table, Policy* policy) const {
    check_keys(table, "landlock", {"compatibility"});
    if (auto* node = table.get("compatibility")) {
      std::string value = string(*node, "landlock.compatibility");
      if (value == "best_effort")
        policy->landlock = LandlockCompatibility::kBestEffort;
      else if (value == "hard_requirement")
        policy->landlock = LandlockCompatibility::kHardRequirement;
      else
        fail(node, "landlock.compatibility",
             "must be \"best_effort\" or \"hard_requirement\", not \"" + value + "\"");
    }
  }

  void process(const toml::table& table, Policy* policy) const {
    check_keys(table, "process", {"run_as_user", "run_as_group", "allow_root"});
    if (const toml::node* node = table.get("allow_root")) {
      if (!node->is_boolean()) fail(node, "process.allow_root", "must be true or false");
      policy->process.allow_root = node->as_boolean()->get();
    }
    for (auto [key, target] : {std::pair{"run_as_user", &policy->process.run_as_user},
                               std::pair{"run_as_group", &policy->process.run_as_group}}) {
      const toml::node* node = table.get(key);
      if (!node) continue;
      std::string field = std::string("process.") + key;
      std::string value;
      if (node->is_integer()) {
        int64_t id = node->as_integer()->get();
        if (id < 0 || id > 0xFFFFFFFELL) fail(node, field, "is not a valid id");
        value = std::to_string(id);
      } else {
        value = string(*node, field);
        // A number in a string is that number ("00" is 0).
        if (auto id = text::parse_uint(value, 0xFFFFFFFE)) value = std::to_string(*id);
      }
      if (value.empty()) fail(node, field, "must not be empty");
      if ((value == "root" || value == "0") && !policy->process.allow_root)
        fail(node, field, "must not be root (unless process.allow_root = true)");
      *target = value;
    }
  }

  // vcpus = 2; memory = "512M" (a size as --memory takes it, rounded up
  // to whole MiB) or an integer of MiB.
  void vm(const toml::table& table, Policy* policy) const {
    check_keys(table, "vm", {"vcpus", "memory"});
    if (const toml::node* node = table.get("vcpus")) {
      if (!node->is_integer()) fail(node, "vm.vcpus", "must be a number of vCPUs");
      int64_t value = node->as_integer()->get();
      if (value < limits::kMinVcpus || value > limits::kMaxVcpus)
        fail(node, "vm.vcpus",
             "must be between " + std::to_string(limits::kMinVcpus) + " and " +
                 std::to_string(limits::kMaxVcpus));
      policy->vm.vcpus = static_cast<uint32_t>(value);
    }
    if (const toml::node* node = table.get("memory")) {
      std::optional<uint64_t> mib;
      if (node->is_integer()) {
        if (node->as_integer()->get() > 0) mib = static_cast<uint64_t>(node->as_integer()->get());
      } else if (node->is_string()) {
        if (auto bytes = text::parse_size(node->as_string()->get()))
          mib = (*bytes + (1u << 20) - 1) >> 20;
      } else {
        fail(node, "vm.memory", "must be a size like \"512M\" or \"2G\", or an integer of MiB");
      }
      if (!mib) fail(node, "vm.memory", "not a size (like \"512M\", \"2G\", or an integer of MiB)");
      if (*mib < limits::kMinGuestMib || *mib > limits::kMaxGuestMib)
        fail(node, "vm.memory",
             "must be between " + std::to_string(limits::kMinGuestMib) + " and " +
                 std::to_string(limits::kMaxGuestMib) + " MiB");
      policy->vm.memory_mib = *mib;
    }
  }

  void network(const toml::table& table, Policy* policy) const {
    for (const auto& [key, value] : table) {
      std::string name(key.str());
      std::string where = "network_policies." + name;
      if (!value.is_table()) fail(&value, where, "must be a table");
      const toml::table& rule_table = *value.as_table();
      check_keys(rule_table, where, {"endpoints", "binaries"});
      NetworkPolicy rule;
      rule.name = name;
      if (auto* endpoints = rule_table.get("endpoints")) {
        if (!endpoints->is_array())
          fail(endpoints, where + ".endpoints", "must be an array of tables");
        size_t i = 0;
        for (const auto& item : *endpoints->as_array()) {
          std::string field = where + ".endpoints[" + std::to_string(i++) + "]";
          rule.endpoints.push_back(endpoint(item, field));
        }
      }
      if (auto* binaries = rule_table.get("binaries")) {
        if (!binaries->is_array())
          fail(binaries, where + ".binaries", "must be an array of tables");
        size_t i = 0;
        for (const auto& item : *binaries->as_array()) {
          std::string field = where + ".binaries[" + std::to_string(i++) + "]";
          if (!item.is_table())
            fail(&item, field, "must be a table like { path = \"/usr/bin/git\" }");
          check_keys(*item.as_table(), field, {"path"});
          const toml::node* path = item.as_table()->get("path");
          if (!path) fail(&item, field, "needs a path");
          Binary binary{string(*path, field + ".path")};
          if (binary.path.empty() || binary.path[0] != '/')
            fail(path, field + ".path", "must be an absolute path");
          rule.binaries.push_back(binary);
        }
      }
      policy->network.push_back(std::move(rule));
    }
  }

  // A string that must be one of `choices`: "must be "a" or "b", not "c"".
  std::string one_of(const toml::node& node, const std::string& field,
                     std::initializer_list<std::string_view> choices) const {
    std::string value = string(node, field);
    std::string list;
    size_t i = 0;
    for (auto choice : choices) {
      if (value == choice) return value;
      if (i++) list += i == choices.size() ? " or " : ", ";
      list += "\"" + std::string(choice) + "\"";
    }
    fail(&node, field, "must be " + list + ", not \"" + value + "\"");
  }

  // { key = "glob" } or { key = { any = ["glob", ...] } }, sorted by key.
  std::vector<QueryMatcher> query(const toml::node& node, const std::string& field) const {
    if (!node.is_table())
      fail(&node, field,
           "must be a table like { state = \"open\" } or { state = { any = [...] } }");
    std::vector<QueryMatcher> out;
    for (const auto& [key, value] : *node.as_table()) {
      std::string item_field = field + "." + std::string(key.str());
      if (key.str().empty()) fail(&value, field, "a query key must not be empty");
      QueryMatcher matcher{std::string(key.str()), "", {}};
      if (value.is_string()) {
        matcher.glob = value.as_string()->get();
      } else if (value.is_table()) {
        check_keys(*value.as_table(), item_field, {"any"});
        const toml::node* any = value.as_table()->get("any");
        if (!any) fail(&value, item_field, "needs any = [\"glob\", ...]");
        for (auto& [item, glob] : string_array(*any, item_field + ".any"))
          matcher.any.push_back(glob);
        if (matcher.any.empty()) fail(any, item_field + ".any", "must not be empty");
      } else {
        fail(&value, item_field, "must be a glob string or { any = [\"glob\", ...] }");
      }
      out.push_back(std::move(matcher));
    }
    return out;
  }

  // rules = [ { allow = {...} } ] or deny_rules = [ { deny = {...} } ].
  std::vector<HttpRule> http_rules(const toml::node& node, const std::string& field,
                                   std::string_view word) const {
    const std::string example =
        "{ " + std::string(word) + " = { method = \"GET\", path = \"/**\" } }";
    if (!node.is_array()) fail(&node, field, "must be an array like [ " + example + " ]");
    std::vector<HttpRule> out;
    size_t i = 0;
    for (const auto& item : *node.as_array()) {
      std::string item_field = field + "[" + std::to_string(i++) + "]";
      if (!item.is_table()) fail(&item, item_field, "must be a table like " + example);
      const toml::table& entry = *item.as_table();
      std::string_view other = word == "allow" ? "deny" : "allow";
      if (const toml::node* wrong = entry.get(other))
        fail(wrong, item_field + "." + std::string(other),
             "an entry of " + std::string(word == "allow" ? "rules" : "deny_rules") + " is " +
                 example);
      check_keys(entry, item_field, {word});
      const toml::node* body = entry.get(word);
      if (!body) fail(&item, item_field, "must be a table like " + example);
      std::string where = item_field + "." + std::string(word);
      if (!body->is_table())
        fail(body, where, "must be a table like { method = \"GET\", path = \"/**\" }");
      const toml::table& t = *body->as_table();
      check_keys(t, where, {"method", "path", "query"});
      HttpRule rule;
      if (const toml::node* m = t.get("method")) {
        rule.method = string(*m, where + ".method");
        if (auto why = check_http_method(rule.method); !why.empty())
          fail(m, where + ".method", why);
        rule.method = text::upper(rule.method);
      }
      if (const toml::node* p = t.get("path")) {
        rule.path = string(*p, where + ".path");
        if (auto why = check_path_glob(rule.path); !why.empty()) fail(p, where + ".path", why);
      }
      if (const toml::node* q = t.get("query")) rule.query = query(*q, where + ".query");
      out.push_back(std::move(rule));
    }
    return out;
  }

  Endpoint endpoint(const toml::node& node, const std::string& field) const {
    if (!node.is_table())
      fail(&node, field, "must be a table like { host = \"example.com\", port = 443 }");
    const toml::table& table = *node.as_table();
    check_keys(table, field,
               {"host", "port", "ports", "allowed_ips", "protocol", "tls", "enforcement", "access",
                "rules", "deny_rules", "allow_encoded_slash", "ca_file", "credentials_in"});
    Endpoint endpoint;
    const toml::node* host = table.get("host");
    if (!host) fail(&node, field, "needs a host");
    endpoint.host = string(*host, field + ".host");
    if (auto why = check_host_pattern(endpoint.host); !why.empty())
      fail(host, field + ".host", why);
    if (auto* p = table.get("port")) endpoint.ports.push_back(port(*p, field + ".port"));
    if (auto* ps = table.get("ports")) {
      if (!ps->is_array()) fail(ps, field + ".ports", "must be an array of port numbers");
      size_t i = 0;
      for (const auto& item : *ps->as_array())
        endpoint.ports.push_back(port(item, field + ".ports[" + std::to_string(i++) + "]"));
    }
    if (endpoint.ports.empty()) fail(&node, field, "needs a port or ports");
    if (auto* ips = table.get("allowed_ips")) {
      size_t i = 0;
      for (auto& [item, value] : string_array(*ips, field + ".allowed_ips")) {
        std::string item_field = field + ".allowed_ips[" + std::to_string(i++) + "]";
        if (auto why = check_allowed_ip(value); !why.empty()) fail(item, item_field, why);
        endpoint.allowed_ips.push_back(value);
      }
    }
    layer7(table, field, &endpoint);
    return endpoint;
  }

  // The layer-7 fields (docs/policy.md, "Layer 7"): each checked alone,
  // then against each other.
  void layer7(const toml::table& table, const std::string& field, Endpoint* endpoint) const {
    if (auto* n = table.get("protocol"))
      endpoint->protocol = one_of(*n, field + ".protocol", {"rest", "websocket"});
    if (auto* n = table.get("tls")) endpoint->tls = one_of(*n, field + ".tls", {"auto", "skip"});
    if (auto* n = table.get("enforcement"))
      endpoint->enforcement = one_of(*n, field + ".enforcement", {"enforce", "audit"});
    if (auto* n = table.get("access"))
      endpoint->access = one_of(*n, field + ".access", {"read-only", "read-write", "full"});
    if (auto* n = table.get("rules")) endpoint->rules = http_rules(*n, field + ".rules", "allow");
    if (auto* n = table.get("deny_rules"))
      endpoint->deny_rules = http_rules(*n, field + ".deny_rules", "deny");
    if (auto* n = table.get("allow_encoded_slash"))
      endpoint->allow_encoded_slash = boolean(*n, field + ".allow_encoded_slash");
    if (auto* n = table.get("ca_file")) {
      endpoint->ca_file = string(*n, field + ".ca_file");
      if (auto why = text::check_absolute_path(endpoint->ca_file); !why.empty())
        fail(n, field + ".ca_file", why);
    }
    if (auto* n = table.get("credentials_in")) {
      size_t i = 0;
      for (auto& [item, place] : string_array(*n, field + ".credentials_in")) {
        const std::string item_field = field + ".credentials_in[" + std::to_string(i++) + "]";
        one_of(*item, item_field, {"query", "body"});
        if (std::find(endpoint->credentials_in.begin(), endpoint->credentials_in.end(), place) !=
            endpoint->credentials_in.end())
          fail(item, item_field, "\"" + place + "\" is given twice");
        endpoint->credentials_in.push_back(place);
      }
    }
    if (table.contains("access") && table.contains("rules"))
      fail(table.get("rules"), field + ".rules",
           "access and rules exclude each other: give access (a preset) or rules, not both");
    if (endpoint->protocol.empty())
      for (const char* key :
           {"rules", "deny_rules", "access", "enforcement", "allow_encoded_slash", "credentials_in"})
        if (auto* n = table.get(key))
          fail(n, field + "." + key,
               "needs protocol = \"rest\" or \"websocket\" on this endpoint (without it the "
               "endpoint is layer 4: its requests are not read)");
    if (endpoint->tls == "skip")
      for (const char* key : {"rules", "deny_rules", "access", "credentials_in"})
        if (auto* n = table.get(key))
          fail(n, field + "." + key,
               "cannot go with tls = \"skip\": the bytes are relayed unread, so there is no "
               "request to judge");
  }

  Policy parse(std::string_view text) {
    toml::table root;
    YamlLines lines;
    if (looks_like_yaml(text) || source_.ends_with(".yaml") || source_.ends_with(".yml")) {
      root = yaml_to_table(text, source_, &lines);
      yaml_lines_ = &lines;
    } else {
      root = toml_file::parse(text, source_);
    }
    Policy policy = parse_root(root);
    yaml_lines_ = nullptr;
    return policy;
  }

  Policy parse_root(const toml::table& root) const {
    check_keys(root, "",
               {"version", "filesystem_policy", "landlock", "process", "network_policies", "vm"});
    Policy policy;
    const toml::node* version = root.get("version");
    if (!version) throw Error(source_ + ": version: missing (write version = 1 at the top)");
    if (!version->is_integer() || version->as_integer()->get() != 1)
      fail(version, "version", "unsupported version (this openshell reads version = 1)");
    if (root.contains("filesystem_policy"))
      filesystem(table_at(root, "filesystem_policy", "filesystem_policy"), &policy);
    if (root.contains("landlock")) landlock(table_at(root, "landlock", "landlock"), &policy);
    if (root.contains("process")) process(table_at(root, "process", "process"), &policy);
    if (root.contains("network_policies"))
      network(table_at(root, "network_policies", "network_policies"), &policy);
    if (root.contains("vm")) vm(table_at(root, "vm", "vm"), &policy);
    return policy;
  }

 private:
  std::string source_;
  const YamlLines* yaml_lines_ = nullptr;  // a YAML policy's lines
};

}  // namespace

std::string check_host_pattern(std::string_view host) {
  if (host.empty()) return "must not be empty";
  if (host.size() > 253) return "is longer than 253 characters";
  auto labels = text::split(host, '.');
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string& label = labels[i];
    if (label.empty()) return "has an empty label";
    if (label.find('*') != std::string::npos) {
      if (i != 0) return "may hold '*' only in its first label";
      if (labels.size() < 3) return "wildcard must leave at least two labels (\"*.example.com\")";
      continue;
    }
    for (char c : label) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '_' || c == ':';
      if (!ok) return std::string("has an invalid character '") + c + "'";
    }
  }
  return {};
}

std::string check_allowed_ip(std::string_view entry) {
  // The parser the rules compile with: what passes here, compiles there.
  if (Cidr::parse(entry)) return {};
  std::string why = "\"" + std::string(entry) + "\" is not an IP address or CIDR";
  size_t slash = entry.find('/');
  auto address = Address::parse(entry.substr(0, slash));
  if (address && slash != std::string_view::npos) {
    int bits = address->family == AF_INET ? 32 : 128;
    std::string_view prefix = entry.substr(slash + 1);
    if (prefix.empty()) return why + ": the prefix length after '/' is missing";
    return why + ": the prefix length must be a number from 0 to " + std::to_string(bits);
  }
  return why + " (like 10.0.0.0/8, 192.0.2.1 or fd00::/8)";
}

std::string check_http_method(std::string_view method) {
  if (method.empty()) return "must not be empty (\"*\" is any method)";
  if (method == "*") return {};
  for (char c : method) {
    bool token = std::isalnum(static_cast<unsigned char>(c)) ||
                 std::string_view("!#$%&'+-.^_`|~").find(c) != std::string_view::npos;
    if (c == '*') return "may be \"*\" (any method) but not hold it";
    if (!token) return "\"" + std::string(method) + "\" is not an HTTP method (like GET or POST)";
  }
  return {};
}

std::string check_path_glob(std::string_view path) {
  if (path.empty() || path[0] != '/') return "must start with '/' (like \"/repos/**\")";
  for (char c : path) {
    auto byte = static_cast<unsigned char>(c);
    if (byte <= 0x20 || byte == 0x7f) return "must not hold spaces or control characters";
    if (c == '?') return "must not hold '?': match the query string with query = { ... }";
    if (c == '#') return "must not hold '#': a request's path has no fragment";
  }
  for (const std::string& segment : text::split(path.substr(1), '/'))
    if (segment.find("**") != std::string::npos && segment != "**")
      return "\"**\" must be a whole segment (like \"/a/**\" or \"/a/**/b\"); \"*\" matches "
             "within one";
  return {};
}

Policy parse(std::string_view text, const std::string& source_name) {
  return Parser(source_name).parse(text);
}

Policy load(const std::string& path) {
  std::string text;
  if (int err = files::read_into(path, &text)) throw_errno("policy " + path, err);
  return parse(text, path);
}

namespace {

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string toml_string(std::string_view text) {
  constexpr std::string_view kPlain = "\"\\\b\t\n\f\r";
  constexpr std::string_view kEscaped = "\"\\btnfr";
  std::string out = "\"";
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if (size_t i = kPlain.find(c); i != std::string_view::npos) {
      out += '\\';
      out += kEscaped[i];
    } else if (byte < 0x20 || byte == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04X", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A key bare where TOML allows it, else quoted.
std::string toml_key(std::string_view key) {
  bool bare = !key.empty();
  for (char c : key)
    bare = bare && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-');
  return bare ? std::string(key) : toml_string(key);
}

// `key = ["a", "b"]` on one line when it fits in 100 columns, else one item a line.
std::string string_array(std::string_view key, const std::vector<std::string>& items) {
  std::string line = std::string(key) + " = [";
  for (size_t i = 0; i < items.size(); ++i) line += (i ? ", " : "") + toml_string(items[i]);
  line += "]\n";
  if (line.size() <= 101) return line;
  std::string lines = std::string(key) + " = [\n";
  for (const auto& item : items) lines += "  " + toml_string(item) + ",\n";
  return lines + "]\n";
}

std::string glob_list(const std::vector<std::string>& globs) {
  std::string out = "[";
  for (size_t i = 0; i < globs.size(); ++i) out += (i ? ", " : "") + toml_string(globs[i]);
  return out + "]";
}

// Each rule as `{ allow = { method = "GET", path = "/x", query = {...} } }`.
std::vector<std::string> http_rules(std::string_view word, const std::vector<HttpRule>& rules) {
  std::vector<std::string> out;
  for (const HttpRule& rule : rules) {
    std::vector<std::string> parts;
    if (!rule.method.empty()) parts.push_back("method = " + toml_string(rule.method));
    if (!rule.path.empty()) parts.push_back("path = " + toml_string(rule.path));
    if (!rule.query.empty()) {
      std::vector<std::string> matchers;
      for (const QueryMatcher& q : rule.query)
        matchers.push_back(
            toml_key(q.key) + " = " +
            (q.any.empty() ? toml_string(q.glob) : "{ any = " + glob_list(q.any) + " }"));
      parts.push_back("query = { " + text::join(matchers, ", ") + " }");
    }
    std::string body = parts.empty() ? "{}" : "{ " + text::join(parts, ", ") + " }";
    out.push_back("{ " + std::string(word) + " = " + body + " }");
  }
  return out;
}

std::string endpoint_table(const Endpoint& endpoint) {
  std::string out = "{ host = " + toml_string(endpoint.host);
  if (endpoint.ports.size() == 1) {
    out += ", port = " + std::to_string(endpoint.ports[0]);
  } else if (!endpoint.ports.empty()) {
    out += ", ports = [";
    for (size_t i = 0; i < endpoint.ports.size(); ++i)
      out += (i ? ", " : "") + std::to_string(endpoint.ports[i]);
    out += "]";
  }
  if (!endpoint.allowed_ips.empty()) {
    out += ", allowed_ips = [";
    for (size_t i = 0; i < endpoint.allowed_ips.size(); ++i)
      out += (i ? ", " : "") + toml_string(endpoint.allowed_ips[i]);
    out += "]";
  }
  for (auto [key, value] :
       {std::pair{"protocol", &endpoint.protocol}, std::pair{"tls", &endpoint.tls},
        std::pair{"enforcement", &endpoint.enforcement}, std::pair{"access", &endpoint.access}})
    if (!value->empty()) out += std::string(", ") + key + " = " + toml_string(*value);
  if (endpoint.allow_encoded_slash) out += ", allow_encoded_slash = true";
  if (!endpoint.ca_file.empty()) out += ", ca_file = " + toml_string(endpoint.ca_file);
  if (!endpoint.credentials_in.empty()) {
    out += ", credentials_in = [";
    for (size_t i = 0; i < endpoint.credentials_in.size(); ++i)
      out += (i ? ", " : "") + toml_string(endpoint.credentials_in[i]);
    out += "]";
  }
  // The rules on the endpoint's line where it fits in 100 columns, else
  // one rule a line (an array may span lines, even in an inline table).
  std::vector<std::pair<std::string, std::vector<std::string>>> arrays;
  if (!endpoint.rules.empty()) arrays.push_back({"rules", http_rules("allow", endpoint.rules)});
  if (!endpoint.deny_rules.empty())
    arrays.push_back({"deny_rules", http_rules("deny", endpoint.deny_rules)});
  std::string one_line = out;
  for (const auto& [key, items] : arrays) {
    one_line += ", " + key + " = [";
    for (size_t i = 0; i < items.size(); ++i) one_line += (i ? ", " : "") + items[i];
    one_line += "]";
  }
  if (one_line.size() + 5 <= 100) return one_line + " }";
  for (const auto& [key, items] : arrays) {
    out += ", " + key + " = [\n";
    for (const auto& item : items) out += "      " + item + ",\n";
    out += "    ]";
  }
  return out + " }";
}

}  // namespace

std::string to_toml(const Policy& policy) {
  std::string out = "version = " + std::to_string(policy.version) + "\n";
  if (policy.has_filesystem_policy) {
    const FilesystemPolicy& fs = policy.filesystem;
    out += "\n[filesystem_policy]\n";
    out += std::string("include_workdir = ") + (fs.include_workdir ? "true" : "false") + "\n";
    out += string_array("read_only", fs.read_only);
    out += string_array("read_write", fs.read_write);
  }
  out += "\n[landlock]\ncompatibility = ";
  out += policy.landlock == LandlockCompatibility::kHardRequirement ? "\"hard_requirement\"\n"
                                                                    : "\"best_effort\"\n";
  if (policy.process.run_as_user || policy.process.run_as_group || policy.process.allow_root) {
    out += "\n[process]\n";
    if (policy.process.allow_root) out += "allow_root = true\n";
    if (policy.process.run_as_user)
      out += "run_as_user = " + toml_string(*policy.process.run_as_user) + "\n";
    if (policy.process.run_as_group)
      out += "run_as_group = " + toml_string(*policy.process.run_as_group) + "\n";
  }
  if (policy.vm.vcpus || policy.vm.memory_mib) {
    out += "\n[vm]\n";
    if (policy.vm.vcpus) out += "vcpus = " + std::to_string(*policy.vm.vcpus) + "\n";
    if (policy.vm.memory_mib)
      out += "memory = \"" + std::to_string(*policy.vm.memory_mib) + "M\"\n";
  }
  std::set<std::string> names;
  for (const NetworkPolicy& rule : policy.network) {
    if (!names.insert(rule.name).second)
      throw Error("network_policies." + rule.name + ": the name is given twice");
    out += "\n[network_policies." + toml_key(rule.name) + "]\n";
    if (!rule.endpoints.empty()) {
      out += "endpoints = [\n";
      for (const Endpoint& endpoint : rule.endpoints)
        out += "  " + endpoint_table(endpoint) + ",\n";
      out += "]\n";
    }
    if (!rule.binaries.empty()) {
      out += "binaries = [\n";
      for (const Binary& binary : rule.binaries)
        out += "  { path = " + toml_string(binary.path) + " },\n";
      out += "]\n";
    }
  }
  return out;
}

Policy default_policy() {
  Policy policy;
  policy.has_filesystem_policy = true;
  policy.filesystem.include_workdir = true;
  policy.filesystem.read_only = {"/usr", "/lib", "/lib64", "/bin", "/sbin",
                                 "/etc", "/opt", "/proc",  "/dev", "/sys"};
  policy.filesystem.read_write = {"/sandbox", "/tmp", "/dev/null", "/dev/shm", "/dev/pts"};
  policy.landlock = LandlockCompatibility::kBestEffort;
  return policy;
}

}  // namespace openshell::policy
