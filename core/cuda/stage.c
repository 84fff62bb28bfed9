/*
 * CUDA collectives across nodes through pinned host memory ("staging").
 *
 * The caller's stream stays in charge of ordering, and neither the caller's
 * thread nor the GPU waits for the host in between. When the collective is
 * issued (smddp__cuda_stage_prepare, on the caller's thread), everything the
 * stream will do is enqueued at once:
 *
 *   copy chunk 0 .. n-1 of the input to the pinned buffer, an event after each
 *   for each chunk i: wait until the host releases chunk i (a one-thread kernel
 *   that polls a flag in mapped pinned memory), copy chunk i back
 *   an event "done": the pinned buffer may be reused
 *
 * When the op's turn comes on the progress thread (smddp__cuda_stage_run),
 * the host waits for chunk i's event, runs the host collective on chunk i
 * (shared memory inside the node, the network between nodes) and releases
 * chunk i to the stream. The copies out of the device run ahead of the host,
 * and chunk i's copy back overlaps chunk i + 1's collective.
 *
 * Chunks exist for the elementwise kinds (allreduce, reduce, broadcast), in
 * SMDDP_CUDA_STAGE_CHUNK bytes; each is its own host collective with its own
 * sequence number (the op reserves them all when it is submitted). The other
 * kinds go in one piece: input and output side by side in one buffer.
 *
 * Whatever happens, every chunk is released to the stream when the op
 * completes (smddp__cuda_stage_finish), so a failed collective leaves wrong
 * data on the GPU and an error on the request, never a stream that waits
 * forever. Pinned buffers are kept in a per-communicator pool until the
 * communicator is destroyed: freeing pinned memory synchronises the device,
 * and on the progress thread that would wait for the very wait kernels only
 * that thread can release.
 *
 * Send and receive on CUDA memory (inside a node too) stage the same way,
 * but a receive's stream must not wait on the GPU for a message: two ranks
 * that each receive, then send, on one stream would wait for each other.
 * So a send copies its buffer to the host on the stream when issued, and the
 * send/recv thread holds it until that copy is done; a receive lands in
 * pinned memory and its copy to the device is enqueued when it completes,
 * before the request reports done.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../coll/coll.h"
#include "../param.h"
#include "nccl.h"
#include "stage.h"

#if SMDDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels.h"

struct smddp__stage {
    struct smddp__stage *next; /* in the pool */
    int device;
    size_t cap;                /* bytes at host */
    char *host;                /* pinned, cap bytes */
    uint32_t *flag;            /* pinned and mapped: chunks released to the stream */
    uint32_t *flag_dev;        /* the same flag, as the device sees it */
    cudaEvent_t *ready;        /* per chunk: its copy to the host is done */
    int nready;
    cudaEvent_t done;          /* the stream is finished with host */
    bool used;                 /* done has been recorded */
    /* The op now using it. */
    bool on_stream;            /* all its stream work was enqueued at issue (not a receive) */
    void *dev_dst;             /* a receive: where the message goes, on `stream` */
    cudaStream_t stream;
    size_t dst_bytes;
    bool elementwise;
    int nchunks;
    size_t chunk;              /* bytes per chunk (elementwise) */
    size_t send_off, recv_off; /* host offsets of input and output (others) */
    bool copied_in;            /* input copies were enqueued (else no event to wait for) */
};

