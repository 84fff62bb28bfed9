/*
 * The public surface: version, status/dtype/op names, the symbols the shared
 * library exports (only smddp_* and the interposed NCCL calls, never an
 * internal smddp__*), and
 * smddp_comm_create_from_env under each launcher's environment (SMDDP_*,
 * torchrun, Open MPI, Slurm) and with none.
 *
 * The shared library's path comes from SMDDP_LIB_PATH (set by meson); it is
 * read and unset at startup, because the settings parser would otherwise
 * warn about an unknown SMDDP_ variable in every rank.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "param.h"

static char lib_path[PATH_MAX];

/* ---- version, names ----------------------------------------------------------- */

static void test_version(void **state)
{
    (void)state;
    assert_int_equal(smddp_get_version(), SMDDP_VERSION);
    assert_int_equal(SMDDP_VERSION,
                     SMDDP_VERSION_CODE(SMDDP_VERSION_MAJOR, SMDDP_VERSION_MINOR,
                                        SMDDP_VERSION_PATCH));
    assert_int_equal(SMDDP_VERSION_CODE(1, 2, 3), 10203);
}

static void test_status_strings(void **state)
{
    (void)state;
    const smddp_status_t all[] = {
        SMDDP_OK,           SMDDP_IN_PROGRESS,          SMDDP_ERR_INVALID_ARGUMENT,
        SMDDP_ERR_NO_MEMORY, SMDDP_ERR_SYSTEM,          SMDDP_ERR_TIMEOUT,
        SMDDP_ERR_PEER_LOST, SMDDP_ERR_ABORTED,         SMDDP_ERR_MISMATCH,
        SMDDP_ERR_NOT_SUPPORTED, SMDDP_ERR_STORE,       SMDDP_ERR_INTERNAL,
    };
    const size_t n = sizeof(all) / sizeof(all[0]);
    for (size_t i = 0; i < n; i++) {
        const char *s = smddp_status_string(all[i]);
        assert_non_null(s);
        assert_true(s[0] != '\0');
        assert_string_not_equal(s, "unknown status");
        for (size_t j = 0; j < i; j++) assert_string_not_equal(s, smddp_status_string(all[j]));
    }
    assert_string_equal(smddp_status_string(SMDDP_OK), "success");
    assert_string_equal(smddp_status_string(SMDDP_ERR_INVALID_ARGUMENT), "invalid argument");
    const int bogus[] = {2, 99, -11, -100, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof(bogus) / sizeof(bogus[0]); i++)
        assert_string_equal(smddp_status_string((smddp_status_t)bogus[i]), "unknown status");
    /* The status convention: zero success, positive pending, negative error. */
    assert_int_equal(SMDDP_OK, 0);
    assert_true(SMDDP_IN_PROGRESS > 0);
    for (size_t i = 2; i < n; i++) assert_true(all[i] < 0);
}

static void test_dtypes(void **state)
{
    (void)state;
    static const struct {
        smddp_dtype_t t;
        size_t size;
        const char *name;
    } want[] = {
        {SMDDP_INT8, 1, "int8"},         {SMDDP_UINT8, 1, "uint8"},
        {SMDDP_INT32, 4, "int32"},       {SMDDP_INT64, 8, "int64"},
        {SMDDP_FLOAT16, 2, "float16"},   {SMDDP_BFLOAT16, 2, "bfloat16"},
        {SMDDP_FLOAT32, 4, "float32"},   {SMDDP_FLOAT64, 8, "float64"},
        {SMDDP_INT16, 2, "int16"},       {SMDDP_UINT16, 2, "uint16"},
        {SMDDP_UINT32, 4, "uint32"},     {SMDDP_UINT64, 8, "uint64"},
    };
    assert_int_equal(sizeof(want) / sizeof(want[0]), SMDDP_DTYPE_COUNT);
    for (int i = 0; i < SMDDP_DTYPE_COUNT; i++) {
        assert_int_equal(smddp_dtype_size(want[i].t), want[i].size);
        assert_string_equal(smddp_dtype_name(want[i].t), want[i].name);
    }
    const int bogus[] = {SMDDP_DTYPE_COUNT, 42, -1, INT_MIN};
    for (size_t i = 0; i < sizeof(bogus) / sizeof(bogus[0]); i++) {
        assert_int_equal(smddp_dtype_size((smddp_dtype_t)bogus[i]), 0);
        assert_string_equal(smddp_dtype_name((smddp_dtype_t)bogus[i]), "unknown");
    }
}

