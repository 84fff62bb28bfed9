/*
 * Settings: every SMDDP_* environment variable is one row of the table in
 * param.c, parsed once on first use.
 */
#ifndef SMDDP_CORE_PARAM_H
#define SMDDP_CORE_PARAM_H

#include <stdio.h>

#include "common.h"

typedef struct smddp__params {
    int debug_level;            /* SMDDP_DEBUG */
    char debug_file[256];       /* SMDDP_DEBUG_FILE */
    int64_t timeout_ms;         /* SMDDP_TIMEOUT (seconds in the env) */
    int rank;                   /* SMDDP_RANK, -1 if unset */
    int world_size;             /* SMDDP_WORLD_SIZE, -1 if unset */
    char master_addr[256];      /* SMDDP_MASTER_ADDR */
    int master_port;            /* SMDDP_MASTER_PORT, -1 if unset */
    char hostname[256];         /* SMDDP_HOSTNAME: node identity override */
    char job_id[256];           /* SMDDP_JOB_ID: derives the store port of one-node jobs */
    int64_t oneshot_max;        /* SMDDP_ALLREDUCE_ONESHOT_MAX bytes */
    int algo;                   /* SMDDP_ALLREDUCE_ALGO: 0 auto, 1 oneshot, 2 twoshot */
    int64_t shm_buffer;         /* SMDDP_SHM_BUFFER_SIZE bytes per rank */
    int64_t stream_min;         /* SMDDP_STREAM_MIN: results this large bypass the caches */
    int64_t p2p_buffer;         /* SMDDP_P2P_BUFFER_SIZE bytes per rank pair */
    int spin;                   /* SMDDP_SPIN microseconds of busy-waiting */
    int yield;                  /* SMDDP_YIELD microseconds of sched_yield after spinning */
    int check;                  /* SMDDP_CHECK_ORDER: cross-rank op check */
    int simd;                   /* SMDDP_SIMD: 0 auto, 1 scalar, 2 avx2, 3 avx512 */
    int inline_exec;            /* SMDDP_INLINE: blocking ops run on caller */
    int comm_backend;           /* SMDDP_COMMUNICATION_BACKEND: 0 auto, 1 nccl */
    int64_t cuda_buffer;        /* SMDDP_CUDA_BUFFER_SIZE bytes per rank */
    int64_t cuda_oneshot_max;   /* SMDDP_CUDA_ONESHOT_MAX bytes */
    char nccl_library[256];     /* SMDDP_NCCL_LIBRARY: "" = libnccl.so.2 */
    int cuda_net;               /* SMDDP_CUDA_NET: 0 auto, 1 staged, 2 nccl */
    int64_t cuda_stage_chunk;   /* SMDDP_CUDA_STAGE_CHUNK bytes */
    int net_algo;               /* SMDDP_NET_ALGO: 0 auto, 1 flat, 2 hier */
    int64_t net_leader_max;     /* SMDDP_NET_LEADER_MAX bytes */
    int ofi_max_inflight;       /* SMDDP_OFI_MAX_INFLIGHT */
    int ofi_mr;                 /* SMDDP_OFI_MR: 0 auto, 1 always */
    int ofi_mr_cache;           /* SMDDP_OFI_MR_CACHE */
    char ofi_provider[64];      /* SMDDP_OFI_PROVIDER: "" = FI_PROVIDER, else efa, else tcp;ofi_rxm */
} smddp__params_t;

/* The settings, parsed from the environment on first call. */
const smddp__params_t *smddp__params(void);

/* Re-reads the environment; for tests that change settings in-process. */
void smddp__params_reload(void);

/* Prints the table with current values. */
void smddp__params_print(FILE *out);

#endif /* SMDDP_CORE_PARAM_H */
