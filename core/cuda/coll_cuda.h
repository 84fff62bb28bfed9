/*
 * Collectives on CUDA device memory among the ranks of one node, through
 * CUDA IPC (coll_cuda.c). The selection (select.c) decides which ops come here.
 */
#ifndef SMDDP_CORE_CUDA_COLL_CUDA_H
#define SMDDP_CORE_CUDA_COLL_CUDA_H

#include "../algo.h"

/*
 * Runs algo for op with the buffers' device current, leaving the calling
 * thread's device as it found it. With ipc, sets up the communicator's IPC
 * state first (the first CUDA collective) and requires one device per
 * communicator; without, algo is another path's (NCCL).
 */
smddp_status_t smddp__cuda_execute(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn algo,
                                   bool ipc);

/* The algorithms; op's device is current and the IPC state set up (smddp__cuda_execute). */
smddp_status_t smddp__cuda_ipc_allreduce(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__cuda_ipc_reduce(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__cuda_ipc_broadcast(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__cuda_ipc_allgather(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__cuda_ipc_gather(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__cuda_ipc_reduce_scatter(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__cuda_ipc_alltoall(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__cuda_ipc_scatter(smddp_comm_t comm, smddp__op_t *op);

/* Whether a CUDA device is usable here (fn names the caller in the message). */
smddp_status_t smddp__cuda_usable(const char *fn);

/*
 * SMDDP_CUDA_SYNC=kernel: an error once a collective kernel of comm gave up
 * (comm is then aborted with it), which a stream synchronisation alone does
 * not report; SMDDP_OK otherwise, and without CUDA.
 */
smddp_status_t smddp__cuda_status(smddp_comm_t comm);

/* Frees the CUDA IPC state (destroy). */
void smddp__cuda_teardown(smddp_comm_t comm);

#if SMDDP_HAVE_CUDA
/* The algorithms, one registry entry per kind (select.c lists them). */
extern const smddp__algo_t smddp__algo_cuda_allreduce, smddp__algo_cuda_reduce,
    smddp__algo_cuda_broadcast, smddp__algo_cuda_allgather, smddp__algo_cuda_gather,
    smddp__algo_cuda_reduce_scatter, smddp__algo_cuda_alltoall, smddp__algo_cuda_scatter;
#endif

#endif /* SMDDP_CORE_CUDA_COLL_CUDA_H */
