// The steps of `openshell image build`, in order, with the cache.
#include "cli/image_build.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/paths.h"
#include "base/text.h"
#include "base/time.h"
#include "cli/images.h"
#include "image/build_cache.h"
#include "image/reference.h"
#include "namespaces/id_pool.h"
#include "runtime/cleanup.h"
#include "spec/container_spec.h"

namespace openshell::cli::build {

using nlohmann::json;

std::vector<std::string> State::env() const {
  std::vector<std::string> base_env = base ? base->config.env : std::vector<std::string>{};
  return spec::merge_env(base_env, edits.env);
}

std::string State::user() const {
  if (edits.user) return *edits.user;
  return base ? base->config.user : "";
}

std::string State::working_dir() const {
  if (edits.working_dir) return *edits.working_dir;
  return base ? base->config.working_dir : "";
}

std::vector<std::string> State::diff_ids() const {
  std::vector<std::string> out = base ? base->diff_ids : std::vector<std::string>{};
  for (const auto& l : layers) out.push_back(l.diff_id);
  return out;
}

std::map<std::string, std::string> State::vars() const {
  std::map<std::string, std::string> out = args;
  for (const auto& entry : env()) {
    size_t eq = entry.find('=');
    if (eq != std::string::npos) out[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return out;
}

namespace {

// A cache entry, parsed; nullopt when missing or unreadable.
std::optional<json> cache_entry(const image::Store& store, const std::string& key) {
  auto text = image::cache_lookup(store, key);
  if (!text) return std::nullopt;
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

// A cached layer step: its layer, when the store still has it whole, and
// when it was made.
std::optional<image::LayerBlob> cached_layer(const image::Store& store, const std::string& key,
                                             std::string* created) {
  auto j = cache_entry(store, key);
  if (!j || !j->contains("layer")) return std::nullopt;
  try {
    image::LayerBlob layer = layer_of((*j)["layer"]);
    if (!store.has_layer(layer.diff_id) || !store.has_blob(layer.digest)) return std::nullopt;
    *created = j->value("created", "");
    return layer;
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

std::string format_seconds(std::chrono::steady_clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

class Printer {
 public:
  explicit Printer(int fd) : out_(fd == 2 ? stderr : stdout) {}
  void line(const std::string& text) {
    std::fprintf(out_, "%s\n", text.c_str());
    std::fflush(out_);
  }

 private:
  std::FILE* out_;
};

// The words of an instruction, substituted; the place is added to errors.
std::vector<std::string> words_of(const image::Containerfile& file, const image::Instruction& in,
                                  const State& state) {
  try {
    if (in.exec_form) {
      std::vector<std::string> out;
      for (const auto& a : in.exec_args)
        out.push_back(image::expand_word(a, state.vars(), file.escape));
      return out;
    }
    return image::expand_words(in.args, state.vars(), file.escape);
  } catch (const image::ContainerfileError&) {
    throw;
  } catch (const Error& e) {
    throw image::ContainerfileError(image::where(file.file, in) + ": " + e.what());
  }
}

std::map<std::string, std::string> build_arg_values(const std::vector<std::string>& given) {
  std::map<std::string, std::string> out;
  for (const auto& entry : given) {
    size_t eq = entry.find('=');
    std::string key = entry.substr(0, eq);
    if (key.empty()) throw Error("--build-arg " + entry + ": expected KEY=VALUE or KEY");
    if (eq != std::string::npos)
      out[key] = entry.substr(eq + 1);
    else if (const char* value = std::getenv(key.c_str()))
      out[key] = value;
  }
  return out;
}

// A user for COPY --chown: numeric, or a name of the image's /etc/passwd
// and /etc/group. Throws Error.
std::pair<uint32_t, uint32_t> chown_ids(const image::Store& store, const State& state,
                                        const std::string& spec, const std::string& what) {
  auto colon = spec.find(':');
  std::string user = spec.substr(0, colon);
  std::string group = colon == std::string::npos ? "" : spec.substr(colon + 1);
  std::vector<std::string> roots;
  auto ids = state.diff_ids();
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) roots.push_back(store.layer_root(*it));
  auto lookup = [&](const std::string& name, const char* file, int* primary) -> uint32_t {
    if (auto n = text::parse_uint(name, UINT32_MAX - 1)) return static_cast<uint32_t>(*n);
    for (const auto& line : text::split(image::read_from_layers(roots, file), '\n')) {
      auto f = text::split(line, ':');
      if (f.size() >= 4 && f[0] == name) {
        if (primary) *primary = static_cast<int>(text::parse_uint(f[3]).value_or(0));
        return static_cast<uint32_t>(text::parse_uint(f[2]).value_or(0));
      }
    }
    throw Error(what + ": --chown=" + spec + ": no " + (primary ? "user" : "group") + " '" + name +
                "' in the image's /" + file);
  };
  int primary = -1;
  uint32_t uid = lookup(user, "etc/passwd", &primary);
  uint32_t gid = group.empty() ? (primary >= 0 ? static_cast<uint32_t>(primary) : uid)
                               : lookup(group, "etc/group", nullptr);
  return {uid, gid};
}

}  // namespace

int build_image(const Options& o) {
  // Everything about the input before anything runs.
  if (o.tag.empty()) throw Error("image build: -t NAME[:TAG] is required");
  const image::Reference ref = image::local_reference(o.tag);
  const std::string context_canonical = files::canonical(o.context, "build context");
  std::string file = o.file;
  if (file.empty()) {
    file = context_canonical + "/Containerfile";
    if (!files::exists(file)) file = context_canonical + "/Dockerfile";
  }
  std::string text;
  if (int err = files::read_into(file, &text)) throw_errno("-f " + file, err);
  const image::Containerfile cf = image::parse_containerfile(text, file);
  const auto given_args = build_arg_values(o.build_args);

  Workspace ws;
  ws.images_dir = chosen_images_dir();
  image::Store store(ws.images_dir);
  ws.store = &store;
  ws.context = context_canonical;
  if (auto ignore = files::try_read(context_canonical + "/.dockerignore"))
    ws.ignore = image::IgnoreRules::parse(*ignore);
  if (!o.policy.empty()) {
    if (int err = files::read_into(o.policy, &ws.policy_text))
      throw_errno("--policy " + o.policy, err);
    ws.policy_source = o.policy;
  }
  const bool scripted = o.quiet || o.output == "json";
  ws.output_fd = scripted ? 2 : 1;
  Printer print(ws.output_fd);
  namespaces::RangeClaim ids;
  if (::geteuid() == 0) {
    ids = namespaces::claim_host_range("", true);
    ws.host_range = ids.range();
  }
  // Prune waits while a build runs: no layer goes from under it.
  UniqueFd working = store.begin_work();

  State state;
  // Global ARGs: their defaults (or --build-arg) for FROM.
  std::map<std::string, std::string> global;
  for (const auto& in : cf.global_args) {
    try {
      auto [name, def] = image::parse_arg(in, global, cf.escape);
      if (given_args.count(name))
        global[name] = given_args.at(name);
      else if (def)
        global[name] = *def;
    } catch (const image::ContainerfileError&) {
      throw;
    } catch (const Error& e) {
      throw image::ContainerfileError(image::where(cf.file, in) + ": " + e.what());
    }
  }

  const size_t total = cf.instructions.size();
  std::string key;
  int cached = 0;
  for (size_t n = 0; n < total; ++n) {
    const image::Instruction& in = cf.instructions[n];
    const std::string what = "step " + std::to_string(n + 1) + "/" + std::to_string(total);
    const std::string place = image::where(cf.file, in);
    auto started = std::chrono::steady_clock::now();

    if (in.name == "FROM") {
      State from_state;
      from_state.args = global;
      auto words = words_of(cf, in, from_state);
      if (!words.empty() && words[0].starts_with("--"))
        throw image::ContainerfileError(place + ": " + words[0] + ": not supported");
      if (words.size() == 3 && text::iequals(words[1], "AS")) words.resize(1);
      if (words.size() != 1)
        throw image::ContainerfileError(place + ": expected FROM IMAGE [AS NAME]");
      print.line("STEP " + std::to_string(n + 1) + "/" + std::to_string(total) + ": FROM " +
                 words[0]);
      if (words[0] == "scratch") {
        key = "scratch";
      } else {
        ensure_image_in(ws.images_dir, words[0], false, "FROM");
        state.base = store.find(words[0]);
        if (!state.base) throw Error(place + ": " + words[0] + ": not in the image store");
        if (int err = files::read_into(store.blob_path(state.base->config_digest),
                                       &state.base_config_json))
          throw_errno("read the config of " + words[0], err);
        key = state.base->config_digest;
      }
      print.line("--> " + (state.base ? state.base->short_id() : std::string("scratch")));
      continue;
    }

    // The instruction as keyed and shown: substituted where Docker does.
    const bool substitutes =
        in.name != "RUN" && in.name != "CMD" && in.name != "ENTRYPOINT" && in.name != "SHELL";
    std::vector<std::string> words;
    if (substitutes && in.name != "ENV" && in.name != "LABEL" && in.name != "ARG")
      words = words_of(cf, in, state);
    std::string shown = in.text();
    if (in.name == "COPY" || in.name == "ADD" || in.name == "WORKDIR" || in.name == "USER" ||
        in.name == "EXPOSE") {
      shown = in.name;
      for (const auto& [k, v] : in.flags) shown += " --" + k + "=" + v;
      for (const auto& w : words) shown += " " + w;
    }
    print.line("STEP " + std::to_string(n + 1) + "/" + std::to_string(total) + ": " + shown);

    std::string extra;
    image::HistoryEntry history;
    history.created_by = shown;
    const bool config_only = in.name != "RUN" && in.name != "COPY" && in.name != "ADD";
    try {
      if (config_only) extra = apply_config(in, words, cf.escape, given_args, global, &state);
    } catch (const image::ContainerfileError&) {
      throw;
    } catch (const Error& e) {
      throw image::ContainerfileError(place + ": " + e.what());
    }
    history.empty_layer = config_only;

    if (history.empty_layer) {
      // Config only: nothing to run, nothing to store but the key's step.
      key = image::step_key(key, shown, extra);
      auto entry = o.no_cache ? std::nullopt : cache_entry(store, key);
      const bool hit = entry.has_value();
      history.created = hit ? entry->value("created", "") : "";
      if (history.created.empty()) history.created = time::format_ns(time::now_ns());
      if (!hit)
        image::cache_store(store, key, json{{"config", true}, {"created", history.created}}.dump());
      state.history.push_back(history);
      if (hit) ++cached;
      print.line(hit ? "--> cached"
                     : "--> done in " + format_seconds(std::chrono::steady_clock::now() - started));
      continue;
    }

    // A layer step: reused from the cache under `key`, or made and cached.
    auto reuse_or_make = [&](const std::function<image::LayerBlob()>& make) {
      if (auto hit = o.no_cache ? std::nullopt : cached_layer(store, key, &history.created)) {
        ++cached;
        print.line("--> cached");
        return *hit;
      }
      image::LayerBlob made = make();
      history.created = time::format_ns(time::now_ns());
      image::cache_store(store, key,
                         json{{"layer", layer_json(made)}, {"created", history.created}}.dump());
      print.line("--> done in " + format_seconds(std::chrono::steady_clock::now() - started));
      return made;
    };
    image::LayerBlob layer;
    if (in.name == "RUN") {
      std::vector<std::string> argv = in.exec_form ? in.exec_args : state.shell;
      if (!in.exec_form) argv.push_back(in.args);
      std::vector<std::string> env = spec::merge_env({}, state.env());
      for (const auto& [k, v] : state.args) extra += k + "=" + v + "\n";
      extra +=
          text::join(env, "\n") + "\nuser=" + state.user() + "\nworkdir=" + state.working_dir();
      key = image::step_key(key, in.text(), extra);
      layer = reuse_or_make([&] {
        image::LayerBlob made;
        int status = run_step(ws, state, argv, what + " (" + in.text() + ")", &made);
        if (status != 0)
          throw Error(what + " (" + in.text() + ") failed: exit status " + std::to_string(status),
                      kStepFailed);
        return made;
      });
    } else {  // COPY, ADD
      if (words.size() < 2)
        throw image::ContainerfileError(place + ": needs a source and a destination");
      std::vector<std::string> sources(words.begin(), words.end() - 1);
      std::string dest = words.back();
      const bool dir_dest = dest.ends_with("/") || sources.size() > 1;
      dest = join_path(state.working_dir(), dest) + (dir_dest ? "/" : "");
      std::optional<mode_t> chmod;
      if (in.flags.count("chmod")) {
        const std::string& m = in.flags.at("chmod");
        char* end = nullptr;
        unsigned long mode = std::strtoul(m.c_str(), &end, 8);
        if (m.empty() || *end != 0 || mode > 07777)
          throw image::ContainerfileError(place + ": --chmod=" + m + ": not an octal mode");
        chmod = static_cast<mode_t>(mode);
      }
      Staged staged;
      try {
        staged = stage_copy(ws, sources, dest, place, in.name == "ADD", chmod);
      } catch (const image::ContainerfileError&) {
        throw;
      } catch (const Error& e) {
        throw image::ContainerfileError(e.what());
      }
      auto remove_staged = [&] { runtime::remove_tree(staged.dir); };
      try {
        uint32_t uid = 0, gid = 0;
        if (in.flags.count("chown"))
          std::tie(uid, gid) = chown_ids(store, state, in.flags.at("chown"), place);
        key = image::step_key(key, shown, staged.digest);
        layer = reuse_or_make([&] { return add_staged_layer(ws, staged.dir, uid, gid, place); });
      } catch (...) {
        remove_staged();
        throw;
      }
      remove_staged();
    }
    state.layers.push_back(layer);
    state.history.push_back(history);
  }

  image::NewImage made;
  made.name = ref.canonical();
  made.base = state.base;
  made.layers = state.layers;
  made.history = state.history;
  made.edits = state.edits;
  made.source = "build " + file;
  // The image is as old as its newest step: a build whose every step is
  // cached makes the same image (the same id) again.
  if (!state.history.empty()) made.created = state.history.back().created;
  if (!state.base && state.layers.empty())
    throw Error("image build: FROM scratch with no layer makes no image");
  image::ImageRecord record = image::put_image(store, made);

  const std::string familiar = ref.familiar();
  if (o.output == "json") {
    std::printf("%s\n", json{{"name", familiar},
                             {"reference", record.name},
                             {"id", record.config_digest},
                             {"digest", record.manifest_digest},
                             {"steps", total},
                             {"cached", cached}}
                            .dump(2)
                            .c_str());
  } else if (o.quiet) {
    std::printf("%s\n", record.config_digest.c_str());
  } else {
    print.line("Built " + familiar + " " + record.config_digest);
  }
  return 0;
}

}  // namespace openshell::cli::build
