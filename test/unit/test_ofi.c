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
#include "param.h"
#include "transport/mr_cache.h"
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
    H_OK(smddp__net_open(comm));
    H_CHECK(comm->net && comm->net->provider(comm->net_ep) != NULL, "no provider after setup");
    static const size_t sizes[] = {0, 1, 4096, 65537, 1 << 20, 8 << 20};
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        unsigned char *out = malloc(n + 1), *in = malloc(n + 1), *want = malloc(n + 1);
        fill(out, n, rank, (int)k);
        fill(want, n, prev, (int)k);
        memset(in, 0xee, n + 1);
        smddp__xfer_t rx, tx;
        smddp__op_t op = recv_op(comm, prev, 60);
        H_OK(smddp__xfer_post(comm, &rx, 0, prev, k, in, n));
        H_OK(smddp__xfer_post(comm, &tx, 1, next, k, out, n));
        H_OK(smddp__xfer_wait(comm, &op, &tx));
        H_OK(smddp__xfer_wait(comm, &op, &rx));
        H_CHECK(memcmp(in, want, n) == 0, "%zu bytes from rank %d differ", n, prev);
        H_CHECK(in[n] == 0xee, "a %zu-byte receive wrote past its end", n);
        free(out);
        free(in);
        free(want);
    }
    /* Many small messages in flight at once, received in the order sent. */
    enum { MANY = 256 };
    static smddp__xfer_t rx[MANY], tx[MANY];
    static uint32_t got[MANY], sent[MANY];
    smddp__op_t op = recv_op(comm, prev, 60);
    for (int i = 0; i < MANY; i++) {
        sent[i] = (uint32_t)(rank * 100000 + i);
        H_OK(smddp__xfer_post(comm, &rx[i], 0, prev, 1000, &got[i], sizeof(got[i])));
    }
    for (int i = 0; i < MANY; i++)
        H_OK(smddp__xfer_post(comm, &tx[i], 1, next, 1000, &sent[i], sizeof(sent[i])));
    for (int i = 0; i < MANY; i++) {
        H_OK(smddp__xfer_wait(comm, &op, &tx[i]));
        H_OK(smddp__xfer_wait(comm, &op, &rx[i]));
        H_CHECK(got[i] == (uint32_t)(prev * 100000 + i), "message %d from rank %d is %u", i,
                prev, got[i]);
    }
    if (arg) {
        /* Registered run: fresh buffers are registered, reused pages hit. */
        uint64_t hits, misses;
        bool registering;
        comm->net->mr_stats(comm->net_ep, &hits, &misses, &registering);
        H_CHECK(registering, "SMDDP_OFI_MR=always, yet the endpoint registers nothing");
        H_CHECK(misses > 0 && hits > 0, "%llu registrations and %llu hits for 524 transfers",
                (unsigned long long)misses, (unsigned long long)hits);
    }
    smddp__net_close(comm);
    smddp__net_close(comm); /* twice is harmless */
}

static void test_ring_2(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = LOOPBACK, .timeout_s = 120};
    assert_int_equal(harness_run(2, ring_fn, NULL, &opts), 0);
}

/* ring_fn with every buffer registered (tcp does not need it), through a 4-entry cache. */
static void test_ring_registered(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = LOOPBACK " SMDDP_OFI_MR=always SMDDP_OFI_MR_CACHE=4",
                           .timeout_s = 120};
    static int registered = 1;
    assert_int_equal(harness_run(2, ring_fn, &registered, &opts), 0);
}

/* ---- the registration cache on its own, with a fake registrar ------------ */

typedef struct fake_reg {
    int regs, deregs, live, fail_next;
    uintptr_t last_lo;
    size_t last_len;
} fake_reg_t;

static int fake_reg_fn(void *ctx, void *addr, size_t len, void **handle, void **desc)
{
    fake_reg_t *f = ctx;
    if (f->fail_next) {
        f->fail_next = 0;
        return -12;
    }
    f->regs++;
    f->live++;
    f->last_lo = (uintptr_t)addr;
    f->last_len = len;
    *handle = addr;
    *desc = (char *)addr + 1; /* any value the test can recognise */
    return 0;
}

static void fake_dereg_fn(void *ctx, void *handle)
{
    fake_reg_t *f = ctx;
    (void)handle;
    f->deregs++;
    f->live--;
}

