/*
 * See coll_ranks.h. The collectives run on 1 to 6 forked ranks, in place and
 * out of place, over sizes 0, 1, 7, 4097 and one that takes several pipeline
 * rounds, each result checked against a reference computed here from the
 * inputs every rank can regenerate. Inputs are small integers (halves for
 * floats) so that the exact result does not depend on the order of
 * additions; that the order is also fixed is checked by comparing result
 * bytes across ranks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "coll_ranks.h"
#include "reduce/half.h"
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

void allreduce_rank(smddp_comm_t comm, int rank, int size, void *arg)
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

void run(int nranks, harness_fn_t fn, const char *env)
{
    harness_opts_t opts = {.env = env, .timeout_s = 300};
    int shm_before = harness_shm_count();
    assert_int_equal(harness_run(nranks, fn, NULL, &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
}

/* ---- reduce, reduce_scatter ---------------------------------------------- */

void reduce_rank(smddp_comm_t comm, int rank, int size, void *arg)
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

/* ---- data movement -------------------------------------------------------- */

/* Byte j of rank r's block b: a pattern that tells all three apart. */
static uint8_t pattern(int r, int b, int64_t j) { return (uint8_t)(r * 31 + b * 7 + j * 13 + 1); }

void movement_rank(smddp_comm_t comm, int rank, int size, void *arg)
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

/* ---- alltoallv with uneven splits ------------------------------------------ */

/* Elements rank i sends to rank j. Zeros included on purpose. */
static int64_t split(int i, int j, int64_t scale) { return ((i * 3 + j * 5) % 4) * scale + (i == j ? 1 : 0); }

void alltoallv_rank(smddp_comm_t comm, int rank, int size, void *arg)
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

/* ---- completion callbacks ------------------------------------------------- */

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
void callback_rank(smddp_comm_t comm, int rank, int size, void *arg)
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

/*
 * Communicators that span nodes: fake hosts on this machine (SMDDP_HOSTNAME
 * per rank), joined through libfabric over loopback. The same checks as on
 * one node: every dtype x op, in place and out of place, bit-identical results.
 */
void run_nodes_env_arg(int nranks, int per_node, harness_fn_t fn, void *arg,
                              const char *env)
{
    harness_opts_t opts = {.timeout_s = 600, .ranks_per_node = per_node, .env = env};
    int shm_before = harness_shm_count();
    assert_int_equal(harness_run(nranks, fn, arg, &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
}

void run_nodes_env(int nranks, int per_node, harness_fn_t fn, const char *env)
{
    run_nodes_env_arg(nranks, per_node, fn, NULL, env);
}

void run_nodes(int nranks, int per_node, harness_fn_t fn)
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
void p2p_across_nodes_rank(smddp_comm_t comm, int rank, int size, void *arg)
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
     * Rank 0 sends rank 1 messages that match by tag, not by order, and some
     * its receives do not expect. Fewer bytes fail that receive only; more
     * bytes than the buffer holds fail it too and, across nodes, abort the
     * communicator (libfabric cannot match that peer's later messages), so
     * that one comes last.
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
        H_CHECK(smddp_recv(comm, got, 4, SMDDP_INT32, 0, 7, NULL, NULL) == SMDDP_ERR_MISMATCH,
                "a smaller message was accepted");
        msg = smddp_get_last_error(NULL);
        H_CHECK(strstr(msg, "8 bytes") && strstr(msg, "tag 7"), "message: %s", msg);
        H_OK(smddp_recv(comm, got, 3, SMDDP_INT32, 0, 7, NULL, NULL));
        H_CHECK(got[0] == 1 && got[2] == 3, "got %d %d", got[0], got[2]);
        got[0] = 0;
        H_OK(smddp_recv(comm, got, 1, SMDDP_INT32, 0, 5, NULL, NULL)); /* sent first */
        H_CHECK(got[0] == 1, "the message with tag 5 carried %d", got[0]);
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

void half_accuracy_rank(smddp_comm_t comm, int rank, int size, void *arg)
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
