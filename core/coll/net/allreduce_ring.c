/*
 * The flat ring allreduce across nodes: every rank on one ring, a ring
 * reduce-scatter then a ring allgather (ring.c). fp16 and bf16 go through
 * fp32 and are rounded once at the end.
 */
#include <stdlib.h>
#include <string.h>

#include "net_algo.h"

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
    smddp_status_t st = tmp ? smddp__ring_allreduce(comm, op, smddp__net_everyone(comm, &g),
                                                    &c.step, out, op->count, off, len, tmp, 0)
                            : smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes",
                                           biggest * es);
    free(off);
    free(len);
    if (st == SMDDP_OK && c.post_divide)
        smddp__net_unary(op, SMDDP_AVG, comm->size, out, op->count);
    return st;
}

smddp_status_t smddp__net_allreduce(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__net_via_fp32(comm, op, op->count, op->count, ring_allreduce);
}

SMDDP_NET_ALGO(net_allreduce_ring, "ring", ALLREDUCE, smddp__net_allreduce,
               "every rank on one ring: reduce-scatter, then allgather");
