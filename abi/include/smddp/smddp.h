/*
 * libsmddp public C API.
 *
 * Everything a program needs to run collectives with libsmddp: a communicator
 * created from a key-value store (the caller's, or a built-in TCP store
 * rendezvoused through the environment), non-blocking collectives that return
 * requests, and one status type with a last-error message.
 *
 * Conventions that hold for every function below unless it says otherwise:
 *  - The return value is a smddp_status_t; SMDDP_OK is 0, negative is an error.
 *  - On error, nothing was enqueued or allocated, output parameters are left
 *    unchanged, and smddp_get_last_error() describes what went wrong.
 *  - Buffers passed to a collective are owned by the caller and must stay
 *    valid and untouched until its request completes.
 *  - All functions are thread-safe; operations on one communicator are
 *    executed in the order they were issued, whichever thread issued them.
 */
#ifndef SMDDP_SMDDP_H
#define SMDDP_SMDDP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SMDDP_API __attribute__((visibility("default")))
#else
#define SMDDP_API
#endif

/** @name Version */
/**@{*/
#define SMDDP_VERSION_MAJOR 0
#define SMDDP_VERSION_MINOR 1
#define SMDDP_VERSION_PATCH 0
/** Encodes a version as one integer, e.g. 0.1.0 -> 100. */
#define SMDDP_VERSION_CODE(major, minor, patch) \
    ((major) * 10000 + (minor) * 100 + (patch))
/** The version of the header this program was compiled against. */
#define SMDDP_VERSION \
    SMDDP_VERSION_CODE(SMDDP_VERSION_MAJOR, SMDDP_VERSION_MINOR, SMDDP_VERSION_PATCH)
/**@}*/

/**
 * Status of every call. Zero is success, positive means "not finished yet",
 * negative is an error.
 */
typedef enum smddp_status {
    SMDDP_OK = 0,
    SMDDP_IN_PROGRESS = 1,          /**< request not complete yet */
    SMDDP_ERR_INVALID_ARGUMENT = -1,/**< bad argument; nothing was done (found only while a
                                          collective ran, e.g. a host buffer passed as CUDA
                                          memory: the communicator is aborted, as on any
                                          other failure, so that no peer waits for it) */
    SMDDP_ERR_NO_MEMORY = -2,       /**< an allocation failed */
    SMDDP_ERR_SYSTEM = -3,          /**< an OS call failed (message has errno text) */
    SMDDP_ERR_TIMEOUT = -4,         /**< a deadline passed; the communicator is aborted */
    SMDDP_ERR_PEER_LOST = -5,       /**< a peer died or left; the communicator is aborted */
    SMDDP_ERR_ABORTED = -6,         /**< the communicator was aborted earlier */
    SMDDP_ERR_MISMATCH = -7,        /**< ranks issued different operations */
    SMDDP_ERR_NOT_SUPPORTED = -8,   /**< valid request this build cannot serve */
    SMDDP_ERR_STORE = -9,           /**< the key-value store failed or sent garbage */
    SMDDP_ERR_INTERNAL = -10        /**< a bug in libsmddp; please report it */
} smddp_status_t;

/** Element types. */
typedef enum smddp_dtype {
    SMDDP_INT8 = 0,
    SMDDP_UINT8 = 1,
    SMDDP_INT32 = 2,
    SMDDP_INT64 = 3,
    SMDDP_FLOAT16 = 4,
    SMDDP_BFLOAT16 = 5,
    SMDDP_FLOAT32 = 6,
    SMDDP_FLOAT64 = 7,
    SMDDP_INT16 = 8,
    SMDDP_UINT16 = 9,
    SMDDP_UINT32 = 10,
    SMDDP_UINT64 = 11,
    SMDDP_DTYPE_COUNT
} smddp_dtype_t;

/**
 * Reduction operations. AVG divides the sum by the number of ranks;
 * PREMUL_SUM multiplies every input by smddp_coll_attr_t::premul_factor before
 * summing (floating-point types only); BAND/BOR/BXOR are for integer types
 * only. fp16 and bf16 accumulate in fp32 and round to nearest even once.
 */
typedef enum smddp_op {
    SMDDP_SUM = 0,
    SMDDP_PROD = 1,
    SMDDP_MIN = 2,
    SMDDP_MAX = 3,
    SMDDP_AVG = 4,
    SMDDP_PREMUL_SUM = 5,
    SMDDP_BAND = 6,
    SMDDP_BOR = 7,
    SMDDP_BXOR = 8,
    SMDDP_OP_COUNT
} smddp_op_t;

