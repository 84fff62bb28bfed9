/*
 * CUDA IPC among the ranks of one node: the state, its setup at the first
 * CUDA collective, and the steps the algorithms of core/coll/cuda/ take.
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

#include "ipc.h"
#include "../fail.h"
#include "../param.h"
#include "../transport/shm.h"

#if SMDDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_error.h"
#include "kernel_sync.h"
#include "kernels.h"

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
    cudaIpcEventHandle_t ev[SMDDP_CUDA_EV_COUNT][2];
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
        smddp__cuda_peer_t *me = &c->peers[comm->local_rank];
        for (int k = 0; k < SMDDP_CUDA_EV_COUNT; k++)
            for (int h = 0; h < 2; h++)
                if (me->ev[k][h]) cudaEventSynchronize(me->ev[k][h]);
        for (int q = 0; q < comm->local_size; q++) {
            smddp__cuda_peer_t *p = &c->peers[q];
            if (q == comm->local_rank && shared) continue;
            for (int k = 0; k < SMDDP_CUDA_EV_COUNT; k++)
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
    c->peers = calloc((size_t)comm->local_size, sizeof(smddp__cuda_peer_t));
    if (!c->peers) {
        free(c);
        return smddp__error(SMDDP_ERR_NO_MEMORY, "out of memory");
    }
    /* A peer that issued something else fails here, before anything waits on the store. */
    SMDDP_CHECK_GOTO(smddp__shm_sync(comm, op), st, fail);

    smddp__cuda_peer_t *me = &c->peers[comm->local_rank];
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
    for (int k = 0; k < SMDDP_CUDA_EV_COUNT; k++)
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
        smddp__cuda_peer_t *p = &c->peers[q];
        e = cudaIpcOpenMemHandle((void **)&p->buf, theirs.mem, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            st = smddp__error(SMDDP_ERR_SYSTEM,
                              "rank %d: mapping rank %d's CUDA buffer (GPU %s, pid %d) through "
                              "CUDA IPC failed: %s",
                              comm->rank, comm->local_ranks[q], theirs.bus_id, (int)theirs.pid,
                              cudaGetErrorString(e));
            goto fail;
        }
        for (int k = 0; k < SMDDP_CUDA_EV_COUNT; k++)
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
    /* From here smddp__comm_abort reaches the kernels (cuda_abort); before, it set the flag. */
    pthread_mutex_lock(&comm->err_lock);
    comm->cuda = c;
    if (c->ks_on && atomic_load(&comm->aborted)) smddp__ksync_abort(&c->ks);
    pthread_mutex_unlock(&comm->err_lock);
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

static void cuda_teardown(smddp_comm_t comm)
{
    if (!comm->cuda) return; /* no CUDA collective ran: the runtime is not touched */
    pthread_mutex_lock(&comm->err_lock);
    struct smddp__cuda *c = comm->cuda;
    comm->cuda = NULL;
    pthread_mutex_unlock(&comm->err_lock);
    enum cudaStreamCaptureMode mode = smddp__cuda_relax_capture();
    free_state(comm, c, comm->local_size > 1);
    smddp__cuda_restore_capture(mode);
}

/* Kernels waiting for peers give up (SMDDP_CUDA_SYNC=kernel). */
static void cuda_abort(smddp_comm_t comm, const char *msg)
{
    (void)msg;
    pthread_mutex_lock(&comm->err_lock);
    if (comm->cuda && comm->cuda->ks_on) smddp__ksync_abort(&comm->cuda->ks);
    pthread_mutex_unlock(&comm->err_lock);
}

/* Set up by the first CUDA collective (smddp__cuda_execute), not at creation. */
const smddp__transport_t smddp__cuda_ipc_transport = {"CUDA IPC", false, NULL, cuda_teardown,
                                                      cuda_abort};

/* ---- steps ---------------------------------------------------------------- */

