#include "image/store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include <nlohmann/json.hpp>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "base/logfile.h"
#include "base/random.h"
#include "base/root_files.h"
#include "image/digest.h"
#include "image/unpack.h"

namespace openshell::image {

using nlohmann::json;

namespace {

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) throw_errno("create " + path);
}

std::vector<std::string> string_list(const json& j, const char* key, const std::string& what) {
  std::vector<std::string> out;
  if (!j.contains(key) || j[key].is_null()) return out;
  if (!j[key].is_array()) throw Error(what + ": " + key + " is not a list");
  for (const auto& v : j[key]) {
    if (!v.is_string()) throw Error(what + ": " + key + " holds a non-string");
    out.push_back(v.get<std::string>());
  }
  return out;
}

std::string string_field(const json& j, const char* key, const std::string& what) {
  if (!j.contains(key) || j[key].is_null()) return "";
  if (!j[key].is_string()) throw Error(what + ": " + key + " is not a string");
  return j[key].get<std::string>();
}

json config_to_json(const ImageConfig& c) {
  return json{{"env", c.env},
              {"entrypoint", c.entrypoint},
              {"cmd", c.cmd},
              {"working_dir", c.working_dir},
              {"user", c.user},
              {"os", c.os},
              {"architecture", c.architecture},
              {"variant", c.variant},
              {"created", c.created}};
}

ImageConfig config_from_json(const json& j) {
  ImageConfig c;
  c.env = j.value("env", std::vector<std::string>{});
  c.entrypoint = j.value("entrypoint", std::vector<std::string>{});
  c.cmd = j.value("cmd", std::vector<std::string>{});
  c.working_dir = j.value("working_dir", "");
  c.user = j.value("user", "");
  c.os = j.value("os", "");
  c.architecture = j.value("architecture", "");
  c.variant = j.value("variant", "");
  c.created = j.value("created", "");
  return c;
}

json record_to_json(const ImageRecord& r) {
  return json{{"name", r.name},
              {"manifest_digest", r.manifest_digest},
              {"config_digest", r.config_digest},
              {"diff_ids", r.diff_ids},
              {"layer_sizes", r.layer_sizes},
              {"stored_at", r.stored_at},
              {"source", r.source},
              {"origin", r.origin},
              {"config", config_to_json(r.config)}};
}

ImageRecord record_from_json(const json& j) {
  ImageRecord r;
  r.name = j.at("name").get<std::string>();
  r.manifest_digest = j.at("manifest_digest").get<std::string>();
  r.config_digest = j.at("config_digest").get<std::string>();
  r.diff_ids = j.at("diff_ids").get<std::vector<std::string>>();
  r.layer_sizes = j.value("layer_sizes", std::vector<uint64_t>(r.diff_ids.size(), 0));
  r.stored_at = j.value("stored_at", "");
  r.source = j.value("source", "");
  r.origin = j.value("origin", "");
  if (j.contains("config")) r.config = config_from_json(j["config"]);
  return r;
}

bool is_hex(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

// Disk use of a tree, in bytes of blocks (what removing it frees).
uint64_t tree_bytes(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return 0;
  uint64_t total = static_cast<uint64_t>(st.st_blocks) * 512;
  if (S_ISDIR(st.st_mode))
    for (const auto& name : files::list_directory(path)) total += tree_bytes(path + "/" + name);
  return total;
}

// A tmp/ entry "<pid>.<random>" whose process is gone.
bool stale_temp(const std::string& name) {
  size_t dot = name.find('.');
  if (dot == std::string::npos) return true;
  pid_t pid = static_cast<pid_t>(std::atoi(name.substr(0, dot).c_str()));
  return pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH);
}

}  // namespace

uint64_t ImageRecord::size() const {
  uint64_t total = 0;
  for (uint64_t s : layer_sizes) total += s;
  return total;
}

