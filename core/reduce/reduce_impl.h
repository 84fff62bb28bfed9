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
 * For each block, all nsrc sources are combined left to right into a local
 * accumulator (acc = src0 op src1, then acc = acc op src2, ...), the unary
 * tail is applied (AVG division), and only then is dst written. A dst that
 * is the same pointer as a source is therefore safe: every source value of
 * the block has been read before dst of the block changes. The accumulator is
 * a restrict-qualified local array and every loop is a plain loop over it, so
 * the compiler vectorises them with whatever vector width the flags allow;
 * sources and dst are accessed with memcpy, which compiles to unaligned
 * vector loads and stores, so any alignment works.
 *
 * fp16 and bf16 blocks are first widened to fp32 (F16C where available,
 * shifts for bf16) and then reuse the fp32 loops; the fp32 result is narrowed
 * once at the end with round to nearest even.
 */
#include <string.h>

#include "half.h"
#include "reduce.h"
#include "reduce_isa.h"

#if defined(REDUCE_USE_F16C)
#include <immintrin.h>
#endif

/*
 * Elements per block: the accumulator plus the fp16/bf16 widening buffer
 * (8 KiB for fp32) stay in L1 while each source streams through once.
 */
#define REDUCE_BLOCK 1024

typedef const unsigned char *reduce_src_t;

/* Unaligned element loads, one per storage type. */
#define REDUCE_DEFINE_LOAD(SUF, T)                                     \
    static inline T ld_##SUF(reduce_src_t p, size_t j)                 \
    {                                                                  \
        T v;                                                           \
        memcpy(&v, p + j * sizeof(T), sizeof(T));                      \
        return v;                                                      \
    }

REDUCE_DEFINE_LOAD(i8, int8_t)
REDUCE_DEFINE_LOAD(u8, uint8_t)
REDUCE_DEFINE_LOAD(i32, int32_t)
REDUCE_DEFINE_LOAD(i64, int64_t)
REDUCE_DEFINE_LOAD(f32, float)
REDUCE_DEFINE_LOAD(f64, double)

/* ------------------------------------------------------------------------ */
/* Floating point: fp32 and fp64 accumulate in their own type. */

/*
 * NaN-propagating max/min (torch.maximum): a NaN in either operand wins. The
 * inner selects are exactly MAXPS/MINPS, so they vectorise.
 */
#define REDUCE_DEFINE_FLOAT(SUF, A)                                              \
    static inline A max_##SUF(A a, A b) { return a != a ? a : (a > b ? a : b); } \
    static inline A min_##SUF(A a, A b) { return a != a ? a : (a < b ? a : b); } \
                                                                                 \
    /* acc = x, times p for PREMUL_SUM. */                                       \
    static void first_##SUF(A *restrict acc, reduce_src_t x, size_t n,           \
                            smddp_op_t op, A p)                                  \
    {                                                                            \
        if (op == SMDDP_PREMUL_SUM) {                                            \
            for (size_t j = 0; j < n; j++) acc[j] = ld_##SUF(x, j) * p;         \
        } else {                                                                 \
            memcpy(acc, x, n * sizeof(A));                                       \
        }                                                                        \
    }                                                                            \
                                                                                 \
    /* acc = x op y: the first step fused, saving one pass over acc. */          \
    static void first2_##SUF(A *restrict acc, reduce_src_t x, reduce_src_t y,    \
                             size_t n, smddp_op_t op, A p)                       \
    {                                                                            \
        size_t j;                                                                \
        switch (op) {                                                            \
        case SMDDP_SUM:                                                          \
        case SMDDP_AVG:                                                          \
            for (j = 0; j < n; j++) acc[j] = ld_##SUF(x, j) + ld_##SUF(y, j);    \
            break;                                                               \
        case SMDDP_PROD:                                                         \
            for (j = 0; j < n; j++) acc[j] = ld_##SUF(x, j) * ld_##SUF(y, j);    \
            break;                                                               \
        case SMDDP_MIN:                                                          \
            for (j = 0; j < n; j++)                                              \
                acc[j] = min_##SUF(ld_##SUF(x, j), ld_##SUF(y, j));              \
            break;                                                               \
        case SMDDP_MAX:                                                          \
            for (j = 0; j < n; j++)                                              \
                acc[j] = max_##SUF(ld_##SUF(x, j), ld_##SUF(y, j));              \
            break;                                                               \
        case SMDDP_PREMUL_SUM:                                                   \
            for (j = 0; j < n; j++)                                              \
                acc[j] = ld_##SUF(x, j) * p + ld_##SUF(y, j) * p;                \
            break;                                                               \
        default:                                                                 \
            break;                                                               \
        }                                                                        \
    }                                                                            \
                                                                                 \
    /* acc = acc op y. */                                                        \
    static void step_##SUF(A *restrict acc, reduce_src_t y, size_t n,            \
                           smddp_op_t op, A p)                                   \
    {                                                                            \
        size_t j;                                                                \
        switch (op) {                                                            \
        case SMDDP_SUM:                                                          \
        case SMDDP_AVG:                                                          \
            for (j = 0; j < n; j++) acc[j] = acc[j] + ld_##SUF(y, j);            \
            break;                                                               \
        case SMDDP_PROD:                                                         \
            for (j = 0; j < n; j++) acc[j] = acc[j] * ld_##SUF(y, j);            \
            break;                                                               \
        case SMDDP_MIN:                                                          \
            for (j = 0; j < n; j++) acc[j] = min_##SUF(acc[j], ld_##SUF(y, j));  \
            break;                                                               \
        case SMDDP_MAX:                                                          \
            for (j = 0; j < n; j++) acc[j] = max_##SUF(acc[j], ld_##SUF(y, j));  \
            break;                                                               \
        case SMDDP_PREMUL_SUM:                                                   \
            for (j = 0; j < n; j++) acc[j] = acc[j] + ld_##SUF(y, j) * p;        \
            break;                                                               \
        default:                                                                 \
            break;                                                               \
        }                                                                        \
    }                                                                            \
                                                                                 \
    /* AVG: divide (not multiply by the reciprocal, which rounds differently). */ \
    static void finish_##SUF(A *restrict acc, size_t n,                          \
                             const smddp__reduce_spec_t *spec)                   \
    {                                                                            \
        if (spec->op != SMDDP_AVG || spec->avg_div <= 0) return;                 \
        A d = (A)spec->avg_div;                                                  \
        for (size_t j = 0; j < n; j++) acc[j] = acc[j] / d;                      \
    }

