/*
 * Soak: long random sequences of mixed operations, several in flight at
 * once, the way a training job issues them. Every rank draws the same
 * sequence from one seed: each operation is a random collective (or a ring
 * of send/recv) with a random dtype, reduction, size (empty, tiny, around the
 * algorithm and staging-round switch points, several rounds), root and
 * in-place choice, on the world communicator or on a half of it split off
 * at the start, issued as a request, as a blocking call, or as a request
 * freed at once whose completion callback is the only news of it. Up to
 * MAX_INFLIGHT run at a time and are finished in random order. Each result
 * is checked element by element against a reference computed here (inputs
 * are small integers, so results are exact), so a lost, reordered, mixed-up
 * or half-written operation fails the test, and a hang fails it by the
 * harness's timeout.
 *
 * TEST_SOAK_SEED and TEST_SOAK_OPS override the seed and the length (for a
 * longer run by hand); a failure prints the seed and the operation.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "values.h"

#define MAX_INFLIGHT 6
#define MAX_RANKS 16
#define DEFAULT_OPS 300
#define DEFAULT_SEED 20261201u

typedef enum kind {
    K_ALLREDUCE,
    K_REDUCE,
    K_BROADCAST,
    K_ALLGATHER,
    K_REDUCE_SCATTER,
    K_ALLTOALL,
    K_ALLTOALLV,
    K_GATHER,
    K_SCATTER,
    K_BARRIER,
    K_SENDRECV,
    K_COUNT
} kind_t;

static const char *const kind_names[K_COUNT] = {
    "allreduce", "reduce",  "broadcast", "allgather", "reduce_scatter", "alltoall",
    "alltoallv", "gather",  "scatter",   "barrier",   "send/recv"};

typedef enum how { ISSUE_REQUEST, ISSUE_BLOCKING, ISSUE_FREED } how_t;

/* xorshift64*: the same stream on every rank. */
typedef struct rng {
    uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *g)
{
    g->s ^= g->s >> 12;
    g->s ^= g->s << 25;
    g->s ^= g->s >> 27;
    return g->s * 2685821657736338717ull;
}

static int64_t below(rng_t *g, int64_t n) { return n <= 0 ? 0 : (int64_t)(rng_next(g) % (uint64_t)n); }

/* One operation of the sequence, the same on every rank. */
typedef struct plan {
    int idx;
    kind_t kind;
    smddp_dtype_t dt;
    smddp_op_t op;
    int64_t n;      /* elements (per block for the kinds with blocks) */
    int root_draw;  /* the root is root_draw % the communicator's size */
    bool inplace;
    bool sub;       /* on this rank's half of the world */
    how_t how;
    int64_t vcnt[MAX_RANKS][MAX_RANKS]; /* alltoallv: what rank s sends to rank d */
} plan_t;

static const smddp_op_t reduce_ops[] = {SMDDP_SUM, SMDDP_PROD, SMDDP_MIN, SMDDP_MAX, SMDDP_AVG,
                                        SMDDP_PREMUL_SUM, SMDDP_BAND, SMDDP_BOR, SMDDP_BXOR};
#define PREMUL 0.5

static int64_t draw_size(rng_t *g)
{
    int64_t r = below(g, 100);
    if (r < 10) return below(g, 3);
    if (r < 40) return 1 + below(g, 300);
    if (r < 75) return 1 + below(g, 20000);
    /* Around a power of two (staging rounds and switch points are powers of two). */
    if (r < 90) return ((int64_t)1 << (8 + below(g, 10))) / 4 + below(g, 3) - 1;
    return 20000 + below(g, 150000);
}

static plan_t draw_plan(rng_t *g, int idx, int world)
{
    plan_t p = {.idx = idx};
    p.kind = (kind_t)below(g, K_COUNT);
    p.sub = below(g, 4) == 0;
    int64_t r = below(g, 10);
    p.how = r < 6 ? ISSUE_REQUEST : r < 8 ? ISSUE_BLOCKING : ISSUE_FREED;
    p.inplace = below(g, 2) == 0;
    p.root_draw = (int)below(g, MAX_RANKS);
    do {
        p.dt = (smddp_dtype_t)below(g, SMDDP_DTYPE_COUNT);
        p.op = reduce_ops[below(g, (int64_t)(sizeof(reduce_ops) / sizeof(reduce_ops[0])))];
    } while (!tv_op_valid(p.dt, p.op));
    p.n = draw_size(g);
    bool blocks = p.kind == K_ALLGATHER || p.kind == K_REDUCE_SCATTER || p.kind == K_ALLTOALL ||
                  p.kind == K_ALLTOALLV || p.kind == K_GATHER || p.kind == K_SCATTER;
    if (blocks) p.n /= world;
    for (int s = 0; s < MAX_RANKS; s++)
        for (int d = 0; d < MAX_RANKS; d++) p.vcnt[s][d] = below(g, 4) == 0 ? 0 : below(g, p.n + 1);
    return p;
}

