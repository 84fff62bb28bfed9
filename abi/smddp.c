/*
 * The exported C API: argument checking with messages that say what was
 * wrong and what is accepted, then a call into core/. Nothing else in the
 * library is visible outside it (see libsmddp.map).
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "cuda/cuda.h"
#include "exec.h"
#include "fail.h"
#include "param.h"
#include "progress.h"
#include "trace.h"
#include "queue.h"
#include "select.h"
#include "transport/shm.h"

#define ACCEPTED_DTYPES \
    "int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, float32, float64"
#define ACCEPTED_OPS "sum, prod, min, max, avg, premul_sum, band, bor, bxor"

int smddp_get_version(void) { return SMDDP_VERSION; }

const char *smddp_status_string(smddp_status_t status) { return smddp__status_string(status); }

const char *smddp_get_last_error(smddp_comm_t comm)
{
    return comm ? comm->last_error : smddp__last_error();
}

void smddp_set_store_error(const char *message)
{
    smddp__error_quiet(SMDDP_ERR_STORE, "%s", message ? message : "");
}

size_t smddp_dtype_size(smddp_dtype_t dtype) { return smddp__dtype_size(dtype); }

const char *smddp_dtype_name(smddp_dtype_t dtype) { return smddp__dtype_name(dtype); }

const char *smddp_op_name(smddp_op_t op) { return smddp__redop_name(op); }

void smddp_print_settings(void *file) { smddp__params_print(file ? file : stdout); }

void smddp_print_selection(void *file, int local_ranks, int nodes)
{
    smddp__select_print(file ? file : stdout, local_ranks, nodes);
}

/* Records a failure on the communicator too, so smddp_get_last_error(comm) has it. */
static smddp_status_t fail(smddp_comm_t comm, smddp_status_t st)
{
    if (comm && st < 0) smddp__comm_set_last_error(comm, smddp__last_error());
    return st;
}

#define INVALID(comm, ...) fail((comm), smddp__error(SMDDP_ERR_INVALID_ARGUMENT, __VA_ARGS__))

/* ---- communicators ------------------------------------------------------- */

smddp_status_t smddp_comm_create(const smddp_store_t *store, int rank, int world_size,
                                 const smddp_comm_config_t *config, smddp_comm_t *comm)
{
    if (!comm) return INVALID(NULL, "smddp_comm_create: comm (the output) is NULL");
    if (!store || !store->set || !store->get || !store->add)
        return INVALID(NULL, "smddp_comm_create: the store and its set, get and add callbacks "
                             "must be non-NULL");
    if (store->size < sizeof(smddp_store_t))
        return INVALID(NULL, "smddp_comm_create: store->size is %zu, expected %zu "
                             "(sizeof(smddp_store_t))", store->size, sizeof(smddp_store_t));
    if (world_size < 1)
        return INVALID(NULL, "smddp_comm_create: world_size is %d; it must be >= 1", world_size);
    if (rank < 0 || rank >= world_size)
        return INVALID(NULL, "smddp_comm_create: rank %d is out of range [0, %d)", rank,
                       world_size);
    if (config && config->size < sizeof(smddp_comm_config_t))
        return INVALID(NULL, "smddp_comm_create: config->size is %zu; initialise the config with "
                             "SMDDP_COMM_CONFIG_INIT", config->size);
    const char *prefix = config && config->prefix ? config->prefix : "smddp";
    if (strlen(prefix) > 128)
        return INVALID(NULL, "smddp_comm_create: prefix is longer than 128 characters");
    if (config && config->timeout_ms == 0)
        return INVALID(NULL, "smddp_comm_create: config->timeout_ms is 0; use > 0 milliseconds, "
                             "or < 0 for SMDDP_TIMEOUT");
    int64_t timeout = smddp__timeout_ms(config ? config->timeout_ms : -1);
    smddp__store_ref_t *ref = smddp__store_ref_new(store);
    if (!ref) return SMDDP_ERR_NO_MEMORY;
    smddp_status_t st = smddp__comm_create(ref, rank, world_size, prefix, timeout, comm);
    if (st < 0) ref->table.release = NULL; /* the caller keeps the store when we fail */
    smddp__store_unref(ref);
    return st;
}

smddp_status_t smddp_comm_create_from_env(const smddp_comm_config_t *config, smddp_comm_t *comm)
{
    if (!comm) return INVALID(NULL, "smddp_comm_create_from_env: comm (the output) is NULL");
    if (config && config->size < sizeof(smddp_comm_config_t))
        return INVALID(NULL, "smddp_comm_create_from_env: config->size is %zu; initialise the "
                             "config with SMDDP_COMM_CONFIG_INIT", config->size);
    if (config && config->timeout_ms == 0)
        return INVALID(NULL, "smddp_comm_create_from_env: config->timeout_ms is 0; use > 0 "
                             "milliseconds, or < 0 for SMDDP_TIMEOUT");
    return smddp__comm_create_from_env(config, comm);
}

