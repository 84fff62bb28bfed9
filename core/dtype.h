/*
 * Element types and reduction operations: size and names (op.c). C and C++
 * (kernels.cu) both include it; the ABI's smddp__dtype_size and friends wrap it.
 */
#ifndef SMDDP_CORE_DTYPE_H
#define SMDDP_CORE_DTYPE_H

#include <stddef.h>

#include "smddp/smddp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one element; 0 for an unknown dtype. */
size_t smddp__dtype_size(smddp_dtype_t dtype);
/* "float32", ...; "unknown" for an unknown dtype. */
const char *smddp__dtype_name(smddp_dtype_t dtype);
/* "sum", ...; "unknown" for an unknown op. */
const char *smddp__redop_name(smddp_op_t op);

#ifdef __cplusplus
}
#endif

#endif /* SMDDP_CORE_DTYPE_H */
