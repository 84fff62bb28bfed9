/*
 * send/recv within a node and across fake nodes: ring exchanges at sizes up
 * to rendezvous, bursts, receives from any rank, messages that do not match
 * their receive, and failures (a peer that never receives, an abort, a
 * receive that fails while its message is on the way).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "coll_ranks.h"
#include "common.h"

/* ---- send/recv ---------------------------------------------------------------- */

static void p2p_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    const int64_t ns[] = {0, 1, 7, 4097, 1000000};
    for (int s = 0; s < 5; s++) {
        int64_t n = ns[s];
        int32_t *out = malloc((size_t)n * 4 + 4), *in = malloc((size_t)n * 4 + 4);
        for (int64_t i = 0; i < n; i++) out[i] = rank * 100000 + (int32_t)i;
        smddp_request_t rs, rr;
        /* Ring exchange, both posted before either waits: no deadlock even when large. */
        H_OK(smddp_recv(comm, in, n, SMDDP_INT32, prev, s, NULL, &rr));
        H_OK(smddp_send(comm, out, n, SMDDP_INT32, next, s, NULL, &rs));
        H_OK(smddp_wait(rs, SMDDP_WAIT_DEFAULT));
        H_OK(smddp_wait(rr, SMDDP_WAIT_DEFAULT));
        smddp_request_free(rs);
        smddp_request_free(rr);
        for (int64_t i = 0; i < n; i++)
            H_CHECK(in[i] == prev * 100000 + (int32_t)i, "p2p n=%lld element %lld", (long long)n,
                    (long long)i);
        free(out);
        free(in);
    }
    /* Many small messages back to back, then a collective still works. */
    if (rank == 0) {
        for (int k = 0; k < 100; k++) H_OK(smddp_send(comm, &k, 1, SMDDP_INT32, 1, 7, NULL, NULL));
    } else if (rank == 1) {
        for (int k = 0; k < 100; k++) {
            int v = -1;
            H_OK(smddp_recv(comm, &v, 1, SMDDP_INT32, 0, 7, NULL, NULL));
            H_CHECK(v == k, "message %d carried %d", k, v);
        }
    }
    H_OK(smddp_barrier(comm, NULL, NULL));
}

static void test_p2p_2(void **state) { (void)state; run(2, p2p_rank, NULL); }
static void test_p2p_3(void **state) { (void)state; run(3, p2p_rank, NULL); }

/*
 * Receives from any rank: every other rank sends rank 0 three messages (of 1,
 * then of 300000 elements: large ones take the provider's rendezvous across
 * nodes); rank 0 takes them all with receives from SMDDP_ANY_SOURCE posted at
 * once, and checks that each rank's messages came whole and in order. Then a
 * directed receive posted first keeps rank 1's first message for itself.
 */
