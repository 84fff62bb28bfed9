// ProcessGroupSMDDP: torch collectives mapped one to one onto libsmddp's
// non-blocking C calls. Tensors that libsmddp cannot use in place (not
// contiguous, or a list that must be one buffer) are staged through a
// contiguous temporary and copied back when the operation has succeeded.
//
// Completion (see WorkSMDDP in backend.hpp) is driven by libsmddp's
// completion callbacks: no thread of ours sits between an operation finishing
// and its Future completing.
#include "backend.hpp"
#include "store_bridge.hpp"

#include <algorithm>
#include <exception>
#include <sstream>
#include <thread>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "convert.hpp"

namespace smddp_torch {

using namespace detail;


// ---- WorkSMDDP ---------------------------------------------------------------

// The CUDA device of a work's outputs, if any: its Future then carries that
// device, so that waiting on it orders the waiter's stream after the work.
static std::optional<c10::Device> cuda_device(const std::vector<at::Tensor>& outputs) {
  for (const auto& t : outputs) {
    if (t.defined() && t.is_cuda()) {
      return t.device();
    }
  }
  return std::nullopt;
}

WorkSMDDP::WorkSMDDP(int rank, c10d::OpType type, c10::weak_intrusive_ptr<c10d::Backend> backend,
                     smddp_comm_t comm, uint64_t seq, std::vector<at::Tensor> outputs)
    // Without a RecordFunction callback (no profiler) the title would only
    // cost torch an inactive RecordFunction per work. Asked as torch's own
    // RECORD_FUNCTION asks (a thread-local read; at::hasCallbacks() takes a
    // global lock), for the scope of the RecordFunction that Work makes.
    : c10d::Work(rank, type,
                 at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE)
                     ? profiling_title(type)
                     : nullptr),
      comm_(comm),
      backend_(std::move(backend)), seq_(seq), outputs_(std::move(outputs)) {
  if (auto dev = cuda_device(outputs_)) {
    stream_ = c10::impl::getDeviceGuardImpl(dev->type())->getStream(*dev);
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(),
                                                       std::vector<c10::Device>{*dev});
  }
}

namespace {
// Holds a work's group, when it is still alive, while the work waits on its
// requests, so that shutdown() does not destroy the communicator meanwhile.
class GroupHold {
 public:
  explicit GroupHold(const c10::weak_intrusive_ptr<c10d::Backend>& backend)
      : group_(backend.lock()) {
    if (group_) {
      use_.emplace(*static_cast<ProcessGroupSMDDP*>(group_.get()),
                   ProcessGroupSMDDP::InUse::kWait);
    }
  }

 private:
  c10::intrusive_ptr<c10d::Backend> group_;
  std::optional<ProcessGroupSMDDP::InUse> use_;  // released before group_
};
}  // namespace

WorkSMDDP::~WorkSMDDP() {
  // A work dropped before it was fully issued (an issue call failed, or a
  // check threw after some requests went out) never completes: let what it
  // issued finish before its buffers go.
  if (!completed_) {
    GroupHold hold(backend_);
    for (auto req : requests_) {
      (void)smddp_wait(req, SMDDP_WAIT_DEFAULT);
    }
  }
  for (auto req : requests_) {
    smddp_request_free(req);
  }
}

void WorkSMDDP::on_request_done(void* arg, smddp_status_t status) {
  auto* work = static_cast<WorkSMDDP*>(arg);
  if (status != SMDDP_OK) {
    if (auto backend = work->backend_.lock()) {
      // The work's backend is always this group's (new_work).
      static_cast<ProcessGroupSMDDP*>(backend.get())->run_abort_hooks();
    }
    auto backend = work->backend_.lock();
    std::string msg = op_failure(work->opType_, backend.get(), work->comm_, status);
    std::lock_guard<std::mutex> lock(work->error_mutex_);
    if (work->error_.empty()) {
      work->error_ = std::move(msg);
    }
  }
  work->release_pending();
}

void WorkSMDDP::release_pending() {
  if (pending_.fetch_sub(1) == 1) {
    complete();
  }
}

