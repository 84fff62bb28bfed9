/*
 * The host side of SMDDP_CUDA_SYNC=kernel (kernel_sync.h): per chunk, one
 * launch of ipc_kernels.cu on the op's stream. The host neither waits nor
 * meets its peers; before each collective it reads the kernels' verdict
 * (host memory the device writes), and smddp__comm_abort sets the abort
 * word the kernels poll.
 *
 * Registration (opt-in: the program must keep a registered allocation
 * until every rank destroyed the communicator, since peers keep it mapped
 * and CUDA leaves freeing mapped memory undefined): an input of
 * SMDDP_CUDA_REGISTER_MIN bytes or more is looked up by address in this
 * rank's slots (allocation start, size and the driver's buffer ID, so a new
 * allocation at a freed one's address is a new buffer). A new one gets the
 * next slot: its IPC handle goes to the store,
 * and the count of published slots to this rank's shm word. Before each
 * collective every rank maps the peers' slots it has not mapped yet, writes
 * where into its region's peer_base and says so in its own shm words. An
 * input whose slot every peer has mapped is read in place (the launch names
 * the slot); until then, or when the input does not qualify, it is copied
 * in. No rank waits for another here: a slot not yet mapped everywhere
 * only means one more copy.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../comm.h"

#if SMDDP_HAVE_CUDA
#include <cuda.h>

#include "kernel_sync.h"
#include "../param.h"
#include "../store/ref.h"
#include "../transport/shm.h"
#include "cuda_error.h"
#include "ipc_kernels.h"

typedef CUresult (*get_attributes_fn)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);

/* What a rank publishes for each slot. */
typedef struct reg_card {
    cudaIpcMemHandle_t handle;
    uint64_t size;
} reg_card_t;

/*
 * Readies registration: mapping peers' slots always, registering this
 * rank's inputs where SMDDP_CUDA_REGISTER_MIN asks. Leaves both off
 * (mapped NULL) where it cannot work here, saying why.
 */
static void registration_prepare(smddp_comm_t comm, smddp__ksync_t *k)
{
    k->register_min = (size_t)smddp__params()->cuda_register_min;
    const char *why = NULL;
    enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t got = cudaGetDriverEntryPointByVersion("cuPointerGetAttributes",
                                                       &k->get_attributes, 12000,
                                                       cudaEnableDefault, &found);
#else
    cudaError_t got = cudaGetDriverEntryPoint("cuPointerGetAttributes", &k->get_attributes,
                                              cudaEnableDefault, &found);
#endif
    if (comm->local_size < 2)
        why = "no peer on this node";
    else if (got != cudaSuccess || found != cudaDriverEntryPointSuccess || !k->get_attributes)
        why = "the driver has no cuPointerGetAttributes";
    else if (!(k->own = calloc(SMDDP_KS_SLOTS, sizeof(*k->own))) ||
             !(k->mapped = calloc((size_t)SMDDP_KS_MAX_RANKS * SMDDP_KS_SLOTS, sizeof(void *))))
        why = "out of memory";
    if (why) {
        (void)cudaGetLastError();
        if (k->register_min)
            SMDDP_INFO("rank %d: CUDA inputs are copied in, never read in place (%s)", comm->rank,
                       why);
        k->register_min = 0;
        free(k->own);
        k->own = NULL;
        free(k->mapped);
        k->mapped = NULL;
    }
}

