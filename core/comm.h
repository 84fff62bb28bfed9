/*
 * The communicator and the operations queued on it. Internal to core/ and
 * abi/; nothing here is exported.
 */
#ifndef SMDDP_CORE_COMM_H
#define SMDDP_CORE_COMM_H

#include <pthread.h>
#include <stdatomic.h>

#include "common.h"
#include "reduce/reduce.h"

/* The scratch buffers a collective across nodes may hold at once (smddp__net_scratch). */
enum {
    SMDDP_SCRATCH_OUTER,
    SMDDP_SCRATCH_FP32,
    SMDDP_SCRATCH_WORK,
    SMDDP_SCRATCH_TMP,
    SMDDP_SCRATCH_SLOTS
};

typedef enum smddp__op_kind {
    SMDDP_OP_ALLREDUCE,
    SMDDP_OP_REDUCE,
    SMDDP_OP_BROADCAST,
    SMDDP_OP_ALLGATHER,
    SMDDP_OP_REDUCE_SCATTER,
    SMDDP_OP_ALLTOALL,
    SMDDP_OP_ALLTOALLV,
    SMDDP_OP_GATHER,
    SMDDP_OP_SCATTER,
    SMDDP_OP_BARRIER,
    SMDDP_OP_SEND,
    SMDDP_OP_RECV,
    SMDDP_OP_KIND_COUNT
} smddp__op_kind_t;

const char *smddp__op_kind_name(smddp__op_kind_t kind);

/* One operation; the public smddp_request_t points at it. */
typedef struct smddp_request {
    smddp__op_kind_t kind;
    uint64_t seq;            /* collective sequence number (p2p: per-peer message number) */
    const void *sendbuf;
    void *recvbuf;
    size_t count;            /* elements, as the API defines it for this kind */
    smddp_dtype_t dtype;
    smddp_dtype_t caller_dtype; /* fp16/bf16 while dtype is the fp32 they travel as (net.c) */
    smddp__reduce_spec_t spec;
    int root;                /* root, or peer for send/recv */
    int tag;
    smddp_mem_type_t mem_type; /* where the buffers live */
    void *stream;            /* cudaStream_t for SMDDP_MEM_CUDA */
    int64_t *v;              /* alltoallv: sendcounts, sdispls, recvcounts, rdispls (4 * size), owned */
    int64_t deadline_ns;     /* set when execution starts */
    uint32_t seq_span;       /* collective sequence numbers it takes (0 means 1) */
    struct smddp__stage *stage; /* CUDA across nodes: its host staging (cuda/stage.c) */
    bool on_stream;          /* staged, and all its stream work was enqueued at issue */

    smddp_complete_fn on_complete; /* optional, called before done is set */
    void *on_complete_arg;

    struct smddp_comm *comm;
    struct smddp_request *next;
    bool queued;             /* in comm's queue, not started (guarded by comm->lock) */
    atomic_int refs;         /* the caller's handle and the engine's */
    _Atomic uint32_t done;   /* 0 while running, 1 when finished (futex word) */
    _Atomic uint32_t sleepers; /* threads in FUTEX_WAIT on done */
    smddp_status_t status;
    char errmsg[SMDDP_ERRMSG_MAX];
} smddp__op_t;

/*
 * The timeout a communicator keeps for a requested one: > 0 ms capped at
 * 1e12 ms (1e9 s, as SMDDP_TIMEOUT allows, so deadlines in ns stay within
 * int64); anything else takes SMDDP_TIMEOUT.
 */
int64_t smddp__timeout_ms(int64_t requested_ms);

/* A store shared by a communicator and those split from it. */
typedef struct smddp__store_ref {
    smddp_store_t table;
    atomic_int refs;
    pthread_mutex_t lock;    /* one callback at a time */
    atomic_int queued;       /* threads waiting for lock (a get lets them in between slices) */
    void (*on_free)(struct smddp__store_ref *self); /* optional, before it is freed */
} smddp__store_ref_t;

