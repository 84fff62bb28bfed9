/*
 * The per-communicator scheduler: a FIFO of operations and one progress
 * thread that runs them in issue order.
 *
 * Whoever executes operations holds exec_lock: normally the progress thread,
 * but two shortcuts run them on a caller's thread instead and so save the
 * thread hand-offs that dominate small-message latency:
 *  - a blocking call (req == NULL), or a host one whose issuer waits for it at
 *    once (SMDDP_COLL_WAIT_NOW), on an idle communicator runs its operation
 *    at once; the queue is empty and exec_lock is taken before the queue lock
 *    is released, so issue order holds;
 *  - smddp_wait() on a request that is still queued runs the queue's head
 *    operations, in order, until its own has run, whenever exec_lock is
 *    free; it never blocks on exec_lock, and never runs a later operation.
 * An operation is taken off the queue only by a thread holding exec_lock, so
 * operations always run one at a time, in issue order. Completion (callback,
 * done flag, wake-up) happens after exec_lock is released.
 *
 * Operations issued from a completion callback (a torch comm hook whose
 * Future callback issues the next collective, and may wait for it, as
 * PowerSGD's does) are the exception to issue order. When the callback runs
 * depends on timing: on one rank the main thread has queued its next
 * collective by then, on another not yet. So such an operation goes to the
 * head of the queue, taking the sequence number of the first one queued
 * (which move up), and no other thread starts an operation while one
 * completes an operation that has a callback: on every rank it runs right
 * after the operation whose completion issued it, as with NCCL, where those
 * callbacks run at issue. The issue itself runs it, since the progress
 * thread, if it is the one in the callback, would never come back to it.
 * This holds for host operations; a CUDA one issued there is queued as
 * usual (a staged one has put its stream work behind that of the CUDA
 * operations queued before it). Callbacks that run elsewhere (send/recv
 * completions, on the send/recv thread) issue in plain issue order.
 */
#include <linux/futex.h>
#include <string.h>

#include "exec.h"
#include "fail.h"
#include "p2p/p2p.h"
#include "param.h"
#include "progress.h"
#include "queue.h"
#include "trace.h"

/* Executes one op (exec_lock held); failures abort the communicator so later ops fail fast. */
static smddp_status_t run_op(smddp_comm_t comm, smddp__op_t *op, int64_t now_ns)
{
    /*
     * A peer that aborted may have posted its part of this op before it gave
     * up, so the op could still "succeed" here alone (a one-shot allreduce
     * does): adopt the peer's abort before running anything.
     */
    smddp_status_t alive = smddp__comm_check_alive(comm, op);
    if (alive < 0) {
        smddp__progress_add_where(comm, op, alive);
        return alive;
    }
    if (!now_ns) now_ns = smddp__now_ns();
    smddp__trace_start(comm->trace, op, now_ns);
    op->started_ns = now_ns;
    op->deadline_ns = now_ns + smddp__op_timeout_ms(comm, op) * 1000000LL;
    smddp__clear_error();
    smddp_status_t st = smddp__op_execute(comm, op);
    /*
     * Whatever stops an op here (an invalid argument found only now, such as
     * a host buffer passed as CUDA memory on this rank alone, included) leaves
     * the peers inside it: abort, so that they fail at once too.
     */
    if (st < 0) {
        /*
         * Where every rank stands goes into the abort message that peers of
         * this node adopt; across nodes it can only be known once the abort
         * has reached the other nodes.
         */
        if (comm->node_count == 1) smddp__progress_add_where(comm, op, st);
        smddp__comm_fail(comm, st, smddp__last_error());
        if (comm->node_count > 1) smddp__progress_add_where(comm, op, st);
        SMDDP_WARN("rank %d: %s", comm->rank, smddp__last_error());
    }
    /* Each op starts its own clock for polling remote aborts. */
    atomic_store(&comm->remote_abort_polled_ns, 0);
    return st;
}

