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

namespace smddp_torch {
namespace {

constexpr const char* kAcceptedDtypes =
    "float32, float64, float16, bfloat16, int8, uint8, int32, int64 "
    "(bool too for operations that do not reduce)";

[[noreturn]] void throw_backend_error(const std::string& msg) {
  C10_THROW_ERROR(DistBackendError, msg);
}

smddp_dtype_t to_smddp_dtype(at::ScalarType type, bool reduces) {
  switch (type) {
    case at::kFloat:
      return SMDDP_FLOAT32;
    case at::kDouble:
      return SMDDP_FLOAT64;
    case at::kHalf:
      return SMDDP_FLOAT16;
    case at::kBFloat16:
      return SMDDP_BFLOAT16;
    case at::kChar:
      return SMDDP_INT8;
    case at::kByte:
      return SMDDP_UINT8;
    case at::kInt:
      return SMDDP_INT32;
    case at::kLong:
      return SMDDP_INT64;
    case at::kBool:
      if (!reduces) {
        return SMDDP_UINT8;
      }
      break;
    default:
      break;
  }
  TORCH_CHECK(false, "smddp does not support tensors of dtype ", type,
              reduces ? " in a reduction" : "", "; accepted: ", kAcceptedDtypes);
}

struct SmddpOp {
  smddp_op_t op;
  double factor;
};

SmddpOp to_smddp_op(const c10d::ReduceOp& rop) {
  switch (rop.op_) {
    case c10d::ReduceOp::SUM:
      return {SMDDP_SUM, 1.0};
    case c10d::ReduceOp::AVG:
      return {SMDDP_AVG, 1.0};
    case c10d::ReduceOp::PRODUCT:
      return {SMDDP_PROD, 1.0};
    case c10d::ReduceOp::MIN:
      return {SMDDP_MIN, 1.0};
    case c10d::ReduceOp::MAX:
      return {SMDDP_MAX, 1.0};
    case c10d::ReduceOp::BAND:
      return {SMDDP_BAND, 1.0};
    case c10d::ReduceOp::BOR:
      return {SMDDP_BOR, 1.0};
    case c10d::ReduceOp::BXOR:
      return {SMDDP_BXOR, 1.0};
    case c10d::ReduceOp::PREMUL_SUM: {
      const auto* sup = dynamic_cast<const c10d::PreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK(sup != nullptr,
                  "smddp: PREMUL_SUM without its factor; create it with "
                  "torch.distributed._make_nccl_premul_sum(factor)");
      double factor = sup->double_factor;
      if (sup->tensor_factor.defined()) {
        factor = sup->tensor_factor.to(at::kCPU).item<double>();
      }
      return {SMDDP_PREMUL_SUM, factor};
    }
    default:
      break;
  }
  TORCH_CHECK(false, "smddp does not support ReduceOp ", static_cast<int>(rop.op_),
              "; accepted: SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM, BAND, BOR, BXOR");
}

void check_tensor(const at::Tensor& t, const char* fn) {
  TORCH_CHECK(t.defined(), "smddp ", fn, ": undefined tensor");
  TORCH_CHECK(t.layout() == at::kStrided, "smddp ", fn,
              ": only dense (strided) tensors are supported, got layout ", t.layout());
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "smddp ", fn,
              ": tensors on device ", t.device(), " are not supported (cpu, cuda)");
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* fn) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "smddp ", fn,
              ": input and output dtypes differ (", a.scalar_type(), " vs ", b.scalar_type(), ")");
}

smddp_coll_attr_t attr_for(const at::Tensor& t, double factor = 1.0) {
  smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
  attr.mem_type = t.is_cuda() ? SMDDP_MEM_CUDA : SMDDP_MEM_HOST;
  attr.premul_factor = factor;
  return attr;
}

const char* comm_error(smddp_comm_t comm) {
  const char* msg = smddp_get_last_error(comm);
  return (msg != nullptr && msg[0] != '\0') ? msg : "(no message from libsmddp)";
}

// The error of a call that just failed on this thread.
std::string issue_error(smddp_comm_t comm) {
  const char* msg = smddp_get_last_error(nullptr);
  if (msg != nullptr && msg[0] != '\0') {
    return msg;
  }
  return comm_error(comm);
}

std::string join_sizes(const std::vector<int64_t>& v) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < v.size(); ++i) {
    out << (i ? ", " : "") << v[i];
  }
  out << "]";
  return out.str();
}

} // namespace

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