/** Where a buffer lives. */
typedef enum smddp_mem_type {
    SMDDP_MEM_HOST = 0,
    SMDDP_MEM_CUDA = 1
} smddp_mem_type_t;

/** Opaque communicator. */
typedef struct smddp_comm *smddp_comm_t;
/** Opaque handle to an operation in flight. */
typedef struct smddp_request *smddp_request_t;

/**
 * A key-value store the communicator rendezvouses through. The PyTorch shim
 * passes torch's c10d::Store through this table; C programs can use the
 * built-in TCP store via smddp_comm_create_from_env(). Callbacks may be
 * invoked from any thread, one at a time per communicator, and must return
 * SMDDP_OK or a negative status (set a message with smddp_set_store_error()).
 */
typedef struct smddp_store {
    size_t size;  /**< sizeof(smddp_store_t), for versioning */
    void *ctx;    /**< passed back to every callback */
    /** Store value (len bytes, copied) under key, replacing any earlier one. */
    smddp_status_t (*set)(void *ctx, const char *key, const void *value, size_t len);
    /**
     * Wait up to timeout_ms for key, then return a malloc()ed copy of its
     * value in *value (freed by libsmddp with free()) and its length in *len.
     * Returns SMDDP_ERR_TIMEOUT when the key did not appear in time.
     */
    smddp_status_t (*get)(void *ctx, const char *key, int64_t timeout_ms,
                          void **value, size_t *len);
    /** Atomically add delta to the integer at key (0 if absent); new value in *result. */
    smddp_status_t (*add)(void *ctx, const char *key, int64_t delta, int64_t *result);
    /** Called once when the last communicator using this store is destroyed; may be NULL. */
    void (*release)(void *ctx);
} smddp_store_t;

/** Initialiser for smddp_comm_config_t. */
#define SMDDP_COMM_CONFIG_INIT {sizeof(smddp_comm_config_t), NULL, -1}

/** Optional settings for communicator creation; pass NULL for defaults. */
typedef struct smddp_comm_config {
    size_t size;          /**< sizeof(smddp_comm_config_t) */
    const char *prefix;   /**< store key prefix, so several communicators can share one store (NULL: "smddp") */
    int64_t timeout_ms;   /**< deadline for every wait, > 0 (capped at 1e12 ms); < 0 takes SMDDP_TIMEOUT (default 30 min) */
} smddp_comm_config_t;

/**
 * Called once when an operation finishes, successfully or not, with its
 * status; arg is smddp_coll_attr_t.on_complete_arg. Not called when the call
 * that issues the operation refuses it (invalid arguments, a communicator
 * being destroyed: nothing was started); a blocking call (req NULL) whose
 * operation ran and failed calls it, then returns the same error. It runs on
 * whichever thread finished the operation (the communicator's progress or
 * send/recv thread, or a caller of smddp_wait() that ran it) before
 * smddp_test() and smddp_wait() report the request finished, and never while
 * that thread holds any of the communicator's locks. It may issue new
 * operations of the same communicator and wait for them: such a collective
 * on host memory runs before the call that issues it returns, right after
 * the one being completed and before any queued earlier, so that it takes
 * the same place in the order on every rank whichever thread ran the
 * callback (as torch's Future callbacks do with NCCL, which run at issue);
 * one on CUDA memory is queued in issue order. Meanwhile no other thread
 * starts an operation of the communicator, so a callback must not wait for
 * something that needs one to run other than through smddp_wait().
 */
typedef void (*smddp_complete_fn)(void *arg, smddp_status_t status);

/** Per-call options for collectives; pass NULL for host memory and defaults. */
typedef struct smddp_coll_attr {
    size_t size;              /**< sizeof(smddp_coll_attr_t) */
    smddp_mem_type_t mem_type;/**< where the buffers live */
    void *stream;             /**< cudaStream_t for SMDDP_MEM_CUDA; ignored for host */
    double premul_factor;     /**< the factor for SMDDP_PREMUL_SUM */
    smddp_complete_fn on_complete; /**< optional completion callback, or NULL */
    void *on_complete_arg;    /**< its argument */
    unsigned flags;           /**< SMDDP_COLL_* flags, or 0 */
    int64_t timeout_ms;       /**< > 0: this operation's own deadline, in ms from when it
                                   starts (on expiry it fails and the communicator is aborted,
                                   as with the communicator's timeout); 0: the communicator's */
} smddp_coll_attr_t;

/** Initialiser for smddp_coll_attr_t. */
#define SMDDP_COLL_ATTR_INIT {sizeof(smddp_coll_attr_t), SMDDP_MEM_HOST, NULL, 1.0, NULL, NULL, 0, 0}

