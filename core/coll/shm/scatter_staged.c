/*
 * Scatter inside a node: in rounds, the root stages every rank's piece in
 * its half and each rank copies its own out.
 */
#include <string.h>

#include "shm_algo.h"

static smddp_status_t scatter_staged(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp__dtype_size(op->dtype);
    size_t bytes = op->count * es; /* per rank */
    int p = comm->local_size, me = comm->local_rank, h;
    int root = smddp__local_index(comm, op->root);
    size_t piece = smddp__shm_half_size(comm) / (size_t)p;
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    for (size_t off = 0; off < bytes; off += piece) {
        size_t n = SMDDP_MIN(piece, bytes - off);
        SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
        char *mine = smddp__shm_buf(comm, me, h);
        if (me == root) {
            for (int q = 0; q < p; q++) {
                const char *src = send + (size_t)comm->local_ranks[q] * bytes + off;
                if (q == me) {
                    if (recv + off != src) memcpy(recv + off, src, n);
                } else {
                    memcpy(mine + (size_t)q * piece, src, n);
                }
            }
        }
        uint32_t t = smddp__shm_post(comm);
        if (me == root) SMDDP_CHECK(smddp__shm_wait_all(comm, op, t));
        if (me != root) {
            SMDDP_CHECK(smddp__shm_wait(comm, op, root, t));
            memcpy(recv + off, (char *)smddp__shm_buf(comm, root, h) + (size_t)me * piece, n);
        }
        smddp__shm_step_end(comm, h);
    }
    return SMDDP_OK;
}

SMDDP_SHM_ALGO(scatter_staged, "staged", SCATTER, NULL, scatter_staged, NULL,
               "the root stages every rank's piece, each copies its own");
