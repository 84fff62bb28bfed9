/*
 * Where every rank is and who keeps the others waiting; see progress.h.
 *
 * The thread that runs ops (exec_lock) is the only writer: after each op it
 * queues the op's seq as pending, and once BATCH ops are pending (or a
 * reader of the stats finds the communicator idle) compares every pending
 * op whose arrivals all local ranks have published, oldest first: reading
 * peers' arrival lines once per BATCH ops keeps the cost per op in the
 * nanoseconds. A rank that has not
 * arrived yet holds the comparison back (a broadcast root may finish before
 * the others arrive); an op whose arrival slots were reused meanwhile (a
 * rank 64 ops further on) is dropped. Readers of the stats, on any thread,
 * see relaxed atomics: a reading taken during an update may mix two ops,
 * never tear a number.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "param.h"
#include "progress.h"
#include "progress_nodes.h"
#include "transport/shm.h"

#define PENDING 64
#define BATCH 16
#define SKEWS 1024
#define WARN_EVERY_NS (60 * 1000000000LL)

struct smddp__progress {
    int local_size;
    uint64_t pending[PENDING]; /* seqs of this rank's ops not compared yet (a ring) */
    unsigned head, count;
    int64_t *arrived;          /* scratch: one arrival per local rank */
    int64_t *absolute;         /* scratch: the same on this node's clock, for nodes */
    smddp__nodes_t *nodes;     /* across nodes; NULL within one */
    int64_t last_warn_ns;
    atomic_bool where_said;    /* this rank's first failed op has said where the ranks are */
    uint64_t last_seq;         /* the last op run, named by a warning */
    smddp__op_kind_t last_kind;
    _Atomic uint64_t ops;
    _Atomic int64_t *late_ns;  /* per local rank */
    _Atomic int64_t skews[SKEWS];
    _Atomic int64_t skew_max;
    _Atomic int64_t skew_sum;
};

smddp__progress_t *smddp__progress_new(smddp_comm_t comm)
{
    smddp__progress_t *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->local_size = comm->local_size;
    p->arrived = calloc((size_t)comm->local_size, sizeof(*p->arrived));
    p->late_ns = calloc((size_t)comm->local_size, sizeof(*p->late_ns));
    p->absolute = calloc((size_t)comm->local_size, sizeof(*p->absolute));
    if (!p->arrived || !p->late_ns || !p->absolute) {
        smddp__progress_free(p);
        return NULL;
    }
    return p;
}

void smddp__progress_free(smddp__progress_t *p)
{
    if (!p) return;
    smddp__nodes_stop(p->nodes);
    free(p->arrived);
    free(p->absolute);
    free((void *)p->late_ns);
    free(p);
}

static void warn_straggler(smddp_comm_t comm, smddp__progress_t *p, uint64_t seq, int last,
                           int64_t skew_ns)
{
    int warn_ms = smddp__params()->straggler_warn_ms;
    if (warn_ms <= 0 || skew_ns <= (int64_t)warn_ms * 1000000LL || comm->local_rank != 0) return;
    int64_t now = smddp__now_ns();
    if (p->last_warn_ns && now - p->last_warn_ns < WARN_EVERY_NS) return;
    p->last_warn_ns = now;
    SMDDP_WARN("%s: rank %d arrived %.1f ms after the first rank at %s seq %llu and kept the "
               "others waiting (SMDDP_STRAGGLER_WARN_MS=%d); its lateness so far: %.3f s over "
               "%llu collectives (at most one such warning a minute)",
               comm->prefix, comm->local_ranks[last], (double)skew_ns / 1e6,
               seq == p->last_seq ? smddp__op_kind_name(p->last_kind) : "collective",
               (unsigned long long)seq, warn_ms,
               (double)atomic_load_explicit(&p->late_ns[last], memory_order_relaxed) / 1e9,
               (unsigned long long)atomic_load_explicit(&p->ops, memory_order_relaxed));
}

void smddp__progress_start_nodes(smddp_comm_t comm)
{
    if (comm->progress) comm->progress->nodes = smddp__nodes_start(comm);
}

void smddp__progress_stop_nodes(smddp_comm_t comm)
{
    if (!comm->progress) return;
    smddp__nodes_stop(comm->progress->nodes);
    comm->progress->nodes = NULL;
}

