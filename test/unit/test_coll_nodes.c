/*
 * Collectives across nodes: fake hosts on this machine (SMDDP_HOSTNAME per
 * rank, harness_opts_t.ranks_per_node), joined through libfabric over
 * loopback. The checks of one node on 2 x 1 up to 3 x 2 ranks, hierarchical
 * and flat; which traffic goes over the network; mismatched collectives that
 * must fail rather than mix; and failures (an abort, a rank killed, one that
 * leaves) that must reach the other nodes within seconds.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "coll_ranks.h"
#include "comm.h"
#include "reduce/half.h"
#include "transport/net.h"

static void test_nodes_half_accuracy_3x2(void **state) { (void)state; run_nodes(6, 2, half_accuracy_rank); }

/*
 * Hierarchical collectives keep traffic between ranks of one node off the
 * network; flat ones do not. Every rank checks its own counters after a
 * large allreduce (several rounds, every local rank on the network), a
 * reduce_scatter, an allgather, a broadcast and a barrier.
 */
static void traffic_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    enum { N = 1 << 20 };
    float *a = malloc(N * sizeof(float)), *b = malloc((size_t)N * (size_t)size * sizeof(float));
    for (int i = 0; i < N; i++) a[i] = (float)(rank + 1);
    for (int i = 0; i < N * size; i++) b[i] = 1.0f;
    H_OK(smddp_allreduce(comm, a, a, N, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    for (int i = 0; i < N; i++)
        H_CHECK(a[i] == (float)(size * (size + 1) / 2), "allreduce element %d is %g", i, a[i]);
    H_OK(smddp_reduce_scatter(comm, b, a, N, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    H_CHECK(a[0] == (float)size && a[N - 1] == (float)size, "reduce_scatter gave %g", a[0]);
    H_OK(smddp_allgather(comm, a, b, N, SMDDP_FLOAT32, NULL, NULL));
    H_OK(smddp_broadcast(comm, a, N, SMDDP_FLOAT32, size - 1, NULL, NULL));
    H_OK(smddp_barrier(comm, NULL, NULL));
    bool hier = getenv("SMDDP_NET_ALGO") == NULL;
    H_CHECK(comm->net_bytes > 0, "rank %d sent nothing over the network", rank);
    if (hier)
        H_CHECK(comm->net_bytes_local == 0 && comm->shm_bytes > 0,
                "hierarchical: rank %d sent %llu bytes over the network to its own node, staged "
                "%llu in shm", rank, (unsigned long long)comm->net_bytes_local,
                (unsigned long long)comm->shm_bytes);
    if (getenv("SMDDP_OFI_MR")) {
        /* Registration forced: the staging segment and the rings' reused blocks hit. */
        uint64_t hits, misses;
        bool registering;
        comm->net->mr_stats(comm->net_ep, &hits, &misses, &registering);
        H_CHECK(registering && hits > misses, "rank %d: %s, %llu registrations, %llu hits", rank,
                registering ? "registering" : "not registering", (unsigned long long)misses,
                (unsigned long long)hits);
    }
    if (hier && getenv("SMDDP_SHM_BUFFER_SIZE")) {
        /*
         * 32 rounds: some ring steps must have moved while their rank staged
         * the next round. One rank may see none (its peers always answered
         * after it had finished staging), so the count is over all ranks.
         */
        int64_t mine = (int64_t)comm->net_steps_overlapped, all[16];
        H_OK(smddp_allgather(comm, &mine, all, 1, SMDDP_INT64, NULL, NULL));
        int64_t total = 0;
        for (int r = 0; r < size; r++) total += all[r];
        H_CHECK(total > 0, "no ring step completed while any rank worked in shared memory: "
                "the allreduce's rounds did not overlap");
    } else if (!hier) /* rank 0's ring neighbour is rank 1, on its node */
        H_CHECK((rank != 0 || comm->net_bytes_local > 0) && comm->shm_bytes == 0,
                "flat: rank %d sent %llu bytes to its own node, staged %llu in shm", rank,
                (unsigned long long)comm->net_bytes_local, (unsigned long long)comm->shm_bytes);
    free(a);
    free(b);
}

static void test_nodes_traffic_2x2(void **state)
{
    (void)state;
    run_nodes(4, 2, traffic_rank);
    run_nodes_env(4, 2, traffic_rank, "SMDDP_SHM_BUFFER_SIZE=256K");
    run_nodes_env(4, 2, traffic_rank, "SMDDP_SHM_BUFFER_SIZE=256K SMDDP_OFI_MR=always");
    run_nodes_env(4, 2, traffic_rank, "SMDDP_NET_ALGO=flat");
}

static void test_nodes_allreduce_2x2(void **state) { (void)state; run_nodes(4, 2, allreduce_rank); }
/* Every buffer registered through a 2-entry cache: evictions and one-transfer registrations. */
static void test_nodes_allreduce_registered(void **state)
{
    (void)state;
    run_nodes_env(4, 2, allreduce_rank, "SMDDP_OFI_MR=always SMDDP_OFI_MR_CACHE=2");
    run_nodes_env(4, 2, p2p_across_nodes_rank, "SMDDP_OFI_MR=always SMDDP_OFI_MR_CACHE=2");
}
/* Every local rank on the network, tiny staging halves: many rounds, uneven pieces. */
static void test_nodes_allreduce_3x2_split(void **state)
{
    (void)state;
    run_nodes_env(6, 2, allreduce_rank,
                  "SMDDP_NET_LEADER_MAX=0 SMDDP_SHM_BUFFER_SIZE=8192 SMDDP_STREAM_MIN=1");
}
/*
 * The flat algorithms keep their scratch between ops (smddp__net_scratch):
 * reduce-scatters, allreduces, reduces to a root, fp16 allreduces (converted
 * through fp32 scratch) and all-to-alls of growing, then shrinking sizes on
 * one communicator, each checked, so scratch sized for one op is never too
 * small or stale for the next.
 */
static void scratch_reuse_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    const int64_t counts[] = {3, 70000, 1 << 20, 1 << 22, 5, 300000, 1};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        int64_t n = counts[k];
        float *in = malloc((size_t)(n * size) * sizeof(float));
        float *out = malloc((size_t)(n * size) * sizeof(float));
        uint16_t *h = malloc((size_t)n * sizeof(uint16_t));
        for (int64_t i = 0; i < n * size; i++) in[i] = (float)((rank + 1) * (i % 7 + 1));
        /* Element i sums (r + 1) * (i % 7 + 1) over the ranks r: tri * (i % 7 + 1). */
        float tri = (float)(size * (size + 1) / 2);
        H_OK(smddp_reduce_scatter(comm, in, out, n, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
        for (int64_t i = 0; i < n; i++)
            H_CHECK(out[i] == tri * (float)((rank * n + i) % 7 + 1),
                    "reduce_scatter n=%lld: element %lld is %g", (long long)n, (long long)i,
                    (double)out[i]);
        H_OK(smddp_allreduce(comm, in, out, n, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
        for (int64_t i = 0; i < n; i++)
            H_CHECK(out[i] == tri * (float)(i % 7 + 1), "allreduce n=%lld: element %lld is %g",
                    (long long)n, (long long)i, (double)out[i]);
        out[0] = -1;
        H_OK(smddp_reduce(comm, in, out, n, SMDDP_FLOAT32, SMDDP_SUM, 0, NULL, NULL));
        for (int64_t i = 0; rank == 0 && i < n; i++)
            H_CHECK(out[i] == tri * (float)(i % 7 + 1), "reduce n=%lld: element %lld is %g",
                    (long long)n, (long long)i, (double)out[i]);
        for (int64_t i = 0; i < n; i++) h[i] = smddp__fp32_to_fp16((float)(rank + (i % 3)));
        H_OK(smddp_allreduce(comm, h, h, n, SMDDP_FLOAT16, SMDDP_SUM, NULL, NULL));
        for (int64_t i = 0; i < n; i++)
            H_CHECK(smddp__fp16_to_fp32(h[i]) ==
                        (float)(size * (size - 1) / 2 + size * (int)(i % 3)),
                    "fp16 allreduce n=%lld: element %lld is %g", (long long)n, (long long)i,
                    (double)smddp__fp16_to_fp32(h[i]));
        /* Block q of rank r holds r * 1000 + q, and lands as block r of rank q. */
        for (int q = 0; q < size; q++)
            for (int64_t i = 0; i < n; i++) in[q * n + i] = (float)(rank * 1000 + q);
        H_OK(smddp_alltoall(comm, in, out, n, SMDDP_FLOAT32, NULL, NULL));
        for (int q = 0; q < size; q++)
            H_CHECK(out[q * n] == (float)(q * 1000 + rank) && out[q * n + n - 1] == out[q * n],
                    "alltoall n=%lld: block %d starts with %g", (long long)n, q,
                    (double)out[q * n]);
        free(in);
        free(out);
        free(h);
    }
}

static void test_nodes_flat_scratch_reuse(void **state)
{
    (void)state;
    run_nodes_env(3, 1, scratch_reuse_rank, "SMDDP_NET_ALGO=flat");
    /*
     * Auto, one rank per node on two nodes: reduce_scatter from 4 MiB of
     * input and allreduce/reduce from 16 MiB (n = 1 << 22) go hierarchical,
     * the rest flat.
     */
    run_nodes(2, 1, scratch_reuse_rank);
}

static void test_nodes_allreduce_2x2_flat(void **state)
{
    (void)state;
    run_nodes_env(4, 2, allreduce_rank, "SMDDP_NET_ALGO=flat");
}
/* Nodes of 2 and 1 ranks: no hierarchy, the flat algorithms. */
static void test_nodes_uneven(void **state)
{
    (void)state;
    run_nodes(3, 2, allreduce_rank);
    run_nodes(3, 2, movement_rank);
}
static void test_nodes_reduce_3x2_small(void **state)
{
    (void)state;
    run_nodes_env(6, 2, reduce_rank, "SMDDP_SHM_BUFFER_SIZE=8192 SMDDP_STREAM_MIN=1");
}
static void test_nodes_movement_3x2_small(void **state)
{
    (void)state;
    run_nodes_env(6, 2, movement_rank, "SMDDP_SHM_BUFFER_SIZE=8192 SMDDP_STREAM_MIN=1");
}
static void test_nodes_allreduce_3x1(void **state) { (void)state; run_nodes(3, 1, allreduce_rank); }
static void test_nodes_reduce_2x2(void **state) { (void)state; run_nodes(4, 2, reduce_rank); }
static void test_nodes_movement_2x2(void **state) { (void)state; run_nodes(4, 2, movement_rank); }
static void test_nodes_movement_3x1(void **state) { (void)state; run_nodes(3, 1, movement_rank); }
static void test_nodes_alltoallv_3x1(void **state) { (void)state; run_nodes(3, 1, alltoallv_rank); }
static void test_nodes_callbacks_2x1(void **state) { (void)state; run_nodes(2, 1, callback_rank); }
/*
 * Ranks on different nodes issuing allreduces of different counts: each gets
 * an error saying the counts differ (the messages name the count, or, should
 * the 12-bit identity collide, a block comes cut off or shorter than
 * expected), never a silently wrong result or a hang.
 */
static void mismatch_across_nodes_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg, (void)size;
    static float buf[1000];
    smddp_status_t st = smddp_allreduce(comm, buf, buf, rank == 0 ? 1000 : 900, SMDDP_FLOAT32,
                                        SMDDP_SUM, NULL, NULL);
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st < 0 && (strstr(msg, "count") != NULL || strstr(msg, "expected") != NULL),
            "rank %d: allreduce of 1000 against 900 elements returned %d: %s", rank, st, msg);
}

/*
 * Rank 1 (on the other node) issues another collective of the same size:
 * arg 0: a max where rank 0 sums; 1: int32 against float32; 2: float16
 * against float32. No result is
 * produced from the mixed messages: both ranks fail, saying a different
 * collective was issued. (Collectives of different kinds usually exchange
 * different steps, whose messages never match: those end in the timeout.)
 */
static void what_mismatch_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    int variant = *(int *)arg;
    static float buf[1 << 16];
    smddp_status_t st;
    if (variant == 0)
        st = smddp_allreduce(comm, buf, buf, 1 << 16, SMDDP_FLOAT32, rank ? SMDDP_MAX : SMDDP_SUM,
                             NULL, NULL);
    else if (variant == 1)
        st = smddp_allreduce(comm, buf, buf, 1 << 16, rank ? SMDDP_INT32 : SMDDP_FLOAT32,
                             SMDDP_SUM, NULL, NULL);
    else /* fp16 travels as fp32: the same bytes on the wire, still another collective */
        st = smddp_allreduce(comm, buf, buf, 1 << 15, rank ? SMDDP_FLOAT16 : SMDDP_FLOAT32,
                             SMDDP_SUM, NULL, NULL);
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st < 0, "rank %d: variant %d: mismatched collectives returned %d", rank, variant, st);
    H_CHECK(strstr(msg, "issued a different collective") != NULL,
            "rank %d: variant %d: %s", rank, variant, msg);
}

/*
 * Node 1 never joins a pipelined allreduce: node 0's ranks time out with
 * ring transfers still posted, abandon them, and the communicator is then
 * destroyed cleanly (the sanitizer build checks that nothing completes into
 * freed memory), with registration forced so that pinned entries go too.
 */
static void abandoned_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg, (void)size;
    enum { N = 1 << 20 };
    float *buf = calloc(N, sizeof(float));
    if (rank < 2) {
        smddp_status_t st = smddp_allreduce(comm, buf, buf, N, SMDDP_FLOAT32, SMDDP_SUM, NULL,
                                            NULL);
        const char *msg = smddp_get_last_error(NULL);
        H_CHECK(st == SMDDP_ERR_TIMEOUT || st == SMDDP_ERR_ABORTED,
                "rank %d: an allreduce node 1 never joined returned %d: %s", rank, st, msg);
        /* Later collectives fail at once instead of touching the abandoned endpoint. */
        st = smddp_allreduce(comm, buf, buf, N, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL);
        H_CHECK(st == SMDDP_ERR_ABORTED, "rank %d: the next allreduce returned %d", rank, st);
    } else {
        sleep(3);
    }
    free(buf);
}

