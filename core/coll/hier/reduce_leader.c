/*
 * The hier-leader reduce: the hier-leader allreduce (allreduce_leader.c),
 * off the root into scratch.
 */
#include "hier.h"

static smddp_status_t reduce_leader(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_reduce_by(comm, op, smddp__hier_allreduce_leader);
}

SMDDP_HIER_ALGO(hier_reduce_leader, "hier-leader", REDUCE, reduce_leader,
                "the hier-leader allreduce, off the root into scratch");
