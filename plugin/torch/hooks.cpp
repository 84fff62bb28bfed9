// CompletionHooks (backend.hpp): the thread that delivers a group's
// completion hook calls in the order works completed, off the completing
// thread, and every queued one before it stops.
#include "backend.hpp"

#include <exception>
#include <thread>
#include <utility>

#include <c10/util/Logging.h>

namespace smddp_torch {

CompletionHooks::CompletionHooks(std::function<void(std::shared_ptr<c10d::WorkInfo>)> hook)
    : hook_(std::move(hook)), thread_([this] { run(); }) {}

CompletionHooks::~CompletionHooks() {
  close();
}

void CompletionHooks::post(std::shared_ptr<c10d::WorkInfo> info) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closing_) {
      return;
    }
    queue_.push_back(std::move(info));
  }
  cv_.notify_one();
}

void CompletionHooks::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
    thread_.join();
  }
}

void CompletionHooks::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) {
      return;  // closing, and everything queued was delivered
    }
    auto info = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    try {
      hook_(std::move(info));
    } catch (const std::exception& e) {
      LOG(WARNING) << "smddp: a completion hook raised: " << e.what();
    } catch (...) {
      LOG(WARNING) << "smddp: a completion hook raised";
    }
    lock.lock();
  }
}

}  // namespace smddp_torch