/*
 * What rank r contributes at element i of operation idx: a small integer
 * from a hash of all three, so a block that lands shifted, at another rank's
 * place or from another operation does not match by chance.
 */
static double value(const plan_t *p, int r, int64_t i)
{
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ (uint64_t)(r + 1) * 0xc2b2ae3d27d4eb4full ^
                 (uint64_t)(p->idx + 1) * 0x165667b19e3779f9ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 32;
    if (p->op == SMDDP_PROD) {
        int k = (int)(x % 4);
        return k == 0 ? 2.0 : k == 1 ? -1.0 : 1.0;
    }
    return (double)(x % 9) - 4.0;
}

/* The reduction of element i over the communicator's size ranks. */
static double reduced(const plan_t *p, int size, int64_t i)
{
    double v[MAX_RANKS];
    for (int r = 0; r < size; r++) v[r] = tv_stored(p->dt, value(p, r, i));
    return tv_reduce(p->dt, p->op, v, size, PREMUL);
}

/* Element offset of block d in rank s's alltoallv send buffer: blocks in order, one element apart. */
static int64_t vdispl(const plan_t *p, int s, int d)
{
    int64_t o = 0;
    for (int q = 0; q < d; q++) o += p->vcnt[s][q] + 1;
    return o;
}

/* Rank s's alltoallv data for rank d starts at this value index, so blocks differ. */
#define VBLOCK ((int64_t)1 << 20)

/* An operation in flight on this rank. */
typedef struct slot {
    plan_t p;
    smddp_comm_t comm;
    int rank, size, root;
    char *in, *out;
    int64_t in_elems, out_elems;
    int64_t sc[MAX_RANKS], sd[MAX_RANKS], rc[MAX_RANKS], rd[MAX_RANKS];
    smddp_request_t req[2];
    int nreq;
    atomic_int callbacks;
    atomic_int failed; /* a callback's non-OK status */
    bool used;
    bool out_owned; /* out is its own allocation (not in, nor inside in) */
} slot_t;

static _Thread_local uint64_t seed_used; /* for messages: per thread (the threads test) */

static void on_complete(void *arg, smddp_status_t st)
{
    slot_t *s = arg;
    if (st != SMDDP_OK) atomic_store(&s->failed, (int)st);
    atomic_fetch_add(&s->callbacks, 1);
}

static void describe(const slot_t *s, char *buf, size_t len)
{
    snprintf(buf, len, "seed %llu op #%d: %s %s %s n=%lld root %d%s on %s (rank %d of %d)",
             (unsigned long long)seed_used, s->p.idx, kind_names[s->p.kind],
             smddp_dtype_name(s->p.dt), smddp_op_name(s->p.op), (long long)s->p.n, s->root,
             s->p.inplace ? " in place" : "", s->p.sub ? "the half" : "the world", s->rank,
             s->size);
}

static char *alloc_filled(int64_t elems, size_t es)
{
    char *b = malloc((size_t)elems * es + 1);
    H_CHECK(b != NULL, "malloc of %lld elements", (long long)elems);
    memset(b, 0x5a, (size_t)elems * es);
    return b;
}

/* An output buffer of its own (freed by finish; in-place outputs point into in). */
static char *own_out(slot_t *s, int64_t elems, size_t es)
{
    s->out_owned = true;
    return alloc_filled(elems, es);
}

static void fill(slot_t *s, char *buf, int r, int64_t from, int64_t n)
{
    for (int64_t i = 0; i < n; i++) tv_store(buf, s->p.dt, i, value(&s->p, r, from + i));
}

