/*
 * The flat reduce across nodes: the ring allreduce (allreduce_ring.c), which
 * off the root writes into scratch: simple, at twice the traffic a reduce needs.
 */
#include "net_algo.h"

smddp_status_t smddp__net_reduce_by(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn allreduce)
{
    if (comm->rank == op->root) return allreduce(comm, op);
    /* Off the root: an allreduce into scratch (simple; twice the traffic). */
    smddp__op_t r = *op;
    r.recvbuf = smddp__net_scratch(comm, SMDDP_SCRATCH_OUTER,
                                   op->count * smddp__dtype_size(op->dtype));
    if (!r.recvbuf) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate scratch");
    return allreduce(comm, &r);
}

static smddp_status_t reduce_ring(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_reduce_by(comm, op, smddp__net_allreduce);
}

SMDDP_NET_ALGO(net_reduce_ring, "ring", REDUCE, reduce_ring,
               "the ring allreduce, off the root into scratch");