namespace {
// How many works this thread is completing (running their Future's callbacks).
thread_local int completing_here = 0;
}  // namespace

void WorkSMDDP::complete() {
  // Keeps this work alive to the end of the function, then lets it go.
  auto self = std::move(self_);
  if (issued_at_ != std::chrono::steady_clock::time_point{}) {
    completed_at_ = std::chrono::steady_clock::now();
  }
  if (hooks_) {
    hooks_->post(std::make_shared<c10d::WorkInfo>(
        opType_, seq_, issued_at_, completed_at_,
        std::chrono::duration<float>(completed_at_ - issued_at_)));
  }
  // CUDA: copies back and the Future's events go on the issuer's stream.
  std::optional<c10::StreamGuard> guard;
  if (stream_) {
    guard.emplace(*stream_);
  }
  std::exception_ptr eptr;
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (!error_.empty()) {
      try {
        throw_backend_error(error_);
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
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(future_mutex_);
    future_done_ = true;
    future_error_ = eptr;
    future = future_;
  }
  if (future) {
    try {
      struct Completing {
        Completing() { ++completing_here; }
        ~Completing() { --completing_here; }
      } completing;
      complete_future(*future, eptr);
    } catch (...) {
      // A Future callback's failure belongs to the callback's own Future.
    }
  }
  finish(eptr);
}

void WorkSMDDP::complete_future(c10::ivalue::Future& future, const std::exception_ptr& eptr) {
  if (eptr) {
    future.setError(eptr);
  } else {
    future.markCompleted(c10::IValue(outputs_));
  }
}

bool WorkSMDDP::wait(std::chrono::milliseconds timeout) {
  if (parts_.empty() && requests_.empty()) {
    // Issued nothing (completed in enqueue): nothing of libsmddp's to wait for.
    return wait_completed();
  }
  const bool bounded = timeout != kNoTimeout;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (auto& part : parts_) {
    // A part that failed throws its own error, which is this work's first.
    part->wait(bounded ? std::max(std::chrono::milliseconds(0),
                                  std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now()))
                       : kNoTimeout);
  }
  {
    // Held while libsmddp may run the requests on this thread; let go before
    // waiting for the completion below, which runs the Future's callbacks on
    // another thread: one that destroys the group waits for every hold.
    GroupHold hold(backend_);
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
  }
  // libsmddp runs a request's callback before it reports it done, so the work
  // has completed by now.
  return wait_completed();
}

bool WorkSMDDP::wait_completed() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return completed_; });
  if (exception_) {
    std::rethrow_exception(exception_);
  }
  if (stream_) {
    // Orders the caller's current stream after the work (no host wait).
    future_->wait();
  }
  if (c10d::allow_inflight_collective_as_graph_input()) {
    // Under torch's in-flight collective registry a Work leaves it when
    // waited, as torch's own backends' do; the registry would keep it (and
    // its tensors) otherwise, and warn of it at exit.
    c10d::unregister_work(c10::intrusive_ptr<WorkSMDDP>::unsafe_reclaim_from_nonowning(this));
  }
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkSMDDP::getFuture() {
  std::lock_guard<std::mutex> lock(future_mutex_);
  if (!future_) {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
    if (future_done_) {
      // No callback can be on it yet: completing it here runs none.
      complete_future(*future, future_error_);
    }
    future_ = std::move(future);  // only once complete where the work is
  }
  return future_;
}

std::vector<at::Tensor> WorkSMDDP::result() {
  return outputs_;
}

int WorkSMDDP::sourceRank() const {
  int rank = -1;
  TORCH_CHECK(opType_ == c10d::OpType::RECV && requests_.size() == 1,
              "smddp: sourceRank() is only defined for a recv");
  smddp_status_t st = smddp_request_source(requests_[0], &rank);
  TORCH_CHECK(st == SMDDP_OK, "smddp: sourceRank() of a recv that has not completed (wait() on "
              "it first)");
  TORCH_CHECK(rank >= 0, "smddp: the recv failed before any rank's message was matched");
  return rank;
}