static void test_ops(void **state)
{
    (void)state;
    static const char *const names[] = {"sum", "prod", "min",  "max", "avg",
                                        "premul_sum", "band", "bor", "bxor"};
    assert_int_equal(sizeof(names) / sizeof(names[0]), SMDDP_OP_COUNT);
    assert_int_equal(SMDDP_PREMUL_SUM, 5);
    for (int i = 0; i < SMDDP_OP_COUNT; i++)
        assert_string_equal(smddp_op_name((smddp_op_t)i), names[i]);
    assert_string_equal(smddp_op_name(SMDDP_OP_COUNT), "unknown");
    assert_string_equal(smddp_op_name((smddp_op_t)-1), "unknown");
}

static void test_last_error_basics(void **state)
{
    (void)state;
    /* Never NULL; a store callback's message becomes the thread's error. */
    assert_non_null(smddp_get_last_error(NULL));
    smddp_set_store_error("the store is on fire");
    assert_string_equal(smddp_get_last_error(NULL), "the store is on fire");
    smddp_set_store_error(NULL);
    assert_string_equal(smddp_get_last_error(NULL), "");
    /* The initialisers fill the versioning size. */
    smddp_comm_config_t cfg = SMDDP_COMM_CONFIG_INIT;
    assert_int_equal(cfg.size, sizeof(cfg));
    assert_null(cfg.prefix);
    assert_true(cfg.timeout_ms < 0);
    /* A 0 ms deadline would fail every wait at once: refused, saying what is accepted. */
    smddp_comm_t c = NULL;
    cfg.timeout_ms = 0;
    assert_int_equal(smddp_comm_create_from_env(&cfg, &c), SMDDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(smddp_get_last_error(NULL), "timeout_ms is 0; use > 0"));
    assert_null(c);
    cfg.timeout_ms = -1;
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    assert_int_equal(attr.size, sizeof(attr));
    assert_int_equal(attr.mem_type, SMDDP_MEM_HOST);
    assert_true(attr.premul_factor == 1.0);
    assert_int_equal(smddp_request_enqueued(NULL), 0);
}

/* ---- the shared library's exports ---------------------------------------------------- */

/* Every function smddp.h declares. */
static const char *const api[] = {
    "smddp_get_version",      "smddp_status_string",   "smddp_get_last_error",
    "smddp_set_store_error",  "smddp_comm_create",     "smddp_comm_create_from_env",
    "smddp_comm_split",       "smddp_comm_abort",      "smddp_comm_destroy",
    "smddp_comm_rank",        "smddp_comm_size",       "smddp_comm_local_rank",
    "smddp_comm_local_size",  "smddp_comm_node_count", "smddp_test",
    "smddp_wait",             "smddp_request_free",    "smddp_allreduce",
    "smddp_reduce",           "smddp_broadcast",       "smddp_allgather",
    "smddp_reduce_scatter",   "smddp_alltoall",        "smddp_alltoallv",
    "smddp_gather",           "smddp_scatter",         "smddp_barrier",
    "smddp_send",             "smddp_recv",            "smddp_dtype_size",
    "smddp_dtype_name",       "smddp_op_name",         "smddp_print_settings",
    "smddp_request_source",   "smddp_request_enqueued", "smddp_comm_dump_trace",
    "smddp_comm_status",      "smddp_print_selection",
};
#define NAPI (sizeof(api) / sizeof(api[0]))

/* The NCCL calls the interposer (core/cuda/interpose.c) defines, and nothing else of NCCL's. */
static const char *const interposed[] = {
    "ncclAllReduce", "ncclAllGather",   "ncclReduceScatter", "ncclGroupStart",
    "ncclGroupEnd",  "ncclCommDestroy", "ncclCommAbort",
};
#define NINTERPOSED (sizeof(interposed) / sizeof(interposed[0]))