static smddp_status_t cuda_fail(const char *what, cudaError_t e)
{
    (void)cudaGetLastError(); /* not left for the application's next check */
    return smddp__error(SMDDP_ERR_SYSTEM, "staging a CUDA collective through host memory: %s "
                                          "failed: %s (%s)",
                        what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define TRY(call)                                                             \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess) return cuda_fail(#call, e_);                   \
    } while (0)

bool smddp__cuda_staged(smddp_comm_t comm, const smddp__op_t *op)
{
    if (op->mem_type != SMDDP_MEM_CUDA || op->kind == SMDDP_OP_BARRIER) return false;
    if (op->kind == SMDDP_OP_SEND || op->kind == SMDDP_OP_RECV) return true; /* the only way */
    if (comm->node_count < 2) return false;
    const smddp__params_t *prm = smddp__params();
    const char *why = NULL;
    switch (prm->cuda_net) {
    case 1: return true;                      /* staged */
    case 2: return false;                     /* nccl */
    default:
        /*
         * auto: NCCL where it loads on every rank and has the op (NCCL
         * crosses nodes with GPUDirect where the fabric allows), staging
         * otherwise.
         */
        if (!smddp__nccl_has_op(op)) return true;
        if (comm->cuda_nccl_everywhere >= 0) return !comm->cuda_nccl_everywhere;
        return !smddp__nccl(&why);
    }
}

smddp_status_t smddp__cuda_stage_agree(smddp_comm_t comm)
{
    if (comm->node_count < 2 || smddp__params()->cuda_net != 0 || comm->cuda_nccl_everywhere >= 0)
        return SMDDP_OK;
    const char *why = NULL;
    int32_t ok = smddp__nccl(&why) != NULL;
    smddp__op_t *op = smddp__op_new(comm, SMDDP_OP_ALLREDUCE);
    if (!op) return SMDDP_ERR_NO_MEMORY;
    op->sendbuf = &ok;
    op->recvbuf = &ok;
    op->count = 1;
    op->dtype = SMDDP_INT32;
    op->spec.dtype = SMDDP_INT32;
    op->spec.op = SMDDP_MIN;
    op->mem_type = SMDDP_MEM_HOST;
    SMDDP_CHECK(smddp__submit(comm, op, NULL));
    comm->cuda_nccl_everywhere = ok;
    if (!ok)
        SMDDP_INFO("rank %d: NCCL does not load on every rank%s%s: CUDA collectives across nodes "
                   "stage through host memory",
                   comm->rank, why ? "; here: " : "", why ? why : "");
    return SMDDP_OK;
}

/* Input and output bytes of op on this rank (0 where a buffer is unused). */
static void op_bytes(smddp_comm_t comm, const smddp__op_t *op, size_t *in, size_t *out)
{
    size_t es = smddp_dtype_size(op->dtype), n = op->count * es, p = (size_t)comm->size;
    bool root = op->root == comm->rank;
    *in = *out = 0;
    switch (op->kind) {
    case SMDDP_OP_ALLREDUCE: *in = *out = n; break;
    case SMDDP_OP_REDUCE: *in = n; *out = root ? n : 0; break;
    case SMDDP_OP_BROADCAST: *in = root ? n : 0; *out = root ? 0 : n; break;
    case SMDDP_OP_ALLGATHER: *in = n; *out = n * p; break;
    case SMDDP_OP_GATHER: *in = n; *out = root ? n * p : 0; break;
    case SMDDP_OP_REDUCE_SCATTER: *in = n * p; *out = n; break;
    case SMDDP_OP_ALLTOALL: *in = *out = n * p; break;
    case SMDDP_OP_SCATTER: *in = root ? n * p : 0; *out = n; break;
    case SMDDP_OP_SEND: *in = n; break;
    case SMDDP_OP_RECV: *out = n; break;
    case SMDDP_OP_ALLTOALLV:
        /* v: sendcounts, sdispls, recvcounts, rdispls, in elements. */
        for (size_t r = 0; r < p; r++) {
            if (op->v[r] > 0) *in = SMDDP_MAX(*in, (size_t)(op->v[p + r] + op->v[r]) * es);
            if (op->v[2 * p + r] > 0)
                *out = SMDDP_MAX(*out, (size_t)(op->v[3 * p + r] + op->v[2 * p + r]) * es);
        }
        break;
    default: break;
    }
}

static bool elementwise(smddp__op_kind_t kind)
{
    return kind == SMDDP_OP_ALLREDUCE || kind == SMDDP_OP_REDUCE || kind == SMDDP_OP_BROADCAST;
}

static void stage_free(smddp__stage_t *s)
{
    if (!s) return;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    cudaSetDevice(s->device);
    if (s->used) cudaEventSynchronize(s->done);
    if (s->done) cudaEventDestroy(s->done);
    for (int i = 0; i < s->nready; i++) cudaEventDestroy(s->ready[i]);
    free(s->ready);
    if (s->host) cudaFreeHost(s->host);
    if (s->flag) cudaFreeHost(s->flag);
    if (prev >= 0 && !smddp__library_thread) cudaSetDevice(prev);
    free(s);
}

/* A buffer of at least cap bytes on device with at least nchunks events. */
static smddp_status_t stage_get(smddp_comm_t comm, int device, size_t cap, int nchunks,
                                smddp__stage_t **out)
{
    smddp__stage_t *s = NULL;
    pthread_mutex_lock(&comm->stage_lock);
    for (smddp__stage_t **pp = &comm->stage_pool; *pp; pp = &(*pp)->next)
        if ((*pp)->device == device && (*pp)->cap >= cap) {
            s = *pp;
            *pp = s->next;
            break;
        }
    pthread_mutex_unlock(&comm->stage_lock);
    if (!s) {
        s = calloc(1, sizeof(*s));
        if (!s) return smddp__error(SMDDP_ERR_NO_MEMORY, "out of memory");
        s->device = device;
        s->cap = SMDDP_MAX(cap, (size_t)1 << 20);
        cudaError_t e = cudaHostAlloc((void **)&s->host, s->cap, cudaHostAllocPortable);
        if (e == cudaSuccess)
            e = cudaHostAlloc((void **)&s->flag, 64, cudaHostAllocPortable | cudaHostAllocMapped);
        if (e == cudaSuccess) e = cudaHostGetDevicePointer((void **)&s->flag_dev, s->flag, 0);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            stage_free(s);
            return smddp__error(SMDDP_ERR_NO_MEMORY,
                                "rank %d: cannot pin %zu bytes of host memory to stage a CUDA "
                                "collective across nodes: %s",
                                comm->rank, cap, cudaGetErrorString(e));
        }
    }
    if (s->nready < nchunks) {
        cudaEvent_t *r = realloc(s->ready, (size_t)nchunks * sizeof(*r));
        if (!r) {
            stage_free(s);
            return smddp__error(SMDDP_ERR_NO_MEMORY, "out of memory");
        }
        s->ready = r;
        for (; s->nready < nchunks; s->nready++) {
            cudaError_t e = cudaEventCreateWithFlags(&s->ready[s->nready], cudaEventDisableTiming);
            if (e != cudaSuccess) {
                stage_free(s);
                return cuda_fail("cudaEventCreateWithFlags", e);
            }
        }
    }
    /* The stream is past the last op that used it (rarely still running). */
    if (s->used) {
        cudaError_t e = cudaEventSynchronize(s->done);
        if (e != cudaSuccess) {
            stage_free(s);
            return cuda_fail("cudaEventSynchronize", e);
        }
    }
    __atomic_store_n(s->flag, 0, __ATOMIC_RELEASE);
    *out = s;
    return SMDDP_OK;
}

