/*
 * Straggler telemetry across nodes; see progress_nodes.h.
 *
 * Store keys, all under <prefix>/nodes/ and bounded in number:
 *   clk/<node>/q, a, a<i>              the clock ping-pongs (ROUNDS per node)
 *   clk/<node>/total, totals           its clock's offset to the reference
 *   arr/<node>/<b % WINDOW>            batch b of a node's arrivals
 *   arrs/<node>                        how many batches the node published
 *   sum, sums                          the reference node's summary, and
 *                                      how many it published
 * A batch and the summary are arrays of int64: see take_batch and
 * publish_summary. A batch overwritten before the reference node read it
 * is skipped (its ops are then not compared). Readers learn what exists from
 * the counters (an add of 0) and get only keys that do, since a store get
 * that times out is not free (torch's TCPStore logs a warning for each).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "param.h"
#include "progress_nodes.h"

#define TICK_MS 100
#define NODES_PER_TICK 8   /* a tick of TICK_MS per this many nodes: the store's load stays flat */
#define WINDOW 16
#define RING 8192          /* records between the op thread and the node's thread */
#define BATCH_MAX 4096     /* records per published batch */
#define QUEUE_MAX 16384    /* records the reference node holds per node, not merged yet */
#define ROUNDS 8           /* clock ping-pongs per node */
#define FIRST_WAIT_MS 60000 /* for the reference node to answer a node's first ping */
#define ROUND_WAIT_MS 5000
#define SKEWS 1024
#define STATS_EVERY_NS (50 * 1000000LL)
#define WARN_EVERY_NS (60 * 1000000000LL)
#define MAGIC_BATCH 0x736d646470626174LL /* "smddpbat" */
#define MAGIC_SUM 0x736d646470737566LL   /* "smddpsuf" */
#define SUM_HEAD 9

int64_t smddp__nodes_clock_shift_ns;

/* A node's arrivals not merged yet, on the reference node: records of 1 + n_local int64. */
typedef struct node_queue {
    int n_local;
    int *ranks;          /* comm rank of each of its local ranks (from its batches) */
    int64_t *rec;
    size_t head, count;  /* in records */
    uint64_t next_batch;
    int64_t err_ns;      /* its clock offset's error bound */
} node_queue_t;

struct smddp__nodes {
    smddp_comm_t comm;
    bool leader;         /* first local rank: runs the thread */
    bool reference;      /* ... of the reference node: merges */
    int ref_node;
    int stride;          /* 1 + local_size */

    /* The op thread's records (seq, arrivals), single producer, single consumer. */
    int64_t *ring;
    _Atomic uint64_t head, tail;

    pthread_t thread;
    bool started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;

    bool offset_known;
    int64_t offset_ns, err_ns;
    uint64_t batch;
    int64_t *out;        /* a batch being published */

    /* The reference node: merging. */
    node_queue_t *q;
    int64_t *t;          /* one op's arrivals, per comm rank */
    int64_t *late;
    uint64_t ops, published_ops;
    int64_t skews[SKEWS], skew_max, skew_sum;
    int64_t last_warn_ns;

    /* Readers of the summary. */
    pthread_mutex_t cache_lock;
    int64_t cache_at_ns;
    int64_t *cache;      /* SUM_HEAD + size, cache[0] == 0 while none */
};

static int64_t now_told(void)
{
    return smddp__now_ns() + smddp__nodes_clock_shift_ns;
}

static bool stopping(smddp__nodes_t *n)
{
    pthread_mutex_lock(&n->lock);
    bool s = n->stop;
    pthread_mutex_unlock(&n->lock);
    return s;
}

/* Sleeps ms unless stopped meanwhile; false once stopped. */
static bool pause_ms(smddp__nodes_t *n, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&n->lock);
    while (!n->stop && pthread_cond_timedwait(&n->cond, &n->lock, &ts) == 0) {
    }
    bool go_on = !n->stop;
    pthread_mutex_unlock(&n->lock);
    return go_on;
}

/*
 * Waits until counter key reaches at least want (an add of 0, which never
 * waits in the store), polling at once for 200 us, then every 100 us up to
 * 5 ms, every ms up to a second, then every 10 ms; false after ms, once
 * stopped, or on a store error.
 */
