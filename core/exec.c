/*
 * The router: which path an op's data takes (shared memory, the network
 * flat or hierarchical, CUDA IPC, host staging, NCCL) and which algorithm
 * moves it, decided here for every op and nowhere else. The algorithms are
 * one table, a row per kind and a column per path; a path without an entry
 * for a kind does not serve it.
 */
#include <stdio.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/net.h"
#include "cuda/coll_cuda.h"
#include "cuda/kernels.h"
#include "cuda/nccl.h"
#include "cuda/stage.h"
#include "exec.h"
#include "param.h"
#include "progress.h"
#include "transport/shm.h"

typedef struct algos {
    smddp__algo_fn shm, flat, hier, cuda;
} algos_t;

#if SMDDP_HAVE_CUDA
#define CUDA(name) smddp__cuda_ipc_##name
#else
#define CUDA(name) NULL
#endif

/* Send and receive have no row: the send/recv engine (p2p/) runs them. */
static const algos_t algos[SMDDP_OP_KIND_COUNT] = {
    [SMDDP_OP_ALLREDUCE] = {smddp__allreduce, smddp__net_allreduce, smddp__hier_allreduce,
                            CUDA(allreduce)},
    [SMDDP_OP_REDUCE] = {smddp__reduce_root, smddp__net_reduce, smddp__hier_reduce, CUDA(reduce)},
    [SMDDP_OP_BROADCAST] = {smddp__coll_broadcast, smddp__net_broadcast, smddp__hier_broadcast,
                            CUDA(broadcast)},
    [SMDDP_OP_ALLGATHER] = {smddp__coll_allgather, smddp__net_allgather, smddp__hier_allgather,
                            CUDA(allgather)},
    [SMDDP_OP_REDUCE_SCATTER] = {smddp__reduce_scatter, smddp__net_reduce_scatter,
                                 smddp__hier_reduce_scatter, CUDA(reduce_scatter)},
    [SMDDP_OP_ALLTOALL] = {smddp__coll_alltoall, smddp__net_alltoall, NULL, CUDA(alltoall)},
    [SMDDP_OP_ALLTOALLV] = {smddp__coll_alltoallv, smddp__net_alltoallv, NULL, NULL},
    [SMDDP_OP_GATHER] = {smddp__coll_gather, smddp__net_gather, NULL, CUDA(gather)},
    [SMDDP_OP_SCATTER] = {smddp__coll_scatter, smddp__net_scatter, NULL, CUDA(scatter)},
    [SMDDP_OP_BARRIER] = {smddp__coll_barrier, smddp__net_barrier, smddp__hier_barrier, NULL},
};

static const algos_t *algos_of(smddp__op_kind_t kind)
{
    static const algos_t none = {NULL, NULL, NULL, NULL};
    return (unsigned)kind < SMDDP_OP_KIND_COUNT ? &algos[kind] : &none;
}

/* ---- the route ---------------------------------------------------------------- */

/*
 * With one rank per node on two nodes, reductions with at least this much
 * input run hierarchical: its allreduce goes in rounds, each round's
 * reduction overlapping the next one's transfer, where the flat ring moves
 * whole blocks and then reduces them; its reduce_scatter reduces from the
 * input round by round, where the flat one first copies the whole input.
 * Only two nodes were measured (bench/RESULTS.md): with more, a hierarchical
 * round (one staging half) is split into a block per node, so its messages
 * shrink as nodes are added.
 */
#define ONE_PER_NODE_ALLREDUCE_HIER_MIN (16u << 20)
#define ONE_PER_NODE_REDUCE_SCATTER_HIER_MIN (4u << 20)

/* Whether the hierarchical algorithms run host op across nodes (see SMDDP_NET_ALGO). */
static bool use_hier(smddp_comm_t comm, const smddp__op_t *op)
{
    smddp__net_algo_t algo = smddp__params()->net_algo;
    if (!algos_of(op->kind)->hier) return false;
    if (algo == SMDDP_NET_FLAT || !comm->node_ranks) return false;
    if (algo == SMDDP_NET_HIER || comm->local_size > 1) return true;
    /* One rank per node: otherwise the same ring as flat, plus copies. */
    if (comm->node_count != 2) return false;
    size_t in = op->count * smddp__dtype_size(op->dtype);
    if (op->kind == SMDDP_OP_REDUCE_SCATTER)
        return in * (size_t)comm->size >= ONE_PER_NODE_REDUCE_SCATTER_HIER_MIN;
    return (op->kind == SMDDP_OP_ALLREDUCE || op->kind == SMDDP_OP_REDUCE) &&
           in >= ONE_PER_NODE_ALLREDUCE_HIER_MIN;
}

