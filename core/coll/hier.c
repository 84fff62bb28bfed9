/*
 * Hierarchical collectives across nodes: shared memory inside each node, the
 * network only between nodes. They need every node to hold the same number
 * of ranks (comm->node_ranks); local rank lr of one node works with local
 * rank lr of every other node (its "counterparts"), so every local rank has a
 * share of the network traffic and no byte crosses the network between two
 * ranks of one node.
 *
 * Allreduce, in rounds of one staging half:
 *   1. reduce-scatter inside the node: each of k local ranks reduces its
 *      piece of the round over the node's ranks (as two-shot does);
 *   2. each of those k ranks runs a ring allreduce of its piece with its
 *      counterparts;
 *   3. allgather inside the node: every rank copies the reduced pieces out.
 * k is every local rank for large messages and one (a leader per node) for
 * small ones, where the network's latency, not its bandwidth, decides
 * (SMDDP_NET_LEADER_MAX). Each element is reduced in one fixed order (node by
 * node, then around one ring), so every rank gets bit-identical results.
 * PREMUL_SUM scales inside the first step only; AVG divides once at the end.
 *
 * Reduce-scatter does steps 1 and 2 with a ring reduce-scatter over the
 * nodes; allgather exchanges each rank's block with its counterparts, then
 * shares them inside the node; broadcast sends along a chain of the root's
 * counterparts, then inside each node; barrier is a node barrier around a
 * barrier of one rank per node.
 */
#include <stdlib.h>
#include <string.h>

#include "../copy.h"
#include "../param.h"
#include "../transport/shm.h"
#include "../topo.h"
#include "../select.h"
#include "net.h"

#define MAX_LOCAL SMDDP_NET_MAX_FUSE
_Static_assert(MAX_LOCAL >= SMDDP_MAX_LOCAL, "a node's ranks fit the fused ring's sources");

static int at(smddp_comm_t comm, int node, int lr)
{
    return comm->node_ranks[node * comm->local_size + lr];
}

/* The ring of local rank lr's counterparts, one per node (ranks holds node_count). */
static smddp__ring_t counterparts(smddp_comm_t comm, int lr, int *ranks)
{
    for (int n = 0; n < comm->node_count; n++) ranks[n] = at(comm, n, lr);
    return (smddp__ring_t){.p = comm->node_count, .me = comm->node, .ranks = ranks};
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
} hier_t;

static void hier_free(hier_t *h)
{
    free(h->ranks);
    free(h->off);
    free(h->len);
    free(h->tmp);
}

static smddp_status_t hier_init(smddp_comm_t comm, hier_t *h, int lr, size_t tmp_bytes)
{
    size_t n = (size_t)comm->node_count;
    h->ranks = malloc(n * sizeof(int));
    h->off = calloc(n, sizeof(size_t));
    h->len = calloc(n, sizeof(size_t));
    h->tmp = malloc(tmp_bytes + 64);
    if (!h->ranks || !h->off || !h->len || !h->tmp) {
        hier_free(h);
        return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes of scratch",
                            tmp_bytes);
    }
    h->ring = counterparts(comm, lr, h->ranks);
    return SMDDP_OK;
}

/* The node-level step of a reduction: the op itself, but AVG only sums. */
static smddp__reduce_spec_t node_spec(const smddp__op_t *op)
{
    smddp__reduce_spec_t s = op->spec;
    s.avg_div = 0;
    return s;
}

/*
 * Allreduce's rounds are pipelined two deep: round r's ring runs on the
 * network while this rank stages round r + 1 in the other shared-memory half,
 * and every wait in between (shared memory or network) keeps both rings
 * moving through comm->pump. Copies and reductions go in slices of PUMP_SLICE
 * bytes with a pump between slices, so a ring step that completes is
 * followed at once by the next one.
 */
#define PUMP_SLICE (256u << 10)

typedef struct ar_round {
    hier_t hr;
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
    SMDDP_CHECK(smddp__ofi_progress(p->comm->ofi));
    for (int i = 0; i < 2; i++) {
        smddp__ring_task_t *t = &p->r[i].task;
        if (!p->r[i].ring_active) continue;
        int before = t->s;
        SMDDP_CHECK(smddp__ring_task_advance(t));
        if (!p->in_ring_wait) p->comm->net_steps_overlapped += (uint64_t)(t->s - before);
    }
    return SMDDP_OK;
}

