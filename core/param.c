/*
 * The settings table. Each SMDDP_* variable is one row: name, type, default,
 * description, and where its parsed value goes. The environment is read once;
 * variables that start with SMDDP_ but name no row get a warning, since a typo
 * in a tuning knob otherwise silently does nothing.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "param.h"

extern char **environ;

typedef enum param_type { P_INT, P_SIZE, P_BOOL, P_STRING, P_ENUM, P_SECONDS } param_type_t;

typedef struct param_row {
    const char *name;
    param_type_t type;
    const char *def;
    const char *doc;
    size_t offset;
    size_t cap;          /* for strings */
    const char *choices; /* for enums: "|"-separated, index is the value */
    smddp__agree_t agree; /* how a communicator's ranks agree on it (smddp__params_agree) */
} param_row_t;

#define OFF(field) offsetof(smddp__params_t, field)
#define CAP(field) sizeof(((smddp__params_t *)0)->field)
/*
 * The agreement column (see smddp__params_agree): OWN, each rank keeps its
 * own value; MATCH: every rank must set the same, else creation fails
 * naming the ranks and values; LEAST / MOST: the smallest / largest any rank
 * sets holds for all (for a range, LEAST on its top and MOST on its bottom
 * give the range every rank allows).
 */
#define OWN SMDDP_AGREE_ANY
#define MATCH SMDDP_AGREE_MATCH
#define LEAST SMDDP_AGREE_MIN
#define MOST SMDDP_AGREE_MAX

