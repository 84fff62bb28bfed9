/* Gather on CUDA memory through CUDA IPC: the allgather's steps, copied out on the root only. */
#if SMDDP_HAVE_CUDA
#include "cuda_algo.h"

static smddp_status_t gather(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__cuda_step_t s = smddp__cuda_step_of(comm, op);
    return smddp__cuda_gather_steps(&s, smddp__cuda_local_root(comm, op));
}

SMDDP_CUDA_ALGO(gather, GATHER, gather, NULL, "as allgather, on the root");
#endif
