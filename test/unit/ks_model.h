/*
 * A CPU model of core/cuda/ipc_kernels.cu: one launch of a collective
 * kernel as threads, one per block, running core/cuda/ksync.h's protocol
 * and moving the same vectors in the same phases as the kernels, with
 * smddp__reduce's arithmetic. Used by test_ksync.c (the protocol alone) and
 * by fake_cudart.c (the stand-in runtime's "kernel launch").
 */
#ifndef SMDDP_TEST_KS_MODEL_H
#define SMDDP_TEST_KS_MODEL_H

#include <stdbool.h>

#include "cuda/ksync.h"
#include "reduce/reduce.h"

/* Ways to disturb a launch (all zero: none). */
typedef struct ks_model_opts {
    int delay_us;   /* > 0: blocks sleep up to this long at random points */
    int slow_rank;  /* this rank sleeps slow_us after the first barrier (-1 or 0 with slow_us 0: none) */
    int slow_us;
    bool skip_last; /* leave out the launch's last barrier (to show it is needed) */
    unsigned seed;
} ks_model_opts_t;

/*
 * Runs job as a launch of `blocks` blocks on this rank (c->rank) and returns
 * when every block has finished: SMDDP_KS_OK, or why a block gave up.
 */
uint32_t ks_model_launch(const smddp__ks_comm_t *c, const smddp__ks_job_t *job,
                         const smddp__reduce_spec_t *spec, int blocks, const ks_model_opts_t *opts);

/*
 * Counts, in this process, every (block, peer) of a launch that read the
 * peer's data where the peer registered it rather than from its scratch.
 */
extern _Atomic unsigned long ks_model_in_place_reads;

/* The blocks a launch of job has (ipc_kernels.cu's grid_of). */
int ks_model_grid(const smddp__ks_comm_t *c, const smddp__ks_job_t *job);

#endif /* SMDDP_TEST_KS_MODEL_H */
