/*
 * The hierarchical allreduce across nodes, in rounds of one staging half:
 *   1. reduce-scatter inside the node: each of k local ranks reduces its
 *      piece of the round over the node's ranks (as two-shot does);
 *   2. each of those k ranks runs a ring allreduce of its piece with its
 *      counterparts;
 *   3. allgather inside the node: every rank copies the reduced pieces out.
 * Here k is every local rank; allreduce_leader.c runs it with one (a leader
 * per node) for small messages, where the network's latency, not its
 * bandwidth, decides (SMDDP_NET_LEADER_MAX). Each element is reduced in one
 * fixed order (node by node, then around one ring), so every rank gets
 * bit-identical results. PREMUL_SUM scales inside the first step only; AVG
 * divides once at the end.
 */
#include <stdlib.h>
#include <string.h>

#include "hier.h"

/*
 * Allreduce's rounds are pipelined two deep: round r's ring runs on the
 * network while this rank stages round r + 1 in the other shared-memory half,
 * and every wait in between (shared memory or network) keeps both rings
 * moving through a poller (pollers.h). Copies and reductions go in slices of
 * PUMP_SLICE bytes with a pump between slices, so a ring step that
 * completes is followed at once by the next one.
 */
#define PUMP_SLICE (256u << 10)

typedef struct ar_round {
    smddp__hier_t hr;
    smddp__ring_task_t task;
    const void *srcs[MAX_LOCAL]; /* every local rank's input for this rank's piece */
    size_t base, m, my_off, my_len;
    int h;
    bool ring_active; /* task started and not yet waited for */
} ar_round_t;

typedef struct ar_pipe {
    smddp_comm_t comm;
    ar_round_t r[2];
    bool in_ring_wait; /* pumped from a wait for a ring, not from shared-memory work */
} ar_pipe_t;

static smddp_status_t pump_rings(void *arg)
{
    ar_pipe_t *p = arg;
    SMDDP_CHECK(p->comm->net->progress(p->comm->net_ep));
    for (int i = 0; i < 2; i++) {
        smddp__ring_task_t *t = &p->r[i].task;
        if (!p->r[i].ring_active) continue;
        int before = t->s;
        SMDDP_CHECK(smddp__ring_task_advance(t));
        if (!p->in_ring_wait) p->comm->net_steps_overlapped += (uint64_t)(t->s - before);
    }
    return SMDDP_OK;
}

static smddp_status_t pump(smddp_comm_t comm) { return smddp__pollers_run(&comm->pollers); }

/* memcpy (or smddp__copy when stream) in slices, pumping between them. */
static smddp_status_t copy_pumped(smddp_comm_t comm, char *dst, const char *src, size_t bytes,
                                  int stream)
{
    for (size_t o = 0; o < bytes; o += PUMP_SLICE) {
        size_t n = SMDDP_MIN((size_t)PUMP_SLICE, bytes - o);
        if (stream)
            smddp__copy(dst + o, src + o, n, 1);
        else
            memcpy(dst + o, src + o, n);
        SMDDP_CHECK(pump(comm));
    }
    return SMDDP_OK;
}

/* smddp__reduce of n elements over nsrc sources, in slices with pumps between them. */
static smddp_status_t reduce_pumped(smddp_comm_t comm, const smddp__reduce_spec_t *spec,
                                    char *dst, const void *const *srcs, int nsrc, size_t n)
{
    size_t es = smddp__dtype_size(spec->dtype), slice = SMDDP_MAX(PUMP_SLICE / es, (size_t)1);
    const void *at[MAX_LOCAL];
    for (size_t o = 0; o < n; o += slice) {
        size_t len = SMDDP_MIN(slice, n - o);
        for (int q = 0; q < nsrc; q++) at[q] = (const char *)srcs[q] + o * es;
        smddp__reduce(spec, dst + o * es, at, nsrc, len);
        SMDDP_CHECK(pump(comm));
    }
    return SMDDP_OK;
}

/* Round R's second half: its ring done everywhere in the node, every piece copied out. */
static smddp_status_t finish_round(smddp_comm_t comm, smddp__op_t *op, ar_pipe_t *pipe,
                                   ar_round_t *R, int k, int stream)
{
    size_t es = smddp__dtype_size(op->dtype);
    if (R->ring_active) {
        pipe->in_ring_wait = true;
        smddp_status_t st = smddp__ring_task_wait(&R->task);
        pipe->in_ring_wait = false;
        SMDDP_CHECK(st);
        R->ring_active = false;
        if (smddp__chain_ops(op).post_divide) {
            char *piece = (char *)smddp__shm_buf(comm, comm->local_rank, R->h) + R->my_off * es;
            smddp__net_unary(op, SMDDP_AVG, comm->size, piece, R->my_len);
        }
    }
    SMDDP_CHECK(smddp__shm_sync(comm, op));
    char *recv = op->recvbuf;
    for (int q = 0; q < k; q++) {
        size_t off, len;
        smddp__piece(R->m, k, q, &off, &len);
        SMDDP_CHECK(copy_pumped(comm, recv + (R->base + off) * es,
                                (char *)smddp__shm_buf(comm, q, R->h) + off * es, len * es,
                                stream));
    }
    smddp__shm_step_end(comm, R->h);
    return SMDDP_OK;
}

