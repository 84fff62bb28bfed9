/*
 * The collective kernels that read peers' scratch through CUDA IPC and
 * synchronise on the device (ipc_kernels.cu; the protocol is ksync.h's).
 * Only built when meson finds nvcc; core/cuda/ipc.c is the caller.
 */
#ifndef SMDDP_CORE_CUDA_IPC_KERNELS_H
#define SMDDP_CORE_CUDA_IPC_KERNELS_H

#include "../reduce/reduce.h"
#include "ksync.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Enqueues job on stream (a cudaStream_t); the reductions (spec; ignored by
 * an allgather) give the CPU kernels' bits. Every local rank must launch the
 * same jobs in the same order. Returns a cudaError_t (0 on success); a
 * kernel that gives up waiting says so in c->control, not here.
 */
int smddp__ks_launch(const smddp__ks_comm_t *c, const smddp__ks_job_t *job,
                     const smddp__reduce_spec_t *spec, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* SMDDP_CORE_CUDA_IPC_KERNELS_H */
