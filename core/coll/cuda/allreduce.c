/*
 * Allreduce on CUDA memory through CUDA IPC. Events path: each chunk is
 * copied into this rank's half, every rank meets the others, then one-shot
 * (each rank reduces every half into its output) up to
 * SMDDP_CUDA_ONESHOT_MAX, else two-shot (each rank reduces its piece of
 * every half in place, meets the others again, and gathers the pieces).
 * Under SMDDP_CUDA_SYNC=kernel, the kernels of cuda/kernel_sync.c.
 */
#if SMDDP_HAVE_CUDA
#include "cuda_algo.h"

const char *const smddp__cuda_kernel_ways[] = {
    "kernel one-shot", "kernel two-shot", "kernel", "kernel one-shot, input in place",
    "kernel two-shot, input in place", "kernel, input in place", NULL};

smddp_status_t smddp__cuda_allreduce_steps(smddp__cuda_step_t *s, int root)
{
    smddp__op_t *op = s->op;
    int p = s->comm->local_size, me = s->comm->local_rank;
    size_t es = smddp__dtype_size(op->dtype), bytes = op->count * es;
    size_t chunk = smddp__cuda_chunk_bytes(s->c->half, es);
    bool oneshot = bytes <= (size_t)smddp__params()->cuda_oneshot_max || p == 1 || root >= 0;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t n = SMDDP_MIN(chunk, bytes - off);
        /* NULL off the root of a reduce */
        char *out = op->recvbuf ? (char *)op->recvbuf + off : NULL;
        SMDDP_CHECK(smddp__cuda_step_begin(s));
        char *mine = smddp__cuda_half_of(s, me);
        SMDDP_CHECK(smddp__cuda_copy(s, mine, (const char *)op->sendbuf + off, n));
        SMDDP_CHECK(smddp__cuda_step_sync(s, SMDDP_CUDA_EV_READY));
        if (oneshot) {
            if (root < 0 || me == root) SMDDP_CHECK(smddp__cuda_reduce_halves(s, out, 0, n));
        } else {
            size_t po, pl;
            smddp__cuda_piece(n, es, p, me, &po, &pl);
            SMDDP_CHECK(smddp__cuda_reduce_halves(s, mine + po, po, pl));
            SMDDP_CHECK(smddp__cuda_step_sync(s, SMDDP_CUDA_EV_REDUCED));
            for (int q = 0; q < p; q++) {
                smddp__cuda_piece(n, es, p, q, &po, &pl);
                SMDDP_CHECK(smddp__cuda_copy(s, out + po, smddp__cuda_half_of(s, q) + po, pl));
            }
        }
        SMDDP_CHECK(smddp__cuda_step_end(s));
    }
    return SMDDP_OK;
}

static smddp_status_t allreduce(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__cuda_step_t s = smddp__cuda_step_of(comm, op);
    if (s.c->ks_on) return smddp__ksync_allreduce(comm, &s.c->ks, op);
    return smddp__cuda_allreduce_steps(&s, -1);
}

SMDDP_CUDA_ALGO(allreduce, ALLREDUCE, allreduce, smddp__cuda_kernel_ways,
                "peers' staging read through CUDA IPC, met through events or flags in device "
                "memory");
#endif
