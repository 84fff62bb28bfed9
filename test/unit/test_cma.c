/*
 * Allgather by cross-memory attach (core/transport/shm_cma.c): ranks read
 * each other's inputs with process_vm_readv inside the size range, out of
 * place, in place, with one rank's input in a pool and with one rank's input
 * inside its output at another rank's slot (that rank is staged, over many
 * staging rounds with small halves); the flight recorder names the op
 * "cross-memory attach" exactly when every input was read where it lies.
 * A staged op, an empty one and a direct one in a row, many times: a staged
 * rank runs ahead into the next op of the same parity. Then what the ranks
 * agree on at creation: one rank told SMDDP_SHM_CMA=off turns it off for
 * all, ranks with different size ranges use the range they share, and
 * ranks that outnumber their CPUs stay staged unless every one is told "on".
 * Every result is checked.
 *
 * Each rank lets any process of its user read it (PR_SET_PTRACER), as under
 * Yama's ptrace_scope 1 sibling processes otherwise could not. Where the
 * kernel refuses all the same (seccomp, ptrace_scope 2 or 3), which main()
 * finds out with two sibling processes of its own, every test expects all
 * ranks to agree to stage, and checks that.
 */
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
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

/* Whether two sibling processes can read each other here (main() finds out). */
static bool siblings_read;

static void let_peers_read(void)
{
#ifdef PR_SET_PTRACER
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); /* EINVAL without Yama: nothing to do */
#endif
}

/* Two children of this process: the second reads a word of the first's. */
static bool probe_siblings(void)
{
    volatile uint64_t *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return false;
    shared[0] = shared[1] = shared[2] = 0;
    pid_t owner = fork();
    if (owner == 0) {
        static volatile uint64_t word = 0x5eed5eed5eed5eedULL;
        let_peers_read();
        shared[1] = (uint64_t)(uintptr_t)&word;
        shared[0] = 1;
        while (!shared[2]) usleep(1000);
        _exit(0);
    }
    pid_t reader = fork();
    if (reader == 0) {
        while (!shared[0]) usleep(1000);
        uint64_t got = 0;
        struct iovec local = {&got, sizeof(got)};
        struct iovec remote = {(void *)(uintptr_t)shared[1], sizeof(got)};
        ssize_t n = process_vm_readv(owner, &local, 1, &remote, 1, 0);
        shared[2] = 1;
        _exit(n == (ssize_t)sizeof(got) && got == 0x5eed5eed5eed5eedULL ? 0 : 1);
    }
    int st_reader = 1, st_owner = 1;
    waitpid(reader, &st_reader, 0);
    shared[2] = 1;
    waitpid(owner, &st_owner, 0);
    munmap((void *)shared, 4096);
    return WIFEXITED(st_reader) && WEXITSTATUS(st_reader) == 0;
}

/*
 * Sets what arg says ("NAME=value ...", NULL: nothing) in this rank when it
 * is rank `who` (-1: every rank), pins it to one CPU if asked, lets peers
 * read it, and makes the communicator.
 */
static smddp_comm_t make_comm(int rank, int size, const char *env, int who, bool pin)
{
    if (who < 0 || who == rank) harness_apply_env(env);
    if (pin) {
        cpu_set_t set;
        H_CHECK(sched_getaffinity(0, sizeof(set), &set) == 0, "sched_getaffinity");
        int first = 0;
        while (!CPU_ISSET(first, &set)) first++;
        CPU_ZERO(&set);
        CPU_SET(first, &set);
        H_CHECK(sched_setaffinity(0, sizeof(set), &set) == 0, "sched_setaffinity");
    }
    let_peers_read();
    smddp_comm_t comm = NULL;
    H_OK(harness_try_comm(rank, size, "cma", -1, &comm));
    return comm;
}

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
    /* 1 KiB and 4 KiB per rank are below the default range; 20 KB, 400 KB and 9.6 MB in it. */
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

/*
 * A case: the settings (in every rank, or only in rank `who`), pinning,
 * and the byte range in which allgathers must be named "cross-memory
 * attach" (lo > hi: none), with how many of gather_all's that makes.
 */
typedef struct cma_case {
    const char *env;
    int who;
    bool pin;
    size_t lo, hi;
    int in_range;
} cma_case_t;

static void case_rank(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    const cma_case_t *c = arg;
    smddp_comm_t comm = make_comm(rank, size, c->env, c->who, c->pin);
    bool on = siblings_read && c->lo <= c->hi;
    int want = gather_all(comm, rank, size, c->lo, on ? c->hi : 0);
    H_CHECK(!on || want == c->in_range, "%d allgathers in the range, expected %d", want,
            c->in_range);
    int named = harness_trace_count(comm, "\"cross-memory attach\"");
    H_CHECK(named == want, "with %s (rank %d's): the flight recorder names %d allgathers "
            "\"cross-memory attach\", expected %d", c->env ? c->env : "the defaults", c->who,
            named, want);
    H_OK(smddp_comm_destroy(comm));
}

