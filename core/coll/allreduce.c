/*
 * Reductions inside a node, through the shared-memory staging buffers.
 *
 * One-shot (small messages): every rank copies its input into its staging
 * half, then every rank reduces all P copies itself. One copy in, P reads,
 * two synchronisations. The smallest (up to SMDDP_SHM_LL_MAX bytes) go
 * through the low-latency slots instead (transport/shm_ll.c): the same
 * one-shot, with the data, the desc and the signal in shared cache lines and
 * one exchange in all.
 *
 * Two-shot (large messages): reduce-scatter then allgather, in rounds of one
 * staging half. In each round every rank copies the pieces of its input that
 * belong to its peers into its half, reduces its own piece across all halves
 * (its own input read in place) into its half, and finally copies every
 * reduced piece out. Each element is reduced by exactly one rank, in rank
 * order, so every rank gets bit-identical results. Consecutive rounds use
 * alternate halves, so a fast rank can start the next round while slower
 * ones are still copying out.
 *
 * Reduce (to a root) is two-shot without the final copy on non-roots.
 * Reduce-scatter is the first half of two-shot with the result written
 * straight into the output.
 *
 * Pools (transport/shm_pool.c): a rank whose input lies in its pool does not
 * copy it in; peers read it where it lies (one-shot: every rank reduces
 * straight from the pooled inputs). When every input and output of a
 * two-shot allreduce lies in a pool, each rank reduces its block of the
 * whole message from every input and writes it into every output: one
 * step, no staging. Reduce-scatter with every input pooled likewise reduces
 * straight from the inputs. A rank whose input peers read in place returns
 * only after every peer is done with it.
 *
 * In place, one-shot cannot read pooled inputs where they lie (each rank
 * overwrites its own while peers read it) and stages them; two-shot in
 * pools need not. So a one-shot-sized allreduce publishes its in-place
 * pooled buffer, every rank learns alike whether all were (the verdict,
 * kept per size in comm->allreduce_pooled), and the next allreduce of that
 * size runs two-shot: in the pools, or staged if a buffer is no longer
 * pooled, which clears the verdict.
 */
#include <string.h>

#include "../copy.h"
#include "../param.h"
#include "../transport/shm.h"
#include "../topo.h"
#include "coll.h"

#define MAX_LOCAL SMDDP_MAX_LOCAL /* checked at creation (topo.c) */
#define N_POOLED (sizeof(((struct smddp_comm *)0)->allreduce_pooled) / sizeof(size_t))
/*
 * Pooled verdicts, kept with the size (bytes << 2 | verdict): every buffer
 * in place in a pool (two-shot runs in the pools), or every input in a
 * pool, out of place (one-shot reads them there).
 */
#define POOLED_IN_PLACE 1u
#define POOLED_INPUTS 2u
/* Up to this many bytes the low-latency slots beat the pools whatever the verdict. */
#define LL_OVER_POOLS_MAX 1024

/* Whether auto picks one-shot for `bytes` by size (see smddp__allreduce). */
static bool oneshot_sized(smddp_comm_t comm, size_t bytes)
{
    return bytes * (size_t)comm->local_size / 2 <= (size_t)smddp__params()->oneshot_max &&
           bytes <= smddp__shm_half_size(comm);
}

/* The verdict of the last one-shot-sized allreduce of `bytes` (0: none). */
static unsigned pooled_verdict(smddp_comm_t comm, size_t bytes)
{
    for (size_t i = 0; i < N_POOLED; i++)
        if (comm->allreduce_pooled[i] >> 2 == bytes) return comm->allreduce_pooled[i] & 3u;
    return 0;
}

/* Records the verdict of an allreduce of `bytes` (the same on every rank). */
static void set_pooled(smddp_comm_t comm, size_t bytes, unsigned verdict)
{
    size_t *v = comm->allreduce_pooled, i = 0;
    while (i < N_POOLED && v[i] >> 2 != bytes) i++;
    if (verdict && i == N_POOLED) { /* newest first, the oldest dropped */
        memmove(v + 1, v, (N_POOLED - 1) * sizeof(*v));
        v[0] = bytes << 2 | verdict;
    } else if (verdict) {
        v[i] = bytes << 2 | verdict;
    } else if (i < N_POOLED) {
        memmove(v + i, v + i + 1, (N_POOLED - 1 - i) * sizeof(*v));
        v[N_POOLED - 1] = 0;
    }
}

