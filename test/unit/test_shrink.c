/*
 * smddp_comm_shrink: the survivors' communicator after a healthy shrink and
 * after a SIGKILL, on one node and on 2 x 2 fake nodes; shrinking twice;
 * survivors that disagree; a survivor that never comes; a second death
 * during a shrink; bad arguments; no
 * file descriptor or /dev/shm entry left after 20 shrinks.
 */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "coll_ranks.h"

/* Allreduce of (rank + 1) on comm: the sum must be size (size + 1) / 2. */
static void check_sum(smddp_comm_t comm, const char *what)
{
    int rank, size;
    H_OK(smddp_comm_rank(comm, &rank));
    H_OK(smddp_comm_size(comm, &size));
    float x[5];
    for (int i = 0; i < 5; i++) x[i] = (float)(rank + 1);
    H_OK(smddp_allreduce(comm, x, x, 5, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    for (int i = 0; i < 5; i++)
        H_CHECK(x[i] == (float)(size * (size + 1) / 2), "%s: sum %g on %d ranks", what, x[i],
                size);
}

/* 4 ranks, healthy: rank 1 leaves the job; 0, 2, 3 become 0, 1, 2. */
static void healthy_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size, (void)arg;
    check_sum(comm, "parent");
    if (rank == 1) return; /* it keeps its parent until the others are done with theirs */
    int gone[] = {1};
    smddp_comm_t child;
    H_OK(smddp_comm_shrink(comm, gone, 1, SMDDP_SHRINK_DEFAULT, &child));
    int crank, csize;
    H_OK(smddp_comm_rank(child, &crank));
    H_OK(smddp_comm_size(child, &csize));
    H_CHECK(csize == 3 && crank == (rank == 0 ? 0 : rank - 1), "rank %d became %d of %d", rank,
            crank, csize);
    check_sum(child, "shrunk");
    /* Twice in a row: the child loses its last rank. */
    if (crank != 2) {
        int last[] = {2};
        smddp_comm_t grandchild;
        H_OK(smddp_comm_shrink(child, last, 1, SMDDP_SHRINK_DEFAULT, &grandchild));
        check_sum(grandchild, "shrunk twice");
        H_OK(smddp_comm_destroy(grandchild));
    }
    H_OK(smddp_comm_destroy(child));
}

static void test_healthy_and_twice(void **state)
{
    (void)state;
    run(4, healthy_rank, NULL);
}

/*
 * Ranks die (arg: how many, the last ones: with 2 ranks per node, 2 is a
 * whole node; NULL: one, on this node): the others fail, see them gone
 * (smddp_comm_peer_state), shrink with SMDDP_SHRINK_ABORT, and go on.
 */
static void after_death_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    int victims = arg ? *(const int *)arg : 1;
    bool one_node = arg == NULL;
    check_sum(comm, "before");
    if (rank >= size - victims) raise(SIGKILL);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0); /* about when the victim died: all left check_sum together */
    float x[3] = {1, 2, 3};
    smddp_status_t st = smddp_allreduce(comm, x, x, 3, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL);
    H_CHECK(st == SMDDP_ERR_PEER_LOST || st == SMDDP_ERR_ABORTED, "with a dead peer: %s",
            smddp_status_string(st));
    for (int r = 0; r < size; r++) {
        smddp_peer_state_t s;
        H_OK(smddp_comm_peer_state(comm, r, &s));
        bool dead = r >= size - victims;
        /* Across nodes a dead rank may not be known yet (UNKNOWN); a live one is never GONE. */
        H_CHECK(dead ? (s == SMDDP_PEER_GONE || (!one_node && s == SMDDP_PEER_UNKNOWN))
                     : (s == SMDDP_PEER_ALIVE || (!one_node && s == SMDDP_PEER_UNKNOWN)),
                "rank %d sees rank %d in state %d", rank, r, (int)s);
    }
    smddp_comm_t child;
    int gone[16];
    for (int i = 0; i < victims; i++) gone[i] = size - victims + i;
    H_OK(smddp_comm_shrink(comm, gone, victims, SMDDP_SHRINK_ABORT, &child));
    check_sum(child, "after the shrink");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rank == 0)
        fprintf(stderr, "test_shrink: %d ranks: from the death to the first collective of the "
                "shrunk communicator: %.0f ms\n", size, (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    for (int i = 0; i < 2; i++) check_sum(child, "after the shrink");
    H_OK(smddp_comm_destroy(child));
}

static void test_after_sigkill(void **state)
{
    (void)state;
    for (int n = 3; n <= 4; n++) {
        harness_opts_t opts = {.timeout_s = 120, .env = "SMDDP_TIMEOUT=30"};
        opts.expect_signal[n - 1] = SIGKILL;
        int shm_before = harness_shm_count();
        assert_int_equal(harness_run(n, after_death_rank, NULL, &opts), 0);
        assert_int_equal(harness_shm_count(), shm_before);
    }
}

static void test_after_sigkill_across_nodes(void **state)
{
    (void)state;
    int victims = 1;
    harness_opts_t opts = {.timeout_s = 240, .ranks_per_node = 2, .env = "SMDDP_TIMEOUT=30"};
    opts.expect_signal[3] = SIGKILL;
    assert_int_equal(harness_run(4, after_death_rank, &victims, &opts), 0);
}

/* 3 fake nodes of 2 ranks: the whole last node dies; the other two shrink and go on. */
static void test_whole_node_dies(void **state)
{
    (void)state;
    int victims = 2;
    harness_opts_t opts = {.timeout_s = 240, .ranks_per_node = 2, .env = "SMDDP_TIMEOUT=30"};
    opts.expect_signal[4] = opts.expect_signal[5] = SIGKILL;
    assert_int_equal(harness_run(6, after_death_rank, &victims, &opts), 0);
}

/* Ranks 0 and 1 exclude 3; rank 2 excludes 1 and 3: every one of them is told. */
static void disagree_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size, (void)arg;
    if (rank == 3) return;
    int theirs[] = {3}, other[] = {1, 3};
    smddp_comm_t child = NULL;
    smddp_status_t st = rank == 2 ? smddp_comm_shrink(comm, other, 2, 0, &child)
                                  : smddp_comm_shrink(comm, theirs, 1, 0, &child);
    const char *msg = smddp_get_last_error(comm);
    H_CHECK(st == SMDDP_ERR_MISMATCH && child == NULL, "rank %d: %s: %s", rank,
            smddp_status_string(st), msg);
    H_CHECK(strstr(msg, "excludes [3]") && strstr(msg, "excludes [1,3]"), "rank %d: %s", rank,
            msg);
}