static const param_row_t rows[] = {
    {"SMDDP_DEBUG", P_ENUM, "WARN", "log level", OFF(debug_level), 0, "NONE|WARN|INFO|TRACE", OWN},
    {"SMDDP_DEBUG_FILE", P_STRING, "", "log to this file instead of stderr; %h = host, %p = pid",
     OFF(debug_file), CAP(debug_file), NULL, OWN},
    {"SMDDP_TIMEOUT", P_SECONDS, "1800",
     "deadline in seconds for every wait; on expiry the communicator is aborted", OFF(timeout_ms),
     0, NULL, OWN},
    {"SMDDP_RANK", P_INT, "-1", "this process's rank (else RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID)",
     OFF(rank), 0, NULL, OWN},
    {"SMDDP_WORLD_SIZE", P_INT, "-1",
     "number of ranks (else WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS)", OFF(world_size), 0,
     NULL, OWN},
    {"SMDDP_MASTER_ADDR", P_STRING, "", "address of rank 0's built-in store (else MASTER_ADDR)",
     OFF(master_addr), CAP(master_addr), NULL, OWN},
    {"SMDDP_MASTER_PORT", P_INT, "-1", "port of rank 0's built-in store (else MASTER_PORT)",
     OFF(master_port), 0, NULL, OWN},
    {"SMDDP_HOSTNAME", P_STRING, "",
     "node identity used to group ranks into nodes (default: the host name)", OFF(hostname),
     CAP(hostname), NULL, OWN},
    {"SMDDP_JOB_ID", P_STRING, "",
     "job id from which a one-node job derives its store port when none is set (else "
     "PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid, SLURM_JOB_ID)",
     OFF(job_id), CAP(job_id), NULL, OWN},
    {"SMDDP_ALGO", P_STRING, "",
     "overrides the selection per kind and size, as kind:lo-hi:algorithm rules joined by '#' "
     "(e.g. allreduce:0-64k:one-shot#allreduce:two-shot; bounds included, first match wins); the table and the names are "
     "printed below", OFF(algo_rules), CAP(algo_rules), NULL, MATCH},
    {"SMDDP_ALLREDUCE_ALGO", P_ENUM, "auto", "allreduce algorithm inside a node", OFF(algo), 0,
     "auto|oneshot|twoshot", MATCH},
    {"SMDDP_ALLREDUCE_ONESHOT_MAX", P_SIZE, "131072",
     "under auto, allreduce uses one-shot while bytes x local ranks / 2 is at most this",
     OFF(oneshot_max), 0, NULL, MATCH},
    {"SMDDP_SHM_BUFFER_SIZE", P_SIZE, "4194304",
     "shared-memory staging buffer per local rank (bytes)", OFF(shm_buffer), 0, NULL, MATCH},
    {"SMDDP_SHM_POOL_SIZE", P_SIZE, "2G",
     "address space per local rank for smddp_mem_alloc (torch: allocate_tensor), memory that "
     "local peers read and write in place; backed only as allocated; 0 turns it off",
     OFF(shm_pool), 0, NULL, OWN},
    {"SMDDP_SHM_POOL_RESERVE_PCT", P_INT, "25",
     "pool allocations that would leave less than this percentage of the shared-memory "
     "filesystem (/dev/shm) free are refused, so that other users of it (data loader workers) "
     "keep room; the tensor then stays in ordinary memory and is staged (0: only a full "
     "/dev/shm refuses)",
     OFF(shm_pool_reserve_pct), 0, NULL, OWN},
    {"SMDDP_SHM_POOL_RELEASE_MS", P_INT, "5000",
     "pool memory freed and left unused this many ms is given back to /dev/shm at the next "
     "collective of the communicator whose pool it is (until then a new allocation reuses it backed); 0: at once, "
     "when freed",
     OFF(shm_pool_release_ms), 0, NULL, OWN},
    {"SMDDP_SHM_CMA", P_ENUM, "auto",
     "allgather inside a node: ranks read each other's inputs with cross-memory attach "
     "(process_vm_readv: one copy where staging makes two); auto: when every local rank can "
     "and they do not outnumber their CPUs; on: whenever every local rank can; off: never",
     OFF(shm_cma), 0, "auto|on|off", OWN},
    {"SMDDP_SHM_CMA_MIN", P_SIZE, "8192",
     "the smallest allgather, in bytes per rank, that cross-memory attach serves (SMDDP_SHM_CMA)",
     OFF(shm_cma_min), 0, NULL, MOST},
    {"SMDDP_SHM_CMA_MAX", P_SIZE, "16777216",
     "the largest allgather, in bytes per rank, that cross-memory attach serves; larger ones are "
     "staged", OFF(shm_cma_max), 0, NULL, LEAST},
    {"SMDDP_SHM_LL_MAX", P_SIZE, "8192",
     "allreduce, and allgather that cross-memory attach does not serve, inside a node of at "
     "most this many bytes per rank go through low-latency slots, where the data, the op's "
     "description and the signal share cache lines, as do the barrier and broadcasts of up "
     "to 1 KiB; the smallest value any rank sets holds (0: off, at most 16384)",
     OFF(shm_ll_max), 0, NULL, LEAST},
    {"SMDDP_STREAM_MIN", P_SIZE, "8388608",
     "collectives moving at least this many bytes write results with non-temporal stores",
     OFF(stream_min), 0, NULL, OWN},
    {"SMDDP_P2P_BUFFER_SIZE", P_SIZE, "262144",
     "shared-memory ring per ordered pair of local ranks for send/recv (bytes)", OFF(p2p_buffer),
     0, NULL, MATCH},
    {"SMDDP_P2P_SET_ASIDE_MAX", P_SIZE, "1073741824",
     "send/recv inside a node: messages set aside for receives not yet posted (they came "
     "ahead of one a receive waits for) take at most this many bytes per rank; beyond, later "
     "messages wait in their ring (one message is always let through)",
     OFF(p2p_set_aside_max), 0, NULL, OWN},
    {"SMDDP_SPIN", P_INT, "-1",
     "microseconds to busy-wait before yielding, then sleeping on a futex (-1: 50, or 1 when "
     "local ranks outnumber cores)",
     OFF(spin), 0, NULL, OWN},
    {"SMDDP_YIELD", P_INT, "-1",
     "microseconds to yield the core after spinning, before sleeping on a futex (-1: 2000, or "
     "200 when local ranks outnumber cores)",
     OFF(yield), 0, NULL, OWN},
    {"SMDDP_CHECK_ORDER", P_BOOL, "0",
     "check (sequence, op, count, dtype, root) against every rank in a barrier before every "
     "collective; without it each rank checks only the peers it waits for", OFF(check), 0, NULL,
     MATCH},
    {"SMDDP_SIMD", P_ENUM, "auto", "CPU reduction kernels", OFF(simd), 0,
     "auto|scalar|avx2|avx512", OWN},
    {"SMDDP_INLINE", P_BOOL, "1",
     "let a blocking call (or one flagged SMDDP_COLL_WAIT_NOW) on an idle communicator, and "
     "smddp_wait() on a request not started yet, run the operation on the caller's thread",
     OFF(inline_exec),
     0, NULL, OWN},
    {"SMDDP_THREAD_SCHED", P_ENUM, "batch",
     "scheduling policy of libsmddp's progress and send/recv threads: batch (SCHED_BATCH: a fair "
     "share of the CPU, but a thread woken for new work does not preempt the application's "
     "thread on its core, which then runs an operation it waits for itself) or normal "
     "(SCHED_OTHER)", OFF(thread_sched), 0, "batch|normal", OWN},
    {"SMDDP_TRACE_BUFFER", P_INT, "2000",
     "operations each communicator's flight recorder keeps (the last ones; 0 turns it off); "
     "smddp_comm_dump_trace() writes them", OFF(trace_buffer), 0, NULL, OWN},
    {"SMDDP_TRACE_DIR", P_STRING, "",
     "folder where each rank writes its flight recorder, smddp-trace-<job>-<comm>-r<rank>.json, "
     "when its communicator fails (and smddp_comm_dump_trace without a path)", OFF(trace_dir),
     CAP(trace_dir), NULL, OWN},
    {"SMDDP_STRAGGLER_WARN_MS", P_INT, "0",
     "log a WARN, at most once a minute per communicator, naming the rank that arrived last at "
     "a collective when it kept the others waiting longer than this many ms (0: never)",
     OFF(straggler_warn_ms), 0, NULL, OWN},
    {"SMDDP_STRAGGLER_NODES", P_INT, "1",
     "1: compare arrivals across nodes too (each node's clock offset to rank 0's node is "
     "measured at creation; a thread on each node's first rank sends its node's arrivals "
     "through the store every 100 ms); 0: within a node only", OFF(straggler_nodes), 0, NULL, OWN},
    {"SMDDP_CUDA_BUFFER_SIZE", P_SIZE, "67108864",
     "device staging buffer per local rank for CUDA collectives, shared with peers through CUDA "
     "IPC (bytes; two halves, used in turn)", OFF(cuda_buffer), 0, NULL, MATCH},
    {"SMDDP_CUDA_ONESHOT_MAX", P_SIZE, "524288",
     "CUDA allreduce: one-shot (every rank reduces every copy) up to this many bytes, two-shot "
     "(reduce-scatter + allgather) above", OFF(cuda_oneshot_max), 0, NULL, MATCH},
    {"SMDDP_CUDA_SYNC", P_ENUM, "events",
     "CUDA allreduce, reduce-scatter and allgather inside a node: events (each step a host "
     "barrier and interprocess CUDA events) or kernel (one launch per chunk, ranks meeting "
     "through flags in device memory, a second SMDDP_CUDA_BUFFER_SIZE of device memory per "
     "rank); the same on every rank", OFF(cuda_sync), 0, "events|kernel", MATCH},
    {"SMDDP_CUDA_KERNEL_BLOCKS", P_INT, "0",
     "SMDDP_CUDA_SYNC=kernel: the most blocks (of 512 threads) one collective kernel takes; 0: "
     "half the GPU's multiprocessors, divided among the ranks that share a GPU",
     OFF(cuda_kernel_blocks), 0, NULL, OWN},
    {"SMDDP_CUDA_REGISTER_MIN", P_SIZE, "0",
     "SMDDP_CUDA_SYNC=kernel: inputs of at least this many bytes (address and size multiples "
     "of 16, in memory CUDA IPC can share) are registered once per allocation and read by "
     "peers in place, without the copy into the scratch, once every peer has mapped the "
     "allocation; every allocation registered must then stay allocated until every rank has "
     "destroyed the communicator; 0 (default): never",
     OFF(cuda_register_min), 0, NULL, OWN},
    {"SMDDP_NCCL_LIBRARY", P_STRING, "",
     "NCCL library loaded at run time for the CUDA collectives smddp hands to NCCL (default: "
     "libnccl.so.2 from the loader's search path)", OFF(nccl_library), CAP(nccl_library), NULL,
     OWN},
    {"SMDDP_CUDA_NET", P_ENUM, "auto",
     "CUDA collectives across nodes: staged (through pinned host memory and smddp's network "
     "path), nccl, or auto (NCCL where it loads and has the op, else staged); the same on "
     "every rank", OFF(cuda_net), 0, "auto|staged|nccl", MATCH},
    {"SMDDP_CUDA_STAGE_CHUNK", P_SIZE, "4194304",
     "staged CUDA allreduce, reduce and broadcast go in chunks of this many bytes (at least "
     "4096), so copies to and from the GPU overlap the network; the same on every rank",
     OFF(cuda_stage_chunk), 0, NULL, MATCH},
    {"SMDDP_OFI_PROVIDER", P_STRING, "",
     "libfabric provider between nodes (default: FI_PROVIDER's choice if set, else efa where "
     "present, else tcp;ofi_rxm)", OFF(ofi_provider), CAP(ofi_provider), NULL, OWN},
    {"SMDDP_OFI_LIBRARY", P_STRING, "",
     "libfabric, opened when a communicator first spans nodes (default: libfabric.so.1 from "
     "the loader's search path)", OFF(ofi_library), CAP(ofi_library), NULL, OWN},
    {"SMDDP_OFI_MAX_INFLIGHT", P_INT, "256",
     "send/recv between nodes: at most this many sends of one tag to one rank posted to the "
     "network at once; later ones of that tag wait their turn in order (receives are posted "
     "at once)", OFF(ofi_max_inflight), 0, NULL, OWN},
    {"SMDDP_OFI_MR", P_ENUM, "auto",
     "register buffers with the network provider: auto (where it asks for it, FI_MR_LOCAL, as "
     "efa and verbs do) or always (also where it does not: to test the registration path)",
     OFF(ofi_mr), 0, "auto|always", OWN},
    {"SMDDP_OFI_MR_CACHE", P_INT, "64",
     "registrations kept per network endpoint (least recently used ones go first); a "
     "collective's own are kept for its duration only", OFF(ofi_mr_cache), 0, NULL, OWN},
    {"SMDDP_NET_ALGO", P_ENUM, "auto",
     "collectives across nodes: hier (shared memory inside each node, the network between "
     "nodes; needs the same number of ranks on every node), flat (every rank on the network), "
     "or auto (hier where nodes are alike and hold several ranks each; with one rank on each "
     "of two nodes, hier for allreduce and reduce from 16 MiB and reduce_scatter from 4 MiB "
     "of input)", OFF(net_algo), 0, "auto|flat|hier", MATCH},
    {"SMDDP_NET_LEADER_MAX", P_SIZE, "65536",
     "hierarchical allreduce up to this many bytes sends through one rank per node; above it "
     "every local rank carries a share", OFF(net_leader_max), 0, NULL, MATCH},
    {"SMDDP_COMMUNICATION_BACKEND", P_ENUM, "auto",
     "auto: smddp's collectives; nccl: CUDA collectives through NCCL (set by smddprun)",
     OFF(comm_backend), 0, "auto|nccl", MATCH},
};