/*
 * One-shot through the low-latency slots; each rank reduces in rank order,
 * so all agree. Above LL_OVER_POOLS_MAX the ranks also learn, in the same
 * lines, where their buffers lie: the pooled verdict one-shot's staged path
 * keeps.
 */
static smddp_status_t allreduce_ll(smddp_comm_t comm, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    const void *srcs[MAX_LOCAL];
    smddp__reduce_spec_t spec = op->spec;
    spec.avg_div = comm->size;
    bool pools = smddp__pool_on(comm) && bytes > LL_OVER_POOLS_MAX;
    uint64_t where = 0;
    if (pools && op->sendbuf == op->recvbuf)
        where = smddp__pool_ref(comm, op->recvbuf, bytes) ? POOLED_IN_PLACE : 0;
    else if (pools && smddp__disjoint(op->sendbuf, bytes, op->recvbuf, bytes))
        where = smddp__pool_ref(comm, op->sendbuf, bytes) ? POOLED_INPUTS : 0;
    SMDDP_CHECK(smddp__shm_ll_exchange(comm, op, op->sendbuf, bytes, &where, srcs));
    if (pools) set_pooled(comm, bytes, (unsigned)where);
    srcs[comm->local_rank] = op->sendbuf;
    smddp__reduce(&spec, op->recvbuf, srcs, comm->local_size, op->count);
    return SMDDP_OK;
}

static smddp_status_t allreduce_oneshot(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp__dtype_size(op->dtype);
    size_t bytes = op->count * es;
    int p = comm->local_size, me = comm->local_rank, h;
    const void *srcs[MAX_LOCAL];
    smddp__reduce_spec_t spec = op->spec;
    spec.avg_div = comm->size;

    smddp__pooled_t pl = {0};
    uint64_t in_ref = 0, in_place_ref = 0;
    if (smddp__pool_on(comm)) {
        /*
         * In place, each rank would overwrite its input while peers still
         * read it: staged, and only the output is published, so that every
         * rank learns whether all buffers were in place in pools.
         */
        if (smddp__disjoint(op->sendbuf, bytes, op->recvbuf, bytes))
            in_ref = smddp__pool_ref(comm, op->sendbuf, bytes);
        else if (op->sendbuf == op->recvbuf)
            in_place_ref = smddp__pool_ref(comm, op->recvbuf, bytes);
        smddp__pool_publish(comm, op, in_ref, in_place_ref);
    }
    SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
    if (!in_ref) memcpy(smddp__shm_buf(comm, me, h), op->sendbuf, bytes);
    uint32_t t = smddp__shm_post(comm);
    SMDDP_CHECK(smddp__shm_wait_all(comm, op, t));
    if (smddp__pool_on(comm)) {
        smddp__pool_peers(comm, op, t, &pl);
        if (pl.all_in) op->algo = "one-shot in pools";
        /* Inputs pooled out of place change the path only where low-latency would run. */
        set_pooled(comm, bytes, pl.all_out ? POOLED_IN_PLACE
                                : pl.all_in && bytes <= smddp__shm_ll_max(comm) ? POOLED_INPUTS
                                                                                 : 0);
    }
    for (int q = 0; q < p; q++)
        srcs[q] = q == me ? op->sendbuf : pl.in && pl.in[q] ? pl.in[q] : smddp__shm_buf(comm, q, h);
    smddp__reduce(&spec, op->recvbuf, srcs, p, op->count);
    smddp__shm_step_end(comm, h);
    /*
     * Peers read my input in place: it is mine again once they all ended
     * this step. Peers read my record for the verdict: a rank that left at
     * once could publish its next op's record over it before a slow peer
     * read it, and the two would then disagree on the verdict.
     */
    return in_ref || in_place_ref ? smddp__shm_step_wait(comm, op, h) : SMDDP_OK;
}

