/*
 * Pools (smddp_mem_alloc): allocation, errors, lifetime, the share of /dev/shm
 * they leave to others (SMDDP_SHM_POOL_RESERVE_PCT), freed memory given back
 * (SMDDP_SHM_POOL_RELEASE_MS), and ranks that
 * disagree on the pool's size (no pools, creation goes on); and allreduce,
 * reduce to a root,
 * reduce-scatter and allgather on 2, 3 and 4 ranks with every buffer in a
 * pool (the in-place path, which the flight recorder must name), with only
 * some ranks' buffers in pools (peers read those where they lie, the rest
 * is staged), and with none, in place and out of place, from one element to
 * many staging rounds.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "coll_ranks.h"
#include "param.h"

/* ---- allocation ------------------------------------------------------------ */

static void alloc_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)rank, (void)size, (void)arg;
    void *a, *b, *c, *d;
    /* 1 MiB pool (SMDDP_SHM_POOL_SIZE below). */
    H_OK(smddp_mem_alloc(comm, 100, &a));
    H_OK(smddp_mem_alloc(comm, 300000, &b));
    H_OK(smddp_mem_alloc(comm, 4096, &c));
    H_CHECK(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 4096 == 0, "not 4 KiB aligned");
    H_CHECK((char *)b >= (char *)a + 4096 && (char *)c >= (char *)b + 300000, "ranges overlap");
    memset(a, 1, 100);
    memset(b, 2, 300000);
    memset(c, 3, 4096);
    H_CHECK(smddp_mem_alloc(comm, 800000, &d) == SMDDP_ERR_NO_MEMORY, "an oversize range was given");
    H_CHECK(strstr(smddp_get_last_error(NULL), "no free range"), "message: %s",
            smddp_get_last_error(NULL));
    /* Freed ranges merge: b and its neighbours make room for 700 KB. */
    H_OK(smddp_mem_free(b));
    H_OK(smddp_mem_free(a));
    H_OK(smddp_mem_alloc(comm, 300000, &b));
    H_CHECK(((char *)b)[0] == 1 || ((char *)b)[0] == 2, "reuse does not keep the memory");
    H_OK(smddp_mem_free(c));
    H_OK(smddp_mem_free(b));
    H_OK(smddp_mem_alloc(comm, 1 << 20, &d));
    H_OK(smddp_mem_free(d));
    H_CHECK(smddp_mem_free(d) == SMDDP_ERR_INVALID_ARGUMENT, "a double free passed");
    H_CHECK(strstr(smddp_get_last_error(NULL), "not an allocation"), "message: %s",
            smddp_get_last_error(NULL));
    int local = 0;
    H_CHECK(smddp_mem_free(&local) == SMDDP_ERR_INVALID_ARGUMENT, "a foreign pointer passed");
    H_OK(smddp_mem_free(NULL));
    H_CHECK(smddp_mem_alloc(comm, 0, &d) == SMDDP_ERR_INVALID_ARGUMENT, "0 bytes passed");
    H_CHECK(smddp_mem_alloc(comm, 10, NULL) == SMDDP_ERR_INVALID_ARGUMENT, "NULL out passed");

    /* An allocation outlives its communicator. */
    H_OK(smddp_mem_alloc(comm, 65536, &a));
    memset(a, 7, 65536);
    H_OK(smddp_comm_destroy(comm));
    for (int i = 0; i < 65536; i += 4096) H_CHECK(((char *)a)[i] == 7, "memory changed");
    memset(a, 8, 65536);
    H_OK(smddp_mem_free(a));
    _exit(0); /* the harness would destroy comm again */
}

static void test_alloc(void **state)
{
    (void)state;
    run(2, alloc_rank, "SMDDP_SHM_POOL_SIZE=1M");
}

/* After an abort, peers of a failed op may still write a pooled buffer: freed ranges are not reused. */
static void abandon_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)rank, (void)size, (void)arg;
    void *a, *b;
    H_OK(smddp_mem_alloc(comm, 8192, &a));
    H_OK(smddp_mem_free(a));
    H_OK(smddp_mem_alloc(comm, 8192, &b));
    H_CHECK(a == b, "a freed range was not reused before the abort");
    H_OK(smddp_comm_abort(comm));
    H_OK(smddp_mem_free(b));
    H_OK(smddp_mem_alloc(comm, 8192, &a));
    H_CHECK(a != b, "a range freed after the abort was handed out again");
    H_OK(smddp_mem_free(a));
}

static void test_abandon(void **state)
{
    (void)state;
    run(2, abandon_rank, NULL);
}

