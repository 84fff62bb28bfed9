/*
 * Collectives among the ranks of one node: every collective on 1, 2, 3 and 4
 * forked ranks (coll_ranks.c says how results are checked), with the
 * algorithms forced and staging buffers shrunk, many requests outstanding,
 * completion callbacks, and races between back-to-back operations.
 */
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "coll_ranks.h"

/* ---- allreduce ------------------------------------------------------------- */

static void test_allreduce_2(void **state) { (void)state; run(2, allreduce_rank, NULL); }
static void test_allreduce_3(void **state) { (void)state; run(3, allreduce_rank, NULL); }
static void test_allreduce_4(void **state) { (void)state; run(4, allreduce_rank, NULL); }

/* Tiny staging buffers force many rounds and every algorithm switch point. */
static void test_allreduce_small_buffers(void **state)
{
    (void)state;
    run(3, allreduce_rank, "SMDDP_SHM_BUFFER_SIZE=8192 SMDDP_ALLREDUCE_ONESHOT_MAX=64 SMDDP_STREAM_MIN=1");
}

static void test_allreduce_oneshot_forced(void **state)
{
    (void)state;
    run(3, allreduce_rank, "SMDDP_ALLREDUCE_ALGO=oneshot SMDDP_SHM_BUFFER_SIZE=8M");
}

static void test_allreduce_twoshot_forced(void **state)
{
    (void)state;
    run(2, allreduce_rank, "SMDDP_ALLREDUCE_ALGO=twoshot SMDDP_SIMD=scalar");
}

/* ---- reduce, reduce_scatter ---------------------------------------------- */

static void test_reduce_2(void **state) { (void)state; run(2, reduce_rank, NULL); }
static void test_reduce_3(void **state) { (void)state; run(3, reduce_rank, NULL); }

/* Each algorithm at every size it can run (the others fall back to the table). */
static void test_reduce_algorithms(void **state)
{
    (void)state;
    run(3, reduce_rank, "SMDDP_ALGO=reduce:two-shot");
    run(3, reduce_rank, "SMDDP_ALGO=reduce:one-shot SMDDP_SHM_BUFFER_SIZE=8192");
    run(2, reduce_rank, "SMDDP_ALGO=reduce:low-latency");
}
static void test_reduce_4(void **state) { (void)state; run(4, reduce_rank, NULL); }
static void test_reduce_small_buffers(void **state)
{
    (void)state;
    run(3, reduce_rank, "SMDDP_SHM_BUFFER_SIZE=8192 SMDDP_STREAM_MIN=1");
}

/* ---- data movement -------------------------------------------------------- */

static void test_movement_2(void **state) { (void)state; run(2, movement_rank, NULL); }
static void test_movement_3(void **state) { (void)state; run(3, movement_rank, NULL); }
static void test_movement_4(void **state) { (void)state; run(4, movement_rank, NULL); }
static void test_movement_small_buffers(void **state)
{
    (void)state;
    run(3, movement_rank, "SMDDP_SHM_BUFFER_SIZE=8192 SMDDP_STREAM_MIN=1");
}

/* ---- alltoallv with uneven splits ------------------------------------------ */

/*
 * smddp_wait(A) runs the ops queued before A and A itself, never a later one.
 * Rank 0 issues allreduces A and B, waits for A, then sends to rank 1; rank 1
 * runs A, receives, then runs B. When the progress thread had taken A while
 * the waiter queued for the execution lock, the waiter used to run B, which
 * needs rank 1, which waits for the send: stuck until SMDDP_TIMEOUT.
 */
