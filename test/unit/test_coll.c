/*
 * Every collective on 2, 3 and 4 forked ranks, in place and out of place, over
 * sizes 0, 1, 7, 4097 and one that takes several pipeline rounds, each result
 * checked against a reference computed here from the inputs every rank can
 * regenerate. Inputs are small integers (halves for floats) so that the exact
 * result does not depend on the order of additions; that the order is also
 * fixed is checked by comparing result bytes across ranks.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm.h"
#include "reduce/half.h"
#include "transport/ofi.h"
#include "harness.h"
#include "values.h"

static const int64_t sizes[] = {0, 1, 7, 4097, 300000};
#define NSIZES (int)(sizeof(sizes) / sizeof(sizes[0]))

/* The value rank r contributes at element i (exact in every dtype). */
static double input_value(int r, int64_t i, smddp_op_t op)
{
    if (op == SMDDP_PROD) {
        int k = (int)((i + r) % 4);
        return k == 0 ? 2.0 : k == 1 ? -1.0 : 1.0;
    }
    return (double)((i * 7 + r * 13 + 3) % 17) - 8.0;
}

/* Reduction of every rank's input at element i, in rank order. */
static double expected_value(smddp_dtype_t t, smddp_op_t op, int size, int64_t i, double premul)
{
    double v[64];
    for (int r = 0; r < size; r++) v[r] = tv_stored(t, input_value(r, i, op));
    return tv_reduce(t, op, v, size, premul);
}

static void fill(void *buf, smddp_dtype_t t, smddp_op_t op, int r, int64_t n, int64_t offset)
{
    for (int64_t i = 0; i < n; i++) tv_store(buf, t, i, input_value(r, i + offset, op));
}

/* Every rank's result bytes must be identical: allgather a checksum and compare. */
static void check_identical(smddp_comm_t comm, const void *buf, size_t bytes)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < bytes; i++) h = (h ^ ((const uint8_t *)buf)[i]) * 1099511628211ull;
    int size;
    smddp_comm_size(comm, &size);
    uint64_t all[16];
    H_OK(smddp_allgather(comm, &h, all, 1, SMDDP_INT64, NULL, NULL));
    for (int r = 1; r < size; r++) H_CHECK(all[r] == all[0], "rank %d's result differs from rank 0's", r);
}

/* ---- allreduce ------------------------------------------------------------- */

static const smddp_op_t all_ops[] = {SMDDP_SUM,  SMDDP_PROD,       SMDDP_MIN,  SMDDP_MAX, SMDDP_AVG,
                                     SMDDP_PREMUL_SUM, SMDDP_BAND, SMDDP_BOR, SMDDP_BXOR};

static void check_result(const void *buf, smddp_dtype_t t, smddp_op_t op, int size, int64_t n,
                         int64_t offset, double premul, const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        double want = expected_value(t, op, size, i + offset, premul);
        double got = tv_load(buf, t, i);
        H_CHECK(got == want, "%s %s %s n=%lld: element %lld is %g, expected %g", what,
                smddp_dtype_name(t), smddp_op_name(op), (long long)n, (long long)i, got, want);
    }
}

static void allreduce_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.premul_factor = 0.5;
    for (int t = 0; t < SMDDP_DTYPE_COUNT; t++) {
        smddp_dtype_t dt = (smddp_dtype_t)t;
        size_t es = smddp_dtype_size(dt);
        for (size_t o = 0; o < sizeof(all_ops) / sizeof(all_ops[0]); o++) {
            smddp_op_t op = all_ops[o];
            if (!tv_op_valid(dt, op)) continue;
            for (int s = 0; s < NSIZES; s++) {
                int64_t n = sizes[s];
                /* The big size only for a few dtype/op pairs, to keep the run short. */
                if (n > 5000 && !(op == SMDDP_SUM || (dt == SMDDP_FLOAT32 && op == SMDDP_MAX) ||
                                  (dt == SMDDP_BFLOAT16 && op == SMDDP_AVG)))
                    continue;
                char *in = malloc((size_t)n * es + 1), *out = malloc((size_t)n * es + 1);
                fill(in, dt, op, rank, n, 0);
                memset(out, 0x5a, (size_t)n * es);
                H_OK(smddp_allreduce(comm, in, out, n, dt, op, &attr, NULL));
                check_result(out, dt, op, size, n, 0, 0.5, "allreduce");
                check_identical(comm, out, (size_t)n * es);
                /* In place, through a request. */
                smddp_request_t req;
                H_OK(smddp_allreduce(comm, in, in, n, dt, op, &attr, &req));
                H_OK(smddp_wait(req, SMDDP_WAIT_DEFAULT));
                smddp_request_free(req);
                H_CHECK(memcmp(in, out, (size_t)n * es) == 0, "in-place allreduce differs");
                free(in);
                free(out);
            }
        }
    }
}

