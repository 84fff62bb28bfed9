/*
 * The hierarchical reduce: the hierarchical allreduce (allreduce.c), off the
 * root into scratch.
 */
#include "hier.h"

static smddp_status_t reduce(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_reduce_by(comm, op, smddp__hier_allreduce);
}

SMDDP_HIER_ALGO(hier_reduce, "hierarchical", REDUCE, reduce,
                "the hierarchical allreduce, off the root into scratch");
