// Log capture: the main process's stdout and stderr into the persisted log.
#include <array>
#include <memory>

#include "base/time.h"
#include "protocol/exec_stream.h"
#include "supervisor/owner.h"

namespace openshell::supervisor {

void Supervisor::read_output(asio::posix::stream_descriptor& stream, const std::string& name) {
  auto buffer = std::make_shared<std::array<char, 16384>>();
  stream.async_read_some(asio::buffer(*buffer), [this, &stream, name, buffer](
                                                    const boost::system::error_code& ec, size_t n) {
    if (ec) {
      log_->flush_partial(name, time::now_ns());
      if (--streams_open_ <= 0) console_.output_done();
      maybe_exit();
      return;
    }
    const std::string_view bytes(buffer->data(), n);
    log_->write(name, bytes, time::now_ns());
    console_.output(name == "stderr" ? protocol::exec::kStderr : protocol::exec::kStdout, bytes);
    read_output(stream, name);
  });
}

}  // namespace openshell::supervisor
