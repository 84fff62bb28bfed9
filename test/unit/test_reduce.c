/*
 * Tests of the CPU reduction kernels (core/reduce). Every result is checked
 * against a reference computed here in plain scalar C, combining left to
 * right in the same accumulation type as the contract says, and every
 * instruction set the CPU supports must give the same bytes as "scalar".
 * The fp16/bf16 conversions are checked exhaustively at every rounding
 * boundary, against a reference that rounds in double arithmetic, and
 * against the F16C instructions where the CPU has them.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reduce/half.h"
#include "reduce/reduce.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TEST_X86 1
#else
#define TEST_X86 0
#endif

/* ------------------------------------------------------------------------ */
/* Helpers */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    /* xorshift64*: deterministic, so a failure reproduces. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static const char *const isa_names[] = {"scalar", "avx2", "avx512"};
#define NUM_ISAS 3

static bool cpu_has_isa(int isa)
{
#if TEST_X86
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    if (isa == 1) return avx2;
    if (isa == 2)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
    return isa == 0;
}

/* Selects an ISA; false (after checking why) when the CPU or build lacks it. */
static bool use_isa(int isa)
{
    smddp_status_t st = smddp__reduce_set_isa(isa_names[isa]);
    if (st == SMDDP_ERR_NOT_SUPPORTED) {
        /* A variant may be missing from a non-x86 build, never from an x86 one. */
        assert_false(TEST_X86 && cpu_has_isa(isa));
        return false;
    }
    assert_int_equal(st, SMDDP_OK);
    assert_string_equal(smddp__reduce_isa(), isa_names[isa]);
    return true;
}

static size_t dtype_size(smddp_dtype_t dt)
{
    static const size_t sizes[] = {1, 1, 4, 8, 2, 2, 4, 8, 2, 2, 4, 8};
    return sizes[dt];
}

static bool dtype_is_float(smddp_dtype_t dt)
{
    return dt == SMDDP_FLOAT16 || dt == SMDDP_BFLOAT16 || dt == SMDDP_FLOAT32 ||
           dt == SMDDP_FLOAT64;
}

static bool dtype_is_unsigned(smddp_dtype_t dt)
{
    return dt == SMDDP_UINT8 || dt == SMDDP_UINT16 || dt == SMDDP_UINT32 || dt == SMDDP_UINT64;
}

static const char *const dtype_names[] = {"int8",  "uint8",  "int32",  "int64",
                                          "fp16",  "bf16",   "fp32",   "fp64",
                                          "int16", "uint16", "uint32", "uint64"};
static const char *const op_names[] = {"sum", "prod", "min", "max", "avg",
                                       "premul_sum", "band", "bor", "bxor"};

/* ------------------------------------------------------------------------ */
/*
 * Reference fp16/bf16 conversions, written differently from half.h: decode
 * the fields with ldexp, encode by rounding a scaled double to an integer.
 */

typedef struct half_format {
    int mant_bits; /* explicit mantissa bits */
    int emin;      /* exponent of the smallest normal */
    int emax;      /* exponent of the largest finite */
} half_format_t;

static const half_format_t FMT_FP16 = {10, -14, 15};
static const half_format_t FMT_BF16 = {7, -126, 127};

static double ref_decode(const half_format_t *f, uint16_t h)
{
    int ebits = 15 - f->mant_bits;
    int bias = (1 << (ebits - 1)) - 1;
    int sign = h >> 15;
    int exp = (h >> f->mant_bits) & ((1 << ebits) - 1);
    int mant = h & ((1 << f->mant_bits) - 1);
    double v;
    if (exp == (1 << ebits) - 1)
        v = mant ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(mant, f->emin - f->mant_bits);
    else
        v = ldexp(mant + (1 << f->mant_bits), exp - bias - f->mant_bits);
    return sign ? -v : v;
}

/* Every value of both formats, decoded once: [0] fp16, [1] bf16. */
static float ref_table[2][65536];
static bool ref_table_ready;

static const float *ref_values(int fmt)
{
    if (!ref_table_ready) {
        for (uint32_t i = 0; i < 65536; i++) {
            ref_table[0][i] = (float)ref_decode(&FMT_FP16, (uint16_t)i);
            ref_table[1][i] = (float)ref_decode(&FMT_BF16, (uint16_t)i);
        }
        ref_table_ready = true;
    }
    return ref_table[fmt];
}

/* 2^e as a double (-1022 <= e <= 1023). */
static double pow2(int e)
{
    uint64_t bits = (uint64_t)(1023 + e) << 52;
    double d;
    memcpy(&d, &bits, 8);
    return d;
}

/*
 * Rounds x (not NaN) to the format: scale |x| so that the format's ulp at
 * its exponent is 1, round to an integer with the 2^52 trick (the FPU rounds
 * to nearest even), and assemble the bits; a carry out of the mantissa and
 * overflow into the infinity encoding fall out of the addition.
 */
static uint16_t ref_encode(const half_format_t *f, float x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    int ebits = 15 - f->mant_bits;
    uint32_t inf = ((1u << ebits) - 1) << f->mant_bits;
    if (isinf(x)) return (uint16_t)(sign | inf);
    double a = fabs((double)x);
    int e = (int)((f2u(x) >> 23) & 0xff) - 127; /* floor(log2 |x|) for normal x */
    if (e < f->emin) e = f->emin;               /* subnormal grid below emin */
    double r = a / pow2(e - f->mant_bits);      /* exact: a power of two */
    volatile double big = 4503599627370496.0;   /* 2^52 */
    r = (r + big) - big;
    uint32_t bits;
    if (r == 0)
        bits = 0;
    else if (e == f->emin && r < (double)(1u << f->mant_bits))
        bits = (uint32_t)r; /* subnormal */
    else
        bits = ((uint32_t)(e + (1 << (ebits - 1)) - 1) << f->mant_bits) +
               (uint32_t)r - (1u << f->mant_bits);
    if (bits > inf) bits = inf;
    return (uint16_t)(sign | bits);
}

static float ref_fp16_to_f32(uint16_t h) { return ref_values(0)[h]; }
static float ref_bf16_to_f32(uint16_t h) { return ref_values(1)[h]; }
static uint16_t ref_f32_to_fp16(float x)
{
    if (isnan(x)) return 0x7e00;
    return ref_encode(&FMT_FP16, x);
}
static uint16_t ref_f32_to_bf16(float x)
{
    if (isnan(x)) return 0x7fc0;
    return ref_encode(&FMT_BF16, x);
}

static bool fp16_is_nan(uint16_t h) { return (h & 0x7fff) > 0x7c00; }
static bool bf16_is_nan(uint16_t h) { return (h & 0x7fff) > 0x7f80; }

