/*
 * The selection: every algorithm of this build in one registry, and one
 * table that says, per (kind, path, ranks per node, nodes) and size range,
 * which of them runs. smddp__select is the only function that chooses a
 * path or an algorithm; it reads nothing but its input. SMDDP_ALGO's rules
 * come first, then the settings that predate it (SMDDP_ALLREDUCE_ALGO,
 * SMDDP_NET_ALGO), then the table; the first row that matches and whose
 * algorithm can run decides.
 *
 * Where the table's figures come from (bench/RESULTS.md):
 * - inside a node, one-shot reads every peer's copy (P x bytes per rank),
 *   two-shot a fixed 2 x bytes plus one more synchronisation, so one-shot's
 *   range (SMDDP_ALLREDUCE_ONESHOT_MAX) shrinks as ranks are added; the
 *   low-latency slots beat both up to SMDDP_SHM_LL_MAX, and beat reading
 *   pooled buffers in place up to 1 KiB. In place in pools, one-shot must
 *   stage and two-shot need not: measured 3-13x faster at 8-128 KiB, so a
 *   size whose last allreduce ran in place in the pools (the verdict,
 *   verdicts.h) goes two-shot. A broadcast through the slots pays off up to
 *   1 KiB; above, the staged one, whose root does not wait, was as fast.
 *   Cross-memory attach (one copy) beat the slots for allgather where it
 *   applies;
 * - across nodes with one rank per node, reductions of at least 16 MiB (a
 *   reduce-scatter's input of 4 MiB) run hierarchical: its rounds overlap
 *   one round's reduction with the next one's transfer, where the flat ring
 *   moves whole blocks and then reduces them. Only two nodes were measured:
 *   with more, a hierarchical round is split into a block per node, so its
 *   messages shrink as nodes are added. With several ranks per node the
 *   hierarchical algorithms keep every byte inside the node off the
 *   network; up to SMDDP_NET_LEADER_MAX one rank per node carries it, where
 *   the network's latency, not its bandwidth, decides.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coll/coll.h"
#include "cuda/nccl.h"
#include "select.h"
#include "transport/shm.h"

/* ---- the registry ------------------------------------------------------------- */

static const smddp__algo_t *const registry[] = {
    &smddp__algo_allreduce_ll, &smddp__algo_allreduce_oneshot, &smddp__algo_allreduce_twoshot,
    &smddp__algo_reduce_ll, &smddp__algo_reduce_oneshot, &smddp__algo_reduce_twoshot,
    &smddp__algo_reduce_scatter_twoshot,
    &smddp__algo_broadcast_ll, &smddp__algo_broadcast_staged, &smddp__algo_allgather_ll,
    &smddp__algo_allgather_staged, &smddp__algo_gather_staged, &smddp__algo_scatter_staged,
    &smddp__algo_alltoall_staged, &smddp__algo_alltoallv_staged, &smddp__algo_barrier_ll,
    &smddp__algo_barrier_counters,
    &smddp__algo_net_allreduce_ring, &smddp__algo_net_reduce_ring,
    &smddp__algo_net_reduce_scatter_ring, &smddp__algo_net_allgather_ring,
    &smddp__algo_net_broadcast_chain, &smddp__algo_net_alltoall_pairwise,
    &smddp__algo_net_alltoallv_pairwise, &smddp__algo_net_gather_direct,
    &smddp__algo_net_scatter_direct, &smddp__algo_net_barrier_ring,
    &smddp__algo_hier_allreduce, &smddp__algo_hier_allreduce_leader, &smddp__algo_hier_reduce,
    &smddp__algo_hier_reduce_leader, &smddp__algo_hier_reduce_scatter,
    &smddp__algo_hier_allgather, &smddp__algo_hier_broadcast, &smddp__algo_hier_barrier,
#if SMDDP_HAVE_CUDA
    &smddp__algo_cuda_allreduce, &smddp__algo_cuda_reduce, &smddp__algo_cuda_broadcast,
    &smddp__algo_cuda_allgather, &smddp__algo_cuda_gather, &smddp__algo_cuda_reduce_scatter,
    &smddp__algo_cuda_alltoall, &smddp__algo_cuda_scatter,
#endif
};
#define N_REGISTRY (sizeof(registry) / sizeof(registry[0]))

