/*
 * Allgather by cross-memory attach (core/transport/shm_cma.c): ranks read
 * each other's inputs with process_vm_readv inside the size range, out of
 * place, in place, with one rank's input in a pool (copied from there) and
 * with one rank's input inside its output at another rank's slot (that rank
 * is staged, its peers still read the others directly, over many staging
 * rounds); the flight recorder names the op "cross-memory attach" exactly
 * when every input was read where it lies. Then what the ranks agree on at
 * creation: one rank told SMDDP_SHM_CMA=off turns it off for all, ranks with
 * different size ranges use the range they share, and ranks that outnumber
 * their CPUs stay staged unless every one is told "on". Every result checked.
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
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "param.h"

static float value(int rank, size_t i) { return (float)(rank * 1000 + (int)(i % 997)); }

static void check_gather(const float *out, size_t n, int size, const char *what)
{
    for (int q = 0; q < size; q++)
        for (size_t i = 0; i < n; i++)
            H_CHECK(out[(size_t)q * n + i] == value(q, i),
                    "%s of %zu floats: rank %d's element %zu is %g, expected %g", what, n, q, i,
                    (double)out[(size_t)q * n + i], (double)value(q, i));
}

/* The layouts, in order; the first three have every input read where it lies. */
enum { OUT_OF_PLACE, IN_PLACE, POOLED, OTHER_SLOT, LAYOUTS };

/*
 * One allgather per layout per count; returns how many had every input
 * in place and in [lo, hi] bytes per rank, which is when the op must be
 * named "cross-memory attach".
 */
static int gather_all(smddp_comm_t comm, int rank, int size, size_t lo, size_t hi)
{
    /* 1 KiB and 4 KiB are below the default range, 400 KB and 9.6 MB in it. */
    const size_t counts[] = {256, 1024, 5000, 100000, 2400000};
    int direct = 0;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t n = counts[c], all = n * (size_t)size, bytes = n * sizeof(float);
        float *in = malloc(bytes), *out = malloc(all * sizeof(float)), *pin = NULL;
        H_CHECK(in && out, "out of memory");
        H_OK(smddp_mem_alloc(comm, bytes, (void **)&pin));
        for (int layout = 0; layout < LAYOUTS; layout++) {
            memset(out, 0xff, all * sizeof(float));
            /* Rank 0's input in a pool, the others' in plain memory; rank 1's at rank 0's slot. */
            float *src = layout == IN_PLACE                  ? out + (size_t)rank * n
                         : layout == POOLED && rank == 0     ? pin
                         : layout == OTHER_SLOT && rank == 1 ? out
                                                             : in;
            for (size_t i = 0; i < n; i++) src[i] = value(rank, i);
            H_OK(smddp_allgather(comm, src, out, (int64_t)n, SMDDP_FLOAT32, NULL, NULL));
            char what[64];
            snprintf(what, sizeof(what), "allgather in layout %d", layout);
            check_gather(out, n, size, what);
            direct += layout != OTHER_SLOT && bytes >= lo && bytes <= hi;
        }
        H_OK(smddp_mem_free(pin));
        free(in);
        free(out);
    }
    return direct;
}

/* arg: 1 when cross-memory attach must serve the default range, 0 when it must be off. */
static void layouts_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    bool on = *(int *)arg;
    int want = gather_all(comm, rank, size, 8192, 16 << 20);
    int named = harness_trace_count(comm, "\"cross-memory attach\"");
    H_CHECK(named == (on ? want : 0), "the flight recorder names %d allgathers \"cross-memory "
            "attach\", expected %d", named, on ? want : 0);
    H_CHECK(want == 9, "%d allgathers in the range", want);
}

