/*
 * Shared-memory transport among the ranks of one node: a segment with one
 * control block and one staging buffer (two halves, for pipelining) per local
 * rank, plus a ring per ordered pair of ranks for send/recv.
 *
 * Synchronisation is one monotonic counter per rank. Every rank executes the
 * same sequence of collective steps and so the same sequence of posts, which
 * lets a rank compute what value a peer's counter must reach for a given step.
 * Waits spin briefly, then sleep on a futex on the counter, waking every
 * slice to check the deadline, the abort flag and whether the peer is alive.
 */
#ifndef SMDDP_CORE_SHM_H
#define SMDDP_CORE_SHM_H

#include "../comm.h"
#include "transport.h"

/*
 * The segment (shm.c). setup, collective over the local ranks, creates or
 * maps it, then unlinks it; teardown marks this rank as gone (peers waiting
 * for it fail) and unmaps; abort tells every local peer that this
 * communicator failed, with the message.
 */
extern const smddp__transport_t smddp__shm_transport;

/* Increments this rank's counter, waking sleepers; returns the new value. */
uint32_t smddp__shm_post(smddp_comm_t comm);
/* Waits until local rank lr's counter reaches target. */
smddp_status_t smddp__shm_wait(smddp_comm_t comm, smddp__op_t *op, int lr, uint32_t target);
/* Waits until every other local rank's counter reaches target. */
smddp_status_t smddp__shm_wait_all(smddp_comm_t comm, smddp__op_t *op, uint32_t target);
/* post + wait_all: a barrier among the local ranks. */
smddp_status_t smddp__shm_sync(smddp_comm_t comm, smddp__op_t *op);

/*
 * Pipeline steps: step_begin picks the next staging half and waits until every
 * peer has finished reading this rank's previous use of it; step_end records
 * that this rank has finished reading peers' halves (one post).
 */
smddp_status_t smddp__shm_step_begin(smddp_comm_t comm, smddp__op_t *op, int *half);
void smddp__shm_step_end(smddp_comm_t comm, int half);
/* Waits until every peer made its step_end of this rank's last step on half. */
smddp_status_t smddp__shm_step_wait(smddp_comm_t comm, smddp__op_t *op, int half);
void *smddp__shm_buf(smddp_comm_t comm, int lr, int half);
/* How long this node's waits spin, then yield, before they sleep (see shm.c). */
void smddp__shm_wait_policy(smddp_comm_t comm, int64_t *spin_ns, int64_t *yield_ns);
/* Bytes in one staging half: SMDDP_SHM_BUFFER_SIZE / 2, at least SMDDP_SHM_HALF_MIN. */
#define SMDDP_SHM_HALF_MIN 4096
size_t smddp__shm_half_size(smddp_comm_t comm);
/* The half and the low-latency payload a communicator would have under this process's settings. */
size_t smddp__shm_default_half(void);
size_t smddp__shm_default_ll_max(void);

/*
 * Publishes desc in this rank's metadata slot for desc->seq; until
 * smddp__shm_op_end, every wait for a post made during this op compares the
 * peer's published desc for the same seq and fails with SMDDP_ERR_MISMATCH
 * when they differ.
 */
void smddp__shm_op_begin(smddp_comm_t comm, const smddp__op_desc_t *desc, int64_t now_ns);
void smddp__shm_op_end(smddp_comm_t comm, bool ok);

/*
 * Where ranks are: op_begin also publishes when this rank arrived at the op
 * (now_ns, from smddp__now_ns(): one clock for the whole node) and that it
 * runs it;
 * op_end, that it finished it (ok) or failed in it.
 *
 * smddp__shm_arrival: local rank lr's arrival time at seq in *ns, modulo
 * 2^48 (compare two with smddp__arrival_diff): 1 known, 0 not arrived yet,
 * -1 no longer known (it is 64 ops or more further).
 */
int smddp__shm_arrival(smddp_comm_t comm, int lr, uint64_t seq, int64_t *ns);
/* a - b for two arrival times modulo 2^48 (their true distance is far below 2^47 ns). */
static inline int64_t smddp__arrival_diff(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)(a - b) << 16) >> 16;
}
typedef struct smddp__shm_position {
    uint64_t running;  /* 1 + seq of the op it runs; 0 between ops */
    uint64_t finished; /* 1 + seq of the last op it finished; 0 none yet */
    uint64_t failed;   /* 1 + seq of the op it failed in; 0 none */
    int state;         /* smddp__shm_peer_state */
} smddp__shm_position_t;
void smddp__shm_position(smddp_comm_t comm, int lr, smddp__shm_position_t *out);

/*
 * Low-latency exchanges (shm_ll.c), for collective steps in which every
 * local rank waits for every other (and all ranks agree which ops use
 * them). smddp__shm_ll_max: the most bytes a rank's payload may have (the
 * smallest SMDDP_SHM_LL_MAX of the local ranks; 0: the slots are off).
 * smddp__shm_ll_exchange publishes `bytes` from mine (NULL: nothing, as
 * for a barrier) and *flags (NULL: 0), waits for every peer's part and
 * compares its desc; then payloads[lr] (unless NULL) points at each rank's
 * payload, this rank's too, readable until this rank's next exchange, and
 * *flags holds all ranks' flags ANDed.
 */
size_t smddp__shm_ll_max(smddp_comm_t comm);
smddp_status_t smddp__shm_ll_exchange(smddp_comm_t comm, smddp__op_t *op, const void *mine,
                                      size_t bytes, uint64_t *flags, const void **payloads);