/* Every CUDA op that NCCL runs; each chunk of a staged one chooses its host algorithm. */
static const smddp__algo_t through_nccl = {
    .name = "nccl", .kind = SMDDP_OP_KIND_COUNT, .path = SMDDP_PATH_NCCL,
    .run = smddp__nccl_execute, .about = "NCCL's own collective, on NCCL's communicator"};

const smddp__algo_t *const *smddp__algos(size_t *n)
{
    *n = N_REGISTRY;
    return registry;
}

const smddp__algo_t *smddp__algo_find(smddp__op_kind_t kind, smddp__path_t path, const char *name)
{
    for (size_t i = 0; i < N_REGISTRY; i++) {
        const smddp__algo_t *a = registry[i];
        if (a->kind == kind && a->path == path && (!name || !strcmp(a->name, name))) return a;
    }
    return NULL;
}

/* The entry of (kind, name) on any path: names are unique per kind (test_select checks). */
static const smddp__algo_t *find_any_path(smddp__op_kind_t kind, const char *name, size_t len)
{
    for (size_t i = 0; i < N_REGISTRY; i++) {
        const smddp__algo_t *a = registry[i];
        if (a->kind == kind && strlen(a->name) == len && !strncmp(a->name, name, len)) return a;
    }
    return NULL;
}

const char *smddp__path_name(smddp__path_t path)
{
    switch (path) {
    case SMDDP_PATH_SHM: return "shm";
    case SMDDP_PATH_NET: return "net";
    case SMDDP_PATH_CUDA_IPC: return "cuda-ipc";
    case SMDDP_PATH_CUDA_STAGED: return "cuda-staged";
    case SMDDP_PATH_NCCL: return "nccl";
    case SMDDP_PATH_COUNT: break;
    }
    return "unknown";
}

/* ---- the table ------------------------------------------------------------------ */

#define K(kind) SMDDP_OP_##kind
#define LIM(l) {SMDDP_LIM_##l, SMDDP_NO_CAP}
#define LIMCAP(l, c) {SMDDP_LIM_##l, (c)}
#define AT(n) {SMDDP_LIM_NONE, (n)}
#define INF AT(SMDDP_NO_CAP)
#define ANY_LAYOUT 1, 0, 1, 0
#define ONE_NODE 1, 0, 1, 1
#define NODES 1, 0, 2, 0
#define MANY_PER_NODE 2, 0, 2, 0
#define ONE_PER_NODE_TWO_NODES 1, 1, 2, 2
#define SHM SMDDP_PATH_SHM
#define NET SMDDP_PATH_NET
#define F(f) SMDDP_FACT_##f
#define A(entry) &smddp__algo_##entry