/* Compares the arrivals at seq: 1 done, 0 someone has not arrived, -1 no longer known. */
static int compare(smddp_comm_t comm, smddp__progress_t *p, uint64_t seq)
{
    for (int lr = 0; lr < p->local_size; lr++) {
        int known = smddp__shm_arrival(comm, lr, seq, &p->arrived[lr]);
        if (known <= 0) return known;
    }
    /* Relative to local rank 0's arrival: the times are modulo 2^48. */
    int64_t first_raw = p->arrived[0];
    for (int lr = p->local_size - 1; lr >= 0; lr--)
        p->arrived[lr] = smddp__arrival_diff(p->arrived[lr], p->arrived[0]);
    if (p->nodes && comm->local_rank == 0) {
        /* Whole times again: local rank 0 arrived less than 2^47 ns ago. */
        int64_t now = smddp__now_ns();
        int64_t first = now - smddp__arrival_diff(now & ((1LL << 48) - 1), first_raw);
        for (int lr = 0; lr < p->local_size; lr++) p->absolute[lr] = first + p->arrived[lr];
        smddp__nodes_push(p->nodes, seq, p->absolute);
    }
    int first = 0, last = 0;
    for (int lr = 1; lr < p->local_size; lr++) {
        if (p->arrived[lr] < p->arrived[first]) first = lr;
        if (p->arrived[lr] > p->arrived[last]) last = lr;
    }
    for (int lr = 0; lr < p->local_size; lr++)
        atomic_store_explicit(&p->late_ns[lr],
                              atomic_load_explicit(&p->late_ns[lr], memory_order_relaxed) +
                                  (p->arrived[lr] - p->arrived[first]),
                              memory_order_relaxed);
    int64_t skew = p->arrived[last] - p->arrived[first];
    uint64_t n = atomic_load_explicit(&p->ops, memory_order_relaxed);
    atomic_store_explicit(&p->skews[n % SKEWS], skew, memory_order_relaxed);
    atomic_store_explicit(&p->skew_sum, atomic_load_explicit(&p->skew_sum, memory_order_relaxed) + skew,
                          memory_order_relaxed);
    if (skew > atomic_load_explicit(&p->skew_max, memory_order_relaxed))
        atomic_store_explicit(&p->skew_max, skew, memory_order_relaxed);
    atomic_store_explicit(&p->ops, n + 1, memory_order_release);
    warn_straggler(comm, p, seq, last, skew);
    return 1;
}

/* Compares the pending ops, oldest first, up to one a rank has not reached yet (exec_lock held). */
static void compare_pending(smddp_comm_t comm, smddp__progress_t *p)
{
    while (p->count) {
        if (compare(comm, p, p->pending[p->head]) == 0) return;
        p->head = (p->head + 1) % PENDING;
        p->count--;
    }
}

