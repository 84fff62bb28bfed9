/*
 * Reduction kernels on the GPU, one instantiation per (dtype, op).
 *
 * The arithmetic is reduce/elem.h's, shared with the CPU kernels, combined in
 * the same order (left to right over the sources, fp16/bf16 in fp32 rounded
 * once), and the build passes -fmad=false so that no multiply and add are
 * fused: a GPU result equals the CPU's bit for bit, which the GPU tests check.
 *
 * Each thread moves 16 bytes per source per step (one uint4 load) in a
 * grid-stride loop over a grid that fills the device once; elements past the
 * last whole vector, or every element when a pointer is not 16-byte aligned,
 * go through the same arithmetic one at a time.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "elem.cuh"
#include "kernels.h"

using smddp_cuda::Elem;

namespace {

constexpr int kThreads = 512;

struct Srcs {
    const void *p[SMDDP_CUDA_MAX_SRCS];
};

template <smddp_dtype_t DT, smddp_op_t ACC, smddp_op_t OUT>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(void *dst, Srcs srcs, int nsrc, size_t nvec, size_t count,
                  typename Elem<DT>::A p, typename Elem<DT>::D d)
{
    using E = Elem<DT>;
    using S = typename E::S;
    using A = typename E::A;
    constexpr int V = 16 / sizeof(S);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;

    for (size_t i = tid; i < nvec; i += stride) {
        smddp_cuda::Vec<DT, ACC, OUT> acc;
        uint4 v = reinterpret_cast<const uint4 *>(srcs.p[0])[i];
        if (nsrc == 2) {
            /* The common case: both loads in flight before any arithmetic. */
            uint4 w = reinterpret_cast<const uint4 *>(srcs.p[1])[i];
            acc.first(v, p);
            acc.comb(w, p);
        } else {
            acc.first(v, p);
            for (int s = 1; s < nsrc; s++) acc.comb(reinterpret_cast<const uint4 *>(srcs.p[s])[i], p);
        }
        reinterpret_cast<uint4 *>(dst)[i] = acc.finish(d);
    }

    for (size_t i = nvec * V + tid; i < count; i += stride) {
        A acc = E::pre(E::ld(static_cast<const S *>(srcs.p[0])[i]), ACC, p);
        for (int s = 1; s < nsrc; s++)
            acc = E::comb(acc, E::ld(static_cast<const S *>(srcs.p[s])[i]), ACC, p);
        static_cast<S *>(dst)[i] = E::st(E::fin(acc, OUT, d));
    }
}

template <smddp_dtype_t DT, smddp_op_t ACC, smddp_op_t OUT>
int launch(const smddp__reduce_spec_t *spec, void *dst, const Srcs &srcs, int nsrc,
           size_t count, cudaStream_t stream)
{
    using E = Elem<DT>;
    constexpr size_t V = 16 / sizeof(typename E::S);
    bool aligned = ((uintptr_t)dst & 15) == 0;
    for (int s = 0; s < nsrc; s++) aligned = aligned && ((uintptr_t)srcs.p[s] & 15) == 0;
    size_t nvec = aligned ? count / V : 0;
    size_t work = nvec + (count - nvec * V);
    size_t blocks = (work + kThreads - 1) / kThreads;
    int limit = smddp_cuda::grid_limit(kThreads);
    if (blocks > (size_t)limit) blocks = (size_t)limit;
    if (blocks == 0) return 0;
    reduce_kernel<DT, ACC, OUT><<<(unsigned)blocks, kThreads, 0, stream>>>(
        dst, srcs, nsrc, nvec, count, E::kFloat ? (typename E::A)spec->premul : (typename E::A)0,
        (typename E::D)spec->avg_div);
    return (int)cudaGetLastError();
}

/* The launch for one (dtype, op), through smddp_cuda::dispatch. */
struct ReduceLaunch {
    const smddp__reduce_spec_t *spec;
    void *dst;
    const Srcs &srcs;
    int nsrc;
    size_t count;
    cudaStream_t st;
    template <smddp_dtype_t DT, smddp_op_t ACC, smddp_op_t OUT>
    int run() const
    {
        return launch<DT, ACC, OUT>(spec, dst, srcs, nsrc, count, st);
    }
};

} // namespace

extern "C" int smddp__cuda_reduce(const smddp__reduce_spec_t *spec, void *dst,
                                  const void *const *srcs, int nsrc, size_t count, void *stream)
{
    if (nsrc < 1 || nsrc > SMDDP_CUDA_MAX_SRCS) return (int)cudaErrorInvalidValue;
    if (count == 0) return 0;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    /* One source and no unary part: a copy, bit for bit (NaN payloads too). */
    if (nsrc == 1 && spec->op != SMDDP_PREMUL_SUM &&
        !(spec->op == SMDDP_AVG && spec->avg_div > 0)) {
        if (dst == srcs[0]) return 0;
        return (int)cudaMemcpyAsync(dst, srcs[0], count * smddp__dtype_size(spec->dtype),
                                    cudaMemcpyDefault, st);
    }
    Srcs s = {};
    for (int i = 0; i < nsrc; i++) s.p[i] = srcs[i];
    return smddp_cuda::dispatch(spec, ReduceLaunch{spec, dst, s, nsrc, count, st});
}

/* Polls the host's flag; the sleep keeps the poll from flooding PCIe. */
__global__ void wait_flag_kernel(const volatile uint32_t *flag, uint32_t value)
{
    while (*flag < value) __nanosleep(2000);
}

extern "C" int smddp__cuda_wait_flag(const uint32_t *flag, uint32_t value, void *stream)
{
    /* The launch's own status, not an earlier error of the application's. */
    void *args[] = {(void *)&flag, (void *)&value};
    return (int)cudaLaunchKernel((const void *)wait_flag_kernel, dim3(1), dim3(1), args, 0,
                                 static_cast<cudaStream_t>(stream));
}
