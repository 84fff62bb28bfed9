/*
 * The low-latency slots (core/transport/shm_ll.c): allreduce up to
 * SMDDP_SHM_LL_MAX bytes, allgather below cross-memory attach's range,
 * broadcast up to 1 KiB and barrier in one exchange each.
 *  - Sizes around the limits, dtypes and layouts: every result checked,
 *    and the flight recorder names exactly the ops within the limit
 *    "low-latency".
 *  - What the ranks agree on at creation: one rank's smaller
 *    SMDDP_SHM_LL_MAX (0: off) holds for all; a larger one than the slots
 *    hold is cut to them; ranks whose SMDDP_ALLREDUCE_ALGO or
 *    SMDDP_ALLREDUCE_ONESHOT_MAX differ are refused.
 *  - Slot reuse: thousands of random ops in one random order on every
 *    rank, low-latency and staged mixed, with ranks delayed at random
 *    (each rank differently) so that they drift apart and back.
 *  - A peer that arrives late while the others sleep in the futex: its
 *    post wakes them (a missed wake-up would cost the 50 ms sleep slice).
 */
#include <sched.h>
#include <setjmp.h>
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

#include "harness.h"
#include "reduce/half.h"

#define SLOTS_MAX 16384 /* SHM_LL_PAYLOAD_MAX */

/* Sets "NAME=value ..." in this rank when it is rank `who` (-1: all), then makes the comm. */
static smddp_comm_t make_comm(int rank, int size, const char *env, int who, const char *prefix)
{
    if (who < 0 || who == rank) harness_apply_env(env);
    smddp_comm_t comm = NULL;
    H_OK(harness_try_comm(rank, size, prefix, -1, &comm));
    return comm;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Small integers, exact in every dtype below. */
static int value(int rank, size_t i) { return (rank + 1) * (int)(i % 5 + 1); }

static void fill(void *buf, smddp_dtype_t dt, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++) {
        int v = value(rank, i);
        switch (dt) {
        case SMDDP_FLOAT32: ((float *)buf)[i] = (float)v; break;
        case SMDDP_FLOAT64: ((double *)buf)[i] = (double)v; break;
        case SMDDP_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
        case SMDDP_BFLOAT16: ((uint16_t *)buf)[i] = smddp__fp32_to_bf16((float)v); break;
        default: H_CHECK(0, "dtype %d not used here", (int)dt);
        }
    }
}

static double get(const void *buf, smddp_dtype_t dt, size_t i)
{
    switch (dt) {
    case SMDDP_FLOAT32: return ((const float *)buf)[i];
    case SMDDP_FLOAT64: return ((const double *)buf)[i];
    case SMDDP_INT8: return ((const int8_t *)buf)[i];
    case SMDDP_BFLOAT16: return smddp__bf16_to_fp32(((const uint16_t *)buf)[i]);
    default: return 0;
    }
}

/* One allreduce (sum or max, in place or not) of n elements, checked; returns its bytes. */
static size_t check_allreduce(smddp_comm_t comm, int rank, int size, smddp_dtype_t dt, size_t n,
                              smddp_op_t op, bool in_place)
{
    size_t bytes = n * smddp_dtype_size(dt);
    char *in = malloc(bytes), *out = malloc(bytes);
    H_CHECK(in && out, "out of memory");
    fill(in, dt, n, rank);
    memset(out, 0x5a, bytes);
    char *res = in_place ? in : out;
    H_OK(smddp_allreduce(comm, in, res, (int64_t)n, dt, op, NULL, NULL));
    for (size_t i = 0; i < n; i++) {
        double want = 0;
        for (int q = 0; q < size; q++) {
            double v = value(q, i);
            want = q == 0 ? v : op == SMDDP_SUM ? want + v : want > v ? want : v;
        }
        H_CHECK(get(res, dt, i) == want, "allreduce of %zu (dtype %d, op %d, in place %d): "
                "element %zu is %g, expected %g", n, (int)dt, (int)op, in_place, i,
                get(res, dt, i), want);
    }
    free(in);
    free(out);
    return bytes;
}

