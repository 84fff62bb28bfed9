/* The flat barrier across nodes: a one-byte ring allreduce (allreduce_ring.c). */
#include "net_algo.h"

static smddp_status_t barrier_ring(smddp_comm_t comm, smddp__op_t *op)
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
    return smddp__net_allreduce(comm, &b);
}

SMDDP_NET_ALGO(net_barrier_ring, "ring", BARRIER, barrier_ring, "a one-byte ring allreduce");
