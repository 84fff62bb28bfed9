// The torch process-group backend "smddp": a c10d::Backend that runs every
// collective through libsmddp's public C API (smddp/smddp.h) and nothing else.
#pragma once

#include <smddp/smddp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "pool_memory.hpp"

namespace smddp_torch {
namespace detail {
struct SmddpReduction;  // convert.hpp
}  // namespace detail
}  // namespace smddp_torch

namespace smddp_torch {

class ProcessGroupSMDDP;

// The completion hook torch registers on a process group
// (ProcessGroup._register_on_completion_hook; its flight recorder and tools
// built on it): one WorkInfo per completed work, delivered in completion
// order on a thread of its own, so a slow hook (or one that takes the GIL)
// never holds up a collective. Shared by the backend and its works; close()
// delivers what is queued, then stops the thread.
class CompletionHooks {
 public:
  explicit CompletionHooks(std::function<void(std::shared_ptr<c10d::WorkInfo>)> hook);
  ~CompletionHooks();
  void post(std::shared_ptr<c10d::WorkInfo> info);
  void close();

 private:
  void run();

  std::function<void(std::shared_ptr<c10d::WorkInfo>)> hook_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<c10d::WorkInfo>> queue_;
  bool closing_ = false;
  std::thread thread_;
};

// One torch-level operation: one or more libsmddp requests issued in order on
// one communicator, the buffers they use, and the copies back into the
// caller's tensors that must run once they succeed.
//
// Completion: every request carries a libsmddp completion callback; the last
// one to finish runs the copies back, then completes the Future and the Work,
// on whichever thread finished it: libsmddp's progress thread, or the thread
// in wait() that ran the operation itself (libsmddp runs a still-queued
// operation on the waiting thread rather than hand it to the progress
// thread). The GIL is never taken, so a Future callback (DDP's comm hook)
// runs at once; a collective it issues runs before the issuing call returns
// (libsmddp's rule for operations issued from completion callbacks). Until every request has been issued the work holds one more
// "pending" count, so it cannot complete half-built; once issued it keeps
// itself alive (self_) until it has completed, so a caller may drop it
// unwaited.
class WorkSMDDP : public c10d::Work {
 public:
  WorkSMDDP(int rank, c10d::OpType type, c10::weak_intrusive_ptr<c10d::Backend> backend,
            smddp_comm_t comm, uint64_t seq, std::vector<at::Tensor> outputs);
  ~WorkSMDDP() override;

  // Without a timeout, waits until the operation ends: libsmddp fails it at
  // its own timeout (the options' timeout) or the communicator's. With one,
  // the requests are waited with smddp_wait(timeout) and a DistBackendError
  // is thrown if they are not done in time (the operation keeps running).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  uint64_t getSequencenumber() const override;
  // Milliseconds from issue to completion, for works issued after the
  // backend's enableCollectivesTiming(); throws for others, or before the
  // work completed.
  float getDuration() const override;
  // The sender of a completed recv (for recvAnysource, the rank it matched).
  int sourceRank() const override;
  // A work that has not completed: aborts its group's communicator, as
  // ProcessGroupNCCL's works do (a collective cannot be withdrawn from one
  // rank alone; the peers fail too, naming the abort), so this work and every
  // other pending one complete at once with the abort's error. A completed
  // work, or one whose group is gone, is left as it is.
  void abort() override;

 private:
  friend class ProcessGroupSMDDP;

  // libsmddp's completion callback; arg is the WorkSMDDP.
  static void on_request_done(void* arg, smddp_status_t status);
  // Drops one pending count; the last one completes the work.
  void release_pending();
  // Runs the copies back (on success), completes the Future and the Work.
  void complete();
  // The end of wait(), once nothing of libsmddp's is left to wait for.
  bool wait_completed();
  // Completes future with outputs_, or with eptr where the work failed.
  void complete_future(c10::ivalue::Future& future, const std::exception_ptr& eptr);