/*
 * The ops this thread is completing, innermost first: a callback may wait
 * for an op of another communicator whose callback issues one of this one.
 */
typedef struct completing_frame {
    smddp_comm_t comm;
    struct completing_frame *outer;
} completing_frame_t;
static __thread completing_frame_t *completing_top;

/* Whether this thread is inside a completion callback of comm's. */
static bool completing_here(smddp_comm_t comm)
{
    for (const completing_frame_t *f = completing_top; f; f = f->outer)
        if (f->comm == comm) return true;
    return false;
}

/*
 * Completes op, which this thread has just run (exec_lock held, and released
 * here). While its callback runs, no other thread starts an op (see the top).
 */
static void complete_locked(smddp_comm_t comm, smddp__op_t *op, smddp_status_t st)
{
    if (!op->on_complete) { /* nothing can issue an op meanwhile */
        pthread_mutex_unlock(&comm->exec_lock);
        smddp__op_complete(op, st);
        return;
    }
    atomic_fetch_add(&comm->completing, 1);
    pthread_mutex_unlock(&comm->exec_lock);
    completing_frame_t frame = {comm, completing_top};
    completing_top = &frame;
    smddp__op_complete(op, st);
    completing_top = frame.outer;
    /* Paired with progress_main: one of the two sees the other's change. */
    if (atomic_fetch_sub(&comm->completing, 1) == 1 && atomic_load(&comm->completion_waiters)) {
        pthread_mutex_lock(&comm->lock);
        pthread_cond_signal(&comm->cond);
        pthread_mutex_unlock(&comm->lock);
    }
}

/*
 * Runs the queue's head to completion on this thread, exec_lock held (and
 * released here); false if the queue was empty, or if upto (when not NULL)
 * has left the queue: a waiter runs the ops queued before its own and its
 * own, never a later one. Also false while another thread completes an op
 * with a callback (see the top).
 */
static bool run_head_locked(smddp_comm_t comm, const smddp__op_t *upto)
{
    pthread_mutex_lock(&comm->lock);
    bool blocked =
        (upto && !upto->queued) || (atomic_load(&comm->completing) && !completing_here(comm));
    smddp__op_t *op = blocked ? NULL : comm->head;
    if (op) {
        comm->head = op->next;
        if (!comm->head) comm->tail = NULL;
        op->queued = false;
    }
    pthread_mutex_unlock(&comm->lock);
    if (!op) {
        pthread_mutex_unlock(&comm->exec_lock);
        return false;
    }
    smddp_status_t st = run_op(comm, op, 0);
    complete_locked(comm, op, st);
    smddp__request_unref(op); /* the engine's reference */
    return true;
}

/* True while op sits in its communicator's queue, not started. */
static bool still_queued(smddp__op_t *op)
{
    if (op->kind == SMDDP_OP_SEND || op->kind == SMDDP_OP_RECV) return false;
    pthread_mutex_lock(&op->comm->lock);
    bool queued = op->queued;
    pthread_mutex_unlock(&op->comm->lock);
    return queued;
}

/*
 * Runs the queue's head operations on this thread, in order, until op has
 * left the queue; never blocks on exec_lock: while another thread executes,
 * sleeps briefly on op's done word instead. That thread may be running op
 * itself, and after it the next op, which may need something this thread
 * does once op is done (a send): blocked there, this thread would see op
 * done only after the next op, perhaps never.
 */
static void run_until(smddp__op_t *op)
{
    while (!atomic_load(&op->done) && still_queued(op)) {
        if (pthread_mutex_trylock(&op->comm->exec_lock) == 0) {
            if (!run_head_locked(op->comm, op)) break;
            continue;
        }
        struct timespec ts = {0, 200 * 1000};
        atomic_fetch_add(&op->sleepers, 1);
        if (!atomic_load(&op->done)) smddp__futex(&op->done, FUTEX_WAIT, 0, &ts);
        atomic_fetch_sub(&op->sleepers, 1);
    }
}

