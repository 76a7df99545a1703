// The sandbox's egress proxy and DNS stub, and the network part of its policy.
#include <memory>
#include <vector>

#include "base/log.h"
#include "egress/credentials.h"
#include "egress/identity.h"
#include "egress/proxy.h"
#include "egress/rules.h"
#include "policy/policy.h"
#include "supervisor/guest_vm.h"
#include "supervisor/network_rules.h"
#include "supervisor/owner.h"

namespace openshell::supervisor {

// The sandbox's egress proxy and DNS stub, with the network part of its policy.
void Supervisor::start_egress() {
  network_log_ = std::make_unique<logfile::RotatingFile>(paths_.sandbox(launch_.sandbox_id) +
                                                         "/logs/network.log");
  egress::Proxy::Options options;
  options.sandbox = launch_.sandbox_name;
  options.init_pid = container_->pid();
  options.audit = [this](const std::string& line) { audit(line); };
  options.ca = ca_.get();
  proxy_ = std::make_unique<egress::Proxy>(io_, options);
  apply_policy(spec_.policy, launch_.policy_revision);
  apply_credentials();
  proxy_->serve(container_->take_proxy_listener(), container_->take_dns_socket(),
                container_->take_diag_socket(), container_->take_connect_listener());
}

// A VM's guest has no network device: its init relays each connection to
// the proxy and each DNS query over vsock, and the VMM hands them to us.
void Supervisor::start_vm_egress() {
  network_log_ = std::make_unique<logfile::RotatingFile>(paths_.sandbox(launch_.sandbox_id) +
                                                         "/logs/network.log");
  egress::Proxy::Options options;
  options.sandbox = launch_.sandbox_name;
  options.audit = [this](const std::string& line) { audit(line); };
  proxy_ = std::make_unique<egress::Proxy>(io_, options);
  apply_policy(spec_.policy, launch_.policy_revision);
  apply_credentials();
}

void Supervisor::guest_connection(uint32_t host_port, UniqueFd fd) {
  if (proxy_) serve_guest_port(*proxy_, host_port, std::move(fd));
}

void Supervisor::apply_policy(const std::string& text, int64_t revision) {
  policy::Policy policy = text.empty() ? policy::default_policy() : policy::parse(text, "policy");
  // Binary paths are resolved as the sandbox's processes see their root: a
  // container's through its init's /proc root, a guest's in its image (the
  // host cannot look into a running guest).
  egress::NetworkRules::PathResolver resolve;
  if (container_) {
    const pid_t init = container_->pid();
    resolve = [init](const std::string& path) { return egress::resolve_in_sandbox(init, path); };
  } else if (spec_.vm) {
    resolve = guest_path_resolver(spec_, paths_.images());
  }
  auto rules = std::make_shared<egress::NetworkRules>(network_rules(policy, resolve));
  proxy_->set_rules(std::move(rules), revision);
  log::debug("network policy revision " + std::to_string(revision) + " applied");
}

void Supervisor::apply_credentials() {
  if (!proxy_) return;
  std::vector<egress::Credential> credentials;
  for (const auto& c : credentials_) credentials.push_back({c.key, c.value, c.endpoints});
  try {
    proxy_->set_credentials(std::move(credentials));
  } catch (const std::exception& e) {
    // The gateway checks what it stores; a set that is still refused here
    // leaves none filled in, so that every placeholder is refused.
    log::error(std::string("the providers' credentials are not usable: ") + e.what());
    proxy_->set_credentials({});
  }
}

void Supervisor::audit(const std::string& line) {
  if (network_log_) network_log_->append(line + "\n");
}

}  // namespace openshell::supervisor
