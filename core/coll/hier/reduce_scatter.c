/*
 * The hierarchical reduce-scatter: in rounds, every local rank reduces over
 * the node its slots for every node (as two-shot's first half does), then
 * runs a ring reduce-scatter of them with its counterparts.
 */
#include <stdlib.h>
#include <string.h>

#include "hier.h"

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
    smddp__reduce_spec_t spec = smddp__hier_node_spec(op);
    smddp__chain_t c = smddp__chain_ops(op);
    smddp__hier_t hr;

    if (round_elems * es * (size_t)L * (size_t)N > smddp__shm_half_size(comm))
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "reduce_scatter: %d ranks do not fit the %zu-byte staging half "
                            "(raise SMDDP_SHM_BUFFER_SIZE or set SMDDP_NET_ALGO=flat)",
                            comm->size, smddp__shm_half_size(comm));
    SMDDP_CHECK(smddp__hier_init(comm, &hr, me, round_elems * es));
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
                       send + ((size_t)smddp__hier_at(comm, j, q) * n + base) * es, m * es);
        }
        comm->shm_bytes += (size_t)(L - 1) * (size_t)N * m * es;
        if ((st = smddp__shm_sync(comm, op)) != SMDDP_OK) break;
        /* My slots (me, *) in my own half are free: reduce into them. */
        char *work = mine + (size_t)me * N * m * es;
        for (int j = 0; j < N; j++) {
            for (int q = 0; q < L; q++)
                srcs[q] = q == me ? send + ((size_t)smddp__hier_at(comm, j, me) * n + base) * es
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
    smddp__hier_free(&hr);
    return st;
}

static smddp_status_t hier_reduce_scatter(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_via_fp32(comm, op, op->count * (size_t)comm->size, op->count,
                               reduce_scatter);
}

SMDDP_HIER_ALGO(hier_reduce_scatter, "hierarchical", REDUCE_SCATTER, hier_reduce_scatter,
                "reduce-scatter in the node, then a ring reduce-scatter across nodes");
