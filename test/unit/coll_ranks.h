/*
 * What more than one of the collective test programs (test_coll_node,
 * test_coll_nodes, test_p2p, test_split) runs: rank functions for
 * harness_run that each check one kind of operation, and the runners that
 * start them on one node or on fake nodes. A runner asserts with CMocka, so
 * it is called from a test, never from a rank.
 */
#ifndef SMDDP_TEST_COLL_RANKS_H
#define SMDDP_TEST_COLL_RANKS_H

#include "harness.h"

/*
 * Runs fn on nranks ranks of one node, each with env set ("NAME=value ...";
 * NULL: none), and fails the test unless every rank passes within 300 s and
 * /dev/shm holds as many smddp- entries afterwards as before.
 */
void run(int nranks, harness_fn_t fn, const char *env);

/* The same on fake nodes of per_node ranks each, fn getting arg, within 600 s. */
void run_nodes_env_arg(int nranks, int per_node, harness_fn_t fn, void *arg, const char *env);
void run_nodes_env(int nranks, int per_node, harness_fn_t fn, const char *env);
void run_nodes(int nranks, int per_node, harness_fn_t fn);

/* Rank functions (arg unused); coll_ranks.c says what each checks. */
void allreduce_rank(smddp_comm_t comm, int rank, int size, void *arg);     /* every dtype x op */
void reduce_rank(smddp_comm_t comm, int rank, int size, void *arg);        /* and reduce_scatter */
void movement_rank(smddp_comm_t comm, int rank, int size, void *arg);      /* broadcast .. alltoall */
void alltoallv_rank(smddp_comm_t comm, int rank, int size, void *arg);     /* uneven, with gaps */
void callback_rank(smddp_comm_t comm, int rank, int size, void *arg);      /* completion callbacks */
void p2p_across_nodes_rank(smddp_comm_t comm, int rank, int size, void *arg); /* send/recv */
void half_accuracy_rank(smddp_comm_t comm, int rank, int size, void *arg); /* bf16 sums */

#endif /* SMDDP_TEST_COLL_RANKS_H */