static smddp__params_t params;
/* Enum settings are parsed into their fields as ints. */
_Static_assert(sizeof(smddp__cuda_net_t) == sizeof(int) && sizeof(smddp__cuda_sync_t) == sizeof(int) &&
                   sizeof(smddp__log_level_t) == sizeof(int) &&
                   sizeof(smddp__thread_sched_t) == sizeof(int),
               "enum settings are stored as int");
/*
 * SMDDP_DEBUG as the log reads it on every SMDDP_LOG without a lock (log.c):
 * -1 until the settings are loaded, then kept in step with every (re)load.
 */
int smddp__log_level_cached = -1;
static pthread_once_t params_once = PTHREAD_ONCE_INIT;

static int enum_index(const char *choices, const char *value)
{
    int idx = 0;
    const char *p = choices;
    size_t vlen = strlen(value);
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == vlen && strncasecmp(p, value, len) == 0) return idx;
        idx++;
        if (!bar) break;
        p = bar + 1;
    }
    return -1;
}

/* Parses "123", "4K", "2M", "1G" (powers of 1024). */
static int parse_size(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0) return -1;
    int64_t mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024; end++; break;
    case 'm': case 'M': mul = 1024 * 1024; end++; break;
    case 'g': case 'G': mul = 1024LL * 1024 * 1024; end++; break;
    default: break;
    }
    if (mul > 1 && (*end == 'i' || *end == 'I')) end++; /* 4Mi, 4MiB */
    if (*end == 'b' || *end == 'B') end++;
    if (*end != '\0') return -1;
    if (v > INT64_MAX / mul) return -1;
    *out = v * mul;
    return 0;
}