static const smddp__select_row_t table[] = {
    /* Host memory, one node: shared memory. */
    {K(ALLREDUCE), SHM, ONE_NODE, AT(1), LIMCAP(AR_LL, 1024), 0, 0, A(allreduce_ll)},
    {K(ALLREDUCE), SHM, ONE_NODE, AT(1), LIM(AR_LL), 0, F(POOLED_ANY), A(allreduce_ll)},
    {K(ALLREDUCE), SHM, ONE_NODE, AT(0), LIM(ONESHOT), F(POOLED_IN_PLACE), 0, A(allreduce_twoshot)},
    {K(ALLREDUCE), SHM, ONE_NODE, AT(0), LIM(ONESHOT), 0, 0, A(allreduce_oneshot)},
    {K(ALLREDUCE), SHM, ONE_NODE, AT(0), INF, 0, 0, A(allreduce_twoshot)},
    {K(REDUCE), SHM, ONE_NODE, AT(1), LIMCAP(LL, 1024), 0, 0, A(reduce_ll)},
    {K(REDUCE), SHM, ONE_NODE, AT(0), LIM(HALF), 0, 0, A(reduce_oneshot)},
    {K(REDUCE), SHM, ONE_NODE, AT(0), INF, 0, 0, A(reduce_twoshot)},
    {K(REDUCE_SCATTER), SHM, ONE_NODE, AT(0), INF, 0, 0, A(reduce_scatter_twoshot)},
    {K(BROADCAST), SHM, ONE_NODE, AT(1), LIMCAP(LL, 1024), 0, 0, A(broadcast_ll)},
    {K(BROADCAST), SHM, ONE_NODE, AT(0), INF, 0, 0, A(broadcast_staged)},
    {K(ALLGATHER), SHM, ONE_NODE, LIM(CMA_MIN), LIM(CMA_MAX), 0, 0, A(allgather_staged)},
    {K(ALLGATHER), SHM, ONE_NODE, AT(1), LIM(LL), 0, 0, A(allgather_ll)},
    {K(ALLGATHER), SHM, ONE_NODE, AT(0), INF, 0, 0, A(allgather_staged)},
    {K(GATHER), SHM, ONE_NODE, AT(0), INF, 0, 0, A(gather_staged)},
    {K(SCATTER), SHM, ONE_NODE, AT(0), INF, 0, 0, A(scatter_staged)},
    {K(ALLTOALL), SHM, ONE_NODE, AT(0), INF, 0, 0, A(alltoall_staged)},
    {K(ALLTOALLV), SHM, ONE_NODE, AT(0), INF, 0, 0, A(alltoallv_staged)},
    {K(BARRIER), SHM, ONE_NODE, AT(0), INF, F(LL_SLOTS), 0, A(barrier_ll)},
    {K(BARRIER), SHM, ONE_NODE, AT(0), INF, 0, 0, A(barrier_counters)},
    /* Host memory across nodes. */
    {K(ALLREDUCE), NET, ONE_PER_NODE_TWO_NODES, AT(16u << 20), INF, F(NODE_RANKS), 0, A(hier_allreduce)},
    {K(ALLREDUCE), NET, MANY_PER_NODE, AT(0), LIM(LEADER), F(NODE_RANKS), 0, A(hier_allreduce_leader)},
    {K(ALLREDUCE), NET, MANY_PER_NODE, AT(0), INF, F(NODE_RANKS), 0, A(hier_allreduce)},
    {K(ALLREDUCE), NET, NODES, AT(0), INF, 0, 0, A(net_allreduce_ring)},
    {K(REDUCE), NET, ONE_PER_NODE_TWO_NODES, AT(16u << 20), INF, F(NODE_RANKS), 0, A(hier_reduce)},
    {K(REDUCE), NET, MANY_PER_NODE, AT(0), LIM(LEADER), F(NODE_RANKS), 0, A(hier_reduce_leader)},
    {K(REDUCE), NET, MANY_PER_NODE, AT(0), INF, F(NODE_RANKS), 0, A(hier_reduce)},
    {K(REDUCE), NET, NODES, AT(0), INF, 0, 0, A(net_reduce_ring)},
    {K(REDUCE_SCATTER), NET, ONE_PER_NODE_TWO_NODES, LIM(RS_ONE_PER_NODE), INF, F(NODE_RANKS), 0,
     A(hier_reduce_scatter)},
    {K(REDUCE_SCATTER), NET, MANY_PER_NODE, AT(0), INF, F(NODE_RANKS), 0, A(hier_reduce_scatter)},
    {K(REDUCE_SCATTER), NET, NODES, AT(0), INF, 0, 0, A(net_reduce_scatter_ring)},
    {K(ALLGATHER), NET, MANY_PER_NODE, AT(0), INF, F(NODE_RANKS), 0, A(hier_allgather)},
    {K(ALLGATHER), NET, NODES, AT(0), INF, 0, 0, A(net_allgather_ring)},
    {K(BROADCAST), NET, MANY_PER_NODE, AT(0), INF, F(NODE_RANKS), 0, A(hier_broadcast)},
    {K(BROADCAST), NET, NODES, AT(0), INF, 0, 0, A(net_broadcast_chain)},
    {K(BARRIER), NET, MANY_PER_NODE, AT(0), INF, F(NODE_RANKS), 0, A(hier_barrier)},
    {K(BARRIER), NET, NODES, AT(0), INF, 0, 0, A(net_barrier_ring)},
    {K(ALLTOALL), NET, NODES, AT(0), INF, 0, 0, A(net_alltoall_pairwise)},
    {K(ALLTOALLV), NET, NODES, AT(0), INF, 0, 0, A(net_alltoallv_pairwise)},
    {K(GATHER), NET, NODES, AT(0), INF, 0, 0, A(net_gather_direct)},
    {K(SCATTER), NET, NODES, AT(0), INF, 0, 0, A(net_scatter_direct)},
};

