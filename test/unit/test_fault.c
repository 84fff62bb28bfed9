/*
 * Every way a communicator can fail, each checked for its status, for a
 * message that names what went wrong (operation, sequence number, the ranks
 * involved), for bounded time (nothing may hang: every wait below is far
 * shorter than the deadline it would otherwise run into) and for what it
 * leaves in /dev/shm. Ranks are forked by the harness; a rank asserts with
 * H_CHECK, and the parent asserts that every rank ended as expected.
 *
 * Leftover segments are recognised by name: local rank 0 creates
 * /dev/shm/smddp-<its pid>-<random>, so a run leaked one exactly when an
 * entry names the pid of one of its ranks. Counting all smddp-* entries
 * would also count those of other test programs running at the same time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "param.h"
#include "store/store.h"
#include "topo.h"
#include "transport/net.h"

/* ---- helpers ---------------------------------------------------------------- */

/* Filled by the ranks, read by the parent: lives in a shared anonymous mapping. */
typedef struct shared {
    int pids[16];
} shared_t;

static shared_t *sh;

static double now_s(void) { return (double)smddp__now_ns() / 1e9; }

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void record_pid(int rank) { sh->pids[rank] = (int)getpid(); }

/* The number of /dev/shm/smddp-<pid>-* entries whose pid is one of the ranks'. */
static int leftover_segments(int nranks)
{
    int n = 0;
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid;
        if (sscanf(e->d_name, "smddp-%d-", &pid) != 1) continue;
        for (int r = 0; r < nranks; r++) {
            if (sh->pids[r] == pid) {
                fprintf(stderr, "leftover shared memory /dev/shm/%s (rank %d)\n", e->d_name, r);
                n++;
            }
        }
    }
    closedir(d);
    return n;
}

/*
 * Runs fn on nranks ranks and asserts they all ended as expected and left no
 * shared memory behind. signals may be NULL.
 */
static void run(int nranks, harness_fn_t fn, void *arg, const char *env, int no_comm,
                const int *signals)
{
    harness_opts_t opts = {.env = env, .timeout_s = 60, .no_comm = no_comm};
    if (signals)
        for (int r = 0; r < nranks; r++) opts.expect_signal[r] = signals[r];
    memset(sh, 0, sizeof(*sh));
    int before = harness_shm_count();
    assert_int_equal(harness_run(nranks, fn, arg, &opts), 0);
    int after = harness_shm_count();
    if (after > before)
        fprintf(stderr, "note: /dev/shm has %d smddp-* entries, %d before (other tests running?)\n",
                after, before);
    assert_int_equal(leftover_segments(nranks), 0);
}

#define H_HAS(msg, needle)                                                                 \
    H_CHECK(strstr((msg), (needle)) != NULL, "message \"%s\" does not contain \"%s\"", (msg), \
            (needle))

#define H_STATUS(st, want)                                                                 \
    H_CHECK((st) == (want), "status %s (%d), expected %s: %s", smddp_status_string(st),    \
            (int)(st), smddp_status_string(want), smddp_get_last_error(NULL))

/* A small allreduce that must succeed and give 1 + 2 + ... + size. */
static void check_usable(smddp_comm_t comm, int rank, int size)
{
    int32_t in[5], out[5];
    for (int i = 0; i < 5; i++) in[i] = rank + 1 + i;
    H_OK(smddp_allreduce(comm, in, out, 5, SMDDP_INT32, SMDDP_SUM, NULL, NULL));
    for (int i = 0; i < 5; i++)
        H_CHECK(out[i] == size * (size + 1) / 2 + size * i, "allreduce after an error: [%d] = %d",
                i, out[i]);
}

/* Allreduce of 64 floats; returns its status and how long it took in *secs. */
static smddp_status_t timed_allreduce(smddp_comm_t comm, double *secs)
{
    float in[64], out[64];
    for (int i = 0; i < 64; i++) in[i] = (float)i;
    double t0 = now_s();
    smddp_status_t st = smddp_allreduce(comm, in, out, 64, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL);
    *secs = now_s() - t0;
    return st;
}

/* ---- a peer killed in the middle of a collective ------------------------------ */

static void kill_rank_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    record_pid(rank);
    double dt;
    H_OK(timed_allreduce(comm, &dt));
    if (rank == 1) raise(SIGKILL);

    smddp_status_t st = timed_allreduce(comm, &dt);
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st == SMDDP_ERR_PEER_LOST || st == SMDDP_ERR_ABORTED,
            "allreduce with a dead peer: %s: %s", smddp_status_string(st), msg);
    H_CHECK(dt < 5.0, "a dead peer was noticed after %.2f s", dt);
    H_HAS(msg, "rank 1");
    H_HAS(msg, "allreduce");
    H_HAS(msg, "seq 1");
    if (st == SMDDP_ERR_PEER_LOST) H_HAS(msg, "died");
    H_CHECK(strcmp(smddp_get_last_error(comm), msg) == 0, "comm error \"%s\" != thread error \"%s\"",
            smddp_get_last_error(comm), msg);

    /* The communicator is aborted now: everything after fails at once. */
    st = timed_allreduce(comm, &dt);
    H_STATUS(st, SMDDP_ERR_ABORTED);
    H_CHECK(dt < 1.0, "an allreduce on an aborted communicator took %.2f s", dt);
    msg = smddp_get_last_error(NULL);
    H_HAS(msg, "aborted");
    H_HAS(msg, "rank 1"); /* the first failure is carried along */
    smddp_request_t req = NULL;
    H_OK(smddp_barrier(comm, NULL, &req));
    H_STATUS(smddp_wait(req, 5000), SMDDP_ERR_ABORTED);
    H_STATUS(smddp_test(req), SMDDP_ERR_ABORTED);
    smddp_request_free(req);
    int32_t x = rank;
    H_STATUS(smddp_send(comm, &x, 1, SMDDP_INT32, rank == 0 ? 2 : 0, 0, NULL, NULL),
             SMDDP_ERR_ABORTED);
}

static void test_kill_peer_during_allreduce(void **state)
{
    (void)state;
    const int signals[3] = {0, SIGKILL, 0};
    run(3, kill_rank_fn, NULL, "SMDDP_TIMEOUT=600", 0, signals);
}

/* Rank 0, which created the segment, dies while rank 1 waits on a request. */
static void kill_root_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    record_pid(rank);
    static float in[100000], out[100000];
    H_OK(smddp_allreduce(comm, in, out, 100000, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    if (rank == 0) raise(SIGKILL);
    smddp_request_t req;
    double t0 = now_s();
    H_OK(smddp_allreduce(comm, in, out, 100000, SMDDP_FLOAT32, SMDDP_MAX, NULL, &req));
    smddp_status_t st = smddp_wait(req, SMDDP_WAIT_DEFAULT);
    double dt = now_s() - t0;
    H_STATUS(st, SMDDP_ERR_PEER_LOST);
    H_CHECK(dt < 5.0, "a dead peer was noticed after %.2f s", dt);
    const char *msg = smddp_get_last_error(NULL);
    H_HAS(msg, "rank 0");
    H_HAS(msg, "allreduce (seq 1");
    H_HAS(msg, "max");
    H_HAS(smddp_get_last_error(comm), "rank 0");
    smddp_request_free(req);
}

static void test_kill_segment_creator_nonblocking(void **state)
{
    (void)state;
    const int signals[2] = {SIGKILL, 0};
    run(2, kill_root_fn, NULL, "SMDDP_TIMEOUT=600", 0, signals);
}

/* ---- the deadline ------------------------------------------------------------- */

static void timeout_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    record_pid(rank);
    double dt;
    if (rank == 0) {
        smddp_status_t st = timed_allreduce(comm, &dt);
        const char *msg = smddp_get_last_error(NULL);
        H_STATUS(st, SMDDP_ERR_TIMEOUT);
        H_CHECK(dt > 0.9 && dt < 2.5, "SMDDP_TIMEOUT=1 fired after %.2f s", dt);
        H_HAS(msg, "allreduce (seq 0");
        H_HAS(msg, "rank(s) 1");
        H_HAS(msg, "1.000 s");
        /* Later operations fail fast with the timeout as the reason. */
        st = timed_allreduce(comm, &dt);
        H_STATUS(st, SMDDP_ERR_ABORTED);
        H_CHECK(dt < 1.0, "allreduce after a timeout took %.2f s", dt);
        H_HAS(smddp_get_last_error(NULL), "timed out");
        return;
    }
    sleep_ms(3000);
    /* Rank 0 gave up and aborted the communicator long ago. */
    smddp_status_t st = timed_allreduce(comm, &dt);
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_ABORTED);
    H_CHECK(dt < 1.0, "a late allreduce on a communicator aborted by a peer took %.2f s", dt);
    H_HAS(msg, "rank 0");
    H_HAS(msg, "allreduce");
}

