/*
 * The data-movement collectives among the ranks of one node that reduce
 * nothing (broadcast, allgather, gather, scatter, all-to-all, barrier).
 * Every one moves data in rounds of one staging half: the writer copies
 * into its own half, posts, and readers copy out of the writer's half (see
 * transport/shm.h for the counter protocol). Allgather reads inputs where
 * they lie when it can; the smallest allgathers and broadcasts and the
 * barrier go through the low-latency slots (transport/shm_ll.c) instead.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../copy.h"
#include "../param.h"
#include "../transport/shm.h"
#include "../topo.h"
#include "../select.h"
#include "coll.h"

/*
 * A broadcast through the low-latency slots: the root's slot carries the
 * data, the others' only their tag. Every rank waits for every other, as
 * the slots require (a root that went on at once could rewrite its slot
 * while a peer still read it).
 */
static smddp_status_t broadcast_ll(smddp_comm_t comm, smddp__op_t *op)
{
    const void *in[SMDDP_MAX_LOCAL];
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    int root = smddp__local_index(comm, op->root);
    bool me = comm->local_rank == root;
    SMDDP_CHECK(smddp__shm_ll_exchange(comm, op, me ? op->recvbuf : NULL, bytes, NULL, in));
    if (!me) memcpy(op->recvbuf, in[root], bytes);
    return SMDDP_OK;
}

static smddp_status_t broadcast_staged(smddp_comm_t comm, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    size_t half = smddp__shm_half_size(comm);
    int root = smddp__local_index(comm, op->root), me = comm->local_rank, h;
    char *buf = op->recvbuf;
    int stream = bytes >= (size_t)smddp__params()->stream_min;
    for (size_t off = 0; off < bytes; off += half) {
        size_t n = SMDDP_MIN(half, bytes - off);
        SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
        if (me == root) memcpy(smddp__shm_buf(comm, me, h), buf + off, n);
        uint32_t t = smddp__shm_post(comm);
        /* The root waits too: each wait compares what the peers are running. */
        if (me == root) SMDDP_CHECK(smddp__shm_wait_all(comm, op, t));
        if (me != root) {
            SMDDP_CHECK(smddp__shm_wait(comm, op, root, t));
            smddp__copy(buf + off, smddp__shm_buf(comm, root, h), n, stream);
        }
        smddp__shm_step_end(comm, h);
    }
    return SMDDP_OK;
}

/*
 * Allgather and gather: with root >= 0 only the root copies out. An
 * allgather input that peers can reach where it lies is not staged: one in
 * a pool (transport/shm_pool.c) they copy, any other they read by
 * cross-memory attach (transport/shm_cma.c) when the size calls for it.
 * When every input is reached so, the whole op is one step.
 */
