/*
 * The flat ring reduce-scatter across nodes: the first half of the ring
 * allreduce, on a copy of the input; fp16 and bf16 through fp32.
 */
#include <stdlib.h>
#include <string.h>

#include "net_algo.h"

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
        st = smddp__ring_reduce_scatter(comm, op, smddp__net_everyone(comm, &g), &c.step, work,
                                        off, len, tmp, 0);
        if (st == SMDDP_OK && c.post_divide) smddp__net_unary(op, SMDDP_AVG, p, mine, n);
        if (st == SMDDP_OK) memcpy(op->recvbuf, mine, n * es);
        free(off);
        free(len);
    }
    return st;
}

static smddp_status_t reduce_scatter_ring(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_via_fp32(comm, op, op->count * (size_t)comm->size, op->count,
                               ring_reduce_scatter_op);
}

SMDDP_NET_ALGO(net_reduce_scatter_ring, "ring", REDUCE_SCATTER, reduce_scatter_ring,
               "every rank on one ring");
