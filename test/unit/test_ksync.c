/*
 * The CUDA collective kernels' synchronisation (core/cuda/ksync.h) in a CPU
 * model (ks_model.c): the header's barrier, launch counters, failure record
 * and plan, compiled for the host, with every block of every rank a thread
 * and the ranks' regions in one address space. Each model block moves the
 * same vectors as its kernel (ipc_kernels.cu) does, in the same phases, here
 * with int32 sums, so a protocol error shows as a wrong result or a hang:
 *
 *   - random sequences of one-shot and two-shot allreduces,
 *     reduce-scatters and allgathers, 2-4 ranks, 1-8 blocks, sizes from one
 *     byte past a vector to several chunks, with random delays in blocks;
 *   - the last barrier of a launch is what keeps the next launch from
 *     overwriting a scratch a slow peer still reads: without it, the model
 *     gives wrong results, with it, right ones (same delays);
 *   - the launch counters wrap around 2^32;
 *   - a rank that never arrives: the others give up within the timeout,
 *     naming it; the abort word: they give up at once;
 *   - a rank that gave up stops its peers, and its later launches touch
 *     nothing a slower peer may still read.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "cuda/ksync.h"
#include "ks_model.h"

#define MAX_P 4

/* One model world: P ranks' regions and control blocks. */
typedef struct world {
    int p;
    size_t scratch;
    smddp__ks_region_t *region[MAX_P];
    smddp__ks_control_t ctl[MAX_P];
    smddp__ks_comm_t comm[MAX_P];
} world_t;

static void world_init(world_t *w, int p, size_t scratch, uint64_t timeout_ns)
{
    memset(w, 0, sizeof(*w));
    w->p = p;
    w->scratch = scratch;
    for (int r = 0; r < p; r++) {
        w->region[r] = aligned_alloc(256, SMDDP_KS_SCRATCH_OFFSET + scratch);
        assert_non_null(w->region[r]);
        memset(w->region[r], 0, SMDDP_KS_SCRATCH_OFFSET + scratch);
    }
    for (int r = 0; r < p; r++) {
        smddp__ks_comm_t *c = &w->comm[r];
        for (int q = 0; q < p; q++) c->region[q] = w->region[q];
        c->control = &w->ctl[r];
        c->timeout_ns = timeout_ns;
        c->rank = r;
        c->nranks = p;
        c->max_blocks = 8;
    }
}

static void world_free(world_t *w)
{
    for (int r = 0; r < w->p; r++) free(w->region[r]);
}

static const smddp__reduce_spec_t int32_sum = {SMDDP_INT32, SMDDP_SUM, 0, 0};

/* ---- sequences of collectives, checked -------------------------------------- */

typedef enum { K_ONESHOT, K_TWOSHOT, K_RS, K_AG } kind_t;

typedef struct step {
    kind_t kind;
    size_t elems; /* per rank (int32), or bytes for an allgather */
    int blocks;
} step_t;

typedef struct run {
    world_t *w;
    const step_t *steps;
    int nsteps;
    int delay_us, slow_rank, slow_us;
    bool skip_last;
    /*
     * Ranks with (rank + step) even register their input where it
     * qualifies (whole vectors) and peers read it in place; a two-shot
     * allreduce then runs truly in place (the output is the input).
     */
    bool in_place;
    int rank;
    long wrong;     /* out: output elements (bytes for allgather) that differ */
    uint32_t failed;
} run_t;

static int32_t input_of(int step, int rank, size_t row, size_t i)
{
    return (int32_t)(step * 1000003 + rank * 7919 + (int)row * 104729 + (int)i * 31 + 7);
}

