/*
 * A stand-in for the CUDA runtime, on the CPU, for testing libsmddp's CUDA
 * code paths that do not need a GPU's arithmetic: host staging across nodes
 * and send/recv of "device" memory (core/cuda/stage.c).
 *
 * "Device" memory is host memory handed out by cudaMalloc and remembered.
 * Each stream is a worker thread that runs its queue in order: copies, event
 * records, waits on events, and the kernel that waits for a host flag
 * (smddp__cuda_wait_flag), which really waits. So the ordering a stream
 * promises, and every wait between the host and "the GPU", behave as on a
 * GPU, and a missed release of a flag hangs the stream as it would there.
 * Only what libsmddp and its tests call is here; IPC and the reduction and
 * collective kernels answer cudaErrorNotSupported.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda/ipc_kernels.h"
#include "cuda/kernels.h"

enum { OP_COPY, OP_COPY2D, OP_MARK, OP_WAIT_FLAG, OP_WAIT_EVENT };

typedef struct fop {
    int kind;
    void *dst;
    const void *src;
    size_t n, dpitch, spitch, rows;
    const uint32_t *flag;
    uint32_t value;
    struct CUstream_st *wait_stream; /* OP_WAIT_EVENT: until that stream has run wait_seq */
    uint64_t wait_seq;
    uint64_t seq;
    struct fop *next;
} fop_t;

struct CUstream_st {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    fop_t *head, *tail;
    uint64_t enqueued;
    _Atomic uint64_t done;
    bool stopping;
    pthread_t thread;
};

struct CUevent_st {
    struct CUstream_st *stream; /* where it was last recorded (NULL: never, or complete) */
    uint64_t seq;
    struct CUevent_st *next;    /* every live event (g_events), under g_lock */
};

static struct CUevent_st *g_events;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st *g_default;
static pid_t g_default_pid;

typedef struct region {
    char *p;
    size_t n;
    bool device;
} region_t;
static region_t g_regions[4096];
static int g_nregions;

static void nap(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

static void *worker(void *arg)
{
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stopping) pthread_cond_wait(&s->cond, &s->lock);
        if (!s->head) break;
        fop_t *op = s->head;
        pthread_mutex_unlock(&s->lock);
        switch (op->kind) {
        case OP_COPY: memcpy(op->dst, op->src, op->n); break;
        case OP_COPY2D:
            for (size_t r = 0; r < op->rows; r++)
                memcpy((char *)op->dst + r * op->dpitch, (const char *)op->src + r * op->spitch,
                       op->n);
            break;
        case OP_WAIT_FLAG:
            while (__atomic_load_n(op->flag, __ATOMIC_ACQUIRE) < op->value) nap();
            break;
        case OP_WAIT_EVENT:
            while (atomic_load(&op->wait_stream->done) < op->wait_seq) nap();
            break;
        default: break;
        }
        pthread_mutex_lock(&s->lock);
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        atomic_store(&s->done, op->seq);
        pthread_cond_broadcast(&s->cond);
        free(op);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static struct CUstream_st *stream_new(void)
{
    struct CUstream_st *s = calloc(1, sizeof(*s));
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    pthread_create(&s->thread, NULL, worker, s);
    return s;
}

/* The default stream, one per process (a forked rank makes its own). */
static struct CUstream_st *resolve(cudaStream_t st)
{
    if (st) return st;
    pthread_mutex_lock(&g_lock);
    if (!g_default || g_default_pid != getpid()) {
        g_default = stream_new();
        g_default_pid = getpid();
    }
    struct CUstream_st *s = g_default;
    pthread_mutex_unlock(&g_lock);
    return s;
}

static uint64_t push(cudaStream_t st, fop_t op)
{
    struct CUstream_st *s = resolve(st);
    fop_t *o = malloc(sizeof(*o));
    *o = op;
    o->next = NULL;
    pthread_mutex_lock(&s->lock);
    uint64_t seq = o->seq = ++s->enqueued; /* o is the worker's once the lock goes */
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return seq;
}

static void drain(struct CUstream_st *s)
{
    pthread_mutex_lock(&s->lock);
    while (atomic_load(&s->done) < s->enqueued) pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
}

static void remember(void *p, size_t n, bool device)
{
    pthread_mutex_lock(&g_lock);
    if (g_nregions < (int)(sizeof(g_regions) / sizeof(g_regions[0])))
        g_regions[g_nregions++] = (region_t){p, n, device};
    pthread_mutex_unlock(&g_lock);
}

static void forget(void *p)
{
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_nregions; i++)
        if (g_regions[i].p == p) {
            g_regions[i] = g_regions[--g_nregions];
            break;
        }
    pthread_mutex_unlock(&g_lock);
}

