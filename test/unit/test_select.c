/*
 * The selection (core/select.c) and the agreement cache (core/verdicts.c):
 *  - the registry: names unique per kind, every table row names an entry;
 *  - the choice, pinned for a grid of kinds, sizes, ranks per node and
 *    nodes, with this build's default settings;
 *  - the settings that change it (SMDDP_ALGO, SMDDP_ALLREDUCE_ALGO,
 *    SMDDP_NET_ALGO), and SMDDP_ALGO's errors;
 *  - over a wide grid, no algorithm is chosen that cannot run;
 *  - the cache on its own;
 *  - on 2 ranks, each op's recorded algorithm is the one the table names,
 *    SMDDP_ALGO changes it, and a bad SMDDP_ALGO fails creation, naming the
 *    accepted algorithms.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm.h"
#include "exec.h"
#include "harness.h"
#include "param.h"
#include "select.h"
#include "verdicts.h"

static void defaults(void)
{
    static const char *const vars[] = {"SMDDP_ALGO", "SMDDP_ALLREDUCE_ALGO", "SMDDP_NET_ALGO",
                                       "SMDDP_SHM_LL_MAX", "SMDDP_ALLREDUCE_ONESHOT_MAX",
                                       "SMDDP_NET_LEADER_MAX", "SMDDP_SHM_BUFFER_SIZE",
                                       "SMDDP_SHM_CMA", "SMDDP_CUDA_NET",
                                       "SMDDP_COMMUNICATION_BACKEND"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) unsetenv(vars[i]);
    smddp__params_reload();
}

/* An op's input as a communicator of L ranks per node on N nodes would give it. */
static smddp__select_in_t input(smddp__op_kind_t kind, uint64_t bytes, int L, int N, uint32_t facts)
{
    smddp__select_in_t in;
    memset(&in, 0, sizeof(in));
    in.kind = kind;
    in.mem = SMDDP_MEM_HOST;
    in.bytes = bytes;
    in.local_size = L;
    in.node_count = N;
    in.size = L * N;
    in.facts = facts;
    smddp__select_default_limits(L, N, in.lim);
    if (in.lim[SMDDP_LIM_LL]) in.facts |= SMDDP_FACT_LL_SLOTS;
    in.net_algo = smddp__params()->net_algo;
    in.allreduce_algo = smddp__params()->algo;
    return in;
}

static const char *chosen(const smddp__select_in_t *in)
{
    smddp__choice_t c = smddp__select(in);
    return c.algo ? c.algo->name : "(none)";
}