static bool await_count(smddp__nodes_t *n, const char *key, int64_t want, int64_t ms)
{
    int64_t start = smddp__now_ns();
    for (;;) {
        int64_t got = 0;
        if (smddp__store_add(n->comm->store, key, 0, &got) != SMDDP_OK) return false;
        if (got >= want) return true;
        int64_t waited = smddp__now_ns() - start;
        if (waited > ms * 1000000LL || stopping(n)) return false;
        if (waited > 200000LL) {
            struct timespec ts = {0, waited > 1000000000LL ? 10000000L
                                     : waited > 5000000LL  ? 1000000L
                                                           : 100000L};
            nanosleep(&ts, NULL);
        }
    }
}

/* ---- clock offsets ----------------------------------------------------------------- */

/*
 * Clocks are compared along a tree of nodes, so that no node answers more
 * than CLOCK_FANOUT others however many nodes there are: the nodes, counted
 * from the reference, in heap order; node at position i asks the node at
 * (i - 1) / CLOCK_FANOUT, and adds that node's offset to the reference
 * (clk/<node>/total, once it knows it) to its own, the error bounds adding
 * up with it. The ping-pongs of node k: its first rank counts its questions
 * in clk/<k>/q; the node it asks reads its clock once it sees question i,
 * writes the time in clk/<k>/a<i> and counts its answers in clk/<k>/a.
 */
#define CLOCK_FANOUT 4

static void clock_key(smddp__nodes_t *n, int node, const char *what, char *key, size_t cap)
{
    snprintf(key, cap, "%s/nodes/clk/%d/%s", n->comm->prefix, node, what);
}

/* Position of node in the tree (the reference's is 0), and back. */
static int clock_pos(smddp__nodes_t *n, int node)
{
    int count = n->comm->node_count;
    return (node - n->ref_node + count) % count;
}

static int clock_node(smddp__nodes_t *n, int pos)
{
    return (pos + n->ref_node) % n->comm->node_count;
}

/* Answers the ping-pongs of the nodes that ask this one. */
static void serve_clocks(smddp__nodes_t *n)
{
    smddp_comm_t comm = n->comm;
    char key[512], name[16];
    int first = clock_pos(n, comm->node) * CLOCK_FANOUT + 1;
    for (int pos = first; pos < first + CLOCK_FANOUT && pos < comm->node_count; pos++) {
        int node = clock_node(n, pos);
        for (int i = 0; i < ROUNDS; i++) {
            clock_key(n, node, "q", key, sizeof(key));
            if (!await_count(n, key, i + 1, i ? ROUND_WAIT_MS : FIRST_WAIT_MS)) {
                if (stopping(n)) return;
                SMDDP_INFO("%s: node %d did not ask for the time; its arrivals are not compared",
                           comm->prefix, node);
                break;
            }
            int64_t t1 = now_told(), count;
            snprintf(name, sizeof(name), "a%d", i);
            clock_key(n, node, name, key, sizeof(key));
            if (smddp__store_set(comm->store, key, &t1, sizeof(t1)) != SMDDP_OK) return;
            clock_key(n, node, "a", key, sizeof(key));
            if (smddp__store_add(comm->store, key, 1, &count) != SMDDP_OK) return;
        }
    }
}

/*
 * This node's offset to the node it asks: offset = its clock - this clock,
 * from the round with the shortest trip: it read its clock (t1) between t0
 * and t2, so the offset is within (t2 - t0) / 2 of t1 - (t0 + t2) / 2.
 */