static void wait_runs_no_later_op_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size, (void)arg;
    for (int it = 0; it < 300; it++) {
        int32_t a = rank, b = rank, msg = it;
        if (rank == 0) {
            smddp_request_t ra, rb;
            H_OK(smddp_allreduce(comm, &a, &a, 1, SMDDP_INT32, SMDDP_SUM, NULL, &ra));
            H_OK(smddp_allreduce(comm, &b, &b, 1, SMDDP_INT32, SMDDP_SUM, NULL, &rb));
            H_OK(smddp_wait(ra, SMDDP_WAIT_DEFAULT));
            H_OK(smddp_send(comm, &msg, 1, SMDDP_INT32, 1, 0, NULL, NULL));
            H_OK(smddp_wait(rb, SMDDP_WAIT_DEFAULT));
            smddp_request_free(ra);
            smddp_request_free(rb);
        } else {
            H_OK(smddp_allreduce(comm, &a, &a, 1, SMDDP_INT32, SMDDP_SUM, NULL, NULL));
            H_OK(smddp_recv(comm, &msg, 1, SMDDP_INT32, 0, 0, NULL, NULL));
            H_CHECK(msg == it, "iteration %d: received %d", it, msg);
            H_OK(smddp_allreduce(comm, &b, &b, 1, SMDDP_INT32, SMDDP_SUM, NULL, NULL));
        }
        H_CHECK(a == 1 && b == 1, "iteration %d: sums %d and %d", it, a, b);
    }
}

static void test_wait_runs_no_later_op(void **state)
{
    (void)state;
    run(2, wait_runs_no_later_op_rank, "SMDDP_TIMEOUT=5");
}

/*
 * SMDDP_COLL_WAIT_NOW: on an idle communicator the non-blocking call runs
 * the op before it returns (callback on the calling thread, request already
 * done); behind a queued op it is queued like any other, in issue order; a
 * failure shows in the request, not in the call's status. Unknown flags are
 * refused; attributes from before the flags field (a smaller size) work.
 */
typedef struct {
    pthread_t thread;
    atomic_int calls;
    smddp_status_t st;
} wait_now_cb_t;

static void wait_now_done(void *arg, smddp_status_t st)
{
    wait_now_cb_t *cb = arg;
    cb->thread = pthread_self();
    cb->st = st;
    atomic_fetch_add(&cb->calls, 1);
}

static void wait_now_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    smddp_request_t req, first;
    float x = (float)rank;

    attr.flags = 0x6;
    H_CHECK(smddp_allreduce(comm, &x, &x, 1, SMDDP_FLOAT32, SMDDP_SUM, &attr, &req) ==
                SMDDP_ERR_INVALID_ARGUMENT, "unknown flags accepted");
    H_CHECK(strstr(smddp_get_last_error(comm), "SMDDP_COLL_WAIT_NOW") != NULL,
            "unknown flags: \"%s\"", smddp_get_last_error(comm));

    attr.flags = SMDDP_COLL_WAIT_NOW;
    for (int it = 0; it < 200; it++) {
        wait_now_cb_t cb = {0};
        attr.on_complete = wait_now_done;
        attr.on_complete_arg = &cb;
        x = (float)(rank + it);
        H_OK(smddp_allreduce(comm, &x, &x, 1, SMDDP_FLOAT32, SMDDP_SUM, &attr, &req));
        H_CHECK(smddp_test(req) == SMDDP_OK, "iteration %d: not finished at return", it);
        H_CHECK(atomic_load(&cb.calls) == 1 && pthread_equal(cb.thread, pthread_self()),
                "iteration %d: callback ran %d times, or on another thread", it,
                atomic_load(&cb.calls));
        H_CHECK(x == (float)(size * it + size * (size - 1) / 2), "iteration %d: sum %g", it, x);
        smddp_request_free(req);
    }

    /* Behind an op still queued or running: issue order holds. */
    float a[4096], b = (float)rank;
    for (int i = 0; i < 4096; i++) a[i] = 1.0f;
    H_OK(smddp_allreduce(comm, a, a, 4096, SMDDP_FLOAT32, SMDDP_SUM, NULL, &first));
    attr.on_complete = NULL;
    H_OK(smddp_allreduce(comm, &b, &b, 1, SMDDP_FLOAT32, SMDDP_MAX, &attr, &req));
    H_OK(smddp_wait(req, SMDDP_WAIT_DEFAULT));
    H_OK(smddp_wait(first, SMDDP_WAIT_DEFAULT));
    H_CHECK(a[4095] == (float)size && b == (float)(size - 1), "queued: %g and %g", a[4095], b);
    smddp_request_free(first);
    smddp_request_free(req);

    /* The size callers built before attr had flags pass: accepted, no flags. */
    smddp_coll_attr_t old = SMDDP_COLL_ATTR_INIT;
    old.size = offsetof(smddp_coll_attr_t, flags);
    b = 1.0f;
    H_OK(smddp_allreduce(comm, &b, &b, 1, SMDDP_FLOAT32, SMDDP_SUM, &old, NULL));
    H_CHECK(b == (float)size, "old attribute size: sum %g", b);
    old.size = offsetof(smddp_coll_attr_t, flags) - 1;
    H_CHECK(smddp_allreduce(comm, &b, &b, 1, SMDDP_FLOAT32, SMDDP_SUM, &old, NULL) ==
                SMDDP_ERR_INVALID_ARGUMENT, "a too-small attribute size was accepted");

    /* Counts that differ between ranks fail when run: the request says so. */
    float c[2] = {0, 0};
    wait_now_cb_t cb = {0};
    attr.on_complete = wait_now_done;
    attr.on_complete_arg = &cb;
    H_OK(smddp_allreduce(comm, c, c, 1 + rank % 2, SMDDP_FLOAT32, SMDDP_SUM, &attr, &req));
    /* A rank whose peer found the mismatch first may learn of it as that peer's abort. */
    smddp_status_t st = smddp_wait(req, SMDDP_WAIT_DEFAULT);
    H_CHECK(st == SMDDP_ERR_MISMATCH || st == SMDDP_ERR_ABORTED, "mismatched counts: %s",
            smddp_get_last_error(comm));
    H_CHECK(atomic_load(&cb.calls) == 1 && cb.st == st,
            "mismatch: callback ran %d times, status %d", atomic_load(&cb.calls), (int)cb.st);
    smddp_request_free(req);
}