static void test_timeout(void **state)
{
    (void)state;
    run(2, timeout_fn, NULL, "SMDDP_TIMEOUT=1", 0, NULL);
}

/* smddp_comm_set_timeout: SMDDP_TIMEOUT is 600 s, the communicator is set to 1 s. */
static void set_timeout_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    record_pid(rank);
    H_STATUS(smddp_comm_set_timeout(comm, 0), SMDDP_ERR_INVALID_ARGUMENT);
    H_HAS(smddp_get_last_error(NULL), "timeout_ms is 0");
    /* "Forever" is capped, not overflowed into a deadline in the past: rank 0 waits. */
    H_OK(smddp_comm_set_timeout(comm, INT64_MAX));
    if (rank == 1) sleep_ms(300);
    check_usable(comm, rank, size);
    H_OK(smddp_comm_set_timeout(comm, 1000));
    check_usable(comm, rank, size);
    if (rank == 0) {
        double dt;
        smddp_status_t st = timed_allreduce(comm, &dt);
        H_STATUS(st, SMDDP_ERR_TIMEOUT);
        H_CHECK(dt > 0.9 && dt < 2.5, "a 1 s communicator timeout fired after %.2f s", dt);
        H_HAS(smddp_get_last_error(NULL), "1.000 s");
        return;
    }
    sleep_ms(3000);
}

static void test_set_timeout(void **state)
{
    (void)state;
    run(2, set_timeout_fn, NULL, "SMDDP_TIMEOUT=600", 0, NULL);
}

/*
 * smddp_coll_attr_t::timeout_ms: an operation's own timeout (0.7 s for an
 * allreduce, 0.5 s for a receive) fires instead of the communicator's 600 s,
 * and its message gives it; a negative one is refused.
 */
static void op_timeout_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    bool p2p = arg != NULL;
    record_pid(rank);
    if (rank == 1) {
        sleep_ms(3000);
        return;
    }
    float in[8] = {0}, out[8];
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.timeout_ms = -5;
    H_STATUS(smddp_allreduce(comm, in, out, 8, SMDDP_FLOAT32, SMDDP_SUM, &attr, NULL),
             SMDDP_ERR_INVALID_ARGUMENT);
    H_HAS(smddp_get_last_error(NULL), "attr->timeout_ms is -5");
    attr.timeout_ms = p2p ? 500 : 700;
    double t0 = now_s();
    smddp_status_t st = p2p ? smddp_recv(comm, out, 8, SMDDP_FLOAT32, 1, 0, &attr, NULL)
                            : smddp_allreduce(comm, in, out, 8, SMDDP_FLOAT32, SMDDP_SUM, &attr,
                                              NULL);
    double dt = now_s() - t0;
    H_STATUS(st, SMDDP_ERR_TIMEOUT);
    H_CHECK(dt > (p2p ? 0.4 : 0.6) && dt < 2.0, "a %s timeout fired after %.2f s",
            p2p ? "0.5 s recv" : "0.7 s allreduce", dt);
    H_HAS(smddp_get_last_error(NULL), p2p ? "0.500 s" : "0.700 s");
}

static void test_op_timeout(void **state)
{
    (void)state;
    run(2, op_timeout_fn, NULL, "SMDDP_TIMEOUT=600", 0, NULL);
    int p2p = 1;
    run(2, op_timeout_fn, &p2p, "SMDDP_TIMEOUT=600", 0, NULL);
}

/*
 * A non-root waits for a broadcast root that is late: the message names the
 * root. 2 KiB, staged (in the low-latency slots, up to 1 KiB, every rank
 * waits for every other, and the message names all that are missing).
 */
static void bcast_timeout_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    record_pid(rank);
    static float buf[512];
    if (rank == 2) {
        sleep_ms(2500);
    } else if (rank == 1) {
        double t0 = now_s();
        smddp_status_t st = smddp_broadcast(comm, buf, 512, SMDDP_FLOAT32, 2, NULL, NULL);
        double dt = now_s() - t0;
        const char *msg = smddp_get_last_error(NULL);
        H_STATUS(st, SMDDP_ERR_TIMEOUT);
        H_CHECK(dt > 0.9 && dt < 2.2, "SMDDP_TIMEOUT=1 fired after %.2f s", dt);
        H_HAS(msg, "broadcast (seq 0");
        H_HAS(msg, "rank 2");
        return;
    }
    /* Rank 0 (and the late root) find the communicator aborted by a peer. */
    if (rank == 0) sleep_ms(1800);
    smddp_status_t st = smddp_broadcast(comm, buf, 512, SMDDP_FLOAT32, 2, NULL, NULL);
    H_STATUS(st, SMDDP_ERR_ABORTED);
    H_HAS(smddp_get_last_error(NULL), "aborted the communicator");
    H_HAS(smddp_get_last_error(NULL), "timed out");
}

static void test_timeout_broadcast_root(void **state)
{
    (void)state;
    run(3, bcast_timeout_fn, NULL, "SMDDP_TIMEOUT=1", 0, NULL);
}

/* Ranks loop on large allreduces while rank 1 is killed at a random point in one. */
static void *kill_me_later(void *arg)
{
    sleep_ms(*(int *)arg);
    raise(SIGKILL);
    return NULL;
}

static void kill_midway_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    record_pid(rank);
    size_t n = 1 << 20; /* several pipeline rounds of the two-shot algorithm */
    float *in = calloc(n, sizeof(float)), *out = calloc(n, sizeof(float));
    H_CHECK(in && out, "out of memory");
    H_OK(smddp_allreduce(comm, in, out, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    static int delay_ms;
    if (rank == 1) {
        pthread_t t;
        delay_ms = 20 + (int)(getpid() % 60);
        H_CHECK(pthread_create(&t, NULL, kill_me_later, &delay_ms) == 0, "pthread_create");
    }
    smddp_status_t st = SMDDP_OK;
    double t_fail = 0;
    for (int i = 0; i < 100000 && st == SMDDP_OK; i++) {
        double t0 = now_s();
        st = smddp_allreduce(comm, in, out, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL);
        t_fail = now_s() - t0;
    }
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st == SMDDP_ERR_PEER_LOST || st == SMDDP_ERR_ABORTED, "%s: %s",
            smddp_status_string(st), msg);
    H_CHECK(t_fail < 5.0, "the failing allreduce took %.2f s", t_fail);
    H_HAS(msg, "rank 1");
    H_HAS(msg, "allreduce (seq");
    free(in);
    free(out);
}

static void test_kill_peer_midway_large(void **state)
{
    (void)state;
    const int signals[3] = {0, SIGKILL, 0};
    run(3, kill_midway_fn, NULL, "SMDDP_TIMEOUT=600", 0, signals);
}