/* The progress thread's turn: blocks while another thread runs an op. */
static bool run_head(smddp_comm_t comm)
{
    pthread_mutex_lock(&comm->exec_lock);
    return run_head_locked(comm, NULL);
}

static void *progress_main(void *arg)
{
    smddp_comm_t comm = arg;
    smddp__library_thread_begin("progress");
    for (;;) {
        /*
         * exec_lock is taken only for queued work, so that a caller finding
         * the communicator idle (no queue, exec_lock free) runs its op at
         * once rather than find this thread checking an empty queue.
         */
        pthread_mutex_lock(&comm->lock);
        for (;;) {
            if (!comm->head && !comm->stopping) { /* an issue signals */
                pthread_cond_wait(&comm->cond, &comm->lock);
                continue;
            }
            /* Work, but another thread completes an op: complete_locked signals. */
            atomic_fetch_add(&comm->completion_waiters, 1);
            bool wait = atomic_load(&comm->completing) > 0;
            if (wait) pthread_cond_wait(&comm->cond, &comm->lock);
            atomic_fetch_sub(&comm->completion_waiters, 1);
            if (!wait) break;
        }
        bool stop = !comm->head && comm->stopping;
        pthread_mutex_unlock(&comm->lock);
        if (stop) return NULL;
        while (run_head(comm)) continue;
    }
}

smddp_status_t smddp__sched_start(smddp_comm_t comm)
{
    int rc = pthread_create(&comm->thread, NULL, progress_main, comm);
    if (rc != 0)
        return smddp__error(SMDDP_ERR_SYSTEM, "cannot start the progress thread: %s", strerror(rc));
    comm->thread_started = true;
    atomic_fetch_add(&comm->threads, 1);
    return SMDDP_OK;
}

void smddp__sched_stop(smddp_comm_t comm)
{
    if (!comm->thread_started) return;
    pthread_mutex_lock(&comm->lock);
    comm->stopping = true;
    pthread_cond_signal(&comm->cond);
    pthread_mutex_unlock(&comm->lock);
    pthread_join(comm->thread, NULL);
    comm->thread_started = false;
}

