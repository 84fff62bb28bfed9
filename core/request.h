/*
 * The request life cycle (request.c): making an op, completing it, waiting
 * for it to be done, and dropping references.
 */
#ifndef SMDDP_CORE_REQUEST_H
#define SMDDP_CORE_REQUEST_H

#include <time.h>

#include "comm.h"

/* A new op of kind on comm, with one reference (the caller's); NULL when out of memory. */
smddp__op_t *smddp__op_new(smddp_comm_t comm, smddp__op_kind_t kind);
/*
 * A new op of kind with its buffers, count, dtype, reduction and root (-1:
 * none) set; host memory, premul 1. NULL when out of memory.
 */
smddp__op_t *smddp__op_make(smddp_comm_t comm, smddp__op_kind_t kind, const void *sendbuf,
                            void *recvbuf, size_t count, smddp_dtype_t dtype, smddp_op_t redop,
                            int root);
/* Drops one reference; the last frees op (and releases a staged op's stream unrun). */
void smddp__request_unref(smddp__op_t *op);

/* Keeps the thread's last error as op's message, replacing any earlier one. */
void smddp__op_keep_error(smddp__op_t *op);
/* op's failure message ("" before it failed). */
const char *smddp__op_errmsg(const smddp__op_t *op);

/*
 * Marks op finished with st (message from the thread's last error): runs its
 * callback, then sets done and wakes waiters. The caller must hold no lock.
 */
void smddp__op_complete(smddp__op_t *op, smddp_status_t st);

/* SMDDP_IN_PROGRESS until op is done, then its status (message as the thread's last error). */
smddp_status_t smddp__request_test(smddp__op_t *op);

/*
 * Waits until op is done, at most timeout_ms (< 0: no limit), spinning
 * briefly then sleeping on its done word; SMDDP_IN_PROGRESS at the limit,
 * else as smddp__request_test.
 */
smddp_status_t smddp__request_wait_done(smddp__op_t *op, int64_t timeout_ms);

/* futex(2) on a private word (FUTEX_WAIT / FUTEX_WAKE with op). */
long smddp__futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts);

#endif /* SMDDP_CORE_REQUEST_H */