static void run(int nranks, harness_fn_t fn, const char *env)
{
    harness_opts_t opts = {.env = env, .timeout_s = 300};
    int shm_before = harness_shm_count();
    assert_int_equal(harness_run(nranks, fn, NULL, &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
}

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

static void reduce_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    const smddp_dtype_t dts[] = {SMDDP_FLOAT32, SMDDP_BFLOAT16, SMDDP_INT64, SMDDP_UINT8};
    const smddp_op_t ops[] = {SMDDP_SUM, SMDDP_MAX, SMDDP_AVG};
    for (size_t t = 0; t < 4; t++) {
        smddp_dtype_t dt = dts[t];
        size_t es = smddp_dtype_size(dt);
        for (size_t o = 0; o < 3; o++) {
            for (int s = 0; s < NSIZES; s++) {
                int64_t n = sizes[s];
                int root = (int)(s + o) % size;
                char *in = malloc((size_t)n * es + 1), *out = malloc((size_t)n * es + 1);
                fill(in, dt, ops[o], rank, n, 0);
                memset(out, 0, (size_t)n * es);
                H_OK(smddp_reduce(comm, in, rank == root ? out : NULL, n, dt, ops[o], root, NULL,
                                  NULL));
                if (rank == root) check_result(out, dt, ops[o], size, n, 0, 1.0, "reduce");
                /* In place on the root. */
                H_OK(smddp_reduce(comm, in, rank == root ? in : NULL, n, dt, ops[o], root, NULL,
                                  NULL));
                if (rank == root) check_result(in, dt, ops[o], size, n, 0, 1.0, "reduce in place");

                /* reduce_scatter: block r of every rank's input reduces into rank r. */
                char *big = malloc((size_t)n * es * (size_t)size + 1);
                for (int b = 0; b < size; b++)
                    fill(big + (size_t)b * (size_t)n * es, dt, ops[o], rank, n, (int64_t)b * n);
                H_OK(smddp_reduce_scatter(comm, big, out, n, dt, ops[o], NULL, NULL));
                check_result(out, dt, ops[o], size, n, (int64_t)rank * n, 1.0, "reduce_scatter");
                char *mine = big + (size_t)rank * (size_t)n * es;
                H_OK(smddp_reduce_scatter(comm, big, mine, n, dt, ops[o], NULL, NULL));
                check_result(mine, dt, ops[o], size, n, (int64_t)rank * n, 1.0,
                             "reduce_scatter in place");
                free(big);
                free(in);
                free(out);
            }
        }
    }
}

static void test_reduce_2(void **state) { (void)state; run(2, reduce_rank, NULL); }
static void test_reduce_3(void **state) { (void)state; run(3, reduce_rank, NULL); }
static void test_reduce_4(void **state) { (void)state; run(4, reduce_rank, NULL); }
static void test_reduce_small_buffers(void **state)
{
    (void)state;
    run(3, reduce_rank, "SMDDP_SHM_BUFFER_SIZE=8192 SMDDP_STREAM_MIN=1");
}

/* ---- data movement -------------------------------------------------------- */

/* Byte j of rank r's block b: a pattern that tells all three apart. */
static uint8_t pattern(int r, int b, int64_t j) { return (uint8_t)(r * 31 + b * 7 + j * 13 + 1); }

static void movement_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    for (int s = 0; s < NSIZES; s++) {
        int64_t n = sizes[s];
        for (int t = 0; t < 2; t++) {
            smddp_dtype_t dt = t == 0 ? SMDDP_UINT8 : SMDDP_FLOAT64;
            size_t es = smddp_dtype_size(dt);
            size_t nb = (size_t)n * es; /* bytes per block */
            uint8_t *one = malloc(nb + 1), *all = malloc(nb * (size_t)size + 1),
                    *res = malloc(nb * (size_t)size + 1);
            int root = s % size;

            /* broadcast */
            for (size_t j = 0; j < nb; j++) one[j] = rank == root ? pattern(root, 0, (int64_t)j) : 0;
            H_OK(smddp_broadcast(comm, one, n, dt, root, NULL, NULL));
            for (size_t j = 0; j < nb; j++)
                H_CHECK(one[j] == pattern(root, 0, (int64_t)j), "broadcast n=%lld byte %zu",
                        (long long)n, j);

            /* allgather, out of place and in place */
            for (size_t j = 0; j < nb; j++) one[j] = pattern(rank, 0, (int64_t)j);
            memset(res, 0, nb * (size_t)size);
            H_OK(smddp_allgather(comm, one, res, n, dt, NULL, NULL));
            for (int r = 0; r < size; r++)
                for (size_t j = 0; j < nb; j++)
                    H_CHECK(res[(size_t)r * nb + j] == pattern(r, 0, (int64_t)j),
                            "allgather n=%lld from rank %d byte %zu", (long long)n, r, j);
            memset(res, 0, nb * (size_t)size);
            memcpy(res + (size_t)rank * nb, one, nb);
            H_OK(smddp_allgather(comm, res + (size_t)rank * nb, res, n, dt, NULL, NULL));
            for (int r = 0; r < size; r++)
                for (size_t j = 0; j < nb; j++)
                    H_CHECK(res[(size_t)r * nb + j] == pattern(r, 0, (int64_t)j),
                            "in-place allgather n=%lld from rank %d byte %zu", (long long)n, r, j);

            /* gather */
            memset(res, 0, nb * (size_t)size);
            H_OK(smddp_gather(comm, one, rank == root ? res : NULL, n, dt, root, NULL, NULL));
            if (rank == root)
                for (int r = 0; r < size; r++)
                    for (size_t j = 0; j < nb; j++)
                        H_CHECK(res[(size_t)r * nb + j] == pattern(r, 0, (int64_t)j),
                                "gather n=%lld from rank %d byte %zu", (long long)n, r, j);

            /* scatter */
            for (int b = 0; b < size; b++)
                for (size_t j = 0; j < nb; j++) all[(size_t)b * nb + j] = pattern(root, b, (int64_t)j);
            memset(one, 0, nb);
            H_OK(smddp_scatter(comm, rank == root ? all : NULL, one, n, dt, root, NULL, NULL));
            for (size_t j = 0; j < nb; j++)
                H_CHECK(one[j] == pattern(root, rank, (int64_t)j), "scatter n=%lld byte %zu",
                        (long long)n, j);

            /* alltoall: block b of rank r goes to rank b */
            for (int b = 0; b < size; b++)
                for (size_t j = 0; j < nb; j++) all[(size_t)b * nb + j] = pattern(rank, b, (int64_t)j);
            memset(res, 0, nb * (size_t)size);
            H_OK(smddp_alltoall(comm, all, res, n, dt, NULL, NULL));
            for (int r = 0; r < size; r++)
                for (size_t j = 0; j < nb; j++)
                    H_CHECK(res[(size_t)r * nb + j] == pattern(r, rank, (int64_t)j),
                            "alltoall n=%lld from rank %d byte %zu", (long long)n, r, j);
            free(one);
            free(all);
            free(res);
        }
        H_OK(smddp_barrier(comm, NULL, NULL));
    }
}

