/*
 * The flight recorder (see trace.h).
 */
#include <errno.h>
#include <sys/stat.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "param.h"
#include "trace.h"

smddp__trace_t *smddp__trace_new(void)
{
    int64_t cap = smddp__params()->trace_buffer;
    if (cap <= 0) return NULL;
    smddp__trace_t *t = calloc(1, sizeof(*t));
    if (t) t->ring = calloc((size_t)cap, sizeof(*t->ring));
    if (!t || !t->ring) {
        free(t);
        SMDDP_WARN("no memory for a flight recorder of %" PRId64 " operations: not recording",
                   cap);
        return NULL;
    }
    t->capacity = (uint32_t)cap;
    return t;
}

void smddp__trace_free(smddp__trace_t *t)
{
    if (!t) return;
    free(t->ring);
    free(t);
}

/* op's slot, while no newer op has taken it. */
static smddp__trace_entry_t *slot_of(const smddp__trace_t *t, const smddp__op_t *op)
{
    if (!t || !op->trace_id) return NULL;
    smddp__trace_entry_t *e = &t->ring[(op->trace_id - 1) % t->capacity];
    return atomic_load_explicit(&e->id, memory_order_acquire) == op->trace_id ? e : NULL;
}

int64_t smddp__trace_issue(smddp__trace_t *t, smddp__op_t *op)
{
    if (!t) return 0;
    int64_t now_ns = smddp__now_ns();
    uint64_t id = atomic_fetch_add_explicit(&t->issued, 1, memory_order_relaxed) + 1;
    smddp__trace_entry_t *e = &t->ring[(id - 1) % t->capacity];
    /* 0 first, so that a dump reading the slot meanwhile drops it. */
    atomic_store_explicit(&e->id, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    e->seq = op->seq;
    e->count = op->count;
    e->root = op->root;
    e->kind = (uint8_t)op->kind;
    e->dtype = (uint8_t)op->dtype;
    e->redop = (uint8_t)op->spec.op;
    e->mem_type = (uint8_t)op->mem_type;
    e->issued_ns = now_ns;
    atomic_store_explicit(&e->path, NULL, memory_order_relaxed);
    atomic_store_explicit(&e->algo, NULL, memory_order_relaxed);
    atomic_store_explicit(&e->started_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&e->finished_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&e->status, 0, memory_order_relaxed);
    atomic_store_explicit(&e->state, SMDDP_TRACE_QUEUED, memory_order_relaxed);
    atomic_store_explicit(&e->id, id, memory_order_release);
    op->trace_id = id;
    return now_ns;
}

void smddp__trace_reseq(smddp__trace_t *t, const smddp__op_t *op)
{
    smddp__trace_entry_t *e = slot_of(t, op);
    if (!e) return;
    /* As at issue: a dump reading the slot meanwhile drops it. */
    atomic_store_explicit(&e->id, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    e->seq = op->seq;
    atomic_store_explicit(&e->id, op->trace_id, memory_order_release);
}

void smddp__trace_start(smddp__trace_t *t, const smddp__op_t *op, int64_t now_ns)
{
    smddp__trace_entry_t *e = slot_of(t, op);
    if (!e) return;
    atomic_store_explicit(&e->started_ns, now_ns, memory_order_relaxed);
    atomic_store_explicit(&e->state, SMDDP_TRACE_RUNNING, memory_order_release);
}

void smddp__trace_finish(smddp__trace_t *t, const smddp__op_t *op, smddp_status_t st)
{
    smddp__trace_entry_t *e = slot_of(t, op);
    if (!e) return;
    atomic_store_explicit(&e->path, op->path, memory_order_relaxed);
    atomic_store_explicit(&e->algo, op->algo, memory_order_relaxed);
    atomic_store_explicit(&e->finished_ns, smddp__now_ns(), memory_order_relaxed);
    atomic_store_explicit(&e->status, st, memory_order_relaxed);
    atomic_store_explicit(&e->state, st < 0 ? SMDDP_TRACE_FAILED : SMDDP_TRACE_DONE,
                          memory_order_release);
}

/* name with everything but letters, digits, '.' and '-' made '_', into out. */
static void clean_name(const char *name, char *out, size_t cap)
{
    size_t n = 0;
    for (; name && *name && n + 1 < cap; name++, n++) {
        char c = *name;
        bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-';
        out[n] = keep ? c : '_';
    }
    out[n] = '\0';
}

/* mkdir -p dir (mode 0755); false with errno set when a part cannot be made. */
static bool make_dirs(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path)) {
        errno = ENAMETOOLONG;
        return false;
    }
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) return false;
        *p = c;
        if (!c) return true;
    }
}

/* path NULL's file (see smddp__trace_dump), its folder made if missing. */
static smddp_status_t default_path(const char *comm_name, int rank, char *out, size_t cap)
{
    const smddp__params_t *params = smddp__params();
    if (!params->trace_dir[0])
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT, "no path given and SMDDP_TRACE_DIR is "
                            "not set: give a path, or set SMDDP_TRACE_DIR to a folder");
    const char *job = params->job_id[0] ? params->job_id : getenv("TORCHELASTIC_RUN_ID");
    char job_c[128], comm_c[128];
    clean_name(job && job[0] ? job : "job", job_c, sizeof(job_c));
    clean_name(comm_name, comm_c, sizeof(comm_c));
    if (snprintf(out, cap, "%s/smddp-trace-%s-%s-r%d.json", params->trace_dir, job_c, comm_c,
                 rank) >= (int)cap)
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT, "SMDDP_TRACE_DIR is too long: %s",
                            params->trace_dir);
    if (!make_dirs(params->trace_dir))
        return smddp__error(SMDDP_ERR_SYSTEM, "cannot make SMDDP_TRACE_DIR %s: %s",
                            params->trace_dir, strerror(errno));
    return SMDDP_OK;
}