  smddp_comm_t comm_;
  // The group, for abort(): a work may outlive it.
  c10::weak_intrusive_ptr<c10d::Backend> backend_;
  uint64_t seq_;
  std::vector<smddp_request_t> requests_;
  std::vector<at::Tensor> outputs_;    // the Future's value
  std::vector<at::Tensor> keepalive_;  // buffers libsmddp reads or writes
  // endCoalescing's work: the works issued while coalescing; it completes
  // when they all have (each holds one pending count), with the first error.
  std::vector<c10::intrusive_ptr<WorkSMDDP>> parts_;
  std::vector<std::function<void()>> finalizers_;  // copies back, in order
  // The Future: made at construction for CUDA works, at the first
  // getFuture() for host ones (a blocking dist.all_reduce never asks for
  // it). future_done_ and future_error_ record the completion, so that a
  // Future made after it is completed at once. All three under future_mutex_.
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool future_done_ = false;
  std::exception_ptr future_error_;
  c10::intrusive_ptr<WorkSMDDP> self_;  // set while not completed
  // CUDA works: the issuing thread's current stream on the outputs' device.
  // Completion (copies back, the Future's events) runs on it, whichever
  // thread completes the work.
  std::optional<c10::Stream> stream_;
  std::atomic<int> pending_{1};         // unfinished requests, + 1 while issuing
  // The options' timeout (ms), which libsmddp enforces for this operation
  // (smddp_coll_attr_t::timeout_ms); 0: the communicator's.
  int64_t own_timeout_ms_ = 0;
  // The caller waits for this work as soon as it is returned (torch's
  // async_op=False): its requests ask libsmddp to run them at issue.
  bool wait_now_ = false;
  // enableCollectivesTiming(): issue and completion times (steady clock);
  // both stay at the epoch for works issued without it.
  std::chrono::steady_clock::time_point issued_at_, completed_at_;
  // The backend's completion hook, when one was registered before issue.
  std::shared_ptr<CompletionHooks> hooks_;
  std::mutex error_mutex_;
  std::string error_;                   // the first failed request's message
};

// What ProcessGroupSMDDP::getBackendOptions() returns: torch's options with
// a weak reference back to the backend.
struct SMDDPOptions : c10d::Backend::Options {
  SMDDPOptions(std::chrono::milliseconds timeout, c10::weak_intrusive_ptr<c10d::Backend> backend)
      : Options("smddp", timeout), backend(std::move(backend)) {}
  c10::weak_intrusive_ptr<c10d::Backend> backend;
};

class ProcessGroupSMDDP : public c10d::Backend {
 public:
  // Creates the communicator through store (collective over size ranks);
  // timeout becomes the communicator's deadline for every wait.
  // name: torch's name of the group ("" if unknown), which names its
  // communicator (the prefix "smddp/<name>": log lines, trace files).
  ProcessGroupSMDDP(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout, const std::string& name = "");
  // Takes over comm, a communicator split from another backend's.
  ProcessGroupSMDDP(smddp_comm_t comm, int rank, int size, std::chrono::milliseconds timeout);
  ~ProcessGroupSMDDP() override;

  const std::string getBackendName() const override {
    return "smddp";
  }
  // The group's timeout and a weak reference to this backend (SMDDPOptions),
  // through which smddp's Python calls find it behind torch's wrapper
  // (module.cpp).
  c10::intrusive_ptr<Options> getBackendOptions() override;