/*
 * SMDDP_THREAD_SCHED: libsmddp's progress and send/recv threads run under
 * SCHED_BATCH by default, SCHED_OTHER with "normal"; the application's
 * threads keep theirs. Counted from /proc (field 41 of a task's stat is its
 * policy), after a collective run by the progress thread and a send/recv.
 */
static int count_tasks_with_policy(int policy)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[300], buf[1024];
        snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        char *p = strrchr(buf, ')'); /* the name may hold spaces */
        int field = 2, value = -1;
        for (char *tok = p ? strtok(p + 1, " ") : NULL; tok; tok = strtok(NULL, " ")) {
            if (++field == 41) {
                value = atoi(tok);
                break;
            }
        }
        n += value == policy;
    }
    closedir(d);
    return n;
}

static void thread_sched_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size, (void)arg;
    const char *want = getenv("SMDDP_THREAD_SCHED");
    bool batch = !want || strcmp(want, "normal") != 0;
    float x = 1.0f;
    smddp_request_t req;
    H_OK(smddp_allreduce(comm, &x, &x, 1, SMDDP_FLOAT32, SMDDP_SUM, NULL, &req));
    while (smddp_test(req) == SMDDP_IN_PROGRESS) usleep(100); /* the progress thread runs it */
    smddp_request_free(req);
    int32_t msg = rank;
    if (rank == 0) H_OK(smddp_send(comm, &msg, 1, SMDDP_INT32, 1, 0, NULL, NULL));
    if (rank == 1) H_OK(smddp_recv(comm, &msg, 1, SMDDP_INT32, 0, 0, NULL, NULL));
    int n = count_tasks_with_policy(SCHED_BATCH);
    if (rank <= 1)
        H_CHECK(batch ? n >= 2 : n == 0, "%d SCHED_BATCH threads with SMDDP_THREAD_SCHED=%s", n,
                want ? want : "(unset)");
    H_CHECK(sched_getscheduler(0) == SCHED_OTHER, "the application's thread's policy changed");
}

static void test_thread_sched(void **state)
{
    (void)state;
    run(2, thread_sched_rank, NULL);
    run(2, thread_sched_rank, "SMDDP_THREAD_SCHED=normal");
}

