// openshell doctor check [-o json].
#include <cstdio>
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/doctor.h"

namespace openshell::cli {

void add_doctor_command(CLI::App& app, Action* action) {
  CLI::App* doctor = app.add_subcommand("doctor", "Check that this host can run sandboxes");
  doctor->require_subcommand(1);
  auto output = std::make_shared<std::string>("table");
  CLI::App* c = doctor->add_subcommand(
      "check",
      "One line per check, ✓ or ✗ with its fix: kernel, namespaces, ids, cgroups, "
      "Landlock, seccomp, overlayfs, micro-VMs, directories, gateway, default image");
  c->add_option("-o,--output", *output, "Output format: table or json")
      ->check(CLI::IsMember({"table", "json"}));
  c->footer(
      "Exits 1 when something 'sandbox create' needs is missing; checks marked (optional) "
      "only limit what sandboxes get. See openshell-doctor(1).");
  c->callback([output, action] {
    *action = [output] {
      const auto checks = doctor::run_all(doctor::Roots::from_environment());
      const bool ok = doctor::all_required_ok(checks);
      if (*output == "json") {
        std::printf("%s\n", doctor::to_json(checks).c_str());
      } else {
        for (const auto& check : checks) std::printf("%s\n", doctor::format_line(check).c_str());
        std::printf("%s\n", ok ? "sandbox create has what it needs here"
                               : "sandbox create cannot work here until the ✗ above without "
                                 "(optional) are fixed");
      }
      return ok ? 0 : 1;  // as status: a state of the host, not openshell failing
    };
  });
}

}  // namespace openshell::cli
