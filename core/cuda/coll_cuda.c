/*
 * Collectives on CUDA device memory among the ranks of one node.
 *
 * Every local rank owns a device staging buffer of two halves, used in turn
 * by successive steps, and six interprocess events (ready, reduced, done;
 * one per half). At the first CUDA collective the ranks exchange the
 * buffer's and the events' IPC handles through the store and map each
 * other's; from then on, every step is enqueued on the caller's stream and
 * the host never waits for the GPU:
 *
 *   wait (on the stream) for every rank's `done` of this half's last use
 *   copy this rank's input into its half            record ready, barrier
 *   wait for every peer's `ready`; read peers' halves through IPC
 *   (two-shot allreduce: reduce own piece in place, record reduced, barrier,
 *    wait peers' `reduced`, gather the pieces)
 *   record done
 *
 * The barriers are host-side (shared-memory counters, with the usual
 * deadline, abort and mismatch checks); they order each event record before
 * every peer's wait on it, which is what cudaStreamWaitEvent on an
 * interprocess event needs. Using a half again two steps later waits on
 * `done`, which peers recorded before their previous barrier.
 *
 * Reductions run smddp__cuda_reduce over the peers' halves in rank order, so
 * every rank gets the same bits as the CPU kernels would. Messages larger
 * than a half go through in chunks. Ranks may share a device.
 *
 * With SMDDP_CUDA_SYNC=kernel, allreduce, reduce-scatter and allgather take
 * another way: each rank's allocation also holds a region (ksync.h: flags,
 * launch counters, a scratch as large as both halves) that peers map with
 * the rest, and each chunk is one launch of ipc_kernels.cu, which copies in,
 * meets the peers through flags in device memory and reads their scratch.
 * The host neither waits nor meets anyone; it reads the kernels' verdict
 * (mapped host memory) before each launch, and smddp__comm_abort tells
 * waiting kernels to stop.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_cuda.h"
#include "../fail.h"
#include "../param.h"
#include "../transport/shm.h"
#include "../topo.h"
#include "nccl.h"

#if SMDDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_error.h"
#include "kernel_sync.h"
#include "kernels.h"

enum { EV_READY, EV_REDUCED, EV_DONE, EV_COUNT };

typedef struct cuda_peer {
    char *buf;                      /* its staging buffer (own: the allocation) */
    cudaEvent_t ev[EV_COUNT][2];    /* by kind and half */
} cuda_peer_t;

struct smddp__cuda {
    int device;
    size_t half;
    cuda_peer_t *peers;  /* local_size entries, this rank's at local_rank */
    uint64_t steps;      /* steps taken; a half is reused every second step */
    /* SMDDP_CUDA_SYNC=kernel: each rank's region follows its two halves. */
    bool ks_on;
    smddp__ksync_t ks;
};

/* What a rank publishes at setup. */
typedef struct cuda_card {
    int32_t pid;
    int32_t pad;
    uint64_t half;
    uint64_t ks_scratch; /* 0: SMDDP_CUDA_SYNC=events */
    int64_t oneshot_max; /* SMDDP_CUDA_ONESHOT_MAX: one-shot and two-shot must agree */
    int32_t sms;         /* the GPU's multiprocessors */
    int32_t blocks_set;  /* SMDDP_CUDA_KERNEL_BLOCKS: grids must agree */
    char bus_id[32];
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t ev[EV_COUNT][2];
} cuda_card_t;

/* The device a buffer lives on, or an error saying it is not device memory. */
static smddp_status_t buffer_device(smddp_comm_t comm, const void *p, const char *name, int *dev)
{
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return smddp__cuda_error(comm, "cudaPointerGetAttributes", e);
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT,
                            "rank %d: %s (%p) is not CUDA device memory but the call said "
                            "SMDDP_MEM_CUDA; pass a cudaMalloc'd buffer or SMDDP_MEM_HOST",
                            comm->rank, name, p);
    *dev = a.device;
    return SMDDP_OK;
}

/*
 * Frees the CUDA state. This rank's own reads are finished first (its
 * events synchronised) and peers' mappings closed. Its own buffer and events
 * are kept when it shares them with peers: a peer may still have reads of
 * them queued on its GPU, and destroy is not collective, so nothing here can
 * tell when they are done; the driver frees them when the process exits.
 */