/**
 * Flag for smddp_coll_attr_t::flags: the caller waits for this request as
 * soon as the call returns (a synchronous call made through a non-blocking
 * interface, such as torch's async_op=False). On host memory, when the
 * communicator has nothing queued and no thread is running one of its
 * operations, the call then runs the operation on the calling thread before
 * it returns, as a blocking call does, instead of handing it to the progress
 * thread; the request comes back finished, its status (success or the
 * operation's failure) given by smddp_test() and smddp_wait(). Otherwise the
 * flag changes nothing. Do not set it when the call must return before the
 * peers arrive.
 */
#define SMDDP_COLL_WAIT_NOW 0x1u

/** Colour for smddp_comm_split() meaning "this rank joins no new communicator". */
#define SMDDP_SPLIT_NOCOLOR (-1)

/** Timeout value meaning "wait until the communicator's own deadline". */
#define SMDDP_WAIT_DEFAULT (-1)

/* ------------------------------------------------------------------------ */
/** @name Version, status and errors */
/**@{*/

/**
 * Returns the library version as SMDDP_VERSION_CODE(major, minor, patch), so a
 * program can compare it with SMDDP_VERSION from the header it was built with.
 * Thread-safe.
 */
SMDDP_API int smddp_get_version(void);

/**
 * Returns a static, human-readable name for a status, e.g. "invalid argument".
 * Never NULL: unknown values give "unknown status". Thread-safe.
 */
SMDDP_API const char *smddp_status_string(smddp_status_t status);

/**
 * Returns the message of the last error, with context (operation, sequence
 * number, ranks involved).
 *
 * @param comm  a communicator to get its last error, or NULL to get the last
 *              error raised on the calling thread by any call.
 * @return a string owned by libsmddp; read it right after the failing call:
 *         a later call on that communicator or thread may replace it (a
 *         failing one always does, a successful one may clear it). Never
 *         NULL. Thread-safe, but the text for a communicator may change under
 *         concurrent errors.
 */
SMDDP_API const char *smddp_get_last_error(smddp_comm_t comm);

/**
 * Lets a store callback explain its failure: the message becomes part of the
 * error the communicator reports. Call from the callback's thread.
 */
SMDDP_API void smddp_set_store_error(const char *message);
/**@}*/

/* ------------------------------------------------------------------------ */
/** @name Communicators */
/**@{*/

/**
 * Creates a communicator of world_size ranks through a caller's store.
 * Collective: every rank must call it with the same world_size and prefix.
 *
 * @param store      the store table, copied; store->ctx must stay valid until
 *                   every communicator created from it (and split from those)
 *                   is destroyed, after which store->release (if set) is called.
 *                   If this call fails, release is never called: the caller
 *                   still owns the store.
 * @param rank       this process's rank, 0 <= rank < world_size
 * @param world_size number of ranks, >= 1
 * @param config     optional settings (NULL: defaults)
 * @param[out] comm  the new communicator
 * @return SMDDP_OK; SMDDP_ERR_INVALID_ARGUMENT for a bad rank or size;
 *         SMDDP_ERR_TIMEOUT if peers did not arrive before the deadline;
 *         SMDDP_ERR_STORE if the store failed.
 */
SMDDP_API smddp_status_t smddp_comm_create(const smddp_store_t *store, int rank,
                                           int world_size,
                                           const smddp_comm_config_t *config,
                                           smddp_comm_t *comm);

/**
 * Creates a communicator from the environment, rendezvousing through the
 * built-in TCP store (served by rank 0). Rank and size are read from
 * SMDDP_RANK/SMDDP_WORLD_SIZE, else torchrun's RANK/WORLD_SIZE, else Open MPI's
 * OMPI_COMM_WORLD_RANK/SIZE, else Slurm's SLURM_PROCID/SLURM_NTASKS. The
 * address is SMDDP_MASTER_ADDR/PORT, else MASTER_ADDR/PORT, else (for a
 * one-node job) 127.0.0.1 and a port derived from the launcher's job id.
 *
 * @param config     optional settings (NULL: defaults)
 * @param[out] comm  the new communicator
 * @return SMDDP_OK; SMDDP_ERR_INVALID_ARGUMENT when the environment names no
 *         rank, size or address (the message lists what was looked for).
 */
SMDDP_API smddp_status_t smddp_comm_create_from_env(const smddp_comm_config_t *config,
                                                    smddp_comm_t *comm);

