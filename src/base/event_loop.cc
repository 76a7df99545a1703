#include "base/event_loop.h"

#include <exception>

#include "base/log.h"

namespace openshell {

size_t run_handling_exceptions(boost::asio::io_context& io, const std::string& what) {
  size_t thrown = 0;
  for (;;) {
    try {
      io.run();  // may be called again after a handler threw, without restart()
      return thrown;
    } catch (const std::exception& e) {
      ++thrown;
      log::error(what + ": " + e.what() + " (dropped what it was doing; serving on)");
    } catch (...) {
      ++thrown;
      log::error(what + ": an unknown exception (dropped what it was doing; serving on)");
    }
  }
}

}  // namespace openshell
