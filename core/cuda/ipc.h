/*
 * CUDA IPC among the ranks of one node (ipc.c), in a build with CUDA: the
 * transport's state (each rank's device staging buffer of two halves and
 * its interprocess events, mapped by every local peer), its setup at the
 * first CUDA collective, and the steps its algorithms (core/coll/cuda/, one
 * per file) are made of. The selection (select.c) decides which ops come
 * here; the rest of the core reaches them through cuda.h's table.
 */
#ifndef SMDDP_CORE_CUDA_IPC_H
#define SMDDP_CORE_CUDA_IPC_H

#include "../algo.h"
#include "../transport/transport.h"

#if SMDDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernel_sync.h"

/*
 * Runs algo for op with the buffers' device current, leaving the calling
 * thread's device as it found it. With ipc, sets up the communicator's IPC
 * state first (the first CUDA collective) and requires one device per
 * communicator; without, algo is another path's (NCCL).
 */
smddp_status_t smddp__cuda_execute(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn algo,
                                   bool ipc);

/* Whether a CUDA device is usable here (fn names the caller in the message). */
smddp_status_t smddp__cuda_usable(const char *fn);

/*
 * SMDDP_CUDA_SYNC=kernel: an error once a collective kernel of comm gave up
 * (comm is then aborted with it), which a stream synchronisation alone does
 * not report; SMDDP_OK otherwise.
 */
smddp_status_t smddp__cuda_status(smddp_comm_t comm);

/*
 * The IPC state (comm->cuda): set up by the first CUDA collective, freed at
 * destroy; abort stops this rank's kernels that wait for peers.
 */
extern const smddp__transport_t smddp__cuda_ipc_transport;

/* A rank's interprocess events, by kind and half. */
enum { SMDDP_CUDA_EV_READY, SMDDP_CUDA_EV_REDUCED, SMDDP_CUDA_EV_DONE, SMDDP_CUDA_EV_COUNT };

typedef struct smddp__cuda_peer {
    char *buf;                                  /* its staging buffer (own: the allocation) */
    cudaEvent_t ev[SMDDP_CUDA_EV_COUNT][2];     /* by kind and half */
} smddp__cuda_peer_t;

struct smddp__cuda {
    int device;
    size_t half;
    smddp__cuda_peer_t *peers; /* local_size entries, this rank's at local_rank */
    uint64_t steps;            /* steps taken; a half is reused every second step */
    /* SMDDP_CUDA_SYNC=kernel: each rank's region follows its two halves. */
    bool ks_on;
    smddp__ksync_t ks;
};

/*
 * One step of an algorithm: a chunk staged in this step's half of every
 * local rank's buffer, all on op's stream (ipc.c describes the sequence).
 */
typedef struct smddp__cuda_step {
    smddp_comm_t comm;
    smddp__op_t *op;
    struct smddp__cuda *c;
    cudaStream_t stream;
    int half; /* 0 or 1 */
} smddp__cuda_step_t;

/* The step state of op, whose device is current and whose IPC state is set up. */
static inline smddp__cuda_step_t smddp__cuda_step_of(smddp_comm_t comm, smddp__op_t *op)
{
    return (smddp__cuda_step_t){comm, op, comm->cuda, (cudaStream_t)op->stream, 0};
}

/* Peer q's half for this step (this rank's own for q == local_rank). */
static inline char *smddp__cuda_half_of(const smddp__cuda_step_t *s, int q)
{
    return s->c->peers[q].buf + (size_t)s->half * s->c->half;
}

/* Bytes per chunk: a multiple of the element size (and of 256 when larger). */
static inline size_t smddp__cuda_chunk_bytes(size_t room, size_t es)
{
    return room >= 256 ? room / 256 * 256 : room / es * es;
}

/* Takes the next half, once every rank's last use of it is done. */
smddp_status_t smddp__cuda_step_begin(smddp__cuda_step_t *s);
/* Records this rank's event of kind k, meets every peer, then waits for theirs. */
smddp_status_t smddp__cuda_step_sync(smddp__cuda_step_t *s, int k);
/* Records this rank's done on the half. */
smddp_status_t smddp__cuda_step_end(smddp__cuda_step_t *s);
/* n bytes on the stream (nothing when n is 0 or dst is src). */
smddp_status_t smddp__cuda_copy(smddp__cuda_step_t *s, void *dst, const void *src, size_t n);
/* rows blocks of n bytes, src_pitch apart, into dst dst_pitch apart. */
smddp_status_t smddp__cuda_copy_rows(smddp__cuda_step_t *s, void *dst, size_t dst_pitch,
                                     const void *src, size_t src_pitch, size_t n, int rows);
/* dst = reduction over every local rank's half at byte offset off, n bytes. */
smddp_status_t smddp__cuda_reduce_halves(smddp__cuda_step_t *s, void *dst, size_t off, size_t n);
/* Piece q of n bytes split in p, in whole 256-byte units (the last takes the rest). */
void smddp__cuda_piece(size_t n, size_t es, int p, int q, size_t *off, size_t *len);
#endif /* SMDDP_HAVE_CUDA */

#endif /* SMDDP_CORE_CUDA_IPC_H */
