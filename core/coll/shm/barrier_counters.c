/* Barrier through the staging counters (transport/shm.h): every rank posts and waits for all. */
#include "shm_algo.h"

static smddp_status_t barrier_counters(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__shm_sync(comm, op);
}

SMDDP_SHM_ALGO(barrier_counters, "counters", BARRIER, NULL, barrier_counters, NULL,
               "every rank posts its counter and waits for all");
