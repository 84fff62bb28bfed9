/* The flat gather across nodes: every rank sends its block straight to the root. */
#include <string.h>

#include "net_algo.h"

static smddp_status_t gather_direct(smddp_comm_t comm, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    int me = comm->rank, root = op->root;
    if (me != root) return smddp__net_exchange(comm, op, 0, root, op->sendbuf, bytes, -1, NULL, 0);
    for (int q = 0; q < comm->size; q++) {
        char *block = (char *)op->recvbuf + (size_t)q * bytes;
        if (q == me)
            memmove(block, op->sendbuf, bytes);
        else
            SMDDP_CHECK(smddp__net_exchange(comm, op, 0, -1, NULL, 0, q, block, bytes));
    }
    return SMDDP_OK;
}

SMDDP_NET_ALGO(net_gather_direct, "direct", GATHER, gather_direct, "every rank sends to the root");
