/*
 * All-to-all on CUDA memory through CUDA IPC: each chunk stages the same
 * slice of every block of every rank's input, side by side, and each rank
 * reads its block from every peer. The same rounds serve reduce-scatter and
 * scatter (smddp__cuda_blockwise).
 */
#if SMDDP_HAVE_CUDA
#include "cuda_algo.h"

smddp_status_t smddp__cuda_blockwise(smddp__cuda_step_t *s, int src_root, bool reduce)
{
    smddp__op_t *op = s->op;
    int p = s->comm->local_size, me = s->comm->local_rank;
    size_t es = smddp__dtype_size(op->dtype), block = op->count * es;
    size_t chunk = smddp__cuda_chunk_bytes(s->c->half / (size_t)p, es);
    for (size_t off = 0; off < block; off += chunk) {
        size_t n = SMDDP_MIN(chunk, block - off);
        SMDDP_CHECK(smddp__cuda_step_begin(s));
        if (src_root < 0 || me == src_root)
            SMDDP_CHECK(smddp__cuda_copy_rows(s, smddp__cuda_half_of(s, me), n,
                                              (const char *)op->sendbuf + off, block, n, p));
        SMDDP_CHECK(smddp__cuda_step_sync(s, SMDDP_CUDA_EV_READY));
        char *out = (char *)op->recvbuf;
        size_t mine = (size_t)me * n; /* where block me's slice lies in a half */
        if (reduce)
            SMDDP_CHECK(smddp__cuda_reduce_halves(s, out + off, mine, n));
        else if (src_root >= 0)
            SMDDP_CHECK(smddp__cuda_copy(s, out + off, smddp__cuda_half_of(s, src_root) + mine, n));
        else /* alltoall: block me of every rank's input, into rank order */
            for (int q = 0; q < p; q++)
                SMDDP_CHECK(smddp__cuda_copy(s, out + (size_t)q * block + off,
                                             smddp__cuda_half_of(s, q) + mine, n));
        SMDDP_CHECK(smddp__cuda_step_end(s));
    }
    return SMDDP_OK;
}

static smddp_status_t alltoall(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__cuda_step_t s = smddp__cuda_step_of(comm, op);
    return smddp__cuda_blockwise(&s, -1, false);
}

SMDDP_CUDA_ALGO(alltoall, ALLTOALL, alltoall, NULL,
                "each rank reads its piece from every peer's staging");
#endif
