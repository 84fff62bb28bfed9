/*
 * The CUDA side of the core (kernels.cu, compiled by nvcc), behind a C
 * interface: reduction kernels for every dtype and op, launched on a stream.
 * Only built when meson finds nvcc; core/cuda/ipc.c is the only caller.
 */
#ifndef SMDDP_CORE_CUDA_KERNELS_H
#define SMDDP_CORE_CUDA_KERNELS_H

#include "../reduce/reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most sources one kernel launch combines (local ranks on a node). */
#define SMDDP_CUDA_MAX_SRCS 16

/*
 * dst[i] = srcs[0][i] op ... op srcs[nsrc-1][i] on the GPU, enqueued on
 * stream (a cudaStream_t): the same results, bit for bit, as smddp__reduce
 * on the CPU (same order, same rounding; see reduce/elem.h). Pointers are
 * device pointers (or peers' memory mapped through CUDA IPC) and may have
 * any alignment; dst may equal any source. 1 <= nsrc <= SMDDP_CUDA_MAX_SRCS.
 * Returns a cudaError_t (0 on success).
 */
int smddp__cuda_reduce(const smddp__reduce_spec_t *spec, void *dst, const void *const *srcs,
                       int nsrc, size_t count, void *stream);

/*
 * Enqueues on stream a one-thread kernel that returns once *flag >= value.
 * flag is the device's view of mapped pinned host memory (written by the
 * host). Returns a cudaError_t (0 on success).
 */
int smddp__cuda_wait_flag(const uint32_t *flag, uint32_t value, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* SMDDP_CORE_CUDA_KERNELS_H */
