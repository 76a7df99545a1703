#include "gateway/background.h"

#include <boost/asio/post.hpp>

#include "base/error.h"
#include "base/log.h"

namespace openshell::gateway {

Background::~Background() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void Background::run(std::function<void()> job, std::function<void()> done) {
  {
    std::lock_guard lock(mutex_);
    jobs_.emplace_back(std::move(job), std::move(done));
    if (jobs_.size() > free_ && threads_.size() < kThreads) {
      threads_.emplace_back([this] { loop(); });
      ++free_;
    }
  }
  wake_.notify_one();
}

void Background::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and nothing left
    auto [job, done] = std::move(jobs_.front());
    jobs_.pop_front();
    --free_;
    lock.unlock();
    try {
      job();
    } catch (const std::exception& e) {
      log::error(e.what());
    }
    boost::asio::post(io_, std::move(done));
    lock.lock();
    ++free_;
  }
}

}  // namespace openshell::gateway