static void run_layouts(int nranks, const char *env, int on)
{
    harness_opts_t opts = {.env = env, .timeout_s = 120};
    int shm_before = harness_shm_count();
    assert_int_equal(harness_run(nranks, layouts_rank, &on, &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
}

static void test_two_ranks(void **state)
{
    (void)state;
    run_layouts(2, NULL, 1);
}

/* Three ranks outnumber two CPUs: "on" on every rank all the same. */
static void test_three_ranks_on(void **state)
{
    (void)state;
    run_layouts(3, "SMDDP_SHM_CMA=on", 1);
}

/* Small staging halves: rank 1's staged input takes many rounds beside direct reads. */
static void test_rounds(void **state)
{
    (void)state;
    run_layouts(3, "SMDDP_SHM_CMA=on SMDDP_SHM_BUFFER_SIZE=16384", 1);
}

static void test_off(void **state)
{
    (void)state;
    run_layouts(2, "SMDDP_SHM_CMA=off", 0);
}

/*
 * Two ranks pinned to one CPU, under auto: staged; told "on", both read
 * directly all the same (arg: the setting, or NULL).
 */
static void pinned_rank(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    cpu_set_t set;
    H_CHECK(sched_getaffinity(0, sizeof(set), &set) == 0, "sched_getaffinity");
    int first = 0;
    while (!CPU_ISSET(first, &set)) first++;
    CPU_ZERO(&set);
    CPU_SET(first, &set);
    H_CHECK(sched_setaffinity(0, sizeof(set), &set) == 0, "sched_setaffinity");
    if (arg) {
        setenv("SMDDP_SHM_CMA", arg, 1);
        smddp__params_reload();
    }
    smddp_comm_t comm = NULL;
    H_OK(harness_try_comm(rank, size, "pinned", -1, &comm));
    int want = gather_all(comm, rank, size, 8192, arg ? 16 << 20 : 0);
    int named = harness_trace_count(comm, "\"cross-memory attach\"");
    H_CHECK(named == want, "two ranks on one CPU, SMDDP_SHM_CMA=%s: the flight recorder names "
            "%d allgathers \"cross-memory attach\", expected %d", arg ? (char *)arg : "auto",
            named, want);
    H_OK(smddp_comm_destroy(comm));
}

static void test_oversubscribed(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = "SMDDP_TIMEOUT=60", .timeout_s = 120, .no_comm = 1};
    assert_int_equal(harness_run(2, pinned_rank, NULL, &opts), 0);
    assert_int_equal(harness_run(2, pinned_rank, "on", &opts), 0);
}

/*
 * Rank 1 alone is told something (arg: "NAME=value") before the
 * communicator exists; the others keep the defaults. With SMDDP_SHM_CMA=off
 * nobody reads by cross-memory attach; with SMDDP_SHM_CMA_MIN=65536 every
 * rank stages the 20 KB allgathers (the range they share starts at 64 KiB).
 */
static void one_rank_rank(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    char setting[64];
    snprintf(setting, sizeof(setting), "%s", (const char *)arg);
    char *eq = strchr(setting, '=');
    *eq = '\0';
    if (rank == 1) {
        setenv(setting, eq + 1, 1);
        smddp__params_reload();
    }
    smddp_comm_t comm = NULL;
    H_OK(harness_try_comm(rank, size, "cma", -1, &comm));
    bool off = !strcmp(setting, "SMDDP_SHM_CMA");
    int want = gather_all(comm, rank, size, 65536, off ? 0 : 16 << 20);
    int named = harness_trace_count(comm, "\"cross-memory attach\"");
    H_CHECK(named == want, "rank 1 told %s: the flight recorder names %d allgathers \"cross-"
            "memory attach\", expected %d", (const char *)arg, named, want);
    H_CHECK(off || want == 6, "%d allgathers in the range", want);
    H_OK(smddp_comm_destroy(comm));
}

static void test_one_rank_differs(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = "SMDDP_TIMEOUT=60", .timeout_s = 120, .no_comm = 1};
    assert_int_equal(harness_run(2, one_rank_rank, "SMDDP_SHM_CMA=off", &opts), 0);
    assert_int_equal(harness_run(2, one_rank_rank, "SMDDP_SHM_CMA_MIN=65536", &opts), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks),       cmocka_unit_test(test_three_ranks_on),
        cmocka_unit_test(test_rounds),          cmocka_unit_test(test_off),
        cmocka_unit_test(test_oversubscribed),  cmocka_unit_test(test_one_rank_differs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