static void test_disagreeing_excludes(void **state)
{
    (void)state;
    run(4, disagree_rank, "SMDDP_TIMEOUT=10");
}

/* Rank 2 is excluded by nobody but never calls: the others fail in time, naming it. */
static void missing_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size, (void)arg;
    if (rank == 3) return; /* excluded: it does not call */
    if (rank == 2) {
        struct timespec ts = {4, 0};
        nanosleep(&ts, NULL);
        return;
    }
    int gone[] = {3};
    smddp_comm_t child = NULL;
    H_OK(smddp_comm_set_timeout(comm, 1500));
    smddp_status_t st = smddp_comm_shrink(comm, gone, 1, 0, &child);
    H_CHECK(st == SMDDP_ERR_TIMEOUT && strstr(smddp_get_last_error(comm), "rank 2 did not join"),
            "rank %d: %s: %s", rank, smddp_status_string(st), smddp_get_last_error(comm));
}

static void test_survivor_missing(void **state)
{
    (void)state;
    run(4, missing_rank, NULL);
}

/*
 * Rank 3 dies; while ranks 0 and 1 shrink it away, rank 2 dies too: their
 * shrink fails as soon as rank 2 is seen gone, naming it (never hangs), and
 * a second shrink without both goes on.
 */
static void second_death_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size, (void)arg;
    check_sum(comm, "before");
    if (rank == 3) raise(SIGKILL);
    float x[3] = {1, 2, 3};
    smddp_status_t st = smddp_allreduce(comm, x, x, 3, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL);
    H_CHECK(st == SMDDP_ERR_PEER_LOST || st == SMDDP_ERR_ABORTED, "with a dead peer: %s",
            smddp_status_string(st));
    if (rank == 2) {
        struct timespec ts = {0, 200 * 1000000L}; /* the others are in their shrink by now */
        nanosleep(&ts, NULL);
        raise(SIGKILL);
    }
    H_OK(smddp_comm_set_timeout(comm, 2000));
    int first[] = {3}, both[] = {2, 3};
    smddp_comm_t child = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = smddp_comm_shrink(comm, first, 1, SMDDP_SHRINK_ABORT, &child);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    H_CHECK(st != SMDDP_OK && child == NULL && strstr(smddp_get_last_error(comm), "rank 2"),
            "rank %d: shrink while rank 2 died: %s: %s", rank, smddp_status_string(st),
            smddp_get_last_error(comm));
    /* Rank 2's death is seen on this node: the shrink fails before its 2 s deadline. */
    H_CHECK(st == SMDDP_ERR_PEER_LOST && s < 1.9, "rank %d: the failed shrink: %s after %.2f s",
            rank, smddp_status_string(st), s);
    H_OK(smddp_comm_shrink(comm, both, 2, SMDDP_SHRINK_ABORT, &child));
    check_sum(child, "after the second shrink");
    H_OK(smddp_comm_destroy(child));
}