void smddp__progress_after_op(smddp_comm_t comm, const smddp__op_t *op, smddp_status_t st)
{
    smddp__progress_t *p = comm->progress;
    if (!p || (p->local_size < 2 && !p->nodes)) return;
    if (p->count == PENDING) { /* the oldest waits for a rank this far behind: give it up */
        p->head = (p->head + 1) % PENDING;
        p->count--;
    }
    p->pending[(p->head + p->count) % PENDING] = op->seq;
    p->last_seq = op->seq;
    p->last_kind = op->kind;
    if (++p->count >= BATCH || st < 0) compare_pending(comm, p);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void smddp__progress_stats(smddp_comm_t comm, smddp_comm_stats_t *out, int64_t *late_ns, int n)
{
    smddp__progress_t *p = comm->progress;
    /* An idle communicator's ops are compared now; a busy one's at its next batch. */
    if (p && p->count && pthread_mutex_trylock(&comm->exec_lock) == 0) {
        compare_pending(comm, p);
        pthread_mutex_unlock(&comm->exec_lock);
    }
    if (p && smddp__nodes_stats(p->nodes, out, late_ns, n)) return;
    for (int r = 0; r < n; r++) late_ns[r] = -1;
    out->slowest_rank = -1;
    out->ranks_covered = p ? p->local_size : 0;
    if (!p) return;
    uint64_t ops = atomic_load_explicit(&p->ops, memory_order_acquire);
    out->ops = ops;
    int64_t worst = -1;
    for (int lr = 0; lr < p->local_size; lr++) {
        int64_t late = atomic_load_explicit(&p->late_ns[lr], memory_order_relaxed);
        int r = comm->local_ranks[lr];
        if (r < n) late_ns[r] = late;
        if (ops && late > worst) {
            worst = late;
            out->slowest_rank = r;
        }
    }
    size_t kept = ops < SKEWS ? (size_t)ops : SKEWS;
    if (kept) {
        int64_t sorted[SKEWS];
        for (size_t i = 0; i < kept; i++)
            sorted[i] = atomic_load_explicit(&p->skews[i], memory_order_relaxed);
        qsort(sorted, kept, sizeof(sorted[0]), cmp_i64);
        out->skew_p50_ns = sorted[(kept - 1) / 2];
        out->skew_p99_ns = sorted[(size_t)((double)(kept - 1) * 0.99 + 0.5)];
        out->skew_max_ns = atomic_load_explicit(&p->skew_max, memory_order_relaxed);
        out->skew_sum_ns = atomic_load_explicit(&p->skew_sum, memory_order_relaxed);
    }
    out->clock_error_ns = 0;
}

static void progress_json(smddp_comm_t comm, char *buf, size_t cap)
{
    if (!cap) return;
    buf[0] = '\0';
    smddp_comm_stats_t st = {.struct_size = sizeof(st)};
    int64_t *late = calloc((size_t)comm->size, sizeof(int64_t));
    if (!late) return;
    smddp__progress_stats(comm, &st, late, comm->size);
    size_t len = (size_t)snprintf(buf, cap, " \"arrivals\": {\"ops\": %llu, \"late_ns\": [",
                                  (unsigned long long)st.ops);
    for (int r = 0; r < comm->size && len < cap; r++) {
        if (late[r] >= 0)
            len += (size_t)snprintf(buf + len, cap - len, "%s%lld", r ? ", " : "", (long long)late[r]);
        else
            len += (size_t)snprintf(buf + len, cap - len, "%snull", r ? ", " : "");
    }
    if (len < cap)
        len += (size_t)snprintf(buf + len, cap - len,
                                "], \"skew_ns\": {\"p50\": %lld, \"p99\": %lld, \"max\": %lld}, "
                                "\"clock_error_ns\": %lld},\n \"positions\": [",
                                (long long)st.skew_p50_ns, (long long)st.skew_p99_ns,
                                (long long)st.skew_max_ns, (long long)st.clock_error_ns);
    /* Where this node's ranks stand, as seq numbers (-1: none): running, finished, failed. */
    for (int lr = 0; comm->shm && lr < comm->local_size && len < cap; lr++) {
        smddp__shm_position_t at;
        smddp__shm_position(comm, lr, &at);
        len += (size_t)snprintf(buf + len, cap - len,
                                "%s{\"rank\": %d, \"running\": %lld, \"finished\": %lld, "
                                "\"failed\": %lld, \"state\": \"%s\"}",
                                lr ? ", " : "", comm->local_ranks[lr],
                                (long long)at.running - 1, (long long)at.finished - 1,
                                (long long)at.failed - 1,
                                at.state == 1 ? "gone" : at.state == 2 ? "left" : "alive");
    }
    if (len < cap) len += (size_t)snprintf(buf + len, cap - len, "]");
    if (len >= cap) buf[0] = '\0';
    free(late);
}

char *smddp__progress_json_new(smddp_comm_t comm)
{
    size_t cap = 512 + (size_t)comm->size * 24 + (size_t)comm->local_size * 128;
    char *buf = malloc(cap);
    if (buf) progress_json(comm, buf, cap);
    return buf;
}

/* Appends "0-2,5" for the sorted ranks. */
static void append_ranks(char *buf, size_t cap, size_t *len, const int *ranks, int n)
{
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
        if (*len < cap) {
            if (j > i + 1)
                *len += (size_t)snprintf(buf + *len, cap - *len, "%s%d-%d", i ? "," : "",
                                         ranks[i], ranks[j]);
            else if (j == i + 1)
                *len += (size_t)snprintf(buf + *len, cap - *len, "%s%d,%d", i ? "," : "",
                                         ranks[i], ranks[j]);
            else
                *len += (size_t)snprintf(buf + *len, cap - *len, "%s%d", i ? "," : "", ranks[i]);
        }
        i = j + 1;
    }
}

