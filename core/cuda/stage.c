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

typedef struct smddp__stage smddp__stage_t;

/* The idle buffers of a communicator (comm->stages), each kept for the next op. */
struct smddp__stage_pool {
    pthread_mutex_t lock;
    smddp__stage_t *idle;
};

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
    /*
     * The op now using it. Chunk i is bytes [i * chunk, ...) of the input at
     * host + that offset and of the output at host + recv_off + that offset:
     * allreduce, reduce and broadcast work in place (recv_off 0) in chunks;
     * the other kinds are one chunk (chunk SIZE_MAX), output after input.
     */
    int nchunks;
    size_t chunk;
    size_t recv_off;
    bool copied_in;            /* input copies were enqueued (else no event to wait for) */
    void *dev_dst;             /* a receive: where the message goes, when it is in */
};

/* Makes device current on this thread; *prev is the one to go back to (-1: none). */
static cudaError_t enter_device(int device, int *prev)
{
    if (cudaGetDevice(prev) != cudaSuccess) *prev = -1;
    return cudaSetDevice(device);
}

/* Library threads have no device of their own to go back to (see smddp__library_thread). */
static void leave_device(int prev)
{
    if (prev >= 0 && !smddp__library_thread) cudaSetDevice(prev);
}

/* Offset and length of chunk i of a total of bytes. */
static void chunk_of(const smddp__stage_t *s, int i, size_t bytes, size_t *off, size_t *n)
{
    *off = (size_t)i * s->chunk;
    *n = SMDDP_MIN(s->chunk, bytes - *off);
}

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

static bool elementwise(smddp__op_kind_t kind)
{
    return kind == SMDDP_OP_ALLREDUCE || kind == SMDDP_OP_REDUCE || kind == SMDDP_OP_BROADCAST;
}

static void stage_free(smddp__stage_t *s)
{
    if (!s) return;
    int prev;
    (void)enter_device(s->device, &prev);
    if (s->used) cudaEventSynchronize(s->done);
    if (s->done) cudaEventDestroy(s->done);
    for (int i = 0; i < s->nready; i++) cudaEventDestroy(s->ready[i]);
    free(s->ready);
    if (s->host) cudaFreeHost(s->host);
    if (s->flag) cudaFreeHost(s->flag);
    leave_device(prev);
    free(s);
}

/* A buffer of at least cap bytes on device with at least nchunks events. */
static smddp_status_t stage_get(smddp_comm_t comm, int device, size_t cap, int nchunks,
                                smddp__stage_t **out)
{
    smddp__stage_t *s = NULL;
    struct smddp__stage_pool *pool = comm->stages;
    pthread_mutex_lock(&pool->lock);
    for (smddp__stage_t **pp = &pool->idle; *pp; pp = &(*pp)->next)
        if ((*pp)->device == device && (*pp)->cap >= cap) {
            s = *pp;
            *pp = s->next;
            break;
        }
    pthread_mutex_unlock(&pool->lock);
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
    struct smddp__stage_pool *pool = comm->stages;
    pthread_mutex_lock(&pool->lock);
    s->next = pool->idle;
    pool->idle = s;
    pthread_mutex_unlock(&pool->lock);
}

/* Enqueues the stream's part; see the top of the file. A receive's comes at finish. */
static smddp_status_t enqueue(smddp__op_t *op, smddp__stage_t *s, size_t in, size_t out)
{
    cudaStream_t st = (cudaStream_t)op->stream;
    const char *src = op->kind == SMDDP_OP_BROADCAST ? op->recvbuf : op->sendbuf;
    size_t off, n;
    if (op->kind == SMDDP_OP_RECV) {
        s->dev_dst = op->recvbuf;
        return SMDDP_OK;
    }
    if (in > 0) {
        for (int i = 0; i < s->nchunks; i++) {
            chunk_of(s, i, in, &off, &n);
            TRY(cudaMemcpyAsync(s->host + off, src + off, n, cudaMemcpyDeviceToHost, st));
            TRY(cudaEventRecord(s->ready[i], st));
        }
        s->copied_in = true;
    }
    if (out > 0) {
        for (int i = 0; i < s->nchunks; i++) {
            chunk_of(s, i, out, &off, &n);
            int e = smddp__cuda_wait_flag(s->flag_dev, (uint32_t)i + 1, st);
            if (e != 0) return cuda_fail("the kernel that waits for the host", (cudaError_t)e);
            TRY(cudaMemcpyAsync((char *)op->recvbuf + off, s->host + s->recv_off + off, n,
                                cudaMemcpyHostToDevice, st));
        }
    }
    TRY(cudaEventRecord(s->done, st));
    s->used = true;
    return SMDDP_OK;
}