static void test_second_death_during_shrink(void **state)
{
    (void)state;
    harness_opts_t opts = {.timeout_s = 120, .env = "SMDDP_TIMEOUT=30"};
    opts.expect_signal[2] = opts.expect_signal[3] = SIGKILL;
    int shm_before = harness_shm_count();
    assert_int_equal(harness_run(4, second_death_rank, NULL, &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
}

static void bad_args_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size, (void)arg;
    smddp_comm_t child;
    int self[] = {rank}, out_of_range[] = {7}, twice[] = {1, 1};
    H_CHECK(smddp_comm_shrink(NULL, NULL, 0, 0, &child) == SMDDP_ERR_INVALID_ARGUMENT, "NULL");
    H_CHECK(smddp_comm_shrink(comm, self, 1, 0, &child) == SMDDP_ERR_INVALID_ARGUMENT, "self");
    H_CHECK(strstr(smddp_get_last_error(comm), "this rank"), "%s", smddp_get_last_error(comm));
    H_CHECK(smddp_comm_shrink(comm, out_of_range, 1, 0, &child) == SMDDP_ERR_INVALID_ARGUMENT,
            "range");
    H_CHECK(strstr(smddp_get_last_error(comm), "ranks are 0..1"), "%s", smddp_get_last_error(comm));
    if (rank == 0)
        H_CHECK(smddp_comm_shrink(comm, twice, 2, 0, &child) == SMDDP_ERR_INVALID_ARGUMENT, "twice");
    H_CHECK(smddp_comm_shrink(comm, NULL, 0, 4, &child) == SMDDP_ERR_INVALID_ARGUMENT, "flags");
    H_CHECK(strstr(smddp_get_last_error(comm), "SMDDP_SHRINK_ABORT"), "%s",
            smddp_get_last_error(comm));
    check_sum(comm, "after refused shrinks"); /* nothing was done */
}

static void test_bad_arguments(void **state)
{
    (void)state;
    run(2, bad_args_rank, NULL);
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* 20 shrinks that exclude nobody, each child used and destroyed: no fd left open. */
static void fd_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)rank, (void)size, (void)arg;
    smddp_comm_t child;
    H_OK(smddp_comm_shrink(comm, NULL, 0, 0, &child)); /* the first may open lazily-kept fds */
    check_sum(child, "first");
    H_OK(smddp_comm_destroy(child));
    int before = open_fds();
    for (int i = 0; i < 20; i++) {
        H_OK(smddp_comm_shrink(comm, NULL, 0, 0, &child));
        check_sum(child, "child");
        H_OK(smddp_comm_destroy(child));
    }
    int after = open_fds();
    H_CHECK(after == before, "open fds %d before 20 shrinks, %d after", before, after);
}

static void test_no_fd_leak(void **state)
{
    (void)state;
    run(3, fd_rank, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_healthy_and_twice),
        cmocka_unit_test(test_after_sigkill),
        cmocka_unit_test(test_after_sigkill_across_nodes),
        cmocka_unit_test(test_whole_node_dies),
        cmocka_unit_test(test_disagreeing_excludes),
        cmocka_unit_test(test_survivor_missing),
        cmocka_unit_test(test_second_death_during_shrink),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_no_fd_leak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