static void free_state(smddp_comm_t comm, struct smddp__cuda *c, bool shared)
{
    if (!c) return;
    cudaSetDevice(c->device);
    smddp__ksync_release(comm, &c->ks);
    if (c->peers) {
        cuda_peer_t *me = &c->peers[comm->local_rank];
        for (int k = 0; k < EV_COUNT; k++)
            for (int h = 0; h < 2; h++)
                if (me->ev[k][h]) cudaEventSynchronize(me->ev[k][h]);
        for (int q = 0; q < comm->local_size; q++) {
            cuda_peer_t *p = &c->peers[q];
            if (q == comm->local_rank && shared) continue;
            for (int k = 0; k < EV_COUNT; k++)
                for (int h = 0; h < 2; h++)
                    if (p->ev[k][h]) cudaEventDestroy(p->ev[k][h]);
            if (p->buf) {
                if (q == comm->local_rank)
                    cudaFree(p->buf);
                else
                    cudaIpcCloseMemHandle(p->buf);
            }
        }
        free(c->peers);
    }
    free(c);
}

/*
 * The most blocks a collective kernel takes, the same on every rank (from
 * every local rank's card), so that every rank launches the same grids:
 * SMDDP_CUDA_KERNEL_BLOCKS up to the smallest GPU's SMs, else half of
 * them, divided among the most ranks that share one GPU (under MPS their
 * kernels run at once, and each must fit beside the others while it spins). One block per SM fits (ipc_kernels.cu
 * launches 512 threads of up to 128 registers), so every block of a launch
 * is resident at once.
 */
static int kernel_blocks(const cuda_card_t *cards, int n)
{
    int sms = INT32_MAX, sharing = 1;
    for (int q = 0; q < n; q++) {
        int same = 0;
        for (int k = 0; k < n; k++) same += strcmp(cards[q].bus_id, cards[k].bus_id) == 0;
        sharing = SMDDP_MAX(sharing, same);
        sms = SMDDP_MIN(sms, cards[q].sms);
    }
    /* A setting (the same on every rank, checked) above the SMs would leave blocks unresident. */
    int b = cards[0].blocks_set > 0 ? SMDDP_MIN(cards[0].blocks_set, sms) : sms / 2 / sharing;
    return SMDDP_MAX(1, SMDDP_MIN(b, SMDDP_KS_MAX_BLOCKS));
}