static smddp_status_t gather_common(smddp_comm_t comm, smddp__op_t *op, int root)
{
    size_t es = smddp__dtype_size(op->dtype);
    size_t bytes = op->count * es;
    size_t half = smddp__shm_half_size(comm);
    int p = comm->local_size, me = comm->local_rank, h = 0;
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    int stream = bytes * (size_t)p >= (size_t)smddp__params()->stream_min;
    smddp__pooled_t pl = {0};
    uint64_t in_ref = 0, addr[SMDDP_MAX_LOCAL]; /* peers' inputs by cross-memory attach */
    bool pools = root < 0 && smddp__pool_on(comm);
    bool cma = root < 0 && p > 1 && smddp__cma_use(comm, bytes);
    bool in_place_ok = false, one_step = false;
    if (root < 0) {
        /* Peers may read the input in place unless this rank's output overlaps it elsewhere. */
        const char *own = recv + (size_t)comm->local_ranks[me] * bytes;
        in_place_ok = send == own || smddp__disjoint(send, bytes, recv, bytes * (size_t)comm->size);
    }
    if (pools) {
        if (in_place_ok) in_ref = smddp__pool_ref(comm, send, bytes);
        smddp__pool_publish(comm, op, in_ref, 0);
    }
    if (cma) smddp__cma_publish(comm, op, in_place_ok ? send : NULL);
    bool direct = in_ref || (cma && in_place_ok); /* peers read this rank's input in place */
    smddp_status_t st = SMDDP_OK;
    for (size_t off = 0; off < bytes; off += half) {
        size_t n = SMDDP_MIN(half, bytes - off);
        SMDDP_CHECK_GOTO(smddp__shm_step_begin(comm, op, &h), st, out);
        if (!direct) memcpy(smddp__shm_buf(comm, me, h), send + off, n);
        uint32_t t = smddp__shm_post(comm);
        if (root >= 0 && root != me) SMDDP_CHECK_GOTO(smddp__shm_wait(comm, op, root, t), st, out);
        if (root < 0 || root == me) {
            SMDDP_CHECK_GOTO(smddp__shm_wait_all(comm, op, t), st, out);
            if (off == 0 && (pools || cma)) {
                if (pools) smddp__pool_peers(comm, op, t, &pl);
                one_step = true;
                for (int q = 0; q < p; q++) {
                    addr[q] = 0;
                    if (cma && q != me) addr[q] = smddp__cma_peer(comm, op, q, t);
                    one_step &= q == me ? direct : (pl.in && pl.in[q]) || addr[q];
                }
                if (one_step) {
                    op->algo = pl.all_in ? "in pools" : "cross-memory attach";
                    n = bytes;
                    off = bytes;
                }
            }
            size_t at = one_step ? 0 : off;
            for (int q = 0; q < p; q++) {
                char *dst = recv + (size_t)comm->local_ranks[q] * bytes + at;
                if (q == me) {
                    /* Own data comes from staging unless in place: recv may overlap send. */
                    const char *src =
                        direct || dst == send + at ? send + at : smddp__shm_buf(comm, q, h);
                    if (dst != src) smddp__copy(dst, src, n, stream);
                } else if (pl.in && pl.in[q]) {
                    smddp__copy(dst, pl.in[q] + at, n, stream);
                } else if (cma && addr[q]) {
                    SMDDP_CHECK_GOTO(smddp__cma_read(comm, op, q, dst, addr[q] + at, n), st, out);
                } else {
                    smddp__copy(dst, smddp__shm_buf(comm, q, h), n, stream);
                }
            }
        }
        smddp__shm_step_end(comm, h);
    }
out:
    /*
     * Peers read my input in place: it is mine again once they all ended
     * their last step, also when this rank failed (a peer may be reading).
     */
    if (direct) {
        char msg[SMDDP_ERRMSG_MAX];
        if (st < 0) snprintf(msg, sizeof(msg), "%s", smddp__last_error());
        smddp_status_t waited = smddp__shm_step_wait(comm, op, h);
        if (st == SMDDP_OK) st = waited;
        else if (waited < 0) smddp__error_quiet(st, "%s", msg); /* the first failure's message */
    }
    return st;
}

static smddp_status_t scatter_staged(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp__dtype_size(op->dtype);
    size_t bytes = op->count * es; /* per rank */
    int p = comm->local_size, me = comm->local_rank, h;
    int root = smddp__local_index(comm, op->root);
    size_t piece = smddp__shm_half_size(comm) / (size_t)p;
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    for (size_t off = 0; off < bytes; off += piece) {
        size_t n = SMDDP_MIN(piece, bytes - off);
        SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
        char *mine = smddp__shm_buf(comm, me, h);
        if (me == root) {
            for (int q = 0; q < p; q++) {
                const char *src = send + (size_t)comm->local_ranks[q] * bytes + off;
                if (q == me) {
                    if (recv + off != src) memcpy(recv + off, src, n);
                } else {
                    memcpy(mine + (size_t)q * piece, src, n);
                }
            }
        }
        uint32_t t = smddp__shm_post(comm);
        if (me == root) SMDDP_CHECK(smddp__shm_wait_all(comm, op, t));
        if (me != root) {
            SMDDP_CHECK(smddp__shm_wait(comm, op, root, t));
            memcpy(recv + off, (char *)smddp__shm_buf(comm, root, h) + (size_t)me * piece, n);
        }
        smddp__shm_step_end(comm, h);
    }
    return SMDDP_OK;
}

/*
 * All-to-all with per-pair byte counts. With check set (alltoallv), a first
 * round exchanges send counts so that every rank verifies what it will
 * receive, and agrees with every other rank on the verdict, before any data
 * moves; it also yields the largest pair, which fixes the number of rounds.
 */