static void stage_put(smddp_comm_t comm, smddp__stage_t *s)
{
    pthread_mutex_lock(&comm->stage_lock);
    s->next = comm->stage_pool;
    comm->stage_pool = s;
    pthread_mutex_unlock(&comm->stage_lock);
}

/* Enqueues the stream's part; see the top of the file. */
static smddp_status_t enqueue(smddp__op_t *op, smddp__stage_t *s, size_t in,
                              size_t out)
{
    cudaStream_t st = (cudaStream_t)op->stream;
    if (s->elementwise) {
        size_t bytes = SMDDP_MAX(in, out);
        const char *src = op->kind == SMDDP_OP_BROADCAST ? op->recvbuf : op->sendbuf;
        if (in > 0) {
            for (int i = 0; i < s->nchunks; i++) {
                size_t off = (size_t)i * s->chunk, n = SMDDP_MIN(s->chunk, bytes - off);
                TRY(cudaMemcpyAsync(s->host + off, src + off, n, cudaMemcpyDeviceToHost, st));
                TRY(cudaEventRecord(s->ready[i], st));
            }
            s->copied_in = true;
        }
        if (out > 0) {
            for (int i = 0; i < s->nchunks; i++) {
                size_t off = (size_t)i * s->chunk, n = SMDDP_MIN(s->chunk, bytes - off);
                int e = smddp__cuda_wait_flag(s->flag_dev, (uint32_t)i + 1, st);
                if (e != 0) return cuda_fail("the kernel that waits for the host", (cudaError_t)e);
                TRY(cudaMemcpyAsync((char *)op->recvbuf + off, s->host + off, n,
                                    cudaMemcpyHostToDevice, st));
            }
        }
    } else if (op->kind == SMDDP_OP_RECV) {
        /* Its copy to the device goes on the stream when it completes (finish). */
        s->dev_dst = op->recvbuf;
        s->stream = st;
        s->dst_bytes = out;
        return SMDDP_OK;
    } else {
        if (in > 0) {
            TRY(cudaMemcpyAsync(s->host + s->send_off, op->sendbuf, in, cudaMemcpyDeviceToHost, st));
            TRY(cudaEventRecord(s->ready[0], st));
            s->copied_in = true;
        }
        if (out > 0) {
            int e = smddp__cuda_wait_flag(s->flag_dev, 1, st);
            if (e != 0) return cuda_fail("the kernel that waits for the host", (cudaError_t)e);
            TRY(cudaMemcpyAsync(op->recvbuf, s->host + s->recv_off, out, cudaMemcpyHostToDevice, st));
        }
    }
    TRY(cudaEventRecord(s->done, st));
    s->used = true;
    return SMDDP_OK;
}