// ---- collectives ---------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::issue_allreduce(
    const c10::intrusive_ptr<WorkSMDDP>& work, const at::Tensor& tensor,
    const c10d::ReduceOp& rop) {
  check_tensor(tensor, "allreduce");
  smddp_dtype_t dt = to_smddp_dtype(tensor.scalar_type(), true);
  SmddpOp op = to_smddp_op(rop);
  at::Tensor buf = stage_inout(*work, tensor);
  smddp_coll_attr_t attr = attr_for(buf, op.factor);
  smddp_request_t req = nullptr;
  check_status("allreduce",
               smddp_allreduce(comm_, buf.data_ptr(), buf.data_ptr(), buf.numel(), dt, op.op,
                               &attr, &req),
               work);
  add_request(*work, req);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "smddp allreduce takes one tensor per call, got ",
              tensors.size());
  auto work = new_work(c10d::OpType::ALLREDUCE, tensors);
  issue_allreduce(work, tensors[0], opts.reduceOp);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  auto work = new_work(c10d::OpType::ALLREDUCE_COALESCED, tensors);
  for (const auto& t : tensors) {
    issue_allreduce(work, t, opts.reduceOp);
  }
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "smddp broadcast takes one tensor per call, got ",
              tensors.size());
  const at::Tensor& t = tensors[0];
  check_tensor(t, "broadcast");
  smddp_dtype_t dt = to_smddp_dtype(t.scalar_type(), false);
  auto work = new_work(c10d::OpType::BROADCAST, tensors);
  at::Tensor buf = stage_inout(*work, t);
  smddp_coll_attr_t attr = attr_for(buf);
  smddp_request_t req = nullptr;
  check_status("broadcast",
               smddp_broadcast(comm_, buf.data_ptr(), buf.numel(), dt,
                               static_cast<int>(opts.rootRank), &attr, &req),
               work);
  add_request(*work, req);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "smddp reduce takes one tensor per call, got ",
              tensors.size());
  const at::Tensor& t = tensors[0];
  check_tensor(t, "reduce");
  smddp_dtype_t dt = to_smddp_dtype(t.scalar_type(), true);
  SmddpOp op = to_smddp_op(opts.reduceOp);
  auto work = new_work(c10d::OpType::REDUCE, tensors);
  at::Tensor buf = stage_inout(*work, t);
  smddp_coll_attr_t attr = attr_for(buf, op.factor);
  smddp_request_t req = nullptr;
  check_status("reduce",
               smddp_reduce(comm_, buf.data_ptr(), buf.data_ptr(), buf.numel(), dt, op.op,
                            static_cast<int>(opts.rootRank), &attr, &req),
               work);
  add_request(*work, req);
  return enqueue(work);
}

void ProcessGroupSMDDP::issue_allgather_base(const c10::intrusive_ptr<WorkSMDDP>& work,
                                             const at::Tensor& output, const at::Tensor& input) {
  check_tensor(input, "allgather");
  check_tensor(output, "allgather");
  check_same_dtype(input, output, "allgather");
  TORCH_CHECK(output.numel() == input.numel() * size_, "smddp allgather: the output has ",
              output.numel(), " elements; expected world size (", size_, ") x input (",
              input.numel(), ")");
  smddp_dtype_t dt = to_smddp_dtype(input.scalar_type(), false);
  at::Tensor in = stage_in(*work, input);
  at::Tensor out = stage_inout(*work, output);
  smddp_coll_attr_t attr = attr_for(in);
  smddp_request_t req = nullptr;
  check_status("allgather",
               smddp_allgather(comm_, in.data_ptr(), out.data_ptr(), in.numel(), dt, &attr, &req),
               work);
  add_request(*work, req);
}