static smddp_status_t alltoall_common(smddp_comm_t comm, smddp__op_t *op, const int64_t *scounts,
                                      const int64_t *sdispls, const int64_t *rcounts,
                                      const int64_t *rdispls, bool check)
{
    size_t es = smddp__dtype_size(op->dtype);
    int p = comm->local_size, me = comm->local_rank, h;
    size_t half = smddp__shm_half_size(comm);
    size_t piece = half / (size_t)p / es * es;
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    int64_t max_count = 0;

    /* Every local rank's send counts and verdict fit one half (topo.c bounds the ranks). */
    _Static_assert((SMDDP_MAX_LOCAL + 1) * sizeof(int64_t) <= SMDDP_SHM_HALF_MIN,
                   "alltoallv's count exchange fits a staging half");
    if (!check) {
        max_count = scounts[0];
    } else {
        SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
        int64_t *mine = smddp__shm_buf(comm, me, h);
        memcpy(mine, scounts, (size_t)p * sizeof(int64_t));
        SMDDP_CHECK(smddp__shm_sync(comm, op));
        int bad_from = -1;
        for (int q = 0; q < p; q++) {
            const int64_t *theirs = smddp__shm_buf(comm, q, h);
            if (theirs[me] != rcounts[q] && bad_from < 0) bad_from = q;
            for (int j = 0; j < p; j++) max_count = SMDDP_MAX(max_count, theirs[j]);
        }
        /* Slot p carries the verdict: -1 = fine, else the first bad sender. */
        mine[p] = bad_from;
        SMDDP_CHECK(smddp__shm_sync(comm, op));
        int bad_rank = -1, bad_sender = -1;
        for (int q = 0; q < p && bad_rank < 0; q++) {
            const int64_t *theirs = smddp__shm_buf(comm, q, h);
            if (theirs[p] >= 0) {
                bad_rank = q;
                bad_sender = (int)theirs[p];
            }
        }
        int64_t sent = bad_rank >= 0
                           ? ((const int64_t *)smddp__shm_buf(comm, bad_sender, h))[bad_rank]
                           : 0;
        smddp__shm_step_end(comm, h);
        if (bad_rank >= 0) {
            char desc[256];
            smddp__op_describe(op, desc, sizeof(desc));
            return smddp__error_quiet(
                SMDDP_ERR_MISMATCH,
                "%s: rank %d sends %" PRId64 " elements to rank %d, which expects a different "
                "count in its recvcounts[%d]; send and receive counts must match pairwise",
                desc, comm->local_ranks[bad_sender], sent, comm->local_ranks[bad_rank],
                comm->local_ranks[bad_sender]);
        }
    }

    size_t max_bytes = (size_t)max_count * es;
    int stream = max_bytes * (size_t)p >= (size_t)smddp__params()->stream_min;
    for (size_t off = 0; off < max_bytes; off += piece) {
        SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
        char *mine = smddp__shm_buf(comm, me, h);
        for (int q = 0; q < p; q++) {
            int r = comm->local_ranks[q];
            size_t total = (size_t)scounts[r] * es;
            if (off >= total) continue;
            size_t n = SMDDP_MIN(piece, total - off);
            const char *src = send + (size_t)sdispls[r] * es + off;
            if (q == me)
                smddp__copy(recv + (size_t)rdispls[r] * es + off, src, n, stream);
            else
                memcpy(mine + (size_t)q * piece, src, n);
        }
        SMDDP_CHECK(smddp__shm_sync(comm, op));
        for (int q = 0; q < p; q++) {
            int r = comm->local_ranks[q];
            size_t total = (size_t)rcounts[r] * es;
            if (q == me || off >= total) continue;
            size_t n = SMDDP_MIN(piece, total - off);
            smddp__copy(recv + (size_t)rdispls[r] * es + off,
                        (char *)smddp__shm_buf(comm, q, h) + (size_t)me * piece, n, stream);
        }
        smddp__shm_step_end(comm, h);
    }
    return SMDDP_OK;
}

