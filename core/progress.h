/*
 * Where every rank is and who keeps the others waiting (progress.c).
 *
 * Each rank publishes in its node's shared memory when it arrived at each
 * collective (the node has one monotonic clock) and which op it runs or last
 * finished. From these:
 *   - lateness: for each collective, every rank's arrival minus the
 *     earliest arrival, summed per rank; and the skew, last arrival minus
 *     first (p50 and p99 over the last ops, max over all);
 *   - SMDDP_STRAGGLER_WARN_MS: a WARN naming the rank that arrived last when
 *     it kept the others waiting longer than that;
 *   - the positions a failure message names ("ranks 0,2 are in seq 41; rank 1
 *     finished seq 40 and has not started seq 41").
 * Across nodes, progress_nodes.c compares the nodes' arrivals on clocks
 * whose offsets it measured (SMDDP_STRAGGLER_NODES); until its first
 * summary, the stats cover this rank's node.
 */
#ifndef SMDDP_CORE_PROGRESS_H
#define SMDDP_CORE_PROGRESS_H

#include "comm.h"

typedef struct smddp__progress smddp__progress_t;

/* For a communicator whose shared memory is set up; NULL on no memory (then all below do nothing). */
smddp__progress_t *smddp__progress_new(smddp_comm_t comm);
void smddp__progress_free(smddp__progress_t *p);
/*
 * The telemetry across nodes (progress_nodes.h), for a communicator
 * spanning nodes: started once it can run ops, stopped before its store
 * and shared memory go.
 */
void smddp__progress_start_nodes(smddp_comm_t comm);
void smddp__progress_stop_nodes(smddp_comm_t comm);

/*
 * After op ran on this rank with status st (exec_lock held): every 16 ops
 * (and on a failure), compares the arrivals of the ops every local rank has
 * reached since, and warns per SMDDP_STRAGGLER_WARN_MS.
 */
void smddp__progress_after_op(smddp_comm_t comm, const smddp__op_t *op, smddp_status_t st);

/*
 * The stats so far (any thread): late_ns[r] for the n first comm ranks (-1
 * for ranks this rank cannot see); see smddp_comm_get_stats.
 */
void smddp__progress_stats(smddp_comm_t comm, smddp_comm_stats_t *out, int64_t *late_ns, int n);

/*
 * The stats as JSON members for a flight-recorder dump: "arrivals": {"ops",
 * "late_ns" (per comm rank, null where not covered), "skew_ns" {"p50",
 * "p99", "max"}, "clock_error_ns"}, and "positions": [{"rank", "running",
 * "finished", "failed" (seq numbers, -1 for none), "state" ("alive", "gone",
 * "left")}] for this node's ranks; in a buffer of the size it needs (free()
 * it), NULL on no memory.
 */
char *smddp__progress_json_new(smddp_comm_t comm);

/*
 * Where every rank stands, relative to op (which failed here): "where the
 * ranks are: ranks 0,2: in seq 41; rank 1: finished seq 40 and has not
 * started seq 41". Ranks of this node are read from shared memory; across
 * nodes, this rank publishes its node's positions through the store and
 * reads the other nodes', waiting 1.5 s at most in all (a node none of
 * whose ranks answers is "not known"; after smddp_comm_abort on this rank
 * it asks nobody). Call it once comm has been aborted
 * (the abort is what makes the other nodes' ranks answer). Writes "" when
 * comm has no shared memory.
 */
void smddp__progress_where(smddp_comm_t comm, const smddp__op_t *op, char *buf, size_t cap);
/*
 * For a timeout, a lost peer, a mismatch or an abort (st): appends the
 * above to the calling thread's error, for the first op that fails on this
 * rank, unless its message already says where the ranks are (a peer's,
 * adopted).
 */
void smddp__progress_add_where(smddp_comm_t comm, const smddp__op_t *op, smddp_status_t st);

#endif /* SMDDP_CORE_PROGRESS_H */
