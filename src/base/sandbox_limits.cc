#include "base/sandbox_limits.h"

// clang-format off
#include <utility>

#include <toml++/toml.h>
// clang-format on

#include <algorithm>

#include "base/error.h"
#include "base/files.h"
#include "base/text.h"
#include "base/toml_file.h"

namespace openshell::limits {

namespace {

constexpr uint64_t kMiB = 1u << 20;

uint64_t whole_mib(uint64_t bytes) { return std::max(bytes / kMiB * kMiB, kMinTmpfsSize); }

[[noreturn]] void fail(const std::string& path, const toml::node* node, const std::string& key,
                       const std::string& message) {
  toml_file::fail(path, node, "sandbox_defaults." + key, message);
}

uint64_t size_value(const std::string& path, const toml::node& node, const std::string& key) {
  std::optional<uint64_t> bytes;
  if (auto s = node.value<std::string>())
    bytes = text::parse_size(*s);
  else if (auto n = node.value<int64_t>(); n && *n >= 0)
    bytes = static_cast<uint64_t>(*n);
  if (!bytes) fail(path, &node, key, "not a size (like \"512M\" or \"2G\")");
  if (*bytes < kMinTmpfsSize) fail(path, &node, key, "below the minimum of 1M");
  return *bytes;
}

}  // namespace

double parse_cpus(const std::string& option, const std::string& value) {
  std::optional<double> cpus;
  if (!value.empty() && value.back() == 'm') {
    // Kubernetes' millicores: whole numbers only ("500m", not "0.5m").
    if (auto milli = text::parse_uint(std::string_view(value).substr(0, value.size() - 1)))
      if (*milli > 0) cpus = static_cast<double>(*milli) / 1000;
  } else {
    cpus = text::parse_positive_decimal(value);
  }
  if (!cpus)
    throw Error(option + " " + value +
                ": not a number of CPUs (like 2, 1.5, or 500m for half a CPU)");
  if (*cpus > 4096) throw Error(option + " " + value + ": more than 4096 CPUs");
  return *cpus;
}

uint64_t parse_memory(const std::string& option, const std::string& value) {
  auto bytes = text::parse_size(value);
  if (!bytes)
    throw Error(option + " " + value + ": not a size (like 512Mi, 4Gi, 1G, 100M or 1073741824)");
  if (*bytes < (4u << 20)) throw Error(option + " " + value + ": below the minimum of 4M");
  return *bytes;
}

uint64_t memory_total() {
  auto text = files::try_read("/proc/meminfo");
  if (!text) return 0;
  for (const auto& line : text::split(*text, '\n')) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::string rest(text::trim(std::string_view(line).substr(9)));
    auto kb = text::parse_uint(rest.substr(0, rest.find(' ')));
    return kb ? *kb * 1024 : 0;
  }
  return 0;
}

uint64_t default_tmp_size(std::optional<uint64_t> memory_limit, uint64_t total) {
  if (memory_limit) return whole_mib(*memory_limit);
  // Unknown RAM: 1 GiB, a size any host that runs sandboxes has.
  return whole_mib(total ? total / 10 : 1024 * kMiB);
}

uint64_t default_shm_size(std::optional<uint64_t> memory_limit, uint64_t total) {
  return whole_mib(default_tmp_size(memory_limit, total) / 2);
}

uint64_t tmpfs_inodes(uint64_t size) { return std::max(size / kInodeBytes, kMinInodes); }

Defaults load_defaults(const std::string& path) {
  Defaults d;
  std::string text;
  if (int err = files::read_into(path, &text)) {
    if (err == ENOENT) return d;
    throw_errno("read " + path, err);
  }
  toml::table root = toml_file::parse(text, path);
  const toml::node* section = root.get("sandbox_defaults");
  if (!section) return d;
  const toml::table* table = section->as_table();
  if (!table) fail(path, section, "", "must be a table");
  for (const auto& [key, node] : *table) {
    const std::string name(key.str());
    if (name == "pids") {
      auto n = node.value<int64_t>();
      if (!n || *n < 0 || *n > 4194304)
        fail(path, &node, name, "not a number of processes (0: no limit)");
      d.pids = static_cast<uint64_t>(*n);
    } else if (name == "tmp_size") {
      d.tmp_size = size_value(path, node, name);
    } else if (name == "shm_size") {
      d.shm_size = size_value(path, node, name);
    } else {
      fail(path, &node, name, "unknown key (known: pids, tmp_size, shm_size)");
    }
  }
  return d;
}

}  // namespace openshell::limits
