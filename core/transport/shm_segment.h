/*
 * The shared-memory segment's layout, private to the shared-memory
 * transport's files (shm.c: setup, waits and steps; shm_ring.c: the pair
 * rings of send/recv). See shm.c for the protocol.
 */
#ifndef SMDDP_CORE_TRANSPORT_SHM_SEGMENT_H
#define SMDDP_CORE_TRANSPORT_SHM_SEGMENT_H

#include "shm.h"

#define SHM_MAGIC 0x736d646470736d31ULL /* "smddpsm1" */
#define CACHELINE 128
#define SLICE_NS (50 * 1000 * 1000LL)
#define ABORT_WRITING 0x80000000u
#define AFFINITY_WORDS 12

typedef struct shm_header {
    uint64_t magic;
    uint32_t nranks;
    _Atomic uint32_t abort_flag; /* 0, or 1 + local rank that aborted */
    char abort_msg[SMDDP_ERRMSG_MAX];
} shm_header_t;

typedef struct shm_ctrl {
    _Atomic uint32_t ctr;
    _Atomic uint32_t sleepers;
    _Atomic int32_t pid;
    _Atomic uint32_t left; /* set when the rank destroyed its communicator */
    uint64_t cpus[AFFINITY_WORDS]; /* the rank's CPU affinity, CPUs 0-767 */
    /*
     * Cross-memory attach (shm_cma.c), written at setup: the address of a
     * word of this rank's that peers read to prove they can, the value they
     * must find there, then its verdict and whether it sees the local ranks
     * outnumber the CPUs (the size range is agreed at creation, param.h).
     */
    uint64_t cma_probe_addr, cma_probe_val;
    _Atomic uint32_t cma_verdict, cma_crowded;
    char pad[2 * CACHELINE - 16 - AFFINITY_WORDS * 8 - 24];
} shm_ctrl_t;
_Static_assert(sizeof(shm_ctrl_t) == 2 * CACHELINE, "a control block is two cache lines");

/*
 * Where the records of a step lie in a rank's metadata slot, after the op's
 * desc: the pool record (shm_pool.c) and the cross-memory-attach record
 * (shm_cma.c). Both are tagged with the op's seq in the high 32 bits and the
 * value of the post they precede in the low ones.
 */
#define META_POOL_RECORD 256
#define META_CMA_RECORD 320
static inline uint64_t shm_record_tag(uint64_t seq, uint32_t post)
{
    return (seq & 0x7fffffffu) << 32 | post;
}

/*
 * Writing a record: shm_record_open marks it as being rewritten, the fields
 * follow (volatile stores), and shm_record_close tags it; the post that
 * follows orders it before the peers' reads. Reading, after waiting for
 * that post: shm_record_is says whether it carries the tag, the fields are
 * read (volatile loads), and shm_record_still says whether it was not
 * rewritten meanwhile.
 */