void ProcessGroupSMDDP::issue_allgather_list(const c10::intrusive_ptr<WorkSMDDP>& work,
                                             std::vector<at::Tensor>& outs,
                                             const at::Tensor& input) {
  check_tensor(input, "allgather");
  TORCH_CHECK(static_cast<int>(outs.size()) == size_, "smddp allgather: the output list has ",
              outs.size(), " tensors; expected the world size, ", size_);
  for (const auto& o : outs) {
    check_tensor(o, "allgather");
    check_same_dtype(input, o, "allgather");
    TORCH_CHECK(o.numel() == input.numel(), "smddp allgather: an output tensor has ", o.numel(),
                " elements, the input ", input.numel());
  }
  at::Tensor flat = at::empty({input.numel() * size_},
                              input.options().memory_format(at::MemoryFormat::Contiguous));
  issue_allgather_base(work, flat, input);
  then(*work, [flat, outs]() mutable {
    for (size_t i = 0; i < outs.size(); ++i) {
      int64_t n = outs[i].numel();
      outs[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(outs[i].sizes()));
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1,
              "smddp allgather takes one input tensor and one output list per call");
  auto work = new_work(c10d::OpType::ALLGATHER, outputs[0]);
  issue_allgather_list(work, outputs[0], inputs[0]);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputTensorLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  TORCH_CHECK(outputTensorLists.size() == inputs.size(), "smddp allgather_coalesced: ",
              outputTensorLists.size(), " output lists but ", inputs.size(), " inputs");
  std::vector<at::Tensor> all_outputs;
  for (const auto& list : outputTensorLists) {
    all_outputs.insert(all_outputs.end(), list.begin(), list.end());
  }
  auto work = new_work(c10d::OpType::ALLGATHER_COALESCED, all_outputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    issue_allgather_list(work, outputTensorLists[i], inputs[i]);
  }
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& /*opts*/) {
  auto work = new_work(c10d::OpType::_ALLGATHER_BASE, {output});
  issue_allgather_base(work, output, input);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "smddp allgather_into_tensor_coalesced: ", outputs.size(), " outputs but ",
              inputs.size(), " inputs");
  auto work = new_work(c10d::OpType::ALLGATHER_COALESCED, outputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    issue_allgather_base(work, outputs[i], inputs[i]);
  }
  return enqueue(work);
}

void ProcessGroupSMDDP::issue_reduce_scatter_base(const c10::intrusive_ptr<WorkSMDDP>& work,
                                                  const at::Tensor& output,
                                                  const at::Tensor& input,
                                                  const c10d::ReduceOp& rop) {
  check_tensor(input, "reduce_scatter");
  check_tensor(output, "reduce_scatter");
  check_same_dtype(input, output, "reduce_scatter");
  TORCH_CHECK(input.numel() == output.numel() * size_, "smddp reduce_scatter: the input has ",
              input.numel(), " elements; expected world size (", size_, ") x output (",
              output.numel(), ")");
  smddp_dtype_t dt = to_smddp_dtype(input.scalar_type(), true);
  SmddpOp op = to_smddp_op(rop);
  at::Tensor in = stage_in(*work, input);
  at::Tensor out = stage_inout(*work, output);
  smddp_coll_attr_t attr = attr_for(in, op.factor);
  smddp_request_t req = nullptr;
  check_status("reduce_scatter",
               smddp_reduce_scatter(comm_, in.data_ptr(), out.data_ptr(), out.numel(), dt, op.op,
                                    &attr, &req),
               work);
  add_request(*work, req);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1,
              "smddp reduce_scatter takes one output tensor and one input list per call");
  const at::Tensor& output = outputs[0];
  auto& ins = inputs[0];
  TORCH_CHECK(static_cast<int>(ins.size()) == size_, "smddp reduce_scatter: the input list has ",
              ins.size(), " tensors; expected the world size, ", size_);
  std::vector<at::Tensor> flat_parts;
  for (const auto& t : ins) {
    check_tensor(t, "reduce_scatter");
    check_same_dtype(t, output, "reduce_scatter");
    TORCH_CHECK(t.numel() == output.numel(), "smddp reduce_scatter: an input tensor has ",
                t.numel(), " elements, the output ", output.numel());
    flat_parts.push_back(t.reshape({-1}));
  }
  auto work = new_work(c10d::OpType::REDUCE_SCATTER, outputs);
  at::Tensor flat = at::cat(flat_parts);
  issue_reduce_scatter_base(work, output, flat, opts.reduceOp);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  auto work = new_work(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
  issue_reduce_scatter_base(work, output, input, opts.reduceOp);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "smddp reduce_scatter_tensor_coalesced: ", outputs.size(), " outputs but ",
              inputs.size(), " inputs");
  auto work = new_work(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, outputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    issue_reduce_scatter_base(work, outputs[i], inputs[i], opts.reduceOp);
  }
  return enqueue(work);
}

