#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/json_text.h"
#include "base/log.h"
#include "base/random.h"
#include "base/sandbox_limits.h"
#include "base/text.h"
#include "base/vm_host.h"
#include "gateway/host_paths.h"
#include "gateway/selector.h"
#include "gateway/service.h"
#include "image/store.h"
#include "runtime/cleanup.h"
#include "runtime/host_ids.h"
#include "spec/container_spec.h"

namespace openshell::gateway {

std::shared_ptr<const SandboxSpec> Gateway::spec_of(const SandboxRecord& record) const {
  auto& [text, spec] = specs_[record.id];
  if (!spec || text != record.spec) {
    spec = std::make_shared<const SandboxSpec>(SandboxSpec::from_json(record.spec));
    text = record.spec;
  }
  return spec;
}

json Gateway::view(const SandboxRecord& r) const {
  json conditions = json::array();
  for (const auto& c : r.conditions)
    conditions.push_back({{"type", c.type},
                          {"status", c.status},
                          {"reason", c.reason},
                          {"message", c.message},
                          {"last_transition_time", time::format_ms(c.last_transition_ms)}});
  const SandboxSpec& spec = *spec_of(r);
  json j = {{"name", r.name},
            {"id", r.id},
            {"owner", owner_of(r)},
            {"phase", std::string(phase_name(r.phase))},
            {"generation", r.generation},
            {"conditions", conditions},
            {"created_at", time::format_ms(r.created_ms)},
            {"labels", r.labels},
            {"from", spec.from},
            {"command", spec.command}};
  if (spec.image)
    j["image"] = {
        {"name", spec.image->name}, {"id", spec.image->id}, {"digest", spec.image->digest}};
  j["storage"] = spec.from == "host" ? "host" : spec.storage.empty() ? "overlay" : spec.storage;
  if (!spec.storage_note.empty()) j["storage_note"] = spec.storage_note;
  j["limits"] = spec.limits_json();
  j["restart"] = spec.restart.empty() ? "unless-stopped" : spec.restart;
  // What create was given that the sandbox keeps across its starts.
  json binds = json::array();
  for (const auto& b : spec.binds)
    binds.push_back({{"source", b.source}, {"target", b.target}, {"read_only", b.read_only}});
  j["binds"] = binds;
  if (!spec.user.empty()) j["user"] = spec.user;
  if (!spec.ca_certs.empty()) j["ca_certs"] = spec.ca_certs.size();
  if (spec.vm)
    j["vm"] = {{"vcpus", spec.vm->vcpus},
               {"memory_mib", spec.vm->memory_mib},
               {"kernel", spec.vm->kernel}};
  if (r.exit_code) j["exit_code"] = *r.exit_code;
  return j;
}

SandboxRecord Gateway::find(const std::string& name) const {
  auto record = store_->find_by_name(name);
  if (!record) throw ApiError(404, "not_found", "no sandbox named '" + name + "'");
  return *record;
}

// The caller's own sandboxes; with all=1, an admin's view of everyone's.
void Gateway::list_sandboxes(const Call& call) {
  const std::shared_ptr<net::Exchange>& exchange = call.exchange;
  const net::Request& req = exchange->request();
  const bool all = req.query.count("all") && req.query.at("all") != "0";
  if (all && !call.who.admin)
    refuse(call, "admin_only",
           "the sandboxes of every principal (all=1, sandbox list --all) are for admins, and " +
               call.who.name + " is not one");
  std::vector<SelectorTerm> terms;
  try {
    terms = parse_selector(req.query.count("selector") ? req.query.at("selector") : "");
  } catch (const Error& e) {
    throw ApiError(400, "bad_request", e.what());
  }
  std::string body = "{\"sandboxes\":[";
  bool first = true;
  for (const Listed& s : listed()) {
    if ((!all && s.owner != call.who.name) || !matches(terms, s.labels)) continue;
    if (!first) body += ',';
    body += s.view;
    first = false;
  }
  body += "]}\n";
  exchange->respond(net::Response{200, std::move(body), "application/json"});
}

const std::vector<Gateway::Listed>& Gateway::listed() const {
  const std::optional<Store::Revision> now = store_->revision();
  if (now && listed_at_ == now) return listed_;
  listed_.clear();
  for (auto& r : store_->list()) {
    std::string text = json_text(view(r));  // before the labels are moved out of r
    listed_.push_back({owner_of(r), std::move(r.labels), std::move(text)});
  }
  listed_at_ = now;
  return listed_;
}

void Gateway::get_sandbox(const std::shared_ptr<net::Exchange>& exchange, const std::string& name) {
  exchange->respond(json_response(200, view(find(name))));
}

// The newest `limit` (default 100, at most the 1000 kept), oldest first.
void Gateway::events(const std::shared_ptr<net::Exchange>& exchange, const std::string& name) {
  const net::Request& req = exchange->request();
  SandboxRecord record = find(name);
  const std::string limit_text = req.query.count("limit") ? req.query.at("limit") : "100";
  auto limit = text::parse_uint(limit_text, 1000);
  if (!limit || *limit < 1)
    throw ApiError(400, "bad_request",
                   "limit must be a number from 1 to 1000, not '" + limit_text + "'");
  json events = json::array();
  for (const auto& e : store_->events(record.id, *limit))
    events.push_back(
        {{"time", time::format_ms(e.time_ms)}, {"type", e.type}, {"message", e.message}});
  exchange->respond(json_response(200, {{"sandbox", record.name}, {"events", events}}));
}

void Gateway::check_host_paths(const Call& call, const SandboxSpec& spec,
                               const std::string& given_kernel) {
  std::vector<HostPath> paths;
  if (!given_kernel.empty()) paths.push_back({given_kernel, "--vm-kernel " + given_kernel});
  for (const auto& b : spec.binds)
    paths.push_back({b.source, "--bind " + b.source + ":" + b.target, !b.read_only, true, false});
  if (!spec.from.empty() && spec.from[0] == '/')
    paths.push_back({spec.from, "--from", false, false, true});
  const Principal& who = call.who;
  // The gateway's own rights are the caller's: root, the gateway's user.
  if (who.unix_peer && (who.uid == 0 || who.uid == ::geteuid())) return;
  if (!who.unix_peer) {
    // A remote principal has no rights on this host's files to check: only
    // an admin's request may name them (from "host" too: the host's root).
    if (who.admin) return;
    if (spec.from == "host") paths.push_back({"/", "--from host", false});
    if (paths.empty()) return;
    refuse(call, "host_path_not_allowed",
           paths.front().what + ": a host path is given only to an admin over " + who.transport +
               " (" + who.name + " is not one); copy the files in with 'sandbox upload' instead");
  }
  if (paths.empty()) return;
  if (::geteuid() != 0)
    refuse(call, "host_path_not_allowed",
           paths.front().what + ": this gateway is not root and cannot check host paths with " +
               who.name + "'s rights");
  std::string problem;
  try {
    problem = host_path_problem(who.uid, who.gid, paths);
  } catch (const Error& e) {
    throw ApiError(500, "internal", e.what());
  }
  if (!problem.empty())
    refuse(call, "host_path_denied",
           problem + ": host paths are used with " + who.name + "'s rights");
}

void Gateway::resolve_image(SandboxSpec* spec) {
  std::optional<image::ImageRecord> record;
  const GatewayConfig& settings = config();
  try {
    // What a short name means comes from the settings as they are now.
    image::set_registry_config(settings.registries(std::getenv));
    record = image::Store(paths_.images()).find(spec->from);
  } catch (const Error& e) {
    throw ApiError(400, "invalid_spec", std::string("--from: ") + e.what());
  }
  if (!record) {
    std::string hint =
        spec->from == "base" || spec->from == "base:latest"
            ? "build it with 'openshell image build-base', or choose another with --from"
            : "pull it first: openshell image pull " + spec->from;
    throw ApiError(404, "image_not_found",
                   "image " + spec->from + " is not in the image store (" + hint + ")");
  }
  spec::resolve_image(spec, *record);
}

// The storage is the gateway's to choose, not its clients': a copy costs
// the gateway's disk a whole root per sandbox, and a sandbox's own copy is
// a root the sandbox can rewrite. A client's "copy" is accepted only where
// every root is a copy anyway (storage.mode = "copy", OPENSHELL_STORAGE=copy).
static void check_client_storage(const SandboxSpec& spec, const std::string& mode) {
  if (spec.storage.empty()) return;
  if (spec.storage == "copy" && mode == "copy") return;
  throw Error("storage '" + spec.storage +
              "': chosen by the gateway, not by its clients (a gateway whose storage.mode is "
              "copy gives every sandbox a copy)");
}

void Gateway::choose_storage(SandboxSpec* spec, const std::string& id) {
  const Setting& mode = config().storage;
  const std::string setting = mode.value;
  if (setting == "overlay") return;
  std::string problem;
  if (setting == "copy") {
    problem = mode.source == "environment" ? "OPENSHELL_STORAGE=copy"
                                           : "storage.mode = \"copy\" in " + config().path;
  } else if (!overlay_checked_) {
    // Once per gateway: whether overlayfs stacks on this file system here.
    std::vector<std::string> lowers;
    if (spec->image) {
      image::Store store(paths_.images());
      for (auto it = spec->image->layers.rbegin(); it != spec->image->layers.rend(); ++it)
        lowers.push_back(store.layer_root(*it));
    } else {
      lowers.push_back(spec->from);
    }
    const std::string scratch = paths_.sandboxes() + "/.probe-" + id;
    if (::mkdir(scratch.c_str(), 0700) != 0) throw_errno("create " + scratch);
    problem = runtime::overlay_problem(lowers, scratch);
    try {
      runtime::remove_tree(scratch);
    } catch (const Error& e) {
      log::warn(e.what());
    }
    if (problem.empty()) overlay_checked_ = true;
  }
  if (problem.empty()) return;
  spec->storage = "copy";
  spec->storage_note = "overlayfs cannot stack the root here (" + problem +
                       "): the sandbox's root is a copy of its image";
  log::warn("sandbox " + id + ": " + spec->storage_note);
}

// A micro-VM's VMM runs as the gateway's user and opens /dev/kvm and the
// guest kernel with its rights: what it could not open is refused at
// create, not at each launch.
static void check_vm_host(const SandboxVm& vm, bool gateway_kernel) {
  if (auto why = vm_host::kvm_problem(); !why.empty())
    throw ApiError(400, "vm_unavailable", "--vm: this gateway cannot run micro-VMs: " + why);
  if (auto why = vm_host::kernel_problem(vm.kernel); !why.empty())
    throw ApiError(400, "vm_unavailable",
                   gateway_kernel ? "--vm: the gateway has no usable guest kernel at " + vm.kernel +
                                        " (" + why + "; give --vm-kernel PATH, or set " +
                                        vm_host::kKernelVariable + " for the gateway)"
                                  : "--vm-kernel " + vm.kernel + ": " + why);
}

void Gateway::trace(const std::string& id, const char* step) {
  auto it = traces_.find(id);
  if (it == traces_.end()) return;
  const auto since = std::chrono::steady_clock::now() - it->second.begin;
  const double ms = std::chrono::duration<double, std::milli>(since).count();
  it->second.steps.push_back({{"step", step}, {"ms", std::round(ms * 1000) / 1000}});
}

json Gateway::take_trace(const std::string& id) {
  auto it = traces_.find(id);
  if (it == traces_.end()) return nullptr;
  trace(id, "answer");
  json steps = std::move(it->second.steps);
  traces_.erase(it);
  return steps;
}

namespace {
bool wants_timings(const net::Request& req) {
  auto it = req.query.find("timings");
  return it != req.query.end() && it->second != "0" && it->second != "false";
}

// The record's view, with the launch's timings when they were asked for.
json with_timings(json view, json timings) {
  if (!timings.is_null()) view["timings"] = std::move(timings);
  return view;
}
}  // namespace

void Gateway::create(const Call& call) {
  const std::shared_ptr<net::Exchange>& exchange = call.exchange;
  const net::Request& req = exchange->request();
  const auto begin = std::chrono::steady_clock::now();
  json body = json::parse(req.body, nullptr, false);
  if (!body.is_object()) throw ApiError(400, "bad_request", "the body must be a JSON object");
  std::string name = body.value("name", "");
  SandboxSpec spec;
  const std::string storage_mode = config().storage.value;
  std::string given_kernel;
  try {
    spec = SandboxSpec::from_json(body.contains("spec") ? body["spec"].dump() : "{}");
    // A VM whose client named no kernel (a remote one's) boots the
    // gateway's: $OPENSHELL_VM_KERNEL of its environment, else the packaged one.
    if (spec.vm && spec.vm->kernel.empty())
      spec.vm->kernel = vm_host::choose_kernel("", std::getenv(vm_host::kKernelVariable)).path;
    else if (spec.vm)
      given_kernel = spec.vm->kernel;
    spec.validate();
    check_client_storage(spec, storage_mode);
  } catch (const Error& e) {
    throw ApiError(400, "invalid_spec", e.what());
  }
  // What the gateway itself decides: which image --from names (its layers
  // are what the supervisor mounts) and why the root is a copy.
  spec.image.reset();
  spec.storage_note.clear();
  std::string id = random_hex(6);
  if (name.empty()) name = "sandbox-" + id.substr(0, 6);
  if (!text::is_dns_label(name))
    throw ApiError(400, "invalid_name",
                   "sandbox name '" + name +
                       "': must be a DNS label (a-z, 0-9 and '-', at most 63, not starting or "
                       "ending with '-')");
  // What the sandbox did not ask for, the gateway's defaults decide: fixed
  // now, so that `sandbox get` shows what holds.
  try {
    spec.apply_limit_defaults(config().sandbox_defaults, limits::memory_total());
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw ApiError(500, "bad_config", e.what());
  }
  // Providers (names), all known before anything is made; lending their
  // credentials is an admin's decision.
  std::vector<std::string> providers;
  if (body.contains("providers")) {
    if (!body["providers"].is_array())
      throw ApiError(400, "bad_request", "providers must be a list of names");
    for (const json& p : body["providers"]) {
      if (!p.is_string()) throw ApiError(400, "bad_request", "providers must be a list of names");
      providers.push_back(p.get<std::string>());
    }
  }
  if (!providers.empty() && !call.who.admin)
    refuse(call, "admin_only",
           "attaching a provider is for admins, and " + call.who.name + " is not one");
  for (const auto& p : providers) find_provider(p);
  // Port forwards (--forward), each free, before anything is made.
  std::vector<ForwardRecord> forwards = forwards_to_create(call, body);
  if (spec.vm && !forwards.empty())
    throw ApiError(400, "unsupported",
                   "--forward: port forwards into a micro-VM sandbox are not supported");
  // Before the gateway looks at any of them with its own rights.
  check_host_paths(call, spec, given_kernel);
  if (spec.vm) check_vm_host(*spec.vm, given_kernel.empty());
  const bool directory = spec.from[0] == '/' && files::is_directory(spec.from);
  if (spec.from != "host" && !directory) resolve_image(&spec);
  if (spec.from != "host") choose_storage(&spec, id);
  // --user is refused now, not at the launch, where the policy or the root
  // has no such user.
  if (!spec.user.empty()) try {
      spec::exec_user(spec, spec::sandbox_placement(id, name, paths_), spec.user);
    } catch (const Error& e) {
      throw ApiError(400, "invalid_spec", e.what());
    }
  // As root, the sandbox's own host ids, never a client's choice: claimed
  // host-wide (other gateways' sandboxes and runs too) until its delete.
  spec.host_uid_start.reset();
  spec.host_gid_start.reset();
  if (::geteuid() == 0) {
    try {
      const runtime::SandboxIds ids = runtime::claim_sandbox_ids(paths_.sandbox(id));
      spec.host_uid_start = ids.uid_start;
      spec.host_gid_start = ids.gid_start;
    } catch (const Error& e) {
      throw ApiError(503, "no_id_range", e.what());
    }
  }

  // "start": false makes it Stopped, its files to be copied in (create
  // --upload) before a start runs anything.
  const json& start_field = body.contains("start") ? body["start"] : json(true);
  if (!start_field.is_boolean()) throw ApiError(400, "bad_request", "start must be true or false");
  const bool start = start_field.get<bool>();
  SandboxRecord record;
  record.id = id;
  record.name = name;
  record.phase = start ? Phase::kProvisioning : Phase::kStopped;
  record.generation = 1;
  record.spec = spec.to_json();
  record.labels = spec.labels;
  record.intent = start ? "launch" : "";
  record.owner = call.who.name;
  record.created_ms = record.updated_ms = now_ms();
  record.conditions.push_back(
      Condition{"Ready", "False", "SupervisorNotConnected", "", record.created_ms});
  if (wants_timings(req)) traces_[id] = LaunchTrace{begin};
  trace(id, "checked");
  // The record, its first policy, providers, forwards and the event: one
  // commit, on disk before anything is done.
  try {
    store_->atomically("create sandbox '" + name + "'", [&] {
      store_->insert(record);
      store_->add_policy(id, spec.policy, record.created_ms);  // revision 1
      // Before the launch, which puts their placeholders in the env.
      if (!providers.empty()) attach_providers(record, providers);
      // Before the launch too: the supervisor's welcome carries them.
      for (auto& f : forwards) {
        f.sandbox_id = id;
        store_->insert_forward(f);
      }
      store_->append_event(
          id, "Created",
          "from " + spec.from + (spec.image ? " (image " + spec.image->id.substr(7, 12) + ")" : ""),
          record.created_ms);
    });
  } catch (...) {
    traces_.erase(id);
    release_id_range(record);  // no record, no sandbox: its ids are free again
    throw;
  }
  trace(id, "stored");

  // The sandbox's directory: launch file, logs, and its writable layer.
  const std::string dir = paths_.sandbox(id);
  try {
    std::vector<std::string> subdirs = {"", "/logs"};
    const bool overlay = spec.from != "host" && spec.storage.empty();
    if (spec.from == "host")
      subdirs.push_back("/workspace");
    else if (overlay)
      subdirs.insert(subdirs.end(),
                     {"/layer", "/layer/upper", "/layer/work", "/layer/upper/sandbox"});
    // The upper layer's root reads as the sandbox's /: 0755. Its /sandbox,
    // the workspace, is the sandbox user's whatever the image says (the
    // launch hands it to another user the sandbox runs as: an image's User,
    // the policy's run_as_user).
    for (const auto& sub : subdirs) {
      mode_t mode = sub == "/layer/upper" || sub == "/layer/upper/sandbox" ? 0755 : 0700;
      if (::mkdir((dir + sub).c_str(), mode) != 0 && errno != EEXIST)
        throw_errno("create " + dir + sub);
    }
    // As root the sandbox runs as unprivileged ids: its layer and workspace
    // are theirs.
    if (::geteuid() == 0) {
      const runtime::SandboxIds ids{*spec.host_uid_start, *spec.host_gid_start};
      auto own = [&](const std::string& path, uint32_t inside_uid, uint32_t inside_gid) {
        runtime::chown_to_sandbox(path, ids, inside_uid, inside_gid);
      };
      if (spec.from == "host") {
        own(dir + "/workspace", 1000, 1000);
      } else if (overlay) {
        for (const char* sub : {"/layer", "/layer/upper", "/layer/work"}) own(dir + sub, 0, 0);
        own(dir + "/layer/upper/sandbox", 1000, 1000);
      }
    }
    // The image's layers stay in the store while the sandbox exists.
    if (spec.image) image::Store(paths_.images()).hold(id, spec.image->layers);
    trace(id, "directory");
    if (start)
      launch(record);
    else
      set_phase(record, Phase::kStopped, "Created", "created without a start");
  } catch (const Error& e) {
    record.intent = "";
    set_phase(record, Phase::kError, "LaunchFailed", e.what());
  }
  std::string wait = req.query.count("wait") ? req.query.at("wait") : "ready";
  if (wait == "none")
    return exchange->respond(json_response(201, with_timings(view(record), take_trace(id))));
  wait_for(
      id,
      [](const SandboxRecord* r) {
        return !r || (r->phase != Phase::kProvisioning && r->phase != Phase::kStarting);
      },
      [this, exchange, id](const SandboxRecord* r) {
        json timings = take_trace(id);
        if (r) return exchange->respond(json_response(201, with_timings(view(*r), timings)));
        auto last = gone_.find(id);
        if (last != gone_.end()) return exchange->respond(json_response(201, last->second));
        exchange->respond(error_response(410, "gone", "the sandbox was deleted"));
      });
}

void Gateway::start_sandbox(const Call& call) {
  const auto begin = std::chrono::steady_clock::now();
  const std::shared_ptr<net::Exchange>& exchange = call.exchange;
  const std::string& name = call.name;
  SandboxRecord record = find(name);
  // A bind's source may have changed since the create (a directory become a
  // symbolic link elsewhere): the caller's rights again, at every start.
  check_host_paths(call, SandboxSpec::from_json(record.spec));
  if (!finished(record.phase))
    throw ApiError(409, "wrong_phase",
                   "sandbox '" + name + "' is " + std::string(phase_name(record.phase)) +
                       " (start works from Stopped, Completed or Error)");
  if (wait_for_copy(exchange, record, "start")) return;
  if (wants_timings(call.exchange->request())) traces_[record.id] = LaunchTrace{begin};
  relaunch(record);
  wait_for(
      record.id,
      [](const SandboxRecord* r) {
        return !r || (r->phase != Phase::kStarting && r->phase != Phase::kProvisioning);
      },
      [this, exchange, id = record.id](const SandboxRecord* r) {
        json timings = take_trace(id);
        if (!r) return exchange->respond(error_response(410, "gone", "the sandbox was deleted"));
        exchange->respond(json_response(200, with_timings(view(*r), timings)));
      });
}

void Gateway::stop_sandbox(const std::shared_ptr<net::Exchange>& exchange,
                           const std::string& name) {
  SandboxRecord record = find(name);
  if (record.phase != Phase::kReady && record.phase != Phase::kProvisioning &&
      record.phase != Phase::kStarting && record.phase != Phase::kStopping)
    throw ApiError(409, "wrong_phase",
                   "sandbox '" + name + "' is " + std::string(phase_name(record.phase)) +
                       " (stop works on a running sandbox)");
  if (record.phase != Phase::kStopping) {
    record.intent = "stop";
    set_phase(record, Phase::kStopping, "StopRequested");
    request_stop(record);
  }
  wait_for(
      record.id, [](const SandboxRecord* r) { return !r || r->phase != Phase::kStopping; },
      [this, exchange](const SandboxRecord* r) {
        if (!r) return exchange->respond(error_response(410, "gone", "the sandbox was deleted"));
        exchange->respond(json_response(200, view(*r)));
      });
}

void Gateway::delete_sandbox(const std::shared_ptr<net::Exchange>& exchange,
                             const std::string& name) {
  SandboxRecord record = find(name);
  std::string id = record.id;
  if (wait_for_copy(exchange, record, "delete")) return;
  if (record.phase != Phase::kDeleting) {
    record.intent = "delete";
    set_phase(record, Phase::kDeleting, "DeleteRequested");
  }
  await_delete(id, name, [exchange, name](const ApiError* timeout) {
    if (timeout)
      return exchange->respond(error_response(timeout->status, timeout->code, timeout->what()));
    exchange->respond(json_response(200, {{"deleted", name}}));
  });
}

void Gateway::await_delete(const std::string& id, const std::string& name,
                           std::function<void(const ApiError*)> then) {
  wait_for(
      id, [](const SandboxRecord* r) { return !r; },
      [name, then = std::move(then)](const SandboxRecord* r) {
        if (!r) return then(nullptr);
        const ApiError timeout(504, "timeout", "deleting '" + name + "' takes too long");
        then(&timeout);
      });
  finish_delete(id);
}

// Several sandboxes at once (`sandbox delete` of more than one, --all): their
// Deleting marks in one commit rather than one each, every supervisor killed
// at once, and one answer when all are gone, in which each name is either
// deleted or has its error (as its single DELETE would have answered). A
// sandbox that one of this gateway's copies is using is deleted when that
// copy ends, as a single delete waits for it.
struct Gateway::DeleteBatch {
  std::shared_ptr<net::Exchange> exchange;
  size_t pending = 0;  // names not yet deleted nor failed
  json deleted = json::array();
  json errors = json::array();