static void expect(const slot_t *s, const char *buf, int64_t n, int from_rank, int64_t from,
                   bool reduction, const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        double want = reduction ? reduced(&s->p, s->size, from + i)
                                : tv_stored(s->p.dt, value(&s->p, from_rank, from + i));
        double got = tv_load(buf, s->p.dt, i);
        if (got != want) {
            char d[256];
            describe(s, d, sizeof(d));
            H_CHECK(got == want, "%s: %s: element %lld is %g, expected %g", d, what,
                    (long long)i, got, want);
        }
    }
}

/*
 * Whether s's receive takes the next message of any rank (in a ring only
 * prev sends here, so the result is the same). Every rank decides alike.
 */
static bool any_source(const slot_t *s)
{
    return s->p.kind == K_SENDRECV && s->p.inplace && s->size > 2 && s->p.how != ISSUE_BLOCKING;
}

/* Issues s's operation (buffers filled here). */
static void issue(slot_t *s)
{
    const plan_t *p = &s->p;
    size_t es = smddp_dtype_size(p->dt);
    int me = s->rank, P = s->size;
    int64_t n = p->n;
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.premul_factor = PREMUL;
    if (p->how == ISSUE_FREED) {
        attr.on_complete = on_complete;
        attr.on_complete_arg = s;
    }
    smddp_request_t *rq = p->how == ISSUE_BLOCKING ? NULL : &s->req[0];
    smddp_status_t st = SMDDP_OK;
    s->nreq = p->how == ISSUE_BLOCKING ? 0 : 1;
    switch (p->kind) {
    case K_ALLREDUCE:
        s->in = alloc_filled(n, es);
        fill(s, s->in, me, 0, n);
        s->out = p->inplace ? s->in : own_out(s, n, es);
        st = smddp_allreduce(s->comm, s->in, s->out, n, p->dt, p->op, &attr, rq);
        break;
    case K_REDUCE:
        s->in = alloc_filled(n, es);
        fill(s, s->in, me, 0, n);
        s->out = me != s->root ? NULL : p->inplace ? s->in : own_out(s, n, es);
        st = smddp_reduce(s->comm, s->in, s->out, n, p->dt, p->op, s->root, &attr, rq);
        break;
    case K_BROADCAST:
        s->out = own_out(s, n, es);
        if (me == s->root) fill(s, s->out, me, 0, n);
        st = smddp_broadcast(s->comm, s->out, n, p->dt, s->root, &attr, rq);
        break;
    case K_ALLGATHER:
        s->out = own_out(s, n * P, es);
        if (p->inplace) {
            fill(s, s->out + (size_t)(me * n) * es, me, 0, n);
            st = smddp_allgather(s->comm, s->out + (size_t)(me * n) * es, s->out, n, p->dt,
                                 &attr, rq);
        } else {
            s->in = alloc_filled(n, es);
            fill(s, s->in, me, 0, n);
            st = smddp_allgather(s->comm, s->in, s->out, n, p->dt, &attr, rq);
        }
        break;
    case K_REDUCE_SCATTER:
        s->in = alloc_filled(n * P, es);
        fill(s, s->in, me, 0, n * P);
        s->out = p->inplace ? s->in + (size_t)(me * n) * es : own_out(s, n, es);
        st = smddp_reduce_scatter(s->comm, s->in, s->out, n, p->dt, p->op, &attr, rq);
        break;
    case K_ALLTOALL:
        s->in = alloc_filled(n * P, es);
        fill(s, s->in, me, 0, n * P);
        s->out = own_out(s, n * P, es);
        st = smddp_alltoall(s->comm, s->in, s->out, n, p->dt, &attr, rq);
        break;
    case K_ALLTOALLV: {
        int64_t stot = 0, rtot = 0;
        for (int q = 0; q < P; q++) {
            s->sc[q] = p->vcnt[me][q];
            s->sd[q] = vdispl(p, me, q);
            s->rc[q] = p->vcnt[q][me];
            s->rd[q] = rtot;
            stot = s->sd[q] + s->sc[q] + 1;
            rtot += s->rc[q] + 1;
        }
        s->in = alloc_filled(stot, es);
        for (int q = 0; q < P; q++)
            fill(s, s->in + (size_t)s->sd[q] * es, me, q * VBLOCK, s->sc[q]);
        s->out = own_out(s, rtot, es);
        s->out_elems = rtot;
        st = smddp_alltoallv(s->comm, s->in, s->sc, s->sd, s->out, s->rc, s->rd, p->dt, &attr,
                             rq);
        break;
    }
    case K_GATHER:
        s->in = alloc_filled(n, es);
        fill(s, s->in, me, 0, n);
        s->out = me == s->root ? own_out(s, n * P, es) : NULL;
        st = smddp_gather(s->comm, s->in, s->out, n, p->dt, s->root, &attr, rq);
        break;
    case K_SCATTER:
        s->in = me == s->root ? alloc_filled(n * P, es) : NULL;
        if (s->in) fill(s, s->in, me, 0, n * P);
        s->out = own_out(s, n, es);
        st = smddp_scatter(s->comm, s->in, s->out, n, p->dt, s->root, &attr, rq);
        break;
    case K_BARRIER:
        st = smddp_barrier(s->comm, &attr, rq);
        break;
    case K_SENDRECV: {
        /* A ring: receive from the previous rank, send to the next. */
        int next = (me + 1) % P, prev = (me + P - 1) % P;
        s->in = alloc_filled(n, es);
        fill(s, s->in, me, 0, n);
        s->out = own_out(s, n, es);
        int tag = p->idx & 0x7fff;
        smddp_request_t *rq2 = p->how == ISSUE_BLOCKING ? NULL : &s->req[1];
        if (p->how == ISSUE_BLOCKING) {
            /* Odd ranks receive first, even ones send first: the ring cannot wait in a circle. */
            if (me % 2 == 1) st = smddp_recv(s->comm, s->out, n, p->dt, prev, tag, &attr, NULL);
            if (st == SMDDP_OK) st = smddp_send(s->comm, s->in, n, p->dt, next, tag, &attr, NULL);
            if (st == SMDDP_OK && me % 2 == 0)
                st = smddp_recv(s->comm, s->out, n, p->dt, prev, tag, &attr, NULL);
        } else {
            st = smddp_recv(s->comm, s->out, n, p->dt, any_source(s) ? SMDDP_ANY_SOURCE : prev,
                            tag, &attr, rq);
            if (st == SMDDP_OK) st = smddp_send(s->comm, s->in, n, p->dt, next, tag, &attr, rq2);
        }
        s->nreq = p->how == ISSUE_BLOCKING ? 0 : 2;
        break;
    }
    default: break;
    }
    if (st != SMDDP_OK) { /* the description only for the message */
        char d[256];
        describe(s, d, sizeof(d));
        H_CHECK(st == SMDDP_OK, "%s: issuing returned %s: %s", d, smddp_status_string(st),
                smddp_get_last_error(s->comm));
    }
    if (p->how == ISSUE_FREED) {
        for (int k = 0; k < s->nreq; k++) smddp_request_free(s->req[k]);
    }
}

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Waits for s's operation, checks its result and frees it. */
static void finish(slot_t *s)
{
    const plan_t *p = &s->p;
    char d[256];
    describe(s, d, sizeof(d));
    if (p->how == ISSUE_REQUEST) {
        for (int k = 0; k < s->nreq; k++) {
            smddp_status_t st = smddp_wait(s->req[k], SMDDP_WAIT_DEFAULT);
            H_CHECK(st == SMDDP_OK, "%s: wait returned %s: %s", d, smddp_status_string(st),
                    smddp_get_last_error(s->comm));
            smddp_request_free(s->req[k]);
        }
    } else if (p->how == ISSUE_FREED) {
        int64_t deadline = now_ms() + 60000;
        while (atomic_load(&s->callbacks) < s->nreq && now_ms() < deadline) sched_yield();
        H_CHECK(atomic_load(&s->callbacks) == s->nreq, "%s: %d of %d completion callbacks ran",
                d, atomic_load(&s->callbacks), s->nreq);
        H_CHECK(atomic_load(&s->failed) == 0, "%s: a callback got %s", d,
                smddp_status_string((smddp_status_t)atomic_load(&s->failed)));
    }

    size_t es = smddp_dtype_size(p->dt);
    int me = s->rank, P = s->size;
    int64_t n = p->n;
    char what[64];
    switch (p->kind) {
    case K_ALLREDUCE: expect(s, s->out, n, 0, 0, true, "result"); break;
    case K_REDUCE:
        if (me == s->root) expect(s, s->out, n, 0, 0, true, "root's result");
        break;
    case K_BROADCAST: expect(s, s->out, n, s->root, 0, false, "root's data"); break;
    case K_ALLGATHER:
    case K_GATHER:
        if (p->kind == K_GATHER && me != s->root) break;
        for (int q = 0; q < P; q++) {
            snprintf(what, sizeof(what), "block of rank %d", q);
            expect(s, s->out + (size_t)(q * n) * es, n, q, 0, false, what);
        }
        break;
    case K_REDUCE_SCATTER: expect(s, s->out, n, 0, me * n, true, "this rank's block"); break;
    case K_ALLTOALL:
        for (int q = 0; q < P; q++) {
            snprintf(what, sizeof(what), "block from rank %d", q);
            expect(s, s->out + (size_t)(q * n) * es, n, q, me * n, false, what);
        }
        break;
    case K_ALLTOALLV:
        for (int q = 0; q < P; q++) {
            snprintf(what, sizeof(what), "block from rank %d", q);
            expect(s, s->out + (size_t)s->rd[q] * es, s->rc[q], q, me * VBLOCK, false, what);
            /* The gap after each block stays untouched. */
            const unsigned char *gap = (const unsigned char *)s->out + (size_t)(s->rd[q] + s->rc[q]) * es;
            for (size_t b = 0; b < es; b++)
                H_CHECK(gap[b] == 0x5a, "%s: the gap after the block from rank %d was written", d, q);
        }
        break;
    case K_SCATTER: expect(s, s->out, n, s->root, me * n, false, "this rank's block"); break;
    case K_SENDRECV: expect(s, s->out, n, (me + P - 1) % P, 0, false, "message from prev"); break;
    default: break;
    }
    if (s->out_owned) free(s->out);
    free(s->in);
    memset(s, 0, sizeof(*s));
}

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* Runs the sequence of seed on world (and a half split from it). */
static void soak(smddp_comm_t world, int rank, int size, uint64_t seed)
{
    H_CHECK(size <= MAX_RANKS, "at most %d ranks", MAX_RANKS);
    seed_used = seed;
    int nops = env_int("TEST_SOAK_OPS", DEFAULT_OPS);
    rng_t plan_rng = {.s = seed_used * 0x9e3779b97f4a7c15ull + 1};
    /* The order of finishing may differ per rank: a rank-specific stream. */
    rng_t local_rng = {.s = (seed_used + (uint64_t)rank + 1) * 0xbf58476d1ce4e5b9ull};

    smddp_comm_t half;
    H_OK(smddp_comm_split(world, rank % 2, rank, &half));
    int half_rank, half_size;
    H_OK(smddp_comm_rank(half, &half_rank));
    H_OK(smddp_comm_size(half, &half_size));

    slot_t slots[MAX_INFLIGHT];
    memset(slots, 0, sizeof(slots));
    int counts[K_COUNT] = {0};
    for (int idx = 0; idx < nops; idx++) {
        plan_t p = draw_plan(&plan_rng, idx, size);
        smddp_comm_t comm = p.sub ? half : world;
        int crank = p.sub ? half_rank : rank, csize = p.sub ? half_size : size;
        if (p.kind == K_SENDRECV && csize < 2) continue; /* no send to oneself */
        /* Finish some: all when the window is full, else now and then. */
        int inflight = 0;
        for (int k = 0; k < MAX_INFLIGHT; k++) inflight += slots[k].used;
        while (inflight > 0 && (inflight == MAX_INFLIGHT || below(&local_rng, 3) == 0)) {
            int k;
            do k = (int)below(&local_rng, MAX_INFLIGHT); while (!slots[k].used);
            finish(&slots[k]);
            inflight--;
        }
        /*
         * A receive from any rank that is still waiting has no claim on a
         * rank's next message once a directed receive waits for that rank
         * (smddp_recv's contract), so a ring's directed receive waits until
         * the any-source receives before it on its communicator are done.
         */
        if (p.kind == K_SENDRECV)
            for (int j = 0; j < MAX_INFLIGHT; j++)
                if (slots[j].used && slots[j].comm == comm && any_source(&slots[j])) finish(&slots[j]);
        /* Now and then one rank lags a little: other interleavings. */
        if (below(&local_rng, 8) == 0) usleep((useconds_t)below(&local_rng, 2000));
        int k = 0;
        while (slots[k].used) k++;
        slot_t *s = &slots[k];
        s->used = true;
        s->p = p;
        s->comm = comm;
        s->rank = crank;
        s->size = csize;
        s->root = p.root_draw % csize;
        issue(s);
        counts[p.kind]++;
        if (p.how == ISSUE_BLOCKING) finish(s);
    }
    for (int k = 0; k < MAX_INFLIGHT; k++)
        if (slots[k].used) finish(&slots[k]);
    H_OK(smddp_comm_destroy(half));
    if (rank == 0) {
        char line[512];
        int n = snprintf(line, sizeof(line), "soak (seed %llu, %d ranks):",
                         (unsigned long long)seed_used, size);
        for (int k = 0; k < K_COUNT && n > 0 && (size_t)n < sizeof(line); k++)
            n += snprintf(line + n, sizeof(line) - (size_t)n, "%s %s %d", k ? "," : "",
                          kind_names[k], counts[k]);
        printf("%s\n", line);
        fflush(stdout);
    }
}