/* Queued requests on a communicator whose peer died all fail, and destroy is quick. */
typedef struct cb_record {
    atomic_int calls;
    smddp_status_t status;
} cb_record_t;

static void record_completion(void *arg, smddp_status_t status)
{
    cb_record_t *rec = arg;
    rec->status = status;
    atomic_fetch_add(&rec->calls, 1);
}

static void queued_fn(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    (void)arg;
    record_pid(rank);
    smddp_comm_t comm = harness_comm(rank, size, "queued");
    check_usable(comm, rank, size);
    if (rank == 1) raise(SIGKILL);
    int32_t in[4][8] = {{0}}, out[4][8];
    smddp_request_t req[4];
    cb_record_t rec[4] = {{0}};
    for (int i = 0; i < 4; i++) {
        smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
        attr.on_complete = record_completion;
        attr.on_complete_arg = &rec[i];
        H_OK(smddp_allreduce(comm, in[i], out[i], 8, SMDDP_INT32, SMDDP_SUM, &attr, &req[i]));
    }
    H_STATUS(smddp_wait(req[0], SMDDP_WAIT_DEFAULT), SMDDP_ERR_PEER_LOST);
    for (int i = 1; i < 4; i++) {
        H_STATUS(smddp_wait(req[i], 2000), SMDDP_ERR_ABORTED);
        H_HAS(smddp_get_last_error(NULL), "rank 1");
    }
    /* Each callback ran once, before its wait returned, with the request's status. */
    for (int i = 0; i < 4; i++) {
        H_CHECK(atomic_load(&rec[i].calls) == 1, "callback %d ran %d times", i,
                atomic_load(&rec[i].calls));
        H_CHECK(rec[i].status == smddp_test(req[i]), "callback %d got %s, the request says %s", i,
                smddp_status_string(rec[i].status), smddp_status_string(smddp_test(req[i])));
    }
    /* The requests outlive the communicator. */
    double t0 = now_s();
    H_OK(smddp_comm_destroy(comm));
    H_CHECK(now_s() - t0 < 1.0, "destroy took %.2f s", now_s() - t0);
    for (int i = 0; i < 4; i++) {
        H_CHECK(smddp_test(req[i]) < 0, "request %d lost its status", i);
        smddp_request_free(req[i]);
    }
}

static void test_queued_requests_after_peer_death(void **state)
{
    (void)state;
    const int signals[2] = {0, SIGKILL};
    run(2, queued_fn, NULL, "SMDDP_TIMEOUT=600", 1, signals);
}

/* ---- SMDDP_CHECK_ORDER --------------------------------------------------------- */

typedef enum mismatch_kind { MM_COUNT, MM_KIND, MM_DTYPE, MM_ROOT } mismatch_kind_t;

static void mismatch_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    record_pid(rank);
    mismatch_kind_t kind = *(const mismatch_kind_t *)arg;
    float buf[16] = {0}, out[16];
    check_usable(comm, rank, size); /* seq 0 matches */
    smddp_status_t st = SMDDP_OK;
    double t0 = now_s();
    switch (kind) {
    case MM_COUNT:
        st = smddp_allreduce(comm, buf, out, rank == 0 ? 10 : 11, SMDDP_FLOAT32, SMDDP_SUM, NULL,
                             NULL);
        break;
    case MM_KIND:
        st = rank == 0 ? smddp_allreduce(comm, buf, out, 10, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL)
                       : smddp_broadcast(comm, buf, 10, SMDDP_FLOAT32, 0, NULL, NULL);
        break;
    case MM_DTYPE:
        st = smddp_allreduce(comm, buf, out, 10, rank == 0 ? SMDDP_FLOAT32 : SMDDP_INT32,
                             SMDDP_SUM, NULL, NULL);
        break;
    case MM_ROOT:
        st = smddp_broadcast(comm, buf, 10, SMDDP_FLOAT32, rank, NULL, NULL);
        break;
    }
    double dt = now_s() - t0;
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_MISMATCH);
    H_CHECK(dt < 2.0, "the mismatch took %.2f s to report", dt);
    H_HAS(msg, "seq 1");
    H_HAS(msg, "rank 0");
    H_HAS(msg, "rank 1");
    switch (kind) {
    case MM_COUNT:
        H_HAS(msg, "count 10");
        H_HAS(msg, "count 11");
        break;
    case MM_KIND:
        H_HAS(msg, "allreduce");
        H_HAS(msg, "broadcast");
        break;
    case MM_DTYPE:
        H_HAS(msg, "float32");
        H_HAS(msg, "int32");
        break;
    case MM_ROOT:
        H_HAS(msg, "root 0");
        H_HAS(msg, "root 1");
        break;
    }
    H_HAS(smddp_get_last_error(comm), "mismatch");
    /* A mismatch leaves the ranks out of step: the communicator is aborted. */
    double dt2;
    H_STATUS(timed_allreduce(comm, &dt2), SMDDP_ERR_ABORTED);
    H_CHECK(dt2 < 1.0, "allreduce after a mismatch took %.2f s", dt2);
}

static void test_mismatch_count(void **state)
{
    (void)state;
    mismatch_kind_t k = MM_COUNT;
    run(2, mismatch_fn, &k, "SMDDP_CHECK_ORDER=1 SMDDP_TIMEOUT=600", 0, NULL);
}

static void test_mismatch_kind(void **state)
{
    (void)state;
    mismatch_kind_t k = MM_KIND;
    run(2, mismatch_fn, &k, "SMDDP_CHECK_ORDER=1 SMDDP_TIMEOUT=600", 0, NULL);
}

static void test_mismatch_dtype(void **state)
{
    (void)state;
    mismatch_kind_t k = MM_DTYPE;
    run(2, mismatch_fn, &k, "SMDDP_CHECK_ORDER=1 SMDDP_TIMEOUT=600", 0, NULL);
}

static void test_mismatch_root(void **state)
{
    (void)state;
    mismatch_kind_t k = MM_ROOT;
    run(2, mismatch_fn, &k, "SMDDP_CHECK_ORDER=1 SMDDP_TIMEOUT=600", 0, NULL);
}

/*
 * Without SMDDP_CHECK_ORDER, every rank still publishes what it runs and
 * compares it at its first wait: a mismatch is an error, never a wrong result
 * reported as success.
 */
static void test_mismatch_count_unchecked(void **state)
{
    (void)state;
    mismatch_kind_t k = MM_COUNT;
    run(2, mismatch_fn, &k, "SMDDP_TIMEOUT=600", 0, NULL);
}

static void test_mismatch_kind_unchecked(void **state)
{
    (void)state;
    mismatch_kind_t k = MM_KIND;
    run(2, mismatch_fn, &k, "SMDDP_TIMEOUT=600", 0, NULL);
}

static void test_mismatch_dtype_unchecked(void **state)
{
    (void)state;
    mismatch_kind_t k = MM_DTYPE;
    run(2, mismatch_fn, &k, "SMDDP_TIMEOUT=600", 0, NULL);
}

static void test_mismatch_root_unchecked(void **state)
{
    (void)state;
    mismatch_kind_t k = MM_ROOT;
    run(2, mismatch_fn, &k, "SMDDP_TIMEOUT=600", 0, NULL);
}

/* ---- smddp_comm_abort ------------------------------------------------------------ */