static void test_nodes_abandoned(void **state)
{
    (void)state;
    run_nodes_env(4, 2, abandoned_rank,
                  "SMDDP_TIMEOUT=1 SMDDP_SHM_BUFFER_SIZE=256K SMDDP_OFI_MR=always");
}

/*
 * Across nodes, alltoallv with a rank's own sendcounts[me] larger than its
 * recvcounts[me]: the copy to itself once wrote past its slot (past the
 * buffer's end when the slot is last). It fails with a clear error instead,
 * and the receive buffer's guard elements stay untouched.
 */
static void alltoallv_self_mismatch_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg, (void)size;
    int32_t send[16] = {0}, recv[8 + 4];
    int64_t sc[2] = {2, 2}, sd[2] = {0, 8}, rc[2] = {2, 2}, rd[2] = {0, 2};
    for (int i = 0; i < 12; i++) recv[i] = -5;
    if (rank == 1) {
        sc[1] = 6; /* 6 to itself, 2 expected: its slot is the last one */
        sd[1] = 2;
    }
    smddp_status_t st = smddp_alltoallv(comm, send, sc, sd, recv, rc, rd, SMDDP_INT32, NULL, NULL);
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st < 0, "rank %d: the alltoallv returned %d", rank, st);
    if (rank == 1)
        H_CHECK(st == SMDDP_ERR_MISMATCH && strstr(msg, "sendcounts[1]") != NULL,
                "rank 1: %s", msg);
    for (int i = 4; i < 12; i++)
        H_CHECK(recv[i] == -5, "rank %d: element %d past the receive slots was written", rank, i);
}