/*
 * Allreduce in place of op->sendbuf into op->recvbuf, k local ranks on the
 * network (1: a leader per node; every local rank); any dtype but fp16/bf16.
 */
smddp_status_t smddp__hier_allreduce_k(smddp_comm_t comm, smddp__op_t *op, int k)
{
    size_t es = smddp__dtype_size(op->dtype);
    int L = comm->local_size, N = comm->node_count, me = comm->local_rank;
    size_t bytes = op->count * es;
    size_t round_elems = smddp__shm_half_size(comm) / es;
    const char *send = op->sendbuf;
    const void *srcs[MAX_LOCAL];
    smddp__reduce_spec_t spec = smddp__hier_node_spec(op);
    smddp__chain_t c = smddp__chain_ops(op);
    int stream = bytes >= (size_t)smddp__params()->stream_min;
    ar_pipe_t pipe = {.comm = comm};

    SMDDP_TRACE("rank %d: allreduce seq %llu: %zu bytes, %d rank(s) per node on the network",
                comm->rank, (unsigned long long)op->seq, bytes, k);
    size_t tmp_bytes = (round_elems / (size_t)k / (size_t)N + 1) * es;
    SMDDP_CHECK(smddp__hier_init(comm, &pipe.r[0].hr, me, tmp_bytes));
    smddp_status_t st = smddp__hier_init(comm, &pipe.r[1].hr, me, tmp_bytes);
    if (st != SMDDP_OK) {
        smddp__hier_free(&pipe.r[0].hr);
        return st;
    }
    if ((st = smddp__poller_add(&comm->pollers, pump_rings, &pipe)) != SMDDP_OK) {
        smddp__hier_free(&pipe.r[0].hr);
        smddp__hier_free(&pipe.r[1].hr);
        return st;
    }
    ar_round_t *prev = NULL;
    uint32_t round = 0;
    for (size_t base = 0; base < op->count && st == SMDDP_OK; base += round_elems, round++) {
        ar_round_t *R = &pipe.r[round & 1];
        R->base = base;
        R->m = SMDDP_MIN(round_elems, op->count - base);
        R->my_off = R->m;
        R->my_len = 0;
        if (me < k) smddp__piece(R->m, k, me, &R->my_off, &R->my_len);
        if ((st = smddp__shm_step_begin(comm, op, &R->h)) != SMDDP_OK) break;
        char *mine = smddp__shm_buf(comm, me, R->h);
        /* Everything but my own piece goes to staging; mine is read in place. */
        size_t after = R->my_off + R->my_len;
        if ((st = copy_pumped(comm, mine, send + base * es, R->my_off * es, 0)) != SMDDP_OK ||
            (st = copy_pumped(comm, mine + after * es, send + (base + after) * es,
                              (R->m - after) * es, 0)) != SMDDP_OK)
            break;
        comm->shm_bytes += (R->m - R->my_len) * es;
        if ((st = smddp__shm_sync(comm, op)) != SMDDP_OK) break;
        if (R->my_len) {
            char *piece = mine + R->my_off * es;
            for (int q = 0; q < L; q++)
                R->srcs[q] = q == me ? send + (base + R->my_off) * es
                                     : (const char *)smddp__shm_buf(comm, q, R->h) + R->my_off * es;
            /*
             * Fused: reduce only the block the ring sends first; the ring
             * reduces each other block with the incoming one as it arrives.
             * PREMUL_SUM scales the local inputs, so it reduces them all here.
             */
            bool fuse = op->spec.op != SMDDP_PREMUL_SUM;
            size_t boff = 0, blen = R->my_len;
            if (fuse) smddp__piece(R->my_len, N, smddp__ring_task_first(&R->hr.ring), &boff, &blen);
            for (int q = 0; q < L; q++) srcs[q] = (const char *)R->srcs[q] + boff * es;
            if ((st = reduce_pumped(comm, &spec, piece + boff * es, srcs, L, blen)) != SMDDP_OK)
                break;
            R->ring_active = true;
            st = smddp__ring_task_start(&R->task, comm, op, &R->hr.ring, &c.step, piece,
                                        R->my_len, R->hr.off, R->hr.len, R->hr.tmp,
                                        round * 2 * (uint32_t)N, fuse ? R->srcs : NULL, L);
            if (st != SMDDP_OK) break;
        }
        if (prev && (st = finish_round(comm, op, &pipe, prev, k, stream)) != SMDDP_OK) break;
        prev = R;
    }
    if (st == SMDDP_OK && prev) st = finish_round(comm, op, &pipe, prev, k, stream);
    smddp__poller_remove(&comm->pollers, pump_rings, &pipe);
    for (int i = 0; i < 2; i++) {
        /* After a failure: transfers still posted must never land in this stack. */
        if (pipe.r[i].ring_active) smddp__ring_task_abandon(&pipe.r[i].task);
        smddp__hier_free(&pipe.r[i].hr);
    }
    return st;
}

static smddp_status_t allreduce_all(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__hier_allreduce_k(comm, op, comm->local_size);
}

smddp_status_t smddp__hier_allreduce(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_via_fp32(comm, op, op->count, op->count, allreduce_all);
}

SMDDP_HIER_ALGO(hier_allreduce, "hierarchical", ALLREDUCE, smddp__hier_allreduce,
                "reduce-scatter in the node, a ring per local rank across nodes, "
                "allgather in the node");
