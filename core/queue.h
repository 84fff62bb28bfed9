/*
 * The scheduler (queue.c): each communicator's queue of operations and the
 * progress thread that runs them in issue order.
 */
#ifndef SMDDP_CORE_QUEUE_H
#define SMDDP_CORE_QUEUE_H

#include "request.h"

smddp_status_t smddp__sched_start(smddp_comm_t comm);
void smddp__sched_stop(smddp_comm_t comm);
/*
 * Issues op: send/recv to the send/recv engine, every other op to the
 * queue with the next sequence number (or run at once on this thread when
 * req is NULL and the communicator is idle). With req NULL, waits for op
 * and drops it; else *req is the caller's handle.
 */
smddp_status_t smddp__submit(smddp_comm_t comm, smddp__op_t *op, smddp_request_t *req);
/*
 * Issues op as the API does: for CUDA memory, first what the router needs
 * at issue (agreement across nodes, a staged op's stream work), then
 * smddp__submit. On error op is dropped.
 */
smddp_status_t smddp__issue(smddp_comm_t comm, smddp__op_t *op, smddp_request_t *req);
/*
 * Waits for op, at most timeout_ms (< 0: no limit); an unbounded wait runs
 * the ops queued up to op on this thread when no other thread is running one.
 */
smddp_status_t smddp__request_wait(smddp__op_t *op, int64_t timeout_ms);

#endif /* SMDDP_CORE_QUEUE_H */