static void test_nodes_alltoallv_self_mismatch(void **state)
{
    (void)state;
    run_nodes_env(2, 1, alltoallv_self_mismatch_rank, "SMDDP_TIMEOUT=5");
}

/*
 * Counts that differ only in a late round of the pipelined hierarchical
 * allreduce (2 x 2, 64 KiB staging: rounds of 8192 floats; 8193 against 8192
 * elements): the first round's messages once matched, and the node with the
 * extra round waited for the timeout. Both nodes now fail at once, naming
 * the count.
 */
static void late_round_mismatch_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg, (void)size;
    static float buf[8193];
    int64_t t0 = smddp__now_ns();
    smddp_status_t st = smddp_allreduce(comm, buf, buf, rank < 2 ? 8193 : 8192, SMDDP_FLOAT32,
                                        SMDDP_SUM, NULL, NULL);
    double took = (double)(smddp__now_ns() - t0) / 1e9;
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st < 0, "rank %d: allreduce of 8193 against 8192 elements returned %d", rank, st);
    H_CHECK(took < 10.0, "rank %d: the mismatch took %.1f s to surface: %s", rank, took, msg);
}

static void test_nodes_late_round_mismatch(void **state)
{
    (void)state;
    run_nodes_env(4, 2, late_round_mismatch_rank,
                  "SMDDP_TIMEOUT=30 SMDDP_SHM_BUFFER_SIZE=65536 SMDDP_NET_ALGO=hier");
}