/**
 * Splits a communicator into disjoint sub-communicators, one per colour, with
 * ranks ordered by (key, parent rank). Collective over the parent: every rank
 * calls it, in the same order relative to other operations.
 *
 * @param comm       the parent; it stays usable
 * @param color      >= 0, or SMDDP_SPLIT_NOCOLOR to join none (then *newcomm = NULL)
 * @param key        ordering key within the colour
 * @param[out] newcomm the sub-communicator, or NULL for SMDDP_SPLIT_NOCOLOR
 */
SMDDP_API smddp_status_t smddp_comm_split(smddp_comm_t comm, int color, int key,
                                          smddp_comm_t *newcomm);

/** What this rank knows of another rank of its communicator (smddp_comm_peer_state). */
typedef enum smddp_peer_state {
    SMDDP_PEER_ALIVE = 0,   /**< its process runs (a rank of this node), or none of the below */
    SMDDP_PEER_GONE = 1,    /**< its process ended without destroying its communicator */
    SMDDP_PEER_LEFT = 2,    /**< it destroyed its communicator */
    SMDDP_PEER_UNKNOWN = 3  /**< on another node, and not seen to die */
} smddp_peer_state_t;

/**
 * Whether rank `peer` of comm is still there, as this rank can tell: for a
 * rank of its node from the process itself; for a rank of another node,
 * SMDDP_PEER_GONE once this rank's liveness connection saw it die, else
 * SMDDP_PEER_UNKNOWN. Asking about a rank of another node makes this rank
 * watch it from then on, so asking again every few hundred milliseconds
 * learns of its death within seconds. Local; safe from any thread, also
 * after a failure. What survivors use to agree on whom to exclude before
 * smddp_comm_shrink.
 */
SMDDP_API smddp_status_t smddp_comm_peer_state(smddp_comm_t comm, int peer,
                                               smddp_peer_state_t *state);

/** smddp_comm_shrink flags: abort the parent's pending operations first. */
#define SMDDP_SHRINK_DEFAULT 0
#define SMDDP_SHRINK_ABORT 1

/**
 * Builds a communicator of the ranks of comm not in exclude, keeping their
 * order (rank r becomes r minus the excluded ranks below it), for example
 * after a peer died. Collective over the surviving ranks only: excluded
 * ranks do not call it. Works on a healthy communicator and on one that
 * failed; needs no new rendezvous (it uses comm's store under a fresh
 * prefix); waits at most comm's timeout. Fails with SMDDP_ERR_MISMATCH,
 * naming both lists, when survivors pass different ranks, and with
 * SMDDP_ERR_PEER_LOST, naming the rank, when a survivor dies before it
 * joined (a second death: excluding it too in a second shrink goes on), and
 * with SMDDP_ERR_TIMEOUT when one does not call it in time. SMDDP_SHRINK_ABORT first aborts comm, so that its
 * pending operations fail at once. comm stays valid (aborted or not): free
 * it with smddp_comm_destroy(). The store must outlive the dead ranks (with
 * the built-in store, it lives in rank 0's process).
 *
 * @param exclude   n_exclude distinct ranks of comm, not this one (NULL if 0)
 * @param flags     SMDDP_SHRINK_DEFAULT or SMDDP_SHRINK_ABORT
 * @param[out] newcomm the survivors' communicator
 */
SMDDP_API smddp_status_t smddp_comm_shrink(smddp_comm_t comm, const int *exclude, int n_exclude,
                                           int flags, smddp_comm_t *newcomm);

/**
 * Aborts a communicator: pending and later operations fail with
 * SMDDP_ERR_ABORTED, and peers blocked in a collective with this rank are
 * told and fail instead of waiting for their deadline. Does not free it; call
 * smddp_comm_destroy() afterwards. Safe to call from any thread, any number
 * of times.
 */
SMDDP_API smddp_status_t smddp_comm_abort(smddp_comm_t comm);

/**
 * Sets the deadline of every wait for operations that start after this call
 * (those already running keep theirs): timeout_ms > 0 (values above 1e12 ms,
 * about 31 years, are taken as 1e12), or < 0 for SMDDP_TIMEOUT.
 * Local; safe to call from any thread.
 */
SMDDP_API smddp_status_t smddp_comm_set_timeout(smddp_comm_t comm, int64_t timeout_ms);