  // ProcessGroup.split_group() (the method; test_backend.py uses it): every
  // rank of this group calls it (smddp_comm_split is collective); ranks not
  // in `ranks` get nullptr. Torch's store is not needed: the child
  // rendezvouses through its parent's. supportsSplitting() stays false, so
  // torch.distributed.split_group() refuses smddp groups and new_group()
  // builds them through the store, which needs no call on non-members (its
  // no-colour split call exists for NCCL only).
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  // Applies to operations that start afterwards.
  void setTimeout(std::chrono::milliseconds timeout) override;

#ifdef SMDDP_C10D_BACKEND_HAS_TENSOR_ALLOC
  // CPU tensors in this rank's pool (smddp_mem_alloc), which collectives on
  // this group move in place between the ranks of a node; FSDP2 asks for its
  // communication buffers here after set_allocate_memory_from_process_group().
  // torch passes the device's index: -1, the CPU, is supported. A tensor the
  // pool cannot hold (no pool, pool full, not on the CPU) comes from
  // at::empty instead. A pooled tensor may outlive the group.
  bool supportsTensorAlloc(c10::DeviceIndex deviceIdx) override {
    return deviceIdx < 0;
  }
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;
#endif

#ifdef SMDDP_C10D_BACKEND_HAS_SHRINK
  // torch.distributed.shrink_group: the surviving ranks call it with the
  // same ranks_to_exclude (smddp_comm_shrink); shrink_flags 1
  // (SHRINK_ABORT) aborts this group's pending works first. The new backend
  // keeps this one's timeout unless opts_override gives one.
  bool supportsShrinking() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude,
                                           int shrink_flags,
                                           const c10::intrusive_ptr<Options>& opts_override) override;
#endif

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputTensorLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
#ifdef SMDDP_C10D_BACKEND_HAS_GATHER_SINGLE
  // torch 2.14's gather into one buffer: the root's output holds world size x
  // the input, rank r's at r x numel; the other ranks' output is not used.
  c10::intrusive_ptr<c10d::Work> gather_single(at::Tensor& output, at::Tensor& input,
                                               const c10d::GatherOptions& opts) override;
#endif
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override {
    return seq_.load();
  }

  void abort() override;
  void shutdown() override;
  // SUCCESS while the communicator works; else its first failure: TIMEOUT,
  // REMOTE_ERROR (a peer died or aborted), COMM_ERROR (anything else).
  c10d::ErrorType getError() override;
  // torch's abort hooks (ProcessGroup.register_abort_hook, on a torch whose
  // Backend.hpp defines C10D_BACKEND_HAS_HOOKS): each runs once, before this
  // group reports its first failure (a timeout, a lost peer, an abort) or
  // before abort() acts, on the thread that sees it first.
#ifdef C10D_BACKEND_HAS_HOOKS
  void registerAbortHook(int64_t hook_id, c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t hook_id) override;
#endif
  void run_abort_hooks();
  // Coalescing (torch's _coalescing_manager given a device, which
  // batch_isend_irecv uses): between startCoalescing and endCoalescing, the
  // operations the calling thread issues on this group go out as they come
  // (libsmddp runs collectives in order, and sends and receives do not wait
  // for one another, so a ring of isend/irecv cannot deadlock), none waits
  // at issue, and endCoalescing returns one work that completes when all of
  // them have, failing with the first one's error. Other threads' operations
  // are not part of it.
  bool supportsCoalescing() const override {
    return true;
  }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // From now on, works record when they were issued and when they completed
  // (Work.getDuration(), in ms).
  void enableCollectivesTiming() override {
    timing_.store(true);
  }

  // torch's ProcessGroup._register_on_completion_hook: hook gets a WorkInfo
  // (op type, sequence number, issue and completion times, their difference
  // as the active duration) for every work issued from now on, on a thread
  // of the backend's. Once per group, as ProcessGroupNCCL allows.
#ifdef SMDDP_C10D_BACKEND_HAS_COMPLETION_HOOK
  void registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override;
  // Waits for every work issued since a hook was registered (torch calls it
  // before it destroys a group that has hooks, so that every hook call is
  // made); failed works are not rethrown here, their own wait() says why.
  void waitForPendingWorks() override;
#endif

