/*
 * The flight recorder (core/trace.c): what smddp_comm_dump_trace() writes,
 * the ring keeping the last SMDDP_TRACE_BUFFER operations, failed and
 * still-running operations, dumps taken while operations run, and the
 * recorder turned off.
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "coll_ranks.h"

/* The whole of a file, NUL-terminated (NULL if unreadable). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

static int count_of(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* The number after `key` in the n-th op (0-based) of a dump, or -1. */
static long long field_of_op(const char *s, int n, const char *key)
{
    const char *p = strstr(s, "\"ops\"");
    for (int i = 0; p && i <= n; i++) p = strstr(p + 1, "{\"id\"");
    if (!p) return -1;
    const char *end = strchr(p, '}');
    const char *k = strstr(p, key);
    if (!k || k > end) return -1;
    return strtoll(k + strlen(key), NULL, 10);
}

static void dump_path(char *out, size_t cap, const char *tag, int rank)
{
    snprintf(out, cap, "/tmp/smddp-test-trace-%ld-%s-r%d.json", (long)getppid(), tag, rank);
}

/*
 * 2 ranks, SMDDP_TRACE_BUFFER=64: 100 allreduces, a broadcast, a send/recv,
 * then a dump holds the last 64 ops in order with what they were; then a
 * collective that fails (counts differ) is recorded as failed.
 */
