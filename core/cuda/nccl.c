/*
 * CUDA collectives through NCCL, loaded at run time (see nccl.h).
 *
 * The NCCL communicator of an smddp communicator is created by the first
 * collective routed to it: rank 0 takes a unique id from NCCL and publishes it
 * through the store, every rank joins with ncclCommInitRank on the buffer's
 * device. Every routed collective is then one NCCL call (grouped sends and
 * receives for the all-to-alls, gather and scatter) on the caller's stream.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../dl.h"
#include "../param.h"
#include "../reduce/half.h"
#include "nccl.h"

static smddp__nccl_api_t api;
static const char *api_error;
static char api_error_buf[512];
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static void load(void)
{
    const char *path = smddp__params()->nccl_library[0] ? smddp__params()->nccl_library
                                                        : "libnccl.so.2";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(api_error_buf, sizeof(api_error_buf), "dlopen(%s) failed: %s", path, dlerror());
        api_error = api_error_buf;
        return;
    }
#define SYM(field) {"nccl" #field, SMDDP_DL_SLOT(api.field)}
    const smddp__dl_sym_t syms[] = {
        SYM(GetVersion),
        SYM(GetErrorString),
        SYM(GetUniqueId),
        SYM(CommInitRank),
        SYM(CommDestroy),
        SYM(CommAbort),
        SYM(AllReduce),
        SYM(Reduce),
        SYM(Broadcast),
        SYM(AllGather),
        SYM(ReduceScatter),
        SYM(Send),
        SYM(Recv),
        SYM(GroupStart),
        SYM(GroupEnd),
        SYM(RedOpCreatePreMulSum),
        SYM(RedOpDestroy),
    };
#undef SYM
    const char *missing = smddp__dl_resolve(lib, syms, sizeof(syms) / sizeof(syms[0]));
    if (missing) {
        snprintf(api_error_buf, sizeof(api_error_buf), "%s has no %s", path, missing);
        api_error = api_error_buf;
        return;
    }
    api.lib = lib;
    if (api.GetVersion(&api.version) != 0 || api.version < 21000) {
        snprintf(api_error_buf, sizeof(api_error_buf),
                 "%s is NCCL %d; libsmddp needs 2.10 or newer (bf16, avg, premul_sum)", path,
                 api.version);
        api_error = api_error_buf;
        return;
    }
    SMDDP_INFO("NCCL %d.%d.%d loaded from %s for CUDA collectives smddp hands over", api.version / 10000,
               api.version / 100 % 100, api.version % 100, path);
}

const smddp__nccl_api_t *smddp__nccl(const char **why)
{
    pthread_once(&api_once, load);
    if (api_error) {
        if (why) *why = api_error;
        return NULL;
    }
    return &api;
}

/* ---- routing ---------------------------------------------------------------- */

/*
 * NCCL's dtype for op's elements; -1 where NCCL has none. int16 and uint16,
 * which NCCL lacks, travel as float16 when they only move (NCCL does not
 * touch the bits of data it does not reduce); they cannot be reduced there.
 */
static int nccl_dtype(const smddp__op_t *op)
{
    bool reduces = smddp__op_traits(op->kind)->reduces;
    switch (op->dtype) {
    case SMDDP_INT16:
    case SMDDP_UINT16: return reduces ? -1 : SMDDP_NCCL_FLOAT16;
    case SMDDP_INT8: return SMDDP_NCCL_INT8;
    case SMDDP_UINT8: return SMDDP_NCCL_UINT8;
    case SMDDP_INT32: return SMDDP_NCCL_INT32;
    case SMDDP_UINT32: return SMDDP_NCCL_UINT32;
    case SMDDP_INT64: return SMDDP_NCCL_INT64;
    case SMDDP_UINT64: return SMDDP_NCCL_UINT64;
    case SMDDP_FLOAT16: return SMDDP_NCCL_FLOAT16;
    case SMDDP_BFLOAT16: return SMDDP_NCCL_BFLOAT16;
    case SMDDP_FLOAT32: return SMDDP_NCCL_FLOAT32;
    case SMDDP_FLOAT64: return SMDDP_NCCL_FLOAT64;
    default: return -1;
    }
}