static void test_mr_cache(void **state)
{
    (void)state;
    fake_reg_t f = {0};
    smddp__mr_cache_t *c;
    assert_int_equal(smddp__mr_cache_new(2, fake_reg_fn, fake_dereg_fn, NULL, &f, "fake", &c),
                     SMDDP_OK);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *mem = aligned_alloc(page, 16 * page);
    smddp__mr_entry_t *a, *b, *d, *e;

    /* Not held: an entry goes when its last transfer completes. */
    assert_int_equal(smddp__mr_cache_get(c, mem + 10, 100, &a), SMDDP_OK);
    assert_int_equal(f.regs, 1);
    assert_true(f.last_lo == (uintptr_t)mem && f.last_len == page); /* page aligned */
    assert_ptr_equal(smddp__mr_desc(a), mem + 1);
    smddp__mr_cache_put(c, a);
    assert_int_equal(f.live, 0);

    /* Held (one collective): a buffer inside a registered range hits. */
    smddp__mr_cache_hold(c);
    assert_int_equal(smddp__mr_cache_get(c, mem, 2 * page, &a), SMDDP_OK);
    smddp__mr_cache_put(c, a);
    assert_int_equal(smddp__mr_cache_get(c, mem + page, 100, &b), SMDDP_OK);
    assert_ptr_equal(a, b);
    smddp__mr_cache_put(c, b);
    assert_int_equal(f.regs, 2);
    /* A range that sticks out of every entry misses. */
    assert_int_equal(smddp__mr_cache_get(c, mem + page, 2 * page, &d), SMDDP_OK);
    assert_int_equal(f.regs, 3);
    /* Full (2 entries) with d pinned: the unpinned, least recently used one (a) is evicted. */
    assert_int_equal(smddp__mr_cache_get(c, mem + 8 * page, 10, &e), SMDDP_OK);
    assert_int_equal(f.deregs, 2); /* the first entry's, and a's now */
    assert_int_equal(smddp__mr_cache_stats(c).evictions, 1);
    /* Everything pinned: a registration for that transfer alone, gone when it completes. */
    smddp__mr_entry_t *t;
    assert_int_equal(smddp__mr_cache_get(c, mem + 12 * page, 10, &t), SMDDP_OK);
    assert_int_equal(smddp__mr_cache_stats(c).uncached, 1);
    assert_int_equal(f.live, 3);
    smddp__mr_cache_put(c, t);
    assert_int_equal(f.live, 2);
    smddp__mr_cache_put(c, d);
    smddp__mr_cache_put(c, e);
    assert_int_equal(f.live, 2); /* still held */
    smddp__mr_cache_release(c);
    assert_int_equal(f.live, 0); /* the collective is over: the caller may free its buffers */

    /* Persistent entries survive release and serve later lookups. */
    assert_int_equal(smddp__mr_cache_add_persistent(c, mem, 16 * page), SMDDP_OK);
    assert_int_equal(smddp__mr_cache_get(c, mem + 5 * page, page, &a), SMDDP_OK);
    smddp__mr_cache_put(c, a);
    smddp__mr_cache_hold(c);
    smddp__mr_cache_release(c);
    assert_int_equal(f.live, 1);
    smddp__mr_stats_t st = smddp__mr_cache_stats(c);
    assert_true(st.hits == 2 && st.live == 1);

    /* A failed registration is an error that says what failed, and leaves nothing behind. */
    f.fail_next = 1;
    smddp_status_t rc = smddp__mr_cache_get(c, (char *)mem + 64 * page, 10, &a);
    assert_int_equal(rc, SMDDP_ERR_SYSTEM);
    assert_non_null(strstr(smddp__last_error(), "fake: registering 4096 bytes"));
    assert_int_equal(f.live, 1);

    smddp__mr_cache_free(c);
    assert_int_equal(f.live, 0);

    /* Teardown with transfers that never completed: their registrations go too. */
    assert_int_equal(smddp__mr_cache_new(1, fake_reg_fn, fake_dereg_fn, NULL, &f, "fake", &c),
                     SMDDP_OK);
    assert_int_equal(smddp__mr_cache_get(c, mem, 10, &a), SMDDP_OK);
    assert_int_equal(smddp__mr_cache_get(c, mem + 4 * page, 10, &t), SMDDP_OK);
    assert_int_equal(smddp__mr_cache_stats(c).uncached, 1);
    assert_int_equal(f.live, 2);
    smddp__mr_cache_free(c);
    assert_int_equal(f.live, 0);
    free(mem);
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
    H_OK(smddp__net_open(comm));
    if (rank == 1) {
        /* Make sure rank 0's endpoint knows this one before going quiet. */
        smddp__xfer_t tx;
        smddp__op_t op = recv_op(comm, 0, 30);
        char hello = 'h';
        H_OK(smddp__xfer_post(comm, &tx, 1, 0, 1, &hello, 1));
        H_OK(smddp__xfer_wait(comm, &op, &tx));
        if (kill_peer) raise(SIGKILL);
        sleep(4);
        smddp__net_close(comm);
        return;
    }
    char hello = 0, never = 0;
    smddp__xfer_t rx;
    smddp__op_t op = recv_op(comm, 1, 30);
    H_OK(smddp__xfer_post(comm, &rx, 0, 1, 1, &hello, 1));
    H_OK(smddp__xfer_wait(comm, &op, &rx));
    H_CHECK(hello == 'h', "first message is %d", hello);
    op = recv_op(comm, 1, 1.5);
    double t0 = now_s();
    H_OK(smddp__xfer_post(comm, &rx, 0, 1, 2, &never, 1));
    smddp_status_t st = smddp__xfer_wait(comm, &op, &rx);
    double dt = now_s() - t0;
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st == SMDDP_ERR_TIMEOUT || (kill_peer && st == SMDDP_ERR_PEER_LOST),
            "the wait returned %s: %s", smddp_status_string(st), msg);
    H_CHECK(dt < 3.0, "the wait took %.2f s with a 1.5 s deadline", dt);
    H_CHECK(strstr(msg, "rank 1") != NULL, "the message does not name rank 1: %s", msg);
    /* Teardown with the receive still posted. */
    smddp__net_close(comm);
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
    H_CHECK(smddp__net_open(comm) == SMDDP_ERR_NOT_SUPPORTED, "setup with a bogus provider");
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(strstr(msg, "no-such-provider") && strstr(msg, "SMDDP_OFI_PROVIDER"),
            "the message does not name the setting: %s", msg);
    H_CHECK(!comm->net && !comm->net_ep && !comm->net_p2p, "a failed setup left a transport behind");
}

