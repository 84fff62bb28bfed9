/*
 * The router: runs every op on the path and with the algorithm the
 * selection (select.c) gives it. What the selection reads is gathered here,
 * before it chooses: the op, the communicator's layout and the limits its
 * ranks agreed on, and the verdicts of earlier ops (verdicts.h).
 */
#include <stdio.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/net/ring.h"
#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "cuda/nccl.h"
#include "exec.h"
#include "param.h"
#include "progress.h"
#include "transport/shm.h"

/* ---- what the selection reads ---------------------------------------------------- */

/* The limits of comm's shared memory; all 0 (nothing fits) where it has none. */
static void shm_limits(smddp_comm_t comm, uint64_t *lim)
{
    lim[SMDDP_LIM_CMA_MIN] = SMDDP_NO_CAP;
    if (!comm->shm) return;
    lim[SMDDP_LIM_LL] = smddp__shm_ll_max(comm);
    lim[SMDDP_LIM_HALF] = smddp__shm_half_size(comm);
    lim[SMDDP_LIM_ONESHOT] = smddp__oneshot_range(comm);
    lim[SMDDP_LIM_AR_LL] = SMDDP_MIN(lim[SMDDP_LIM_LL], lim[SMDDP_LIM_ONESHOT]);
    size_t lo, hi;
    if (smddp__cma_range(comm, &lo, &hi)) {
        lim[SMDDP_LIM_CMA_MIN] = lo;
        lim[SMDDP_LIM_CMA_MAX] = hi;
    }
}

void smddp__select_input(smddp_comm_t comm, const smddp__op_t *op, smddp__select_in_t *in)
{
    const smddp__params_t *params = smddp__params();
    size_t es = smddp__dtype_size(op->dtype);
    /* Field by field: a memset of the whole struct costs more than the choice (rep stos). */
    in->kind = op->kind;
    in->mem = op->mem_type;
    in->bytes = op->count * es;
    in->local_size = comm->local_size;
    in->node_count = comm->node_count;
    in->size = comm->size;
    in->facts = comm->node_ranks ? SMDDP_FACT_NODE_RANKS : 0;
    memset(in->lim, 0, sizeof(in->lim));
    in->net_algo = params->net_algo;
    in->allreduce_algo = params->algo;
    in->rules = comm->algo_rules;
    in->n_rules = comm->n_algo_rules;
    in->cuda_net = SMDDP_CUDA_NET_AUTO;
    in->backend_nccl = in->nccl_has_op = in->nccl_loads = false;
    in->cuda_max_local = 0;
    if (comm->node_count < 2) {
        shm_limits(comm, in->lim);
        if (in->lim[SMDDP_LIM_LL]) in->facts |= SMDDP_FACT_LL_SLOTS;
        if (op->kind == SMDDP_OP_ALLREDUCE && comm->shm && smddp__pool_on(comm)) {
            smddp__pool_verdict_t v = smddp__verdict_pooled(&comm->verdicts, in->bytes);
            if (v == SMDDP_POOLED_IN_PLACE) in->facts |= SMDDP_FACT_POOLED_IN_PLACE;
            if (v == SMDDP_POOLED_INPUTS) in->facts |= SMDDP_FACT_POOLED_INPUTS;
        }
    } else {
        /* fp16 and bf16 travel as fp32 across nodes: the leader's limit counts them so. */
        size_t travel = op->dtype == SMDDP_FLOAT16 || op->dtype == SMDDP_BFLOAT16 ? 4 : es;
        in->lim[SMDDP_LIM_LEADER] = (uint64_t)params->net_leader_max * es / SMDDP_MAX(travel, 1);
        in->lim[SMDDP_LIM_RS_ONE_PER_NODE] = ((4u << 20) + (uint64_t)comm->size - 1) / (uint64_t)comm->size;
    }
    if (op->mem_type != SMDDP_MEM_CUDA) return;
    in->cuda_net = params->cuda_net;
    in->backend_nccl = params->comm_backend == SMDDP_BACKEND_NCCL;
    in->nccl_has_op = smddp__nccl_has_op(op);
#if SMDDP_HAVE_CUDA
    in->cuda_max_local = SMDDP_CUDA_MAX_SRCS;
#endif
    /* Only where the choice depends on it: asking loads NCCL. */
    if (comm->node_count > 1 && in->cuda_net == SMDDP_CUDA_NET_AUTO && in->nccl_has_op) {
        const char *why = NULL;
        in->nccl_loads = comm->verdicts.nccl_everywhere >= 0 ? comm->verdicts.nccl_everywhere > 0
                                                             : smddp__nccl(&why) != NULL;
    }
}

