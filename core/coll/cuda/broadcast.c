/* Broadcast on CUDA memory through CUDA IPC: the root stages each chunk, the others read it. */
#if SMDDP_HAVE_CUDA
#include "cuda_algo.h"

static smddp_status_t broadcast(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__cuda_step_t step = smddp__cuda_step_of(comm, op), *s = &step;
    int me = comm->local_rank, root = smddp__cuda_local_root(comm, op);
    size_t es = smddp__dtype_size(op->dtype), bytes = op->count * es;
    size_t chunk = smddp__cuda_chunk_bytes(s->c->half, es);
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t n = SMDDP_MIN(chunk, bytes - off);
        char *at = (char *)op->recvbuf + off;
        SMDDP_CHECK(smddp__cuda_step_begin(s));
        if (me == root) SMDDP_CHECK(smddp__cuda_copy(s, smddp__cuda_half_of(s, me), at, n));
        SMDDP_CHECK(smddp__cuda_step_sync(s, SMDDP_CUDA_EV_READY));
        if (me != root) SMDDP_CHECK(smddp__cuda_copy(s, at, smddp__cuda_half_of(s, root), n));
        SMDDP_CHECK(smddp__cuda_step_end(s));
    }
    return SMDDP_OK;
}

SMDDP_CUDA_ALGO(broadcast, BROADCAST, broadcast, NULL, "the root's staging read through CUDA IPC");
#endif
