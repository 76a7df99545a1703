#include "runtime/cdi.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include <algorithm>
#include <cerrno>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/text.h"
#include "base/unique_fd.h"

namespace openshell::runtime::cdi {

using nlohmann::json;

namespace {

// A YAML document whose aliases could repeat a subtree many times is bounded.
constexpr size_t kMaxYamlNodes = 200000;
constexpr int kMaxDepth = 32;
constexpr size_t kMaxString = 4096;

struct YamlParser {
  yaml_parser_t parser;
  YamlParser() { yaml_parser_initialize(&parser); }
  ~YamlParser() { yaml_parser_delete(&parser); }
};

struct YamlDocument {
  yaml_document_t doc;
  bool loaded = false;
  ~YamlDocument() {
    if (loaded) yaml_document_delete(&doc);
  }
};

// YAML into the JSON tree a JSON spec parses into: mappings, sequences; a
// plain scalar is null (null, ~, empty), a boolean, an integer, or else a
// string; a quoted one always a string.
class YamlToJson {
 public:
  YamlToJson(yaml_document_t* doc, const std::string& file) : doc_(doc), file_(file) {}

  json convert(yaml_node_t* node, int depth) {
    if (++nodes_ > kMaxYamlNodes) fail(node, "too many nodes (aliases repeat too much)");
    if (depth > kMaxDepth) fail(node, "nested too deeply");
    switch (node->type) {
      case YAML_SCALAR_NODE:
        return scalar(node);
      case YAML_SEQUENCE_NODE: {
        json out = json::array();
        for (yaml_node_item_t* item = node->data.sequence.items.start;
             item < node->data.sequence.items.top; ++item)
          out.push_back(convert(yaml_document_get_node(doc_, *item), depth + 1));
        return out;
      }
      case YAML_MAPPING_NODE: {
        json out = json::object();
        for (yaml_node_pair_t* pair = node->data.mapping.pairs.start;
             pair < node->data.mapping.pairs.top; ++pair) {
          yaml_node_t* key = yaml_document_get_node(doc_, pair->key);
          if (!key || key->type != YAML_SCALAR_NODE) fail(node, "a key must be a string");
          std::string name = text(key);
          if (out.contains(name)) fail(key, name + ": the key is given twice");
          out[name] = convert(yaml_document_get_node(doc_, pair->value), depth + 1);
        }
        return out;
      }
      default:
        fail(node, "an empty node");
    }
  }

 private:
  [[noreturn]] void fail(const yaml_node_t* node, const std::string& why) const {
    throw Error(file_ + ":" + std::to_string(node ? node->start_mark.line + 1 : 0) + ": " + why);
  }
  static std::string text(const yaml_node_t* node) {
    return std::string(reinterpret_cast<const char*>(node->data.scalar.value),
                       node->data.scalar.length);
  }
  json scalar(yaml_node_t* node) const {
    std::string value = text(node);
    if (node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return value;
    if (value.empty() || value == "~" || value == "null" || value == "Null" || value == "NULL")
      return nullptr;
    if (value == "true" || value == "True" || value == "TRUE") return true;
    if (value == "false" || value == "False" || value == "FALSE") return false;
    // Integers: decimal (signed), 0o octal, 0x hex, as YAML 1.2's core schema.
    std::string_view digits = value;
    bool negative = false;
    if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) {
      negative = digits[0] == '-';
      digits.remove_prefix(1);
    }
    int base = 10;
    if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'o' || digits[1] == 'x')) {
      base = digits[1] == 'o' ? 8 : 16;
      digits.remove_prefix(2);
    }
    if (digits.empty() || digits.size() > 20) return value;
    uint64_t n = 0;
    for (char c : digits) {
      int d = text::hex_value(c);
      if (d < 0 || d >= base) return value;
      if (n > (UINT64_MAX - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base)) return value;
      n = n * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    }
    if (negative) {
      if (n > static_cast<uint64_t>(INT64_MAX)) return value;
      return -static_cast<int64_t>(n);
    }
    return n;
  }

  yaml_document_t* doc_;
  const std::string& file_;
  size_t nodes_ = 0;
};