/* ------------------------------------------------------------------------ */
/* Conversion tests */

/* All 65536 fp16 values: widen exactly, and narrow back to the same bits. */
static void test_fp16_roundtrip_exhaustive(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = smddp__fp16_to_fp32(h);
        uint16_t back = smddp__fp32_to_fp16(f);
        if (fp16_is_nan(h)) {
            if (!isnan(f) || back != (h | 0x0200))
                fail_msg("fp16 NaN %04x -> %08x -> %04x", h, f2u(f), back);
            /* Quiet NaN, same sign and payload. */
            assert_int_equal(f2u(f), ((uint32_t)(h & 0x8000) << 16) | 0x7fc00000u |
                                         ((uint32_t)(h & 0x3ff) << 13));
        } else {
            if (f2u(f) != f2u(ref_fp16_to_f32(h)) || back != h)
                fail_msg("fp16 %04x -> %08x (want %08x) -> %04x", h, f2u(f),
                         f2u(ref_fp16_to_f32(h)), back);
        }
    }
}

/* bf16 widening is a shift; narrowing a widened value gives it back. */
static void test_bf16_roundtrip_exhaustive(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = smddp__bf16_to_fp32(h);
        assert_int_equal(f2u(f), (uint32_t)h << 16);
        uint16_t back = smddp__fp32_to_bf16(f);
        if (bf16_is_nan(h)) {
            assert_true(bf16_is_nan(back));
            assert_int_equal(back, h | 0x0040);
        } else {
            if (f2u(f) != f2u(ref_bf16_to_f32(h)) || back != h)
                fail_msg("bf16 %04x -> %08x -> %04x", h, f2u(f), back);
        }
    }
}

typedef uint16_t (*narrow_fn_t)(float);
typedef float (*widen_fn_t)(uint16_t);

/*
 * For every pair of neighbouring finite values lo < hi of the format: the
 * midpoint rounds to the even one, one fp32 ulp either side rounds to the
 * nearer one. The midpoint past the largest finite value must give infinity.
 * Covers every tie, every subnormal and the overflow threshold.
 */
static void check_boundaries(const char *name, narrow_fn_t narrow, narrow_fn_t ref,
                             widen_fn_t widen, uint16_t max_finite, uint16_t inf)
{
    for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
        for (uint32_t m = 0; m <= max_finite; m++) {
            uint16_t lo = (uint16_t)(sign | m);
            float vlo = widen(lo);
            double vhi; /* in double: 2^128 is past FLT_MAX */
            uint16_t hi;
            if (m == max_finite) {
                /* The next "value" is 2^(emax+1): lo + one ulp. */
                hi = (uint16_t)(sign | inf);
                vhi = (double)vlo + ((double)vlo - widen((uint16_t)(lo - 1)));
            } else {
                hi = (uint16_t)(lo + 1);
                vhi = widen(hi);
            }
            /* Exact in fp32: one bit more than the format's precision. */
            float mid = (float)(((double)vlo + vhi) / 2);
            float below = nextafterf(mid, vlo);
            float above = nextafterf(mid, (float)vhi);
            uint16_t even = (m & 1) ? hi : lo; /* the largest finite is odd: to inf */
            const float xs[] = {vlo, below, mid, above};
            const uint16_t want[] = {lo, lo, even, hi};
            for (int k = 0; k < 4; k++) {
                uint16_t got = narrow(xs[k]);
                if (got != want[k] || ref(xs[k]) != want[k])
                    fail_msg("%s(%a = %08x) = %04x, reference %04x, want %04x", name,
                             (double)xs[k], f2u(xs[k]), got, ref(xs[k]), want[k]);
            }
        }
    }
}

static void test_half_rounding_boundaries(void **state)
{
    (void)state;
    check_boundaries("fp32_to_fp16", smddp__fp32_to_fp16, ref_f32_to_fp16,
                     smddp__fp16_to_fp32, 0x7bff, 0x7c00);
    check_boundaries("fp32_to_bf16", smddp__fp32_to_bf16, ref_f32_to_bf16,
                     smddp__bf16_to_fp32, 0x7f7f, 0x7f80);
}

static void test_half_special_values(void **state)
{
    (void)state;
    static const struct {
        uint32_t in;
        uint16_t fp16, bf16;
    } cases[] = {
        {0x00000000, 0x0000, 0x0000}, /* +0 */
        {0x80000000, 0x8000, 0x8000}, /* -0 */
        {0x3f800000, 0x3c00, 0x3f80}, /* 1 */
        {0x477fe000, 0x7bff, 0x4780}, /* 65504, fp16 max */
        {0x477fefff, 0x7bff, 0x4780}, /* just below 65520 */
        {0x477ff000, 0x7c00, 0x4780}, /* 65520: tie, rounds to inf */
        {0x501502f9, 0x7c00, 0x5015}, /* 1e10 */
        {0x7f7fffff, 0x7c00, 0x7f80}, /* FLT_MAX: bf16 overflows too */
        {0x7f7f8000, 0x7c00, 0x7f80}, /* bf16 tie at the top: 0x7f7f is odd */
        {0x7f7f7fff, 0x7c00, 0x7f7f},
        {0x7f800000, 0x7c00, 0x7f80}, /* +inf */
        {0xff800000, 0xfc00, 0xff80}, /* -inf */
        {0x7fc00000, 0x7e00, 0x7fc0}, /* qNaN */
        {0x7f800001, 0x7e00, 0x7fc0}, /* sNaN gets quieted */
        {0xffa00000, 0xff00, 0xffe0}, /* negative NaN with payload */
        {0x33800000, 0x0001, 0x3380}, /* 2^-24: smallest fp16 subnormal */
        {0x33000000, 0x0000, 0x3300}, /* 2^-25: tie, rounds to even 0 */
        {0x33000001, 0x0001, 0x3300}, /* just above: rounds up */
        {0x33c00000, 0x0002, 0x33c0}, /* 1.5 * 2^-24: tie, rounds to 2 */
        {0x38800000, 0x0400, 0x3880}, /* 2^-14: smallest fp16 normal */
        {0x387fc000, 0x03ff, 0x3880}, /* largest fp16 subnormal */
        {0x387fe000, 0x0400, 0x3880}, /* largest subnormal + half ulp: to normal */
        {0x3f808000, 0x3c04, 0x3f80}, /* 1 + 2^-8: bf16 tie, to even */
        {0x3f818000, 0x3c0c, 0x3f82}, /* 1 + 3 * 2^-8: bf16 tie, up */
        {0x3f800fff, 0x3c00, 0x3f80},
        {0x3f801000, 0x3c00, 0x3f80}, /* 1 + 2^-11: fp16 tie, to even */
        {0x3f803000, 0x3c02, 0x3f80}, /* 1 + 3 * 2^-11: fp16 tie, up */
        {0x00000001, 0x0000, 0x0000}, /* fp32 subnormals */
        {0x00008000, 0x0000, 0x0000}, /* bf16 tie, to even 0 */
        {0x00018000, 0x0000, 0x0002}, /* bf16 tie, to even 2 */
        {0x007fffff, 0x0000, 0x0080}, /* largest fp32 subnormal -> smallest normal */
        {0x80010000, 0x8000, 0x8001}, /* negative bf16 subnormal */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        float x = u2f(cases[i].in);
        uint16_t h = smddp__fp32_to_fp16(x);
        uint16_t b = smddp__fp32_to_bf16(x);
        if (h != cases[i].fp16 || b != cases[i].bf16)
            fail_msg("%08x: fp16 %04x (want %04x), bf16 %04x (want %04x)", cases[i].in, h,
                     cases[i].fp16, b, cases[i].bf16);
    }
    /* Widening specials. */
    assert_int_equal(f2u(smddp__fp16_to_fp32(0x0001)), 0x33800000u);
    assert_int_equal(f2u(smddp__fp16_to_fp32(0x83ff)), 0xb87fc000u);
    assert_int_equal(f2u(smddp__fp16_to_fp32(0xfc00)), 0xff800000u);
    assert_int_equal(f2u(smddp__fp16_to_fp32(0x7c01)), 0x7fc02000u);
    assert_int_equal(f2u(smddp__bf16_to_fp32(0x0001)), 0x00010000u);
}

