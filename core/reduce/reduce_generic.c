/*
 * The portable kernels ("scalar"): reduce_impl.h with the core's own flags.
 * They are the reference the vector variants must match bit for bit, and the
 * fallback on CPUs (or architectures) without AVX2.
 */
#define REDUCE_ENTRY smddp__reduce_generic
#include "reduce_impl.h"
