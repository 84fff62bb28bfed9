/*
 * reduce_impl.h compiled with -mavx2 -mf16c (see meson.build); fp16 widens
 * and narrows with F16C. reduce.c calls it only on CPUs that have both.
 */
#define REDUCE_ENTRY smddp__reduce_avx2
#define REDUCE_USE_F16C
#include "reduce_impl.h"
