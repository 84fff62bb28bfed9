/*
 * The CUDA kernels' view of reduce/elem.h (kernels.cu, ipc_kernels.cu): per
 * dtype, the stored and accumulated types and the arithmetic, and the
 * dispatch from a reduce spec's (dtype, op) to a kernel instantiation.
 */
#ifndef SMDDP_CORE_CUDA_ELEM_CUH
#define SMDDP_CORE_CUDA_ELEM_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../dtype.h"
#include "../reduce/elem.h"
#include "../reduce/reduce.h"

namespace smddp_cuda {

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

/* The lanes of one 16-byte vector of DT: reduced with ACC, finished with OUT. */
template <smddp_dtype_t DT, smddp_op_t ACC, smddp_op_t OUT>
struct Vec {
    using E = Elem<DT>;
    using S = typename E::S;
    using A = typename E::A;
    static constexpr int V = 16 / sizeof(S);
    A a[V];

    /* The first source. */
    __device__ __forceinline__ void first(const uint4 &v, A p)
    {
        const S *x = reinterpret_cast<const S *>(&v);
#pragma unroll
        for (int k = 0; k < V; k++) a[k] = E::pre(E::ld(x[k]), ACC, p);
    }

    /* The next source, in order. */
    __device__ __forceinline__ void comb(const uint4 &w, A p)
    {
        const S *y = reinterpret_cast<const S *>(&w);
#pragma unroll
        for (int k = 0; k < V; k++) a[k] = E::comb(a[k], E::ld(y[k]), ACC, p);
    }

    /* The result, stored. */
    __device__ __forceinline__ uint4 finish(typename E::D d) const
    {
        uint4 o;
        S *out = reinterpret_cast<S *>(&o);
#pragma unroll
        for (int k = 0; k < V; k++) out[k] = E::st(E::fin(a[k], OUT, d));
        return o;
    }
};

/*
 * Calls f.template run<DT, ACC, OUT>() for spec's dtype and op: AVG
 * accumulates a sum and divides at the end (not at all for a partial step,
 * avg_div == 0); the others use one op throughout. Only the ops defined for
 * the type are instantiated (the API checked the pair).
 */
template <smddp_dtype_t DT, class F>
int dispatch_op(const smddp__reduce_spec_t *spec, const F &f)
{
#define SMDDP_CUDA_OP(OP) \
    case OP: return f.template run<DT, OP, OP>();
    switch (spec->op) {
    SMDDP_CUDA_OP(SMDDP_PROD)
    SMDDP_CUDA_OP(SMDDP_MIN)
    SMDDP_CUDA_OP(SMDDP_MAX)
    case SMDDP_AVG:
        if (spec->avg_div > 0) return f.template run<DT, SMDDP_SUM, SMDDP_AVG>();
        break;
    default:
        if constexpr (Elem<DT>::kFloat) {
            if (spec->op == SMDDP_PREMUL_SUM)
                return f.template run<DT, SMDDP_PREMUL_SUM, SMDDP_PREMUL_SUM>();
        } else {
            switch (spec->op) {
            SMDDP_CUDA_OP(SMDDP_BAND)
            SMDDP_CUDA_OP(SMDDP_BOR)
            SMDDP_CUDA_OP(SMDDP_BXOR)
            default: break;
            }
        }
        break;
    }
#undef SMDDP_CUDA_OP
    return f.template run<DT, SMDDP_SUM, SMDDP_SUM>();
}

/* dispatch_op for spec's dtype; cudaErrorInvalidValue for an unknown one. */
template <class F>
int dispatch(const smddp__reduce_spec_t *spec, const F &f)
{
    switch (spec->dtype) {
    case SMDDP_INT8: return dispatch_op<SMDDP_INT8>(spec, f);
    case SMDDP_UINT8: return dispatch_op<SMDDP_UINT8>(spec, f);
    case SMDDP_INT32: return dispatch_op<SMDDP_INT32>(spec, f);
    case SMDDP_INT64: return dispatch_op<SMDDP_INT64>(spec, f);
    case SMDDP_INT16: return dispatch_op<SMDDP_INT16>(spec, f);
    case SMDDP_UINT16: return dispatch_op<SMDDP_UINT16>(spec, f);
    case SMDDP_UINT32: return dispatch_op<SMDDP_UINT32>(spec, f);
    case SMDDP_UINT64: return dispatch_op<SMDDP_UINT64>(spec, f);
    case SMDDP_FLOAT16: return dispatch_op<SMDDP_FLOAT16>(spec, f);
    case SMDDP_BFLOAT16: return dispatch_op<SMDDP_BFLOAT16>(spec, f);
    case SMDDP_FLOAT32: return dispatch_op<SMDDP_FLOAT32>(spec, f);
    case SMDDP_FLOAT64: return dispatch_op<SMDDP_FLOAT64>(spec, f);
    default: return 1; /* cudaErrorInvalidValue */
    }
}

/* Blocks of `threads` threads that fill the current device once (its shape looked up once). */
inline int grid_limit(int threads)
{
    static int sms[64], per_sm[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 264;
    if (!sms[dev]) {
        cudaDeviceGetAttribute(&per_sm[dev], cudaDevAttrMaxThreadsPerMultiProcessor, dev);
        cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev);
    }
    int blocks = sms[dev] * (per_sm[dev] / threads);
    return blocks > 0 ? blocks : 264;
}

} // namespace smddp_cuda

#endif /* SMDDP_CORE_CUDA_ELEM_CUH */