/*
 * SMDDP_SHM_POOL_RESERVE_PCT=100: backing any of the pool would leave less
 * than all of /dev/shm free, so every allocation is refused, saying why; the
 * communicator works on, staged.
 */
static void reserve_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size, (void)arg;
    void *p;
    H_CHECK(smddp_mem_alloc(comm, 4096, &p) == SMDDP_ERR_NO_MEMORY, "allocated into the reserve");
    H_CHECK(strstr(smddp_get_last_error(NULL), "SMDDP_SHM_POOL_RESERVE_PCT=100%"), "message: %s",
            smddp_get_last_error(NULL));
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)(rank + i);
    H_OK(smddp_allreduce(comm, x, x, 1000, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    for (int i = 0; i < 1000; i++) H_CHECK(x[i] == (float)(1 + 2 * i), "element %d is %g", i, x[i]);
}

static void test_reserve(void **state)
{
    (void)state;
    run(2, reserve_rank, "SMDDP_SHM_POOL_RESERVE_PCT=100");
    /* 0: only a full /dev/shm refuses (alloc_rank allocates and frees). */
    run(2, alloc_rank, "SMDDP_SHM_POOL_SIZE=1M SMDDP_SHM_POOL_RESERVE_PCT=0");
}

/* Bytes of this rank's pool backed in /dev/shm: its file is the one open here of `size` bytes. */
static size_t pool_backed(size_t size)
{
    DIR *d = opendir("/proc/self/fd");
    size_t backed = SIZE_MAX;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char path[300], link[256];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof(link) - 1);
        struct stat sb;
        if (n <= 9 || strncmp(link, "/dev/shm/", 9) != 0 || fstat(atoi(e->d_name), &sb) != 0)
            continue;
        if ((size_t)sb.st_size == size) backed = (size_t)sb.st_blocks * 512;
    }
    if (d) closedir(d);
    return backed;
}

/*
 * Freed pool memory goes back to /dev/shm: at once (arg "now",
 * SMDDP_SHM_POOL_RELEASE_MS=0), or (arg "idle") not before a collective
 * runs after it was idle SMDDP_SHM_POOL_RELEASE_MS. Reallocated, it is
 * backed again (reads zeros).
 */
static void release_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    bool now = !strcmp((const char *)arg, "now");
    const size_t pool = 64u << 20, mib4 = 4u << 20;
    void *a;
    H_CHECK(pool_backed(pool) < mib4, "the pool is backed before any allocation: %zu",
            pool_backed(pool));
    H_OK(smddp_mem_alloc(comm, mib4, &a));
    memset(a, 1, mib4);
    H_CHECK(pool_backed(pool) >= mib4 && pool_backed(pool) != SIZE_MAX, "not backed: %zu",
            pool_backed(pool));
    H_OK(smddp_mem_free(a));
    float x[16];
    for (int i = 0; i < 16; i++) x[i] = (float)rank;
    if (!now) {
        /* Kept for reuse until idle long enough and a collective comes. */
        H_CHECK(pool_backed(pool) >= mib4, "given back before idle: %zu", pool_backed(pool));
        H_OK(smddp_allreduce(comm, x, x, 16, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
        H_CHECK(pool_backed(pool) >= mib4, "given back before idle: %zu", pool_backed(pool));
        usleep(400 * 1000);
        H_OK(smddp_allreduce(comm, x, x, 16, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    }
    H_CHECK(pool_backed(pool) < mib4, "not given back: %zu bytes backed", pool_backed(pool));
    H_OK(smddp_mem_alloc(comm, mib4, &a));
    H_CHECK(pool_backed(pool) >= mib4, "not backed again: %zu", pool_backed(pool));
    for (size_t i = 0; i < mib4; i += 4096) H_CHECK(((char *)a)[i] == 0, "byte %zu kept", i);
    memset(a, 2, mib4);
    H_OK(smddp_mem_free(a));
    if (!now) return;
    /* Whatever is allocated is backed at once, across holes split and merged. */
    void *b, *c, *d;
    const size_t mib = 1u << 20;
    H_OK(smddp_mem_alloc(comm, 4 * mib, &a));
    H_OK(smddp_mem_alloc(comm, 4 * mib, &b));
    H_OK(smddp_mem_free(a));
    H_OK(smddp_mem_alloc(comm, 2 * mib, &c)); /* in a's hole */
    H_CHECK(pool_backed(pool) >= 6 * mib, "%zu backed for 6 MiB allocated", pool_backed(pool));
    H_OK(smddp_mem_alloc(comm, 3 * mib, &d)); /* after b */
    H_CHECK(pool_backed(pool) >= 9 * mib, "%zu backed for 9 MiB allocated", pool_backed(pool));
    H_OK(smddp_mem_free(b));
    H_OK(smddp_mem_alloc(comm, 5 * mib, &a)); /* over b's hole and the rest of a's */
    H_CHECK(pool_backed(pool) >= 10 * mib, "%zu backed for 10 MiB allocated", pool_backed(pool));
    memset(a, 3, 5 * mib);
    memset(c, 3, 2 * mib);
    memset(d, 3, 3 * mib);
    H_CHECK(pool_backed(pool) <= 11 * mib, "%zu backed for 10 MiB allocated", pool_backed(pool));
    H_OK(smddp_mem_free(a));
    H_OK(smddp_mem_free(c));
    H_OK(smddp_mem_free(d));
    H_CHECK(pool_backed(pool) < mib, "not given back: %zu", pool_backed(pool));
}

static void test_release(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = "SMDDP_SHM_POOL_SIZE=64M SMDDP_SHM_POOL_RELEASE_MS=0",
                           .timeout_s = 120};
    assert_int_equal(harness_run(2, release_rank, "now", &opts), 0);
    opts.env = "SMDDP_SHM_POOL_SIZE=64M SMDDP_SHM_POOL_RELEASE_MS=200";
    assert_int_equal(harness_run(2, release_rank, "idle", &opts), 0);
}

/* arg: what the allocation's error must say. */
static void off_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)rank, (void)size;
    void *p;
    H_CHECK(smddp_mem_alloc(comm, 64, &p) == SMDDP_ERR_NOT_SUPPORTED, "allocated without a pool");
    H_CHECK(strstr(smddp_get_last_error(NULL), (const char *)arg), "message: %s",
            smddp_get_last_error(NULL));
}

