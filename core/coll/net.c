/*
 * Collectives for communicators that span nodes: flat algorithms in which
 * every rank talks to its peers through the libfabric transport (ranks of one
 * node too, for now). Rings for allreduce, reduce-scatter and allgather, a
 * pipelined chain for broadcast, pairwise exchange for all-to-all, direct
 * transfers for gather and scatter. The hierarchical versions (shared memory
 * inside a node, the network between nodes) come next.
 *
 * Every transfer's tag is (collective sequence number, step), and receives
 * name their peer, so messages of different collectives or steps never mix.
 * Each piece of a ring reduction is reduced by one chain of ranks and then
 * copied everywhere, so every rank gets bit-identical results. fp16 and bf16
 * travel and accumulate as fp32 and are rounded once at the end, as inside a
 * node (rounding at every hop of a long ring loses digits).
 */
#include <stdlib.h>
#include <string.h>

#include "../reduce/half.h"
#include "../reduce/reduce.h"
#include "../transport/ofi.h"
#include "coll.h"

/* Pipeline unit of the broadcast chain. */
#define CHAIN_CHUNK (1u << 20)

static uint64_t tag_of(const smddp__op_t *op, uint32_t step)
{
    return (op->seq << 20) | (step & 0xfffff);
}

/* Sends to `to` and receives from `from` at once (either may be skipped with -1). */
static smddp_status_t exchange(smddp_comm_t comm, const smddp__op_t *op, uint32_t step, int to,
                               const void *sbuf, size_t slen, int from, void *rbuf, size_t rlen)
{
    smddp__ofi_xfer_t rx, tx;
    uint64_t tag = tag_of(op, step);
    if (from >= 0) SMDDP_CHECK(smddp__ofi_post(comm, &rx, 0, from, tag, rbuf, rlen));
    if (to >= 0) SMDDP_CHECK(smddp__ofi_post(comm, &tx, 1, to, tag, (void *)sbuf, slen));
    if (to >= 0) SMDDP_CHECK(smddp__ofi_wait(comm, op, &tx));
    if (from >= 0) SMDDP_CHECK(smddp__ofi_wait(comm, op, &rx));
    return SMDDP_OK;
}

/*
 * How a chain of partial reductions combines: PREMUL_SUM scales each rank's
 * own input once (pre_scale) and then sums; AVG sums and divides once at
 * the end (post_divide); every other op chains as it is.
 */
typedef struct chain_ops {
    smddp__reduce_spec_t step;
    bool pre_scale;
    bool post_divide;
} chain_ops_t;