json parse_yaml(std::string_view text, const std::string& file) {
  YamlParser p;
  yaml_parser_set_input_string(&p.parser, reinterpret_cast<const unsigned char*>(text.data()),
                               text.size());
  YamlDocument d;
  if (!yaml_parser_load(&p.parser, &d.doc)) {
    const std::string problem = p.parser.problem ? p.parser.problem : "a YAML syntax error";
    throw Error(file + ":" + std::to_string(p.parser.problem_mark.line + 1) + ": " + problem);
  }
  d.loaded = true;
  yaml_node_t* root = yaml_document_get_root_node(&d.doc);
  if (!root) throw Error(file + ": an empty document");
  json out = YamlToJson(&d.doc, file).convert(root, 0);
  YamlDocument next;
  if (yaml_parser_load(&p.parser, &next.doc)) {
    next.loaded = true;
    if (yaml_document_get_root_node(&next.doc)) throw Error(file + ": more than one YAML document");
  }
  return out;
}

// JSON nested deeper than kMaxDepth is refused before it is parsed.
bool json_too_deep(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// The checks of one JSON tree, each failure naming the file and the field.
class Reader {
 public:
  explicit Reader(const std::string& file) : file_(file) {}

  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw Error(file_ + ": " + field + ": " + why);
  }

  static std::string at(const std::string& field, const char* key) {
    return field.empty() ? std::string(key) : field + "." + key;
  }

  const json* member(const json& object, const char* key) const {
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::string string(const json& value, const std::string& field, bool required = true) const {
    if (value.is_null() && !required) return "";
    if (!value.is_string()) fail(field, "must be a string");
    std::string s = value.get<std::string>();
    if (s.size() > kMaxString) fail(field, "longer than " + std::to_string(kMaxString) + " bytes");
    if (s.find('\0') != std::string::npos) fail(field, "holds a NUL byte");
    if (required && s.empty()) fail(field, "must not be empty");
    return s;
  }

  std::string member_string(const json& object, const std::string& field, const char* key,
                            bool required) const {
    const json* v = member(object, key);
    if (!v) {
      if (required) fail(at(field, key), "missing");
      return "";
    }
    return string(*v, at(field, key), required);
  }

  std::string path(const json& object, const std::string& field, const char* key,
                   bool required) const {
    std::string p = member_string(object, field, key, required);
    if (p.empty()) return p;
    if (auto why = text::check_absolute_path(p); !why.empty()) fail(at(field, key), why);
    if (text::normalize_path(p) == "/") fail(at(field, key), "must not be /");
    for (const auto& part : text::split(p, '/'))
      if (part == "..") fail(at(field, key), "must not hold '..'");
    return text::normalize_path(p);
  }

  const json& list(const json& value, const std::string& field) const {
    if (!value.is_array()) fail(field, "must be a list");
    if (value.size() > kMaxEntries)
      fail(field, "more than " + std::to_string(kMaxEntries) + " entries");
    return value;
  }

  std::vector<std::string> strings(const json& object, const std::string& field,
                                   const char* key) const {
    std::vector<std::string> out;
    const json* v = member(object, key);
    if (!v) return out;
    const std::string where = at(field, key);
    const json& items = list(*v, where);
    for (size_t i = 0; i < items.size(); ++i)
      out.push_back(string(items[i], where + "[" + std::to_string(i) + "]", false));
    return out;
  }

  std::optional<int64_t> integer(const json& object, const std::string& field, const char* key,
                                 int64_t min, int64_t max) const {
    const json* v = member(object, key);
    if (!v) return std::nullopt;
    const std::string where = at(field, key);
    if (!v->is_number_integer()) fail(where, "must be a whole number");
    int64_t n;
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(max)) fail(where, "above " + std::to_string(max));
      n = static_cast<int64_t>(u);
    } else {
      n = v->get<int64_t>();
    }
    if (n < min || n > max)
      fail(where, "must be between " + std::to_string(min) + " and " + std::to_string(max));
    return n;
  }

  void env(const std::string& entry, const std::string& field) const {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) fail(field, "expected KEY=VALUE, got '" + entry + "'");
  }

  Edits edits(const json& value, const std::string& field) const {
    Edits e;
    if (!value.is_object()) fail(field, "must be a mapping");
    e.env = strings(value, field, "env");
    for (size_t i = 0; i < e.env.size(); ++i)
      env(e.env[i], field + ".env[" + std::to_string(i) + "]");
    if (const json* nodes = member(value, "deviceNodes")) {
      const std::string where = field + ".deviceNodes";
      const json& items = list(*nodes, where);
      for (size_t i = 0; i < items.size(); ++i)
        e.device_nodes.push_back(device_node(items[i], where + "[" + std::to_string(i) + "]"));
    }
    if (const json* mounts = member(value, "mounts")) {
      const std::string where = field + ".mounts";
      const json& items = list(*mounts, where);
      for (size_t i = 0; i < items.size(); ++i)
        e.mounts.push_back(mount(items[i], where + "[" + std::to_string(i) + "]"));
    }
    if (const json* hooks = member(value, "hooks")) {
      const std::string where = field + ".hooks";
      const json& items = list(*hooks, where);
      for (size_t i = 0; i < items.size(); ++i)
        e.hooks.push_back(hook(items[i], where + "[" + std::to_string(i) + "]"));
    }
    if (const json* gids = member(value, "additionalGids")) {
      const std::string where = field + ".additionalGids";
      const json& items = list(*gids, where);
      for (size_t i = 0; i < items.size(); ++i) {
        const std::string at = where + "[" + std::to_string(i) + "]";
        if (!items[i].is_number_unsigned() || items[i].get<uint64_t>() >= UINT32_MAX)
          fail(at, "must be a group id (a whole number below 4294967295)");
        e.additional_gids.push_back(items[i].get<uint32_t>());
      }
    }
    return e;
  }

  DeviceNode device_node(const json& value, const std::string& field) const {
    if (!value.is_object()) fail(field, "must be a mapping");
    DeviceNode n;
    n.path = path(value, field, "path", true);
    n.host_path = path(value, field, "hostPath", false);
    const std::string type = member_string(value, field, "type", false);
    if (!type.empty()) {
      if (type != "c" && type != "b" && type != "p" && type != "u")
        fail(field + ".type", "must be c, b, u or p, not '" + type + "'");
      n.type = type == "u" ? 'c' : type[0];
    }
    n.major = integer(value, field, "major", 0, 0xfff);
    n.minor = integer(value, field, "minor", 0, 0xfffff);
    n.permissions = member_string(value, field, "permissions", false);
    for (char c : n.permissions)
      if (c != 'r' && c != 'w' && c != 'm')
        fail(field + ".permissions", "must be made of r, w and m, not '" + n.permissions + "'");
    if (auto mode = integer(value, field, "fileMode", 0, 07777))
      n.file_mode = static_cast<uint32_t>(*mode);
    if (auto uid = integer(value, field, "uid", 0, UINT32_MAX - 1))
      n.uid = static_cast<uint32_t>(*uid);
    if (auto gid = integer(value, field, "gid", 0, UINT32_MAX - 1))
      n.gid = static_cast<uint32_t>(*gid);
    return n;
  }

  Mount mount(const json& value, const std::string& field) const {
    if (!value.is_object()) fail(field, "must be a mapping");
    Mount m;
    m.host_path = path(value, field, "hostPath", true);
    m.container_path = path(value, field, "containerPath", true);
    m.type = member_string(value, field, "type", false);
    m.options = strings(value, field, "options");
    if (!m.type.empty() && m.type != "bind" && m.type != "rbind")
      fail(field + ".type", "'" + m.type + "': only bind mounts are supported");
    return m;
  }

  Hook hook(const json& value, const std::string& field) const {
    if (!value.is_object()) fail(field, "must be a mapping");
    Hook h;
    const std::string name = member_string(value, field, "hookName", true);
    auto stage = hook_stage(name);
    if (!stage)
      fail(field + ".hookName",
           "'" + name +
               "': expected createRuntime, createContainer, startContainer, poststart or poststop");
    h.stage = *stage;
    h.path = path(value, field, "path", true);
    h.args = strings(value, field, "args");
    h.env = strings(value, field, "env");
    for (size_t i = 0; i < h.env.size(); ++i)
      env(h.env[i], field + ".env[" + std::to_string(i) + "]");
    if (auto timeout = integer(value, field, "timeout", 1, 3600))
      h.timeout_s = static_cast<int>(*timeout);
    return h;
  }

 private:
  const std::string& file_;
};

