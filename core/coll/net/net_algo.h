/*
 * What the flat algorithms across nodes share (core/coll/net/, one
 * algorithm per file): every rank is on the network, and each algorithm is
 * built from ring.c's blocks over the group of every rank.
 */
#ifndef SMDDP_CORE_COLL_NET_ALGO_H
#define SMDDP_CORE_COLL_NET_ALGO_H

#include "../../algo.h"
#include "ring.h"

/* The group of every rank of comm, in rank order. */
static inline const smddp__ring_t *smddp__net_everyone(smddp_comm_t comm, smddp__ring_t *g)
{
    *g = (smddp__ring_t){.p = comm->size, .me = comm->rank, .ranks = NULL};
    return g;
}

/* The ring allreduce (allreduce_ring.c), fp16/bf16 through fp32. */
smddp_status_t smddp__net_allreduce(smddp_comm_t comm, smddp__op_t *op);

/* A reduce as allreduce, which off the root writes into scratch (reduce_ring.c). */
smddp_status_t smddp__net_reduce_by(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn allreduce);

/* The pairwise exchange with per-pair counts (alltoallv_pairwise.c). */
smddp_status_t smddp__net_pairwise(smddp_comm_t comm, smddp__op_t *op, const int64_t *scounts,
                                   const int64_t *sdispls, const int64_t *rcounts,
                                   const int64_t *rdispls);

/* One registry entry of path net, flat. */
#define SMDDP_NET_ALGO(var, name, kind, run, about)                                                \
    const smddp__algo_t smddp__algo_##var = {name, SMDDP_OP_##kind, SMDDP_PATH_NET, false, NULL,   \
                                             run, NULL, about}

#endif /* SMDDP_CORE_COLL_NET_ALGO_H */
