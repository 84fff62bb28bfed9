/*
 * Allgather on CUDA memory through CUDA IPC. Events path: each rank stages
 * a chunk of its block, meets the others, and copies every rank's chunk
 * into rank order. Under SMDDP_CUDA_SYNC=kernel, the kernels of
 * cuda/kernel_sync.c.
 */
#if SMDDP_HAVE_CUDA
#include "cuda_algo.h"

smddp_status_t smddp__cuda_gather_steps(smddp__cuda_step_t *s, int root)
{
    smddp__op_t *op = s->op;
    int p = s->comm->local_size, me = s->comm->local_rank;
    size_t es = smddp__dtype_size(op->dtype), block = op->count * es;
    size_t chunk = smddp__cuda_chunk_bytes(s->c->half, es);
    for (size_t off = 0; off < block; off += chunk) {
        size_t n = SMDDP_MIN(chunk, block - off);
        SMDDP_CHECK(smddp__cuda_step_begin(s));
        SMDDP_CHECK(smddp__cuda_copy(s, smddp__cuda_half_of(s, me),
                                     (const char *)op->sendbuf + off, n));
        SMDDP_CHECK(smddp__cuda_step_sync(s, SMDDP_CUDA_EV_READY));
        if (root < 0 || me == root)
            for (int q = 0; q < p; q++)
                SMDDP_CHECK(smddp__cuda_copy(s, (char *)op->recvbuf + (size_t)q * block + off,
                                             smddp__cuda_half_of(s, q), n));
        SMDDP_CHECK(smddp__cuda_step_end(s));
    }
    return SMDDP_OK;
}

static smddp_status_t allgather(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__cuda_step_t s = smddp__cuda_step_of(comm, op);
    if (s.c->ks_on) return smddp__ksync_allgather(comm, &s.c->ks, op);
    return smddp__cuda_gather_steps(&s, -1);
}

SMDDP_CUDA_ALGO(allgather, ALLGATHER, allgather, smddp__cuda_kernel_ways,
                "every peer's staging read through CUDA IPC");
#endif