static void test_exported_symbols(void **state)
{
    (void)state;
    if (!lib_path[0]) fail_msg("SMDDP_LIB_PATH is not set and libsmddp.so was not found");
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof(cmd), "nm -D --defined-only '%s' 2>&1", lib_path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1024];
    int found[NAPI] = {0}, nccl_found[NINTERPOSED] = {0}, nsyms = 0, versioned = 0;
    while (fgets(line, sizeof(line), p)) {
        char addr[64], type[8], name[512];
        if (sscanf(line, "%63s %7s %511s", addr, type, name) != 3) {
            fail_msg("unexpected nm output: %s", line);
        }
        /* "A SMDDP_0.1" is the version node, not a symbol. */
        if (strcmp(type, "A") == 0) continue;
        if (!strchr("TtDdBbRrWwVvGgSsiu", type[0])) fail_msg("unexpected symbol type: %s", line);
        char *at = strchr(name, '@');
        if (at) {
            if (strcmp(at, "@@SMDDP_0.1") == 0) versioned++;
            *at = '\0';
        }
        nsyms++;
        bool nccl = false;
        for (size_t i = 0; i < NINTERPOSED; i++)
            if (strcmp(name, interposed[i]) == 0) nccl_found[i]++, nccl = true;
        if (nccl) continue;
        if (strncmp(name, "smddp_", 6) != 0) fail_msg("non-API symbol exported: %s", line);
        if (strncmp(name, "smddp__", 7) == 0) fail_msg("internal symbol exported: %s", line);
        for (size_t i = 0; i < NAPI; i++)
            if (strcmp(name, api[i]) == 0) found[i]++;
    }
    int rc = pclose(p);
    assert_int_equal(rc, 0);
    for (size_t i = 0; i < NAPI; i++)
        if (found[i] != 1) fail_msg("%s is exported %d times", api[i], found[i]);
    for (size_t i = 0; i < NINTERPOSED; i++)
        if (nccl_found[i] != 1)
            fail_msg("interposed %s is exported %d times", interposed[i], nccl_found[i]);
    assert_int_equal(versioned, nsyms); /* every export carries the version tag */
    assert_true(nsyms >= (int)(NAPI + NINTERPOSED));
}

/* The shared library itself (the tests link a static copy): it loads and answers. */
static void test_shared_library_loads(void **state)
{
    (void)state;
    if (!lib_path[0]) fail_msg("SMDDP_LIB_PATH is not set");
    void *h = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (!h) fail_msg("dlopen(%s): %s", lib_path, dlerror());
    int (*version)(void) = (int (*)(void))dlsym(h, "smddp_get_version");
    assert_non_null(version);
    assert_int_equal(version(), SMDDP_VERSION);
    const char *(*status)(smddp_status_t) =
        (const char *(*)(smddp_status_t))dlsym(h, "smddp_status_string");
    assert_non_null(status);
    assert_string_equal(status(SMDDP_ERR_TIMEOUT), smddp_status_string(SMDDP_ERR_TIMEOUT));
    for (size_t i = 0; i < NAPI; i++)
        if (!dlsym(h, api[i])) fail_msg("dlsym(%s) failed", api[i]);
    assert_null(dlsym(h, "smddp__params_reload"));
    assert_null(dlsym(h, "smddp__error_at"));
    assert_null(dlsym(h, "smddp__reduce"));
    dlclose(h);
}

/* ---- smddp_comm_create_from_env ---------------------------------------------------------- */

typedef enum env_style {
    ENV_SMDDP,
    ENV_TORCHRUN,
    ENV_TORCHRUN_AGENT,
    ENV_OMPI,
    ENV_SLURM,
    ENV_JOB_ID,
    ENV_NOTHING,
    ENV_RANK_TOO_BIG,
    ENV_NO_ADDRESS,
    ENV_PORT_BUSY,
    ENV_NO_SERVER,
    ENV_RECREATE,
} env_style_t;

typedef struct env_case {
    env_style_t style;
    int port;
    char job[64]; /* job id for the derived-port styles */
    int rank0_last; /* ENV_RECREATE: rank 0 destroys its last communicator last */
} env_case_t;

/* Everything a launcher might have left in the test's own environment. */
static void clear_launcher_env(void)
{
    static const char *const vars[] = {
        "SMDDP_RANK", "SMDDP_WORLD_SIZE", "SMDDP_MASTER_ADDR", "SMDDP_MASTER_PORT",
        "SMDDP_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid",
        "PMIX_NAMESPACE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
        "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NNODES", NULL};
    for (int i = 0; vars[i]; i++) unsetenv(vars[i]);
}

static void setenv_int(const char *name, int v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%d", v);
    setenv(name, buf, 1);
}

#define H_HAS(msg, needle)                                                                 \
    H_CHECK(strstr((msg), (needle)) != NULL, "message \"%s\" does not contain \"%s\"", (msg), \
            (needle))

