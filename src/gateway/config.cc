#include "gateway/config.h"

// clang-format off
#include <utility>

#include <toml++/toml.h>
// clang-format on

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>

#include <boost/asio/ip/address.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/text.h"
#include "base/toml_file.h"

namespace openshell::gateway {

using nlohmann::json;

namespace {

using toml_file::fail;

// "1.2.3.4", "1.2.3.4:5353", "::1", "[::1]:5353": what the resolver takes.
bool is_server(std::string_view text) {
  std::string host(text);
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return false;
    host = std::string(text.substr(1, close - 1));
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return false;
      port = rest.substr(1);
      if (port.empty()) return false;
    }
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    size_t colon = text.find(':');
    host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
    if (port.empty()) return false;
  }
  if (!port.empty()) {
    auto value = text::parse_uint(port, 65535);
    if (!value || *value == 0) return false;
  }
  boost::system::error_code ec;
  boost::asio::ip::make_address(host, ec);
  return !ec;
}

std::string servers_problem(const std::vector<std::string>& servers) {
  for (const auto& s : servers)
    if (!is_server(s)) return "\"" + s + "\" is not an address or address:port";
  return "";
}

std::optional<double> number_from_text(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  double parsed = std::strtod(text.c_str(), &end);
  if (*end != '\0' || !std::isfinite(parsed)) return std::nullopt;
  return parsed;
}

std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

const char* const kRateWhat = "a number of DNS lookups a second (like 20; 0 for no limit)";
const char* const kBurstWhat = "a number of DNS lookups of at least 1";
const char* const kStorageWhat = "one of auto, overlay, copy";

bool good_storage(const std::string& mode) {
  return mode == "auto" || mode == "overlay" || mode == "copy";
}

constexpr int64_t kMaxLimit = 86400000;

constexpr const char* kRegistryWhat = "must be a registry, HOST[:PORT], like \"registry.example\"";
constexpr const char* kPrefixWhat = "must be path components, like \"library\"";

bool good_registry(const std::string& s) {
  if (s.empty() || s.front() == '-' || s.front() == '.' || s.front() == ':') return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '-' || c == ':' || c == '[' || c == ']'))
      return false;
  return true;
}

bool good_prefix(const std::string& s) {
  if (s.empty() || s.front() == '/' || s.back() == '/' || s.find("//") != std::string::npos)
    return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' ||
          c == '/'))
      return false;
  return true;
}

Setting* api_setting(GatewayConfig* c, const std::string& name) {
  if (name == "api.header_timeout_ms") return &c->header_timeout_ms;
  if (name == "api.body_timeout_ms") return &c->body_timeout_ms;
  if (name == "api.idle_timeout_ms") return &c->idle_timeout_ms;
  if (name == "api.max_connections_per_uid") return &c->max_connections_per_uid;
  return nullptr;
}

