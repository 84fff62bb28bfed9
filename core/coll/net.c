/*
 * The flat collectives across nodes, in which every rank is on the network:
 * rings for allreduce, reduce-scatter and allgather, a pipelined chain for
 * broadcast, pairwise exchange for all-to-all, direct transfers for gather
 * and scatter, all built from ring.c's blocks. hier.c has the hierarchical
 * ones; the selection (select.c) picks between them.
 */
#include <stdlib.h>
#include <string.h>

#include "../param.h"
#include "../transport/ofi.h"
#include "net.h"

#define exchange smddp__net_exchange

static const smddp__ring_t *everyone(smddp_comm_t comm, smddp__ring_t *g)
{
    *g = (smddp__ring_t){.p = comm->size, .me = comm->rank, .ranks = NULL};
    return g;
}

/* Allreduce of op->sendbuf into op->recvbuf: ring reduce-scatter, then ring allgather. */
static smddp_status_t ring_allreduce(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp__dtype_size(op->dtype);
    char *out = op->recvbuf;
    smddp__chain_t c = smddp__chain_ops(op);
    smddp__ring_t g;
    if (out != op->sendbuf) memcpy(out, op->sendbuf, op->count * es);
    if (c.pre_scale) smddp__net_unary(op, SMDDP_PREMUL_SUM, 0, out, op->count);
    size_t biggest = op->count / (size_t)comm->size + 1, *off, *len;
    SMDDP_CHECK(smddp__net_blocks(comm->size, op->count, 0, &off, &len));
    char *tmp = smddp__net_scratch(comm, SMDDP_SCRATCH_TMP, biggest * es);
    smddp_status_t st = tmp ? smddp__ring_allreduce(comm, op, everyone(comm, &g), &c.step, out,
                                                    op->count, off, len, tmp, 0)
                            : smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes",
                                           biggest * es);
    free(off);
    free(len);
    if (st == SMDDP_OK && c.post_divide)
        smddp__net_unary(op, SMDDP_AVG, comm->size, out, op->count);
    return st;
}

/* Reduce-scatter of op->sendbuf (p blocks of op->count) into op->recvbuf. */
static smddp_status_t ring_reduce_scatter_op(smddp_comm_t comm, smddp__op_t *op)
{
    int p = comm->size;
    size_t es = smddp__dtype_size(op->dtype), n = op->count, *off, *len;
    smddp__chain_t c = smddp__chain_ops(op);
    smddp__ring_t g;
    /* The ring reduces in place: work on a copy of the input. */
    char *work = smddp__net_scratch(comm, SMDDP_SCRATCH_WORK, n * (size_t)p * es);
    char *tmp = smddp__net_scratch(comm, SMDDP_SCRATCH_TMP, n * es);
    smddp_status_t st = SMDDP_OK;
    if (!work || !tmp) st = smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes",
                                         n * (size_t)(p + 1) * es);
    if (st == SMDDP_OK) st = smddp__net_blocks(p, 0, n, &off, &len);
    if (st == SMDDP_OK) {
        memcpy(work, op->sendbuf, n * (size_t)p * es);
        if (c.pre_scale) smddp__net_unary(op, SMDDP_PREMUL_SUM, 0, work, n * (size_t)p);
        char *mine = work + off[comm->rank] * es;
        st = smddp__ring_reduce_scatter(comm, op, everyone(comm, &g), &c.step, work, off, len,
                                        tmp, 0);
        if (st == SMDDP_OK && c.post_divide) smddp__net_unary(op, SMDDP_AVG, p, mine, n);
        if (st == SMDDP_OK) memcpy(op->recvbuf, mine, n * es);
        free(off);
        free(len);
    }
    return st;
}

smddp_status_t smddp__net_allgather(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp__dtype_size(op->dtype), n = op->count, *off, *len;
    char *recv = op->recvbuf;
    smddp__ring_t g;
    memmove(recv + (size_t)comm->rank * n * es, op->sendbuf, n * es);
    SMDDP_CHECK(smddp__net_blocks(comm->size, 0, n, &off, &len));
    smddp_status_t st = smddp__ring_allgather(comm, op, everyone(comm, &g), recv, off, len, es, 0);
    free(off);
    free(len);
    return st;
}

/* A chain from the root, rank order, pipelined in chunks. */
smddp_status_t smddp__net_broadcast(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__ring_t g;
    return smddp__chain_broadcast(comm, op, everyone(comm, &g), op->root, op->recvbuf,
                                  op->count * smddp__dtype_size(op->dtype), 0);
}

