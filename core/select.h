/*
 * The one place that chooses (select.c): for an op, the path its data takes
 * and the algorithm that moves it, from the registry of algorithms and one
 * table of size ranges per (kind, path, ranks per node, nodes).
 *
 * The choice is a pure function of what smddp__select_in_t holds: the op's
 * kind, memory and size, the communicator's layout, the limits its ranks
 * agreed on at creation, and the verdicts its ranks settled together on
 * earlier ops (verdicts.h), looked up before the choice. Every rank of a
 * communicator therefore makes the same choice for the same op.
 */
#ifndef SMDDP_CORE_SELECT_H
#define SMDDP_CORE_SELECT_H

#include <stdio.h>

#include "algo.h"

/* The sizes the table's ranges are made of, per communicator (and per op where noted). */
typedef enum smddp__limit {
    SMDDP_LIM_NONE,         /* a constant bound */
    SMDDP_LIM_LL,           /* the low-latency slots' payload (0: none) */
    SMDDP_LIM_AR_LL,        /* allreduce through the slots: LL within one-shot's range */
    SMDDP_LIM_ONESHOT,      /* one-shot's range: bytes x local ranks / 2 <= SMDDP_ALLREDUCE_ONESHOT_MAX, within a half */
    SMDDP_LIM_HALF,         /* one staging half */
    SMDDP_LIM_CMA_MIN,      /* cross-memory attach's range (MIN > MAX when off) */
    SMDDP_LIM_CMA_MAX,
    SMDDP_LIM_LEADER,       /* SMDDP_NET_LEADER_MAX, in the op's own dtype (fp16/bf16 travel as fp32) */
    SMDDP_LIM_RS_ONE_PER_NODE, /* reduce-scatter, one rank per node: hierarchical from this output */
    SMDDP_LIM_COUNT
} smddp__limit_t;

/* Facts a row may require (need) or exclude (unless). */
enum {
    SMDDP_FACT_NODE_RANKS = 1u << 0,      /* every node holds the same ranks (hierarchical can run) */
    SMDDP_FACT_LL_SLOTS = 1u << 1,        /* the low-latency slots exist */
    SMDDP_FACT_POOLED_IN_PLACE = 1u << 2, /* verdict: this size's allreduce ran in place in the pools */
    SMDDP_FACT_POOLED_INPUTS = 1u << 3,   /* verdict: ... its inputs lay in the pools, out of place */
    SMDDP_FACT_POOLED_ANY = SMDDP_FACT_POOLED_IN_PLACE | SMDDP_FACT_POOLED_INPUTS,
};

/* One bound of a size range: min(limit, cap), or cap alone. */
typedef struct smddp__bound {
    smddp__limit_t lim;
    uint64_t cap;
} smddp__bound_t;

#define SMDDP_NO_CAP UINT64_MAX

/*
 * A row of the selection: an op of `kind` on `path` whose layout lies in
 * the local and node ranges, whose bytes lie in [lo, hi], and whose facts
 * include `need` and none of `unless`, runs `algo` (a registry entry of that
 * kind and path). The first row that matches and whose algorithm can run
 * decides.
 */
typedef struct smddp__select_row {
    smddp__op_kind_t kind;
    smddp__path_t path;
    int local_min, local_max; /* 0: no bound above */
    int nodes_min, nodes_max;
    smddp__bound_t lo, hi;
    uint32_t need, unless;
    const struct smddp__algo *algo;
} smddp__select_row_t;

/* What the choice reads; smddp__select_input fills it from comm and op. */
typedef struct smddp__select_in {
    smddp__op_kind_t kind;
    smddp_mem_type_t mem;
    uint64_t bytes;      /* count x dtype size, as the caller passed them */
    int local_size, node_count, size;
    uint32_t facts;      /* SMDDP_FACT_* */
    uint64_t lim[SMDDP_LIM_COUNT];
    /* The settings that choose (param.c); SMDDP_ALGO's rules are `rules`. */
    smddp__net_algo_t net_algo;
    smddp__allreduce_algo_t allreduce_algo;
    const smddp__select_row_t *rules; /* SMDDP_ALGO, parsed and checked at creation */
    int n_rules;
    /* CUDA memory only: what decides between CUDA IPC, host staging and NCCL. */
    smddp__cuda_net_t cuda_net;
    bool backend_nccl;   /* SMDDP_COMMUNICATION_BACKEND=nccl */
    bool nccl_has_op;    /* NCCL serves this op */
    bool nccl_loads;     /* NCCL loads (on every rank, where agreed) */
    int cuda_max_local;  /* the most local ranks smddp's CUDA kernels combine */
} smddp__select_in_t;

typedef struct smddp__choice {
    smddp__path_t path;
    const smddp__algo_t *algo; /* NULL on SMDDP_PATH_CUDA_STAGED: each chunk chooses again */
    const char *why;           /* why an op goes to NCCL; NULL otherwise */
} smddp__choice_t;

/* The choice for in (pure). */
smddp__choice_t smddp__select(const smddp__select_in_t *in);

/* The table itself (for tests and printing). */
const smddp__select_row_t *smddp__select_table(int *n);

/* The registry: every algorithm this build has, and the entry of (kind, path, name). */
const smddp__algo_t *const *smddp__algos(size_t *n);
const smddp__algo_t *smddp__algo_find(smddp__op_kind_t kind, smddp__path_t path, const char *name);

/* A path's name ("shm", "net", "cuda-ipc", ...). */
const char *smddp__path_name(smddp__path_t path);

/*
 * SMDDP_ALGO: '#'-separated rules "kind:lo-hi:name" (sizes in bytes, with
 * k/M/G suffixes, both bounds included, "inf" for no bound) or "kind:name" for every
 * size, as UCC writes its scores. Each name must be an algorithm of that
 * kind in the registry. Fills rows (up to cap) and *n, or returns
 * SMDDP_ERR_INVALID_ARGUMENT with a message naming what is accepted.
 */
smddp_status_t smddp__select_parse(const char *spec, smddp__select_row_t *rows, int cap, int *n);

/*
 * Prints the table as it applies to a communicator of local_ranks ranks on
 * each of nodes nodes with this process's settings (host memory; CUDA
 * memory's route in a line below it).
 */
void smddp__select_print(FILE *out, int local_ranks, int nodes);

/* The limits of a communicator built with this process's settings (for printing and tests). */
void smddp__select_default_limits(int local_ranks, int nodes, uint64_t lim[SMDDP_LIM_COUNT]);

#endif /* SMDDP_CORE_SELECT_H */