float WorkSMDDP::getDuration() const {
  TORCH_CHECK(issued_at_ != std::chrono::steady_clock::time_point{}, "smddp: getDuration() needs the backend's enableCollectivesTiming() "
              "before the work is issued");
  TORCH_CHECK(completed_at_ != std::chrono::steady_clock::time_point{},
              "smddp: getDuration() of a work that has not completed (wait() on it first)");
  return std::chrono::duration<float, std::milli>(completed_at_ - issued_at_).count();
}

void WorkSMDDP::abort() {
  if (isCompleted()) {
    return;
  }
  if (auto backend = backend_.lock()) {
    backend->abort();
  }
}

uint64_t WorkSMDDP::getSequencenumber() const {
  return seq_;
}

// ---- ProcessGroupSMDDP: lifecycle --------------------------------------------

ProcessGroupSMDDP::ProcessGroupSMDDP(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::chrono::milliseconds timeout,
                                     const std::string& name)
    : c10d::Backend(rank, size), timeout_(timeout) {
  TORCH_CHECK(store, "smddp: the store is None");
  smddp_store_t table;
  store_bridge_init(store, &table);
  smddp_comm_config_t config = SMDDP_COMM_CONFIG_INIT;
  // torch hands every group its own PrefixStore; "smddp" keeps our keys apart
  // from those of other backends of the same group, and the group's name
  // tells its communicator from the others (logs, trace files).
  const std::string prefix = name.empty() ? std::string("smddp") : "smddp/" + name;
  config.prefix = prefix.c_str();
  config.timeout_ms = timeout.count() > 0 ? timeout.count() : -1;
  smddp_status_t st = smddp_comm_create(&table, rank, size, &config, &comm_);
  if (st != SMDDP_OK) {
    // A failed create leaves the table (and its reference to torch's store) to us.
    if (table.release != nullptr) {
      table.release(table.ctx);
    }
    std::ostringstream msg;
    msg << "smddp: creating the communicator (rank " << rank << " of " << size
        << ") failed (" << smddp_status_string(st) << "): " << issue_error(nullptr);
    throw_backend_error(msg.str());
  }
}

ProcessGroupSMDDP::ProcessGroupSMDDP(smddp_comm_t comm, int rank, int size,
                                     std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), comm_(comm), timeout_(timeout) {}

c10::intrusive_ptr<c10d::Backend> ProcessGroupSMDDP::adopt_child(
    smddp_comm_t child, const c10::intrusive_ptr<Options>& opts) {
  auto timeout = opts && opts->timeout.count() > 0 ? opts->timeout : timeout_;
  (void)smddp_comm_set_timeout(child, timeout.count() > 0 ? timeout.count() : -1);
  int rank = 0;
  int size = 0;
  (void)smddp_comm_rank(child, &rank);
  (void)smddp_comm_size(child, &size);
  return c10::make_intrusive<ProcessGroupSMDDP>(child, rank, size, timeout);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupSMDDP::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  InUse in_use(*this);
  const bool member = std::find(ranks.begin(), ranks.end(), rank_) != ranks.end();
  for (int r : ranks) {
    TORCH_CHECK(r >= 0 && r < size_, "smddp split: rank ", r, " is not in this group of ", size_,
                " ranks");
  }
  // torch's ProcessGroup::splitGroup calls split once per device type this
  // backend serves (CPU and CUDA), with one store object: torch 2.13 on every
  // rank, 2.14 only where the first call returned nullptr (ranks outside the
  // new group). A repeated call for the same split gets the first call's
  // answer, without a second collective that the other ranks may not make.
  // The store is kept so that its address cannot be reused meanwhile.
  if (store && store == last_split_store_) {
    return last_split_member_ ? last_split_child_.lock() : nullptr;
  }
  // One colour per new group: its lowest rank.
  const int color = member ? *std::min_element(ranks.begin(), ranks.end()) : SMDDP_SPLIT_NOCOLOR;
  smddp_comm_t child = nullptr;
  smddp_status_t st = smddp_comm_split(comm_, color, rank_, &child);
  if (st != SMDDP_OK) {
    fail_issue("split", st);
  }
  last_split_store_ = store;
  last_split_member_ = child != nullptr;
  if (child == nullptr) {
    last_split_child_ = c10::weak_intrusive_ptr<c10d::Backend>(
        c10::intrusive_ptr<c10d::Backend>());
    return nullptr;
  }
  auto backend = adopt_child(child, opts);
  last_split_child_ = c10::weak_intrusive_ptr<c10d::Backend>(backend);
  return backend;
}