/* Allocates this rank's buffer and events, exchanges handles, maps peers'. */
static smddp_status_t setup(smddp_comm_t comm, smddp__op_t *op, int device)
{
    smddp_status_t st;
    const smddp__params_t *prm = smddp__params();
    cuda_card_t *cards = NULL; /* SMDDP_CUDA_SYNC=kernel: every local rank's, for the grid */
    struct smddp__cuda *c = calloc(1, sizeof(*c));
    if (!c) return smddp__error(SMDDP_ERR_NO_MEMORY, "out of memory");
    c->device = device;
    c->half = (size_t)prm->cuda_buffer / 2 / 256 * 256;
    if (c->half < 4096) c->half = 4096;
    c->ks_on = prm->cuda_sync == SMDDP_CUDA_SYNC_KERNEL;
    if (c->ks_on && comm->local_size > SMDDP_KS_MAX_RANKS) {
        SMDDP_INFO("rank %d: SMDDP_CUDA_SYNC=kernel serves at most %d ranks on a node, not %d; "
                   "CUDA collectives synchronise through events",
                   comm->rank, SMDDP_KS_MAX_RANKS, comm->local_size);
        c->ks_on = false;
    }
    c->ks.scratch = c->ks_on ? 2 * c->half : 0;
    c->ks.oneshot_max = prm->cuda_oneshot_max;
    c->peers = calloc((size_t)comm->local_size, sizeof(cuda_peer_t));
    if (!c->peers) {
        free(c);
        return smddp__error(SMDDP_ERR_NO_MEMORY, "out of memory");
    }
    /* A peer that issued something else fails here, before anything waits on the store. */
    SMDDP_CHECK_GOTO(smddp__shm_sync(comm, op), st, fail);

    cuda_peer_t *me = &c->peers[comm->local_rank];
    cuda_card_t card;
    memset(&card, 0, sizeof(card));
    card.pid = (int32_t)getpid();
    card.half = c->half;
    card.ks_scratch = c->ks.scratch;
    card.blocks_set = prm->cuda_kernel_blocks > 0 ? prm->cuda_kernel_blocks : 0;
    size_t alloc = 2 * c->half + (c->ks_on ? smddp__ksync_region_bytes(c->ks.scratch) : 0);
    cudaError_t e = cudaMalloc((void **)&me->buf, alloc);
    if (e != cudaSuccess) {
        st = smddp__error(SMDDP_ERR_NO_MEMORY,
                          "rank %d: cudaMalloc of the %zu-byte CUDA staging buffer failed: %s; "
                          "set SMDDP_CUDA_BUFFER_SIZE lower",
                          comm->rank, alloc, cudaGetErrorString(e));
        goto fail;
    }
#define SETUP_TRY(call)                                                       \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess) {                                              \
            st = smddp__cuda_error(comm, #call, e_);                          \
            goto fail;                                                        \
        }                                                                     \
    } while (0)
    SETUP_TRY(cudaDeviceGetPCIBusId(card.bus_id, (int)sizeof(card.bus_id), device));
    card.oneshot_max = prm->cuda_oneshot_max;
    if (c->ks_on) {
        SMDDP_CHECK_GOTO(smddp__ksync_prepare(comm, &c->ks, me->buf + 2 * c->half), st, fail);
        SETUP_TRY(cudaDeviceGetAttribute(&card.sms, cudaDevAttrMultiProcessorCount, device));
        cards = calloc((size_t)comm->local_size, sizeof(*cards));
        if (!cards) {
            st = smddp__error(SMDDP_ERR_NO_MEMORY, "out of memory");
            goto fail;
        }
        cards[comm->local_rank] = card;
    }
    SETUP_TRY(cudaIpcGetMemHandle(&card.mem, me->buf));
    for (int k = 0; k < EV_COUNT; k++)
        for (int h = 0; h < 2; h++) {
            SETUP_TRY(cudaEventCreateWithFlags(&me->ev[k][h],
                                               cudaEventDisableTiming | cudaEventInterprocess));
            SETUP_TRY(cudaIpcGetEventHandle(&card.ev[k][h], me->ev[k][h]));
        }

    char key[320];
    snprintf(key, sizeof(key), "%s/cuda/%d", comm->prefix, comm->rank);
    SMDDP_CHECK_GOTO(smddp__store_set(comm->store, key, &card, sizeof(card)), st, fail);
    SMDDP_CHECK_GOTO(smddp__shm_sync(comm, op), st, fail);

    for (int q = 0; q < comm->local_size; q++) {
        if (q == comm->local_rank) continue;
        void *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof(key), "%s/cuda/%d", comm->prefix, comm->local_ranks[q]);
        SMDDP_CHECK_GOTO(smddp__store_get(comm->store, key, comm->timeout_ms, &v, &len), st, fail);
        cuda_card_t theirs;
        if (len != sizeof(theirs)) {
            free(v);
            st = smddp__error(SMDDP_ERR_STORE, "rank %d: CUDA setup record of rank %d has %zu "
                                               "bytes, expected %zu (different libsmddp builds?)",
                              comm->rank, comm->local_ranks[q], len, sizeof(theirs));
            goto fail;
        }
        memcpy(&theirs, v, sizeof(theirs));
        free(v);
        if (theirs.ks_scratch != c->ks.scratch) {
            st = smddp__error(SMDDP_ERR_MISMATCH,
                              "rank %d: SMDDP_CUDA_SYNC differs between ranks (%s here, %s on "
                              "rank %d); set it the same everywhere",
                              comm->rank, c->ks_on ? "kernel" : "events",
                              theirs.ks_scratch ? "kernel" : "events", comm->local_ranks[q]);
            goto fail;
        }
        if (theirs.oneshot_max != card.oneshot_max) {
            st = smddp__error(SMDDP_ERR_MISMATCH,
                              "rank %d: SMDDP_CUDA_ONESHOT_MAX differs between ranks (%" PRId64
                              " here, %" PRId64 " on rank %d); set it the same everywhere",
                              comm->rank, card.oneshot_max, theirs.oneshot_max,
                              comm->local_ranks[q]);
            goto fail;
        }
        if (theirs.blocks_set != card.blocks_set) {
            st = smddp__error(SMDDP_ERR_MISMATCH,
                              "rank %d: SMDDP_CUDA_KERNEL_BLOCKS differs between ranks (%d here, "
                              "%d on rank %d; 0: unset); set it the same everywhere",
                              comm->rank, (int)card.blocks_set, (int)theirs.blocks_set,
                              comm->local_ranks[q]);
            goto fail;
        }
        if (cards) cards[q] = theirs;
        if (theirs.half != c->half) {
            st = smddp__error(SMDDP_ERR_MISMATCH,
                              "rank %d: SMDDP_CUDA_BUFFER_SIZE differs between ranks (%zu-byte "
                              "halves here, %" PRIu64 " on rank %d); set it the same everywhere",
                              comm->rank, c->half, theirs.half, comm->local_ranks[q]);
            goto fail;
        }
        int their_dev = -1;
        if (strcmp(theirs.bus_id, card.bus_id) != 0 &&
            cudaDeviceGetByPCIBusId(&their_dev, theirs.bus_id) == cudaSuccess) {
            int ok = 0;
            cudaDeviceCanAccessPeer(&ok, device, their_dev);
            if (!ok) {
                st = smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                                  "rank %d: GPU %s cannot access rank %d's GPU %s directly (no "
                                  "peer access between them); CUDA collectives inside a node "
                                  "need peer access or a shared GPU",
                                  comm->rank, card.bus_id, comm->local_ranks[q], theirs.bus_id);
                goto fail;
            }
        }
        (void)cudaGetLastError();
        cuda_peer_t *p = &c->peers[q];
        e = cudaIpcOpenMemHandle((void **)&p->buf, theirs.mem, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            st = smddp__error(SMDDP_ERR_SYSTEM,
                              "rank %d: mapping rank %d's CUDA buffer (GPU %s, pid %d) through "
                              "CUDA IPC failed: %s",
                              comm->rank, comm->local_ranks[q], theirs.bus_id, (int)theirs.pid,
                              cudaGetErrorString(e));
            goto fail;
        }
        for (int k = 0; k < EV_COUNT; k++)
            for (int h = 0; h < 2; h++)
                SETUP_TRY(cudaIpcOpenEventHandle(&p->ev[k][h], theirs.ev[k][h]));
    }