/* A rank's position, from its node's shared memory or from the store. */
typedef struct position {
    bool known;
    smddp__shm_position_t at;
    char kind[24]; /* the op it runs, when that is not the failed one and is known */
} position_t;

/* What a rank is doing, relative to seq (the op that failed here). */
static void describe(const position_t *p, uint64_t seq, char *out, size_t cap)
{
    const smddp__shm_position_t *pos = &p->at;
    size_t len = 0;
    if (pos->running == seq + 1 || (!pos->running && pos->failed == seq + 1)) {
        len = (size_t)snprintf(out, cap, "in seq %llu", (unsigned long long)seq);
    } else if (pos->running) {
        len = (size_t)snprintf(out, cap, "in seq %llu", (unsigned long long)(pos->running - 1));
        if (p->kind[0] && len < cap) len += (size_t)snprintf(out + len, cap - len, " (%s)", p->kind);
    } else if (pos->failed) {
        len = (size_t)snprintf(out, cap, "failed in seq %llu",
                               (unsigned long long)(pos->failed - 1));
    } else if (pos->finished > seq) {
        len = (size_t)snprintf(out, cap, "finished seq %llu",
                               (unsigned long long)(pos->finished - 1));
    } else if (pos->finished) {
        len = (size_t)snprintf(out, cap, "finished seq %llu and has not started seq %llu",
                               (unsigned long long)(pos->finished - 1), (unsigned long long)seq);
    } else {
        len = (size_t)snprintf(out, cap, "has not started seq %llu (nor any before)",
                               (unsigned long long)seq);
    }
    if (len < cap && pos->state)
        snprintf(out + len, cap - len, pos->state == 1 ? " (process gone)"
                                                       : " (destroyed its communicator)");
}

static void local_positions(smddp_comm_t comm, position_t *pos)
{
    for (int lr = 0; lr < comm->local_size; lr++) {
        position_t *p = &pos[comm->local_ranks[lr]];
        p->known = true;
        smddp__shm_position(comm, lr, &p->at);
        smddp__op_desc_t theirs;
        if (p->at.running && smddp__shm_read_desc(comm, lr, p->at.running - 1, &theirs))
            snprintf(p->kind, sizeof(p->kind), "%s",
                     smddp__op_kind_name((smddp__op_kind_t)(theirs.kind & 0xffff)));
    }
}

/*
 * Across nodes, through the store: the first ranks of each node to fail
 * publish their node's positions as "<prefix>/where/<node>/<n>" (n counting
 * from 1); a rank reads "<prefix>/where/<node>/1" of every other node,
 * waiting REMOTE_WAIT_MS in all: the ranks of other nodes fail within a
 * poll of the store once this one has published the abort.
 */
#define REMOTE_WAIT_MS 1500

static void publish_node(smddp_comm_t comm, const position_t *pos)
{
    char key[384], view[64 * 128];
    size_t len = 0;
    for (int lr = 0; lr < comm->local_size && len < sizeof(view); lr++) {
        int r = comm->local_ranks[lr];
        const smddp__shm_position_t *a = &pos[r].at;
        len += (size_t)snprintf(view + len, sizeof(view) - len, "%d %llu %llu %llu %d %s\n", r,
                                (unsigned long long)a->running, (unsigned long long)a->finished,
                                (unsigned long long)a->failed, a->state,
                                pos[r].kind[0] ? pos[r].kind : "-");
    }
    if (len >= sizeof(view)) return;
    int64_t n = 0;
    snprintf(key, sizeof(key), "%s/where/%d/count", comm->prefix, comm->node);
    if (smddp__store_add(comm->store, key, 1, &n) != SMDDP_OK) return;
    snprintf(key, sizeof(key), "%s/where/%d/%lld", comm->prefix, comm->node, (long long)n);
    (void)smddp__store_set(comm->store, key, view, len + 1);
}

