/*
 * The communicator: the state every layer of the core reads (topology,
 * transports, queue, abort), and its life cycle (comm.c). Internal to core/
 * and abi/; nothing here is exported.
 */
#ifndef SMDDP_CORE_COMM_H
#define SMDDP_CORE_COMM_H

#include <pthread.h>
#include <stdatomic.h>

#include "common.h"
#include "op.h"
#include "pollers.h"
#include "store/ref.h"
#include "verdicts.h"
#include "reduce/reduce.h"

/* The scratch buffers a collective across nodes may hold at once (smddp__net_scratch). */
enum {
    SMDDP_SCRATCH_OUTER,
    SMDDP_SCRATCH_FP32,
    SMDDP_SCRATCH_WORK,
    SMDDP_SCRATCH_TMP,
    SMDDP_SCRATCH_SLOTS
};

/*
 * The timeout a communicator keeps for a requested one: > 0 ms capped at
 * 1e12 ms (1e9 s, as SMDDP_TIMEOUT allows, so deadlines in ns stay within
 * int64); anything else takes SMDDP_TIMEOUT.
 */
int64_t smddp__timeout_ms(int64_t requested_ms);

typedef struct smddp__shm smddp__shm_t;
typedef struct smddp__p2p smddp__p2p_t;
typedef struct smddp__net_ep smddp__net_ep_t;
typedef struct smddp__watch smddp__watch_t;

struct smddp_comm {
    int rank;
    int size;
    int local_rank;
    int local_size;
    int node_count;
    int node;                /* this rank's node index */
    int *local_ranks;        /* comm rank of each local rank */
    int *node_of;            /* node index of each rank */
    int *node_ranks;         /* [node * local_size + lr]: comm rank of local rank lr of each
                              * node, when every node holds local_size ranks; else NULL */
    uint64_t net_bytes;      /* bytes this rank sent over the network in collectives */
    uint64_t net_bytes_local; /* of which to ranks on its own node */
    uint64_t shm_bytes;      /* bytes this rank staged for its node's peers in hierarchical ops */
    uint64_t net_steps_overlapped; /* ring steps of a pipelined allreduce that completed while
                                    * this rank worked in shared memory */
    char prefix[256];
    _Atomic int64_t timeout_ms; /* read when an op starts; smddp_comm_set_timeout changes it */
    /*
     * What the ranks settled together on earlier ops (the pooled verdicts,
     * whether NCCL loads everywhere), read by the selection before it
     * chooses (verdicts.h, select.h).
     */
    smddp__verdicts_t verdicts;
    /*
     * The settings as this communicator's ranks agreed on them at creation
     * (param.h's agreement column): what must match does, and the smallest
     * or largest value holds where the table says so.
     */
    struct smddp__params *params;
    /* SMDDP_ALGO's rules, parsed and checked at creation (select.h). */
    struct smddp__select_row *algo_rules;
    int n_algo_rules;

    smddp__store_ref_t *store;
    /*
     * What the communicator holds open (transport/transport.h), in comm.c's
     * order: smddp__comm_abort tells each of them. Installed here rather than
     * named in fail.c, which the transports call (no file cycle).
     */
    const struct smddp__transport *const *transports;
    int n_transports;
    smddp__shm_t *shm;
    smddp__p2p_t *p2p;       /* send/recv engine, started on first use */
    /* The network transport (transport/net.h), when the comm spans nodes, and its endpoints. */
    const struct smddp__net_transport *net;
    smddp__net_ep_t *net_ep;    /* collectives', driven by the thread that runs them */
    smddp__net_ep_t *net_p2p;   /* send/recv's, driven by the p2p thread */
    smddp__watch_t *watch;      /* liveness of other nodes' ranks, when the comm spans nodes */
    struct smddp__trace *trace; /* flight recorder (trace.h); NULL when off */
    struct smddp__progress *progress; /* arrivals and lateness (progress.h); NULL on no memory */
    /*
     * What waits drive besides their own transport (pollers.h): registered by
     * an op with network transfers in flight while it waits in shared memory.
     */
    smddp__pollers_t pollers;
    /*
     * Scratch of the collectives across nodes (smddp__net_scratch), kept
     * between ops; only the thread running an op (exec_lock) touches it.
     */
    void *scratch[SMDDP_SCRATCH_SLOTS];
    size_t scratch_len[SMDDP_SCRATCH_SLOTS];
    /*
     * CUDA's transports (cuda/cuda.h), each with its state in its own
     * struct: CUDA IPC, set up by the first CUDA collective (written under
     * err_lock, so that an abort finds its kernels); the idle pinned staging
     * buffers; NCCL's communicator, created by the first collective routed
     * to it.
     */
    struct smddp__cuda *cuda;
    struct smddp__stage_pool *stages;
    struct ncclComm *nccl;