static void abort_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    record_pid(rank);
    double dt;
    check_usable(comm, rank, size);
    if (rank == 0) {
        sleep_ms(300);
        H_OK(smddp_comm_abort(comm));
        H_OK(smddp_comm_abort(comm)); /* any number of times */
        H_STATUS(timed_allreduce(comm, &dt), SMDDP_ERR_ABORTED);
        H_CHECK(dt < 1.0, "allreduce after smddp_comm_abort took %.2f s", dt);
        H_HAS(smddp_get_last_error(NULL), "smddp_comm_abort");
        H_HAS(smddp_get_last_error(comm), "smddp_comm_abort");
        smddp_request_t req = NULL;
        int32_t x = 0;
        H_OK(smddp_allgather(comm, &x, &x, 0, SMDDP_INT32, NULL, &req));
        H_STATUS(smddp_wait(req, 1000), SMDDP_ERR_ABORTED);
        smddp_request_free(req);
        H_STATUS(smddp_recv(comm, &x, 1, SMDDP_INT32, 1, 0, NULL, NULL), SMDDP_ERR_ABORTED);
        return;
    }
    smddp_status_t st = timed_allreduce(comm, &dt);
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_ABORTED);
    H_CHECK(dt < 3.0, "rank 0's abort reached rank 1 after %.2f s", dt);
    H_HAS(msg, "rank 0");
    H_HAS(msg, "allreduce (seq 1");
    H_HAS(msg, "smddp_comm_abort");
    H_STATUS(timed_allreduce(comm, &dt), SMDDP_ERR_ABORTED);
    H_CHECK(dt < 1.0, "allreduce after the abort took %.2f s", dt);
}

static void test_abort_peer(void **state)
{
    (void)state;
    run(2, abort_fn, NULL, "SMDDP_TIMEOUT=600", 0, NULL);
}

static void *abort_later(void *arg)
{
    sleep_ms(200);
    smddp_comm_abort(arg);
    return NULL;
}

/* Another thread aborts while this rank's own allreduce waits for a late peer. */
static void abort_thread_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    record_pid(rank);
    double dt;
    if (rank == 0) {
        pthread_t t;
        H_CHECK(pthread_create(&t, NULL, abort_later, comm) == 0, "pthread_create");
        smddp_status_t st = timed_allreduce(comm, &dt);
        pthread_join(t, NULL);
        H_STATUS(st, SMDDP_ERR_ABORTED);
        H_CHECK(dt < 2.0, "the abort from another thread took %.2f s to end the allreduce", dt);
        H_HAS(smddp_get_last_error(NULL), "smddp_comm_abort on rank 0");
        return;
    }
    sleep_ms(1500);
    smddp_status_t st = timed_allreduce(comm, &dt);
    H_STATUS(st, SMDDP_ERR_ABORTED);
    H_CHECK(dt < 1.0, "allreduce on a communicator aborted by a peer took %.2f s", dt);
    H_HAS(smddp_get_last_error(NULL), "rank 0");
}

static void test_abort_from_thread(void **state)
{
    (void)state;
    run(2, abort_thread_fn, NULL, "SMDDP_TIMEOUT=600", 0, NULL);
}

/* ---- a rank that leaves early ------------------------------------------------------ */

static void early_destroy_fn(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    (void)arg;
    record_pid(rank);
    smddp_comm_t comm = harness_comm(rank, size, "early");
    check_usable(comm, rank, size);
    if (rank == 0) {
        H_OK(smddp_comm_destroy(comm));
        sleep_ms(1500); /* stay alive: the peer must see "left", not "died" */
        return;
    }
    sleep_ms(300);
    double dt;
    smddp_status_t st = timed_allreduce(comm, &dt);
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_PEER_LOST);
    H_CHECK(dt < 2.0, "a departed peer was noticed after %.2f s", dt);
    H_HAS(msg, "rank 0");
    H_HAS(msg, "left");
    H_HAS(msg, "allreduce (seq 1");
    H_STATUS(timed_allreduce(comm, &dt), SMDDP_ERR_ABORTED);
    H_OK(smddp_comm_destroy(comm));
}

static void test_early_destroy(void **state)
{
    (void)state;
    run(2, early_destroy_fn, NULL, "SMDDP_TIMEOUT=600", 1, NULL);
}

/* A receive from a rank that destroyed its communicator without sending. */
static void p2p_left_fn(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    (void)arg;
    record_pid(rank);
    smddp_comm_t comm = harness_comm(rank, size, "p2pleft");
    check_usable(comm, rank, size);
    if (rank == 0) {
        H_OK(smddp_comm_destroy(comm));
        sleep_ms(1500);
        return;
    }
    int32_t x = 0;
    double t0 = now_s();
    smddp_status_t st = smddp_recv(comm, &x, 1, SMDDP_INT32, 0, 3, NULL, NULL);
    double dt = now_s() - t0;
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_PEER_LOST);
    H_CHECK(dt < 3.0, "a departed sender was noticed after %.2f s", dt);
    H_HAS(msg, "recv");
    H_HAS(msg, "rank 0");
    H_HAS(msg, "tag 3");
    H_OK(smddp_comm_destroy(comm));
}

static void test_recv_from_departed_peer(void **state)
{
    (void)state;
    run(2, p2p_left_fn, NULL, "SMDDP_TIMEOUT=600", 1, NULL);
}

/* A large send to a receiver that is killed before it receives. */
static void p2p_kill_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    record_pid(rank);
    check_usable(comm, rank, 2);
    if (rank == 1) raise(SIGKILL);
    size_t n = 1 << 20; /* four times the default pair ring */
    char *buf = calloc(n, 1);
    H_CHECK(buf, "out of memory");
    double t0 = now_s();
    smddp_status_t st = smddp_send(comm, buf, (int64_t)n, SMDDP_UINT8, 1, 4, NULL, NULL);
    double dt = now_s() - t0;
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_PEER_LOST);
    H_CHECK(dt < 3.0, "a dead receiver was noticed after %.2f s", dt);
    H_HAS(msg, "send (to rank 1");
    H_HAS(msg, "died");
    free(buf);
}

static void test_send_to_killed_peer(void **state)
{
    (void)state;
    const int signals[2] = {0, SIGKILL};
    run(2, p2p_kill_fn, NULL, "SMDDP_TIMEOUT=600", 0, signals);
}

/* A receive that nobody sends to times out; one blocked in recv sees a peer's abort. */
static void p2p_timeout_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    record_pid(rank);
    int32_t x = 0;
    if (rank == 0) {
        double t0 = now_s();
        smddp_status_t st = smddp_recv(comm, &x, 1, SMDDP_INT32, 1, 2, NULL, NULL);
        double dt = now_s() - t0;
        const char *msg = smddp_get_last_error(NULL);
        H_STATUS(st, SMDDP_ERR_TIMEOUT);
        H_CHECK(dt > 0.9 && dt < 2.5, "SMDDP_TIMEOUT=1 fired after %.2f s", dt);
        H_HAS(msg, "recv (from rank 1");
        H_HAS(msg, "rank 1 did not send");
        return;
    }
    /*
     * Rank 0's timeout aborts the communicator; a receive posted later (so
     * that its own deadline comes after rank 0's) must learn of it then.
     */
    sleep_ms(500);
    smddp_request_t req;
    double t0 = now_s();
    H_OK(smddp_recv(comm, &x, 1, SMDDP_INT32, 0, 2, NULL, &req));
    smddp_status_t st = smddp_wait(req, 10000);
    double dt = now_s() - t0;
    H_STATUS(st, SMDDP_ERR_ABORTED);
    H_CHECK(dt < 0.9, "recv learnt of rank 0's abort after %.2f s", dt);
    H_HAS(smddp_get_last_error(NULL), "rank 0 aborted the communicator");
    H_HAS(smddp_get_last_error(NULL), "timed out");
    smddp_request_free(req);
}

static void test_recv_timeout(void **state)
{
    (void)state;
    run(2, p2p_timeout_fn, NULL, "SMDDP_TIMEOUT=1", 0, NULL);
}