static void any_source_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    enum { M = 3 };
    const int64_t counts[] = {1, 300000};
    for (int c = 0; c < 2; c++) {
        int64_t n = counts[c];
        if (rank != 0) {
            for (int k = 0; k < M; k++) {
                int32_t *out = malloc((size_t)n * 4);
                for (int64_t i = 0; i < n; i++) out[i] = rank * 1000 + k * 100 + (int32_t)(i % 97);
                H_OK(smddp_send(comm, out, n, SMDDP_INT32, 0, 5, NULL, NULL));
                free(out);
            }
        } else {
            int total = (size - 1) * M;
            int32_t **in = calloc((size_t)total, sizeof(*in));
            smddp_request_t *req = calloc((size_t)total, sizeof(*req));
            int next_k[64] = {0};
            for (int j = 0; j < total; j++) {
                in[j] = malloc((size_t)n * 4);
                H_OK(smddp_recv(comm, in[j], n, SMDDP_INT32, SMDDP_ANY_SOURCE, 5, NULL, &req[j]));
            }
            for (int j = 0; j < total; j++) {
                int src = -2;
                H_OK(smddp_wait(req[j], SMDDP_WAIT_DEFAULT));
                H_OK(smddp_request_source(req[j], &src));
                H_CHECK(src > 0 && src < size, "count %lld: receive %d matched rank %d",
                        (long long)n, j, src);
                int k = next_k[src]++;
                for (int64_t i = 0; i < n; i++)
                    H_CHECK(in[j][i] == src * 1000 + k * 100 + (int32_t)(i % 97),
                            "count %lld: receive %d from rank %d (its message %d): element %lld "
                            "is %d", (long long)n, j, src, k, (long long)i, in[j][i]);
                smddp_request_free(req[j]);
                free(in[j]);
            }
            for (int r = 1; r < size; r++)
                H_CHECK(next_k[r] == M, "count %lld: rank %d: %d messages received, %d sent",
                        (long long)n, r, next_k[r], M);
            free(in);
            free(req);
        }
        H_OK(smddp_barrier(comm, NULL, NULL));
    }
    if (rank == 1) {
        for (int v = 10; v < 12; v++) H_OK(smddp_send(comm, &v, 1, SMDDP_INT32, 0, 6, NULL, NULL));
    } else if (rank == 0) {
        int d = -1, a = -1, src = -2;
        smddp_request_t rd, ra;
        H_OK(smddp_recv(comm, &d, 1, SMDDP_INT32, 1, 6, NULL, &rd));
        H_OK(smddp_recv(comm, &a, 1, SMDDP_INT32, SMDDP_ANY_SOURCE, 6, NULL, &ra));
        H_OK(smddp_wait(ra, SMDDP_WAIT_DEFAULT));
        H_OK(smddp_wait(rd, SMDDP_WAIT_DEFAULT));
        H_OK(smddp_request_source(ra, &src));
        H_CHECK(d == 10 && a == 11 && src == 1,
                "directed receive got %d, the one from any rank %d from rank %d", d, a, src);
        H_CHECK(smddp_request_source(rd, &src) == SMDDP_OK && src == 1, "source of a directed "
                "receive: %d", src);
        smddp_request_free(rd);
        smddp_request_free(ra);
        /* A send has no source; a send to SMDDP_ANY_SOURCE is refused. */
        smddp_request_t rs;
        H_OK(smddp_send(comm, &d, 1, SMDDP_INT32, 1, 7, NULL, &rs));
        H_CHECK(smddp_request_source(rs, &src) == SMDDP_ERR_INVALID_ARGUMENT,
                "smddp_request_source accepted a send");
        H_OK(smddp_wait(rs, SMDDP_WAIT_DEFAULT));
        smddp_request_free(rs);
        H_CHECK(smddp_send(comm, &d, 1, SMDDP_INT32, SMDDP_ANY_SOURCE, 7, NULL, NULL) ==
                    SMDDP_ERR_INVALID_ARGUMENT, "a send to SMDDP_ANY_SOURCE was accepted");
    }
    if (rank == 1) {
        int v = 0;
        H_OK(smddp_recv(comm, &v, 1, SMDDP_INT32, 0, 7, NULL, NULL));
    }
    H_OK(smddp_barrier(comm, NULL, NULL));
}

/* Nobody sends: the receive from any rank times out and says so. */
static void any_source_timeout_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg, (void)size;
    if (rank != 0) return;
    int v;
    smddp_status_t st = smddp_recv(comm, &v, 1, SMDDP_INT32, SMDDP_ANY_SOURCE, 0, NULL, NULL);
    const char *msg = smddp_get_last_error(comm);
    H_CHECK(st == SMDDP_ERR_TIMEOUT && strstr(msg, "from any rank") &&
                strstr(msg, "no rank sent it a message"),
            "a receive nobody sends to returned %d: %s", st, msg);
}

static void test_p2p_any_source_3(void **state) { (void)state; run(3, any_source_rank, NULL); }
static void test_p2p_any_source_timeout(void **state)
{
    (void)state;
    run(2, any_source_timeout_rank, "SMDDP_TIMEOUT=1");
}

/* ---- across nodes ----------------------------------------------------------- */

