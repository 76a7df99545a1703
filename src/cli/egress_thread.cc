#include "cli/egress_thread.h"

#include <signal.h>

#include <utility>

#include <boost/asio.hpp>

#include "base/event_loop.h"
#include "base/log.h"
#include "egress/identity.h"
#include "egress/proxy.h"
#include "supervisor/network_rules.h"

namespace openshell::cli {

namespace asio = boost::asio;

class EgressThread::Impl {
 public:
  // network_log: open already (see open_network_log), or null.
  Impl(runtime::Container& container, const runtime::ContainerSpec& spec,
       const policy::Policy& policy, std::unique_ptr<logfile::RotatingFile> network_log,
       egress::tls::SandboxCa* ca)
      : log_(std::move(network_log)) {
    egress::Proxy::Options options;
    options.ca = ca;
    options.sandbox = spec.hostname;
    options.init_pid = container.pid();
    options.audit = [this](const std::string& line) {
      if (log_)
        log_->append(line + "\n");
      else
        log::debug(line);
    };
    proxy_ = std::make_unique<egress::Proxy>(io_, options);
    const pid_t init = container.pid();
    proxy_->set_rules(std::make_shared<egress::NetworkRules>(supervisor::network_rules(
        policy,
        [init](const std::string& path) { return egress::resolve_in_sandbox(init, path); })));
    proxy_->serve(container.take_proxy_listener(), container.take_dns_socket(),
                  container.take_diag_socket(), container.take_connect_listener());
    work_.emplace(io_.get_executor());
    // The thread takes no signals: they are the terminal loop's to read.
    sigset_t all, saved;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &saved);
    // What the sandbox sends is served here: nothing it sends may end this
    // process (and with it the run) from this thread.
    thread_ = std::thread([this] { run_handling_exceptions(io_, "egress proxy"); });
    ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  }
  ~Impl() {
    asio::post(io_, [this] {
      proxy_->close();
      work_.reset();
      io_.stop();
    });
    thread_.join();
  }

 private:
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::unique_ptr<egress::Proxy> proxy_;
  std::unique_ptr<logfile::RotatingFile> log_;
  std::thread thread_;
};

EgressThread::EgressThread(runtime::Container& container, const runtime::ContainerSpec& spec,
                           const policy::Policy& policy,
                           std::unique_ptr<logfile::RotatingFile> network_log,
                           egress::tls::SandboxCa* ca)
    : impl_(std::make_unique<Impl>(container, spec, policy, std::move(network_log), ca)) {}

EgressThread::~EgressThread() = default;

}  // namespace openshell::cli
