// ProcessGroupSMDDP's collectives: each checks its tensors, stages what
// libsmddp cannot use in place (see backend.cpp) and issues the non-blocking
// C calls; the work completes from libsmddp's completion callbacks.
#include "backend.hpp"
#include "convert.hpp"

#include <algorithm>
#include <optional>
#include <sstream>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace smddp_torch {

using namespace detail;

// ---- collectives ---------------------------------------------------------------

// The checks of each kind, run for every member of a coalesced call before
// any is issued: a check failing half-way would leave the issued members
// without their counterparts on the other ranks. Each returns what it
// converted, for the issue that follows.
static SmddpReduction check_allreduce(const at::Tensor& tensor, const c10d::ReduceOp& rop) {
  check_tensor(tensor, "allreduce");
  return to_smddp_reduction(tensor.scalar_type(), rop);
}

static smddp_dtype_t check_allgather_base(const at::Tensor& output, const at::Tensor& input,
                                          int size) {
  check_tensor(input, "allgather");
  check_tensor(output, "allgather");
  check_alike(input, output, "allgather");
  TORCH_CHECK(output.numel() == input.numel() * size, "smddp allgather: the output has ",
              output.numel(), " elements; expected world size (", size, ") x input (",
              input.numel(), ")");
  return to_smddp_dtype(input.scalar_type(), false);
}

static void check_allgather_list(const std::vector<at::Tensor>& outs, const at::Tensor& input,
                                 int size) {
  check_tensor(input, "allgather");
  TORCH_CHECK(static_cast<int>(outs.size()) == size, "smddp allgather: the output list has ",
              outs.size(), " tensors; expected the world size, ", size);
  for (const auto& o : outs) {
    check_tensor(o, "allgather");
    check_alike(input, o, "allgather");
    TORCH_CHECK(o.numel() == input.numel(), "smddp allgather: an output tensor has ", o.numel(),
                " elements, the input ", input.numel());
  }
  (void)to_smddp_dtype(input.scalar_type(), false);  // a dtype smddp lacks: refused here
}

static SmddpReduction check_reduce_scatter_base(const at::Tensor& output,
                                                const at::Tensor& input,
                                                const c10d::ReduceOp& rop, int size) {
  check_tensor(input, "reduce_scatter");
  check_tensor(output, "reduce_scatter");
  check_alike(input, output, "reduce_scatter");
  TORCH_CHECK(input.numel() == output.numel() * size, "smddp reduce_scatter: the input has ",
              input.numel(), " elements; expected world size (", size, ") x output (",
              output.numel(), ")");
  return to_smddp_reduction(input.scalar_type(), rop);
}

void ProcessGroupSMDDP::issue_allreduce(const c10::intrusive_ptr<WorkSMDDP>& work,
                                        const at::Tensor& tensor, const SmddpReduction& op) {
  at::Tensor buf = stage_inout(*work, tensor);
  smddp_coll_attr_t attr = attr_for(buf, op.factor);
  issue(*work, "allreduce", attr, [&](const smddp_coll_attr_t* a, smddp_request_t* r) {
    return smddp_allreduce(comm_, buf.data_ptr(), buf.data_ptr(), buf.numel(), op.dtype, op.op,
                           a, r);
  });
}

bool ProcessGroupSMDDP::runs_now(const at::Tensor& t) {
  TORCH_CHECK(!closing_.load(std::memory_order_relaxed),
              "smddp: the process group has been shut down");
  bool hooked = false;
#ifdef SMDDP_C10D_BACKEND_HAS_COMPLETION_HOOK
  hooked = hasHooks();
#endif
  return t.device().is_cpu() && t.is_contiguous() && !hooked &&
         !timing_.load(std::memory_order_relaxed) && !coalescing_.load(std::memory_order_relaxed);
}

bool ProcessGroupSMDDP::runs_without_work(bool waits, const at::Tensor& a, const at::Tensor& b) {
  // runs_now refuses while the group coalesces; an in-place call passes one tensor twice.
  return waits && runs_now(a) && (&b == &a || runs_now(b)) &&
         !c10d::allow_inflight_collective_as_graph_input();
}