/*
 * Callbacks that issue collectives and wait for them (torch's PowerSGD hook
 * does): each runs right after the op whose completion issued it, on every
 * rank, whatever the main thread queued meanwhile. Rank 0 queues the next
 * op before the first has finished, the other ranks only after; rank 1 runs
 * the first op itself (smddp_wait), so its callback runs on the main
 * thread, the others' on the progress thread. Chained and next ops have the
 * same count, so a swap between them would give wrong sums, not an error.
 */
enum { ORDER_N = 4096, ORDER_ROUNDS = 20 };

typedef struct {
    smddp_comm_t comm;
    int size;
    float chained[2][ORDER_N];
    atomic_int ok;
} order_cb_t;

static bool all_equal(const float *v, int64_t n, float want)
{
    for (int64_t i = 0; i < n; i++)
        if (v[i] != want) return false;
    return true;
}

static void order_done(void *arg, smddp_status_t st)
{
    order_cb_t *cb = arg;
    bool ok = st == SMDDP_OK;
    for (int k = 0; k < 2 && ok; k++) { /* two in a row, each waited for at once */
        smddp_request_t req;
        ok = smddp_allreduce(cb->comm, cb->chained[k], cb->chained[k], ORDER_N, SMDDP_FLOAT32,
                             SMDDP_SUM, NULL, &req) == SMDDP_OK;
        ok = ok && smddp_wait(req, SMDDP_WAIT_DEFAULT) == SMDDP_OK;
        if (ok) smddp_request_free(req);
        ok = ok && all_equal(cb->chained[k], ORDER_N, (float)(100 * (k + 1) * cb->size));
    }
    atomic_store(&cb->ok, ok);
}

static void callback_order_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    static order_cb_t cb;
    static float first[ORDER_N], next[ORDER_N];
    for (int round = 0; round < ORDER_ROUNDS; round++) {
        cb = (order_cb_t){.comm = comm, .size = size};
        for (int i = 0; i < ORDER_N; i++) {
            first[i] = 1.0f;
            next[i] = 10.0f;
            cb.chained[0][i] = 100.0f;
            cb.chained[1][i] = 200.0f;
        }
        smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
        attr.on_complete = order_done;
        attr.on_complete_arg = &cb;
        smddp_request_t a, b;
        H_OK(smddp_allreduce(comm, first, first, ORDER_N, SMDDP_FLOAT32, SMDDP_SUM, &attr, &a));
        if (rank == 1) H_OK(smddp_wait(a, SMDDP_WAIT_DEFAULT));
        if (rank > 1) usleep(2000);
        H_OK(smddp_allreduce(comm, next, next, ORDER_N, SMDDP_FLOAT32, SMDDP_SUM, NULL, &b));
        H_OK(smddp_wait(b, SMDDP_WAIT_DEFAULT));
        H_OK(smddp_wait(a, SMDDP_WAIT_DEFAULT));
        H_CHECK(atomic_load(&cb.ok), "round %d: the callback's allreduces failed or were wrong",
                round);
        H_CHECK(all_equal(first, ORDER_N, (float)size), "round %d: first allreduce wrong", round);
        H_CHECK(all_equal(next, ORDER_N, (float)(10 * size)), "round %d: next allreduce wrong",
                round);
        smddp_request_free(a);
        smddp_request_free(b);
    }
}

/*
 * Nested across communicators: a callback of comm's waits for an allreduce
 * on a second communicator, whose callback issues one on comm and waits.
 */
typedef struct {
    smddp_comm_t comm, other;
    int size;
    float other_buf[16], back[16];
    atomic_int ok;
} cross_cb_t;

static void cross_inner_done(void *arg, smddp_status_t st)
{
    cross_cb_t *cb = arg;
    smddp_request_t req;
    bool ok = st == SMDDP_OK &&
              smddp_allreduce(cb->comm, cb->back, cb->back, 16, SMDDP_FLOAT32, SMDDP_SUM, NULL,
                              &req) == SMDDP_OK;
    ok = ok && smddp_wait(req, SMDDP_WAIT_DEFAULT) == SMDDP_OK;
    if (ok) smddp_request_free(req);
    atomic_store(&cb->ok, ok && all_equal(cb->back, 16, (float)(3 * cb->size)));
}

