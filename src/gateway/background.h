// Work the gateway hands to threads of its own: what waits on the disk (a
// deleted sandbox's directory, its cgroups), so that the gateway's one
// thread goes on answering while it is done.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

namespace openshell::gateway {

class Background {
 public:
  explicit Background(boost::asio::io_context& io) : io_(io) {}
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  // Finishes the jobs queued, then its threads end; their `done`s are left
  // on an io_context that no longer runs (what they record is made good by
  // the next gateway's reconciliation).
  ~Background();

  // Runs `job` on one of up to kThreads threads, started as jobs queue up
  // with none free, then `done` on the io_context. Jobs start in the order
  // given, and several may run at once: each must stand alone (a delete's
  // removal touches only its own sandbox's files). A job catches its own
  // errors: one that escapes is logged.
  void run(std::function<void()> job, std::function<void()> done);

 private:
  void loop();

  boost::asio::io_context& io_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<std::function<void()>, std::function<void()>>> jobs_;
  bool stopping_ = false;
  // A removal waits on the disk far longer than it computes (ext4 mounted
  // with discard trims every freed extent before unlink returns): four at
  // once made a delete --all of 1000 sandboxes 0.6-1.2 s faster here than
  // one; sixteen were no faster than four.
  static constexpr size_t kThreads = 4;
  size_t free_ = 0;  // threads started and not running a job
  std::vector<std::thread> threads_;
};

}  // namespace openshell::gateway