static bool ping(smddp__nodes_t *n, int64_t *offset, int64_t *err)
{
    smddp_comm_t comm = n->comm;
    char key[512], name[16];
    int64_t best = -1;
    for (int i = 0; i < ROUNDS; i++) {
        int64_t t0 = now_told(), count;
        clock_key(n, comm->node, "q", key, sizeof(key));
        if (smddp__store_add(comm->store, key, 1, &count) != SMDDP_OK) return false;
        clock_key(n, comm->node, "a", key, sizeof(key));
        if (!await_count(n, key, i + 1, i ? ROUND_WAIT_MS : FIRST_WAIT_MS)) return false;
        int64_t t2 = now_told(), t1 = 0;
        snprintf(name, sizeof(name), "a%d", i);
        clock_key(n, comm->node, name, key, sizeof(key));
        void *v = NULL;
        size_t len = 0;
        if (smddp__store_get(comm->store, key, 1000, &v, &len) != SMDDP_OK) return false;
        if (len == sizeof(t1)) memcpy(&t1, v, sizeof(t1));
        free(v);
        if (len != sizeof(t1)) return false;
        int64_t half = (t2 - t0 + 1) / 2;
        if (best < 0 || half < best) {
            best = half;
            *offset = t1 - (t0 + (t2 - t0) / 2);
        }
    }
    *err = best;
    return true;
}

/*
 * This node's offset to the reference: its own to the node it asks, plus
 * that node's to the reference, published as [known, offset, error] under
 * clk/<node>/total (with clk/<node>/totals counting to 1) for the nodes that
 * ask this one.
 */
static bool estimate_offset(smddp__nodes_t *n)
{
    smddp_comm_t comm = n->comm;
    int pos = clock_pos(n, comm->node);
    int64_t total[3] = {1, 0, 0};
    if (pos > 0) {
        int64_t offset = 0, err = 0;
        bool ok = ping(n, &offset, &err);
        if (ok && pos > CLOCK_FANOUT) { /* the node asked is not the reference */
            char key[512];
            int up = clock_node(n, (pos - 1) / CLOCK_FANOUT);
            void *v = NULL;
            size_t len = 0;
            clock_key(n, up, "totals", key, sizeof(key));
            ok = await_count(n, key, 1, FIRST_WAIT_MS);
            clock_key(n, up, "total", key, sizeof(key));
            ok = ok && smddp__store_get(comm->store, key, 1000, &v, &len) == SMDDP_OK;
            int64_t theirs[3] = {0, 0, 0};
            if (ok && len == sizeof(theirs)) memcpy(theirs, v, sizeof(theirs));
            free(v);
            ok = ok && theirs[0] == 1;
            offset += theirs[1];
            err += theirs[2];
        }
        total[0] = ok;
        total[1] = offset;
        total[2] = err;
    }
    n->offset_ns = total[1];
    n->err_ns = total[2];
    if (pos * CLOCK_FANOUT + 1 < comm->node_count) { /* nodes ask this one */
        char key[512];
        int64_t count;
        clock_key(n, comm->node, "total", key, sizeof(key));
        if (smddp__store_set(comm->store, key, total, sizeof(total)) == SMDDP_OK) {
            clock_key(n, comm->node, "totals", key, sizeof(key));
            (void)smddp__store_add(comm->store, key, 1, &count);
        }
    }
    return total[0] == 1;
}

/* ---- the node's batches -------------------------------------------------------------- */

/*
 * Publishes what the op thread pushed since the last batch (BATCH_MAX at
 * most), on the reference clock: [MAGIC_BATCH, batch, n_local, err_ns,
 * count, ranks[n_local], count x (seq, arrivals[n_local])]. The reference
 * node keeps its own instead (append).
 */
static void take_batch(smddp__nodes_t *n, void (*append)(smddp__nodes_t *, int, const int64_t *,
                                                         size_t, const int *, int, int64_t))
{
    smddp_comm_t comm = n->comm;
    uint64_t tail = atomic_load_explicit(&n->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&n->head, memory_order_acquire);
    size_t count = (size_t)SMDDP_MIN(head - tail, (uint64_t)BATCH_MAX);
    if (!count) return;
    int ls = comm->local_size, hdr = 5 + ls;
    int64_t *out = n->out;
    out[0] = MAGIC_BATCH;
    out[1] = (int64_t)n->batch;
    out[2] = ls;
    out[3] = n->err_ns;
    out[4] = (int64_t)count;
    for (int lr = 0; lr < ls; lr++) out[5 + lr] = comm->local_ranks[lr];
    int64_t shift = n->offset_ns + smddp__nodes_clock_shift_ns;
    for (size_t i = 0; i < count; i++) {
        const int64_t *rec = &n->ring[((tail + i) % RING) * (size_t)n->stride];
        int64_t *dst = &out[hdr + i * (size_t)n->stride];
        dst[0] = rec[0];
        for (int lr = 0; lr < ls; lr++) dst[1 + lr] = rec[1 + lr] + shift;
    }
    atomic_store_explicit(&n->tail, tail + count, memory_order_release);
    if (append) {
        append(n, comm->node, &out[hdr], count, comm->local_ranks, ls, n->err_ns);
        n->batch++;
    } else {
        char key[512];
        snprintf(key, sizeof(key), "%s/nodes/arr/%d/%llu", comm->prefix, comm->node,
                 (unsigned long long)(n->batch % WINDOW));
        int64_t published;
        if (smddp__store_set(comm->store, key, out,
                             (size_t)(hdr + count * (size_t)n->stride) * sizeof(int64_t)) ==
            SMDDP_OK) {
            /* The count names the next slot: counted only once set (else lost). */
            snprintf(key, sizeof(key), "%s/nodes/arrs/%d", comm->prefix, comm->node);
            if (smddp__store_add(comm->store, key, 1, &published) == SMDDP_OK)
                n->batch = (uint64_t)published;
        }
    }
}