smddp_status_t smddp__cuda_stage_prepare(smddp_comm_t comm, smddp__op_t *op)
{
    size_t in, out, es = smddp__dtype_size(op->dtype);
    smddp__op_bytes(op, comm->size, comm->rank, &in, &out);
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
    size_t chunk = SIZE_MAX, cap, recv_off = (in + 255) / 256 * 256;
    int nchunks = 1;
    if (elementwise(op->kind)) {
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
        recv_off = 0; /* in place */
    } else {
        cap = recv_off + out;
    }

    int prev;
    cudaError_t e = enter_device(device, &prev);
    smddp__stage_t *s = NULL;
    smddp_status_t st = e != cudaSuccess ? cuda_fail("cudaSetDevice", e)
                                         : stage_get(comm, device, cap, nchunks, &s);
    if (st == SMDDP_OK) {
        s->nchunks = nchunks;
        s->chunk = chunk;
        s->recv_off = recv_off;
        s->copied_in = false;
        s->dev_dst = NULL;
        st = enqueue(op, s, in, out);
        if (st == SMDDP_OK) {
            op->stage = s;
            op->on_stream = op->kind != SMDDP_OP_RECV;
            /* The send/recv thread moves host memory: point the op at the pinned copy. */
            if (op->kind == SMDDP_OP_SEND)
                op->sendbuf = s->host;
            else if (op->kind == SMDDP_OP_RECV)
                op->recvbuf = s->host + s->recv_off;
            else
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
    leave_device(prev);
    if (st == SMDDP_OK && smddp__log_level() >= SMDDP_LOG_TRACE) {
        char desc[256];
        smddp__op_describe(op, desc, sizeof(desc));
        SMDDP_TRACE("rank %d: %s across %d nodes staged through pinned host memory in %d "
                    "chunk(s)", comm->rank, desc, comm->node_count, nchunks);
    }
    return st;
}

/*
 * One look at a copy to the host: SMDDP_OK when done, SMDDP_IN_PROGRESS
 * before, else an error (a failed copy, or op's deadline passed; what names
 * the copy in the message).
 */
static smddp_status_t poll_copy_in(smddp__op_t *op, cudaEvent_t ev, const char *what)
{
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return SMDDP_OK;
    if (e != cudaErrorNotReady) return cuda_fail("cudaEventQuery", e);
    if (op->deadline_ns && smddp__now_ns() > op->deadline_ns)
        return smddp__error(SMDDP_ERR_TIMEOUT,
                            "rank %d: %s did not reach host memory before the timeout: its "
                            "stream is still busy with earlier work",
                            op->comm->rank, what);
    return SMDDP_IN_PROGRESS;
}

/* Waits for chunk i's copy to the host, unless the communicator is aborted. */
static smddp_status_t wait_ready(smddp_comm_t comm, smddp__op_t *op, int i)
{
    char what[64];
    snprintf(what, sizeof(what), "chunk %d of a staged CUDA collective", i);
    for (int polls = 0;; polls++) {
        smddp_status_t st = poll_copy_in(op, op->stage->ready[i], what);
        if (st != SMDDP_IN_PROGRESS) return st;
        if (atomic_load(&comm->aborted))
            return smddp__error(SMDDP_ERR_ABORTED, "rank %d: aborted while %s was copied to the "
                                "host: %s", comm->rank, what, comm->abort_msg);
        if (polls > 100) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

smddp_status_t smddp__cuda_stage_run(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn host)
{
    smddp__stage_t *s = op->stage;
    size_t es = smddp__dtype_size(op->dtype), off, n;
    /* A reduce's non-roots get no result (the host path may use it as scratch). */
    bool gets = op->recvbuf && (op->kind != SMDDP_OP_REDUCE || op->root == comm->rank);
    for (int i = 0; i < s->nchunks; i++) {
        if (s->copied_in) SMDDP_CHECK(wait_ready(comm, op, i));
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
        chunk_of(s, i, op->count * es, &off, &n);
        sub.count = elementwise(op->kind) ? n / es : op->count;
        sub.sendbuf = op->sendbuf ? s->host + off : NULL;
        sub.recvbuf = gets ? s->host + s->recv_off + off : NULL;
        SMDDP_CHECK(host(comm, &sub));
        __atomic_store_n(s->flag, (uint32_t)i + 1, __ATOMIC_RELEASE);
    }
    return SMDDP_OK;
}

smddp_status_t smddp__cuda_stage_finish(smddp__op_t *op, smddp_status_t st)
{
    smddp__stage_t *s = op->stage;
    if (!s) return st;
    op->stage = NULL;
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    if (s->dev_dst && st == SMDDP_OK && bytes > 0) {
        /* A receive: the message to the device, on the stream, before the request is done. */
        int prev;
        cudaStream_t stream = (cudaStream_t)op->stream;
        cudaError_t e = enter_device(s->device, &prev);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(s->dev_dst, s->host + s->recv_off, bytes, cudaMemcpyHostToDevice,
                                stream);
        if (e == cudaSuccess) e = cudaEventRecord(s->done, stream);
        if (e == cudaSuccess) s->used = true;
        else st = cuda_fail("copying a received message to the device", e);
        leave_device(prev);
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
    char what[64];
    snprintf(what, sizeof(what), "a send of CUDA memory to rank %d", op->root);
    smddp_status_t st = poll_copy_in(op, s->ready[0], what);
    if (st == SMDDP_OK) s->copied_in = false; /* no need to ask again */
    return st;
}

static smddp_status_t stage_setup(smddp_comm_t comm)
{
    struct smddp__stage_pool *pool = calloc(1, sizeof(*pool));
    if (!pool) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate the CUDA staging pool");
    pthread_mutex_init(&pool->lock, NULL);
    comm->stages = pool;
    return SMDDP_OK;
}

static void stage_teardown(smddp_comm_t comm)
{
    struct smddp__stage_pool *pool = comm->stages;
    if (!pool) return;
    smddp__stage_t *s = pool->idle;
    while (s) {
        smddp__stage_t *next = s->next;
        stage_free(s);
        s = next;
    }
    pthread_mutex_destroy(&pool->lock);
    free(pool);
    comm->stages = NULL;
}

const smddp__transport_t smddp__cuda_stage_transport = {"CUDA staging", false, stage_setup,
                                                        stage_teardown, NULL};

#endif /* SMDDP_HAVE_CUDA */