bool smddp__nccl_has_op(const smddp__op_t *op)
{
    if (nccl_dtype(op) < 0) return false;
    if (!smddp__op_traits(op->kind)->reduces) return true;
    switch (op->spec.op) {
    case SMDDP_BAND:
    case SMDDP_BOR:
    case SMDDP_BXOR: return false;
    default: return true;
    }
}

/* ---- execution -------------------------------------------------------------- */

static smddp_status_t nccl_error(smddp_comm_t comm, const char *what, int res)
{
    return smddp__error(SMDDP_ERR_SYSTEM, "rank %d: %s failed: NCCL error %d (%s)", comm->rank,
                        what, res, api.GetErrorString(res));
}

#define NCCL_TRY(comm, call)                                                  \
    do {                                                                      \
        int r_ = (call);                                                      \
        if (r_ != 0) return nccl_error((comm), #call, r_);                    \
    } while (0)

static smddp_status_t init_comm(smddp_comm_t comm)
{
    smddp__nccl_id_t id;
    char key[320];
    snprintf(key, sizeof(key), "%s/nccl/id", comm->prefix);
    if (comm->rank == 0) {
        NCCL_TRY(comm, api.GetUniqueId(&id));
        SMDDP_CHECK(smddp__store_set(comm->store, key, &id, sizeof(id)));
    } else {
        void *v = NULL;
        size_t len = 0;
        SMDDP_CHECK(smddp__store_get(comm->store, key, comm->timeout_ms, &v, &len));
        if (len != sizeof(id)) {
            free(v);
            return smddp__error(SMDDP_ERR_STORE, "rank %d: the NCCL id under %s has %zu bytes, "
                                                 "expected %zu", comm->rank, key, len, sizeof(id));
        }
        memcpy(&id, v, sizeof(id));
        free(v);
    }
    smddp__nccl_comm_t nc = NULL;
    NCCL_TRY(comm, api.CommInitRank(&nc, comm->size, id, comm->rank));
    comm->nccl = nc;
    return SMDDP_OK;
}

/* The premul factor in the element type, for ncclRedOpCreatePreMulSum. */
static void premul_scalar(smddp_dtype_t dt, double f, void *out)
{
    float f32 = (float)f;
    uint16_t h;
    switch (dt) {
    case SMDDP_FLOAT64: memcpy(out, &f, 8); break;
    case SMDDP_FLOAT16: h = smddp__fp32_to_fp16(f32); memcpy(out, &h, 2); break;
    case SMDDP_BFLOAT16: h = smddp__fp32_to_bf16(f32); memcpy(out, &h, 2); break;
    default: memcpy(out, &f32, 4); break;
    }
}

/* Grouped sends and receives: block r of send (scount[r] at sdispl[r]) to r, and back. */
static smddp_status_t exchange(smddp_comm_t comm, smddp__op_t *op, const int64_t *scount,
                               const int64_t *sdispl, const int64_t *rcount,
                               const int64_t *rdispl)
{
    smddp__nccl_comm_t nc = comm->nccl;
    size_t es = smddp__dtype_size(op->dtype);
    int dt = nccl_dtype(op);
    NCCL_TRY(comm, api.GroupStart());
    for (int r = 0; r < comm->size; r++) {
        if (scount[r] > 0) {
            int res = api.Send((const char *)op->sendbuf + (size_t)sdispl[r] * es, (size_t)scount[r],
                               dt, r, nc, op->stream);
            if (res != 0) {
                api.GroupEnd();
                return nccl_error(comm, "ncclSend", res);
            }
        }
        if (rcount[r] > 0) {
            int res = api.Recv((char *)op->recvbuf + (size_t)rdispl[r] * es, (size_t)rcount[r], dt,
                               r, nc, op->stream);
            if (res != 0) {
                api.GroupEnd();
                return nccl_error(comm, "ncclRecv", res);
            }
        }
    }
    NCCL_TRY(comm, api.GroupEnd());
    return SMDDP_OK;
}

/* Uniform blocks for alltoall, gather and scatter, as exchange() tables. */
static smddp_status_t uniform(smddp_comm_t comm, smddp__op_t *op, bool send_all, bool recv_all)
{
    int p = comm->size;
    int64_t *t = calloc((size_t)p * 4, sizeof(int64_t));
    if (!t) return smddp__error(SMDDP_ERR_NO_MEMORY, "out of memory");
    int64_t n = (int64_t)op->count;
    int root = op->root;
    for (int r = 0; r < p; r++) {
        /* gather: everyone sends its one block to the root; scatter: the reverse. */
        bool s = send_all || (op->kind == SMDDP_OP_GATHER && r == root) ||
                 (op->kind == SMDDP_OP_SCATTER && comm->rank == root);
        bool v = recv_all || (op->kind == SMDDP_OP_GATHER && comm->rank == root) ||
                 (op->kind == SMDDP_OP_SCATTER && r == root);
        t[r] = s ? n : 0;
        t[p + r] = op->kind == SMDDP_OP_GATHER ? 0 : (int64_t)r * n;
        t[2 * p + r] = v ? n : 0;
        t[3 * p + r] = op->kind == SMDDP_OP_SCATTER ? 0 : (int64_t)r * n;
    }
    smddp_status_t st = exchange(comm, op, t, t + p, t + 2 * p, t + 3 * p);
    free(t);
    return st;
}

/* One NCCL call per kind: dt and redop are NCCL's values for op's dtype and reduction. */
typedef struct nccl_call {
    smddp_comm_t comm;
    smddp__op_t *op;
    smddp__nccl_comm_t nc;
    int dt, redop;
    const char *name; /* set by calls that return an NCCL result */
} nccl_call_t;

static int nccl_allreduce(nccl_call_t *c)
{
    c->name = "ncclAllReduce";
    return api.AllReduce(c->op->sendbuf, c->op->recvbuf, c->op->count, c->dt, c->redop, c->nc,
                         c->op->stream);
}

static int nccl_reduce(nccl_call_t *c)
{
    c->name = "ncclReduce";
    return api.Reduce(c->op->sendbuf, c->op->recvbuf, c->op->count, c->dt, c->redop, c->op->root,
                      c->nc, c->op->stream);
}

static int nccl_reduce_scatter(nccl_call_t *c)
{
    c->name = "ncclReduceScatter";
    return api.ReduceScatter(c->op->sendbuf, c->op->recvbuf, c->op->count, c->dt, c->redop, c->nc,
                             c->op->stream);
}

static int nccl_broadcast(nccl_call_t *c)
{
    c->name = "ncclBroadcast";
    return api.Broadcast(c->op->recvbuf, c->op->recvbuf, c->op->count, c->dt, c->op->root, c->nc,
                         c->op->stream);
}

static int nccl_allgather(nccl_call_t *c)
{
    c->name = "ncclAllGather";
    return api.AllGather(c->op->sendbuf, c->op->recvbuf, c->op->count, c->dt, c->nc, c->op->stream);
}

/* The calls built of sends and receives fail with smddp's message (c->name stays NULL). */
static int nccl_alltoall(nccl_call_t *c) { return uniform(c->comm, c->op, true, true); }
static int nccl_gather_scatter(nccl_call_t *c) { return uniform(c->comm, c->op, false, false); }

static int nccl_alltoallv(nccl_call_t *c)
{
    int p = c->comm->size;
    const int64_t *v = c->op->v;
    return exchange(c->comm, c->op, v, v + p, v + 2 * p, v + 3 * p);
}

static int (*const nccl_calls[SMDDP_OP_KIND_COUNT])(nccl_call_t *) = {
    [SMDDP_OP_ALLREDUCE] = nccl_allreduce,    [SMDDP_OP_REDUCE] = nccl_reduce,
    [SMDDP_OP_REDUCE_SCATTER] = nccl_reduce_scatter, [SMDDP_OP_BROADCAST] = nccl_broadcast,
    [SMDDP_OP_ALLGATHER] = nccl_allgather,    [SMDDP_OP_ALLTOALL] = nccl_alltoall,
    [SMDDP_OP_GATHER] = nccl_gather_scatter,  [SMDDP_OP_SCATTER] = nccl_gather_scatter,
    [SMDDP_OP_ALLTOALLV] = nccl_alltoallv,
};

smddp_status_t smddp__nccl_execute(smddp_comm_t comm, smddp__op_t *op)
{
    const char *why = NULL;
    if (!smddp__nccl(&why))
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "rank %d: this CUDA %s needs NCCL, which could not be loaded: %s "
                            "(set SMDDP_NCCL_LIBRARY to its path)",
                            comm->rank, smddp__op_kind_name(op->kind), why);
    if (!smddp__nccl_has_op(op))
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "rank %d: %s of %s with %s on CUDA memory across %d nodes: NCCL has "
                            "no %s %s, and smddp's CUDA collectives stay inside a node",
                            comm->rank, smddp__op_kind_name(op->kind),
                            smddp__dtype_name(op->dtype), smddp__redop_name(op->spec.op),
                            comm->node_count, smddp__dtype_name(op->dtype),
                            smddp__redop_name(op->spec.op));
    /* The caller has made the buffers' device current. */
    if (!comm->nccl) SMDDP_CHECK(init_comm(comm));
    smddp__nccl_comm_t nc = comm->nccl;
    int dt = nccl_dtype(op);
    int redop = SMDDP_NCCL_SUM;
    bool premul = false;
    switch (op->spec.op) {
    case SMDDP_PROD: redop = SMDDP_NCCL_PROD; break;
    case SMDDP_MIN: redop = SMDDP_NCCL_MIN; break;
    case SMDDP_MAX: redop = SMDDP_NCCL_MAX; break;
    case SMDDP_AVG: redop = SMDDP_NCCL_AVG; break;
    case SMDDP_PREMUL_SUM: premul = true; break;
    default: break;
    }
    bool reduces = smddp__op_traits(op->kind)->reduces;
    if (reduces && premul) {
        char scalar[8];
        premul_scalar(op->dtype, op->spec.premul, scalar);
        NCCL_TRY(comm, api.RedOpCreatePreMulSum(&redop, scalar, dt, 1 /* host, immediate */, nc));
    }
    int (*call)(nccl_call_t *) =
        (unsigned)op->kind < SMDDP_OP_KIND_COUNT ? nccl_calls[op->kind] : NULL;
    if (!call) {
        if (reduces && premul) api.RedOpDestroy(redop, nc);
        return smddp__error(SMDDP_ERR_INTERNAL, "rank %d: %s has no NCCL path", comm->rank,
                            smddp__op_kind_name(op->kind));
    }
    nccl_call_t c = {comm, op, nc, dt, redop, NULL};
    int res = call(&c);
    if (reduces && premul) api.RedOpDestroy(redop, nc);
    if (c.name) return res != 0 ? nccl_error(comm, c.name, res) : SMDDP_OK;
    return (smddp_status_t)res;
}

static void nccl_teardown(smddp_comm_t comm)
{
    if (!comm->nccl) return;
    if (atomic_load(&comm->aborted))
        api.CommAbort(comm->nccl);
    else
        api.CommDestroy(comm->nccl);
    comm->nccl = NULL;
}

/* Created by the first collective routed to NCCL (smddp__nccl_execute), not at creation. */
const smddp__transport_t smddp__nccl_transport = {"NCCL", false, NULL, nccl_teardown, NULL};