static void test_nodes_p2p(void **state)
{
    (void)state;
    run_nodes(2, 1, p2p_across_nodes_rank);
    run_nodes(4, 2, p2p_across_nodes_rank); /* mixed: ring neighbours on both nodes */
    run_nodes_env(2, 1, p2p_across_nodes_rank, "SMDDP_OFI_MAX_INFLIGHT=3");
}

/* Senders on this node and on others, small and rendezvous-sized. */
static void test_nodes_any_source(void **state)
{
    (void)state;
    run_nodes(4, 2, any_source_rank);
    run_nodes_env(3, 1, any_source_rank, "SMDDP_OFI_MR=always");
}

/*
 * A send to a rank on another node that never takes part in send/recv (its
 * endpoint is never progressed, so the connection is never made) must not
 * hold up send/recv with other ranks: it fails at the timeout on its own.
 */
static void p2p_stuck_peer_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    if (rank == 2) {
        sleep(5); /* past rank 0's 2 s timeout, then leave */
        return;
    }
    int32_t x = rank, y = -1, z = 7;
    smddp_request_t stuck = NULL, rs, rr;
    if (rank == 0) H_OK(smddp_send(comm, &z, 1, SMDDP_INT32, 2, 0, NULL, &stuck));
    int peer = 1 - rank;
    int64_t t0 = smddp__now_ns();
    H_OK(smddp_recv(comm, &y, 1, SMDDP_INT32, peer, 1, NULL, &rr));
    H_OK(smddp_send(comm, &x, 1, SMDDP_INT32, peer, 1, NULL, &rs));
    H_OK(smddp_wait(rr, SMDDP_WAIT_DEFAULT));
    H_OK(smddp_wait(rs, SMDDP_WAIT_DEFAULT));
    double took = (double)(smddp__now_ns() - t0) / 1e9;
    smddp_request_free(rr);
    smddp_request_free(rs);
    H_CHECK(y == peer, "got %d from rank %d", y, peer);
    H_CHECK(took < 1.0, "rank %d: an exchange with rank %d took %.2f s behind a send to a rank "
            "that never receives", rank, peer, took);
    if (rank == 0) {
        smddp_status_t st = smddp_wait(stuck, SMDDP_WAIT_DEFAULT);
        H_CHECK(st == SMDDP_ERR_TIMEOUT && strstr(smddp_get_last_error(NULL), "rank 2"),
                "the send to rank 2 ended with %s: %s", smddp_status_string(st),
                smddp_get_last_error(NULL));
        smddp_request_free(stuck);
    }
}

static void test_nodes_p2p_stuck_peer(void **state)
{
    (void)state;
    run_nodes_env(3, 1, p2p_stuck_peer_rank, "SMDDP_TIMEOUT=2");
}

/*
 * A send/recv failure that aborts a communicator must reach the ranks on
 * other nodes at once, as a collective's does. Rank 1 gets a message larger
 * than its receive, which aborts its communicator (tcp;ofi_rxm cannot match
 * what follows); it stays alive, so only the abort can tell the others. Rank
 * 0 then waits for a message from rank 1 (or, with arg, from any rank: only
 * receives from any rank were waiting, which once never asked the store) and
 * rank 2 for an allreduce's: both must fail with rank 1's message within
 * seconds, long before SMDDP_TIMEOUT (60 s here).
 */
static void p2p_abort_spreads_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    int from = arg ? SMDDP_ANY_SOURCE : 1;
    (void)size;
    int32_t big[64] = {0}, small[4], x = rank;
    int64_t t0 = smddp__now_ns();
    smddp_status_t st;
    const char *want = "rank 1";
    if (rank == 1) {
        st = smddp_recv(comm, small, 4, SMDDP_INT32, 0, 5, NULL, NULL);
        H_CHECK(st == SMDDP_ERR_MISMATCH, "the cut-off receive returned %s: %s",
                smddp_status_string(st), smddp_get_last_error(NULL));
        sleep(6); /* alive, but gone from the communicator */
        return;
    }
    if (rank == 0) {
        H_OK(smddp_send(comm, big, 64, SMDDP_INT32, 1, 5, NULL, NULL));
        st = smddp_recv(comm, &x, 1, SMDDP_INT32, from, 6, NULL, NULL);
    } else {
        st = smddp_allreduce(comm, &x, &x, 1, SMDDP_INT32, SMDDP_SUM, NULL, NULL);
    }
    double took = (double)(smddp__now_ns() - t0) / 1e9;
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st == SMDDP_ERR_ABORTED, "rank %d: %s returned %s: %s", rank,
            rank == 0 ? "recv" : "allreduce", smddp_status_string(st), msg);
    H_CHECK(strstr(msg, want) && strstr(msg, "larger than"), "rank %d: \"%s\" does not say "
            "what failed on rank 1", rank, msg);
    H_CHECK(took < 4.0, "rank %d learnt of rank 1's abort after %.2f s", rank, took);
}