#undef SETUP_TRY
    /* Nobody unmaps or reuses anything until every peer has mapped it all. */
    SMDDP_CHECK_GOTO(smddp__shm_sync(comm, op), st, fail);
    if (c->ks_on) {
        char *regions[SMDDP_KS_MAX_RANKS];
        for (int q = 0; q < comm->local_size; q++) regions[q] = c->peers[q].buf + 2 * c->half;
        smddp__ksync_attach(comm, &c->ks, regions, kernel_blocks(cards, comm->local_size));
        free(cards);
        cards = NULL;
    }
    comm->cuda = c;
    SMDDP_INFO("rank %d: CUDA collectives on GPU %s (device %d), %zu-byte staging halves shared "
               "with %d local rank(s) through CUDA IPC%s",
               comm->rank, card.bus_id, device, c->half, comm->local_size,
               c->ks_on ? "; allreduce, reduce-scatter and allgather synchronise in the kernels"
                        : "");
    return SMDDP_OK;
fail:
    free(cards);
    /* Handles may have been published: keep what peers could have mapped. */
    free_state(comm, c, comm->local_size > 1);
    return st;
}

void smddp__cuda_teardown(smddp_comm_t comm)
{
    if (!comm->cuda) return; /* no CUDA collective ran: the runtime is not touched */
    enum cudaStreamCaptureMode mode = smddp__cuda_relax_capture();
    free_state(comm, comm->cuda, comm->local_size > 1);
    smddp__cuda_restore_capture(mode);
    comm->cuda = NULL;
}

