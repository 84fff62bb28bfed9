/*
 * The host side of SMDDP_CUDA_SYNC=kernel (kernel_sync.c): allreduce,
 * reduce-scatter and allgather inside a node as launches of ipc_kernels.cu,
 * which meet their peers through flags in device memory (ksync.h). Each
 * rank's region (flags, launch counters, scratch) lies in the allocation
 * ipc.c shares through CUDA IPC, after the staging halves; ipc.c
 * sets it up, maps the peers' and calls in here. Only built with CUDA.
 */
#ifndef SMDDP_CORE_CUDA_KERNEL_SYNC_H
#define SMDDP_CORE_CUDA_KERNEL_SYNC_H

#include <cuda_runtime_api.h>

#include "../comm.h"
#include "ksync.h"

/* A buffer this rank registered: its allocation, as the driver names it. */
typedef struct smddp__ks_reg {
    uintptr_t base;
    size_t size;
    uint64_t id; /* the driver's buffer ID: a new allocation at the same address differs */
} smddp__ks_reg_t;

typedef struct smddp__ksync {
    size_t scratch;            /* bytes of scratch in each rank's region */
    int64_t oneshot_max;       /* SMDDP_CUDA_ONESHOT_MAX, as every rank agreed at setup */
    smddp__ks_comm_t ks;       /* what every launch gets */
    smddp__ks_control_t *ctl;  /* this rank's control block, as the host sees it */
    cudaEvent_t done;          /* recorded after this rank's latest launch, eager or replayed */
    bool launched;
    cudaStream_t side;         /* this communicator's own: zeroes the flags, writes peer_base */
    /*
     * Registration (SMDDP_CUDA_REGISTER_MIN; own and mapped NULL where it
     * cannot work here).
     * This rank's slots are published in order through the store, their
     * count in its shm word 0; word 1 + q counts the slots of local rank q
     * this rank has mapped (and written into its region's peer_base).
     */
    size_t register_min;
    smddp__ks_reg_t *own;      /* SMDDP_KS_SLOTS entries, nown used */
    int nown;
    uint32_t opened[SMDDP_KS_MAX_RANKS];
    bool open_failed[SMDDP_KS_MAX_RANKS]; /* stop mapping that peer's slots */
    void **mapped;             /* [q * SMDDP_KS_SLOTS + s]: peers' slots as mapped here */
    void *get_attributes;      /* the driver's cuPointerGetAttributes */
} smddp__ksync_t;

/* Bytes of a region with scratch bytes of scratch. */
static inline size_t smddp__ksync_region_bytes(size_t scratch)
{
    return SMDDP_KS_SCRATCH_OFFSET + scratch;
}

/*
 * Before this rank's region is published: zeroes its flags and counters
 * (device memory at region), allocates the control block and the event.
 * k->scratch and k->oneshot_max are set by the caller.
 */
smddp_status_t smddp__ksync_prepare(smddp_comm_t comm, smddp__ksync_t *k, void *region);

/*
 * Once every peer's region is mapped (regions[q], this rank's own at
 * local_rank): the kernels' view of them. max_blocks is the grid limit
 * every rank agreed.
 */
void smddp__ksync_attach(smddp_comm_t comm, smddp__ksync_t *k, char *const *regions,
                         int max_blocks);

/*
 * Tells this rank's kernels that wait for peers to give up (the abort word
 * they poll, in mapped host memory): the communicator was aborted. Any
 * thread, while the control block exists.
 */
void smddp__ksync_abort(smddp__ksync_t *k);

/* The kernels' verdict on this rank's earlier launches: an error once they gave up. */
smddp_status_t smddp__ksync_check(smddp_comm_t comm, const smddp__ksync_t *k);

/* op on its stream, the op's device current. */
smddp_status_t smddp__ksync_allreduce(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op);
smddp_status_t smddp__ksync_reduce_scatter(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op);
smddp_status_t smddp__ksync_allgather(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op);

/*
 * Waits for this rank's launches (each ends within SMDDP_TIMEOUT), says so
 * if they gave up, frees the control block and the event; the region's
 * device is current. The region
 * itself belongs to ipc.c's allocation.
 */
void smddp__ksync_release(smddp_comm_t comm, smddp__ksync_t *k);

#endif /* SMDDP_CORE_CUDA_KERNEL_SYNC_H */
