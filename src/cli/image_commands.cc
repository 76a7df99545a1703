// openshell image pull|import|list|inspect|rm|prune (push: image_push.cc).
#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <utility>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/paths.h"
#include "base/text.h"
#include "base/time.h"
#include "cli/base_image.h"
#include "cli/commands.h"
#include "cli/gateway_client.h"
#include "cli/gateway_registry.h"
#include "cli/images.h"
#include "cli/table.h"
#include "image/build_cache.h"
#include "image/pull.h"
#include "image/store.h"

namespace openshell::cli {

using nlohmann::json;

// The store of the gateway commands talk to: this OPENSHELL_HOME's, or,
// for another gateway on this host (its socket, or a loopback address), the
// one it says it keeps.
// A remote gateway's store is on its own host: the image commands refuse.
std::string chosen_images_dir() {
  GatewayChoice choice = chosen_gateway();
  if (choice.local_default()) return Paths::resolve().images();
  if (choice.remote())
    throw Error("image: " + choice.describe() +
                " is remote: its image store is on its own host, out of this machine's reach "
                "(run the image command there, or push the image to a registry it pulls from)");
  GatewayClient client(choice, false);
  const std::string state = client.call("GET", "/v1/gateway").value("state_dir", "");
  if (state.empty()) throw Error(choice.describe() + " did not say where its state is");
  return Paths{state, ""}.images();
}

namespace {

image::Store open_store() { return image::Store(chosen_images_dir()); }

// A pull's or import's progress: one line redrawn on a terminal, a line at
// the start and at the end otherwise.
class ProgressDisplay : public image::Progress {
 public:
  ProgressDisplay(std::string verb, bool quiet)
      : verb_(std::move(verb)), quiet_(quiet), tty_(::isatty(2) == 1) {}

  void start(const std::string& image, size_t layers, size_t missing, uint64_t bytes) override {
    image_ = image;
    layers_ = layers;
    missing_ = missing;
    total_ = bytes;
    began_ = std::chrono::steady_clock::now();
    if (quiet_) return;
    if (missing == 0) {
      std::fprintf(stderr, "%s %s: all %zu layers already stored\n", verb_.c_str(), image.c_str(),
                   layers);
    } else if (!tty_) {
      std::fprintf(stderr, "%s %s: %zu of %zu layers to %s (%s)\n", verb_.c_str(), image.c_str(),
                   missing, layers, verb_ == "Importing" ? "unpack" : "fetch",
                   text::format_bytes(bytes).c_str());
    } else {
      draw(true);
    }
  }

  void advance(uint64_t bytes) override {
    done_ = bytes;
    draw(false);
  }

  void layer_done(const std::string& diff_id, uint64_t size) override {
    ++stored_;
    if (!quiet_ && !tty_)
      std::fprintf(stderr, "  layer %s stored (%s)\n", diff_id.substr(7, 12).c_str(),
                   text::format_bytes(size).c_str());
    draw(true);
  }

  void finish() override {
    if (quiet_ || missing_ == 0) return;
    if (tty_) {
      draw(true);
      std::fputc('\n', stderr);
    }
  }

 private:
  void draw(bool force) {
    if (quiet_ || !tty_ || missing_ == 0) return;
    auto now = std::chrono::steady_clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    winsize ws{};
    int columns = ::ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
    double seconds = std::chrono::duration<double>(now - began_).count();
    double fraction = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 0;
    if (fraction > 1) fraction = 1;
    std::string rate =
        seconds > 0.2 ? text::format_bytes(static_cast<uint64_t>(done_ / seconds)) + "/s" : "";
    std::string tail = " " + text::format_bytes(done_) + " / " + text::format_bytes(total_) + "  " +
                       std::to_string(stored_) + "/" + std::to_string(missing_) + " layers  " +
                       rate;
    std::string head = verb_ + " " + image_ + " ";
    int bar = columns - static_cast<int>(head.size() + tail.size()) - 3;
    if (bar > 40) bar = 40;
    std::string line = head;
    if (bar >= 10) {
      int filled = static_cast<int>(fraction * bar);
      line += "[" + std::string(filled, '#') + std::string(bar - filled, '.') + "]";
    }
    line += tail;
    if (static_cast<int>(line.size()) > columns - 1) line.resize(columns - 1);
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
  }