/**
 * Allocates bytes (rounded up to 4 KiB, aligned to 4 KiB) of this rank's
 * pool: shared memory that the other ranks on its node have mapped, so that
 * collectives on comm whose buffers all lie in pools move the data in place
 * (allreduce: each rank reduces its block of every input and writes it into
 * every output; allgather: each rank copies every input into its output;
 * reduce-scatter: each rank reduces its block of every input into its
 * output), with no staging copies. Buffers outside pools work as always,
 * also mixed with pooled ones. The memory is not zeroed.
 *
 * The pool is SMDDP_SHM_POOL_SIZE bytes of address space per rank (default
 * 2 GiB, backed only as allocated; 0 turns pools off). A communicator has
 * pools when all of one node's ranks made one of the same size at creation;
 * otherwise none of them has (with a warning), and a communicator across
 * nodes never has. After the communicator fails, freed ranges are not
 * handed out again (a failed op's peers may still write them). Local;
 * thread-safe.
 *
 * @return SMDDP_OK; SMDDP_ERR_INVALID_ARGUMENT for bytes == 0 or a NULL
 *         argument; SMDDP_ERR_NOT_SUPPORTED when comm has no pool (the
 *         message says why);
 *         SMDDP_ERR_NO_MEMORY when the pool has no free range that large or
 *         /dev/shm cannot back it. Use ordinary memory then.
 */
SMDDP_API smddp_status_t smddp_mem_alloc(smddp_comm_t comm, size_t bytes, void **ptr);

/**
 * Returns memory from smddp_mem_alloc, from any thread, also after its
 * communicator was destroyed (the pool lives until its last allocation is
 * freed). NULL is a no-op.
 *
 * @return SMDDP_OK; SMDDP_ERR_INVALID_ARGUMENT when ptr is not a live
 *         allocation of smddp_mem_alloc.
 */
SMDDP_API smddp_status_t smddp_mem_free(void *ptr);

/**
 * Writes the communicator's flight recorder, its last SMDDP_TRACE_BUFFER
 * operations (default 2000), as JSON to path, or with path NULL to
 * SMDDP_TRACE_DIR/smddp-trace-<job>-<comm>-r<rank>.json, the file each rank
 * also writes when its communicator fails (job: SMDDP_JOB_ID, else
 * TORCHELASTIC_RUN_ID, else "job"; comm: the communicator's prefix, with
 * characters other than letters, digits, '.' and '-' made '_'). When
 * written is not NULL it receives the path (up to cap bytes). For each op: its sequence
 * number, kind, count, dtype, reduction, root or peer, memory type, path
 * and algorithm, when it was issued, started and finished (CLOCK_MONOTONIC
 * ns; the file also holds both clocks at the time of writing), and its state
 * (queued, running, done, failed) and status. The file appears whole or not
 * at all. Local; safe from any thread, while operations run and after the
 * communicator failed. Fails with SMDDP_ERR_INVALID_ARGUMENT when the
 * recorder is off (SMDDP_TRACE_BUFFER=0), SMDDP_ERR_SYSTEM when the file
 * cannot be written, SMDDP_ERR_INVALID_ARGUMENT also when path is NULL and
 * SMDDP_TRACE_DIR is not set.
 */
SMDDP_API smddp_status_t smddp_comm_dump_trace(smddp_comm_t comm, const char *path, char *written,
                                               size_t cap);

/**
 * Waits for operations still queued on the communicator (each up to its
 * deadline), then frees it and every resource it holds. Requests not freed
 * yet stay valid until smddp_request_free(). comm may be NULL (no-op).
 * Not collective, but ranks that leave early make peers' later collectives
 * fail with SMDDP_ERR_PEER_LOST. Must not race with other calls on comm.
 */
SMDDP_API smddp_status_t smddp_comm_destroy(smddp_comm_t comm);

/**
 * SMDDP_OK while the communicator can still run operations; once it has
 * failed, the status of its first failure (SMDDP_ERR_TIMEOUT,
 * SMDDP_ERR_PEER_LOST, SMDDP_ERR_MISMATCH, SMDDP_ERR_ABORTED for an abort by
 * the application or adopted from a peer, ...), whose message
 * smddp_get_last_error(comm) gives. SMDDP_ERR_INVALID_ARGUMENT for a NULL
 * comm. Local; safe from any thread. With SMDDP_CUDA_SYNC=kernel, a
 * collective kernel that gave up after the call returned (its stream then
 * finishes, with an invalid result) fails the communicator here, or at its
 * next CUDA collective.
 */
SMDDP_API smddp_status_t smddp_comm_status(smddp_comm_t comm);

/**
 * Straggler telemetry (smddp_comm_get_stats). Each rank records when it
 * arrived at each collective (when the op started running on it: issued,
 * and every op before it on the communicator done). A rank's lateness at a
 * collective is its arrival minus the earliest arrival of any rank; the
 * skew, the last arrival minus the first. The ranks of a node share one
 * monotonic clock. Across nodes (SMDDP_STRAGGLER_NODES=1, the default),
 * each node's clock offset to the clock of rank 0's node is measured when
 * the communicator is created (within half the shortest round trip through
 * the store: clock_error_ns), every node's first rank sends its node's
 * arrivals to rank 0's node every 100 ms, and every rank reads the summary
 * made there; until the first one, the stats cover this rank's node.
 *
 * Versioned: set struct_size to sizeof(smddp_comm_stats_t) before the call;
 * the library fills the fields that fit and sets version. Fields are only
 * ever added at the end.
 */