/* The host side of one collective (kernel_sync.c's chunks()): chunks that fit the scratch. */
static void run_step(run_t *run, int s, const step_t *st)
{
    world_t *w = run->w;
    const smddp__ks_comm_t *c = &w->comm[run->rank];
    int p = w->p, me = run->rank;
    bool ag = st->kind == K_AG, rs = st->kind == K_RS;
    size_t es = ag ? 1 : 4, block = st->elems * es;
    size_t in_bytes = rs ? block * (size_t)p : block, out_bytes = ag ? block * (size_t)p : block;
    bool mine = run->in_place && (me + s) % 2 == 0 && block % SMDDP_KS_VEC == 0;
    bool same = mine && st->kind == K_TWOSHOT;
    char *in = aligned_alloc(SMDDP_KS_VEC, (in_bytes + SMDDP_KS_VEC) / SMDDP_KS_VEC * SMDDP_KS_VEC);
    char *out = same ? in : malloc(out_bytes + 1);
    assert_non_null(in);
    assert_non_null(out);
    memset(out, 0xee, out_bytes + 1);
    for (size_t row = 0; row < (rs ? (size_t)p : 1); row++)
        for (size_t i = 0; i < st->elems; i++) {
            if (ag) {
                in[i] = (char)(input_of(s, me, 0, i) & 0xff);
            } else {
                int32_t v = input_of(s, me, row, i);
                memcpy(in + row * block + i * 4, &v, 4);
            }
        }
    smddp__ks_kind_t kind = st->kind == K_ONESHOT   ? SMDDP_KS_ALLREDUCE_ONESHOT
                            : st->kind == K_TWOSHOT ? SMDDP_KS_ALLREDUCE_TWOSHOT
                            : rs                    ? SMDDP_KS_REDUCE_SCATTER
                                                    : SMDDP_KS_ALLGATHER;
    size_t room = rs ? w->scratch / (size_t)p : w->scratch;
    size_t chunk = room / SMDDP_KS_VEC * SMDDP_KS_VEC;
    /* "Registering": every peer's host maps slot s of this rank's (here: the same address). */
    uint64_t slot = mine ? (uint64_t)(s % SMDDP_KS_SLOTS) + 1 : 0;
    if (slot)
        for (int q = 0; q < p; q++)
            if (q != me) w->region[q]->peer_base[me][slot - 1] = (uint64_t)(uintptr_t)in;
    for (size_t off = 0; off < block; off += chunk) {
        smddp__ks_job_t job = {kind, in + off, out + off, block - off < chunk ? block - off : chunk,
                               rs || ag ? block : 0, slot, slot ? off : 0};
        assert_true(smddp__ks_scratch_need(&job, p) <= w->scratch);
        ks_model_opts_t o = {run->delay_us, run->slow_rank, run->slow_us, run->skip_last,
                             (unsigned)(s * 977 + me * 13 + (int)(off / 16))};
        uint32_t r = ks_model_launch(c, &job, &int32_sum, st->blocks, &o);
        if (r != SMDDP_KS_OK) run->failed = r;
    }
    /* Check against the sums and copies the collective promises. */
    for (size_t row = 0; row < (ag ? (size_t)p : 1); row++)
        for (size_t i = 0; i < st->elems; i++) {
            if (ag) {
                if (out[row * block + i] != (char)(input_of(s, (int)row, 0, i) & 0xff)) run->wrong++;
                continue;
            }
            uint32_t want = 0;
            for (int q = 0; q < p; q++) want += (uint32_t)input_of(s, q, rs ? (size_t)me : 0, i);
            int32_t got;
            memcpy(&got, out + i * 4, 4);
            if ((uint32_t)got != want) run->wrong++;
        }
    if (!same && (unsigned char)out[out_bytes] != 0xee) run->wrong++; /* nothing past the end */
    free(in);
    if (!same) free(out);
}

static void *rank_main(void *p)
{
    run_t *run = p;
    for (int s = 0; s < run->nsteps && !run->failed; s++) run_step(run, s, &run->steps[s]);
    return NULL;
}

/* Every rank runs steps; returns the wrong elements summed over ranks. */
static long run_world(world_t *w, const step_t *steps, int nsteps, const run_t *tmpl)
{
    pthread_t th[MAX_P];
    run_t runs[MAX_P];
    for (int r = 0; r < w->p; r++) {
        runs[r] = *tmpl;
        runs[r].w = w;
        runs[r].steps = steps;
        runs[r].nsteps = nsteps;
        runs[r].rank = r;
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &runs[r]), 0);
    }
    long wrong = 0;
    for (int r = 0; r < w->p; r++) {
        pthread_join(th[r], NULL);
        wrong += runs[r].wrong;
        assert_int_equal(runs[r].failed, SMDDP_KS_OK);
    }
    for (int r = 0; r < w->p; r++) assert_int_equal(w->ctl[r].failed, SMDDP_KS_OK);
    return wrong;
}

