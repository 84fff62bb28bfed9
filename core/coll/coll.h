/*
 * The collectives among the ranks of one node, through shared memory: the
 * reductions (allreduce.c) and the data movement (coll.c). The selection
 * (select.c) picks among them for host memory on one node.
 */
#ifndef SMDDP_CORE_COLL_H
#define SMDDP_CORE_COLL_H

#include "../algo.h"
#include "../param.h"
#include "../transport/shm.h"

/*
 * Whether [a, a + alen) and [b, b + blen) share no byte. An input that
 * overlaps its output is read in place by peers only in the exact in-place
 * layouts, where no rank writes what a peer reads.
 */
static inline bool smddp__disjoint(const void *a, size_t alen, const void *b, size_t blen)
{
    return (const char *)a + alen <= (const char *)b || (const char *)b + blen <= (const char *)a;
}

/*
 * Up to this many bytes the low-latency slots beat reading pooled buffers
 * in place (allreduce), and beat the staged broadcast, whose root does not
 * wait (bench/RESULTS.md).
 */
#define SMDDP_LL_OVER_POOLS_MAX 1024
#define SMDDP_LL_BROADCAST_MAX 1024

/*
 * The largest allreduce one-shot's range holds: bytes x local ranks / 2 at
 * most SMDDP_ALLREDUCE_ONESHOT_MAX, and within a staging half.
 */
static inline size_t smddp__oneshot_range(smddp_comm_t comm)
{
    size_t by_setting = (2 * (size_t)smddp__params()->oneshot_max + 1) / (size_t)comm->local_size;
    return SMDDP_MIN(by_setting, smddp__shm_half_size(comm));
}

/* The algorithms, one registry entry each (select.c lists them). */
extern const smddp__algo_t smddp__algo_allreduce_ll, smddp__algo_allreduce_oneshot,
    smddp__algo_allreduce_twoshot, smddp__algo_reduce_twoshot,
    smddp__algo_reduce_scatter_twoshot, smddp__algo_broadcast_ll, smddp__algo_broadcast_staged,
    smddp__algo_allgather_ll, smddp__algo_allgather_staged, smddp__algo_gather_staged,
    smddp__algo_scatter_staged, smddp__algo_alltoall_staged, smddp__algo_alltoallv_staged,
    smddp__algo_barrier_ll, smddp__algo_barrier_counters;

#endif /* SMDDP_CORE_COLL_H */
