/*
 * Allreduce through the low-latency slots (transport/shm_ll.c): one-shot
 * with the data, the descriptor and the signal in shared cache lines, one
 * exchange in all. Each rank reduces every copy in rank order, so all agree.
 *
 * Above SMDDP_LL_OVER_POOLS_MAX the ranks also learn, in the same lines,
 * where their buffers lie: the pooled verdict (verdicts.c) that sends the
 * next allreduce of this size in place through the pools.
 */
#include "shm_algo.h"

static smddp_status_t allreduce_ll(smddp_comm_t comm, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    const void *srcs[MAX_LOCAL];
    smddp__reduce_spec_t spec = op->spec;
    spec.avg_div = comm->size;
    bool pools = smddp__pool_on(comm) && bytes > SMDDP_LL_OVER_POOLS_MAX;
    uint64_t where = 0;
    if (pools && op->sendbuf == op->recvbuf)
        where = smddp__pool_ref(comm, op->recvbuf, bytes) ? SMDDP_POOLED_IN_PLACE : 0;
    else if (pools && smddp__disjoint(op->sendbuf, bytes, op->recvbuf, bytes))
        where = smddp__pool_ref(comm, op->sendbuf, bytes) ? SMDDP_POOLED_INPUTS : 0;
    SMDDP_CHECK(smddp__shm_ll_exchange(comm, op, op->sendbuf, bytes, &where, srcs));
    if (pools) smddp__verdict_set_pooled(&comm->verdicts, bytes, (smddp__pool_verdict_t)where);
    srcs[comm->local_rank] = op->sendbuf;
    smddp__reduce(&spec, op->recvbuf, srcs, comm->local_size, op->count);
    return SMDDP_OK;
}

SMDDP_SHM_ALGO(allreduce_ll, "low-latency", ALLREDUCE, smddp__ll_fits, allreduce_ll, NULL,
               "one exchange through the low-latency slots; every rank reduces every copy");