/* ---- tests --------------------------------------------------------------------- */

/* The sizes that matter: none, under a vector, odd, one vector, many, several chunks. */
static const size_t sizes[] = {0, 1, 3, 4, 5, 17, 64, 333, 4096, 5000, 40000};

static void random_sequence_with(int p, unsigned seed, int nsteps, int delay_us, bool in_place)
{
    world_t w;
    world_init(&w, p, 16384, 20ull * 1000000000u);
    step_t *steps = calloc((size_t)nsteps, sizeof(*steps));
    assert_non_null(steps);
    for (int s = 0; s < nsteps; s++) {
        steps[s].kind = (kind_t)(rand_r(&seed) % 4);
        steps[s].elems = sizes[rand_r(&seed) % (sizeof(sizes) / sizeof(sizes[0]))];
        steps[s].blocks = 1 + (int)(rand_r(&seed) % 8);
    }
    run_t tmpl = {.delay_us = delay_us, .slow_rank = -1, .in_place = in_place};
    assert_int_equal(run_world(&w, steps, nsteps, &tmpl), 0);
    free(steps);
    world_free(&w);
}

static void random_sequence(int p, unsigned seed, int nsteps, int delay_us)
{
    random_sequence_with(p, seed, nsteps, delay_us, false);
}

static void test_sequences_2(void **state)
{
    (void)state;
    random_sequence(2, 1, 120, 300);
}

static void test_sequences_3(void **state)
{
    (void)state;
    random_sequence(3, 2, 80, 300);
}

static void test_sequences_4(void **state)
{
    (void)state;
    random_sequence(4, 3, 60, 200);
}

/*
 * Registered inputs read in place, mixed in one launch with ranks that copy
 * in, and the two-shot allreduce truly in place: a rank overwrites its
 * input with the result while peers read it, each vector only after every
 * peer's reads of it (the middle barrier).
 */
static void test_in_place_sequences(void **state)
{
    (void)state;
    unsigned long before = ks_model_in_place_reads;
    for (int p = 2; p <= MAX_P; p++) random_sequence_with(p, 40u + (unsigned)p, 80, 200, true);
    assert_true(ks_model_in_place_reads > before);
}

/* Every kind at every size, one block and several, without delays. */
static void test_every_kind_and_size(void **state)
{
    (void)state;
    for (int p = 2; p <= MAX_P; p++) {
        world_t w;
        world_init(&w, p, 16384, 20ull * 1000000000u);
        step_t steps[4 * 11 * 2];
        int n = 0;
        for (int k = 0; k < 4; k++)
            for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++)
                for (int b = 1; b <= 5; b += 4) steps[n++] = (step_t){(kind_t)k, sizes[z], b};
        run_t tmpl = {.slow_rank = -1};
        assert_int_equal(run_world(&w, steps, n, &tmpl), 0);
        world_free(&w);
    }
}

/*
 * Rank 1 is slow to read after the first barrier of every launch. With the
 * last barrier, rank 0 waits for it before its next launch overwrites the
 * scratch; without it, rank 1 reads the next launch's data.
 */
static void test_last_barrier_protects_scratch(void **state)
{
    (void)state;
    step_t steps[6];
    for (int s = 0; s < 6; s++) steps[s] = (step_t){s % 2 ? K_AG : K_ONESHOT, 1000, 2};
    for (int skip = 0; skip <= 1; skip++) {
        world_t w;
        world_init(&w, 2, 16384, 20ull * 1000000000u);
        run_t tmpl = {.slow_rank = 1, .slow_us = 20000, .skip_last = skip};
        long wrong = run_world(&w, steps, 6, &tmpl);
        if (skip)
            assert_true(wrong > 0);
        else
            assert_int_equal(wrong, 0);
        world_free(&w);
    }
}