static smddp_status_t pump(smddp_comm_t comm)
{
    return comm->pump ? comm->pump(comm->pump_arg) : SMDDP_OK;
}

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
static smddp_status_t allreduce(smddp_comm_t comm, smddp__op_t *op, int k)
{
    size_t es = smddp__dtype_size(op->dtype);
    int L = comm->local_size, N = comm->node_count, me = comm->local_rank;
    size_t bytes = op->count * es;
    size_t round_elems = smddp__shm_half_size(comm) / es;
    const char *send = op->sendbuf;
    const void *srcs[MAX_LOCAL];
    smddp__reduce_spec_t spec = node_spec(op);
    smddp__chain_t c = smddp__chain_ops(op);
    int stream = bytes >= (size_t)smddp__params()->stream_min;
    ar_pipe_t pipe = {.comm = comm};

    SMDDP_TRACE("rank %d: allreduce seq %llu: %zu bytes, %d rank(s) per node on the network",
                comm->rank, (unsigned long long)op->seq, bytes, k);
    size_t tmp_bytes = (round_elems / (size_t)k / (size_t)N + 1) * es;
    SMDDP_CHECK(hier_init(comm, &pipe.r[0].hr, me, tmp_bytes));
    smddp_status_t st = hier_init(comm, &pipe.r[1].hr, me, tmp_bytes);
    if (st != SMDDP_OK) {
        hier_free(&pipe.r[0].hr);
        return st;
    }
    comm->pump = pump_rings;
    comm->pump_arg = &pipe;
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
    comm->pump = NULL;
    comm->pump_arg = NULL;
    for (int i = 0; i < 2; i++) {
        /* After a failure: transfers still posted must never land in this stack. */
        if (pipe.r[i].ring_active) smddp__ring_task_abandon(&pipe.r[i].task);
        hier_free(&pipe.r[i].hr);
    }
    return st;
}

static smddp_status_t allreduce_all(smddp_comm_t comm, smddp__op_t *op)
{
    return allreduce(comm, op, comm->local_size);
}

static smddp_status_t allreduce_leader(smddp_comm_t comm, smddp__op_t *op)
{
    return allreduce(comm, op, 1);
}

smddp_status_t smddp__hier_allreduce(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_via_fp32(comm, op, op->count, op->count, allreduce_all);
}

smddp_status_t smddp__hier_allreduce_leader(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_via_fp32(comm, op, op->count, op->count, allreduce_leader);
}

/* Reduce-scatter: p blocks of op->count in op->sendbuf, this rank's block into op->recvbuf. */
static smddp_status_t reduce_scatter(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp__dtype_size(op->dtype), n = op->count;
    int L = comm->local_size, N = comm->node_count, me = comm->local_rank, h;
    /* A round holds, per local rank, one slot per node. */
    size_t round_elems = smddp__shm_half_size(comm) / es / ((size_t)L * (size_t)N);
    if (round_elems == 0) round_elems = 1;
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    const void *srcs[MAX_LOCAL];
    smddp__reduce_spec_t spec = node_spec(op);
    smddp__chain_t c = smddp__chain_ops(op);
    hier_t hr;

    if (round_elems * es * (size_t)L * (size_t)N > smddp__shm_half_size(comm))
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "reduce_scatter: %d ranks do not fit the %zu-byte staging half "
                            "(raise SMDDP_SHM_BUFFER_SIZE or set SMDDP_NET_ALGO=flat)",
                            comm->size, smddp__shm_half_size(comm));
    SMDDP_CHECK(hier_init(comm, &hr, me, round_elems * es));
    smddp_status_t st = SMDDP_OK;
    uint32_t step = 0;
    for (size_t base = 0; base < n && st == SMDDP_OK; base += round_elems) {
        size_t m = SMDDP_MIN(round_elems, n - base);
        if ((st = smddp__shm_step_begin(comm, op, &h)) != SMDDP_OK) break;
        char *mine = smddp__shm_buf(comm, me, h);
        /* Slot (q, j) of my half: what local rank q reduces for the rank of node j. */
        for (int q = 0; q < L; q++) {
            if (q == me) continue;
            for (int j = 0; j < N; j++)
                memcpy(mine + ((size_t)q * N + j) * m * es,
                       send + ((size_t)at(comm, j, q) * n + base) * es, m * es);
        }
        comm->shm_bytes += (size_t)(L - 1) * (size_t)N * m * es;
        if ((st = smddp__shm_sync(comm, op)) != SMDDP_OK) break;
        /* My slots (me, *) in my own half are free: reduce into them. */
        char *work = mine + (size_t)me * N * m * es;
        for (int j = 0; j < N; j++) {
            for (int q = 0; q < L; q++)
                srcs[q] = q == me ? send + ((size_t)at(comm, j, me) * n + base) * es
                                  : (const char *)smddp__shm_buf(comm, q, h) +
                                        ((size_t)me * N + j) * m * es;
            smddp__reduce(&spec, work + (size_t)j * m * es, srcs, L, m);
        }
        for (int j = 0; j < N; j++) {
            hr.off[j] = (size_t)j * m;
            hr.len[j] = m;
        }
        st = smddp__ring_reduce_scatter(comm, op, &hr.ring, &c.step, work, hr.off, hr.len, hr.tmp,
                                        step);
        if (st != SMDDP_OK) break;
        step += (uint32_t)N;
        char *result = work + (size_t)comm->node * m * es;
        if (c.post_divide) smddp__net_unary(op, SMDDP_AVG, comm->size, result, m);
        memcpy(recv + base * es, result, m * es);
        smddp__shm_step_end(comm, h);
    }
    hier_free(&hr);
    return st;
}

