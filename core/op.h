/*
 * The operation's vocabulary: the op and its kinds, one table of what each
 * kind is (its traits), describing an op for messages, and the descriptor
 * ranks compare to find that they issued different operations. Below every
 * other file of the engine: it calls nothing but the logging helpers.
 */
#ifndef SMDDP_CORE_OP_H
#define SMDDP_CORE_OP_H

#include <stdatomic.h>

#include "common.h"
#include "dtype.h"
#include "reduce/reduce.h"

struct smddp_comm;
struct smddp__stage;

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

/* One operation; the public smddp_request_t points at it. */
typedef struct smddp_request {
    smddp__op_kind_t kind;
    uint64_t seq;            /* collective sequence number (p2p: per-peer message number) */
    const void *sendbuf;
    void *recvbuf;
    size_t count;            /* elements, as the API defines it for this kind */
    smddp_dtype_t dtype;
    smddp_dtype_t caller_dtype; /* fp16/bf16 while dtype is the fp32 they travel as (coll/net/) */
    smddp__reduce_spec_t spec;
    int root;                /* root, or peer for send/recv */
    int tag;
    smddp_mem_type_t mem_type; /* where the buffers live */
    void *stream;            /* cudaStream_t for SMDDP_MEM_CUDA */
    int64_t *v;              /* alltoallv: sendcounts, sdispls, recvcounts, rdispls (4 * size), owned */
    int64_t started_ns;      /* when execution started (smddp__now_ns()) */
    int64_t deadline_ns;     /* set when execution starts */
    int64_t timeout_ms;      /* > 0: its own timeout (attr); 0: the communicator's */
    uint32_t seq_span;       /* collective sequence numbers it takes (0 means 1) */
    struct smddp__stage *stage; /* CUDA across nodes: its host staging (cuda/stage.c) */
    bool on_stream;          /* staged, and all its stream work was enqueued at issue */

    smddp_complete_fn on_complete; /* optional, called before done is set */
    void *on_complete_arg;
    bool wait_now;           /* SMDDP_COLL_WAIT_NOW: the issuer waits for it at once */
    uint64_t trace_id;       /* its slot in the flight recorder (trace.h); 0: none */
    const char *path;        /* the route it took (static name; exec.c, p2p) */
    const char *algo;        /* the algorithm it ran, when the path has several (static name) */

    struct smddp_comm *comm;
    struct smddp_request *next;
    bool queued;             /* in comm's queue, not started (guarded by comm->lock) */
    atomic_int refs;         /* the caller's handle and the engine's */
    _Atomic uint32_t done;   /* 0 while running, 1 when finished (futex word) */
    _Atomic uint32_t sleepers; /* threads in FUTEX_WAIT on done */
    smddp_status_t status;
    /*
     * The failure's message (malloc'd, smddp__op_keep_error), NULL until it
     * fails; read with smddp__op_errmsg. Not inline: an op that succeeds
     * never touches it, and a smaller op is allocated and cleared faster.
     */
    char *errmsg;
} smddp__op_t;

/* Which ranks of an op use one of its buffers. */
typedef enum smddp__buf_use {
    SMDDP_BUF_UNSET = 0,  /* a row that forgot it (test_op checks every row) */
    SMDDP_BUF_NONE,       /* no rank */
    SMDDP_BUF_ALL,        /* every rank */
    SMDDP_BUF_ROOT,       /* the root alone */
    SMDDP_BUF_NONROOT,    /* every rank but the root */
    SMDDP_BUF_VARIABLE    /* per pair, from op->v (alltoallv) */
} smddp__buf_use_t;

/* How large one of an op's buffers is, in op->count elements. */
typedef enum smddp__buf_scale {
    SMDDP_SCALE_UNSET = 0,
    SMDDP_SCALE_COUNT,    /* count elements */
    SMDDP_SCALE_RANKS     /* count elements per rank of the communicator */
} smddp__buf_scale_t;

/*
 * What a kind of operation is. Every question the engine asks of a kind is
 * a field here, so that adding a kind means adding a row, not editing
 * switches across the engine.
 */
typedef struct smddp__op_traits {
    const char *name;          /* as the API names it, for messages */
    bool reduces;              /* combines its inputs with a reduction op (spec) */
    bool rooted;               /* op->root is a root rank */
    bool p2p;                  /* send/recv: op->root is the peer, not queued in order */
    bool empty_is_noop;        /* count 0: nothing moves, no rank waits for another */
    bool count_agreed;         /* every rank passes the same count (checked across ranks) */
    smddp__buf_use_t in_use;   /* who reads sendbuf */
    smddp__buf_scale_t in_scale;
    smddp__buf_use_t out_use;  /* who writes recvbuf */
    smddp__buf_scale_t out_scale;
} smddp__op_traits_t;

/* The row of kind (a row named "unknown" for an out-of-range kind). */
const smddp__op_traits_t *smddp__op_traits(smddp__op_kind_t kind);
const char *smddp__op_kind_name(smddp__op_kind_t kind);

/*
 * Bytes of op's input and output buffers on rank `rank` of a communicator
 * of `size` ranks (0 where this rank does not use the buffer).
 */
void smddp__op_bytes(const smddp__op_t *op, int size, int rank, size_t *in, size_t *out);

/* Describes an op for messages: "allreduce (seq 5, count 1024, float32, sum)". */
void smddp__op_describe(const smddp__op_t *op, char *buf, size_t cap);

/*
 * What ranks compare to find that they issued different operations at the
 * same point: published in shared memory (transport/shm.c) and carried by
 * network messages' headers (coll/net/ring.c).
 */
typedef struct smddp__op_desc {
    uint64_t seq;
    int32_t kind;  /* the kind; the memory type in the high 16 bits */
    int32_t dtype;
    int32_t redop; /* -1 for ops that do not reduce */
    int32_t root;  /* -1 for ops without a root */
    uint64_t count;
} smddp__op_desc_t;

void smddp__op_desc(const smddp__op_t *op, smddp__op_desc_t *out);

/*
 * The error for op (issued by comm rank `rank`) when comm rank `peer`
 * published theirs for the same sequence number: SMDDP_ERR_MISMATCH with
 * both operations named.
 */
smddp_status_t smddp__op_mismatch_error(const smddp__op_t *op, int rank, int peer,
                                        const smddp__op_desc_t *theirs);

#endif /* SMDDP_CORE_OP_H */
