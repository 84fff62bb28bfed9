/*
 * The hierarchical barrier: everyone in the node arrives, the leaders meet,
 * the node is released.
 */
#include "hier.h"

static smddp_status_t barrier(smddp_comm_t comm, smddp__op_t *op)
{
    SMDDP_CHECK(smddp__shm_sync(comm, op));
    if (comm->local_rank == 0) {
        smddp__hier_t hr;
        SMDDP_CHECK(smddp__hier_init(comm, &hr, 0, 64));
        uint8_t one = 1;
        smddp__reduce_spec_t max = {.dtype = SMDDP_UINT8, .op = SMDDP_MAX, .premul = 1.0};
        smddp_status_t st = smddp__ring_allreduce(comm, op, &hr.ring, &max, (char *)&one, 1,
                                                  hr.off, hr.len, hr.tmp, 0);
        smddp__hier_free(&hr);
        SMDDP_CHECK(st);
    }
    return smddp__shm_sync(comm, op);
}

SMDDP_HIER_ALGO(hier_barrier, "hierarchical", BARRIER, barrier,
                "a node barrier around a barrier of one rank per node");
