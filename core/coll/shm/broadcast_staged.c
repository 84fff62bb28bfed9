/*
 * Broadcast inside a node in rounds of one staging half: the root copies a
 * round into its half and posts, the others copy it out of the root's half
 * (transport/shm.h has the counter protocol).
 */
#include <string.h>

#include "shm_algo.h"

static smddp_status_t broadcast_staged(smddp_comm_t comm, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    size_t half = smddp__shm_half_size(comm);
    int root = smddp__local_index(comm, op->root), me = comm->local_rank, h;
    char *buf = op->recvbuf;
    int stream = bytes >= (size_t)smddp__params()->stream_min;
    for (size_t off = 0; off < bytes; off += half) {
        size_t n = SMDDP_MIN(half, bytes - off);
        SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
        if (me == root) memcpy(smddp__shm_buf(comm, me, h), buf + off, n);
        uint32_t t = smddp__shm_post(comm);
        /* The root waits too: each wait compares what the peers are running. */
        if (me == root) SMDDP_CHECK(smddp__shm_wait_all(comm, op, t));
        if (me != root) {
            SMDDP_CHECK(smddp__shm_wait(comm, op, root, t));
            smddp__copy(buf + off, smddp__shm_buf(comm, root, h), n, stream);
        }
        smddp__shm_step_end(comm, h);
    }
    return SMDDP_OK;
}

SMDDP_SHM_ALGO(broadcast_staged, "staged", BROADCAST, NULL, broadcast_staged, NULL,
               "the root stages rounds of one half, the others copy them out");