/* Maps the slots peers published since the last call (map_peers' one peer). */
static void map_peer(smddp_comm_t comm, smddp__ksync_t *k, int q)
{
    _Atomic uint32_t *mine = smddp__shm_words(comm, comm->local_rank);
    uint32_t published = atomic_load_explicit(smddp__shm_words(comm, q), memory_order_acquire);
    if (published > SMDDP_KS_SLOTS) published = SMDDP_KS_SLOTS;
    while (k->opened[q] < published && !k->open_failed[q]) {
        uint32_t s = k->opened[q];
        char key[320];
        void *v = NULL, *base = NULL;
        size_t len = 0;
        snprintf(key, sizeof(key), "%s/cureg/%d/%u", comm->prefix, comm->local_ranks[q], s);
        reg_card_t card;
        const char *why = NULL;
        cudaError_t e = cudaSuccess;
        if (smddp__store_get(comm->store, key, comm->timeout_ms, &v, &len) != SMDDP_OK ||
            len != sizeof(card)) {
            why = "its record is missing from the store";
        } else {
            memcpy(&card, v, sizeof(card));
            e = cudaIpcOpenMemHandle(&base, card.handle, cudaIpcMemLazyEnablePeerAccess);
            if (e != cudaSuccess) {
                why = "cudaIpcOpenMemHandle failed";
            } else {
                uint64_t at = (uint64_t)(uintptr_t)base;
                smddp__ks_region_t *region = k->ks.region[comm->local_rank];
                e = cudaMemcpyAsync(&region->peer_base[q][s], &at, sizeof(at),
                                    cudaMemcpyHostToDevice, k->side);
                if (e == cudaSuccess) e = cudaStreamSynchronize(k->side);
                if (e != cudaSuccess) {
                    why = "writing where it is mapped failed";
                    cudaIpcCloseMemHandle(base);
                    base = NULL;
                }
            }
        }
        free(v);
        if (why) {
            (void)cudaGetLastError();
            SMDDP_INFO("rank %d: cannot map rank %d's registered buffer %u (%s%s%s); its inputs "
                       "are copied in from now on", comm->rank, comm->local_ranks[q], s, why,
                       e != cudaSuccess ? ": " : "", e != cudaSuccess ? cudaGetErrorString(e) : "");
            k->open_failed[q] = true;
            break;
        }
        k->mapped[q * SMDDP_KS_SLOTS + (int)s] = base;
        k->opened[q] = s + 1;
        atomic_store_explicit(&mine[1 + q], k->opened[q], memory_order_release);
    }
}

static void map_peers(smddp_comm_t comm, smddp__ksync_t *k)
{
    for (int q = 0; q < comm->local_size; q++)
        if (q != comm->local_rank) map_peer(comm, k, q);
}

/* This rank's slot holding r's allocation, registering it if new; -1 if none can. */
static int slot_of(smddp_comm_t comm, smddp__ksync_t *k, const smddp__ks_reg_t *r)
{
    for (int s = k->nown - 1; s >= 0; s--)
        if (k->own[s].base == r->base && k->own[s].size == r->size && k->own[s].id == r->id)
            return s;
    if (k->nown >= SMDDP_KS_SLOTS) return -1;
    reg_card_t card = {.size = r->size};
    cudaError_t e = cudaIpcGetMemHandle(&card.handle, (void *)r->base);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    char key[320];
    snprintf(key, sizeof(key), "%s/cureg/%d/%d", comm->prefix, comm->rank, k->nown);
    if (smddp__store_set(comm->store, key, &card, sizeof(card)) != SMDDP_OK) {
        SMDDP_INFO("rank %d: CUDA inputs are copied in from now on (the store refused a "
                   "registration: %s)", comm->rank, smddp__last_error());
        k->register_min = 0;
        return -1;
    }
    k->own[k->nown++] = *r;
    atomic_store_explicit(smddp__shm_words(comm, comm->local_rank), (uint32_t)k->nown,
                          memory_order_release);
    return k->nown - 1;
}

/*
 * The slot (+ 1) peers may read `extent` bytes at in from, with in's offset
 * in it; 0: copy in. The caller has checked that in may be read in place.
 */
