#include "supervisor/run_vm.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>

#include <boost/asio.hpp>

#include "base/error.h"
#include "base/event_loop.h"
#include "base/files.h"
#include "base/log.h"
#include "egress/proxy.h"
#include "policy/policy.h"
#include "supervisor/guest_vm.h"
#include "supervisor/network_rules.h"

namespace openshell::supervisor {

namespace {

// The run's own directory, for the layer and the initramfs; removed with it.
struct RunDir {
  std::string path;
  RunDir() {
    const char* tmp = ::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/openshell-vm.XXXXXX";
    if (!::mkdtemp(pattern.data())) throw_errno("mkdtemp " + pattern);
    path = pattern;
  }
  ~RunDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

int run_vm(const SandboxSpec& spec, const runtime::ContainerSpec& container,
           const std::string& images_dir, int grace_ms) {
  RunDir dir;
  const GuestVmPlan plan = prepare_guest_vm(spec, container, dir.path, images_dir);

  asio::io_context io;
  std::optional<int> status;
  std::optional<std::pair<int, std::string>> failure;
  std::unique_ptr<egress::Proxy> proxy;
  std::string vm_end;
  GuestVm::Events events;
  events.main_exited = [&](int s) { status = s; };
  events.failed = [&](int code, std::string why) { failure = {code, std::move(why)}; };
  events.output = [](const std::string& stream, std::string_view bytes) {
    // A closed terminal: the guest's output goes nowhere.
    (void)files::write_all(stream == "stdout" ? 1 : 2, bytes);
  };
  events.accepted = [&](uint32_t host_port, UniqueFd fd) {
    if (proxy) serve_guest_port(*proxy, host_port, std::move(fd));
  };
  events.ended = [&](int vmm_status, std::string last_line) {
    if (last_line.empty()) last_line = "the VMM exited with status " + std::to_string(vmm_status);
    vm_end = last_line;
    io.stop();
  };
  GuestVm vm(io, std::move(events));

  if (container.egress) {
    const policy::Policy policy =
        spec.policy.empty() ? policy::default_policy() : policy::parse(spec.policy, "policy");
    egress::Proxy::Options options;
    options.sandbox = "run";
    proxy = std::make_unique<egress::Proxy>(io, options);
    proxy->set_rules(std::make_shared<egress::NetworkRules>(
        network_rules(policy, guest_path_resolver(spec, images_dir))));
  }
  asio::signal_set signals(io, SIGINT, SIGTERM);
  std::function<void(const boost::system::error_code&, int)> on_signal =
      [&](const boost::system::error_code& ec, int) {
        if (ec) return;
        vm.stop(grace_ms);
        signals.async_wait(on_signal);
      };
  signals.async_wait(on_signal);
  vm.start(plan);
  run_handling_exceptions(io, "run --vm");
  if (failure) {
    log::error(failure->second);
    return failure->first;
  }
  if (status) return *status;
  // The VMM says why in its own last line, already on our stderr.
  if (vm_end.rfind("openshell: ", 0) != 0)
    log::error("the VM ended before its init reported (" + vm_end + ")");
  return exit_code::kFailure;
}

}  // namespace openshell::supervisor