#ifdef SMDDP_C10D_BACKEND_HAS_TENSOR_ALLOC
at::Tensor ProcessGroupSMDDP::allocateTensor(long size, at::TensorOptions options) {
  TORCH_CHECK(size >= 0, "smddp: allocate_tensor: size is ", size, "; give 0 or more elements");
  if (options.device().is_cpu() && size > 0) {
    size_t item = options.dtype().itemsize();
    TORCH_CHECK(static_cast<size_t>(size) <= SIZE_MAX / item, "smddp: allocate_tensor: ", size,
                " elements of ", item, " bytes overflow the address space");
    size_t bytes = static_cast<size_t>(size) * item;
    InUse in_use(*this);
    c10::DataPtr p = pool_.alloc(comm_, bytes);
    if (p) {
      c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(p),
                           /*allocator=*/nullptr, /*resizable=*/false);
      return at::empty({0}, options).set_(storage, 0, {size}, {1});
    }
  }
  return at::empty({size}, options);
}
#endif

#ifdef SMDDP_C10D_BACKEND_HAS_SHRINK
c10::intrusive_ptr<c10d::Backend> ProcessGroupSMDDP::shrink(
    const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
    const c10::intrusive_ptr<Options>& opts_override) {
  InUse in_use(*this);
  TORCH_CHECK(shrink_flags == SMDDP_SHRINK_DEFAULT || shrink_flags == SMDDP_SHRINK_ABORT,
              "smddp shrink: shrink_flags ", shrink_flags, " is not supported; accepted: 0 "
              "(SHRINK_DEFAULT) and 1 (SHRINK_ABORT)");
  std::vector<int> exclude(ranks_to_exclude.begin(), ranks_to_exclude.end());
  smddp_comm_t child = nullptr;
  smddp_status_t st = smddp_comm_shrink(comm_, exclude.data(), static_cast<int>(exclude.size()),
                                        shrink_flags, &child);
  if (st != SMDDP_OK) {
    fail_issue("shrink", st);
  }
  return adopt_child(child, opts_override);
}
#endif

void ProcessGroupSMDDP::setTimeout(std::chrono::milliseconds timeout) {
  TORCH_CHECK(timeout.count() > 0, "smddp setTimeout: the timeout must be positive, got ",
              timeout.count(), " ms");
  InUse in_use(*this);
  (void)smddp_comm_set_timeout(comm_, timeout.count());
  timeout_ = timeout;
}

ProcessGroupSMDDP::~ProcessGroupSMDDP() {
  shutdown();
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupSMDDP::getBackendOptions() {
  return c10::make_intrusive<SMDDPOptions>(timeout_, weak_self());
}

#ifdef C10D_BACKEND_HAS_HOOKS
void ProcessGroupSMDDP::registerAbortHook(int64_t hook_id, c10d::AbortHook hook) {
  std::lock_guard<std::mutex> lock(abort_hooks_mutex_);
  abort_hooks_[hook_id] = std::move(hook);
}

void ProcessGroupSMDDP::unregisterAbortHook(int64_t hook_id) {
  std::lock_guard<std::mutex> lock(abort_hooks_mutex_);
  abort_hooks_.erase(hook_id);
}
#endif

void ProcessGroupSMDDP::run_abort_hooks() {
  if (abort_hooks_ran_.exchange(true)) {
    return;
  }
  std::map<int64_t, std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lock(abort_hooks_mutex_);
    hooks = abort_hooks_;
  }
  for (auto& [id, hook] : hooks) {
    try {
      hook();
    } catch (const std::exception& e) {
      TORCH_WARN("smddp: abort hook ", id, " raised: ", e.what());
    }
  }
}