/* Allgather of n floats, out of place, in place, or with the input at the next rank's slot. */
enum { OUT_OF_PLACE, IN_PLACE, OTHER_SLOT, LAYOUTS };
static void check_allgather(smddp_comm_t comm, int rank, int size, size_t n, int layout)
{
    size_t all = n * (size_t)size;
    float *in = malloc(n * sizeof(float) + 1), *out = malloc(all * sizeof(float) + 1);
    H_CHECK(in && out, "out of memory");
    memset(out, 0xff, all * sizeof(float));
    float *src = layout == IN_PLACE     ? out + (size_t)rank * n
                 : layout == OTHER_SLOT ? out + (size_t)((rank + 1) % size) * n
                                        : in;
    for (size_t i = 0; i < n; i++) src[i] = (float)value(rank, i);
    H_OK(smddp_allgather(comm, src, out, (int64_t)n, SMDDP_FLOAT32, NULL, NULL));
    for (int q = 0; q < size; q++)
        for (size_t i = 0; i < n; i++)
            H_CHECK(out[(size_t)q * n + i] == (float)value(q, i),
                    "allgather of %zu in layout %d: rank %d's element %zu is %g", n, layout, q, i,
                    (double)out[(size_t)q * n + i]);
    free(in);
    free(out);
}

/* ---- sizes, dtypes, layouts and the recorder ---------------------------------------- */

typedef struct limits_case {
    const char *env;
    int who;
    size_t limit; /* the agreed SMDDP_SHM_LL_MAX (0: off) */
} limits_case_t;

/*
 * Allreduces just within and just over the limit (and the slots' size),
 * in every dtype, then allgathers and a barrier; the recorder (fresh for
 * each group, which stays under its 64 entries) names the ones within.
 */
static void limits_rank(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    const limits_case_t *c = arg;
    smddp_comm_t comm = make_comm(rank, size, c->env, c->who, "ll-allreduce");
    const smddp_dtype_t dts[] = {SMDDP_FLOAT32, SMDDP_FLOAT64, SMDDP_BFLOAT16, SMDDP_INT8};
    const size_t sizes[] = {1, 16, 17, 1000, 1024, 1032, 8192, 8200, SLOTS_MAX, SLOTS_MAX + 8};
    int want = 0;
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        size_t es = smddp_dtype_size(dts[d]);
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            size_t n = (sizes[s] + es - 1) / es;
            bool in_place = s % 2;
            size_t bytes = check_allreduce(comm, rank, size, dts[d], n,
                                           d % 2 ? SMDDP_MAX : SMDDP_SUM, in_place);
            want += bytes <= c->limit;
        }
    }
    int named = harness_trace_count(comm, "\"low-latency\"");
    H_CHECK(named == want, "%d allreduces named \"low-latency\" with limit %zu, expected %d", named,
            c->limit, want);
    H_OK(smddp_comm_destroy(comm));

    /* Allgathers of 4 B to 4 KiB per rank (below cross-memory attach's range), then a barrier. */
    comm = make_comm(rank, size, NULL, -1, "ll-allgather");
    const size_t counts[] = {1, 4, 5, 250, 1024};
    want = 0;
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
        for (int layout = 0; layout < LAYOUTS; layout++) {
            check_allgather(comm, rank, size, counts[k], layout);
            want += counts[k] * sizeof(float) <= c->limit;
        }
    H_OK(smddp_barrier(comm, NULL, NULL));
    want += c->limit > 0;
    /* Broadcasts from the last rank, low-latency up to 1 KiB within the limit. */
    const size_t bcast[] = {1, 200, 256, 257, 2048};
    for (size_t k = 0; k < sizeof(bcast) / sizeof(bcast[0]); k++) {
        size_t n = bcast[k];
        float *x = malloc(n * sizeof(float));
        H_CHECK(x != NULL, "out of memory");
        for (size_t i = 0; i < n; i++) x[i] = rank == size - 1 ? (float)value(size, i) : -1.0f;
        H_OK(smddp_broadcast(comm, x, (int64_t)n, SMDDP_FLOAT32, size - 1, NULL, NULL));
        for (size_t i = 0; i < n; i++)
            H_CHECK(x[i] == (float)value(size, i), "broadcast of %zu: element %zu is %g", n, i,
                    (double)x[i]);
        free(x);
        want += n * sizeof(float) <= (c->limit < 1024 ? c->limit : 1024);
    }
    named = harness_trace_count(comm, "\"low-latency\"");
    H_CHECK(named == want, "%d allgathers, barriers and broadcasts named \"low-latency\" with "
            "limit %zu, expected %d", named, c->limit, want);
    H_OK(smddp_comm_destroy(comm));
}

