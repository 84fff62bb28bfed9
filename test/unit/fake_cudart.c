/*
 * A stand-in for the CUDA runtime, on the CPU, for testing libsmddp's CUDA
 * code paths where no GPU is: host staging across nodes and send/recv of
 * "device" memory (core/cuda/stage.c), and the collectives inside a node
 * through CUDA IPC (core/cuda/ipc.c), on either synchronisation.
 *
 * "Device" memory is shared memory (a memfd per cudaMalloc) that other
 * processes map through an IPC handle naming the owner's pid and fd
 * (/proc/PID/fd/FD). Each stream is a worker thread that runs its queue in
 * order: copies, event records, waits on events (interprocess ones through
 * counters in shared memory), the kernel that waits for a host flag
 * (smddp__cuda_wait_flag), which really waits, reductions (smddp__reduce's
 * arithmetic) and the collective kernels (the CPU model of ks_model.c, a
 * thread per block). So the ordering a stream promises, and every wait
 * between the host, "the GPU" and peers, behave as on a GPU, and a missed
 * release hangs the stream as it would there. Only what libsmddp and its
 * tests call is here.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuda/ipc_kernels.h"
#include "cuda/kernels.h"
#include "ks_model.h"
#include "reduce/reduce.h"

enum { OP_COPY, OP_COPY2D, OP_MARK, OP_WAIT_FLAG, OP_WAIT_EVENT, OP_WAIT_IPC, OP_REDUCE, OP_KS };

/* An interprocess event's state, in shared memory: records made, and completed. */
typedef struct ipc_counts {
    _Atomic uint64_t recorded, completed;
} ipc_counts_t;

typedef struct fop {
    int kind;
    ipc_counts_t *ipc; /* OP_MARK of an interprocess event: completes `value64`; OP_WAIT_IPC: waits for it */
    uint64_t value64;
    smddp__reduce_spec_t spec;           /* OP_REDUCE, OP_KS */
    const void *srcs[SMDDP_CUDA_MAX_SRCS];
    int nsrc;
    smddp__ks_comm_t ks;                 /* OP_KS */
    smddp__ks_job_t job;
    void *owned;                         /* freed once the op has run */
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
    ipc_counts_t *ipc;          /* interprocess: shared counters (mapped), else NULL */
    int ipc_fd;                 /* the memfd holding them, in the process that created them */
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
    int fd;      /* device memory: its memfd (-1: a peer's, mapped through IPC) */
    uint64_t id; /* this process's cudaMalloc: which one (the driver's buffer ID) */
} region_t;
static uint64_t g_next_id;
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
        case OP_WAIT_IPC:
            while (atomic_load(&op->ipc->completed) < op->value64) nap();
            break;
        case OP_MARK:
            if (op->ipc) {
                uint64_t c = atomic_load(&op->ipc->completed);
                while (c < op->value64 && !atomic_compare_exchange_weak(&op->ipc->completed, &c, op->value64)) {}
            }
            break;
        case OP_REDUCE: smddp__reduce(&op->spec, op->dst, op->srcs, op->nsrc, op->n); break;
        case OP_KS:
            ks_model_launch(&op->ks, &op->job, &op->spec, ks_model_grid(&op->ks, &op->job), NULL);
            break;
        default: break;
        }
        pthread_mutex_lock(&s->lock);
        free(op->owned);
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

static void remember(void *p, size_t n, bool device, int fd)
{
    pthread_mutex_lock(&g_lock);
    if (g_nregions < (int)(sizeof(g_regions) / sizeof(g_regions[0])))
        g_regions[g_nregions++] = (region_t){p, n, device, fd, ++g_next_id};
    pthread_mutex_unlock(&g_lock);
}