static void read_node(smddp_comm_t comm, int node, int64_t deadline_ns, position_t *pos)
{
    char key[384];
    int64_t left_ms = (deadline_ns - smddp__now_ns()) / 1000000;
    if (left_ms < 1) left_ms = 1;
    snprintf(key, sizeof(key), "%s/where/%d/1", comm->prefix, node);
    void *v = NULL;
    size_t len = 0;
    if (smddp__store_get(comm->store, key, left_ms, &v, &len) != SMDDP_OK) return;
    char *text = v;
    if (len == 0 || text[len - 1] != '\0') {
        free(v);
        return;
    }
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        if (!end) break;
        *end = '\0';
        int r, state;
        unsigned long long running, finished, failed;
        char kind[24];
        if (sscanf(line, "%d %llu %llu %llu %d %23s", &r, &running, &finished, &failed, &state,
                   kind) == 6 &&
            r >= 0 && r < comm->size && comm->node_of[r] == node) {
            position_t *p = &pos[r];
            p->known = true;
            p->at = (smddp__shm_position_t){running, finished, failed, state};
            snprintf(p->kind, sizeof(p->kind), "%s", strcmp(kind, "-") ? kind : "");
        }
        line = end + 1;
    }
    free(v);
}

void smddp__progress_add_where(smddp_comm_t comm, const smddp__op_t *op, smddp_status_t st)
{
    if (st != SMDDP_ERR_TIMEOUT && st != SMDDP_ERR_PEER_LOST && st != SMDDP_ERR_MISMATCH &&
        st != SMDDP_ERR_ABORTED)
        return;
    smddp__progress_t *p = comm->progress;
    char msg[SMDDP_ERRMSG_MAX], where[SMDDP_ERRMSG_MAX / 2];
    snprintf(msg, sizeof(msg), "%s", smddp__last_error());
    if (strstr(msg, "where the ranks are:")) return; /* a peer's message that says it already */
    /* Once per rank: the ops failing after the first report the abort, and wait for nothing. */
    if (!p || atomic_exchange(&p->where_said, true)) return;
    smddp__progress_where(comm, op, where, sizeof(where));
    if (where[0]) smddp__error_quiet(st, "%s; %s", msg, where);
}

void smddp__progress_where(smddp_comm_t comm, const smddp__op_t *op, char *buf, size_t cap)
{
    if (!cap) return;
    buf[0] = '\0';
    if (!comm->shm) return;
    int size = comm->size;
    position_t *pos = calloc((size_t)size, sizeof(*pos));
    char (*what)[128] = calloc((size_t)size, sizeof(*what));
    int *ranks = calloc((size_t)size, sizeof(int));
    bool *said = calloc((size_t)size, sizeof(bool));
    if (!pos || !what || !ranks || !said) goto out;
    local_positions(comm, pos);
    /* An application that aborts wants its ops back at once: no wait for other nodes. */
    bool ask = comm->node_count > 1 && !atomic_load(&comm->aborted_by_app);
    if (ask) {
        /* Store errors on this path must not replace the failure being reported. */
        char saved[SMDDP_ERRMSG_MAX];
        snprintf(saved, sizeof(saved), "%s", smddp__last_error());
        publish_node(comm, pos);
        int64_t deadline = smddp__now_ns() + REMOTE_WAIT_MS * 1000000LL;
        for (int node = 0; node < comm->node_count; node++)
            if (node != comm->node) read_node(comm, node, deadline, pos);
        smddp__clear_error();
        if (saved[0]) smddp__error_quiet(SMDDP_ERR_INTERNAL, "%s", saved);
    }
    for (int r = 0; r < size; r++) {
        if (pos[r].known) describe(&pos[r], op->seq, what[r], sizeof(what[r]));
        else if (ask) snprintf(what[r], sizeof(what[r]), "not known (no rank of its node "
                                                        "answered within %.1f s)",
                               REMOTE_WAIT_MS / 1000.0);
        else snprintf(what[r], sizeof(what[r]), "on another node, not asked (this rank's "
                                                "application aborted)");
    }
    size_t len = (size_t)snprintf(buf, cap, "where the ranks are:");
    const char *sep = " ";
    for (int r = 0; r < size; r++) {
        if (said[r]) continue;
        int n = 0;
        for (int k = r; k < size; k++) {
            if (said[k] || strcmp(what[k], what[r]) != 0) continue;
            said[k] = true;
            ranks[n++] = k;
        }
        if (len < cap)
            len += (size_t)snprintf(buf + len, cap - len, "%s%s ", sep, n > 1 ? "ranks" : "rank");
        append_ranks(buf, cap, &len, ranks, n);
        if (len < cap) len += (size_t)snprintf(buf + len, cap - len, ": %s", what[r]);
        sep = "; ";
    }
out:
    free(pos);
    free(what);
    free(ranks);
    free(said);
}