static void cross_outer_done(void *arg, smddp_status_t st)
{
    cross_cb_t *cb = arg;
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.on_complete = cross_inner_done;
    attr.on_complete_arg = cb;
    smddp_request_t req;
    if (st == SMDDP_OK &&
        smddp_allreduce(cb->other, cb->other_buf, cb->other_buf, 16, SMDDP_FLOAT32, SMDDP_SUM,
                        &attr, &req) == SMDDP_OK) {
        (void)smddp_wait(req, SMDDP_WAIT_DEFAULT);
        smddp_request_free(req);
    }
}

static void callback_cross_comm_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    static cross_cb_t cb;
    smddp_comm_t other;
    H_OK(smddp_comm_split(comm, 0, rank, &other));
    for (int round = 0; round < ORDER_ROUNDS; round++) {
        cb = (cross_cb_t){.comm = comm, .other = other, .size = size};
        float first[16], next[16];
        for (int i = 0; i < 16; i++) {
            first[i] = 1.0f;
            next[i] = 5.0f;
            cb.other_buf[i] = 2.0f;
            cb.back[i] = 3.0f;
        }
        smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
        attr.on_complete = cross_outer_done;
        attr.on_complete_arg = &cb;
        smddp_request_t a, b;
        H_OK(smddp_allreduce(comm, first, first, 16, SMDDP_FLOAT32, SMDDP_SUM, &attr, &a));
        if (rank == 1) H_OK(smddp_wait(a, SMDDP_WAIT_DEFAULT));
        H_OK(smddp_allreduce(comm, next, next, 16, SMDDP_FLOAT32, SMDDP_SUM, NULL, &b));
        H_OK(smddp_wait(b, SMDDP_WAIT_DEFAULT));
        H_OK(smddp_wait(a, SMDDP_WAIT_DEFAULT));
        H_CHECK(atomic_load(&cb.ok), "round %d: the nested allreduces failed or were wrong",
                round);
        H_CHECK(all_equal(cb.other_buf, 16, (float)(2 * size)), "round %d: other comm", round);
        H_CHECK(all_equal(next, 16, (float)(5 * size)), "round %d: next allreduce wrong", round);
        smddp_request_free(a);
        smddp_request_free(b);
    }
    H_OK(smddp_comm_destroy(other));
}

static void test_callback_cross_comm(void **state)
{
    (void)state;
    run(2, callback_cross_comm_rank, NULL);
}

static void test_callback_order_2(void **state) { (void)state; run(2, callback_order_rank, NULL); }
static void test_callback_order_3(void **state) { (void)state; run(3, callback_order_rank, NULL); }

static void test_wait_now_2(void **state) { (void)state; run(2, wait_now_rank, NULL); }
static void test_wait_now_3(void **state) { (void)state; run(3, wait_now_rank, NULL); }

static void test_alltoallv_2(void **state) { (void)state; run(2, alltoallv_rank, NULL); }
static void test_alltoallv_3(void **state) { (void)state; run(3, alltoallv_rank, NULL); }
static void test_alltoallv_4(void **state) { (void)state; run(4, alltoallv_rank, "SMDDP_SHM_BUFFER_SIZE=65536 SMDDP_STREAM_MIN=1"); }

/* ---- many outstanding requests, completion callbacks ------------------------ */

#define NOUT 32
static void outstanding_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    smddp_request_t reqs[NOUT];
    static float bufs[NOUT][1024];
    for (int k = 0; k < NOUT; k++) {
        for (int i = 0; i < 1024; i++) bufs[k][i] = (float)(k + rank + i % 5);
        H_OK(smddp_allreduce(comm, bufs[k], bufs[k], 1024 * (k % 3 == 0 ? 1 : 1), SMDDP_FLOAT32,
                             SMDDP_SUM, NULL, &reqs[k]));
    }
    /* Wait in reverse order: completion must not depend on wait order. */
    for (int k = NOUT - 1; k >= 0; k--) {
        H_OK(smddp_wait(reqs[k], SMDDP_WAIT_DEFAULT));
        H_CHECK(smddp_test(reqs[k]) == SMDDP_OK, "test after wait");
        /* Host memory is never "on a stream" (only staged CUDA requests are). */
        H_CHECK(smddp_request_enqueued(reqs[k]) == 0, "a host request said it is enqueued");
        smddp_request_free(reqs[k]);
    }
    for (int k = 0; k < NOUT; k++)
        for (int i = 0; i < 1024; i++) {
            float want = 0;
            for (int r = 0; r < size; r++) want += (float)(k + r + i % 5);
            H_CHECK(bufs[k][i] == want, "request %d element %d: %g != %g", k, i, bufs[k][i], want);
        }
}

