#include "image/pull.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <thread>

#include <archive.h>
#include <archive_entry.h>
#include <nlohmann/json.hpp>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "base/text.h"
#include "base/time.h"
#include "image/budget.h"
#include "image/digest.h"
#include "image/manifest.h"
#include "image/registry.h"
#include "image/unpack.h"

namespace openshell::image {

using nlohmann::json;

namespace {

constexpr size_t kMaxJson = 4 << 20;  // manifests, configs, indexes

std::string short_digest(const std::string& digest) { return digest.substr(0, 19); }

// A directory under the store's tmp/, removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const Store& store) : path_(store.make_temp_dir()) {}
  ~TempDir() {
    try {
      files::remove_tree(path_);
    } catch (const Error&) {
      // Left for the next pull or prune.
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Serialises a Progress that several layer workers report to.
class SharedProgress {
 public:
  explicit SharedProgress(Progress* p) : p_(p) {}
  void start(const std::string& image, size_t layers, size_t missing, uint64_t bytes) {
    std::lock_guard<std::mutex> g(m_);
    if (p_) p_->start(image, layers, missing, bytes);
  }
  // A worker's layer has now read `done` bytes.
  void layer_bytes(size_t index, uint64_t done) {
    std::lock_guard<std::mutex> g(m_);
    uint64_t& seen = per_layer_[index];
    total_ += done - seen;
    seen = done;
    if (p_) p_->advance(total_);
  }
  void layer_done(const std::string& diff_id, uint64_t size) {
    std::lock_guard<std::mutex> g(m_);
    if (p_) p_->layer_done(diff_id, size);
  }
  void finish() {
    std::lock_guard<std::mutex> g(m_);
    if (p_) p_->finish();
  }

 private:
  Progress* p_;
  std::mutex m_;
  std::map<size_t, uint64_t> per_layer_;
  uint64_t total_ = 0;
};

struct StoredLayer {
  uint64_t size;            // unpacked bytes
  std::string blob_digest;  // of the bytes read
};

// Unpacks the layer in fd into the store, checking both of its digests.
// blob_digest may be "" (unknown: a docker save archive's layer file).
StoredLayer store_layer(const Store& store, int fd, const std::string& blob_digest,
                        const std::string& diff_id, const std::string& work_dir,
                        const std::function<void(uint64_t)>& progress, UnpackBudget& budget) {
  const std::string what = "layer " + short_digest(blob_digest.empty() ? diff_id : blob_digest);
  if (::mkdir(work_dir.c_str(), 0700) != 0) throw_errno("create " + work_dir);
  const std::string root = work_dir + "/root";
  if (::mkdir(root.c_str(), 0755) != 0) throw_errno("create " + root);
  UnpackOptions options;
  options.progress = progress;
  options.account = [&budget](uint64_t bytes) { budget.add_entry(bytes); };
  UnpackResult result = unpack_layer(fd, root, options, what);
  if (!blob_digest.empty() && result.compressed_digest != blob_digest)
    throw Error(what + ": content does not match its digest (got " + result.compressed_digest +
                ")");
  if (result.diff_id != diff_id)
    throw Error(what + ": its uncompressed content is " + result.diff_id +
                ", but the image config says " + diff_id);
  store.commit_layer(work_dir, diff_id, result.content_bytes);
  return {result.content_bytes, result.compressed_digest};
}

std::string now_text() { return time::format_ns(time::now_ns()); }

// Names the image once its manifest, config and layers are all stored.
ImageRecord finish(const Store& store, const std::string& name, const std::string& manifest,
                   const std::string& config_json, const std::vector<std::string>& diff_ids,
                   const ImageConfig& config, const std::string& source,
                   const std::string& origin = "") {
  ImageRecord record;
  record.origin = origin;
  record.name = name;
  record.manifest_digest = store.put_blob(manifest);
  record.config_digest = store.put_blob(config_json);
  record.diff_ids = diff_ids;
  for (const auto& d : diff_ids) record.layer_sizes.push_back(store.layer_size(d));
  record.stored_at = now_text();
  record.source = source;
  record.config = config;
  store.put(record);
  return record;
}

void check_layer_count(const Manifest& m, const std::vector<std::string>& diff_ids,
                       const std::string& what) {
  if (m.layers.size() != diff_ids.size())
    throw Error(what + ": the manifest lists " + std::to_string(m.layers.size()) +
                " layers, its config " + std::to_string(diff_ids.size()));
}

// ---- pull ---------------------------------------------------------------------

}  // namespace

ImageRecord pull(const Store& store, const Reference& ref, const PullOptions& options) {
  const std::string what = ref.familiar();
  RegistryOptions registry_options;
  registry_options.insecure = options.insecure;
  registry_options.attempts = options.attempts;
  RegistryClient client(ref, registry_options);
  UniqueFd working = store.begin_work();

  // The manifest, through an index when the tag names several platforms.
  RegistryClient::Manifest top = client.manifest(ref.manifest_key());
  std::string manifest_json = top.body;
  if (is_index(top.body, top.media_type, what)) {
    Index index = parse_index(top.body, what);
    const Descriptor& chosen =
        select_platform(index, options.platform.value_or(host_platform()), what);
    RegistryClient::Manifest m = client.manifest(chosen.digest);
    if (is_index(m.body, m.media_type, what))
      throw Error(what + ": an index inside an index is not supported");
    manifest_json = m.body;
  }
  Manifest manifest = parse_manifest(manifest_json, what);
  const std::string config_json = client.blob(manifest.config.digest, kMaxJson);
  std::vector<std::string> diff_ids;
  ImageConfig config = parse_config(config_json, what + ": config", &diff_ids);
  check_layer_count(manifest, diff_ids, what);
  if (!config.os.empty() && config.os != "linux")
    throw Error(what + ": the image is for " + config.os + ", not linux");

  // The layers the store lacks, a few at a time.
  std::vector<size_t> missing;
  uint64_t missing_bytes = 0;
  for (size_t i = 0; i < diff_ids.size(); ++i) {
    // A layer the store has unpacked still needs its blob (push sends it).
    if (store.has_layer(diff_ids[i]) && store.has_blob(manifest.layers[i].digest)) continue;
    bool duplicate = false;  // the same layer twice in one image
    for (size_t j : missing) duplicate = duplicate || diff_ids[j] == diff_ids[i];
    if (duplicate) continue;
    missing.push_back(i);
    missing_bytes += static_cast<uint64_t>(manifest.layers[i].size);
  }
  UnpackBudget budget(what, store.dir(), options.max_unpacked);
  budget.check_free_space(missing_bytes);
  SharedProgress progress(options.progress);
  progress.start(what, diff_ids.size(), missing.size(), missing_bytes);
  TempDir temp(store);
  std::atomic<size_t> next{0};
  std::mutex error_mutex;
  std::string first_error;
  std::atomic<bool> failed{false};
  auto worker = [&] {
    // A client per worker: a client keeps one connection and is not shared.
    std::unique_ptr<RegistryClient> layer_client;
    for (;;) {
      size_t k = next.fetch_add(1);
      if (k >= missing.size() || failed) return;
      const size_t i = missing[k];
      const Descriptor& layer = manifest.layers[i];
      try {
        const std::string blob = temp.path() + "/blob-" + std::to_string(i);
        if (!layer_client) layer_client = std::make_unique<RegistryClient>(ref, registry_options);
        layer_client->blob_to_file(layer.digest, layer.size, blob,
                                   [&, i](uint64_t done) { progress.layer_bytes(i, done); });
        uint64_t size = store.layer_size(diff_ids[i]);
        if (!store.has_layer(diff_ids[i])) {
          UniqueFd fd(::open(blob.c_str(), O_RDONLY | O_CLOEXEC));
          if (!fd) throw_errno("open " + blob);
          size = store_layer(store, fd.get(), layer.digest, diff_ids[i],
                             temp.path() + "/layer-" + std::to_string(i), nullptr, budget)
                     .size;
        }
        // blob_to_file checked its digest.
        store.keep_blob(blob, layer.digest);
        progress.layer_done(diff_ids[i], size);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(error_mutex);
        if (first_error.empty()) first_error = e.what();
        failed = true;
        return;
      }
    }
  };
  const size_t n_workers = std::min<size_t>(missing.size(), std::max(1, options.jobs));
  std::vector<std::thread> workers;
  for (size_t w = 1; w < n_workers; ++w) workers.emplace_back(worker);
  if (n_workers > 0) worker();
  for (auto& t : workers) t.join();
  if (failed) throw Error(first_error);
  ImageRecord record = finish(store, ref.canonical(), manifest_json, config_json, diff_ids, config,
                              "pull " + ref.familiar(), ref.name());
  progress.finish();
  return record;
}

// ---- import -------------------------------------------------------------------

namespace {

// The name an archive carries: a short one ("app:1", as docker save writes
// it) means the default registry's when one is configured, else it is
// kept as a local name, localhost/app:1, rather than refused.
Reference archive_reference(std::string_view name) {
  if (parse_reference_text(name).short_name && registry_config().default_registry.empty())
    return local_reference(name);
  return parse_reference(name);
}

// The files of an image archive or directory, by their path inside it.
class Source {
 public:
  virtual ~Source() = default;
  // The host path of a file inside, or "" when it has none.
  virtual std::string path(const std::string& inside) const = 0;
  std::string read(const std::string& inside, const std::string& what) const {
    const std::string p = path(inside);
    if (p.empty()) throw Error(what + ": " + inside + " is missing");
    struct stat st;
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      throw Error(what + ": " + inside + " is not a file");
    if (static_cast<uint64_t>(st.st_size) > kMaxJson)
      throw Error(what + ": " + inside + " is larger than 4 MiB");
    return files::read(p);
  }
  bool has(const std::string& inside) const { return !path(inside).empty(); }
};

class DirectorySource : public Source {
 public:
  explicit DirectorySource(std::string dir) : dir_(std::move(dir)) {}
  std::string path(const std::string& inside) const override {
    if (inside.empty() || inside[0] == '/' || inside.find("..") != std::string::npos) return "";
    std::string p = dir_ + "/" + inside;
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? p : "";
  }

 private:
  std::string dir_;
};

// A tar archive's regular files, extracted into a staging directory; its
// symbolic and hard links are kept as a table (docker save links repeated
// layers) and resolved inside the archive only.
class ArchiveSource : public Source {
 public:
  ArchiveSource(const std::string& file, const std::string& staging, const std::string& what,
                UnpackBudget& budget)
      : staging_(staging) {
    struct archive* a = archive_read_new();
    archive_read_support_format_tar(a);
    archive_read_support_filter_gzip(a);
    archive_read_support_filter_zstd(a);
    archive_read_support_filter_xz(a);
    archive_read_support_filter_none(a);
    struct Closer {
      struct archive* a;
      ~Closer() { archive_read_free(a); }
    } closer{a};
    if (archive_read_open_filename(a, file.c_str(), 1 << 20) != ARCHIVE_OK)
      throw Error(what + ": " + archive_error_string(a));
    archive_entry* entry;
    std::vector<char> buffer(1 << 20);
    for (int count = 0;; ++count) {
      int rc = archive_read_next_header(a, &entry);
      if (rc == ARCHIVE_EOF) break;
      if (rc != ARCHIVE_OK && rc != ARCHIVE_WARN)
        throw Error(what + ": not an image archive (" + std::string(archive_error_string(a)) + ")");
      if (count > 100000) throw Error(what + ": more than 100000 entries");
      std::string name = clean(archive_entry_pathname(entry) ? archive_entry_pathname(entry) : "");
      if (name.empty()) continue;
      if (!safe(name)) throw Error(what + ": entry '" + name + "' leaves the archive");
      const mode_t type = archive_entry_filetype(entry);
      if (archive_entry_hardlink(entry)) {
        links_[name] = "/" + clean(archive_entry_hardlink(entry));  // from the archive's top
        continue;
      }
      if (type == AE_IFLNK) {
        links_[name] = archive_entry_symlink(entry) ? archive_entry_symlink(entry) : "";
        continue;
      }
      if (type == AE_IFDIR) {
        make_parents(name + "/x");
        continue;
      }
      if (type != AE_IFREG) continue;
      const int64_t declared = archive_entry_size(entry);
      budget.add_entry(kEntryCost + (declared > 0 ? static_cast<uint64_t>(declared) : 0));
      make_parents(name);
      const std::string out = staging_ + "/" + name;
      UniqueFd fd(::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
      if (!fd) throw_errno("write " + out);
      for (;;) {
        la_ssize_t n = archive_read_data(a, buffer.data(), buffer.size());
        if (n < 0) throw Error(what + ": " + archive_error_string(a));
        if (n == 0) break;
        for (la_ssize_t off = 0; off < n;) {
          ssize_t w = ::write(fd.get(), buffer.data() + off, static_cast<size_t>(n - off));
          if (w < 0) {
            if (errno == EINTR) continue;
            throw_errno("write " + out);
          }
          off += w;
        }
      }
    }
  }

  std::string path(const std::string& inside) const override {
    std::string p = clean(inside);
    for (int hops = 0; hops < 16; ++hops) {
      if (!safe(p)) return "";
      const std::string file = staging_ + "/" + p;
      struct stat st;
      if (::lstat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return file;
      // The first component that is a link is replaced by its target.
      const std::vector<std::string> parts = text::split(p, '/');
      std::string next;
      for (size_t k = 1; k <= parts.size() && next.empty(); ++k) {
        auto link = links_.find(join(parts, 0, k));
        if (link == links_.end()) continue;
        std::string resolved = resolve(join(parts, 0, k - 1), link->second);
        if (resolved.empty()) return "";
        std::string rest = join(parts, k, parts.size());
        next = rest.empty() ? resolved : resolved + "/" + rest;
      }
      if (next.empty()) return "";
      p = next;
    }
    return "";
  }

 private:
  static std::string clean(std::string name) {
    while (name.compare(0, 2, "./") == 0) name = name.substr(2);
    while (!name.empty() && name.back() == '/') name.pop_back();
    return name;
  }
  static std::string join(const std::vector<std::string>& parts, size_t from, size_t to) {
    std::string out;
    for (size_t i = from; i < to; ++i) out += (out.empty() ? "" : "/") + parts[i];
    return out;
  }
  static bool safe(const std::string& name) {
    if (name.empty() || name[0] == '/') return false;
    for (const auto& part : text::split(name, '/'))
      if (part.empty() || part == "." || part == "..") return false;
    return true;
  }
  // base + "/" + target, with "." and ".." applied, staying inside.
  static std::string resolve(const std::string& base, const std::string& target) {
    std::vector<std::string> parts;
    if (!(target.size() && target[0] == '/'))
      for (const auto& p : text::split(base, '/'))
        if (!p.empty()) parts.push_back(p);
    for (const auto& p : text::split(target, '/')) {
      if (p.empty() || p == ".") continue;
      if (p == "..") {
        if (parts.empty()) return "";
        parts.pop_back();
      } else {
        parts.push_back(p);
      }
    }
    return text::join(parts, "/");
  }
  void make_parents(const std::string& name) {
    for (size_t slash = name.find('/'); slash != std::string::npos;
         slash = name.find('/', slash + 1)) {
      const std::string dir = staging_ + "/" + name.substr(0, slash);
      if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) throw_errno("create " + dir);
    }
  }

  std::string staging_;
  std::map<std::string, std::string> links_;
};

std::string blob_inside(const std::string& digest) { return "blobs/sha256/" + digest.substr(7); }

// The layer's compression, from its first bytes, as an OCI media type.
std::string layer_media_type(const std::string& file) {
  unsigned char magic[4] = {0, 0, 0, 0};
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd) (void)!::read(fd.get(), magic, sizeof magic);
  if (magic[0] == 0x1f && magic[1] == 0x8b) return std::string(media_type::kOciLayerGzip);
  if (magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd)
    return std::string(media_type::kOciLayerZstd);
  return std::string(media_type::kOciLayer);
}

// Stores the layers the store lacks, from files of the source; fills in the
// digests of the blobs it read.
void import_layers(const Store& store, const Source& source,
                   const std::vector<std::string>& files_in, std::vector<std::string>* blob_digests,
                   const std::vector<std::string>& diff_ids, const std::string& work,
                   SharedProgress& progress, const std::string& what, UnpackBudget& budget) {
  for (size_t i = 0; i < diff_ids.size(); ++i) {
    if (store.has_layer(diff_ids[i])) continue;
    const std::string file = source.path(files_in[i]);
    if (file.empty()) throw Error(what + ": layer " + files_in[i] + " is missing");
    UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) throw_errno("open " + file);
    StoredLayer stored = store_layer(
        store, fd.get(), (*blob_digests)[i], diff_ids[i], work + "/layer-" + std::to_string(i),
        [&, i](uint64_t done) { progress.layer_bytes(i, done); }, budget);
    (*blob_digests)[i] = stored.blob_digest;
    progress.layer_done(diff_ids[i], stored.size);
  }
}

// Copies each layer file of the source the store lacks as a blob into the
// store (push sends them), checking its digest on the way.
void keep_layer_blobs(const Store& store, const Source& source,
                      const std::vector<std::string>& files_in,
                      const std::vector<std::string>& digests, const std::string& work,
                      const std::string& what) {
  for (size_t i = 0; i < files_in.size(); ++i) {
    if (store.has_blob(digests[i])) continue;
    const std::string file = source.path(files_in[i]);
    if (file.empty()) throw Error(what + ": layer " + files_in[i] + " is missing");
    UniqueFd in(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!in) throw_errno("open " + file);
    const std::string copy = work + "/blob-" + std::to_string(i);
    UniqueFd out(::open(copy.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!out) throw_errno("create " + copy);
    Sha256 h;
    std::vector<char> buf(1 << 20);
    for (;;) {
      ssize_t n = ::read(in.get(), buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_errno("read " + file);
      if (n == 0) break;
      h.update(buf.data(), static_cast<size_t>(n));
      if (!files::write_all(out.get(), std::string_view(buf.data(), static_cast<size_t>(n))))
        throw_errno("write " + copy);
    }
    if (h.digest() != digests[i])
      throw Error(what + ": layer " + files_in[i] + " does not match its digest " + digests[i]);
    out.reset();
    store.keep_blob(copy, digests[i]);
  }
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  return path.empty() || ::stat(path.c_str(), &st) != 0 ? 0 : static_cast<uint64_t>(st.st_size);
}

ImageRecord import_oci(const Store& store, const Source& source, const ImportOptions& options,
                       const std::string& what, const std::string& work, SharedProgress& progress,
                       UnpackBudget& budget) {
  auto read_verified = [&](const std::string& digest) {
    std::string bytes = source.read(blob_inside(digest), what);
    if (sha256_digest(bytes) != digest)
      throw Error(what + ": blob " + digest + " does not match its digest");
    return bytes;
  };
  Index index = parse_index(source.read("index.json", what), what + ": index.json");
  if (index.manifests.empty()) throw Error(what + ": index.json lists no image");
  const Platform want = options.platform.value_or(host_platform());
  const Descriptor* chosen = nullptr;
  if (index.manifests.size() == 1) {
    chosen = &index.manifests[0];
  } else {
    bool platforms = false;
    for (const auto& d : index.manifests) platforms = platforms || !d.platform.os.empty();
    if (!platforms) {
      std::string names;
      for (const auto& d : index.manifests) {
        auto n = d.annotations.find("org.opencontainers.image.ref.name");
        names += (names.empty() ? "" : ", ") +
                 (n == d.annotations.end() ? short_digest(d.digest) : n->second);
      }
      throw Error(what + ": holds " + std::to_string(index.manifests.size()) + " images (" + names +
                  "); import an archive of one");
    }
    chosen = &select_platform(index, want, what);
  }
  Descriptor top = *chosen;
  std::string manifest_json = read_verified(top.digest);
  if (is_index(manifest_json, top.media_type, what)) {
    Index inner = parse_index(manifest_json, what);
    top.digest = select_platform(inner, want, what).digest;
    manifest_json = read_verified(top.digest);
  }
  Manifest manifest = parse_manifest(manifest_json, what);
  const std::string config_json = read_verified(manifest.config.digest);
  std::vector<std::string> diff_ids;
  ImageConfig config = parse_config(config_json, what + ": config", &diff_ids);
  check_layer_count(manifest, diff_ids, what);

  // The name: the caller's, else containerd's or the layout's annotation.
  std::string name = options.name;
  if (name.empty()) {
    for (const char* key : {"io.containerd.image.name", "org.opencontainers.image.ref.name"}) {
      auto it = chosen->annotations.find(key);
      if (it == chosen->annotations.end()) continue;
      if (it->second.find_first_of("/:") == std::string::npos) continue;  // a bare tag
      name = it->second;
      break;
    }
  }
  if (name.empty())
    throw Error(
        what +
        ": the archive does not name its image; give a name: openshell image import FILE NAME");
  const Reference ref = options.name.empty() ? archive_reference(name) : local_reference(name);

  std::vector<std::string> files_in, blob_digests;
  uint64_t bytes = 0;
  size_t missing = 0;
  for (size_t i = 0; i < manifest.layers.size(); ++i) {
    files_in.push_back(blob_inside(manifest.layers[i].digest));
    blob_digests.push_back(manifest.layers[i].digest);
    if (!store.has_layer(diff_ids[i]))
      ++missing, bytes += static_cast<uint64_t>(manifest.layers[i].size);
  }
  progress.start(ref.familiar(), diff_ids.size(), missing, bytes);
  import_layers(store, source, files_in, &blob_digests, diff_ids, work, progress, what, budget);
  keep_layer_blobs(store, source, files_in, blob_digests, work, what);
  return finish(store, ref.canonical(), manifest_json, config_json, diff_ids, config,
                "import " + what);
}

ImageRecord import_docker(const Store& store, const Source& source, const ImportOptions& options,
                          const std::string& what, const std::string& work,
                          SharedProgress& progress, UnpackBudget& budget) {
  json list = json::parse(source.read("manifest.json", what), nullptr, false);
  if (list.is_discarded() || !list.is_array() || list.empty())
    throw Error(what + ": manifest.json is not a list of images");
  const json* entry = nullptr;
  if (list.size() == 1) {
    entry = &list[0];
  } else if (!options.name.empty()) {
    const std::string want = archive_reference(options.name).canonical();
    for (const auto& e : list)
      if (e.contains("RepoTags") && e["RepoTags"].is_array())
        for (const auto& t : e["RepoTags"])
          if (t.is_string() && archive_reference(t.get<std::string>()).canonical() == want)
            entry = &e;
  }
  if (!entry)
    throw Error(what + ": holds " + std::to_string(list.size()) +
                " images; name the one to import: openshell image import FILE NAME");
  if (!entry->is_object() || !(*entry).contains("Config") || !(*entry)["Config"].is_string() ||
      !(*entry).contains("Layers") || !(*entry)["Layers"].is_array())
    throw Error(what + ": manifest.json lacks Config or Layers");
  const std::string config_json = source.read((*entry)["Config"].get<std::string>(), what);
  std::vector<std::string> diff_ids;
  ImageConfig config = parse_config(config_json, what + ": config", &diff_ids);
  std::vector<std::string> files_in;
  for (const auto& l : (*entry)["Layers"]) {
    if (!l.is_string()) throw Error(what + ": manifest.json: a layer is not a path");
    files_in.push_back(l.get<std::string>());
  }
  if (files_in.size() != diff_ids.size())
    throw Error(what + ": manifest.json lists " + std::to_string(files_in.size()) +
                " layers, the config " + std::to_string(diff_ids.size()));

  std::string name = options.name;
  if (name.empty() && (*entry).contains("RepoTags") && (*entry)["RepoTags"].is_array() &&
      !(*entry)["RepoTags"].empty() && (*entry)["RepoTags"][0].is_string())
    name = (*entry)["RepoTags"][0].get<std::string>();
  if (name.empty())
    throw Error(
        what +
        ": the archive does not name its image; give a name: openshell image import FILE NAME");
  const Reference ref = options.name.empty() ? archive_reference(name) : local_reference(name);

  // Layer files are blobs as they are; their digests are computed on the way.
  std::vector<std::string> blob_digests(files_in.size());
  uint64_t bytes = 0;
  size_t missing = 0;
  for (size_t i = 0; i < files_in.size(); ++i)
    if (!store.has_layer(diff_ids[i])) ++missing, bytes += file_size(source.path(files_in[i]));
  progress.start(ref.familiar(), diff_ids.size(), missing, bytes);
  import_layers(store, source, files_in, &blob_digests, diff_ids, work, progress, what, budget);

  // A manifest of our own, so the image is stored as any other.
  Descriptor config_desc{std::string(media_type::kOciConfig),
                         sha256_digest(config_json),
                         static_cast<int64_t>(config_json.size()),
                         {},
                         {}};
  std::vector<Descriptor> layers;
  for (size_t i = 0; i < files_in.size(); ++i) {
    const std::string file = source.path(files_in[i]);
    Descriptor d;
    d.media_type = layer_media_type(file);
    d.size = static_cast<int64_t>(file_size(file));
    d.digest = blob_digests[i];
    if (d.digest.empty()) {
      // The store had this layer: an uncompressed one's blob is its diff id,
      // others are hashed now.
      if (d.media_type == media_type::kOciLayer) {
        d.digest = diff_ids[i];
      } else {
        UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd) throw_errno("open " + file);
        Sha256 h;
        std::vector<char> buf(1 << 20);
        for (;;) {
          ssize_t n = ::read(fd.get(), buf.data(), buf.size());
          if (n < 0) throw_errno("read " + file);
          if (n == 0) break;
          h.update(buf.data(), static_cast<size_t>(n));
        }
        d.digest = h.digest();
      }
    }
    layers.push_back(d);
  }
  std::vector<std::string> layer_digests;
  for (const auto& d : layers) layer_digests.push_back(d.digest);
  keep_layer_blobs(store, source, files_in, layer_digests, work, what);
  return finish(store, ref.canonical(), make_manifest(config_desc, layers), config_json, diff_ids,
                config, "import " + what);
}

}  // namespace

ImageRecord import_image(const Store& store, const std::string& path,
                         const ImportOptions& options) {
  const std::string what = path;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw_errno("import " + path);
  UniqueFd working = store.begin_work();
  TempDir temp(store);
  UnpackBudget budget(what, store.dir(), options.max_unpacked);
  std::unique_ptr<Source> source;
  if (S_ISDIR(st.st_mode)) {
    source = std::make_unique<DirectorySource>(path);
  } else {
    const std::string staging = temp.path() + "/archive";
    if (::mkdir(staging.c_str(), 0700) != 0) throw_errno("create " + staging);
    source = std::make_unique<ArchiveSource>(path, staging, what, budget);
  }
  SharedProgress progress(options.progress);
  ImageRecord record;
  if (source->has("index.json") && !(source->has("manifest.json") && !source->has("oci-layout"))) {
    record = import_oci(store, *source, options, what, temp.path(), progress, budget);
  } else if (source->has("manifest.json")) {
    record = import_docker(store, *source, options, what, temp.path(), progress, budget);
  } else {
    throw Error(
        what +
        ": neither an OCI image layout (index.json) nor a docker save archive (manifest.json)");
  }
  progress.finish();
  return record;
}

}  // namespace openshell::image
