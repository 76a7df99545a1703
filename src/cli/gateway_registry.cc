#include "cli/gateway_registry.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "base/address.h"
#include "base/error.h"
#include "base/files.h"

namespace openshell::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : "";
}

std::string gateways_of(const std::string& registry) { return registry + "/gateways"; }

// mkdir -p, each directory it makes 0700.
void make_private_dirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) throw_errno("create " + prefix);
  }
}

bool is_url(const std::string& text) {
  return text.find("://") != std::string::npos || (!text.empty() && text[0] == '/');
}

// The files generate-certs wrote for this user, when they are all there.
net::TlsFiles local_client_files(const Paths& paths) {
  const std::string dir = paths.tls_dir();
  net::TlsFiles files{dir + "/ca.crt", dir + "/client.crt", dir + "/client.key"};
  if (!files::exists(files.ca) || !files::exists(files.cert) || !files::exists(files.key))
    return {};
  return files;
}

}  // namespace

void check_gateway_name(const std::string& name) {
  const std::string why = name.empty()       ? "empty"
                          : name.size() > 63 ? "longer than 63 characters"
                          : name[0] == '.' || name[0] == '-'
                              ? "starts with '" + name.substr(0, 1) + "'"
                          : std::any_of(name.begin(), name.end(),
                                        [](char c) {
                                          return !(std::isalnum(static_cast<unsigned char>(c)) ||
                                                   c == '-' || c == '_' || c == '.');
                                        })
                              ? "only letters, digits, '-', '_' and '.' are allowed"
                              : "";
  if (!why.empty()) throw Error("gateway name '" + name + "': " + why);
}

GatewayRegistry GatewayRegistry::from_environment() {
  std::string user = env("XDG_CONFIG_HOME");
  if (user.empty()) {
    const std::string home = env("HOME");
    user = home.empty() ? "" : home + "/.config";
  }
  if (!user.empty()) user += "/openshell";
  std::string system = env("OPENSHELL_SYSTEM_CONFIG_DIR");
  if (system.empty()) system = "/etc/openshell";
  return GatewayRegistry(user, system);
}

GatewayRegistry::GatewayRegistry(std::string user_dir, std::string system_dir)
    : user_dir_(std::move(user_dir)), system_dir_(std::move(system_dir)) {}