    /* Scheduler: the queue, guarded by lock; exec_lock is held by whoever runs ops. */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    smddp__op_t *head, *tail;
    bool stopping;
    bool thread_started;
    pthread_t thread;
    pthread_mutex_t exec_lock;
    /*
     * While a thread completes an op (callbacks included), no other thread
     * starts one: an op a callback issues runs next (queue.c). A progress
     * thread waiting for that (under lock) counts itself in
     * completion_waiters first.
     */
    atomic_int completing;
    atomic_int completion_waiters;
    uint64_t next_seq;
    _Atomic uint64_t shrinks; /* smddp_comm_shrink calls so far: names the next one */
    /* What the communicator cost this rank (smddp_comm_get_stats). */
    int64_t create_ns;                    /* its creation's duration */
    uint64_t store_ops0, store_bytes0;    /* the store's counts when its creation began */
    uint64_t create_store_ops, create_store_bytes; /* and during its creation */
    _Atomic int connections;              /* network peers resolved, liveness connections */
    _Atomic int threads;                  /* threads started */
    _Atomic bool *seen_dead; /* per rank: the liveness watch saw it die (smddp_comm_peer_state) */

    /* Abort: first failure wins; later ops fail fast with its message. */
    atomic_int aborted;
    atomic_bool aborted_by_app; /* smddp_comm_abort on this rank: fail at once, ask nobody */
    smddp_status_t abort_status;
    char abort_msg[SMDDP_ERRMSG_MAX];

    pthread_mutex_t err_lock;
    char last_error[SMDDP_ERRMSG_MAX];

    /* Across nodes, aborts travel through the store (smddp__comm_fail). */
    _Atomic int64_t remote_abort_polled_ns;
    /*
     * How a transport waiting for a peer learns that the communicator was
     * aborted, here or on another node: installed at creation
     * (smddp__comm_poll_remote_abort, fail.c), called between polls with the
     * time and the comm rank waited for (-1 if none); true once aborted.
     */
    bool (*poll_abort)(struct smddp_comm *comm, int64_t now_ns, int waiting_for);
};

/* The transports' way to ask comm->poll_abort (installed before any transport is set up). */
static inline bool smddp__comm_poll_abort(struct smddp_comm *comm, int64_t now_ns,
                                          int waiting_for)
{
    return comm->poll_abort(comm, now_ns, waiting_for);
}

/* The timeout op runs under: its own (smddp_coll_attr_t::timeout_ms), else comm's. */
static inline int64_t smddp__op_timeout_ms(const struct smddp_comm *comm, const smddp__op_t *op)
{
    return op->timeout_ms > 0 ? op->timeout_ms : comm->timeout_ms;
}

/* An algorithm: runs op on comm, on the calling thread (exec_lock held). */
typedef smddp_status_t (*smddp__algo_fn)(smddp_comm_t comm, smddp__op_t *op);

/* Creation through a store reference (takes one reference on success). */
smddp_status_t smddp__comm_create(smddp__store_ref_t *store, int rank, int size,
                                  const char *prefix, int64_t timeout_ms,
                                  smddp_comm_t *out);
smddp_status_t smddp__comm_split(smddp_comm_t comm, int color, int key, smddp_comm_t *out);
/* smddp_comm_peer_state's answer for a checked rank (an smddp_peer_state_t). */
int smddp__comm_peer_state(smddp_comm_t comm, int peer);
/*
 * smddp_comm_shrink on checked arguments: excluded[r] for each parent rank
 * (never this one; at least one rank stays). Agrees on the list through the
 * parent's store, then creates the survivors' communicator under a fresh
 * prefix, all by one deadline (the parent's timeout).
 */
smddp_status_t smddp__comm_shrink(smddp_comm_t comm, const bool *excluded, int flags,
                                  smddp_comm_t *out);
smddp_status_t smddp__comm_destroy(smddp_comm_t comm);
/* The version-2 fields of smddp_comm_get_stats: what comm has cost this rank. */
void smddp__comm_costs(smddp_comm_t comm, smddp_comm_stats_t *out);

#endif /* SMDDP_CORE_COMM_H */