static uint64_t first_seed(void) { return (uint64_t)env_int("TEST_SOAK_SEED", (int)DEFAULT_SEED); }

static void soak_rank(smddp_comm_t world, int rank, int size, void *arg)
{
    (void)arg;
    soak(world, rank, size, first_seed());
}

/*
 * Two threads per rank, each with its own communicator (a copy of the
 * world split off it) and its own sequence, at the same time: what several
 * process groups driven from different threads do.
 */
typedef struct soak_thread {
    smddp_comm_t comm;
    int rank, size;
    uint64_t seed;
} soak_thread_t;

static void *soak_thread(void *arg)
{
    soak_thread_t *t = arg;
    soak(t->comm, t->rank, t->size, t->seed);
    return NULL;
}

static void soak_threads_rank(smddp_comm_t world, int rank, int size, void *arg)
{
    (void)arg;
    soak_thread_t other = {.rank = rank, .size = size, .seed = first_seed() + 1};
    H_OK(smddp_comm_split(world, 0, rank, &other.comm));
    pthread_t th;
    H_CHECK(pthread_create(&th, NULL, soak_thread, &other) == 0, "pthread_create");
    soak(world, rank, size, first_seed());
    H_CHECK(pthread_join(th, NULL) == 0, "pthread_join");
    H_OK(smddp_comm_destroy(other.comm));
}