/* SMDDP_ALLREDUCE_ALGO=oneshot and =twoshot, and SMDDP_NET_ALGO=hier, as rules. */
static const smddp__select_row_t rules_oneshot[] = {
    {K(ALLREDUCE), SHM, ANY_LAYOUT, AT(0), LIM(HALF), 0, 0, A(allreduce_oneshot)},
    {K(ALLREDUCE), SHM, ANY_LAYOUT, AT(0), INF, 0, 0, A(allreduce_twoshot)},
};
static const smddp__select_row_t rules_twoshot[] = {
    {K(ALLREDUCE), SHM, ANY_LAYOUT, AT(0), INF, 0, 0, A(allreduce_twoshot)},
};
static const smddp__select_row_t rules_hier[] = {
    {K(ALLREDUCE), NET, ANY_LAYOUT, AT(0), LIM(LEADER), 0, 0, A(hier_allreduce_leader)},
    {K(ALLREDUCE), NET, ANY_LAYOUT, AT(0), INF, 0, 0, A(hier_allreduce)},
    {K(REDUCE), NET, ANY_LAYOUT, AT(0), LIM(LEADER), 0, 0, A(hier_reduce_leader)},
    {K(REDUCE), NET, ANY_LAYOUT, AT(0), INF, 0, 0, A(hier_reduce)},
    {K(REDUCE_SCATTER), NET, ANY_LAYOUT, AT(0), INF, 0, 0, A(hier_reduce_scatter)},
    {K(ALLGATHER), NET, ANY_LAYOUT, AT(0), INF, 0, 0, A(hier_allgather)},
    {K(BROADCAST), NET, ANY_LAYOUT, AT(0), INF, 0, 0, A(hier_broadcast)},
    {K(BARRIER), NET, ANY_LAYOUT, AT(0), INF, 0, 0, A(hier_barrier)},
};
#define N_OF(a) (int)(sizeof(a) / sizeof((a)[0]))

const smddp__select_row_t *smddp__select_table(int *n)
{
    *n = N_OF(table);
    return table;
}

static uint64_t bound(const smddp__bound_t *b, const uint64_t *lim)
{
    return b->lim == SMDDP_LIM_NONE ? b->cap : SMDDP_MIN(lim[b->lim], b->cap);
}

static bool in_range(int v, int lo, int hi) { return v >= lo && (hi == 0 || v <= hi); }

/* The row's algorithm when it matches in and that algorithm can run it; else NULL. */
static const smddp__algo_t *match(const smddp__select_row_t *r, const smddp__select_in_t *in,
                                  smddp__path_t path, bool flat_only)
{
    if (r->kind != in->kind || r->path != path) return NULL;
    if (!in_range(in->local_size, r->local_min, r->local_max) ||
        !in_range(in->node_count, r->nodes_min, r->nodes_max))
        return NULL;
    if (in->bytes < bound(&r->lo, in->lim) || in->bytes > bound(&r->hi, in->lim)) return NULL;
    if ((in->facts & r->need) != r->need || (in->facts & r->unless)) return NULL;
    const smddp__algo_t *a = r->algo;
    if (flat_only && a->hier) return NULL;
    return !a->can_run || a->can_run(in) ? a : NULL;
}

static const smddp__algo_t *first(const smddp__select_row_t *rows, int n,
                                  const smddp__select_in_t *in, smddp__path_t path, bool flat_only)
{
    for (int i = 0; i < n; i++) {
        const smddp__algo_t *a = match(&rows[i], in, path, flat_only);
        if (a) return a;
    }
    return NULL;
}

/* Host memory: the rules, then the settings that predate them, then the table. */
static const smddp__algo_t *host_algo(const smddp__select_in_t *in, smddp__path_t path)
{
    bool flat_only = path == SMDDP_PATH_NET && in->net_algo == SMDDP_NET_FLAT;
    const smddp__algo_t *a = first(in->rules, in->n_rules, in, path, flat_only);
    if (!a && path == SMDDP_PATH_SHM && in->allreduce_algo == SMDDP_ALLREDUCE_ONESHOT)
        a = first(rules_oneshot, N_OF(rules_oneshot), in, path, false);
    if (!a && path == SMDDP_PATH_SHM && in->allreduce_algo == SMDDP_ALLREDUCE_TWOSHOT)
        a = first(rules_twoshot, N_OF(rules_twoshot), in, path, false);
    if (!a && path == SMDDP_PATH_NET && in->net_algo == SMDDP_NET_HIER)
        a = first(rules_hier, N_OF(rules_hier), in, path, false);
    if (!a) a = first(table, N_OF(table), in, path, flat_only);
    return a;
}