/* Launch counters and flags near 2^32 keep working across the wrap. */
static void test_epoch_wraps(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 3, 16384, 20ull * 1000000000u);
    for (int r = 0; r < 3; r++) {
        for (int b = 0; b < SMDDP_KS_MAX_BLOCKS; b++) w.region[r]->epoch[b] = 0xfffffff0u;
        for (int st = 0; st < SMDDP_KS_STAGES; st++)
            for (int b = 0; b < SMDDP_KS_MAX_BLOCKS; b++)
                for (int q = 0; q < SMDDP_KS_MAX_RANKS; q++) w.region[r]->flag[st][b][q] = 0xfffffff0u;
    }
    step_t steps[40];
    for (int s = 0; s < 40; s++) steps[s] = (step_t){(kind_t)(s % 4), 100 + (size_t)s, 3};
    run_t tmpl = {.slow_rank = -1, .delay_us = 100};
    assert_int_equal(run_world(&w, steps, 40, &tmpl), 0);
    /* Every block passed zero: its counter is small again. */
    assert_true(w.region[0]->epoch[0] < 0x100u);
    world_free(&w);
}

typedef struct lone {
    const smddp__ks_comm_t *c;
    smddp__ks_job_t job;
    int blocks;
    uint32_t result;
    double seconds;
} lone_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *lone_main(void *p)
{
    lone_t *a = p;
    double t0 = now_s();
    a->result = ks_model_launch(a->c, &a->job, &int32_sum, a->blocks, NULL);
    a->seconds = now_s() - t0;
    return NULL;
}

/* Ranks 0 and 1 launch; rank 2 never does: both give up after the timeout, naming it. */
static void test_dead_peer_times_out(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 3, 16384, 300ull * 1000000u);
    static int32_t in[2][1000], out[2][1000];
    lone_t a[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        a[r] = (lone_t){&w.comm[r], {SMDDP_KS_ALLREDUCE_TWOSHOT, in[r], out[r], sizeof(in[r]), 0, 0, 0},
                        4, 0, 0};
        assert_int_equal(pthread_create(&th[r], NULL, lone_main, &a[r]), 0);
    }
    int timed_out = 0;
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        assert_int_not_equal(a[r].result, SMDDP_KS_OK); /* blocks after the first say "aborted" */
        /* Each times out waiting for rank 2, unless the other gave up first and told it. */
        if (w.ctl[r].failed == SMDDP_KS_PEER) {
            assert_int_equal(w.ctl[r].peer, 1 - r);
        } else {
            assert_int_equal(w.ctl[r].failed, SMDDP_KS_TIMEOUT);
            assert_int_equal(w.ctl[r].peer, 2);
            assert_int_equal(w.ctl[r].epoch, 1);
            timed_out++;
        }
        assert_int_equal(w.ctl[r].stage, 0);
        assert_true(w.ctl[r].block < 4);
        /* Four blocks wait at once, each for 0.3 s; the rank gives up in about that. */
        assert_true(a[r].seconds >= 0.29);
        assert_true(a[r].seconds < 3.0);
    }
    assert_true(timed_out >= 1);
    world_free(&w);
}

/* With a long timeout, the abort word ends the wait at once. */
static void test_abort_ends_wait(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 2, 16384, 60ull * 1000000000u);
    static char in[64], out[128];
    lone_t a = {&w.comm[0], {SMDDP_KS_ALLGATHER, in, out, sizeof(in), sizeof(in), 0, 0}, 2, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, lone_main, &a), 0);
    usleep(100000);
    __atomic_store_n(&w.ctl[0].abort, 1u, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    assert_int_equal(a.result, SMDDP_KS_ABORTED);
    assert_int_equal(w.ctl[0].failed, SMDDP_KS_ABORTED);
    assert_int_equal(w.ctl[0].peer, 1);
    assert_true(a.seconds < 5.0);
    world_free(&w);
}

typedef struct seq2 {
    const smddp__ks_comm_t *c;
    int32_t *in[2], *out[2];
    size_t n;
    ks_model_opts_t o;
    uint32_t result[2];
} seq2_t;

static void *seq2_main(void *p)
{
    seq2_t *a = p;
    for (int k = 0; k < 2; k++) {
        smddp__ks_job_t job = {SMDDP_KS_ALLREDUCE_ONESHOT, a->in[k], a->out[k], a->n * 4, 0, 0, 0};
        a->result[k] = ks_model_launch(a->c, &job, &int32_sum, 2, &a->o);
    }
    return NULL;
}

/*
 * Rank 0 gives up at the last barrier of a launch while rank 1 still reads
 * its scratch, then goes straight to its next launch: that launch must not
 * touch the scratch, so rank 1's result is right; rank 1 learns that rank 0
 * gave up at its own last barrier (the launch fails: with an input read in
 * place, the data could have changed under it), and its next launch stops
 * at once.
 */