/* ---- steps ---------------------------------------------------------------- */

typedef struct step {
    smddp_comm_t comm;
    smddp__op_t *op;
    struct smddp__cuda *c;
    cudaStream_t stream;
    int half;            /* 0 or 1 */
} step_t;

/* Peer q's half for this step (this rank's own for q == local_rank). */
static char *half_of(const step_t *s, int q)
{
    return s->c->peers[q].buf + (size_t)s->half * s->c->half;
}

static smddp_status_t step_begin(step_t *s)
{
    struct smddp__cuda *c = s->c;
    s->half = (int)(c->steps & 1);
    if (c->steps >= 2)
        for (int q = 0; q < s->comm->local_size; q++)
            CUDA_TRY(s->comm, cudaStreamWaitEvent(s->stream, c->peers[q].ev[EV_DONE][s->half], 0));
    return SMDDP_OK;
}

/* Records this rank's event of kind k, meets every peer, then waits for theirs. */
static smddp_status_t step_sync(step_t *s, int k)
{
    smddp_comm_t comm = s->comm;
    CUDA_TRY(comm, cudaEventRecord(s->c->peers[comm->local_rank].ev[k][s->half], s->stream));
    SMDDP_CHECK(smddp__shm_sync(comm, s->op));
    for (int q = 0; q < comm->local_size; q++)
        if (q != comm->local_rank)
            CUDA_TRY(comm, cudaStreamWaitEvent(s->stream, s->c->peers[q].ev[k][s->half], 0));
    return SMDDP_OK;
}

static smddp_status_t step_end(step_t *s)
{
    smddp_comm_t comm = s->comm;
    CUDA_TRY(comm, cudaEventRecord(s->c->peers[comm->local_rank].ev[EV_DONE][s->half], s->stream));
    s->c->steps++;
    return SMDDP_OK;
}

static smddp_status_t copy(step_t *s, void *dst, const void *src, size_t n)
{
    if (n == 0 || dst == src) return SMDDP_OK;
    CUDA_TRY(s->comm, cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s->stream));
    return SMDDP_OK;
}

/* rows blocks of n bytes, src_pitch apart, into dst dst_pitch apart. */
static smddp_status_t copy_rows(step_t *s, void *dst, size_t dst_pitch, const void *src,
                                size_t src_pitch, size_t n, int rows)
{
    if (n == 0 || rows == 0) return SMDDP_OK;
    CUDA_TRY(s->comm, cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, n, (size_t)rows,
                                        cudaMemcpyDefault, s->stream));
    return SMDDP_OK;
}

/* dst = reduction over every local rank's half at byte offset off, n bytes. */
static smddp_status_t reduce_halves(step_t *s, void *dst, size_t off, size_t n)
{
    const void *srcs[SMDDP_CUDA_MAX_SRCS];
    int p = s->comm->local_size;
    size_t es = smddp__dtype_size(s->op->dtype);
    if (n == 0) return SMDDP_OK;
    for (int q = 0; q < p; q++) srcs[q] = half_of(s, q) + off;
    smddp__reduce_spec_t spec = s->op->spec;
    spec.avg_div = spec.op == SMDDP_AVG ? s->comm->size : 0;
    int e = smddp__cuda_reduce(&spec, dst, srcs, p, n / es, s->stream);
    if (e != 0) return smddp__cuda_error(s->comm, "the reduction kernel", (cudaError_t)e);
    return SMDDP_OK;
}

/* Bytes per chunk: a multiple of the element size (and of 256 when larger). */
static size_t chunk_bytes(size_t room, size_t es)
{
    return room >= 256 ? room / 256 * 256 : room / es * es;
}

/* Piece q of n bytes split in p, in whole 256-byte units (the last takes the rest). */
static void piece(size_t n, size_t es, int p, int q, size_t *off, size_t *len)
{
    size_t unit = 256 % es == 0 ? 256 : es;
    size_t units = n / unit, per = units / (size_t)p, extra = units % (size_t)p;
    size_t a = (size_t)q * per + SMDDP_MIN((size_t)q, extra);
    size_t b = a + per + ((size_t)q < extra ? 1 : 0);
    *off = a * unit;
    *len = (q == p - 1 ? n : b * unit) - *off;
}

