/*
 * reduce_impl.h compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq
 * -mf16c and 512-bit vectors preferred (see meson.build): the same loops as
 * the AVX2 variant, auto-vectorised twice as wide. reduce.c calls it only on
 * CPUs that have all of these.
 */
#define REDUCE_ENTRY smddp__reduce_avx512
#define REDUCE_USE_F16C
#include "reduce_impl.h"