#define PIN(kind, bytes, L, N, facts, want)                                                        \
    do {                                                                                           \
        smddp__select_in_t in_ = input(SMDDP_OP_##kind, (bytes), (L), (N), (facts));               \
        const char *got_ = chosen(&in_);                                                           \
        if (strcmp(got_, (want)) != 0)                                                             \
            fail_msg("%s of %llu bytes, %d per node on %d node(s): %s, expected %s", #kind,        \
                     (unsigned long long)(bytes), (L), (N), got_, (want));                         \
    } while (0)

static void test_registry(void **state)
{
    (void)state;
    size_t n;
    const smddp__algo_t *const *all = smddp__algos(&n);
    assert_true(n >= 30);
    for (size_t i = 0; i < n; i++) {
        assert_non_null(all[i]->run);
        assert_non_null(all[i]->about);
        for (size_t j = i + 1; j < n; j++)
            if (all[i]->kind == all[j]->kind && !strcmp(all[i]->name, all[j]->name))
                fail_msg("%s has two algorithms named %s", smddp__op_kind_name(all[i]->kind),
                         all[i]->name);
    }
    int rows;
    const smddp__select_row_t *t = smddp__select_table(&rows);
    for (int r = 0; r < rows; r++)
        if (!t[r].algo || t[r].algo->kind != t[r].kind || t[r].algo->path != t[r].path)
            fail_msg("row %d (%s on %s) names %s, an entry of another kind or path", r,
                     smddp__op_kind_name(t[r].kind), smddp__path_name(t[r].path),
                     t[r].algo ? t[r].algo->name : "nothing");
    /* Every host kind has an algorithm on one node and across nodes. */
    for (int k = 0; k < SMDDP_OP_KIND_COUNT; k++) {
        if (smddp__op_traits((smddp__op_kind_t)k)->p2p) continue;
        assert_non_null(smddp__algo_find((smddp__op_kind_t)k, SMDDP_PATH_SHM, NULL));
        assert_non_null(smddp__algo_find((smddp__op_kind_t)k, SMDDP_PATH_NET, NULL));
    }
}

static void test_one_node(void **state)
{
    (void)state;
    defaults();
    /* 2 ranks: slots up to 8 KiB, one-shot up to 128 KiB, then two-shot. */
    PIN(ALLREDUCE, 8, 2, 1, 0, "low-latency");
    PIN(ALLREDUCE, 8192, 2, 1, 0, "low-latency");
    PIN(ALLREDUCE, 8193, 2, 1, 0, "one-shot");
    PIN(ALLREDUCE, 128 << 10, 2, 1, 0, "one-shot");
    PIN(ALLREDUCE, (128 << 10) + 1, 2, 1, 0, "two-shot");
    PIN(ALLREDUCE, 64 << 20, 2, 1, 0, "two-shot");
    /* 8 ranks: one-shot's range shrinks to 32 KiB. */
    PIN(ALLREDUCE, 32 << 10, 8, 1, 0, "one-shot");
    PIN(ALLREDUCE, (32 << 10) + 1, 8, 1, 0, "two-shot");
    /* The pooled verdicts: in place in pools, two-shot above 1 KiB; inputs pooled, one-shot. */
    PIN(ALLREDUCE, 1024, 2, 1, SMDDP_FACT_POOLED_IN_PLACE, "low-latency");
    PIN(ALLREDUCE, 2048, 2, 1, SMDDP_FACT_POOLED_IN_PLACE, "two-shot");
    PIN(ALLREDUCE, 64 << 10, 2, 1, SMDDP_FACT_POOLED_IN_PLACE, "two-shot");
    PIN(ALLREDUCE, 2048, 2, 1, SMDDP_FACT_POOLED_INPUTS, "one-shot");
    /* Reduce: slots up to 1 KiB, one-shot within a staging half, then two-shot. */
    PIN(REDUCE, 8, 2, 1, 0, "low-latency");
    PIN(REDUCE, 1024, 2, 1, 0, "low-latency");
    PIN(REDUCE, 1025, 2, 1, 0, "one-shot");
    PIN(REDUCE, 1 << 20, 4, 1, 0, "one-shot");
    PIN(REDUCE, 64 << 20, 2, 1, 0, "two-shot");
    PIN(REDUCE_SCATTER, 8, 4, 1, 0, "two-shot");
    /* Broadcast: slots up to 1 KiB. Allgather: cross-memory attach's range stages. */
    PIN(BROADCAST, 1024, 2, 1, 0, "low-latency");
    PIN(BROADCAST, 1025, 2, 1, 0, "staged");
    PIN(ALLGATHER, 4096, 2, 1, 0, "low-latency");
    PIN(ALLGATHER, 8192, 2, 1, 0, "staged");
    PIN(ALLGATHER, 1 << 20, 2, 1, 0, "staged");
    PIN(BARRIER, 0, 2, 1, 0, "low-latency");
    PIN(ALLTOALL, 8, 2, 1, 0, "staged");
    PIN(ALLTOALLV, 8, 2, 1, 0, "staged");
    PIN(GATHER, 8, 2, 1, 0, "staged");
    PIN(SCATTER, 8, 2, 1, 0, "staged");
    setenv("SMDDP_SHM_CMA", "off", 1);
    setenv("SMDDP_SHM_LL_MAX", "0", 1);
    smddp__params_reload();
    PIN(ALLGATHER, 8192, 2, 1, 0, "staged");
    PIN(ALLREDUCE, 8, 2, 1, 0, "one-shot");
    PIN(REDUCE, 8, 2, 1, 0, "one-shot");
    PIN(BARRIER, 0, 2, 1, 0, "counters");
    setenv("SMDDP_SHM_LL_MAX", "16384", 1);
    smddp__params_reload();
    PIN(ALLGATHER, 8192, 2, 1, 0, "low-latency");
    defaults();
}

static void test_nodes(void **state)
{
    (void)state;
    defaults();
    const uint32_t same = SMDDP_FACT_NODE_RANKS;
    /* Several ranks per node: hierarchical, one leader per node up to 64 KiB. */
    PIN(ALLREDUCE, 64 << 10, 2, 2, same, "hier-leader");
    PIN(ALLREDUCE, (64 << 10) + 1, 2, 2, same, "hierarchical");
    PIN(REDUCE, 8, 4, 8, same, "hier-leader");
    PIN(ALLGATHER, 8, 2, 2, same, "hierarchical");
    PIN(BROADCAST, 8, 2, 4, same, "hierarchical");
    PIN(BARRIER, 0, 2, 2, same, "hierarchical");
    PIN(REDUCE_SCATTER, 8, 2, 2, same, "hierarchical");
    /* Nodes of different sizes: flat. */
    PIN(ALLREDUCE, 1 << 20, 2, 2, 0, "ring");
    PIN(ALLGATHER, 1 << 20, 2, 2, 0, "ring");
    PIN(BROADCAST, 8, 2, 2, 0, "chain");
    PIN(BARRIER, 0, 2, 2, 0, "ring");
    /* No hierarchical all-to-all, gather or scatter. */
    PIN(ALLTOALL, 8, 2, 2, same, "pairwise");
    PIN(ALLTOALLV, 8, 2, 2, same, "pairwise");
    PIN(GATHER, 8, 2, 2, same, "direct");
    PIN(SCATTER, 8, 2, 2, same, "direct");
    /* One rank per node on two nodes: hierarchical from 16 MiB (reduce-scatter: 4 MiB in). */
    PIN(ALLREDUCE, (16 << 20) - 1, 1, 2, same, "ring");
    PIN(ALLREDUCE, 16 << 20, 1, 2, same, "hierarchical");
    PIN(REDUCE, 16 << 20, 1, 2, same, "hierarchical");
    PIN(REDUCE_SCATTER, (2 << 20) - 1, 1, 2, same, "ring");
    PIN(REDUCE_SCATTER, 2 << 20, 1, 2, same, "hierarchical");
    PIN(ALLGATHER, 64 << 20, 1, 2, same, "ring");
    /* ... and on more nodes, the ring. */
    PIN(ALLREDUCE, 64 << 20, 1, 4, same, "ring");
    PIN(BARRIER, 0, 1, 4, same, "ring");
}

static void test_settings(void **state)
{
    (void)state;
    defaults();
    const uint32_t same = SMDDP_FACT_NODE_RANKS;
    setenv("SMDDP_ALLREDUCE_ALGO", "twoshot", 1);
    smddp__params_reload();
    PIN(ALLREDUCE, 8, 2, 1, 0, "two-shot");
    setenv("SMDDP_ALLREDUCE_ALGO", "oneshot", 1);
    smddp__params_reload();
    PIN(ALLREDUCE, 8, 2, 1, 0, "one-shot");
    PIN(ALLREDUCE, 1 << 20, 2, 1, 0, "one-shot");       /* within a 2 MiB half */
    PIN(ALLREDUCE, (2 << 20) + 1, 2, 1, 0, "two-shot"); /* above it */
    defaults();
    setenv("SMDDP_NET_ALGO", "flat", 1);
    smddp__params_reload();
    PIN(ALLREDUCE, 8, 2, 2, same, "ring");
    PIN(BARRIER, 0, 2, 2, same, "ring");
    setenv("SMDDP_NET_ALGO", "hier", 1);
    smddp__params_reload();
    PIN(ALLREDUCE, 1 << 20, 1, 4, same, "hierarchical");
    PIN(ALLREDUCE, 8, 1, 4, same, "hier-leader");
    PIN(ALLGATHER, 8, 1, 2, same, "hierarchical");
    PIN(ALLREDUCE, 8, 2, 2, 0, "ring"); /* hierarchical cannot run: nodes differ */
    defaults();
}

/* Parses spec into in's rules (kept in a static array). */
static void use_rules(smddp__select_in_t *in, const char *spec)
{
    static smddp__select_row_t rows[16];
    int n = -1;
    assert_int_equal(smddp__select_parse(spec, rows, 16, &n), SMDDP_OK);
    in->rules = rows;
    in->n_rules = n;
}

static void bad_rules(const char *spec, const char *says)
{
    smddp__select_row_t rows[4];
    int n;
    assert_int_equal(smddp__select_parse(spec, rows, 4, &n), SMDDP_ERR_INVALID_ARGUMENT);
    if (!strstr(smddp__last_error(), says))
        fail_msg("SMDDP_ALGO=%s: \"%s\" does not say \"%s\"", spec, smddp__last_error(), says);
}

static void test_rules(void **state)
{
    (void)state;
    defaults();
    smddp__select_in_t in = input(SMDDP_OP_ALLREDUCE, 8, 2, 1, 0);
    use_rules(&in, "allreduce:0-64k:two-shot#allgather:staged");
    assert_string_equal(chosen(&in), "two-shot");
    in.bytes = 64 << 10; /* bounds included */
    assert_string_equal(chosen(&in), "two-shot");
    in.bytes = (64 << 10) + 1; /* above: the table's one-shot */
    assert_string_equal(chosen(&in), "one-shot");
    in.kind = SMDDP_OP_ALLGATHER;
    in.bytes = 8;
    assert_string_equal(chosen(&in), "staged");
    /* A rule whose algorithm cannot run the op is passed over. */
    in = input(SMDDP_OP_ALLREDUCE, 16 << 10, 2, 1, 0);
    use_rules(&in, "allreduce:0-inf:low-latency");
    assert_string_equal(chosen(&in), "one-shot");
    in.bytes = 16;
    assert_string_equal(chosen(&in), "low-latency");
    in = input(SMDDP_OP_ALLREDUCE, 8, 2, 2, 0);
    use_rules(&in, "allreduce:hierarchical");
    assert_string_equal(chosen(&in), "ring"); /* nodes of different sizes */
    in.facts = SMDDP_FACT_NODE_RANKS;
    assert_string_equal(chosen(&in), "hierarchical");
    /* A rule for the other path does not apply here. */
    in = input(SMDDP_OP_ALLREDUCE, 8, 2, 1, 0);
    use_rules(&in, "allreduce:ring#ALLREDUCE:1k-2k:one-shot");
    assert_string_equal(chosen(&in), "low-latency");
    in.bytes = 1500;
    assert_string_equal(chosen(&in), "one-shot");

    bad_rules("allreduce:0-4k:nonesuch", "accepted: low-latency|one-shot|two-shot|ring|");
    bad_rules("allreduce:4k-1k:two-shot", "lo <= hi");
    bad_rules("allredux:two-shot", "unknown kind");
    bad_rules("allreduce", "no ':'");
    bad_rules("allreduce:4q-8k:two-shot", "size range");
    bad_rules("a:x#b:y#c:z#d:w#e:v", "unknown kind");
}

/* Over a wide grid, every choice is of the op's kind and path and can run it. */
static void test_never_unrunnable(void **state)
{
    (void)state;
    defaults();
    const uint64_t sizes[] = {0, 1, 8, 1000, 1024, 1025, 4096, 8191, 8192, 8193, 65536,
                              131073, 1 << 20, 16 << 20, 1ull << 32};
    const int layouts[][2] = {{1, 1}, {2, 1}, {3, 1}, {8, 1}, {128, 1}, {1, 2}, {2, 2},
                              {4, 3}, {1, 8}, {16, 64}};
    const char *const specs[] = {"", "allreduce:low-latency#allgather:low-latency#barrier:low-latency",
                                 "allreduce:one-shot#broadcast:low-latency",
                                 "allreduce:hier-leader#reduce:hierarchical#barrier:hierarchical"};
    int checked = 0;
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(specs[0]); sp++)
        for (int k = 0; k < SMDDP_OP_KIND_COUNT; k++) {
            if (smddp__op_traits((smddp__op_kind_t)k)->p2p) continue;
            for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
                for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); l++)
                    for (uint32_t facts = 0; facts < 16; facts++) {
                        smddp__select_in_t in = input((smddp__op_kind_t)k, sizes[s], layouts[l][0],
                                                      layouts[l][1], facts);
                        if (!(facts & SMDDP_FACT_LL_SLOTS)) {
                            in.facts &= ~SMDDP_FACT_LL_SLOTS;
                            in.lim[SMDDP_LIM_LL] = in.lim[SMDDP_LIM_AR_LL] = 0;
                        }
                        use_rules(&in, specs[sp]);
                        smddp__choice_t c = smddp__select(&in);
                        assert_non_null(c.algo);
                        assert_int_equal(c.algo->kind, k);
                        assert_int_equal(c.path, layouts[l][1] > 1 ? SMDDP_PATH_NET : SMDDP_PATH_SHM);
                        assert_int_equal(c.algo->path, c.path);
                        if (c.algo->can_run && !c.algo->can_run(&in))
                            fail_msg("%s of %llu bytes: %s chosen but cannot run",
                                     smddp__op_kind_name((smddp__op_kind_t)k),
                                     (unsigned long long)sizes[s], c.algo->name);
                        checked++;
                    }
        }
    assert_true(checked > 10000);
}

