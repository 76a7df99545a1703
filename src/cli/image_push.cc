// openshell image push IMAGE [REF].
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/text.h"
#include "cli/commands.h"
#include "cli/images.h"
#include "image/push.h"
#include "image/reference.h"
#include "image/store.h"

namespace openshell::cli {

namespace {

using nlohmann::json;

// One line per blob on stderr: redrawn while it is sent on a terminal,
// written once when done otherwise.
class PushDisplay : public image::PushProgress {
 public:
  explicit PushDisplay(bool quiet) : quiet_(quiet), tty_(::isatty(2) == 1) {}

  void start(const std::string& image, size_t blobs, uint64_t bytes) override {
    if (quiet_) return;
    std::fprintf(stderr, "Pushing %s: %zu blobs (%s)\n", image.c_str(), blobs,
                 text::format_bytes(bytes).c_str());
  }
  void advance(size_t, uint64_t bytes) override {
    if (quiet_ || !tty_) return;
    auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    std::fprintf(stderr, "\r  sending  %s\033[K", text::format_bytes(bytes).c_str());
  }
  void blob_done(size_t, const std::string& digest, uint64_t size,
                 const std::string& how) override {
    if (quiet_) return;
    std::fprintf(stderr, "%s  %s  %-8s %s\n", tty_ ? "\r\033[K" : "", digest.substr(7, 12).c_str(),
                 how.c_str(), text::format_bytes(size).c_str());
  }

 private:
  bool quiet_, tty_;
  std::chrono::steady_clock::time_point last_{};
};

json blob_json(const image::PushResult::Blob& b) {
  return {{"digest", b.digest}, {"size", b.size}, {"action", b.how}};
}

}  // namespace

void add_image_push_command(CLI::App* images, Action* action) {
  struct Flags {
    std::string image, ref, output = "table";
    bool insecure = false, quiet = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* c = images->add_subcommand("push", "Push a store image to a registry");
  c->add_option("image", flags->image, "The image in the store: a name, an id or a digest")
      ->required();
  c->add_option("reference", flags->ref,
                "Where to: REGISTRY/NAME[:TAG] (default: the image's own name)");
  c->add_flag("--insecure", flags->insecure,
              "Plain HTTP to this registry (localhost registries use it anyway)");
  c->add_flag("-q,--quiet", flags->quiet, "No progress; print only the manifest's digest");
  c->add_option("-o,--output", flags->output, "Output format: table or json")
      ->check(CLI::IsMember({"table", "json"}));
  c->footer(
      "Sends the layer blobs as the store keeps them (their digests do not change), then the "
      "config and the manifest. A blob the repository has is skipped; one another repository of "
      "the same registry has (where the image was pulled from or pushed to before) is mounted "
      "from there, not uploaded. Anonymous bearer tokens only.\nExamples:\n"
      "  openshell image push localhost/agent:1 localhost:5000/tools/agent:1\n"
      "  openshell image push localhost:5000/tools/agent:1 -o json\n"
      "See openshell-image(1).");
  c->callback([flags, action] {
    *action = [flags] {
      image::Store store(chosen_images_dir());
      auto record = store.find(flags->image);
      if (!record) throw Error("image push: " + flags->image + ": not in the store");
      const image::Reference dest =
          image::parse_reference(flags->ref.empty() ? record->name : flags->ref);
      PushDisplay display(flags->quiet || flags->output == "json");
      image::PushOptions options;
      options.insecure = flags->insecure;
      options.progress = &display;
      image::PushResult result = image::push(store, *record, dest, options);
      if (flags->output == "json") {
        json layers = json::array();
        for (const auto& l : result.layers) layers.push_back(blob_json(l));
        json out = {{"reference", result.reference},
                    {"digest", result.manifest_digest},
                    {"config", blob_json(result.config)},
                    {"layers", layers}};
        std::printf("%s\n", out.dump(2).c_str());
      } else if (flags->quiet) {
        std::printf("%s\n", result.manifest_digest.c_str());
      } else {
        std::printf("%s  %s\n", dest.familiar().c_str(), result.manifest_digest.c_str());
      }
      return 0;
    };
  });
}

}  // namespace openshell::cli