/* Pairwise exchange: at step s, send to me + s and receive from me - s. */
static smddp_status_t net_alltoallv(smddp_comm_t comm, smddp__op_t *op, const int64_t *scounts,
                                    const int64_t *sdispls, const int64_t *rcounts,
                                    const int64_t *rdispls)
{
    int p = comm->size, me = comm->rank;
    size_t es = smddp__dtype_size(op->dtype);
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    if (scounts[me] != rcounts[me]) {
        char desc[256];
        smddp__op_describe(op, desc, sizeof(desc));
        return smddp__error_quiet(SMDDP_ERR_MISMATCH,
                                  "%s: rank %d sends itself %lld elements but expects to receive "
                                  "%lld from itself: sendcounts[%d] and recvcounts[%d] must be "
                                  "equal", desc, me, (long long)scounts[me],
                                  (long long)rcounts[me], me, me);
    }
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

smddp_status_t smddp__net_alltoall(smddp_comm_t comm, smddp__op_t *op)
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
        size_t bytes = op->count * (size_t)p * smddp__dtype_size(op->dtype);
        void *copy = smddp__net_scratch(comm, SMDDP_SCRATCH_OUTER, bytes);
        if (!copy) st = smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes", bytes);
        if (copy) {
            memcpy(copy, op->sendbuf, bytes);
            smddp__op_t tmp = *op;
            tmp.sendbuf = copy;
            st = net_alltoallv(comm, &tmp, v, v + p, v + 2 * p, v + 3 * p);
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
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
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

smddp_status_t smddp__net_alltoallv(smddp_comm_t comm, smddp__op_t *op)
{
    int p = comm->size;
    return net_alltoallv(comm, op, op->v, op->v + p, op->v + 2 * p, op->v + 3 * p);
}

smddp_status_t smddp__net_gather(smddp_comm_t comm, smddp__op_t *op)
{
    return net_gather_scatter(comm, op, true);
}

smddp_status_t smddp__net_scatter(smddp_comm_t comm, smddp__op_t *op)
{
    return net_gather_scatter(comm, op, false);
}

/* One flat allreduce (fp16/bf16 through fp32). */
smddp_status_t smddp__net_allreduce(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_via_fp32(comm, op, op->count, op->count, ring_allreduce);
}

smddp_status_t smddp__net_reduce_scatter(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_via_fp32(comm, op, op->count * (size_t)comm->size, op->count,
                               ring_reduce_scatter_op);
}

smddp_status_t smddp__net_barrier(smddp_comm_t comm, smddp__op_t *op)
{
    /*
     * Nothing moves until every rank has arrived: a one-byte allreduce,
     * still of kind barrier, so that its messages do not pass for a real
     * one-byte max allreduce's and errors name the barrier.
     */
    uint8_t one = 1;
    smddp__op_t b = *op;
    b.sendbuf = b.recvbuf = &one;
    b.count = 1;
    b.dtype = SMDDP_UINT8;
    b.spec = (smddp__reduce_spec_t){.dtype = SMDDP_UINT8, .op = SMDDP_MAX, .premul = 1.0};
    return ring_allreduce(comm, &b);
}

smddp_status_t smddp__net_reduce_by(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn allreduce)
{
    if (comm->rank == op->root) return allreduce(comm, op);
    /* Off the root: an allreduce into scratch (simple; twice the traffic). */
    smddp__op_t r = *op;
    r.recvbuf = smddp__net_scratch(comm, SMDDP_SCRATCH_OUTER,
                                   op->count * smddp__dtype_size(op->dtype));
    if (!r.recvbuf) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate scratch");
    return allreduce(comm, &r);
}

smddp_status_t smddp__net_reduce(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_reduce_by(comm, op, smddp__net_allreduce);
}

smddp_status_t smddp__net_run(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn algo)
{
    /* Buffers registered during the op (where the provider needs it) are reused until its end. */
    smddp__ofi_op_begin(comm, op);
    uint64_t net0 = comm->net_bytes, shm0 = comm->shm_bytes;
    smddp_status_t st = algo(comm, op);
    SMDDP_TRACE("rank %d: seq %llu moved %llu bytes over the network, %llu through shared memory",
                comm->rank, (unsigned long long)op->seq,
                (unsigned long long)(comm->net_bytes - net0),
                (unsigned long long)(comm->shm_bytes - shm0));
    smddp__ofi_op_end(comm);
    smddp__net_scratch_trim(comm); /* after op_end: no registration of it is held any more */
    return st;
}

#define ENTRY(var, name, kind, run, about)                                                          \
    const smddp__algo_t smddp__algo_##var = {name, SMDDP_OP_##kind, SMDDP_PATH_NET, false, NULL,    \
                                             run, NULL, about}
ENTRY(net_allreduce_ring, "ring", ALLREDUCE, smddp__net_allreduce,
      "every rank on one ring: reduce-scatter, then allgather");
ENTRY(net_reduce_ring, "ring", REDUCE, smddp__net_reduce,
      "the ring allreduce, off the root into scratch");
ENTRY(net_reduce_scatter_ring, "ring", REDUCE_SCATTER, smddp__net_reduce_scatter,
      "every rank on one ring");
ENTRY(net_allgather_ring, "ring", ALLGATHER, smddp__net_allgather, "every rank on one ring");
ENTRY(net_broadcast_chain, "chain", BROADCAST, smddp__net_broadcast,
      "a pipelined chain from the root");
ENTRY(net_alltoall_pairwise, "pairwise", ALLTOALL, smddp__net_alltoall,
      "every pair exchanges directly");
ENTRY(net_alltoallv_pairwise, "pairwise", ALLTOALLV, smddp__net_alltoallv,
      "every pair exchanges directly, counts checked first");
ENTRY(net_gather_direct, "direct", GATHER, smddp__net_gather, "every rank sends to the root");
ENTRY(net_scatter_direct, "direct", SCATTER, smddp__net_scatter, "the root sends to every rank");
ENTRY(net_barrier_ring, "ring", BARRIER, smddp__net_barrier, "a one-byte ring allreduce");