static void run_fn(int nranks, int per_node, const char *env, harness_fn_t fn)
{
    harness_opts_t opts = {.timeout_s = 300, .ranks_per_node = per_node, .env = env};
    int shm_before = harness_shm_count();
    assert_int_equal(harness_run(nranks, fn, NULL, &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
}

static void run(int nranks, int per_node, const char *env) { run_fn(nranks, per_node, env, soak_rank); }

/* Small staging buffers: the random sizes cross many rounds and every switch point. */
#define SMALL "SMDDP_SHM_BUFFER_SIZE=16384 SMDDP_ALLREDUCE_ONESHOT_MAX=1024 SMDDP_STREAM_MIN=4096"

static void test_soak_1x2(void **state) { (void)state; run(2, 0, NULL); }
static void test_soak_1x3(void **state) { (void)state; run(3, 0, NULL); }
static void test_soak_1x4_small(void **state) { (void)state; run(4, 0, SMALL); }
static void test_soak_1x3_threads(void **state) { (void)state; run_fn(3, 0, NULL, soak_threads_rank); }
#if SMDDP_HAVE_OFI /* fake nodes talk through libfabric */
static void test_soak_2x2_nodes(void **state) { (void)state; run(4, 2, NULL); }
static void test_soak_2x2_nodes_small(void **state) { (void)state; run(4, 2, SMALL); }
static void test_soak_3x1_nodes(void **state) { (void)state; run(3, 1, NULL); }
static void test_soak_2x2_flat(void **state) { (void)state; run(4, 2, "SMDDP_NET_ALGO=flat"); }
static void test_soak_2x2_nodes_threads(void **state)
{
    (void)state;
    run_fn(4, 2, NULL, soak_threads_rank);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_soak_1x2),
        cmocka_unit_test(test_soak_1x3),
        cmocka_unit_test(test_soak_1x4_small),
        cmocka_unit_test(test_soak_1x3_threads),
#if SMDDP_HAVE_OFI
        cmocka_unit_test(test_soak_2x2_nodes),
        cmocka_unit_test(test_soak_2x2_nodes_small),
        cmocka_unit_test(test_soak_3x1_nodes),
        cmocka_unit_test(test_soak_2x2_flat),
        cmocka_unit_test(test_soak_2x2_nodes_threads),
#endif
    };
    /* TEST_FILTER=pattern runs only the matching tests (cmocka's wildcards). */
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
