// sandbox connect's pieces that need no sandbox: the detach keys as typed,
// and the console's replay, which keeps exactly the latest 1 MiB.
#include "supervisor/console.h"

#include <utility>

#include <boost/asio.hpp>
#include <gtest/gtest.h>

#include "base/error.h"
#include "cli/connect.h"
#include "protocol/attach_stream.h"
#include "protocol/exec_stream.h"

namespace openshell {
namespace {

TEST(DetachKeys, ParsesDockersSpelling) {
  EXPECT_EQ(cli::parse_detach_keys("ctrl-p,ctrl-q"), std::string("\x10\x11"));
  EXPECT_EQ(cli::parse_detach_keys("ctrl-A,x"), std::string("\x01x"));
  EXPECT_EQ(cli::parse_detach_keys("ctrl-@,ctrl-[,ctrl-_"), std::string("\0\x1b\x1f", 3));
  EXPECT_THROW(cli::parse_detach_keys("ctrl-1"), Error);
  EXPECT_THROW(cli::parse_detach_keys("ab"), Error);
  EXPECT_THROW(cli::parse_detach_keys("ctrl-p,"), Error);
  try {
    cli::parse_detach_keys("ctrl-p,,x");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "--detach-keys ctrl-p,,x: '' is neither one character nor ctrl-X (e.g. "
                 "ctrl-p,ctrl-q)");
  }
}

TEST(DetachKeys, AreFoundAcrossReadsAndABrokenSequenceIsPassedOn) {
  cli::DetachMatcher m(std::string("\x10\x11"));
  bool detached = false;
  EXPECT_EQ(m.feed("ab\x10", &detached), "ab");  // held: it may begin the keys
  EXPECT_FALSE(detached);
  EXPECT_EQ(m.feed("c", &detached),
            "\x10"
            "c");  // broken off: passed on as typed
  EXPECT_FALSE(detached);
  EXPECT_EQ(m.feed("\x10\x10", &detached), "\x10");  // the second may begin it again
  EXPECT_EQ(m.feed("\x11rest", &detached), "");
  EXPECT_TRUE(detached);
  cli::DetachMatcher none{std::string()};
  EXPECT_EQ(none.feed("\x10\x11", &detached), "\x10\x11");
  EXPECT_FALSE(detached);
}

TEST(Console, KeepsExactlyTheLatestMebibyteForReplay) {
  boost::asio::io_context io;
  supervisor::Console console(io, [] {});
  std::string all;
  for (int i = 0; all.size() < 3 * protocol::attach::kReplayBytes; ++i) {
    std::string chunk = std::to_string(i) + std::string(1000 + i % 7, 'x') + "\n";
    console.output(i % 2 ? protocol::exec::kStderr : protocol::exec::kStdout, chunk);
    all += chunk;
  }
  EXPECT_EQ(console.kept_bytes(), protocol::attach::kReplayBytes);
  EXPECT_EQ(console.kept(), all.substr(all.size() - protocol::attach::kReplayBytes));
  console.output(protocol::exec::kStdout, "");  // nothing kept for nothing
  EXPECT_EQ(console.kept_bytes(), protocol::attach::kReplayBytes);
}

}  // namespace
}  // namespace openshell