static smddp_status_t alltoall_staged(smddp_comm_t comm, smddp__op_t *op)
{
    int p = comm->size;
    int64_t *v = malloc(sizeof(int64_t) * 2 * (size_t)p);
    if (!v) return smddp__error(SMDDP_ERR_NO_MEMORY, "alltoall: out of memory");
    for (int q = 0; q < p; q++) {
        v[q] = (int64_t)op->count;
        v[p + q] = (int64_t)op->count * q;
    }
    smddp_status_t st = alltoall_common(comm, op, v, v + p, v, v + p, false);
    free(v);
    return st;
}

/* An allgather through the low-latency slots: one exchange. */
static smddp_status_t allgather_ll(smddp_comm_t comm, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    const void *in[SMDDP_MAX_LOCAL];
    char *recv = op->recvbuf;
    SMDDP_CHECK(smddp__shm_ll_exchange(comm, op, op->sendbuf, bytes, NULL, in));
    /* Own data from the slot too: the input may lie in the output at another rank's place. */
    for (int q = 0; q < comm->local_size; q++) {
        char *dst = recv + (size_t)comm->local_ranks[q] * bytes;
        if (q != comm->local_rank || dst != op->sendbuf) memcpy(dst, in[q], bytes);
    }
    return SMDDP_OK;
}

static smddp_status_t allgather_staged(smddp_comm_t comm, smddp__op_t *op)
{
    return gather_common(comm, op, -1);
}

static smddp_status_t gather_staged(smddp_comm_t comm, smddp__op_t *op)
{
    return gather_common(comm, op, smddp__local_index(comm, op->root));
}

static smddp_status_t alltoallv_staged(smddp_comm_t comm, smddp__op_t *op)
{
    int p = comm->size;
    return alltoall_common(comm, op, op->v, op->v + p, op->v + 2 * p, op->v + 3 * p, true);
}

static smddp_status_t barrier_ll(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__shm_ll_exchange(comm, op, NULL, 0, NULL, NULL);
}

static smddp_status_t barrier_counters(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__shm_sync(comm, op);
}

static bool ll_fits(const smddp__select_in_t *in)
{
    return in->bytes > 0 && in->bytes <= in->lim[SMDDP_LIM_LL];
}

static bool ll_slots(const smddp__select_in_t *in) { return in->facts & SMDDP_FACT_LL_SLOTS; }

static const char *const read_in_place[] = {"in pools", "cross-memory attach", NULL};

#define ENTRY(var, name, kind, can_run, run, placements, about)                                    \
    const smddp__algo_t smddp__algo_##var = {name, SMDDP_OP_##kind, SMDDP_PATH_SHM, false, can_run, \
                                             run, placements, about}
ENTRY(broadcast_ll, "low-latency", BROADCAST, ll_fits, broadcast_ll, NULL,
      "the root's slot carries the data; every rank waits for every other");
ENTRY(broadcast_staged, "staged", BROADCAST, NULL, broadcast_staged, NULL,
      "the root stages rounds of one half, the others copy them out");
ENTRY(allgather_ll, "low-latency", ALLGATHER, ll_fits, allgather_ll, NULL,
      "one exchange through the low-latency slots");
ENTRY(allgather_staged, "staged", ALLGATHER, NULL, allgather_staged, read_in_place,
      "rounds of one half; inputs in pools or reachable by cross-memory attach read in place");
ENTRY(gather_staged, "staged", GATHER, NULL, gather_staged, NULL,
      "rounds of one half, copied out on the root");
ENTRY(scatter_staged, "staged", SCATTER, NULL, scatter_staged, NULL,
      "the root stages every rank's piece, each copies its own");
ENTRY(alltoall_staged, "staged", ALLTOALL, NULL, alltoall_staged, NULL,
      "each rank stages a piece per peer in rounds of one half");
ENTRY(alltoallv_staged, "staged", ALLTOALLV, NULL, alltoallv_staged, NULL,
      "counts checked pairwise first, then as alltoall");
ENTRY(barrier_ll, "low-latency", BARRIER, ll_slots, barrier_ll, NULL,
      "one exchange through the low-latency slots");
ENTRY(barrier_counters, "counters", BARRIER, NULL, barrier_counters, NULL,
      "every rank posts its counter and waits for all");
