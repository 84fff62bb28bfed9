/*
 * Entry points of a library opened at run time (dlopen): NCCL (cuda/nccl.c)
 * and libfabric (transport/ofi_lib.c), resolved from one table each.
 */
#ifndef SMDDP_CORE_DL_H
#define SMDDP_CORE_DL_H

#include <stddef.h>

/* One entry point: its name in the library, and where its address goes. */
typedef struct smddp__dl_sym {
    const char *name;
    void **slot;
} smddp__dl_sym_t;

/* A slot for the function pointer `field` (object and function pointers share a size here). */
#define SMDDP_DL_SLOT(field) ((void **)&(field))

/*
 * Resolves every symbol of syms from lib (a dlopen handle) into its slot, in
 * order; returns the name of the first one lib lacks, or NULL when it has all.
 */
const char *smddp__dl_resolve(void *lib, const smddp__dl_sym_t *syms, size_t n);

#endif
