// The cache of `image build`: what each step made, keyed by what it was
// made from, so that a rebuild reuses a step instead of running it again.
//
// A step's key is the SHA-256 of its parent's key (the first step's parent
// is the FROM image's id, or "scratch"), the instruction's text after
// variable substitution, and what else decides its result: for RUN, the
// environment it runs with (ENV and ARG values); for COPY and ADD, a digest
// of what they copy (names, types, modes, link targets and bytes). Equal
// keys mean the same result, so a changed COPY source changes the key of
// its step and of every step after it.
//
// Entries live in the image store: images/build-cache/<key hex>.json, each
// the image's state after that step (its layers, config and history),
// written atomically. An entry whose layers the store no longer has is a
// miss. `image prune` removes the cache with the layers only it kept.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace openshell::image {

class Store;

// "sha256:..." of parent, text and extra (each length-prefixed, so that no
// two different triples give the same bytes).
std::string step_key(std::string_view parent, std::string_view text, std::string_view extra);

// The state after a step, as JSON text (the build's own format: layers,
// sizes, config, history).
std::optional<std::string> cache_lookup(const Store& store, const std::string& key);
void cache_store(const Store& store, const std::string& key, const std::string& state_json);

// The cache's directory in the store.
std::string cache_dir(const Store& store);

}  // namespace openshell::image
