/*
 * A broadcast through the low-latency slots: the root's slot carries the
 * data, the others' only their tag. Every rank waits for every other, as
 * the slots require (a root that went on at once could rewrite its slot
 * while a peer still read it).
 */
#include <string.h>

#include "shm_algo.h"

static smddp_status_t broadcast_ll(smddp_comm_t comm, smddp__op_t *op)
{
    const void *in[SMDDP_MAX_LOCAL];
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    int root = smddp__local_index(comm, op->root);
    bool me = comm->local_rank == root;
    SMDDP_CHECK(smddp__shm_ll_exchange(comm, op, me ? op->recvbuf : NULL, bytes, NULL, in));
    if (!me) memcpy(op->recvbuf, in[root], bytes);
    return SMDDP_OK;
}

SMDDP_SHM_ALGO(broadcast_ll, "low-latency", BROADCAST, smddp__ll_fits, broadcast_ll, NULL,
               "the root's slot carries the data; every rank waits for every other");
