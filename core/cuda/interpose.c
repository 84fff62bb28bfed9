/*
 * The NCCL interposer (see interpose.h).
 *
 * A communicator is served once it has been bootstrapped: at the first call
 * smddp could serve on it, every rank learns through the real NCCL (one
 * ncclAllGather of a 16-byte record per rank, the only host synchronisation)
 * whether all ranks share this node and where rank 0's private store
 * listens; then each creates an smddp communicator of the same ranks through
 * that store. The decision to serve depends only on what every rank of a
 * collective sees alike (settings, dtype, op, memory type, group state), so
 * all ranks take the same path. Calls inside ncclGroupStart/End go to NCCL:
 * NCCL defers grouped calls to ncclGroupEnd, and serving one at once could
 * reorder it against its group on the stream.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interpose.h"

#include "../comm.h"
#include "../param.h"
#include "../queue.h"
#include "../request.h"
#include "../store/store.h"
#include "../topo.h"
#include "nccl.h"

#if SMDDP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define NCCL_EXPORT __attribute__((visibility("default")))

typedef int nccl_result_t;
enum { NCCL_OK = 0, NCCL_SYSTEM_ERROR = 2, NCCL_INTERNAL_ERROR = 3 };

static atomic_long served_count, forwarded_count;
static __thread int group_depth;

void smddp__ipose_counts(long *served, long *forwarded)
{
    *served = atomic_load(&served_count);
    *forwarded = atomic_load(&forwarded_count);
}

/* ---- the decision ----------------------------------------------------------- */

static bool map_dtype(int nccl, smddp_dtype_t *out)
{
    switch (nccl) {
    case SMDDP_NCCL_INT8: *out = SMDDP_INT8; return true;
    case SMDDP_NCCL_UINT8: *out = SMDDP_UINT8; return true;
    case SMDDP_NCCL_INT32: *out = SMDDP_INT32; return true;
    case SMDDP_NCCL_UINT32: *out = SMDDP_UINT32; return true;
    case SMDDP_NCCL_INT64: *out = SMDDP_INT64; return true;
    case SMDDP_NCCL_UINT64: *out = SMDDP_UINT64; return true;
    case SMDDP_NCCL_FLOAT16: *out = SMDDP_FLOAT16; return true;
    case SMDDP_NCCL_FLOAT32: *out = SMDDP_FLOAT32; return true;
    case SMDDP_NCCL_FLOAT64: *out = SMDDP_FLOAT64; return true;
    case SMDDP_NCCL_BFLOAT16: *out = SMDDP_BFLOAT16; return true;
    default: return false; /* fp8 */
    }
}

static bool map_op(int nccl, smddp_op_t *out)
{
    switch (nccl) {
    case SMDDP_NCCL_SUM: *out = SMDDP_SUM; return true;
    case SMDDP_NCCL_PROD: *out = SMDDP_PROD; return true;
    case SMDDP_NCCL_MAX: *out = SMDDP_MAX; return true;
    case SMDDP_NCCL_MIN: *out = SMDDP_MIN; return true;
    case SMDDP_NCCL_AVG: *out = SMDDP_AVG; return true;
    default: return false; /* ops made with ncclRedOpCreatePreMulSum */
    }
}

const char *smddp__ipose_route(const smddp__ipose_call_t *c, smddp_dtype_t *dtype, smddp_op_t *op)
{
    if (!c->enabled) return "smddp's collectives are off (USE_SMDDP_COLLECTIVES is not 1, or the "
                            "communication backend is nccl)";
    if (!SMDDP_HAVE_CUDA) return "this libsmddp was built without CUDA";
    if (c->in_group) return "the call is inside ncclGroupStart/ncclGroupEnd";
    if (!map_dtype(c->nccl_dtype, dtype)) return "smddp has no such dtype (fp8)";
    *op = SMDDP_SUM;
    if (c->kind != SMDDP_IPOSE_ALLGATHER && !map_op(c->nccl_op, op))
        return "the reduction is a custom NCCL op (ncclRedOpCreatePreMulSum)";
    if (!c->device_memory) return "a buffer is not CUDA device memory";
    if (c->comm_refused) return c->comm_refused;
    return NULL;
}

/* ---- the real NCCL ---------------------------------------------------------------- */

