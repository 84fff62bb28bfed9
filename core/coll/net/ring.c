/*
 * The building blocks of the collectives across nodes, over any group of
 * ranks: tagged exchanges, ring reduce-scatter, allgather and allreduce (also
 * as a task that runs in the background of its caller), the pipelined chain
 * broadcast, the scratch kept between ops, fp16/bf16 through fp32, and the
 * runner every algorithm across nodes goes through (smddp__net_run). The flat
 * algorithms (coll/net/) run them over every rank, the hierarchical ones
 * (coll/hier/) over one rank of each node.
 *
 * Every transfer's tag is (collective sequence number, what the collective
 * is, step), and receives name their peer, so messages of different
 * collectives or steps never mix. Receives ignore the middle field and then
 * compare it: a peer that issued another collective at the same point (other
 * operation, dtype, reduction or root) is reported instead of being reduced
 * into the result. Counts that differ show up as blocks of the wrong size.
 * Each piece of a ring reduction is reduced by one chain of ranks and then
 * copied everywhere, so every rank gets bit-identical results. fp16 and bf16
 * travel and accumulate as fp32 and are rounded once at the end, as inside a
 * node (rounding at every hop of a long ring loses digits).
 */
#include <stdlib.h>
#include <string.h>

#include "../../param.h"
#include "../../transport/net.h"
#include "ring.h"

/* Pipeline unit of the broadcast chain. */
#define CHAIN_CHUNK (1u << 20)

#define TAG_STEP_BITS 20
#define TAG_WHAT_BITS 12
#define TAG_WHAT_MASK (((1ull << TAG_WHAT_BITS) - 1) << TAG_STEP_BITS)

static bool is_half(smddp_dtype_t t) { return t == SMDDP_FLOAT16 || t == SMDDP_BFLOAT16; }

/* 12 bits of what op is, the same on every rank that issued the same collective. */
static uint64_t what_of(const smddp__op_t *op)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    /* The caller's dtype: fp16 travelling as fp32 must not pass for fp32. */
    smddp_dtype_t dt = is_half(op->caller_dtype) ? op->caller_dtype : op->dtype;
    /*
     * The count too where every rank passes the same one: counts that differ
     * are then reported at the first message, also when a multi-round
     * collective's first rounds would have matched and the last ones waited
     * for the timeout.
     */
    bool same_count = op->kind == SMDDP_OP_ALLREDUCE || op->kind == SMDDP_OP_REDUCE ||
                      op->kind == SMDDP_OP_BROADCAST || op->kind == SMDDP_OP_ALLGATHER ||
                      op->kind == SMDDP_OP_REDUCE_SCATTER;
    uint64_t count = same_count ? (uint64_t)op->count : 0;
    const uint32_t fields[] = {(uint32_t)op->kind,   (uint32_t)dt,
                               (uint32_t)op->spec.op, (uint32_t)op->root,
                               (uint32_t)count,      (uint32_t)(count >> 32)};
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        h ^= fields[i];
        h *= 16777619u;
    }
    return (h ^ (h >> TAG_WHAT_BITS) ^ (h >> 2 * TAG_WHAT_BITS)) & ((1u << TAG_WHAT_BITS) - 1);
}

static uint64_t tag_of(const smddp__op_t *op, uint32_t step)
{
    return (op->seq << (TAG_STEP_BITS + TAG_WHAT_BITS)) | what_of(op) << TAG_STEP_BITS |
           (step & ((1u << TAG_STEP_BITS) - 1));
}

/* Posts a receive of step's message from rank from, whatever collective the sender issued. */
static smddp_status_t post_recv(smddp_comm_t comm, const smddp__op_t *op, smddp__xfer_t *x,
                                int from, uint32_t step, void *buf, size_t len)
{
    return comm->net->post(comm->net_ep, x, 0, from, tag_of(op, step), TAG_WHAT_MASK, buf, len,
                           true);
}

