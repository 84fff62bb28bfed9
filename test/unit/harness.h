/*
 * Multi-process test harness: runs a function on N forked ranks that share a
 * communicator created through the built-in TCP store (served by the parent),
 * and reports how each rank ended. Inside a rank, use H_CHECK instead of
 * CMocka's asserts: a failed check prints where and why and exits the rank
 * with status 1, which the parent turns into a test failure.
 */
#ifndef SMDDP_TEST_HARNESS_H
#define SMDDP_TEST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>

#include "smddp/smddp.h"

typedef void (*harness_fn_t)(smddp_comm_t comm, int rank, int size, void *arg);

/* The most ranks harness_run starts. */
#define HARNESS_MAX_RANKS 128

typedef struct harness_opts {
    const char *env;        /* "NAME=value NAME=value" set in every rank before it starts */
    int timeout_s;          /* the parent kills every rank after this (default 120) */
    int no_comm;            /* 1: fn gets comm == NULL and creates its own */
    int expect_signal[16];  /* per rank: the signal it is expected to die of (0: none) */
    int store_port;         /* out: the parent's store port */
    int ranks_per_node;     /* > 0: fake nodes on this machine; rank r says it runs on host
                               "fake-node-<r / ranks_per_node>" (SMDDP_HOSTNAME), and the
                               nodes talk through libfabric over loopback */
    long long clock_shift_ns; /* with ranks_per_node: fake node k tells other nodes times
                                 k x this ahead of its clock (smddp__nodes_clock_shift_ns) */
} harness_opts_t;

/*
 * Runs fn on nranks processes. Returns 0 when every rank exited with status 0
 * (or died of the signal it was expected to), else the number of ranks that
 * did not; a rank still running at timeout_s counts as failed and is killed.
 */
int harness_run(int nranks, harness_fn_t fn, void *arg, harness_opts_t *opts);

/* "A=1 B=2" (NULL: nothing): sets each in this process, then re-reads SMDDP_* settings. */
void harness_apply_env(const char *env);

/* The port of the store the current harness run serves (valid in ranks). */
extern int harness_store_port;

/* Creates a communicator of `size` ranks through the harness's store. */
smddp_comm_t harness_comm(int rank, int size, const char *prefix);

/* Like harness_comm, but returns the status (timeout_ms < 0: SMDDP_TIMEOUT). */
smddp_status_t harness_try_comm(int rank, int size, const char *prefix, int64_t timeout_ms,
                                smddp_comm_t *comm);

/*
 * A communicator that is only its topology (nodes x per_node ranks, rank r
 * on node r / per_node, no transports): enough for the router's and the
 * topology's checks. Free it with free().
 */
struct smddp_comm *harness_topology(int nodes, int per_node);

/* How many times the communicator's flight recorder dump says `what` (in a rank). */
int harness_trace_count(smddp_comm_t comm, const char *what);
/*
 * Counts the /dev/shm segments (smddp-<pid>-...) made by this process or by
 * ranks harness_run forked from it: not those of other programs running now.
 */
int harness_shm_count(void);

#define H_CHECK(cond, ...)                                                          \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "[pid %d] %s:%d: check failed: %s: ", (int)getpid(),    \
                    __FILE__, __LINE__, #cond);                                     \
            fprintf(stderr, __VA_ARGS__);                                           \
            fprintf(stderr, "\n");                                                  \
            fflush(stderr);                                                         \
            _exit(1);                                                               \
        }                                                                           \
    } while (0)

#define H_OK(call)                                                                       \
    do {                                                                                 \
        smddp_status_t h_st = (call);                                                    \
        H_CHECK(h_st == SMDDP_OK, "%s returned %s: %s", #call, smddp_status_string(h_st), \
                smddp_get_last_error(NULL));                                             \
    } while (0)

#endif /* SMDDP_TEST_HARNESS_H */