static void test_cuda_route(void **state)
{
    (void)state;
    defaults();
    smddp__select_in_t in = input(SMDDP_OP_ALLTOALLV, 16, 4, 1, 0);
    in.mem = SMDDP_MEM_CUDA;
    in.cuda_max_local = 16;
    smddp__choice_t c = smddp__select(&in);
    assert_int_equal(c.path, SMDDP_PATH_NCCL);
    assert_non_null(c.why);
    /* A barrier never moves device memory. */
    in.kind = SMDDP_OP_BARRIER;
    assert_int_equal(smddp__select(&in).path, SMDDP_PATH_SHM);
    /* Across nodes: staged where NCCL does not load, NCCL where it does. */
    in = input(SMDDP_OP_ALLREDUCE, 16, 2, 2, SMDDP_FACT_NODE_RANKS);
    in.mem = SMDDP_MEM_CUDA;
    in.nccl_has_op = true;
    assert_int_equal(smddp__select(&in).path, SMDDP_PATH_CUDA_STAGED);
    in.nccl_loads = true;
    assert_int_equal(smddp__select(&in).path, SMDDP_PATH_NCCL);
    in.cuda_net = SMDDP_CUDA_NET_STAGED;
    assert_int_equal(smddp__select(&in).path, SMDDP_PATH_CUDA_STAGED);
}