/* Creates a communicator from the environment and checks it with an allreduce. */
static void create_and_use(int rank, int size)
{
    smddp_comm_t comm = NULL;
    H_OK(smddp_comm_create_from_env(NULL, &comm));
    int r, s, lr, ls, nodes;
    H_OK(smddp_comm_rank(comm, &r));
    H_OK(smddp_comm_size(comm, &s));
    H_OK(smddp_comm_local_rank(comm, &lr));
    H_OK(smddp_comm_local_size(comm, &ls));
    H_OK(smddp_comm_node_count(comm, &nodes));
    H_CHECK(r == rank && s == size && lr == rank && ls == size && nodes == 1,
            "rank %d size %d local %d/%d nodes %d", r, s, lr, ls, nodes);
    int64_t in[3] = {rank, 10 * rank, 1}, out[3];
    H_OK(smddp_allreduce(comm, in, out, 3, SMDDP_INT64, SMDDP_SUM, NULL, NULL));
    int64_t sum = (int64_t)size * (size - 1) / 2;
    H_CHECK(out[0] == sum && out[1] == 10 * sum && out[2] == size, "allreduce gave %lld %lld %lld",
            (long long)out[0], (long long)out[1], (long long)out[2]);
    H_OK(smddp_comm_destroy(comm));
}

static void env_fn(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    const env_case_t *c = arg;
    clear_launcher_env();
    switch (c->style) {
    case ENV_SMDDP:
        setenv_int("SMDDP_RANK", rank);
        setenv_int("SMDDP_WORLD_SIZE", size);
        setenv("SMDDP_MASTER_ADDR", "127.0.0.1", 1);
        setenv_int("SMDDP_MASTER_PORT", c->port);
        /* SMDDP_* wins over a launcher's variables. */
        setenv("RANK", "7", 1);
        setenv("WORLD_SIZE", "9", 1);
        setenv("MASTER_PORT", "1", 1);
        break;
    case ENV_TORCHRUN:
    case ENV_TORCHRUN_AGENT:
        setenv_int("RANK", rank);
        setenv_int("WORLD_SIZE", size);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv_int("MASTER_PORT", c->port);
        /* torchrun's own store holds MASTER_PORT: libsmddp must move to the next one. */
        if (c->style == ENV_TORCHRUN_AGENT) setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
        break;
    case ENV_OMPI:
        setenv_int("OMPI_COMM_WORLD_RANK", rank);
        setenv_int("OMPI_COMM_WORLD_SIZE", size);
        setenv_int("OMPI_COMM_WORLD_LOCAL_SIZE", size);
        setenv("PMIX_NAMESPACE", c->job, 1);
        break;
    case ENV_SLURM:
        setenv_int("SLURM_PROCID", rank);
        setenv_int("SLURM_NTASKS", size);
        setenv("SLURM_NNODES", "1", 1);
        setenv("SLURM_JOB_ID", c->job, 1);
        setenv("SLURM_STEP_ID", "3", 1);
        break;
    case ENV_JOB_ID:
        /* No address: a port from SMDDP_JOB_ID, and 127.0.0.1 as every rank is local. */
        setenv_int("SMDDP_RANK", rank);
        setenv_int("SMDDP_WORLD_SIZE", size);
        setenv_int("LOCAL_WORLD_SIZE", size);
        setenv("SMDDP_JOB_ID", c->job, 1);
        setenv("PMIX_NAMESPACE", "loses-to-SMDDP_JOB_ID", 1);
        break;
    case ENV_RANK_TOO_BIG:
        setenv("RANK", "5", 1);
        setenv("WORLD_SIZE", "2", 1);
        break;
    case ENV_RECREATE:
        setenv_int("SMDDP_RANK", rank);
        setenv_int("SMDDP_WORLD_SIZE", size);
        setenv("SMDDP_MASTER_ADDR", "127.0.0.1", 1);
        setenv_int("SMDDP_MASTER_PORT", c->port);
        break;
    default:
        break;
    }
    smddp__params_reload();

    if (c->style == ENV_RECREATE) {
        /* Two communicators share the env store; then a fresh one after both are gone. */
        smddp_comm_t a, b;
        H_OK(smddp_comm_create_from_env(NULL, &a));
        H_OK(smddp_comm_create_from_env(NULL, &b));
        int32_t x = rank + 1, y = 0;
        H_OK(smddp_allreduce(a, &x, &y, 1, SMDDP_INT32, SMDDP_SUM, NULL, NULL));
        H_CHECK(y == 3, "a: %d", y);
        H_OK(smddp_comm_destroy(a));
        H_OK(smddp_allreduce(b, &x, &y, 1, SMDDP_INT32, SMDDP_MAX, NULL, NULL));
        H_CHECK(y == 2, "b: %d", y);
        /*
         * The last env communicator gone, rank 0 stops its store and starts a
         * new one for the next. With rank0_last, rank 1 asks for the next
         * communicator while rank 0's old store is still up (see
         * test_from_env_recreate_rank0_last); otherwise rank 1 waits until
         * the old store is surely gone.
         */
        struct timespec ts = {0, 300 * 1000 * 1000};
        if (rank == 0 && c->rank0_last) nanosleep(&ts, NULL);
        H_OK(smddp_comm_destroy(b));
        if (rank == 1 && !c->rank0_last) nanosleep(&ts, NULL);
        create_and_use(rank, size);
        return;
    }
    if (c->style <= ENV_JOB_ID) {
        create_and_use(rank, size);
        return;
    }

    smddp_comm_t comm = (smddp_comm_t)(uintptr_t)0x5eed;
    smddp_comm_config_t cfg = SMDDP_COMM_CONFIG_INIT;
    cfg.timeout_ms = 500;
    smddp_status_t st = smddp_comm_create_from_env(&cfg, &comm);
    const char *msg = smddp_get_last_error(NULL);
    H_CHECK(comm == (smddp_comm_t)(uintptr_t)0x5eed, "*comm changed on error");
    switch (c->style) {
    case ENV_NOTHING:
        H_CHECK(st == SMDDP_ERR_INVALID_ARGUMENT, "%s", smddp_status_string(st));
        H_HAS(msg, "SMDDP_RANK");
        H_HAS(msg, "SMDDP_WORLD_SIZE");
        H_HAS(msg, "torchrun");
        H_HAS(msg, "OMPI_COMM_WORLD_RANK");
        H_HAS(msg, "SLURM_PROCID");
        break;
    case ENV_RANK_TOO_BIG:
        H_CHECK(st == SMDDP_ERR_INVALID_ARGUMENT, "%s", smddp_status_string(st));
        H_HAS(msg, "rank 5 (from RANK)");
        H_HAS(msg, "world size 2 (from WORLD_SIZE)");
        break;
    default:
        break;
    }
}

