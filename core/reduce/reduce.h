/*
 * CPU reduction kernels, one per (dtype, op), vectorised with AVX2 or
 * AVX-512 when the CPU has them and a portable version otherwise.
 */
#ifndef SMDDP_CORE_REDUCE_H
#define SMDDP_CORE_REDUCE_H

#include "../common.h"

/* How a reduction combines its inputs. */
typedef struct smddp__reduce_spec {
    smddp_dtype_t dtype;
    /*
     * The public op. AVG sums, then divides by avg_div if avg_div > 0 (a
     * partial step of a larger reduction passes 0 and divides later).
     * PREMUL_SUM multiplies every input by premul before summing.
     */
    smddp_op_t op;
    double premul;
    int avg_div;
} smddp__reduce_spec_t;

/*
 * dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i], combined left to
 * right so that every caller gets bit-identical results for the same inputs,
 * whichever instruction set runs. fp16/bf16 accumulate all nsrc inputs in
 * fp32 and round to nearest even once. Integer arithmetic wraps (two's
 * complement), as torch's does; min/max propagate NaN, as torch.maximum does.
 * A floating-point result that is NaN is the canonical quiet NaN (its sign and
 * payload would otherwise depend on the instruction set).
 * nsrc >= 1; nsrc == 1 applies the op's unary part (premul, avg division) or
 * copies (bit for bit). dst may be the same pointer as any src; any alignment is allowed.
 * The spec must be valid (smddp__reduce_valid).
 */
void smddp__reduce(const smddp__reduce_spec_t *spec, void *dst,
                   const void *const *srcs, int nsrc, size_t count);

/* True when op is defined for dtype (bitwise ops: integers; premul: floats). */
bool smddp__reduce_valid(smddp_dtype_t dtype, smddp_op_t op);

/* The instruction set the kernels run with: "avx512", "avx2" or "scalar". */
const char *smddp__reduce_isa(void);

/*
 * Forces an instruction set: "auto", "scalar", "avx2" or "avx512". Returns
 * SMDDP_ERR_NOT_SUPPORTED if the CPU lacks it. For tests and SMDDP_SIMD.
 */
smddp_status_t smddp__reduce_set_isa(const char *isa);

#endif /* SMDDP_CORE_REDUCE_H */