#define SMDDP_COMM_STATS_VERSION 2
typedef struct smddp_comm_stats {
    uint32_t struct_size;   /**< in: sizeof(smddp_comm_stats_t) as the caller knows it */
    uint32_t version;       /**< out: SMDDP_COMM_STATS_VERSION of the library */
    uint64_t ops;           /**< collectives whose arrivals were compared */
    int32_t slowest_rank;   /**< the covered rank with the most lateness; -1 before any op */
    int32_t ranks_covered;  /**< ranks whose arrivals are compared (its node's, or all) */
    int64_t skew_p50_ns;    /**< skew percentiles over the last 1024 compared ops */
    int64_t skew_p99_ns;
    int64_t skew_max_ns;    /**< over all compared ops */
    int64_t clock_error_ns; /**< bound on the error between compared clocks; 0: one clock */
    int64_t skew_sum_ns;    /**< summed over all compared ops (with ops: the mean skew) */
    /*
     * Version 2: what the communicator costs this rank. Store calls are
     * counted on the store this communicator shares with those split from
     * it, from the start of its creation; a get is one call however long it
     * waits.
     */
    int64_t create_ns;          /**< how long its creation took on this rank */
    uint64_t create_store_ops;  /**< store calls (set, get, add) made during its creation */
    uint64_t create_store_bytes; /**< the keys and values they sent and received */
    uint64_t store_ops;         /**< store calls since its creation began (creation included) */
    uint64_t store_bytes;       /**< their keys and values */
    int32_t connections;        /**< network peers this rank has resolved (a connection each,
                                     opened by the first message) plus liveness connections */
    int32_t threads;            /**< threads the communicator has started */
} smddp_comm_stats_t;

/**
 * The straggler telemetry so far, in *stats, and in late_ns (may be NULL;
 * else n entries, n >= 0) each comm rank's summed lateness in ns, -1 for
 * ranks that are not covered. Within a node local, across nodes one store
 * read at most every 50 ms; safe from any thread, also after the
 * communicator failed. SMDDP_ERR_INVALID_ARGUMENT for a NULL comm or stats,
 * a struct_size below 8, or late_ns NULL with n > 0.
 */
SMDDP_API smddp_status_t smddp_comm_get_stats(smddp_comm_t comm, smddp_comm_stats_t *stats,
                                              int64_t *late_ns, int n);

/** This rank's index in comm, in *rank. */
SMDDP_API smddp_status_t smddp_comm_rank(smddp_comm_t comm, int *rank);
/** The number of ranks in comm, in *size. */
SMDDP_API smddp_status_t smddp_comm_size(smddp_comm_t comm, int *size);
/** This rank's index among the ranks of comm on its node, in *local_rank. */
SMDDP_API smddp_status_t smddp_comm_local_rank(smddp_comm_t comm, int *local_rank);
/** The number of ranks of comm on this rank's node, in *local_size. */
SMDDP_API smddp_status_t smddp_comm_local_size(smddp_comm_t comm, int *local_size);
/** The number of distinct nodes spanned by comm, in *node_count. */
SMDDP_API smddp_status_t smddp_comm_node_count(smddp_comm_t comm, int *node_count);
/**@}*/

/* ------------------------------------------------------------------------ */
/** @name Requests */
/**@{*/

/**
 * Checks a request without blocking.
 * @return SMDDP_OK when it completed successfully, SMDDP_IN_PROGRESS while it
 *         runs, or the error it failed with (message in smddp_get_last_error).
 */
SMDDP_API smddp_status_t smddp_test(smddp_request_t req);

/**
 * Waits for a request to complete. With SMDDP_WAIT_DEFAULT, a request whose
 * collective has not started yet is run on the calling thread (with any
 * queued before it, in order) instead of waiting for the progress thread to
 * reach it.
 * @param timeout_ms  how long to wait: >= 0 milliseconds, or
 *                    SMDDP_WAIT_DEFAULT for the communicator's deadline.
 *                    Running out of a caller's timeout returns
 *                    SMDDP_IN_PROGRESS and leaves the operation running;
 *                    running out of the communicator's deadline fails the
 *                    operation and aborts the communicator.
 * @return as smddp_test().
 */
SMDDP_API smddp_status_t smddp_wait(smddp_request_t req, int64_t timeout_ms);