smddp_status_t smddp__cuda_step_begin(smddp__cuda_step_t *s)
{
    struct smddp__cuda *c = s->c;
    s->half = (int)(c->steps & 1);
    if (c->steps >= 2)
        for (int q = 0; q < s->comm->local_size; q++)
            CUDA_TRY(s->comm, cudaStreamWaitEvent(s->stream,
                                                  c->peers[q].ev[SMDDP_CUDA_EV_DONE][s->half], 0));
    return SMDDP_OK;
}

/* Records this rank's event of kind k, meets every peer, then waits for theirs. */
smddp_status_t smddp__cuda_step_sync(smddp__cuda_step_t *s, int k)
{
    smddp_comm_t comm = s->comm;
    CUDA_TRY(comm, cudaEventRecord(s->c->peers[comm->local_rank].ev[k][s->half], s->stream));
    SMDDP_CHECK(smddp__shm_sync(comm, s->op));
    for (int q = 0; q < comm->local_size; q++)
        if (q != comm->local_rank)
            CUDA_TRY(comm, cudaStreamWaitEvent(s->stream, s->c->peers[q].ev[k][s->half], 0));
    return SMDDP_OK;
}

smddp_status_t smddp__cuda_step_end(smddp__cuda_step_t *s)
{
    smddp_comm_t comm = s->comm;
    CUDA_TRY(comm, cudaEventRecord(s->c->peers[comm->local_rank].ev[SMDDP_CUDA_EV_DONE][s->half],
                                   s->stream));
    s->c->steps++;
    return SMDDP_OK;
}

smddp_status_t smddp__cuda_copy(smddp__cuda_step_t *s, void *dst, const void *src, size_t n)
{
    if (n == 0 || dst == src) return SMDDP_OK;
    CUDA_TRY(s->comm, cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s->stream));
    return SMDDP_OK;
}

/* rows blocks of n bytes, src_pitch apart, into dst dst_pitch apart. */
smddp_status_t smddp__cuda_copy_rows(smddp__cuda_step_t *s, void *dst, size_t dst_pitch,
                                     const void *src, size_t src_pitch, size_t n, int rows)
{
    if (n == 0 || rows == 0) return SMDDP_OK;
    CUDA_TRY(s->comm, cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, n, (size_t)rows,
                                        cudaMemcpyDefault, s->stream));
    return SMDDP_OK;
}

/* dst = reduction over every local rank's half at byte offset off, n bytes. */
smddp_status_t smddp__cuda_reduce_halves(smddp__cuda_step_t *s, void *dst, size_t off, size_t n)
{
    const void *srcs[SMDDP_CUDA_MAX_SRCS];
    int p = s->comm->local_size;
    size_t es = smddp__dtype_size(s->op->dtype);
    if (n == 0) return SMDDP_OK;
    for (int q = 0; q < p; q++) srcs[q] = smddp__cuda_half_of(s, q) + off;
    smddp__reduce_spec_t spec = s->op->spec;
    spec.avg_div = spec.op == SMDDP_AVG ? s->comm->size : 0;
    int e = smddp__cuda_reduce(&spec, dst, srcs, p, n / es, s->stream);
    if (e != 0) return smddp__cuda_error(s->comm, "the reduction kernel", (cudaError_t)e);
    return SMDDP_OK;
}

/* Piece q of n bytes split in p, in whole 256-byte units (the last takes the rest). */
void smddp__cuda_piece(size_t n, size_t es, int p, int q, size_t *off, size_t *len)
{
    size_t unit = 256 % es == 0 ? 256 : es;
    size_t units = n / unit, per = units / (size_t)p, extra = units % (size_t)p;
    size_t a = (size_t)q * per + SMDDP_MIN((size_t)q, extra);
    size_t b = a + per + ((size_t)q < extra ? 1 : 0);
    *off = a * unit;
    *len = (q == p - 1 ? n : b * unit) - *off;
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

#endif /* SMDDP_HAVE_CUDA */