static chain_ops_t chain_ops(const smddp__op_t *op)
{
    chain_ops_t c = {.step = op->spec};
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

static void apply_unary(const smddp__op_t *op, smddp_op_t which, int avg_div, void *buf,
                        size_t n)
{
    smddp__reduce_spec_t s = op->spec;
    s.op = which;
    s.avg_div = avg_div;
    const void *src[1] = {buf};
    smddp__reduce(&s, buf, src, 1, n);
}

/*
 * Ring reduce-scatter over work (p blocks of block(q) elements, block q at
 * offset off(q)): afterwards block `me` of work holds the reduction of every
 * rank's block `me`. tmp holds the largest block.
 */
static smddp_status_t ring_reduce_scatter(smddp_comm_t comm, const smddp__op_t *op, char *work,
                                          const size_t *off, const size_t *len, char *tmp,
                                          uint32_t step0)
{
    int p = comm->size, me = comm->rank;
    size_t es = smddp_dtype_size(op->dtype);
    chain_ops_t c = chain_ops(op);
    int next = (me + 1) % p, prev = (me + p - 1) % p;
    for (int s = 0; s < p - 1; s++) {
        int sb = (me - s - 1 + 2 * p) % p, rb = (me - s - 2 + 2 * p) % p;
        SMDDP_CHECK(exchange(comm, op, step0 + (uint32_t)s, next, work + off[sb] * es,
                             len[sb] * es, prev, tmp, len[rb] * es));
        const void *srcs[2] = {work + off[rb] * es, tmp};
        smddp__reduce(&c.step, work + off[rb] * es, srcs, 2, len[rb]);
    }
    if (c.post_divide) apply_unary(op, SMDDP_AVG, comm->size, work + off[me] * es, len[me]);
    return SMDDP_OK;
}

/* Ring allgather: block `me` of buf is this rank's; afterwards every block is filled. */
static smddp_status_t ring_allgather(smddp_comm_t comm, const smddp__op_t *op, char *buf,
                                     const size_t *off, const size_t *len, size_t es,
                                     uint32_t step0)
{
    int p = comm->size, me = comm->rank;
    int next = (me + 1) % p, prev = (me + p - 1) % p;
    for (int s = 0; s < p - 1; s++) {
        int sb = (me - s + p) % p, rb = (me - s - 1 + p) % p;
        SMDDP_CHECK(exchange(comm, op, step0 + (uint32_t)s, next, buf + off[sb] * es,
                             len[sb] * es, prev, buf + off[rb] * es, len[rb] * es));
    }
    return SMDDP_OK;
}

/*
 * A ring's block table: p offsets and lengths (elements), freed by the
 * caller. each == 0: the even split of n (piece 0 is the largest); else p
 * blocks of `each`, block q at q * each.
 */
static smddp_status_t block_table(int p, size_t n, size_t each, size_t **off, size_t **len)
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

/* Allreduce of op->sendbuf into op->recvbuf: ring reduce-scatter, then ring allgather. */
static smddp_status_t ring_allreduce(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp_dtype_size(op->dtype), *off, *len;
    char *out = op->recvbuf;
    if (out != op->sendbuf) memcpy(out, op->sendbuf, op->count * es);
    if (chain_ops(op).pre_scale) apply_unary(op, SMDDP_PREMUL_SUM, 0, out, op->count);
    SMDDP_CHECK(block_table(comm->size, op->count, 0, &off, &len));
    char *tmp = malloc((len[0] ? len[0] : 1) * es);
    smddp_status_t st = tmp ? SMDDP_OK
                            : smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes",
                                           len[0] * es);
    if (st == SMDDP_OK) st = ring_reduce_scatter(comm, op, out, off, len, tmp, 0);
    if (st == SMDDP_OK) st = ring_allgather(comm, op, out, off, len, es, (uint32_t)comm->size);
    free(tmp);
    free(off);
    free(len);
    return st;
}

/* Reduce-scatter of op->sendbuf (p blocks of op->count) into op->recvbuf. */
static smddp_status_t ring_reduce_scatter_op(smddp_comm_t comm, smddp__op_t *op)
{
    int p = comm->size;
    size_t es = smddp_dtype_size(op->dtype), n = op->count, *off, *len;
    /* The ring reduces in place: work on a copy of the input. */
    char *work = malloc(n * (size_t)p * es + 1), *tmp = malloc(n * es + 1);
    smddp_status_t st = SMDDP_OK;
    if (!work || !tmp) st = smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes",
                                         n * (size_t)(p + 1) * es);
    if (st == SMDDP_OK) st = block_table(p, 0, n, &off, &len);
    if (st == SMDDP_OK) {
        memcpy(work, op->sendbuf, n * (size_t)p * es);
        if (chain_ops(op).pre_scale) apply_unary(op, SMDDP_PREMUL_SUM, 0, work, n * (size_t)p);
        st = ring_reduce_scatter(comm, op, work, off, len, tmp, 0);
        if (st == SMDDP_OK) memcpy(op->recvbuf, work + off[comm->rank] * es, n * es);
        free(off);
        free(len);
    }
    free(work);
    free(tmp);
    return st;
}

static bool is_half(smddp_dtype_t t) { return t == SMDDP_FLOAT16 || t == SMDDP_BFLOAT16; }

/*
 * fp16/bf16: runs ring on an fp32 copy of the in_count inputs (same
 * collective, same tags) and rounds its out_count results once into
 * op->recvbuf.
 */