static void run_limits(int nranks, const char *env, int who, size_t limit)
{
    limits_case_t c = {env, who, limit};
    harness_opts_t opts = {.env = "SMDDP_TIMEOUT=60", .timeout_s = 120, .no_comm = 1};
    assert_int_equal(harness_run(nranks, limits_rank, &c, &opts), 0);
}

static void test_limits(void **state)
{
    (void)state;
    run_limits(2, NULL, -1, 8192); /* the default */
    run_limits(3, NULL, -1, 8192);
    run_limits(4, NULL, -1, 8192);
}

static void test_agreement(void **state)
{
    (void)state;
    run_limits(2, "SMDDP_SHM_LL_MAX=0", 1, 0);         /* one rank off: off for all */
    run_limits(3, "SMDDP_SHM_LL_MAX=1024", 2, 1024);   /* the smallest holds */
    run_limits(2, "SMDDP_SHM_LL_MAX=1M", -1, SLOTS_MAX); /* cut to the slots */
}

/*
 * Ranks that pick allreduce algorithms differently are refused at creation,
 * every one of them, naming the setting and the rank that differs.
 */
static void algo_rank(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    smddp_comm_t comm = NULL;
    if (rank == 1) harness_apply_env(arg);
    smddp_status_t st = harness_try_comm(rank, size, "ll-algo", -1, &comm);
    H_CHECK(st == SMDDP_ERR_MISMATCH, "creation returned %s, expected a mismatch",
            smddp_status_string(st));
    const char *msg = smddp_get_last_error(NULL);
    char name[64];
    snprintf(name, sizeof(name), "%.*s must be the same on every rank",
             (int)(strchr(arg, '=') - (const char *)arg), (const char *)arg);
    H_CHECK(strstr(msg, name) && strstr(msg, "(ranks that differ from rank 0: 1)"),
            "the message was: %s", msg);
}

static void test_algo_disagreement(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = "SMDDP_TIMEOUT=30", .timeout_s = 60, .no_comm = 1};
    assert_int_equal(harness_run(2, algo_rank, "SMDDP_ALLREDUCE_ALGO=oneshot", &opts), 0);
    assert_int_equal(harness_run(3, algo_rank, "SMDDP_ALLREDUCE_ONESHOT_MAX=4096", &opts), 0);
}

/* ---- slot reuse under drift ------------------------------------------------------------ */

/* The same pseudo-random sequence on every rank from one seed; another for each rank's delays. */
static uint32_t next_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*s >> 33);
}

