// PoolMemory: one backend's tensors in its communicator's shared-memory pool
// (smddp_mem_alloc), for allocateTensor and move_to_pool.
#pragma once

#include <smddp/smddp.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include <ATen/ATen.h>

namespace smddp_torch {

class PoolMemory {
 public:
  PoolMemory();

  // Pool memory of `bytes`, as a DataPtr tagged with this PoolMemory; null
  // where comm has no pool, or it was full for as many bytes or fewer and
  // nothing pooled was freed since (warned once). The caller keeps comm
  // alive for the call.
  c10::DataPtr alloc(smddp_comm_t comm, size_t bytes);

  // Copies t's whole storage into alloc() memory and swaps the storage's
  // DataPtr (see ProcessGroupSMDDP::move_to_pool); whether the storage is
  // in this pool: already, or now.
  bool move(smddp_comm_t comm, const at::Tensor& t);

 private:
  const uint64_t owner_;              // the tag on this PoolMemory's DataPtrs
  std::atomic<bool> no_pool_{false};  // smddp_mem_alloc: the communicator has none
  // The pool was full for full_bytes_ when the count of pooled frees was full_at_.
  std::mutex full_mutex_;
  uint64_t full_at_ = UINT64_MAX;
  size_t full_bytes_ = 0;
};

}  // namespace smddp_torch
