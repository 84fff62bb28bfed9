/* Gather inside a node: the staged allgather (allgather_staged.c), copied out on the root. */
#include "shm_algo.h"

static smddp_status_t gather_staged(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__shm_gather_rounds(comm, op, smddp__local_index(comm, op->root));
}

SMDDP_SHM_ALGO(gather_staged, "staged", GATHER, NULL, gather_staged, NULL,
               "rounds of one half, copied out on the root");
