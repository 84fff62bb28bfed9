/*
 * The collectives across nodes: the flat ones (net.c), every rank on the
 * network, and the hierarchical ones (hier.c), shared memory inside each
 * node and the network between nodes (comm->node_ranks must be set). The
 * selection (select.c) picks one and exec.c runs it through smddp__net_run.
 */
#ifndef SMDDP_CORE_NET_H
#define SMDDP_CORE_NET_H

#include "../algo.h"
#include "ring.h"

/*
 * Runs algo for op across nodes: registrations of the op's buffers are kept
 * until it ends, and scratch over the limit is given back after it.
 */
smddp_status_t smddp__net_run(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn algo);

/* Flat (net.c). */
smddp_status_t smddp__net_allreduce(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__net_reduce(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__net_reduce_scatter(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__net_allgather(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__net_broadcast(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__net_barrier(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__net_alltoall(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__net_alltoallv(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__net_gather(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__net_scatter(smddp_comm_t comm, smddp__op_t *op);
/* A reduce as allreduce, which off the root writes into scratch. */
smddp_status_t smddp__net_reduce_by(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn allreduce);

/* Hierarchical (hier.c). */
smddp_status_t smddp__hier_allreduce(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__hier_allreduce_leader(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__hier_reduce(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__hier_reduce_scatter(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__hier_allgather(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__hier_broadcast(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__hier_barrier(smddp_comm_t comm, smddp__op_t *op);

/* The algorithms, one registry entry each (select.c lists them). */
extern const smddp__algo_t smddp__algo_net_allreduce_ring, smddp__algo_net_reduce_ring,
    smddp__algo_net_reduce_scatter_ring, smddp__algo_net_allgather_ring,
    smddp__algo_net_broadcast_chain, smddp__algo_net_alltoall_pairwise,
    smddp__algo_net_alltoallv_pairwise, smddp__algo_net_gather_direct,
    smddp__algo_net_scatter_direct, smddp__algo_net_barrier_ring, smddp__algo_hier_allreduce,
    smddp__algo_hier_allreduce_leader, smddp__algo_hier_reduce, smddp__algo_hier_reduce_leader,
    smddp__algo_hier_reduce_scatter, smddp__algo_hier_allgather, smddp__algo_hier_broadcast,
    smddp__algo_hier_barrier;

#endif /* SMDDP_CORE_NET_H */
