/*
 * The hierarchical broadcast: a chain of the root's counterparts, then each
 * node from its member of the chain.
 */
#include <string.h>

#include "hier.h"

static smddp_status_t broadcast(smddp_comm_t comm, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    size_t half = smddp__shm_half_size(comm);
    int root_node = comm->node_of[op->root], root_lr = 0, me = comm->local_rank, h;
    while (smddp__hier_at(comm, root_node, root_lr) != op->root) root_lr++;
    char *buf = op->recvbuf;
    int stream = bytes >= (size_t)smddp__params()->stream_min;
    smddp__hier_t hr;

    SMDDP_CHECK(smddp__hier_init(comm, &hr, root_lr, 0));
    smddp_status_t st = SMDDP_OK;
    uint32_t step = 0;
    for (size_t off = 0; off < bytes && st == SMDDP_OK; off += half) {
        size_t m = SMDDP_MIN(half, bytes - off);
        if ((st = smddp__shm_step_begin(comm, op, &h)) != SMDDP_OK) break;
        if (me == root_lr) {
            st = smddp__chain_broadcast(comm, op, &hr.ring, root_node, buf + off, m, step);
            if (st != SMDDP_OK) break;
            if (comm->local_size > 1) {
                memcpy(smddp__shm_buf(comm, me, h), buf + off, m);
                comm->shm_bytes += m;
            }
        }
        step += (uint32_t)(m / (1u << 20) + 1);
        uint32_t t = smddp__shm_post(comm);
        if (me == root_lr) {
            st = smddp__shm_wait_all(comm, op, t);
        } else {
            st = smddp__shm_wait(comm, op, root_lr, t);
            if (st == SMDDP_OK) smddp__copy(buf + off, smddp__shm_buf(comm, root_lr, h), m, stream);
        }
        if (st == SMDDP_OK) smddp__shm_step_end(comm, h);
    }
    smddp__hier_free(&hr);
    return st;
}

SMDDP_HIER_ALGO(hier_broadcast, "hierarchical", BROADCAST, broadcast,
                "a chain of the root's counterparts, then inside each node");