REDUCE_DEFINE_FLOAT(f32, float)
REDUCE_DEFINE_FLOAT(f64, double)

#define REDUCE_DEFINE_NATIVE_FLOAT(SUF, A)                                        \
    static void reduce_##SUF(const smddp__reduce_spec_t *spec, void *dst,         \
                             const void *const *srcs, int nsrc, size_t count)     \
    {                                                                             \
        A acc[REDUCE_BLOCK];                                                      \
        A p = (A)spec->premul;                                                    \
        for (size_t i = 0; i < count; i += REDUCE_BLOCK) {                        \
            size_t n = SMDDP_MIN(count - i, (size_t)REDUCE_BLOCK);                \
            size_t off = i * sizeof(A);                                           \
            if (nsrc >= 2)                                                        \
                first2_##SUF(acc, (reduce_src_t)srcs[0] + off,                    \
                             (reduce_src_t)srcs[1] + off, n, spec->op, p);        \
            else                                                                  \
                first_##SUF(acc, (reduce_src_t)srcs[0] + off, n, spec->op, p);    \
            for (int s = 2; s < nsrc; s++)                                        \
                step_##SUF(acc, (reduce_src_t)srcs[s] + off, n, spec->op, p);     \
            finish_##SUF(acc, n, spec);                                           \
            memcpy((unsigned char *)dst + off, acc, n * sizeof(A));               \
        }                                                                         \
    }

REDUCE_DEFINE_NATIVE_FLOAT(f32, float)
REDUCE_DEFINE_NATIVE_FLOAT(f64, double)

/* ------------------------------------------------------------------------ */
/* fp16 and bf16: widen each block to fp32, combine in fp32, narrow once. */

static void widen_bf16(float *restrict out, reduce_src_t in, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        uint16_t h;
        memcpy(&h, in + 2 * j, 2);
        out[j] = smddp__bf16_to_fp32(h);
    }
}

static void narrow_bf16(unsigned char *out, const float *restrict in, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        uint16_t h = smddp__fp32_to_bf16(in[j]);
        memcpy(out + 2 * j, &h, 2);
    }
}