static void test_movement_2(void **state) { (void)state; run(2, movement_rank, NULL); }
static void test_movement_3(void **state) { (void)state; run(3, movement_rank, NULL); }
static void test_movement_4(void **state) { (void)state; run(4, movement_rank, NULL); }
static void test_movement_small_buffers(void **state)
{
    (void)state;
    run(3, movement_rank, "SMDDP_SHM_BUFFER_SIZE=8192 SMDDP_STREAM_MIN=1");
}

/* ---- alltoallv with uneven splits ------------------------------------------ */

/* Elements rank i sends to rank j. Zeros included on purpose. */
static int64_t split(int i, int j, int64_t scale) { return ((i * 3 + j * 5) % 4) * scale + (i == j ? 1 : 0); }

static void alltoallv_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    const int64_t scales[] = {0, 1, 7, 1000, 200000};
    for (int s = 0; s < 5; s++) {
        int64_t sc[16], sd[16], rc[16], rd[16], stot = 0, rtot = 0;
        for (int j = 0; j < size; j++) {
            sc[j] = split(rank, j, scales[s]);
            rc[j] = split(j, rank, scales[s]);
            /* Displacements leave gaps, so they are really used. */
            sd[j] = stot + j;
            rd[j] = rtot + 2 * j;
            stot += sc[j] + j;
            rtot += rc[j] + 2 * j;
        }
        int32_t *send = malloc((size_t)stot * 4 + 4), *recv = malloc((size_t)rtot * 4 + 4);
        for (int j = 0; j < size; j++)
            for (int64_t k = 0; k < sc[j]; k++) send[sd[j] + k] = rank * 1000000 + j * 10000 + (int32_t)(k % 10000);
        memset(recv, 0xff, (size_t)rtot * 4);
        H_OK(smddp_alltoallv(comm, send, sc, sd, recv, rc, rd, SMDDP_INT32, NULL, NULL));
        for (int i = 0; i < size; i++)
            for (int64_t k = 0; k < rc[i]; k++)
                H_CHECK(recv[rd[i] + k] == i * 1000000 + rank * 10000 + (int32_t)(k % 10000),
                        "alltoallv scale %lld: element %lld from rank %d", (long long)scales[s],
                        (long long)k, i);
        free(send);
        free(recv);
    }
}

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

