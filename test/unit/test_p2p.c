/*
 * send/recv within a node and across fake nodes: ring exchanges at sizes up
 * to rendezvous, bursts, receives from any rank, matching by tag whatever the
 * send order, messages that do not match their receive, and failures (a
 * peer that never receives, an abort, a receive that fails while its message
 * is on the way).
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

/* ---- matching by tag ------------------------------------------------------------ */

static int32_t tag_value(int tag, int k, int64_t i) { return tag * 1000000 + k * 10000 + (int32_t)(i % 9973); }

static void check_tagged(const int32_t *got, int64_t n, int tag, int k, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        H_CHECK(got[i] == tag_value(tag, k, i), "%s (count %lld): element %lld is %d, not from "
                "the message with tag %d number %d", what, (long long)n, (long long)i, got[i],
                tag, k);
}

/*
 * Receives match by tag, not by send order, and messages with one source and
 * tag keep their order. Rank 0 sends rank 1 tags 3, 7, 3, 7 (small, then
 * larger than the pair ring); rank 1 waits for the first 7 before it posts
 * anything for tag 3. Then receives posted before the sends; then a large
 * message set aside while it comes in and claimed half-way; then 40
 * messages alternating two tags, taken one tag after the other. With 3
 * ranks or more, receives from any rank take the message with their tag.
 */
