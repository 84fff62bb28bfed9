/*
 * The NCCL interposer: with libsmddp preloaded (smddprun does it under the
 * `auto` communication backend), NCCL-based code's ncclAllReduce,
 * ncclAllGather and ncclReduceScatter reach libsmddp first. A call smddp
 * serves runs on smddp's CUDA collectives, on the caller's stream; every
 * other call, and every call under `nccl` or without USE_SMDDP_COLLECTIVES=1,
 * goes to the real NCCL (dlsym(RTLD_NEXT), else the library SMDDP_NCCL_LIBRARY
 * names) untouched.
 */
#ifndef SMDDP_CORE_CUDA_INTERPOSE_H
#define SMDDP_CORE_CUDA_INTERPOSE_H

#include <stdbool.h>
#include <stddef.h>

#include "smddp/smddp.h"

typedef enum smddp__ipose_kind {
    SMDDP_IPOSE_ALLREDUCE,
    SMDDP_IPOSE_ALLGATHER,
    SMDDP_IPOSE_REDUCE_SCATTER
} smddp__ipose_kind_t;

/* What the routing decision looks at, gathered per call. */
typedef struct smddp__ipose_call {
    smddp__ipose_kind_t kind;
    int nccl_dtype;
    int nccl_op;                /* ignored for allgather */
    bool enabled;               /* USE_SMDDP_COLLECTIVES=1 and the backend is auto */
    bool in_group;              /* between ncclGroupStart and ncclGroupEnd on this thread */
    bool device_memory;         /* both buffers are CUDA device memory */
    const char *comm_refused;   /* why this communicator is never served, or NULL */
} smddp__ipose_call_t;

/*
 * NULL when smddp serves the call (with its dtype and op in *dtype, *op);
 * otherwise a static reason for handing it to NCCL. Depends on nothing but
 * its argument, so the dispatch is unit-tested without NCCL or a GPU.
 */
const char *smddp__ipose_route(const smddp__ipose_call_t *c, smddp_dtype_t *dtype, smddp_op_t *op);

/*
 * The interposed calls, with NCCL's signatures (ncclComm_t and cudaStream_t
 * as void *, NCCL's enums as int). Everything else of NCCL's is not touched.
 */
int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, void *comm,
                  void *stream);
int ncclAllGather(const void *send, void *recv, size_t count, int dtype, void *comm, void *stream);
int ncclReduceScatter(const void *send, void *recv, size_t count, int dtype, int op, void *comm,
                      void *stream);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int ncclCommDestroy(void *comm);
int ncclCommAbort(void *comm);

/* Calls served by smddp and handed to NCCL since the process started. */
void smddp__ipose_counts(long *served, long *forwarded);

#endif /* SMDDP_CORE_CUDA_INTERPOSE_H */
