/*
 * A CUDA runtime error as an smddp error (coll_cuda.c, kernel_sync.c): the
 * call that failed, the error's name and text. Only built with CUDA.
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

#endif /* SMDDP_CORE_CUDA_CUDA_ERROR_H */