#define SHM_RECORD_WRITING UINT64_MAX
static inline void shm_record_open(_Atomic uint64_t *tag)
{
    atomic_store_explicit(tag, SHM_RECORD_WRITING, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}
static inline void shm_record_close(_Atomic uint64_t *tag, uint64_t value)
{
    atomic_store_explicit(tag, value, memory_order_release);
}
static inline bool shm_record_is(_Atomic uint64_t *tag, uint64_t want)
{
    return atomic_load_explicit(tag, memory_order_acquire) == want;
}
static inline bool shm_record_still(_Atomic uint64_t *tag, uint64_t want)
{
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(tag, memory_order_relaxed) == want;
}

/* The op a setup step waits under: a barrier with the communicator's timeout. */
static inline smddp__op_t shm_setup_op(smddp_comm_t comm)
{
    smddp__op_t op = {.kind = SMDDP_OP_BARRIER, .comm = comm};
    op.deadline_ns = smddp__now_ns() + comm->timeout_ms * 1000000LL;
    return op;
}

/*
 * Where a local rank is (written by it alone): the op it runs, the last op
 * it finished, and when it arrived at each of its last ARRIVALS ops, indexed
 * by seq. An arrival is one word, so that it is written and read whole:
 * (1 + seq) modulo 2^16 in the top 16 bits, the monotonic clock's ns modulo
 * 2^48 (78 hours) below; 0 for none. Differences of arrivals are taken
 * modulo 2^48, so a wrap between two ranks' arrivals costs nothing.
 */
#define ARRIVALS 64
#define ARRIVAL_NS_BITS 48
typedef struct shm_progress {
    _Atomic uint64_t running;  /* 1 + seq of the op it runs; 0 between ops */
    _Atomic uint64_t finished; /* 1 + seq of the last op it finished; 0 none yet */
    _Atomic uint64_t failed;   /* 1 + seq of the op it failed in; 0 none */
    char pad[CACHELINE - 24];
    _Atomic uint64_t arrived[ARRIVALS];
    _Atomic uint32_t words[SMDDP_SHM_WORDS]; /* smddp__shm_words */
} shm_progress_t;

/*
 * Low-latency slots (shm_ll.c): two per local rank, used in turn by the
 * exchanges. A slot ends with its head, the op's desc and then the tag
 * that says which exchange the slot holds; the payload lies right before
 * the head, so that up to 16 bytes of it share the head's cache line.
 * Slots start on CACHELINE boundaries.
 */
#define SHM_LL_PAYLOAD_MAX 16384
typedef struct shm_ll_head {
    smddp__op_desc_t desc;
    uint64_t flags;       /* the caller's, ANDed over the ranks for it */
    _Atomic uint64_t tag; /* 1 + the exchange's number; 0: none yet */
} shm_ll_head_t;
/* The tag stays aligned, and so does a payload of any dtype right before the head. */
_Static_assert(sizeof(shm_ll_head_t) % 16 == 0, "the head keeps the slot's alignment");
#define SHM_LL_SLOT \
    ((SHM_LL_PAYLOAD_MAX + sizeof(shm_ll_head_t) + CACHELINE - 1) / CACHELINE * CACHELINE)

/* One direction of a pair ring: a byte count and a futex tick, each on its own line. */
typedef struct ring_side {
    _Atomic uint64_t bytes;
    _Atomic uint32_t tick;
    _Atomic uint32_t sleepers;
    char pad[CACHELINE - 16];
} ring_side_t;

typedef struct ring_ctrl {
    ring_side_t tail; /* written by the sender */
    ring_side_t head; /* written by the receiver */
} ring_ctrl_t;

struct smddp__shm {
    char name[64];
    void *base;
    size_t len;
    shm_header_t *hdr;
    shm_ctrl_t *ctrl;
    char *meta;
    shm_progress_t *progress;
    ring_ctrl_t *rings;
    char *ll;   /* the low-latency slots, [local rank][2] */
    char *data;
    char *ring_data;
    size_t half;      /* bytes in one staging half */
    size_t ring_size; /* bytes in one pair ring */
    uint32_t my_ctr;
    uint32_t free_at[2];
    int next_half;
    int64_t spin_ns;
    int64_t yield_ns;
    bool op_active;
    uint32_t op_base;
    smddp__op_desc_t desc;
    struct smddp__pool *pool; /* this rank's (shm_pool.c); NULL: pools off */
    char **peer_pool;         /* every local rank's pool, mapped here */
    char **pooled_in, **pooled_out; /* smddp__pool_peers' answers */
    size_t pool_size;
    char pool_name[64];       /* until unlinked */
    char pool_off[200];       /* why there are no pools; "" when there are */
    bool oversubscribed;      /* the local ranks outnumber the CPUs they may run on */
    uint64_t cma_probe;       /* the word peers read at setup (shm_cma.c) */
    bool cma_on;              /* every local rank reads every other by cross-memory attach */
    size_t cma_min, cma_max;  /* agreed: allgather bytes per rank read so */
    size_t ll_max;            /* agreed: the largest payload per rank the low-latency
                               * slots carry (shm_ll.c); 0: they are off */
    uint64_t ll_next;         /* the number of this rank's next low-latency exchange */
};

/* An unguessable /dev/shm name, "/smddp-PID-HEX". */
smddp_status_t smddp__shm_random_name(char *out, size_t cap);

/* shm_policy.c: this rank's CPU affinity into its control line (all CPUs if unknown). */
void smddp__shm_publish_affinity(shm_ctrl_t *ctrl);
/*
 * How long waits of the p local ranks spin and yield: the ranks share cores
 * when the union of their affinities has fewer CPUs than there are ranks
 * (ranks pinned one per core, as mpirun and the benchmarks do, do not).
 */
void smddp__shm_set_wait_policy(smddp__shm_t *s, int p);


/* Wakes the threads asleep on word (counted in sleepers). */
void smddp__shm_wake(_Atomic uint32_t *word, _Atomic uint32_t *sleepers);

/*
 * The one wait loop (shm.c): until ready(s, arg), spinning, then yielding,
 * then asleep on `word` (a futex woken by whoever changes it, when
 * `sleepers` counts a sleeper). `blame` is the local rank waited for, `what`
 * what it did not do, for the messages of a timeout or a peer's death.
 */
typedef bool (*shm_ready_fn)(smddp__shm_t *s, void *arg);
smddp_status_t smddp__shm_wait_until(smddp_comm_t comm, smddp__op_t *op, _Atomic uint32_t *word,
                                     _Atomic uint32_t *sleepers, shm_ready_fn ready, void *arg,
                                     int blame, const char *what);
/*
 * The timeout of a wait for every peer, naming each local rank for which
 * ready(s, lr, arg) is still false.
 */
smddp_status_t smddp__shm_timeout_all(smddp_comm_t comm, smddp__op_t *op,
                                      bool (*ready)(smddp__shm_t *s, int lr, const void *arg),
                                      const void *arg);

#endif /* SMDDP_CORE_TRANSPORT_SHM_SEGMENT_H */