/* A port nothing listens on now (and, with pair set, the one after it too). */
static int free_port(int pair)
{
    for (int attempt = 0; attempt < 50; attempt++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        assert_true(fd >= 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
        socklen_t len = sizeof(sa);
        assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
        int port = ntohs(sa.sin_port);
        close(fd);
        if (!pair) return port;
        if (port >= 65535) continue;
        fd = socket(AF_INET, SOCK_STREAM, 0);
        sa.sin_port = htons((uint16_t)(port + 1));
        int ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        close(fd);
        if (ok) return port;
    }
    fail_msg("no free port pair");
    return -1;
}

static int port_is_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY),
                             .sin_port = htons((uint16_t)port)};
    int ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return ok;
}

/*
 * The port a one-node job derives from its launcher's job id. This mirrors
 * bootstrap.c (FNV-1a of "VARIABLE:value[.step]" into 20000..39999) only so
 * that the test can pick a job id whose port is free on this machine.
 */
static int derived_port(const char *job)
{
    uint32_t h = 2166136261u;
    for (const char *s = job; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return 20000 + (int)(h % 20000u);
}

static void pick_job(env_case_t *c, const char *var, const char *suffix)
{
    for (int i = 0; i < 100; i++) {
        char full[128];
        snprintf(c->job, sizeof(c->job), "smddp-test-%d-%d", (int)getpid(), i);
        snprintf(full, sizeof(full), "%s:%s%s", var, c->job, suffix);
        if (port_is_free(derived_port(full))) return;
    }
    fail_msg("no job id with a free derived port");
}

static void run_env(env_style_t style, int nranks)
{
    env_case_t c = {.style = style};
    if (style == ENV_OMPI) pick_job(&c, "PMIX_NAMESPACE", "");
    if (style == ENV_SLURM) pick_job(&c, "SLURM_JOB_ID", ".3");
    if (style == ENV_JOB_ID) pick_job(&c, "SMDDP_JOB_ID", "");
    c.port = free_port(style == ENV_TORCHRUN_AGENT);
    int agent = -1;
    if (style == ENV_TORCHRUN_AGENT) {
        /* Play torchrun's agent store: MASTER_PORT is taken, libsmddp must use the next. */
        agent = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY),
                                 .sin_port = htons((uint16_t)c.port)};
        assert_int_equal(bind(agent, (struct sockaddr *)&sa, sizeof(sa)), 0);
        assert_int_equal(listen(agent, 1), 0);
    }
    harness_opts_t opts = {.timeout_s = 60, .no_comm = 1};
    assert_int_equal(harness_run(nranks, env_fn, &c, &opts), 0);
    if (agent >= 0) close(agent);
}