/* ---- merging, on the reference node ---------------------------------------------- */

static void append_records(smddp__nodes_t *n, int node, const int64_t *rec, size_t count,
                           const int *ranks, int n_local, int64_t err_ns)
{
    node_queue_t *q = &n->q[node];
    if (!q->ranks) {
        q->ranks = malloc((size_t)n_local * sizeof(int));
        q->rec = malloc((size_t)QUEUE_MAX * (size_t)(1 + n_local) * sizeof(int64_t));
        if (!q->ranks || !q->rec) {
            free(q->ranks);
            free(q->rec);
            q->ranks = NULL;
            q->rec = NULL;
            return;
        }
        q->n_local = n_local;
        memcpy(q->ranks, ranks, (size_t)n_local * sizeof(int));
    }
    if (n_local != q->n_local) return;
    q->err_ns = err_ns;
    size_t stride = (size_t)(1 + n_local);
    for (size_t i = 0; i < count; i++) {
        if (q->count == QUEUE_MAX) { /* another node is far behind: drop the oldest */
            q->head = (q->head + 1) % QUEUE_MAX;
            q->count--;
        }
        memcpy(&q->rec[((q->head + q->count) % QUEUE_MAX) * stride], &rec[i * stride],
               stride * sizeof(int64_t));
        q->count++;
    }
}

static const int64_t *queue_front(const node_queue_t *q)
{
    return &q->rec[q->head * (size_t)(1 + q->n_local)];
}

static void queue_pop(node_queue_t *q)
{
    q->head = (q->head + 1) % QUEUE_MAX;
    q->count--;
}

/* Reads the batches other nodes published since the last look. */
static void read_batches(smddp__nodes_t *n)
{
    smddp_comm_t comm = n->comm;
    char key[512];
    for (int node = 0; node < comm->node_count; node++) {
        if (node == n->ref_node) continue;
        node_queue_t *q = &n->q[node];
        int64_t published = 0;
        snprintf(key, sizeof(key), "%s/nodes/arrs/%d", comm->prefix, node);
        if (smddp__store_add(comm->store, key, 0, &published) != SMDDP_OK) continue;
        if (published - (int64_t)q->next_batch > WINDOW) /* overwritten: skip them */
            q->next_batch = (uint64_t)(published - WINDOW);
        while ((int64_t)q->next_batch < published) {
            snprintf(key, sizeof(key), "%s/nodes/arr/%d/%llu", comm->prefix, node,
                     (unsigned long long)(q->next_batch % WINDOW));
            void *v = NULL;
            size_t len = 0;
            if (smddp__store_get(comm->store, key, 1000, &v, &len) != SMDDP_OK) break;
            const int64_t *b = v;
            size_t words = len / sizeof(int64_t);
            bool fresh = words >= 5 && b[0] == MAGIC_BATCH && b[1] >= (int64_t)q->next_batch &&
                         b[2] > 0 && b[4] >= 0 &&
                         words == (size_t)(5 + b[2]) + (size_t)b[4] * (size_t)(1 + b[2]);
            if (fresh) {
                int n_local = (int)b[2];
                int *ranks = malloc((size_t)n_local * sizeof(int));
                bool ok = ranks != NULL;
                for (int lr = 0; ok && lr < n_local; lr++) {
                    ok = b[5 + lr] >= 0 && b[5 + lr] < comm->size;
                    if (ok) ranks[lr] = (int)b[5 + lr];
                }
                if (ok)
                    append_records(n, node, &b[5 + n_local], (size_t)b[4], ranks, n_local, b[3]);
                free(ranks);
                q->next_batch = (uint64_t)b[1] + 1; /* one overwritten meanwhile is skipped */
            } else {
                q->next_batch++; /* not a batch of this node's: skip it */
            }
            free(v);
        }
    }
}

