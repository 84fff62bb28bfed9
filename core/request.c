/*
 * The request life cycle: an op is made at issue with one reference (the
 * caller's handle), the engine takes another while it runs it, and it is
 * freed when both are dropped. Completion sets the done word, a futex, and
 * wakes whoever sleeps on it.
 */
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cuda.h"
#include "fail.h"
#include "request.h"
#include "trace.h"

long smddp__futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op | FUTEX_PRIVATE_FLAG, val, ts, NULL, 0);
}

smddp__op_t *smddp__op_new(smddp_comm_t comm, smddp__op_kind_t kind)
{
    smddp__op_t *op = calloc(1, sizeof(*op));
    if (!op) {
        smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate a request");
        return NULL;
    }
    op->comm = comm;
    op->kind = kind;
    op->root = -1;
    op->spec.premul = 1.0;
    atomic_init(&op->refs, 1);
    atomic_init(&op->done, 0);
    return op;
}

smddp__op_t *smddp__op_make(smddp_comm_t comm, smddp__op_kind_t kind, const void *sendbuf,
                            void *recvbuf, size_t count, smddp_dtype_t dtype, smddp_op_t redop,
                            int root)
{
    smddp__op_t *op = smddp__op_new(comm, kind);
    if (!op) return NULL;
    op->sendbuf = sendbuf;
    op->recvbuf = recvbuf;
    op->count = count;
    op->dtype = op->spec.dtype = dtype;
    op->spec.op = redop;
    op->root = root;
    return op;
}

void smddp__request_unref(smddp__op_t *op)
{
    if (atomic_fetch_sub(&op->refs, 1) == 1) {
        if (op->stage) (void)smddp__cuda_calls()->stage_finish(op, SMDDP_ERR_ABORTED); /* unrun */
        free(op->v);
        free(op->errmsg);
        free(op);
    }
}

void smddp__op_keep_error(smddp__op_t *op)
{
    free(op->errmsg);
    op->errmsg = strdup(smddp__last_error());
}

const char *smddp__op_errmsg(const smddp__op_t *op)
{
    if (op->errmsg) return op->errmsg;
    return op->status < 0 ? "(no memory was left to keep the error's message)" : "";
}

void smddp__op_complete(smddp__op_t *op, smddp_status_t st)
{
    /* The stream must never wait for an op that has ended (op->stage: CUDA staged it). */
    if (op->stage) st = smddp__cuda_calls()->stage_finish(op, st);
    op->status = st;
    if (st < 0) {
        smddp__op_keep_error(op);
        smddp__comm_set_last_error(op->comm, smddp__op_errmsg(op));
    }
    smddp__trace_finish(op->comm->trace, op, st);
    if (op->on_complete) op->on_complete(op->on_complete_arg, st);
    atomic_store(&op->done, 1);
    if (atomic_load(&op->sleepers) > 0) smddp__futex(&op->done, FUTEX_WAKE, INT_MAX, NULL);
}

smddp_status_t smddp__request_test(smddp__op_t *op)
{
    if (!atomic_load(&op->done)) return SMDDP_IN_PROGRESS;
    if (op->status < 0) return smddp__error_quiet(op->status, "%s", smddp__op_errmsg(op));
    return op->status;
}

smddp_status_t smddp__request_wait_done(smddp__op_t *op, int64_t timeout_ms)
{
    /* Capped at 1e12 ms, as communicator timeouts are: INT64_MAX ms must not wrap. */
    int64_t capped_ms = SMDDP_MIN(timeout_ms, (int64_t)1000000000000LL);
    int64_t deadline = timeout_ms >= 0 ? smddp__now_ns() + capped_ms * 1000000LL : 0;
    /*
     * Collectives mostly complete on threads of other processes: a short
     * spin catches them. A send or receive completes on this process's
     * send/recv thread, which, on a rank pinned to one core, spinning here
     * would keep off the core: sleep at once.
     */
    int spins = op->kind == SMDDP_OP_SEND || op->kind == SMDDP_OP_RECV ? 0 : 2000;
    for (int i = 0; i < spins && !atomic_load(&op->done); i++) smddp__cpu_relax();
    while (!atomic_load(&op->done)) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        if (deadline) {
            int64_t left = deadline - smddp__now_ns();
            if (left <= 0) return SMDDP_IN_PROGRESS;
            if (left < 100 * 1000 * 1000) ts.tv_nsec = left;
        }
        atomic_fetch_add(&op->sleepers, 1);
        if (!atomic_load(&op->done)) smddp__futex(&op->done, FUTEX_WAIT, 0, &ts);
        atomic_fetch_sub(&op->sleepers, 1);
    }
    return smddp__request_test(op);
}
