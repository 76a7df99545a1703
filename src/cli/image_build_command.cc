// `openshell image build`: its options and help.
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/image_build.h"

namespace openshell::cli {

void add_image_build_command(CLI::App* images, Action* action) {
  auto o = std::make_shared<build::Options>();
  CLI::App* c = images->add_subcommand(
      "build", "Build an image from a Containerfile (Dockerfile), with no daemon");
  c->add_option("-f,--file", o->file,
                "The Containerfile (default: CONTEXT/Containerfile, else CONTEXT/Dockerfile)")
      ->type_name("FILE");
  c->add_option("-t,--tag", o->tag,
                "The image's name: NAME[:TAG] (localhost/NAME without a registry)")
      ->required();
  c->add_option("--build-arg", o->build_args,
                "Set an ARG: KEY=VALUE, or KEY for the caller's value (repeatable)")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  c->add_flag("--no-cache", o->no_cache, "Run every step, reusing nothing from earlier builds");
  c->add_option("--policy", o->policy,
                "Policy file (TOML) for every RUN: with network_policies, RUN reaches what they "
                "allow through an egress proxy; without it, RUN has no network at all")
      ->type_name("FILE");
  c->add_flag("-q,--quiet", o->quiet, "Print only the image's id (steps and output go to stderr)");
  c->add_option("-o,--output", o->output, "Output format: table or json (json: steps go to stderr)")
      ->check(CLI::IsMember({"table", "json"}));
  c->add_option("context", o->context, "The build context: the directory COPY and ADD read")
      ->capture_default_str();
  c->footer(
      "Each RUN runs in a one-shot sandbox on the image so far, as root of its user namespace "
      "with the capabilities package managers need there and none outside it; what it changes "
      "becomes one layer. COPY and ADD read only the build context (.dockerignore honoured). "
      "Steps are cached by their parent and their text (COPY: the content copied); "
      "image prune clears the cache.\n"
      "Exit status: 0 built, 1 a step failed, 125 bad input or any other failure.\n"
      "Examples:\n"
      "  openshell image build -t tools:1 .\n"
      "  openshell image build -f Containerfile.dev -t dev --build-arg VERSION=2 ./src\n"
      "  openshell image build -t app --policy apt-mirror.toml .\n"
      "See openshell-image(1).");
  c->callback([o, action] { *action = [o] { return build::build_image(*o); }; });
}

}  // namespace openshell::cli
