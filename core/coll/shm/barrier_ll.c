/* Barrier through the low-latency slots (transport/shm_ll.c): one exchange of tags. */
#include "shm_algo.h"

static smddp_status_t barrier_ll(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__shm_ll_exchange(comm, op, NULL, 0, NULL, NULL);
}

static bool ll_slots(const smddp__select_in_t *in) { return in->facts & SMDDP_FACT_LL_SLOTS; }

SMDDP_SHM_ALGO(barrier_ll, "low-latency", BARRIER, ll_slots, barrier_ll, NULL,
               "one exchange through the low-latency slots");