void ProcessGroupSMDDP::abort() {
  run_abort_hooks();
  std::lock_guard<std::mutex> lock(lifecycle_mutex_);
  if (comm_ != nullptr) {
    (void)smddp_comm_abort(comm_);  // returns within about half a second
  }
}

namespace {
// The groups whose InUse this thread holds, innermost last (InUse lives on
// the stack, so they end in the reverse order).
thread_local std::vector<const ProcessGroupSMDDP*> in_use_here;

bool held_here(const ProcessGroupSMDDP* pg) {
  return std::find(in_use_here.begin(), in_use_here.end(), pg) != in_use_here.end();
}
}  // namespace

ProcessGroupSMDDP::InUse::InUse(ProcessGroupSMDDP& pg, Kind kind) : pg_(pg) {
  pg_.use_mutex_.lock_shared();
  if (kind == kCall && pg_.closing_.load()) {
    pg_.use_mutex_.unlock_shared();
    TORCH_CHECK(false, "smddp: the process group has been shut down");
  }
  in_use_here.push_back(&pg_);
}

ProcessGroupSMDDP::InUse::~InUse() {
  pg_.use_mutex_.unlock_shared();
  in_use_here.pop_back();
  if (pg_.shutdown_deferred_.load(std::memory_order_relaxed) && !held_here(&pg_) &&
      pg_.shutdown_deferred_.exchange(false)) {
    pg_.shutdown_now();
  }
}

void ProcessGroupSMDDP::shutdown() {
  if (held_here(this) || completing_here > 0) {
    // Inside one of this group's calls on this thread (a Future callback
    // run by wait()), or in a Future callback on the thread completing a
    // work, which a wait() on another thread may be holding the group for:
    // waiting here for the calls under way could wait for this very thread.
    // Refuse new calls now; destroy at once if nobody holds the group, else
    // when the last hold ends.
    closing_.store(true);
    shutdown_deferred_.store(true);
    if (!held_here(this) && use_mutex_.try_lock()) {
      use_mutex_.unlock();
      if (shutdown_deferred_.exchange(false)) {
        shutdown_now();
      }
    }
    return;
  }
  shutdown_now();
}

void ProcessGroupSMDDP::shutdown_now() {
  std::call_once(shutdown_once_, [this] {
    closing_.store(true);
    // Calls and waits under way on other threads end first (a blocking call
    // runs to its end or its timeout); a wait that starts meanwhile waits
    // for the destroy, then finds its requests completed.
    std::unique_lock<std::shared_mutex> in_use(use_mutex_);
    std::lock_guard<std::mutex> lock(lifecycle_mutex_);
    // Destroying the communicator first runs what is still queued, so every
    // work completes.
    if (comm_ != nullptr) {
      (void)smddp_comm_destroy(comm_);
      comm_ = nullptr;
    }
    // Every work has completed: its hook calls are queued; deliver them, then stop.
    std::lock_guard<std::mutex> hooks_lock(hooks_mutex_);
    if (hooks_) {
      hooks_->close();
    }
  });
}

// ---- ProcessGroupSMDDP: helpers -----------------------------------------------

c10::intrusive_ptr<WorkSMDDP> ProcessGroupSMDDP::new_work(c10d::OpType type,
                                                          std::vector<at::Tensor> outputs) {
  TORCH_CHECK(!closing_.load(std::memory_order_relaxed),
              "smddp: the process group has been shut down");
  auto work = c10::make_intrusive<WorkSMDDP>(
      rank_, type, weak_self(), comm_, ++seq_, std::move(outputs));
#ifdef SMDDP_C10D_BACKEND_HAS_COMPLETION_HOOK
  if (hasHooks()) {
    std::lock_guard<std::mutex> lock(hooks_mutex_);
    work->hooks_ = hooks_;
  }
#endif
  if (work->hooks_ || timing_.load(std::memory_order_relaxed)) {
    work->issued_at_ = std::chrono::steady_clock::now();
  }
  return work;
}

