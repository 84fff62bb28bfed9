/*
 * One-shot allreduce (small messages): every rank copies its input into its
 * staging half, then every rank reduces all P copies itself, in rank order.
 * One copy in, P reads, two synchronisations.
 *
 * A rank whose input lies in its pool (transport/shm_pool.c) does not copy
 * it in: peers reduce from it where it lies, and the rank returns only
 * after every peer is done with it. In place, one-shot cannot read pooled
 * inputs where they lie (each rank overwrites its own while peers read it)
 * and stages them; two-shot in pools need not. So a one-shot-sized
 * allreduce publishes its in-place pooled buffer, every rank learns alike
 * whether all were (the verdict, kept per size in the agreement cache,
 * comm->verdicts), and the selection (select.c) sends the next allreduce of
 * that size two-shot: in the pools, or staged if a buffer is no longer
 * pooled, which clears the verdict.
 */
#include <string.h>

#include "shm_algo.h"

static smddp_status_t allreduce_oneshot(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp__dtype_size(op->dtype);
    size_t bytes = op->count * es;
    int p = comm->local_size, me = comm->local_rank, h;
    const void *srcs[MAX_LOCAL];
    smddp__reduce_spec_t spec = op->spec;
    spec.avg_div = comm->size;

    smddp__pooled_t pl = {0};
    uint64_t in_ref = 0, in_place_ref = 0;
    if (smddp__pool_on(comm)) {
        /*
         * In place, each rank would overwrite its input while peers still
         * read it: staged, and only the output is published, so that every
         * rank learns whether all buffers were in place in pools.
         */
        if (smddp__disjoint(op->sendbuf, bytes, op->recvbuf, bytes))
            in_ref = smddp__pool_ref(comm, op->sendbuf, bytes);
        else if (op->sendbuf == op->recvbuf)
            in_place_ref = smddp__pool_ref(comm, op->recvbuf, bytes);
        smddp__pool_publish(comm, op, in_ref, in_place_ref);
    }
    SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
    if (!in_ref) memcpy(smddp__shm_buf(comm, me, h), op->sendbuf, bytes);
    uint32_t t = smddp__shm_post(comm);
    SMDDP_CHECK(smddp__shm_wait_all(comm, op, t));
    if (smddp__pool_on(comm)) {
        smddp__pool_peers(comm, op, t, &pl);
        if (pl.all_in) op->algo = "one-shot in pools";
        /* Inputs pooled out of place change the path only where low-latency would run. */
        smddp__verdict_set_pooled(&comm->verdicts, bytes,
                                  pl.all_out ? SMDDP_POOLED_IN_PLACE
                                  : pl.all_in && bytes <= smddp__shm_ll_max(comm)
                                      ? SMDDP_POOLED_INPUTS
                                      : SMDDP_POOLED_NONE);
    }
    for (int q = 0; q < p; q++)
        srcs[q] = q == me ? op->sendbuf : pl.in && pl.in[q] ? pl.in[q] : smddp__shm_buf(comm, q, h);
    smddp__reduce(&spec, op->recvbuf, srcs, p, op->count);
    smddp__shm_step_end(comm, h);
    /*
     * Peers read my input in place: it is mine again once they all ended
     * this step. Peers read my record for the verdict: a rank that left at
     * once could publish its next op's record over it before a slow peer
     * read it, and the two would then disagree on the verdict.
     */
    return in_ref || in_place_ref ? smddp__shm_step_wait(comm, op, h) : SMDDP_OK;
}

static const char *const oneshot_in_pools[] = {"one-shot in pools", NULL};

SMDDP_SHM_ALGO(allreduce_oneshot, "one-shot", ALLREDUCE, smddp__within_half, allreduce_oneshot,
               oneshot_in_pools, "each rank stages its input once and reduces all of them");