static void run_case(int nranks, const char *env, int who, bool pin, size_t lo, size_t hi,
                     int in_range)
{
    cma_case_t c = {env, who, pin, lo, hi, in_range};
    harness_opts_t opts = {.env = "SMDDP_TIMEOUT=60", .timeout_s = 120, .no_comm = 1};
    int shm_before = harness_shm_count();
    assert_int_equal(harness_run(nranks, case_rank, &c, &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
}

/* The default range, 8 KiB to 16 MiB per rank: 20 KB, 400 KB and 9.6 MB in 3 layouts. */
#define DEFAULT_RANGE 8192, 16 << 20, 9

static void test_two_ranks(void **state)
{
    (void)state;
    run_case(2, NULL, -1, false, DEFAULT_RANGE);
}

/* Three ranks outnumber two CPUs: "on" on every rank all the same. */
static void test_three_ranks_on(void **state)
{
    (void)state;
    run_case(3, "SMDDP_SHM_CMA=on", -1, false, DEFAULT_RANGE);
}

/* Small staging halves: rank 1's staged input takes many rounds beside direct reads. */
static void test_rounds(void **state)
{
    (void)state;
    run_case(3, "SMDDP_SHM_CMA=on SMDDP_SHM_BUFFER_SIZE=16384", -1, false, DEFAULT_RANGE);
}

static void test_off(void **state)
{
    (void)state;
    run_case(2, "SMDDP_SHM_CMA=off", -1, false, 1, 0, 0);
}

/* Two ranks pinned to one CPU: staged under auto, and when only one is told "on". */
static void test_oversubscribed(void **state)
{
    (void)state;
    run_case(2, NULL, -1, true, 1, 0, 0);
    run_case(2, "SMDDP_SHM_CMA=on", 0, true, 1, 0, 0);
    run_case(2, "SMDDP_SHM_CMA=on", -1, true, DEFAULT_RANGE);
}

/* Rank 1 alone is told something; the others keep the defaults. */
static void test_one_rank_differs(void **state)
{
    (void)state;
    run_case(2, "SMDDP_SHM_CMA=off", 1, false, 1, 0, 0);
    /* The range they share: 64 KiB-16 MiB (400 KB, 9.6 MB), then 8 KiB-1 MiB (20 KB, 400 KB). */
    run_case(2, "SMDDP_SHM_CMA_MIN=65536", 1, false, 65536, 16 << 20, 6);
    run_case(2, "SMDDP_SHM_CMA_MAX=1M", 1, false, 8192, 1 << 20, 6);
}

/*
 * Rank 1's input at rank 0's slot (staged), an empty allgather, then every
 * input read directly, many times over: rank 1 leaves the staged op without
 * waiting, and its next record of the same parity may be written while a
 * peer still looks for the staged op's.
 */
static void race_rank(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused, (void)arg;
    smddp_comm_t comm = make_comm(rank, size, "SMDDP_SHM_CMA=on", -1, false);
    size_t n = 5000, all = n * (size_t)size;
    float *in = malloc(n * sizeof(float)), *out = malloc(all * sizeof(float));
    H_CHECK(in && out, "out of memory");
    for (int round = 0; round < 300; round++) {
        float *src = rank == 1 ? out : in;
        for (size_t i = 0; i < n; i++) src[i] = value(rank, i);
        H_OK(smddp_allgather(comm, src, out, (int64_t)n, SMDDP_FLOAT32, NULL, NULL));
        check_gather(out, n, size, "the staged allgather");
        H_OK(smddp_allgather(comm, in, out, 0, SMDDP_FLOAT32, NULL, NULL));
        for (size_t i = 0; i < n; i++) in[i] = value(rank, i);
        H_OK(smddp_allgather(comm, in, out, (int64_t)n, SMDDP_FLOAT32, NULL, NULL));
        check_gather(out, n, size, "the direct allgather");
    }
    int named = harness_trace_count(comm, "\"cross-memory attach\"");
    H_CHECK(named == (siblings_read ? 300 : 0), "%d direct allgathers named", named);
    free(in);
    free(out);
    H_OK(smddp_comm_destroy(comm));
}

static void test_staged_runs_ahead(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = "SMDDP_TIMEOUT=60", .timeout_s = 120, .no_comm = 1};
    assert_int_equal(harness_run(3, race_rank, NULL, &opts), 0);
}

int main(void)
{
    siblings_read = probe_siblings();
    if (!siblings_read)
        print_message("process_vm_readv between sibling processes is refused here: every test "
                      "expects the ranks to agree to stage\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks),        cmocka_unit_test(test_three_ranks_on),
        cmocka_unit_test(test_rounds),           cmocka_unit_test(test_off),
        cmocka_unit_test(test_oversubscribed),   cmocka_unit_test(test_one_rank_differs),
        cmocka_unit_test(test_staged_runs_ahead),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