namespace {
// Under a profiler, the event a Work of type records (its title), from
// construction to destruction; nothing otherwise.
class BlockingEvent {
 public:
  explicit BlockingEvent(c10d::OpType type) {
    if (auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE)) {
      event_.emplace(std::move(*callbacks));
      event_->before(profiling_title(type), c10::ArrayRef<const c10::IValue>());
    }
  }

 private:
  std::optional<at::RecordFunction> event_;
};
}  // namespace

template <typename Call>
void ProcessGroupSMDDP::run_blocking(c10d::OpType type, const char* fn, smddp_coll_attr_t attr,
                                     std::chrono::milliseconds timeout, Call&& call) {
  InUse in_use(*this);
  ++seq_;
  BlockingEvent event(type);
  attr.timeout_ms = std::max<int64_t>(0, timeout.count());
  smddp_status_t st = call(&attr);
  if (st != SMDDP_OK) {
    fail_now(type, fn, st);
  }
}

void ProcessGroupSMDDP::blocking_allreduce(const at::Tensor& t, const SmddpReduction& op,
                                           std::chrono::milliseconds timeout) {
  run_blocking(c10d::OpType::ALLREDUCE, "allreduce", attr_for(t, op.factor), timeout,
               [&](const smddp_coll_attr_t* a) {
                 return smddp_allreduce(comm_, t.data_ptr(), t.data_ptr(), t.numel(), op.dtype,
                                        op.op, a, nullptr);
               });
}

void ProcessGroupSMDDP::blocking_allgather(const at::Tensor& output, const at::Tensor& input,
                                           smddp_dtype_t dt, std::chrono::milliseconds timeout) {
  run_blocking(c10d::OpType::_ALLGATHER_BASE, "allgather", attr_for(input), timeout,
               [&](const smddp_coll_attr_t* a) {
                 return smddp_allgather(comm_, input.data_ptr(), output.data_ptr(), input.numel(),
                                        dt, a, nullptr);
               });
}