typedef struct smddp__shm smddp__shm_t;
typedef struct smddp__p2p smddp__p2p_t;
typedef struct smddp__ofi smddp__ofi_t;
typedef struct smddp__watch smddp__watch_t;
typedef struct smddp__stage smddp__stage_t;

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
    uint64_t net_bytes;      /* bytes this rank sent over the network (ofi) */
    uint64_t net_bytes_local; /* of which to ranks on its own node */
    uint64_t shm_bytes;      /* bytes this rank staged for its node's peers in hierarchical ops */
    uint64_t net_steps_overlapped; /* ring steps of a pipelined allreduce that completed while
                                    * this rank worked in shared memory */
    char prefix[256];
    _Atomic int64_t timeout_ms; /* read when an op starts; smddp_comm_set_timeout changes it */

    smddp__store_ref_t *store;
    smddp__shm_t *shm;
    smddp__p2p_t *p2p;       /* send/recv engine, started on first use */
    struct smddp__ofi *ofi;  /* network transport, when the comm spans nodes */
    struct smddp__ofi *ofi_p2p; /* its send/recv endpoint, driven by the p2p thread */
    smddp__watch_t *watch;      /* liveness of other nodes' ranks, when the comm spans nodes */
    /*
     * Set by an op that has network transfers in flight while it waits in
     * shared memory: every shm wait calls it between polls (and sleeps at
     * most 50 us at a time), so those transfers keep moving. Only the thread
     * running the op touches it.
     */
    smddp_status_t (*pump)(void *arg);
    void *pump_arg;
    /*
     * Scratch of the collectives across nodes (smddp__net_scratch), kept
     * between ops; only the thread running an op (exec_lock) touches it.
     */
    void *scratch[SMDDP_SCRATCH_SLOTS];
    size_t scratch_len[SMDDP_SCRATCH_SLOTS];
    struct smddp__cuda *cuda; /* CUDA IPC state, set up by the first CUDA collective */
    struct ncclComm *nccl;   /* NCCL communicator, created by the first collective routed to it */
    struct smddp__stage *stage_pool; /* idle pinned staging buffers, guarded by stage_lock */
    int cuda_nccl_everywhere; /* SMDDP_CUDA_NET=auto: -1 not asked yet, else whether NCCL
                               * loaded on every rank (agreed at the first CUDA collective) */
    pthread_mutex_t stage_lock;

    /* Scheduler: the queue, guarded by lock; exec_lock is held by whoever runs ops. */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    smddp__op_t *head, *tail;
    bool stopping;
    bool thread_started;
    pthread_t thread;
    pthread_mutex_t exec_lock;
    uint64_t next_seq;
    uint64_t *p2p_send_seq;  /* per peer, next message number */
    uint64_t *p2p_recv_seq;

    /* Abort: first failure wins; later ops fail fast with its message. */
    atomic_int aborted;
    smddp_status_t abort_status;
    char abort_msg[SMDDP_ERRMSG_MAX];

    pthread_mutex_t err_lock;
    char last_error[SMDDP_ERRMSG_MAX];

    /* Across nodes, aborts travel through the store (smddp__comm_fail). */
    _Atomic int64_t remote_abort_polled_ns;
};

/* Creation through a store reference (takes one reference on success). */
smddp_status_t smddp__comm_create(smddp__store_ref_t *store, int rank, int size,
                                  const char *prefix, int64_t timeout_ms,
                                  smddp_comm_t *out);
smddp_status_t smddp__comm_create_from_env(const smddp_comm_config_t *config,
                                           smddp_comm_t *out);
smddp_status_t smddp__comm_split(smddp_comm_t comm, int color, int key, smddp_comm_t *out);
void smddp__comm_abort(smddp_comm_t comm, smddp_status_t status, const char *msg);
/*
 * Aborts comm here too if a peer has aborted it, so that an operation that
 * is about to start fails as the peer's did rather than running alone.
 */
