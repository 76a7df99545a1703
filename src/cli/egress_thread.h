// The egress proxy and DNS stub of a one-shot sandbox (openshell run, the
// RUN steps of image build), served on a thread of this process for as long
// as the sandbox runs.
#pragma once

#include <memory>

#include "base/logfile.h"
#include "policy/policy.h"
#include "runtime/container.h"
#include "runtime/spec.h"

namespace openshell::egress::tls {
class SandboxCa;
}

namespace openshell::cli {

class EgressThread {
 public:
  // network_log: open already (see open_network_log in run_command.cc), or
  // null. ca: the sandbox's CA, for the endpoints the proxy inspects
  // (egress::Proxy::Options::ca), or null; it must outlive this thread.
  EgressThread(runtime::Container& container, const runtime::ContainerSpec& spec,
               const policy::Policy& policy, std::unique_ptr<logfile::RotatingFile> network_log,
               egress::tls::SandboxCa* ca = nullptr);
  ~EgressThread();
  EgressThread(const EgressThread&) = delete;
  EgressThread& operator=(const EgressThread&) = delete;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace openshell::cli
