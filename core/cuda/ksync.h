/*
 * How the CUDA collective kernels (ipc_kernels.cu) synchronise among the
 * ranks of a node without the host, written once for the GPU and for a CPU
 * model of it (test/unit/test_ksync.c, where "blocks" are threads and
 * "device memory" is host memory).
 *
 * Each local rank owns a region of device memory that every peer maps
 * through CUDA IPC: flags written by peers, a launch counter per block, and
 * a scratch area the rank copies its input into. A launch is a grid of
 * blocks; block b of every rank pairs with block b of every other rank:
 *
 *   e = ++epoch[b]                          (the launch's number for b)
 *   copy this rank's input into its scratch, vectors owned by b
 *   barrier(stage 0, e)                     every peer's block b copied in
 *   read peers' scratch, vectors owned by b (two-shot: reduce this rank's
 *     piece in place, barrier(stage 1, e), read peers' reduced pieces)
 *   barrier(last stage, e)                  every peer's block b done reading
 *
 * A barrier: each block writes e into flag[stage][b][me] of every rank's
 * region (release, system scope), then waits until its own
 * flag[stage][b][q] has reached e for every q (acquire). Every rank runs
 * the same launches with the same grids, so epoch[b] agrees across ranks and
 * only grows; flags are never reset, and comparisons survive wrap-around.
 *
 * A rank's input may also be read in place, without the copy: a buffer
 * registered once (kernel_sync.c exports its allocation through CUDA IPC
 * and every peer maps it, "slot" s of the rank's registrations). Before
 * barrier 0 each block writes where its rank's data is for this launch into
 * src[b] of its own region: 0 for the scratch, else s + 1 and the offset
 * in slot s; after barrier 0 a reader takes src[b] of every peer and,
 * for a slot, the address where it mapped that slot itself (its own
 * region's peer_base, written by its host with a copy that completed
 * before it told the peers). A rank names a slot only once every peer has
 * mapped it, and slots are never reused, so peer_base entries never change
 * while a launch may read them. The program must keep a registered
 * allocation until every rank destroyed the communicator (peers keep it
 * mapped, and a captured launch keeps naming the slot).
 *
 * The vectors block b owns are those of a grid-stride loop (16-byte vector
 * i belongs to block (i / lanes) % blocks), the same on every rank and in
 * every phase of a launch, so block b's barrier covers everything block b
 * reads. The last barrier lets the next launch overwrite the scratch: a
 * rank's kernel ends only once every peer has finished reading from it.
 *
 * Waits are bounded: every SMDDP_KS_CHECK_EVERY polls a wait reads the
 * host's abort word and the clock, and gives up on abort or after
 * timeout_ns. Giving up stops the rank's other blocks and later launches
 * (given_up), and its peers' too (it writes their given_up), and records
 * why in the control block (host memory mapped into the device), which the
 * host reads before its next collective and fails the communicator.
 */
#ifndef SMDDP_CORE_CUDA_KSYNC_H
#define SMDDP_CORE_CUDA_KSYNC_H

#include <stddef.h>
#include <stdint.h>

#define SMDDP_KS_MAX_RANKS 16
#define SMDDP_KS_MAX_BLOCKS 1024
#define SMDDP_KS_STAGES 3
#define SMDDP_KS_VEC 16 /* bytes per vector, the unit of ownership */
#define SMDDP_KS_CHECK_EVERY 256
#define SMDDP_KS_SLOTS 256 /* buffers a rank registers, at most (later ones are copied in) */

/* Why a kernel gave up (smddp__ks_control_t::failed). */
enum {
    SMDDP_KS_OK = 0,
    SMDDP_KS_TIMEOUT = 1, /* a peer did not arrive within timeout_ns */
    SMDDP_KS_ABORTED = 2, /* the host's abort word */
    SMDDP_KS_PEER = 3,    /* a peer gave up (for one of the reasons above) and said so */
};

/* given_up as a peer writes it: this bit and the peer's local rank. */
#define SMDDP_KS_POISON 0x80000000u

/* Where a rank's data for block b of a launch is: its scratch (slot 0), or registered slot - 1. */
typedef struct smddp__ks_src {
    uint64_t slot;
    uint64_t off; /* bytes from the start of the slot's allocation */
} smddp__ks_src_t;

