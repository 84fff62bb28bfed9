/*
 * The reduction kernels, written once and compiled once per instruction set:
 * reduce_generic.c, reduce_avx2.c and reduce_avx512.c each define
 * REDUCE_ENTRY (the name of their entry point) and, where F16C may be used,
 * REDUCE_USE_F16C, then include this file. Only the compiler flags differ, so
 * every variant computes the same IEEE operations in the same order and the
 * results are bit-identical (the build keeps -ffp-contract=off so that no
 * variant fuses a multiply and an add).
 *
 * How a kernel runs: the count elements are cut into blocks of REDUCE_BLOCK.
 * Within a block the sources are combined left to right, one pass per
 * source: with nsrc >= 3, acc = src0 op src1, then acc = acc op src_s for the
 * middle sources, and the last pass computes dst = finish(acc op src_last)
 * (finish: AVG's division, rounding to fp16/bf16). With nsrc == 2 the single
 * pass is dst = finish(src0 op src1), with nsrc == 1 dst = finish(pre(src0)).
 * dst is only written by the last pass of a block, element i right after
 * element i of the last sources was read, so a dst that is the same pointer
 * as any source is safe. acc is a restrict-qualified local array, every pass
 * a plain loop, so the compiler vectorises them with whatever vector width
 * the flags allow (for the passes that write dst, GCC adds a runtime overlap
 * check that an exactly aliased dst passes). Sources and dst are accessed
 * with memcpy, which compiles to unaligned vector loads and stores.
 *
 * Each pass is instantiated once per op with the op a constant (the
 * REDUCE_SWITCH_* macros), so that every loop body is a few instructions.
 *
 * fp16 and bf16 values are widened to fp32 as they are loaded (bf16 with a
 * shift inside the same loops; fp16 with F16C one block at a time into
 * buffers), combined in fp32, and the fp32 result is narrowed once at the end
 * with round to nearest even.
 *
 * A floating-point result that is NaN is stored as the canonical quiet NaN
 * (positive, zero payload). IEEE arithmetic does not say which NaN operand's
 * payload a + b returns, and the compiler may swap the operands of a
 * commutative operation differently in each variant, so without this step
 * the variants could disagree in the sign or payload of a NaN.
 */
#include <math.h>
#include <string.h>

#include "elem.h"
#include "half.h"
#include "reduce.h"
#include "reduce_isa.h"

#if defined(REDUCE_USE_F16C)
#include <immintrin.h>
#endif

/*
 * Elements per block: the accumulator (4 KiB for fp32; 16 KiB of buffers
 * for fp16 with F16C) stays in L1 while each source streams through once.
 */
#define REDUCE_BLOCK 1024

/* The helpers below must be inlined for their op argument to fold away. */
#define REDUCE_INLINE static inline __attribute__((always_inline))

typedef const unsigned char *reduce_src_t;

/* ------------------------------------------------------------------------ */
/* Loads and stores of one element, by storage type. */

#define REDUCE_DEFINE_NATIVE_IO(SUF, T)                              \
    REDUCE_INLINE T ld_##SUF(reduce_src_t p, size_t j)               \
    {                                                                \
        T v;                                                         \
        memcpy(&v, p + j * sizeof(T), sizeof(T));                    \
        return v;                                                    \
    }                                                                \
    REDUCE_INLINE void put_##SUF(unsigned char *p, size_t j, T v)    \
    {                                                                \
        memcpy(p + j * sizeof(T), &v, sizeof(T));                    \
    }

REDUCE_DEFINE_NATIVE_IO(i8, int8_t)
REDUCE_DEFINE_NATIVE_IO(u8, uint8_t)
REDUCE_DEFINE_NATIVE_IO(i32, int32_t)
REDUCE_DEFINE_NATIVE_IO(i64, int64_t)
REDUCE_DEFINE_NATIVE_IO(i16, int16_t)
REDUCE_DEFINE_NATIVE_IO(u16, uint16_t)
REDUCE_DEFINE_NATIVE_IO(u32, uint32_t)
REDUCE_DEFINE_NATIVE_IO(u64, uint64_t)

