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
#define SYM(field, name)                                                                   \
    do {                                                                                   \
        *(void **)&api.field = dlsym(lib, name);                                           \
        if (!api.field) {                                                                  \
            snprintf(api_error_buf, sizeof(api_error_buf), "%s has no %s", path, name);    \
            api_error = api_error_buf;                                                     \
            return;                                                                        \
        }                                                                                  \
    } while (0)
    SYM(GetVersion, "ncclGetVersion");
    SYM(GetErrorString, "ncclGetErrorString");
    SYM(GetUniqueId, "ncclGetUniqueId");
    SYM(CommInitRank, "ncclCommInitRank");
    SYM(CommDestroy, "ncclCommDestroy");
    SYM(CommAbort, "ncclCommAbort");
    SYM(AllReduce, "ncclAllReduce");
    SYM(Reduce, "ncclReduce");
    SYM(Broadcast, "ncclBroadcast");
    SYM(AllGather, "ncclAllGather");
    SYM(ReduceScatter, "ncclReduceScatter");
    SYM(Send, "ncclSend");
    SYM(Recv, "ncclRecv");
    SYM(GroupStart, "ncclGroupStart");
    SYM(GroupEnd, "ncclGroupEnd");
    SYM(RedOpCreatePreMulSum, "ncclRedOpCreatePreMulSum");
    SYM(RedOpDestroy, "ncclRedOpDestroy");
#undef SYM
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

bool smddp__nccl_has_op(const smddp__op_t *op)
{
    bool reduces = op->kind == SMDDP_OP_ALLREDUCE || op->kind == SMDDP_OP_REDUCE ||
                   op->kind == SMDDP_OP_REDUCE_SCATTER;
    if (!reduces) return true;
    switch (op->spec.op) {
    case SMDDP_BAND:
    case SMDDP_BOR:
    case SMDDP_BXOR: return false;
    default: return true;
    }
}

bool smddp__nccl_route(smddp_comm_t comm, const smddp__op_t *op, const char **why)
{
    if (smddp__params()->comm_backend == 1 && smddp__nccl_has_op(op)) {
        *why = "SMDDP_COMMUNICATION_BACKEND is nccl";
        return true;
    }
    if (comm->node_count > 1) {
        *why = "NCCL loads and crosses nodes with GPUDirect where the fabric allows "
               "(SMDDP_CUDA_NET=staged stages through host memory instead)";
        return true;
    }
    if (op->kind == SMDDP_OP_ALLTOALLV) {
        *why = "smddp has no CUDA all-to-all with split sizes yet";
        return true;
    }
    return false;
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

static int nccl_dtype(smddp_dtype_t dt)
{
    static const int map[SMDDP_DTYPE_COUNT] = {
        [SMDDP_INT8] = SMDDP_NCCL_INT8,       [SMDDP_UINT8] = SMDDP_NCCL_UINT8,
        [SMDDP_INT32] = SMDDP_NCCL_INT32,     [SMDDP_INT64] = SMDDP_NCCL_INT64,
        [SMDDP_FLOAT16] = SMDDP_NCCL_FLOAT16, [SMDDP_BFLOAT16] = SMDDP_NCCL_BFLOAT16,
        [SMDDP_FLOAT32] = SMDDP_NCCL_FLOAT32, [SMDDP_FLOAT64] = SMDDP_NCCL_FLOAT64,
    };
    return map[dt];
}

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
    int dt = nccl_dtype(op->dtype);
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
                            "rank %d: %s with %s on CUDA memory across %d nodes: NCCL has no %s "
                            "and smddp's CUDA collectives stay inside a node",
                            comm->rank, smddp__op_kind_name(op->kind), smddp__redop_name(op->spec.op),
                            comm->node_count, smddp__redop_name(op->spec.op));
    /* The caller has made the buffers' device current. */
    if (!comm->nccl) SMDDP_CHECK(init_comm(comm));
    smddp__nccl_comm_t nc = comm->nccl;
    int dt = nccl_dtype(op->dtype);
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
    bool reduces = op->kind == SMDDP_OP_ALLREDUCE || op->kind == SMDDP_OP_REDUCE ||
                   op->kind == SMDDP_OP_REDUCE_SCATTER;
    if (reduces && premul) {
        char scalar[8];
        premul_scalar(op->dtype, op->spec.premul, scalar);
        NCCL_TRY(comm, api.RedOpCreatePreMulSum(&redop, scalar, dt, 1 /* host, immediate */, nc));
    }
    smddp_status_t st = SMDDP_OK;
    int res = 0;
    const char *call = "";
    switch (op->kind) {
    case SMDDP_OP_ALLREDUCE:
        call = "ncclAllReduce";
        res = api.AllReduce(op->sendbuf, op->recvbuf, op->count, dt, redop, nc, op->stream);
        break;
    case SMDDP_OP_REDUCE:
        call = "ncclReduce";
        res = api.Reduce(op->sendbuf, op->recvbuf, op->count, dt, redop, op->root, nc, op->stream);
        break;
    case SMDDP_OP_REDUCE_SCATTER:
        call = "ncclReduceScatter";
        res = api.ReduceScatter(op->sendbuf, op->recvbuf, op->count, dt, redop, nc, op->stream);
        break;
    case SMDDP_OP_BROADCAST:
        call = "ncclBroadcast";
        res = api.Broadcast(op->recvbuf, op->recvbuf, op->count, dt, op->root, nc, op->stream);
        break;
    case SMDDP_OP_ALLGATHER:
        call = "ncclAllGather";
        res = api.AllGather(op->sendbuf, op->recvbuf, op->count, dt, nc, op->stream);
        break;
    case SMDDP_OP_ALLTOALL: st = uniform(comm, op, true, true); break;
    case SMDDP_OP_GATHER:
    case SMDDP_OP_SCATTER: st = uniform(comm, op, false, false); break;
    case SMDDP_OP_ALLTOALLV: {
        int p = comm->size;
        st = exchange(comm, op, op->v, op->v + p, op->v + 2 * p, op->v + 3 * p);
        break;
    }
    default:
        st = smddp__error(SMDDP_ERR_INTERNAL, "rank %d: %s has no NCCL path", comm->rank,
                          smddp__op_kind_name(op->kind));
        break;
    }
    if (reduces && premul) api.RedOpDestroy(redop, nc);
    if (res != 0) return nccl_error(comm, call, res);
    return st;
}

void smddp__nccl_teardown(smddp_comm_t comm)
{
    if (!comm->nccl) return;
    if (atomic_load(&comm->aborted))
        api.CommAbort(comm->nccl);
    else
        api.CommDestroy(comm->nccl);
    comm->nccl = NULL;
}