ImageConfig parse_config(const std::string& text, const std::string& what,
                         std::vector<std::string>* diff_ids) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(what + ": not a JSON object");
  ImageConfig c;
  c.os = string_field(j, "os", what);
  c.architecture = string_field(j, "architecture", what);
  c.variant = string_field(j, "variant", what);
  c.created = string_field(j, "created", what);
  if (j.contains("config") && j["config"].is_object()) {
    const json& cfg = j["config"];
    const std::string w = what + ": config";
    c.env = string_list(cfg, "Env", w);
    c.entrypoint = string_list(cfg, "Entrypoint", w);
    c.cmd = string_list(cfg, "Cmd", w);
    c.working_dir = string_field(cfg, "WorkingDir", w);
    c.user = string_field(cfg, "User", w);
    for (const auto& e : c.env)
      if (e.find('=') == std::string::npos || e[0] == '=')
        throw Error(w + ": Env entry '" + e + "' is not KEY=VALUE");
  }
  if (diff_ids) {
    if (!j.contains("rootfs") || !j["rootfs"].is_object())
      throw Error(what + ": no rootfs section");
    const json& rootfs = j["rootfs"];
    if (rootfs.value("type", "") != "layers") throw Error(what + ": rootfs type is not \"layers\"");
    *diff_ids = string_list(rootfs, "diff_ids", what + ": rootfs");
    for (const auto& d : *diff_ids)
      if (!is_digest(d)) throw Error(what + ": rootfs diff id '" + d + "' is not a sha256 digest");
  }
  return c;
}

std::string Platform::text() const {
  std::string t = os + "/" + architecture;
  if (!variant.empty()) t += "/" + variant;
  return t;
}

Platform host_platform() {
  utsname u;
  ::uname(&u);
  std::string machine = u.machine;
  Platform p;
  if (machine == "x86_64")
    p.architecture = "amd64";
  else if (machine == "aarch64")
    p.architecture = "arm64", p.variant = "v8";
  else if (machine == "i386" || machine == "i686")
    p.architecture = "386";
  else if (machine.compare(0, 3, "arm") == 0)
    p.architecture = "arm", p.variant = "v7";
  else if (machine == "ppc64le")
    p.architecture = "ppc64le";
  else if (machine == "s390x")
    p.architecture = "s390x";
  else if (machine == "riscv64")
    p.architecture = "riscv64";
  else
    p.architecture = machine;
  return p;
}

Platform parse_platform(std::string_view text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t slash = text.find('/', start);
    parts.emplace_back(text.substr(start, slash == std::string_view::npos ? slash : slash - start));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  if (parts.size() < 2 || parts.size() > 3 || parts[0].empty() || parts[1].empty())
    throw Error("--platform " + std::string(text) +
                ": expected OS/ARCH[/VARIANT], e.g. linux/amd64");
  Platform p{parts[0], parts[1], parts.size() == 3 ? parts[2] : ""};
  return p;
}

std::string read_from_layers(const std::vector<std::string>& layer_roots_top_first,
                             const std::string& path) {
  // The topmost layer that has the name decides, and what it has is read
  // inside that layer alone, never on the host. A symlink there is followed
  // as the merged root would follow it, by looking its target up in the
  // layers again (so /etc/passwd may lead to another layer's file).
  std::string current = path;
  for (int hops = 0; hops < 40; ++hops) {
    bool followed = false;
    for (const auto& layer : layer_roots_top_first) {
      std::string target;
      switch (files::layer_entry(layer, current, &target)) {
        case files::LayerEntry::kAbsent:
          continue;
        case files::LayerEntry::kWhiteout:
          return "";
        case files::LayerEntry::kSymlink: {
          const size_t slash = current.rfind('/');
          current = files::join_in_root(slash == std::string::npos ? "" : current.substr(0, slash),
                                        target);
          followed = true;
          break;
        }
        case files::LayerEntry::kPresent:
          return files::read_in_root(layer, current).value_or("");
      }
      break;
    }
    if (!followed) return "";
  }
  throw Error("/" + path + " in the image: too many levels of symbolic links");
}