static void test_bad_provider(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = "SMDDP_OFI_PROVIDER=no-such-provider", .timeout_s = 60};
    assert_int_equal(harness_run(2, bad_provider_fn, NULL, &opts), 0);
}

/* An EFA device is an entry of the RDMA class whose driver is efa; others are not. */
static void test_efa_present(void **state)
{
    (void)state;
    char root[] = "/tmp/smddp-efa-XXXXXX", path[256], cmd[320];
    assert_non_null(mkdtemp(root));
    snprintf(path, sizeof(path), "%s/missing", root);
    assert_false(smddp__efa_present(path));
    snprintf(cmd, sizeof(cmd), "mkdir -p %s/mlx5_0/device %s/rdmap0/device && "
             "ln -s ../../../bus/pci/drivers/mlx5_core %s/mlx5_0/device/driver", root, root, root);
    assert_int_equal(system(cmd), 0);
    assert_false(smddp__efa_present(root)); /* an RDMA device, not EFA; one without a driver */
    snprintf(cmd, sizeof(cmd), "ln -s ../../../bus/pci/drivers/efa %s/rdmap0/device/driver", root);
    assert_int_equal(system(cmd), 0);
    assert_true(smddp__efa_present(root));
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    assert_int_equal(system(cmd), 0);
}

/*
 * FI_PROVIDER=efa where no EFA device is (SageMaker's runner exports it on
 * every instance): the ranks drop it and meet over tcp;ofi_rxm.
 */
static void efa_absent_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)rank, (void)size, (void)arg;
    H_OK(smddp__net_open(comm));
    const char *provider = comm->net->provider(comm->net_ep);
    H_CHECK(strcmp(provider, "tcp;ofi_rxm") == 0, "provider %s, expected tcp;ofi_rxm", provider);
    H_CHECK(getenv("FI_PROVIDER") == NULL, "FI_PROVIDER=%s is still set", getenv("FI_PROVIDER"));
    smddp__net_close(comm);
}

