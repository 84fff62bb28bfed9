// ProcessGroupSMDDP: torch collectives mapped one to one onto libsmddp's
// non-blocking C calls. Tensors that libsmddp cannot use in place (not
// contiguous, or a list that must be one buffer) are staged through a
// contiguous temporary and copied back when the operation has succeeded.
//
// Completion: each backend owns one completion thread that takes works in
// issue order, waits on their requests with smddp_wait() (bounded by the
// communicator's deadline) and then completes them: copies back, Future, Work.
// A caller of Work::wait() or Work::isCompleted() whose requests are already
// done completes its work itself instead of waiting for the thread to reach
// it, so a pending recv at the head of the queue never holds up a later
// collective. Whichever gets there first claims the completion; it runs once.
#include "backend.hpp"
#include "store_bridge.hpp"

#include <algorithm>
#include <exception>
#include <sstream>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "convert.hpp"

namespace smddp_torch {

using namespace detail;


// ---- WorkSMDDP ---------------------------------------------------------------

WorkSMDDP::WorkSMDDP(int rank, c10d::OpType type, smddp_comm_t comm, uint64_t seq,
                     std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      comm_(comm),
      seq_(seq),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

WorkSMDDP::~WorkSMDDP() {
  for (auto req : requests_) {
    smddp_request_free(req);
  }
}

void WorkSMDDP::complete_once() {
  if (claimed_.exchange(true)) {
    return;
  }
  std::exception_ptr eptr;
  for (size_t i = 0; i < requests_.size() && !eptr; ++i) {
    smddp_status_t st = smddp_test(requests_[i]);
    if (st != SMDDP_OK) {
      std::ostringstream msg;
      msg << "smddp " << c10d::opTypeToString(opType_) << " failed ("
          << smddp_status_string(st) << "): " << comm_error(comm_);
      try {
        throw_backend_error(msg.str());
      } catch (...) {
        eptr = std::current_exception();
      }
    }
  }
  if (!eptr) {
    try {
      for (auto& fn : finalizers_) {
        fn();
      }
    } catch (...) {
      eptr = std::current_exception();
    }
  }
  finalizers_.clear();
  keepalive_.clear();
  try {
    if (eptr) {
      future_->setError(eptr);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  } catch (...) {
    // A Future callback's failure belongs to the callback's own Future.
  }
  finish(eptr);
}

bool WorkSMDDP::requests_done() {
  for (auto req : requests_) {
    if (smddp_test(req) == SMDDP_IN_PROGRESS) {
      return false;
    }
  }
  return true;
}

bool WorkSMDDP::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) {
      return true;
    }
  }
  if (!requests_done()) {
    return false;
  }
  complete_once();
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool WorkSMDDP::wait(std::chrono::milliseconds timeout) {
  const bool bounded = timeout != kNoTimeout;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (auto req : requests_) {
    int64_t wait_ms = SMDDP_WAIT_DEFAULT;
    if (bounded) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      wait_ms = std::max<int64_t>(0, left.count());
    }
    if (smddp_wait(req, wait_ms) == SMDDP_IN_PROGRESS) {
      std::ostringstream msg;
      msg << "smddp " << c10d::opTypeToString(opType_) << " (seq " << seq_
          << ") did not complete within the " << timeout.count()
          << " ms given to wait(); the operation is still running";
      throw_backend_error(msg.str());
    }
  }
  // Every request has finished (or failed): completing is a few copies, so do
  // it here unless the completion thread already has.
  complete_once();
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return completed_; });
  if (exception_) {
    std::rethrow_exception(exception_);
  }
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkSMDDP::getFuture() {
  return future_;
}

std::vector<at::Tensor> WorkSMDDP::result() {
  return outputs_;
}

uint64_t WorkSMDDP::getSequencenumber() const {
  return seq_;
}

// ---- ProcessGroupSMDDP: lifecycle --------------------------------------------

ProcessGroupSMDDP::ProcessGroupSMDDP(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), timeout_(timeout) {
  TORCH_CHECK(store, "smddp: the store is None");
  smddp_store_t table;
  store_bridge_init(store, &table);
  smddp_comm_config_t config = SMDDP_COMM_CONFIG_INIT;
  // torch hands every group its own PrefixStore; "smddp" keeps our keys apart
  // from those of other backends of the same group.
  config.prefix = "smddp";
  config.timeout_ms = timeout.count() > 0 ? timeout.count() : -1;
  smddp_status_t st = smddp_comm_create(&table, rank, size, &config, &comm_);
  if (st != SMDDP_OK) {
    std::ostringstream msg;
    msg << "smddp: creating the communicator (rank " << rank << " of " << size
        << ") failed (" << smddp_status_string(st) << "): " << issue_error(nullptr);
    throw_backend_error(msg.str());
  }
  completion_thread_ = std::thread([this] { completion_loop(); });
}