static void p2p_abort_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    record_pid(rank);
    int32_t x = 0;
    if (rank == 0) {
        sleep_ms(300);
        H_OK(smddp_comm_abort(comm));
        return;
    }
    double t0 = now_s();
    smddp_status_t st = smddp_recv(comm, &x, 1, SMDDP_INT32, 0, 0, NULL, NULL);
    double dt = now_s() - t0;
    H_STATUS(st, SMDDP_ERR_ABORTED);
    H_CHECK(dt < 2.0, "the abort reached a blocked recv after %.2f s", dt);
    H_HAS(smddp_get_last_error(NULL), "rank 0");
    H_HAS(smddp_get_last_error(NULL), "recv (from rank 0");
}

/* A send issued after the peer aborted fails like a collective would, even a small one. */
static void p2p_after_abort_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    record_pid(rank);
    int32_t x = 5;
    if (rank == 0) {
        H_OK(smddp_comm_abort(comm));
        sleep_ms(600);
        return;
    }
    sleep_ms(300);
    smddp_status_t st = smddp_send(comm, &x, 1, SMDDP_INT32, 0, 0, NULL, NULL);
    H_STATUS(st, SMDDP_ERR_ABORTED);
    H_HAS(smddp_get_last_error(NULL), "rank 0 aborted the communicator");
}

static void test_send_after_peer_abort(void **state)
{
    (void)state;
    run(2, p2p_after_abort_fn, NULL, "SMDDP_TIMEOUT=600", 0, NULL);
}

static void test_abort_during_recv(void **state)
{
    (void)state;
    run(2, p2p_abort_fn, NULL, "SMDDP_TIMEOUT=600", 0, NULL);
}

/* ---- mismatched alltoallv counts and send/recv tags ---------------------------------- */

static void alltoallv_mismatch_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    record_pid(rank);
    int64_t sc[3], sd[3], rc[3], rd[3];
    int32_t sbuf[30] = {0}, rbuf[30];
    for (int j = 0; j < size; j++) {
        sc[j] = 2;
        sd[j] = 2 * j;
        rc[j] = 2;
        rd[j] = 2 * j;
    }
    /* Rank 1 expects 3 elements from rank 2, which sends 2. */
    if (rank == 1) rc[2] = 3;
    double t0 = now_s();
    smddp_status_t st = smddp_alltoallv(comm, sbuf, sc, sd, rbuf, rc, rd, SMDDP_INT32, NULL, NULL);
    double dt = now_s() - t0;
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_MISMATCH);
    H_CHECK(dt < 2.0, "the alltoallv mismatch took %.2f s", dt);
    H_HAS(msg, "alltoallv");
    H_HAS(msg, "rank 2 sends 2 elements to rank 1");
    H_HAS(msg, "recvcounts[2]");
}

static void test_alltoallv_mismatch(void **state)
{
    (void)state;
    run(3, alltoallv_mismatch_fn, NULL, "SMDDP_TIMEOUT=600", 0, NULL);
}

/*
 * Messages match by tag: a receive takes the message with its tag, whatever
 * the send order; a receive of another size fails and the message is
 * dropped, and the others still arrive intact. A receive for a tag nobody
 * sends times out, naming the tags the sender's waiting messages carry.
 */
static void tag_mismatch_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    record_pid(rank);
    int32_t buf[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[8];
    if (rank == 0) {
        /* Small messages complete without the receiver. */
        H_OK(smddp_send(comm, buf, 8, SMDDP_INT32, 1, 5, NULL, NULL));
        H_OK(smddp_send(comm, buf, 8, SMDDP_INT32, 1, 7, NULL, NULL));
        H_OK(smddp_send(comm, buf, 8, SMDDP_INT32, 1, 9, NULL, NULL));
    } else {
        double t0 = now_s();
        smddp_status_t st = smddp_recv(comm, got, 4, SMDDP_INT32, 0, 7, NULL, NULL);
        double dt = now_s() - t0;
        const char *msg = smddp_get_last_error(NULL);
        H_STATUS(st, SMDDP_ERR_MISMATCH);
        H_CHECK(dt < 2.0, "the size mismatch took %.2f s", dt);
        H_HAS(msg, "tag 7");
        H_HAS(msg, "32 bytes");
        H_HAS(msg, "expects 16");
        H_HAS(msg, "rank 0");
        H_HAS(smddp_get_last_error(comm), "tag 7");
        /* The stream stays in step: the other two arrive intact, the later one first. */
        memset(got, 0, sizeof(got));
        H_OK(smddp_recv(comm, got, 8, SMDDP_INT32, 0, 9, NULL, NULL));
        H_CHECK(memcmp(got, buf, sizeof(buf)) == 0, "message with tag 9 is corrupt");
        memset(got, 0, sizeof(got));
        H_OK(smddp_recv(comm, got, 8, SMDDP_INT32, 0, 5, NULL, NULL));
        H_CHECK(memcmp(got, buf, sizeof(buf)) == 0, "message with tag 5 is corrupt");
    }
    check_usable(comm, rank, 2);
    if (rank == 0) {
        H_OK(smddp_send(comm, buf, 8, SMDDP_INT32, 1, 4, NULL, NULL));
        H_OK(smddp_send(comm, buf, 8, SMDDP_INT32, 1, 8, NULL, NULL));
        sleep_ms(2000);
        return;
    }
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.timeout_ms = 500;
    smddp_status_t st = smddp_recv(comm, got, 8, SMDDP_INT32, 0, 6, &attr, NULL);
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_TIMEOUT);
    H_HAS(msg, "tag 6");
    H_HAS(msg, "rank 0 did not send it (it sent messages with tags 4, 8 that no receive took)");
}

static void test_p2p_mismatch(void **state)
{
    (void)state;
    run(2, tag_mismatch_fn, NULL, "SMDDP_TIMEOUT=600", 0, NULL);
}

/* ---- argument checks ----------------------------------------------------------------- */

/*
 * Runs `call`, which must fail with `want` at once, leave both last-error
 * messages containing `word` (the communicator's only when comm is not NULL),
 * and leave the communicator `real` usable.
 */
