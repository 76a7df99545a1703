// Work the gateway hands to a thread of its own: what waits on the disk
// (a deleted sandbox's directory, its cgroups), so that the gateway's one
// thread goes on answering while it is done.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include <boost/asio/io_context.hpp>

namespace openshell::gateway {

class Background {
 public:
  explicit Background(boost::asio::io_context& io) : io_(io) {}
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  // Finishes the jobs queued, then its thread ends; their `done`s are left
  // on an io_context that no longer runs (what they record is made good by
  // the next gateway's reconciliation).
  ~Background();

  // Runs `job` on the thread (started with the first), one job at a time in
  // the order given, then `done` on the io_context. A job catches its own
  // errors: one that escapes is logged.
  void run(std::function<void()> job, std::function<void()> done);

 private:
  void loop();

  boost::asio::io_context& io_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<std::function<void()>, std::function<void()>>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace openshell::gateway