#if defined(REDUCE_USE_F16C)
/*
 * VCVTPH2PS / VCVTPS2PH with an explicit round-to-nearest-even immediate (so
 * MXCSR's rounding mode does not matter). The tail goes through a padded
 * 8-lane buffer so that it uses the same instruction as the body.
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
#else
static void widen_fp16(float *restrict out, reduce_src_t in, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        uint16_t h;
        memcpy(&h, in + 2 * j, 2);
        out[j] = smddp__fp16_to_fp32(h);
    }
}

static void narrow_fp16(unsigned char *out, const float *restrict in, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        uint16_t h = smddp__fp32_to_fp16(in[j]);
        memcpy(out + 2 * j, &h, 2);
    }
}
#endif

#define REDUCE_DEFINE_HALF(SUF)                                                      \
    static void reduce_##SUF(const smddp__reduce_spec_t *spec, void *dst,            \
                             const void *const *srcs, int nsrc, size_t count)        \
    {                                                                                \
        float acc[REDUCE_BLOCK];                                                     \
        float tmp[REDUCE_BLOCK];                                                     \
        float p = (float)spec->premul;                                               \
        for (size_t i = 0; i < count; i += REDUCE_BLOCK) {                           \
            size_t n = SMDDP_MIN(count - i, (size_t)REDUCE_BLOCK);                   \
            size_t off = i * 2;                                                      \
            widen_##SUF(acc, (reduce_src_t)srcs[0] + off, n);                        \
            if (spec->op == SMDDP_PREMUL_SUM)                                        \
                for (size_t j = 0; j < n; j++) acc[j] = acc[j] * p;                  \
            for (int s = 1; s < nsrc; s++) {                                         \
                widen_##SUF(tmp, (reduce_src_t)srcs[s] + off, n);                    \
                step_f32(acc, (reduce_src_t)tmp, n, spec->op, p);                    \
            }                                                                        \
            finish_f32(acc, n, spec);                                                \
            narrow_##SUF((unsigned char *)dst + off, acc, n);                        \
        }                                                                            \
    }

REDUCE_DEFINE_HALF(fp16)
REDUCE_DEFINE_HALF(bf16)

/* ------------------------------------------------------------------------ */
/*
 * Integers: sums and products wrap (two's complement, like torch), computed in
 * the unsigned type U so that no signed overflow occurs; min/max compare in
 * the element type T; AVG truncates the wrapped sum towards zero, dividing in
 * D, a type wide enough for avg_div.
 */