#if SMDDP_HAVE_CUDA
/*
 * CUDA memory across nodes staged through host memory rather than NCCL:
 * SMDDP_CUDA_NET=staged, or auto where NCCL does not load (on every rank)
 * or lacks the op. Send and receive on CUDA memory always stage.
 */
static bool staged(smddp_comm_t comm, const smddp__op_t *op)
{
    if (smddp__op_traits(op->kind)->p2p) return true; /* the only way */
    if (comm->node_count < 2) return false;
    const char *why = NULL;
    switch (smddp__params()->cuda_net) {
    case SMDDP_CUDA_NET_STAGED: return true;
    case SMDDP_CUDA_NET_NCCL: return false;
    case SMDDP_CUDA_NET_AUTO: break;
    }
    /* NCCL crosses nodes with GPUDirect where the fabric allows. */
    if (!smddp__nccl_has_op(op)) return true;
    if (comm->cuda_nccl_everywhere >= 0) return !comm->cuda_nccl_everywhere;
    return !smddp__nccl(&why);
}
#endif

/* Whether a CUDA op that does not stage goes to NCCL rather than smddp's kernels. */
static bool to_nccl(smddp_comm_t comm, const smddp__op_t *op, const char **why)
{
    if (smddp__params()->comm_backend == SMDDP_BACKEND_NCCL && smddp__nccl_has_op(op)) {
        *why = "SMDDP_COMMUNICATION_BACKEND is nccl";
        return true;
    }
    if (comm->node_count > 1) {
        *why = "NCCL loads and crosses nodes with GPUDirect where the fabric allows "
               "(SMDDP_CUDA_NET=staged stages through host memory instead)";
        return true;
    }
    if (!algos_of(op->kind)->cuda) {
        *why = "smddp has no CUDA all-to-all with split sizes yet";
        return true;
    }
#if SMDDP_HAVE_CUDA
    if (comm->local_size > SMDDP_CUDA_MAX_SRCS) {
        *why = "more local ranks than smddp's CUDA kernels combine";
        return true;
    }
#endif
    return false;
}

smddp__route_t smddp__route(smddp_comm_t comm, const smddp__op_t *op, const char **why)
{
    const char *unused;
    if (!why) why = &unused;
    *why = NULL;
    if (op->mem_type != SMDDP_MEM_CUDA || op->kind == SMDDP_OP_BARRIER) {
        if (comm->node_count < 2) return SMDDP_ROUTE_SHM;
        return use_hier(comm, op) ? SMDDP_ROUTE_NET_HIER : SMDDP_ROUTE_NET_FLAT;
    }
#if SMDDP_HAVE_CUDA
    if (staged(comm, op)) return SMDDP_ROUTE_CUDA_STAGED;
#endif
    return to_nccl(comm, op, why) ? SMDDP_ROUTE_NCCL : SMDDP_ROUTE_CUDA_IPC;
}

/* ---- at issue ------------------------------------------------------------------ */

smddp_status_t smddp__route_check_cuda(smddp_comm_t comm, smddp__op_kind_t kind, const char *fn)
{
    SMDDP_CHECK(smddp__cuda_usable(fn));
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
    bool only_nccl = !algos_of(kind)->cuda && !smddp__op_traits(kind)->p2p &&
                     kind != SMDDP_OP_BARRIER;
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
           comm->cuda_nccl_everywhere < 0;
}

int32_t smddp__route_nccl_here(const char **why) { return smddp__nccl(why) != NULL; }

void smddp__route_agreed(smddp_comm_t comm, int32_t everywhere, const char *why_here)
{
    comm->cuda_nccl_everywhere = everywhere != 0;
    if (!everywhere)
        SMDDP_INFO("rank %d: NCCL does not load on every rank%s%s: CUDA collectives across nodes "
                   "stage through host memory",
                   comm->rank, why_here ? "; here: " : "", why_here ? why_here : "");
}

smddp_status_t smddp__route_prepare(smddp_comm_t comm, smddp__op_t *op)
{
    if (smddp__route(comm, op, NULL) != SMDDP_ROUTE_CUDA_STAGED) return SMDDP_OK;
    return smddp__cuda_stage_prepare(comm, op);
}

