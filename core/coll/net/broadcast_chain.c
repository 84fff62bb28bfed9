/* The flat broadcast across nodes: a chain from the root in rank order, pipelined in chunks. */
#include "net_algo.h"

static smddp_status_t broadcast_chain(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__ring_t g;
    return smddp__chain_broadcast(comm, op, smddp__net_everyone(comm, &g), op->root, op->recvbuf,
                                  op->count * smddp__dtype_size(op->dtype), 0);
}

SMDDP_NET_ALGO(net_broadcast_chain, "chain", BROADCAST, broadcast_chain,
               "a pipelined chain from the root");