static uint64_t registered(smddp_comm_t comm, smddp__ksync_t *k, const void *in, size_t extent,
                           uint64_t *off)
{
    CUpointer_attribute what[4] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                   CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                   CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
    CUdeviceptr start = 0;
    size_t size = 0;
    unsigned long long id = 0;
    int ipc = 0;
    void *data[4] = {&start, &size, &id, &ipc};
    CUresult e = ((get_attributes_fn)k->get_attributes)(4, what, data, (CUdeviceptr)(uintptr_t)in);
    uintptr_t p = (uintptr_t)in;
    if (e != CUDA_SUCCESS || !ipc || p < start || p + extent > start + size) return 0;
    smddp__ks_reg_t r = {(uintptr_t)start, size, id};
    int s = slot_of(comm, k, &r);
    if (s < 0) return 0;
    for (int q = 0; q < comm->local_size; q++)
        if (q != comm->local_rank &&
            atomic_load_explicit(&smddp__shm_words(comm, q)[1 + comm->local_rank],
                                 memory_order_acquire) <= (uint32_t)s)
            return 0;
    *off = p - (uintptr_t)start;
    return (uint64_t)s + 1;
}

smddp_status_t smddp__ksync_prepare(smddp_comm_t comm, smddp__ksync_t *k, void *region)
{
    /*
     * Flags and launch counters start at zero before any peer can see them;
     * on a stream of this communicator's own, beside whatever stream is
     * being captured.
     */
    CUDA_TRY(comm, cudaStreamCreateWithFlags(&k->side, cudaStreamNonBlocking));
    cudaError_t e = cudaMemsetAsync(region, 0, SMDDP_KS_SCRATCH_OFFSET, k->side);
    if (e == cudaSuccess) e = cudaStreamSynchronize(k->side);
    if (e != cudaSuccess) return smddp__cuda_error(comm, "zeroing the kernels' flags", e);
    CUDA_TRY(comm, cudaHostAlloc((void **)&k->ctl, sizeof(*k->ctl), cudaHostAllocMapped));
    memset(k->ctl, 0, sizeof(*k->ctl));
    CUDA_TRY(comm, cudaHostGetDevicePointer((void **)&k->ks.control, k->ctl, 0));
    CUDA_TRY(comm, cudaEventCreateWithFlags(&k->done, cudaEventDisableTiming));
    registration_prepare(comm, k);
    return SMDDP_OK;
}

void smddp__ksync_attach(smddp_comm_t comm, smddp__ksync_t *k, char *const *regions,
                         int max_blocks)
{
    for (int q = 0; q < comm->local_size; q++) k->ks.region[q] = (smddp__ks_region_t *)regions[q];
    k->ks.rank = comm->local_rank;
    k->ks.nranks = comm->local_size;
    k->ks.max_blocks = max_blocks;
}

void smddp__ksync_abort(smddp__ksync_t *k)
{
    if (k->ctl) __atomic_store_n(&k->ctl->abort, 1u, __ATOMIC_RELEASE);
}

/* Why this rank's kernels gave up, in words (the control block says they did). */
static const char *verdict(smddp_comm_t comm, const smddp__ksync_t *k)
{
    static _Thread_local char why[320];
    const smddp__ks_control_t *ctl = k->ctl;
    int q = (int)ctl->peer;
    int rank = q >= 0 && q < comm->local_size ? comm->local_ranks[q] : -1;
    switch (__atomic_load_n(&ctl->failed, __ATOMIC_ACQUIRE)) {
    case SMDDP_KS_TIMEOUT:
        snprintf(why, sizeof(why), "it stopped waiting for rank %d (barrier %u of block %u's "
                 "launch %u): rank %d did not arrive within SMDDP_TIMEOUT (did it die, or issue "
                 "another collective?)", rank, ctl->stage, ctl->block, ctl->epoch, rank);
        break;
    case SMDDP_KS_PEER:
        snprintf(why, sizeof(why), "rank %d's kernel gave up waiting (timeout or abort there) "
                 "and stopped this rank's (block %u)", rank, ctl->block);
        break;
    default:
        snprintf(why, sizeof(why), "it stopped waiting for rank %d (barrier %u of block %u's "
                 "launch %u): the communicator was aborted", rank, ctl->stage, ctl->block,
                 ctl->epoch);
        break;
    }
    return why;
}

