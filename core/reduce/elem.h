/*
 * The per-element arithmetic of every reduction, written once and compiled
 * both by the C compiler (reduce_impl.h, the CPU kernels) and by nvcc as
 * __host__ __device__ (core/cuda/kernels.cu), so that a GPU and a CPU
 * reducing the same inputs in the same order produce the same bits. The unit
 * tests exercise it on the CPU through the CPU kernels.
 *
 * A reduction of sources x0..xn-1 is fin(comb(...comb(pre(x0), x1)..., xn-1)):
 *  - pre:  applied to the first source (PREMUL_SUM multiplies by the factor);
 *  - comb: acc op next source (PREMUL_SUM: acc + y * factor; AVG is a sum);
 *  - fin:  applied to the result (AVG divides: x * (1/n) would round
 *          differently).
 * Floats: min/max propagate NaN (torch.maximum) and give the right operand
 * for equal ones (+0 and -0); the selects are exactly MINPS/MAXPS. A NaN
 * result is stored as the canonical quiet NaN (the store helpers below).
 * Integers: sums and products wrap (two's complement, like torch), computed
 * in the unsigned type U so that no signed overflow occurs; min/max compare
 * in the element type; AVG truncates the wrapped sum towards zero, dividing
 * in D, a type wide enough for the divisor. PREMUL_SUM does not apply.
 * Both builds keep multiplies and adds unfused (-ffp-contract=off, nvcc
 * -fmad=false).
 */
#ifndef SMDDP_CORE_REDUCE_ELEM_H
#define SMDDP_CORE_REDUCE_ELEM_H

#include <smddp/smddp.h>

#include "half.h"

#if defined(__CUDACC__)
#define SMDDP_ELEM_FN static __forceinline__ __host__ __device__
#else
#define SMDDP_ELEM_FN static inline __attribute__((always_inline))
#endif

#define SMDDP_ELEM_FLOAT_OPS(SUF, A)                                            \
    SMDDP_ELEM_FN A smddp__pre_##SUF(A x, smddp_op_t op, A p)                   \
    {                                                                           \
        return op == SMDDP_PREMUL_SUM ? x * p : x;                              \
    }                                                                           \
    SMDDP_ELEM_FN A smddp__comb_##SUF(A a, A y, smddp_op_t op, A p)             \
    {                                                                           \
        switch (op) {                                                           \
        case SMDDP_PROD: return a * y;                                          \
        case SMDDP_MIN: return a != a ? a : (a < y ? a : y);                    \
        case SMDDP_MAX: return a != a ? a : (a > y ? a : y);                    \
        case SMDDP_PREMUL_SUM: return a + y * p;                                \
        default: return a + y;                                                  \
        }                                                                       \
    }                                                                           \
    SMDDP_ELEM_FN A smddp__fin_##SUF(A v, smddp_op_t op, A d)                   \
    {                                                                           \
        return op == SMDDP_AVG ? v / d : v;                                     \
    }

SMDDP_ELEM_FLOAT_OPS(f32, float)
SMDDP_ELEM_FLOAT_OPS(f64, double)

#define SMDDP_ELEM_INT_OPS(SUF, T, U, D)                                        \
    SMDDP_ELEM_FN T smddp__pre_##SUF(T x, smddp_op_t op, T p)                   \
    {                                                                           \
        (void)op;                                                               \
        (void)p;                                                                \
        return x;                                                               \
    }                                                                           \
    SMDDP_ELEM_FN T smddp__comb_##SUF(T a, T y, smddp_op_t op, T p)             \
    {                                                                           \
        (void)p;                                                                \
        switch (op) {                                                           \
        case SMDDP_PROD: return (T)((U)a * (U)y);                               \
        case SMDDP_MIN: return a < y ? a : y;                                   \
        case SMDDP_MAX: return a > y ? a : y;                                   \
        case SMDDP_BAND: return (T)(a & y);                                     \
        case SMDDP_BOR: return (T)(a | y);                                      \
        case SMDDP_BXOR: return (T)(a ^ y);                                     \
        default: return (T)((U)a + (U)y);                                       \
        }                                                                       \
    }                                                                           \
    SMDDP_ELEM_FN T smddp__fin_##SUF(T v, smddp_op_t op, D d)                   \
    {                                                                           \
        return op == SMDDP_AVG ? (T)((D)v / d) : v;                             \
    }

SMDDP_ELEM_INT_OPS(i8, int8_t, uint8_t, int)
SMDDP_ELEM_INT_OPS(u8, uint8_t, uint8_t, int)
SMDDP_ELEM_INT_OPS(i32, int32_t, uint32_t, int32_t)
SMDDP_ELEM_INT_OPS(i64, int64_t, uint64_t, int64_t)
/* 16-bit products in uint32_t: uint16_t would promote to int, which overflows. */
SMDDP_ELEM_INT_OPS(i16, int16_t, uint32_t, int)
SMDDP_ELEM_INT_OPS(u16, uint16_t, uint32_t, int)
SMDDP_ELEM_INT_OPS(u32, uint32_t, uint32_t, uint32_t)
SMDDP_ELEM_INT_OPS(u64, uint64_t, uint64_t, uint64_t)

/* Results as stored: NaN becomes the canonical quiet NaN. */
SMDDP_ELEM_FN float smddp__canon_f32(float v)
{
    return v != v ? smddp__bits_to_f32(0x7fc00000u) : v;
}

SMDDP_ELEM_FN double smddp__canon_f64(double v)
{
    union {
        uint64_t u;
        double d;
    } nan;
    nan.u = 0x7ff8000000000000ull;
    return v != v ? nan.d : v;
}

/*
 * fp32 -> bf16 with round to nearest even, NaN canonical (0x7fc0). Spelled
 * with a mask on the 32-bit value rather than a branch, so that GCC turns a
 * loop over it into a few vector instructions and one pack.
 */
SMDDP_ELEM_FN uint16_t smddp__store_bf16(float v)
{
    uint32_t x = smddp__f32_to_bits(v);
    uint32_t r = x + 0x7fffu + ((x >> 16) & 1u);
    uint32_t nan = 0u - (uint32_t)(v != v);
    r = (r & ~nan) | (0x7fc00000u & nan);
    return (uint16_t)(r >> 16);
}

/* fp32 -> fp16 with round to nearest even, NaN canonical (0x7e00). */
SMDDP_ELEM_FN uint16_t smddp__store_fp16(float v)
{
    return v != v ? (uint16_t)0x7e00 : smddp__fp32_to_fp16(v);
}

#endif /* SMDDP_CORE_REDUCE_ELEM_H */