#ifdef SMDDP_C10D_BACKEND_HAS_COMPLETION_HOOK
void ProcessGroupSMDDP::registerOnCompletionHook(
    std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) {
  std::lock_guard<std::mutex> lock(hooks_mutex_);
  TORCH_CHECK(onCompletionHook_ == nullptr,
              "smddp: a completion hook is already registered on this process group (one is "
              "accepted, as with ProcessGroupNCCL)");
  TORCH_CHECK(!closing_.load(), "smddp: the process group has been shut down");
  hooks_ = std::make_shared<CompletionHooks>(hook);
  onCompletionHook_ = std::move(hook);  // what Backend::hasHooks() looks at
}

void ProcessGroupSMDDP::waitForPendingWorks() {
  std::vector<c10::weak_intrusive_ptr<WorkSMDDP>> works;
  {
    std::lock_guard<std::mutex> lock(hooks_mutex_);
    works.swap(pending_works_);
  }
  for (auto& w : works) {
    if (auto work = w.lock()) {
      try {
        work->wait();
      } catch (const std::exception&) {
        // Its own wait() reports the failure; here only completion matters.
      }
    }
  }
}
#endif

c10d::ErrorType ProcessGroupSMDDP::getError() {
  std::lock_guard<std::mutex> lock(lifecycle_mutex_);
  if (comm_ == nullptr) {
    return c10d::ErrorType::SUCCESS;
  }
  switch (smddp_comm_status(comm_)) {
    case SMDDP_OK: return c10d::ErrorType::SUCCESS;
    case SMDDP_ERR_TIMEOUT: return c10d::ErrorType::TIMEOUT;
    case SMDDP_ERR_PEER_LOST:
    case SMDDP_ERR_ABORTED: return c10d::ErrorType::REMOTE_ERROR;
    default: return c10d::ErrorType::COMM_ERROR;
  }
}