/* ---- the collectives ---------------------------------------------------- */

/* allreduce (root < 0), and reduce: a one-shot of which only the root reduces. */
static smddp_status_t allreduce(step_t *s, int root)
{
    smddp__op_t *op = s->op;
    int p = s->comm->local_size, me = s->comm->local_rank;
    size_t es = smddp__dtype_size(op->dtype), bytes = op->count * es;
    size_t chunk = chunk_bytes(s->c->half, es);
    bool oneshot = bytes <= (size_t)smddp__params()->cuda_oneshot_max || p == 1 || root >= 0;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t n = SMDDP_MIN(chunk, bytes - off);
        char *out = op->recvbuf ? (char *)op->recvbuf + off : NULL; /* NULL off the root of a reduce */
        SMDDP_CHECK(step_begin(s));
        SMDDP_CHECK(copy(s, half_of(s, me), (const char *)op->sendbuf + off, n));
        SMDDP_CHECK(step_sync(s, EV_READY));
        if (oneshot) {
            if (root < 0 || me == root) SMDDP_CHECK(reduce_halves(s, out, 0, n));
        } else {
            size_t po, pl;
            piece(n, es, p, me, &po, &pl);
            SMDDP_CHECK(reduce_halves(s, half_of(s, me) + po, po, pl));
            SMDDP_CHECK(step_sync(s, EV_REDUCED));
            for (int q = 0; q < p; q++) {
                piece(n, es, p, q, &po, &pl);
                SMDDP_CHECK(copy(s, out + po, half_of(s, q) + po, pl));
            }
        }
        SMDDP_CHECK(step_end(s));
    }
    return SMDDP_OK;
}

/* allgather (root < 0) and gather: every rank's block into rank order. */
static smddp_status_t gather(step_t *s, int root)
{
    smddp__op_t *op = s->op;
    int p = s->comm->local_size, me = s->comm->local_rank;
    size_t es = smddp__dtype_size(op->dtype), block = op->count * es;
    size_t chunk = chunk_bytes(s->c->half, es);
    for (size_t off = 0; off < block; off += chunk) {
        size_t n = SMDDP_MIN(chunk, block - off);
        SMDDP_CHECK(step_begin(s));
        SMDDP_CHECK(copy(s, half_of(s, me), (const char *)op->sendbuf + off, n));
        SMDDP_CHECK(step_sync(s, EV_READY));
        if (root < 0 || me == root)
            for (int q = 0; q < p; q++)
                SMDDP_CHECK(copy(s, (char *)op->recvbuf + (size_t)q * block + off, half_of(s, q), n));
        SMDDP_CHECK(step_end(s));
    }
    return SMDDP_OK;
}

/*
 * The ops whose input is one block per rank (reduce_scatter, alltoall,
 * scatter): each chunk stages the same slice of every block, side by side.
 * src_root >= 0 means only that rank's input is read (scatter).
 */
static smddp_status_t blockwise(step_t *s, int src_root, bool reduce)
{
    smddp__op_t *op = s->op;
    int p = s->comm->local_size, me = s->comm->local_rank;
    size_t es = smddp__dtype_size(op->dtype), block = op->count * es;
    size_t chunk = chunk_bytes(s->c->half / (size_t)p, es);
    for (size_t off = 0; off < block; off += chunk) {
        size_t n = SMDDP_MIN(chunk, block - off);
        SMDDP_CHECK(step_begin(s));
        if (src_root < 0 || me == src_root)
            SMDDP_CHECK(copy_rows(s, half_of(s, me), n, (const char *)op->sendbuf + off, block, n, p));
        SMDDP_CHECK(step_sync(s, EV_READY));
        char *out = (char *)op->recvbuf;
        if (reduce)
            SMDDP_CHECK(reduce_halves(s, out + off, (size_t)me * n, n));
        else if (src_root >= 0)
            SMDDP_CHECK(copy(s, out + off, half_of(s, src_root) + (size_t)me * n, n));
        else /* alltoall: block me of every rank's input, into rank order */
            for (int q = 0; q < p; q++)
                SMDDP_CHECK(copy(s, out + (size_t)q * block + off, half_of(s, q) + (size_t)me * n, n));
        SMDDP_CHECK(step_end(s));
    }
    return SMDDP_OK;
}