smddp_status_t smddp__cuda_stage_prepare(smddp_comm_t comm, smddp__op_t *op)
{
    if (!smddp__cuda_staged(comm, op)) return SMDDP_OK;
    size_t in, out, es = smddp_dtype_size(op->dtype);
    op_bytes(comm, op, &in, &out);
    const void *probe = out > 0                              ? op->recvbuf
                        : in > 0 && op->kind == SMDDP_OP_BROADCAST ? op->recvbuf
                        : in > 0                             ? op->sendbuf
                                                             : NULL;
    bool gated = out > 0 && op->kind != SMDDP_OP_RECV; /* the stream waits for the host */
    const char *blocking = getenv("CUDA_LAUNCH_BLOCKING");
    if (gated && blocking && strcmp(blocking, "1") == 0)
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "rank %d: CUDA collectives across nodes staged through host memory "
                            "cannot run with CUDA_LAUNCH_BLOCKING=1 (the stream waits for the "
                            "host's result inside a kernel launch); unset it, or set "
                            "SMDDP_CUDA_NET=nccl",
                            comm->rank);
    if (op->stream) {
        enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing((cudaStream_t)op->stream, &cap) == cudaSuccess &&
            cap != cudaStreamCaptureStatusNone)
            return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                                "rank %d: a CUDA %s staged through host memory cannot be captured "
                                "in a CUDA graph (the host's part would not replay); issue it "
                                "outside the capture, or set SMDDP_CUDA_NET=nccl for collectives",
                                comm->rank, smddp__op_kind_name(op->kind));
    }
    int device = -1;
    if (probe) {
        struct cudaPointerAttributes a;
        cudaError_t e = cudaPointerGetAttributes(&a, probe);
        if (e != cudaSuccess || (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)) {
            (void)cudaGetLastError();
            return smddp__error(SMDDP_ERR_INVALID_ARGUMENT,
                                "rank %d: %p is not CUDA device memory but the call said "
                                "SMDDP_MEM_CUDA; pass a cudaMalloc'd buffer or SMDDP_MEM_HOST",
                                comm->rank, probe);
        }
        device = a.device;
    } else {
        TRY(cudaGetDevice(&device));
    }
    bool ew = elementwise(op->kind);
    size_t chunk = 0, cap;
    int nchunks = 1;
    if (ew) {
        size_t bytes = SMDDP_MAX(in, out);
        /* At least 4 KiB, so a tiny setting cannot make millions of chunks. */
        chunk = (size_t)SMDDP_MAX(smddp__params()->cuda_stage_chunk, 4096) / es * es;
        if (bytes > chunk) {
            size_t n = (bytes + chunk - 1) / chunk;
            if (n > (size_t)INT32_MAX)
                return smddp__error(SMDDP_ERR_INVALID_ARGUMENT, "rank %d: %zu bytes make too many "
                                    "SMDDP_CUDA_STAGE_CHUNK chunks; raise it", comm->rank, bytes);
            nchunks = (int)n;
        }
        cap = bytes;
    } else {
        cap = (in + 255) / 256 * 256 + out;
    }

    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    TRY(cudaSetDevice(device));
    smddp__stage_t *s = NULL;
    smddp_status_t st = stage_get(comm, device, cap, nchunks, &s);
    if (st == SMDDP_OK) {
        s->elementwise = ew;
        s->nchunks = nchunks;
        s->chunk = chunk;
        s->send_off = 0;
        s->recv_off = (in + 255) / 256 * 256;
        s->copied_in = false;
        s->on_stream = op->kind != SMDDP_OP_RECV;
        s->dev_dst = NULL;
        st = enqueue(op, s, in, out);
        if (st == SMDDP_OK && (op->kind == SMDDP_OP_SEND || op->kind == SMDDP_OP_RECV)) {
            /* The send/recv thread moves host memory: point the op at the pinned copy. */
            op->stage = s;
            op->on_stream = op->kind == SMDDP_OP_SEND;
            if (op->kind == SMDDP_OP_SEND) op->sendbuf = s->host;
            else op->recvbuf = s->host + s->recv_off;
        } else if (st == SMDDP_OK) {
            op->stage = s;
            op->on_stream = true;
            /*
             * Its chunks take nchunks sequence numbers; an odd span keeps
             * consecutive ops on alternate shared-memory descriptor slots.
             */
            op->seq_span = (uint32_t)nchunks | 1u;
        } else {
            /*
             * Whatever reached the stream must not wait for ever, and the
             * buffer is reused only after the stream is done with it.
             */
            __atomic_store_n(s->flag, UINT32_MAX, __ATOMIC_RELEASE);
            if (cudaEventRecord(s->done, (cudaStream_t)op->stream) == cudaSuccess) {
                s->used = true;
                stage_put(comm, s);
            }
            /* else CUDA itself is failing: the buffer is left alone, never reused. */
        }
    }
    if (prev >= 0 && !smddp__library_thread) cudaSetDevice(prev);
    if (st == SMDDP_OK && smddp__log_level() >= SMDDP_LOG_TRACE) {
        char desc[256];
        smddp__op_describe(op, desc, sizeof(desc));
        SMDDP_TRACE("rank %d: %s across %d nodes staged through pinned host memory in %d "
                    "chunk(s)", comm->rank, desc, comm->node_count, nchunks);
    }
    return st;
}

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Waits for a copy to the host, within the op's deadline and unless aborted. */
static smddp_status_t wait_ready(smddp_comm_t comm, smddp__op_t *op, cudaEvent_t ev, int chunk)
{
    for (int polls = 0;; polls++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return SMDDP_OK;
        if (e != cudaErrorNotReady) return cuda_fail("cudaEventQuery", e);
        if (atomic_load(&comm->aborted))
            return smddp__error(SMDDP_ERR_ABORTED, "rank %d: aborted while chunk %d of a staged "
                                "CUDA collective was copied to the host: %s",
                                comm->rank, chunk, comm->abort_msg);
        if (op->deadline_ns && now_ns() > op->deadline_ns)
            return smddp__error(SMDDP_ERR_TIMEOUT,
                                "rank %d: chunk %d of a staged CUDA collective did not reach host "
                                "memory before the timeout: the GPU stream is still busy with "
                                "earlier work",
                                comm->rank, chunk);
        if (polls > 100) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

smddp_status_t smddp__cuda_stage_run(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__stage_t *s = op->stage;
    size_t es = smddp_dtype_size(op->dtype);
    for (int i = 0; i < s->nchunks; i++) {
        if (s->copied_in) SMDDP_CHECK(wait_ready(comm, op, s->ready[i], i));
        smddp__op_t sub;
        memset(&sub, 0, sizeof(sub));
        sub.kind = op->kind;
        sub.seq = op->seq + (uint64_t)i;
        sub.dtype = op->dtype;
        sub.spec = op->spec;
        sub.root = op->root;
        sub.tag = op->tag;
        sub.mem_type = SMDDP_MEM_HOST;
        sub.v = op->v;
        sub.deadline_ns = op->deadline_ns;
        sub.comm = comm;
        if (s->elementwise) {
            size_t bytes = op->count * es, off = (size_t)i * s->chunk;
            size_t n = SMDDP_MIN(s->chunk, bytes - off);
            sub.count = n / es;
            sub.sendbuf = s->host + off;
            /* In place; a reduce's non-roots get no result (the host path may use it as scratch). */
            bool gets = op->kind != SMDDP_OP_REDUCE || op->root == comm->rank;
            sub.recvbuf = gets ? s->host + off : NULL;
        } else {
            sub.count = op->count;
            sub.sendbuf = op->sendbuf ? s->host + s->send_off : NULL;
            sub.recvbuf = op->recvbuf ? s->host + s->recv_off : NULL;
        }
        SMDDP_CHECK(smddp__coll_execute_host(comm, &sub));
        __atomic_store_n(s->flag, (uint32_t)i + 1, __ATOMIC_RELEASE);
    }
    return SMDDP_OK;
}

smddp_status_t smddp__cuda_stage_finish(smddp__op_t *op, smddp_status_t st)
{
    smddp__stage_t *s = op->stage;
    if (!s) return st;
    op->stage = NULL;
    if (s->dev_dst && st == SMDDP_OK && s->dst_bytes > 0) {
        /* A receive: the message to the device, on the stream, before the request is done. */
        int prev = -1;
        if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
        cudaError_t e = cudaSetDevice(s->device);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(s->dev_dst, s->host + s->recv_off, s->dst_bytes,
                                cudaMemcpyHostToDevice, s->stream);
        if (e == cudaSuccess) e = cudaEventRecord(s->done, s->stream);
        if (e == cudaSuccess) s->used = true;
        else st = cuda_fail("copying a received message to the device", e);
        if (prev >= 0 && !smddp__library_thread) cudaSetDevice(prev);
    }
    __atomic_store_n(s->flag, UINT32_MAX, __ATOMIC_RELEASE);
    stage_put(op->comm, s);
    return st;
}

int smddp__cuda_stage_enqueued(const smddp__op_t *op)
{
    return op->on_stream ? 1 : 0;
}

smddp_status_t smddp__cuda_stage_ready(smddp__op_t *op)
{
    smddp__stage_t *s = op->stage;
    if (!s || !s->copied_in) return SMDDP_OK;
    cudaError_t e = cudaEventQuery(s->ready[0]);
    if (e == cudaSuccess) {
        s->copied_in = false; /* no need to ask again */
        return SMDDP_OK;
    }
    if (e != cudaErrorNotReady) return cuda_fail("cudaEventQuery", e);
    if (op->deadline_ns && now_ns() > op->deadline_ns)
        return smddp__error(SMDDP_ERR_TIMEOUT,
                            "rank %d: a send of CUDA memory to rank %d did not reach host memory "
                            "before the timeout: its stream is still busy with earlier work",
                            op->comm->rank, op->root);
    return SMDDP_IN_PROGRESS;
}

void smddp__cuda_stage_teardown(smddp_comm_t comm)
{
    pthread_mutex_lock(&comm->stage_lock);
    smddp__stage_t *s = comm->stage_pool;
    comm->stage_pool = NULL;
    pthread_mutex_unlock(&comm->stage_lock);
    while (s) {
        smddp__stage_t *next = s->next;
        stage_free(s);
        s = next;
    }
}

#else /* !SMDDP_HAVE_CUDA */

smddp_status_t smddp__cuda_stage_agree(smddp_comm_t comm)
{
    (void)comm;
    return SMDDP_OK;
}

bool smddp__cuda_staged(smddp_comm_t comm, const smddp__op_t *op)
{
    (void)comm;
    (void)op;
    return false;
}

smddp_status_t smddp__cuda_stage_prepare(smddp_comm_t comm, smddp__op_t *op)
{
    (void)comm;
    (void)op;
    return SMDDP_OK;
}

smddp_status_t smddp__cuda_stage_run(smddp_comm_t comm, smddp__op_t *op)
{
    (void)op;
    return smddp__error(SMDDP_ERR_INTERNAL, "rank %d: staged CUDA op without CUDA", comm->rank);
}

smddp_status_t smddp__cuda_stage_finish(smddp__op_t *op, smddp_status_t st)
{
    (void)op;
    return st;
}

int smddp__cuda_stage_enqueued(const smddp__op_t *op)
{
    (void)op;
    return 0;
}

smddp_status_t smddp__cuda_stage_ready(smddp__op_t *op)
{
    (void)op;
    return SMDDP_OK;
}

void smddp__cuda_stage_teardown(smddp_comm_t comm) { (void)comm; }

#endif
