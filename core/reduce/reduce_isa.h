/*
 * The per-instruction-set entry points that reduce.c dispatches between. Each
 * is reduce_impl.h compiled with different flags; all have the contract of
 * smddp__reduce() (nsrc >= 1, a valid spec) and give bit-identical results.
 */
#ifndef SMDDP_CORE_REDUCE_ISA_H
#define SMDDP_CORE_REDUCE_ISA_H

#include "reduce.h"

/* Portable C, compiled with the core's flags; runs on every CPU. */
void smddp__reduce_generic(const smddp__reduce_spec_t *spec, void *dst,
                           const void *const *srcs, int nsrc, size_t count);
/* -mavx2 -mf16c: only call when the CPU has AVX2 and F16C. */
void smddp__reduce_avx2(const smddp__reduce_spec_t *spec, void *dst,
                        const void *const *srcs, int nsrc, size_t count);
/* -mavx512{f,bw,vl,dq} -mf16c: only call when the CPU has all of them. */
void smddp__reduce_avx512(const smddp__reduce_spec_t *spec, void *dst,
                          const void *const *srcs, int nsrc, size_t count);

#endif /* SMDDP_CORE_REDUCE_ISA_H */