static smddp_status_t via_fp32(smddp_comm_t comm, smddp__op_t *op, size_t in_count,
                               size_t out_count,
                               smddp_status_t (*ring)(smddp_comm_t, smddp__op_t *))
{
    float *w = malloc((in_count + out_count) * sizeof(float));
    if (!w) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes",
                                (in_count + out_count) * sizeof(float));
    const uint16_t *in = op->sendbuf;
    bool f16 = op->dtype == SMDDP_FLOAT16;
    for (size_t i = 0; i < in_count; i++)
        w[i] = f16 ? smddp__fp16_to_fp32(in[i]) : smddp__bf16_to_fp32(in[i]);
    smddp__op_t f = *op;
    f.dtype = f.spec.dtype = SMDDP_FLOAT32;
    f.sendbuf = w;
    f.recvbuf = w + in_count;
    smddp_status_t st = ring(comm, &f);
    uint16_t *out = op->recvbuf;
    for (size_t i = 0; st == SMDDP_OK && i < out_count; i++)
        out[i] = f16 ? smddp__fp32_to_fp16(w[in_count + i]) : smddp__fp32_to_bf16(w[in_count + i]);
    free(w);
    return st;
}

static smddp_status_t net_allreduce(smddp_comm_t comm, smddp__op_t *op)
{
    if (is_half(op->dtype)) return via_fp32(comm, op, op->count, op->count, ring_allreduce);
    return ring_allreduce(comm, op);
}

static smddp_status_t net_reduce_scatter(smddp_comm_t comm, smddp__op_t *op)
{
    if (is_half(op->dtype))
        return via_fp32(comm, op, op->count * (size_t)comm->size, op->count,
                        ring_reduce_scatter_op);
    return ring_reduce_scatter_op(comm, op);
}

static smddp_status_t net_allgather(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp_dtype_size(op->dtype), n = op->count, *off, *len;
    char *recv = op->recvbuf;
    memmove(recv + (size_t)comm->rank * n * es, op->sendbuf, n * es);
    SMDDP_CHECK(block_table(comm->size, 0, n, &off, &len));
    smddp_status_t st = ring_allgather(comm, op, recv, off, len, es, 0);
    free(off);
    free(len);
    return st;
}

/* A chain from the root, rank order, pipelined in chunks. */
static smddp_status_t net_broadcast(smddp_comm_t comm, smddp__op_t *op)
{
    int p = comm->size;
    int pos = (comm->rank - op->root + p) % p;
    int next = pos == p - 1 ? -1 : (comm->rank + 1) % p;
    int prev = pos == 0 ? -1 : (comm->rank + p - 1) % p;
    size_t bytes = op->count * smddp_dtype_size(op->dtype);
    char *buf = op->recvbuf;
    uint32_t step = 0;
    for (size_t o = 0; o < bytes || (bytes == 0 && step == 0); o += CHAIN_CHUNK, step++) {
        size_t n = SMDDP_MIN((size_t)CHAIN_CHUNK, bytes - o);
        if (prev >= 0) SMDDP_CHECK(exchange(comm, op, step, -1, NULL, 0, prev, buf + o, n));
        if (next >= 0) SMDDP_CHECK(exchange(comm, op, step, next, buf + o, n, -1, NULL, 0));
        if (bytes == 0) break;
    }
    return SMDDP_OK;
}

/* Pairwise exchange: at step s, send to me + s and receive from me - s. */
static smddp_status_t net_alltoallv(smddp_comm_t comm, smddp__op_t *op, const int64_t *scounts,
                                    const int64_t *sdispls, const int64_t *rcounts,
                                    const int64_t *rdispls)
{
    int p = comm->size, me = comm->rank;
    size_t es = smddp_dtype_size(op->dtype);
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    memmove(recv + (size_t)rdispls[me] * es, send + (size_t)sdispls[me] * es,
            (size_t)scounts[me] * es);
    for (int s = 1; s < p; s++) {
        int to = (me + s) % p, from = (me - s + p) % p;
        SMDDP_CHECK(exchange(comm, op, (uint32_t)s, to, send + (size_t)sdispls[to] * es,
                             (size_t)scounts[to] * es, from, recv + (size_t)rdispls[from] * es,
                             (size_t)rcounts[from] * es));
    }
    return SMDDP_OK;
}

