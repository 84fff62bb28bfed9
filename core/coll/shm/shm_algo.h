/*
 * What the algorithms among the ranks of one node share (core/coll/shm/,
 * one algorithm per file). They move data through the staging halves of
 * transport/shm.c, the low-latency slots of transport/shm_ll.c, the pools of
 * transport/shm_pool.c and cross-memory attach (transport/shm_cma.c).
 */
#ifndef SMDDP_CORE_COLL_SHM_ALGO_H
#define SMDDP_CORE_COLL_SHM_ALGO_H

#include "../../copy.h"
#include "../../param.h"
#include "../../select.h"
#include "../../topo.h"
#include "../../transport/shm.h"
#include "../coll.h"

#define MAX_LOCAL SMDDP_MAX_LOCAL /* checked at creation (topo.c) */

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

/* can_run of the low-latency algorithms: a payload that fits a slot. */
static inline bool smddp__ll_fits(const smddp__select_in_t *in)
{
    return in->bytes > 0 && in->bytes <= in->lim[SMDDP_LIM_LL];
}

/* can_run of the one-shot algorithms: a payload that fits one staging half. */
static inline bool smddp__within_half(const smddp__select_in_t *in)
{
    return in->bytes <= in->lim[SMDDP_LIM_HALF];
}

/* Two-shot allreduce (allreduce_twoshot.c); with root_lr >= 0 only that local rank copies out. */
smddp_status_t smddp__shm_twoshot(smddp_comm_t comm, smddp__op_t *op, int root_lr);

/* Staged allgather (allgather_staged.c); with root >= 0 a gather to that local rank. */
smddp_status_t smddp__shm_gather_rounds(smddp_comm_t comm, smddp__op_t *op, int root);

/*
 * Staged all-to-all with per-pair counts (alltoallv_staged.c); with check,
 * the counts are first verified pairwise and agreed on.
 */
smddp_status_t smddp__shm_alltoall_rounds(smddp_comm_t comm, smddp__op_t *op,
                                          const int64_t *scounts, const int64_t *sdispls,
                                          const int64_t *rcounts, const int64_t *rdispls,
                                          bool check);

/* One registry entry of path shm (hier false, no placements unless given). */
#define SMDDP_SHM_ALGO(var, name, kind, can_run, run, placements, about)                           \
    const smddp__algo_t smddp__algo_##var = {name, SMDDP_OP_##kind, SMDDP_PATH_SHM, false,         \
                                             can_run, run, placements, about}

#endif /* SMDDP_CORE_COLL_SHM_ALGO_H */