std::vector<std::string> GatewayRegistry::names_in(const std::string& registry) const {
  std::vector<std::string> names;
  if (registry.empty()) return names;
  std::error_code ec;
  for (fs::directory_iterator it(gateways_of(registry), ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (files::exists(it->path().string() + "/endpoint.json")) names.push_back(name);
  }
  return names;
}

std::optional<RegisteredGateway> GatewayRegistry::read_entry(const std::string& registry,
                                                             const std::string& name,
                                                             bool system) const {
  if (registry.empty()) return std::nullopt;
  try {
    check_gateway_name(name);
  } catch (const Error&) {
    return std::nullopt;
  }
  const std::string dir = gateways_of(registry) + "/" + name;
  const std::string meta_file = dir + "/endpoint.json";
  auto text = files::try_read(meta_file);
  if (!text) return std::nullopt;
  json meta = json::parse(*text, nullptr, false);
  if (!meta.is_object() || !meta.contains("endpoint") || !meta["endpoint"].is_string())
    throw Error(meta_file + ": not a gateway's entry (expected {\"endpoint\": URL})");
  RegisteredGateway g;
  g.name = name;
  g.dir = dir;
  g.system = system;
  try {
    g.endpoint = net::Endpoint::parse(meta["endpoint"].get<std::string>());
  } catch (const Error& e) {
    throw Error(meta_file + ": " + e.what());
  }
  if (files::exists(dir + "/ca.crt"))
    g.endpoint.tls = {dir + "/ca.crt", dir + "/client.crt", dir + "/client.key"};
  return g;
}

std::vector<RegisteredGateway> GatewayRegistry::list() const {
  std::vector<std::string> names = names_in(user_dir_);
  for (const auto& name : names_in(system_dir_))
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  std::sort(names.begin(), names.end());
  std::vector<RegisteredGateway> all;
  for (const auto& name : names)
    if (auto g = find(name)) all.push_back(*g);
  return all;
}

std::optional<RegisteredGateway> GatewayRegistry::find(const std::string& name) const {
  if (auto g = read_entry(user_dir_, name, false)) return g;
  return read_entry(system_dir_, name, true);
}

std::optional<RegisteredGateway> GatewayRegistry::find_by_url(const std::string& url) const {
  for (const auto& g : list())
    if (g.endpoint.url() == url) return g;
  return std::nullopt;
}

std::string GatewayRegistry::active(bool* system) const {
  auto named = [](const std::string& registry) {
    if (registry.empty()) return std::string();
    std::string name = files::try_read(registry + "/active").value_or("");
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    return name;
  };
  if (std::string name = named(user_dir_); !name.empty() && find(name)) {
    if (system) *system = false;
    return name;
  }
  if (std::string name = named(system_dir_); !name.empty() && find(name)) {
    if (system) *system = true;
    return name;
  }
  return "";
}

RegisteredGateway GatewayRegistry::add(const std::string& name, const net::Endpoint& endpoint,
                                       const net::TlsFiles& tls) {
  check_gateway_name(name);
  if (user_dir_.empty()) throw Error("neither XDG_CONFIG_HOME nor HOME is set");
  const std::string dir = gateways_of(user_dir_) + "/" + name;
  make_private_dirs(dir);
  if (::chmod(dir.c_str(), 0700) != 0) throw_errno("chmod " + dir);
  // The credentials first, the entry last: a half-written entry is none.
  const std::pair<const std::string*, const char*> copies[] = {
      {&tls.ca, "ca.crt"}, {&tls.cert, "client.crt"}, {&tls.key, "client.key"}};
  for (const auto& [source, leaf] : copies) {
    const std::string target = dir + "/" + leaf;
    if (source->empty()) {
      ::unlink(target.c_str());
      continue;
    }
    std::string bytes;
    if (int err = files::read_into(*source, &bytes)) throw_errno("read " + *source, err);
    files::write_atomically(target, bytes, 0600);
  }
  files::write_atomically(dir + "/endpoint.json", json{{"endpoint", endpoint.url()}}.dump(2) + "\n",
                          0600);
  if (active().empty()) select(name);
  return *read_entry(user_dir_, name, false);
}

void GatewayRegistry::select(const std::string& name) {
  check_gateway_name(name);
  if (!find(name))
    throw Error("gateway '" + name + "' is not registered (see 'openshell gateway list')");
  if (user_dir_.empty()) throw Error("neither XDG_CONFIG_HOME nor HOME is set");
  make_private_dirs(user_dir_);
  files::write_atomically(user_dir_ + "/active", name + "\n", 0600);
}

void GatewayRegistry::remove(const std::string& name) {
  check_gateway_name(name);
  auto g = find(name);
  if (!g) throw Error("gateway '" + name + "' is not registered (see 'openshell gateway list')");
  if (g->system)
    throw Error("gateway '" + name + "' is in the system registry (" + system_dir_ +
                "/gateways), which only its package changes; add one of that name to shadow it");
  std::error_code ec;
  fs::remove_all(g->dir, ec);
  if (ec) throw Error("remove " + g->dir + ": " + ec.message());
  const std::string active_file = user_dir_ + "/active";
  std::string marked = files::try_read(active_file).value_or("");
  while (!marked.empty() && marked.back() == '\n') marked.pop_back();
  if (marked == name) ::unlink(active_file.c_str());
}

bool GatewayChoice::remote() const {
  if (endpoint.kind == net::Endpoint::Kind::kUnix) return false;
  if (endpoint.host == "localhost") return false;
  auto cidr_v4 = Cidr::parse("127.0.0.0/8"), cidr_v6 = Cidr::parse("::1/128");
  auto address = Address::parse(endpoint.host);
  return !(address && (cidr_v4->contains(*address) || cidr_v6->contains(*address)));
}

std::string GatewayChoice::describe() const {
  if (name.empty()) return endpoint.url();
  return "gateway '" + name + "' (" + endpoint.url() + ")";
}

GatewayChoice choose_gateway(const GatewaySelection& selection,
                             const std::optional<std::string>& environment,
                             const GatewayRegistry& registry, const Paths& paths) {
  if (!selection.name.empty() && !selection.endpoint.empty())
    throw Error("--gateway and --gateway-endpoint both choose a gateway: give one");
  GatewayChoice choice;
  auto by_name = [&](const std::string& name, GatewayChoice::Source source,
                     const std::string& what) {
    check_gateway_name(name);
    auto g = registry.find(name);
    if (!g)
      throw Error(what + name + ": no such gateway is registered (see 'openshell gateway list')");
    choice.endpoint = g->endpoint;
    choice.name = g->name;
    choice.source = source;
    return choice;
  };
  auto by_url = [&](const std::string& url, GatewayChoice::Source source, const std::string& what) {
    try {
      choice.endpoint = net::Endpoint::parse(url);
    } catch (const Error& e) {
      throw Error(what + e.what());
    }
    choice.source = source;
    // The active gateway's credentials first, when it is the one at the URL.
    std::optional<RegisteredGateway> g;
    if (auto active = registry.find(registry.active());
        active && active->endpoint.url() == choice.endpoint.url())
      g = active;
    else
      g = registry.find_by_url(choice.endpoint.url());
    if (g) {
      choice.endpoint.tls = g->endpoint.tls;
      choice.name = g->name;
    } else if (choice.endpoint.kind == net::Endpoint::Kind::kTls) {
      choice.endpoint.tls = local_client_files(paths);
    }
    return choice;
  };
  if (!selection.endpoint.empty())
    return by_url(selection.endpoint, GatewayChoice::Source::kFlagEndpoint, "--gateway-endpoint: ");
  if (!selection.name.empty())
    return by_name(selection.name, GatewayChoice::Source::kFlagName, "--gateway ");
  if (environment && !environment->empty()) {
    if (is_url(*environment))
      return by_url(*environment, GatewayChoice::Source::kEnvironment, "OPENSHELL_GATEWAY: ");
    return by_name(*environment, GatewayChoice::Source::kEnvironment, "OPENSHELL_GATEWAY=");
  }
  bool system = false;
  if (std::string active = registry.active(&system); !active.empty())
    return by_name(active, system ? GatewayChoice::Source::kSystem : GatewayChoice::Source::kActive,
                   "active gateway ");
  choice.endpoint = net::Endpoint::unix_socket(paths.socket());
  choice.source = GatewayChoice::Source::kLocal;
  return choice;
}

namespace {
GatewaySelection g_selection;
}

void set_gateway_selection(GatewaySelection selection) { g_selection = std::move(selection); }

GatewayChoice chosen_gateway() {
  const char* environment = std::getenv("OPENSHELL_GATEWAY");
  return choose_gateway(g_selection,
                        environment ? std::optional<std::string>(environment) : std::nullopt,
                        GatewayRegistry::from_environment(), Paths::resolve());
}

}  // namespace openshell::cli