/*
 * A barrier against a one-byte max allreduce (what a flat barrier runs):
 * they once passed for each other on the wire, and both ranks 'succeeded'.
 */
static void barrier_vs_allreduce_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg, (void)size;
    uint8_t x = 1;
    smddp_status_t st = rank == 0 ? smddp_barrier(comm, NULL, NULL)
                                  : smddp_allreduce(comm, &x, &x, 1, SMDDP_UINT8, SMDDP_MAX, NULL,
                                                    NULL);
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st < 0, "rank %d: a barrier against an allreduce returned %d", rank, st);
    H_CHECK(strstr(msg, "issued a different collective") != NULL, "rank %d: %s", rank, msg);
}

static void test_nodes_barrier_vs_allreduce(void **state)
{
    (void)state;
    run_nodes_env(2, 1, barrier_vs_allreduce_rank, "SMDDP_TIMEOUT=20 SMDDP_NET_ALGO=flat");
}

static void test_nodes_mismatch(void **state)
{
    (void)state;
    run_nodes_env(2, 1, mismatch_across_nodes_rank, "SMDDP_TIMEOUT=20");
}

static void test_nodes_what_mismatch(void **state)
{
    (void)state;
    for (int variant = 0; variant < 3; variant++) {
        harness_opts_t opts = {.timeout_s = 120, .ranks_per_node = 1, .env = "SMDDP_TIMEOUT=20"};
        int shm_before = harness_shm_count();
        assert_int_equal(harness_run(2, what_mismatch_rank, &variant, &opts), 0);
        assert_int_equal(harness_shm_count(), shm_before);
    }
}