/**
 * Releases a request. If it is still running, the operation carries on and
 * its resources are freed when it completes. req may be NULL (no-op).
 */
SMDDP_API void smddp_request_free(smddp_request_t req);

/**
 * The rank a completed receive got its message from: for a receive from
 * SMDDP_ANY_SOURCE, the rank it was matched with (SMDDP_ANY_SOURCE if it
 * failed before it was matched). Fails with
 * SMDDP_ERR_INVALID_ARGUMENT for a request that is not a receive, and
 * returns SMDDP_IN_PROGRESS (leaving *rank alone) while it has not completed.
 */
SMDDP_API smddp_status_t smddp_request_source(smddp_request_t req, int *rank);

/**
 * For a collective on CUDA memory: 1 when everything it does to the GPU is
 * already on its stream, so work the caller enqueues next is ordered after
 * it without smddp_wait() (a collective across nodes staged through host
 * memory: the stream waits for the host's result on the GPU; a send of CUDA
 * memory: its copy to the host is on the stream). 0 otherwise: the operation
 * reaches the stream when it runs, and smddp_wait() (or smddp_test()
 * reporting it done) tells when that happened. So on one stream, wait for
 * such a request before issuing a staged one that depends on its result.
 */
SMDDP_API int smddp_request_enqueued(smddp_request_t req);
/**@}*/

/* ------------------------------------------------------------------------ */
/**
 * @name Collectives
 *
 * Every collective is non-blocking: it validates its arguments, enqueues the
 * operation and returns a request in *req. Passing req == NULL makes the call
 * blocking: it returns once the operation has completed, with its status.
 * Counts are in elements and must be >= 0; an in-place call passes the same
 * pointer as send and receive buffer. attr may be NULL (host memory).
 * Collectives must be called by every rank of comm in the same order with
 * matching count, dtype, op and root.
 */
/**@{*/

/** recvbuf[i] = op over ranks of sendbuf[i], on every rank; count elements each. */
SMDDP_API smddp_status_t smddp_allreduce(smddp_comm_t comm, const void *sendbuf,
                                         void *recvbuf, int64_t count,
                                         smddp_dtype_t dtype, smddp_op_t op,
                                         const smddp_coll_attr_t *attr,
                                         smddp_request_t *req);

/** Like smddp_allreduce, but only root's recvbuf is written (others may pass NULL). */
SMDDP_API smddp_status_t smddp_reduce(smddp_comm_t comm, const void *sendbuf,
                                      void *recvbuf, int64_t count,
                                      smddp_dtype_t dtype, smddp_op_t op, int root,
                                      const smddp_coll_attr_t *attr,
                                      smddp_request_t *req);

/** Copies root's buf (count elements) into buf on every other rank. */
SMDDP_API smddp_status_t smddp_broadcast(smddp_comm_t comm, void *buf, int64_t count,
                                         smddp_dtype_t dtype, int root,
                                         const smddp_coll_attr_t *attr,
                                         smddp_request_t *req);

/**
 * recvbuf (size * sendcount elements) receives every rank's sendbuf in rank
 * order. In place: sendbuf == recvbuf + rank * sendcount elements.
 */
SMDDP_API smddp_status_t smddp_allgather(smddp_comm_t comm, const void *sendbuf,
                                         void *recvbuf, int64_t sendcount,
                                         smddp_dtype_t dtype,
                                         const smddp_coll_attr_t *attr,
                                         smddp_request_t *req);

/**
 * sendbuf holds size blocks of recvcount elements; rank r's recvbuf receives
 * the reduction of block r over all ranks. In place: recvbuf == sendbuf + rank
 * * recvcount elements.
 */
SMDDP_API smddp_status_t smddp_reduce_scatter(smddp_comm_t comm, const void *sendbuf,
                                              void *recvbuf, int64_t recvcount,
                                              smddp_dtype_t dtype, smddp_op_t op,
                                              const smddp_coll_attr_t *attr,
                                              smddp_request_t *req);

/** Block j (count elements) of sendbuf goes to rank j, landing in its block i for sender i. */
SMDDP_API smddp_status_t smddp_alltoall(smddp_comm_t comm, const void *sendbuf,
                                        void *recvbuf, int64_t count,
                                        smddp_dtype_t dtype,
                                        const smddp_coll_attr_t *attr,
                                        smddp_request_t *req);

/**
 * All-to-all with per-rank counts and displacements (in elements). What
 * rank i sends to j (sendcounts[j] on i) must equal recvcounts[i] on j, or
 * every rank involved fails with SMDDP_ERR_MISMATCH. The four arrays have
 * size entries and are copied before the call returns. Not in place.
 */