REDUCE_INLINE float ld_f32(reduce_src_t p, size_t j)
{
    float v;
    memcpy(&v, p + 4 * j, 4);
    return v;
}

REDUCE_INLINE void put_f32(unsigned char *p, size_t j, float v)
{
    v = smddp__canon_f32(v);
    memcpy(p + 4 * j, &v, 4);
}

REDUCE_INLINE double ld_f64(reduce_src_t p, size_t j)
{
    double v;
    memcpy(&v, p + 8 * j, 8);
    return v;
}

REDUCE_INLINE void put_f64(unsigned char *p, size_t j, double v)
{
    v = smddp__canon_f64(v);
    memcpy(p + 8 * j, &v, 8);
}

/* bf16 is the top half of an fp32: widening is a shift that vectorises. */
REDUCE_INLINE float ld_bf16(reduce_src_t p, size_t j)
{
    uint16_t h;
    memcpy(&h, p + 2 * j, 2);
    return smddp__bf16_to_fp32(h);
}

REDUCE_INLINE void put_bf16(unsigned char *p, size_t j, float v)
{
    uint16_t h = smddp__store_bf16(v);
    memcpy(p + 2 * j, &h, 2);
}

/* fp16 without F16C: the portable conversions (scalar; the fallback path). */
REDUCE_INLINE float ld_fp16(reduce_src_t p, size_t j)
{
    uint16_t h;
    memcpy(&h, p + 2 * j, 2);
    return smddp__fp16_to_fp32(h);
}

REDUCE_INLINE void put_fp16(unsigned char *p, size_t j, float v)
{
    uint16_t h = smddp__store_fp16(v);
    memcpy(p + 2 * j, &h, 2);
}

/* ------------------------------------------------------------------------ */
/*
 * The ops on an accumulator type: pre (applied to the first source), comb
 * (acc op next source), fin (applied to the result); premul and divisor,
 * from the spec, in the accumulation type.
 */

/*
 * pre/comb/fin are elem.h's, shared with the CUDA kernels; premul and
 * divisor convert the spec's values to the accumulation type (integers take
 * no factor: converting an arbitrary double to them would be undefined).
 */
#define REDUCE_DEFINE_OPS(ASUF, A, D, PREMUL)                                           \
    REDUCE_INLINE A pre_##ASUF(A x, smddp_op_t op, A p)                         \
    {                                                                           \
        return smddp__pre_##ASUF(x, op, p);                                     \
    }                                                                           \
    REDUCE_INLINE A comb_##ASUF(A a, A y, smddp_op_t op, A p)                   \
    {                                                                           \
        return smddp__comb_##ASUF(a, y, op, p);                                 \
    }                                                                           \
    REDUCE_INLINE A fin_##ASUF(A v, smddp_op_t op, D d)                         \
    {                                                                           \
        return smddp__fin_##ASUF(v, op, d);                                     \
    }                                                                           \
    REDUCE_INLINE A premul_##ASUF(const smddp__reduce_spec_t *spec)             \
    {                                                                           \
        return (A)(PREMUL);                                                     \
    }                                                                           \
    REDUCE_INLINE D divisor_##ASUF(const smddp__reduce_spec_t *spec)            \
    {                                                                           \
        return (D)spec->avg_div;                                                \
    }

REDUCE_DEFINE_OPS(f32, float, float, spec->premul)
REDUCE_DEFINE_OPS(f64, double, double, spec->premul)
REDUCE_DEFINE_OPS(i8, int8_t, int, 0 * (spec != NULL))
REDUCE_DEFINE_OPS(u8, uint8_t, int, 0 * (spec != NULL))
REDUCE_DEFINE_OPS(i32, int32_t, int32_t, 0 * (spec != NULL))
REDUCE_DEFINE_OPS(i64, int64_t, int64_t, 0 * (spec != NULL))
REDUCE_DEFINE_OPS(i16, int16_t, int, 0 * (spec != NULL))
REDUCE_DEFINE_OPS(u16, uint16_t, int, 0 * (spec != NULL))
REDUCE_DEFINE_OPS(u32, uint32_t, uint32_t, 0 * (spec != NULL))
REDUCE_DEFINE_OPS(u64, uint64_t, uint64_t, 0 * (spec != NULL))