/* The head of a rank's region; the scratch follows at SMDDP_KS_SCRATCH_OFFSET. */
typedef struct smddp__ks_region {
    uint32_t flag[SMDDP_KS_STAGES][SMDDP_KS_MAX_BLOCKS][SMDDP_KS_MAX_RANKS]; /* written by peers */
    uint32_t epoch[SMDDP_KS_MAX_BLOCKS]; /* this rank's own: launches block b has begun */
    smddp__ks_src_t src[SMDDP_KS_MAX_BLOCKS]; /* this rank's data in its launch, by block */
    /* Where this rank mapped peer q's registered slot s (its host writes it before saying so). */
    uint64_t peer_base[SMDDP_KS_MAX_RANKS][SMDDP_KS_SLOTS];
    /*
     * Nonzero once this rank's kernels must stop: claimed by the first of its
     * blocks to give up, or written by a peer that gave up (SMDDP_KS_POISON).
     * From then on every launch ends at once, touching neither scratch nor
     * flags, so a slower peer still reading this scratch is not misled. An
     * input read in place is the program's: once this rank's kernel ended,
     * its stream may overwrite it under a slower peer's reads; that peer
     * was poisoned first, and its next barrier fails the launch.
     */
    uint32_t given_up;
    uint32_t reported; /* claimed by the block that writes the control block */
} smddp__ks_region_t;

#define SMDDP_KS_SCRATCH_OFFSET ((sizeof(smddp__ks_region_t) + 255) / 256 * 256)

/*
 * Per rank, in host memory the device sees: the host's abort, the kernels'
 * verdict. Only plain loads and stores cross: atomics on mapped host memory
 * are not atomic over PCIe, so blocks race for given_up in device memory.
 */
typedef struct smddp__ks_control {
    uint32_t abort;  /* nonzero: stop waiting (the communicator was aborted) */
    uint32_t failed; /* SMDDP_KS_*, written last by the block that gave up first */
    uint32_t stage, block, peer, epoch; /* where that block was waiting */
} smddp__ks_control_t;

/* What every launch of a communicator shares (passed by value to kernels). */
typedef struct smddp__ks_comm {
    smddp__ks_region_t *region[SMDDP_KS_MAX_RANKS]; /* every local rank's, as this rank maps it */
    smddp__ks_control_t *control;                   /* this rank's */
    uint64_t timeout_ns;
    int32_t rank, nranks; /* local */
    int32_t max_blocks;   /* a launch's most blocks: no more than every rank's GPU runs at once */
    int32_t pad;
} smddp__ks_comm_t;

typedef enum smddp__ks_kind {
    SMDDP_KS_ALLREDUCE_ONESHOT, /* every rank reduces every rank's copy */
    SMDDP_KS_ALLREDUCE_TWOSHOT, /* each reduces its piece, then every rank gathers the pieces */
    SMDDP_KS_REDUCE_SCATTER,    /* row q of every rank's input, reduced, to rank q */
    SMDDP_KS_ALLGATHER,         /* every rank's input to row q of every output */
} smddp__ks_kind_t;

/*
 * One launch: bytes of this rank's input (per row for a reduce-scatter) at
 * in; rows pitch bytes apart (the reduce-scatter's input rows, the
 * allgather's output rows). The scratch must hold the launch's copy-in:
 * bytes rounded up to 16, times nranks for a reduce-scatter.
 */
typedef struct smddp__ks_job {
    smddp__ks_kind_t kind;
    const void *in;
    void *out;
    size_t bytes;
    size_t pitch;
    /*
     * 0: in is copied into the scratch. s + 1: in lies in this rank's
     * registered slot s, slot_off bytes from its start; peers read it there
     * and nothing is copied in. The host picks this only where in, bytes and
     * pitch are multiples of 16 and out is not written where peers read in
     * before they are done.
     */
    uint64_t slot;
    uint64_t slot_off;
} smddp__ks_job_t;

/* Bytes of scratch job needs: its bytes rounded up to a vector, per row (also when registered). */
static inline size_t smddp__ks_scratch_need(const smddp__ks_job_t *job, int nranks)
{
    size_t row = (job->bytes + SMDDP_KS_VEC - 1) / SMDDP_KS_VEC * SMDDP_KS_VEC;
    return job->kind == SMDDP_KS_REDUCE_SCATTER ? row * (size_t)nranks : row;
}

/* ---- the primitives, for the GPU and for the CPU model --------------------- */

#ifdef __CUDACC__
#define SMDDP_KS_FN static __device__ __forceinline__
#define SMDDP_KS_HD static __host__ __device__ __forceinline__

SMDDP_KS_FN uint32_t smddp__ks_load_acquire(const uint32_t *p)
{
    uint32_t v;
#if __CUDA_ARCH__ >= 700
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
    v = *(const volatile uint32_t *)p;
    __threadfence_system();
#endif
    return v;
}

SMDDP_KS_FN void smddp__ks_store_release(uint32_t *p, uint32_t v)
{
#if __CUDA_ARCH__ >= 700
    __threadfence_system();
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
    __threadfence_system();
    *(volatile uint32_t *)p = v;
#endif
}

SMDDP_KS_FN uint32_t smddp__ks_load_relaxed(const uint32_t *p)
{
    return *(const volatile uint32_t *)p;
}