/* SMDDP_OFI_PROVIDER=efa stays strict: setup fails, naming efa and the setting. */
static void efa_strict_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)rank, (void)size, (void)arg;
    H_CHECK(smddp__net_open(comm) == SMDDP_ERR_NOT_SUPPORTED, "efa asked for by "
            "SMDDP_OFI_PROVIDER without a device");
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(strstr(msg, "\"efa\"") && strstr(msg, "SMDDP_OFI_PROVIDER"), "message: %s", msg);
    H_CHECK(getenv("FI_PROVIDER") && strcmp(getenv("FI_PROVIDER"), "efa") == 0,
            "FI_PROVIDER was changed under an explicit SMDDP_OFI_PROVIDER");
}

static void test_efa_absent(void **state)
{
    (void)state;
    if (smddp__efa_present(SMDDP_EFA_CLASS_DIR)) {
        print_message("skipped: this machine has an EFA device\n");
        skip();
    }
    harness_opts_t opts = {.env = LOOPBACK " FI_PROVIDER=efa SMDDP_TIMEOUT=60", .timeout_s = 60};
    assert_int_equal(harness_run(2, efa_absent_fn, NULL, &opts), 0);
    harness_opts_t strict = {.env = "FI_PROVIDER=efa SMDDP_OFI_PROVIDER=efa", .timeout_s = 60};
    assert_int_equal(harness_run(2, efa_strict_fn, NULL, &strict), 0);
}

/*
 * libfabric is opened when a communicator first needs it: a library that
 * cannot be opened, or that is not libfabric, fails the setup naming it.
 */
static void bad_library_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)rank, (void)size;
    const char *want = arg;
    H_CHECK(smddp__net_open(comm) == SMDDP_ERR_NOT_SUPPORTED, "setup with SMDDP_OFI_LIBRARY=%s",
            smddp__params()->ofi_library);
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(strstr(msg, smddp__params()->ofi_library) && strstr(msg, want), "message: %s", msg);
}

static void test_bad_library(void **state)
{
    (void)state;
    harness_opts_t missing = {.env = "SMDDP_OFI_LIBRARY=/no/such/libfabric.so.1", .timeout_s = 60};
    assert_int_equal(harness_run(2, bad_library_fn, "SMDDP_OFI_LIBRARY", &missing), 0);
    harness_opts_t other = {.env = "SMDDP_OFI_LIBRARY=libm.so.6", .timeout_s = 60};
    assert_int_equal(harness_run(2, bad_library_fn, "is not libfabric: it has no fi_getinfo",
                                 &other), 0);
}

/*
 * Ranks on different providers (SMDDP_OFI_PROVIDER or FI_PROVIDER set on
 * some hosts only; efa on some, tcp on others) cannot talk: setup fails on
 * both at once, naming both providers, instead of timing out.
 */
static void provider_mismatch_fn(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size, (void)arg;
    setenv("SMDDP_OFI_PROVIDER", rank == 0 ? "tcp;ofi_rxm" : "sockets", 1);
    smddp__params_reload();
    double t0 = now_s();
    smddp_status_t st = smddp__net_open(comm);
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(st == SMDDP_ERR_MISMATCH, "setup across two providers returned %d: %s", st, msg);
    H_CHECK(strstr(msg, "\"tcp;ofi_rxm\"") && strstr(msg, "\"sockets\"") &&
                strstr(msg, "SMDDP_OFI_PROVIDER"),
            "the message does not name both providers and the setting: %s", msg);
    H_CHECK(now_s() - t0 < 20, "the mismatch took the timeout to show");
    smddp__net_close(comm);
}

static void test_provider_mismatch(void **state)
{
    (void)state;
    if (!smddp__ofi_offers("tcp;ofi_rxm") || !smddp__ofi_offers("sockets")) {
        print_message("skipped: this libfabric lacks tcp;ofi_rxm or sockets\n");
        skip();
    }
    harness_opts_t opts = {.env = LOOPBACK " SMDDP_TIMEOUT=60", .timeout_s = 60};
    assert_int_equal(harness_run(2, provider_mismatch_fn, NULL, &opts), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_2),
        cmocka_unit_test(test_ring_3),
        cmocka_unit_test(test_ring_registered),
        cmocka_unit_test(test_mr_cache),
        cmocka_unit_test(test_receive_times_out),
        cmocka_unit_test(test_receive_from_killed_peer),
        cmocka_unit_test(test_bad_provider),
        cmocka_unit_test(test_efa_present),
        cmocka_unit_test(test_efa_absent),
        cmocka_unit_test(test_bad_library),
        cmocka_unit_test(test_provider_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
