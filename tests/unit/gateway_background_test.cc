#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <gtest/gtest.h>

#include "gateway/background.h"

namespace openshell::gateway {
namespace {

namespace asio = boost::asio;

TEST(GatewayBackground, EveryJobRunsOnceOffTheCallersThreadAndDoneOnTheIoContext) {
  asio::io_context io;
  const auto caller = std::this_thread::get_id();
  std::mutex mutex;
  std::vector<int> ran;
  std::vector<int> done;
  std::vector<std::thread::id> job_threads, done_threads;
  {
    Background background(io);
    for (int i = 0; i < 50; ++i)
      background.run(
          [&, i] {
            std::lock_guard lock(mutex);
            ran.push_back(i);
            job_threads.push_back(std::this_thread::get_id());
          },
          [&, i] {
            done.push_back(i);
            done_threads.push_back(std::this_thread::get_id());
          });
    // Nothing is done until the io_context runs the `done`s. (An io_context
    // with no work would stop at once; the gateway's always has its acceptor.)
    auto work = asio::make_work_guard(io);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (done.size() < 50 && std::chrono::steady_clock::now() < give_up)
      io.run_one_for(std::chrono::seconds(1));
  }
  // Several run at once: each once, in whatever order they end.
  std::vector<int> in_order;
  for (int i = 0; i < 50; ++i) in_order.push_back(i);
  std::sort(ran.begin(), ran.end());
  std::sort(done.begin(), done.end());
  EXPECT_EQ(ran, in_order);
  EXPECT_EQ(done, in_order);
  for (auto id : job_threads) EXPECT_NE(id, caller);
  for (auto id : done_threads) EXPECT_EQ(id, caller);
}

// Jobs that wait (as a removal waits on the disk) do not wait one behind
// another, and no more than four threads are started however many queue.
TEST(GatewayBackground, UpToFourJobsRunAtOnce) {
  asio::io_context io;
  std::mutex mutex;
  std::condition_variable changed;
  int running = 0, most = 0, finished = 0;
  bool release = false;
  std::set<std::thread::id> threads;
  {
    Background background(io);
    for (int i = 0; i < 12; ++i)
      background.run(
          [&] {
            std::unique_lock lock(mutex);
            threads.insert(std::this_thread::get_id());
            most = std::max(most, ++running);
            changed.notify_all();
            // Each waits to be let go, or for 10 s should that never come.
            changed.wait_for(lock, std::chrono::seconds(10), [&] { return release; });
            --running;
            ++finished;
          },
          [] {});
    std::unique_lock lock(mutex);
    // Four at once, or a failure after 10 s (one thread would show 1).
    changed.wait_for(lock, std::chrono::seconds(10), [&] { return running == 4; });
    EXPECT_EQ(running, 4);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a fifth would start now
    EXPECT_EQ(running, 4);
    release = true;
    changed.notify_all();
  }
  EXPECT_EQ(finished, 12);
  EXPECT_EQ(most, 4);
  EXPECT_EQ(threads.size(), 4u);
  io.run();
}

TEST(GatewayBackground, ItsEndFinishesTheJobsQueuedAndLeavesTheirDoneUnrun) {
  asio::io_context io;
  std::atomic<int> ran{0};
  int done = 0;
  {
    Background background(io);
    for (int i = 0; i < 20; ++i)
      background.run(
          [&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            ++ran;
          },
          [&] { ++done; });
  }
  EXPECT_EQ(ran.load(), 20);  // none dropped
  EXPECT_EQ(done, 0);         // the io_context never ran
  io.run();                   // what was posted is still there, and harmless
  EXPECT_EQ(done, 20);
}

TEST(GatewayBackground, AJobThatThrowsIsLoggedAndTheNextOnesStillRun) {
  asio::io_context io;
  int done = 0;
  bool later_ran = false;
  {
    Background background(io);
    background.run([] { throw std::runtime_error("remove /nowhere: No such file"); },
                   [&] { ++done; });
    background.run([&] { later_ran = true; }, [&] { ++done; });
  }
  io.run();
  EXPECT_TRUE(later_ran);
  EXPECT_EQ(done, 2);  // a failed job's `done` runs too: its caller is told it ended
}

}  // namespace
}  // namespace openshell::gateway
