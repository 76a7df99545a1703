#include "base/event_loop.h"

#include <stdexcept>

#include <boost/asio/post.hpp>
#include <gtest/gtest.h>

namespace openshell {
namespace {

namespace asio = boost::asio;

TEST(RunHandlingExceptions, AThrowingHandlerEndsOnlyItselfAndTheLoopGoesOn) {
  asio::io_context io;
  int ran = 0;
  asio::post(io, [&] { ++ran; });
  asio::post(io, [] { throw std::runtime_error("bad input from a sandbox"); });
  asio::post(io, [&] {
    ++ran;
    asio::post(io, [] { throw 42; });  // not even a std::exception
    asio::post(io, [&] { ++ran; });
  });
  testing::internal::CaptureStderr();
  size_t thrown = run_handling_exceptions(io, "test loop");
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(thrown, 2u);
  EXPECT_EQ(ran, 3);
  EXPECT_NE(err.find("test loop: bad input from a sandbox"), std::string::npos) << err;
  EXPECT_TRUE(io.stopped()) << "returns once the work is done";
}

TEST(RunHandlingExceptions, ReturnsAtOnceWhenStopped) {
  asio::io_context io;
  int ran = 0;
  asio::post(io, [&] {
    ++ran;
    io.stop();
  });
  asio::post(io, [&] { ++ran; });
  EXPECT_EQ(run_handling_exceptions(io, "test loop"), 0u);
  EXPECT_EQ(ran, 1);
}

}  // namespace
}  // namespace openshell