#define EXPECT_ERR(real, comm, want, word, call)                                               \
    do {                                                                                       \
        double t0_ = now_s();                                                                  \
        smddp_status_t st_ = (call);                                                           \
        double dt_ = now_s() - t0_;                                                            \
        H_CHECK(st_ == (want), "%s returned %s, expected %s: %s", #call,                        \
                smddp_status_string(st_), smddp_status_string(want),                           \
                smddp_get_last_error(NULL));                                                   \
        H_CHECK(dt_ < 0.5, "%s took %.3f s to fail", #call, dt_);                               \
        H_CHECK(strstr(smddp_get_last_error(NULL), (word)) != NULL,                            \
                "%s: thread error \"%s\" does not contain \"%s\"", #call,                      \
                smddp_get_last_error(NULL), (word));                                           \
        if ((comm) != NULL)                                                                    \
            H_CHECK(strstr(smddp_get_last_error(comm), (word)) != NULL,                        \
                    "%s: communicator error \"%s\" does not contain \"%s\"", #call,            \
                    smddp_get_last_error(comm), (word));                                       \
        H_CHECK(req == sentinel, "%s changed *req on error", #call);                            \
        check_usable((real), rank, size);                                                      \
    } while (0)

#define INVALID(word, call) EXPECT_ERR(comm, comm, SMDDP_ERR_INVALID_ARGUMENT, word, call)
#define INVALID_NOCOMM(word, call) \
    EXPECT_ERR(comm, (smddp_comm_t)NULL, SMDDP_ERR_INVALID_ARGUMENT, word, call)

static void bad_args_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    record_pid(rank);
    const smddp_request_t sentinel = (smddp_request_t)(uintptr_t)0x5eed;
    smddp_request_t req = sentinel;
    float f[16] = {0}, g[16];
    int32_t n[16] = {0}, m[16];
    int other = 1 - rank;
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;

    INVALID_NOCOMM("comm is NULL", smddp_allreduce(NULL, f, g, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, &req));
    INVALID_NOCOMM("comm is NULL", smddp_barrier(NULL, NULL, &req));
    INVALID_NOCOMM("comm is NULL", smddp_send(NULL, f, 1, SMDDP_FLOAT32, other, 0, NULL, &req));
    INVALID_NOCOMM("comm is NULL", smddp_recv(NULL, f, 1, SMDDP_FLOAT32, other, 0, NULL, &req));
    INVALID("sendbuf", smddp_allreduce(comm, NULL, g, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, &req));
    INVALID("recvbuf", smddp_allreduce(comm, f, NULL, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, &req));
    INVALID("buf", smddp_broadcast(comm, NULL, 4, SMDDP_FLOAT32, 0, NULL, &req));
    INVALID("count", smddp_allreduce(comm, f, g, -1, SMDDP_FLOAT32, SMDDP_SUM, NULL, &req));
    INVALID("sendcount", smddp_allgather(comm, f, g, -3, SMDDP_FLOAT32, NULL, &req));
    INVALID("overflows", smddp_allgather(comm, f, g, INT64_MAX / 2, SMDDP_FLOAT32, NULL, &req));
    INVALID("dtype", smddp_allreduce(comm, f, g, 4, (smddp_dtype_t)42, SMDDP_SUM, NULL, &req));
    INVALID("accepted", smddp_broadcast(comm, f, 4, (smddp_dtype_t)-1, 0, NULL, &req));
    INVALID("op 42", smddp_allreduce(comm, f, g, 4, SMDDP_FLOAT32, (smddp_op_t)42, NULL, &req));
    INVALID("accepted", smddp_reduce(comm, f, g, 4, SMDDP_FLOAT32, (smddp_op_t)-2, 0, NULL, &req));
    INVALID("band", smddp_allreduce(comm, f, g, 4, SMDDP_FLOAT32, SMDDP_BAND, NULL, &req));
    INVALID("float32", smddp_reduce_scatter(comm, f, g, 2, SMDDP_FLOAT32, SMDDP_BXOR, NULL, &req));
    INVALID("premul_sum", smddp_allreduce(comm, n, m, 4, SMDDP_INT32, SMDDP_PREMUL_SUM, NULL, &req));
    INVALID("root -1", smddp_reduce(comm, f, g, 4, SMDDP_FLOAT32, SMDDP_SUM, -1, NULL, &req));
    INVALID("root 2", smddp_broadcast(comm, f, 4, SMDDP_FLOAT32, size, NULL, &req));
    INVALID("root", smddp_gather(comm, f, g, 1, SMDDP_FLOAT32, size, NULL, &req));
    INVALID("root", smddp_scatter(comm, f, g, 1, SMDDP_FLOAT32, -1, NULL, &req));
    INVALID("this rank", smddp_send(comm, f, 1, SMDDP_FLOAT32, rank, 0, NULL, &req));
    INVALID("this rank", smddp_recv(comm, f, 1, SMDDP_FLOAT32, rank, 0, NULL, &req));
    INVALID("peer", smddp_send(comm, f, 1, SMDDP_FLOAT32, size, 0, NULL, &req));
    INVALID("tag -1", smddp_send(comm, f, 1, SMDDP_FLOAT32, other, -1, NULL, &req));
    INVALID("tag", smddp_recv(comm, f, 1, SMDDP_FLOAT32, other, -7, NULL, &req));

    attr.mem_type = SMDDP_MEM_CUDA;
    EXPECT_ERR(comm, comm, SMDDP_ERR_NOT_SUPPORTED, "CUDA",
               smddp_allreduce(comm, f, g, 4, SMDDP_FLOAT32, SMDDP_SUM, &attr, &req));
    EXPECT_ERR(comm, comm, SMDDP_ERR_NOT_SUPPORTED, "CUDA",
               smddp_send(comm, f, 4, SMDDP_FLOAT32, other, 0, &attr, &req));
    attr.mem_type = (smddp_mem_type_t)7;
    INVALID("memory type 7", smddp_allreduce(comm, f, g, 4, SMDDP_FLOAT32, SMDDP_SUM, &attr, &req));
    attr = (smddp_coll_attr_t)SMDDP_COLL_ATTR_INIT;
    attr.size = 0;
    INVALID("attr->size", smddp_allreduce(comm, f, g, 4, SMDDP_FLOAT32, SMDDP_SUM, &attr, &req));

    int64_t counts[2] = {1, 1}, displs[2] = {0, 1}, neg[2] = {1, -1};
    INVALID("sendcounts", smddp_alltoallv(comm, f, NULL, displs, g, counts, displs, SMDDP_FLOAT32,
                                          NULL, &req));
    INVALID("rdispls", smddp_alltoallv(comm, f, counts, displs, g, counts, NULL, SMDDP_FLOAT32,
                                       NULL, &req));
    INVALID("recvcounts[1]", smddp_alltoallv(comm, f, counts, displs, g, neg, displs,
                                             SMDDP_FLOAT32, NULL, &req));
    INVALID("sdispls[1]", smddp_alltoallv(comm, f, counts, neg, g, counts, displs, SMDDP_FLOAT32,
                                          NULL, &req));
    INVALID("in-place", smddp_alltoallv(comm, f, counts, displs, f, counts, displs, SMDDP_FLOAT32,
                                        NULL, &req));
    INVALID("in-place", smddp_alltoall(comm, f, f, 2, SMDDP_FLOAT32, NULL, &req));
    INVALID("overlaps", smddp_reduce_scatter(comm, f, f + 1, 2, SMDDP_FLOAT32, SMDDP_SUM, NULL,
                                             &req));

    /* Communicator and request calls. */
    smddp_comm_t sub = (smddp_comm_t)(uintptr_t)0x5eed;
    int out = -7;
    INVALID_NOCOMM("comm is NULL", smddp_comm_rank(NULL, &out));
    INVALID("output", smddp_comm_size(comm, NULL));
    H_CHECK(out == -7, "an output parameter changed on error");
    INVALID_NOCOMM("comm is NULL", smddp_comm_split(NULL, 0, 0, &sub));
    INVALID("newcomm", smddp_comm_split(comm, 0, 0, NULL));
    INVALID("color -5", smddp_comm_split(comm, -5, 0, &sub));
    H_CHECK(sub == (smddp_comm_t)(uintptr_t)0x5eed, "split changed *newcomm on error");
    INVALID_NOCOMM("comm is NULL", smddp_comm_abort(NULL));
    INVALID_NOCOMM("req", smddp_test(NULL));
    INVALID_NOCOMM("req", smddp_wait(NULL, SMDDP_WAIT_DEFAULT));

    /* A bad timeout on a real request: the operation must be unaffected. */
    smddp_request_t r;
    int32_t in = rank + 1, res = 0;
    H_OK(smddp_allreduce(comm, &in, &res, 1, SMDDP_INT32, SMDDP_SUM, NULL, &r));
    INVALID("timeout_ms", smddp_wait(r, -5));
    H_OK(smddp_wait(r, SMDDP_WAIT_DEFAULT));
    H_CHECK(res == 3, "allreduce around a bad smddp_wait: %d", res);
    smddp_request_free(r);

    /* NULL buffers are fine when nothing is moved. */
    H_OK(smddp_allreduce(comm, NULL, NULL, 0, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    smddp_request_free(NULL);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    /* The order check would catch an invalid call that used up a sequence number. */
    run(2, bad_args_fn, NULL, "SMDDP_CHECK_ORDER=1 SMDDP_TIMEOUT=600", 0, NULL);
}

static smddp_status_t dummy_set(void *ctx, const char *key, const void *v, size_t len)
{
    (void)ctx, (void)key, (void)v, (void)len;
    return SMDDP_ERR_STORE;
}
static smddp_status_t dummy_get(void *ctx, const char *key, int64_t t, void **v, size_t *len)
{
    (void)ctx, (void)key, (void)t, (void)v, (void)len;
    return SMDDP_ERR_STORE;
}
static smddp_status_t dummy_add(void *ctx, const char *key, int64_t d, int64_t *r)
{
    (void)ctx, (void)key, (void)d, (void)r;
    return SMDDP_ERR_STORE;
}

/* Creation arguments are checked before the store is touched; no ranks needed. */
static void test_bad_create_arguments(void **state)
{
    (void)state;
    smddp_store_t store = {sizeof(smddp_store_t), NULL, dummy_set, dummy_get, dummy_add, NULL};
    smddp_comm_config_t cfg = SMDDP_COMM_CONFIG_INIT;
    smddp_comm_t comm = (smddp_comm_t)(uintptr_t)0x5eed;
    char longp[200];
    memset(longp, 'p', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = '\0';
    struct {
        smddp_status_t st;
        const char *word;
    } cases[9];
    int k = 0;
#define CASE(w, call) cases[k].st = (call), cases[k].word = (w), k++
    CASE("output", smddp_comm_create(&store, 0, 1, NULL, NULL));
    CASE("store", smddp_comm_create(NULL, 0, 1, NULL, &comm));
    store.size = 8;
    CASE("store->size is 8", smddp_comm_create(&store, 0, 1, NULL, &comm));
    store.size = sizeof(store);
    CASE("world_size is 0", smddp_comm_create(&store, 0, 0, NULL, &comm));
    CASE("rank 2 is out of range", smddp_comm_create(&store, 2, 2, NULL, &comm));
    CASE("rank -1", smddp_comm_create(&store, -1, 2, NULL, &comm));
    cfg.size = 0;
    CASE("SMDDP_COMM_CONFIG_INIT", smddp_comm_create(&store, 0, 2, &cfg, &comm));
    CASE("SMDDP_COMM_CONFIG_INIT", smddp_comm_create_from_env(&cfg, &comm));
    cfg = (smddp_comm_config_t)SMDDP_COMM_CONFIG_INIT;
    cfg.prefix = longp;
    CASE("prefix", smddp_comm_create(&store, 0, 2, &cfg, &comm));
#undef CASE
    for (int i = 0; i < k; i++) {
        if (cases[i].st != SMDDP_ERR_INVALID_ARGUMENT)
            fail_msg("case %d (%s): %s", i, cases[i].word, smddp_status_string(cases[i].st));
    }
    /* Each message is checked right after its call. */
    assert_int_equal(smddp_comm_create(&store, 5, 3, NULL, &comm), SMDDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(smddp_get_last_error(NULL), "rank 5 is out of range [0, 3)"));
    cfg.prefix = longp;
    assert_int_equal(smddp_comm_create(&store, 0, 2, &cfg, &comm), SMDDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(smddp_get_last_error(NULL), "prefix"));
    assert_true(comm == (smddp_comm_t)(uintptr_t)0x5eed);
    /* A store that fails is reported as such, with the key. */
    assert_int_equal(smddp_comm_create(&store, 0, 1, NULL, &comm), SMDDP_ERR_STORE);
    assert_non_null(strstr(smddp_get_last_error(NULL), "smddp/topo"));
    assert_true(comm == (smddp_comm_t)(uintptr_t)0x5eed);
    assert_int_equal(smddp_comm_destroy(NULL), SMDDP_OK);
}

/* ---- issue order with blocking and non-blocking calls mixed ----------------------- */

/*
 * A non-blocking allreduce followed at once by a blocking one: the blocking
 * call may run on the caller's thread only if nothing issued before it is
 * still pending, else the two run in different orders on different ranks.
 * With SMDDP_CHECK_ORDER=1 such a swap is a MISMATCH; without it, wrong sums.
 */
static void mixed_order_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    record_pid(rank);
    for (int it = 0; it < 3000; it++) {
        int32_t a = rank + 1, b = 10 * (rank + 1), ra = 0, rb = 0;
        smddp_request_t req;
        H_OK(smddp_allreduce(comm, &a, &ra, 1, SMDDP_INT32, SMDDP_SUM, NULL, &req));
        smddp_status_t st = smddp_allreduce(comm, &b, &rb, 1, SMDDP_INT32, SMDDP_MAX, NULL, NULL);
        H_CHECK(st == SMDDP_OK, "iteration %d: blocking allreduce after a non-blocking one: %s",
                it, smddp_get_last_error(NULL));
        H_OK(smddp_wait(req, SMDDP_WAIT_DEFAULT));
        smddp_request_free(req);
        H_CHECK(ra == size * (size + 1) / 2 && rb == 10 * size,
                "iteration %d: sum %d, max %d", it, ra, rb);
    }
}

static void test_mixed_blocking_order(void **state)
{
    (void)state;
    run(2, mixed_order_fn, NULL, "SMDDP_CHECK_ORDER=1 SMDDP_TIMEOUT=600", 0, NULL);
}

/* ---- a caller's own timeout ------------------------------------------------------------ */

static void wait_timeout_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    record_pid(rank);
    float in[1000], out[1000];
    for (int i = 0; i < 1000; i++) in[i] = (float)(rank + i);
    if (rank == 1) sleep_ms(600);
    smddp_request_t req;
    H_OK(smddp_allreduce(comm, in, out, 1000, SMDDP_FLOAT32, SMDDP_SUM, NULL, &req));
    if (rank == 0) {
        double t0 = now_s();
        smddp_status_t st = smddp_wait(req, 50);
        double dt = now_s() - t0;
        H_STATUS(st, SMDDP_IN_PROGRESS);
        H_CHECK(dt >= 0.045 && dt < 1.0, "smddp_wait(50 ms) returned after %.3f s", dt);
        t0 = now_s();
        H_STATUS(smddp_wait(req, 0), SMDDP_IN_PROGRESS);
        H_CHECK(now_s() - t0 < 0.3, "smddp_wait(0) blocked");
        H_STATUS(smddp_test(req), SMDDP_IN_PROGRESS);
    }
    H_OK(smddp_wait(req, SMDDP_WAIT_DEFAULT));
    H_OK(smddp_wait(req, 0)); /* a finished request stays finished */
    H_OK(smddp_test(req));
    smddp_request_free(req);
    for (int i = 0; i < 1000; i++)
        H_CHECK(out[i] == (float)(1 + 2 * i), "out[%d] = %g", i, (double)out[i]);
    check_usable(comm, rank, size);
}

static void test_wait_caller_timeout(void **state)
{
    (void)state;
    run(2, wait_timeout_fn, NULL, "SMDDP_TIMEOUT=600", 0, NULL);
}

/* ---- /dev/shm after normal and failed runs ----------------------------------------------- */

static void normal_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    record_pid(rank);
    check_usable(comm, rank, size);
    /* A split makes one more segment per new communicator; it must go too. */
    smddp_comm_t sub;
    int sub_rank, sub_size;
    H_OK(smddp_comm_split(comm, rank % 2, 0, &sub));
    H_OK(smddp_comm_rank(sub, &sub_rank));
    H_OK(smddp_comm_size(sub, &sub_size));
    check_usable(sub, sub_rank, sub_size);
    H_OK(smddp_comm_destroy(sub));
}

static void test_shm_clean_after_normal_run(void **state)
{
    (void)state;
    run(3, normal_fn, NULL, NULL, 0, NULL);
}

/* Rank 1 is killed before it joins: rank 0's creation times out naming it. */
static void killed_before_join_fn(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    (void)arg;
    record_pid(rank);
    if (rank == 1) raise(SIGKILL);
    smddp_comm_t comm = (smddp_comm_t)(uintptr_t)0x5eed;
    double t0 = now_s();
    smddp_status_t st = harness_try_comm(rank, size, "kbj", -1, &comm);
    double dt = now_s() - t0;
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_TIMEOUT);
    H_CHECK(dt > 1.5 && dt < 4.0, "creation gave up after %.2f s with SMDDP_TIMEOUT=2", dt);
    H_HAS(msg, "rank 1 of 2");
    H_HAS(msg, "did not join");
    H_CHECK(comm == (smddp_comm_t)(uintptr_t)0x5eed, "*comm changed on error");
}