static const char *state_name(int32_t s)
{
    switch (s) {
    case SMDDP_TRACE_QUEUED: return "queued";
    case SMDDP_TRACE_RUNNING: return "running";
    case SMDDP_TRACE_DONE: return "done";
    case SMDDP_TRACE_FAILED: return "failed";
    default: return "unknown";
    }
}

/* A copy of one slot's fields, read without tearing or dropped. */
typedef struct {
    uint64_t id, seq, count;
    int32_t root, state, status;
    uint8_t kind, dtype, redop, mem_type;
    const char *path, *algo;
    int64_t issued_ns, started_ns, finished_ns;
} entry_copy_t;

static bool read_slot(smddp__trace_entry_t *e, entry_copy_t *c)
{
    c->id = atomic_load_explicit(&e->id, memory_order_acquire);
    if (!c->id) return false;
    c->seq = e->seq;
    c->count = e->count;
    c->root = e->root;
    c->kind = e->kind;
    c->dtype = e->dtype;
    c->redop = e->redop;
    c->mem_type = e->mem_type;
    c->issued_ns = e->issued_ns;
    c->state = atomic_load_explicit(&e->state, memory_order_acquire);
    c->path = atomic_load_explicit(&e->path, memory_order_relaxed);
    c->algo = atomic_load_explicit(&e->algo, memory_order_relaxed);
    c->started_ns = atomic_load_explicit(&e->started_ns, memory_order_relaxed);
    c->finished_ns = atomic_load_explicit(&e->finished_ns, memory_order_relaxed);
    c->status = atomic_load_explicit(&e->status, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&e->id, memory_order_relaxed) == c->id &&
           c->kind < SMDDP_OP_KIND_COUNT;
}

/* A JSON string of s (names and the communicator's name: no control characters expected). */
static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

smddp_status_t smddp__trace_dump(smddp__trace_t *t, const char *path, const char *comm_name,
                                 int rank, int size, const char *extra, char *written,
                                 size_t cap)
{
    if (!t)
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT, "the flight recorder is off "
                            "(SMDDP_TRACE_BUFFER=0): nothing to dump");
    char def[4096];
    if (!path) {
        SMDDP_CHECK(default_path(comm_name, rank, def, sizeof(def)));
        path = def;
    }
    /* Written beside its final name, then renamed: a reader never sees half a file. */
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT, "trace path too long: %s", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return smddp__error(SMDDP_ERR_SYSTEM, "cannot write the flight recorder to %s: %s", tmp,
                            strerror(errno));
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    uint64_t issued = atomic_load_explicit(&t->issued, memory_order_acquire);
    uint64_t first = issued > t->capacity ? issued - t->capacity + 1 : 1;
    fprintf(f, "{\"format\": \"smddp-trace\", \"version\": 1, \"comm\": ");
    put_string(f, comm_name);
    fprintf(f, ", \"rank\": %d, \"size\": %d, \"pid\": %ld, \"capacity\": %u, "
               "\"recorded\": %" PRIu64 ", \"monotonic_ns\": %" PRId64 ", \"wall_ns\": %" PRId64
               ",\n%s%s \"ops\": [",
            rank, size, (long)getpid(), t->capacity, issued, smddp__now_ns(),
            (int64_t)(wall.tv_sec * 1000000000LL + wall.tv_nsec), extra ? extra : "",
            extra ? ",\n" : "");
    int ops = 0;
    for (uint64_t id = first; id <= issued; id++) {
        entry_copy_t c;
        if (!read_slot(&t->ring[(id - 1) % t->capacity], &c) || c.id != id) continue;
        fprintf(f, "%s\n  {\"id\": %" PRIu64 ", \"seq\": %" PRIu64 ", \"kind\": \"%s\", "
                   "\"count\": %" PRIu64 ", \"dtype\": \"%s\", \"op\": \"%s\", \"root\": %d, "
                   "\"mem\": \"%s\", \"path\": ",
                ops ? "," : "", c.id, c.seq, smddp__op_kind_name((smddp__op_kind_t)c.kind),
                c.count, smddp__dtype_name((smddp_dtype_t)c.dtype),
                smddp__op_traits((smddp__op_kind_t)c.kind)->reduces
                    ? smddp__redop_name((smddp_op_t)c.redop)
                    : "",
                c.root, c.mem_type == SMDDP_MEM_CUDA ? "cuda" : "host");
        put_string(f, c.path ? c.path : "");
        fprintf(f, ", \"algo\": ");
        put_string(f, c.algo ? c.algo : "");
        fprintf(f, ", \"issued_ns\": %" PRId64 ", \"started_ns\": %" PRId64
                   ", \"finished_ns\": %" PRId64 ", \"state\": \"%s\", \"status\": ",
                c.issued_ns, c.started_ns, c.finished_ns, state_name(c.state));
        put_string(f, c.state >= SMDDP_TRACE_DONE ? smddp__status_string(c.status) : "");
        fputc('}', f);
        ops++;
    }
    fprintf(f, "\n]}\n");
    bool ok = !ferror(f);
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        int err = errno;
        remove(tmp);
        return smddp__error(SMDDP_ERR_SYSTEM, "cannot write the flight recorder to %s: %s", path,
                            strerror(err));
    }
    if (written && cap) snprintf(written, cap, "%s", path);
    return SMDDP_OK;
}
