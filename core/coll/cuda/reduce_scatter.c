/*
 * Reduce-scatter on CUDA memory through CUDA IPC. Events path: the
 * all-to-all's rounds (alltoall.c), each rank reducing its block from every
 * peer's staging. Under SMDDP_CUDA_SYNC=kernel, the kernels of
 * cuda/kernel_sync.c.
 */
#if SMDDP_HAVE_CUDA
#include "cuda_algo.h"

static smddp_status_t reduce_scatter(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__cuda_step_t s = smddp__cuda_step_of(comm, op);
    if (s.c->ks_on) return smddp__ksync_reduce_scatter(comm, &s.c->ks, op);
    return smddp__cuda_blockwise(&s, -1, true);
}

SMDDP_CUDA_ALGO(reduce_scatter, REDUCE_SCATTER, reduce_scatter, smddp__cuda_kernel_ways,
                "each rank reduces its block from every peer's staging");
#endif