/* Forgets p; returns its region (n == 0 if it was not known). */
static region_t forget(void *p)
{
    region_t r = {0};
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_nregions; i++)
        if (g_regions[i].p == p) {
            r = g_regions[i];
            g_regions[i] = g_regions[--g_nregions];
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* n bytes of zeroed shared memory, and the memfd that holds them. */
static void *shared_alloc(size_t n, int *fd)
{
    *fd = memfd_create("smddp-fake-cuda", MFD_CLOEXEC);
    if (*fd < 0 || ftruncate(*fd, (off_t)n) != 0) abort();
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    if (p == MAP_FAILED) abort();
    return p;
}

/* What an IPC handle names: the owner's memfd, and its size. */
typedef struct fake_handle {
    int32_t pid, fd;
    uint64_t n;
} fake_handle_t;

/* Maps the memory a handle names; NULL if its owner is gone. */
static void *shared_open(const fake_handle_t *h)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h->pid, (int)h->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return NULL;
    void *p = mmap(NULL, (size_t)h->n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
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
    int fd;
    size_t n = size ? size : 1;
    *devPtr = shared_alloc(n, &fd);
    remember(*devPtr, n, true, fd);
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr)
{
    region_t r = forget(devPtr);
    if (!r.n || !r.device || r.fd < 0) return cudaErrorInvalidValue;
    munmap(r.p, r.n);
    close(r.fd);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    (void)flags;
    *pHost = calloc(1, size ? size : 1);
    remember(*pHost, size ? size : 1, false, -1);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    region_t r = forget(ptr);
    if (!r.n || r.device) return cudaErrorInvalidValue;
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

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    (void)flags;
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

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    (void)mode;
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

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t st)
{
    /* A copy, on the stream, from a filled buffer the op owns. */
    char *fillbuf = malloc(count ? count : 1);
    memset(fillbuf, value, count);
    push(st, (fop_t){.kind = OP_COPY, .dst = devPtr, .src = fillbuf, .n = count, .owned = fillbuf});
    return cudaSuccess;
}

static void event_link(cudaEvent_t event)
{
    pthread_mutex_lock(&g_lock);
    event->next = g_events;
    g_events = event;
    pthread_mutex_unlock(&g_lock);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    *event = calloc(1, sizeof(struct CUevent_st));
    (*event)->ipc_fd = -1;
    if (flags & cudaEventInterprocess)
        (*event)->ipc = shared_alloc(sizeof(ipc_counts_t), &(*event)->ipc_fd);
    event_link(*event);
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
    if (event->ipc) munmap(event->ipc, sizeof(ipc_counts_t));
    if (event->ipc_fd >= 0) close(event->ipc_fd);
    free(event);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t st)
{
    struct CUstream_st *s = resolve(st);
    fop_t mark = {.kind = OP_MARK};
    if (event->ipc) {
        mark.ipc = event->ipc;
        mark.value64 = atomic_fetch_add(&event->ipc->recorded, 1) + 1;
    }
    uint64_t seq = push(s, mark);
    pthread_mutex_lock(&g_lock);
    event->seq = seq;
    event->stream = s;
    pthread_mutex_unlock(&g_lock);
    return cudaSuccess;
}

/* Captures are never active here: an external record is a record. */
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t st, unsigned int flags)
{
    (void)flags;
    return cudaEventRecord(event, st);
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    if (event->ipc)
        return atomic_load(&event->ipc->completed) >= atomic_load(&event->ipc->recorded)
                   ? cudaSuccess
                   : cudaErrorNotReady;
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
    if (event->ipc) {
        /* The latest record anywhere, as of this call. */
        push(st, (fop_t){.kind = OP_WAIT_IPC, .ipc = event->ipc,
                         .value64 = atomic_load(&event->ipc->recorded)});
        return cudaSuccess;
    }
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

/*
 * 16 "multiprocessors": the collective kernels' grids (half, shared among the
 * ranks on this one GPU) then have several blocks. Nothing else is known.
 */
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    (void)device;
    if (attr != cudaDevAttrMultiProcessorCount) return cudaErrorNotSupported;
    *value = 16;
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

_Static_assert(sizeof(fake_handle_t) <= sizeof(cudaIpcMemHandle_t) &&
                   sizeof(fake_handle_t) <= sizeof(cudaIpcEventHandle_t),
               "a fake handle fits in a real one");

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    fake_handle_t h = {0};
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_nregions; i++)
        if (g_regions[i].p == devPtr && g_regions[i].device && g_regions[i].fd >= 0)
            h = (fake_handle_t){(int32_t)getpid(), g_regions[i].fd, g_regions[i].n};
    pthread_mutex_unlock(&g_lock);
    if (!h.n) return cudaErrorInvalidValue;
    memset(handle, 0, sizeof(*handle));
    memcpy(handle, &h, sizeof(h));
    return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    (void)flags;
    fake_handle_t h;
    memcpy(&h, &handle, sizeof(h));
    void *p = shared_open(&h);
    if (!p) return cudaErrorInvalidResourceHandle;
    remember(p, (size_t)h.n, true, -1);
    *devPtr = p;
    return cudaSuccess;
}

