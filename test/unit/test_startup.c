/*
 * Start-up at more ranks than one level of the rendezvous tree holds (topo.c:
 * a rank heads at most 8 runs of ranks): the topology and settings every rank
 * learns, what creation costs a rank (store calls, connections, threads,
 * counted by smddp_comm_get_stats), and the errors every rank must report
 * the same way when a rank deep in the tree is missing or disagrees.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "param.h"

#define RANKS 18
#define PER_NODE 3

/*
 * The store calls creation may make on one rank, whatever the job's size:
 * the rendezvous (8 heads read, a record set, the table read or written),
 * shared memory (2), the network (2 addresses set, 2 neighbours read) and
 * the liveness watch (2), with room for the waits that read a key again. An
 * exchange where every rank reads every rank's records makes 3 x RANKS.
 */
#define CREATE_STORE_OPS_MAX 24

static double now_s(void) { return (double)smddp__now_ns() / 1e9; }

/* 6 fake nodes of 3 ranks: where every rank is, and what its creation cost it. */
static void tree_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    int nodes = 0, local_rank = -1, local_size = 0;
    H_OK(smddp_comm_node_count(comm, &nodes));
    H_OK(smddp_comm_local_rank(comm, &local_rank));
    H_OK(smddp_comm_local_size(comm, &local_size));
    H_CHECK(nodes == size / PER_NODE && local_size == PER_NODE && local_rank == rank % PER_NODE,
            "rank %d: %d nodes, local rank %d of %d; expected %d nodes, local rank %d of %d",
            rank, nodes, local_rank, local_size, size / PER_NODE, rank % PER_NODE, PER_NODE);
    double x = rank + 1, sum = 0;
    H_OK(smddp_allreduce(comm, &x, &sum, 1, SMDDP_FLOAT64, SMDDP_SUM, NULL, NULL));
    H_CHECK(sum == size * (size + 1) / 2.0, "rank %d: sum %g", rank, sum);

    smddp_comm_stats_t st = {.struct_size = sizeof(st)};
    H_OK(smddp_comm_get_stats(comm, &st, NULL, 0));
    H_CHECK(st.version >= 2, "stats version %u", st.version);
    H_CHECK(st.create_ns > 0, "rank %d: creation took %lld ns", rank, (long long)st.create_ns);
    H_CHECK(st.create_store_ops >= 3 && st.create_store_ops <= CREATE_STORE_OPS_MAX,
            "rank %d: creation made %llu store calls (at most %d expected)", rank,
            (unsigned long long)st.create_store_ops, CREATE_STORE_OPS_MAX);
    H_CHECK(st.create_store_bytes > 0 && st.store_ops >= st.create_store_ops &&
                st.store_bytes >= st.create_store_bytes,
            "rank %d: %llu store bytes in creation, %llu calls / %llu bytes in all", rank,
            (unsigned long long)st.create_store_bytes, (unsigned long long)st.store_ops,
            (unsigned long long)st.store_bytes);
    /*
     * Network peers: the ring neighbours in rank order (read at creation)
     * and the hierarchical allreduce's (same local rank, neighbouring
     * nodes); liveness: the next rank.
     */
    H_CHECK(st.connections >= 1 && st.connections <= 6, "rank %d: %d connections", rank,
            st.connections);
    /* The ops' thread, and the straggler telemetry's on a node's first rank. */
    H_CHECK(st.threads >= 1 && st.threads <= 2, "rank %d: %d threads", rank, st.threads);
}

static void test_startup_tree(void **state)
{
    (void)state;
    harness_opts_t opts = {.timeout_s = 240, .ranks_per_node = PER_NODE};
    assert_int_equal(harness_run(RANKS, tree_rank, NULL, &opts), 0);
}

/*
 * Rank 13 (in the second level of the tree) never joins: every other rank
 * fails within the timeout and a few seconds more, naming it.
 */
static void missing_rank(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused, (void)arg;
    if (rank == 13) return;
    smddp_comm_t comm = (smddp_comm_t)(uintptr_t)0x5eed;
    double t0 = now_s();
    smddp_status_t st = harness_try_comm(rank, size, "miss", -1, &comm);
    double dt = now_s() - t0;
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st == SMDDP_ERR_TIMEOUT, "rank %d: %s: %s", rank, smddp_status_string(st), msg);
    H_CHECK(strstr(msg, "rank 13 of 18 did not join"), "rank %d: %s", rank, msg);
    H_CHECK(dt > 1.5 && dt < 8.0, "rank %d gave up after %.2f s with SMDDP_TIMEOUT=2", rank, dt);
    H_CHECK(comm == (smddp_comm_t)(uintptr_t)0x5eed, "*comm changed on error");
}

static void test_startup_missing_rank(void **state)
{
    (void)state;
    harness_opts_t opts = {.timeout_s = 60, .no_comm = 1, .env = "SMDDP_TIMEOUT=2"};
    assert_int_equal(harness_run(RANKS, missing_rank, NULL, &opts), 0);
}

/* Rank 17, a leaf of the second level, sets another shared-memory size: every rank says so. */
static void disagree_rank(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused, (void)arg;
    if (rank == 17) {
        setenv("SMDDP_SHM_BUFFER_SIZE", "1048576", 1);
        smddp__params_reload();
    }
    smddp_comm_t comm = NULL;
    smddp_status_t st = harness_try_comm(rank, size, "disagree", -1, &comm);
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st == SMDDP_ERR_MISMATCH, "rank %d: %s: %s", rank, smddp_status_string(st), msg);
    H_CHECK(strstr(msg, "SMDDP_SHM_BUFFER_SIZE") && strstr(msg, "rank 17 has \"1048576\""),
            "rank %d: %s", rank, msg);
}

static void test_startup_disagreement(void **state)
{
    (void)state;
    harness_opts_t opts = {.timeout_s = 60, .no_comm = 1, .env = "SMDDP_TIMEOUT=30"};
    assert_int_equal(harness_run(RANKS, disagree_rank, NULL, &opts), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_startup_tree),
        cmocka_unit_test(test_startup_missing_rank),
        cmocka_unit_test(test_startup_disagreement),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