smddp__choice_t smddp__choose(smddp_comm_t comm, const smddp__op_t *op)
{
    smddp__select_in_t in;
    smddp__select_input(comm, op, &in);
    return smddp__select(&in);
}

/* ---- at issue ------------------------------------------------------------------ */

smddp_status_t smddp__route_check_cuda(smddp_comm_t comm, smddp__op_kind_t kind, const char *fn)
{
    const smddp__cuda_calls_t *cuda = smddp__cuda_calls();
    if (!cuda)
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "%s: SMDDP_MEM_CUDA given, but this libsmddp was built without CUDA "
                            "(nvcc was not found at build time); pass host memory or rebuild with "
                            "-Dcuda=enabled",
                            fn);
    SMDDP_CHECK(cuda->usable(fn));
    const char *why = NULL;
    smddp__cuda_net_t net = smddp__params()->cuda_net;
    if (comm->node_count > 1 && net == SMDDP_CUDA_NET_NCCL && !smddp__nccl(&why))
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "%s: SMDDP_CUDA_NET=nccl sends CUDA memory across the %d nodes "
                            "through NCCL, which could not be loaded (%s); set "
                            "SMDDP_NCCL_LIBRARY, or SMDDP_CUDA_NET=auto to stage through host "
                            "memory",
                            fn, comm->node_count, why);
    /* A kind smddp's kernels lack goes through NCCL, unless staging serves it across nodes. */
    bool only_nccl = !smddp__algo_find(kind, SMDDP_PATH_CUDA_IPC, NULL) &&
                     !smddp__op_traits(kind)->p2p && kind != SMDDP_OP_BARRIER;
    bool can_stage = comm->node_count > 1 && net != SMDDP_CUDA_NET_NCCL;
    if (only_nccl && !can_stage && !smddp__nccl(&why))
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "%s: on CUDA memory this call goes through NCCL, which could not be "
                            "loaded (%s); set SMDDP_NCCL_LIBRARY, or stage through host memory "
                            "(SMDDP_MEM_HOST)",
                            fn, why);
    return SMDDP_OK;
}

bool smddp__route_needs_agreement(smddp_comm_t comm)
{
    return comm->node_count > 1 && smddp__params()->cuda_net == SMDDP_CUDA_NET_AUTO &&
           comm->verdicts.nccl_everywhere < 0;
}

int32_t smddp__route_nccl_here(const char **why) { return smddp__nccl(why) != NULL; }

void smddp__route_agreed(smddp_comm_t comm, int32_t everywhere, const char *why_here)
{
    comm->verdicts.nccl_everywhere = everywhere != 0;
    if (!everywhere)
        SMDDP_INFO("rank %d: NCCL does not load on every rank%s%s: CUDA collectives across nodes "
                   "stage through host memory",
                   comm->rank, why_here ? "; here: " : "", why_here ? why_here : "");
}

smddp_status_t smddp__route_prepare(smddp_comm_t comm, smddp__op_t *op)
{
    if (smddp__choose(comm, op).path != SMDDP_PATH_CUDA_STAGED) return SMDDP_OK;
    return smddp__cuda_calls()->stage_prepare(comm, op);
}

/* ---- in the op's turn ------------------------------------------------------------ */

/* The recorded path: across nodes, whether shared memory carried the node's share. */
static const char *path_name(const smddp__choice_t *c)
{
    if (c->path == SMDDP_PATH_NET) return c->algo && c->algo->hier ? "net-hier" : "net-flat";
    return smddp__path_name(c->path);
}

static void trace_choice(smddp_comm_t comm, const smddp__op_t *op, const smddp__choice_t *c)
{
    if (smddp__log_level() < SMDDP_LOG_TRACE) return;
    char desc[256];
    smddp__op_describe(op, desc, sizeof(desc));
    SMDDP_TRACE("rank %d: %s: %s, %s (%d local rank(s), %d node(s))", comm->rank, desc,
                path_name(c), c->algo ? c->algo->name : "chunks staged through host memory",
                comm->local_size, comm->node_count);
}

