// A --vm sandbox's lifecycle (docs/vm.md): the VM started in place of a
// container, the guest's status stream read into the sandbox's phases, its
// egress connections handed to the proxy, its end recorded as a
// container's is.
#include <memory>

#include "base/error.h"
#include "base/log.h"
#include "base/time.h"
#include "net/http.h"
#include "protocol/exec_stream.h"
#include "supervisor/guest_exec.h"
#include "supervisor/guest_vm.h"
#include "supervisor/owner.h"
#include "vm/layout.h"

namespace openshell::supervisor {

void Supervisor::start_vm() {
  console_.set_refusal(
      "connect is not for a micro-VM yet: its main process runs on the guest's console; "
      "'openshell sandbox exec -t " +
      launch_.sandbox_name + " -- sh' gives a terminal");
  GuestVm::Events events;
  events.ready = [this](pid_t guest_pid) {
    log::debug("the guest's main process runs as pid " + std::to_string(guest_pid));
    vm_ready_ = true;
    if (state_ == State::kRunning) report_status();
  };
  events.main_exited = [this](int status) { guest_status_ = status; };
  events.failed = [this](int code, std::string why) { guest_failure_ = {code, std::move(why)}; };
  events.accepted = [this](uint32_t host_port, UniqueFd fd) {
    guest_connection(host_port, std::move(fd));
  };
  events.output = [this](const std::string& stream, std::string_view bytes) {
    log_->write(stream, bytes, time::now_ns());
  };
  events.ended = [this](int vmm_status, std::string last_line) {
    log_->flush_partial("stdout", time::now_ns());
    log_->flush_partial("stderr", time::now_ns());
    vm_ended(vmm_status, last_line);
  };
  vm_ = std::make_unique<GuestVm>(io_, std::move(events));
  try {
    const GuestVmPlan plan = prepare_guest_vm(spec_, container_spec_,
                                              paths_.sandbox(launch_.sandbox_id), paths_.images());
    vm_->start(plan);
  } catch (const Error& e) {
    vm_.reset();
    fail_start(e.exit_code(), e.what());
    return;
  }
  start_vm_egress();
}

void Supervisor::start_copy_vm() {
  GuestVm::Events events;
  events.ready = [this](pid_t) {
    vm_ready_ = true;
    copy_ready("ready");
  };
  events.main_exited = [](int) {};
  events.failed = [this](int, std::string why) { copy_ready("error " + why); };
  // No network: a guest's connection to the proxy's ports is closed.
  events.accepted = [](uint32_t, UniqueFd) {};
  // The console is not the sandbox's log; the VMM's complaints go to the
  // supervisor's own.
  events.output = [](const std::string& stream, std::string_view bytes) {
    if (stream == "stderr") log::warn("copy VMM: " + std::string(bytes));
  };
  events.ended = [this](int vmm_status, std::string last_line) {
    state_ = State::kEnded;
    if (!vm_ready_) {
      if (last_line.rfind("openshell: ", 0) == 0) last_line.erase(0, 11);
      copy_ready("error the VM ended before its init reported (" +
                 (last_line.empty() ? "the VMM exited with status " + std::to_string(vmm_status)
                                    : last_line) +
                 ")");
    }
    copy_container_gone();
  };
  vm_ = std::make_unique<GuestVm>(io_, std::move(events));
  vm_->start(prepare_guest_vm(spec_, container_spec_, paths_.sandbox(launch_.sandbox_id),
                              paths_.images()));
}

// An exec in the guest: a connection to its init's exec port, then the
// frames of runtime/guest_init.h (GuestExec).
void Supervisor::start_guest_exec(std::shared_ptr<net::WebSocket> ws) {
  const uint64_t id = next_exec_++;
  auto refuse = [ws](const std::string& why) {
    ws->send(protocol::encode(protocol::exec::Failure{exit_code::kFailure, why}), false);
    ws->close();
  };
  if (state_ != State::kRunning || !vm_ || !vm_->running())
    return refuse("sandbox '" + launch_.sandbox_name + "' is not running");
  // A copy supervisor serves one copy, and only one.
  if (copy_ && id > 1) return ws->close();
  if (copy_) ++open_execs_;
  vm_->connect(
      vm::layout::kGuestInitPort, [this, ws, id, refuse](UniqueFd fd, const std::string& error) {
        if (!fd) {
          refuse("exec: the guest's init cannot be reached: " + error);
          return exec_closed();
        }
        ExecDefaults defaults{container_spec_.env,
                              container_spec_.fs.workdir,
                              [this](const std::string& user) { return exec_user(user); },
                              {}};
        if (copy_)
          defaults.refuse = [this](const std::vector<std::string>& argv, bool tty) {
            return copy_refusal(argv, tty);
          };
        auto session = std::make_shared<GuestExec>(io_, ws, std::move(fd), std::move(defaults), id);
        guest_execs_[id] = session;
        session->start([this](uint64_t done) {
          guest_execs_.erase(done);
          exec_closed();
        });
      });
}

void Supervisor::vm_ended(int vmm_status, const std::string& last_line) {
  state_ = State::kEnded;
  if (stopped_) {
    reason_ = "Stopped";
    message_ = "stopped";
    exit_code_ = guest_status_.value_or(128 + 9);
  } else if (guest_failure_) {
    exit_code_ = guest_failure_->first;
    reason_ = "MainProcessFailed";
    message_ = guest_failure_->second;
  } else if (guest_status_) {
    exit_code_ = *guest_status_;
    reason_ = exit_code_ == 0 ? "MainProcessCompleted" : "MainProcessFailed";
    if (exit_code_ != 0)
      message_ = "the main process exited with status " + std::to_string(exit_code_);
  } else {
    // The guest ended before its init said how the main process did: a
    // kernel that did not boot, a triple fault, a VMM that was killed.
    std::string why = last_line;
    if (why.rfind("openshell: ", 0) == 0) why.erase(0, 11);
    exit_code_ = exit_code::kFailure;
    reason_ = "VmFailed";
    message_ = "the VM ended before its init reported (" +
               (why.empty() ? "the VMM exited with status " + std::to_string(vmm_status) : why) +
               ")";
    log_->write("stderr", "openshell: " + message_ + "\n", time::now_ns());
  }
  for (auto& [id, session] : std::map(guest_execs_)) session->sandbox_gone();
  write_exit_file();
  finish_soon();
}

}  // namespace openshell::supervisor