/*
 * Calls fn(args..., OP) with OP a constant matching op. The ACC variants are
 * for passes into acc, where AVG is a plain sum (the caller passes SUM).
 */
#define REDUCE_SWITCH_FLOAT_ACC(op, fn, ...)                                   \
    switch (op) {                                                              \
    case SMDDP_PROD: fn(__VA_ARGS__, SMDDP_PROD); break;                       \
    case SMDDP_MIN: fn(__VA_ARGS__, SMDDP_MIN); break;                         \
    case SMDDP_MAX: fn(__VA_ARGS__, SMDDP_MAX); break;                         \
    case SMDDP_PREMUL_SUM: fn(__VA_ARGS__, SMDDP_PREMUL_SUM); break;           \
    default: fn(__VA_ARGS__, SMDDP_SUM); break;                                \
    }
#define REDUCE_SWITCH_FLOAT_OUT(op, fn, ...)                                   \
    switch (op) {                                                              \
    case SMDDP_AVG: fn(__VA_ARGS__, SMDDP_AVG); break;                         \
    default: REDUCE_SWITCH_FLOAT_ACC(op, fn, __VA_ARGS__) break;               \
    }
#define REDUCE_SWITCH_INT_ACC(op, fn, ...)                                     \
    switch (op) {                                                              \
    case SMDDP_PROD: fn(__VA_ARGS__, SMDDP_PROD); break;                       \
    case SMDDP_MIN: fn(__VA_ARGS__, SMDDP_MIN); break;                         \
    case SMDDP_MAX: fn(__VA_ARGS__, SMDDP_MAX); break;                         \
    case SMDDP_BAND: fn(__VA_ARGS__, SMDDP_BAND); break;                       \
    case SMDDP_BOR: fn(__VA_ARGS__, SMDDP_BOR); break;                         \
    case SMDDP_BXOR: fn(__VA_ARGS__, SMDDP_BXOR); break;                       \
    default: fn(__VA_ARGS__, SMDDP_SUM); break;                                \
    }
#define REDUCE_SWITCH_INT_OUT(op, fn, ...)                                     \
    switch (op) {                                                              \
    case SMDDP_AVG: fn(__VA_ARGS__, SMDDP_AVG); break;                         \
    default: REDUCE_SWITCH_INT_ACC(op, fn, __VA_ARGS__) break;                 \
    }

/* ------------------------------------------------------------------------ */
/*
 * The passes and the kernel for storage type SUF (ld_SUF/put_SUF) with
 * accumulator A and ops ASUF, divisor type D, switches FAM (FLOAT or INT).
 * The *_k helpers take the op last, as a constant after inlining.
 */