/*
 * Reduces n elements of srcs into the staging piece dst, in slices small
 * enough to stay in the core's cache, copying each slice to the result out
 * right after: the rank's own piece is then not read back from staging with
 * the others' (a sixth less memory traffic for two ranks).
 */
#define HOT_SLICE (64u << 10)

static void reduce_and_copy(const smddp__reduce_spec_t *spec, char *out, char *dst,
                            const void *const *srcs, int p, size_t n, int stream)
{
    size_t es = smddp__dtype_size(spec->dtype), slice = SMDDP_MAX(HOT_SLICE / es, (size_t)1);
    const void *at[MAX_LOCAL];
    for (size_t o = 0; o < n; o += slice) {
        size_t len = SMDDP_MIN(slice, n - o);
        for (int q = 0; q < p; q++) at[q] = (const char *)srcs[q] + o * es;
        smddp__reduce(spec, dst + o * es, at, p, len);
        smddp__copy(out + o * es, dst + o * es, len * es, stream);
    }
}

/*
 * Every input and output in a pool: reduces this rank's block of all n
 * elements into its output, a slice at a time, and copies each slice on
 * into every peer's output. Non-temporal stores (stream) only into an
 * output that is not its input: the slice of an input was just read, its
 * lines are in this core's cache, and ordinary stores over them measured
 * 20-30% faster at 16-64 MiB (bench/RESULTS.md); into lines never read,
 * streaming saves reading them first.
 */
static void reduce_and_push(const smddp__reduce_spec_t *spec, const smddp__pooled_t *pl, int p,
                            int me, size_t off, size_t n, int stream)
{
    size_t es = smddp__dtype_size(spec->dtype), slice = SMDDP_MAX(HOT_SLICE / es, (size_t)1);
    const void *at[MAX_LOCAL];
    for (size_t o = off; o < off + n; o += slice) {
        size_t len = SMDDP_MIN(slice, off + n - o);
        for (int q = 0; q < p; q++) at[q] = pl->in[q] + o * es;
        char *mine = pl->out[me] + o * es;
        smddp__reduce(spec, mine, at, p, len);
        for (int q = 0; q < p; q++)
            if (q != me)
                smddp__copy(pl->out[q] + o * es, mine, len * es,
                            stream && pl->out[q] != pl->in[q]);
    }
}

