/*
 * Where every rank is and who keeps the others waiting (core/progress.c):
 * smddp_comm_get_stats() naming a rank that arrives late, the WARN of
 * SMDDP_STRAGGLER_WARN_MS, and the positions a failure message gives when a
 * rank skips a collective or dies.
 */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "coll_ranks.h"

#define SLEEP_MS 30
#define LATE_OPS 20

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
}

/*
 * Rank 1 sleeps 30 ms before each of 20 allreduces: every rank's stats name
 * it, with 0.6 s of lateness give or take 20 %, and a skew near 30 ms.
 */
static void straggler_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    float x[4] = {1, 2, 3, 4};
    for (int i = 0; i < LATE_OPS; i++) {
        if (rank == 1) sleep_ms(SLEEP_MS);
        H_OK(smddp_allreduce(comm, x, x, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    }
    smddp_comm_stats_t st = {.struct_size = sizeof(st)};
    int64_t late[8];
    H_OK(smddp_comm_get_stats(comm, &st, late, size));
    double truth = LATE_OPS * SLEEP_MS / 1000.0, got = (double)late[1] / 1e9;
    H_CHECK(st.version == SMDDP_COMM_STATS_VERSION, "version %u", st.version);
    H_CHECK(st.ops == LATE_OPS, "rank %d compared %llu ops, expected %d", rank,
            (unsigned long long)st.ops, LATE_OPS);
    H_CHECK(st.ranks_covered == size, "ranks covered %d", st.ranks_covered);
    H_CHECK(st.slowest_rank == 1, "rank %d names rank %d the slowest", rank, st.slowest_rank);
    H_CHECK(got > truth * 0.8 && got < truth * 1.2, "rank %d: rank 1's lateness %.3f s, truth %.3f s",
            rank, got, truth);
    for (int r = 0; r < size; r++)
        if (r != 1) H_CHECK(late[r] < late[1] / 10, "rank %d late by %lld ns", r, (long long)late[r]);
    H_CHECK(st.skew_p50_ns > SLEEP_MS * 800000LL && st.skew_p50_ns < SLEEP_MS * 3000000LL,
            "skew p50 %lld ns", (long long)st.skew_p50_ns);
    H_CHECK(st.skew_max_ns >= st.skew_p99_ns && st.skew_p99_ns >= st.skew_p50_ns,
            "skews p50 %lld p99 %lld max %lld", (long long)st.skew_p50_ns,
            (long long)st.skew_p99_ns, (long long)st.skew_max_ns);
    H_CHECK(st.clock_error_ns == 0, "one clock, error %lld", (long long)st.clock_error_ns);
}

static void test_straggler_named(void **state)
{
    (void)state;
    run(3, straggler_rank, NULL);
}

/*
 * Across fake nodes whose clocks the ranks tell each other skewed by
 * seconds: the slow rank (arg) is named by every rank, with its lateness
 * within 20 % of the truth, once the nodes' arrivals have been exchanged
 * (every 100 ms), and the clock error bound is measured, not 0.
 */
static void straggler_nodes_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    int slow = *(const int *)arg;
    float x[4] = {1, 2, 3, 4};
    for (int i = 0; i < LATE_OPS; i++) {
        if (rank == slow) sleep_ms(SLEEP_MS);
        H_OK(smddp_allreduce(comm, x, x, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    }
    smddp_comm_stats_t st = {.struct_size = sizeof(st)};
    int64_t late[8];
    for (int tries = 0; tries < 100; tries++) { /* 10 s at most */
        H_OK(smddp_comm_get_stats(comm, &st, late, size));
        if (st.ranks_covered == size && st.ops == LATE_OPS) break;
        sleep_ms(100);
    }
    H_CHECK(st.ranks_covered == size && st.ops == LATE_OPS,
            "rank %d: %llu ops of %d ranks compared, expected %d of %d", rank,
            (unsigned long long)st.ops, st.ranks_covered, LATE_OPS, size);
    double truth = LATE_OPS * SLEEP_MS / 1000.0, got = (double)late[slow] / 1e9;
    H_CHECK(st.slowest_rank == slow, "rank %d names rank %d the slowest", rank, st.slowest_rank);
    H_CHECK(got > truth * 0.8 && got < truth * 1.2,
            "rank %d: rank %d's lateness %.3f s, truth %.3f s", rank, slow, got, truth);
    for (int r = 0; r < size; r++)
        if (r != slow)
            H_CHECK(late[r] >= 0 && late[r] < late[slow] / 10, "rank %d late by %lld ns", r,
                    (long long)late[r]);
    H_CHECK(st.skew_p50_ns > SLEEP_MS * 800000LL && st.skew_p50_ns < SLEEP_MS * 3000000LL,
            "skew p50 %lld ns", (long long)st.skew_p50_ns);
    H_CHECK(st.clock_error_ns > 0 && st.clock_error_ns < 20000000LL, "clock error %lld ns",
            (long long)st.clock_error_ns);
    int nodes = 0;
    H_OK(smddp_comm_node_count(comm, &nodes));
    if (rank == 0)
        fprintf(stderr, "test_progress: %d ranks on %d nodes: rank %d late by %.3f s (truth "
                "%.3f s), skew p50 %.1f ms, clock error bound %.0f us\n", size, nodes, slow,
                got, truth, (double)st.skew_p50_ns / 1e6, (double)st.clock_error_ns / 1e3);
    /* Every rank has read the summary before any leaves (a leaving node stops publishing). */
    H_OK(smddp_barrier(comm, NULL, NULL));
}

static void test_straggler_across_nodes(void **state)
{
    (void)state;
    /* 2 nodes x 2 ranks, node 1's clock told 3 s ahead; a rank of node 1 is slow. */
    int slow = 3;
    harness_opts_t opts = {.timeout_s = 120, .ranks_per_node = 2,
                           .clock_shift_ns = 3000000000LL};
    assert_int_equal(harness_run(4, straggler_nodes_rank, &slow, &opts), 0);
    /* 3 nodes x 1 rank, each clock told 2 s behind the last; the middle one is slow. */
    slow = 1;
    harness_opts_t one = {.timeout_s = 120, .ranks_per_node = 1,
                          .clock_shift_ns = -2000000000LL};
    assert_int_equal(harness_run(3, straggler_nodes_rank, &slow, &one), 0);
    /*
     * 6 nodes x 1 rank, each clock told 1 s behind the last: node 5 asks
     * node 1 for the time, not the reference, and adds node 1's offset to
     * its own; it is the slow one.
     */
    slow = 5;
    harness_opts_t tree = {.timeout_s = 120, .ranks_per_node = 1,
                           .clock_shift_ns = -1000000000LL};
    assert_int_equal(harness_run(6, straggler_nodes_rank, &slow, &tree), 0);
}

/* SMDDP_STRAGGLER_WARN_MS=10: local rank 0 warns once (once a minute at most), naming rank 1. */
static void test_straggler_warn(void **state)
{
    (void)state;
    char dir[] = "/tmp/smddp-test-progress-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char env[512];
    snprintf(env, sizeof(env), "SMDDP_STRAGGLER_WARN_MS=10 SMDDP_DEBUG_FILE=%s/log.%%p", dir);
    run(3, straggler_rank, env);
    int warnings = 0, naming = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[1024], line[2048];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        FILE *f = fopen(p, "r");
        while (f && fgets(line, sizeof(line), f)) {
            if (!strstr(line, "SMDDP_STRAGGLER_WARN_MS=10")) continue;
            warnings++;
            naming += strstr(line, "rank 1 arrived") != NULL;
        }
        if (f) fclose(f);
        remove(p);
    }
    closedir(d);
    rmdir(dir);
    assert_int_equal(warnings, 1);
    assert_int_equal(naming, 1);
}

/* The seq in "allreduce (seq N, ..." of a message, or -1. */
static long long seq_of(const char *msg)
{
    const char *p = strstr(msg, "(seq ");
    return p ? strtoll(p + 5, NULL, 10) : -1;
}

/*
 * The last rank of the communicator skips the sixth allreduce. The others
 * fail in it (the first to time out aborts the communicator; the rest adopt
 * its message), and each message says where everyone is: themselves in that
 * seq, the last rank finished the one before and has not started it. Across
 * nodes, the other node's positions come through the store.
 */
static void skip_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    float x[4] = {1, 2, 3, 4};
    for (int i = 0; i < 5; i++)
        H_OK(smddp_allreduce(comm, x, x, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    if (rank == size - 1) {
        sleep_ms(8000); /* long enough for the others to fail and report, then leave */
        return;
    }
    smddp_status_t st = smddp_allreduce(comm, x, x, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL);
    const char *msg = smddp_get_last_error(comm);
    H_CHECK(st == SMDDP_ERR_TIMEOUT || st == SMDDP_ERR_ABORTED, "rank %d: %s: %s", rank,
            smddp_status_string(st), msg);
    long long seq = seq_of(msg);
    char want[256];
    snprintf(want, sizeof(want), "ranks %s: in seq %lld; rank %d: finished seq %lld and has not "
             "started seq %lld", size == 3 ? "0,1" : "0-2", seq, size - 1, seq - 1, seq);
    H_CHECK(seq >= 5 && strstr(msg, want), "rank %d: \"%s\" not in: %s", rank, want, msg);
    sleep_ms(2000); /* a rank that left would be reported as such to the others still failing */
}

static void test_where_skipped(void **state)
{
    (void)state;
    run(3, skip_rank, "SMDDP_TIMEOUT=2");
}

/* 2 fake nodes of 2 ranks: rank 3 skips. */
static void test_where_skipped_across_nodes(void **state)
{
    (void)state;
    run_nodes_env(4, 2, skip_rank, "SMDDP_TIMEOUT=3");
}

/*
 * 2 fake nodes of 2 ranks: rank 0 aborts while its allreduce waits for the
 * others. Its op fails at once: the positions of the other node's ranks are
 * not asked for (that would wait for them), and the message says so.
 */
static void app_abort_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    float x[4] = {1, 2, 3, 4};
    H_OK(smddp_allreduce(comm, x, x, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    if (rank != 0) {
        sleep_ms(3000);
        smddp_status_t st = smddp_allreduce(comm, x, x, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL);
        H_CHECK(st == SMDDP_ERR_ABORTED, "rank %d: %s", rank, smddp_status_string(st));
        return;
    }
    smddp_request_t req;
    H_OK(smddp_allreduce(comm, x, x, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, &req));
    sleep_ms(200);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    H_OK(smddp_comm_abort(comm));
    smddp_status_t st = smddp_wait(req, SMDDP_WAIT_DEFAULT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    const char *msg = smddp_get_last_error(comm);
    H_CHECK(st == SMDDP_ERR_ABORTED, "rank 0: %s: %s", smddp_status_string(st), msg);
    H_CHECK(took < 1.0, "the aborted allreduce took %.2f s to fail", took);
    H_CHECK(strstr(msg, "ranks 2,3: on another node, not asked"), "message: %s", msg);
    smddp_request_free(req);
}

static void test_app_abort_asks_nobody(void **state)
{
    (void)state;
    run_nodes_env(4, 2, app_abort_rank, "SMDDP_TIMEOUT=20");
}

/* Rank 1 dies after 3 allreduces: the others' failure says so, and where it stopped. */
static void die_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    float x[4] = {1, 2, 3, 4};
    for (int i = 0; i < 3; i++)
        H_OK(smddp_allreduce(comm, x, x, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    if (rank == 1) raise(SIGKILL);
    smddp_status_t st = smddp_allreduce(comm, x, x, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL);
    const char *msg = smddp_get_last_error(comm);
    H_CHECK(st == SMDDP_ERR_PEER_LOST || st == SMDDP_ERR_ABORTED, "rank %d: %s: %s", rank,
            smddp_status_string(st), msg);
    long long seq = seq_of(msg);
    char want[256];
    snprintf(want, sizeof(want), "rank 1: finished seq %lld and has not started seq %lld "
             "(process gone)", seq - 1, seq);
    H_CHECK(seq >= 3 && strstr(msg, want), "rank %d: \"%s\" not in: %s", rank, want, msg);
}

static void test_where_dead(void **state)
{
    (void)state;
    harness_opts_t opts = {.timeout_s = 120, .expect_signal = {0, SIGKILL, 0}};
    assert_int_equal(harness_run(3, die_rank, NULL, &opts), 0);
}

/* Bad arguments are refused with what is accepted; an older, shorter struct gets what fits. */
static void api_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    (void)rank;
    smddp_comm_stats_t st = {.struct_size = sizeof(st)};
    int64_t late[4];
    H_CHECK(smddp_comm_get_stats(NULL, &st, late, size) == SMDDP_ERR_INVALID_ARGUMENT, "NULL comm");
    H_CHECK(smddp_comm_get_stats(comm, NULL, late, size) == SMDDP_ERR_INVALID_ARGUMENT, "NULL stats");
    H_CHECK(smddp_comm_get_stats(comm, &st, NULL, 2) == SMDDP_ERR_INVALID_ARGUMENT, "NULL late_ns");
    H_CHECK(strstr(smddp_get_last_error(comm), "n is 2"), "%s", smddp_get_last_error(comm));
    st.struct_size = 0;
    H_CHECK(smddp_comm_get_stats(comm, &st, NULL, 0) == SMDDP_ERR_INVALID_ARGUMENT, "size 0");
    H_CHECK(strstr(smddp_get_last_error(comm), "sizeof(smddp_comm_stats_t)"), "%s",
            smddp_get_last_error(comm));
    /* Before any op: nothing compared, nobody slowest, every rank covered at 0. */
    st.struct_size = sizeof(st);
    H_OK(smddp_comm_get_stats(comm, &st, late, 4));
    H_CHECK(st.ops == 0 && st.slowest_rank == -1, "ops %llu slowest %d",
            (unsigned long long)st.ops, st.slowest_rank);
    H_CHECK(late[0] == 0 && late[1] == 0 && late[2] == -1 && late[3] == -1,
            "late %lld %lld %lld %lld", (long long)late[0], (long long)late[1],
            (long long)late[2], (long long)late[3]);
    /* A caller that knows only the first 16 bytes gets those and nothing past them. */
    H_OK(smddp_barrier(comm, NULL, NULL));
    unsigned char buf[sizeof(smddp_comm_stats_t)];
    memset(buf, 0xab, sizeof(buf));
    ((smddp_comm_stats_t *)(void *)buf)->struct_size = 16;
    H_OK(smddp_comm_get_stats(comm, (smddp_comm_stats_t *)(void *)buf, NULL, 0));
    smddp_comm_stats_t head;
    memcpy(&head, buf, 16);
    H_CHECK(head.version == SMDDP_COMM_STATS_VERSION && head.struct_size == 16 && head.ops == 1,
            "version %u size %u ops %llu", head.version, head.struct_size,
            (unsigned long long)head.ops);
    for (size_t i = 16; i < sizeof(buf); i++) H_CHECK(buf[i] == 0xab, "byte %zu written", i);
}

static void test_api(void **state)
{
    (void)state;
    run(2, api_rank, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_straggler_named),
        cmocka_unit_test(test_straggler_warn),
        cmocka_unit_test(test_straggler_across_nodes),
        cmocka_unit_test(test_where_skipped),
        cmocka_unit_test(test_where_dead),
        cmocka_unit_test(test_where_skipped_across_nodes),
        cmocka_unit_test(test_app_abort_asks_nobody),
        cmocka_unit_test(test_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
