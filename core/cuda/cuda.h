/*
 * CUDA device memory as the rest of the core sees it: one table of calls
 * (smddp__cuda_calls_t), which a build without CUDA does not have, and the
 * transports behind it (CUDA IPC among a node's ranks, pinned host staging
 * across nodes; NCCL is nccl.h's). exec.c routes ops on device memory
 * through the table, the queue and the ABI complete staged ops through it;
 * none of them needs a stub when CUDA is absent, since an op on device
 * memory is refused at issue then (smddp__route_check_cuda).
 */
#ifndef SMDDP_CORE_CUDA_CUDA_H
#define SMDDP_CORE_CUDA_CUDA_H

#include "../comm.h"

typedef struct smddp__cuda_calls {
    /* Whether a CUDA device is usable here (fn names the caller in the message). */
    smddp_status_t (*usable)(const char *fn);
    /*
     * Runs algo for op with the buffers' device current; with ipc, sets up
     * the CUDA IPC state first (ipc.h: smddp__cuda_execute).
     */
    smddp_status_t (*execute)(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn algo,
                              bool ipc);
    /* An error once a collective kernel of comm gave up (ipc.h: smddp__cuda_status). */
    smddp_status_t (*status)(smddp_comm_t comm);
    /* Ops staged through pinned host memory (stage.h: smddp__cuda_stage_*). */
    smddp_status_t (*stage_prepare)(smddp_comm_t comm, smddp__op_t *op);
    smddp_status_t (*stage_run)(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn host);
    smddp_status_t (*stage_finish)(smddp__op_t *op, smddp_status_t st);
    int (*stage_enqueued)(const smddp__op_t *op);
    smddp_status_t (*stage_ready)(smddp__op_t *op);
} smddp__cuda_calls_t;

/* This build's CUDA calls; NULL without CUDA. */
const smddp__cuda_calls_t *smddp__cuda_calls(void);

#endif /* SMDDP_CORE_CUDA_CUDA_H */