static void drift_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    uint64_t ops = 12345, delays = 777 + (uint64_t)rank * 1000003;
    float *a = malloc(65536 * sizeof(float)), *b = malloc(65536 * sizeof(float) * (size_t)size);
    H_CHECK(a && b, "out of memory");
    int ll = 0;
    for (int it = 0; it < 3000; it++) {
        /* A delay of 0-20 us most of the time, now and then a yield or 200 us. */
        uint32_t d = next_rand(&delays) % 100;
        if (d < 5) usleep(200);
        else if (d < 15) sched_yield();
        else for (volatile uint32_t spin = 0; spin < d * 40; spin++) {}
        uint32_t kind = next_rand(&ops) % 6;
        size_t n = 1 + next_rand(&ops) % 2048; /* up to 8 KiB of floats */
        switch (kind) {
        case 0: case 1: /* low-latency allreduce, in place */
            for (size_t i = 0; i < n; i++) a[i] = (float)(value(rank, i) + it % 3);
            H_OK(smddp_allreduce(comm, a, a, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
            for (size_t i = 0; i < n; i++) {
                float want = 0;
                for (int q = 0; q < size; q++) want += (float)(value(q, i) + it % 3);
                H_CHECK(a[i] == want, "op %d: allreduce of %zu: element %zu is %g, expected %g",
                        it, n, i, (double)a[i], (double)want);
            }
            ll++;
            break;
        case 2: /* low-latency allgather (up to 4 KiB per rank) */
            n = n / 2 + 1;
            for (size_t i = 0; i < n; i++) a[i] = (float)(value(rank, i) + it);
            H_OK(smddp_allgather(comm, a, b, (int64_t)n, SMDDP_FLOAT32, NULL, NULL));
            for (int q = 0; q < size; q++)
                for (size_t i = 0; i < n; i++)
                    H_CHECK(b[(size_t)q * n + i] == (float)(value(q, i) + it),
                            "op %d: allgather of %zu: rank %d's element %zu is %g", it, n, q, i,
                            (double)b[(size_t)q * n + i]);
            ll++;
            break;
        case 3:
            H_OK(smddp_barrier(comm, NULL, NULL));
            ll++;
            break;
        case 4: { /* a broadcast: low-latency up to 1 KiB; staged, the root does not wait */
            int root = (int)(next_rand(&ops) % (uint32_t)size);
            if (next_rand(&ops) % 2) n = n % 256 + 1;
            ll += n * sizeof(float) <= 1024;
            for (size_t i = 0; i < n; i++) a[i] = rank == root ? (float)(it + (int)i) : -1.0f;
            H_OK(smddp_broadcast(comm, a, (int64_t)n, SMDDP_FLOAT32, root, NULL, NULL));
            for (size_t i = 0; i < n; i++)
                H_CHECK(a[i] == (float)(it + (int)i), "op %d: broadcast of %zu from %d: element "
                        "%zu is %g", it, n, root, i, (double)a[i]);
            break;
        }
        default: /* a staged allreduce of 64 KiB, or an empty one */
            n = next_rand(&ops) % 4 ? 16384 : 0;
            for (size_t i = 0; i < n; i++) a[i] = (float)value(rank, i);
            H_OK(smddp_allreduce(comm, a, b, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
            for (size_t i = 0; i < n; i++) {
                float want = 0;
                for (int q = 0; q < size; q++) want += (float)value(q, i);
                H_CHECK(b[i] == want, "op %d: staged allreduce: element %zu is %g", it, i,
                        (double)b[i]);
            }
        }
    }
    int named = harness_trace_count(comm, "\"low-latency\"");
    H_CHECK(named == ll && ll > 1000, "%d ops named \"low-latency\", %d expected", named, ll);
    free(a);
    free(b);
}

static void test_drift(void **state)
{
    (void)state;
    /* The recorder keeps every op. */
    harness_opts_t opts = {.env = "SMDDP_TIMEOUT=60 SMDDP_TRACE_BUFFER=4096", .timeout_s = 300};
    assert_int_equal(harness_run(2, drift_rank, NULL, &opts), 0);
    assert_int_equal(harness_run(3, drift_rank, NULL, &opts), 0);
}

/* ---- a late peer wakes the sleepers -------------------------------------------------- */

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/*
 * Rank 1 comes 10 ms late to each allreduce, which carries the time it
 * arrived; rank 0, asleep by then, measures how long after that arrival its
 * own call returned.
 */
static void late_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    double after[7];
    for (int k = 0; k < 7; k++) {
        H_OK(smddp_barrier(comm, NULL, NULL));
        if (rank == 1) usleep(10 * 1000);
        double t = rank == 1 ? now_s() : 0.0;
        H_OK(smddp_allreduce(comm, &t, &t, 1, SMDDP_FLOAT64, SMDDP_SUM, NULL, NULL));
        after[k] = now_s() - t;
    }
    qsort(after, 7, sizeof(after[0]), cmp_double);
    /* Woken by the post: well under a millisecond; a missed wake-up sleeps out its 50 ms slice. */
    if (rank == 0)
        H_CHECK(after[3] < 0.010, "rank 0 returned a median %.2f ms after the late rank arrived",
                after[3] * 1e3);
    H_CHECK(harness_trace_count(comm, "\"low-latency\"") == 14, "not every op was low-latency");
}

static void test_late_peer_wakes(void **state)
{
    (void)state;
    /* No spinning or yielding: every wait goes to sleep at once. */
    harness_opts_t opts = {.env = "SMDDP_SPIN=0 SMDDP_YIELD=0", .timeout_s = 60};
    assert_int_equal(harness_run(2, late_rank, NULL, &opts), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_agreement),
        cmocka_unit_test(test_algo_disagreement),
        cmocka_unit_test(test_drift),
        cmocka_unit_test(test_late_peer_wakes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