/* Allgather: counterparts swap their blocks over the network, then the node shares them. */
smddp_status_t smddp__hier_allgather(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp__dtype_size(op->dtype), n = op->count, bytes = n * es;
    int L = comm->local_size, N = comm->node_count, me = comm->local_rank, h;
    char *recv = op->recvbuf;
    hier_t hr;

    SMDDP_CHECK(hier_init(comm, &hr, me, 0));
    memmove(recv + (size_t)comm->rank * bytes, op->sendbuf, bytes);
    for (int j = 0; j < N; j++) {
        hr.off[j] = (size_t)hr.ranks[j] * n;
        hr.len[j] = n;
    }
    smddp_status_t st = smddp__ring_allgather(comm, op, &hr.ring, recv, hr.off, hr.len, es, 0);
    /* Inside the node: each rank stages its N blocks, in rounds of N slots. */
    size_t slot = smddp__shm_half_size(comm) / (size_t)N;
    int stream = bytes * (size_t)comm->size >= (size_t)smddp__params()->stream_min;
    for (size_t o = 0; o < bytes && st == SMDDP_OK && L > 1; o += slot) {
        size_t m = SMDDP_MIN(slot, bytes - o);
        if ((st = smddp__shm_step_begin(comm, op, &h)) != SMDDP_OK) break;
        char *mine = smddp__shm_buf(comm, me, h);
        for (int j = 0; j < N; j++)
            memcpy(mine + (size_t)j * slot, recv + (size_t)at(comm, j, me) * bytes + o, m);
        comm->shm_bytes += (size_t)N * m;
        uint32_t t = smddp__shm_post(comm);
        if ((st = smddp__shm_wait_all(comm, op, t)) != SMDDP_OK) break;
        for (int q = 0; q < L; q++) {
            if (q == me) continue;
            const char *theirs = smddp__shm_buf(comm, q, h);
            for (int j = 0; j < N; j++)
                smddp__copy(recv + (size_t)at(comm, j, q) * bytes + o, theirs + (size_t)j * slot,
                            m, stream);
        }
        smddp__shm_step_end(comm, h);
    }
    hier_free(&hr);
    return st;
}