static smddp_status_t broadcast(step_t *s, int root)
{
    smddp__op_t *op = s->op;
    int me = s->comm->local_rank;
    size_t es = smddp__dtype_size(op->dtype), bytes = op->count * es;
    size_t chunk = chunk_bytes(s->c->half, es);
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t n = SMDDP_MIN(chunk, bytes - off);
        SMDDP_CHECK(step_begin(s));
        if (me == root) SMDDP_CHECK(copy(s, half_of(s, me), (char *)op->recvbuf + off, n));
        SMDDP_CHECK(step_sync(s, EV_READY));
        if (me != root) SMDDP_CHECK(copy(s, (char *)op->recvbuf + off, half_of(s, root), n));
        SMDDP_CHECK(step_end(s));
    }
    return SMDDP_OK;
}

static smddp_status_t execute_on_device(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn algo,
                                        bool ipc);

smddp_status_t smddp__cuda_execute(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn algo,
                                   bool ipc)
{
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    smddp_status_t st = execute_on_device(comm, op, algo, ipc);
    if (prev >= 0 && !smddp__library_thread) cudaSetDevice(prev);
    return st;
}

static smddp_status_t execute_on_device(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn algo,
                                        bool ipc)
{
    const void *probe = op->recvbuf ? op->recvbuf : op->sendbuf;
    int dev = -1;
    if (probe) SMDDP_CHECK(buffer_device(comm, probe, op->recvbuf ? "recvbuf" : "sendbuf", &dev));
    else if (comm->cuda) dev = comm->cuda->device;
    else CUDA_TRY(comm, cudaGetDevice(&dev));
    CUDA_TRY(comm, cudaSetDevice(dev));
    if (!ipc) return algo(comm, op);
    if (!comm->cuda) {
        enum cudaStreamCaptureMode mode = smddp__cuda_relax_capture();
        smddp_status_t st = setup(comm, op, dev);
        smddp__cuda_restore_capture(mode);
        SMDDP_CHECK(st);
    }
    if (comm->cuda->device != dev)
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "rank %d: this communicator's CUDA collectives run on device %d, but "
                            "this buffer is on device %d; use one device per communicator",
                            comm->rank, comm->cuda->device, dev);
    /* A kernel that gave up fails whatever CUDA collective comes next. */
    if (comm->cuda->ks_on) SMDDP_CHECK(smddp__ksync_check(comm, &comm->cuda->ks));
    if (smddp__log_level() >= SMDDP_LOG_TRACE) {
        char desc[256];
        smddp__op_describe(op, desc, sizeof(desc));
        SMDDP_TRACE("rank %d: %s on GPU %d through CUDA IPC, %d local rank(s)", comm->rank, desc,
                    dev, comm->local_size);
    }
    return algo(comm, op);
}

/* The step state of op, whose device is current and whose IPC state is set up. */
static step_t step_of(smddp_comm_t comm, smddp__op_t *op)
{
    return (step_t){comm, op, comm->cuda, (cudaStream_t)op->stream, 0};
}

static int local_root(smddp_comm_t comm, const smddp__op_t *op)
{
    return op->root >= 0 ? smddp__local_index(comm, op->root) : -1;
}

#define CUDA_ALGO(name, body)                                              \
    smddp_status_t smddp__cuda_ipc_##name(smddp_comm_t comm, smddp__op_t *op)  \
    {                                                                      \
        step_t s = step_of(comm, op);                                      \
        return body;                                                       \
    }
