/*
 * What the hierarchical algorithms across nodes share (core/coll/hier/, one
 * algorithm per file): shared memory inside each node, the network only
 * between nodes. They need every node to hold the same number of ranks
 * (comm->node_ranks); local rank lr of one node works with local rank lr of
 * every other node (its "counterparts"), so every local rank has a share of
 * the network traffic and no byte crosses the network between two ranks of
 * one node.
 */
#ifndef SMDDP_CORE_COLL_HIER_H
#define SMDDP_CORE_COLL_HIER_H

#include "../../copy.h"
#include "../../param.h"
#include "../../select.h"
#include "../../topo.h"
#include "../../transport/shm.h"
#include "../net/net_algo.h"

#define MAX_LOCAL SMDDP_NET_MAX_FUSE
_Static_assert(MAX_LOCAL >= SMDDP_MAX_LOCAL, "a node's ranks fit the fused ring's sources");

/* The comm rank of local rank lr of node `node`. */
static inline int smddp__hier_at(smddp_comm_t comm, int node, int lr)
{
    return comm->node_ranks[node * comm->local_size + lr];
}

/*
 * The state every hierarchical op allocates: the counterparts ring, a block
 * table for it (one block per node) and scratch for the ring's incoming
 * blocks.
 */
typedef struct hier {
    int *ranks;
    smddp__ring_t ring;
    size_t *off, *len;
    char *tmp;
} smddp__hier_t;


/* Allocates h for local rank lr's counterparts ring, with tmp_bytes of scratch. */
smddp_status_t smddp__hier_init(smddp_comm_t comm, smddp__hier_t *h, int lr, size_t tmp_bytes);
void smddp__hier_free(smddp__hier_t *h);

/* The node-level step of a reduction: the op itself, but AVG only sums. */
static inline smddp__reduce_spec_t smddp__hier_node_spec(const smddp__op_t *op)
{
    smddp__reduce_spec_t s = op->spec;
    s.avg_div = 0;
    return s;
}

/* The hierarchical allreduce with k local ranks on the network (allreduce.c). */
smddp_status_t smddp__hier_allreduce_k(smddp_comm_t comm, smddp__op_t *op, int k);
/* k = every local rank (allreduce.c) and k = 1 (allreduce_leader.c), fp16/bf16 through fp32. */
smddp_status_t smddp__hier_allreduce(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__hier_allreduce_leader(smddp_comm_t comm, smddp__op_t *op);

/* Every node holds the same ranks: what every hierarchical algorithm needs. */
static inline bool smddp__hier_node_ranks(const smddp__select_in_t *in)
{
    return in->facts & SMDDP_FACT_NODE_RANKS;
}

/* One registry entry of path net, hierarchical. */
#define SMDDP_HIER_ALGO(var, name, kind, run, about)                                               \
    const smddp__algo_t smddp__algo_##var = {name, SMDDP_OP_##kind, SMDDP_PATH_NET, true,          \
                                             smddp__hier_node_ranks, run, NULL, about}

#endif /* SMDDP_CORE_COLL_HIER_H */
