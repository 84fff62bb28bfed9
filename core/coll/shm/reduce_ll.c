/*
 * Reduce to a root through the low-latency slots (transport/shm_ll.c): the
 * allreduce's one exchange, after which only the root reduces every copy,
 * in rank order.
 */
#include "shm_algo.h"

static smddp_status_t reduce_ll(smddp_comm_t comm, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    const void *srcs[MAX_LOCAL];
    SMDDP_CHECK(smddp__shm_ll_exchange(comm, op, op->sendbuf, bytes, NULL, srcs));
    if (comm->local_rank != smddp__local_index(comm, op->root)) return SMDDP_OK;
    smddp__reduce_spec_t spec = op->spec;
    spec.avg_div = comm->size;
    srcs[comm->local_rank] = op->sendbuf;
    smddp__reduce(&spec, op->recvbuf, srcs, comm->local_size, op->count);
    return SMDDP_OK;
}

SMDDP_SHM_ALGO(reduce_ll, "low-latency", REDUCE, smddp__ll_fits, reduce_ll, NULL,
               "one exchange through the low-latency slots; the root reduces every copy");
