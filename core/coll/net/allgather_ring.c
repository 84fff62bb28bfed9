/* The flat ring allgather across nodes: every rank on one ring (ring.c). */
#include <stdlib.h>
#include <string.h>

#include "net_algo.h"

static smddp_status_t allgather_ring(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp__dtype_size(op->dtype), n = op->count, *off, *len;
    char *recv = op->recvbuf;
    smddp__ring_t g;
    memmove(recv + (size_t)comm->rank * n * es, op->sendbuf, n * es);
    SMDDP_CHECK(smddp__net_blocks(comm->size, 0, n, &off, &len));
    smddp_status_t st =
        smddp__ring_allgather(comm, op, smddp__net_everyone(comm, &g), recv, off, len, es, 0);
    free(off);
    free(len);
    return st;
}

SMDDP_NET_ALGO(net_allgather_ring, "ring", ALLGATHER, allgather_ring, "every rank on one ring");
