/*
 * fp16 (IEEE binary16) and bf16 (bfloat16) <-> fp32 conversions in portable
 * C, so that CPU kernels without F16C and, later, CUDA kernels (compiled by
 * nvcc as __host__ __device__) round exactly as the F16C instructions do.
 *
 * Narrowing rounds to nearest, ties to even; finite values too large become
 * infinity; subnormals are produced and consumed exactly (no flushing). A NaN
 * stays a NaN: it is quieted and keeps its sign and the top bits of its
 * payload, which is what VCVTPS2PH / VCVTPH2PS do, so that the scalar and the
 * vector kernels agree bit for bit. Widening is exact for every other value.
 * Nothing here calls the C library.
 */
#ifndef SMDDP_CORE_REDUCE_HALF_H
#define SMDDP_CORE_REDUCE_HALF_H

#include <stdint.h>

#if defined(__CUDACC__)
#define SMDDP_HALF_FN static __inline__ __host__ __device__
#else
#define SMDDP_HALF_FN static inline
#endif

/* Type punning through a union is defined in C11 and supported by nvcc. */
SMDDP_HALF_FN uint32_t smddp__f32_to_bits(float f)
{
    union {
        float f;
        uint32_t u;
    } v;
    v.f = f;
    return v.u;
}

SMDDP_HALF_FN float smddp__bits_to_f32(uint32_t u)
{
    union {
        float f;
        uint32_t u;
    } v;
    v.u = u;
    return v.f;
}

/* Widens fp16 bits to fp32 (exact; a signalling NaN comes back quiet). */
SMDDP_HALF_FN float smddp__fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0x1f) {
        /* Infinity, or NaN: set the quiet bit, keep the payload. */
        uint32_t quiet = mant ? 0x00400000u : 0;
        return smddp__bits_to_f32(sign | 0x7f800000u | quiet | (mant << 13));
    }
    if (exp == 0) {
        if (mant == 0) return smddp__bits_to_f32(sign);
        /* Subnormal: mant * 2^-24; normalise so the leading 1 is implicit. */
        uint32_t e = 113; /* fp32 biased exponent of 2^-14 */
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        return smddp__bits_to_f32(sign | (e << 23) | ((mant & 0x3ffu) << 13));
    }
    return smddp__bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Narrows fp32 to fp16 bits, rounding to nearest even. */
SMDDP_HALF_FN uint16_t smddp__fp32_to_fp16(float f)
{
    uint32_t x = smddp__f32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;

    if (ax > 0x7f800000u) /* NaN: quiet it and keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    /* 65520 = 65504 + half an ulp is a tie whose even neighbour is 2^16. */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) {
        /*
         * Normal result: rebias the exponent (127 -> 15) and round the 13
         * dropped bits; a carry out of the mantissa correctly bumps the
         * exponent.
         */
        uint32_t odd = (ax >> 13) & 1u;
        return (uint16_t)(sign | ((ax - 0x38000000u + 0xfffu + odd) >> 13));
    }
    /* 2^-25 and below round to zero (2^-25 itself is a tie with even 0). */
    if (ax <= 0x33000000u) return (uint16_t)sign;
    /*
     * Subnormal result: value = m * 2^(e - 150), in units of 2^-24 that is
     * m >> (126 - e), shift between 14 and 24. Rounding up the largest
     * subnormal gives 0x400, the smallest normal, as it should.
     */
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

/* Widens bf16 bits to fp32: bf16 is the top half of an fp32 (exact). */
SMDDP_HALF_FN float smddp__bf16_to_fp32(uint16_t b)
{
    return smddp__bits_to_f32((uint32_t)b << 16);
}

/*
 * Narrows fp32 to bf16 bits, rounding to nearest even. Written without
 * branches on the common path so that loops over it vectorise.
 */
SMDDP_HALF_FN uint16_t smddp__fp32_to_bf16(float f)
{
    uint32_t x = smddp__f32_to_bits(f);
    /* Overflow rounds up into the infinity encoding by itself. */
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

#endif /* SMDDP_CORE_REDUCE_HALF_H */