static smddp_status_t net_alltoall(smddp_comm_t comm, smddp__op_t *op)
{
    int p = comm->size;
    int64_t *v = malloc(4 * (size_t)p * sizeof(int64_t));
    if (!v) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate the all-to-all table");
    for (int q = 0; q < p; q++) {
        v[q] = v[2 * p + q] = (int64_t)op->count;
        v[p + q] = v[3 * p + q] = (int64_t)op->count * q;
    }
    smddp_status_t st = SMDDP_OK;
    if (op->sendbuf == op->recvbuf) {
        /* In place: send from a copy. */
        size_t bytes = op->count * (size_t)p * smddp_dtype_size(op->dtype);
        void *copy = malloc(bytes + 1);
        if (!copy) st = smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes", bytes);
        if (copy) {
            memcpy(copy, op->sendbuf, bytes);
            smddp__op_t tmp = *op;
            tmp.sendbuf = copy;
            st = net_alltoallv(comm, &tmp, v, v + p, v + 2 * p, v + 3 * p);
            free(copy);
        }
    } else {
        st = net_alltoallv(comm, op, v, v + p, v + 2 * p, v + 3 * p);
    }
    free(v);
    return st;
}

/* Gather (root >= 0 receives everything) and scatter: direct transfers. */
static smddp_status_t net_gather_scatter(smddp_comm_t comm, smddp__op_t *op, bool gather)
{
    size_t bytes = op->count * smddp_dtype_size(op->dtype);
    int me = comm->rank, root = op->root;
    if (me != root)
        return gather ? exchange(comm, op, 0, root, op->sendbuf, bytes, -1, NULL, 0)
                      : exchange(comm, op, 0, -1, NULL, 0, root, op->recvbuf, bytes);
    for (int q = 0; q < comm->size; q++) {
        char *block = (char *)(gather ? op->recvbuf : op->sendbuf) + (size_t)q * bytes;
        if (q == me) {
            if (gather) memmove(block, op->sendbuf, bytes);
            else memmove(op->recvbuf, block, bytes);
            continue;
        }
        SMDDP_CHECK(gather ? exchange(comm, op, 0, -1, NULL, 0, q, block, bytes)
                           : exchange(comm, op, 0, q, block, bytes, -1, NULL, 0));
    }
    return SMDDP_OK;
}

smddp_status_t smddp__net_execute(smddp_comm_t comm, smddp__op_t *op)
{
    switch (op->kind) {
    case SMDDP_OP_ALLREDUCE:
        if (op->count == 0) return SMDDP_OK;
        return net_allreduce(comm, op);
    case SMDDP_OP_REDUCE: {
        /* An allreduce into scratch on non-roots: simple, twice the traffic. */
        if (op->count == 0) return SMDDP_OK;
        if (comm->rank == op->root) return net_allreduce(comm, op);
        smddp__op_t r = *op;
        r.recvbuf = malloc(op->count * smddp_dtype_size(op->dtype));
        if (!r.recvbuf) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate scratch");
        smddp_status_t st = net_allreduce(comm, &r);
        free(r.recvbuf);
        return st;
    }
    case SMDDP_OP_REDUCE_SCATTER:
        if (op->count == 0) return SMDDP_OK;
        return net_reduce_scatter(comm, op);
    case SMDDP_OP_ALLGATHER:
        return net_allgather(comm, op);
    case SMDDP_OP_BROADCAST:
        return net_broadcast(comm, op);
    case SMDDP_OP_ALLTOALL:
        if (op->count == 0) return SMDDP_OK;
        return net_alltoall(comm, op);
    case SMDDP_OP_ALLTOALLV: {
        int p = comm->size;
        return net_alltoallv(comm, op, op->v, op->v + p, op->v + 2 * p, op->v + 3 * p);
    }
    case SMDDP_OP_GATHER:
        return net_gather_scatter(comm, op, true);
    case SMDDP_OP_SCATTER:
        return net_gather_scatter(comm, op, false);
    case SMDDP_OP_BARRIER: {
        /* Nothing moves until every rank has arrived: a one-byte allreduce. */
        uint8_t one = 1;
        smddp__op_t b = *op;
        b.kind = SMDDP_OP_ALLREDUCE;
        b.sendbuf = b.recvbuf = &one;
        b.count = 1;
        b.dtype = SMDDP_UINT8;
        b.spec = (smddp__reduce_spec_t){.dtype = SMDDP_UINT8, .op = SMDDP_MAX, .premul = 1.0};
        return net_allreduce(comm, &b);
    }
    default:
        return smddp__error(SMDDP_ERR_INTERNAL, "no network algorithm for op kind %d",
                            (int)op->kind);
    }
}
