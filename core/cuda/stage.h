/*
 * CUDA collectives across nodes staged through pinned host memory (stage.c):
 * the stream's copies and waits are enqueued when the op is issued, the host
 * collective runs in the op's turn, and chunks are handed back to the stream
 * as they finish. In a build with CUDA; the rest of the core reaches these
 * through cuda.h's table.
 */
#ifndef SMDDP_CORE_CUDA_STAGE_H
#define SMDDP_CORE_CUDA_STAGE_H

#include "../comm.h"
#include "../transport/transport.h"

#if SMDDP_HAVE_CUDA
/*
 * At issue, on the caller's thread, before smddp__submit, for an op the
 * router sends through host staging (smddp__route_prepare): enqueues its
 * copies and waits on op->stream and sets op->stage and op->seq_span (the
 * sequence numbers its chunks take).
 */
smddp_status_t smddp__cuda_stage_prepare(smddp_comm_t comm, smddp__op_t *op);

/*
 * In the op's turn: the host collective (host, the router's host path),
 * chunk by chunk, releasing each to the stream.
 */
smddp_status_t smddp__cuda_stage_run(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn host);

/*
 * When the op completes with st, or is dropped: enqueues a receive's copy to
 * the device (if st is OK), releases every chunk to the stream and pools the
 * buffer. Returns st, or the error of that copy.
 */
smddp_status_t smddp__cuda_stage_finish(smddp__op_t *op, smddp_status_t st);

/* 1 when all of a staged op's stream work was enqueued when it was issued (not a receive). */
int smddp__cuda_stage_enqueued(const smddp__op_t *op);

/*
 * For a send: SMDDP_OK once its copy to the host is done (at once for other
 * ops), SMDDP_IN_PROGRESS before that, an error when the copy failed or the
 * op's deadline passed.
 */
smddp_status_t smddp__cuda_stage_ready(smddp__op_t *op);

/* The pool of idle pinned buffers (comm->stages): set up at creation, freed at destroy. */
extern const smddp__transport_t smddp__cuda_stage_transport;
#endif /* SMDDP_HAVE_CUDA */

#endif /* SMDDP_CORE_CUDA_STAGE_H */