/* A received message must come from the same collective as op. */
static smddp_status_t check_what(const smddp__op_t *op, int from, uint64_t tag)
{
    if ((tag & TAG_WHAT_MASK) >> TAG_STEP_BITS == what_of(op)) return SMDDP_OK;
    char desc[256];
    smddp__op_describe(op, desc, sizeof(desc));
    return smddp__error_quiet(SMDDP_ERR_MISMATCH,
                              "%s: rank %d issued a different collective at this point (another "
                              "operation, count, dtype, reduction or root): every rank must "
                              "issue the same collectives in the same order", desc, from);
}

/* Only a peer running another collective (count, dtype, root) sends a block of another size. */
static smddp_status_t check_block(const smddp__op_t *op, int from, size_t received, size_t expected)
{
    if (received == expected) return SMDDP_OK;
    char desc[256];
    smddp__op_describe(op, desc, sizeof(desc));
    return smddp__error_quiet(SMDDP_ERR_MISMATCH,
                              "%s: rank %d sent %zu bytes where this rank expected %zu: the ranks "
                              "issued different collectives at this point", desc, from, received,
                              expected);
}

static void count_sent(smddp_comm_t comm, int to, size_t bytes)
{
    comm->net_bytes += bytes;
    if (comm->node_of[to] == comm->node) comm->net_bytes_local += bytes;
}

smddp_status_t smddp__net_exchange(smddp_comm_t comm, const smddp__op_t *op, uint32_t step,
                                   int to, const void *sbuf, size_t slen, int from, void *rbuf,
                                   size_t rlen)
{
    smddp__xfer_t rx, tx;
    uint64_t tag = tag_of(op, step);
    rx.done = tx.done = 1;
    smddp_status_t st = SMDDP_OK;
    if (from >= 0) st = post_recv(comm, op, &rx, from, step, rbuf, rlen);
    if (st == SMDDP_OK && to >= 0) st = smddp__xfer_post(comm, &tx, 1, to, tag, (void *)sbuf, slen);
    if (st == SMDDP_OK && to >= 0) st = smddp__xfer_wait(comm, op, &tx);
    if (st == SMDDP_OK && from >= 0) st = smddp__xfer_wait(comm, op, &rx);
    if (st != SMDDP_OK) {
        /* rx and tx live on this stack: nothing may complete into them later. */
        comm->net->abort(comm->net_ep, &rx);
        comm->net->abort(comm->net_ep, &tx);
        return st;
    }
    if (from >= 0) SMDDP_CHECK(check_what(op, from, rx.tag));
    if (from >= 0) SMDDP_CHECK(check_block(op, from, rx.received, rlen));
    if (to >= 0) count_sent(comm, to, slen);
    return SMDDP_OK;
}
#define exchange smddp__net_exchange

smddp__chain_t smddp__chain_ops(const smddp__op_t *op)
{
    smddp__chain_t c = {.step = op->spec};
    c.step.avg_div = 0;
    if (op->spec.op == SMDDP_PREMUL_SUM) {
        c.pre_scale = true;
        c.step.op = SMDDP_SUM;
    } else if (op->spec.op == SMDDP_AVG) {
        c.post_divide = true;
        c.step.op = SMDDP_SUM;
    }
    return c;
}

void smddp__net_unary(const smddp__op_t *op, smddp_op_t which, int avg_div, void *buf, size_t n)
{
    smddp__reduce_spec_t s = op->spec;
    s.op = which;
    s.avg_div = avg_div;
    const void *src[1] = {buf};
    smddp__reduce(&s, buf, src, 1, n);
}

static int member(const smddp__ring_t *g, int i) { return g->ranks ? g->ranks[i] : i; }

smddp_status_t smddp__ring_reduce_scatter(smddp_comm_t comm, const smddp__op_t *op,
                                          const smddp__ring_t *g,
                                          const smddp__reduce_spec_t *spec, char *work,
                                          const size_t *off, const size_t *len, char *tmp,
                                          uint32_t step0)
{
    int p = g->p, me = g->me;
    size_t es = smddp__dtype_size(spec->dtype);
    int next = member(g, (me + 1) % p), prev = member(g, (me + p - 1) % p);
    for (int s = 0; s < p - 1; s++) {
        int sb = (me - s - 1 + 2 * p) % p, rb = (me - s - 2 + 2 * p) % p;
        SMDDP_CHECK(exchange(comm, op, step0 + (uint32_t)s, next, work + off[sb] * es,
                             len[sb] * es, prev, tmp, len[rb] * es));
        const void *srcs[2] = {work + off[rb] * es, tmp};
        smddp__reduce(spec, work + off[rb] * es, srcs, 2, len[rb]);
    }
    return SMDDP_OK;
}