// Element counts and displacements of an alltoall split along dim 0.
static void split_counts(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                         const char* which, std::vector<int64_t>& counts,
                         std::vector<int64_t>& displs) {
  const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
  const int64_t row_elems = rows > 0 ? t.numel() / rows : 0;
  counts.assign(size, 0);
  displs.assign(size, 0);
  if (splits.empty()) {
    TORCH_CHECK(rows % size == 0, "smddp alltoall_base: the ", which, " has ", rows,
                " rows, not divisible by the world size ", size, "; pass split sizes");
    for (int i = 0; i < size; ++i) {
      counts[i] = rows / size * row_elems;
    }
  } else {
    TORCH_CHECK(static_cast<int>(splits.size()) == size, "smddp alltoall_base: ", which,
                " split sizes ", join_sizes(splits), " must have one entry per rank (", size,
                ")");
    int64_t total = 0;
    for (int i = 0; i < size; ++i) {
      TORCH_CHECK(splits[i] >= 0, "smddp alltoall_base: negative ", which, " split size");
      counts[i] = splits[i] * row_elems;
      total += splits[i];
    }
    TORCH_CHECK(total == rows, "smddp alltoall_base: ", which, " split sizes ",
                join_sizes(splits), " add up to ", total, ", but dim 0 of the ", which, " is ",
                rows);
  }
  for (int i = 1; i < size; ++i) {
    displs[i] = displs[i - 1] + counts[i - 1];
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions& /*opts*/) {
  check_tensor(input, "alltoall_base");
  check_tensor(output, "alltoall_base");
  check_same_dtype(input, output, "alltoall_base");
  smddp_dtype_t dt = to_smddp_dtype(input.scalar_type(), false);
  std::vector<int64_t> scounts, sdispls, rcounts, rdispls;
  split_counts(input, inputSplitSizes, size_, "input", scounts, sdispls);
  split_counts(output, outputSplitSizes, size_, "output", rcounts, rdispls);
  auto work = new_work(c10d::OpType::ALLTOALL_BASE, {output});
  at::Tensor in = stage_in(*work, input);
  at::Tensor out = stage_inout(*work, output);
  smddp_coll_attr_t attr = attr_for(in);
  smddp_request_t req = nullptr;
  check_status("alltoall_base",
               smddp_alltoallv(comm_, in.data_ptr(), scounts.data(), sdispls.data(),
                               out.data_ptr(), rcounts.data(), rdispls.data(), dt, &attr, &req),
               work);
  add_request(*work, req);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& /*opts*/) {
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ &&
                  static_cast<int>(outputs.size()) == size_,
              "smddp alltoall: the input and output lists need one tensor per rank (", size_,
              "), got ", inputs.size(), " and ", outputs.size());
  std::vector<int64_t> scounts(size_), sdispls(size_), rcounts(size_), rdispls(size_);
  std::vector<at::Tensor> parts;
  for (int i = 0; i < size_; ++i) {
    check_tensor(inputs[i], "alltoall");
    check_tensor(outputs[i], "alltoall");
    check_same_dtype(inputs[i], inputs[0], "alltoall");
    check_same_dtype(outputs[i], inputs[0], "alltoall");
    scounts[i] = inputs[i].numel();
    rcounts[i] = outputs[i].numel();
    if (i > 0) {
      sdispls[i] = sdispls[i - 1] + scounts[i - 1];
      rdispls[i] = rdispls[i - 1] + rcounts[i - 1];
    }
    parts.push_back(inputs[i].reshape({-1}));
  }
  smddp_dtype_t dt = to_smddp_dtype(inputs[0].scalar_type(), false);
  auto work = new_work(c10d::OpType::ALLTOALL, outputs);
  at::Tensor send = at::cat(parts);
  at::Tensor recv = at::empty({rdispls[size_ - 1] + rcounts[size_ - 1]}, send.options());
  keep(*work, send);
  keep(*work, recv);
  smddp_coll_attr_t attr = attr_for(send);
  smddp_request_t req = nullptr;
  check_status("alltoall",
               smddp_alltoallv(comm_, send.data_ptr(), scounts.data(), sdispls.data(),
                               recv.data_ptr(), rcounts.data(), rdispls.data(), dt, &attr, &req),
               work);
  add_request(*work, req);
  then(*work, [recv, outputs, rcounts, rdispls]() mutable {
    for (size_t i = 0; i < outputs.size(); ++i) {
      outputs[i].copy_(recv.narrow(0, rdispls[i], rcounts[i]).view(outputs[i].sizes()));
    }
  });
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1, "smddp gather takes one input tensor per call");
  const at::Tensor& input = inputs[0];
  check_tensor(input, "gather");
  const int root = static_cast<int>(opts.rootRank);
  smddp_dtype_t dt = to_smddp_dtype(input.scalar_type(), false);
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "smddp gather: the root needs one output list of world size (", size_,
                ") tensors");
    outs = outputs[0];
    for (const auto& o : outs) {
      check_tensor(o, "gather");
      check_same_dtype(input, o, "gather");
      TORCH_CHECK(o.numel() == input.numel(), "smddp gather: an output tensor has ", o.numel(),
                  " elements, the input ", input.numel());
    }
  }
  auto work = new_work(c10d::OpType::GATHER, outs);
  at::Tensor in = stage_in(*work, input);
  at::Tensor flat;
  if (rank_ == root) {
    flat = at::empty({input.numel() * size_}, in.options());
    keep(*work, flat);
  }
  smddp_coll_attr_t attr = attr_for(in);
  smddp_request_t req = nullptr;
  check_status("gather",
               smddp_gather(comm_, in.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr,
                            in.numel(), dt, root, &attr, &req),
               work);
  add_request(*work, req);
  if (rank_ == root) {
    then(*work, [flat, outs]() mutable {
      for (size_t i = 0; i < outs.size(); ++i) {
        int64_t n = outs[i].numel();
        outs[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(outs[i].sizes()));
      }
    });
  }
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1, "smddp scatter takes one output tensor per call");
  const at::Tensor& output = outputs[0];
  check_tensor(output, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  smddp_dtype_t dt = to_smddp_dtype(output.scalar_type(), false);
  auto work = new_work(c10d::OpType::SCATTER, outputs);
  at::Tensor flat;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "smddp scatter: the root needs one input list of world size (", size_,
                ") tensors");
    std::vector<at::Tensor> parts;
    for (const auto& t : inputs[0]) {
      check_tensor(t, "scatter");
      check_same_dtype(t, output, "scatter");
      TORCH_CHECK(t.numel() == output.numel(), "smddp scatter: an input tensor has ", t.numel(),
                  " elements, the output ", output.numel());
      parts.push_back(t.reshape({-1}));
    }
    flat = at::cat(parts);
    keep(*work, flat);
  }
  at::Tensor out = stage_inout(*work, output);
  smddp_coll_attr_t attr = attr_for(out);
  smddp_request_t req = nullptr;
  check_status("scatter",
               smddp_scatter(comm_, flat.defined() ? flat.data_ptr() : nullptr, out.data_ptr(),
                             out.numel(), dt, root, &attr, &req),
               work);
  add_request(*work, req);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::send(std::vector<at::Tensor>& tensors,
                                                       int dstRank, int tag) {
  TORCH_CHECK(tensors.size() == 1, "smddp send takes one tensor per call");
  const at::Tensor& t = tensors[0];
  check_tensor(t, "send");
  smddp_dtype_t dt = to_smddp_dtype(t.scalar_type(), false);
  auto work = new_work(c10d::OpType::SEND, tensors);
  at::Tensor buf = stage_in(*work, t);
  smddp_coll_attr_t attr = attr_for(buf);
  smddp_request_t req = nullptr;
  check_status("send",
               smddp_send(comm_, buf.data_ptr(), buf.numel(), dt, dstRank, tag, &attr, &req),
               work);
  add_request(*work, req);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::recv(std::vector<at::Tensor>& tensors,
                                                       int srcRank, int tag) {
  TORCH_CHECK(tensors.size() == 1, "smddp recv takes one tensor per call");
  const at::Tensor& t = tensors[0];
  check_tensor(t, "recv");
  smddp_dtype_t dt = to_smddp_dtype(t.scalar_type(), false);
  auto work = new_work(c10d::OpType::RECV, tensors);
  at::Tensor buf = stage_inout(*work, t);
  smddp_coll_attr_t attr = attr_for(buf);
  smddp_request_t req = nullptr;
  check_status("recv",
               smddp_recv(comm_, buf.data_ptr(), buf.numel(), dt, srcRank, tag, &attr, &req),
               work);
  add_request(*work, req);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::barrier(const c10d::BarrierOptions& /*opts*/) {
  auto work = new_work(c10d::OpType::BARRIER, {});
  smddp_request_t req = nullptr;
  check_status("barrier", smddp_barrier(comm_, &req), work);
  add_request(*work, req);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Backend> create_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size, int64_t timeout_ms) {
  return c10::make_intrusive<ProcessGroupSMDDP>(store, rank, size,
                                                std::chrono::milliseconds(timeout_ms));
}

} // namespace smddp_torch