smddp_status_t smddp__ksync_check(smddp_comm_t comm, const smddp__ksync_t *k)
{
    uint32_t why = __atomic_load_n(&k->ctl->failed, __ATOMIC_ACQUIRE);
    if (why == SMDDP_KS_OK) return SMDDP_OK;
    return smddp__error(why == SMDDP_KS_ABORTED ? SMDDP_ERR_ABORTED : SMDDP_ERR_TIMEOUT,
                        "rank %d: a CUDA collective kernel gave up, so its output is not valid: %s",
                        comm->rank, verdict(comm, k));
}

/*
 * One launch of job on the op's stream (spec: the op's, with its AVG
 * divisor; captured: whether the stream is being captured).
 *
 * Every launch waits for the one before it, wherever that ran: another
 * stream, or a CUDA graph replayed since. Launches running side by side
 * would share the launch counters and the scratch. Under capture, the wait
 * and the record are "external" nodes, so that every replay waits for the
 * latest launch and records its own.
 */
static smddp_status_t run(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op,
                          const smddp__ks_job_t *job, const smddp__reduce_spec_t *spec,
                          bool captured)
{
    cudaStream_t stream = (cudaStream_t)op->stream;
    if (k->launched) {
        cudaError_t w = cudaStreamWaitEvent(stream, k->done, captured ? cudaEventWaitExternal : 0);
        if (w != cudaSuccess)
            return smddp__error(SMDDP_ERR_SYSTEM,
                                "rank %d: ordering this CUDA %s after this communicator's previous "
                                "one failed: %s",
                                comm->rank, smddp__op_kind_name(op->kind), cudaGetErrorString(w));
    }
    int e = smddp__ks_launch(&k->ks, job, spec, stream);
    if (e != 0) return smddp__cuda_error(comm, "the collective kernel's launch", (cudaError_t)e);
    if (captured)
        CUDA_TRY(comm, cudaEventRecordWithFlags(k->done, stream, cudaEventRecordExternal));
    else
        CUDA_TRY(comm, cudaEventRecord(k->done, stream));
    k->launched = true;
    return SMDDP_OK;
}

/* Whether [a, a + an) and [b, b + bn) share a byte. */
static bool overlap(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bn && y < x + an;
}

/*
 * Whether peers may read op's input in place: it and its rows are whole
 * vectors, and this rank writes nothing they read before they are done
 * (per kind: no overlap, or exactly in place where the kernel allows it).
 */
static bool in_place_ok(smddp_comm_t comm, const smddp__op_t *op, smddp__ks_kind_t kind,
                        size_t bytes)
{
    const char *in = op->sendbuf, *out = op->recvbuf;
    size_t p = (size_t)comm->local_size;
    if ((uintptr_t)in % SMDDP_KS_VEC || bytes % SMDDP_KS_VEC) return false;
    switch (kind) {
    case SMDDP_KS_ALLREDUCE_ONESHOT: return !overlap(in, bytes, out, bytes);
    case SMDDP_KS_ALLREDUCE_TWOSHOT: return in == out || !overlap(in, bytes, out, bytes);
    case SMDDP_KS_REDUCE_SCATTER: return !overlap(in, bytes * p, out, bytes);
    default:
        return in == out + (size_t)comm->local_rank * bytes || !overlap(in, bytes, out, bytes * p);
    }
}

/*
 * Runs kind over bytes per rank in chunks that fit the scratch (rows of the
 * input, or of the output, pitch apart): chunk k of every row in launch k.
 * The input is read in place where it is registered and every peer mapped it.
 */