#if TEST_X86
__attribute__((target("avx,f16c"))) static void f16c_widen8(const uint16_t *in, uint32_t *out)
{
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)in));
    _mm256_storeu_ps((float *)out, v);
}

__attribute__((target("avx,f16c"))) static void f16c_narrow8(const uint32_t *in, uint16_t *out)
{
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps((const float *)in), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128((__m128i *)out, h);
}
#endif

/*
 * The portable conversions against the F16C instructions, bit for bit and
 * NaNs included: all fp16 values widened; random fp32 patterns, every fp16
 * value and its midpoints narrowed.
 */
static void test_half_vs_f16c(void **state)
{
    (void)state;
#if TEST_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("f16c") || !__builtin_cpu_supports("avx")) {
        skip();
        return;
    }
    for (uint32_t i = 0; i < 65536; i += 8) {
        uint16_t h[8];
        uint32_t hw[8];
        for (int k = 0; k < 8; k++) h[k] = (uint16_t)(i + (uint32_t)k);
        f16c_widen8(h, hw);
        for (int k = 0; k < 8; k++)
            if (f2u(smddp__fp16_to_fp32(h[k])) != hw[k])
                fail_msg("widen %04x: portable %08x, F16C %08x", h[k],
                         f2u(smddp__fp16_to_fp32(h[k])), hw[k]);
    }
    const int nrand = 1 << 20;
    for (int i = 0; i < nrand + 3 * 65536; i += 8) {
        uint32_t in[8];
        uint16_t hw[8];
        for (int k = 0; k < 8; k++) {
            int idx = i + k;
            if (idx < nrand) {
                in[k] = (uint32_t)rnd();
                /* Half of them in or near fp16's range, where rounding happens. */
                if (idx & 1) in[k] = (in[k] & 0x87ffffffu) | 0x30000000u;
            } else {
                int j = (idx - nrand) / 3;
                float v = smddp__fp16_to_fp32((uint16_t)j);
                float w = smddp__fp16_to_fp32((uint16_t)(j + 1));
                float mid = (v + w) / 2;
                int which = (idx - nrand) % 3;
                in[k] = which == 0 ? f2u(v) : which == 1 ? f2u(mid) : f2u(mid) + 1;
            }
        }
        f16c_narrow8(in, hw);
        for (int k = 0; k < 8; k++)
            if (smddp__fp32_to_fp16(u2f(in[k])) != hw[k])
                fail_msg("narrow %08x: portable %04x, F16C %04x", in[k],
                         smddp__fp32_to_fp16(u2f(in[k])), hw[k]);
    }
#else
    skip();
#endif
}

/* ------------------------------------------------------------------------ */
/* The reference reduction: one element at a time, left to right. */

typedef struct rcase {
    smddp_dtype_t dtype;
    smddp_op_t op;
    int nsrc;
    size_t count;
    double premul;
    int avg_div;
} rcase_t;

