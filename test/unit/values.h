/*
 * Test values that every dtype holds exactly, and the reference reduction of
 * them, shared by the collective tests. A test picks small integers per rank
 * and element; floating-point dtypes store half of each (so the results
 * exercise fractions), unsigned dtypes store it shifted by 8. With such inputs a sum,
 * product, minimum or maximum over a few ranks is exact whatever the order of
 * operations, so results are compared with ==.
 */
#ifndef SMDDP_TEST_VALUES_H
#define SMDDP_TEST_VALUES_H

#include <stdbool.h>
#include <stdint.h>

#include "smddp/smddp.h"
#include "reduce/half.h"

static inline bool tv_is_float(smddp_dtype_t t)
{
    return t == SMDDP_FLOAT16 || t == SMDDP_BFLOAT16 || t == SMDDP_FLOAT32 || t == SMDDP_FLOAT64;
}

/* Unsigned dtypes store v + 8, so that the small negative test values stay in range. */
static inline bool tv_is_unsigned(smddp_dtype_t t)
{
    return t == SMDDP_UINT8 || t == SMDDP_UINT16 || t == SMDDP_UINT32 || t == SMDDP_UINT64;
}

/* Stores small integer v at element i of buf as dtype t (see the top). */
static inline void tv_store(void *buf, smddp_dtype_t t, int64_t i, double v)
{
    switch (t) {
    case SMDDP_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case SMDDP_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(int)(v + 8); break;
    case SMDDP_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case SMDDP_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case SMDDP_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case SMDDP_UINT16: ((uint16_t *)buf)[i] = (uint16_t)(int)(v + 8); break;
    case SMDDP_UINT32: ((uint32_t *)buf)[i] = (uint32_t)(int64_t)(v + 8); break;
    case SMDDP_UINT64: ((uint64_t *)buf)[i] = (uint64_t)(int64_t)(v + 8); break;
    case SMDDP_FLOAT16: ((uint16_t *)buf)[i] = smddp__fp32_to_fp16((float)(v * 0.5)); break;
    case SMDDP_BFLOAT16: ((uint16_t *)buf)[i] = smddp__fp32_to_bf16((float)(v * 0.5)); break;
    case SMDDP_FLOAT32: ((float *)buf)[i] = (float)(v * 0.5); break;
    case SMDDP_FLOAT64: ((double *)buf)[i] = v * 0.5; break;
    default: break;
    }
}

/* The value tv_store stored for v, as tv_load reads it back. */
static inline double tv_stored(smddp_dtype_t t, double v)
{
    if (tv_is_unsigned(t)) return v + 8;
    return tv_is_float(t) ? v * 0.5 : v;
}

/* Element i of buf as a double. */
static inline double tv_load(const void *buf, smddp_dtype_t t, int64_t i)
{
    switch (t) {
    case SMDDP_INT8: return ((const int8_t *)buf)[i];
    case SMDDP_UINT8: return ((const uint8_t *)buf)[i];
    case SMDDP_INT32: return ((const int32_t *)buf)[i];
    case SMDDP_INT64: return (double)((const int64_t *)buf)[i];
    case SMDDP_INT16: return ((const int16_t *)buf)[i];
    case SMDDP_UINT16: return ((const uint16_t *)buf)[i];
    case SMDDP_UINT32: return ((const uint32_t *)buf)[i];
    case SMDDP_UINT64: return (double)((const uint64_t *)buf)[i];
    case SMDDP_FLOAT16: return smddp__fp16_to_fp32(((const uint16_t *)buf)[i]);
    case SMDDP_BFLOAT16: return smddp__bf16_to_fp32(((const uint16_t *)buf)[i]);
    case SMDDP_FLOAT32: return ((const float *)buf)[i];
    case SMDDP_FLOAT64: return ((const double *)buf)[i];
    default: return 0;
    }
}

/* Whether op is defined for dtype t (PREMUL_SUM on floats, bitwise ops on integers). */
static inline bool tv_op_valid(smddp_dtype_t t, smddp_op_t op)
{
    if (op == SMDDP_PREMUL_SUM) return tv_is_float(t);
    if (op == SMDDP_BAND || op == SMDDP_BOR || op == SMDDP_BXOR) return !tv_is_float(t);
    return true;
}

/* v as dtype t stores it: integers wrap modulo their width. */
static inline double tv_wrap(smddp_dtype_t t, int64_t v)
{
    switch (t) {
    case SMDDP_INT8: return (int8_t)v;
    case SMDDP_UINT8: return (uint8_t)v;
    case SMDDP_INT16: return (int16_t)v;
    case SMDDP_UINT16: return (uint16_t)v;
    case SMDDP_INT32: return (int32_t)v;
    case SMDDP_UINT32: return (uint32_t)v;
    case SMDDP_UINT64: return (double)(uint64_t)v;
    default: return (double)v;
    }
}

/*
 * What the library must produce for op over the stored values v[0..n) of n
 * ranks, in rank order: AVG divides in the accumulation type (fp32 for the
 * halves) and rounds once; integer AVG truncates; integers wrap at their width.
 */
static inline double tv_reduce(smddp_dtype_t t, smddp_op_t op, const double *v, int n,
                               double premul)
{
    double acc = 0;
    int64_t iacc = 0;
    for (int r = 0; r < n; r++) {
        double x = op == SMDDP_PREMUL_SUM ? v[r] * premul : v[r];
        int64_t ix = (int64_t)v[r];
        if (r == 0) {
            acc = x;
            iacc = ix;
            continue;
        }
        switch (op) {
        case SMDDP_SUM: case SMDDP_AVG: case SMDDP_PREMUL_SUM: acc += x; break;
        case SMDDP_PROD: acc *= x; break;
        case SMDDP_MIN: acc = x < acc ? x : acc; break;
        case SMDDP_MAX: acc = x > acc ? x : acc; break;
        case SMDDP_BAND: iacc &= ix; break;
        case SMDDP_BOR: iacc |= ix; break;
        case SMDDP_BXOR: iacc ^= ix; break;
        default: break;
        }
    }
    if (op == SMDDP_BAND || op == SMDDP_BOR || op == SMDDP_BXOR) {
        return tv_wrap(t, iacc);
    }
    if (op == SMDDP_AVG) {
        if (tv_is_float(t)) {
            if (t == SMDDP_FLOAT64) return acc / n;
            float f = (float)acc / (float)n;
            if (t == SMDDP_FLOAT16) return smddp__fp16_to_fp32(smddp__fp32_to_fp16(f));
            if (t == SMDDP_BFLOAT16) return smddp__bf16_to_fp32(smddp__fp32_to_bf16(f));
            return f;
        }
        return (double)((int64_t)acc / n);
    }
    if (!tv_is_float(t)) return tv_wrap(t, (int64_t)acc);
    return acc;
}

#endif /* SMDDP_TEST_VALUES_H */
