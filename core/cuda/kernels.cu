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

#include "../dtype.h"
#include "../reduce/elem.h"
#include "kernels.h"

namespace {

constexpr int kThreads = 512;

/* Loads, stores and ops by storage type: S stored, A accumulated, D divisor. */
template <smddp_dtype_t DT>
struct Elem;

/*
 * ELEM(dtype, stored, ops suffix, accumulated, divisor, float?, load, store):
 * load converts s (stored) to A, store converts a (accumulated) back.
 */
#define ELEM(DT, ST, SUF, A_, D_, FLOAT, LD, STORE)                               \
    template <>                                                                   \
    struct Elem<DT> {                                                             \
        using S = ST;                                                             \
        using A = A_;                                                             \
        using D = D_;                                                             \
        static constexpr bool kFloat = FLOAT;                                     \
        __device__ static A ld(S s) { return LD; }                                \
        __device__ static S st(A a) { return STORE; }                             \
        __device__ static A pre(A x, smddp_op_t op, A p) { return smddp__pre_##SUF(x, op, p); } \
        __device__ static A comb(A a, A y, smddp_op_t op, A p) { return smddp__comb_##SUF(a, y, op, p); } \
        __device__ static A fin(A v, smddp_op_t op, D d) { return smddp__fin_##SUF(v, op, d); } \
    };

ELEM(SMDDP_INT8, int8_t, i8, int8_t, int, false, s, a)
ELEM(SMDDP_UINT8, uint8_t, u8, uint8_t, int, false, s, a)
ELEM(SMDDP_INT32, int32_t, i32, int32_t, int32_t, false, s, a)
ELEM(SMDDP_INT64, int64_t, i64, int64_t, int64_t, false, s, a)
ELEM(SMDDP_INT16, int16_t, i16, int16_t, int, false, s, a)
ELEM(SMDDP_UINT16, uint16_t, u16, uint16_t, int, false, s, a)
ELEM(SMDDP_UINT32, uint32_t, u32, uint32_t, uint32_t, false, s, a)
ELEM(SMDDP_UINT64, uint64_t, u64, uint64_t, uint64_t, false, s, a)
ELEM(SMDDP_FLOAT32, float, f32, float, float, true, s, smddp__canon_f32(a))
ELEM(SMDDP_FLOAT64, double, f64, double, double, true, s, smddp__canon_f64(a))
ELEM(SMDDP_BFLOAT16, uint16_t, f32, float, float, true, smddp__bf16_to_fp32(s), smddp__store_bf16(a))
/* The hardware conversions round as the CPU's do (nearest even, subnormals
 * kept); NaN is made canonical before narrowing. */
ELEM(SMDDP_FLOAT16, uint16_t, f32, float, float, true, __half2float(__ushort_as_half(s)),
           a != a ? (uint16_t)0x7e00 : __half_as_ushort(__float2half_rn(a)))

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
        A acc[V];
        uint4 v = reinterpret_cast<const uint4 *>(srcs.p[0])[i];
        if (nsrc == 2) {
            /* The common case: both loads in flight before any arithmetic. */
            uint4 w = reinterpret_cast<const uint4 *>(srcs.p[1])[i];
            const S *x = reinterpret_cast<const S *>(&v);
            const S *y = reinterpret_cast<const S *>(&w);
#pragma unroll
            for (int k = 0; k < V; k++) acc[k] = E::comb(E::pre(E::ld(x[k]), ACC, p), E::ld(y[k]), ACC, p);
        } else {
            const S *x = reinterpret_cast<const S *>(&v);
#pragma unroll
            for (int k = 0; k < V; k++) acc[k] = E::pre(E::ld(x[k]), ACC, p);
            for (int s = 1; s < nsrc; s++) {
                uint4 w = reinterpret_cast<const uint4 *>(srcs.p[s])[i];
                const S *y = reinterpret_cast<const S *>(&w);
#pragma unroll
                for (int k = 0; k < V; k++) acc[k] = E::comb(acc[k], E::ld(y[k]), ACC, p);
            }
        }
        uint4 o;
        S *out = reinterpret_cast<S *>(&o);
#pragma unroll
        for (int k = 0; k < V; k++) out[k] = E::st(E::fin(acc[k], OUT, d));
        reinterpret_cast<uint4 *>(dst)[i] = o;
    }

    for (size_t i = nvec * V + tid; i < count; i += stride) {
        A acc = E::pre(E::ld(static_cast<const S *>(srcs.p[0])[i]), ACC, p);
        for (int s = 1; s < nsrc; s++)
            acc = E::comb(acc, E::ld(static_cast<const S *>(srcs.p[s])[i]), ACC, p);
        static_cast<S *>(dst)[i] = E::st(E::fin(acc, OUT, d));
    }
}

/* One full wave of resident blocks per device, looked up once. */
int grid_limit()
{
    static int limit[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 264;
    if (!limit[dev]) {
        int sms = 0, per_sm = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, dev);
        int blocks = sms * (per_sm / kThreads);
        limit[dev] = blocks > 0 ? blocks : 264;
    }
    return limit[dev];
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
    int limit = grid_limit();
    if (blocks > (size_t)limit) blocks = (size_t)limit;
    if (blocks == 0) return 0;
    reduce_kernel<DT, ACC, OUT><<<(unsigned)blocks, kThreads, 0, stream>>>(
        dst, srcs, nsrc, nvec, count, E::kFloat ? (typename E::A)spec->premul : (typename E::A)0,
        (typename E::D)spec->avg_div);
    return (int)cudaGetLastError();
}

} // namespace

/*
 * The op dispatch: AVG accumulates a sum and divides at the end (not at all
 * for a partial step, avg_div == 0); the others use one op throughout.
 */
#define DISPATCH_OP(DT, OP)                                                       \
    case OP: return launch<DT, OP, OP>(spec, dst, s, nsrc, count, st);

template <smddp_dtype_t DT>
static int dispatch(const smddp__reduce_spec_t *spec, void *dst, const Srcs &s, int nsrc,
                    size_t count, cudaStream_t st)
{
    switch (spec->op) {
    DISPATCH_OP(DT, SMDDP_PROD)
    DISPATCH_OP(DT, SMDDP_MIN)
    DISPATCH_OP(DT, SMDDP_MAX)
    case SMDDP_AVG:
        if (spec->avg_div > 0) return launch<DT, SMDDP_SUM, SMDDP_AVG>(spec, dst, s, nsrc, count, st);
        break;
    default:
        /* Only the ops defined for the type are instantiated (the API checked). */
        if constexpr (Elem<DT>::kFloat) {
            if (spec->op == SMDDP_PREMUL_SUM)
                return launch<DT, SMDDP_PREMUL_SUM, SMDDP_PREMUL_SUM>(spec, dst, s, nsrc, count, st);
        } else {
            switch (spec->op) {
            DISPATCH_OP(DT, SMDDP_BAND)
            DISPATCH_OP(DT, SMDDP_BOR)
            DISPATCH_OP(DT, SMDDP_BXOR)
            default: break;
            }
        }
        break;
    }
    return launch<DT, SMDDP_SUM, SMDDP_SUM>(spec, dst, s, nsrc, count, st);
}

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
    switch (spec->dtype) {
    case SMDDP_INT8: return dispatch<SMDDP_INT8>(spec, dst, s, nsrc, count, st);
    case SMDDP_UINT8: return dispatch<SMDDP_UINT8>(spec, dst, s, nsrc, count, st);
    case SMDDP_INT32: return dispatch<SMDDP_INT32>(spec, dst, s, nsrc, count, st);
    case SMDDP_INT64: return dispatch<SMDDP_INT64>(spec, dst, s, nsrc, count, st);
    case SMDDP_INT16: return dispatch<SMDDP_INT16>(spec, dst, s, nsrc, count, st);
    case SMDDP_UINT16: return dispatch<SMDDP_UINT16>(spec, dst, s, nsrc, count, st);
    case SMDDP_UINT32: return dispatch<SMDDP_UINT32>(spec, dst, s, nsrc, count, st);
    case SMDDP_UINT64: return dispatch<SMDDP_UINT64>(spec, dst, s, nsrc, count, st);
    case SMDDP_FLOAT16: return dispatch<SMDDP_FLOAT16>(spec, dst, s, nsrc, count, st);
    case SMDDP_BFLOAT16: return dispatch<SMDDP_BFLOAT16>(spec, dst, s, nsrc, count, st);
    case SMDDP_FLOAT32: return dispatch<SMDDP_FLOAT32>(spec, dst, s, nsrc, count, st);
    case SMDDP_FLOAT64: return dispatch<SMDDP_FLOAT64>(spec, dst, s, nsrc, count, st);
    default: return (int)cudaErrorInvalidValue;
    }
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