static void test_alltoallv_2(void **state) { (void)state; run(2, alltoallv_rank, NULL); }
static void test_alltoallv_3(void **state) { (void)state; run(3, alltoallv_rank, NULL); }
static void test_alltoallv_4(void **state) { (void)state; run(4, alltoallv_rank, "SMDDP_SHM_BUFFER_SIZE=65536 SMDDP_STREAM_MIN=1"); }

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

/* ---- split, many outstanding requests, threads ---------------------------- */

static void split_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    smddp_comm_t sub = NULL;
    /* Evens and odds, reversed order within each; the last rank joins none. */
    int color = rank == size - 1 && size > 2 ? SMDDP_SPLIT_NOCOLOR : rank % 2;
    H_OK(smddp_comm_split(comm, color, -rank, &sub));
    if (color == SMDDP_SPLIT_NOCOLOR) {
        H_CHECK(sub == NULL, "NOCOLOR must give NULL");
    } else {
        int srank, ssize, expect = 0;
        for (int r = 0; r < size; r++)
            if ((r % 2) == color && !(r == size - 1 && size > 2)) expect++;
        H_OK(smddp_comm_rank(sub, &srank));
        H_OK(smddp_comm_size(sub, &ssize));
        H_CHECK(ssize == expect, "sub size %d, expected %d", ssize, expect);
        int64_t v = rank, sum = -1;
        H_OK(smddp_allreduce(sub, &v, &sum, 1, SMDDP_INT64, SMDDP_SUM, NULL, NULL));
        int64_t want = 0;
        for (int r = 0; r < size; r++)
            if ((r % 2) == color && !(r == size - 1 && size > 2)) want += r;
        H_CHECK(sum == want, "sub allreduce gave %lld, expected %lld", (long long)sum, (long long)want);
        /* Highest parent rank gets sub rank 0 (keys are -rank). */
        int higher = 0;
        for (int r = rank + 1; r < size; r++)
            if ((r % 2) == color && !(r == size - 1 && size > 2)) higher++;
        H_CHECK(srank == higher, "sub rank %d, expected %d", srank, higher);
        H_OK(smddp_comm_destroy(sub));
    }
    /* The parent still works after the split. */
    int64_t one = 1, total = 0;
    H_OK(smddp_allreduce(comm, &one, &total, 1, SMDDP_INT64, SMDDP_SUM, NULL, NULL));
    H_CHECK(total == size, "parent allreduce after split gave %lld", (long long)total);
}

static void test_split_3(void **state) { (void)state; run(3, split_rank, NULL); }
static void test_split_4(void **state) { (void)state; run(4, split_rank, NULL); }

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

/*
 * Completion callbacks: each runs once, after the result is in place and
 * before the request reports done; one of them issues the next collective,
 * which the main thread then waits for (the callback may run on the thread
 * that waits, so this must not deadlock).
 */
typedef struct cb_state {
    smddp_comm_t comm;
    float *buf;
    int64_t n;
    float want;
    atomic_int calls;
    atomic_int result_ok;
    smddp_request_t chained; /* issued by the callback, if it chains */
    float *chained_buf;
} cb_state_t;