smddp_status_t smddp__submit(smddp_comm_t comm, smddp__op_t *op, smddp_request_t *req)
{
    pthread_mutex_lock(&comm->lock);
    if (comm->stopping) {
        pthread_mutex_unlock(&comm->lock);
        smddp__request_unref(op);
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT, "communicator is being destroyed");
    }
    if (op->kind == SMDDP_OP_SEND || op->kind == SMDDP_OP_RECV) {
        op->path = "p2p";
        smddp__trace_start(comm->trace, op, smddp__trace_issue(comm->trace, op));
        smddp_status_t st = smddp__p2p_submit(comm, op);
        if (st < 0) smddp__trace_finish(comm->trace, op, st);
        pthread_mutex_unlock(&comm->lock);
        if (st < 0 || !req) {
            if (st >= 0) st = smddp__request_wait(op, -1);
            smddp__request_unref(op);
            return st;
        }
        *req = op;
        return SMDDP_OK;
    }
    /*
     * Issued from a completion callback on this thread: see the top. Only
     * host ops: a staged CUDA op's stream work is enqueued at issue, behind
     * that of CUDA ops queued before it, which must run first.
     */
    bool in_callback = completing_here(comm);
    bool first = in_callback && op->mem_type == SMDDP_MEM_HOST;
    uint64_t span = op->seq_span ? op->seq_span : 1;
    op->seq = first && comm->head ? comm->head->seq : comm->next_seq;
    comm->next_seq += span;
    for (smddp__op_t *q = first ? comm->head : NULL; q; q = q->next) {
        q->seq += span;
        smddp__trace_reseq(comm->trace, q);
    }
    /* One clock read serves the recorder's issue time and, run here, the start. */
    int64_t now = smddp__trace_issue(comm->trace, op);

    /*
     * A host op its issuer waits for at once runs here, on an idle
     * communicator, rather than wake the progress thread only for the
     * issuer to take the op back in smddp_wait(): that hand-off costs more
     * than a small collective. A CUDA op goes to the queue like any other
     * (its caller waits on the stream, not on the host).
     */
    bool run_now = !req || (op->wait_now && op->mem_type == SMDDP_MEM_HOST);
    run_now = run_now && smddp__params()->inline_exec && !comm->head &&
              pthread_mutex_trylock(&comm->exec_lock) == 0;
    /* Read with exec_lock held: a completing thread counted itself before releasing it. */
    if (run_now && !in_callback && atomic_load(&comm->completing)) {
        pthread_mutex_unlock(&comm->exec_lock);
        run_now = false;
    }
    if (run_now) {
        pthread_mutex_unlock(&comm->lock);
        smddp_status_t st = run_op(comm, op, now);
        complete_locked(comm, op, st);
        if (req) { /* finished: its status is the request's */
            *req = op;
            return SMDDP_OK;
        }
        if (st < 0) smddp__error_quiet(st, "%s", smddp__op_errmsg(op));
        smddp__request_unref(op);
        return st;
    }

    atomic_fetch_add(&op->refs, 1); /* the engine's reference */
    op->queued = true;
    if (first) {
        op->next = comm->head;
        comm->head = op;
        if (!comm->tail) comm->tail = op;
    } else {
        if (comm->tail)
            comm->tail->next = op;
        else
            comm->head = op;
        comm->tail = op;
    }
    pthread_cond_signal(&comm->cond);
    pthread_mutex_unlock(&comm->lock);

    if (req) {
        *req = op;
        /* Issued from a completion callback on this thread: see the top. */
        if (first) run_until(op);
        return SMDDP_OK;
    }
    smddp_status_t st = smddp__request_wait(op, -1);
    smddp__request_unref(op);
    return st;
}

smddp_status_t smddp__request_wait(smddp__op_t *op, int64_t timeout_ms)
{
    /*
     * An unbounded wait runs the queue up to op itself rather than waiting
     * for the progress thread to be scheduled; a bounded one cannot, since a
     * running collective cannot be left at the caller's deadline, except in
     * a completion callback, where no other thread would run it.
     */
    if (completing_here(op->comm) || (timeout_ms < 0 && smddp__params()->inline_exec))
        run_until(op);
    return smddp__request_wait_done(op, timeout_ms);
}

/*
 * Under SMDDP_CUDA_NET=auto, before a communicator spanning nodes issues its
 * first CUDA collective: every rank learns whether NCCL loads on all of
 * them (a host allreduce, in issue order like any op), so that all route alike.
 */
static smddp_status_t agree_cuda_route(smddp_comm_t comm)
{
    const char *why = NULL;
    int32_t ok = smddp__route_nccl_here(&why);
    smddp__op_t *op =
        smddp__op_make(comm, SMDDP_OP_ALLREDUCE, &ok, &ok, 1, SMDDP_INT32, SMDDP_MIN, -1);
    if (!op) return SMDDP_ERR_NO_MEMORY;
    SMDDP_CHECK(smddp__submit(comm, op, NULL));
    smddp__route_agreed(comm, ok, why);
    return SMDDP_OK;
}

smddp_status_t smddp__issue(smddp_comm_t comm, smddp__op_t *op, smddp_request_t *req)
{
    if (op->mem_type == SMDDP_MEM_CUDA) {
        smddp_status_t st = SMDDP_OK;
        if (!smddp__op_traits(op->kind)->p2p && smddp__route_needs_agreement(comm))
            st = agree_cuda_route(comm);
        if (st == SMDDP_OK) st = smddp__route_prepare(comm, op);
        if (st != SMDDP_OK) {
            smddp__request_unref(op);
            return st;
        }
    }
    return smddp__submit(comm, op, req);
}