SMDDP_API smddp_status_t smddp_alltoallv(smddp_comm_t comm, const void *sendbuf,
                                         const int64_t *sendcounts,
                                         const int64_t *sdispls, void *recvbuf,
                                         const int64_t *recvcounts,
                                         const int64_t *rdispls, smddp_dtype_t dtype,
                                         const smddp_coll_attr_t *attr,
                                         smddp_request_t *req);

/** Root's recvbuf (size * sendcount elements) receives every rank's sendbuf in rank order. */
SMDDP_API smddp_status_t smddp_gather(smddp_comm_t comm, const void *sendbuf,
                                      void *recvbuf, int64_t sendcount,
                                      smddp_dtype_t dtype, int root,
                                      const smddp_coll_attr_t *attr,
                                      smddp_request_t *req);

/** Block r (recvcount elements) of root's sendbuf lands in rank r's recvbuf. */
SMDDP_API smddp_status_t smddp_scatter(smddp_comm_t comm, const void *sendbuf,
                                       void *recvbuf, int64_t recvcount,
                                       smddp_dtype_t dtype, int root,
                                       const smddp_coll_attr_t *attr,
                                       smddp_request_t *req);

/** Completes once every rank has entered it. attr may be NULL (only its callback is used). */
SMDDP_API smddp_status_t smddp_barrier(smddp_comm_t comm, const smddp_coll_attr_t *attr,
                                       smddp_request_t *req);

/**
 * Sends count elements to rank peer with a tag >= 0. Messages are matched by
 * (source, tag), as in MPI: a receive takes the oldest message from its
 * source with its tag, so messages with one tag arrive in the order they were
 * sent, whatever the order of other tags. The receiver's count must equal
 * the sender's, else the receive fails with SMDDP_ERR_MISMATCH and the
 * message is discarded (the send has completed).
 * Sends and receives progress independently of collectives and of each
 * other, so exchanges such as "irecv from left, isend to right" on every rank
 * do not deadlock. Small messages complete without waiting for the receiver.
 *
 * On CUDA memory (attr->mem_type SMDDP_MEM_CUDA) messages go through pinned
 * host memory: a send copies buf to the host on attr->stream when it is
 * issued (so it sends what the stream's earlier work left there) and moves
 * it once that copy is done; a receive enqueues the copy into buf on
 * attr->stream when the message is in, before the request reports done, so
 * work enqueued on that stream after smddp_wait() sees the message.
 */
SMDDP_API smddp_status_t smddp_send(smddp_comm_t comm, const void *buf, int64_t count,
                                    smddp_dtype_t dtype, int peer, int tag,
                                    const smddp_coll_attr_t *attr, smddp_request_t *req);

/** smddp_recv()'s peer for a receive that takes the next message of any rank. */
#define SMDDP_ANY_SOURCE (-1)

/**
 * Receives count elements from rank peer with a tag >= 0; see smddp_send().
 * With peer SMDDP_ANY_SOURCE it takes a message with its tag from whichever
 * rank sends one first (smddp_request_source() tells which), except one a
 * directed receive is already waiting for; receives from any rank with one
 * tag are matched in the order they were posted.
 */
SMDDP_API smddp_status_t smddp_recv(smddp_comm_t comm, void *buf, int64_t count,
                                    smddp_dtype_t dtype, int peer, int tag,
                                    const smddp_coll_attr_t *attr, smddp_request_t *req);
/**@}*/

/* ------------------------------------------------------------------------ */
/** @name Helpers */
/**@{*/

/** Size in bytes of one element of dtype, or 0 for an unknown dtype. */
SMDDP_API size_t smddp_dtype_size(smddp_dtype_t dtype);
/** Static name of a dtype ("float32"), or "unknown". */
SMDDP_API const char *smddp_dtype_name(smddp_dtype_t dtype);
/** Static name of an op ("sum"), or "unknown". */
SMDDP_API const char *smddp_op_name(smddp_op_t op);

/**
 * Prints every SMDDP_* setting with its type, default, current value and
 * description to the stream (a FILE *), one per line. Used by smddp_info.
 */
SMDDP_API void smddp_print_settings(void *file);

/**
 * Prints, to the stream (a FILE *), which algorithm each collective runs at
 * each size for a communicator of local_ranks ranks on each of nodes nodes
 * under this process's settings (SMDDP_ALGO's rules first), and every
 * algorithm this build has. Used by smddp_info.
 */
SMDDP_API void smddp_print_selection(void *file, int local_ranks, int nodes);
/**@}*/

#ifdef __cplusplus
}
#endif

#endif /* SMDDP_SMDDP_H */