/* Parses one value into its field of *into; returns 0, or -1 for a malformed value. */
static int parse_into(smddp__params_t *into, const param_row_t *row, const char *value)
{
    char *field = (char *)into + row->offset;
    char *end;
    switch (row->type) {
    case P_INT: {
        errno = 0;
        long v = strtol(value, &end, 10);
        if (errno || end == value || *end != '\0' || v < -2147483647L || v > 2147483647L) return -1;
        *(int *)field = (int)v;
        return 0;
    }
    case P_SIZE:
        return parse_size(value, (int64_t *)field);
    case P_SECONDS: {
        errno = 0;
        double v = strtod(value, &end);
        if (errno || end == value || *end != '\0' || !(v > 0) || v > 1e9) return -1;
        /* A positive value must not round down to 0 ms, which would be an instant deadline. */
        *(int64_t *)field = SMDDP_MAX((int64_t)(v * 1000.0), 1);
        return 0;
    }
    case P_BOOL:
        if (!strcmp(value, "1") || !strcasecmp(value, "true") || !strcasecmp(value, "yes") ||
            !strcasecmp(value, "on")) {
            *(int *)field = 1;
            return 0;
        }
        if (!strcmp(value, "0") || !strcasecmp(value, "false") || !strcasecmp(value, "no") ||
            !strcasecmp(value, "off")) {
            *(int *)field = 0;
            return 0;
        }
        return -1;
    case P_STRING:
        if (strlen(value) >= row->cap) return -1;
        strcpy(field, value);
        return 0;
    case P_ENUM: {
        int idx = enum_index(row->choices, value);
        if (idx < 0) return -1;
        *(int *)field = idx;
        return 0;
    }
    }
    return -1;
}