#define REDUCE_DEFINE_INT(SUF, T, U, D)                                               \
    static inline T op_##SUF(T a, T b, smddp_op_t op)                                 \
    {                                                                                 \
        switch (op) {                                                                 \
        case SMDDP_PROD: return (T)((U)a * (U)b);                                     \
        case SMDDP_MIN: return a < b ? a : b;                                         \
        case SMDDP_MAX: return a > b ? a : b;                                         \
        case SMDDP_BAND: return (T)(a & b);                                           \
        case SMDDP_BOR: return (T)(a | b);                                            \
        case SMDDP_BXOR: return (T)(a ^ b);                                           \
        default: return (T)((U)a + (U)b);                                             \
        }                                                                             \
    }                                                                                 \
                                                                                      \
    /*                                                                                \
     * One loop per op: op_##SUF is inlined with a constant op, so each loop          \
     * body is a single vector operation.                                            \
     */                                                                               \
    static void first2_##SUF(T *restrict acc, reduce_src_t x, reduce_src_t y,         \
                             size_t n, smddp_op_t op)                                 \
    {                                                                                 \
        size_t j;                                                                     \
        switch (op) {                                                                 \
        case SMDDP_SUM:                                                               \
        case SMDDP_AVG:                                                               \
            for (j = 0; j < n; j++)                                                   \
                acc[j] = op_##SUF(ld_##SUF(x, j), ld_##SUF(y, j), SMDDP_SUM);         \
            break;                                                                    \
        case SMDDP_PROD:                                                              \
            for (j = 0; j < n; j++)                                                   \
                acc[j] = op_##SUF(ld_##SUF(x, j), ld_##SUF(y, j), SMDDP_PROD);        \
            break;                                                                    \
        case SMDDP_MIN:                                                               \
            for (j = 0; j < n; j++)                                                   \
                acc[j] = op_##SUF(ld_##SUF(x, j), ld_##SUF(y, j), SMDDP_MIN);         \
            break;                                                                    \
        case SMDDP_MAX:                                                               \
            for (j = 0; j < n; j++)                                                   \
                acc[j] = op_##SUF(ld_##SUF(x, j), ld_##SUF(y, j), SMDDP_MAX);         \
            break;                                                                    \
        case SMDDP_BAND:                                                              \
            for (j = 0; j < n; j++)                                                   \
                acc[j] = op_##SUF(ld_##SUF(x, j), ld_##SUF(y, j), SMDDP_BAND);        \
            break;                                                                    \
        case SMDDP_BOR:                                                               \
            for (j = 0; j < n; j++)                                                   \
                acc[j] = op_##SUF(ld_##SUF(x, j), ld_##SUF(y, j), SMDDP_BOR);         \
            break;                                                                    \
        case SMDDP_BXOR:                                                              \
            for (j = 0; j < n; j++)                                                   \
                acc[j] = op_##SUF(ld_##SUF(x, j), ld_##SUF(y, j), SMDDP_BXOR);        \
            break;                                                                    \
        default:                                                                      \
            break;                                                                    \
        }                                                                             \
    }                                                                                 \
                                                                                      \
    static void step_##SUF(T *restrict acc, reduce_src_t y, size_t n, smddp_op_t op)  \
    {                                                                                 \
        size_t j;                                                                     \
        switch (op) {                                                                 \
        case SMDDP_SUM:                                                               \
        case SMDDP_AVG:                                                               \
            for (j = 0; j < n; j++) acc[j] = op_##SUF(acc[j], ld_##SUF(y, j), SMDDP_SUM); \
            break;                                                                    \
        case SMDDP_PROD:                                                              \
            for (j = 0; j < n; j++) acc[j] = op_##SUF(acc[j], ld_##SUF(y, j), SMDDP_PROD); \
            break;                                                                    \
        case SMDDP_MIN:                                                               \
            for (j = 0; j < n; j++) acc[j] = op_##SUF(acc[j], ld_##SUF(y, j), SMDDP_MIN); \
            break;                                                                    \
        case SMDDP_MAX:                                                               \
            for (j = 0; j < n; j++) acc[j] = op_##SUF(acc[j], ld_##SUF(y, j), SMDDP_MAX); \
            break;                                                                    \
        case SMDDP_BAND:                                                              \
            for (j = 0; j < n; j++) acc[j] = op_##SUF(acc[j], ld_##SUF(y, j), SMDDP_BAND); \
            break;                                                                    \
        case SMDDP_BOR:                                                               \
            for (j = 0; j < n; j++) acc[j] = op_##SUF(acc[j], ld_##SUF(y, j), SMDDP_BOR); \
            break;                                                                    \
        case SMDDP_BXOR:                                                              \
            for (j = 0; j < n; j++) acc[j] = op_##SUF(acc[j], ld_##SUF(y, j), SMDDP_BXOR); \
            break;                                                                    \
        default:                                                                      \
            break;                                                                    \
        }                                                                             \
    }                                                                                 \
                                                                                      \
    static void reduce_##SUF(const smddp__reduce_spec_t *spec, void *dst,             \
                             const void *const *srcs, int nsrc, size_t count)         \
    {                                                                                 \
        T acc[REDUCE_BLOCK];                                                          \
        for (size_t i = 0; i < count; i += REDUCE_BLOCK) {                            \
            size_t n = SMDDP_MIN(count - i, (size_t)REDUCE_BLOCK);                    \
            size_t off = i * sizeof(T);                                               \
            if (nsrc >= 2)                                                            \
                first2_##SUF(acc, (reduce_src_t)srcs[0] + off,                        \
                             (reduce_src_t)srcs[1] + off, n, spec->op);               \
            else                                                                      \
                memcpy(acc, (reduce_src_t)srcs[0] + off, n * sizeof(T));              \
            for (int s = 2; s < nsrc; s++)                                            \
                step_##SUF(acc, (reduce_src_t)srcs[s] + off, n, spec->op);            \
            if (spec->op == SMDDP_AVG && spec->avg_div > 0) {                         \
                D d = (D)spec->avg_div;                                               \
                for (size_t j = 0; j < n; j++) acc[j] = (T)((D)acc[j] / d);           \
            }                                                                         \
            memcpy((unsigned char *)dst + off, acc, n * sizeof(T));                   \
        }                                                                             \
    }

REDUCE_DEFINE_INT(i8, int8_t, uint8_t, int)
REDUCE_DEFINE_INT(u8, uint8_t, uint8_t, int)
REDUCE_DEFINE_INT(i32, int32_t, uint32_t, int32_t)
REDUCE_DEFINE_INT(i64, int64_t, uint64_t, int64_t)

/* ------------------------------------------------------------------------ */

void REDUCE_ENTRY(const smddp__reduce_spec_t *spec, void *dst, const void *const *srcs,
                  int nsrc, size_t count)
{
    switch (spec->dtype) {
    case SMDDP_INT8: reduce_i8(spec, dst, srcs, nsrc, count); break;
    case SMDDP_UINT8: reduce_u8(spec, dst, srcs, nsrc, count); break;
    case SMDDP_INT32: reduce_i32(spec, dst, srcs, nsrc, count); break;
    case SMDDP_INT64: reduce_i64(spec, dst, srcs, nsrc, count); break;
    case SMDDP_FLOAT16: reduce_fp16(spec, dst, srcs, nsrc, count); break;
    case SMDDP_BFLOAT16: reduce_bf16(spec, dst, srcs, nsrc, count); break;
    case SMDDP_FLOAT32: reduce_f32(spec, dst, srcs, nsrc, count); break;
    case SMDDP_FLOAT64: reduce_f64(spec, dst, srcs, nsrc, count); break;
    default: break;
    }
}