smddp_status_t smddp__ring_allgather(smddp_comm_t comm, const smddp__op_t *op,
                                     const smddp__ring_t *g, char *buf, const size_t *off,
                                     const size_t *len, size_t es, uint32_t step0)
{
    int p = g->p, me = g->me;
    int next = member(g, (me + 1) % p), prev = member(g, (me + p - 1) % p);
    for (int s = 0; s < p - 1; s++) {
        int sb = (me - s + p) % p, rb = (me - s - 1 + p) % p;
        SMDDP_CHECK(exchange(comm, op, step0 + (uint32_t)s, next, buf + off[sb] * es,
                             len[sb] * es, prev, buf + off[rb] * es, len[rb] * es));
    }
    return SMDDP_OK;
}

/*
 * Scratch above this many bytes in all is given back after the op, so one
 * huge collective does not pin its size (four times it, for fp16 through
 * fp32) for the communicator's life.
 */
#define SCRATCH_KEEP_MAX ((size_t)256 << 20)

void smddp__net_scratch_trim(smddp_comm_t comm)
{
    size_t total = 0;
    for (int i = 0; i < SMDDP_SCRATCH_SLOTS; i++) total += comm->scratch_len[i];
    if (total <= SCRATCH_KEEP_MAX) return;
    for (int i = 0; i < SMDDP_SCRATCH_SLOTS; i++) {
        free(comm->scratch[i]);
        comm->scratch[i] = NULL;
        comm->scratch_len[i] = 0;
    }
}

void *smddp__net_scratch(smddp_comm_t comm, int slot, size_t bytes)
{
    if (bytes == 0) bytes = 1;
    if (comm->scratch_len[slot] < bytes) {
        free(comm->scratch[slot]);
        comm->scratch[slot] = malloc(bytes);
        comm->scratch_len[slot] = comm->scratch[slot] ? bytes : 0;
    }
    return comm->scratch[slot];
}

smddp_status_t smddp__net_blocks(int p, size_t n, size_t each, size_t **off, size_t **len)
{
    *off = calloc((size_t)p, sizeof(size_t));
    *len = calloc((size_t)p, sizeof(size_t));
    if (!*off || !*len) {
        free(*off);
        free(*len);
        return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate the ring's block table");
    }
    for (int q = 0; q < p; q++) {
        if (each) {
            (*off)[q] = (size_t)q * each;
            (*len)[q] = each;
        } else {
            smddp__piece(n, p, q, &(*off)[q], &(*len)[q]);
        }
    }
    return SMDDP_OK;
}

/* Step 0 sends block me - 1; every later reduce-scatter step sends the block it just received. */
int smddp__ring_task_first(const smddp__ring_t *g) { return (g->me - 1 + g->p) % g->p; }

/* The blocks that step s of a ring allreduce sends (*sb) and receives (*rb). */
static bool task_blocks(const smddp__ring_task_t *t, int *sb, int *rb)
{
    int p = t->g->p, me = t->g->me, s = t->s;
    if (s < p - 1) { /* reduce-scatter */
        *sb = (me - s - 1 + 2 * p) % p;
        *rb = (me - s - 2 + 2 * p) % p;
        return true;
    }
    s -= p - 1; /* allgather */
    *sb = (me - s + p) % p;
    *rb = (me - s - 1 + p) % p;
    return false;
}