static void test_killed_before_join(void **state)
{
    (void)state;
    const int signals[2] = {0, SIGKILL};
    run(2, killed_before_join_fn, NULL, "SMDDP_TIMEOUT=2", 1, signals);
}

/* Sets key in the harness's store by hand, as a rank's creation would. */
static void publish(const char *key, const void *value, size_t len)
{
    smddp_store_t store;
    H_OK(smddp__tcp_client_connect("127.0.0.1", harness_store_port, 30000, NULL, &store));
    H_OK(store.set(store.ctx, key, value, len));
    store.release(store.ctx);
}

/*
 * Rank 1 joins the rendezvous (publishes its node record, the node name and
 * its settings' agreement record, by hand, as smddp_comm_create would) and
 * is killed before it maps the segment rank 0 created: rank 0 must time out
 * in the setup barrier and remove the segment.
 */
static void killed_in_setup_fn(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    (void)arg;
    record_pid(rank);
    if (rank == 1) {
        static char settings[8192], record[8400];
        size_t len = smddp__params_agree_record(settings, sizeof(settings));
        H_CHECK(len < sizeof(settings), "the settings' record takes %zu bytes", len);
        len = smddp__topo_record(record, sizeof(record), "fault-node", settings);
        H_CHECK(len <= sizeof(record), "the node record takes %zu bytes", len);
        publish("kis/host/1", record, len);
        raise(SIGKILL);
    }
    smddp_comm_t comm = NULL;
    double t0 = now_s();
    smddp_status_t st = harness_try_comm(rank, size, "kis", -1, &comm);
    double dt = now_s() - t0;
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_TIMEOUT);
    H_CHECK(dt > 1.5 && dt < 4.0, "creation gave up after %.2f s with SMDDP_TIMEOUT=2", dt);
    H_HAS(msg, "shared-memory setup");
    H_HAS(msg, "rank(s) 1");
}