smddp_status_t smddp_comm_split(smddp_comm_t comm, int color, int key, smddp_comm_t *newcomm)
{
    if (!comm) return INVALID(NULL, "smddp_comm_split: comm is NULL");
    if (!newcomm) return INVALID(comm, "smddp_comm_split: newcomm (the output) is NULL");
    if (color < 0 && color != SMDDP_SPLIT_NOCOLOR)
        return INVALID(comm, "smddp_comm_split: color %d is negative; use a color >= 0 or "
                             "SMDDP_SPLIT_NOCOLOR", color);
    return fail(comm, smddp__comm_split(comm, color, key, newcomm));
}

smddp_status_t smddp_comm_peer_state(smddp_comm_t comm, int peer, smddp_peer_state_t *state)
{
    if (!comm) return INVALID(NULL, "smddp_comm_peer_state: comm is NULL");
    if (!state) return INVALID(comm, "smddp_comm_peer_state: state (the output) is NULL");
    if (peer < 0 || peer >= comm->size)
        return INVALID(comm, "smddp_comm_peer_state: peer %d; ranks are 0..%d", peer,
                       comm->size - 1);
    *state = (smddp_peer_state_t)smddp__comm_peer_state(comm, peer);
    return SMDDP_OK;
}

smddp_status_t smddp_comm_shrink(smddp_comm_t comm, const int *exclude, int n_exclude,
                                 int flags, smddp_comm_t *newcomm)
{
    if (!comm) return INVALID(NULL, "smddp_comm_shrink: comm is NULL");
    if (!newcomm) return INVALID(comm, "smddp_comm_shrink: newcomm (the output) is NULL");
    if (n_exclude < 0 || (n_exclude > 0 && !exclude))
        return INVALID(comm, "smddp_comm_shrink: n_exclude is %d with exclude %s; give "
                             "n_exclude >= 0 and, when > 0, an array of that many ranks",
                       n_exclude, exclude ? "set" : "NULL");
    if (flags & ~SMDDP_SHRINK_ABORT)
        return INVALID(comm, "smddp_comm_shrink: unknown flags 0x%x; accepted: "
                             "SMDDP_SHRINK_DEFAULT (0), SMDDP_SHRINK_ABORT (1)", flags);
    bool *excluded = calloc((size_t)comm->size, sizeof(bool));
    if (!excluded) return fail(comm, smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %d flags",
                                                  comm->size));
    smddp_status_t st = SMDDP_OK;
    for (int i = 0; i < n_exclude && st == SMDDP_OK; i++) {
        int r = exclude[i];
        if (r < 0 || r >= comm->size)
            st = INVALID(comm, "smddp_comm_shrink: exclude[%d] is %d; ranks are 0..%d", i, r,
                         comm->size - 1);
        else if (r == comm->rank)
            st = INVALID(comm, "smddp_comm_shrink: exclude[%d] is this rank (%d); an excluded "
                               "rank does not call smddp_comm_shrink", i, r);
        else if (excluded[r])
            st = INVALID(comm, "smddp_comm_shrink: rank %d is in exclude twice", r);
        else
            excluded[r] = true;
    }
    if (st == SMDDP_OK) st = fail(comm, smddp__comm_shrink(comm, excluded, flags, newcomm));
    free(excluded);
    return st;
}

smddp_status_t smddp_comm_abort(smddp_comm_t comm)
{
    if (!comm) return INVALID(NULL, "smddp_comm_abort: comm is NULL");
    char msg[128];
    snprintf(msg, sizeof(msg), "aborted by the application (smddp_comm_abort on rank %d)",
             comm->rank);
    smddp__comm_abort_by_user(comm, msg);
    return SMDDP_OK;
}

smddp_status_t smddp_comm_status(smddp_comm_t comm)
{
    if (!comm) return INVALID(NULL, "smddp_comm_status: comm is NULL");
    /* A CUDA collective kernel that gave up after its host returned fails the communicator here. */
    const smddp__cuda_calls_t *cuda = smddp__cuda_calls();
    if (!atomic_load(&comm->aborted) && (!cuda || cuda->status(comm) == SMDDP_OK)) return SMDDP_OK;
    return comm->abort_status < 0 ? comm->abort_status : SMDDP_ERR_ABORTED;
}

