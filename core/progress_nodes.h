/*
 * Straggler telemetry across nodes (progress_nodes.c).
 *
 * Each node has its own monotonic clock. The first local rank of every node
 * runs a thread that:
 *   - estimates, right after the communicator is created, its clock's
 *     offset to the clock of the node of comm rank 0 (the reference), by
 *     ping-pongs through the store along a tree of nodes (each answers at
 *     most four); the error bound is half the shortest round trip, summed
 *     along the tree;
 *   - takes its node's arrivals at each collective from the thread that runs
 *     ops (smddp__nodes_push), converts them to the reference clock and
 *     publishes them through the store every 100 ms per 8 nodes (400 ms
 *     with 32), so that the store's load stays flat as nodes are added.
 * The reference node's first rank merges every node's arrivals by sequence
 * number, and keeps each rank's lateness (its arrival minus the earliest
 * arrival of any rank, summed) and the skew (last arrival minus the first),
 * and publishes a summary that every rank reads (smddp__nodes_stats).
 * Everything but the push runs off the thread that runs ops; a push that
 * finds its ring full (8,192 ops since the last publication) drops the op,
 * which is then not compared.
 */
#ifndef SMDDP_CORE_PROGRESS_NODES_H
#define SMDDP_CORE_PROGRESS_NODES_H

#include "comm.h"

typedef struct smddp__nodes smddp__nodes_t;

/*
 * For a communicator spanning nodes, with SMDDP_STRAGGLER_NODES on; on a
 * node's first local rank it starts the thread. NULL otherwise, or on no
 * memory (then the others do nothing).
 */
smddp__nodes_t *smddp__nodes_start(smddp_comm_t comm);
/* Stops the thread (within a store call and 10 ms) and frees n (NULL: nothing). */
void smddp__nodes_stop(smddp__nodes_t *n);

/*
 * The arrivals at op seq of this node's ranks (local rank order), on this
 * node's monotonic clock (ns); from the thread that runs ops, on the first
 * local rank. Never blocks.
 */
void smddp__nodes_push(smddp__nodes_t *n, uint64_t seq, const int64_t *arrived_ns);

/*
 * The telemetry over every node, from the reference node's latest summary
 * (one store read, at most every 50 ms): fills *out and late_ns[0..count) as
 * smddp_comm_get_stats does; false while there is none (then nothing is
 * written).
 */
bool smddp__nodes_stats(smddp__nodes_t *n, smddp_comm_stats_t *out, int64_t *late_ns, int count);

/*
 * For tests of fake nodes on one machine: added to every time this process
 * tells other nodes, as if its clock ran this far ahead. Set before the
 * communicator is created.
 */
extern int64_t smddp__nodes_clock_shift_ns;

#endif /* SMDDP_CORE_PROGRESS_NODES_H */