smddp_status_t smddp__ring_task_start(smddp__ring_task_t *t, smddp_comm_t comm,
                                      const smddp__op_t *op, const smddp__ring_t *g,
                                      const smddp__reduce_spec_t *spec, char *buf, size_t n,
                                      size_t *off, size_t *len, char *tmp, uint32_t step0,
                                      const void *const *local, int nlocal)
{
    memset(t, 0, sizeof(*t));
    t->local = local;
    t->nlocal = nlocal;
    t->comm = comm;
    t->op = op;
    t->g = g;
    t->spec = *spec;
    t->buf = buf;
    t->tmp = tmp;
    t->off = off;
    t->len = len;
    t->step0 = step0;
    t->nsteps = 2 * (g->p - 1);
    for (int q = 0; q < g->p; q++) smddp__piece(n, g->p, q, &off[q], &len[q]);
    return smddp__ring_task_advance(t);
}

smddp_status_t smddp__ring_task_advance(smddp__ring_task_t *t)
{
    smddp_comm_t comm = t->comm;
    size_t es = smddp__dtype_size(t->spec.dtype);
    int p = t->g->p, sb, rb;
    int next = member(t->g, (t->g->me + 1) % p), prev = member(t->g, (t->g->me + p - 1) % p);
    while (!t->done) {
        bool rs = task_blocks(t, &sb, &rb);
        if (t->posted) {
            if (!t->rx.done || !t->tx.done) return SMDDP_OK;
            t->posted = false;
            SMDDP_CHECK(smddp__xfer_status(t->op, &t->tx));
            SMDDP_CHECK(smddp__xfer_status(t->op, &t->rx));
            SMDDP_CHECK(check_what(t->op, prev, t->rx.tag));
            SMDDP_CHECK(check_block(t->op, prev, t->rx.received, t->len[rb] * es));
            count_sent(comm, next, t->len[sb] * es);
            if (rs) {
                char *mine = t->buf + t->off[rb] * es;
                if (t->local) {
                    /* This rank's share of block rb was never reduced: all sources at once. */
                    const void *srcs[SMDDP_NET_MAX_FUSE + 1];
                    for (int q = 0; q < t->nlocal; q++)
                        srcs[q] = (const char *)t->local[q] + t->off[rb] * es;
                    srcs[t->nlocal] = t->tmp;
                    smddp__reduce(&t->spec, mine, srcs, t->nlocal + 1, t->len[rb]);
                } else {
                    const void *srcs[2] = {mine, t->tmp};
                    smddp__reduce(&t->spec, mine, srcs, 2, t->len[rb]);
                }
            }
            t->s++;
            continue;
        }
        if (t->s == t->nsteps) {
            t->done = true;
            break;
        }
        uint64_t tag = tag_of(t->op, t->step0 + (uint32_t)t->s);
        char *into = rs ? t->tmp : t->buf + t->off[rb] * es;
        SMDDP_CHECK(post_recv(comm, t->op, &t->rx, prev, t->step0 + (uint32_t)t->s, into,
                              t->len[rb] * es));
        t->posted = true; /* from here on rx may complete: cancel must see it */
        smddp_status_t st =
            smddp__xfer_post(comm, &t->tx, 1, next, tag, t->buf + t->off[sb] * es, t->len[sb] * es);
        if (st != SMDDP_OK) {
            t->tx.done = 1;
            return st;
        }
    }
    return SMDDP_OK;
}

static smddp_status_t poll_task(void *arg, smddp__xfer_blame_t *blame)
{
    smddp__ring_task_t *t = arg;
    smddp_comm_t comm = t->comm;
    if (comm->pollers.n) {
        SMDDP_CHECK(smddp__pollers_run(&comm->pollers)); /* they advance t too */
    } else {
        SMDDP_CHECK(comm->net->progress(comm->net_ep));
        SMDDP_CHECK(smddp__ring_task_advance(t));
    }
    if (t->done) return SMDDP_OK;
    const smddp__xfer_t *x = t->rx.done ? &t->tx : &t->rx;
    blame->peer = x->peer;
    blame->is_send = x->is_send;
    return SMDDP_IN_PROGRESS;
}

smddp_status_t smddp__ring_task_wait(smddp__ring_task_t *t)
{
    if (t->done) return SMDDP_OK;
    return smddp__xfer_wait_until(t->comm, t->op, poll_task, t);
}