static void test_router_input(void **state)
{
    (void)state;
    defaults();
    struct smddp_comm *two = harness_topology(2, 2);
    smddp__op_t op = {.kind = SMDDP_OP_ALLREDUCE, .count = 10000, .dtype = SMDDP_FLOAT32,
                      .mem_type = SMDDP_MEM_HOST, .root = -1};
    /* 40 KB of float32: one leader per node. */
    assert_string_equal(smddp__choose(two, &op).algo->name, "hier-leader");
    /* 40 KB of fp16 travels as 80 KB of fp32: every local rank. */
    op.dtype = SMDDP_FLOAT16;
    op.count = 20000;
    assert_string_equal(smddp__choose(two, &op).algo->name, "hierarchical");
    op.count = 16000; /* 64,000 bytes as fp32 */
    assert_string_equal(smddp__choose(two, &op).algo->name, "hier-leader");
    free(two);
}

static void test_verdicts(void **state)
{
    (void)state;
    smddp__verdicts_t v;
    smddp__verdicts_init(&v);
    assert_int_equal(v.nccl_everywhere, -1);
    assert_int_equal(smddp__verdict_pooled(&v, 4096), SMDDP_POOLED_NONE);
    smddp__verdict_set_pooled(&v, 4096, SMDDP_POOLED_IN_PLACE);
    smddp__verdict_set_pooled(&v, 2048, SMDDP_POOLED_INPUTS);
    assert_int_equal(smddp__verdict_pooled(&v, 4096), SMDDP_POOLED_IN_PLACE);
    assert_int_equal(smddp__verdict_pooled(&v, 2048), SMDDP_POOLED_INPUTS);
    assert_int_equal(smddp__verdict_pooled(&v, 0), SMDDP_POOLED_NONE);
    /* Updating a size keeps its slot; forgetting one frees it. */
    smddp__verdict_set_pooled(&v, 4096, SMDDP_POOLED_INPUTS);
    assert_int_equal(smddp__verdict_pooled(&v, 4096), SMDDP_POOLED_INPUTS);
    smddp__verdict_set_pooled(&v, 4096, SMDDP_POOLED_NONE);
    assert_int_equal(smddp__verdict_pooled(&v, 4096), SMDDP_POOLED_NONE);
    assert_int_equal(smddp__verdict_pooled(&v, 2048), SMDDP_POOLED_INPUTS);
    /* Full: the oldest size goes. */
    for (size_t b = 1; b <= SMDDP_VERDICT_SIZES; b++)
        smddp__verdict_set_pooled(&v, b * 100000, SMDDP_POOLED_IN_PLACE);
    assert_int_equal(smddp__verdict_pooled(&v, 2048), SMDDP_POOLED_NONE);
    for (size_t b = 1; b <= SMDDP_VERDICT_SIZES; b++)
        assert_int_equal(smddp__verdict_pooled(&v, b * 100000), SMDDP_POOLED_IN_PLACE);
}