static void recorder_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    char path[256];
    dump_path(path, sizeof(path), "ring", rank);
    float x[3] = {0};
    for (int i = 0; i < 100; i++)
        H_OK(smddp_allreduce(comm, x, x, 3, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    H_OK(smddp_broadcast(comm, x, 2, SMDDP_FLOAT32, 1, NULL, NULL));
    int32_t msg = 7;
    if (rank == 0) H_OK(smddp_send(comm, &msg, 1, SMDDP_INT32, 1, 5, NULL, NULL));
    if (rank == 1) H_OK(smddp_recv(comm, &msg, 1, SMDDP_INT32, 0, 5, NULL, NULL));

    H_OK(smddp_comm_dump_trace(comm, path, NULL, 0));
    char *s = slurp(path);
    H_CHECK(s != NULL, "no dump at %s", path);
    H_CHECK(strstr(s, "\"format\": \"smddp-trace\"") && strstr(s, "\"capacity\": 64"),
            "header: %.200s", s);
    char want[64];
    snprintf(want, sizeof(want), "\"rank\": %d, \"size\": %d", rank, size);
    H_CHECK(strstr(s, want) != NULL, "no \"%s\" in the header", want);
    int ops = count_of(s, "{\"id\"");
    int total = 100 + 1 + 1; /* 2 ranks: each has a send or a recv */
    H_CHECK(ops == 64, "%d ops in the dump, expected the last 64 of %d", ops, total);
    /* Oldest first: ids run consecutively up to the number of ops recorded. */
    for (int i = 0; i < ops; i++)
        H_CHECK(field_of_op(s, i, "\"id\": ") == total - 64 + 1 + i, "op %d has id %lld", i,
                field_of_op(s, i, "\"id\": "));
    /* Collective sequence numbers follow each other: the last allreduces, the broadcast. */
    for (int i = 1; i < 63; i++)
        H_CHECK(field_of_op(s, i, "\"seq\": ") == field_of_op(s, i - 1, "\"seq\": ") + 1,
                "op %d has seq %lld after %lld", i, field_of_op(s, i, "\"seq\": "),
                field_of_op(s, i - 1, "\"seq\": "));
    H_CHECK(strstr(s, "\"kind\": \"allreduce\", \"count\": 3, \"dtype\": \"float32\", "
                      "\"op\": \"sum\", \"root\": -1, \"mem\": \"host\", \"path\": \"shm\", "
                      "\"algo\": \"low-latency\"") != NULL,
            "no allreduce entry as expected in %.400s", strstr(s, "\"ops\""));
    H_CHECK(strstr(s, "\"kind\": \"broadcast\", \"count\": 2, \"dtype\": \"float32\", "
                      "\"op\": \"\", \"root\": 1") != NULL,
            "no broadcast entry");
    H_CHECK(strstr(s, rank == 0 ? "\"kind\": \"send\"" : "\"kind\": \"recv\"") != NULL &&
                    strstr(s, "\"path\": \"p2p\"") != NULL,
                "no send/recv entry");
    H_CHECK(count_of(s, "\"state\": \"done\", \"status\": \"success\"") == 64,
            "not every op done and successful");
    /* Times are ordered within each op. */
    for (int i = 0; i < ops; i++) {
        long long is = field_of_op(s, i, "\"issued_ns\": "),
                  st = field_of_op(s, i, "\"started_ns\": "),
                  fi = field_of_op(s, i, "\"finished_ns\": ");
        H_CHECK(is > 0 && is <= st && st <= fi, "op %d: issued %lld started %lld finished %lld",
                i, is, st, fi);
    }
    free(s);
    remove(path);

    /* A collective that fails is recorded so (and the communicator says it failed). */
    H_CHECK(smddp_comm_status(comm) == SMDDP_OK, "a healthy communicator's status: %d",
            (int)smddp_comm_status(comm));
    float y[2] = {0};
    H_CHECK(smddp_allreduce(comm, y, y, 1 + rank % 2, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL) ==
                SMDDP_ERR_MISMATCH, "mismatched counts did not fail");
    smddp_status_t cs = smddp_comm_status(comm);
    H_CHECK(cs == SMDDP_ERR_MISMATCH || cs == SMDDP_ERR_ABORTED, "status after a mismatch: %s",
            smddp_status_string(cs));
    H_OK(smddp_comm_dump_trace(comm, path, NULL, 0));
    s = slurp(path);
    H_CHECK(s != NULL, "no dump after the failure");
    const char *last = strrchr(s, '{');
    H_CHECK(last && strstr(last, "\"state\": \"failed\", \"status\": \"operation mismatch across ranks\""),
            "last op: %s", last ? last : "(none)");
    free(s);
    remove(path);
}

static void test_recorder(void **state)
{
    (void)state;
    run(2, recorder_rank, "SMDDP_TRACE_BUFFER=64");
}

/*
 * A dump from another thread while ops run on the communicator: every dump
 * is a whole file whose ops are all done or running; and a queued op shows
 * as queued.
 */
typedef struct {
    smddp_comm_t comm;
    const char *path;
    atomic_int stop;
    atomic_int dumps;
    atomic_int bad;
} dumper_t;

static void *dumper(void *arg)
{
    dumper_t *d = arg;
    while (!atomic_load(&d->stop)) {
        if (smddp_comm_dump_trace(d->comm, d->path, NULL, 0) != SMDDP_OK) {
            atomic_fetch_add(&d->bad, 1);
            continue;
        }
        char *s = slurp(d->path);
        size_t n = s ? strlen(s) : 0;
        if (!s || n < 4 || strcmp(s + n - 3, "]}\n") != 0 || strstr(s, "\"state\": \"unknown\""))
            atomic_fetch_add(&d->bad, 1);
        free(s);
        atomic_fetch_add(&d->dumps, 1);
    }
    return NULL;
}

static void concurrent_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size, (void)arg;
    char path[256];
    dump_path(path, sizeof(path), "live", rank);
    dumper_t d = {.comm = comm, .path = path};
    pthread_t th;
    H_CHECK(pthread_create(&th, NULL, dumper, &d) == 0, "cannot start the dumping thread");
    float x[1024];
    /* 2000 ops, and on until both ranks saw a dump finish (a busy machine may start the thread late). */
    for (int i = 0;; i++) {
        int32_t more = i < 2000 || atomic_load(&d.dumps) == 0, any = more;
        if (i >= 2000) H_OK(smddp_allreduce(comm, &more, &any, 1, SMDDP_INT32, SMDDP_MAX, NULL, NULL));
        if (!any) break;
        H_CHECK(i < 2000000, "the dumping thread finished no dump during 2000000 allreduces");
        smddp_request_t r;
        H_OK(smddp_allreduce(comm, x, x, 1 + i % 1024, SMDDP_FLOAT32, SMDDP_MAX, NULL, &r));
        H_OK(smddp_wait(r, SMDDP_WAIT_DEFAULT));
        smddp_request_free(r);
    }
    atomic_store(&d.stop, 1);
    pthread_join(th, NULL);
    H_CHECK(atomic_load(&d.bad) == 0 && atomic_load(&d.dumps) > 0, "%d of %d dumps bad",
            atomic_load(&d.bad), atomic_load(&d.dumps));

    /*
     * Rank 0 issues a broadcast from rank 1 and dumps before rank 1 joins
     * (rank 1 waits for a message rank 0 sends after its dump): the op shows
     * as queued or running, not finished.
     */
    int32_t v = rank, go = 1;
    smddp_request_t r;
    if (rank == 0) {
        H_OK(smddp_broadcast(comm, &v, 1, SMDDP_INT32, 1, NULL, &r));
        H_OK(smddp_comm_dump_trace(comm, path, NULL, 0));
        char *s = slurp(path);
        const char *last = s ? strrchr(s, '{') : NULL;
        H_CHECK(last && strstr(last, "\"kind\": \"broadcast\"") &&
                    (strstr(last, "\"state\": \"queued\"") ||
                     strstr(last, "\"state\": \"running\"")),
                "an op waiting for its peer: %s", last ? last : "(no dump)");
        free(s);
        H_OK(smddp_send(comm, &go, 1, SMDDP_INT32, 1, 0, NULL, NULL));
        H_OK(smddp_wait(r, SMDDP_WAIT_DEFAULT));
        smddp_request_free(r);
    } else {
        H_OK(smddp_recv(comm, &go, 1, SMDDP_INT32, 0, 0, NULL, NULL));
        H_OK(smddp_broadcast(comm, &v, 1, SMDDP_INT32, 1, NULL, NULL));
    }
    H_CHECK(v == 1, "broadcast gave %d", v);
    remove(path);
}

