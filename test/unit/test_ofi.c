/*
 * The libfabric transport on its own: ranks of one machine open endpoints
 * (tcp;ofi_rxm over loopback unless SMDDP_OFI_PROVIDER or FI_PROVIDER say
 * otherwise), exchange addresses through the store and move tagged messages;
 * a receive nobody answers times out naming the peer, and so does one whose
 * peer was killed.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "transport/ofi.h"

#define LOOPBACK "FI_TCP_IFACE=lo"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* An op that only names the transfer in messages and bounds the wait. */
static smddp__op_t recv_op(smddp_comm_t comm, int peer, double timeout_s)
{
    smddp__op_t op = {.kind = SMDDP_OP_RECV, .comm = comm, .root = peer, .dtype = SMDDP_UINT8};
    op.deadline_ns = (int64_t)((now_s() + timeout_s) * 1e9);
    return op;
}

static void fill(unsigned char *buf, size_t n, int from, int k)
{
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 7 + (size_t)from * 31 + (size_t)k);
}

/* Every rank sends to the next and receives from the previous, sizes 0 to 8 MiB. */
static void ring_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    H_OK(smddp__ofi_setup(comm));
    H_CHECK(smddp__ofi_provider(comm) != NULL, "no provider after setup");
    static const size_t sizes[] = {0, 1, 4096, 65537, 1 << 20, 8 << 20};
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        unsigned char *out = malloc(n + 1), *in = malloc(n + 1), *want = malloc(n + 1);
        fill(out, n, rank, (int)k);
        fill(want, n, prev, (int)k);
        memset(in, 0xee, n + 1);
        smddp__ofi_xfer_t rx, tx;
        smddp__op_t op = recv_op(comm, prev, 60);
        H_OK(smddp__ofi_post(comm, &rx, 0, prev, k, in, n));
        H_OK(smddp__ofi_post(comm, &tx, 1, next, k, out, n));
        H_OK(smddp__ofi_wait(comm, &op, &tx));
        H_OK(smddp__ofi_wait(comm, &op, &rx));
        H_CHECK(memcmp(in, want, n) == 0, "%zu bytes from rank %d differ", n, prev);
        H_CHECK(in[n] == 0xee, "a %zu-byte receive wrote past its end", n);
        free(out);
        free(in);
        free(want);
    }
    /* Many small messages in flight at once, received in the order sent. */
    enum { MANY = 256 };
    static smddp__ofi_xfer_t rx[MANY], tx[MANY];
    static uint32_t got[MANY], sent[MANY];
    smddp__op_t op = recv_op(comm, prev, 60);
    for (int i = 0; i < MANY; i++) {
        sent[i] = (uint32_t)(rank * 100000 + i);
        H_OK(smddp__ofi_post(comm, &rx[i], 0, prev, 1000, &got[i], sizeof(got[i])));
    }
    for (int i = 0; i < MANY; i++)
        H_OK(smddp__ofi_post(comm, &tx[i], 1, next, 1000, &sent[i], sizeof(sent[i])));
    for (int i = 0; i < MANY; i++) {
        H_OK(smddp__ofi_wait(comm, &op, &tx[i]));
        H_OK(smddp__ofi_wait(comm, &op, &rx[i]));
        H_CHECK(got[i] == (uint32_t)(prev * 100000 + i), "message %d from rank %d is %u", i,
                prev, got[i]);
    }
    smddp__ofi_teardown(comm);
    smddp__ofi_teardown(comm); /* twice is harmless */
}

static void test_ring_2(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = LOOPBACK, .timeout_s = 120};
    assert_int_equal(harness_run(2, ring_fn, NULL, &opts), 0);
}

static void test_ring_3(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = LOOPBACK, .timeout_s = 120};
    assert_int_equal(harness_run(3, ring_fn, NULL, &opts), 0);
}

/*
 * Rank 0 waits for a message rank 1 never sends (first case) or cannot send
 * because it was killed (second): the wait ends at the deadline or at the
 * provider's error, and the message names rank 1.
 */
static void silent_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    int kill_peer = *(int *)arg;
    H_OK(smddp__ofi_setup(comm));
    if (rank == 1) {
        /* Make sure rank 0's endpoint knows this one before going quiet. */
        smddp__ofi_xfer_t tx;
        smddp__op_t op = recv_op(comm, 0, 30);
        char hello = 'h';
        H_OK(smddp__ofi_post(comm, &tx, 1, 0, 1, &hello, 1));
        H_OK(smddp__ofi_wait(comm, &op, &tx));
        if (kill_peer) raise(SIGKILL);
        sleep(4);
        smddp__ofi_teardown(comm);
        return;
    }
    char hello = 0, never = 0;
    smddp__ofi_xfer_t rx;
    smddp__op_t op = recv_op(comm, 1, 30);
    H_OK(smddp__ofi_post(comm, &rx, 0, 1, 1, &hello, 1));
    H_OK(smddp__ofi_wait(comm, &op, &rx));
    H_CHECK(hello == 'h', "first message is %d", hello);
    op = recv_op(comm, 1, 1.5);
    double t0 = now_s();
    H_OK(smddp__ofi_post(comm, &rx, 0, 1, 2, &never, 1));
    smddp_status_t st = smddp__ofi_wait(comm, &op, &rx);
    double dt = now_s() - t0;
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st == SMDDP_ERR_TIMEOUT || (kill_peer && st == SMDDP_ERR_PEER_LOST),
            "the wait returned %s: %s", smddp_status_string(st), msg);
    H_CHECK(dt < 3.0, "the wait took %.2f s with a 1.5 s deadline", dt);
    H_CHECK(strstr(msg, "rank 1") != NULL, "the message does not name rank 1: %s", msg);
    /* Teardown with the receive still posted. */
    smddp__ofi_teardown(comm);
}

static void test_receive_times_out(void **state)
{
    (void)state;
    int kill_peer = 0;
    harness_opts_t opts = {.env = LOOPBACK, .timeout_s = 60};
    assert_int_equal(harness_run(2, silent_fn, &kill_peer, &opts), 0);
}

static void test_receive_from_killed_peer(void **state)
{
    (void)state;
    int kill_peer = 1;
    harness_opts_t opts = {.env = LOOPBACK, .timeout_s = 60, .expect_signal = {0, SIGKILL}};
    assert_int_equal(harness_run(2, silent_fn, &kill_peer, &opts), 0);
}

/* A provider that does not exist: setup fails and says which and why. */
static void bad_provider_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)rank, (void)size, (void)arg;
    H_CHECK(smddp__ofi_setup(comm) == SMDDP_ERR_NOT_SUPPORTED, "setup with a bogus provider");
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(strstr(msg, "no-such-provider") && strstr(msg, "SMDDP_OFI_PROVIDER"),
            "the message does not name the setting: %s", msg);
    H_CHECK(smddp__ofi_provider(comm) == NULL, "a failed setup left a transport behind");
}

static void test_bad_provider(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = "SMDDP_OFI_PROVIDER=no-such-provider", .timeout_s = 60};
    assert_int_equal(harness_run(2, bad_provider_fn, NULL, &opts), 0);
}

int main(void)
{
    if (!smddp__ofi_built()) {
        printf("libsmddp was built without libfabric (install libfabric-dev): "
               "the transport tests are skipped\n");
        return 77; /* meson's "skipped" */
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_2),
        cmocka_unit_test(test_ring_3),
        cmocka_unit_test(test_receive_times_out),
        cmocka_unit_test(test_receive_from_killed_peer),
        cmocka_unit_test(test_bad_provider),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
