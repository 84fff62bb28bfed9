/*
 * An algorithm as the registry knows it: one entry per (kind, path, name),
 * defined in the file that holds the algorithm's code. select.c lists them
 * all and chooses among them; nothing else chooses.
 */
#ifndef SMDDP_CORE_ALGO_H
#define SMDDP_CORE_ALGO_H

#include "comm.h"
#include "param.h"

/* Where an op's data goes. */
typedef enum smddp__path {
    SMDDP_PATH_SHM,         /* host memory, one node: shared memory (coll/shm/) */
    SMDDP_PATH_NET,         /* host memory across nodes (coll/net/: flat; coll/hier/: hierarchical) */
    SMDDP_PATH_CUDA_IPC,    /* CUDA memory, one node: CUDA IPC (cuda/ipc.c) */
    SMDDP_PATH_CUDA_STAGED, /* CUDA memory through pinned host memory (cuda/stage.c) */
    SMDDP_PATH_NCCL,        /* CUDA memory through an NCCL communicator (cuda/nccl.c) */
    SMDDP_PATH_COUNT
} smddp__path_t;

struct smddp__select_in;

typedef struct smddp__algo {
    const char *name;         /* unique within (kind, path); what SMDDP_ALGO and the flight recorder say */
    smddp__op_kind_t kind;
    smddp__path_t path;
    bool hier;                /* on SMDDP_PATH_NET: shared memory inside each node ("net-hier") */
    /* Whether it can run the op described by in; NULL: always. Pure, like the selection. */
    bool (*can_run)(const struct smddp__select_in *in);
    smddp__algo_fn run;
    /*
     * Names it may record instead of its own when it finds, in its first
     * exchange, every rank's buffers where peers can read them in place
     * ("in pools", "cross-memory attach"); NULL-terminated, may be NULL.
     */
    const char *const *placements;
    const char *about;        /* one line, for smddp_info */
} smddp__algo_t;

#endif /* SMDDP_CORE_ALGO_H */