void from_file(const std::string& path, const toml::table& root, GatewayConfig* c) {
  auto set = [](Setting* s, std::string value) {
    s->value = std::move(value);
    s->source = "file";
  };
  for (const auto& [table_key, table_node] : root) {
    const std::string table_name(table_key.str());
    if (table_name == "sandbox_defaults") continue;  // base/sandbox_limits.h reads it
    if (table_name != "dns" && table_name != "storage" && table_name != "api" &&
        table_name != "images")
      fail(path, &table_node, table_name,
           "unknown table (known: dns, storage, api, images, sandbox_defaults)");
    const toml::table* table = table_node.as_table();
    if (!table) fail(path, &table_node, table_name, "must be a table");
    for (const auto& [key, node] : *table) {
      const std::string name = table_name + "." + std::string(key.str());
      if (name == "dns.servers") {
        const toml::array* list = node.as_array();
        std::vector<std::string> servers;
        if (list)
          for (const auto& item : *list) {
            auto s = item.value<std::string>();
            if (!s) fail(path, &node, name, "must be a list of addresses (strings)");
            servers.push_back(*s);
          }
        else
          fail(path, &node, name, "must be a list, like [\"192.0.2.53\", \"192.0.2.54:5353\"]");
        if (auto why = servers_problem(servers); !why.empty()) fail(path, &node, name, why);
        set(&c->servers, text::join(servers, ","));
      } else if (name == "dns.hosts_file" || name == "dns.resolv_conf") {
        auto s = node.value<std::string>();
        if (!s || s->empty() || (*s)[0] != '/') fail(path, &node, name, "must be an absolute path");
        set(name == "dns.hosts_file" ? &c->hosts_file : &c->resolv_conf, *s);
      } else if (name == "dns.query_rate" || name == "dns.query_burst") {
        const bool rate = name == "dns.query_rate";
        auto n = node.value<double>();
        if (!n || !std::isfinite(*n) || *n < (rate ? 0 : 1))
          fail(path, &node, name, std::string("not ") + (rate ? kRateWhat : kBurstWhat));
        set(rate ? &c->query_rate : &c->query_burst, number_text(*n));
      } else if (name == "storage.mode") {
        auto s = node.value<std::string>();
        if (!s || !good_storage(*s)) fail(path, &node, name, std::string("not ") + kStorageWhat);
        set(&c->storage, *s);
      } else if (name == "api.listen" || name == "api.insecure_listen") {
        const toml::array* list = node.as_array();
        std::vector<std::string> addresses;
        if (list)
          for (const auto& item : *list) {
            auto s = item.value<std::string>();
            if (!s || s->empty()) fail(path, &node, name, "must be a list of ADDRESS:PORT strings");
            addresses.push_back(*s);
          }
        else
          fail(path, &node, name, "must be a list, like [\"127.0.0.1:17670\"]");
        set(name == "api.listen" ? &c->listen : &c->insecure_listen, text::join(addresses, ","));
      } else if (name == "images.default_registry") {
        auto s = node.value<std::string>();
        if (!s || !good_registry(*s)) fail(path, &node, name, kRegistryWhat);
        set(&c->default_registry, *s);
      } else if (name == "images.one_component_prefix") {
        auto s = node.value<std::string>();
        if (!s || !good_prefix(*s)) fail(path, &node, name, kPrefixWhat);
        set(&c->one_component_prefix, *s);
      } else if (name == "api.tls_dir") {
        auto s = node.value<std::string>();
        if (!s || s->empty() || (*s)[0] != '/') fail(path, &node, name, "must be an absolute path");
        set(&c->tls_dir, *s);
      } else if (Setting* limit = api_setting(c, name)) {
        auto n = node.value<int64_t>();
        if (!n || *n < 1 || *n > kMaxLimit)
          fail(path, &node, name, "not a whole number from 1 to 86400000");
        set(limit, std::to_string(*n));
      } else if (name == "api.socket_group") {
        auto s = node.value<std::string>();
        if (!s || s->empty()) fail(path, &node, name, "must be a group's name");
        set(&c->socket_group, *s);
      } else if (table_name == "api") {
        fail(path, &node, name,
             "unknown key (known: header_timeout_ms, body_timeout_ms, idle_timeout_ms, "
             "max_connections_per_uid, listen, insecure_listen, tls_dir, socket_group)");
      } else if (table_name == "dns") {
        fail(path, &node, name,
             "unknown key (known: servers, hosts_file, resolv_conf, query_rate, query_burst)");
      } else {
        fail(path, &node, name, "unknown key (known: mode)");
      }
    }
  }
}

