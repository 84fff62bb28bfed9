/*
 * NCCL, loaded at run time (no link-time dependency, no nccl.h needed): the
 * few types and calls libsmddp uses, declared with NCCL's stable ABI values,
 * and the CUDA collectives that go through an NCCL communicator of the
 * smddp communicator's ranks.
 *
 * When: under SMDDP_COMMUNICATION_BACKEND=nccl every CUDA collective NCCL
 * has; under auto, only what smddp does not serve itself (a communicator
 * spanning nodes, all-to-all with splits), said once at INFO.
 */
#ifndef SMDDP_CORE_CUDA_NCCL_H
#define SMDDP_CORE_CUDA_NCCL_H

#include "../comm.h"
#include "../transport/transport.h"

typedef struct smddp__nccl_id {
    char internal[128];
} smddp__nccl_id_t;

typedef struct ncclComm *smddp__nccl_comm_t;

/* NCCL's enums (nccl.h), by value. */
enum {
    SMDDP_NCCL_INT8 = 0, SMDDP_NCCL_UINT8 = 1, SMDDP_NCCL_INT32 = 2, SMDDP_NCCL_UINT32 = 3,
    SMDDP_NCCL_INT64 = 4, SMDDP_NCCL_UINT64 = 5,
    SMDDP_NCCL_FLOAT16 = 6, SMDDP_NCCL_FLOAT32 = 7, SMDDP_NCCL_FLOAT64 = 8, SMDDP_NCCL_BFLOAT16 = 9
};
enum { SMDDP_NCCL_SUM = 0, SMDDP_NCCL_PROD = 1, SMDDP_NCCL_MAX = 2, SMDDP_NCCL_MIN = 3, SMDDP_NCCL_AVG = 4 };

/* The calls, resolved from the library once. */
typedef struct smddp__nccl_api {
    void *lib;    /* the dlopen handle */
    int version;  /* ncclGetVersion: e.g. 22703 for 2.27.3 */
    int (*GetVersion)(int *version);
    const char *(*GetErrorString)(int result);
    int (*GetUniqueId)(smddp__nccl_id_t *id);
    int (*CommInitRank)(smddp__nccl_comm_t *comm, int nranks, smddp__nccl_id_t id, int rank);
    int (*CommDestroy)(smddp__nccl_comm_t comm);
    int (*CommAbort)(smddp__nccl_comm_t comm);
    int (*AllReduce)(const void *send, void *recv, size_t count, int dtype, int op,
                     smddp__nccl_comm_t comm, void *stream);
    int (*Reduce)(const void *send, void *recv, size_t count, int dtype, int op, int root,
                  smddp__nccl_comm_t comm, void *stream);
    int (*Broadcast)(const void *send, void *recv, size_t count, int dtype, int root,
                     smddp__nccl_comm_t comm, void *stream);
    int (*AllGather)(const void *send, void *recv, size_t count, int dtype,
                     smddp__nccl_comm_t comm, void *stream);
    int (*ReduceScatter)(const void *send, void *recv, size_t count, int dtype, int op,
                         smddp__nccl_comm_t comm, void *stream);
    int (*Send)(const void *buf, size_t count, int dtype, int peer, smddp__nccl_comm_t comm,
                void *stream);
    int (*Recv)(void *buf, size_t count, int dtype, int peer, smddp__nccl_comm_t comm,
                void *stream);
    int (*GroupStart)(void);
    int (*GroupEnd)(void);
    int (*RedOpCreatePreMulSum)(int *op, void *scalar, int dtype, int residence,
                                smddp__nccl_comm_t comm);
    int (*RedOpDestroy)(int op, smddp__nccl_comm_t comm);
} smddp__nccl_api_t;

/*
 * The library (SMDDP_NCCL_LIBRARY, else libnccl.so.2), loaded on first call;
 * NULL when it cannot be, with the reason in *why (static text).
 */
const smddp__nccl_api_t *smddp__nccl(const char **why);

/* Whether NCCL has op's reduction (it lacks the bitwise ones). */
bool smddp__nccl_has_op(const smddp__op_t *op);

/*
 * Runs a CUDA op through the communicator's NCCL communicator (created on
 * first use, on the calling thread's current device: the buffers').
 */
smddp_status_t smddp__nccl_execute(smddp_comm_t comm, smddp__op_t *op);

/* comm->nccl; teardown destroys it, if any (aborts it after a failure). */
extern const smddp__transport_t smddp__nccl_transport;

#endif /* SMDDP_CORE_CUDA_NCCL_H */
