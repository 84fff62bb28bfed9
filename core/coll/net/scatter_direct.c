/* The flat scatter across nodes: the root sends each rank its block straight. */
#include <string.h>

#include "net_algo.h"

static smddp_status_t scatter_direct(smddp_comm_t comm, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    int me = comm->rank, root = op->root;
    if (me != root) return smddp__net_exchange(comm, op, 0, -1, NULL, 0, root, op->recvbuf, bytes);
    for (int q = 0; q < comm->size; q++) {
        const char *block = (const char *)op->sendbuf + (size_t)q * bytes;
        if (q == me)
            memmove(op->recvbuf, block, bytes);
        else
            SMDDP_CHECK(smddp__net_exchange(comm, op, 0, q, block, bytes, -1, NULL, 0));
    }
    return SMDDP_OK;
}

SMDDP_NET_ALGO(net_scatter_direct, "direct", SCATTER, scatter_direct,
               "the root sends to every rank");