static void tag_order_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    const int64_t counts[] = {1, 300000};
    const int tags[4] = {3, 7, 3, 7};
    for (int c = 0; c < 2; c++) {
        int64_t n = counts[c];
        int32_t *buf[4];
        for (int m = 0; m < 4; m++) {
            buf[m] = malloc((size_t)n * 4);
            for (int64_t i = 0; i < n; i++) buf[m][i] = rank == 0 ? tag_value(tags[m], m / 2, i) : -1;
        }
        if (rank == 0) {
            /*
             * Not waited for one by one: as in MPI and gloo, a large send may
             * wait for its receive, which rank 1 posts after tag 7's.
             */
            smddp_request_t req[4];
            for (int m = 0; m < 4; m++)
                H_OK(smddp_send(comm, buf[m], n, SMDDP_INT32, 1, tags[m], NULL, &req[m]));
            for (int m = 0; m < 4; m++) {
                H_OK(smddp_wait(req[m], SMDDP_WAIT_DEFAULT));
                smddp_request_free(req[m]);
            }
        } else if (rank == 1) {
            smddp_request_t req[3];
            H_OK(smddp_recv(comm, buf[0], n, SMDDP_INT32, 0, 7, NULL, NULL));
            check_tagged(buf[0], n, 7, 0, "the first receive for tag 7");
            H_OK(smddp_recv(comm, buf[1], n, SMDDP_INT32, 0, 7, NULL, &req[0]));
            H_OK(smddp_recv(comm, buf[2], n, SMDDP_INT32, 0, 3, NULL, &req[1]));
            H_OK(smddp_recv(comm, buf[3], n, SMDDP_INT32, 0, 3, NULL, &req[2]));
            for (int j = 0; j < 3; j++) {
                H_OK(smddp_wait(req[j], SMDDP_WAIT_DEFAULT));
                smddp_request_free(req[j]);
            }
            check_tagged(buf[1], n, 7, 1, "the second receive for tag 7");
            check_tagged(buf[2], n, 3, 0, "the first receive for tag 3");
            check_tagged(buf[3], n, 3, 1, "the second receive for tag 3");
        }
        /* Receives posted first, for the tag sent last first. */
        smddp_request_t r7 = NULL, r3 = NULL;
        if (rank == 1) {
            H_OK(smddp_recv(comm, buf[0], n, SMDDP_INT32, 0, 7, NULL, &r7));
            H_OK(smddp_recv(comm, buf[1], n, SMDDP_INT32, 0, 3, NULL, &r3));
        }
        H_OK(smddp_barrier(comm, NULL, NULL));
        if (rank == 0) {
            H_OK(smddp_send(comm, buf[0], n, SMDDP_INT32, 1, 3, NULL, NULL));
            H_OK(smddp_send(comm, buf[1], n, SMDDP_INT32, 1, 7, NULL, NULL));
        } else if (rank == 1) {
            H_OK(smddp_wait(r7, SMDDP_WAIT_DEFAULT));
            H_OK(smddp_wait(r3, SMDDP_WAIT_DEFAULT));
            smddp_request_free(r7);
            smddp_request_free(r3);
            check_tagged(buf[0], n, 7, 0, "a receive for tag 7 posted before the sends");
            check_tagged(buf[1], n, 3, 0, "a receive for tag 3 posted after it");
        }
        for (int m = 0; m < 4; m++) free(buf[m]);
        H_OK(smddp_barrier(comm, NULL, NULL));
    }
    /*
     * 8 M elements with tag 3, then 1 with tag 7: the receive for tag 7 makes
     * the large message be set aside as it comes in; the receive for tag 3,
     * posted a moment later, most likely finds it half-way and takes the rest
     * straight from the ring.
     */
    int64_t big = 8 << 20;
    int32_t *large = malloc((size_t)big * 4), small = rank == 0 ? tag_value(7, 0, 0) : -1;
    for (int64_t i = 0; i < big; i++) large[i] = rank == 0 ? tag_value(3, 5, i) : -1;
    smddp_request_t r7b = NULL, r3b = NULL;
    if (rank == 1) H_OK(smddp_recv(comm, &small, 1, SMDDP_INT32, 0, 7, NULL, &r7b));
    H_OK(smddp_barrier(comm, NULL, NULL));
    if (rank == 0) {
        smddp_request_t req[2];
        H_OK(smddp_send(comm, large, big, SMDDP_INT32, 1, 3, NULL, &req[0]));
        H_OK(smddp_send(comm, &small, 1, SMDDP_INT32, 1, 7, NULL, &req[1]));
        for (int j = 0; j < 2; j++) {
            H_OK(smddp_wait(req[j], SMDDP_WAIT_DEFAULT));
            smddp_request_free(req[j]);
        }
    } else if (rank == 1) {
        usleep(2000);
        H_OK(smddp_recv(comm, large, big, SMDDP_INT32, 0, 3, NULL, &r3b));
        H_OK(smddp_wait(r7b, SMDDP_WAIT_DEFAULT));
        H_OK(smddp_wait(r3b, SMDDP_WAIT_DEFAULT));
        smddp_request_free(r7b);
        smddp_request_free(r3b);
        H_CHECK(small == tag_value(7, 0, 0), "the receive for tag 7 got %d", small);
        check_tagged(large, big, 3, 5, "a message claimed while it was set aside");
    }
    free(large);
    H_OK(smddp_barrier(comm, NULL, NULL));
    /* Two tags interleaved, received one tag after the other: each in send order. */
    enum { K = 40 };
    if (rank == 0) {
        for (int k = 0; k < K; k++) {
            int32_t v = tag_value(k % 2, k / 2, 0);
            H_OK(smddp_send(comm, &v, 1, SMDDP_INT32, 1, k % 2, NULL, NULL));
        }
    } else if (rank == 1) {
        for (int t = 1; t >= 0; t--)
            for (int k = 0; k < K / 2; k++) {
                int32_t v = -1;
                H_OK(smddp_recv(comm, &v, 1, SMDDP_INT32, 0, t, NULL, NULL));
                H_CHECK(v == tag_value(t, k, 0), "message %d with tag %d carried %d", k, t, v);
            }
    }
    H_OK(smddp_barrier(comm, NULL, NULL));
    if (size < 3) return;
    /* From any rank: rank 1 sends with tag 11, rank 2 with tag 12; rank 0 asks for 12 first. */
    int32_t v = rank == 1 || rank == 2 ? tag_value(10 + rank, 0, 0) : -1, w = -1;
    smddp_request_t r12 = NULL, r11 = NULL;
    if (rank == 0) {
        H_OK(smddp_recv(comm, &v, 1, SMDDP_INT32, SMDDP_ANY_SOURCE, 12, NULL, &r12));
        H_OK(smddp_recv(comm, &w, 1, SMDDP_INT32, SMDDP_ANY_SOURCE, 11, NULL, &r11));
    }
    if (rank == 2) usleep(100 * 1000); /* tag 11 comes first */
    if (rank == 1 || rank == 2) H_OK(smddp_send(comm, &v, 1, SMDDP_INT32, 0, 10 + rank, NULL, NULL));
    if (rank == 0) {
        int s12 = -1, s11 = -1;
        H_OK(smddp_wait(r12, SMDDP_WAIT_DEFAULT));
        H_OK(smddp_wait(r11, SMDDP_WAIT_DEFAULT));
        H_OK(smddp_request_source(r12, &s12));
        H_OK(smddp_request_source(r11, &s11));
        smddp_request_free(r12);
        smddp_request_free(r11);
        H_CHECK(s12 == 2 && v == tag_value(12, 0, 0) && s11 == 1 && w == tag_value(11, 0, 0),
                "from any rank: tag 12 got %d from rank %d, tag 11 got %d from rank %d", v, s12,
                w, s11);
    }
    H_OK(smddp_barrier(comm, NULL, NULL));
}