#define REDUCE_DEFINE_PASSES(SUF, A, ASUF, D, FAM)                                 \
    REDUCE_INLINE void acc2_##SUF##_k(A *restrict acc, reduce_src_t x,             \
                                      reduce_src_t y, size_t n, A p, smddp_op_t op) \
    {                                                                              \
        for (size_t j = 0; j < n; j++)                                             \
            acc[j] = comb_##ASUF(pre_##ASUF(ld_##SUF(x, j), op, p), ld_##SUF(y, j), \
                                 op, p);                                           \
    }                                                                              \
    /* acc = pre(x) op y */                                                        \
    static void acc2_##SUF(A *restrict acc, reduce_src_t x, reduce_src_t y,        \
                           size_t n, A p, smddp_op_t op)                           \
    {                                                                              \
        REDUCE_SWITCH_##FAM##_ACC(op, acc2_##SUF##_k, acc, x, y, n, p)             \
    }                                                                              \
                                                                                   \
    REDUCE_INLINE void step_##SUF##_k(A *restrict acc, reduce_src_t y, size_t n,   \
                                      A p, smddp_op_t op)                          \
    {                                                                              \
        for (size_t j = 0; j < n; j++) acc[j] = comb_##ASUF(acc[j], ld_##SUF(y, j), op, p); \
    }                                                                              \
    /* acc = acc op y */                                                           \
    static void step_##SUF(A *restrict acc, reduce_src_t y, size_t n, A p,         \
                           smddp_op_t op)                                          \
    {                                                                              \
        REDUCE_SWITCH_##FAM##_ACC(op, step_##SUF##_k, acc, y, n, p)                \
    }                                                                              \
                                                                                   \
    REDUCE_INLINE void last_##SUF##_k(unsigned char *dst, const A *restrict acc,   \
                                      reduce_src_t y, size_t n, A p, D d,          \
                                      smddp_op_t op)                               \
    {                                                                              \
        for (size_t j = 0; j < n; j++)                                             \
            put_##SUF(dst, j, fin_##ASUF(comb_##ASUF(acc[j], ld_##SUF(y, j), op, p), op, d)); \
    }                                                                              \
    /* dst = fin(acc op y) */                                                      \
    static void last_##SUF(unsigned char *dst, const A *restrict acc, reduce_src_t y, \
                           size_t n, A p, D d, smddp_op_t op)                      \
    {                                                                              \
        REDUCE_SWITCH_##FAM##_OUT(op, last_##SUF##_k, dst, acc, y, n, p, d)        \
    }                                                                              \
                                                                                   \
    REDUCE_INLINE void two_##SUF##_k(unsigned char *dst, reduce_src_t x,           \
                                     reduce_src_t y, size_t n, A p, D d,           \
                                     smddp_op_t op)                                \
    {                                                                              \
        for (size_t j = 0; j < n; j++)                                             \
            put_##SUF(dst, j,                                                      \
                      fin_##ASUF(comb_##ASUF(pre_##ASUF(ld_##SUF(x, j), op, p),    \
                                             ld_##SUF(y, j), op, p),               \
                                 op, d));                                          \
    }                                                                              \
    /* dst = fin(pre(x) op y) */                                                   \
    static void two_##SUF(unsigned char *dst, reduce_src_t x, reduce_src_t y,      \
                          size_t n, A p, D d, smddp_op_t op)                       \
    {                                                                              \
        REDUCE_SWITCH_##FAM##_OUT(op, two_##SUF##_k, dst, x, y, n, p, d)           \
    }                                                                              \
                                                                                   \
    REDUCE_INLINE void one_##SUF##_k(unsigned char *dst, reduce_src_t x, size_t n, \
                                     A p, D d, smddp_op_t op)                      \
    {                                                                              \
        for (size_t j = 0; j < n; j++)                                             \
            put_##SUF(dst, j, fin_##ASUF(pre_##ASUF(ld_##SUF(x, j), op, p), op, d)); \
    }                                                                              \
    /* dst = fin(pre(x)) */                                                        \
    static void one_##SUF(unsigned char *dst, reduce_src_t x, size_t n, A p, D d,  \
                          smddp_op_t op)                                           \
    {                                                                              \
        REDUCE_SWITCH_##FAM##_OUT(op, one_##SUF##_k, dst, x, n, p, d)              \
    }

/*
 * The block loop. acc_op is the op for passes into acc (AVG is a sum there),
 * out_op the op for the pass that writes dst (AVG only with a divisor).
 */