Reference local_reference(std::string_view text) {
  Reference ref = parse_reference_text(text);
  if (ref.short_name) ref.domain = "localhost";  // the user's own name, as written
  return ref;
}

Store::Store(std::string dir) : dir_(std::move(dir)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  // The state directory itself may be new.
  for (size_t pos = 1; pos <= dir_.size(); ++pos)
    if (pos == dir_.size() || dir_[pos] == '/') make_dir(dir_.substr(0, pos));
  for (const char* sub : {"/blobs", "/blobs/sha256", "/layers", "/holds", "/tmp"})
    make_dir(dir_ + sub);
}

std::string Store::layer_dir(const std::string& diff_id) const {
  return dir_ + "/layers/" + digest_hex(diff_id, "layer");
}

bool Store::has_layer(const std::string& diff_id) const {
  return files::exists(layer_dir(diff_id) + "/info.json");
}

uint64_t Store::layer_size(const std::string& diff_id) const {
  auto text = files::try_read(layer_dir(diff_id) + "/info.json");
  if (!text) return 0;
  json j = json::parse(*text, nullptr, false);
  return j.is_object() ? j.value("size", uint64_t{0}) : 0;
}

std::string Store::blob_path(const std::string& digest) const {
  return dir_ + "/blobs/sha256/" + digest_hex(digest, "blob");
}

bool Store::has_blob(const std::string& digest) const {
  return is_digest(digest) && files::exists(blob_path(digest));
}

namespace {

// `path` (made when missing) held with flock(operation) until the fd closes.
UniqueFd locked(const std::string& path, int operation) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd) throw_errno("open " + path);
  while (::flock(fd.get(), operation) != 0)
    if (errno != EINTR) throw_errno("lock " + path);
  return fd;
}

}  // namespace

UniqueFd Store::lock() const { return locked(dir_ + "/lock", LOCK_EX); }

UniqueFd Store::begin_work() const { return locked(dir_ + "/active", LOCK_SH); }

std::string Store::make_temp_dir() const {
  const std::string tmp = dir_ + "/tmp";
  for (const auto& name : files::list_directory(tmp)) {
    if (!stale_temp(name)) continue;
    try {
      files::remove_tree(tmp + "/" + name);
    } catch (const Error&) {
      // Another process may be removing it too; prune retries.
    }
  }
  std::string path = tmp + "/" + std::to_string(::getpid()) + "." + random_hex(6);
  if (::mkdir(path.c_str(), 0700) != 0) throw_errno("create " + path);
  return path;
}

void Store::commit_layer(const std::string& temp_dir, const std::string& diff_id,
                         uint64_t size) const {
  const std::string target = layer_dir(diff_id);
  files::write_atomically(temp_dir + "/info.json",
                          json{{"diff_id", diff_id}, {"size", size}}.dump() + "\n", 0600);
  UniqueFd held = lock();
  if (has_layer(diff_id)) {
    files::remove_tree(temp_dir);
    return;
  }
  // A directory without info.json is an interrupted commit's: replace it.
  if (files::exists(target)) files::remove_tree(target);
  if (::rename(temp_dir.c_str(), target.c_str()) != 0) throw_errno("store layer " + diff_id);
}

std::string Store::put_blob(std::string_view bytes) const {
  const std::string digest = sha256_digest(bytes);
  const std::string path = blob_path(digest);
  if (!files::exists(path)) files::write_atomically(path, bytes, 0600);
  return digest;
}

void Store::keep_blob(const std::string& path, const std::string& digest) const {
  const std::string target = blob_path(digest);
  if (files::exists(target)) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_errno("remove " + path);
    return;
  }
  if (::chmod(path.c_str(), 0600) != 0) throw_errno("chmod " + path);
  if (::rename(path.c_str(), target.c_str()) != 0) throw_errno("store blob " + digest);
}