/*
 * CUDA memory across nodes staged through host memory rather than NCCL:
 * SMDDP_CUDA_NET=staged, or auto where NCCL does not load (on every rank)
 * or lacks the op. Send and receive on CUDA memory always stage.
 */
static bool staged(const smddp__select_in_t *in)
{
    if (smddp__op_traits(in->kind)->p2p) return true; /* the only way */
    if (in->node_count < 2) return false;
    switch (in->cuda_net) {
    case SMDDP_CUDA_NET_STAGED: return true;
    case SMDDP_CUDA_NET_NCCL: return false;
    case SMDDP_CUDA_NET_AUTO: break;
    }
    /* NCCL crosses nodes with GPUDirect where the fabric allows. */
    return !in->nccl_has_op || !in->nccl_loads;
}

/*
 * Why a CUDA op that does not stage goes to NCCL rather than smddp's kernels
 * (ipc: its CUDA IPC entry, if any); NULL: it does not.
 */
static const char *to_nccl(const smddp__select_in_t *in, const smddp__algo_t *ipc)
{
    if (in->backend_nccl && in->nccl_has_op) return "SMDDP_COMMUNICATION_BACKEND is nccl";
    if (in->node_count > 1)
        return "NCCL loads and crosses nodes with GPUDirect where the fabric allows "
               "(SMDDP_CUDA_NET=staged stages through host memory instead)";
    if (!ipc) return "smddp has no CUDA all-to-all with split sizes yet";
    if (in->local_size > in->cuda_max_local) return "more local ranks than smddp's CUDA kernels combine";
    return NULL;
}

smddp__choice_t smddp__select(const smddp__select_in_t *in)
{
    smddp__choice_t c = {SMDDP_PATH_SHM, NULL, NULL};
    if (in->mem != SMDDP_MEM_CUDA || in->kind == SMDDP_OP_BARRIER) {
        c.path = in->node_count < 2 ? SMDDP_PATH_SHM : SMDDP_PATH_NET;
        c.algo = host_algo(in, c.path);
        return c;
    }
    if (staged(in)) {
        c.path = SMDDP_PATH_CUDA_STAGED;
        return c;
    }
    const smddp__algo_t *ipc = smddp__algo_find(in->kind, SMDDP_PATH_CUDA_IPC, NULL);
    c.why = to_nccl(in, ipc);
    c.path = c.why ? SMDDP_PATH_NCCL : SMDDP_PATH_CUDA_IPC;
    c.algo = c.why ? &through_nccl : ipc;
    return c;
}

/* ---- SMDDP_ALGO ------------------------------------------------------------------ */

static int kind_of(const char *s, size_t len)
{
    for (int k = 0; k < SMDDP_OP_KIND_COUNT; k++) {
        const char *name = smddp__op_kind_name((smddp__op_kind_t)k);
        if (strlen(name) == len && !strncasecmp(name, s, len)) return k;
    }
    return -1;
}

/* "123", "4k", "2M", "1G" (powers of 1024) or "inf"; -1 if malformed. */
static int parse_bytes(const char *s, size_t len, uint64_t *out)
{
    char buf[32];
    if (len == 0 || len >= sizeof(buf)) return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    if (!strcasecmp(buf, "inf")) {
        *out = SMDDP_NO_CAP;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno || end == buf || buf[0] == '-') return -1;
    uint64_t mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    default: break;
    }
    if (*end != '\0' || v > UINT64_MAX / mul) return -1;
    *out = v * mul;
    return 0;
}

/* The names the registry has for kind, "a|b|c", into buf. */
static void names_of(int kind, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_REGISTRY && at < cap; i++)
        if ((int)registry[i]->kind == kind)
            at += (size_t)snprintf(buf + at, cap - at, "%s%s", at ? "|" : "", registry[i]->name);
}

static smddp_status_t bad_rule(const char *rule, size_t len, const char *what)
{
    return smddp__error(SMDDP_ERR_INVALID_ARGUMENT,
                        "SMDDP_ALGO: rule \"%.*s\": %s; a rule is kind:lo-hi:algorithm or "
                        "kind:algorithm, rules joined by '#' (sizes in bytes with k/M/G, both "
                        "bounds included, inf for no bound; smddp_info lists the algorithms)",
                        (int)len, rule, what);
}