#define REDUCE_DEFINE_KERNEL(SUF, ESZ, A, ASUF, D, FAM)                            \
    REDUCE_DEFINE_PASSES(SUF, A, ASUF, D, FAM)                                     \
    static void reduce_##SUF(const smddp__reduce_spec_t *spec, void *dst,          \
                             const void *const *srcs, int nsrc, size_t count)      \
    {                                                                              \
        A acc[REDUCE_BLOCK];                                                       \
        A p = premul_##ASUF(spec);                                                 \
        D d = divisor_##ASUF(spec);                                                \
        smddp_op_t acc_op = spec->op == SMDDP_AVG ? SMDDP_SUM : spec->op;          \
        smddp_op_t out_op =                                                        \
            spec->op == SMDDP_AVG && spec->avg_div > 0 ? SMDDP_AVG : acc_op;       \
        for (size_t i = 0; i < count; i += REDUCE_BLOCK) {                         \
            size_t n = SMDDP_MIN(count - i, (size_t)REDUCE_BLOCK);                 \
            size_t off = i * (ESZ);                                                \
            unsigned char *out = (unsigned char *)dst + off;                       \
            reduce_src_t s0 = (reduce_src_t)srcs[0] + off;                         \
            if (nsrc == 1) {                                                       \
                one_##SUF(out, s0, n, p, d, out_op);                               \
            } else if (nsrc == 2) {                                                \
                two_##SUF(out, s0, (reduce_src_t)srcs[1] + off, n, p, d, out_op);  \
            } else {                                                               \
                acc2_##SUF(acc, s0, (reduce_src_t)srcs[1] + off, n, p, acc_op);    \
                for (int s = 2; s < nsrc - 1; s++)                                 \
                    step_##SUF(acc, (reduce_src_t)srcs[s] + off, n, p, acc_op);    \
                last_##SUF(out, acc, (reduce_src_t)srcs[nsrc - 1] + off, n, p, d,  \
                           out_op);                                                \
            }                                                                      \
        }                                                                          \
    }

REDUCE_DEFINE_KERNEL(i8, 1, int8_t, i8, int, INT)
REDUCE_DEFINE_KERNEL(u8, 1, uint8_t, u8, int, INT)
REDUCE_DEFINE_KERNEL(i32, 4, int32_t, i32, int32_t, INT)
REDUCE_DEFINE_KERNEL(i64, 8, int64_t, i64, int64_t, INT)
REDUCE_DEFINE_KERNEL(i16, 2, int16_t, i16, int, INT)
REDUCE_DEFINE_KERNEL(u16, 2, uint16_t, u16, int, INT)
REDUCE_DEFINE_KERNEL(u32, 4, uint32_t, u32, uint32_t, INT)
REDUCE_DEFINE_KERNEL(u64, 8, uint64_t, u64, uint64_t, INT)
REDUCE_DEFINE_KERNEL(f32, 4, float, f32, float, FLOAT)
REDUCE_DEFINE_KERNEL(f64, 8, double, f64, double, FLOAT)
REDUCE_DEFINE_KERNEL(bf16, 2, float, f32, float, FLOAT)

#if !defined(REDUCE_USE_F16C)
REDUCE_DEFINE_KERNEL(fp16, 2, float, f32, float, FLOAT)
#else
/*
 * fp16 with F16C: each source block is widened into a buffer with VCVTPH2PS
 * and combined by the fp32 passes into an fp32 block (NaN already canonical),
 * which VCVTPS2PH narrows into dst. Both take an explicit rounding immediate
 * (MXCSR's mode does not matter) and handle the tail through a padded 8-lane
 * buffer, so that it uses the same instructions as the body.
 */
static void widen_fp16(float *restrict out, reduce_src_t in, size_t n)
{
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(out + j,
                         _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + 2 * j))));
    if (j < n) {
        uint16_t h[8] = {0};
        float f[8];
        memcpy(h, in + 2 * j, (n - j) * 2);
        _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)));
        memcpy(out + j, f, (n - j) * sizeof(float));
    }
}

static void narrow_fp16(unsigned char *out, const float *restrict in, size_t n)
{
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm_storeu_si128((__m128i *)(out + 2 * j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + j), _MM_FROUND_TO_NEAREST_INT));
    if (j < n) {
        float f[8] = {0};
        uint16_t h[8];
        memcpy(f, in + j, (n - j) * sizeof(float));
        _mm_storeu_si128((__m128i *)h,
                         _mm256_cvtps_ph(_mm256_loadu_ps(f), _MM_FROUND_TO_NEAREST_INT));
        memcpy(out + 2 * j, h, (n - j) * 2);
    }
}