  std::string verb_;
  bool quiet_;
  bool tty_;
  std::string image_;
  size_t layers_ = 0, missing_ = 0, stored_ = 0;
  uint64_t total_ = 0, done_ = 0;
  std::chrono::steady_clock::time_point began_, last_;
};

std::string stored_age(const std::string& rfc3339) {
  auto then = time::parse(rfc3339);
  return then ? time::long_age((time::now_ns() - *then) / 1000000000) : "-";
}

json record_json(const image::Store& store, const image::ImageRecord& r) {
  json layers = json::array();
  for (size_t i = 0; i < r.diff_ids.size(); ++i)
    layers.push_back({{"diff_id", r.diff_ids[i]},
                      {"size", i < r.layer_sizes.size() ? r.layer_sizes[i] : 0},
                      {"path", store.layer_root(r.diff_ids[i])}});
  const image::ImageConfig& c = r.config;
  std::string platform = c.os + "/" + c.architecture + (c.variant.empty() ? "" : "/" + c.variant);
  return {{"name", image::parse_reference(r.name).familiar()},
          {"reference", r.name},
          {"id", r.config_digest},
          {"digest", r.manifest_digest},
          {"created", c.created},
          {"stored_at", r.stored_at},
          {"source", r.source},
          {"platform", platform},
          {"size", r.size()},
          {"config",
           {{"env", c.env},
            {"entrypoint", c.entrypoint},
            {"cmd", c.cmd},
            {"working_dir", c.working_dir},
            {"user", c.user}}},
          {"layers", layers}};
}

struct PullFlags {
  bool insecure = false;
  std::string platform;
  bool quiet = false;
  std::string output = "table";
  std::string max_unpacked;  // --max-unpacked-size
};

// --max-unpacked-size in bytes; 0 when not given.
uint64_t max_unpacked_of(const PullFlags& flags) {
  if (flags.max_unpacked.empty()) return 0;
  auto bytes = text::parse_size(flags.max_unpacked);
  if (!bytes || *bytes == 0)
    throw Error("--max-unpacked-size " + flags.max_unpacked + ": not a size (like 512M or 20G)");
  return *bytes;
}

void add_max_unpacked_option(CLI::App* c, PullFlags* flags) {
  c->add_option("--max-unpacked-size", flags->max_unpacked,
                "The most the image may unpack to, like 2G (default: OPENSHELL_MAX_UNPACKED, else "
                "the smaller of 32G and 90% of the store's free space)");
}

std::optional<image::Platform> platform_of(const std::string& text) {
  if (text.empty()) return std::nullopt;
  return image::parse_platform(text);
}

image::ImageRecord do_pull(const std::string& text, const PullFlags& flags,
                           const std::string& images_dir) {
  image::Reference ref = image::parse_reference(text);
  image::Store store(images_dir);
  ProgressDisplay display("Pulling", flags.quiet);
  image::PullOptions options;
  options.insecure = flags.insecure;
  options.platform = platform_of(flags.platform);
  options.progress = &display;
  options.max_unpacked = max_unpacked_of(flags);
  return image::pull(store, ref, options);
}

void report_stored(const image::Store& store, const image::ImageRecord& record,
                   const PullFlags& flags) {
  if (flags.output == "json") {
    std::printf("%s\n", record_json(store, record).dump(2).c_str());
    return;
  }
  if (flags.quiet) {
    std::printf("%s\n", record.config_digest.c_str());
    return;
  }
  std::printf("%s  %s  %s\n", image::parse_reference(record.name).familiar().c_str(),
              record.short_id().c_str(), text::format_bytes(record.size()).c_str());
}

}  // namespace

void ensure_image(const std::string& from, bool insecure, const std::string& option) {
  ensure_image_in(Paths::resolve().images(), from, insecure, option);
}

void ensure_image_in(const std::string& images_dir, const std::string& from, bool insecure,
                     const std::string& option) {
  image::Store store(images_dir);
  if (store.find(from)) return;
  // The default image is built here, never fetched from a registry.
  if (from == "base" || from == "base:latest") {
    base_image::Plan plan = base_image::plan(base_image::this_host(""));
    if (!plan.ok()) throw Error(plan.problem + " (or choose another image with " + option + ")");
    base_image::build(plan, images_dir, "base");
    return;
  }
  PullFlags flags;
  flags.insecure = insecure;
  do_pull(from, flags, images_dir);
}

void add_image_commands(CLI::App& app, Action* action) {
  CLI::App* images =
      app.add_subcommand("image", "Pull, import, build, push, list and remove images");
  images->require_subcommand(1);
  add_image_build_command(images, action);
  add_image_push_command(images, action);

  {
    auto flags = std::make_shared<PullFlags>();
    auto ref = std::make_shared<std::string>();
    CLI::App* c = images->add_subcommand("pull", "Pull an image from a registry into the store");
    c->add_option("reference", *ref, "The image: NAME[:TAG] or NAME@DIGEST")->required();
    c->add_flag("--insecure", flags->insecure,
                "Plain HTTP to this registry (localhost registries use it anyway)");
    c->add_option("--platform", flags->platform,
                  "OS/ARCH[/VARIANT] to pull (default: this machine's)");
    add_max_unpacked_option(c, flags.get());
    c->add_flag("-q,--quiet", flags->quiet, "No progress; print only the image's id");
    c->add_option("-o,--output", flags->output, "Output format: table or json")
        ->check(CLI::IsMember({"table", "json"}));
    c->footer(
        "Speaks the OCI distribution API (anonymous bearer tokens), picks this machine's platform "
        "from an index, verifies every digest and resumes broken transfers.\nExamples:\n"
        "  openshell image pull busybox\n  openshell image pull localhost:5000/tools/agent:1.2\n"
        "See openshell-image(1).");
    c->callback([flags, ref, action] {
      *action = [flags, ref] {
        const std::string images_dir = chosen_images_dir();
        image::ImageRecord record = do_pull(*ref, *flags, images_dir);
        report_stored(image::Store(images_dir), record, *flags);
        return 0;
      };
    });
  }

  {
    auto flags = std::make_shared<PullFlags>();
    auto file = std::make_shared<std::string>();
    auto name = std::make_shared<std::string>();
    CLI::App* c =
        images->add_subcommand("import", "Import an OCI image layout or a docker save archive");
    c->add_option(
         "file", *file,
         "A tar archive (OCI layout or docker save; may be compressed) or an OCI layout directory")
        ->required();
    c->add_option("name", *name, "What to call it (default: the name the archive gives)");
    c->add_option("--platform", flags->platform,
                  "OS/ARCH[/VARIANT] to import from a multi-platform layout");
    add_max_unpacked_option(c, flags.get());
    c->add_flag("-q,--quiet", flags->quiet, "No progress; print only the image's id");
    c->add_option("-o,--output", flags->output, "Output format: table or json")
        ->check(CLI::IsMember({"table", "json"}));
    c->footer(
        "A NAME without a registry is stored as localhost/NAME.\nExamples:\n"
        "  skopeo copy docker://busybox oci-archive:busybox.tar && openshell image import "
        "busybox.tar busybox\n"
        "  docker save app:1 | gzip > app.tgz && openshell image import app.tgz\n"
        "See openshell-image(1).");
    c->callback([flags, file, name, action] {
      *action = [flags, file, name] {
        image::Store store = open_store();
        ProgressDisplay display("Importing", flags->quiet);
        image::ImportOptions options;
        options.name = *name;
        options.platform = platform_of(flags->platform);
        options.progress = &display;
        options.max_unpacked = max_unpacked_of(*flags);
        image::ImageRecord record = image::import_image(store, *file, options);
        report_stored(store, record, *flags);
        return 0;
      };
    });
  }

  {
    auto output = std::make_shared<std::string>("table");
    auto quiet = std::make_shared<bool>(false);
    CLI::App* c = images->add_subcommand("list", "List the images in the store");
    c->alias("ls");
    c->add_option("-o,--output", *output, "Output format: table or json")
        ->check(CLI::IsMember({"table", "json"}))
        ->capture_default_str();
    c->add_flag("-q,--quiet", *quiet, "Only names");
    c->callback([output, quiet, action] {
      *action = [output, quiet] {
        image::Store store = open_store();
        auto records = store.list();
        if (*output == "json") {
          json list = json::array();
          for (const auto& r : records) list.push_back(record_json(store, r));
          std::printf("%s\n", list.dump(2).c_str());
          return 0;
        }
        if (*quiet) {
          for (const auto& r : records)
            std::printf("%s\n", image::parse_reference(r.name).familiar().c_str());
          return 0;
        }
        std::vector<std::vector<std::string>> rows = {{"NAME", "ID", "CREATED", "SIZE", "LAYERS"}};
        for (const auto& r : records)
          rows.push_back({image::parse_reference(r.name).familiar(), r.short_id(),
                          stored_age(r.config.created), text::format_bytes(r.size()),
                          std::to_string(r.diff_ids.size())});
        print_table(rows);
        return 0;
      };
    });
  }

  {
    auto refs = std::make_shared<std::vector<std::string>>();
    CLI::App* c = images->add_subcommand("inspect", "Show images as JSON: config, layers, digests");
    c->add_option("reference", *refs, "Images: names, ids or id prefixes")->required();
    c->callback([refs, action] {
      *action = [refs] {
        image::Store store = open_store();
        json list = json::array();
        for (const auto& ref : *refs) {
          auto record = store.find(ref);
          if (!record) throw Error("image " + ref + ": not in the image store");
          list.push_back(record_json(store, *record));
        }
        std::printf("%s\n", (list.size() == 1 ? list[0] : list).dump(2).c_str());
        return 0;
      };
    });
  }

  {
    auto refs = std::make_shared<std::vector<std::string>>();
    CLI::App* c = images->add_subcommand("rm", "Remove image names (their layers go with prune)");
    c->alias("remove");
    c->add_option("reference", *refs, "Images: names, or ids (all names of that image)")
        ->required();
    c->footer(
        "Sandboxes made from an image keep working: their layers stay until they are deleted.");
    c->callback([refs, action] {
      *action = [refs] {
        image::Store store = open_store();
        int status = 0;
        for (const auto& ref : *refs) {
          try {
            for (const auto& r : store.remove(ref))
              std::printf("Untagged %s\n", image::parse_reference(r.name).familiar().c_str());
          } catch (const Error& e) {
            log::error(e.what());
            status = exit_code::kFailure;
          }
        }
        return status;
      };
    });
  }

  {
    auto mirror = std::make_shared<std::string>();
    auto force = std::make_shared<bool>(false);
    CLI::App* c = images->add_subcommand(
        "build-base", "Build the default image base now, from this host's package mirror");
    c->add_option("--mirror", *mirror,
                  "The Debian mirror to build from (default: the one this host's apt sources "
                  "name)")
        ->type_name("URL");
    c->add_flag("--force", *force, "Build it even when the store has it");
    auto output = std::make_shared<std::string>();
    c->add_option("--output", *output,
                  "Write it to this file, an OCI image layout tar archive, instead of the store")
        ->type_name("FILE");
    c->footer(
        "As root with debootstrap, as an ordinary user with mmdebstrap --mode=unshare. The "
        "first 'sandbox create' or 'run --image base' does the same when base is missing.");
    c->callback([mirror, force, output, action] {
      *action = [mirror, force, output] {
        base_image::Plan plan = base_image::plan(base_image::this_host(*mirror));
        if (!output->empty()) {
          base_image::build(plan, "", "base", *output);
          return 0;
        }
        const std::string dir = chosen_images_dir();
        if (!*force && image::Store(dir).find("base")) {
          std::fprintf(stderr, "image base is already in the store (--force builds it again)\n");
          return 0;
        }
        base_image::build(plan, dir, "base");
        return 0;
      };
    });
  }

  {
    auto output = std::make_shared<std::string>("table");
    CLI::App* c = images->add_subcommand(
        "prune", "Remove layers, blobs and micro-VM disks no image or sandbox uses");
    c->add_option("-o,--output", *output, "Output format: table or json")
        ->check(CLI::IsMember({"table", "json"}));
    c->callback([output, action] {
      *action = [output] {
        image::Store store = open_store();
        auto result = store.prune();
        // The build cache goes too: its steps are worth nothing without
        // the layers only it kept (image build makes them again).
        if (files::exists(image::cache_dir(store))) files::remove_tree(image::cache_dir(store));
        if (*output == "json") {
          std::printf("%s\n", json{{"layers", result.layers},
                                   {"blobs", result.blobs},
                                   {"vm_disks", result.vm_disks},
                                   {"bytes", result.bytes}}
                                  .dump(2)
                                  .c_str());
        } else {
          const std::string disks =
              result.vm_disks == 0
                  ? ""
                  : " and " + std::to_string(result.vm_disks) +
                        (result.vm_disks == 1 ? " micro-VM disk" : " micro-VM disks");
          std::printf("Removed %d layers and %d blobs%s, %s freed\n", result.layers, result.blobs,
                      disks.c_str(), text::format_bytes(result.bytes).c_str());
        }
        return 0;
      };
    });
  }
}

}  // namespace openshell::cli