static void test_dump_while_running(void **state)
{
    (void)state;
    run(2, concurrent_rank, NULL);
}

static void off_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)rank, (void)size, (void)arg;
    H_CHECK(smddp_comm_dump_trace(comm, "/tmp/smddp-test-trace-off.json", NULL, 0) ==
                SMDDP_ERR_INVALID_ARGUMENT, "a dump with the recorder off");
    H_CHECK(strstr(smddp_get_last_error(comm), "SMDDP_TRACE_BUFFER=0") != NULL, "message: %s",
            smddp_get_last_error(comm));
    H_CHECK(smddp_comm_dump_trace(comm, NULL, NULL, 0) == SMDDP_ERR_INVALID_ARGUMENT, "NULL path");
    H_CHECK(access("/tmp/smddp-test-trace-off.json", F_OK) != 0, "a file was written");
}

static void test_off(void **state)
{
    (void)state;
    run(2, off_rank, "SMDDP_TRACE_BUFFER=0");
}

static void bad_dir_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)rank, (void)size, (void)arg;
    H_CHECK(smddp_comm_dump_trace(comm, "/nonexistent-dir/t.json", NULL, 0) == SMDDP_ERR_SYSTEM,
            "a dump into a missing folder");
    H_CHECK(strstr(smddp_get_last_error(comm), "/nonexistent-dir/t.json") != NULL, "message: %s",
            smddp_get_last_error(comm));
}

static void test_bad_dir(void **state)
{
    (void)state;
    run(1, bad_dir_rank, NULL);
}

/*
 * SMDDP_TRACE_DIR: when a peer dies, each survivor writes its recorder to
 * the folder on its own, the op it was in last; the dead rank writes none.
 */
static void die_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)size;
    const char *dir = arg;
    float x[4] = {1, 1, 1, 1};
    H_OK(smddp_allreduce(comm, x, x, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    if (rank == 1) raise(SIGKILL);
    smddp_status_t st = smddp_allreduce(comm, x, x, 4, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL);
    H_CHECK(st == SMDDP_ERR_PEER_LOST || st == SMDDP_ERR_ABORTED, "allreduce with a dead peer: %s",
            smddp_status_string(st));
    smddp_status_t cs = smddp_comm_status(comm);
    H_CHECK(cs == SMDDP_ERR_PEER_LOST || cs == SMDDP_ERR_ABORTED, "status with a dead peer: %s",
            smddp_status_string(cs));
    char suffix[32], path[1024] = "";
    snprintf(suffix, sizeof(suffix), "-r%d.json", rank);
    DIR *d = opendir(dir);
    H_CHECK(d != NULL, "no folder %s", dir);
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name), m = strlen(suffix);
        if (n > m && strcmp(e->d_name + n - m, suffix) == 0 &&
            strncmp(e->d_name, "smddp-trace-", 12) == 0)
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    }
    closedir(d);
    H_CHECK(path[0], "rank %d wrote no smddp-trace-*%s in %s", rank, suffix, dir);
    char *s = slurp(path);
    const char *last = s ? strrchr(s, '{') : NULL;
    /* Queued: the abort reached this rank before it started the op (a slow rank). */
    H_CHECK(last && strstr(last, "\"kind\": \"allreduce\"") &&
                (strstr(last, "\"state\": \"running\"") || strstr(last, "\"state\": \"failed\"") ||
                 strstr(last, "\"state\": \"queued\"")),
            "last op in %s: %s", path, last ? last : "(none)");
    free(s);
}

static void test_dump_on_failure(void **state)
{
    (void)state;
    char dir[] = "/tmp/smddp-test-trace-fail-XXXXXX";
    assert_non_null(mkdtemp(dir));
    /* A folder that does not exist yet: the first dump makes it. */
    char env[256], sub[128];
    snprintf(sub, sizeof(sub), "%s/made/here", dir);
    snprintf(env, sizeof(env), "SMDDP_TRACE_DIR=%s", sub);
    harness_opts_t opts = {.env = env, .timeout_s = 120, .expect_signal = {0, SIGKILL, 0}};
    assert_int_equal(harness_run(3, die_rank, sub, &opts), 0);
    /* Two files, from ranks 0 and 2; none from the dead rank 1. */
    int files = 0, from_dead = 0;
    DIR *d = opendir(sub);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        files++;
        from_dead += strstr(e->d_name, "-r1.json") != NULL;
        char p[1024];
        snprintf(p, sizeof(p), "%s/%s", sub, e->d_name);
        remove(p);
    }
    closedir(d);
    rmdir(sub);
    snprintf(sub, sizeof(sub), "%s/made", dir);
    rmdir(sub);
    rmdir(dir);
    assert_int_equal(files, 2);
    assert_int_equal(from_dead, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recorder),
        cmocka_unit_test(test_dump_while_running),
        cmocka_unit_test(test_off),
        cmocka_unit_test(test_bad_dir),
        cmocka_unit_test(test_dump_on_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