static void reduce_fp16(const smddp__reduce_spec_t *spec, void *dst, const void *const *srcs,
                        int nsrc, size_t count)
{
    float acc[REDUCE_BLOCK], x[REDUCE_BLOCK], y[REDUCE_BLOCK], res[REDUCE_BLOCK];
    float p = premul_f32(spec);
    float d = divisor_f32(spec);
    smddp_op_t acc_op = spec->op == SMDDP_AVG ? SMDDP_SUM : spec->op;
    smddp_op_t out_op = spec->op == SMDDP_AVG && spec->avg_div > 0 ? SMDDP_AVG : acc_op;
    unsigned char *r = (unsigned char *)res;
    for (size_t i = 0; i < count; i += REDUCE_BLOCK) {
        size_t n = SMDDP_MIN(count - i, (size_t)REDUCE_BLOCK);
        size_t off = i * 2;
        widen_fp16(x, (reduce_src_t)srcs[0] + off, n);
        if (nsrc == 1) {
            one_f32(r, (reduce_src_t)x, n, p, d, out_op);
        } else {
            widen_fp16(y, (reduce_src_t)srcs[1] + off, n);
            if (nsrc == 2) {
                two_f32(r, (reduce_src_t)x, (reduce_src_t)y, n, p, d, out_op);
            } else {
                acc2_f32(acc, (reduce_src_t)x, (reduce_src_t)y, n, p, acc_op);
                for (int s = 2; s < nsrc - 1; s++) {
                    widen_fp16(y, (reduce_src_t)srcs[s] + off, n);
                    step_f32(acc, (reduce_src_t)y, n, p, acc_op);
                }
                widen_fp16(y, (reduce_src_t)srcs[nsrc - 1] + off, n);
                last_f32(r, acc, (reduce_src_t)y, n, p, d, out_op);
            }
        }
        narrow_fp16((unsigned char *)dst + off, res, n);
    }
}
#endif

/* ------------------------------------------------------------------------ */

static size_t dtype_size(smddp_dtype_t dtype)
{
    switch (dtype) {
    case SMDDP_INT8:
    case SMDDP_UINT8: return 1;
    case SMDDP_INT16:
    case SMDDP_UINT16:
    case SMDDP_FLOAT16:
    case SMDDP_BFLOAT16: return 2;
    case SMDDP_INT32:
    case SMDDP_UINT32:
    case SMDDP_FLOAT32: return 4;
    default: return 8;
    }
}

void REDUCE_ENTRY(const smddp__reduce_spec_t *spec, void *dst, const void *const *srcs,
                  int nsrc, size_t count)
{
    /* One source and no unary part: a copy, bit for bit (NaN payloads too). */
    if (nsrc == 1 && spec->op != SMDDP_PREMUL_SUM &&
        !(spec->op == SMDDP_AVG && spec->avg_div > 0)) {
        if (dst != srcs[0] && count > 0) memcpy(dst, srcs[0], count * dtype_size(spec->dtype));
        return;
    }
    switch (spec->dtype) {
    case SMDDP_INT8: reduce_i8(spec, dst, srcs, nsrc, count); break;
    case SMDDP_UINT8: reduce_u8(spec, dst, srcs, nsrc, count); break;
    case SMDDP_INT32: reduce_i32(spec, dst, srcs, nsrc, count); break;
    case SMDDP_INT64: reduce_i64(spec, dst, srcs, nsrc, count); break;
    case SMDDP_INT16: reduce_i16(spec, dst, srcs, nsrc, count); break;
    case SMDDP_UINT16: reduce_u16(spec, dst, srcs, nsrc, count); break;
    case SMDDP_UINT32: reduce_u32(spec, dst, srcs, nsrc, count); break;
    case SMDDP_UINT64: reduce_u64(spec, dst, srcs, nsrc, count); break;
    case SMDDP_FLOAT16: reduce_fp16(spec, dst, srcs, nsrc, count); break;
    case SMDDP_BFLOAT16: reduce_bf16(spec, dst, srcs, nsrc, count); break;
    case SMDDP_FLOAT32: reduce_f32(spec, dst, srcs, nsrc, count); break;
    case SMDDP_FLOAT64: reduce_f64(spec, dst, srcs, nsrc, count); break;
    default: break;
    }
}
