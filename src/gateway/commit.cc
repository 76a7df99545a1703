// Committing a sandbox: its writable layer (the overlay's upper directory,
// which holds its workspace /sandbox too) as a new layer on its image, named
// in the gateway's image store. A running sandbox is held still with a
// freezer cgroup while the layer is read (runtime/freeze.h), and thawed
// before the image is named.
#include <fcntl.h>
#include <unistd.h>

#include <optional>

#include "base/directory.h"
#include "base/log.h"
#include "gateway/service.h"
#include "image/compose.h"
#include "image/digest.h"
#include "image/store.h"
#include "runtime/freeze.h"
#include "runtime/id_map_exec.h"
#include "spec/container_spec.h"

namespace openshell::gateway {

namespace {

constexpr uint32_t kSandboxIds = 65536;

// Where a rootless gateway's helper writes the layer, removed however the
// commit ends.
struct TempDir {
  explicit TempDir(const image::Store& store) : path(store.make_temp_dir()) {}
  ~TempDir() {
    try {
      files::remove_tree(path);
    } catch (const Error& e) {
      log::warn(e.what());
    }
  }
  std::string path;
};

}  // namespace

void Gateway::commit_sandbox(const Call& call) {
  const auto& exchange = call.exchange;
  SandboxRecord record = find(call.name);
  if (wait_for_copy(exchange, record, "commit")) return;
  json body = json::parse(exchange->request().body, nullptr, false);
  if (!body.is_object() || !body.contains("image") || !body["image"].is_string())
    throw ApiError(400, "bad_request",
                   "the body must be {\"image\": \"NAME[:TAG]\", \"message\": \"...\"}");
  const std::string wanted = body["image"].get<std::string>();
  const std::string message = body.contains("message") && body["message"].is_string()
                                  ? body["message"].get<std::string>()
                                  : "";
  image::Reference ref;
  try {
    ref = image::local_reference(wanted);
  } catch (const Error& e) {
    throw ApiError(400, "invalid_image_name", e.what());
  }
  if (!ref.digest.empty())
    throw ApiError(400, "invalid_image_name",
                   "image " + wanted + ": name the new image with a tag, not a digest");

  SandboxSpec spec = SandboxSpec::from_json(record.spec);
  const std::string who = "sandbox '" + record.name + "'";
  if (!spec.image)
    throw ApiError(409, "not_from_image",
                   who + " was not made from an image (--from " + spec.from +
                       "): only a sandbox made from an image can be committed");
  if (spec.storage == "copy")
    throw ApiError(409, "copy_storage",
                   who +
                       " has a copy of its root (storage copy), not an overlay layer: "
                       "commit needs a sandbox on overlayfs");
  const bool running =
      record.phase == Phase::kReady && alive(record.supervisor_pid, record.supervisor_start);
  if (!running && !finished(record.phase))
    throw ApiError(409, "busy",
                   who + " is " + std::string(phase_name(record.phase)) +
                       ": commit it when it is Ready, Stopped, Completed or Error");

  image::Store store(paths_.images());
  auto base = store.find(spec.image->id);
  if (!base)
    throw ApiError(
        409, "image_not_found",
        who + ": its image " + spec.image->id.substr(0, 19) + " is no longer in the image store");
  const std::string upper = paths_.sandbox(record.id) + "/layer/upper";
  const std::string what = "layer of " + who;
  UniqueFd working = store.begin_work();

  std::optional<runtime::SandboxFreeze> frozen;
  if (running) {
    auto live = supervised_.find(record.id);
    const int64_t init = live == supervised_.end() ? 0 : live->second.init_pid;
    if (init <= 0)
      throw ApiError(409, "busy", who + " has not reported its init yet: try again in a moment");
    if (!runtime::can_freeze())
      throw ApiError(409, "cannot_freeze",
                     who +
                         " is running, and this gateway cannot freeze it (no freezer cgroup it "
                         "may use: a rootless gateway has none): stop it first (openshell "
                         "sandbox stop " +
                         record.name + "), then commit");
    try {
      frozen.emplace(static_cast<pid_t>(init), "openshell-commit-" + record.id);
    } catch (const Error& e) {
      throw ApiError(500, "commit_failed", who + ": freeze: " + e.what());
    }
  }

  image::LayerBlob layer;
  try {
    if (::geteuid() == 0) {
      // The sandbox's files belong to its own host id range: ids inside.
      image::LayerWriteOptions options;
      if (spec.host_uid_start && spec.host_gid_start) {
        options.uid_map = {{0, *spec.host_uid_start, kSandboxIds}};
        options.gid_map = {{0, *spec.host_gid_start, kSandboxIds}};
      }
      layer = image::add_layer(store, {{upper, ""}}, options, what);
    } else {
      // Files of subordinate ids are readable only with the sandbox's id
      // map: a helper of this binary reads them there.
      const runtime::ContainerSpec container =
          spec::container_spec_for(spec, spec::sandbox_placement(record.id, record.name, paths_));
      TempDir temp(store);
      const std::string blob = temp.path + "/blob";
      UniqueFd out(::open(blob.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!out) throw_errno("create " + blob);
      std::string errors;
      const int status =
          runtime::run_with_caller_id_map({"/proc/self/exe", "sandbox", "__write-layer", upper},
                                          container.uid, container.gid, out.get(), &errors);
      out.reset();
      if (status != 0)
        throw Error(errors.empty()
                        ? what + ": the layer writer exited with " + std::to_string(status)
                        : errors);
      layer = image::store_layer_blob(store, blob, what);
    }
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw ApiError(500, "commit_failed", e.what());
  }
  frozen.reset();  // thawed before the image is named

  image::NewImage made;
  made.name = ref.canonical();
  made.base = *base;
  made.layers = {layer};
  made.history = {{"", "openshell sandbox commit " + record.name, message, "", false}};
  made.source = "commit sandbox " + record.name;
  image::ImageRecord stored;
  try {
    stored = image::put_image(store, made);
  } catch (const Error& e) {
    throw ApiError(500, "commit_failed", e.what());
  }
  store_->append_event(record.id, "Committed",
                       "as " + ref.familiar() + " (layer " + layer.digest.substr(7, 12) + ")",
                       now_ms());
  exchange->respond(json_response(
      201,
      {{"sandbox", record.name},
       {"image", ref.familiar()},
       {"id", stored.config_digest},
       {"digest", stored.manifest_digest},
       {"frozen", running},
       {"layer", {{"diff_id", layer.diff_id}, {"digest", layer.digest}, {"size", layer.size}}}}));
}

}  // namespace openshell::gateway