/* Two-shot; with root >= 0 only the root copies the result out (reduce). */
static smddp_status_t allreduce_twoshot(smddp_comm_t comm, smddp__op_t *op, int root_lr)
{
    size_t es = smddp__dtype_size(op->dtype);
    int p = comm->local_size, me = comm->local_rank, h;
    size_t round_elems = smddp__shm_half_size(comm) / es;
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    const void *srcs[MAX_LOCAL];
    smddp__reduce_spec_t spec = op->spec;
    spec.avg_div = comm->size;
    bool copy_out = root_lr < 0 || root_lr == me;
    /*
     * Non-temporal stores only into an output that is not the input: in
     * place, each round's lines were just read and sit in this core's
     * cache, and streaming over them measured 1.5x slower at 16-64 MiB
     * (bench/RESULTS.md).
     */
    int stream = op->count * es >= (size_t)smddp__params()->stream_min && copy_out &&
                 smddp__disjoint(send, op->count * es, recv, op->count * es);
    smddp__pooled_t pl = {0};
    uint64_t in_ref = 0;
    if (smddp__pool_on(comm)) {
        size_t bytes = op->count * es;
        if (send == recv || smddp__disjoint(send, bytes, recv, bytes))
            in_ref = smddp__pool_ref(comm, send, bytes);
        smddp__pool_publish(comm, op, in_ref, smddp__pool_ref(comm, recv, bytes));
    }

    for (size_t base = 0; base < op->count; base += round_elems) {
        size_t m = SMDDP_MIN(round_elems, op->count - base);
        size_t my_off, my_len;
        smddp__piece(m, p, me, &my_off, &my_len);
        SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
        char *mine = smddp__shm_buf(comm, me, h);
        /* Everything but my own piece goes to staging; mine is read in place. */
        if (!in_ref) {
            memcpy(mine, send + base * es, my_off * es);
            memcpy(mine + (my_off + my_len) * es, send + (base + my_off + my_len) * es,
                   (m - my_off - my_len) * es);
        }
        uint32_t t = smddp__shm_post(comm);
        SMDDP_CHECK(smddp__shm_wait_all(comm, op, t));
        if (base == 0 && smddp__pool_on(comm)) {
            smddp__pool_peers(comm, op, t, &pl);
            if (root_lr < 0 && oneshot_sized(comm, op->count * es)) {
                /* The same verdict as one-shot's: every buffer pooled and in place. */
                bool in_place = pl.all_in && pl.all_out;
                for (int q = 0; q < p && in_place; q++) in_place = pl.in[q] == pl.out[q];
                set_pooled(comm, op->count * es, in_place ? POOLED_IN_PLACE : 0);
            }
            if (pl.all_in && pl.all_out && root_lr < 0) {
                size_t off, len;
                smddp__piece(op->count, p, me, &off, &len);
                op->algo = "in pools";
                reduce_and_push(&spec, &pl, p, me, off, len, stream);
                SMDDP_CHECK(smddp__shm_sync(comm, op));
                smddp__shm_step_end(comm, h);
                return SMDDP_OK;
            }
        }
        for (int q = 0; q < p; q++)
            srcs[q] = q == me  ? send + (base + my_off) * es
                      : pl.in && pl.in[q] ? pl.in[q] + (base + my_off) * es
                                          : (const char *)smddp__shm_buf(comm, q, h) + my_off * es;
        if (copy_out)
            reduce_and_copy(&spec, recv + (base + my_off) * es, mine + my_off * es, srcs, p,
                            my_len, stream);
        else
            smddp__reduce(&spec, mine + my_off * es, srcs, p, my_len);
        SMDDP_CHECK(smddp__shm_sync(comm, op));
        if (copy_out) {
            for (int q = 0; q < p; q++) {
                size_t off, len;
                if (q == me) continue; /* copied out above */
                smddp__piece(m, p, q, &off, &len);
                smddp__copy(recv + (base + off) * es, (char *)smddp__shm_buf(comm, q, h) + off * es,
                            len * es, stream);
            }
        }
        smddp__shm_step_end(comm, h);
    }
    return SMDDP_OK;
}

smddp_status_t smddp__allreduce(smddp_comm_t comm, smddp__op_t *op)
{
    enum { LOW_LATENCY, ONE_SHOT, TWO_SHOT } how;
    static const char *const names[] = {"low-latency", "one-shot", "two-shot"};
    const smddp__params_t *params = smddp__params();
    size_t bytes = op->count * smddp__dtype_size(op->dtype); /* > 0: count 0 runs nothing */
    if (params->algo == SMDDP_ALLREDUCE_ONESHOT) {
        how = bytes <= smddp__shm_half_size(comm) ? ONE_SHOT : TWO_SHOT;
    } else if (params->algo == SMDDP_ALLREDUCE_TWOSHOT || !oneshot_sized(comm, bytes)) {
        /*
         * One-shot reads every peer's copy (P x bytes per rank), two-shot a
         * fixed 2 x bytes plus one more synchronisation: the switch point
         * measured for 2 ranks scales down as ranks are added.
         */
        how = TWO_SHOT;
    } else {
        /*
         * In place in pools, one-shot must stage (see above) and two-shot
         * need not: measured 3-13x faster at 8-128 KiB. Up to
         * SMDDP_SHM_LL_MAX the low-latency slots beat staging, and beat the
         * pools up to LL_OVER_POOLS_MAX (bench/RESULTS.md).
         */
        unsigned verdict = smddp__pool_on(comm) ? pooled_verdict(comm, bytes) : 0;
        how = bytes <= smddp__shm_ll_max(comm) && (!verdict || bytes <= LL_OVER_POOLS_MAX)
                  ? LOW_LATENCY
              : verdict == POOLED_IN_PLACE ? TWO_SHOT
                                           : ONE_SHOT;
    }
    SMDDP_TRACE("rank %d: allreduce seq %llu: %zu bytes, %s through shm", comm->rank,
                (unsigned long long)op->seq, bytes, names[how]);
    op->algo = names[how];
    return how == LOW_LATENCY ? allreduce_ll(comm, op)
           : how == ONE_SHOT  ? allreduce_oneshot(comm, op)
                              : allreduce_twoshot(comm, op, -1);
}