void from_environment(const Getenv& getenv, GatewayConfig* c) {
  auto variable = [&](Setting* s) -> std::optional<std::string> {
    const char* value = getenv(s->env.c_str());
    if (!value || !*value) return std::nullopt;
    return std::string(value);
  };
  auto bad = [](const Setting& s, const std::string& value, const std::string& why) {
    throw Error(s.env + "=" + value + ": " + why);
  };
  auto set = [](Setting* s, std::string value) {
    s->value = std::move(value);
    s->source = "environment";
  };
  if (auto v = variable(&c->servers)) {
    std::vector<std::string> servers;
    for (const std::string& part : text::split(*v, ','))
      if (auto s = text::trim(part); !s.empty()) servers.emplace_back(s);
    if (auto why = servers_problem(servers); !why.empty()) bad(c->servers, *v, why);
    set(&c->servers, text::join(servers, ","));
  }
  for (Setting* s : {&c->hosts_file, &c->resolv_conf})
    if (auto v = variable(s)) set(s, *v);
  if (auto v = variable(&c->query_rate)) {
    auto n = number_from_text(*v);
    if (!n || *n < 0) bad(c->query_rate, *v, std::string("not ") + kRateWhat);
    set(&c->query_rate, number_text(*n));
  }
  if (auto v = variable(&c->query_burst)) {
    auto n = number_from_text(*v);
    if (!n || *n < 1) bad(c->query_burst, *v, std::string("not ") + kBurstWhat);
    set(&c->query_burst, number_text(*n));
  }
  if (auto v = variable(&c->storage)) {
    if (!good_storage(*v)) bad(c->storage, *v, std::string("not ") + kStorageWhat);
    set(&c->storage, *v);
  }
  if (auto v = variable(&c->default_registry)) {
    if (!good_registry(*v)) bad(c->default_registry, *v, kRegistryWhat);
    set(&c->default_registry, *v);
  }
  if (auto v = variable(&c->one_component_prefix)) {
    if (!good_prefix(*v)) bad(c->one_component_prefix, *v, kPrefixWhat);
    set(&c->one_component_prefix, *v);
  }
  for (Setting* s : {&c->header_timeout_ms, &c->body_timeout_ms, &c->idle_timeout_ms,
                     &c->max_connections_per_uid})
    if (auto v = variable(s)) {
      auto n = text::parse_uint(*v, kMaxLimit);
      if (!n || *n == 0) bad(*s, *v, "expected a whole number from 1 to 86400000");
      set(s, std::to_string(*n));
    }
}

}  // namespace

std::string config_path(const Paths& paths, uid_t euid, const Getenv& getenv,
                        const std::string& system_file) {
  // The system gateway: its settings where the host's are kept.
  if (euid == 0 && !getenv("OPENSHELL_HOME") && files::exists(system_file)) return system_file;
  return paths.gateway_config();
}

GatewayConfig load_config(const std::string& path, const Getenv& getenv) {
  GatewayConfig c;
  c.path = path;
  // The defaults, as egress/dns.h has them.
  c.servers = {"", "default", "OPENSHELL_DNS_SERVERS"};
  c.hosts_file = {"/etc/hosts", "default", "OPENSHELL_HOSTS_FILE"};
  c.resolv_conf = {"/etc/resolv.conf", "default", "OPENSHELL_RESOLV_CONF"};
  c.query_rate = {"20", "default", "OPENSHELL_DNS_QUERY_RATE"};
  c.query_burst = {"50", "default", "OPENSHELL_DNS_QUERY_BURST"};
  c.storage = {"auto", "default", "OPENSHELL_STORAGE"};
  const net::ServerLimits api;
  c.header_timeout_ms = {std::to_string(api.header_timeout.count()), "default",
                         "OPENSHELL_API_HEADER_TIMEOUT_MS"};
  c.body_timeout_ms = {std::to_string(api.body_timeout.count()), "default",
                       "OPENSHELL_API_BODY_TIMEOUT_MS"};
  c.idle_timeout_ms = {std::to_string(api.idle_timeout.count()), "default",
                       "OPENSHELL_API_IDLE_TIMEOUT_MS"};
  c.max_connections_per_uid = {std::to_string(api.max_connections_per_uid), "default",
                               "OPENSHELL_API_MAX_CONNECTIONS_PER_UID"};
  c.listen = {"", "default", ""};
  c.insecure_listen = {"", "default", ""};
  c.tls_dir = {"", "default", ""};
  c.socket_group = {"", "default", ""};
  c.default_registry = {"", "default", "OPENSHELL_DEFAULT_REGISTRY"};
  c.one_component_prefix = {"", "default", "OPENSHELL_ONE_COMPONENT_PREFIX"};
  std::string text;
  int err = files::read_into(path, &text);
  if (err && err != ENOENT) throw_errno("read " + path, err);
  if (!err) {
    c.file_exists = true;
    toml::table root = toml_file::parse(text, path);
    from_file(path, root, &c);
    c.sandbox_defaults = limits::load_defaults(path);
  }
  from_environment(getenv, &c);
  return c;
}