static void warn_straggler(smddp__nodes_t *n, uint64_t seq, int last, int64_t skew_ns)
{
    int warn_ms = smddp__params()->straggler_warn_ms;
    if (warn_ms <= 0 || skew_ns <= (int64_t)warn_ms * 1000000LL) return;
    int64_t now = smddp__now_ns();
    if (n->last_warn_ns && now - n->last_warn_ns < WARN_EVERY_NS) return;
    n->last_warn_ns = now;
    SMDDP_WARN("%s: rank %d arrived %.1f ms after the first rank of any node at seq %llu and "
               "kept the others waiting (SMDDP_STRAGGLER_WARN_MS=%d); its lateness so far: "
               "%.3f s over %llu collectives compared across nodes (at most one such warning "
               "a minute)", n->comm->prefix, last, (double)skew_ns / 1e6,
               (unsigned long long)seq, warn_ms, (double)n->late[last] / 1e9,
               (unsigned long long)n->ops);
}

/* Compares every op that every node has published, oldest first. */
static void merge(smddp__nodes_t *n)
{
    smddp_comm_t comm = n->comm;
    for (;;) {
        int64_t seq = -1;
        for (int node = 0; node < comm->node_count; node++) {
            node_queue_t *q = &n->q[node];
            if (!q->count) return; /* a node has not published this far yet */
            int64_t s = queue_front(q)[0];
            if (seq < 0 || s < seq) seq = s;
        }
        bool everywhere = true;
        for (int node = 0; node < comm->node_count; node++)
            if (queue_front(&n->q[node])[0] != seq) everywhere = false;
        if (!everywhere) { /* dropped somewhere: not comparable */
            for (int node = 0; node < comm->node_count; node++)
                if (queue_front(&n->q[node])[0] == seq) queue_pop(&n->q[node]);
            continue;
        }
        int first = -1, last = -1;
        for (int node = 0; node < comm->node_count; node++) {
            node_queue_t *q = &n->q[node];
            const int64_t *rec = queue_front(q);
            for (int lr = 0; lr < q->n_local; lr++) {
                int r = q->ranks[lr];
                n->t[r] = rec[1 + lr];
                if (first < 0 || n->t[r] < n->t[first]) first = r;
                if (last < 0 || n->t[r] > n->t[last]) last = r;
            }
            queue_pop(q);
        }
        for (int node = 0; node < comm->node_count; node++) {
            node_queue_t *q = &n->q[node];
            for (int lr = 0; lr < q->n_local; lr++) {
                int r = q->ranks[lr];
                n->late[r] += n->t[r] - n->t[first];
            }
        }
        int64_t skew = n->t[last] - n->t[first];
        n->skews[n->ops % SKEWS] = skew;
        n->skew_sum += skew;
        if (skew > n->skew_max) n->skew_max = skew;
        n->ops++;
        warn_straggler(n, (uint64_t)seq, last, skew);
    }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/*
 * [MAGIC_SUM, ops, clock_error_ns, skew p50, p99, max, sum, slowest rank,
 * size, late_ns[size]].
 */
static void publish_summary(smddp__nodes_t *n)
{
    smddp_comm_t comm = n->comm;
    if (n->ops == n->published_ops) return;
    size_t words = SUM_HEAD + (size_t)comm->size;
    int64_t *s = calloc(words, sizeof(int64_t));
    if (!s) return;
    int64_t err = 0;
    for (int node = 0; node < comm->node_count; node++) err = SMDDP_MAX(err, n->q[node].err_ns);
    size_t kept = n->ops < SKEWS ? (size_t)n->ops : SKEWS;
    int64_t sorted[SKEWS];
    memcpy(sorted, n->skews, kept * sizeof(int64_t));
    qsort(sorted, kept, sizeof(sorted[0]), cmp_i64);
    int slowest = 0;
    for (int r = 1; r < comm->size; r++)
        if (n->late[r] > n->late[slowest]) slowest = r;
    s[0] = MAGIC_SUM;
    s[1] = (int64_t)n->ops;
    s[2] = err;
    s[3] = sorted[(kept - 1) / 2];
    s[4] = sorted[(size_t)((double)(kept - 1) * 0.99 + 0.5)];
    s[5] = n->skew_max;
    s[6] = n->skew_sum;
    s[7] = slowest;
    s[8] = comm->size;
    memcpy(&s[SUM_HEAD], n->late, (size_t)comm->size * sizeof(int64_t));
    char key[512];
    snprintf(key, sizeof(key), "%s/nodes/sum", comm->prefix);
    int64_t count;
    if (smddp__store_set(comm->store, key, s, words * sizeof(int64_t)) == SMDDP_OK) {
        n->published_ops = n->ops;
        snprintf(key, sizeof(key), "%s/nodes/sums", comm->prefix);
        (void)smddp__store_add(comm->store, key, 1, &count);
    }
    free(s);
}

/* ---- the thread ------------------------------------------------------------------- */

static void *nodes_main(void *arg)
{
    smddp__nodes_t *n = arg;
    smddp__library_thread_begin("straggler telemetry");
    n->offset_known = estimate_offset(n);
    serve_clocks(n);
    if (!n->offset_known && !stopping(n))
        SMDDP_INFO("%s: rank %d could not measure its node's clock offset; this node's "
                   "arrivals are not compared with other nodes'", n->comm->prefix,
                   n->comm->rank);
    if (n->offset_known)
        SMDDP_INFO("%s: node %d's clock is %+.3f ms off the reference node's, within %.3f ms",
                   n->comm->prefix, n->comm->node, (double)n->offset_ns / 1e6,
                   (double)n->err_ns / 1e6);
    /*
     * The reference reads one counter per node each tick, and every other node
     * publishes at least once: ticks lengthen with the nodes, so that the
     * store sees about 80 + 160 calls a second however many there are.
     */
    int tick_ms = TICK_MS * ((n->comm->node_count + NODES_PER_TICK - 1) / NODES_PER_TICK);
    while (pause_ms(n, tick_ms)) {
        if (!n->offset_known) {
            /* Nothing to compare: keep the ring empty. */
            atomic_store(&n->tail, atomic_load(&n->head));
            continue;
        }
        if (n->reference) {
            while (atomic_load(&n->head) != atomic_load(&n->tail)) take_batch(n, append_records);
            read_batches(n);
            merge(n);
            publish_summary(n);
        } else {
            while (atomic_load(&n->head) != atomic_load(&n->tail)) take_batch(n, NULL);
        }
    }
    return NULL;
}

/* ---- life cycle ------------------------------------------------------------------- */

static void nodes_free(smddp__nodes_t *n)
{
    if (n->q)
        for (int node = 0; node < n->comm->node_count; node++) {
            free(n->q[node].ranks);
            free(n->q[node].rec);
        }
    free(n->q);
    free(n->t);
    free(n->late);
    free(n->ring);
    free(n->out);
    free(n->cache);
    pthread_mutex_destroy(&n->lock);
    pthread_cond_destroy(&n->cond);
    pthread_mutex_destroy(&n->cache_lock);
    free(n);
}

smddp__nodes_t *smddp__nodes_start(smddp_comm_t comm)
{
    if (comm->node_count < 2 || !smddp__params()->straggler_nodes) return NULL;
    smddp__nodes_t *n = calloc(1, sizeof(*n));
    if (!n) return NULL;
    n->comm = comm;
    n->ref_node = comm->node_of[0];
    n->leader = comm->local_rank == 0;
    n->reference = n->leader && comm->node == n->ref_node;
    n->stride = 1 + comm->local_size;
    pthread_mutex_init(&n->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&n->cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&n->cache_lock, NULL);
    n->cache = calloc(SUM_HEAD + (size_t)comm->size, sizeof(int64_t));
    bool ok = n->cache != NULL;
    if (ok && n->leader) {
        n->ring = malloc((size_t)RING * (size_t)n->stride * sizeof(int64_t));
        n->out = malloc(((size_t)(5 + comm->local_size) + (size_t)BATCH_MAX * (size_t)n->stride) *
                        sizeof(int64_t));
        ok = n->ring && n->out;
    }
    if (ok && n->reference) {
        n->q = calloc((size_t)comm->node_count, sizeof(*n->q));
        n->t = calloc((size_t)comm->size, sizeof(int64_t));
        n->late = calloc((size_t)comm->size, sizeof(int64_t));
        ok = n->q && n->t && n->late;
    }
    if (ok && n->leader) {
        ok = pthread_create(&n->thread, NULL, nodes_main, n) == 0;
        n->started = ok;
        if (ok) atomic_fetch_add(&comm->threads, 1);
    }
    if (!ok) {
        SMDDP_INFO("%s: no straggler telemetry across nodes (out of memory or threads)",
                   comm->prefix);
        nodes_free(n);
        return NULL;
    }
    return n;
}

void smddp__nodes_stop(smddp__nodes_t *n)
{
    if (!n) return;
    if (n->started) {
        pthread_mutex_lock(&n->lock);
        n->stop = true;
        pthread_cond_broadcast(&n->cond);
        pthread_mutex_unlock(&n->lock);
        pthread_join(n->thread, NULL);
    }
    nodes_free(n);
}

void smddp__nodes_push(smddp__nodes_t *n, uint64_t seq, const int64_t *arrived_ns)
{
    if (!n || !n->ring) return;
    uint64_t head = atomic_load_explicit(&n->head, memory_order_relaxed);
    if (head - atomic_load_explicit(&n->tail, memory_order_acquire) >= RING) return; /* full */
    int64_t *rec = &n->ring[(head % RING) * (size_t)n->stride];
    rec[0] = (int64_t)seq;
    memcpy(&rec[1], arrived_ns, (size_t)(n->stride - 1) * sizeof(int64_t));
    atomic_store_explicit(&n->head, head + 1, memory_order_release);
}

bool smddp__nodes_stats(smddp__nodes_t *n, smddp_comm_stats_t *out, int64_t *late_ns, int count)
{
    if (!n) return false;
    smddp_comm_t comm = n->comm;
    size_t words = SUM_HEAD + (size_t)comm->size;
    pthread_mutex_lock(&n->cache_lock);
    int64_t now = smddp__now_ns();
    if (!n->cache_at_ns || now - n->cache_at_ns >= STATS_EVERY_NS) {
        n->cache_at_ns = now;
        char key[512];
        snprintf(key, sizeof(key), "%s/nodes/sum", comm->prefix);
        void *v = NULL;
        size_t len = 0;
        int64_t published = 0;
        char count_key[512];
        snprintf(count_key, sizeof(count_key), "%s/nodes/sums", comm->prefix);
        if (smddp__store_add(comm->store, count_key, 0, &published) == SMDDP_OK && published > 0 &&
            smddp__store_get(comm->store, key, 1000, &v, &len) == SMDDP_OK) {
            const int64_t *s = v;
            if (len == words * sizeof(int64_t) && s[0] == MAGIC_SUM && s[8] == comm->size)
                memcpy(n->cache, s, len);
            free(v);
        }
        smddp__clear_error();
    }
    bool have = n->cache[0] == MAGIC_SUM;
    if (have) {
        const int64_t *s = n->cache;
        out->ops = (uint64_t)s[1];
        out->clock_error_ns = s[2];
        out->skew_p50_ns = s[3];
        out->skew_p99_ns = s[4];
        out->skew_max_ns = s[5];
        out->skew_sum_ns = s[6];
        out->slowest_rank = (int32_t)s[7];
        out->ranks_covered = comm->size;
        for (int r = 0; r < count; r++) late_ns[r] = r < comm->size ? s[SUM_HEAD + r] : -1;
    }
    pthread_mutex_unlock(&n->cache_lock);
    return have;
}