std::vector<ImageRecord> Store::read_records() const {
  std::vector<ImageRecord> records;
  const std::string path = dir_ + "/images.json";
  auto text = files::try_read(path);
  if (!text) {
    if (files::exists(path)) throw Error("read " + path + ": cannot be read");
    return records;
  }
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("images") || !j["images"].is_array())
    throw Error(path + ": not an image index (remove it and pull again)");
  try {
    for (const auto& item : j["images"]) records.push_back(record_from_json(item));
  } catch (const json::exception& e) {
    throw Error(path + ": malformed entry: " + e.what());
  }
  return records;
}

void Store::write_records(const std::vector<ImageRecord>& records) const {
  json list = json::array();
  for (const auto& r : records) list.push_back(record_to_json(r));
  files::write_atomically(dir_ + "/images.json", json{{"images", list}}.dump(1) + "\n", 0600);
}

std::vector<ImageRecord> Store::list() const { return read_records(); }

std::optional<ImageRecord> Store::find(std::string_view text) const {
  std::vector<ImageRecord> records = read_records();
  // An id or digest: "sha256:<hex>", or a prefix of the id's hex.
  std::string_view hex = text;
  if (hex.substr(0, 7) == "sha256:") hex = hex.substr(7);
  if (is_hex(hex) && (hex.size() >= 4 || text.substr(0, 7) == "sha256:")) {
    std::optional<ImageRecord> found;
    for (const auto& r : records) {
      if (r.config_digest.compare(7, hex.size(), hex) == 0 ||
          (hex.size() == 64 && r.manifest_digest.substr(7) == hex)) {
        if (found && found->config_digest != r.config_digest)
          throw Error("image id " + std::string(text) + " is ambiguous: give more digits");
        if (!found) found = r;
      }
    }
    if (found || hex.size() == 64 || text.substr(0, 7) == "sha256:") return found;
  }
  Reference ref = parse_reference_text(text);
  std::vector<std::string> candidates;
  if (ref.short_name) {
    candidates.push_back(local_reference(text).canonical());
    // Without a default registry a short name can mean only a local image.
    const RegistryConfig config = registry_config();
    if (config.default_registry.empty())
      ref = local_reference(text);
    else
      ref = parse_reference(text, config);
  }
  candidates.push_back(ref.canonical());
  for (const auto& want : candidates)
    for (const auto& r : records)
      if (r.name == want) return r;
  // name@digest where the store knows the digest under another tag.
  if (!ref.digest.empty())
    for (const auto& r : records)
      if (r.manifest_digest == ref.digest && parse_reference(r.name).name() == ref.name()) return r;
  return std::nullopt;
}

void Store::put(const ImageRecord& record) const {
  for (const auto& d : record.diff_ids)
    if (!has_layer(d))
      throw Error("image " + record.name + ": layer " + d + " is not in the store");
  for (const auto& d : {record.manifest_digest, record.config_digest})
    if (!files::exists(blob_path(d)))
      throw Error("image " + record.name + ": blob " + d + " is not in the store");
  UniqueFd held = lock();
  std::vector<ImageRecord> records = read_records();
  records.erase(std::remove_if(records.begin(), records.end(),
                               [&](const ImageRecord& r) { return r.name == record.name; }),
                records.end());
  records.push_back(record);
  std::sort(records.begin(), records.end(),
            [](const ImageRecord& a, const ImageRecord& b) { return a.name < b.name; });
  write_records(records);
}

std::vector<ImageRecord> Store::remove(std::string_view text) const {
  UniqueFd held = lock();
  std::optional<ImageRecord> target = find(text);
  if (!target) throw Error("image " + std::string(text) + ": not in the store");
  std::vector<ImageRecord> records = read_records();
  std::vector<ImageRecord> removed;
  // By id: every name of the image; by name: that name.
  std::string_view hex = text.substr(0, 7) == "sha256:" ? text.substr(7) : text;
  const bool by_id = is_hex(hex) && target->config_digest.compare(7, hex.size(), hex) == 0;
  auto gone = [&](const ImageRecord& r) {
    return by_id ? r.config_digest == target->config_digest : r.name == target->name;
  };
  for (const auto& r : records)
    if (gone(r)) removed.push_back(r);
  records.erase(std::remove_if(records.begin(), records.end(), gone), records.end());
  write_records(records);
  return removed;
}