static void on_done(void *arg, smddp_status_t st)
{
    cb_state_t *cs = arg;
    bool ok = st == SMDDP_OK;
    for (int64_t i = 0; ok && i < cs->n; i++) ok = cs->buf[i] == cs->want;
    atomic_store(&cs->result_ok, ok);
    if (cs->chained_buf)
        (void)smddp_allreduce(cs->comm, cs->chained_buf, cs->chained_buf, cs->n, SMDDP_FLOAT32,
                              SMDDP_SUM, NULL, &cs->chained);
    atomic_fetch_add(&cs->calls, 1);
}

#define NCB 8
static void callback_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    /* Sizes that take one-shot, two-shot and several two-shot rounds. */
    static const int64_t counts[NCB] = {1, 7, 1000, 70000, 1, 300000, 3, 1 << 20};
    static cb_state_t cs[NCB];
    float *bufs[NCB];
    float *chain = malloc(sizeof(float) * 1000);
    smddp_request_t reqs[NCB];
    for (int k = 0; k < NCB; k++) {
        bufs[k] = malloc(sizeof(float) * (size_t)counts[k]);
        for (int64_t i = 0; i < counts[k]; i++) bufs[k][i] = (float)(rank + k);
        cs[k] = (cb_state_t){.comm = comm, .buf = bufs[k], .n = counts[k]};
        cs[k].want = (float)(size * k + size * (size - 1) / 2);
        smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
        attr.on_complete = on_done;
        attr.on_complete_arg = &cs[k];
        if (k == 2) {
            for (int i = 0; i < 1000; i++) chain[i] = 1.0f;
            cs[k].chained_buf = chain;
        }
        H_OK(smddp_allreduce(comm, bufs[k], bufs[k], counts[k], SMDDP_FLOAT32, SMDDP_SUM, &attr,
                             &reqs[k]));
        if (k == 2) {
            /* Nothing else is issued until the chained op is: same order on every rank. */
            H_OK(smddp_wait(reqs[k], SMDDP_WAIT_DEFAULT));
            H_CHECK(cs[k].chained != NULL, "the callback did not issue its allreduce");
            H_OK(smddp_wait(cs[k].chained, SMDDP_WAIT_DEFAULT));
            for (int i = 0; i < 1000; i++)
                H_CHECK(chain[i] == (float)size, "chained element %d is %g", i, chain[i]);
            smddp_request_free(cs[k].chained);
        }
    }
    for (int k = NCB - 1; k >= 0; k--) {
        H_OK(smddp_wait(reqs[k], SMDDP_WAIT_DEFAULT));
        H_CHECK(atomic_load(&cs[k].calls) == 1, "op %d: callback ran %d times", k,
                atomic_load(&cs[k].calls));
        H_CHECK(atomic_load(&cs[k].result_ok), "op %d: result not in place in the callback", k);
        smddp_request_free(reqs[k]);
        free(bufs[k]);
    }
    /* A blocking call runs its callback too, before it returns. */
    float one = 1.0f;
    cb_state_t blocking = {.comm = comm, .buf = &one, .n = 1, .want = (float)size};
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.on_complete = on_done;
    attr.on_complete_arg = &blocking;
    H_OK(smddp_allreduce(comm, &one, &one, 1, SMDDP_FLOAT32, SMDDP_SUM, &attr, NULL));
    H_CHECK(atomic_load(&blocking.calls) == 1 && atomic_load(&blocking.result_ok),
            "blocking call: callback ran %d times", atomic_load(&blocking.calls));
    free(chain);
}

static void test_callbacks_2(void **state) { (void)state; run(2, callback_rank, NULL); }
static void test_callbacks_3(void **state) { (void)state; run(3, callback_rank, NULL); }

/*
 * Communicators that span nodes: fake hosts on this machine (SMDDP_HOSTNAME
 * per rank), joined through libfabric over loopback. The same checks as on
 * one node: every dtype x op, in place and out of place, bit-identical results.
 */