/*
 * Reads local rank lr's published desc for seq into out; false when the slot
 * holds another op's desc or is being rewritten (the peer has moved on).
 */
bool smddp__shm_read_desc(smddp_comm_t comm, int lr, uint64_t seq, smddp__op_desc_t *out);

/* The whole mapped segment (for registering it with the network once). */
void smddp__shm_segment(smddp_comm_t comm, void **base, size_t *len);

/*
 * Rank lr's words for modules above the transport to share state without an
 * op (core/cuda's buffer registrations): each written by lr alone, read by
 * every local rank; zero at creation.
 */
#define SMDDP_SHM_WORDS 32
_Atomic uint32_t *smddp__shm_words(smddp_comm_t comm, int lr);

/* A small per-rank slot (512 bytes, two by parity) for metadata exchanges. */
void *smddp__shm_meta(smddp_comm_t comm, int lr, int parity);
#define SMDDP_SHM_META_SIZE 512

/*
 * Pools (shm_pool.c): memory of this rank's that local peers map. setup
 * (collective over the local ranks, after the segment's) creates this
 * rank's and maps every peer's, or leaves every rank without one when some
 * cannot (a warning says why; creation goes on); teardown (before the
 * segment's) unmaps them, leaving this rank's pool to its live allocations;
 * abort: peers may still write this rank's pool, so freed ranges are not
 * reused.
 */
extern const smddp__transport_t smddp__pool_transport;
/*
 * smddp__pool_alloc hands out a range (SMDDP_ERR_NOT_SUPPORTED without a
 * pool); smddp__pool_free takes it back, whichever communicator it came
 * from, also after that communicator is gone.
 */
smddp_status_t smddp__pool_alloc(smddp_comm_t comm, size_t bytes, void **out);
smddp_status_t smddp__pool_free(void *ptr);
/* Whether this communicator has pools. */
bool smddp__pool_on(smddp_comm_t comm);
/* 1 + the offset of [ptr, ptr + bytes) in this rank's pool; 0 when it is not all in it. */
uint64_t smddp__pool_ref(smddp_comm_t comm, const void *ptr, size_t bytes);
/*
 * At the start of every op (now_ns): gives back pool memory that was freed
 * and left unused SMDDP_SHM_POOL_RELEASE_MS, when some is due.
 */
void smddp__pool_tick(smddp_comm_t comm, int64_t now_ns);
/*
 * Publishes where this rank's input and output of op lie (smddp__pool_ref
 * values), for the next post; call it right before that post's step.
 */
void smddp__pool_publish(smddp_comm_t comm, const smddp__op_t *op, uint64_t in_ref,
                         uint64_t out_ref);
/*
 * After waiting for every local rank's post `tag` of the same step: each
 * one's input and output in its pool (this rank's too), NULL where they are
 * not; all_*: none is NULL.
 */
typedef struct smddp__pooled {
    char **in, **out;
    bool all_in, all_out;
} smddp__pooled_t;
void smddp__pool_peers(smddp_comm_t comm, const smddp__op_t *op, uint32_t tag,
                       smddp__pooled_t *out);

/*
 * Cross-memory attach (shm_cma.c): reading a local peer's memory with
 * process_vm_readv. setup (collective over the local ranks, after the
 * segment's) finds out whether every local rank can read every
 * other, and leaves it off for all when one cannot (an INFO line says why).
 * smddp__cma_use: whether an allgather of `bytes` per rank reads peers'
 * inputs so (the same answer on every local rank).
 */
extern const smddp__transport_t smddp__cma_transport;
bool smddp__cma_use(smddp_comm_t comm, size_t bytes);
/* The range cross-memory attach serves (allgather bytes per rank); false when it is off. */
bool smddp__cma_range(smddp_comm_t comm, size_t *lo, size_t *hi);
/*
 * Publishes the address of this rank's input for the next post; NULL when
 * peers must read it staged. In the order of pool_publish's contract: right
 * before that post's step.
 */
void smddp__cma_publish(smddp_comm_t comm, const smddp__op_t *op, const void *in);
/* After waiting for local rank lr's post `tag`: the address it published (0: staged). */
uint64_t smddp__cma_peer(smddp_comm_t comm, const smddp__op_t *op, int lr, uint32_t tag);
/* Reads len bytes at addr in local rank lr's process into dst. */
smddp_status_t smddp__cma_read(smddp_comm_t comm, smddp__op_t *op, int lr, void *dst,
                               uint64_t addr, size_t len);

/*
 * Point-to-point through the pair rings, never blocking: put copies up to len
 * bytes into the ring towards dst_lr (src NULL writes nothing but advances),
 * get copies out of the ring from src_lr (dst NULL discards); both return the
 * bytes moved, possibly 0.
 */
size_t smddp__shm_ring_put(smddp_comm_t comm, int dst_lr, const void *src, size_t len);
size_t smddp__shm_ring_get(smddp_comm_t comm, int src_lr, void *dst, size_t len);
size_t smddp__shm_ring_avail(smddp_comm_t comm, int src_lr);
/* 0: alive, 1: process gone, 2: destroyed its communicator. */
int smddp__shm_peer_state(smddp_comm_t comm, int lr);
/* The comm rank that aborted the segment (message in *msg), or -1. */
int smddp__shm_abort_flag(smddp_comm_t comm, const char **msg);

#endif /* SMDDP_CORE_SHM_H */