smddp_status_t smddp__ring_allreduce(smddp_comm_t comm, const smddp__op_t *op,
                                     const smddp__ring_t *g, const smddp__reduce_spec_t *spec,
                                     char *buf, size_t n, size_t *off, size_t *len, char *tmp,
                                     uint32_t step0)
{
    smddp__ring_task_t t;
    smddp_status_t st = smddp__ring_task_start(&t, comm, op, g, spec, buf, n, off, len, tmp,
                                               step0, NULL, 0);
    if (st == SMDDP_OK) st = smddp__ring_task_wait(&t);
    if (st != SMDDP_OK) smddp__ring_task_abandon(&t); /* t lives on this stack */
    return st;
}

void smddp__ring_task_abandon(smddp__ring_task_t *t)
{
    if (!t->posted) return;
    t->comm->net->abort(t->comm->net_ep, &t->rx);
    t->comm->net->abort(t->comm->net_ep, &t->tx);
}

smddp_status_t smddp__chain_broadcast(smddp_comm_t comm, const smddp__op_t *op,
                                      const smddp__ring_t *g, int root, char *buf, size_t bytes,
                                      uint32_t step0)
{
    int p = g->p;
    int pos = (g->me - root + p) % p;
    int next = pos == p - 1 ? -1 : member(g, (g->me + 1) % p);
    int prev = pos == 0 ? -1 : member(g, (g->me + p - 1) % p);
    uint32_t step = step0;
    for (size_t o = 0; o < bytes || (bytes == 0 && step == step0); o += CHAIN_CHUNK, step++) {
        size_t n = SMDDP_MIN((size_t)CHAIN_CHUNK, bytes - o);
        if (prev >= 0) SMDDP_CHECK(exchange(comm, op, step, -1, NULL, 0, prev, buf + o, n));
        if (next >= 0) SMDDP_CHECK(exchange(comm, op, step, next, buf + o, n, -1, NULL, 0));
        if (bytes == 0) break;
    }
    return SMDDP_OK;
}

smddp_status_t smddp__net_via_fp32(smddp_comm_t comm, smddp__op_t *op, size_t in_count,
                                   size_t out_count,
                                   smddp_status_t (*run)(smddp_comm_t, smddp__op_t *))
{
    if (!is_half(op->dtype)) return run(comm, op);
    float *w = smddp__net_scratch(comm, SMDDP_SCRATCH_FP32, (in_count + out_count) * sizeof(float));
    if (!w) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes",
                                (in_count + out_count) * sizeof(float));
    const uint16_t *in = op->sendbuf;
    bool f16 = op->dtype == SMDDP_FLOAT16;
    for (size_t i = 0; i < in_count; i++)
        w[i] = f16 ? smddp__fp16_to_fp32(in[i]) : smddp__bf16_to_fp32(in[i]);
    smddp__op_t f = *op;
    f.caller_dtype = op->dtype;
    f.dtype = f.spec.dtype = SMDDP_FLOAT32;
    f.sendbuf = w;
    f.recvbuf = w + in_count;
    smddp_status_t st = run(comm, &f);
    uint16_t *out = op->recvbuf;
    for (size_t i = 0; st == SMDDP_OK && i < out_count; i++)
        out[i] = f16 ? smddp__fp32_to_fp16(w[in_count + i]) : smddp__fp32_to_bf16(w[in_count + i]);
    return st;
}

smddp_status_t smddp__net_run(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn algo)
{
    /* Buffers registered during the op (where the provider needs it) are reused until its end. */
    comm->net->op_begin(comm->net_ep, op->deadline_ns);
    uint64_t net0 = comm->net_bytes, shm0 = comm->shm_bytes;
    smddp_status_t st = algo(comm, op);
    SMDDP_TRACE("rank %d: seq %llu moved %llu bytes over the network, %llu through shared memory",
                comm->rank, (unsigned long long)op->seq,
                (unsigned long long)(comm->net_bytes - net0),
                (unsigned long long)(comm->shm_bytes - shm0));
    comm->net->op_end(comm->net_ep);
    smddp__net_scratch_trim(comm); /* after op_end: no registration of it is held any more */
    return st;
}
