/*
 * The operation's vocabulary (op.h): element types, the table of kinds, and
 * how an op is described to people and to other ranks.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "op.h"

static const struct {
    size_t size;
    const char *name;
} dtypes[SMDDP_DTYPE_COUNT] = {
    [SMDDP_INT8] = {1, "int8"},         [SMDDP_UINT8] = {1, "uint8"},
    [SMDDP_INT32] = {4, "int32"},       [SMDDP_INT64] = {8, "int64"},
    [SMDDP_FLOAT16] = {2, "float16"},   [SMDDP_BFLOAT16] = {2, "bfloat16"},
    [SMDDP_FLOAT32] = {4, "float32"},   [SMDDP_FLOAT64] = {8, "float64"},
    [SMDDP_INT16] = {2, "int16"},       [SMDDP_UINT16] = {2, "uint16"},
    [SMDDP_UINT32] = {4, "uint32"},     [SMDDP_UINT64] = {8, "uint64"},
};

size_t smddp__dtype_size(smddp_dtype_t dtype)
{
    return (unsigned)dtype < SMDDP_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

const char *smddp__dtype_name(smddp_dtype_t dtype)
{
    return (unsigned)dtype < SMDDP_DTYPE_COUNT ? dtypes[dtype].name : "unknown";
}

const char *smddp__redop_name(smddp_op_t op)
{
    static const char *const names[SMDDP_OP_COUNT] = {
        [SMDDP_SUM] = "sum",       [SMDDP_PROD] = "prod", [SMDDP_MIN] = "min",
        [SMDDP_MAX] = "max",       [SMDDP_AVG] = "avg",   [SMDDP_PREMUL_SUM] = "premul_sum",
        [SMDDP_BAND] = "band",     [SMDDP_BOR] = "bor",   [SMDDP_BXOR] = "bxor",
    };
    return (unsigned)op < SMDDP_OP_COUNT ? names[op] : "unknown";
}

/*
 * Rows are positional, so that -Wmissing-field-initializers (-Wextra) stops
 * the build when a row leaves a trait out; test_op checks every kind has a row.
 */
#define ALL SMDDP_BUF_ALL
#define NONE SMDDP_BUF_NONE
#define ROOT SMDDP_BUF_ROOT
#define NONROOT SMDDP_BUF_NONROOT
#define VAR SMDDP_BUF_VARIABLE
#define N SMDDP_SCALE_COUNT
#define NP SMDDP_SCALE_RANKS
static const smddp__op_traits_t traits[SMDDP_OP_KIND_COUNT] = {
    /*                          name   reduces rooted p2p  empty=noop count_agreed in   out */
    [SMDDP_OP_ALLREDUCE] = {"allreduce", true, false, false, true, true, ALL, N, ALL, N},
    [SMDDP_OP_REDUCE] = {"reduce", true, true, false, true, true, ALL, N, ROOT, N},
    [SMDDP_OP_BROADCAST] = {"broadcast", false, true, false, false, true, ROOT, N, NONROOT, N},
    [SMDDP_OP_ALLGATHER] = {"allgather", false, false, false, false, true, ALL, N, ALL, NP},
    [SMDDP_OP_REDUCE_SCATTER] = {"reduce_scatter", true, false, false, true, true, ALL, NP, ALL,
                                 N},
    [SMDDP_OP_ALLTOALL] = {"alltoall", false, false, false, true, true, ALL, NP, ALL, NP},
    [SMDDP_OP_ALLTOALLV] = {"alltoallv", false, false, false, false, false, VAR, N, VAR, N},
    [SMDDP_OP_GATHER] = {"gather", false, true, false, false, true, ALL, N, ROOT, NP},
    [SMDDP_OP_SCATTER] = {"scatter", false, true, false, false, true, ROOT, NP, ALL, N},
    [SMDDP_OP_BARRIER] = {"barrier", false, false, false, false, false, NONE, N, NONE, N},
    [SMDDP_OP_SEND] = {"send", false, false, true, false, true, ALL, N, NONE, N},
    [SMDDP_OP_RECV] = {"recv", false, false, true, false, true, NONE, N, ALL, N},
};
#undef ALL
#undef NONE
#undef ROOT
#undef NONROOT
#undef VAR
#undef N
#undef NP

const smddp__op_traits_t *smddp__op_traits(smddp__op_kind_t kind)
{
    static const smddp__op_traits_t unknown = {"unknown",     false,         false,
                                               false,         false,         false,
                                               SMDDP_BUF_NONE, SMDDP_SCALE_COUNT,
                                               SMDDP_BUF_NONE, SMDDP_SCALE_COUNT};
    return (unsigned)kind < SMDDP_OP_KIND_COUNT ? &traits[kind] : &unknown;
}

const char *smddp__op_kind_name(smddp__op_kind_t kind) { return smddp__op_traits(kind)->name; }