/* ---- on 2 ranks ---------------------------------------------------------------------- */

static void allreduce_bytes(smddp_comm_t comm, size_t bytes)
{
    size_t n = bytes / sizeof(float);
    float *x = malloc(n * sizeof(float));
    H_CHECK(x != NULL, "out of memory");
    for (size_t i = 0; i < n; i++) x[i] = 1.0f;
    H_OK(smddp_allreduce(comm, x, x, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    H_CHECK(x[0] == 2.0f && x[n - 1] == 2.0f, "allreduce of %zu bytes: %g", bytes, (double)x[0]);
    free(x);
}

typedef struct ranks_case {
    const char *algo_env; /* SMDDP_ALGO, or NULL */
} ranks_case_t;

static void recorded_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    const ranks_case_t *c = arg;
    (void)rank;
    (void)size;
    if (c->algo_env) setenv("SMDDP_ALGO", c->algo_env, 1);
    else unsetenv("SMDDP_ALGO");
    setenv("SMDDP_SHM_POOL_SIZE", "0", 1);
    smddp__params_reload();
    comm = harness_comm(rank, size, "select");
    allreduce_bytes(comm, 64);
    allreduce_bytes(comm, 32 << 10);
    allreduce_bytes(comm, 1 << 20);
    H_OK(smddp_barrier(comm, NULL, NULL));
    int ll = harness_trace_count(comm, "\"low-latency\"");
    int one = harness_trace_count(comm, "\"one-shot\"");
    int two = harness_trace_count(comm, "\"two-shot\"");
    if (!c->algo_env)
        H_CHECK(ll == 2 && one == 1 && two == 1, "recorded low-latency %d, one-shot %d, two-shot %d",
                ll, one, two);
    else
        H_CHECK(ll == 1 && one == 0 && two == 3, "with SMDDP_ALGO=%s: low-latency %d, one-shot "
                "%d, two-shot %d", c->algo_env, ll, one, two);
    H_OK(smddp_comm_destroy(comm));
}

static void test_recorded(void **state)
{
    (void)state;
    ranks_case_t plain = {NULL}, forced = {"allreduce:0-inf:two-shot"};
    harness_opts_t opts = {.env = "SMDDP_TIMEOUT=60", .timeout_s = 120, .no_comm = 1};
    assert_int_equal(harness_run(2, recorded_rank, &plain, &opts), 0);
    assert_int_equal(harness_run(2, recorded_rank, &forced, &opts), 0);
}

static void bad_env_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    setenv("SMDDP_ALGO", "allreduce:0-4k:fastest", 1);
    smddp__params_reload();
    smddp_status_t st = harness_try_comm(rank, size, "select-bad", 20000, &comm);
    H_CHECK(st == SMDDP_ERR_INVALID_ARGUMENT, "creation with a bad SMDDP_ALGO returned %d", st);
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(strstr(msg, "\"fastest\"") && strstr(msg, "accepted: low-latency|one-shot|two-shot"),
            "message: %s", msg);
}

static void test_bad_env(void **state)
{
    (void)state;
    harness_opts_t opts = {.env = "SMDDP_TIMEOUT=30", .timeout_s = 60, .no_comm = 1};
    assert_int_equal(harness_run(2, bad_env_rank, NULL, &opts), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),       cmocka_unit_test(test_one_node),
        cmocka_unit_test(test_nodes),          cmocka_unit_test(test_settings),
        cmocka_unit_test(test_rules),          cmocka_unit_test(test_never_unrunnable),
        cmocka_unit_test(test_cuda_route),     cmocka_unit_test(test_router_input),
        cmocka_unit_test(test_verdicts),       cmocka_unit_test(test_recorded),
        cmocka_unit_test(test_bad_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