/* The driver's cuPointerGetAttributes, for the attributes libsmddp asks for. */
static CUresult fake_get_attributes(unsigned int n, CUpointer_attribute *what, void **data,
                                    CUdeviceptr ptr)
{
    region_t r = {0};
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_nregions; i++)
        if (g_regions[i].device && (uintptr_t)ptr >= (uintptr_t)g_regions[i].p &&
            (uintptr_t)ptr < (uintptr_t)g_regions[i].p + g_regions[i].n)
            r = g_regions[i];
    pthread_mutex_unlock(&g_lock);
    if (!r.n) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned int i = 0; i < n; i++) {
        switch (what[i]) {
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *(CUdeviceptr *)data[i] = (CUdeviceptr)(uintptr_t)r.p;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data[i] = r.n; break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data[i] = r.id; break;
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data[i] = r.fd >= 0; break;
        default: return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status)
{
    (void)cudaVersion;
    (void)flags;
    bool known = strcmp(symbol, "cuPointerGetAttributes") == 0;
    *funcPtr = known ? (void *)fake_get_attributes : NULL;
    if (status) *status = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
    region_t r = forget(devPtr);
    if (!r.n || r.fd >= 0) return cudaErrorInvalidValue;
    munmap(r.p, r.n);
    return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t event)
{
    if (!event->ipc || event->ipc_fd < 0) return cudaErrorInvalidResourceHandle;
    fake_handle_t h = {(int32_t)getpid(), event->ipc_fd, sizeof(ipc_counts_t)};
    memset(handle, 0, sizeof(*handle));
    memcpy(handle, &h, sizeof(h));
    return cudaSuccess;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *event, cudaIpcEventHandle_t handle)
{
    fake_handle_t h;
    memcpy(&h, &handle, sizeof(h));
    ipc_counts_t *counts = shared_open(&h);
    if (!counts) return cudaErrorInvalidResourceHandle;
    *event = calloc(1, sizeof(struct CUevent_st));
    (*event)->ipc = counts;
    (*event)->ipc_fd = -1;
    event_link(*event);
    return cudaSuccess;
}

/* ---- the kernels (core/cuda/kernels.h) -------------------------------------- */

int smddp__cuda_reduce(const smddp__reduce_spec_t *spec, void *dst, const void *const *srcs,
                       int nsrc, size_t count, void *stream)
{
    if (nsrc < 1 || nsrc > SMDDP_CUDA_MAX_SRCS) return (int)cudaErrorInvalidValue;
    if (count == 0) return 0;
    fop_t op = {.kind = OP_REDUCE, .spec = *spec, .dst = dst, .nsrc = nsrc, .n = count};
    for (int i = 0; i < nsrc; i++) op.srcs[i] = srcs[i];
    push((cudaStream_t)stream, op);
    return 0;
}

int smddp__ks_launch(const smddp__ks_comm_t *c, const smddp__ks_job_t *job,
                     const smddp__reduce_spec_t *spec, void *stream)
{
    if (c->nranks < 1 || c->nranks > SMDDP_KS_MAX_RANKS || c->max_blocks < 1)
        return (int)cudaErrorInvalidValue;
    if (job->bytes == 0) return 0;
    push((cudaStream_t)stream, (fop_t){.kind = OP_KS, .ks = *c, .job = *job, .spec = *spec});
    return 0;
}

int smddp__cuda_wait_flag(const uint32_t *flag, uint32_t value, void *stream)
{
    push((cudaStream_t)stream, (fop_t){.kind = OP_WAIT_FLAG, .flag = flag, .value = value});
    return 0;
}