Store::PruneResult Store::prune() const {
  // No pull or import is half-way: their layers may not be named yet.
  UniqueFd active = locked(dir_ + "/active", LOCK_EX);
  UniqueFd held = lock();

  std::set<std::string> used_layers, used_blobs;
  for (const auto& r : read_records()) {
    for (const auto& d : r.diff_ids) used_layers.insert(d.substr(7));
    used_blobs.insert(r.manifest_digest.substr(7));
    used_blobs.insert(r.config_digest.substr(7));
    // The layer blobs its manifest names (kept for push).
    auto manifest = files::try_read(blob_path(r.manifest_digest));
    json m = manifest ? json::parse(*manifest, nullptr, false) : json();
    if (m.is_object() && m.contains("layers") && m["layers"].is_array())
      for (const auto& l : m["layers"])
        if (l.is_object() && l.contains("digest") && l["digest"].is_string() &&
            is_digest(l["digest"].get<std::string>()))
          used_blobs.insert(l["digest"].get<std::string>().substr(7));
  }
  for (const auto& id : files::list_directory(dir_ + "/holds")) {
    auto text = files::try_read(dir_ + "/holds/" + id);
    if (!text) continue;
    size_t start = 0;
    while (start < text->size()) {
      size_t end = text->find('\n', start);
      if (end == std::string::npos) end = text->size();
      std::string line = text->substr(start, end - start);
      if (is_digest(line)) used_layers.insert(line.substr(7));
      start = end + 1;
    }
  }
  PruneResult result;
  for (const auto& name : files::list_directory(dir_ + "/layers")) {
    if (used_layers.count(name)) continue;
    const std::string path = dir_ + "/layers/" + name;
    result.bytes += tree_bytes(path);
    files::remove_tree(path);
    ++result.layers;
  }
  for (const auto& name : files::list_directory(dir_ + "/blobs/sha256")) {
    if (used_blobs.count(name)) continue;
    const std::string path = dir_ + "/blobs/sha256/" + name;
    result.bytes += tree_bytes(path);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_errno("remove " + path);
    ++result.blobs;
  }
  // Micro-VM disks (supervisor/vm_disks.h: vm-disks/sha256-HEX.ext4, one an
  // image id) of images the store no longer names. A VM that runs from one
  // keeps it open; its next start makes it again from the layers it holds.
  std::set<std::string> used_disks;
  for (const auto& r : read_records()) used_disks.insert("sha256-" + r.id().substr(7) + ".ext4");
  for (const auto& name : files::list_directory(dir_ + "/vm-disks")) {
    if (used_disks.count(name) || name.size() < 5 || name.compare(name.size() - 5, 5, ".ext4") != 0)
      continue;
    const std::string path = dir_ + "/vm-disks/" + name;
    result.bytes += tree_bytes(path);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_errno("remove " + path);
    ++result.vm_disks;
  }
  for (const auto& name : files::list_directory(dir_ + "/tmp")) {
    const std::string path = dir_ + "/tmp/" + name;
    result.bytes += tree_bytes(path);
    files::remove_tree(path);
  }
  return result;
}

void Store::hold(const std::string& sandbox_id, const std::vector<std::string>& diff_ids) const {
  UniqueFd held = lock();
  std::string text;
  for (const auto& d : diff_ids) {
    if (!has_layer(d))
      throw Error("layer " + d +
                  " is no longer in the image store (pruned?): pull the image again");
    text += d + "\n";
  }
  files::write_atomically(dir_ + "/holds/" + sandbox_id, text, 0600);
}

void Store::release(const std::string& sandbox_id) const {
  const std::string path = dir_ + "/holds/" + sandbox_id;
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_errno("remove " + path);
}

}  // namespace openshell::image