/*
 * smddp_comm_abort tells the ranks of other nodes too, as it tells those of
 * its own: rank 1, alone on its node and blocked in an allreduce with rank 0,
 * fails within seconds with rank 0's message, not at SMDDP_TIMEOUT (20 s).
 */
static void app_abort_across_nodes_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    int32_t x = rank;
    H_OK(smddp_allreduce(comm, &x, &x, 1, SMDDP_INT32, SMDDP_SUM, NULL, NULL)); /* both up */
    if (rank == 0) {
        usleep(300 * 1000);
        H_OK(smddp_comm_abort(comm));
        return;
    }
    int64_t t0 = smddp__now_ns();
    smddp_status_t st = smddp_allreduce(comm, &x, &x, 1, SMDDP_INT32, SMDDP_SUM, NULL, NULL);
    double took = (double)(smddp__now_ns() - t0) / 1e9;
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st == SMDDP_ERR_ABORTED, "the allreduce returned %s: %s", smddp_status_string(st),
            msg);
    H_CHECK(strstr(msg, "rank 0") && strstr(msg, "smddp_comm_abort"),
            "\"%s\" does not say that rank 0 called smddp_comm_abort", msg);
    H_CHECK(took < 4.0, "rank 1 learnt of rank 0's smddp_comm_abort after %.2f s", took);
}

static void test_nodes_app_abort_reaches_other_nodes(void **state)
{
    (void)state;
    run_nodes_env(2, 1, app_abort_across_nodes_rank, "SMDDP_TIMEOUT=20");
}

/*
 * A rank alone on its node that dies: nobody shares its memory to notice, so
 * the rank before it notices through the liveness connection it keeps to it
 * (transport/watch.c), and everyone fails within seconds naming it, not
 * after SMDDP_TIMEOUT (60 s here).
 */
static void lone_rank_killed_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    int32_t x = rank;
    H_OK(smddp_allreduce(comm, &x, &x, 1, SMDDP_INT32, SMDDP_SUM, NULL, NULL));
    if (rank == 1) raise(SIGKILL);
    usleep(300 * 1000);
    int64_t t0 = smddp__now_ns();
    smddp_status_t st = smddp_allreduce(comm, &x, &x, 1, SMDDP_INT32, SMDDP_SUM, NULL, NULL);
    double took = (double)(smddp__now_ns() - t0) / 1e9;
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st == SMDDP_ERR_ABORTED || st == SMDDP_ERR_PEER_LOST,
            "rank %d: the allreduce returned %s: %s", rank, smddp_status_string(st), msg);
    H_CHECK(strstr(msg, "rank 1"), "rank %d: \"%s\" does not name rank 1", rank, msg);
    H_CHECK(took < 10.0, "rank %d learnt of rank 1's death after %.2f s", rank, took);
}

/* fn on 3 ranks, one per fake node, rank 1 dying of SIGKILL; SMDDP_TIMEOUT is 60 s. */
static void run_lone_rank_killed(harness_fn_t fn)
{
    harness_opts_t opts = {.timeout_s = 120, .ranks_per_node = 1, .env = "SMDDP_TIMEOUT=60"};
    opts.expect_signal[1] = SIGKILL;
    assert_int_equal(harness_run(3, fn, NULL, &opts), 0);
}