/* After an acquire: src[] written by a peer's kernel, peer_base by this rank's host (a copy). */
SMDDP_KS_FN uint64_t smddp__ks_load64(const uint64_t *p)
{
    uint64_t v;
#if __CUDA_ARCH__ >= 700
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#else
    v = *(const volatile uint64_t *)p;
#endif
    return v;
}

/* given_up is also written by peers (system scope). */
SMDDP_KS_FN bool smddp__ks_claim(uint32_t *p, uint32_t v)
{
    return atomicCAS_system((unsigned int *)p, 0u, v) == 0u;
}

SMDDP_KS_FN uint64_t smddp__ks_now_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

SMDDP_KS_FN void smddp__ks_pause(void)
{
#if __CUDA_ARCH__ >= 700
    __nanosleep(64);
#endif
}
#else /* the CPU model */
#include <sched.h>
#include <stdbool.h>
#include <time.h>
#define SMDDP_KS_FN static inline
#define SMDDP_KS_HD static inline

SMDDP_KS_FN uint32_t smddp__ks_load_acquire(const uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

SMDDP_KS_FN void smddp__ks_store_release(uint32_t *p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

SMDDP_KS_FN uint32_t smddp__ks_load_relaxed(const uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

SMDDP_KS_FN uint64_t smddp__ks_load64(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

SMDDP_KS_FN bool smddp__ks_claim(uint32_t *p, uint32_t v)
{
    uint32_t zero = 0;
    return __atomic_compare_exchange_n(p, &zero, v, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

SMDDP_KS_FN uint64_t smddp__ks_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The model's "blocks" are threads, more of them than CPUs: let the others run. */
SMDDP_KS_FN void smddp__ks_pause(void)
{
    sched_yield();
}
#endif

/* ---- the protocol ---------------------------------------------------------- */

/* The scratch of local rank q, as this rank maps it. */
SMDDP_KS_FN char *smddp__ks_scratch(const smddp__ks_comm_t *c, int q)
{
    return (char *)c->region[q] + SMDDP_KS_SCRATCH_OFFSET;
}

/* Tells the host (once per rank) why its kernels stopped; returns code. */
SMDDP_KS_FN uint32_t smddp__ks_report(const smddp__ks_comm_t *c, uint32_t code, int stage, int b,
                                      int q, uint32_t e)
{
    smddp__ks_control_t *ctl = c->control;
    if (smddp__ks_claim(&c->region[c->rank]->reported, 1u)) {
        ctl->stage = (uint32_t)stage;
        ctl->block = (uint32_t)b;
        ctl->peer = (uint32_t)q;
        ctl->epoch = e;
        smddp__ks_store_release(&ctl->failed, code);
    }
    return code;
}

/*
 * Gives up: this rank's kernels stop, and so do its peers' (their waits
 * would otherwise last their own timeouts, or forever); returns code.
 */
SMDDP_KS_FN uint32_t smddp__ks_fail(const smddp__ks_comm_t *c, uint32_t code, int stage, int b,
                                    int q, uint32_t e)
{
    if (smddp__ks_claim(&c->region[c->rank]->given_up, code))
        for (int p = 0; p < c->nranks; p++)
            if (p != c->rank)
                smddp__ks_store_release(&c->region[p]->given_up,
                                        SMDDP_KS_POISON | (uint32_t)c->rank);
    return smddp__ks_report(c, code, stage, b, q, e);
}

/* Whether this rank's kernels must stop; a peer's word is reported to the host. */
SMDDP_KS_FN bool smddp__ks_stopped(const smddp__ks_comm_t *c, int stage, int b, uint32_t e)
{
    uint32_t g = smddp__ks_load_relaxed(&c->region[c->rank]->given_up);
    if (!g) return false;
    if (g & SMDDP_KS_POISON)
        smddp__ks_report(c, SMDDP_KS_PEER, stage, b, (int)(g & 0xffu), e);
    return true;
}

/*
 * Begins block b's part of a launch: its number in *e, or false if this
 * rank's kernels have stopped (then the block must return at once).
 */
SMDDP_KS_FN bool smddp__ks_begin(const smddp__ks_comm_t *c, int b, uint32_t *e)
{
    if (smddp__ks_stopped(c, 0, b, 0)) return false;
    uint32_t *ep = &c->region[c->rank]->epoch[b];
    *e = *ep + 1;
    *ep = *e;
    return true;
}

/*
 * One lane's part of block b's barrier at stage for launch e: lane signals
 * ranks lane, lane + lanes, ... and then waits for the same ranks. The
 * caller synchronises its block's lanes before (so the block's writes
 * precede every signal) and after (so no lane reads before every wait has
 * ended). Returns SMDDP_KS_OK, or why it gave up.
 */
SMDDP_KS_FN uint32_t smddp__ks_arrive_wait(const smddp__ks_comm_t *c, int stage, int b, uint32_t e,
                                           int lane, int lanes)
{
    for (int q = lane; q < c->nranks; q += lanes)
        smddp__ks_store_release(&c->region[q]->flag[stage][b][c->rank], e);
    for (int q = lane; q < c->nranks; q += lanes) {
        const uint32_t *f = &c->region[c->rank]->flag[stage][b][q];
        uint64_t start = 0;
        uint32_t polls = 0;
        while ((int32_t)(smddp__ks_load_acquire(f) - e) < 0) {
            if (++polls % SMDDP_KS_CHECK_EVERY) continue;
            if (smddp__ks_stopped(c, stage, b, e)) return SMDDP_KS_ABORTED;
            if (smddp__ks_load_relaxed(&c->control->abort))
                return smddp__ks_fail(c, SMDDP_KS_ABORTED, stage, b, q, e);
            uint64_t now = smddp__ks_now_ns();
            if (!start)
                start = now;
            else if (now - start > c->timeout_ns)
                return smddp__ks_fail(c, SMDDP_KS_TIMEOUT, stage, b, q, e);
            smddp__ks_pause();
        }
    }
    /*
     * A peer that gave up may have ended its kernel while this one read its
     * data: an input read in place is the program's again once that kernel
     * ended. It poisoned this rank before ending, so a barrier passed while
     * poisoned fails the launch rather than let its output count.
     */
    if (smddp__ks_stopped(c, stage, b, e)) return SMDDP_KS_ABORTED;
    return SMDDP_KS_OK;
}

/* ---- the plan: which vectors, in which piece --------------------------------- */

SMDDP_KS_HD size_t smddp__ks_vectors(size_t bytes)
{
    return (bytes + SMDDP_KS_VEC - 1) / SMDDP_KS_VEC;
}

/* Piece q of nvec vectors split among p ranks: [*lo, *hi). */
SMDDP_KS_HD void smddp__ks_piece(size_t nvec, int p, int q, size_t *lo, size_t *hi)
{
    size_t per = nvec / (size_t)p, extra = nvec % (size_t)p;
    *lo = (size_t)q * per + ((size_t)q < extra ? (size_t)q : extra);
    *hi = *lo + per + ((size_t)q < extra ? 1 : 0);
}

/* The piece that vector i falls in (the inverse of smddp__ks_piece). */
SMDDP_KS_HD int smddp__ks_piece_of(size_t nvec, int p, size_t i)
{
    size_t per = nvec / (size_t)p, extra = nvec % (size_t)p, big = extra * (per + 1);
    return i < big ? (int)(i / (per + 1)) : (int)(extra + (i - big) / per);
}

/* The first vector >= lo of the grid-stride loop that starts at tid. */
SMDDP_KS_HD size_t smddp__ks_first(size_t lo, size_t tid, size_t stride)
{
    return tid >= lo ? tid : tid + (lo - tid + stride - 1) / stride * stride;
}

/* ---- where each rank's data is ---------------------------------------------- */

/*
 * Block b, before barrier 0: says where this rank's data for the launch is
 * (its scratch, or the job's registered slot). The barrier publishes it.
 */
SMDDP_KS_FN void smddp__ks_publish_src(const smddp__ks_comm_t *c, const smddp__ks_job_t *j, int b)
{
    smddp__ks_src_t *s = &c->region[c->rank]->src[b];
    s->slot = j->slot;
    s->off = j->slot_off;
}

/*
 * Block b, after barrier 0: where local rank q's data for this launch
 * starts, as this rank maps it, and how far apart its rows are (a
 * reduce-scatter's input rows: pitch in place, padded rows in a scratch).
 */
SMDDP_KS_FN const char *smddp__ks_src(const smddp__ks_comm_t *c, const smddp__ks_job_t *j, int b,
                                      int q, size_t *row_stride)
{
    size_t padded = smddp__ks_vectors(j->bytes) * SMDDP_KS_VEC;
    if (q == c->rank) {
        *row_stride = j->slot ? j->pitch : padded;
        return j->slot ? (const char *)j->in : smddp__ks_scratch(c, q);
    }
    const smddp__ks_src_t *s = &c->region[q]->src[b];
    uint64_t slot = smddp__ks_load64(&s->slot);
    if (slot == 0 || slot > SMDDP_KS_SLOTS) {
        *row_stride = padded;
        return smddp__ks_scratch(c, q);
    }
    *row_stride = j->pitch;
    uint64_t base = smddp__ks_load64(&c->region[c->rank]->peer_base[q][slot - 1]);
    return (const char *)(uintptr_t)base + smddp__ks_load64(&s->off);
}

#endif /* SMDDP_CORE_CUDA_KSYNC_H */