static void test_killed_during_shm_setup(void **state)
{
    (void)state;
    const int signals[2] = {0, SIGKILL};
    run(2, killed_in_setup_fn, NULL, "SMDDP_TIMEOUT=2 SMDDP_HOSTNAME=fault-node", 1, signals);
}

/*
 * Rank 1 publishes a node record as an older libsmddp would (the node name
 * alone, read by every rank): rank 0 refuses at once, saying why.
 */
static void old_record_fn(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    (void)arg;
    record_pid(rank);
    if (rank == 1) {
        publish("old/host/1", "fault-node", sizeof("fault-node"));
        return;
    }
    smddp_comm_t comm = NULL;
    smddp_status_t st = harness_try_comm(rank, size, "old", -1, &comm);
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_MISMATCH);
    H_HAS(msg, "rank 1 published its node record in a form this libsmddp does not read");
    H_HAS(msg, "must run the same libsmddp");
}

static void test_record_without_settings(void **state)
{
    (void)state;
    run(2, old_record_fn, NULL, "SMDDP_TIMEOUT=10 SMDDP_HOSTNAME=fault-node", 1, NULL);
}

/* Ranks disagree on SMDDP_SHM_BUFFER_SIZE: every rank says so at once, naming the rank and values. */
static void shm_size_fn(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    (void)arg;
    record_pid(rank);
    if (rank == 1) {
        setenv("SMDDP_SHM_BUFFER_SIZE", "1M", 1);
        smddp__params_reload();
    }
    smddp_comm_t comm = NULL;
    double t0 = now_s();
    smddp_status_t st = harness_try_comm(rank, size, "size", -1, &comm);
    double dt = now_s() - t0;
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_MISMATCH);
    H_HAS(msg, "SMDDP_SHM_BUFFER_SIZE must be the same on every rank");
    H_HAS(msg, "rank 1 has \"1048576\" (ranks that differ from rank 0: 1)");
    H_CHECK(dt < 2.0, "the check took %.2f s", dt);
}

static void test_shm_size_mismatch(void **state)
{
    (void)state;
    run(2, shm_size_fn, NULL, "SMDDP_TIMEOUT=2", 1, NULL);
}

/*
 * Two node names and a libfabric provider that does not exist: creation
 * fails on every rank, naming the provider and the setting, and leaves no
 * shared memory behind.
 */
static void two_nodes_fn(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    (void)arg;
    record_pid(rank);
    setenv("SMDDP_HOSTNAME", rank == 0 ? "node-a" : "node-b", 1);
    smddp__params_reload();
    smddp_comm_t comm = NULL;
    smddp_status_t st = harness_try_comm(rank, size, "nodes", -1, &comm);
    const char *msg = smddp_get_last_error(NULL);
    H_STATUS(st, SMDDP_ERR_NOT_SUPPORTED);
    if (!smddp__net_transport()) {
        /* Built without libfabric: it says so, whatever the provider. */
        H_HAS(msg, "built without libfabric");
        return;
    }
    H_HAS(msg, "network setup failed");
    H_HAS(msg, "no-such-provider");
    H_HAS(msg, "SMDDP_OFI_PROVIDER");
}

static void test_two_nodes_without_a_network(void **state)
{
    (void)state;
    int before = harness_shm_count();
    run(2, two_nodes_fn, NULL, "SMDDP_TIMEOUT=10 SMDDP_OFI_PROVIDER=no-such-provider", 1, NULL);
    assert_int_equal(harness_shm_count(), before);
}

static int setup(void **state)
{
    (void)state;
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return sh == MAP_FAILED ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    munmap(sh, sizeof(*sh));
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_peer_during_allreduce),
        cmocka_unit_test(test_kill_segment_creator_nonblocking),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_set_timeout),
        cmocka_unit_test(test_op_timeout),
        cmocka_unit_test(test_timeout_broadcast_root),
        cmocka_unit_test(test_kill_peer_midway_large),
        cmocka_unit_test(test_queued_requests_after_peer_death),
        cmocka_unit_test(test_mismatch_count),
        cmocka_unit_test(test_mismatch_kind),
        cmocka_unit_test(test_mismatch_dtype),
        cmocka_unit_test(test_mismatch_root),
        cmocka_unit_test(test_mismatch_count_unchecked),
        cmocka_unit_test(test_mismatch_kind_unchecked),
        cmocka_unit_test(test_mismatch_dtype_unchecked),
        cmocka_unit_test(test_mismatch_root_unchecked),
        cmocka_unit_test(test_abort_peer),
        cmocka_unit_test(test_abort_from_thread),
        cmocka_unit_test(test_early_destroy),
        cmocka_unit_test(test_recv_from_departed_peer),
        cmocka_unit_test(test_send_to_killed_peer),
        cmocka_unit_test(test_recv_timeout),
        cmocka_unit_test(test_abort_during_recv),
        cmocka_unit_test(test_send_after_peer_abort),
        cmocka_unit_test(test_alltoallv_mismatch),
        cmocka_unit_test(test_p2p_mismatch),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_bad_create_arguments),
        cmocka_unit_test(test_wait_caller_timeout),
        cmocka_unit_test(test_mixed_blocking_order),
        cmocka_unit_test(test_shm_clean_after_normal_run),
        cmocka_unit_test(test_killed_before_join),
        cmocka_unit_test(test_killed_during_shm_setup),
        cmocka_unit_test(test_record_without_settings),
        cmocka_unit_test(test_shm_size_mismatch),
        cmocka_unit_test(test_two_nodes_without_a_network),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
