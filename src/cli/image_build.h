// `openshell image build`: a Containerfile built into the image store by
// this process alone, each RUN in a one-shot sandbox of ours
// (docs/images.md, Building images).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "image/compose.h"
#include "image/containerfile.h"
#include "image/dockerignore.h"
#include "image/store.h"
#include "namespaces/userns.h"

namespace openshell::cli::build {

// A step that failed: exit status 1 (bad input and the rest: 125).
inline constexpr int kStepFailed = 1;

struct Options {
  std::string file;  // -f; "" = CONTEXT/Containerfile, else CONTEXT/Dockerfile
  std::string tag;   // -t NAME[:TAG]
  std::string context = ".";
  std::vector<std::string> build_args;  // K=V
  bool no_cache = false;
  std::string policy;  // TOML: network for RUN
  bool quiet = false;
  std::string output = "table";
};

// The state of the image being built: its base, the layers made so far and
// the config edits, with the variables substitution sees.
struct State {
  std::optional<image::ImageRecord> base;
  std::string base_config_json;  // the base's OCI config ("" for scratch)
  std::vector<image::LayerBlob> layers;
  std::vector<image::HistoryEntry> history;
  image::ConfigEdits edits;
  std::map<std::string, std::string> args;  // ARG values in effect
  std::vector<std::string> shell = {"/bin/sh", "-c"};
  bool cmd_set = false;  // CMD given in this file (ENTRYPOINT clears the base's otherwise)

  // The config as RUN sees it: the base's with the edits so far.
  std::vector<std::string> env() const;
  std::string user() const;
  std::string working_dir() const;
  std::vector<std::string> diff_ids() const;  // all, bottom first
  // What substitution sees: the ARGs, then the environment over them.
  std::map<std::string, std::string> vars() const;
};

// Where one build's files go; what RUN and COPY need of their caller.
struct Workspace {
  const image::Store* store = nullptr;
  std::string images_dir;
  std::string context;  // canonical
  image::IgnoreRules ignore;
  std::string policy_text;  // --policy's contents ("" none)
  std::string policy_source;
  int output_fd = 1;                                // where RUN's output goes
  std::optional<namespaces::HostRange> host_range;  // as root
};

// A config instruction (any but FROM, RUN, COPY and ADD), applied to
// *state. words: its arguments, substituted (WORKDIR, USER, EXPOSE).
// given_args: --build-arg; global: the ARGs before FROM. Returns what
// decides its result beyond its text (the values it sets), for its cache
// key. Throws Error (without the place: the caller adds it).
std::string apply_config(const image::Instruction& in, const std::vector<std::string>& words,
                         char escape, const std::map<std::string, std::string>& given_args,
                         const std::map<std::string, std::string>& global, State* state);

// path against dir (the working directory so far), normalized.
std::string join_path(const std::string& dir, const std::string& path);

// A layer as the step cache's entries and the user namespace's layer
// writer carry it. layer_of throws nlohmann::json::exception when a field
// is missing or of the wrong type.
nlohmann::json layer_json(const image::LayerBlob& layer);
image::LayerBlob layer_of(const nlohmann::json& j);

// A RUN: runs it over the state's layers and adds its layer; returns the
// command's exit status (0: *layer is set).
int run_step(const Workspace& ws, const State& state, const std::vector<std::string>& argv,
             const std::string& what, image::LayerBlob* layer);

// A COPY or ADD's sources, staged in a fresh directory under the store's
// tmp/: `dest` resolved against the working directory. Returns the staged
// directory (removed by the caller) and sets *digest to the content's
// digest. Throws Error for a source outside the context.
struct Staged {
  std::string dir;     // tmp/... holding the tree to become the layer
  std::string digest;  // names, types, modes, link targets, bytes
};
// chmod: --chmod's mode for everything copied.
Staged stage_copy(const Workspace& ws, const std::vector<std::string>& sources,
                  const std::string& dest, const std::string& what, bool add,
                  std::optional<mode_t> chmod = std::nullopt);

// Writes a staged directory (owned by this process's uid and gid) as a
// layer in the store, its files owned by uid:gid in the layer.
image::LayerBlob add_staged_layer(const Workspace& ws, const std::string& staged, uint32_t uid,
                                  uint32_t gid, const std::string& what);

// Builds; returns the exit status. Throws Error (125) for bad input.
int build_image(const Options& options);

}  // namespace openshell::cli::build