/* ---- the runtime calls ------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count) { *count = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDevice(int *device) { *device = 0; return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t error) { return error ? "fake error" : "no error"; }
const char *cudaGetErrorName(cudaError_t error) { return error ? "cudaErrorFake" : "cudaSuccess"; }

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    *devPtr = calloc(1, size ? size : 1);
    remember(*devPtr, size ? size : 1, true);
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr)
{
    forget(devPtr);
    free(devPtr);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    (void)flags;
    *pHost = calloc(1, size ? size : 1);
    remember(*pHost, size ? size : 1, false);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    forget(ptr);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    (void)flags;
    *pDevice = pHost;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr)
{
    memset(a, 0, sizeof(*a));
    a->type = cudaMemoryTypeUnregistered;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_nregions; i++)
        if ((const char *)ptr >= g_regions[i].p && (const char *)ptr < g_regions[i].p + g_regions[i].n) {
            a->type = g_regions[i].device ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
            a->devicePointer = (void *)ptr;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    *pStream = stream_new();
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t st)
{
    drain(st);
    /* Its events are complete; they outlive it, as real ones do. */
    pthread_mutex_lock(&g_lock);
    for (struct CUevent_st *e = g_events; e; e = e->next)
        if (e->stream == st) e->stream = NULL;
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_lock(&st->lock);
    st->stopping = true;
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
    pthread_join(st->thread, NULL);
    free(st);
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t st, enum cudaStreamCaptureStatus *status)
{
    (void)st;
    *status = cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    drain(resolve(st));
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    drain(resolve(NULL));
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t st)
{
    (void)kind;
    push(st, (fop_t){.kind = OP_COPY, .dst = dst, .src = src, .n = count});
    return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t st)
{
    (void)kind;
    push(st, (fop_t){.kind = OP_COPY2D, .dst = dst, .src = src, .n = width, .dpitch = dpitch,
                     .spitch = spitch, .rows = height});
    return cudaSuccess;
}

/* Synchronous with respect to the default stream, as the real one is. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    (void)kind;
    drain(resolve(NULL));
    memcpy(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    drain(resolve(NULL));
    memset(devPtr, value, count);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    (void)flags;
    *event = calloc(1, sizeof(struct CUevent_st));
    pthread_mutex_lock(&g_lock);
    (*event)->next = g_events;
    g_events = *event;
    pthread_mutex_unlock(&g_lock);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    pthread_mutex_lock(&g_lock);
    for (struct CUevent_st **pp = &g_events; *pp; pp = &(*pp)->next)
        if (*pp == event) {
            *pp = event->next;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    free(event);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t st)
{
    struct CUstream_st *s = resolve(st);
    uint64_t seq = push(s, (fop_t){.kind = OP_MARK});
    pthread_mutex_lock(&g_lock);
    event->seq = seq;
    event->stream = s;
    pthread_mutex_unlock(&g_lock);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    pthread_mutex_lock(&g_lock);
    bool done = !event->stream || atomic_load(&event->stream->done) >= event->seq;
    pthread_mutex_unlock(&g_lock);
    return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    while (cudaEventQuery(event) == cudaErrorNotReady) nap();
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t event, unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&g_lock);
    fop_t op = {.kind = OP_WAIT_EVENT, .wait_stream = event->stream, .wait_seq = event->seq};
    pthread_mutex_unlock(&g_lock);
    if (op.wait_stream) push(st, op);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    snprintf(pciBusId, (size_t)len, "0000:00:%02x.0", device);
    return cudaSuccess;
}

/* One "multiprocessor"; no other attribute is known here. */
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    (void)device;
    if (attr != cudaDevAttrMultiProcessorCount) return cudaErrorNotSupported;
    *value = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *pciBusId)
{
    (void)pciBusId;
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
    *canAccessPeer = device == peerDevice;
    return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    (void)handle;
    (void)devPtr;
    return cudaErrorNotSupported;
}

cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    (void)devPtr;
    (void)handle;
    (void)flags;
    return cudaErrorNotSupported;
}

cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
    (void)devPtr;
    return cudaErrorNotSupported;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t event)
{
    (void)handle;
    (void)event;
    return cudaErrorNotSupported;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *event, cudaIpcEventHandle_t handle)
{
    (void)event;
    (void)handle;
    return cudaErrorNotSupported;
}

/* ---- the kernels (core/cuda/kernels.h) -------------------------------------- */

int smddp__cuda_reduce(const smddp__reduce_spec_t *spec, void *dst, const void *const *srcs,
                       int nsrc, size_t count, void *stream)
{
    (void)spec;
    (void)dst;
    (void)srcs;
    (void)nsrc;
    (void)count;
    (void)stream;
    return (int)cudaErrorNotSupported;
}

int smddp__ks_launch(const smddp__ks_comm_t *c, const smddp__ks_job_t *job,
                     const smddp__reduce_spec_t *spec, void *stream)
{
    (void)c;
    (void)job;
    (void)spec;
    (void)stream;
    return (int)cudaErrorNotSupported;
}

int smddp__cuda_wait_flag(const uint32_t *flag, uint32_t value, void *stream)
{
    push((cudaStream_t)stream, (fop_t){.kind = OP_WAIT_FLAG, .flag = flag, .value = value});
    return 0;
}
