// Running an io_context that serves untrusted peers (a sandbox's proxy and
// DNS stub, the gateway's clients).
#pragma once

#include <string>
#include <utility>

#include <boost/asio/io_context.hpp>

namespace openshell {

// io.run() until it runs out of work or is stopped. An exception out of a
// handler ends that handler only: it is logged (as "WHAT: ...") and the loop
// goes on. The handler's objects go with it, so a connection whose handler
// threw is closed once nothing else holds it, and the other connections
// are not disturbed. Returns how many handlers threw.
size_t run_handling_exceptions(boost::asio::io_context& io, const std::string& what);

}  // namespace openshell