/* ---- in the op's turn ------------------------------------------------------------ */

/* Host memory on its route: shared memory on one node, else the network. */
static smddp_status_t run_host_on(smddp_comm_t comm, smddp__op_t *op, smddp__route_t route)
{
    const algos_t *a = algos_of(op->kind);
    smddp__algo_fn algo = route == SMDDP_ROUTE_SHM        ? a->shm
                          : route == SMDDP_ROUTE_NET_HIER ? a->hier
                                                          : a->flat;
    if (!algo)
        return smddp__error(SMDDP_ERR_INTERNAL, "no host algorithm for operation kind %d",
                            (int)op->kind);
    if (smddp__log_level() >= SMDDP_LOG_TRACE &&
        (route != SMDDP_ROUTE_SHM || op->kind != SMDDP_OP_ALLREDUCE)) {
        char desc[256];
        smddp__op_describe(op, desc, sizeof(desc));
        if (route == SMDDP_ROUTE_SHM)
            SMDDP_TRACE("rank %d: %s through shm, %d local rank(s)", comm->rank, desc,
                        comm->local_size);
        else
            SMDDP_TRACE("rank %d: %s across %d nodes: %s", comm->rank, desc, comm->node_count,
                        route == SMDDP_ROUTE_NET_HIER
                            ? "hierarchical (shm inside nodes, network between)"
                            : "flat (every rank on the network)");
    }
    if (op->count == 0 && smddp__op_traits(op->kind)->empty_is_noop) return SMDDP_OK;
    if (route == SMDDP_ROUTE_SHM) return algo(comm, op);
    return smddp__net_run(comm, op, algo);
}

/* The host path of a staged op's chunks (host memory: always a host route). */
static smddp_status_t run_host(smddp_comm_t comm, smddp__op_t *op)
{
    return run_host_on(comm, op, smddp__route(comm, op, NULL));
}

/* A route's name, for the flight recorder (op->path). */
static const char *route_name(smddp__route_t route)
{
    switch (route) {
    case SMDDP_ROUTE_SHM: return "shm";
    case SMDDP_ROUTE_NET_FLAT: return "net-flat";
    case SMDDP_ROUTE_NET_HIER: return "net-hier";
    case SMDDP_ROUTE_CUDA_IPC: return "cuda-ipc";
    case SMDDP_ROUTE_CUDA_STAGED: return "cuda-staged";
    case SMDDP_ROUTE_NCCL: return "nccl";
    }
    return "unknown";
}

/* An op in its turn, on the route smddp__route gives it. */
static smddp_status_t run(smddp_comm_t comm, smddp__op_t *op)
{
    /* A staged op's stream work was enqueued at issue (smddp__route_prepare). */
    if (op->stage) {
        op->path = route_name(SMDDP_ROUTE_CUDA_STAGED);
        return smddp__cuda_stage_run(comm, op, run_host);
    }
    const char *why = NULL;
    smddp__route_t route = smddp__route(comm, op, &why);
    op->path = route_name(route);
    switch (route) {
    case SMDDP_ROUTE_SHM:
    case SMDDP_ROUTE_NET_FLAT:
    case SMDDP_ROUTE_NET_HIER:
        return run_host_on(comm, op, route);
    case SMDDP_ROUTE_NCCL: {
        static _Atomic uint32_t said;
        uint32_t bit = 1u << (comm->node_count > 1 ? 1 : op->kind == SMDDP_OP_ALLTOALLV ? 2 : 0);
        if (!(atomic_fetch_or(&said, bit) & bit))
            SMDDP_INFO("CUDA %s goes to NCCL: %s (said once)", smddp__op_kind_name(op->kind),
                       why);
        return smddp__cuda_execute(comm, op, smddp__nccl_execute, false);
    }
    case SMDDP_ROUTE_CUDA_IPC:
        break;
    case SMDDP_ROUTE_CUDA_STAGED:
        return smddp__error(SMDDP_ERR_INTERNAL, "rank %d: %s routed through host staging was "
                            "not staged at issue", comm->rank, smddp__op_kind_name(op->kind));
    }
    smddp__algo_fn algo = algos_of(op->kind)->cuda;
    if (!algo)
        return smddp__error(SMDDP_ERR_INTERNAL, "rank %d: %s has no CUDA implementation",
                            comm->rank, smddp__op_kind_name(op->kind));
    return smddp__cuda_execute(comm, op, algo, true);
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