smddp_status_t smddp__reduce_root(smddp_comm_t comm, smddp__op_t *op)
{
    return allreduce_twoshot(comm, op, smddp__local_index(comm, op->root));
}

smddp_status_t smddp__reduce_scatter(smddp_comm_t comm, smddp__op_t *op)
{
    size_t es = smddp__dtype_size(op->dtype);
    int p = comm->local_size, me = comm->local_rank, h = 0;
    size_t n = op->count; /* per rank */
    size_t round_elems = smddp__shm_half_size(comm) / es / (size_t)p;
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    const void *srcs[MAX_LOCAL];
    smddp__reduce_spec_t spec = op->spec;
    spec.avg_div = comm->size;

    if (round_elems == 0) round_elems = 1;
    /* As in two-shot: no non-temporal stores over the input's own lines. */
    int stream = n * es >= (size_t)smddp__params()->stream_min / (size_t)p &&
                 smddp__disjoint(send, n * (size_t)p * es, recv, n * es);
    smddp__pooled_t pl = {0};
    uint64_t in_ref = 0;
    if (smddp__pool_on(comm)) {
        const char *own = send + (size_t)me * n * es;
        if (recv == own || smddp__disjoint(send, n * (size_t)p * es, recv, n * es))
            in_ref = smddp__pool_ref(comm, send, n * (size_t)p * es);
        smddp__pool_publish(comm, op, in_ref, 0);
    }
    for (size_t base = 0; base < n; base += round_elems) {
        size_t m = SMDDP_MIN(round_elems, n - base);
        SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
        char *mine = smddp__shm_buf(comm, me, h);
        for (int q = 0; q < p && !in_ref; q++)
            if (q != me)
                memcpy(mine + (size_t)q * m * es, send + ((size_t)q * n + base) * es, m * es);
        uint32_t t = smddp__shm_post(comm);
        SMDDP_CHECK(smddp__shm_wait_all(comm, op, t));
        if (base == 0 && smddp__pool_on(comm)) {
            smddp__pool_peers(comm, op, t, &pl);
            if (pl.all_in) {
                for (int q = 0; q < p; q++) srcs[q] = pl.in[q] + (size_t)me * n * es;
                op->algo = "in pools";
                smddp__reduce(&spec, recv, srcs, p, n);
                smddp__shm_step_end(comm, h);
                return smddp__shm_step_wait(comm, op, h);
            }
        }
        for (int q = 0; q < p; q++)
            srcs[q] = q == me  ? send + ((size_t)me * n + base) * es
                      : pl.in && pl.in[q] ? pl.in[q] + ((size_t)me * n + base) * es
                                          : (const char *)smddp__shm_buf(comm, q, h) + (size_t)me * m * es;
        if (stream) {
            /* My own slot in my half is free: reduce there, then stream out. */
            char *tmp = mine + (size_t)me * m * es;
            smddp__reduce(&spec, tmp, srcs, p, m);
            smddp__copy(recv + base * es, tmp, m * es, 1);
        } else {
            smddp__reduce(&spec, recv + base * es, srcs, p, m);
        }
        smddp__shm_step_end(comm, h);
    }
    /* Peers read my input in place: it is mine again once they all ended their last step. */
    return in_ref ? smddp__shm_step_wait(comm, op, h) : SMDDP_OK;
}
