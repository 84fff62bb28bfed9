#include "pool_memory.hpp"

#include <cstring>
#include <memory>

#include <c10/util/Exception.h>

namespace smddp_torch {

namespace {
// A pooled storage's DataPtr context: the memory and the PoolMemory that
// gave it. free_pooled, the deleter, is how a pooled storage is recognised.
struct PooledBlock {
  void* p;
  uint64_t owner;
};
std::atomic<uint64_t> pooled_frees{0};  // a full pool may have room again once this moves

void free_pooled(void* ctx) {
  auto* block = static_cast<PooledBlock*>(ctx);
  (void)smddp_mem_free(block->p);
  delete block;
  pooled_frees.fetch_add(1, std::memory_order_relaxed);
}

uint64_t new_owner() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

PoolMemory::PoolMemory() : owner_(new_owner()) {}

c10::DataPtr PoolMemory::alloc(smddp_comm_t comm, size_t bytes) {
  if (no_pool_.load(std::memory_order_relaxed)) {
    return c10::DataPtr();
  }
  uint64_t frees = pooled_frees.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(full_mutex_);
    if (full_at_ == frees && bytes >= full_bytes_) {
      return c10::DataPtr();
    }
  }
  auto block = std::make_unique<PooledBlock>(PooledBlock{nullptr, owner_});
  smddp_status_t st = smddp_mem_alloc(comm, bytes, &block->p);
  if (st == SMDDP_OK) {
    void* p = block->p;
    return c10::DataPtr(p, block.release(), &free_pooled, c10::Device(c10::kCPU));
  }
  if (st == SMDDP_ERR_NOT_SUPPORTED) {
    no_pool_.store(true, std::memory_order_relaxed);  // asked again every step: once is enough
  } else if (st == SMDDP_ERR_NO_MEMORY) {
    std::lock_guard<std::mutex> lock(full_mutex_);
    if (full_at_ != frees || bytes < full_bytes_) {  // not again until something is freed
      full_at_ = frees;
      full_bytes_ = bytes;
    }
    TORCH_WARN_ONCE("smddp: ", smddp_get_last_error(nullptr),
                    "; tensors that do not fit stay in ordinary memory and are staged");
  }
  return c10::DataPtr();
}

bool PoolMemory::move(smddp_comm_t comm, const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || !t.has_storage()) {
    return false;
  }
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const c10::DataPtr& now = storage->data_ptr();
  if (now.get_deleter() == &free_pooled &&
      static_cast<const PooledBlock*>(now.get_context())->owner == owner_) {
    return true;
  }
  size_t bytes = storage->nbytes();
  if (bytes == 0) {
    return false;
  }
  c10::DataPtr moved = alloc(comm, bytes);
  if (!moved) {
    return false;
  }
  // mutable_data(): a copy-on-write storage gets its own copy first, which
  // leaves it an ordinary storage whose DataPtr may be swapped.
  const void* src = storage->mutable_data();
  if (src == nullptr) {
    return false;  // `moved` goes back to the pool
  }
  std::memcpy(moved.get(), src, bytes);
  storage->set_data_ptr_noswap(std::move(moved));  // frees the old memory
  return true;
}

}  // namespace smddp_torch
