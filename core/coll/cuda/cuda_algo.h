/*
 * What the algorithms on CUDA memory among the ranks of one node share
 * (core/coll/cuda/, one algorithm per file; built with CUDA only): the steps
 * of the CUDA IPC transport (cuda/ipc.h), each chunk staged in a half of
 * every local rank's device buffer, and the bodies that serve a second
 * kind. Under SMDDP_CUDA_SYNC=kernel, allreduce, reduce-scatter and
 * allgather run the kernels of cuda/kernel_sync.c instead.
 */
#ifndef SMDDP_CORE_COLL_CUDA_ALGO_H
#define SMDDP_CORE_COLL_CUDA_ALGO_H

#include "../../cuda/ipc.h"
#include "../../param.h"
#include "../../topo.h"
#include "../coll.h"

/* op's root as a local rank, or -1 for an op without one. */
static inline int smddp__cuda_local_root(smddp_comm_t comm, const smddp__op_t *op)
{
    return op->root >= 0 ? smddp__local_index(comm, op->root) : -1;
}

/*
 * The events path's allreduce (allreduce.c): one-shot up to
 * SMDDP_CUDA_ONESHOT_MAX, else two-shot; with root >= 0 a one-shot reduce
 * to that local rank.
 */
smddp_status_t smddp__cuda_allreduce_steps(smddp__cuda_step_t *s, int root);

/* The events path's allgather (allgather.c); with root >= 0 a gather to that local rank. */
smddp_status_t smddp__cuda_gather_steps(smddp__cuda_step_t *s, int root);

/*
 * The ops whose input is one block per rank (alltoall.c): each chunk stages
 * the same slice of every block, side by side. reduce: reduce-scatter;
 * src_root >= 0: only that rank's input is read (scatter); else alltoall.
 */
smddp_status_t smddp__cuda_blockwise(smddp__cuda_step_t *s, int src_root, bool reduce);

/*
 * The ways an entry that can run the kernels records (allreduce.c): under
 * SMDDP_CUDA_SYNC=kernel, the kernels' one-shot or two-shot, and whether
 * they read the input in place.
 */
extern const char *const smddp__cuda_kernel_ways[];

/* One registry entry of path cuda-ipc: every kind's algorithm is named "cuda-ipc". */
#define SMDDP_CUDA_ALGO(var, kind, run, ways, about)                                               \
    const smddp__algo_t smddp__algo_cuda_##var = {"cuda-ipc", SMDDP_OP_##kind,                     \
                                                  SMDDP_PATH_CUDA_IPC, false, NULL, run, ways,     \
                                                  about}

#endif /* SMDDP_CORE_COLL_CUDA_ALGO_H */
