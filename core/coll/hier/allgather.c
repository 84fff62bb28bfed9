/*
 * The hierarchical allgather: counterparts swap their blocks over the
 * network, then the node shares them.
 */
#include <string.h>

#include "hier.h"

static smddp_status_t allgather(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp__dtype_size(op->dtype), n = op->count, bytes = n * es;
    int L = comm->local_size, N = comm->node_count, me = comm->local_rank, h;
    char *recv = op->recvbuf;
    smddp__hier_t hr;

    SMDDP_CHECK(smddp__hier_init(comm, &hr, me, 0));
    memmove(recv + (size_t)comm->rank * bytes, op->sendbuf, bytes);
    for (int j = 0; j < N; j++) {
        hr.off[j] = (size_t)hr.ranks[j] * n;
        hr.len[j] = n;
    }
    smddp_status_t st = smddp__ring_allgather(comm, op, &hr.ring, recv, hr.off, hr.len, es, 0);
    /* Inside the node: each rank stages its N blocks, in rounds of N slots. */
    size_t slot = smddp__shm_half_size(comm) / (size_t)N;
    int stream = bytes * (size_t)comm->size >= (size_t)smddp__params()->stream_min;
    for (size_t o = 0; o < bytes && st == SMDDP_OK && L > 1; o += slot) {
        size_t m = SMDDP_MIN(slot, bytes - o);
        if ((st = smddp__shm_step_begin(comm, op, &h)) != SMDDP_OK) break;
        char *mine = smddp__shm_buf(comm, me, h);
        for (int j = 0; j < N; j++)
            memcpy(mine + (size_t)j * slot,
                   recv + (size_t)smddp__hier_at(comm, j, me) * bytes + o, m);
        comm->shm_bytes += (size_t)N * m;
        uint32_t t = smddp__shm_post(comm);
        if ((st = smddp__shm_wait_all(comm, op, t)) != SMDDP_OK) break;
        for (int q = 0; q < L; q++) {
            if (q == me) continue;
            const char *theirs = smddp__shm_buf(comm, q, h);
            for (int j = 0; j < N; j++)
                smddp__copy(recv + (size_t)smddp__hier_at(comm, j, q) * bytes + o,
                            theirs + (size_t)j * slot, m, stream);
        }
        smddp__shm_step_end(comm, h);
    }
    smddp__hier_free(&hr);
    return st;
}

SMDDP_HIER_ALGO(hier_allgather, "hierarchical", ALLGATHER, allgather,
                "blocks exchanged with the counterparts, then shared in the node");
