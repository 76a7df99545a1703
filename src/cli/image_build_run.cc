// A RUN of `image build`: a one-shot sandbox on the image so far, its
// writable layer a directory of the store's tmp/ that becomes the step's
// layer once the command has succeeded.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "cli/egress_thread.h"
#include "cli/image_build.h"
#include "cli/terminal.h"
#include "image/unpack.h"
#include "namespaces/id_pool.h"
#include "runtime/caps.h"
#include "runtime/cgroup_reaper.h"
#include "runtime/cleanup.h"
#include "runtime/container.h"
#include "runtime/host_ids.h"
#include "runtime/id_map_exec.h"
#include "runtime/private_paths.h"
#include "spec/container_spec.h"

namespace openshell::cli::build {

namespace {

// What package managers need of root inside the sandbox's user namespace
// (Docker's default set, less MKNOD and NET_RAW, which mean nothing there):
// they hold nothing outside it.
const std::vector<std::string> kRunCapabilities = {
    "CHOWN",  "DAC_OVERRIDE", "FOWNER",  "FSETID",           "KILL",       "SETGID",
    "SETUID", "SETPCAP",      "SETFCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "AUDIT_WRITE"};

// A tmp/ directory of the store, removed however the step ends (its files
// may belong to the sandbox's ids: runtime::remove_tree).
class TempDir {
 public:
  explicit TempDir(const image::Store& store) : path_(store.make_temp_dir()) {}
  ~TempDir() {
    try {
      runtime::remove_tree(path_);
    } catch (const Error&) {
      // image prune removes what is left in tmp/
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void make_dir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) != 0) throw_errno("create " + path);
}

// The mount points the runtime makes in an overlay's writable layer for a
// root that lacks them (an empty /etc/hosts, /etc/resolv.conf): not the
// RUN's doing, so not the image's.
void drop_mount_point_files(const std::string& upper) {
  for (const char* name : {"/etc/hosts", "/etc/resolv.conf"}) {
    struct stat st;
    const std::string path = upper + name;
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0)
      ::unlink(path.c_str());
  }
}

// A layer blob written under tmp/, made a layer of the store: unpacked by
// the verified unpacker (so exactly what a pull of it would give), its blob
// kept for push.
void store_blob(const image::Store& store, const std::string& dir, const std::string& blob_path,
                const image::LayerBlob& blob, const std::string& what) {
  if (!store.has_layer(blob.diff_id)) {
    const std::string work = dir + "/unpacked";
    make_dir(work, 0700);
    make_dir(work + "/root", 0755);
    UniqueFd in(::open(blob_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!in) throw_errno("open " + blob_path);
    image::UnpackResult unpacked = image::unpack_layer(in.get(), work + "/root", {}, what);
    if (unpacked.diff_id != blob.diff_id || unpacked.compressed_digest != blob.digest)
      throw Error(what + ": the layer written does not read back the same");
    store.commit_layer(work, blob.diff_id, unpacked.content_bytes);
  }
  store.keep_blob(blob_path, blob.digest);
}

// Writes `dir` as a layer to out_fd from a user namespace with this user's
// id map, as root of it: there the files the sandbox made as its other ids
// (subordinate ones on the host) are readable, and their owners read as
// the sandbox saw them. For an ordinary user only (root reads everything,
// and maps ids itself).
image::LayerBlob write_in_user_namespace(int dir_fd, int out_fd, const std::string& what) {
  std::string answer;
  const int status = runtime::run_in_caller_id_map(
      0, 0, "the layer's writer for " + what,
      [&](int result) {
        // A fork of a process with one thread: it may allocate.
        std::string text;
        int code = 1;
        try {
          image::LayerBlob blob = image::write_layer(
              {{"/proc/self/fd/" + std::to_string(dir_fd), ""}}, out_fd, {}, what);
          text = layer_json(blob).dump();
          code = 0;
        } catch (const std::exception& e) {
          text = e.what();
        }
        size_t off = 0;
        while (off < text.size()) {
          ssize_t n = ::write(result, text.data() + off, text.size() - off);
          if (n <= 0) break;
          off += static_cast<size_t>(n);
        }
        return code;
      },
      &answer, std::string::npos);
  if (status != 0) throw Error(answer.empty() ? what + ": the layer's writer failed" : answer);
  auto j = nlohmann::json::parse(answer, nullptr, false);
  if (j.is_discarded()) throw Error(what + ": the layer's writer answered nonsense");
  return layer_of(j);
}

// Writes dir (as the sandbox left it) as a layer into the store.
image::LayerBlob layer_from_upper(const Workspace& ws, const TempDir& temp, const std::string& dir,
                                  const std::string& what) {
  const std::string blob_path = temp.path() + "/blob";
  image::LayerBlob blob;
  {
    UniqueFd out(::open(blob_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!out) throw_errno("create " + blob_path);
    if (ws.host_range) {
      image::LayerWriteOptions options;
      options.uid_map = {{0, ws.host_range->uid_start, namespaces::kRangeSize}};
      options.gid_map = {{0, ws.host_range->gid_start, namespaces::kRangeSize}};
      blob = image::write_layer({{dir, ""}}, out.get(), options, what);
    } else {
      UniqueFd dir_fd(::open(dir.c_str(), O_PATH | O_DIRECTORY));  // inherited by the writer
      if (!dir_fd) throw_errno("open " + dir);
      blob = write_in_user_namespace(dir_fd.get(), out.get(), what);
    }
    if (::fsync(out.get()) != 0) throw_errno("write " + blob_path);
  }
  store_blob(*ws.store, temp.path(), blob_path, blob, what);
  return blob;
}

// Copies the sandbox's output to the build's, on a thread.
class OutputPump {
 public:
  OutputPump(UniqueFd from, int to) : from_(std::move(from)), to_(to) {
    thread_ = std::thread([this] {
      char buf[8192];
      for (;;) {
        ssize_t n = ::read(from_.get(), buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        ssize_t off = 0;
        while (off < n) {
          ssize_t w = ::write(to_, buf + off, static_cast<size_t>(n - off));
          if (w <= 0) break;
          off += w;
        }
      }
    });
  }
  ~OutputPump() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  UniqueFd from_;
  int to_;
  std::thread thread_;
};

}  // namespace

nlohmann::json layer_json(const image::LayerBlob& l) {
  return {{"diff_id", l.diff_id},
          {"digest", l.digest},
          {"size", l.size},
          {"tar_size", l.tar_size},
          {"content_bytes", l.content_bytes},
          {"entries", l.entries}};
}

image::LayerBlob layer_of(const nlohmann::json& j) {
  image::LayerBlob l;
  l.diff_id = j.at("diff_id").get<std::string>();
  l.digest = j.at("digest").get<std::string>();
  l.size = j.at("size").get<uint64_t>();
  l.tar_size = j.at("tar_size").get<uint64_t>();
  l.content_bytes = j.at("content_bytes").get<uint64_t>();
  l.entries = j.at("entries").get<uint64_t>();
  return l;
}

int run_step(const Workspace& ws, const State& state, const std::vector<std::string>& argv,
             const std::string& what, image::LayerBlob* layer) {
  TempDir temp(*ws.store);
  const std::string layer_dir = temp.path() + "/layer";
  make_dir(layer_dir, 0700);
  make_dir(layer_dir + "/upper", 0755);
  make_dir(layer_dir + "/work", 0700);
  if (ws.host_range) {
    const runtime::SandboxIds ids{ws.host_range->uid_start, ws.host_range->gid_start};
    for (const char* sub : {"", "/upper", "/work"})
      runtime::chown_to_sandbox(layer_dir + sub, ids, 0, 0);
  }

  SandboxSpec sandbox;
  spec::Placement where;
  spec::OneShot& one_shot = where.one_shot.emplace();
  where.images_dir = ws.images_dir;
  sandbox.from = state.base ? state.base->name : "scratch";
  SandboxImage image;
  image.name = sandbox.from;
  image.id = state.base ? state.base->config_digest : "";
  image.layers = state.diff_ids();
  image.working_dir = state.working_dir();
  sandbox.image = image;
  sandbox.command = argv;
  sandbox.env = state.env();
  for (const auto& [k, v] : state.args) {
    bool in_env = false;
    for (const auto& e : sandbox.env) in_env = in_env || e.rfind(k + "=", 0) == 0;
    if (!in_env) sandbox.env.push_back(k + "=" + v);
  }
  sandbox.policy = ws.policy_text;
  sandbox.policy_source = ws.policy_source;
  one_shot.user = state.user().empty() ? "0:0" : state.user();
  one_shot.workdir = state.working_dir().empty() ? "/" : state.working_dir();
  one_shot.cap_add = runtime::caps::parse(kRunCapabilities);
  where.hidden = runtime::openshell_private_paths();
  where.hostname = "build";
  where.cgroup_name = "openshell-run-" + std::to_string(::getpid());

  runtime::ContainerSpec spec = spec::container_spec_for(sandbox, where);
  spec.fs.layer_dir = layer_dir;
  if (spec.host_range || ws.host_range) spec.host_range = ws.host_range;
  const policy::Policy policy = spec::effective_policy(sandbox, where);
  UniqueFd null_in(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null_in) throw_errno("open /dev/null");
  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw_errno("pipe");
  UniqueFd out_read(out_pipe[0]), out_write(out_pipe[1]);
  spec.stdin_fd = null_in.get();
  spec.stdout_fd = out_write.get();
  spec.stderr_fd = out_write.get();
  const auto grace = stop_grace();

  int status = 0;
  {
    block_forwarded_signals();
    runtime::CgroupReaper reaper(spec.cgroup_name);  // outlives the container
    auto container = runtime::Container::start(spec);
    out_write.reset();
    OutputPump pump(std::move(out_read), ws.output_fd);
    std::unique_ptr<EgressThread> egress;
    if (spec.egress) egress = std::make_unique<EgressThread>(*container, spec, policy, nullptr);
    status = attach(*container, grace);
  }
  if (status != 0) return status;
  drop_mount_point_files(layer_dir + "/upper");
  *layer = layer_from_upper(ws, temp, layer_dir + "/upper", what);
  return 0;
}

image::LayerBlob add_staged_layer(const Workspace& ws, const std::string& staged, uint32_t uid,
                                  uint32_t gid, const std::string& what) {
  TempDir temp(*ws.store);
  const std::string blob_path = temp.path() + "/blob";
  image::LayerBlob blob;
  {
    UniqueFd out(::open(blob_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!out) throw_errno("create " + blob_path);
    image::LayerWriteOptions options;
    options.uid_map = {{uid, static_cast<uint32_t>(::geteuid()), 1}};
    options.gid_map = {{gid, static_cast<uint32_t>(::getegid()), 1}};
    blob = image::write_layer({{staged, ""}}, out.get(), options, what);
    if (::fsync(out.get()) != 0) throw_errno("write " + blob_path);
  }
  store_blob(*ws.store, temp.path(), blob_path, blob, what);
  return blob;
}

}  // namespace openshell::cli::build
