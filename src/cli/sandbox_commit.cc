// openshell sandbox commit NAME IMAGE[:TAG], and the gateway's hidden
// helper that writes a rootless sandbox's layer from inside its id map.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"
#include "image/layer_writer.h"

namespace openshell::cli {

using nlohmann::json;

void add_sandbox_commit(CLI::App* sandbox, Action* action) {
  {
    auto name = std::make_shared<std::string>();
    auto image = std::make_shared<std::string>();
    auto message = std::make_shared<std::string>();
    auto output = std::make_shared<std::string>("table");
    CLI::App* c = sandbox->add_subcommand(
        "commit", "Store a sandbox's changes (its root and /sandbox) as a new image");
    c->add_option("name", *name, "The sandbox")->required();
    c->add_option("image", *image, "The new image: NAME[:TAG] (no registry: localhost/NAME)")
        ->required();
    c->add_option("-m,--message", *message, "A comment for the new layer's history entry");
    add_output(c, output.get());
    c->footer(
        "The new image is the sandbox's image plus one layer: what the sandbox wrote, including "
        "its workspace /sandbox, and what it deleted (as whiteouts). It lands in the gateway's "
        "image store. A running sandbox is frozen (freezer cgroup) while its layer is read, and "
        "thawed after; a gateway that cannot freeze it (rootless) asks to stop it first.\n"
        "Examples:\n"
        "  openshell sandbox commit agent agent-snapshot:1 -m 'tools installed'\n"
        "  openshell sandbox create --from agent-snapshot:1 --name agent2\n"
        "See openshell-sandbox(1).");
    c->callback([name, image, message, output, action] {
      *action = [name, image, message, output] {
        GatewayClient client;
        json body = {{"image", *image}, {"message", *message}};
        json r = client.call("POST", target(*name, "commit"), body.dump());
        if (*output == "json") {
          std::printf("%s\n", r.dump(2).c_str());
        } else {
          std::printf("%s  %s  (layer %s, %s)\n", r.value("image", "").c_str(),
                      r.value("id", "").substr(7, 12).c_str(),
                      r["layer"].value("digest", "").substr(7, 12).c_str(),
                      r.value("frozen", false) ? "frozen while read" : "stopped");
        }
        return 0;
      };
    });
  }
  {
    // The gateway runs this, in a rootless sandbox's id map: the layer to stdout.
    auto dir = std::make_shared<std::string>();
    CLI::App* c = sandbox->add_subcommand("__write-layer", "");
    c->group("");  // hidden
    c->add_option("dir", *dir, "")->required();
    c->callback([dir, action] {
      *action = [dir] {
        if (::isatty(1))
          throw Error("sandbox __write-layer: writes a gzip layer: not to a terminal");
        image::write_layer({{*dir, ""}}, 1, {}, "layer of " + *dir);
        return 0;
      };
    });
  }
}

}  // namespace openshell::cli