static int parse_value(const param_row_t *row, const char *value)
{
    return parse_into(&params, row, value);
}

static const char *type_name(param_type_t type)
{
    switch (type) {
    case P_INT: return "int";
    case P_SIZE: return "bytes";
    case P_BOOL: return "bool";
    case P_STRING: return "string";
    case P_ENUM: return "enum";
    case P_SECONDS: return "seconds";
    }
    return "?";
}

/*
 * Warnings here go straight to stderr: the logger itself depends on these
 * settings, so it cannot be used while they are being parsed.
 */
static void params_load(void)
{
    memset(&params, 0, sizeof(params));
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const param_row_t *row = &rows[i];
        if (parse_value(row, row->def) != 0) abort(); /* a bad default is a bug */
        const char *value = getenv(row->name);
        if (value && parse_value(row, value) != 0) {
            fprintf(stderr, "smddp WARN ignoring %s=\"%s\": expected %s%s%s; using default %s\n",
                    row->name, value, type_name(row->type), row->choices ? " one of " : "",
                    row->choices ? row->choices : "", row->def);
            parse_value(row, row->def);
        }
    }
    for (char **env = environ; env && *env; env++) {
        if (strncmp(*env, "SMDDP_", 6) != 0) continue;
        const char *eq = strchr(*env, '=');
        size_t len = eq ? (size_t)(eq - *env) : strlen(*env);
        bool known = false;
        for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]) && !known; i++)
            known = strlen(rows[i].name) == len && strncmp(rows[i].name, *env, len) == 0;
        if (!known)
            fprintf(stderr, "smddp WARN unknown setting %.*s ignored (smddp_info lists them all)\n",
                    (int)len, *env);
    }
}