smddp_status_t smddp__select_parse(const char *spec, smddp__select_row_t *rows, int cap, int *n)
{
    *n = 0;
    for (const char *p = spec; p && *p;) {
        const char *end = strchr(p, '#');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *c1 = memchr(p, ':', len);
        if (len == 0) {
            p = end ? end + 1 : NULL;
            continue;
        }
        if (!c1) return bad_rule(p, len, "no ':'");
        int kind = kind_of(p, (size_t)(c1 - p));
        if (kind < 0)
            return bad_rule(p, len, "unknown kind (allreduce, reduce, broadcast, allgather, "
                                    "reduce_scatter, alltoall, alltoallv, gather, scatter, "
                                    "barrier)");
        const char *rest = c1 + 1, *stop = p + len;
        const char *c2 = memchr(rest, ':', (size_t)(stop - rest));
        uint64_t lo = 0, hi = SMDDP_NO_CAP;
        const char *name = rest;
        if (c2) {
            const char *dash = memchr(rest, '-', (size_t)(c2 - rest));
            if (!dash || parse_bytes(rest, (size_t)(dash - rest), &lo) ||
                parse_bytes(dash + 1, (size_t)(c2 - dash - 1), &hi) || lo > hi)
                return bad_rule(p, len, "the size range is not lo-hi with lo <= hi");
            name = c2 + 1;
        }
        const smddp__algo_t *a = find_any_path((smddp__op_kind_t)kind, name, (size_t)(stop - name));
        if (!a) {
            char names[512], what[600];
            names_of(kind, names, sizeof(names));
            snprintf(what, sizeof(what), "%s has no algorithm \"%.*s\" in this build (accepted: %s)",
                     smddp__op_kind_name((smddp__op_kind_t)kind), (int)(stop - name), name,
                     names[0] ? names : "none");
            return bad_rule(p, len, what);
        }
        if (*n == cap) return bad_rule(p, len, "too many rules");
        rows[(*n)++] = (smddp__select_row_t){
            .kind = a->kind, .path = a->path, .local_min = 1, .local_max = 0, .nodes_min = 1,
            .nodes_max = 0, .lo = AT(lo), .hi = AT(hi),
            .algo = a};
        p = end ? end + 1 : NULL;
    }
    return SMDDP_OK;
}

/* ---- printing ---------------------------------------------------------------------- */

void smddp__select_default_limits(int local_ranks, int nodes, uint64_t lim[SMDDP_LIM_COUNT])
{
    const smddp__params_t *params = smddp__params();
    int L = SMDDP_MAX(local_ranks, 1), size = L * SMDDP_MAX(nodes, 1);
    uint64_t half = smddp__shm_default_half(), ll = smddp__shm_default_ll_max();
    memset(lim, 0, sizeof(uint64_t) * SMDDP_LIM_COUNT);
    lim[SMDDP_LIM_LL] = ll;
    lim[SMDDP_LIM_HALF] = half;
    lim[SMDDP_LIM_ONESHOT] = SMDDP_MIN((2 * (uint64_t)params->oneshot_max + 1) / (uint64_t)L, half);
    lim[SMDDP_LIM_AR_LL] = SMDDP_MIN(ll, lim[SMDDP_LIM_ONESHOT]);
    bool cma = L > 1 && params->shm_cma != SMDDP_CMA_OFF && params->shm_cma_min <= params->shm_cma_max;
    lim[SMDDP_LIM_CMA_MIN] = cma ? (uint64_t)params->shm_cma_min : SMDDP_NO_CAP;
    lim[SMDDP_LIM_CMA_MAX] = cma ? (uint64_t)params->shm_cma_max : 0;
    lim[SMDDP_LIM_LEADER] = (uint64_t)params->net_leader_max;
    lim[SMDDP_LIM_RS_ONE_PER_NODE] = ((4u << 20) + (uint64_t)size - 1) / (uint64_t)size;
}

static void put_bytes(char *buf, size_t cap, uint64_t v)
{
    if (v == SMDDP_NO_CAP) snprintf(buf, cap, "inf");
    else if (v && v % (1u << 30) == 0) snprintf(buf, cap, "%lluG", (unsigned long long)(v >> 30));
    else if (v && v % (1u << 20) == 0) snprintf(buf, cap, "%lluM", (unsigned long long)(v >> 20));
    else if (v && v % (1u << 10) == 0) snprintf(buf, cap, "%lluk", (unsigned long long)(v >> 10));
    else snprintf(buf, cap, "%llu", (unsigned long long)v);
}