/*
 * More sends of one tag than the network may hold at once (the cap is 2 in
 * the run across nodes), large enough to wait for their receives, then one
 * with another tag, which the receiver takes first: it must go past them.
 */
static void tag_past_cap_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    enum { M = 3 };
    int64_t n = 1 << 18;
    int32_t *big[M], small = rank == 0 ? tag_value(2, 0, 0) : -1;
    for (int m = 0; m < M; m++) {
        big[m] = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) big[m][i] = rank == 0 ? tag_value(1, m, i) : -1;
    }
    if (rank == 0) {
        smddp_request_t req[M + 1];
        for (int m = 0; m < M; m++)
            H_OK(smddp_send(comm, big[m], n, SMDDP_INT32, 1, 1, NULL, &req[m]));
        H_OK(smddp_send(comm, &small, 1, SMDDP_INT32, 1, 2, NULL, &req[M]));
        for (int m = 0; m <= M; m++) {
            H_OK(smddp_wait(req[m], SMDDP_WAIT_DEFAULT));
            smddp_request_free(req[m]);
        }
    } else if (rank == 1) {
        H_OK(smddp_recv(comm, &small, 1, SMDDP_INT32, 0, 2, NULL, NULL));
        H_CHECK(small == tag_value(2, 0, 0), "the message with tag 2 carried %d", small);
        for (int m = 0; m < M; m++) {
            H_OK(smddp_recv(comm, big[m], n, SMDDP_INT32, 0, 1, NULL, NULL));
            check_tagged(big[m], n, 1, m, "a message with tag 1 sent before the one with tag 2");
        }
    }
    for (int m = 0; m < M; m++) free(big[m]);
    H_OK(smddp_barrier(comm, NULL, NULL));
}

/*
 * SMDDP_P2P_SET_ASIDE_MAX=4096: the first 8 KiB message with tag 1 is set
 * aside for the receive of tag 2 behind it, the second no longer fits and
 * waits in the ring, so the receive of tag 2 times out, and says why.
 */
static void set_aside_cap_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    int32_t a[2048] = {0}, b[2048] = {0}, c = 7;
    if (rank == 0) {
        H_OK(smddp_send(comm, a, 2048, SMDDP_INT32, 1, 1, NULL, NULL));
        H_OK(smddp_send(comm, b, 2048, SMDDP_INT32, 1, 1, NULL, NULL));
        H_OK(smddp_send(comm, &c, 1, SMDDP_INT32, 1, 2, NULL, NULL));
        sleep(2); /* rank 1 times out meanwhile */
    } else if (rank == 1) {
        smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
        attr.timeout_ms = 1000;
        smddp_status_t st = smddp_recv(comm, &c, 1, SMDDP_INT32, 0, 2, &attr, NULL);
        const char *msg = smddp_get_last_error(NULL);
        H_CHECK(st == SMDDP_ERR_TIMEOUT, "the receive behind a full set-aside returned %s: %s",
                smddp_status_string(st), msg);
        H_CHECK(strstr(msg, "tags 1 that no receive took") &&
                    strstr(msg, "fill SMDDP_P2P_SET_ASIDE_MAX (8192 bytes)"),
                "the timeout does not say why: %s", msg);
    }
}

static void test_p2p_set_aside_cap(void **state)
{
    (void)state;
    run(2, set_aside_cap_rank, "SMDDP_P2P_SET_ASIDE_MAX=4096");
}

static void test_p2p_tag_order(void **state)
{
    (void)state;
    run(2, tag_order_rank, NULL);
    run(3, tag_order_rank, NULL);
    run(2, tag_past_cap_rank, NULL);
}

static void test_nodes_p2p_tag_order(void **state)
{
    (void)state;
    run_nodes(2, 1, tag_order_rank);
    run_nodes(3, 1, tag_order_rank);
    run_nodes(4, 2, tag_order_rank); /* any rank: one sender on this node, one on the other */
    run_nodes_env(2, 1, tag_past_cap_rank, "SMDDP_OFI_MAX_INFLIGHT=2");
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
        cmocka_unit_test(test_p2p_tag_order),
        cmocka_unit_test(test_p2p_set_aside_cap),
        cmocka_unit_test(test_nodes_p2p),
        cmocka_unit_test(test_nodes_p2p_stuck_peer),
        cmocka_unit_test(test_nodes_p2p_abort_spreads),
        cmocka_unit_test(test_nodes_p2p_failed_recv_untouched),
        cmocka_unit_test(test_nodes_p2p_abort_reaches_any_source),
        cmocka_unit_test(test_nodes_any_source),
        cmocka_unit_test(test_nodes_p2p_tag_order),
    };
    /* TEST_FILTER=pattern runs only the matching tests (cmocka's wildcards). */
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