const smddp__params_t *smddp__params(void)
{
    pthread_once(&params_once, params_load);
    return &params;
}

void smddp__params_reload(void)
{
    pthread_once(&params_once, params_load);
    params_load();
    __atomic_store_n(&smddp__log_level_cached, (int)params.debug_level, __ATOMIC_RELEASE);
}

static void format_from(const smddp__params_t *from, const param_row_t *row, char *buf,
                        size_t cap)
{
    const char *field = (const char *)from + row->offset;
    switch (row->type) {
    case P_INT:
    case P_BOOL:
        snprintf(buf, cap, "%d", *(const int *)field);
        break;
    case P_SIZE:
        snprintf(buf, cap, "%lld", (long long)*(const int64_t *)field);
        break;
    case P_SECONDS:
        snprintf(buf, cap, "%g", (double)*(const int64_t *)field / 1000.0);
        break;
    case P_STRING:
        snprintf(buf, cap, "%s", field);
        break;
    case P_ENUM: {
        int idx = *(const int *)field;
        const char *p = row->choices;
        for (int i = 0; i < idx && p; i++) {
            p = strchr(p, '|');
            if (p) p++;
        }
        const char *bar = p ? strchr(p, '|') : NULL;
        snprintf(buf, cap, "%.*s", p ? (int)(bar ? (size_t)(bar - p) : strlen(p)) : 1, p ? p : "?");
        break;
    }
    }
}

static void format_value(const param_row_t *row, char *buf, size_t cap)
{
    format_from(&params, row, buf, cap);
}

void smddp__params_print(FILE *out)
{
    smddp__params();
    static const char *const agree_names[] = {"own", "match", "min", "max"};
    fprintf(out, "%-29s %-8s %-9s %-9s %-6s %s\n", "name", "type", "default", "value", "ranks",
            "description");
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char value[300];
        format_value(&rows[i], value, sizeof(value));
        fprintf(out, "%-29s %-8s %-9s %-9s %-6s %s%s%s%s\n", rows[i].name,
                type_name(rows[i].type), rows[i].def[0] ? rows[i].def : "\"\"",
                value[0] ? value : "\"\"", agree_names[rows[i].agree], rows[i].doc,
                rows[i].choices ? " (" : "", rows[i].choices ? rows[i].choices : "",
                rows[i].choices ? ")" : "");
    }
}

/* ---- agreement across a communicator's ranks ------------------------------ */

enum { N_ROWS = sizeof(rows) / sizeof(rows[0]) };

size_t smddp__params_agree_record(char *buf, size_t cap)
{
    smddp__params();
    size_t len = 0;
    for (size_t i = 0; i < N_ROWS; i++) {
        if (rows[i].agree == SMDDP_AGREE_ANY) continue;
        char value[1100];
        format_value(&rows[i], value, sizeof(value));
        bool room = buf && len < cap;
        int n = snprintf(room ? buf + len : NULL, room ? cap - len : 0, "%s=%s\n", rows[i].name,
                         value);
        len += (size_t)SMDDP_MAX(n, 0);
    }
    return len;
}