static void test_nodes_p2p_abort_spreads(void **state)
{
    (void)state;
    run_nodes_env(3, 1, p2p_abort_spreads_rank, "SMDDP_TIMEOUT=60");
}

static void test_nodes_p2p_abort_reaches_any_source(void **state)
{
    (void)state;
    static int any = 1;
    run_nodes_env_arg(3, 1, p2p_abort_spreads_rank, &any, "SMDDP_TIMEOUT=60");
}

/*
 * A receive from another node that fails (here: its own rank aborts) hands
 * its buffer back to the caller: nothing may be written there afterwards,
 * even when the message it was waiting for arrives later. Rank 1 posts the
 * receive and aborts; rank 0 sends after that.
 */
static void p2p_failed_recv_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    int32_t buf[1024], x = rank;
    /* One message first, so that the connection is up when the late one comes. */
    if (rank == 0) H_OK(smddp_send(comm, &x, 1, SMDDP_INT32, 1, 1, NULL, NULL));
    else H_OK(smddp_recv(comm, &x, 1, SMDDP_INT32, 0, 1, NULL, NULL));
    if (rank == 1) {
        smddp_request_t req;
        for (int i = 0; i < 1024; i++) buf[i] = -7;
        H_OK(smddp_recv(comm, buf, 1024, SMDDP_INT32, 0, 3, NULL, &req));
        usleep(200 * 1000);
        H_OK(smddp_comm_abort(comm));
        smddp_status_t st = smddp_wait(req, 10000);
        H_CHECK(st == SMDDP_ERR_ABORTED, "the receive returned %s: %s", smddp_status_string(st),
                smddp_get_last_error(NULL));
        smddp_request_free(req);
        sleep(2); /* rank 0's message comes in meanwhile */
        for (int i = 0; i < 1024; i++)
            H_CHECK(buf[i] == -7, "element %d of the failed receive's buffer was written after "
                    "it failed: %d", i, (int)buf[i]);
        return;
    }
    for (int i = 0; i < 1024; i++) buf[i] = i;
    /*
     * After rank 1's abort, and most likely before this rank hears of it: the
     * message (eager, 4 KiB) then goes out. Either way the send may fail.
     */
    usleep(300 * 1000);
    (void)smddp_send(comm, buf, 1024, SMDDP_INT32, 1, 3, NULL, NULL);
}

static void test_nodes_p2p_failed_recv_untouched(void **state)
{
    (void)state;
    run_nodes_env(2, 1, p2p_failed_recv_rank, "SMDDP_TIMEOUT=5");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_p2p_2),
        cmocka_unit_test(test_p2p_3),
        cmocka_unit_test(test_p2p_any_source_3),
        cmocka_unit_test(test_p2p_any_source_timeout),
        cmocka_unit_test(test_nodes_p2p),
        cmocka_unit_test(test_nodes_p2p_stuck_peer),
        cmocka_unit_test(test_nodes_p2p_abort_spreads),
        cmocka_unit_test(test_nodes_p2p_failed_recv_untouched),
        cmocka_unit_test(test_nodes_p2p_abort_reaches_any_source),
        cmocka_unit_test(test_nodes_any_source),
    };
    /* TEST_FILTER=pattern runs only the matching tests (cmocka's wildcards). */
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