static int64_t get_int(smddp_dtype_t dt, const unsigned char *p, size_t i)
{
    switch (dt) {
    case SMDDP_INT8: { int8_t v; memcpy(&v, p + i, 1); return v; }
    case SMDDP_UINT8: { uint8_t v; memcpy(&v, p + i, 1); return v; }
    case SMDDP_INT16: { int16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case SMDDP_UINT16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case SMDDP_INT32: { int32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case SMDDP_UINT32: { uint32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    default: { int64_t v; memcpy(&v, p + 8 * i, 8); return v; } /* uint64: its bits */
    }
}

/* Stores the low bits of v, which is how wrapping arithmetic ends. */
static void put_int(smddp_dtype_t dt, unsigned char *p, size_t i, uint64_t v)
{
    switch (dt) {
    case SMDDP_INT8:
    case SMDDP_UINT8: { uint8_t b = (uint8_t)v; memcpy(p + i, &b, 1); break; }
    case SMDDP_INT16:
    case SMDDP_UINT16: { uint16_t h = (uint16_t)v; memcpy(p + 2 * i, &h, 2); break; }
    case SMDDP_INT32:
    case SMDDP_UINT32: { uint32_t w = (uint32_t)v; memcpy(p + 4 * i, &w, 4); break; }
    default: memcpy(p + 8 * i, &v, 8); break;
    }
}

static float get_f32(smddp_dtype_t dt, const unsigned char *p, size_t i)
{
    uint16_t h;
    float f;
    switch (dt) {
    case SMDDP_FLOAT16: memcpy(&h, p + 2 * i, 2); return ref_fp16_to_f32(h);
    case SMDDP_BFLOAT16: memcpy(&h, p + 2 * i, 2); return ref_bf16_to_f32(h);
    default: memcpy(&f, p + 4 * i, 4); return f;
    }
}

static void put_f32(smddp_dtype_t dt, unsigned char *p, size_t i, float f)
{
    uint16_t h;
    switch (dt) {
    case SMDDP_FLOAT16: h = ref_f32_to_fp16(f); memcpy(p + 2 * i, &h, 2); break;
    case SMDDP_BFLOAT16: h = ref_f32_to_bf16(f); memcpy(p + 2 * i, &h, 2); break;
    default: memcpy(p + 4 * i, &f, 4); break;
    }
}

/*
 * NaN wins; equal operands (only +0 and -0 differ) give the later one, b:
 * min(+0, -0) = -0, min(-0, +0) = +0.
 */
static float ref_minf(float a, float b)
{
    return isnan(a) || isnan(b) ? NAN : a == b ? b : fminf(a, b);
}
static float ref_maxf(float a, float b)
{
    return isnan(a) || isnan(b) ? NAN : a == b ? b : fmaxf(a, b);
}
static double ref_min(double a, double b)
{
    return isnan(a) || isnan(b) ? NAN : a == b ? b : fmin(a, b);
}
static double ref_max(double a, double b)
{
    return isnan(a) || isnan(b) ? NAN : a == b ? b : fmax(a, b);
}

/*
 * The contract: left to right in the accumulation type; a NaN result is the
 * canonical quiet NaN, except that one source without a unary part (premul,
 * avg division) is copied bit for bit.
 */
static void reference(const rcase_t *c, unsigned char *dst, unsigned char *const *srcs)
{
    smddp_dtype_t dt = c->dtype;
    if (c->nsrc == 1 && c->op != SMDDP_PREMUL_SUM && !(c->op == SMDDP_AVG && c->avg_div > 0)) {
        memcpy(dst, srcs[0], c->count * dtype_size(dt));
        return;
    }
    for (size_t i = 0; i < c->count; i++) {
        if (!dtype_is_float(dt)) {
            /* Unsigned values compare as unsigned (uint64's top bit is not a sign). */
            bool uns = dtype_is_unsigned(dt);
            int64_t acc = get_int(dt, srcs[0], i);
            for (int s = 1; s < c->nsrc; s++) {
                int64_t x = get_int(dt, srcs[s], i);
                bool less = uns ? (uint64_t)x < (uint64_t)acc : x < acc;
                bool more = uns ? (uint64_t)x > (uint64_t)acc : x > acc;
                uint64_t r;
                switch (c->op) {
                case SMDDP_PROD: r = (uint64_t)acc * (uint64_t)x; break;
                case SMDDP_MIN: r = (uint64_t)(less ? x : acc); break;
                case SMDDP_MAX: r = (uint64_t)(more ? x : acc); break;
                case SMDDP_BAND: r = (uint64_t)(acc & x); break;
                case SMDDP_BOR: r = (uint64_t)(acc | x); break;
                case SMDDP_BXOR: r = (uint64_t)(acc ^ x); break;
                default: r = (uint64_t)acc + (uint64_t)x; break;
                }
                /* Wrap to the element type after every step. */
                unsigned char tmp[8];
                put_int(dt, tmp, 0, r);
                acc = get_int(dt, tmp, 0);
            }
            if (c->op == SMDDP_AVG && c->avg_div > 0)
                acc = uns ? (int64_t)((uint64_t)acc / (uint64_t)c->avg_div) : acc / c->avg_div;
            put_int(dt, dst, i, (uint64_t)acc);
        } else if (dt == SMDDP_FLOAT64) {
            double p = c->premul, acc, x;
            memcpy(&acc, srcs[0] + 8 * i, 8);
            if (c->op == SMDDP_PREMUL_SUM) acc = acc * p;
            for (int s = 1; s < c->nsrc; s++) {
                memcpy(&x, srcs[s] + 8 * i, 8);
                switch (c->op) {
                case SMDDP_PROD: acc = acc * x; break;
                case SMDDP_MIN: acc = ref_min(acc, x); break;
                case SMDDP_MAX: acc = ref_max(acc, x); break;
                case SMDDP_PREMUL_SUM: acc = acc + x * p; break;
                default: acc = acc + x; break;
                }
            }
            if (c->op == SMDDP_AVG && c->avg_div > 0) acc = acc / (double)c->avg_div;
            if (isnan(acc)) acc = NAN;
            memcpy(dst + 8 * i, &acc, 8);
        } else {
            float p = (float)c->premul;
            float acc = get_f32(dt, srcs[0], i);
            if (c->op == SMDDP_PREMUL_SUM) acc = acc * p;
            for (int s = 1; s < c->nsrc; s++) {
                float x = get_f32(dt, srcs[s], i);
                switch (c->op) {
                case SMDDP_PROD: acc = acc * x; break;
                case SMDDP_MIN: acc = ref_minf(acc, x); break;
                case SMDDP_MAX: acc = ref_maxf(acc, x); break;
                case SMDDP_PREMUL_SUM: acc = acc + x * p; break;
                default: acc = acc + x; break;
                }
            }
            if (c->op == SMDDP_AVG && c->avg_div > 0) acc = acc / (float)c->avg_div;
            if (isnan(acc)) acc = NAN;
            put_f32(dt, dst, i, acc);
        }
    }
}

static void describe(const rcase_t *c, const char *isa, const char *what, char *buf,
                     size_t cap)
{
    snprintf(buf, cap, "%s %s nsrc=%d count=%zu isa=%s %s", dtype_names[c->dtype],
             op_names[c->op], c->nsrc, c->count, isa, what);
}

static void hex_elem(smddp_dtype_t dt, const unsigned char *p, size_t i, char *out)
{
    size_t sz = dtype_size(dt);
    out[0] = '\0';
    for (size_t k = sz; k-- > 0;) sprintf(out + strlen(out), "%02x", p[i * sz + k]);
}

/* Bit for bit, NaNs included. */
static void check_equal(const rcase_t *c, const char *isa, const char *what,
                        const unsigned char *got, const unsigned char *want)
{
    size_t sz = dtype_size(c->dtype);
    if (memcmp(got, want, c->count * sz) == 0) return;
    for (size_t i = 0; i < c->count; i++) {
        if (memcmp(got + i * sz, want + i * sz, sz) == 0) continue;
        char desc[256], g[20], w[20];
        describe(c, isa, what, desc, sizeof(desc));
        hex_elem(c->dtype, got, i, g);
        hex_elem(c->dtype, want, i, w);
        fail_msg("%s: element %zu is 0x%s, want 0x%s", desc, i, g, w);
    }
}

/* ------------------------------------------------------------------------ */
/* Inputs */

/* Random float values with many significant bits and spread exponents. */
static double rnd_float(smddp_op_t op, bool wide)
{
    if (op == SMDDP_PROD) /* near 1, so products of 8 stay finite but round */
        return 1.0 + ((double)(int64_t)(rnd() % 4001) - 2000) / 4096.0;
    int64_t m = (int64_t)(rnd() >> (wide ? 11 : 40)) - (wide ? (1ll << 52) : (1ll << 23));
    int e = (int)(rnd() % 16) - (wide ? 56 : 26);
    return (double)m * pow2(e);
}

static void fill(smddp_dtype_t dt, smddp_op_t op, unsigned char *p, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        switch (dt) {
        case SMDDP_FLOAT64: {
            double v = rnd_float(op, true);
            memcpy(p + 8 * i, &v, 8);
            break;
        }
        case SMDDP_FLOAT32:
        case SMDDP_FLOAT16:
        case SMDDP_BFLOAT16:
            put_f32(dt, p, i, (float)rnd_float(op, false));
            break;
        default: {
            uint64_t v = rnd();
            /* Products of full-width random integers are mostly zero bits. */
            if (op == SMDDP_PROD) v = (v & 7) - 3;
            put_int(dt, p, i, v);
            break;
        }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* The runner */

/*
 * Buffers reused from case to case: fresh multi-megabyte allocations cost
 * more in page faults than the kernels take to run. Slot ranges below.
 */
enum { SLOT_INPUT = 0, SLOT_SRC = 64, SLOT_WANT = 128, SLOT_SCALAR, SLOT_OUT, NUM_SLOTS };
static unsigned char *scratch_buf[NUM_SLOTS];
static size_t scratch_cap[NUM_SLOTS];

/* A buffer of at least bytes + 64, valid until the slot is asked for again. */
static unsigned char *scratch(int slot, size_t bytes)
{
    if (scratch_cap[slot] < bytes + 64) {
        free(scratch_buf[slot]);
        scratch_cap[slot] = bytes + 64;
        scratch_buf[slot] = malloc(scratch_cap[slot]);
        assert_non_null(scratch_buf[slot]);
    }
    return scratch_buf[slot];
}

static void scratch_free(void)
{
    for (int i = 0; i < NUM_SLOTS; i++) {
        free(scratch_buf[i]);
        scratch_buf[i] = NULL;
        scratch_cap[i] = 0;
    }
}

/* Where the buffers of a run sit; a case runs in one or more layouts. */
enum {
    RUN_ALIGNED = 1,
    RUN_UNALIGNED = 2,     /* sources and dst start 1..3 bytes past malloc's alignment */
    RUN_INPLACE_FIRST = 4, /* dst = srcs[0], unaligned */
    RUN_INPLACE_LAST = 8,  /* dst = srcs[nsrc - 1], aligned */
};

/*
 * Runs one layout under every ISA the CPU has: checks each result against
 * the reference want and against the scalar result, bit for bit.
 */
static void run_layout(const rcase_t *c, unsigned layout, unsigned char *const *inputs,
                       const unsigned char *want)
{
    size_t bytes = c->count * dtype_size(c->dtype);
    bool misalign = layout & (RUN_UNALIGNED | RUN_INPLACE_FIRST);
    unsigned char *srcs[64];
    for (int s = 0; s < c->nsrc; s++) {
        srcs[s] = scratch(SLOT_SRC + s, bytes) + (misalign ? 1 + s % 3 : 0);
        memcpy(srcs[s], inputs[s], bytes);
    }
    unsigned char *scalar = scratch(SLOT_SCALAR, bytes);
    unsigned char *out = scratch(SLOT_OUT, bytes) + (misalign ? 3 : 0);
    int inplace = layout == RUN_INPLACE_FIRST ? 0 : layout == RUN_INPLACE_LAST ? c->nsrc - 1 : -1;
    const char *what = layout == RUN_INPLACE_FIRST ? "in place (dst = srcs[0])"
                       : layout == RUN_INPLACE_LAST ? "in place (dst = srcs[last])"
                       : misalign ? "unaligned" : "aligned";
    smddp__reduce_spec_t spec = {c->dtype, c->op, c->premul, c->avg_div};
    bool have_scalar = false;
    for (int isa = 0; isa < NUM_ISAS; isa++) {
        if (!use_isa(isa)) continue;
        unsigned char *dst = out;
        if (inplace >= 0) {
            memcpy(srcs[inplace], inputs[inplace], bytes);
            dst = srcs[inplace];
        } else {
            memset(dst, 0xa5, bytes);
        }
        smddp__reduce(&spec, dst, (const void *const *)srcs, c->nsrc, c->count);
        check_equal(c, isa_names[isa], what, dst, want);
        if (isa == 0) {
            memcpy(scalar, dst, bytes);
            have_scalar = true;
        } else if (have_scalar) {
            check_equal(c, isa_names[isa], "vs scalar", dst, scalar);
        }
    }
    assert_int_equal(smddp__reduce_set_isa("auto"), SMDDP_OK);
}

/*
 * Runs a case in each of the layouts: the sources are inputs, or random
 * values when inputs is NULL; the reference is computed once.
 */
static void run_case_inputs(const rcase_t *c, unsigned layouts, unsigned char *const *inputs)
{
    size_t bytes = c->count * dtype_size(c->dtype);
    unsigned char *own[64];
    assert_true(c->nsrc >= 1 && c->nsrc <= 64);
    if (!inputs) {
        for (int s = 0; s < c->nsrc; s++) {
            own[s] = scratch(SLOT_INPUT + s, bytes);
            fill(c->dtype, c->op, own[s], c->count);
        }
        inputs = own;
    }
    unsigned char *want = scratch(SLOT_WANT, bytes);
    reference(c, want, inputs);
    for (unsigned layout = 1; layout <= RUN_INPLACE_LAST; layout <<= 1)
        if (layouts & layout) run_layout(c, layout, inputs, want);
}

static void run_case(const rcase_t *c, unsigned layouts) { run_case_inputs(c, layouts, NULL); }

static const smddp_op_t all_ops[] = {SMDDP_SUM,        SMDDP_PROD, SMDDP_MIN, SMDDP_MAX,
                                     SMDDP_AVG,        SMDDP_PREMUL_SUM, SMDDP_BAND,
                                     SMDDP_BOR,        SMDDP_BXOR};

/* Every valid op x sizes 0, 1, 7, 4097, ~1M x nsrc 1, 2, 3, 4, 8. */
static void run_dtype_matrix(smddp_dtype_t dt)
{
    static const size_t sizes[] = {0, 1, 7, 4097, (1u << 20) + 3};
    static const int nsrcs[] = {1, 2, 3, 4, 8};
    for (size_t o = 0; o < sizeof(all_ops) / sizeof(all_ops[0]); o++) {
        smddp_op_t op = all_ops[o];
        if (!smddp__reduce_valid(dt, op)) continue;
        for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
            for (size_t k = 0; k < sizeof(nsrcs) / sizeof(nsrcs[0]); k++) {
                int nsrc = nsrcs[k];
                bool large = sizes[z] > 100000;
                /*
                 * Large counts: nsrc 1, 2 and 8 cover the unary, the fused
                 * two-source and the accumulating passes; 3 and 4 take the
                 * same passes as 8 and only cost time.
                 */
                if (large && nsrc != 1 && nsrc != 2 && nsrc != 8) continue;
                rcase_t c = {dt, op, nsrc, sizes[z], 0.3, nsrc};
                unsigned layouts = RUN_UNALIGNED;
                if (!large) layouts |= RUN_ALIGNED;
                if (sizes[z] == 4097 || (large && nsrc == 2))
                    layouts |= RUN_INPLACE_FIRST | RUN_INPLACE_LAST;
                run_case(&c, layouts);
            }
        }
    }
}

static void test_matrix_int8(void **state) { (void)state; run_dtype_matrix(SMDDP_INT8); }
static void test_matrix_uint8(void **state) { (void)state; run_dtype_matrix(SMDDP_UINT8); }
static void test_matrix_int32(void **state) { (void)state; run_dtype_matrix(SMDDP_INT32); }
static void test_matrix_int64(void **state) { (void)state; run_dtype_matrix(SMDDP_INT64); }
static void test_matrix_fp16(void **state) { (void)state; run_dtype_matrix(SMDDP_FLOAT16); }
static void test_matrix_bf16(void **state) { (void)state; run_dtype_matrix(SMDDP_BFLOAT16); }
static void test_matrix_fp32(void **state) { (void)state; run_dtype_matrix(SMDDP_FLOAT32); }
static void test_matrix_fp64(void **state) { (void)state; run_dtype_matrix(SMDDP_FLOAT64); }
static void test_matrix_int16(void **state) { (void)state; run_dtype_matrix(SMDDP_INT16); }
static void test_matrix_uint16(void **state) { (void)state; run_dtype_matrix(SMDDP_UINT16); }
static void test_matrix_uint32(void **state) { (void)state; run_dtype_matrix(SMDDP_UINT32); }
static void test_matrix_uint64(void **state) { (void)state; run_dtype_matrix(SMDDP_UINT64); }

/* AVG without a divisor (a partial step) is a plain sum; other divisors and premuls. */
static void test_avg_premul_variants(void **state)
{
    (void)state;
    for (int dt = 0; dt < SMDDP_DTYPE_COUNT; dt++) {
        for (int div = 0; div <= 7; div += 7) {
            for (int nsrc = 1; nsrc <= 3; nsrc++) {
                rcase_t c = {(smddp_dtype_t)dt, SMDDP_AVG, nsrc, 1031, 1.0, div};
                run_case(&c, RUN_UNALIGNED);
            }
        }
        if (!dtype_is_float((smddp_dtype_t)dt)) continue;
        static const double premuls[] = {1.0, 0.0, -2.5, 1.0 / 3.0, 1e-3};
        for (size_t k = 0; k < sizeof(premuls) / sizeof(premuls[0]); k++) {
            for (int nsrc = 1; nsrc <= 3; nsrc++) {
                rcase_t c = {(smddp_dtype_t)dt, SMDDP_PREMUL_SUM, nsrc, 1031, premuls[k], 0};
                run_case(&c, RUN_ALIGNED);
            }
        }
    }
}

/* 64 sources, odd size: every step loop and block boundary. */
static void test_many_sources(void **state)
{
    (void)state;
    for (int dt = 0; dt < SMDDP_DTYPE_COUNT; dt++) {
        for (size_t o = 0; o < sizeof(all_ops) / sizeof(all_ops[0]); o++) {
            if (!smddp__reduce_valid((smddp_dtype_t)dt, all_ops[o])) continue;
            rcase_t c = {(smddp_dtype_t)dt, all_ops[o], 64, 2053, 0.125, 64};
            run_case(&c, RUN_UNALIGNED | RUN_INPLACE_LAST);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Targeted semantics */

static void reduce2(smddp_dtype_t dt, smddp_op_t op, void *dst, const void *a, const void *b,
                    size_t count)
{
    smddp__reduce_spec_t spec = {dt, op, 1.0, 0};
    const void *srcs[2] = {a, b};
    smddp__reduce(&spec, dst, srcs, 2, count);
}

static void test_int_wraparound(void **state)
{
    (void)state;
    for (int isa = 0; isa < NUM_ISAS; isa++) {
        if (!use_isa(isa)) continue;
        int8_t a8[3] = {127, -128, 100}, b8[3] = {1, -1, 100}, r8[3];
        reduce2(SMDDP_INT8, SMDDP_SUM, r8, a8, b8, 3);
        assert_int_equal(r8[0], -128);
        assert_int_equal(r8[1], 127);
        assert_int_equal(r8[2], -56);
        reduce2(SMDDP_INT8, SMDDP_PROD, r8, a8, b8, 3);
        assert_int_equal(r8[0], 127);
        assert_int_equal(r8[1], -128); /* -128 * -1 wraps to -128 */
        assert_int_equal(r8[2], 16);   /* 10000 mod 256 */
        uint8_t au[2] = {255, 16}, bu[2] = {1, 16}, ru[2];
        reduce2(SMDDP_UINT8, SMDDP_SUM, ru, au, bu, 2);
        assert_int_equal(ru[0], 0);
        assert_int_equal(ru[1], 32);
        reduce2(SMDDP_UINT8, SMDDP_PROD, ru, au, bu, 2);
        assert_int_equal(ru[0], 255);
        assert_int_equal(ru[1], 0);
        reduce2(SMDDP_UINT8, SMDDP_MAX, ru, au, bu, 2);
        assert_int_equal(ru[0], 255); /* unsigned compare */
        int32_t a32[3] = {INT32_MAX, INT32_MIN, 65536}, b32[3] = {1, -1, 65536}, r32[3];
        reduce2(SMDDP_INT32, SMDDP_SUM, r32, a32, b32, 3);
        assert_int_equal(r32[0], INT32_MIN);
        assert_int_equal(r32[1], INT32_MAX);
        assert_int_equal(r32[2], 131072);
        reduce2(SMDDP_INT32, SMDDP_PROD, r32, a32, b32, 3);
        assert_int_equal(r32[0], INT32_MAX);
        assert_int_equal(r32[1], INT32_MIN);
        assert_int_equal(r32[2], 0);
        int64_t a64[2] = {INT64_MAX, INT64_MIN}, b64[2] = {1, -1}, r64[2];
        reduce2(SMDDP_INT64, SMDDP_SUM, r64, a64, b64, 2);
        assert_true(r64[0] == INT64_MIN);
        assert_true(r64[1] == INT64_MAX);
        reduce2(SMDDP_INT64, SMDDP_MIN, r64, a64, b64, 2);
        assert_true(r64[0] == 1 && r64[1] == INT64_MIN);

        /* AVG truncates the wrapped sum towards zero. */
        smddp__reduce_spec_t avg = {SMDDP_INT8, SMDDP_AVG, 1.0, 2};
        const void *s8[2] = {a8, b8};
        reduce2(SMDDP_INT8, SMDDP_SUM, r8, a8, b8, 3);
        smddp__reduce(&avg, r8, s8, 2, 3);
        assert_int_equal(r8[0], -64);
        assert_int_equal(r8[1], 63);
        assert_int_equal(r8[2], -28);
        int32_t m7[1] = {-7}, z[1] = {0}, rr[1];
        smddp__reduce_spec_t avg32 = {SMDDP_INT32, SMDDP_AVG, 1.0, 2};
        const void *s32[2] = {m7, z};
        smddp__reduce(&avg32, rr, s32, 2, 1);
        assert_int_equal(rr[0], -3);
        /* A divisor larger than the type's range. */
        uint8_t big[1] = {250}, one[1] = {5}, rb[1];
        smddp__reduce_spec_t avg8 = {SMDDP_UINT8, SMDDP_AVG, 1.0, 300};
        const void *sb[2] = {big, one};
        smddp__reduce(&avg8, rb, sb, 2, 1);
        assert_int_equal(rb[0], 0);
        avg8.avg_div = 1;
        smddp__reduce(&avg8, rb, sb, 2, 1);
        assert_int_equal(rb[0], 255);
    }
    assert_int_equal(smddp__reduce_set_isa("auto"), SMDDP_OK);
}

/*
 * NaN anywhere among the inputs makes min/max NaN, at every position of a
 * vector (37 elements covers several vectors and a tail), whichever source
 * holds it. Also checks infinities and that NaN does not leak sideways.
 */
static void test_minmax_nan(void **state)
{
    (void)state;
    enum { N = 37, NSRC = 3 };
    static const smddp_dtype_t dts[] = {SMDDP_FLOAT16, SMDDP_BFLOAT16, SMDDP_FLOAT32,
                                        SMDDP_FLOAT64};
    for (size_t d = 0; d < 4; d++) {
        smddp_dtype_t dt = dts[d];
        for (int nan_src = 0; nan_src < NSRC; nan_src++) {
            unsigned char in[NSRC][N * 8];
            unsigned char *ins[NSRC];
            for (int s = 0; s < NSRC; s++) {
                ins[s] = in[s];
                for (size_t i = 0; i < N; i++) {
                    double v = (double)((int)(i * 7 + (size_t)s * 3) % 11) - 5.0;
                    if (i % 5 == 1 && s == nan_src) v = NAN;
                    if (i % 5 == 3) v = s == nan_src ? INFINITY : -INFINITY;
                    if (dt == SMDDP_FLOAT64)
                        memcpy(in[s] + 8 * i, &v, 8);
                    else
                        put_f32(dt, in[s], i, (float)v);
                }
            }
            for (smddp_op_t op = SMDDP_MIN; op <= SMDDP_MAX; op++) {
                for (int nsrc = 2; nsrc <= NSRC; nsrc++) {
                    if (nan_src >= nsrc) continue;
                    rcase_t c = {dt, op, nsrc, N, 1.0, 0};
                    run_case_inputs(&c, RUN_ALIGNED | RUN_UNALIGNED, ins);
                    /* The reference itself: NaN exactly where planted. */
                    unsigned char want[N * 8];
                    reference(&c, want, ins);
                    for (size_t i = 0; i < N; i++) {
                        double v;
                        if (dt == SMDDP_FLOAT64)
                            memcpy(&v, want + 8 * i, 8);
                        else
                            v = get_f32(dt, want, i);
                        assert_int_equal(isnan(v) != 0, i % 5 == 1);
                        if (i % 5 == 3) assert_true(isinf(v));
                    }
                }
            }
        }
    }
}

/*
 * Special values (NaN with payloads, inf, -0, subnormals, huge) through every
 * float op: every ISA must give the reference's bits, NaN results being the
 * canonical NaN whatever NaNs went in.
 */
static void test_float_specials(void **state)
{
    (void)state;
    static const uint32_t f32s[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000,
                                    0x7fc00000, 0x00000001, 0x807fffff, 0x7f7fffff,
                                    0x3f800000, 0xbf800000, 0x38800000, 0x33800000,
                                    0x477ff000, 0x3f808000, 0x00800000, 0x1e3ce508,
                                    0xffa00001, 0x7fc12345};
    enum { NSPEC = sizeof(f32s) / sizeof(f32s[0]), N = NSPEC * NSPEC };
    static const smddp_dtype_t dts[] = {SMDDP_FLOAT16, SMDDP_BFLOAT16, SMDDP_FLOAT32,
                                        SMDDP_FLOAT64};
    for (size_t d = 0; d < 4; d++) {
        smddp_dtype_t dt = dts[d];
        unsigned char in[3][N * 8];
        unsigned char *ins[3] = {in[0], in[1], in[2]};
        /* Every pair of specials (a, b), then a third to exercise the step loop. */
        for (size_t i = 0; i < N; i++) {
            float v[3] = {u2f(f32s[i / NSPEC]), u2f(f32s[i % NSPEC]),
                          u2f(f32s[(i * 7) % NSPEC])};
            for (int s = 0; s < 3; s++) {
                if (dt == SMDDP_FLOAT64) {
                    double x = v[s];
                    memcpy(in[s] + 8 * i, &x, 8);
                } else {
                    put_f32(dt, in[s], i, v[s]);
                }
                /* NaNs with a sign and a payload, which the results must not keep. */
                uint16_t pay = dt == SMDDP_FLOAT16 ? 0xfd55 : 0xffa1;
                if (isnan(v[s]) && (i & 1) && dt != SMDDP_FLOAT64 && dt != SMDDP_FLOAT32)
                    memcpy(in[s] + 2 * i, &pay, 2);
            }
        }
        for (size_t o = 0; o < sizeof(all_ops) / sizeof(all_ops[0]); o++) {
            if (!smddp__reduce_valid(dt, all_ops[o])) continue;
            for (int nsrc = 1; nsrc <= 3; nsrc++) {
                rcase_t c = {dt, all_ops[o], nsrc, N, -0.75, nsrc};
                run_case_inputs(&c, RUN_ALIGNED | RUN_UNALIGNED, ins);
            }
        }
    }
}

static void test_count_zero_and_nsrc_one_copy(void **state)
{
    (void)state;
    /* count 0 touches nothing, not even the (NULL) pointers. */
    smddp__reduce_spec_t spec = {SMDDP_FLOAT32, SMDDP_SUM, 1.0, 0};
    const void *none[2] = {NULL, NULL};
    smddp__reduce(&spec, NULL, none, 2, 0);
    /* One source: bit-exact copy, NaN payloads included. */
    uint32_t in[4] = {0x7fa00001, 0xffc12345, 0x80000000, 0x3f800000}, out[4];
    const void *s1[1] = {in};
    for (smddp_op_t op = SMDDP_SUM; op <= SMDDP_AVG; op++) {
        spec.op = op;
        memset(out, 0, sizeof(out));
        smddp__reduce(&spec, out, s1, 1, 4);
        assert_memory_equal(out, in, sizeof(in));
        smddp__reduce(&spec, in, s1, 1, 4); /* in place */
        assert_memory_equal(out, in, sizeof(in));
    }
}

static void test_valid_table(void **state)
{
    (void)state;
    for (int dt = 0; dt < SMDDP_DTYPE_COUNT; dt++) {
        bool fl = dtype_is_float((smddp_dtype_t)dt);
        for (int op = 0; op < SMDDP_OP_COUNT; op++) {
            bool want = true;
            if (op == SMDDP_PREMUL_SUM) want = fl;
            if (op == SMDDP_BAND || op == SMDDP_BOR || op == SMDDP_BXOR) want = !fl;
            if (smddp__reduce_valid((smddp_dtype_t)dt, (smddp_op_t)op) != want)
                fail_msg("valid(%s, %s) should be %d", dtype_names[dt], op_names[op], want);
        }
    }
    assert_false(smddp__reduce_valid(SMDDP_FLOAT32, SMDDP_BAND));
    assert_false(smddp__reduce_valid(SMDDP_BFLOAT16, SMDDP_BXOR));
    assert_false(smddp__reduce_valid(SMDDP_INT32, SMDDP_PREMUL_SUM));
    assert_true(smddp__reduce_valid(SMDDP_INT8, SMDDP_AVG));
    assert_true(smddp__reduce_valid(SMDDP_FLOAT16, SMDDP_PREMUL_SUM));
    assert_false(smddp__reduce_valid(SMDDP_DTYPE_COUNT, SMDDP_SUM));
    assert_false(smddp__reduce_valid(SMDDP_FLOAT32, SMDDP_OP_COUNT));
    assert_false(smddp__reduce_valid((smddp_dtype_t)-1, SMDDP_SUM));
    assert_false(smddp__reduce_valid(SMDDP_FLOAT32, (smddp_op_t)-1));
}

static void test_set_isa(void **state)
{
    (void)state;
    assert_int_equal(smddp__reduce_set_isa("nonsense"), SMDDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(smddp__reduce_set_isa(""), SMDDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(smddp__reduce_set_isa(NULL), SMDDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(smddp__reduce_set_isa("scalar"), SMDDP_OK);
    assert_string_equal(smddp__reduce_isa(), "scalar");
    /* A failed switch leaves the current choice alone. */
    assert_int_equal(smddp__reduce_set_isa("nonsense"), SMDDP_ERR_INVALID_ARGUMENT);
    assert_string_equal(smddp__reduce_isa(), "scalar");
    smddp_status_t st = smddp__reduce_set_isa("avx512");
    if (cpu_has_isa(2) && TEST_X86) {
        assert_int_equal(st, SMDDP_OK);
    } else {
        assert_int_equal(st, SMDDP_ERR_NOT_SUPPORTED);
        assert_string_equal(smddp__reduce_isa(), "scalar");
        assert_true(strstr(smddp__last_error(), "avx512") != NULL);
    }
    st = smddp__reduce_set_isa("avx2");
    assert_int_equal(st, (TEST_X86 && cpu_has_isa(1)) ? SMDDP_OK : SMDDP_ERR_NOT_SUPPORTED);
    /* auto picks the widest the CPU has. */
    assert_int_equal(smddp__reduce_set_isa("AUTO"), SMDDP_OK);
    const char *best = "scalar";
    if (TEST_X86 && cpu_has_isa(1)) best = "avx2";
    if (TEST_X86 && cpu_has_isa(2)) best = "avx512";
    assert_string_equal(smddp__reduce_isa(), best);
}

/* ------------------------------------------------------------------------ */

int main(void)
{
    const struct CMUnitTest conversions[] = {
        cmocka_unit_test(test_fp16_roundtrip_exhaustive),
        cmocka_unit_test(test_bf16_roundtrip_exhaustive),
        cmocka_unit_test(test_half_rounding_boundaries),
        cmocka_unit_test(test_half_special_values),
        cmocka_unit_test(test_half_vs_f16c),
    };
    const struct CMUnitTest semantics[] = {
        cmocka_unit_test(test_valid_table),
        cmocka_unit_test(test_set_isa),
        cmocka_unit_test(test_count_zero_and_nsrc_one_copy),
        cmocka_unit_test(test_int_wraparound),
        cmocka_unit_test(test_minmax_nan),
        cmocka_unit_test(test_float_specials),
        cmocka_unit_test(test_avg_premul_variants),
        cmocka_unit_test(test_many_sources),
    };
    const struct CMUnitTest matrix[] = {
        cmocka_unit_test(test_matrix_int8),  cmocka_unit_test(test_matrix_uint8),
        cmocka_unit_test(test_matrix_int32), cmocka_unit_test(test_matrix_int64),
        cmocka_unit_test(test_matrix_fp16),  cmocka_unit_test(test_matrix_bf16),
        cmocka_unit_test(test_matrix_fp32),  cmocka_unit_test(test_matrix_fp64),
        cmocka_unit_test(test_matrix_int16), cmocka_unit_test(test_matrix_uint16),
        cmocka_unit_test(test_matrix_uint32), cmocka_unit_test(test_matrix_uint64),
    };
    /* Say which variants the cross-ISA comparisons cover on this machine. */
    printf("reduce ISAs tested:");
    for (int isa = 0; isa < NUM_ISAS; isa++)
        if (smddp__reduce_set_isa(isa_names[isa]) == SMDDP_OK) printf(" %s", isa_names[isa]);
    printf("\n");
    smddp__reduce_set_isa("auto");

    int failed = 0;
    failed += cmocka_run_group_tests_name("reduce_conversions", conversions, NULL, NULL);
    failed += cmocka_run_group_tests_name("reduce_semantics", semantics, NULL, NULL);
    failed += cmocka_run_group_tests_name("reduce_matrix", matrix, NULL, NULL);
    scratch_free();
    return failed ? 1 : 0;
}