static smddp_status_t chunks(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op,
                             smddp__ks_kind_t kind, size_t bytes, size_t pitch)
{
    size_t room = k->scratch;
    size_t rows = kind == SMDDP_KS_REDUCE_SCATTER ? (size_t)comm->local_size : 1;
    room /= rows;
    size_t chunk = room / SMDDP_KS_VEC * SMDDP_KS_VEC;
    uint64_t slot = 0, base_off = 0;
    if (k->mapped && bytes) {
        enum cudaStreamCaptureMode mode = smddp__cuda_relax_capture();
        map_peers(comm, k);
        if (k->register_min && bytes * rows >= k->register_min &&
            in_place_ok(comm, op, kind, bytes))
            slot = registered(comm, k, op->sendbuf, bytes * rows, &base_off);
        smddp__cuda_restore_capture(mode);
    }
    int64_t ms = smddp__op_timeout_ms(comm, op);
    k->ks.timeout_ns = ms <= 0 || (uint64_t)ms >= UINT64_MAX / 1000000u ? UINT64_MAX
                                                                         : (uint64_t)ms * 1000000u;
    smddp__reduce_spec_t spec = op->spec;
    spec.avg_div = spec.op == SMDDP_AVG ? comm->size : 0;
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUDA_TRY(comm, cudaStreamIsCapturing((cudaStream_t)op->stream, &cap));
    if (slot) {
        op->algo = kind == SMDDP_KS_ALLREDUCE_ONESHOT   ? "kernel one-shot, input in place"
                   : kind == SMDDP_KS_ALLREDUCE_TWOSHOT ? "kernel two-shot, input in place"
                                                        : "kernel, input in place";
    }
    for (size_t off = 0; off < bytes; off += chunk) {
        smddp__ks_job_t job = {kind, (const char *)op->sendbuf + off, (char *)op->recvbuf + off,
                               SMDDP_MIN(chunk, bytes - off), pitch, slot,
                               slot ? base_off + off : 0};
        SMDDP_CHECK(run(comm, k, op, &job, &spec, cap == cudaStreamCaptureStatusActive));
    }
    return SMDDP_OK;
}

smddp_status_t smddp__ksync_allreduce(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    bool oneshot = bytes <= (uint64_t)k->oneshot_max || comm->local_size == 1;
    op->algo = oneshot ? "kernel one-shot" : "kernel two-shot";
    return chunks(comm, k, op, oneshot ? SMDDP_KS_ALLREDUCE_ONESHOT : SMDDP_KS_ALLREDUCE_TWOSHOT,
                  bytes, 0);
}

smddp_status_t smddp__ksync_reduce_scatter(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op)
{
    size_t block = op->count * smddp__dtype_size(op->dtype);
    op->algo = "kernel";
    return chunks(comm, k, op, SMDDP_KS_REDUCE_SCATTER, block, block);
}

smddp_status_t smddp__ksync_allgather(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op)
{
    size_t block = op->count * smddp__dtype_size(op->dtype);
    op->algo = "kernel";
    return chunks(comm, k, op, SMDDP_KS_ALLGATHER, block, block);
}

void smddp__ksync_release(smddp_comm_t comm, smddp__ksync_t *k)
{
    if (k->done) {
        /* This rank's kernels may wait for peers: at most SMDDP_TIMEOUT. */
        cudaEventSynchronize(k->done);
        cudaEventDestroy(k->done);
        k->done = NULL;
        if (k->ctl && __atomic_load_n(&k->ctl->failed, __ATOMIC_ACQUIRE))
            SMDDP_WARN("rank %d: a CUDA collective kernel of this communicator gave up before "
                       "it was destroyed (its output is not valid): %s",
                       comm->rank, verdict(comm, k));
    }
    if (k->mapped) {
        /* This rank's launches are done (above), so none reads peers' slots any more. */
        for (int i = 0; i < SMDDP_KS_MAX_RANKS * SMDDP_KS_SLOTS; i++)
            if (k->mapped[i]) cudaIpcCloseMemHandle(k->mapped[i]);
        free(k->mapped);
        k->mapped = NULL;
    }
    free(k->own);
    k->own = NULL;
    if (k->side) {
        cudaStreamDestroy(k->side);
        k->side = NULL;
    }
    if (k->ctl) {
        cudaFreeHost(k->ctl);
        k->ctl = NULL;
    }
}

#endif /* SMDDP_HAVE_CUDA */