/* Host memory: shared memory on one node, else the network. */
static smddp_status_t run_host_choice(smddp_comm_t comm, smddp__op_t *op, const smddp__choice_t *c)
{
    op->path = path_name(c);
    op->algo = c->algo ? c->algo->name : NULL;
    trace_choice(comm, op, c);
    if (!c->algo)
        return smddp__error(SMDDP_ERR_INTERNAL, "rank %d: no host algorithm for %s",
                            comm->rank, smddp__op_kind_name(op->kind));
    if (op->count == 0 && smddp__op_traits(op->kind)->empty_is_noop) return SMDDP_OK;
    if (c->path == SMDDP_PATH_SHM) return c->algo->run(comm, op);
    return smddp__net_run(comm, op, c->algo->run);
}

/* The host path of a staged op's chunks (host memory: always a host path). */
static smddp_status_t run_host(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__choice_t c = smddp__choose(comm, op);
    return run_host_choice(comm, op, &c);
}

/*
 * An op in its turn, on the path and with the algorithm the selection gives
 * it. The CUDA paths are taken only by ops on device memory, which a build
 * without CUDA refused at issue (smddp__route_check_cuda).
 */
static smddp_status_t run(smddp_comm_t comm, smddp__op_t *op)
{
    /* A staged op's stream work was enqueued at issue (smddp__route_prepare). */
    if (op->stage) {
        op->path = smddp__path_name(SMDDP_PATH_CUDA_STAGED);
        return smddp__cuda_calls()->stage_run(comm, op, run_host);
    }
    smddp__choice_t c = smddp__choose(comm, op);
    switch (c.path) {
    case SMDDP_PATH_SHM:
    case SMDDP_PATH_NET:
        return run_host_choice(comm, op, &c);
    case SMDDP_PATH_NCCL: {
        op->path = path_name(&c);
        op->algo = c.algo->name;
        trace_choice(comm, op, &c);
        static _Atomic uint32_t said;
        uint32_t bit = 1u << (comm->node_count > 1 ? 1 : op->kind == SMDDP_OP_ALLTOALLV ? 2 : 0);
        if (!(atomic_fetch_or(&said, bit) & bit))
            SMDDP_INFO("CUDA %s goes to NCCL: %s (said once)", smddp__op_kind_name(op->kind),
                       c.why);
        return smddp__cuda_calls()->execute(comm, op, c.algo->run, false);
    }
    case SMDDP_PATH_CUDA_IPC:
        op->path = path_name(&c);
        if (!c.algo)
            return smddp__error(SMDDP_ERR_INTERNAL, "rank %d: %s has no CUDA implementation",
                                comm->rank, smddp__op_kind_name(op->kind));
        op->algo = c.algo->name;
        trace_choice(comm, op, &c);
        return smddp__cuda_calls()->execute(comm, op, c.algo->run, true);
    case SMDDP_PATH_CUDA_STAGED:
    case SMDDP_PATH_COUNT:
        break;
    }
    return smddp__error(SMDDP_ERR_INTERNAL, "rank %d: %s routed through host staging was "
                        "not staged at issue", comm->rank, smddp__op_kind_name(op->kind));
}

/* SMDDP_CHECK_ORDER: one extra barrier so that every rank compares every peer's desc. */
static smddp_status_t check_order(smddp_comm_t comm, smddp__op_t *op, const smddp__op_desc_t *mine)
{
    SMDDP_CHECK(smddp__shm_sync(comm, op));
    for (int q = 0; q < comm->local_size; q++) {
        smddp__op_desc_t theirs;
        /* A peer already two ops on has rewritten the slot: it got past this one. */
        if (!smddp__shm_read_desc(comm, q, op->seq, &theirs)) continue;
        if (memcmp(&theirs, mine, sizeof(theirs)) != 0)
            return smddp__op_mismatch_error(op, comm->rank, comm->local_ranks[q], &theirs);
    }
    return SMDDP_OK;
}

smddp_status_t smddp__op_execute(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__op_desc_t desc;
    smddp__op_desc(op, &desc);
    smddp__shm_op_begin(comm, &desc, op->started_ns);
    smddp__pool_tick(comm, op->started_ns);
    smddp_status_t st = SMDDP_OK;
    if (smddp__params()->check) st = check_order(comm, op, &desc);
    if (st == SMDDP_OK) st = run(comm, op);
    smddp__shm_op_end(comm, st == SMDDP_OK);
    smddp__progress_after_op(comm, op, st);
    return st;
}