net::ServerLimits GatewayConfig::api_limits() const {
  net::ServerLimits limits;
  auto number = [](const Setting& s) { return text::parse_uint(s.value).value_or(1); };
  limits.header_timeout = std::chrono::milliseconds(number(header_timeout_ms));
  limits.body_timeout = std::chrono::milliseconds(number(body_timeout_ms));
  limits.idle_timeout = std::chrono::milliseconds(number(idle_timeout_ms));
  limits.max_connections_per_uid = static_cast<size_t>(number(max_connections_per_uid));
  return limits;
}

std::vector<std::string> GatewayConfig::supervisor_env() const {
  std::vector<std::string> env;
  for (const Setting* s : {&servers, &hosts_file, &resolv_conf, &query_rate, &query_burst})
    if (s->source != "default") env.push_back(s->env + "=" + s->value);
  return env;
}

image::RegistryConfig GatewayConfig::registries(const Getenv& getenv) const {
  // registries.conf alone: the two settings already hold the variables.
  image::RegistryConfig r = image::load_registry_config([&getenv](const char* name) -> const char* {
    std::string_view n(name);
    if (n == "OPENSHELL_DEFAULT_REGISTRY" || n == "OPENSHELL_ONE_COMPONENT_PREFIX") return nullptr;
    return getenv(name);
  });
  if (!default_registry.value.empty()) {
    r.default_registry = default_registry.value;
    r.default_source = default_registry.source == "file" ? path + " images.default_registry"
                                                         : default_registry.env;
  }
  r.one_component_prefix = one_component_prefix.value;
  return r;
}

json GatewayConfig::view() const {
  json settings = json::object();
  auto add = [&](const char* key, const Setting& s) {
    settings[key] = {{"value", s.value}, {"source", s.source}, {"env", s.env}};
  };
  add("dns.servers", servers);
  add("dns.hosts_file", hosts_file);
  add("dns.resolv_conf", resolv_conf);
  add("dns.query_rate", query_rate);
  add("dns.query_burst", query_burst);
  add("storage.mode", storage);
  add("api.header_timeout_ms", header_timeout_ms);
  add("api.body_timeout_ms", body_timeout_ms);
  add("api.idle_timeout_ms", idle_timeout_ms);
  add("api.max_connections_per_uid", max_connections_per_uid);
  add("api.listen", listen);
  add("api.insecure_listen", insecure_listen);
  add("api.tls_dir", tls_dir);
  add("api.socket_group", socket_group);
  // Unset here: show what registries.conf gives short names, or why nothing.
  Setting shown_registry = default_registry;
  if (shown_registry.value.empty()) {
    try {
      image::RegistryConfig r = registries(std::getenv);
      if (!r.default_registry.empty()) {
        shown_registry.value = r.default_registry;
        shown_registry.source = r.default_source;
      } else {
        shown_registry.source = "none: short image names are refused";
      }
    } catch (const Error& e) {
      shown_registry.source = e.what();
    }
  }
  add("images.default_registry", shown_registry);
  add("images.one_component_prefix", one_component_prefix);
  auto add_default = [&](const char* key, const std::optional<uint64_t>& value,
                         const std::string& builtin) {
    settings[key] = {{"value", value ? std::to_string(*value) : builtin},
                     {"source", value ? "file" : "default"}};
  };
  add_default("sandbox_defaults.pids", sandbox_defaults.pids, std::to_string(limits::kDefaultPids));
  add_default("sandbox_defaults.tmp_size", sandbox_defaults.tmp_size,
              "the memory limit, else a tenth of the RAM");
  add_default("sandbox_defaults.shm_size", sandbox_defaults.shm_size, "half of /tmp's default");
  return {{"file", path}, {"file_exists", file_exists}, {"settings", settings}};
}

}  // namespace openshell::gateway