smddp_status_t smddp_comm_dump_trace(smddp_comm_t comm, const char *path, char *written,
                                     size_t cap)
{
    if (!comm) return INVALID(NULL, "smddp_comm_dump_trace: comm is NULL");
    if (path && !path[0]) return INVALID(comm, "smddp_comm_dump_trace: path is empty");
    char *arrivals = smddp__progress_json_new(comm);
    smddp_status_t st = smddp__trace_dump(comm->trace, path, comm->prefix, comm->rank, comm->size,
                                          arrivals && arrivals[0] ? arrivals : NULL, written, cap);
    free(arrivals);
    return fail(comm, st);
}

smddp_status_t smddp_comm_get_stats(smddp_comm_t comm, smddp_comm_stats_t *stats,
                                    int64_t *late_ns, int n)
{
    if (!comm) return INVALID(NULL, "smddp_comm_get_stats: comm is NULL");
    if (!stats) return INVALID(comm, "smddp_comm_get_stats: stats is NULL");
    if (stats->struct_size < 8)
        return INVALID(comm, "smddp_comm_get_stats: stats->struct_size is %u; set it to "
                             "sizeof(smddp_comm_stats_t) (%zu in this library's version %d)",
                       stats->struct_size, sizeof(smddp_comm_stats_t), SMDDP_COMM_STATS_VERSION);
    if (n < 0 || (n > 0 && !late_ns))
        return INVALID(comm, "smddp_comm_get_stats: n is %d with late_ns %s; give n >= 0 and, "
                             "when n > 0, an array of n entries", n, late_ns ? "set" : "NULL");
    smddp_comm_stats_t full = {0};
    smddp__progress_stats(comm, &full, late_ns, n);
    smddp__comm_costs(comm, &full);
    full.version = SMDDP_COMM_STATS_VERSION;
    uint32_t size = stats->struct_size;
    full.struct_size = size;
    memcpy(stats, &full, SMDDP_MIN((size_t)size, sizeof(full)));
    return SMDDP_OK;
}

smddp_status_t smddp_comm_set_timeout(smddp_comm_t comm, int64_t timeout_ms)
{
    if (!comm) return INVALID(NULL, "smddp_comm_set_timeout: comm is NULL");
    if (timeout_ms == 0)
        return INVALID(comm, "smddp_comm_set_timeout: timeout_ms is 0; use > 0 milliseconds, or "
                             "< 0 for SMDDP_TIMEOUT");
    atomic_store(&comm->timeout_ms, smddp__timeout_ms(timeout_ms));
    return SMDDP_OK;
}

smddp_status_t smddp_mem_alloc(smddp_comm_t comm, size_t bytes, void **ptr)
{
    if (!comm) return INVALID(NULL, "smddp_mem_alloc: comm is NULL");
    if (!ptr) return INVALID(comm, "smddp_mem_alloc: ptr is NULL");
    if (bytes == 0) return INVALID(comm, "smddp_mem_alloc: bytes is 0; ask for 1 or more");
    return smddp__pool_alloc(comm, bytes, ptr);
}

smddp_status_t smddp_mem_free(void *ptr)
{
    if (!ptr) return SMDDP_OK;
    return smddp__pool_free(ptr);
}

smddp_status_t smddp_comm_destroy(smddp_comm_t comm)
{
    if (!comm) return SMDDP_OK;
    return smddp__comm_destroy(comm);
}