static void run_nodes_env_arg(int nranks, int per_node, harness_fn_t fn, void *arg,
                              const char *env)
{
    harness_opts_t opts = {.timeout_s = 600, .ranks_per_node = per_node, .env = env};
    int shm_before = harness_shm_count();
    assert_int_equal(harness_run(nranks, fn, arg, &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
}

static void run_nodes_env(int nranks, int per_node, harness_fn_t fn, const char *env)
{
    run_nodes_env_arg(nranks, per_node, fn, NULL, env);
}

static void run_nodes(int nranks, int per_node, harness_fn_t fn)
{
    harness_opts_t opts = {.timeout_s = 600, .ranks_per_node = per_node};
    int shm_before = harness_shm_count();
    assert_int_equal(harness_run(nranks, fn, NULL, &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
}

/*
 * send/recv across nodes: a ring exchange at several sizes (requests, so
 * every rank sends and receives at once), then messages that do not match
 * the receive (another tag, more or fewer bytes) fail that receive with a
 * message saying what arrived, and the stream stays usable.
 */
static void p2p_across_nodes_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    const int64_t counts[] = {0, 1, 4097, 1 << 20};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        int64_t n = counts[k];
        int32_t *out = malloc((size_t)n * 4 + 4), *in = malloc((size_t)n * 4 + 4);
        for (int64_t i = 0; i < n; i++) {
            out[i] = (int32_t)(rank * 1000003 + i);
            in[i] = -1;
        }
        smddp_request_t rs, rr;
        H_OK(smddp_recv(comm, in, n, SMDDP_INT32, prev, (int)k, NULL, &rr));
        H_OK(smddp_send(comm, out, n, SMDDP_INT32, next, (int)k, NULL, &rs));
        H_OK(smddp_wait(rr, SMDDP_WAIT_DEFAULT));
        H_OK(smddp_wait(rs, SMDDP_WAIT_DEFAULT));
        smddp_request_free(rr);
        smddp_request_free(rs);
        for (int64_t i = 0; i < n; i++)
            H_CHECK(in[i] == (int32_t)(prev * 1000003 + i), "n=%lld: element %lld is %d",
                    (long long)n, (long long)i, in[i]);
        free(out);
        free(in);
    }
    /* A burst of small messages, more than SMDDP_OFI_MAX_INFLIGHT in one variant. */
    enum { BURST = 64 };
    int32_t bout[BURST], bin[BURST];
    smddp_request_t breq[2 * BURST];
    for (int i = 0; i < BURST; i++) {
        bout[i] = rank * 100 + i;
        bin[i] = -1;
        H_OK(smddp_recv(comm, &bin[i], 1, SMDDP_INT32, prev, i, NULL, &breq[i]));
    }
    for (int i = 0; i < BURST; i++)
        H_OK(smddp_send(comm, &bout[i], 1, SMDDP_INT32, next, i, NULL, &breq[BURST + i]));
    for (int i = 0; i < 2 * BURST; i++) {
        H_OK(smddp_wait(breq[i], SMDDP_WAIT_DEFAULT));
        smddp_request_free(breq[i]);
    }
    for (int i = 0; i < BURST; i++)
        H_CHECK(bin[i] == prev * 100 + i, "burst message %d is %d", i, bin[i]);
    /*
     * Rank 0 sends rank 1 messages its receives do not expect. Another tag or
     * fewer bytes fail that receive only; more bytes than the buffer holds
     * fail it too and, across nodes, abort the communicator (libfabric cannot
     * match that peer's later messages), so that one comes last.
     */
    int32_t v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    if (rank == 0) {
        H_OK(smddp_send(comm, v, 1, SMDDP_INT32, 1, 5, NULL, NULL));
        H_OK(smddp_send(comm, v, 2, SMDDP_INT32, 1, 7, NULL, NULL));
        H_OK(smddp_send(comm, v, 3, SMDDP_INT32, 1, 7, NULL, NULL));
        H_OK(smddp_send(comm, v, 8, SMDDP_INT32, 1, 7, NULL, NULL));
    } else if (rank == 1) {
        int32_t got[8] = {0};
        const char *msg;
        H_CHECK(smddp_recv(comm, got, 1, SMDDP_INT32, 0, 6, NULL, NULL) == SMDDP_ERR_MISMATCH,
                "a message with another tag was accepted");
        msg = smddp_get_last_error(NULL);
        H_CHECK(strstr(msg, "has tag 5") != NULL, "message: %s", msg);
        H_CHECK(smddp_recv(comm, got, 4, SMDDP_INT32, 0, 7, NULL, NULL) == SMDDP_ERR_MISMATCH,
                "a smaller message was accepted");
        msg = smddp_get_last_error(NULL);
        H_CHECK(strstr(msg, "8 bytes") != NULL, "message: %s", msg);
        H_OK(smddp_recv(comm, got, 3, SMDDP_INT32, 0, 7, NULL, NULL));
        H_CHECK(got[0] == 1 && got[2] == 3, "got %d %d", got[0], got[2]);
        H_CHECK(smddp_recv(comm, got, 4, SMDDP_INT32, 0, 7, NULL, NULL) == SMDDP_ERR_MISMATCH,
                "a larger message was accepted");
        /* Over the network the message is cut off at the buffer; in a node it is drained. */
        msg = smddp_get_last_error(NULL);
        H_CHECK(strstr(msg, "larger than the 16 bytes") || strstr(msg, "32 bytes"), "message: %s",
                msg);
    }
}

/*
 * bf16 sums rounded once, whatever the path: values k/64 in [1, 2.5] add up
 * exactly in fp32, so the one right answer is that sum rounded to bf16.
 * Rounding after every hop of a ring gets many elements wrong.
 */
static float half_value(int rank, int i) { return 1.0f + (float)((i * 7 + rank * 13) % 97) / 64.0f; }

static void half_accuracy_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    enum { N = 4096 };
    static uint16_t in[N], out[N];
    for (int i = 0; i < N; i++) in[i] = smddp__fp32_to_bf16(half_value(rank, i));
    H_OK(smddp_allreduce(comm, in, out, N, SMDDP_BFLOAT16, SMDDP_SUM, NULL, NULL));
    int wrong = 0;
    for (int i = 0; i < N; i++) {
        float sum = 0;
        for (int r = 0; r < size; r++) sum += smddp__bf16_to_fp32(smddp__fp32_to_bf16(half_value(r, i)));
        wrong += out[i] != smddp__fp32_to_bf16(sum);
    }
    H_CHECK(wrong == 0, "%d of %d bf16 sums are not the fp32 sum rounded once", wrong, N);
}

static void test_half_accuracy_1_node(void **state) { (void)state; run(4, half_accuracy_rank, NULL); }
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
        smddp__ofi_mr_stats(comm, &hits, &misses, &registering);
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
static void test_nodes_split_2x2(void **state) { (void)state; run_nodes(4, 2, split_rank); }
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

/* Senders on this node and on others, small and rendezvous-sized. */
static void test_nodes_any_source(void **state)
{
    (void)state;
    run_nodes(4, 2, any_source_rank);
    run_nodes_env(3, 1, any_source_rank, "SMDDP_OFI_MR=always");
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

static void test_nodes_p2p(void **state)
{
    (void)state;
    run_nodes(2, 1, p2p_across_nodes_rank);
    run_nodes(4, 2, p2p_across_nodes_rank); /* mixed: ring neighbours on both nodes */
    run_nodes_env(2, 1, p2p_across_nodes_rank, "SMDDP_OFI_MAX_INFLIGHT=3");
}

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
        cmocka_unit_test(test_reduce_small_buffers),
        cmocka_unit_test(test_movement_2),
        cmocka_unit_test(test_movement_3),
        cmocka_unit_test(test_movement_4),
        cmocka_unit_test(test_movement_small_buffers),
        cmocka_unit_test(test_alltoallv_2),
        cmocka_unit_test(test_wait_runs_no_later_op),
        cmocka_unit_test(test_alltoallv_3),
        cmocka_unit_test(test_alltoallv_4),
        cmocka_unit_test(test_p2p_2),
        cmocka_unit_test(test_p2p_3),
        cmocka_unit_test(test_p2p_any_source_3),
        cmocka_unit_test(test_p2p_any_source_timeout),
        cmocka_unit_test(test_split_3),
        cmocka_unit_test(test_split_4),
        cmocka_unit_test(test_outstanding_3),
        cmocka_unit_test(test_callbacks_2),
        cmocka_unit_test(test_callbacks_3),
        cmocka_unit_test(test_half_accuracy_1_node),
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
        cmocka_unit_test(test_nodes_split_2x2),
        cmocka_unit_test(test_nodes_callbacks_2x1),
        cmocka_unit_test(test_nodes_p2p),
        cmocka_unit_test(test_nodes_p2p_stuck_peer),
        cmocka_unit_test(test_nodes_p2p_abort_spreads),
        cmocka_unit_test(test_nodes_p2p_failed_recv_untouched),
        cmocka_unit_test(test_nodes_app_abort_reaches_other_nodes),
        cmocka_unit_test(test_nodes_p2p_abort_reaches_any_source),
        cmocka_unit_test(test_nodes_lone_rank_killed),
        cmocka_unit_test(test_nodes_lone_rank_killed_p2p),
        cmocka_unit_test(test_nodes_clean_leave_not_death),
        cmocka_unit_test(test_nodes_any_source),
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
