/*
 * Settings: every SMDDP_* environment variable is one row of the table in
 * param.c, parsed once on first use.
 */
#ifndef SMDDP_CORE_PARAM_H
#define SMDDP_CORE_PARAM_H

#include <stdio.h>

#include "common.h"

/* The settings that choose among named values, in their tables' order (param.c). */
typedef enum smddp__allreduce_algo {
    SMDDP_ALLREDUCE_AUTO, SMDDP_ALLREDUCE_ONESHOT, SMDDP_ALLREDUCE_TWOSHOT
} smddp__allreduce_algo_t;
typedef enum smddp__simd { SMDDP_SIMD_AUTO, SMDDP_SIMD_SCALAR, SMDDP_SIMD_AVX2, SMDDP_SIMD_AVX512 } smddp__simd_t;
typedef enum smddp__comm_backend { SMDDP_BACKEND_AUTO, SMDDP_BACKEND_NCCL } smddp__comm_backend_t;
typedef enum smddp__cuda_net { SMDDP_CUDA_NET_AUTO, SMDDP_CUDA_NET_STAGED, SMDDP_CUDA_NET_NCCL } smddp__cuda_net_t;
typedef enum smddp__cuda_sync { SMDDP_CUDA_SYNC_EVENTS, SMDDP_CUDA_SYNC_KERNEL } smddp__cuda_sync_t;
typedef enum smddp__net_algo { SMDDP_NET_AUTO, SMDDP_NET_FLAT, SMDDP_NET_HIER } smddp__net_algo_t;
typedef enum smddp__ofi_mr { SMDDP_OFI_MR_AUTO, SMDDP_OFI_MR_ALWAYS } smddp__ofi_mr_t;
typedef enum smddp__shm_cma { SMDDP_CMA_AUTO, SMDDP_CMA_ON, SMDDP_CMA_OFF } smddp__shm_cma_t;
typedef enum smddp__thread_sched { SMDDP_THREAD_BATCH, SMDDP_THREAD_NORMAL } smddp__thread_sched_t;

/* How a communicator's ranks agree on a setting: the settings table's agreement column. */
typedef enum smddp__agree {
    SMDDP_AGREE_ANY,   /* each rank keeps its own */
    SMDDP_AGREE_MATCH, /* every rank must set the same */
    SMDDP_AGREE_MIN,   /* the smallest any rank sets holds for all */
    SMDDP_AGREE_MAX    /* the largest any rank sets holds for all */
} smddp__agree_t;

