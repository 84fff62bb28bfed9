/* Reduce on CUDA memory through CUDA IPC: the one-shot allreduce, reduced on the root only. */
#if SMDDP_HAVE_CUDA
#include "cuda_algo.h"

static smddp_status_t reduce(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__cuda_step_t s = smddp__cuda_step_of(comm, op);
    return smddp__cuda_allreduce_steps(&s, smddp__cuda_local_root(comm, op));
}

SMDDP_CUDA_ALGO(reduce, REDUCE, reduce, NULL, "as allreduce, kept on the root");
#endif
