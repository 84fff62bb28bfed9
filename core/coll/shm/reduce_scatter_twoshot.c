/*
 * Reduce-scatter inside a node: the first half of two-shot
 * (allreduce_twoshot.c), in rounds of one staging half, with each rank's
 * block reduced straight into its output. When every input lies in a pool,
 * each rank reduces its block straight from the inputs where they lie ("in
 * pools"), and returns once every peer is done reading its own.
 */
#include <string.h>

#include "shm_algo.h"

static smddp_status_t reduce_scatter(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp__dtype_size(op->dtype);
    int p = comm->local_size, me = comm->local_rank, h = 0;
    size_t n = op->count; /* per rank */
    size_t round_elems = smddp__shm_half_size(comm) / es / (size_t)p;
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    const void *srcs[MAX_LOCAL];
    smddp__reduce_spec_t spec = op->spec;
    spec.avg_div = comm->size;

    if (round_elems == 0) round_elems = 1;
    /* As in two-shot: no non-temporal stores over the input's own lines. */
    int stream = n * es >= (size_t)smddp__params()->stream_min / (size_t)p &&
                 smddp__disjoint(send, n * (size_t)p * es, recv, n * es);
    smddp__pooled_t pl = {0};
    uint64_t in_ref = 0;
    if (smddp__pool_on(comm)) {
        const char *own = send + (size_t)me * n * es;
        if (recv == own || smddp__disjoint(send, n * (size_t)p * es, recv, n * es))
            in_ref = smddp__pool_ref(comm, send, n * (size_t)p * es);
        smddp__pool_publish(comm, op, in_ref, 0);
    }
    for (size_t base = 0; base < n; base += round_elems) {
        size_t m = SMDDP_MIN(round_elems, n - base);
        SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
        char *mine = smddp__shm_buf(comm, me, h);
        for (int q = 0; q < p && !in_ref; q++)
            if (q != me)
                memcpy(mine + (size_t)q * m * es, send + ((size_t)q * n + base) * es, m * es);
        uint32_t t = smddp__shm_post(comm);
        SMDDP_CHECK(smddp__shm_wait_all(comm, op, t));
        if (base == 0 && smddp__pool_on(comm)) {
            smddp__pool_peers(comm, op, t, &pl);
            if (pl.all_in) {
                for (int q = 0; q < p; q++) srcs[q] = pl.in[q] + (size_t)me * n * es;
                op->algo = "in pools";
                smddp__reduce(&spec, recv, srcs, p, n);
                smddp__shm_step_end(comm, h);
                return smddp__shm_step_wait(comm, op, h);
            }
        }
        /* My block's place in every input, and in every staging half. */
        size_t at = ((size_t)me * n + base) * es, staged = (size_t)me * m * es;
        for (int q = 0; q < p; q++)
            srcs[q] = q == me             ? send + at
                      : pl.in && pl.in[q] ? pl.in[q] + at
                                          : (const char *)smddp__shm_buf(comm, q, h) + staged;
        if (stream) {
            /* My own slot in my half is free: reduce there, then stream out. */
            char *tmp = mine + (size_t)me * m * es;
            smddp__reduce(&spec, tmp, srcs, p, m);
            smddp__copy(recv + base * es, tmp, m * es, 1);
        } else {
            smddp__reduce(&spec, recv + base * es, srcs, p, m);
        }
        smddp__shm_step_end(comm, h);
    }
    /* Peers read my input in place: it is mine again once they all ended their last step. */
    return in_ref ? smddp__shm_step_wait(comm, op, h) : SMDDP_OK;
}

static const char *const in_pools[] = {"in pools", NULL};

SMDDP_SHM_ALGO(reduce_scatter_twoshot, "two-shot", REDUCE_SCATTER, NULL, reduce_scatter, in_pools,
               "two-shot's first half, written straight into the output");