static void test_no_launch_after_give_up(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 2, 16384, 200ull * 1000000u);
    w.comm[1].timeout_ns = 60ull * 1000000000u;
    enum { N = 1000 };
    static int32_t in[2][2][N], out[2][2][N];
    seq2_t a[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < N; i++) in[r][k][i] = (r + 1) * 1000 + k * 100000 + i;
        a[r] = (seq2_t){&w.comm[r], {in[r][0], in[r][1]}, {out[r][0], out[r][1]}, N,
                        {.slow_rank = 1, .slow_us = 600000}, {0, 0}};
        assert_int_equal(pthread_create(&th[r], NULL, seq2_main, &a[r]), 0);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int i = 0; i < N; i++) assert_int_equal(out[1][0][i], in[0][0][i] + in[1][0][i]);
    assert_int_not_equal(a[1].result[0], SMDDP_KS_OK);
    assert_int_not_equal(a[0].result[0], SMDDP_KS_OK);
    assert_int_not_equal(a[0].result[1], SMDDP_KS_OK);
    assert_int_not_equal(a[1].result[1], SMDDP_KS_OK);
    assert_int_equal(w.ctl[0].failed, SMDDP_KS_TIMEOUT);
    assert_int_equal(w.ctl[0].peer, 1);
    assert_int_equal(w.ctl[0].stage, 1);
    assert_int_equal(w.ctl[1].failed, SMDDP_KS_PEER);
    assert_int_equal(w.ctl[1].peer, 0);
    world_free(&w);
}

/* Rank 2 never comes; rank 0 gives up after 0.2 s and stops rank 1, whose own timeout is a minute. */
static void test_give_up_stops_peers(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 3, 16384, 200ull * 1000000u);
    w.comm[1].timeout_ns = 60ull * 1000000000u;
    static int32_t in[2][1000], out[2][1000];
    lone_t a[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        a[r] = (lone_t){&w.comm[r], {SMDDP_KS_ALLGATHER, in[r], out[r], sizeof(in[r]) / 2, 0, 0, 0}, 3,
                        0, 0};
        assert_int_equal(pthread_create(&th[r], NULL, lone_main, &a[r]), 0);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    assert_int_equal(w.ctl[0].failed, SMDDP_KS_TIMEOUT);
    assert_int_equal(w.ctl[0].peer, 2);
    assert_int_equal(w.ctl[1].failed, SMDDP_KS_PEER);
    assert_int_equal(w.ctl[1].peer, 0);
    assert_true(a[1].seconds < 5.0);
    world_free(&w);
}

/* The plan: pieces cover the vectors once, and piece_of inverts them. */
static void test_pieces(void **state)
{
    (void)state;
    for (int p = 1; p <= SMDDP_KS_MAX_RANKS; p++)
        for (size_t nvec = 0; nvec < 70; nvec++) {
            size_t next = 0;
            for (int q = 0; q < p; q++) {
                size_t lo, hi;
                smddp__ks_piece(nvec, p, q, &lo, &hi);
                assert_int_equal(lo, next);
                assert_true(hi >= lo && hi - lo <= nvec / (size_t)p + 1);
                for (size_t i = lo; i < hi; i++) assert_int_equal(smddp__ks_piece_of(nvec, p, i), q);
                next = hi;
            }
            assert_int_equal(next, nvec);
        }
    for (size_t stride = 1; stride < 9; stride++)
        for (size_t tid = 0; tid < stride; tid++)
            for (size_t lo = 0; lo < 30; lo++) {
                size_t f = smddp__ks_first(lo, tid, stride);
                assert_true(f >= lo && f < lo + stride && f % stride == tid);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_every_kind_and_size),
        cmocka_unit_test(test_sequences_2),
        cmocka_unit_test(test_sequences_3),
        cmocka_unit_test(test_sequences_4),
        cmocka_unit_test(test_in_place_sequences),
        cmocka_unit_test(test_last_barrier_protects_scratch),
        cmocka_unit_test(test_epoch_wraps),
        cmocka_unit_test(test_dead_peer_times_out),
        cmocka_unit_test(test_abort_ends_wait),
        cmocka_unit_test(test_no_launch_after_give_up),
        cmocka_unit_test(test_give_up_stops_peers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