static void test_from_env_smddp(void **state)
{
    (void)state;
    run_env(ENV_SMDDP, 2);
}

static void test_from_env_torchrun(void **state)
{
    (void)state;
    run_env(ENV_TORCHRUN, 3);
}

static void test_from_env_torchrun_agent_store(void **state)
{
    (void)state;
    run_env(ENV_TORCHRUN_AGENT, 2);
}

static void test_from_env_ompi(void **state)
{
    (void)state;
    run_env(ENV_OMPI, 2);
}

static void test_from_env_slurm(void **state)
{
    (void)state;
    run_env(ENV_SLURM, 2);
}

static void test_from_env_job_id(void **state)
{
    (void)state;
    run_env(ENV_JOB_ID, 2);
}

static void test_from_env_recreate(void **state)
{
    (void)state;
    run_env(ENV_RECREATE, 2);
}

/*
 * Rank 0 destroys its last env communicator after the other rank has already
 * asked for the next one: the store must outlive communicators, or the other
 * rank reaches a store that is about to stop and loses it mid-rendezvous.
 */
static void test_from_env_recreate_rank0_last(void **state)
{
    (void)state;
    env_case_t c = {.style = ENV_RECREATE, .rank0_last = 1};
    c.port = free_port(0);
    harness_opts_t opts = {.timeout_s = 60, .no_comm = 1, .env = "SMDDP_TIMEOUT=5"};
    assert_int_equal(harness_run(2, env_fn, &c, &opts), 0);
}

static void test_from_env_nothing_set(void **state)
{
    (void)state;
    run_env(ENV_NOTHING, 1);
}

static void test_from_env_rank_too_big(void **state)
{
    (void)state;
    run_env(ENV_RANK_TOO_BIG, 1);
}

/* Error cases that run with exactly the environment the harness set. */
static void preset_fn(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused;
    (void)rank;
    (void)size;
    const env_case_t *c = arg;
    smddp__params_reload();
    smddp_comm_t comm = NULL;
    smddp_comm_config_t cfg = SMDDP_COMM_CONFIG_INIT;
    cfg.timeout_ms = 500;
    double t0 = (double)smddp__now_ns() / 1e9;
    smddp_status_t st = smddp_comm_create_from_env(&cfg, &comm);
    double dt = (double)smddp__now_ns() / 1e9 - t0;
    const char *msg = smddp_get_last_error(NULL);
    switch (c->style) {
    case ENV_NO_ADDRESS:
        H_CHECK(st == SMDDP_ERR_INVALID_ARGUMENT, "%s: %s", smddp_status_string(st), msg);
        H_HAS(msg, "rendezvous address");
        H_HAS(msg, "SMDDP_MASTER_ADDR");
        H_HAS(msg, "rank 0 of 2");
        break;
    case ENV_PORT_BUSY:
        H_CHECK(st < 0, "rank 0 served on a port already in use");
        H_HAS(msg, "rank 0 cannot serve the store on port");
        H_HAS(msg, "SMDDP_MASTER_PORT");
        break;
    case ENV_NO_SERVER:
        H_CHECK(st < 0, "rank 1 joined without a store");
        H_HAS(msg, "rank 1 cannot reach rank 0's store at 127.0.0.1");
        H_CHECK(dt < 3.0, "giving up on the store took %.2f s with a 0.5 s timeout", dt);
        break;
    default:
        H_CHECK(0, "unexpected style");
    }
}

static void test_from_env_no_address(void **state)
{
    (void)state;
    env_case_t c = {.style = ENV_NO_ADDRESS};
    harness_opts_t opts = {.timeout_s = 60, .no_comm = 1};
    opts.env = "SMDDP_RANK=0 SMDDP_WORLD_SIZE=2";
    assert_int_equal(harness_run(1, preset_fn, &c, &opts), 0);
}