/* The value rank's record gives name (up to the end of its line), or NULL: *vlen its length. */
static const char *record_value(const char *record, const char *name, size_t *vlen)
{
    size_t nlen = strlen(name);
    for (const char *line = record; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t llen = end ? (size_t)(end - line) : strlen(line);
        if (llen > nlen && !strncmp(line, name, nlen) && line[nlen] == '=') {
            *vlen = llen - nlen - 1;
            return line + nlen + 1;
        }
        line = end ? end + 1 : NULL;
    }
    return NULL;
}

/* The ranks whose value of name is not want ("3, 5, 8" or "3, 5, 8 and 12 more"), into out. */
static void name_ranks(const char *const *records, int n, const char *name, const char *want,
                       size_t wlen, char *out, size_t cap)
{
    enum { LISTED_MAX = 6 };
    int listed = 0, more = 0;
    size_t len = 0;
    out[0] = '\0';
    for (int r = 0; r < n; r++) {
        size_t vlen = 0;
        const char *v = record_value(records[r], name, &vlen);
        if (v && vlen == wlen && !memcmp(v, want, wlen)) continue;
        if (listed == LISTED_MAX || len >= cap) {
            more++;
            continue;
        }
        len += (size_t)snprintf(out + len, cap - len, "%s%d", listed++ ? ", " : "", r);
    }
    if (more && len < cap) snprintf(out + len, cap - len, " and %d more", more);
}

/* SMDDP_ERR_MISMATCH, with what disagreed in why. */
__attribute__((format(printf, 3, 4))) static smddp_status_t disagree(char *why, size_t cap,
                                                                     const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return SMDDP_ERR_MISMATCH;
}

smddp_status_t smddp__params_agree(const char *const *records, int n, smddp__params_t *out,
                                   char *why, size_t why_cap)
{
    *out = *smddp__params();
    for (size_t i = 0; i < N_ROWS; i++) {
        const param_row_t *row = &rows[i];
        if (row->agree == SMDDP_AGREE_ANY) continue;
        size_t len0 = 0;
        const char *v0 = record_value(records[0], row->name, &len0);
        for (int r = 0; r < n; r++) {
            size_t vlen = 0;
            const char *v = record_value(records[r], row->name, &vlen);
            if (!v || !v0)
                return disagree(why, why_cap,
                                "rank %d does not report %s: every rank of a communicator must "
                                "run the same libsmddp", v ? 0 : r, row->name);
            if (row->agree == SMDDP_AGREE_MATCH) {
                if (vlen == len0 && !memcmp(v, v0, vlen)) continue;
                char which[96];
                name_ranks(records, n, row->name, v0, len0, which, sizeof(which));
                return disagree(
                    why, why_cap, "%s must be the same on every rank: rank 0 has \"%.*s\", "
                    "rank %d has \"%.*s\" (ranks that differ from rank 0: %s)", row->name,
                    (int)SMDDP_MIN(len0, (size_t)200), v0, r, (int)SMDDP_MIN(vlen, (size_t)200),
                    v, which);
            }
            /* LEAST / MOST: sizes, parsed as this build parses them. */
            char text[64];
            smddp__params_t theirs;
            snprintf(text, sizeof(text), "%.*s", (int)SMDDP_MIN(vlen, sizeof(text) - 1), v);
            if (row->type != P_SIZE || parse_into(&theirs, row, text) != 0)
                return disagree(why, why_cap, "rank %d reports %s=\"%s\", which this rank "
                                "cannot read", r, row->name, text);
            int64_t *mine = (int64_t *)((char *)out + row->offset);
            int64_t other = *(const int64_t *)((const char *)&theirs + row->offset);
            *mine = row->agree == SMDDP_AGREE_MIN ? SMDDP_MIN(*mine, other)
                                                  : SMDDP_MAX(*mine, other);
        }
    }
    return SMDDP_OK;
}