static void put_facts(char *buf, size_t cap, uint32_t need, uint32_t unless)
{
    snprintf(buf, cap, "%s%s%s%s%s",
             need & SMDDP_FACT_NODE_RANKS ? "same ranks on every node" : "",
             need & SMDDP_FACT_LL_SLOTS ? "low-latency slots" : "",
             need & SMDDP_FACT_POOLED_IN_PLACE ? "this size last ran in place in pools" : "",
             need & SMDDP_FACT_POOLED_INPUTS ? "this size's inputs last lay in pools" : "",
             unless & SMDDP_FACT_POOLED_ANY ? "unless this size last ran in pools" : "");
}

static void print_rows(FILE *out, const char *source, const smddp__select_row_t *rows, int n,
                       int L, int N, const uint64_t *lim, bool flat_only)
{
    for (int i = 0; i < n; i++) {
        const smddp__select_row_t *r = &rows[i];
        if (!in_range(L, r->local_min, r->local_max) || !in_range(N, r->nodes_min, r->nodes_max))
            continue;
        if (r->path != (N > 1 ? SMDDP_PATH_NET : SMDDP_PATH_SHM)) continue;
        uint64_t lo = bound(&r->lo, lim), hi = bound(&r->hi, lim);
        if (lo > hi) continue; /* empty here */
        char los[24], his[24], facts[160];
        put_bytes(los, sizeof(los), lo);
        put_bytes(his, sizeof(his), hi);
        put_facts(facts, sizeof(facts), r->need, r->unless);
        if (flat_only && r->algo->hier) continue;
        fprintf(out, "  %-15s %-5s %6s-%-6s %-14s %-10s %s\n", smddp__op_kind_name(r->kind),
                smddp__path_name(r->path), los, his, r->algo->name, source, facts);
    }
}

void smddp__select_print(FILE *out, int local_ranks, int nodes)
{
    const smddp__params_t *params = smddp__params();
    int L = SMDDP_MAX(local_ranks, 1), N = SMDDP_MAX(nodes, 1);
    uint64_t lim[SMDDP_LIM_COUNT];
    smddp__select_default_limits(L, N, lim);
    fprintf(out, "selection for %d rank(s) per node on %d node(s), host memory (first match wins; "
                 "sizes in bytes, both bounds included):\n",
            L, N);
    fprintf(out, "  %-15s %-5s %-13s %-14s %-10s %s\n", "kind", "path", "sizes", "algorithm",
            "from", "when");
    smddp__select_row_t rules[64];
    int n = 0;
    if (smddp__select_parse(params->algo_rules, rules, 64, &n) < 0) {
        fprintf(out, "  (SMDDP_ALGO ignored here: %s)\n", smddp__last_error());
        n = 0;
    }
    bool flat_only = N > 1 && params->net_algo == SMDDP_NET_FLAT;
    print_rows(out, "SMDDP_ALGO", rules, n, L, N, lim, flat_only);
    if (N == 1 && params->algo == SMDDP_ALLREDUCE_ONESHOT)
        print_rows(out, "ALLREDUCE_ALGO", rules_oneshot, N_OF(rules_oneshot), L, N, lim, false);
    if (N == 1 && params->algo == SMDDP_ALLREDUCE_TWOSHOT)
        print_rows(out, "ALLREDUCE_ALGO", rules_twoshot, N_OF(rules_twoshot), L, N, lim, false);
    if (N > 1 && params->net_algo == SMDDP_NET_HIER)
        print_rows(out, "NET_ALGO", rules_hier, N_OF(rules_hier), L, N, lim, false);
    print_rows(out, "table", table, N_OF(table), L, N, lim, flat_only);
    fprintf(out, "  (fp16 and bf16 across nodes travel as fp32: SMDDP_NET_LEADER_MAX counts them "
                 "at 4 bytes)\n");
    fprintf(out, "CUDA memory: %s\n",
            N > 1 ? "NCCL where it loads on every rank (SMDDP_CUDA_NET=auto), else staged "
                    "through host memory by the rows above"
                  : "CUDA IPC (cuda-ipc) for every kind but alltoallv, which goes to NCCL");
    fprintf(out, "algorithms:\n");
    for (size_t i = 0; i < N_REGISTRY; i++)
        fprintf(out, "  %-15s %-9s %-14s %s\n", smddp__op_kind_name(registry[i]->kind),
                smddp__path_name(registry[i]->path), registry[i]->name, registry[i]->about);
}