  // smddp.all_reduce and smddp.all_gather_into_tensor: the collective runs
  // on the calling thread and has completed when these return (libsmddp's
  // blocking call), with no Work, Future or dispatcher in between. Where a
  // Work is needed for the same result (a tensor libsmddp cannot use in
  // place: not contiguous or not on the CPU; a group that is coalescing, or
  // that has completion hooks or timing on), they issue through the usual
  // path and wait for it. A failure throws what a work's wait() would.
  void allreduce_now(at::Tensor& tensor, const c10d::ReduceOp& rop);
  void allgather_now(at::Tensor& output, at::Tensor& input);

  // Writes libsmddp's flight recorder of this group's communicator to path,
  // or "" for SMDDP_TRACE_DIR's file (smddp_comm_dump_trace); returns the
  // path written; throws with libsmddp's message on failure.
  std::string dump_trace(const std::string& path);

  // Moves the whole storage of t (a CPU tensor) into this rank's pool: its
  // bytes are copied into smddp_mem_alloc memory, which from then on backs
  // the storage, and so every tensor that shares it (its views too); the old
  // memory is freed at once. Collectives of this group then read and write
  // it in place (DDP's buckets: smddp.allreduce_hook). Only for storages
  // nobody reaches by their old address (numpy arrays, from_blob tensors
  // and data_ptr() values taken before keep the old one), with no operation
  // under way on them and no other thread using them. Returns whether the
  // storage lies in this group's pool: already (a tensor from
  // allocateTensor or moved before; true without a copy), or now; false
  // where this group has no pool, t is not on the CPU or is empty, or the
  // pool is full (warned once), leaving t as it was. A storage in another
  // group's pool is moved into this one's.
  bool move_to_pool(const at::Tensor& t) {
    InUse in_use(*this);
    return pool_.move(comm_, t);
  }

  // libsmddp's straggler telemetry of this group's communicator
  // (smddp_comm_get_stats): the summary, and each group rank's lateness in
  // ns (-1 where not covered).
  smddp_comm_stats_t stats(std::vector<int64_t>& late_ns);

  // smddp_comm_peer_state of every rank of the group, in rank order.
  std::vector<smddp_peer_state_t> peer_states();

  // Held by each call into comm_ (a request's issue, a blocking call, a
  // wait on a request): shutdown() refuses new calls and waits for those
  // under way before it destroys the communicator, so that none runs on a
  // freed one. A wait is not refused: what was issued completes. A
  // shutdown() on a thread that holds one (a Future callback run inside
  // wait()) refuses new calls at once and destroys the communicator when
  // that thread lets its last one go, instead of waiting for itself.
  class InUse {
   public:
    enum Kind { kCall, kWait };
    explicit InUse(ProcessGroupSMDDP& pg, Kind kind = kCall);  // kCall: throws once shut down
    ~InUse();
    InUse(const InUse&) = delete;
    InUse& operator=(const InUse&) = delete;

   private:
    ProcessGroupSMDDP& pg_;
  };

