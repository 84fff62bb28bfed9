/* Scatter on CUDA memory through CUDA IPC: the all-to-all's rounds (alltoall.c), from the root. */
#if SMDDP_HAVE_CUDA
#include "cuda_algo.h"

static smddp_status_t scatter(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__cuda_step_t s = smddp__cuda_step_of(comm, op);
    return smddp__cuda_blockwise(&s, smddp__cuda_local_root(comm, op), false);
}

SMDDP_CUDA_ALGO(scatter, SCATTER, scatter, NULL,
                "each rank reads its piece from the root's staging");
#endif
