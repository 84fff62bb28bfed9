/*
 * The hierarchical allreduce (allreduce.c) with one rank per node on the
 * network: for small messages, where the network's latency decides.
 */
#include "hier.h"

static smddp_status_t allreduce_leader(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__hier_allreduce_k(comm, op, 1);
}

smddp_status_t smddp__hier_allreduce_leader(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_via_fp32(comm, op, op->count, op->count, allreduce_leader);
}

SMDDP_HIER_ALGO(hier_allreduce_leader, "hier-leader", ALLREDUCE, smddp__hier_allreduce_leader,
                "as hierarchical, one rank per node on the network");