void smddp__comm_adopt_peer_abort(smddp_comm_t comm);
/*
 * Aborts comm on a failure found on this rank (not one it adopted) and,
 * across nodes, tells the other nodes through the store, so that ranks
 * waiting there for a rank that will never come fail at once with the
 * reason instead of at their deadline.
 */
void smddp__comm_fail(smddp_comm_t comm, smddp_status_t status, const char *msg);
/*
 * smddp_comm_abort: aborts comm and, the first time, tells the other nodes as
 * above, unless the store stays busy for half a second (then they fail at
 * their deadline): an abort never hangs on the store.
 */
void smddp__comm_abort_by_user(smddp_comm_t comm, const char *msg);
/*
 * For long waits across nodes: at most every half second, looks in the
 * store for an abort another node published, and adopts it; a store that
 * stopped answering (its host died) aborts comm too, naming waiting_for (the
 * comm rank this rank waits for, or -1). True if comm is now aborted.
 */
bool smddp__comm_poll_remote_abort(smddp_comm_t comm, int64_t now_ns, int waiting_for);
smddp_status_t smddp__comm_destroy(smddp_comm_t comm);
void smddp__comm_set_last_error(smddp_comm_t comm, const char *msg);

/*
 * True on libsmddp's own threads (progress, send/recv). CUDA code there
 * must not restore a "previous" device: such a thread has none, and setting
 * device 0 would create a context on GPU 0 in every process.
 */
extern _Thread_local bool smddp__library_thread;
/* This process's node name (SMDDP_HOSTNAME, else the host name). */
void smddp__node_name(char *out, size_t cap);

/* Store access, serialised per store. Errors carry the key in the message. */
smddp_status_t smddp__store_set(smddp__store_ref_t *s, const char *key, const void *v, size_t len);
smddp_status_t smddp__store_get(smddp__store_ref_t *s, const char *key, int64_t timeout_ms,
                                void **v, size_t *len);
smddp_status_t smddp__store_add(smddp__store_ref_t *s, const char *key, int64_t delta,
                                int64_t *result);
void smddp__store_unref(smddp__store_ref_t *s);

/* Scheduler (sched.c). */
smddp_status_t smddp__sched_start(smddp_comm_t comm);
void smddp__sched_stop(smddp_comm_t comm);
/* Enqueues op (or runs it inline when req is NULL and the comm is idle). */
smddp_status_t smddp__submit(smddp_comm_t comm, smddp__op_t *op, smddp_request_t *req);
smddp__op_t *smddp__op_new(smddp_comm_t comm, smddp__op_kind_t kind);
smddp_status_t smddp__request_wait(smddp__op_t *op, int64_t timeout_ms);
smddp_status_t smddp__request_test(smddp__op_t *op);
void smddp__request_unref(smddp__op_t *op);

/*
 * Marks op finished with st (message from the thread's last error): runs its
 * callback, then sets done and wakes waiters. The caller must hold no lock.
 */
void smddp__op_complete(smddp__op_t *op, smddp_status_t st);

/* send/recv engine (coll/p2p.c). */
smddp_status_t smddp__p2p_submit(smddp_comm_t comm, smddp__op_t *op);
void smddp__p2p_stop(smddp_comm_t comm);

/* Runs one operation on the calling thread (coll/coll.c). */
smddp_status_t smddp__op_execute(smddp_comm_t comm, smddp__op_t *op);

/*
 * The error for op when local rank peer_lr published a different operation
 * (desc points at a smddp__shm_desc_t) for the same sequence number.
 */
smddp_status_t smddp__mismatch_error(smddp_comm_t comm, const smddp__op_t *op, int peer_lr,
                                     const void *desc);

/* Describes an op for messages: "allreduce (seq 5, 1024 x float32, sum)". */
void smddp__op_describe(const smddp__op_t *op, char *buf, size_t cap);

#endif /* SMDDP_CORE_COMM_H */