typedef struct smddp__params {
    smddp__log_level_t debug_level; /* SMDDP_DEBUG */
    char debug_file[256];       /* SMDDP_DEBUG_FILE */
    int64_t timeout_ms;         /* SMDDP_TIMEOUT (seconds in the env) */
    int rank;                   /* SMDDP_RANK, -1 if unset */
    int world_size;             /* SMDDP_WORLD_SIZE, -1 if unset */
    char master_addr[256];      /* SMDDP_MASTER_ADDR */
    int master_port;            /* SMDDP_MASTER_PORT, -1 if unset */
    char hostname[256];         /* SMDDP_HOSTNAME: node identity override */
    char job_id[256];           /* SMDDP_JOB_ID: derives the store port of one-node jobs */
    int64_t oneshot_max;        /* SMDDP_ALLREDUCE_ONESHOT_MAX bytes */
    smddp__allreduce_algo_t algo; /* SMDDP_ALLREDUCE_ALGO */
    char algo_rules[1024];      /* SMDDP_ALGO: the selection's overrides (select.h) */
    int64_t shm_buffer;         /* SMDDP_SHM_BUFFER_SIZE bytes per rank */
    int64_t shm_pool;           /* SMDDP_SHM_POOL_SIZE bytes per rank (0: no pool) */
    int shm_pool_reserve_pct;   /* SMDDP_SHM_POOL_RESERVE_PCT: % of /dev/shm pools leave free */
    int shm_pool_release_ms;    /* SMDDP_SHM_POOL_RELEASE_MS: idle freed pool memory given back */
    smddp__shm_cma_t shm_cma;   /* SMDDP_SHM_CMA: cross-memory attach inside a node */
    int64_t shm_cma_min;        /* SMDDP_SHM_CMA_MIN: allgather bytes per rank read so */
    int64_t shm_cma_max;        /* SMDDP_SHM_CMA_MAX: ... up to this */
    int64_t shm_ll_max;         /* SMDDP_SHM_LL_MAX: bytes per rank through the low-latency slots */
    int64_t stream_min;         /* SMDDP_STREAM_MIN: results this large bypass the caches */
    int64_t p2p_buffer;         /* SMDDP_P2P_BUFFER_SIZE bytes per rank pair */
    int64_t p2p_set_aside_max;  /* SMDDP_P2P_SET_ASIDE_MAX bytes */
    int spin;                   /* SMDDP_SPIN microseconds of busy-waiting */
    int yield;                  /* SMDDP_YIELD microseconds of sched_yield after spinning */
    int check;                  /* SMDDP_CHECK_ORDER: cross-rank op check */
    smddp__simd_t simd;         /* SMDDP_SIMD */
    int inline_exec;            /* SMDDP_INLINE: blocking ops run on caller */
    smddp__thread_sched_t thread_sched; /* SMDDP_THREAD_SCHED: libsmddp's own threads */
    int trace_buffer;           /* SMDDP_TRACE_BUFFER: ops the flight recorder keeps, 0: off */
    char trace_dir[256];        /* SMDDP_TRACE_DIR: where failing communicators dump it */
    int straggler_warn_ms;      /* SMDDP_STRAGGLER_WARN_MS: WARN when a rank arrives this late */
    int straggler_nodes;        /* SMDDP_STRAGGLER_NODES: compare arrivals across nodes too */
    smddp__comm_backend_t comm_backend; /* SMDDP_COMMUNICATION_BACKEND */
    int64_t cuda_buffer;        /* SMDDP_CUDA_BUFFER_SIZE bytes per rank */
    int64_t cuda_oneshot_max;   /* SMDDP_CUDA_ONESHOT_MAX bytes */
    smddp__cuda_sync_t cuda_sync; /* SMDDP_CUDA_SYNC */
    int cuda_kernel_blocks;     /* SMDDP_CUDA_KERNEL_BLOCKS, 0: automatic */
    int64_t cuda_register_min;  /* SMDDP_CUDA_REGISTER_MIN bytes, 0: never */
    char nccl_library[256];     /* SMDDP_NCCL_LIBRARY: "" = libnccl.so.2 */
    smddp__cuda_net_t cuda_net; /* SMDDP_CUDA_NET */
    int64_t cuda_stage_chunk;   /* SMDDP_CUDA_STAGE_CHUNK bytes */
    smddp__net_algo_t net_algo; /* SMDDP_NET_ALGO */
    int64_t net_leader_max;     /* SMDDP_NET_LEADER_MAX bytes */
    int ofi_max_inflight;       /* SMDDP_OFI_MAX_INFLIGHT */
    smddp__ofi_mr_t ofi_mr;     /* SMDDP_OFI_MR */
    int ofi_mr_cache;           /* SMDDP_OFI_MR_CACHE */
    char ofi_provider[64];      /* SMDDP_OFI_PROVIDER: "" = FI_PROVIDER, else efa, else tcp;ofi_rxm */
    char ofi_library[256];      /* SMDDP_OFI_LIBRARY: "" = libfabric.so.1 */
} smddp__params_t;

/* The settings, parsed from the environment on first call. */
const smddp__params_t *smddp__params(void);

/* Re-reads the environment; for tests that change settings in-process. */
void smddp__params_reload(void);

/* Prints the table with current values. */
void smddp__params_print(FILE *out);

/*
 * This process's values of the settings its communicator's ranks must agree
 * on, as one text record ("NAME=value" lines) to exchange at creation: into
 * buf, NUL-terminated when it fits; returns its length.
 */
size_t smddp__params_agree_record(char *buf, size_t cap);
/*
 * Applies the agreement column to every rank's record (records[r] from rank
 * r, n ranks): a setting that must match and differs fails with
 * SMDDP_ERR_MISMATCH, naming it, rank 0's value, the first other value and
 * the ranks that differ, in why (why_cap bytes; the last error is left as it
 * was); the others take the smallest or largest value. *out: this process's
 * settings with that applied. Every rank reaches the same verdict from the
 * same records.
 */
smddp_status_t smddp__params_agree(const char *const *records, int n, smddp__params_t *out,
                                   char *why, size_t why_cap);

#endif /* SMDDP_CORE_PARAM_H */