#define QUERY(fn, field)                                              \
    smddp_status_t fn(smddp_comm_t comm, int *out)                    \
    {                                                                 \
        if (!comm) return INVALID(NULL, #fn ": comm is NULL");        \
        if (!out) return INVALID(comm, #fn ": output pointer is NULL"); \
        *out = comm->field;                                           \
        return SMDDP_OK;                                              \
    }
QUERY(smddp_comm_rank, rank)
QUERY(smddp_comm_size, size)
QUERY(smddp_comm_local_rank, local_rank)
QUERY(smddp_comm_local_size, local_size)
QUERY(smddp_comm_node_count, node_count)

/* ---- requests ------------------------------------------------------------ */

smddp_status_t smddp_test(smddp_request_t req)
{
    if (!req) return INVALID(NULL, "smddp_test: req is NULL");
    return smddp__request_test(req);
}

int smddp_request_enqueued(smddp_request_t req)
{
    const smddp__cuda_calls_t *cuda = smddp__cuda_calls();
    return req && cuda ? cuda->stage_enqueued(req) : 0;
}

smddp_status_t smddp_request_source(smddp_request_t req, int *rank)
{
    if (!req) return INVALID(NULL, "smddp_request_source: req is NULL");
    if (!rank) return INVALID(req->comm, "smddp_request_source: rank is NULL");
    if (req->kind != SMDDP_OP_RECV)
        return INVALID(req->comm, "smddp_request_source: the request is a %s, not a recv",
                       smddp__op_kind_name(req->kind));
    if (!atomic_load(&req->done)) return SMDDP_IN_PROGRESS;
    *rank = req->root;
    return SMDDP_OK;
}

smddp_status_t smddp_wait(smddp_request_t req, int64_t timeout_ms)
{
    if (!req) return INVALID(NULL, "smddp_wait: req is NULL");
    if (timeout_ms < 0 && timeout_ms != SMDDP_WAIT_DEFAULT)
        return INVALID(req->comm, "smddp_wait: timeout_ms is %" PRId64 "; use >= 0 or "
                                  "SMDDP_WAIT_DEFAULT", timeout_ms);
    return smddp__request_wait(req, timeout_ms);
}

void smddp_request_free(smddp_request_t req)
{
    if (req) smddp__request_unref(req);
}

/* ---- collectives ---------------------------------------------------------- */

typedef struct coll_check {
    const char *fn;
    smddp_comm_t comm;
    smddp__op_kind_t kind;
} coll_check_t;

static unsigned attr_flags(const smddp_coll_attr_t *attr)
{
    return attr->size >= offsetof(smddp_coll_attr_t, flags) + sizeof(attr->flags) ? attr->flags : 0;
}

/* Callers built before attr had a timeout pass the smaller size: 0, the communicator's. */
static int64_t attr_timeout_ms(const smddp_coll_attr_t *attr)
{
    return attr->size >= offsetof(smddp_coll_attr_t, timeout_ms) + sizeof(attr->timeout_ms)
               ? attr->timeout_ms
               : 0;
}

static smddp_status_t check_common(const coll_check_t *c, const smddp_coll_attr_t *attr)
{
    if (!c->comm) return INVALID(NULL, "%s: comm is NULL", c->fn);
    if (attr) {
        /* Callers built before attr had flags pass the smaller size. */
        if (attr->size < offsetof(smddp_coll_attr_t, flags))
            return INVALID(c->comm, "%s: attr->size is %zu; initialise attributes with "
                                    "SMDDP_COLL_ATTR_INIT", c->fn, attr->size);
        if (attr_flags(attr) & ~SMDDP_COLL_WAIT_NOW)
            return INVALID(c->comm, "%s: unknown attr->flags 0x%x; accepted: 0, "
                                    "SMDDP_COLL_WAIT_NOW", c->fn, attr_flags(attr));
        if (attr_timeout_ms(attr) < 0)
            return INVALID(c->comm, "%s: attr->timeout_ms is %" PRId64 "; use > 0 milliseconds, "
                                    "or 0 for the communicator's timeout", c->fn,
                                    attr_timeout_ms(attr));
        if (attr->mem_type == SMDDP_MEM_CUDA)
            return fail(c->comm, smddp__route_check_cuda(c->comm, c->kind, c->fn));
        if (attr->mem_type != SMDDP_MEM_HOST)
            return INVALID(c->comm, "%s: unknown memory type %d; accepted: SMDDP_MEM_HOST, "
                                    "SMDDP_MEM_CUDA", c->fn, (int)attr->mem_type);
    }
    return SMDDP_OK;
}

static smddp_status_t check_dtype(const coll_check_t *c, smddp_dtype_t dtype)
{
    if ((unsigned)dtype >= SMDDP_DTYPE_COUNT)
        return INVALID(c->comm, "%s: unknown dtype %d; accepted: " ACCEPTED_DTYPES, c->fn,
                       (int)dtype);
    return SMDDP_OK;
}

/* count >= 0, and count * multiple elements addressable. */
static smddp_status_t check_count(const coll_check_t *c, const char *name, int64_t count,
                                  smddp_dtype_t dtype, int64_t multiple)
{
    if (count < 0)
        return INVALID(c->comm, "%s: %s is %" PRId64 "; counts must be >= 0", c->fn, name, count);
    if (count > 0 && (uint64_t)count > (uint64_t)INT64_MAX / smddp_dtype_size(dtype) /
                                           (uint64_t)multiple)
        return INVALID(c->comm, "%s: %s %" PRId64 " x %zu bytes x %" PRId64 " overflows", c->fn,
                       name, count, smddp_dtype_size(dtype), multiple);
    return SMDDP_OK;
}

static smddp_status_t check_op(const coll_check_t *c, smddp_op_t op, smddp_dtype_t dtype)
{
    if ((unsigned)op >= SMDDP_OP_COUNT)
        return INVALID(c->comm, "%s: unknown op %d; accepted: " ACCEPTED_OPS, c->fn, (int)op);
    if (!smddp__reduce_valid(dtype, op)) {
        if (op == SMDDP_PREMUL_SUM)
            return INVALID(c->comm, "%s: premul_sum is defined for floating-point types only, "
                                    "not %s", c->fn, smddp_dtype_name(dtype));
        return INVALID(c->comm, "%s: op %s is not defined for %s; band, bor and bxor take "
                                "int8, uint8, int32 or int64", c->fn, smddp_op_name(op),
                       smddp_dtype_name(dtype));
    }
    return SMDDP_OK;
}

static smddp_status_t check_buf(const coll_check_t *c, const char *name, const void *buf,
                                int64_t count)
{
    if (!buf && count > 0) return INVALID(c->comm, "%s: %s is NULL", c->fn, name);
    return SMDDP_OK;
}

static smddp_status_t check_rank(const coll_check_t *c, const char *name, int r)
{
    if (r < 0 || r >= c->comm->size)
        return INVALID(c->comm, "%s: %s %d is out of range for a communicator of %d ranks", c->fn,
                       name, r, c->comm->size);
    return SMDDP_OK;
}

static smddp_status_t submit(const coll_check_t *c, smddp__op_t *op, smddp_request_t *req)
{
    if (!op) return fail(c->comm, SMDDP_ERR_NO_MEMORY);
    return fail(c->comm, smddp__issue(c->comm, op, req));
}

static smddp__op_t *make_op(smddp_comm_t comm, smddp__op_kind_t kind, const void *sendbuf,
                            void *recvbuf, int64_t count, smddp_dtype_t dtype, smddp_op_t redop,
                            int root, const smddp_coll_attr_t *attr)
{
    smddp__op_t *op = smddp__op_make(comm, kind, sendbuf, recvbuf, (size_t)count, dtype, redop,
                                     root);
    if (!op || !attr) return op;
    op->spec.premul = attr->premul_factor;
    if (kind != SMDDP_OP_BARRIER) {
        op->mem_type = attr->mem_type;
        op->stream = attr->stream;
    }
    op->on_complete = attr->on_complete;
    op->on_complete_arg = attr->on_complete_arg;
    op->wait_now = (attr_flags(attr) & SMDDP_COLL_WAIT_NOW) != 0;
    if (attr_timeout_ms(attr) > 0) op->timeout_ms = smddp__timeout_ms(attr_timeout_ms(attr));
    return op;
}

smddp_status_t smddp_allreduce(smddp_comm_t comm, const void *sendbuf, void *recvbuf,
                               int64_t count, smddp_dtype_t dtype, smddp_op_t op,
                               const smddp_coll_attr_t *attr, smddp_request_t *req)
{
    coll_check_t c = {"smddp_allreduce", comm, SMDDP_OP_ALLREDUCE};
    SMDDP_CHECK(check_common(&c, attr));
    SMDDP_CHECK(check_dtype(&c, dtype));
    SMDDP_CHECK(check_op(&c, op, dtype));
    SMDDP_CHECK(check_count(&c, "count", count, dtype, 1));
    SMDDP_CHECK(check_buf(&c, "sendbuf", sendbuf, count));
    SMDDP_CHECK(check_buf(&c, "recvbuf", recvbuf, count));
    return submit(&c, make_op(comm, SMDDP_OP_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, -1,
                              attr), req);
}

smddp_status_t smddp_reduce(smddp_comm_t comm, const void *sendbuf, void *recvbuf, int64_t count,
                            smddp_dtype_t dtype, smddp_op_t op, int root,
                            const smddp_coll_attr_t *attr, smddp_request_t *req)
{
    coll_check_t c = {"smddp_reduce", comm, SMDDP_OP_REDUCE};
    SMDDP_CHECK(check_common(&c, attr));
    SMDDP_CHECK(check_dtype(&c, dtype));
    SMDDP_CHECK(check_op(&c, op, dtype));
    SMDDP_CHECK(check_count(&c, "count", count, dtype, 1));
    SMDDP_CHECK(check_rank(&c, "root", root));
    SMDDP_CHECK(check_buf(&c, "sendbuf", sendbuf, count));
    if (comm->rank == root) SMDDP_CHECK(check_buf(&c, "recvbuf (on the root)", recvbuf, count));
    return submit(&c, make_op(comm, SMDDP_OP_REDUCE, sendbuf, recvbuf, count, dtype, op, root,
                              attr), req);
}

smddp_status_t smddp_broadcast(smddp_comm_t comm, void *buf, int64_t count, smddp_dtype_t dtype,
                               int root, const smddp_coll_attr_t *attr, smddp_request_t *req)
{
    coll_check_t c = {"smddp_broadcast", comm, SMDDP_OP_BROADCAST};
    SMDDP_CHECK(check_common(&c, attr));
    SMDDP_CHECK(check_dtype(&c, dtype));
    SMDDP_CHECK(check_count(&c, "count", count, dtype, 1));
    SMDDP_CHECK(check_rank(&c, "root", root));
    SMDDP_CHECK(check_buf(&c, "buf", buf, count));
    return submit(&c, make_op(comm, SMDDP_OP_BROADCAST, buf, buf, count, dtype, SMDDP_SUM, root,
                              attr), req);
}

smddp_status_t smddp_allgather(smddp_comm_t comm, const void *sendbuf, void *recvbuf,
                               int64_t sendcount, smddp_dtype_t dtype,
                               const smddp_coll_attr_t *attr, smddp_request_t *req)
{
    coll_check_t c = {"smddp_allgather", comm, SMDDP_OP_ALLGATHER};
    SMDDP_CHECK(check_common(&c, attr));
    SMDDP_CHECK(check_dtype(&c, dtype));
    SMDDP_CHECK(check_count(&c, "sendcount", sendcount, dtype, comm->size));
    SMDDP_CHECK(check_buf(&c, "sendbuf", sendbuf, sendcount));
    SMDDP_CHECK(check_buf(&c, "recvbuf", recvbuf, sendcount));
    return submit(&c, make_op(comm, SMDDP_OP_ALLGATHER, sendbuf, recvbuf, sendcount, dtype,
                              SMDDP_SUM, -1, attr), req);
}

smddp_status_t smddp_reduce_scatter(smddp_comm_t comm, const void *sendbuf, void *recvbuf,
                                    int64_t recvcount, smddp_dtype_t dtype, smddp_op_t op,
                                    const smddp_coll_attr_t *attr, smddp_request_t *req)
{
    coll_check_t c = {"smddp_reduce_scatter", comm, SMDDP_OP_REDUCE_SCATTER};
    SMDDP_CHECK(check_common(&c, attr));
    SMDDP_CHECK(check_dtype(&c, dtype));
    SMDDP_CHECK(check_op(&c, op, dtype));
    SMDDP_CHECK(check_count(&c, "recvcount", recvcount, dtype, comm->size));
    SMDDP_CHECK(check_buf(&c, "sendbuf", sendbuf, recvcount));
    SMDDP_CHECK(check_buf(&c, "recvbuf", recvbuf, recvcount));
    size_t es = smddp_dtype_size(dtype);
    const char *own = (const char *)sendbuf + (size_t)comm->rank * (size_t)recvcount * es;
    if (recvcount > 0 && recvbuf != (const void *)own &&
        (const char *)recvbuf + (size_t)recvcount * es > (const char *)sendbuf &&
        (const char *)recvbuf < (const char *)sendbuf + (size_t)comm->size * (size_t)recvcount * es)
        return INVALID(comm, "smddp_reduce_scatter: recvbuf overlaps sendbuf; in place, recvbuf "
                             "must be sendbuf + rank * recvcount elements");
    return submit(&c, make_op(comm, SMDDP_OP_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype,
                              op, -1, attr), req);
}

smddp_status_t smddp_alltoall(smddp_comm_t comm, const void *sendbuf, void *recvbuf,
                              int64_t count, smddp_dtype_t dtype, const smddp_coll_attr_t *attr,
                              smddp_request_t *req)
{
    coll_check_t c = {"smddp_alltoall", comm, SMDDP_OP_ALLTOALL};
    SMDDP_CHECK(check_common(&c, attr));
    SMDDP_CHECK(check_dtype(&c, dtype));
    SMDDP_CHECK(check_count(&c, "count", count, dtype, comm->size));
    SMDDP_CHECK(check_buf(&c, "sendbuf", sendbuf, count));
    SMDDP_CHECK(check_buf(&c, "recvbuf", recvbuf, count));
    if (count > 0 && sendbuf == recvbuf)
        return INVALID(comm, "smddp_alltoall: in-place (sendbuf == recvbuf) is not supported; "
                             "pass distinct buffers");
    return submit(&c, make_op(comm, SMDDP_OP_ALLTOALL, sendbuf, recvbuf, count, dtype, SMDDP_SUM,
                              -1, attr), req);
}

static smddp_status_t check_v(const coll_check_t *c, const char *cname, const int64_t *counts,
                              const char *dname, const int64_t *displs, smddp_dtype_t dtype)
{
    if (!counts || !displs)
        return INVALID(c->comm, "%s: %s and %s must be non-NULL arrays of %d entries", c->fn,
                       cname, dname, c->comm->size);
    for (int i = 0; i < c->comm->size; i++) {
        if (counts[i] < 0 || displs[i] < 0)
            return INVALID(c->comm, "%s: %s[%d] = %" PRId64 ", %s[%d] = %" PRId64
                                    "; both must be >= 0", c->fn, cname, i, counts[i], dname, i,
                           displs[i]);
        SMDDP_CHECK(check_count(c, cname, counts[i], dtype, 1));
        if (displs[i] > INT64_MAX / (int64_t)smddp_dtype_size(dtype) - counts[i])
            return INVALID(c->comm, "%s: %s[%d] + %s[%d] overflows", c->fn, dname, i, cname, i);
    }
    return SMDDP_OK;
}

smddp_status_t smddp_alltoallv(smddp_comm_t comm, const void *sendbuf, const int64_t *sendcounts,
                               const int64_t *sdispls, void *recvbuf, const int64_t *recvcounts,
                               const int64_t *rdispls, smddp_dtype_t dtype,
                               const smddp_coll_attr_t *attr, smddp_request_t *req)
{
    coll_check_t c = {"smddp_alltoallv", comm, SMDDP_OP_ALLTOALLV};
    SMDDP_CHECK(check_common(&c, attr));
    SMDDP_CHECK(check_dtype(&c, dtype));
    SMDDP_CHECK(check_v(&c, "sendcounts", sendcounts, "sdispls", sdispls, dtype));
    SMDDP_CHECK(check_v(&c, "recvcounts", recvcounts, "rdispls", rdispls, dtype));
    int64_t stotal = 0, rtotal = 0;
    for (int i = 0; i < comm->size; i++)
        if (__builtin_add_overflow(stotal, sendcounts[i], &stotal) ||
            __builtin_add_overflow(rtotal, recvcounts[i], &rtotal))
            return INVALID(comm, "smddp_alltoallv: the counts add up to more than %" PRId64
                                 " elements", INT64_MAX);
    SMDDP_CHECK(check_count(&c, "the sum of sendcounts", stotal, dtype, 1));
    SMDDP_CHECK(check_count(&c, "the sum of recvcounts", rtotal, dtype, 1));
    SMDDP_CHECK(check_buf(&c, "sendbuf", sendbuf, stotal));
    SMDDP_CHECK(check_buf(&c, "recvbuf", recvbuf, rtotal));
    if (stotal > 0 && sendbuf == recvbuf)
        return INVALID(comm, "smddp_alltoallv: in-place (sendbuf == recvbuf) is not supported");
    smddp__op_t *op = make_op(comm, SMDDP_OP_ALLTOALLV, sendbuf, recvbuf, stotal, dtype,
                              SMDDP_SUM, -1, attr);
    if (!op) return fail(comm, SMDDP_ERR_NO_MEMORY);
    size_t n = (size_t)comm->size;
    op->v = malloc(4 * n * sizeof(int64_t));
    if (!op->v) {
        smddp__request_unref(op);
        return fail(comm, smddp__error(SMDDP_ERR_NO_MEMORY, "smddp_alltoallv: out of memory"));
    }
    memcpy(op->v, sendcounts, n * sizeof(int64_t));
    memcpy(op->v + n, sdispls, n * sizeof(int64_t));
    memcpy(op->v + 2 * n, recvcounts, n * sizeof(int64_t));
    memcpy(op->v + 3 * n, rdispls, n * sizeof(int64_t));
    return submit(&c, op, req);
}

smddp_status_t smddp_gather(smddp_comm_t comm, const void *sendbuf, void *recvbuf,
                            int64_t sendcount, smddp_dtype_t dtype, int root,
                            const smddp_coll_attr_t *attr, smddp_request_t *req)
{
    coll_check_t c = {"smddp_gather", comm, SMDDP_OP_GATHER};
    SMDDP_CHECK(check_common(&c, attr));
    SMDDP_CHECK(check_dtype(&c, dtype));
    SMDDP_CHECK(check_count(&c, "sendcount", sendcount, dtype, comm->size));
    SMDDP_CHECK(check_rank(&c, "root", root));
    SMDDP_CHECK(check_buf(&c, "sendbuf", sendbuf, sendcount));
    if (comm->rank == root) SMDDP_CHECK(check_buf(&c, "recvbuf (on the root)", recvbuf, sendcount));
    return submit(&c, make_op(comm, SMDDP_OP_GATHER, sendbuf, recvbuf, sendcount, dtype,
                              SMDDP_SUM, root, attr), req);
}

smddp_status_t smddp_scatter(smddp_comm_t comm, const void *sendbuf, void *recvbuf,
                             int64_t recvcount, smddp_dtype_t dtype, int root,
                             const smddp_coll_attr_t *attr, smddp_request_t *req)
{
    coll_check_t c = {"smddp_scatter", comm, SMDDP_OP_SCATTER};
    SMDDP_CHECK(check_common(&c, attr));
    SMDDP_CHECK(check_dtype(&c, dtype));
    SMDDP_CHECK(check_count(&c, "recvcount", recvcount, dtype, comm->size));
    SMDDP_CHECK(check_rank(&c, "root", root));
    if (comm->rank == root) SMDDP_CHECK(check_buf(&c, "sendbuf (on the root)", sendbuf, recvcount));
    SMDDP_CHECK(check_buf(&c, "recvbuf", recvbuf, recvcount));
    return submit(&c, make_op(comm, SMDDP_OP_SCATTER, sendbuf, recvbuf, recvcount, dtype,
                              SMDDP_SUM, root, attr), req);
}

smddp_status_t smddp_barrier(smddp_comm_t comm, const smddp_coll_attr_t *attr,
                             smddp_request_t *req)
{
    coll_check_t c = {"smddp_barrier", comm, SMDDP_OP_BARRIER};
    smddp_coll_attr_t host;
    if (attr && attr->size >= offsetof(smddp_coll_attr_t, flags)) {
        /* A barrier moves no buffers: only the callback, flags and timeout are taken. */
        size_t known = attr->size < sizeof(host) ? attr->size : sizeof(host);
        memset(&host, 0, sizeof(host));
        memcpy(&host, attr, known);
        host.size = known;
        host.mem_type = SMDDP_MEM_HOST;
        attr = &host;
    }
    SMDDP_CHECK(check_common(&c, attr));
    return submit(&c, make_op(comm, SMDDP_OP_BARRIER, NULL, NULL, 0, SMDDP_UINT8, SMDDP_SUM, -1,
                              attr), req);
}

static smddp_status_t p2p(const coll_check_t *c, smddp__op_kind_t kind, const void *sbuf,
                          void *rbuf, int64_t count, smddp_dtype_t dtype, int peer, int tag,
                          const smddp_coll_attr_t *attr, smddp_request_t *req)
{
    SMDDP_CHECK(check_common(c, attr));
    SMDDP_CHECK(check_dtype(c, dtype));
    SMDDP_CHECK(check_count(c, "count", count, dtype, 1));
    if (!(kind == SMDDP_OP_RECV && peer == SMDDP_ANY_SOURCE))
        SMDDP_CHECK(check_rank(c, "peer", peer));
    if (peer == c->comm->rank)
        return INVALID(c->comm, "%s: peer %d is this rank; send/recv need another rank", c->fn,
                       peer);
    if (tag < 0) return INVALID(c->comm, "%s: tag %d is negative; tags must be >= 0", c->fn, tag);
    SMDDP_CHECK(check_buf(c, "buf", kind == SMDDP_OP_SEND ? sbuf : rbuf, count));
    smddp__op_t *op = make_op(c->comm, kind, sbuf, rbuf, count, dtype, SMDDP_SUM, peer, attr);
    if (op) op->tag = tag;
    return submit(c, op, req);
}

smddp_status_t smddp_send(smddp_comm_t comm, const void *buf, int64_t count, smddp_dtype_t dtype,
                          int peer, int tag, const smddp_coll_attr_t *attr, smddp_request_t *req)
{
    coll_check_t c = {"smddp_send", comm, SMDDP_OP_SEND};
    if (!comm) return INVALID(NULL, "smddp_send: comm is NULL");
    return p2p(&c, SMDDP_OP_SEND, buf, NULL, count, dtype, peer, tag, attr, req);
}

smddp_status_t smddp_recv(smddp_comm_t comm, void *buf, int64_t count, smddp_dtype_t dtype,
                          int peer, int tag, const smddp_coll_attr_t *attr, smddp_request_t *req)
{
    coll_check_t c = {"smddp_recv", comm, SMDDP_OP_RECV};
    if (!comm) return INVALID(NULL, "smddp_recv: comm is NULL");
    return p2p(&c, SMDDP_OP_RECV, NULL, buf, count, dtype, peer, tag, attr, req);
}