void ProcessGroupSMDDP::startCoalescing() {
  TORCH_CHECK(!coalescing_.load(),
              "smddp startCoalescing: the group is coalescing already (one "
              "_coalescing_manager at a time per group; end the first with endCoalescing)");
  coalesced_.clear();
  coalescing_thread_ = std::this_thread::get_id();
  coalescing_.store(true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::endCoalescing() {
  TORCH_CHECK(coalescing_here(),
              "smddp endCoalescing without startCoalescing on this thread");
  coalescing_.store(false);
  std::vector<c10::intrusive_ptr<WorkSMDDP>> parts;
  parts.swap(coalesced_);
  std::vector<at::Tensor> outputs;
  for (const auto& part : parts) {
    outputs.insert(outputs.end(), part->outputs_.begin(), part->outputs_.end());
  }
  auto work = new_work(c10d::OpType::COALESCED, std::move(outputs));
  for (auto& part : parts) {
    work->pending_.fetch_add(1);
    // work is alive until it completes: it holds a pending count until
    // enqueue, which makes it hold itself (self_).
    WorkSMDDP* whole = work.get();
    part->getFuture()->addCallback([whole](c10::ivalue::Future& f) {
      if (f.hasError()) {
        std::lock_guard<std::mutex> lock(whole->error_mutex_);
        if (whole->error_.empty()) {
          whole->error_ = f.tryRetrieveErrorMessage();
        }
      }
      whole->release_pending();
    });
    work->parts_.push_back(std::move(part));
  }
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::enqueue(
    const c10::intrusive_ptr<WorkSMDDP>& work) {
  if (coalescing_here()) {
    coalesced_.push_back(work);
  }
  work->self_ = work;
  if (work->hooks_) {
    std::lock_guard<std::mutex> lock(hooks_mutex_);
    auto done = [](const c10::weak_intrusive_ptr<WorkSMDDP>& w) {
      auto p = w.lock();
      return !p || p->isCompleted();
    };
    pending_works_.erase(std::remove_if(pending_works_.begin(), pending_works_.end(), done),
                         pending_works_.end());
    pending_works_.emplace_back(work);
  }
  // Read before release_pending: from then on the work may complete (and
  // clear its finalizers) on the progress thread.
  const bool copies_back = !work->finalizers_.empty();
  // Send and receive are never waited for here: two ranks that each receive,
  // then send, would wait for each other. A send's copy to the host is on the
  // stream already; a receive's copy to the device goes on the stream when it
  // completes, before this work does, and wait() orders the caller after it.
  const bool p2p = work->opType_ == c10d::OpType::SEND || work->opType_ == c10d::OpType::RECV ||
                   work->opType_ == c10d::OpType::RECVANYSOURCE;
  work->release_pending();
  if (work->stream_ && !p2p) {
    InUse in_use(*this, InUse::kWait);
    // CUDA: put the operation on the stream now, so that whatever the caller
    // enqueues next comes after it, as with NCCL. smddp_wait runs a request
    // that has not started on this thread; it returns once the work is
    // enqueued, without waiting for the GPU. Failures surface in wait().
    // A request staged through host memory across nodes is on the stream
    // already (the stream waits for the host on the GPU), unless the work
    // copies results back at completion, which must precede what comes next.
    for (auto req : work->requests_) {
      if (!copies_back && smddp_request_enqueued(req)) {
        continue;
      }
      (void)smddp_wait(req, SMDDP_WAIT_DEFAULT);
    }
  }
  return work;
}

std::string ProcessGroupSMDDP::dump_trace(const std::string& path) {
  std::lock_guard<std::mutex> lock(lifecycle_mutex_);
  TORCH_CHECK(comm_ != nullptr, "smddp.dump_trace: the process group has been shut down");
  char written[4096] = "";
  smddp_status_t st = smddp_comm_dump_trace(comm_, path.empty() ? nullptr : path.c_str(),
                                            written, sizeof(written));
  TORCH_CHECK(st == SMDDP_OK, "smddp.dump_trace: ", comm_error(comm_));
  return written;
}

smddp_comm_stats_t ProcessGroupSMDDP::stats(std::vector<int64_t>& late_ns) {
  std::lock_guard<std::mutex> lock(lifecycle_mutex_);
  TORCH_CHECK(comm_ != nullptr, "smddp.stats: the process group has been shut down");
  smddp_comm_stats_t out{};
  out.struct_size = sizeof(out);
  late_ns.assign(static_cast<size_t>(size_), -1);
  smddp_status_t st = smddp_comm_get_stats(comm_, &out, late_ns.data(), size_);
  TORCH_CHECK(st == SMDDP_OK, "smddp.stats: ", comm_error(comm_));
  return out;
}

std::vector<smddp_peer_state_t> ProcessGroupSMDDP::peer_states() {
  std::lock_guard<std::mutex> lock(lifecycle_mutex_);
  TORCH_CHECK(comm_ != nullptr, "smddp.peer_states: the process group has been shut down");
  std::vector<smddp_peer_state_t> out(static_cast<size_t>(size_), SMDDP_PEER_UNKNOWN);
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK(smddp_comm_peer_state(comm_, r, &out[static_cast<size_t>(r)]) == SMDDP_OK,
                "smddp.peer_states: ", comm_error(comm_));
  }
  return out;
}

void ProcessGroupSMDDP::fail_issue(const char* fn, smddp_status_t st) {
  std::ostringstream msg;
  msg << "smddp " << fn << " failed (" << smddp_status_string(st) << "): " << issue_error(comm_);
  throw_backend_error(msg.str());
}

bool ProcessGroupSMDDP::refused(smddp_status_t st) {
  return (st == SMDDP_ERR_INVALID_ARGUMENT || st == SMDDP_ERR_NOT_SUPPORTED ||
          st == SMDDP_ERR_NO_MEMORY) &&
         smddp_comm_status(comm_) == SMDDP_OK;
}

void ProcessGroupSMDDP::fail_now(c10d::OpType type, const char* fn, smddp_status_t st) {
  if (refused(st)) {
    fail_issue(fn, st);  // nothing ran
  }
  run_abort_hooks();  // it ran and failed: the group is broken
  throw_backend_error(op_failure(type, this, comm_, st));
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

c10::intrusive_ptr<c10d::Backend> create_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size, int64_t timeout_ms,
                                                 const std::string& name) {
  return c10::make_intrusive<ProcessGroupSMDDP>(store, rank, size,
                                                std::chrono::milliseconds(timeout_ms), name);
}

} // namespace smddp_torch