CUDA_ALGO(allreduce, s.c->ks_on ? smddp__ksync_allreduce(comm, &s.c->ks, op) : allreduce(&s, -1))
CUDA_ALGO(reduce, allreduce(&s, local_root(comm, op)))
CUDA_ALGO(broadcast, broadcast(&s, local_root(comm, op)))
CUDA_ALGO(allgather, s.c->ks_on ? smddp__ksync_allgather(comm, &s.c->ks, op) : gather(&s, -1))
CUDA_ALGO(gather, gather(&s, local_root(comm, op)))
CUDA_ALGO(reduce_scatter,
          s.c->ks_on ? smddp__ksync_reduce_scatter(comm, &s.c->ks, op) : blockwise(&s, -1, true))
CUDA_ALGO(alltoall, blockwise(&s, -1, false))
CUDA_ALGO(scatter, blockwise(&s, local_root(comm, op), false))
#undef CUDA_ALGO

smddp_status_t smddp__cuda_status(smddp_comm_t comm)
{
    struct smddp__cuda *c = comm->cuda;
    if (!c || !c->ks_on) return SMDDP_OK;
    smddp_status_t st = smddp__ksync_check(comm, &c->ks);
    if (st != SMDDP_OK) smddp__comm_abort(comm, st, smddp__last_error());
    return st;
}

smddp_status_t smddp__cuda_usable(const char *fn)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "%s: SMDDP_MEM_CUDA given, but no CUDA device is usable here (%s)",
                            fn, e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
    }
    return SMDDP_OK;
}

/*
 * One entry per kind: the events path or, under SMDDP_CUDA_SYNC=kernel, the
 * kernels of kernel_sync.c, whose one-shot or two-shot it records.
 */
static const char *const kernel_ways[] = {
    "kernel one-shot", "kernel two-shot", "kernel", "kernel one-shot, input in place",
    "kernel two-shot, input in place", "kernel, input in place", NULL};

#define ENTRY(var, kind, run, ways, about)                                                          \
    const smddp__algo_t smddp__algo_cuda_##var = {"cuda-ipc", kind, SMDDP_PATH_CUDA_IPC, false,    \
                                                  NULL, run, ways, about}
ENTRY(allreduce, SMDDP_OP_ALLREDUCE, smddp__cuda_ipc_allreduce, kernel_ways,
      "peers' staging read through CUDA IPC, met through events or flags in device memory");
ENTRY(reduce, SMDDP_OP_REDUCE, smddp__cuda_ipc_reduce, NULL, "as allreduce, kept on the root");
ENTRY(broadcast, SMDDP_OP_BROADCAST, smddp__cuda_ipc_broadcast, NULL,
      "the root's staging read through CUDA IPC");
ENTRY(allgather, SMDDP_OP_ALLGATHER, smddp__cuda_ipc_allgather, kernel_ways,
      "every peer's staging read through CUDA IPC");
ENTRY(gather, SMDDP_OP_GATHER, smddp__cuda_ipc_gather, NULL, "as allgather, on the root");
ENTRY(reduce_scatter, SMDDP_OP_REDUCE_SCATTER, smddp__cuda_ipc_reduce_scatter, kernel_ways,
      "each rank reduces its block from every peer's staging");
ENTRY(alltoall, SMDDP_OP_ALLTOALL, smddp__cuda_ipc_alltoall, NULL,
      "each rank reads its piece from every peer's staging");
ENTRY(scatter, SMDDP_OP_SCATTER, smddp__cuda_ipc_scatter, NULL,
      "each rank reads its piece from the root's staging");

#else /* !SMDDP_HAVE_CUDA */

smddp_status_t smddp__cuda_execute(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn algo,
                                   bool ipc)
{
    (void)op;
    (void)algo;
    (void)ipc;
    return smddp__error(SMDDP_ERR_NOT_SUPPORTED, "rank %d: this libsmddp was built without CUDA",
                        comm->rank);
}

smddp_status_t smddp__cuda_usable(const char *fn)
{
    return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                        "%s: SMDDP_MEM_CUDA given, but this libsmddp was built without CUDA "
                        "(nvcc was not found at build time); pass host memory or rebuild with "
                        "-Dcuda=enabled",
                        fn);
}

void smddp__cuda_teardown(smddp_comm_t comm)
{
    (void)comm;
}

smddp_status_t smddp__cuda_status(smddp_comm_t comm)
{
    (void)comm;
    return SMDDP_OK;
}

#endif