// "0.3.0" to "0.8.0" (and their patch releases).
bool supported_version(const std::string& version) {
  auto parts = text::split(version, '.');
  if (parts.size() != 3 || parts[0] != "0") return false;
  auto minor = text::parse_uint(parts[1], 1000);
  auto patch = text::parse_uint(parts[2], 1000);
  return minor && patch && *minor >= 3 && *minor <= 8;
}

// VENDOR/CLASS: the vendor a domain-like name, the class a name.
bool valid_kind(const std::string& kind) {
  const size_t slash = kind.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == kind.size() || kind.size() > 255)
    return false;
  for (size_t i = 0; i < kind.size(); ++i) {
    const char c = kind[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (i == slash) continue;
    if (!alnum && c != '-' && c != '_' && c != '.') return false;
  }
  return kind.find('/', slash + 1) == std::string::npos;
}

// A device's name: letters, digits, '_', '-', '.', ':' starting with a
// letter or digit.
bool valid_device_name(const std::string& name) {
  if (name.empty() || name.size() > 255) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '-' && c != '_' && c != '.' && c != ':'))) return false;
  }
  return true;
}

bool has_suffix(const std::string& s, std::string_view suffix) {
  return s.size() > suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

const Device* Spec::find(std::string_view name) const {
  for (const Device& d : devices)
    if (d.name == name) return &d;
  return nullptr;
}

Spec parse(std::string_view text, const std::string& file, bool yaml) {
  if (text.size() > kMaxFileBytes)
    throw Error(file + ": larger than " + std::to_string(kMaxFileBytes >> 20) + " MiB");
  json root;
  if (yaml) {
    root = parse_yaml(text, file);
  } else {
    if (json_too_deep(text)) throw Error(file + ": nested too deeply");
    try {
      root = json::parse(text);
    } catch (const json::exception& e) {
      throw Error(file + ": not JSON: " + e.what());
    }
  }
  Reader r(file);
  if (!root.is_object()) throw Error(file + ": not a CDI spec (expected a mapping at the top)");
  Spec spec;
  spec.file = file;
  spec.version = r.member_string(root, "", "cdiVersion", true);
  if (!supported_version(spec.version))
    r.fail("cdiVersion", "'" + spec.version + "' is not supported (0.3.0 to 0.8.0 are)");
  spec.kind = r.member_string(root, "", "kind", true);
  if (!valid_kind(spec.kind))
    r.fail("kind",
           "'" + spec.kind + "': expected VENDOR/CLASS, a vendor's domain and a device class");
  const json* devices = r.member(root, "devices");
  if (!devices) r.fail("devices", "missing");
  if (!devices->is_array()) r.fail("devices", "must be a list");
  if (devices->size() > kMaxDevices)
    r.fail("devices", "more than " + std::to_string(kMaxDevices) + " devices");
  for (size_t i = 0; i < devices->size(); ++i) {
    const std::string field = "devices[" + std::to_string(i) + "]";
    const json& d = (*devices)[i];
    if (!d.is_object()) r.fail(field, "must be a mapping");
    Device device;
    device.name = r.member_string(d, field, "name", true);
    if (!valid_device_name(device.name))
      r.fail(field + ".name", "'" + device.name + "': letters, digits, '_', '-', '.' and ':'");
    if (spec.find(device.name)) r.fail(field + ".name", "'" + device.name + "' is given twice");
    const json* edits = r.member(d, "containerEdits");
    if (!edits) r.fail(field + ".containerEdits", "missing");
    device.edits = r.edits(*edits, field + ".containerEdits");
    spec.devices.push_back(std::move(device));
  }
  if (const json* edits = r.member(root, "containerEdits"))
    spec.edits = r.edits(*edits, "containerEdits");
  return spec;
}

std::vector<std::string> spec_files(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    if (errno == ENOENT || errno == ENOTDIR) return out;
    throw_errno("read the CDI directory " + dir);
  }
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name[0] == '.') continue;
    if (has_suffix(name, ".json") || has_suffix(name, ".yaml") || has_suffix(name, ".yml"))
      out.push_back(dir + "/" + name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

Spec load_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) throw_errno("open the CDI spec " + path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) throw_errno("stat the CDI spec " + path);
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  // Its hooks run as the caller: only root's or the caller's own spec, and
  // one nobody else may change.
  if (st.st_uid != 0 && st.st_uid != ::geteuid())
    throw Error(path + ": owned by uid " + std::to_string(st.st_uid) +
                ", neither root nor you (a CDI spec names programs to run)");
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    throw Error(path + ": writable by its group or others (a CDI spec names programs to run)");
  if (static_cast<uint64_t>(st.st_size) > kMaxFileBytes)
    throw Error(path + ": larger than " + std::to_string(kMaxFileBytes >> 20) + " MiB");
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("read the CDI spec " + path);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return parse(text, path, !has_suffix(path, ".json"));
}

std::vector<Spec> load_kind(const std::vector<std::string>& dirs, const std::string& kind,
                            std::vector<std::string>* skipped) {
  std::vector<Spec> out;
  for (auto dir = dirs.rbegin(); dir != dirs.rend(); ++dir) {
    std::vector<std::string> files;
    try {
      files = spec_files(*dir);
    } catch (const Error& e) {
      skipped->push_back(e.what());
      continue;
    }
    for (const auto& file : files) {
      try {
        Spec spec = load_file(file);
        if (spec.kind == kind) out.push_back(std::move(spec));
      } catch (const Error& e) {
        skipped->push_back(e.what());
      }
    }
  }
  return out;
}

}  // namespace openshell::runtime::cdi