/* Broadcast: a chain of the root's counterparts, then each node from its member of the chain. */
smddp_status_t smddp__hier_broadcast(smddp_comm_t comm, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    size_t half = smddp__shm_half_size(comm);
    int root_node = comm->node_of[op->root], root_lr = 0, me = comm->local_rank, h;
    while (at(comm, root_node, root_lr) != op->root) root_lr++;
    char *buf = op->recvbuf;
    int stream = bytes >= (size_t)smddp__params()->stream_min;
    hier_t hr;

    SMDDP_CHECK(hier_init(comm, &hr, root_lr, 0));
    smddp_status_t st = SMDDP_OK;
    uint32_t step = 0;
    for (size_t off = 0; off < bytes && st == SMDDP_OK; off += half) {
        size_t m = SMDDP_MIN(half, bytes - off);
        if ((st = smddp__shm_step_begin(comm, op, &h)) != SMDDP_OK) break;
        if (me == root_lr) {
            st = smddp__chain_broadcast(comm, op, &hr.ring, root_node, buf + off, m, step);
            if (st != SMDDP_OK) break;
            if (comm->local_size > 1) {
                memcpy(smddp__shm_buf(comm, me, h), buf + off, m);
                comm->shm_bytes += m;
            }
        }
        step += (uint32_t)(m / (1u << 20) + 1);
        uint32_t t = smddp__shm_post(comm);
        if (me == root_lr) {
            st = smddp__shm_wait_all(comm, op, t);
        } else {
            st = smddp__shm_wait(comm, op, root_lr, t);
            if (st == SMDDP_OK) smddp__copy(buf + off, smddp__shm_buf(comm, root_lr, h), m, stream);
        }
        if (st == SMDDP_OK) smddp__shm_step_end(comm, h);
    }
    hier_free(&hr);
    return st;
}

/* Barrier: everyone in the node arrives, the leaders meet, the node is released. */
smddp_status_t smddp__hier_barrier(smddp_comm_t comm, smddp__op_t *op)
{
    SMDDP_CHECK(smddp__shm_sync(comm, op));
    if (comm->local_rank == 0) {
        hier_t hr;
        SMDDP_CHECK(hier_init(comm, &hr, 0, 64));
        uint8_t one = 1;
        smddp__reduce_spec_t max = {.dtype = SMDDP_UINT8, .op = SMDDP_MAX, .premul = 1.0};
        smddp_status_t st = smddp__ring_allreduce(comm, op, &hr.ring, &max, (char *)&one, 1,
                                                  hr.off, hr.len, hr.tmp, 0);
        hier_free(&hr);
        SMDDP_CHECK(st);
    }
    return smddp__shm_sync(comm, op);
}

smddp_status_t smddp__hier_reduce(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_reduce_by(comm, op, smddp__hier_allreduce);
}

static smddp_status_t reduce_leader(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_reduce_by(comm, op, smddp__hier_allreduce_leader);
}

smddp_status_t smddp__hier_reduce_scatter(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_via_fp32(comm, op, op->count * (size_t)comm->size, op->count,
                               reduce_scatter);
}

/* Every node holds the same ranks: what every hierarchical algorithm needs. */
static bool node_ranks(const smddp__select_in_t *in) { return in->facts & SMDDP_FACT_NODE_RANKS; }

#define ENTRY(var, name, kind, run, about)                                                          \
    const smddp__algo_t smddp__algo_##var = {name, SMDDP_OP_##kind, SMDDP_PATH_NET, true,           \
                                             node_ranks, run, NULL, about}
ENTRY(hier_allreduce, "hierarchical", ALLREDUCE, smddp__hier_allreduce,
      "reduce-scatter in the node, a ring per local rank across nodes, allgather in the node");
ENTRY(hier_allreduce_leader, "hier-leader", ALLREDUCE, smddp__hier_allreduce_leader,
      "as hierarchical, one rank per node on the network");
ENTRY(hier_reduce, "hierarchical", REDUCE, smddp__hier_reduce,
      "the hierarchical allreduce, off the root into scratch");
ENTRY(hier_reduce_leader, "hier-leader", REDUCE, reduce_leader,
      "the hier-leader allreduce, off the root into scratch");
ENTRY(hier_reduce_scatter, "hierarchical", REDUCE_SCATTER, smddp__hier_reduce_scatter,
      "reduce-scatter in the node, then a ring reduce-scatter across nodes");
ENTRY(hier_allgather, "hierarchical", ALLGATHER, smddp__hier_allgather,
      "blocks exchanged with the counterparts, then shared in the node");
ENTRY(hier_broadcast, "hierarchical", BROADCAST, smddp__hier_broadcast,
      "a chain of the root's counterparts, then inside each node");
ENTRY(hier_barrier, "hierarchical", BARRIER, smddp__hier_barrier,
      "a node barrier around a barrier of one rank per node");