static void test_off(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = "SMDDP_SHM_POOL_SIZE=0", .timeout_s = 60};
    assert_int_equal(harness_run(2, off_rank, "SMDDP_SHM_POOL_SIZE=0", &opts), 0);
    /* A pool larger than the address space: no rank has one, and the communicator works. */
    opts.env = "SMDDP_SHM_POOL_SIZE=300000G";
    assert_int_equal(harness_run(2, off_rank, "SMDDP_SHM_POOL_SIZE sets its size", &opts), 0);
}

/*
 * Ranks disagree on SMDDP_SHM_POOL_SIZE (arg: rank 1's): creation goes on
 * without pools on every rank, whose allocations then say why, and the
 * collectives work.
 */
static void size_mismatch_rank(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    const char *theirs = arg;
    if (rank == 1) {
        setenv("SMDDP_SHM_POOL_SIZE", theirs, 1);
        smddp__params_reload();
    }
    smddp_comm_t comm = NULL;
    H_OK(harness_try_comm(rank, size, "poolsize", -1, &comm));
    void *p;
    H_CHECK(smddp_mem_alloc(comm, 64, &p) == SMDDP_ERR_NOT_SUPPORTED, "allocated from a pool");
    const char *msg = smddp_get_last_error(NULL);
    const char *want = rank == 1 && !strcmp(theirs, "0") ? "SMDDP_SHM_POOL_SIZE=0"
                       : !strcmp(theirs, "0")            ? "local rank 1 has no pool"
                                                         : "the same SMDDP_SHM_POOL_SIZE";
    H_CHECK(strstr(msg, want), "message \"%s\" lacks \"%s\"", msg, want);
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)(rank + i);
    H_OK(smddp_allreduce(comm, x, x, 1000, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    for (int i = 0; i < 1000; i++) H_CHECK(x[i] == (float)(1 + 2 * i), "element %d is %g", i, x[i]);
    H_OK(smddp_comm_destroy(comm));
}

static void test_size_mismatch(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = "SMDDP_TIMEOUT=20", .timeout_s = 30, .no_comm = 1};
    int shm_before = harness_shm_count();
    assert_int_equal(harness_run(2, size_mismatch_rank, "64M", &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
    /* One rank without a pool. */
    assert_int_equal(harness_run(2, size_mismatch_rank, "0", &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
}

/* ---- collectives ----------------------------------------------------------- */

enum { ALL_POOLED, SOME_POOLED, NONE_POOLED };

static float value(int rank, size_t i) { return (float)((rank + 1) * (int)(i % 13)); }

static void *get(smddp_comm_t comm, bool pooled, size_t bytes)
{
    void *p = NULL;
    if (pooled) H_OK(smddp_mem_alloc(comm, bytes, &p));
    else H_CHECK((p = malloc(bytes)) != NULL, "malloc");
    return p;
}

static void put(bool pooled, void *p)
{
    if (pooled) H_OK(smddp_mem_free(p));
    else free(p);
}

static bool trace_says(smddp_comm_t comm, const char *what)
{
    return harness_trace_count(comm, what) > 0;
}

static void coll_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    int mode = *(int *)arg;
    bool pooled = mode == ALL_POOLED || (mode == SOME_POOLED && rank % 2 == 0);
    const size_t counts[] = {1, 5, 1000, 10000, 20000, 40000, 700001};
    float sum_of_ranks = (float)(size * (size + 1) / 2);
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t n = counts[c], all = n * (size_t)size;
        float *in = get(comm, pooled, all * sizeof(float));
        float *out = get(comm, pooled, all * sizeof(float));
        for (int inplace = 0; inplace < 2; inplace++) {
            /* allreduce */
            for (size_t i = 0; i < n; i++) in[i] = value(rank, i);
            H_OK(smddp_allreduce(comm, in, inplace ? in : out, (int64_t)n, SMDDP_FLOAT32,
                                 SMDDP_SUM, NULL, NULL));
            const float *r = inplace ? in : out;
            for (size_t i = 0; i < n; i++)
                H_CHECK(r[i] == sum_of_ranks * (float)(i % 13), "allreduce of %zu, in place %d: "
                        "element %zu is %g, expected %g", n, inplace, i, (double)r[i],
                        (double)(sum_of_ranks * (float)(i % 13)));

            /* reduce-scatter: block q of rank r's input holds value(r, q * n + i) */
            for (size_t i = 0; i < all; i++) in[i] = value(rank, i);
            float *rs_out = inplace ? in + (size_t)rank * n : out;
            H_OK(smddp_reduce_scatter(comm, in, rs_out, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM,
                                      NULL, NULL));
            for (size_t i = 0; i < n; i++) {
                float want = sum_of_ranks * (float)(((size_t)rank * n + i) % 13);
                H_CHECK(rs_out[i] == want, "reduce_scatter of %zu, in place %d: element %zu is "
                        "%g, expected %g", n, inplace, i, (double)rs_out[i], (double)want);
            }

            /* reduce to a root: allreduce's two-shot without the final copy on non-roots */
            int root = (int)(c % (size_t)size);
            for (size_t i = 0; i < n; i++) in[i] = value(rank, i);
            H_OK(smddp_reduce(comm, in, rank == root ? (inplace ? in : out) : NULL, (int64_t)n,
                              SMDDP_FLOAT32, SMDDP_SUM, root, NULL, NULL));
            for (size_t i = 0; i < n && rank == root; i++)
                H_CHECK(r[i] == sum_of_ranks * (float)(i % 13), "reduce of %zu to %d, in place "
                        "%d: element %zu is %g", n, root, inplace, i, (double)r[i]);

            /* allgather */
            float *ag_in = inplace ? out + (size_t)rank * n : in;
            for (size_t i = 0; i < n; i++) ag_in[i] = value(rank, i);
            H_OK(smddp_allgather(comm, ag_in, out, (int64_t)n, SMDDP_FLOAT32, NULL, NULL));
            for (int q = 0; q < size; q++)
                for (size_t i = 0; i < n; i++)
                    H_CHECK(out[(size_t)q * n + i] == value(q, i), "allgather of %zu, in place "
                            "%d: rank %d's element %zu is %g, expected %g", n, inplace, q, i,
                            (double)out[(size_t)q * n + i], (double)value(q, i));
        }
        /* An input inside the output at another rank's slot is staged, not read in place. */
        float *elsewhere = out + (size_t)((rank + 1) % size) * n;
        for (size_t i = 0; i < n; i++) elsewhere[i] = value(rank, i);
        H_OK(smddp_allgather(comm, elsewhere, out, (int64_t)n, SMDDP_FLOAT32, NULL, NULL));
        for (int q = 0; q < size; q++)
            for (size_t i = 0; i < n; i++)
                H_CHECK(out[(size_t)q * n + i] == value(q, i), "allgather of %zu from another "
                        "slot: rank %d's element %zu is %g", n, q, i, (double)out[(size_t)q * n + i]);
        put(pooled, in);
        put(pooled, out);
    }
    bool in_pools = trace_says(comm, "\"in pools\"");
    H_CHECK(in_pools == (mode == ALL_POOLED), "the flight recorder %s \"in pools\" with mode %d",
            in_pools ? "names" : "does not name", mode);
    /*
     * Out of place, small allreduces are one-shot unless two-shot is forced
     * (10000 elements are one-shot-sized for up to 4 ranks, and above the
     * low-latency slots).
     */
    bool oneshot = trace_says(comm, "\"one-shot in pools\"");
    bool twoshot_only = getenv("SMDDP_ALLREDUCE_ALGO") != NULL;
    H_CHECK(oneshot == (mode == ALL_POOLED && !twoshot_only), "the flight recorder %s \"one-shot "
            "in pools\" with mode %d", oneshot ? "names" : "does not name", mode);
}

/*
 * Small allreduces in place, repeated: the first of a size finds every
 * buffer in a pool (one-shot staged, or through the low-latency slots up to
 * SMDDP_SHM_LL_MAX), the next ones run two-shot in the pools; when one
 * rank's buffer is not pooled (rank 1, third round), all go back together.
 * Up to 1 KiB the low-latency slots serve every round. Results checked
 * every time.
 */
static void repeat_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    const size_t counts[] = {1, 5, 300, 1000, 4096};
    float sum_of_ranks = (float)(size * (size + 1) / 2);
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t n = counts[c];
        float *pooled = get(comm, true, n * sizeof(float)), *plain = malloc(n * sizeof(float));
        H_CHECK(plain != NULL, "out of memory");
        for (int round = 0; round < 4; round++) {
            float *x = round == 2 && rank == 1 ? plain : pooled;
            for (size_t i = 0; i < n; i++) x[i] = (float)(rank + 1) * (float)(i % 7 + 1);
            H_OK(smddp_allreduce(comm, x, x, n, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
            for (size_t i = 0; i < n; i++)
                H_CHECK(x[i] == sum_of_ranks * (float)(i % 7 + 1), "count %zu round %d element %zu: %g",
                        n, round, i, x[i]);
        }
        H_OK(smddp_mem_free(pooled));
        free(plain);
    }
    /*
     * 4 and 20 bytes: low-latency in every round. 1200, 4000 and 16384
     * bytes: round 0 low-latency (the last staged), round 1 in the pools,
     * round 2 (rank 1 not pooled) two-shot staged, round 3 as round 0.
     */
    int in_pools = harness_trace_count(comm, "\"in pools\"");
    H_CHECK(in_pools == 3, "%d allreduces ran in pools, not 3", in_pools);
    int ll = harness_trace_count(comm, "\"low-latency\"");
    H_CHECK(ll == 12, "%d allreduces ran low-latency, not 12", ll);
}

static void test_pooled_repeat(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = "SMDDP_SHM_LL_MAX=8192", .timeout_s = 120};
    assert_int_equal(harness_run(2, repeat_rank, NULL, &opts), 0);
    assert_int_equal(harness_run(3, repeat_rank, NULL, &opts), 0);
}

static void run_mode(int nranks, int mode, const char *env)
{
    harness_opts_t opts = {.env = env, .timeout_s = 300};
    int shm_before = harness_shm_count();
    assert_int_equal(harness_run(nranks, coll_rank, &mode, &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
}

static void test_all_pooled_2(void **state) { (void)state; run_mode(2, ALL_POOLED, NULL); }
static void test_all_pooled_3(void **state) { (void)state; run_mode(3, ALL_POOLED, NULL); }
static void test_all_pooled_4(void **state) { (void)state; run_mode(4, ALL_POOLED, NULL); }
static void test_some_pooled_2(void **state) { (void)state; run_mode(2, SOME_POOLED, NULL); }
static void test_some_pooled_3(void **state) { (void)state; run_mode(3, SOME_POOLED, NULL); }
static void test_none_pooled_2(void **state) { (void)state; run_mode(2, NONE_POOLED, NULL); }

/* Small staging halves: many rounds with some ranks read in place. */
static void test_some_pooled_rounds(void **state)
{
    (void)state;
    run_mode(4, SOME_POOLED, "SMDDP_SHM_BUFFER_SIZE=8192 SMDDP_STREAM_MIN=1");
}

static void test_all_pooled_stream(void **state)
{
    (void)state;
    run_mode(3, ALL_POOLED, "SMDDP_STREAM_MIN=1 SMDDP_ALLREDUCE_ALGO=twoshot");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc),
        cmocka_unit_test(test_off),
        cmocka_unit_test(test_abandon),
        cmocka_unit_test(test_reserve),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_pooled_repeat),
        cmocka_unit_test(test_size_mismatch),
        cmocka_unit_test(test_all_pooled_2),
        cmocka_unit_test(test_all_pooled_3),
        cmocka_unit_test(test_all_pooled_4),
        cmocka_unit_test(test_some_pooled_2),
        cmocka_unit_test(test_some_pooled_3),
        cmocka_unit_test(test_none_pooled_2),
        cmocka_unit_test(test_some_pooled_rounds),
        cmocka_unit_test(test_all_pooled_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