 private:
  // Whether t can go to libsmddp's blocking call: on the CPU, contiguous,
  // and the group neither coalescing nor recording works (completion hooks,
  // timing). The direct calls (allreduce_now, allgather_now), and
  // runs_without_work for async_op=False.
  bool runs_now(const at::Tensor& t);
  // Whether a blocking call that failed with st ran nothing: an argument
  // libsmddp refuses, a feature it lacks, memory for the request, with the
  // communicator still healthy (the same codes from a collective that ran
  // come with the communicator failed).
  bool refused(smddp_status_t st);
  // Throws for a blocking call of type (fn: its name in refusals) that returned st.
  [[noreturn]] void fail_now(c10d::OpType type, const char* fn, smddp_status_t st);
  // The backend of a communicator split or shrunk from this one: opts' timeout, else this one's.
  c10::intrusive_ptr<c10d::Backend> adopt_child(smddp_comm_t child,
                                                const c10::intrusive_ptr<Options>& opts);
  c10::intrusive_ptr<c10d::Work> recv_from(std::vector<at::Tensor>& tensors, int srcRank, int tag);
  // This backend, for works and options that must not keep it alive.
  c10::weak_intrusive_ptr<c10d::Backend> weak_self() {
    return c10::weak_intrusive_ptr<c10d::Backend>(
        c10::intrusive_ptr<c10d::Backend>::unsafe_reclaim_from_nonowning(this));
  }
  c10::intrusive_ptr<WorkSMDDP> new_work(c10d::OpType type, std::vector<at::Tensor> outputs);
  // The same, for a collective called with opts: it runs under the
  // options' timeout when they set one (libsmddp fails it then, and aborts
  // the group, as for the group's timeout); with async_op=False the caller
  // waits at once, so the work's requests run at issue when the communicator
  // is idle (SMDDP_COLL_WAIT_NOW).
  template <typename Opts>
  c10::intrusive_ptr<WorkSMDDP> new_work(c10d::OpType type, std::vector<at::Tensor> outputs,
                                         const Opts& opts) {
    auto work = new_work(type, std::move(outputs));
    work->wait_now_ = waits_now(opts, 0) && !coalescing_here();
    if (opts.timeout.count() > 0) {
      work->own_timeout_ms_ = opts.timeout.count();
    }
    return work;
  }
  // torch's options carry asyncOp (set by torch.distributed's Python calls);
  // options without it say nothing.
  template <typename Opts>
  static auto waits_now(const Opts& opts, int) -> decltype(opts.asyncOp, bool()) {
    return !opts.asyncOp;
  }
  template <typename Opts>
  static bool waits_now(const Opts&, long) {
    return false;
  }
  // Issues one request of work: call(attr, req) is the libsmddp call, given
  // attr with the work's completion callback added. A failed call throws a
  // DistBackendError; the requests the work already issued are waited for
  // when the work is dropped (their buffers die with it).
  template <typename Call>
  void issue(WorkSMDDP& work, const char* fn, smddp_coll_attr_t attr, Call&& call) {
    attr.on_complete = &WorkSMDDP::on_request_done;
    attr.on_complete_arg = &work;
    if (work.wait_now_) {
      attr.flags |= SMDDP_COLL_WAIT_NOW;
    }
    attr.timeout_ms = work.own_timeout_ms_;
    InUse in_use(*this);
    work.pending_.fetch_add(1);
    smddp_request_t req = nullptr;
    smddp_status_t st = call(&attr, &req);
    if (st != SMDDP_OK) {
      work.pending_.fetch_sub(1);
      fail_issue(fn, st);
    }
    work.requests_.push_back(req);
  }
  [[noreturn]] void fail_issue(const char* fn, smddp_status_t st);
  // Ends the issue of a work whose requests are all issued; returns it.
  c10::intrusive_ptr<c10d::Work> enqueue(const c10::intrusive_ptr<WorkSMDDP>& work);