void ProcessGroupSMDDP::blocking_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                                const SmddpReduction& op,
                                                std::chrono::milliseconds timeout) {
  run_blocking(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter", attr_for(input, op.factor),
               timeout, [&](const smddp_coll_attr_t* a) {
                 return smddp_reduce_scatter(comm_, input.data_ptr(), output.data_ptr(),
                                             output.numel(), op.dtype, op.op, a, nullptr);
               });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allreduce(std::vector<at::Tensor>& given,
                                                            const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(given.size() == 1, "smddp allreduce takes one tensor per call, got ",
              given.size());
  check_reducible(given[0], opts.reduceOp, "allreduce");
  std::vector<at::Tensor> tensors = as_elems(given);
  SmddpReduction op = check_allreduce(tensors[0], opts.reduceOp);
  if (runs_without_work(waits_now(opts, 0), tensors[0], tensors[0])) {
    // async_op=False: libsmddp's blocking call, on this thread. It has
    // finished when it returns, so no Work is made; a failure throws here,
    // with the error wait() would have thrown.
    blocking_allreduce(tensors[0], op, opts.timeout);
    return {};
  }
  auto work = new_work(c10d::OpType::ALLREDUCE, tensors, opts);
  issue_allreduce(work, tensors[0], op);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allreduce_coalesced(
    std::vector<at::Tensor>& given, const c10d::AllreduceCoalescedOptions& opts) {
  for (const auto& t : given) {
    check_reducible(t, opts.reduceOp, "allreduce_coalesced");
  }
  std::vector<at::Tensor> tensors = as_elems(given);
  std::vector<SmddpReduction> ops;
  ops.reserve(tensors.size());
  for (const auto& t : tensors) {
    ops.push_back(check_allreduce(t, opts.reduceOp));
  }
  auto work = new_work(c10d::OpType::ALLREDUCE_COALESCED, tensors, opts);
  for (size_t i = 0; i < tensors.size(); ++i) {
    issue_allreduce(work, tensors[i], ops[i]);
  }
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::broadcast(std::vector<at::Tensor>& given,
                                                            const c10d::BroadcastOptions& opts) {
  std::vector<at::Tensor> tensors = as_elems(given);
  TORCH_CHECK(tensors.size() == 1, "smddp broadcast takes one tensor per call, got ",
              tensors.size());
  const at::Tensor& t = tensors[0];
  check_tensor(t, "broadcast");
  smddp_dtype_t dt = to_smddp_dtype(t.scalar_type(), false);
  auto work = new_work(c10d::OpType::BROADCAST, tensors, opts);
  at::Tensor buf = stage_inout(*work, t);
  smddp_coll_attr_t attr = attr_for(buf);
  issue(*work, "broadcast", attr, [&](const smddp_coll_attr_t* a, smddp_request_t* r) {
    return smddp_broadcast(comm_, buf.data_ptr(), buf.numel(), dt, static_cast<int>(opts.rootRank), a, r);
  });
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::reduce(std::vector<at::Tensor>& given,
                                                         const c10d::ReduceOptions& opts) {
  TORCH_CHECK(given.size() == 1, "smddp reduce takes one tensor per call, got ",
              given.size());
  check_reducible(given[0], opts.reduceOp, "reduce");
  std::vector<at::Tensor> tensors = as_elems(given);
  const at::Tensor& t = tensors[0];
  check_tensor(t, "reduce");
  SmddpReduction op = to_smddp_reduction(t.scalar_type(), opts.reduceOp);
  smddp_dtype_t dt = op.dtype;
  auto work = new_work(c10d::OpType::REDUCE, tensors, opts);
  at::Tensor buf = stage_inout(*work, t);
  smddp_coll_attr_t attr = attr_for(buf, op.factor);
  issue(*work, "reduce", attr, [&](const smddp_coll_attr_t* a, smddp_request_t* r) {
    return smddp_reduce(comm_, buf.data_ptr(), buf.data_ptr(), buf.numel(), dt, op.op, static_cast<int>(opts.rootRank), a, r);
  });
  return enqueue(work);
}

void ProcessGroupSMDDP::issue_allgather_base(const c10::intrusive_ptr<WorkSMDDP>& work,
                                             const at::Tensor& output, const at::Tensor& input) {
  smddp_dtype_t dt = check_allgather_base(output, input, size_);
  at::Tensor in = stage_in(*work, input);
  at::Tensor out = stage_inout(*work, output);
  smddp_coll_attr_t attr = attr_for(in);
  issue(*work, "allgather", attr, [&](const smddp_coll_attr_t* a, smddp_request_t* r) {
    return smddp_allgather(comm_, in.data_ptr(), out.data_ptr(), in.numel(), dt, a, r);
  });
}

void ProcessGroupSMDDP::issue_allgather_list(const c10::intrusive_ptr<WorkSMDDP>& work,
                                             std::vector<at::Tensor>& outs,
                                             const at::Tensor& input) {
  check_allgather_list(outs, input, size_);
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
    std::vector<std::vector<at::Tensor>>& given_outputs, std::vector<at::Tensor>& given_inputs,
    const c10d::AllgatherOptions& opts) {
  for (size_t i = 0; i < given_inputs.size() && i < given_outputs.size(); ++i) {
    check_dtype(given_inputs[i], given_outputs[i], "allgather");
  }
  auto outputs = as_elems(given_outputs);
  auto inputs = as_elems(given_inputs);
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1,
              "smddp allgather takes one input tensor and one output list per call");
  auto work = new_work(c10d::OpType::ALLGATHER, outputs[0], opts);
  issue_allgather_list(work, outputs[0], inputs[0]);
  return enqueue(work);
}

// outputTensorLists[r][i] receives rank r's inputs[i], as in
// torch.distributed.all_gather_coalesced and gloo: one list per rank, each as
// long as inputs.
c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& given_outputs, std::vector<at::Tensor>& given_inputs,
    const c10d::AllgatherOptions& opts) {
  for (const auto& list : given_outputs) {
    for (size_t i = 0; i < list.size() && i < given_inputs.size(); ++i) {
      check_dtype(given_inputs[i], list[i], "allgather_coalesced");
    }
  }
  auto outputTensorLists = as_elems(given_outputs);
  auto inputs = as_elems(given_inputs);
  TORCH_CHECK(static_cast<int>(outputTensorLists.size()) == size_,
              "smddp allgather_coalesced: ", outputTensorLists.size(),
              " output lists; give one per rank (", size_, "), each as long as the inputs");
  std::vector<at::Tensor> all_outputs;
  for (size_t r = 0; r < outputTensorLists.size(); ++r) {
    TORCH_CHECK(outputTensorLists[r].size() == inputs.size(), "smddp allgather_coalesced: "
                "output list ", r, " holds ", outputTensorLists[r].size(), " tensors for ",
                inputs.size(), " inputs; each rank's list holds one tensor per input");
    all_outputs.insert(all_outputs.end(), outputTensorLists[r].begin(),
                       outputTensorLists[r].end());
  }
  // Per input, its tensor of every rank's list: what one allgather fills.
  std::vector<std::vector<at::Tensor>> per_input(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (const auto& list : outputTensorLists) {
      per_input[i].push_back(list[i]);
    }
    check_allgather_list(per_input[i], inputs[i], size_);
  }
  auto work = new_work(c10d::OpType::ALLGATHER_COALESCED, all_outputs, opts);
  for (size_t i = 0; i < inputs.size(); ++i) {
    issue_allgather_list(work, per_input[i], inputs[i]);
  }
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::_allgather_base(
    at::Tensor& given_output, at::Tensor& given_input, const c10d::AllgatherOptions& opts) {
  check_dtype(given_input, given_output, "allgather");
  at::Tensor output = as_elems(given_output);
  at::Tensor input = as_elems(given_input);
  if (runs_without_work(waits_now(opts, 0), input, output)) {
    // As allreduce's: async_op=False runs the blocking call, and returns no Work.
    smddp_dtype_t dt = check_allgather_base(output, input, size_);
    blocking_allgather(output, input, dt, opts.timeout);
    return {};
  }
  auto work = new_work(c10d::OpType::_ALLGATHER_BASE, {output}, opts);
  issue_allgather_base(work, output, input);
  return enqueue(work);
}

void ProcessGroupSMDDP::allreduce_now(at::Tensor& given, const c10d::ReduceOp& rop) {
  check_reducible(given, rop, "allreduce");
  at::Tensor tensor = as_elems(given);
  SmddpReduction op = check_allreduce(tensor, rop);
  if (!runs_now(tensor)) {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = rop;
    allreduce(tensors, opts)->wait();
    return;
  }
  blocking_allreduce(tensor, op, std::chrono::milliseconds(0));
}

void ProcessGroupSMDDP::allgather_now(at::Tensor& given_output, at::Tensor& given_input) {
  check_dtype(given_input, given_output, "allgather");
  at::Tensor output = as_elems(given_output);
  at::Tensor input = as_elems(given_input);
  smddp_dtype_t dt = check_allgather_base(output, input, size_);
  if (!runs_now(input) || !runs_now(output)) {
    c10d::AllgatherOptions opts;
    _allgather_base(output, input, opts)->wait();
    return;
  }
  blocking_allgather(output, input, dt, std::chrono::milliseconds(0));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& given_outputs, std::vector<at::Tensor>& given_inputs,
    const c10d::AllgatherOptions& opts) {
  for (size_t i = 0; i < given_inputs.size() && i < given_outputs.size(); ++i) {
    check_dtype(given_inputs[i], given_outputs[i], "allgather_into_tensor_coalesced");
  }
  auto outputs = as_elems(given_outputs);
  auto inputs = as_elems(given_inputs);
  TORCH_CHECK(outputs.size() == inputs.size(),
              "smddp allgather_into_tensor_coalesced: ", outputs.size(), " outputs but ",
              inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    (void)check_allgather_base(outputs[i], inputs[i], size_);
  }
  auto work = new_work(c10d::OpType::ALLGATHER_COALESCED, outputs, opts);
  for (size_t i = 0; i < inputs.size(); ++i) {
    issue_allgather_base(work, outputs[i], inputs[i]);
  }
  return enqueue(work);
}

void ProcessGroupSMDDP::issue_reduce_scatter_base(const c10::intrusive_ptr<WorkSMDDP>& work,
                                                  const at::Tensor& output,
                                                  const at::Tensor& input,
                                                  const c10d::ReduceOp& rop) {
  SmddpReduction op = check_reduce_scatter_base(output, input, rop, size_);
  smddp_dtype_t dt = op.dtype;
  at::Tensor in = stage_in(*work, input);
  at::Tensor out = stage_inout(*work, output);
  smddp_coll_attr_t attr = attr_for(in, op.factor);
  issue(*work, "reduce_scatter", attr, [&](const smddp_coll_attr_t* a, smddp_request_t* r) {
    return smddp_reduce_scatter(comm_, in.data_ptr(), out.data_ptr(), out.numel(), dt, op.op, a, r);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::reduce_scatter(
    std::vector<at::Tensor>& given_outputs, std::vector<std::vector<at::Tensor>>& given_inputs,
    const c10d::ReduceScatterOptions& opts) {
  for (const auto& t : given_outputs) {
    check_reducible(t, opts.reduceOp, "reduce_scatter");
    for (const auto& list : given_inputs) {
      check_dtype(t, list, "reduce_scatter");
    }
  }
  auto outputs = as_elems(given_outputs);
  auto inputs = as_elems(given_inputs);
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1,
              "smddp reduce_scatter takes one output tensor and one input list per call");
  const at::Tensor& output = outputs[0];
  auto& ins = inputs[0];
  TORCH_CHECK(static_cast<int>(ins.size()) == size_, "smddp reduce_scatter: the input list has ",
              ins.size(), " tensors; expected the world size, ", size_);
  std::vector<at::Tensor> flat_parts;
  for (const auto& t : ins) {
    check_tensor(t, "reduce_scatter");
    check_alike(t, output, "reduce_scatter");
    TORCH_CHECK(t.numel() == output.numel(), "smddp reduce_scatter: an input tensor has ",
                t.numel(), " elements, the output ", output.numel());
    flat_parts.push_back(t.reshape({-1}));
  }
  auto work = new_work(c10d::OpType::REDUCE_SCATTER, outputs, opts);
  at::Tensor flat = at::cat(flat_parts);
  issue_reduce_scatter_base(work, output, flat, opts.reduceOp);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::_reduce_scatter_base(
    at::Tensor& given_output, at::Tensor& given_input, const c10d::ReduceScatterOptions& opts) {
  check_dtype(given_input, given_output, "reduce_scatter");
  check_reducible(given_input, opts.reduceOp, "reduce_scatter");
  at::Tensor output = as_elems(given_output);
  at::Tensor input = as_elems(given_input);
  if (runs_without_work(waits_now(opts, 0), input, output)) {
    // As allreduce's: async_op=False runs the blocking call, and returns no Work.
    SmddpReduction op = check_reduce_scatter_base(output, input, opts.reduceOp, size_);
    blocking_reduce_scatter(output, input, op, opts.timeout);
    return {};
  }
  auto work = new_work(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, opts);
  issue_reduce_scatter_base(work, output, input, opts.reduceOp);
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& given_outputs, std::vector<at::Tensor>& given_inputs,
    const c10d::ReduceScatterOptions& opts) {
  for (size_t i = 0; i < given_inputs.size(); ++i) {
    if (i < given_outputs.size()) {
      check_dtype(given_inputs[i], given_outputs[i], "reduce_scatter_tensor_coalesced");
    }
    check_reducible(given_inputs[i], opts.reduceOp, "reduce_scatter_tensor_coalesced");
  }
  auto outputs = as_elems(given_outputs);
  auto inputs = as_elems(given_inputs);
  TORCH_CHECK(outputs.size() == inputs.size(),
              "smddp reduce_scatter_tensor_coalesced: ", outputs.size(), " outputs but ",
              inputs.size(), " inputs");
  // COALESCED: torch 2.11's OpType has no REDUCE_SCATTER_TENSOR_COALESCED.
  for (size_t i = 0; i < inputs.size(); ++i) {
    (void)check_reduce_scatter_base(outputs[i], inputs[i], opts.reduceOp, size_);
  }
  auto work = new_work(c10d::OpType::COALESCED, outputs, opts);
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
    at::Tensor& given_output, at::Tensor& given_input, std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions& opts) {
  check_dtype(given_input, given_output, "alltoall_base");
  // A complex tensor splits along dim 0 of its real view, which a 0-dim one lacks.
  TORCH_CHECK(!(given_input.defined() && given_input.is_complex() && given_input.dim() == 0) &&
                  !(given_output.defined() && given_output.is_complex() && given_output.dim() == 0),
              "smddp alltoall_base: a 0-dim complex tensor cannot be split among ranks; give it "
              "a dimension (t.reshape(1))");
  at::Tensor output = as_elems(given_output);
  at::Tensor input = as_elems(given_input);
  check_tensor(input, "alltoall_base");
  check_tensor(output, "alltoall_base");
  check_alike(input, output, "alltoall_base");
  smddp_dtype_t dt = to_smddp_dtype(input.scalar_type(), false);
  std::vector<int64_t> scounts, sdispls, rcounts, rdispls;
  split_counts(input, inputSplitSizes, size_, "input", scounts, sdispls);
  split_counts(output, outputSplitSizes, size_, "output", rcounts, rdispls);
  auto work = new_work(c10d::OpType::ALLTOALL_BASE, {output}, opts);
  at::Tensor in = stage_in(*work, input);
  at::Tensor out = stage_inout(*work, output);
  smddp_coll_attr_t attr = attr_for(in);
  if (inputSplitSizes.empty() && outputSplitSizes.empty()) {
    // Equal splits (all_to_all_single without sizes): the plain all-to-all,
    // which CUDA memory supports too. The split form stays alltoallv even
    // when its sizes happen to be equal, so that every rank issues the same
    // operation whatever sizes its peers pass.
    TORCH_CHECK(scounts[0] == rcounts[0], "smddp alltoall_base: without split sizes the input (",
                input.sizes(), ") and output (", output.sizes(), ") must have the same size");
    issue(*work, "alltoall_base", attr, [&](const smddp_coll_attr_t* a, smddp_request_t* r) {
      return smddp_alltoall(comm_, in.data_ptr(), out.data_ptr(), scounts[0], dt, a, r);
    });
  } else {
    issue(*work, "alltoall_base", attr, [&](const smddp_coll_attr_t* a, smddp_request_t* r) {
      return smddp_alltoallv(comm_, in.data_ptr(), scounts.data(), sdispls.data(), out.data_ptr(), rcounts.data(), rdispls.data(), dt, a, r);
    });
  }
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::alltoall(std::vector<at::Tensor>& given_outputs,
                                                           std::vector<at::Tensor>& given_inputs,
                                                           const c10d::AllToAllOptions& opts) {
  if (!given_inputs.empty()) {
    check_dtype(given_inputs[0], given_inputs, "alltoall");
    check_dtype(given_inputs[0], given_outputs, "alltoall");
  }
  auto outputs = as_elems(given_outputs);
  auto inputs = as_elems(given_inputs);
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ &&
                  static_cast<int>(outputs.size()) == size_,
              "smddp alltoall: the input and output lists need one tensor per rank (", size_,
              "), got ", inputs.size(), " and ", outputs.size());
  std::vector<int64_t> scounts(size_), sdispls(size_), rcounts(size_), rdispls(size_);
  std::vector<at::Tensor> parts;
  for (int i = 0; i < size_; ++i) {
    check_tensor(inputs[i], "alltoall");
    check_tensor(outputs[i], "alltoall");
    check_alike(inputs[i], inputs[0], "alltoall");
    check_alike(outputs[i], inputs[0], "alltoall");
    scounts[i] = inputs[i].numel();
    rcounts[i] = outputs[i].numel();
    if (i > 0) {
      sdispls[i] = sdispls[i - 1] + scounts[i - 1];
      rdispls[i] = rdispls[i - 1] + rcounts[i - 1];
    }
    parts.push_back(inputs[i].reshape({-1}));
  }
  smddp_dtype_t dt = to_smddp_dtype(inputs[0].scalar_type(), false);
  auto work = new_work(c10d::OpType::ALLTOALL, outputs, opts);
  at::Tensor send = at::cat(parts);
  at::Tensor recv = at::empty({rdispls[size_ - 1] + rcounts[size_ - 1]}, send.options());
  keep(*work, send);
  keep(*work, recv);
  smddp_coll_attr_t attr = attr_for(send);
  issue(*work, "alltoall", attr, [&](const smddp_coll_attr_t* a, smddp_request_t* r) {
    return smddp_alltoallv(comm_, send.data_ptr(), scounts.data(), sdispls.data(), recv.data_ptr(), rcounts.data(), rdispls.data(), dt, a, r);
  });
  then(*work, [recv, outputs, rcounts, rdispls]() mutable {
    for (size_t i = 0; i < outputs.size(); ++i) {
      outputs[i].copy_(recv.narrow(0, rdispls[i], rcounts[i]).view(outputs[i].sizes()));
    }
  });
  return enqueue(work);
}

// The gather into output (the root's world size x input; undefined elsewhere)
// of work, whose stream, on CUDA, comes from the input where it has none.
void ProcessGroupSMDDP::issue_gather_base(const c10::intrusive_ptr<WorkSMDDP>& work,
                                          const at::Tensor& output, const at::Tensor& input,
                                          int root) {
  smddp_dtype_t dt = to_smddp_dtype(input.scalar_type(), false);
  if (!work->stream_ && input.is_cuda()) {
    // A non-root has no outputs to take the stream from: without one the
    // gather would read its input whenever the progress thread got to it, not
    // in the caller's stream order (as the input's next writer expects).
    work->stream_ = c10::impl::getDeviceGuardImpl(input.device().type())->getStream(input.device());
  }
  at::Tensor in = stage_in(*work, input);
  at::Tensor out = output.defined() ? stage_inout(*work, output) : at::Tensor();
  smddp_coll_attr_t attr = attr_for(in);
  issue(*work, "gather", attr, [&](const smddp_coll_attr_t* a, smddp_request_t* r) {
    return smddp_gather(comm_, in.data_ptr(), out.defined() ? out.data_ptr() : nullptr,
                        in.numel(), dt, root, a, r);
  });
}

#ifdef SMDDP_C10D_BACKEND_HAS_GATHER_SINGLE
c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::gather_single(at::Tensor& given_output,
                                                                at::Tensor& given_input,
                                                                const c10d::GatherOptions& opts) {
  if (rank_ == static_cast<int>(opts.rootRank)) {
    check_dtype(given_input, given_output, "gather_single");
  }
  at::Tensor output = as_elems(given_output);
  at::Tensor input = as_elems(given_input);
  check_tensor(input, "gather_single");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "smddp gather_single: root ", root,
              " is not a rank of this group (0..", size_ - 1, ")");
  (void)to_smddp_dtype(input.scalar_type(), false);  // a dtype smddp lacks: refused here
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    check_tensor(output, "gather_single");
    check_alike(input, output, "gather_single");
    TORCH_CHECK(output.numel() == input.numel() * size_, "smddp gather_single: the root's output "
                "has ", output.numel(), " elements; it needs world size (", size_, ") x the "
                "input's ", input.numel());
    outs.push_back(output);
  }
  auto work = new_work(c10d::OpType::GATHER, outs, opts);
  issue_gather_base(work, rank_ == root ? output : at::Tensor(), input, root);
  return enqueue(work);
}
#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::gather(
    std::vector<std::vector<at::Tensor>>& given_outputs, std::vector<at::Tensor>& given_inputs,
    const c10d::GatherOptions& opts) {
  for (const auto& t : given_inputs) {
    for (const auto& list : given_outputs) {
      check_dtype(t, list, "gather");
    }
  }
  auto outputs = as_elems(given_outputs);
  auto inputs = as_elems(given_inputs);
  TORCH_CHECK(inputs.size() == 1, "smddp gather takes one input tensor per call");
  const at::Tensor& input = inputs[0];
  check_tensor(input, "gather");
  const int root = static_cast<int>(opts.rootRank);
  (void)to_smddp_dtype(input.scalar_type(), false);  // a dtype smddp lacks: refused here
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "smddp gather: the root needs one output list of world size (", size_,
                ") tensors");
    outs = outputs[0];
    for (const auto& o : outs) {
      check_tensor(o, "gather");
      check_alike(input, o, "gather");
      TORCH_CHECK(o.numel() == input.numel(), "smddp gather: an output tensor has ", o.numel(),
                  " elements, the input ", input.numel());
    }
  }
  auto work = new_work(c10d::OpType::GATHER, outs, opts);
  at::Tensor flat;
  if (rank_ == root) {
    flat = at::empty({input.numel() * size_},
                     input.options().memory_format(at::MemoryFormat::Contiguous));
  }
  issue_gather_base(work, flat, input, root);
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
    std::vector<at::Tensor>& given_outputs, std::vector<std::vector<at::Tensor>>& given_inputs,
    const c10d::ScatterOptions& opts) {
  for (const auto& t : given_outputs) {
    for (const auto& list : given_inputs) {
      check_dtype(t, list, "scatter");
    }
  }
  auto outputs = as_elems(given_outputs);
  auto inputs = as_elems(given_inputs);
  TORCH_CHECK(outputs.size() == 1, "smddp scatter takes one output tensor per call");
  const at::Tensor& output = outputs[0];
  check_tensor(output, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  smddp_dtype_t dt = to_smddp_dtype(output.scalar_type(), false);
  auto work = new_work(c10d::OpType::SCATTER, outputs, opts);
  at::Tensor flat;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "smddp scatter: the root needs one input list of world size (", size_,
                ") tensors");
    std::vector<at::Tensor> parts;
    for (const auto& t : inputs[0]) {
      check_tensor(t, "scatter");
      check_alike(t, output, "scatter");
      TORCH_CHECK(t.numel() == output.numel(), "smddp scatter: an input tensor has ", t.numel(),
                  " elements, the output ", output.numel());
      parts.push_back(t.reshape({-1}));
    }
    flat = at::cat(parts);
    keep(*work, flat);
  }
  at::Tensor out = stage_inout(*work, output);
  smddp_coll_attr_t attr = attr_for(out);
  issue(*work, "scatter", attr, [&](const smddp_coll_attr_t* a, smddp_request_t* r) {
    return smddp_scatter(comm_, flat.defined() ? flat.data_ptr() : nullptr, out.data_ptr(), out.numel(), dt, root, a, r);
  });
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::send(std::vector<at::Tensor>& given,
                                                       int dstRank, int tag) {
  std::vector<at::Tensor> tensors = as_elems(given);
  TORCH_CHECK(tensors.size() == 1, "smddp send takes one tensor per call");
  const at::Tensor& t = tensors[0];
  check_tensor(t, "send");
  smddp_dtype_t dt = to_smddp_dtype(t.scalar_type(), false);
  auto work = new_work(c10d::OpType::SEND, tensors);
  at::Tensor buf = stage_in(*work, t);
  smddp_coll_attr_t attr = attr_for(buf);
  issue(*work, "send", attr, [&](const smddp_coll_attr_t* a, smddp_request_t* r) {
    return smddp_send(comm_, buf.data_ptr(), buf.numel(), dt, dstRank, tag, a, r);
  });
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::recv(std::vector<at::Tensor>& tensors,
                                                       int srcRank, int tag) {
  TORCH_CHECK(srcRank >= 0, "smddp recv: source rank ", srcRank,
              " is negative; use recvAnysource (dist.recv without src) to receive from any rank");
  return recv_from(tensors, srcRank, tag);
}

// dist.recv / dist.irecv without src; the Work's sourceRank() then names the sender.
c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                int tag) {
  return recv_from(tensors, SMDDP_ANY_SOURCE, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::recv_from(std::vector<at::Tensor>& given,
                                                            int srcRank, int tag) {
  std::vector<at::Tensor> tensors = as_elems(given);
  TORCH_CHECK(tensors.size() == 1, "smddp recv takes one tensor per call");
  const at::Tensor& t = tensors[0];
  check_tensor(t, "recv");
  smddp_dtype_t dt = to_smddp_dtype(t.scalar_type(), false);
  auto work = new_work(c10d::OpType::RECV, tensors);
  at::Tensor buf = stage_inout(*work, t);
  smddp_coll_attr_t attr = attr_for(buf);
  issue(*work, "recv", attr, [&](const smddp_coll_attr_t* a, smddp_request_t* r) {
    return smddp_recv(comm_, buf.data_ptr(), buf.numel(), dt, srcRank, tag, a, r);
  });
  return enqueue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::barrier(const c10d::BarrierOptions& opts) {
  auto work = new_work(c10d::OpType::BARRIER, {}, opts);
  issue(*work, "barrier", SMDDP_COLL_ATTR_INIT,
        [&](const smddp_coll_attr_t* a, smddp_request_t* r) { return smddp_barrier(comm_, a, r); });
  return enqueue(work);
}


} // namespace smddp_torch