static void *real_sym(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (f) return f;
    const char *why = NULL;
    const smddp__nccl_api_t *api = smddp__nccl(&why);
    return api ? dlsym(api->lib, name) : NULL;
}

#define REAL(type, name)                                                              \
    static type real_##name;                                                          \
    if (!real_##name) *(void **)&real_##name = real_sym(#name);                       \
    if (!real_##name) {                                                               \
        SMDDP_WARN("interposed %s: no NCCL to hand it to (%s not found after "        \
                   "libsmddp, and SMDDP_NCCL_LIBRARY/libnccl.so.2 did not load)",     \
                   #name, #name);                                                     \
        return NCCL_SYSTEM_ERROR;                                                     \
    }

/* Says once per distinct reason why calls go to NCCL. */
static void note_forward(const char *fn, const char *why)
{
    static const char *said[16];
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    atomic_fetch_add(&forwarded_count, 1);
    if (smddp__log_level() < SMDDP_LOG_INFO) return;
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < 16 && said[i] && said[i] != why) i++;
    bool first = i < 16 && !said[i];
    if (first) said[i] = why;
    pthread_mutex_unlock(&lock);
    if (first) SMDDP_INFO("%s goes to NCCL: %s (said once per reason)", fn, why);
}

static bool enabled(void)
{
    const char *use = getenv("USE_SMDDP_COLLECTIVES");
    return use && strcmp(use, "1") == 0 && smddp__params()->comm_backend == SMDDP_BACKEND_AUTO;
}

#if SMDDP_HAVE_CUDA

static bool is_device(const void *p)
{
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* ---- communicators ------------------------------------------------------------- */

typedef struct served_comm {
    void *nccl;
    smddp_comm_t comm;       /* NULL when refused */
    char refused[256];
    struct served_comm *next;
} served_comm_t;

static served_comm_t *comms;
static pthread_mutex_t comms_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct boot_record {
    uint64_t node;   /* hash of the node name */
    int32_t port;    /* rank 0: its store's port, 0 if it failed to start */
    int32_t pad;
} boot_record_t;

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The collective first contact of a communicator; fills e->comm or e->refused. */
static void bootstrap(served_comm_t *e, void *nccl, void *stream)
{
    typedef nccl_result_t (*rank_fn)(void *, int *);
    typedef nccl_result_t (*gather_fn)(const void *, void *, size_t, int, void *, void *);
    rank_fn user_rank = (rank_fn)real_sym("ncclCommUserRank");
    rank_fn count = (rank_fn)real_sym("ncclCommCount");
    gather_fn gather = (gather_fn)real_sym("ncclAllGather");
    int rank = -1, nranks = 0;
    if (!user_rank || !count || !gather || user_rank(nccl, &rank) != 0 || count(nccl, &nranks) != 0) {
        snprintf(e->refused, sizeof(e->refused), "the real NCCL does not say this "
                                                  "communicator's rank and size");
        return;
    }
    smddp__tcp_server_t *server = NULL;
    boot_record_t mine = {0, 0, 0}, *all = calloc((size_t)nranks, sizeof(boot_record_t));
    char name[256];
    smddp__node_name(name, sizeof(name));
    mine.node = fnv1a(name);
    if (rank == 0) {
        int port = 0;
        if (smddp__tcp_server_start("127.0.0.1", 0, &server, &port) == SMDDP_OK) mine.port = port;
    }
    void *dev = NULL;
    bool ok = all && cudaMalloc(&dev, (size_t)nranks * sizeof(boot_record_t)) == cudaSuccess;
    char *slot = ok ? (char *)dev + (size_t)rank * sizeof(boot_record_t) : NULL;
    ok = ok && cudaMemcpyAsync(slot, &mine, sizeof(mine), cudaMemcpyHostToDevice, stream) == cudaSuccess;
    ok = ok && gather(slot, dev, sizeof(mine), SMDDP_NCCL_UINT8, nccl, stream) == 0;
    ok = ok && cudaMemcpyAsync(all, dev, (size_t)nranks * sizeof(mine), cudaMemcpyDeviceToHost,
                               stream) == cudaSuccess;
    ok = ok && cudaStreamSynchronize(stream) == cudaSuccess;
    if (dev) cudaFree(dev);
    if (!ok) {
        (void)cudaGetLastError();
        snprintf(e->refused, sizeof(e->refused), "its bootstrap through NCCL failed");
    } else {
        for (int r = 1; r < nranks && !e->refused[0]; r++)
            if (all[r].node != all[0].node)
                snprintf(e->refused, sizeof(e->refused),
                         "its ranks span nodes; smddp serves NCCL calls inside one node");
        if (!e->refused[0] && all[0].port == 0)
            snprintf(e->refused, sizeof(e->refused), "rank 0 could not start its store");
    }
    if (!e->refused[0]) {
        smddp_store_t store;
        smddp_status_t st = smddp__tcp_client_connect("127.0.0.1", all[0].port, 60000, server, &store);
        if (st == SMDDP_OK) {
            server = NULL; /* the client owns it now */
            smddp__store_ref_t *ref = smddp__store_ref_new(&store);
            st = ref ? smddp__comm_create(ref, rank, nranks, "smddp-nccl", smddp__timeout_ms(-1),
                                          &e->comm)
                     : SMDDP_ERR_NO_MEMORY;
            if (ref && st != SMDDP_OK) ref->table.release = NULL; /* released below */
            smddp__store_unref(ref);
            if (st != SMDDP_OK) store.release(store.ctx);
        }
        if (st != SMDDP_OK)
            snprintf(e->refused, sizeof(e->refused), "creating its smddp communicator failed: %s",
                     smddp__last_error());
        else
            SMDDP_INFO("NCCL communicator %p (rank %d of %d): its allreduce, allgather and "
                       "reduce_scatter on CUDA memory are served by smddp", nccl, rank, nranks);
    }
    if (e->refused[0])
        SMDDP_WARN("NCCL communicator %p: not served by smddp, every call goes to NCCL: %s", nccl,
                   e->refused);
    smddp__tcp_server_stop(server);
    free(all);
}

/* Issues the call as the core's own op on the caller's stream, and waits for its issue. */
static smddp_status_t serve(smddp_comm_t comm, smddp__ipose_kind_t kind, const void *send,
                            void *recv, size_t count, smddp_dtype_t dt, smddp_op_t sop,
                            void *stream)
{
    static const smddp__op_kind_t kinds[] = {
        [SMDDP_IPOSE_ALLREDUCE] = SMDDP_OP_ALLREDUCE,
        [SMDDP_IPOSE_ALLGATHER] = SMDDP_OP_ALLGATHER,
        [SMDDP_IPOSE_REDUCE_SCATTER] = SMDDP_OP_REDUCE_SCATTER,
    };
    smddp__op_t *op = smddp__op_make(comm, kinds[kind], send, recv, count, dt, sop, -1);
    if (!op) return SMDDP_ERR_NO_MEMORY;
    op->mem_type = SMDDP_MEM_CUDA;
    op->stream = stream;
    return smddp__issue(comm, op, NULL);
}

static served_comm_t *find_or_boot(void *nccl, void *stream)
{
    pthread_mutex_lock(&comms_lock);
    served_comm_t *e = comms;
    while (e && e->nccl != nccl) e = e->next;
    if (!e && (e = calloc(1, sizeof(*e))) != NULL) {
        e->nccl = nccl;
        bootstrap(e, nccl, stream);
        e->next = comms;
        comms = e;
    }
    pthread_mutex_unlock(&comms_lock);
    return e;
}

static void forget(void *nccl)
{
    pthread_mutex_lock(&comms_lock);
    for (served_comm_t **p = &comms; *p; p = &(*p)->next)
        if ((*p)->nccl == nccl) {
            served_comm_t *e = *p;
            *p = e->next;
            if (e->comm) smddp__comm_destroy(e->comm);
            free(e);
            break;
        }
    pthread_mutex_unlock(&comms_lock);
}

#else

static bool is_device(const void *p)
{
    (void)p;
    return false;
}

static void forget(void *nccl)
{
    (void)nccl;
}

#endif

/*
 * Serves the call if it can: returns true with *res set, or false after
 * counting it as handed to NCCL.
 */
static bool try_serve(const char *fn, smddp__ipose_kind_t kind, const void *send, void *recv,
                      size_t count, int dtype, int op, void *nccl, void *stream,
                      nccl_result_t *res)
{
    /* The cheap checks first (taking the memory as device memory), then the real memory type. */
    smddp__ipose_call_t c = {kind, dtype, op, enabled(), group_depth > 0, true, NULL};
    smddp_dtype_t dt;
    smddp_op_t sop;
    const char *why = smddp__ipose_route(&c, &dt, &sop);
    if (!why) {
        c.device_memory = is_device(send) && is_device(recv);
        why = smddp__ipose_route(&c, &dt, &sop);
    }
#if SMDDP_HAVE_CUDA
    served_comm_t *e = NULL;
    if (!why) {
        e = find_or_boot(nccl, stream);
        c.comm_refused = !e ? "out of memory" : e->refused[0] ? e->refused : NULL;
        why = smddp__ipose_route(&c, &dt, &sop);
    }
    if (!why) {
        smddp_status_t st = serve(e->comm, kind, send, recv, count, dt, sop, stream);
        if (st != SMDDP_OK) SMDDP_WARN("%s served by smddp failed: %s", fn, smddp__last_error());
        atomic_fetch_add(&served_count, 1);
        *res = st == SMDDP_OK ? NCCL_OK : NCCL_INTERNAL_ERROR;
        return true;
    }
#else
    (void)send, (void)recv, (void)count, (void)nccl, (void)stream, (void)res;
#endif
    note_forward(fn, why);
    return false;
}

/* ---- the interposed calls ---------------------------------------------------------- */

typedef nccl_result_t (*reduce_fn)(const void *, void *, size_t, int, int, void *, void *);
typedef nccl_result_t (*gather_fn)(const void *, void *, size_t, int, void *, void *);
typedef nccl_result_t (*comm_fn)(void *);
typedef nccl_result_t (*void_fn)(void);

NCCL_EXPORT nccl_result_t ncclAllReduce(const void *send, void *recv, size_t count, int dtype,
                                        int op, void *comm, void *stream)
{
    nccl_result_t res = 0; /* set by try_serve when it serves */
    if (try_serve("ncclAllReduce", SMDDP_IPOSE_ALLREDUCE, send, recv, count, dtype, op, comm,
                  stream, &res))
        return res;
    REAL(reduce_fn, ncclAllReduce)
    return real_ncclAllReduce(send, recv, count, dtype, op, comm, stream);
}

NCCL_EXPORT nccl_result_t ncclReduceScatter(const void *send, void *recv, size_t count, int dtype,
                                            int op, void *comm, void *stream)
{
    nccl_result_t res = 0; /* set by try_serve when it serves */
    if (try_serve("ncclReduceScatter", SMDDP_IPOSE_REDUCE_SCATTER, send, recv, count, dtype, op,
                  comm, stream, &res))
        return res;
    REAL(reduce_fn, ncclReduceScatter)
    return real_ncclReduceScatter(send, recv, count, dtype, op, comm, stream);
}

NCCL_EXPORT nccl_result_t ncclAllGather(const void *send, void *recv, size_t count, int dtype,
                                        void *comm, void *stream)
{
    nccl_result_t res = 0; /* set by try_serve when it serves */
    if (try_serve("ncclAllGather", SMDDP_IPOSE_ALLGATHER, send, recv, count, dtype, -1, comm,
                  stream, &res))
        return res;
    REAL(gather_fn, ncclAllGather)
    return real_ncclAllGather(send, recv, count, dtype, comm, stream);
}

NCCL_EXPORT nccl_result_t ncclGroupStart(void)
{
    REAL(void_fn, ncclGroupStart)
    nccl_result_t r = real_ncclGroupStart();
    if (r == NCCL_OK) group_depth++;
    return r;
}

NCCL_EXPORT nccl_result_t ncclGroupEnd(void)
{
    REAL(void_fn, ncclGroupEnd)
    if (group_depth > 0) group_depth--;
    return real_ncclGroupEnd();
}

NCCL_EXPORT nccl_result_t ncclCommDestroy(void *comm)
{
    forget(comm);
    REAL(comm_fn, ncclCommDestroy)
    return real_ncclCommDestroy(comm);
}

NCCL_EXPORT nccl_result_t ncclCommAbort(void *comm)
{
    forget(comm);
    REAL(comm_fn, ncclCommAbort)
    return real_ncclCommAbort(comm);
}
