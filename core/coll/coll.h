/*
 * The collectives on host memory, one algorithm per file, each file ending
 * with the algorithm's registry entry:
 *   shm/   among the ranks of one node, through shared memory;
 *   net/   across nodes with every rank on the network (flat), and ring.c,
 *          the blocks every algorithm across nodes is built from;
 *   hier/  across nodes, shared memory inside each node and the network
 *          between them (hierarchical).
 * A file is named <kind>_<algorithm>.c, in hier/ <kind>.c, so that
 * `ls core/coll/{shm,net,hier}/allreduce*` lists every allreduce. The selection
 * (select.c) alone chooses among them; exec.c runs the choice.
 */
#ifndef SMDDP_CORE_COLL_H
#define SMDDP_CORE_COLL_H

#include "../algo.h"
#include "../param.h"
#include "../transport/shm.h"

/*
 * The largest allreduce one-shot's range holds: bytes x local ranks / 2 at
 * most SMDDP_ALLREDUCE_ONESHOT_MAX, and within a staging half.
 */
static inline size_t smddp__oneshot_range(smddp_comm_t comm)
{
    size_t by_setting = (2 * (size_t)smddp__params()->oneshot_max + 1) / (size_t)comm->local_size;
    return SMDDP_MIN(by_setting, smddp__shm_half_size(comm));
}

/* The registry entries, one per file (select.c lists them). */
extern const smddp__algo_t smddp__algo_allreduce_ll, smddp__algo_allreduce_oneshot,
    smddp__algo_allreduce_twoshot, smddp__algo_reduce_ll, smddp__algo_reduce_oneshot,
    smddp__algo_reduce_twoshot,
    smddp__algo_reduce_scatter_twoshot, smddp__algo_broadcast_ll, smddp__algo_broadcast_staged,
    smddp__algo_allgather_ll, smddp__algo_allgather_staged, smddp__algo_gather_staged,
    smddp__algo_scatter_staged, smddp__algo_alltoall_staged, smddp__algo_alltoallv_staged,
    smddp__algo_barrier_ll, smddp__algo_barrier_counters;
extern const smddp__algo_t smddp__algo_net_allreduce_ring, smddp__algo_net_reduce_ring,
    smddp__algo_net_reduce_scatter_ring, smddp__algo_net_allgather_ring,
    smddp__algo_net_broadcast_chain, smddp__algo_net_alltoall_pairwise,
    smddp__algo_net_alltoallv_pairwise, smddp__algo_net_gather_direct,
    smddp__algo_net_scatter_direct, smddp__algo_net_barrier_ring;
extern const smddp__algo_t smddp__algo_hier_allreduce, smddp__algo_hier_allreduce_leader,
    smddp__algo_hier_reduce, smddp__algo_hier_reduce_leader, smddp__algo_hier_reduce_scatter,
    smddp__algo_hier_allgather, smddp__algo_hier_broadcast, smddp__algo_hier_barrier;
#if SMDDP_HAVE_CUDA
extern const smddp__algo_t smddp__algo_cuda_allreduce, smddp__algo_cuda_reduce,
    smddp__algo_cuda_broadcast, smddp__algo_cuda_allgather, smddp__algo_cuda_gather,
    smddp__algo_cuda_reduce_scatter, smddp__algo_cuda_alltoall, smddp__algo_cuda_scatter;
#endif

#endif /* SMDDP_CORE_COLL_H */