static size_t buf_bytes(smddp__buf_use_t use, smddp__buf_scale_t scale, size_t n, int size,
                        bool root)
{
    bool used = use == SMDDP_BUF_ALL || (use == SMDDP_BUF_ROOT && root) ||
                (use == SMDDP_BUF_NONROOT && !root);
    if (!used) return 0;
    return scale == SMDDP_SCALE_RANKS ? n * (size_t)size : n;
}

void smddp__op_bytes(const smddp__op_t *op, int size, int rank, size_t *in, size_t *out)
{
    const smddp__op_traits_t *t = smddp__op_traits(op->kind);
    size_t es = smddp__dtype_size(op->dtype), n = op->count * es, p = (size_t)size;
    bool root = t->rooted && op->root == rank;
    *in = buf_bytes(t->in_use, t->in_scale, n, size, root);
    *out = buf_bytes(t->out_use, t->out_scale, n, size, root);
    if (t->in_use == SMDDP_BUF_VARIABLE) {
        /* v: sendcounts, sdispls, recvcounts, rdispls, in elements. */
        for (size_t r = 0; r < p; r++) {
            if (op->v[r] > 0) *in = SMDDP_MAX(*in, (size_t)(op->v[p + r] + op->v[r]) * es);
            if (op->v[2 * p + r] > 0)
                *out = SMDDP_MAX(*out, (size_t)(op->v[3 * p + r] + op->v[2 * p + r]) * es);
        }
    }
}

void smddp__op_describe(const smddp__op_t *op, char *buf, size_t cap)
{
    const smddp__op_traits_t *t = smddp__op_traits(op->kind);
    const char *name = t->name, *dtype = smddp__dtype_name(op->dtype);
    if (op->kind == SMDDP_OP_BARRIER) {
        snprintf(buf, cap, "barrier (seq %" PRIu64 ")", op->seq);
    } else if (t->p2p && op->root < 0) {
        snprintf(buf, cap, "%s (from any rank, tag %d, count %zu, %s)", name, op->tag, op->count,
                 dtype);
    } else if (t->p2p) {
        snprintf(buf, cap, "%s (%s rank %d, message %" PRIu64 ", tag %d, count %zu, %s)", name,
                 op->kind == SMDDP_OP_SEND ? "to" : "from", op->root, op->seq, op->tag, op->count,
                 dtype);
    } else if (t->reduces) {
        snprintf(buf, cap, "%s (seq %" PRIu64 ", count %zu, %s, %s)", name, op->seq, op->count,
                 dtype, smddp__redop_name(op->spec.op));
    } else {
        snprintf(buf, cap, "%s (seq %" PRIu64 ", count %zu, %s)", name, op->seq, op->count, dtype);
    }
    size_t used = strlen(buf);
    if (op->mem_type == SMDDP_MEM_CUDA && used < cap)
        snprintf(buf + used, cap - used, " on CUDA memory");
}

void smddp__op_desc(const smddp__op_t *op, smddp__op_desc_t *d)
{
    const smddp__op_traits_t *t = smddp__op_traits(op->kind);
    memset(d, 0, sizeof(*d));
    d->seq = op->seq;
    /* The memory type rides in the high bits: host and CUDA steps never pair up. */
    d->kind = (int32_t)op->kind | (int32_t)op->mem_type << 16;
    d->dtype = (int32_t)op->dtype;
    d->redop = t->reduces ? (int32_t)op->spec.op : -1;
    d->root = op->root;
    /* alltoallv counts differ legitimately; they are checked pairwise instead. */
    d->count = t->count_agreed ? op->count : 0;
}

smddp_status_t smddp__op_mismatch_error(const smddp__op_t *op, int rank, int peer,
                                        const smddp__op_desc_t *theirs)
{
    char mine_s[256], theirs_s[256];
    smddp__op_describe(op, mine_s, sizeof(mine_s));
    smddp__op_t other = {0};
    other.kind = (smddp__op_kind_t)(theirs->kind & 0xffff);
    other.mem_type = (smddp_mem_type_t)(theirs->kind >> 16);
    other.seq = theirs->seq;
    other.count = theirs->count;
    other.dtype = (smddp_dtype_t)theirs->dtype;
    other.spec.op = theirs->redop >= 0 ? (smddp_op_t)theirs->redop : SMDDP_SUM;
    other.root = theirs->root;
    smddp__op_describe(&other, theirs_s, sizeof(theirs_s));
    char root_a[32] = "", root_b[32] = "";
    if (op->root >= 0) snprintf(root_a, sizeof(root_a), " with root %d", op->root);
    if (theirs->root >= 0) snprintf(root_b, sizeof(root_b), " with root %d", theirs->root);
    return smddp__error_quiet(SMDDP_ERR_MISMATCH,
                              "operation mismatch: rank %d issued %s%s while rank %d issued %s%s "
                              "at the same point",
                              rank, mine_s, root_a, peer, theirs_s, root_b);
}