ProcessGroupSMDDP::~ProcessGroupSMDDP() {
  shutdown();
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupSMDDP::getBackendOptions() {
  return c10::make_intrusive<Options>("smddp", timeout_);
}

void ProcessGroupSMDDP::completion_loop() {
  for (;;) {
    c10::intrusive_ptr<WorkSMDDP> work;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) {
        return;
      }
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    for (auto req : work->requests_) {
      // Bounded by the communicator's deadline: on expiry libsmddp fails the
      // request and aborts the communicator, so this never hangs.
      (void)smddp_wait(req, SMDDP_WAIT_DEFAULT);
    }
    work->complete_once();
  }
}

void ProcessGroupSMDDP::stop_completion_thread() {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (completion_thread_.joinable()) {
    completion_thread_.join();
  }
}

void ProcessGroupSMDDP::abort() {
  if (comm_ != nullptr) {
    (void)smddp_comm_abort(comm_);
  }
}

void ProcessGroupSMDDP::shutdown() {
  std::call_once(shutdown_once_, [this] {
    stop_completion_thread();
    if (comm_ != nullptr) {
      (void)smddp_comm_destroy(comm_);
      comm_ = nullptr;
    }
  });
}

// ---- ProcessGroupSMDDP: helpers -----------------------------------------------

c10::intrusive_ptr<WorkSMDDP> ProcessGroupSMDDP::new_work(c10d::OpType type,
                                                          std::vector<at::Tensor> outputs) {
  TORCH_CHECK(comm_ != nullptr, "smddp: the process group has been shut down");
  return c10::make_intrusive<WorkSMDDP>(rank_, type, comm_, ++seq_, std::move(outputs));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::enqueue(
    const c10::intrusive_ptr<WorkSMDDP>& work) {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.push_back(work);
  }
  queue_cv_.notify_one();
  return work;
}

void ProcessGroupSMDDP::fail_issue(const char* fn, smddp_status_t st,
                                   const c10::intrusive_ptr<WorkSMDDP>& work) {
  std::ostringstream msg;
  msg << "smddp " << fn << " failed (" << smddp_status_string(st) << "): " << issue_error(comm_);
  // Requests already issued still use this work's buffers: let them finish.
  for (auto req : work->requests_) {
    (void)smddp_wait(req, SMDDP_WAIT_DEFAULT);
  }
  throw_backend_error(msg.str());
}

void ProcessGroupSMDDP::check_status(const char* fn, smddp_status_t st,
                                     const c10::intrusive_ptr<WorkSMDDP>& work) {
  if (st != SMDDP_OK) {
    fail_issue(fn, st, work);
  }
}

// Returns a contiguous tensor with t's values that libsmddp may use; when t
// itself is not contiguous, a copy that is written back into t on success if
// copy_back is set.
static at::Tensor stage(const at::Tensor& t, bool copy_back, std::vector<at::Tensor>& keepalive,
                        std::vector<std::function<void()>>& finalizers) {
  if (t.is_contiguous()) {
    keepalive.push_back(t);
    return t;
  }
  at::Tensor c = t.contiguous();
  keepalive.push_back(c);
  if (copy_back) {
    at::Tensor dst = t;
    finalizers.emplace_back([dst, c]() mutable { dst.copy_(c); });
  }
  return c;
}

at::Tensor ProcessGroupSMDDP::stage_in(WorkSMDDP& work, const at::Tensor& t) {
  return stage(t, false, work.keepalive_, work.finalizers_);
}

at::Tensor ProcessGroupSMDDP::stage_inout(WorkSMDDP& work, const at::Tensor& t) {
  return stage(t, true, work.keepalive_, work.finalizers_);
}

void ProcessGroupSMDDP::keep(WorkSMDDP& work, const at::Tensor& t) {
  work.keepalive_.push_back(t);
}

void ProcessGroupSMDDP::then(WorkSMDDP& work, std::function<void()> fn) {
  work.finalizers_.push_back(std::move(fn));
}

void ProcessGroupSMDDP::add_request(WorkSMDDP& work, smddp_request_t req) {
  work.requests_.push_back(req);
}


c10::intrusive_ptr<c10d::Backend> create_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size, int64_t timeout_ms) {
  return c10::make_intrusive<ProcessGroupSMDDP>(store, rank, size,
                                                std::chrono::milliseconds(timeout_ms));
}

} // namespace smddp_torch
