/*
 * The router (exec.c): running an op once it is its turn, on the path and
 * with the algorithm the selection (select.c) chooses from what is gathered
 * here.
 */
#ifndef SMDDP_CORE_EXEC_H
#define SMDDP_CORE_EXEC_H

#include "comm.h"
#include "select.h"

/* What the selection reads for op on comm (select.h), gathered before it chooses. */
void smddp__select_input(smddp_comm_t comm, const smddp__op_t *op, smddp__select_in_t *in);

/*
 * The path and algorithm of op on comm, the same on every rank given the
 * same settings and, under SMDDP_CUDA_NET=auto across nodes, the agreement
 * below. choice.why says why an op goes to NCCL.
 */
smddp__choice_t smddp__choose(smddp_comm_t comm, const smddp__op_t *op);

/*
 * At issue, for CUDA memory: whether this build and machine can serve a
 * `kind` call named fn on comm (a usable device; NCCL where only NCCL
 * serves it). The error says what to change.
 */
smddp_status_t smddp__route_check_cuda(smddp_comm_t comm, smddp__op_kind_t kind, const char *fn);

/*
 * Under SMDDP_CUDA_NET=auto, a communicator spanning nodes agrees once,
 * before its first CUDA collective, whether NCCL loads on every rank, so
 * that all ranks route alike. needs: not agreed yet; here: whether NCCL
 * loads on this rank (*why: why not); agreed: records the verdict of all.
 */
bool smddp__route_needs_agreement(smddp_comm_t comm);
int32_t smddp__route_nccl_here(const char **why);
void smddp__route_agreed(smddp_comm_t comm, int32_t everywhere, const char *why_here);

/* At issue, for CUDA memory: a staged op's stream work (cuda/stage.c); else nothing. */
smddp_status_t smddp__route_prepare(smddp_comm_t comm, smddp__op_t *op);

/*
 * Runs op on the calling thread in its turn (exec_lock held): publishes its
 * descriptor for the cross-rank checks, then its route's algorithm.
 */
smddp_status_t smddp__op_execute(smddp_comm_t comm, smddp__op_t *op);

#endif /* SMDDP_CORE_EXEC_H */