  // Building blocks of the collectives (they reach into WorkSMDDP's state).
  at::Tensor stage_in(WorkSMDDP& work, const at::Tensor& t);
  at::Tensor stage_inout(WorkSMDDP& work, const at::Tensor& t);
  void keep(WorkSMDDP& work, const at::Tensor& t);
  void then(WorkSMDDP& work, std::function<void()> fn);
  // op: check_allreduce's result for tensor.
  void issue_allreduce(const c10::intrusive_ptr<WorkSMDDP>& work, const at::Tensor& tensor,
                       const detail::SmddpReduction& op);
  // Whether a call with async_op=False (waits) on tensors a and b runs
  // libsmddp's blocking call and returns no Work: both are runs_now's, and
  // torch's in-flight collective registry (torch.compile's wait_tensor),
  // which needs a Work to register, is off. torch.distributed's collectives
  // take a null Work from a backend that has synchronised in C++, and skip
  // wait().
  bool runs_without_work(bool waits, const at::Tensor& a, const at::Tensor& b);
  // libsmddp's blocking call of a collective on this thread: call(attr)
  // with attr's timeout set to timeout (0: the communicator's), counted in
  // the group's sequence and, under a profiler, recorded as a Work of type
  // would be; throws what a work's wait() would (fn names the call).
  template <typename Call>
  void run_blocking(c10d::OpType type, const char* fn, smddp_coll_attr_t attr,
                    std::chrono::milliseconds timeout, Call&& call);
  // Through run_blocking: an allreduce of t in place, a tensor runs_now accepts;
  void blocking_allreduce(const at::Tensor& t, const detail::SmddpReduction& op,
                          std::chrono::milliseconds timeout);
  // an allgather of input into output (check_allgather_base's dtype);
  void blocking_allgather(const at::Tensor& output, const at::Tensor& input, smddp_dtype_t dt,
                          std::chrono::milliseconds timeout);
  // a reduce-scatter of input into output (check_reduce_scatter_base's op).
  void blocking_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                               const detail::SmddpReduction& op,
                               std::chrono::milliseconds timeout);
  // allgather into a list of world-size tensors through one flat buffer.
  void issue_allgather_list(const c10::intrusive_ptr<WorkSMDDP>& work,
                            std::vector<at::Tensor>& outs, const at::Tensor& input);
  void issue_allgather_base(const c10::intrusive_ptr<WorkSMDDP>& work, const at::Tensor& output,
                            const at::Tensor& input);
  void issue_gather_base(const c10::intrusive_ptr<WorkSMDDP>& work, const at::Tensor& output,
                         const at::Tensor& input, int root);
  void issue_reduce_scatter_base(const c10::intrusive_ptr<WorkSMDDP>& work,
                                 const at::Tensor& output, const at::Tensor& input,
                                 const c10d::ReduceOp& rop);

  std::shared_mutex use_mutex_;  // shared by InUse holders, held by shutdown() to destroy
  std::atomic<bool> closing_{false};

  smddp_comm_t comm_ = nullptr;
  std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<bool> timing_{false};
  PoolMemory pool_;  // allocateTensor's and move_to_pool's memory
  std::shared_ptr<CompletionHooks> hooks_;  // set once, by registerOnCompletionHook
  // With a hook: the works issued and maybe not completed (for waitForPendingWorks).
  std::vector<c10::weak_intrusive_ptr<WorkSMDDP>> pending_works_;
  std::mutex hooks_mutex_;
  // Between startCoalescing and endCoalescing on coalescing_thread_.
  bool coalescing_here() {
    return coalescing_.load(std::memory_order_relaxed) &&
           coalescing_thread_ == std::this_thread::get_id();
  }
  std::atomic<bool> coalescing_{false};
  std::thread::id coalescing_thread_;
  std::vector<c10::intrusive_ptr<WorkSMDDP>> coalesced_;  // that thread's works so far
  // This rank's last split (see split()): its store, whether this rank was
  // in the new group, and the new group's backend.
  c10::intrusive_ptr<c10d::Store> last_split_store_;
  bool last_split_member_ = false;
  c10::weak_intrusive_ptr<c10d::Backend> last_split_child_{
      c10::intrusive_ptr<c10d::Backend>()};
  std::mutex abort_hooks_mutex_;
  std::map<int64_t, std::function<void()>> abort_hooks_;
  std::atomic<bool> abort_hooks_ran_{false};
  std::once_flag shutdown_once_;
  std::atomic<bool> shutdown_deferred_{false};  // asked for inside an InUse (see InUse)
  void shutdown_now();
  // abort() may come from another thread (a watchdog) while shutdown()
  // destroys the communicator: it waits for the destroy rather than use a
  // communicator being freed (libsmddp's destroy must not race other calls).
  std::mutex lifecycle_mutex_;
};

// Creates the backend for torch's extended-API registration; the store is
// torch's per-group PrefixStore. timeout_ms < 0 takes libsmddp's default.
c10::intrusive_ptr<c10d::Backend> create_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size, int64_t timeout_ms,
                                                 const std::string& name);

} // namespace smddp_torch
