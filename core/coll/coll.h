/*
 * The collectives among the ranks of one node, through shared memory: the
 * reductions (allreduce.c: one-shot and two-shot) and the data movement
 * (coll.c). The router (exec.c) picks them for host memory on one node.
 */
#ifndef SMDDP_CORE_COLL_H
#define SMDDP_CORE_COLL_H

#include "../comm.h"

/*
 * Whether [a, a + alen) and [b, b + blen) share no byte. An input that
 * overlaps its output is read in place by peers only in the exact in-place
 * layouts, where no rank writes what a peer reads.
 */
static inline bool smddp__disjoint(const void *a, size_t alen, const void *b, size_t blen)
{
    return (const char *)a + alen <= (const char *)b || (const char *)b + blen <= (const char *)a;
}

smddp_status_t smddp__allreduce(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__reduce_root(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__reduce_scatter(smddp_comm_t comm, smddp__op_t *op);

smddp_status_t smddp__coll_broadcast(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__coll_allgather(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__coll_gather(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__coll_scatter(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__coll_alltoall(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__coll_alltoallv(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__coll_barrier(smddp_comm_t comm, smddp__op_t *op);

#endif /* SMDDP_CORE_COLL_H */
