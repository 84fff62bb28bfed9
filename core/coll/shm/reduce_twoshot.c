/*
 * Reduce to a root inside a node: the two-shot allreduce
 * (allreduce_twoshot.c) without the final copy off the root.
 */
#include "shm_algo.h"

static smddp_status_t reduce_twoshot(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__shm_twoshot(comm, op, smddp__local_index(comm, op->root));
}

SMDDP_SHM_ALGO(reduce_twoshot, "two-shot", REDUCE, NULL, reduce_twoshot, NULL,
               "two-shot allreduce, copied out on the root only");