  void done() {
    if (--pending == 0)
      exchange->respond(json_response(200, {{"deleted", deleted}, {"errors", errors}}));
  }
  void fail(const std::string& name, int status, const std::string& code,
            const std::string& message) {
    errors.push_back({{"name", name}, {"status", status}, {"code", code}, {"message", message}});
    done();
  }
};

void Gateway::delete_sandboxes(const Call& call) {
  json body = json::parse(call.exchange->request().body, nullptr, false);
  const char* shape = "the body must be {\"names\": [NAME, ...]} with at least one name";
  if (!body.is_object() || !body.contains("names") || !body["names"].is_array() ||
      body["names"].empty())
    throw ApiError(400, "bad_request", shape);
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const auto& n : body["names"]) {
    if (!n.is_string()) throw ApiError(400, "bad_request", shape);
    if (seen.insert(n.get<std::string>()).second) names.push_back(n.get<std::string>());
  }
  auto batch = std::make_shared<DeleteBatch>();
  batch->exchange = call.exchange;
  batch->pending = names.size();
  delete_batch(batch, names, call);
}

void Gateway::delete_batch(const std::shared_ptr<DeleteBatch>& batch,
                           const std::vector<std::string>& names, const Call& call) {
  std::vector<SandboxRecord> marks;
  std::vector<std::pair<std::string, std::string>> targets;  // name, id
  for (const std::string& name : names) {
    try {
      SandboxRecord record = owned(call, name);
      if (copies_.count(record.id)) {
        copy_waiters_[record.id].push_back(
            [this, batch, name, call] { delete_batch(batch, {name}, call); });
        continue;
      }
      wait_for_copy(call.exchange, record, "delete");  // another's copy: 409 busy
      targets.emplace_back(name, record.id);
      if (record.phase != Phase::kDeleting) {
        record.intent = "delete";
        marks.push_back(std::move(record));
      }
    } catch (const ApiError& e) {
      batch->fail(name, e.status, e.code, e.what());
    }
  }
  try {
    if (!marks.empty())
      store_->atomically("mark " + std::to_string(marks.size()) + " sandboxes Deleting", [&] {
        for (SandboxRecord& record : marks) set_phase(record, Phase::kDeleting, "DeleteRequested");
      });
  } catch (const Error& e) {
    for (const auto& target : targets) batch->fail(target.first, 500, "internal", e.what());
    return;
  }
  for (const auto& [name, id] : targets) {
    await_delete(id, name, [batch, name](const ApiError* timeout) {
      if (timeout) return batch->fail(name, timeout->status, timeout->code, timeout->what());
      batch->deleted.push_back(name);
      batch->done();
    });
  }
}

void Gateway::wait_exit(const std::shared_ptr<net::Exchange>& exchange, const std::string& name) {
  SandboxRecord record = find(name);
  wait_for(
      record.id, [](const SandboxRecord* r) { return !r || finished(r->phase); },
      [this, exchange](const SandboxRecord* r) {
        if (!r) return exchange->respond(error_response(410, "gone", "the sandbox was deleted"));
        exchange->respond(json_response(200, view(*r)));
      });
}

// Log records as they are in the file; with follow, a WebSocket that stays
// open until the main process has ended and its output is all sent.

// Every change of the sandboxes the caller may see (notify() sends them).
void Gateway::watch(const Call& call) {
  auto ws = call.exchange->upgrade();
  ws->start([](std::string, bool) {}, [](const std::string&) {});
  watchers_.push_back({ws, call.who});
}

}  // namespace openshell::gateway
