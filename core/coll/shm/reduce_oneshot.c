/*
 * One-shot reduce to a root (small messages): every other rank copies its
 * input into its staging half and posts; the root waits for them all and
 * reduces every half and its own input, in rank order, into its output. One
 * synchronisation, where two-shot (reduce_twoshot.c) needs two and splits
 * the reduction. The others wait only for the root's post, which compares
 * what the root runs, and leave; their halves stay untouched until the root
 * has read them (the next use of a half waits for every reader).
 */
#include <string.h>

#include "shm_algo.h"

static smddp_status_t reduce_oneshot(smddp_comm_t comm, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    int p = comm->local_size, me = comm->local_rank, root = smddp__local_index(comm, op->root), h;
    SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
    if (me != root) memcpy(smddp__shm_buf(comm, me, h), op->sendbuf, bytes);
    uint32_t t = smddp__shm_post(comm);
    if (me != root) {
        SMDDP_CHECK(smddp__shm_wait(comm, op, root, t));
        smddp__shm_step_end(comm, h);
        return SMDDP_OK;
    }
    SMDDP_CHECK(smddp__shm_wait_all(comm, op, t));
    const void *srcs[MAX_LOCAL];
    for (int q = 0; q < p; q++) srcs[q] = q == me ? op->sendbuf : smddp__shm_buf(comm, q, h);
    smddp__reduce_spec_t spec = op->spec;
    spec.avg_div = comm->size;
    smddp__reduce(&spec, op->recvbuf, srcs, p, op->count);
    smddp__shm_step_end(comm, h);
    return SMDDP_OK;
}

SMDDP_SHM_ALGO(reduce_oneshot, "one-shot", REDUCE, smddp__within_half, reduce_oneshot, NULL,
               "the others stage their inputs once; the root reduces all of them");
