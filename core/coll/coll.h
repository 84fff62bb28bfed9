/* Collective algorithms; one entry point per operation kind. */
#ifndef SMDDP_CORE_COLL_H
#define SMDDP_CORE_COLL_H

#include "../comm.h"

/* Splits n elements into p nearly equal pieces; piece q is [off, off + len). */
void smddp__piece(size_t n, int p, int q, size_t *off, size_t *len);

/* Runs one operation on the calling thread (exec_lock held). */
smddp_status_t smddp__op_execute(smddp_comm_t comm, smddp__op_t *op);

smddp_status_t smddp__allreduce(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__reduce_root(smddp_comm_t comm, smddp__op_t *op);
smddp_status_t smddp__reduce_scatter(smddp_comm_t comm, smddp__op_t *op);
/* Any collective of a communicator that spans nodes, over the network (net.c). */
smddp_status_t smddp__net_execute(smddp_comm_t comm, smddp__op_t *op);
/* Any collective on CUDA device memory, inside one node (cuda/coll_cuda.c). */
smddp_status_t smddp__cuda_execute(smddp_comm_t comm, smddp__op_t *op);
/* Whether fn can take SMDDP_MEM_CUDA on comm here (a device, one node, a CUDA build). */
smddp_status_t smddp__cuda_check(smddp_comm_t comm, const char *fn);
/*
 * The host-memory algorithms for op, without the order checks of
 * smddp__op_execute: the stage of a CUDA op runs its chunks through it.
 */
smddp_status_t smddp__coll_execute_host(smddp_comm_t comm, smddp__op_t *op);
/* Frees the CUDA IPC state (destroy). */
void smddp__cuda_teardown(smddp_comm_t comm);

#endif /* SMDDP_CORE_COLL_H */