static void test_nodes_lone_rank_killed(void **state)
{
    (void)state;
    run_lone_rank_killed(lone_rank_killed_rank);
}

/*
 * The same when the rank that watches the dead one (the one before it) is
 * busy elsewhere: the rank waiting in a receive from it starts watching it
 * itself, and fails within seconds.
 */
static void lone_rank_killed_p2p_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    int32_t x = rank;
    H_OK(smddp_allreduce(comm, &x, &x, 1, SMDDP_INT32, SMDDP_SUM, NULL, NULL));
    if (rank == 1) raise(SIGKILL);
    if (rank == 0) {
        sleep(8); /* not in any operation: it does not look */
        return;
    }
    int64_t t0 = smddp__now_ns();
    smddp_status_t st = smddp_recv(comm, &x, 1, SMDDP_INT32, 1, 3, NULL, NULL);
    double took = (double)(smddp__now_ns() - t0) / 1e9;
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st == SMDDP_ERR_ABORTED || st == SMDDP_ERR_PEER_LOST, "the recv returned %s: %s",
            smddp_status_string(st), msg);
    H_CHECK(strstr(msg, "rank 1 is gone") || strstr(msg, "rank 1 died"),
            "\"%s\" does not say that rank 1 is gone", msg);
    H_CHECK(took < 6.0, "rank 2 learnt of rank 1's death after %.2f s", took);
}

static void test_nodes_lone_rank_killed_p2p(void **state)
{
    (void)state;
    run_lone_rank_killed(lone_rank_killed_p2p_rank);
}

/*
 * A rank that destroys its communicator and leaves is not taken for dead:
 * the rank watching it (rank 0) waits meanwhile, for longer than the watch's
 * grace, in a receive from rank 2, which must succeed.
 */
static void clean_leave_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    int32_t x = rank;
    H_OK(smddp_allreduce(comm, &x, &x, 1, SMDDP_INT32, SMDDP_SUM, NULL, NULL));
    if (rank == 1) return; /* the harness destroys the communicator; the process exits */
    if (rank == 2) {
        sleep(4);
        H_OK(smddp_send(comm, &x, 1, SMDDP_INT32, 0, 9, NULL, NULL));
    } else {
        int32_t y = -1;
        H_OK(smddp_recv(comm, &y, 1, SMDDP_INT32, 2, 9, NULL, NULL));
        H_CHECK(y == 3, "got %d", y);
    }
}

static void test_nodes_clean_leave_not_death(void **state)
{
    (void)state;
    run_nodes_env(3, 1, clean_leave_rank, "SMDDP_TIMEOUT=60");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nodes_half_accuracy_3x2),
        cmocka_unit_test(test_nodes_traffic_2x2),
        cmocka_unit_test(test_nodes_allreduce_2x2),
        cmocka_unit_test(test_nodes_allreduce_registered),
        cmocka_unit_test(test_nodes_allreduce_3x2_split),
        cmocka_unit_test(test_nodes_allreduce_2x2_flat),
        cmocka_unit_test(test_nodes_flat_scratch_reuse),
        cmocka_unit_test(test_nodes_uneven),
        cmocka_unit_test(test_nodes_reduce_3x2_small),
        cmocka_unit_test(test_nodes_movement_3x2_small),
        cmocka_unit_test(test_nodes_allreduce_3x1),
        cmocka_unit_test(test_nodes_reduce_2x2),
        cmocka_unit_test(test_nodes_movement_2x2),
        cmocka_unit_test(test_nodes_movement_3x1),
        cmocka_unit_test(test_nodes_alltoallv_3x1),
        cmocka_unit_test(test_nodes_callbacks_2x1),
        cmocka_unit_test(test_nodes_app_abort_reaches_other_nodes),
        cmocka_unit_test(test_nodes_lone_rank_killed),
        cmocka_unit_test(test_nodes_lone_rank_killed_p2p),
        cmocka_unit_test(test_nodes_clean_leave_not_death),
        cmocka_unit_test(test_nodes_what_mismatch),
        cmocka_unit_test(test_nodes_alltoallv_self_mismatch),
        cmocka_unit_test(test_nodes_late_round_mismatch),
        cmocka_unit_test(test_nodes_barrier_vs_allreduce),
        cmocka_unit_test(test_nodes_mismatch),
        cmocka_unit_test(test_nodes_abandoned),
    };
    /* TEST_FILTER=pattern runs only the matching tests (cmocka's wildcards). */
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