static void test_outstanding_3(void **state) { (void)state; run(3, outstanding_rank, NULL); }

static void test_callbacks_2(void **state) { (void)state; run(2, callback_rank, NULL); }
static void test_callbacks_3(void **state) { (void)state; run(3, callback_rank, NULL); }

static void test_half_accuracy_1_node(void **state) { (void)state; run(4, half_accuracy_rank, NULL); }

/*
 * A collective with count 0 runs no step, so a peer can get two ops ahead
 * and rewrite the desc slot this rank is reading for the mismatch check. The
 * check must not report that half-written desc as a mismatch (it once did,
 * about one run in a hundred of the small-buffer test). Ranks outnumber the
 * cores so that a reader is often preempted between its wait and its read.
 */
static void empty_ops_race_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    for (int i = 0; i < 20000; i++) {
        int64_t h = i, all[16];
        H_OK(smddp_allgather(comm, &h, all, 1, SMDDP_INT64, NULL, NULL));
        for (int r = 0; r < size; r++) H_CHECK(all[r] == i, "iteration %d: rank %d sent %lld", i, r, (long long)all[r]);
        H_OK(smddp_allreduce(comm, &h, &h, 0, SMDDP_INT64, SMDDP_SUM, NULL, NULL));
        int64_t v = rank + i;
        H_OK(smddp_allreduce(comm, &v, &v, 1, SMDDP_INT64, SMDDP_MAX, NULL, NULL));
        H_CHECK(v == size - 1 + i, "iteration %d: max is %lld", i, (long long)v);
    }
}

static void test_empty_ops_race(void **state)
{
    (void)state;
    run(3, empty_ops_race_rank, NULL);
    run(4, empty_ops_race_rank, "SMDDP_CHECK_ORDER=1");
}

static void test_single_rank(void **state)
{
    (void)state;
    run(1, allreduce_rank, NULL);
    run(1, movement_rank, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_rank),
        cmocka_unit_test(test_empty_ops_race),
        cmocka_unit_test(test_allreduce_2),
        cmocka_unit_test(test_allreduce_3),
        cmocka_unit_test(test_allreduce_4),
        cmocka_unit_test(test_allreduce_small_buffers),
        cmocka_unit_test(test_allreduce_oneshot_forced),
        cmocka_unit_test(test_allreduce_twoshot_forced),
        cmocka_unit_test(test_reduce_2),
        cmocka_unit_test(test_reduce_3),
        cmocka_unit_test(test_reduce_4),
        cmocka_unit_test(test_reduce_algorithms),
        cmocka_unit_test(test_reduce_small_buffers),
        cmocka_unit_test(test_movement_2),
        cmocka_unit_test(test_movement_3),
        cmocka_unit_test(test_movement_4),
        cmocka_unit_test(test_movement_small_buffers),
        cmocka_unit_test(test_alltoallv_2),
        cmocka_unit_test(test_wait_runs_no_later_op),
        cmocka_unit_test(test_wait_now_2),
        cmocka_unit_test(test_wait_now_3),
        cmocka_unit_test(test_thread_sched),
        cmocka_unit_test(test_alltoallv_3),
        cmocka_unit_test(test_alltoallv_4),
        cmocka_unit_test(test_outstanding_3),
        cmocka_unit_test(test_callbacks_2),
        cmocka_unit_test(test_callbacks_3),
        cmocka_unit_test(test_callback_order_2),
        cmocka_unit_test(test_callback_order_3),
        cmocka_unit_test(test_callback_cross_comm),
        cmocka_unit_test(test_half_accuracy_1_node),
    };
    /* TEST_FILTER=pattern runs only the matching tests (cmocka's wildcards). */
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