/* A malformed MASTER_PORT is refused, naming it, instead of atoi's guess. */
static void bad_master_port_fn(smddp_comm_t unused, int rank, int size, void *arg)
{
    (void)unused, (void)rank, (void)size, (void)arg;
    static const char *const bad[] = {"29500x", "0", "70000", "-1", "2e4"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        clear_launcher_env();
        setenv("RANK", "0", 1);
        setenv("WORLD_SIZE", "2", 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", bad[i], 1);
        smddp_comm_t comm = NULL;
        smddp_status_t st = smddp_comm_create_from_env(NULL, &comm);
        const char *msg = smddp_get_last_error(NULL);
        H_CHECK(st == SMDDP_ERR_INVALID_ARGUMENT, "MASTER_PORT=\"%s\": %s: %s", bad[i],
                smddp_status_string(st), msg);
        H_HAS(msg, "MASTER_PORT");
        H_HAS(msg, bad[i]);
    }
}

static void test_from_env_bad_master_port(void **state)
{
    (void)state;
    harness_opts_t opts = {.timeout_s = 60, .no_comm = 1};
    assert_int_equal(harness_run(1, bad_master_port_fn, NULL, &opts), 0);
}

static void test_from_env_port_busy(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof(sa);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    char env[160];
    snprintf(env, sizeof(env),
             "SMDDP_RANK=0 SMDDP_WORLD_SIZE=2 SMDDP_MASTER_ADDR=127.0.0.1 SMDDP_MASTER_PORT=%d",
             ntohs(sa.sin_port));
    env_case_t c = {.style = ENV_PORT_BUSY};
    harness_opts_t opts = {.timeout_s = 60, .no_comm = 1, .env = env};
    assert_int_equal(harness_run(1, preset_fn, &c, &opts), 0);
    close(fd);
}

static void test_from_env_no_server(void **state)
{
    (void)state;
    char env[160];
    snprintf(env, sizeof(env),
             "SMDDP_RANK=1 SMDDP_WORLD_SIZE=2 SMDDP_MASTER_ADDR=127.0.0.1 SMDDP_MASTER_PORT=%d",
             free_port(0));
    env_case_t c = {.style = ENV_NO_SERVER};
    harness_opts_t opts = {.timeout_s = 60, .no_comm = 1, .env = env};
    assert_int_equal(harness_run(1, preset_fn, &c, &opts), 0);
}

static int setup(void **state)
{
    (void)state;
    /* Launcher variables in the test's own environment must not leak into the cases. */
    clear_launcher_env();
    return 0;
}

int main(void)
{
    const char *p = getenv("SMDDP_LIB_PATH");
    if (p) {
        snprintf(lib_path, sizeof(lib_path), "%s", p);
    } else {
        /* Run by hand from the build tree: build/test/unit/test_api -> build/abi/. */
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n > 0) {
            exe[n] = '\0';
            char *slash = strrchr(exe, '/');
            if (slash) *slash = '\0';
            snprintf(lib_path, sizeof(lib_path), "%.*s/../../abi/libsmddp.so",
                     (int)(sizeof(lib_path) - 32), exe);
            if (access(lib_path, R_OK) != 0) lib_path[0] = '\0';
        }
    }
    unsetenv("SMDDP_LIB_PATH");

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_ops),
        cmocka_unit_test(test_last_error_basics),
        cmocka_unit_test(test_exported_symbols),
        cmocka_unit_test(test_shared_library_loads),
        cmocka_unit_test(test_from_env_smddp),
        cmocka_unit_test(test_from_env_torchrun),
        cmocka_unit_test(test_from_env_torchrun_agent_store),
        cmocka_unit_test(test_from_env_ompi),
        cmocka_unit_test(test_from_env_slurm),
        cmocka_unit_test(test_from_env_job_id),
        cmocka_unit_test(test_from_env_recreate),
        cmocka_unit_test(test_from_env_recreate_rank0_last),
        cmocka_unit_test(test_from_env_nothing_set),
        cmocka_unit_test(test_from_env_rank_too_big),
        cmocka_unit_test(test_from_env_no_address),
        cmocka_unit_test(test_from_env_bad_master_port),
        cmocka_unit_test(test_from_env_port_busy),
        cmocka_unit_test(test_from_env_no_server),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
