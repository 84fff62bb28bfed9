/*
 * What ipc.c and kernel_sync.c share about the CUDA runtime: a CUDA
 * error as an smddp error (the call that failed, the error's name and
 * text), and the thread's graph-capture mode relaxed around calls a
 * capture in global mode forbids. Only built with CUDA.
 */
#ifndef SMDDP_CORE_CUDA_CUDA_ERROR_H
#define SMDDP_CORE_CUDA_CUDA_ERROR_H

#include <cuda_runtime_api.h>

#include "../comm.h"

static inline smddp_status_t smddp__cuda_error(smddp_comm_t comm, const char *what, cudaError_t err)
{
    return smddp__error(SMDDP_ERR_SYSTEM, "rank %d: %s failed: %s (%s)", comm->rank, what,
                        cudaGetErrorName(err), cudaGetErrorString(err));
}

/* Returns the error from the function when call fails. */
#define CUDA_TRY(comm, call)                                                  \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess) return smddp__cuda_error((comm), #call, e_);   \
    } while (0)

/*
 * Allocating, freeing, IPC handles: a CUDA graph capture in global mode
 * forbids them on every thread, so they run in relaxed mode; returns the
 * mode to restore.
 */
static inline enum cudaStreamCaptureMode smddp__cuda_relax_capture(void)
{
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    return mode;
}

static inline void smddp__cuda_restore_capture(enum cudaStreamCaptureMode mode)
{
    cudaThreadExchangeStreamCaptureMode(&mode);
}

#endif /* SMDDP_CORE_CUDA_CUDA_ERROR_H */
