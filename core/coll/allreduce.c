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
 * kept per size in the agreement cache, comm->verdicts), and the selection
 * (select.c) sends the next allreduce of that size two-shot: in the pools,
 * or staged if a buffer is no longer pooled, which clears the verdict.
 *
 * Each algorithm here is one registry entry (at the end of the file); the
 * selection alone chooses among them.
 */
#include <string.h>

#include "../copy.h"
#include "../param.h"
#include "../transport/shm.h"
#include "../topo.h"
#include "../select.h"
#include "coll.h"

#define MAX_LOCAL SMDDP_MAX_LOCAL /* checked at creation (topo.c) */

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
    bool pools = smddp__pool_on(comm) && bytes > SMDDP_LL_OVER_POOLS_MAX;
    uint64_t where = 0;
    if (pools && op->sendbuf == op->recvbuf)
        where = smddp__pool_ref(comm, op->recvbuf, bytes) ? SMDDP_POOLED_IN_PLACE : 0;
    else if (pools && smddp__disjoint(op->sendbuf, bytes, op->recvbuf, bytes))
        where = smddp__pool_ref(comm, op->sendbuf, bytes) ? SMDDP_POOLED_INPUTS : 0;
    SMDDP_CHECK(smddp__shm_ll_exchange(comm, op, op->sendbuf, bytes, &where, srcs));
    if (pools) smddp__verdict_set_pooled(&comm->verdicts, bytes, (smddp__pool_verdict_t)where);
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
        smddp__verdict_set_pooled(&comm->verdicts, bytes,
                                  pl.all_out ? SMDDP_POOLED_IN_PLACE
                                  : pl.all_in && bytes <= smddp__shm_ll_max(comm)
                                      ? SMDDP_POOLED_INPUTS
                                      : SMDDP_POOLED_NONE);
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
            if (root_lr < 0 && op->count * es <= smddp__oneshot_range(comm)) {
                /* The same verdict as one-shot's: every buffer pooled and in place. */
                bool in_place = pl.all_in && pl.all_out;
                for (int q = 0; q < p && in_place; q++) in_place = pl.in[q] == pl.out[q];
                smddp__verdict_set_pooled(&comm->verdicts, op->count * es,
                                          in_place ? SMDDP_POOLED_IN_PLACE : SMDDP_POOLED_NONE);
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

static smddp_status_t allreduce_twoshot_all(smddp_comm_t comm, smddp__op_t *op)
{
    return allreduce_twoshot(comm, op, -1);
}

static smddp_status_t reduce_root(smddp_comm_t comm, smddp__op_t *op)
{
    return allreduce_twoshot(comm, op, smddp__local_index(comm, op->root));
}

static bool ll_fits(const smddp__select_in_t *in)
{
    return in->bytes > 0 && in->bytes <= in->lim[SMDDP_LIM_LL];
}

static bool within_half(const smddp__select_in_t *in) { return in->bytes <= in->lim[SMDDP_LIM_HALF]; }

static const char *const in_pools[] = {"in pools", NULL};
static const char *const oneshot_in_pools[] = {"one-shot in pools", NULL};

const smddp__algo_t smddp__algo_allreduce_ll = {
    "low-latency", SMDDP_OP_ALLREDUCE, SMDDP_PATH_SHM, false, ll_fits, allreduce_ll, NULL,
    "one exchange through the low-latency slots; every rank reduces every copy"};
const smddp__algo_t smddp__algo_allreduce_oneshot = {
    "one-shot", SMDDP_OP_ALLREDUCE, SMDDP_PATH_SHM, false, within_half, allreduce_oneshot,
    oneshot_in_pools, "each rank stages its input once and reduces all of them"};
const smddp__algo_t smddp__algo_allreduce_twoshot = {
    "two-shot", SMDDP_OP_ALLREDUCE, SMDDP_PATH_SHM, false, NULL, allreduce_twoshot_all, in_pools,
    "reduce-scatter then allgather in rounds of one staging half"};
const smddp__algo_t smddp__algo_reduce_twoshot = {
    "two-shot", SMDDP_OP_REDUCE, SMDDP_PATH_SHM, false, NULL, reduce_root, NULL,
    "two-shot allreduce, copied out on the root only"};

static smddp_status_t reduce_scatter(smddp_comm_t comm, smddp__op_t *op)
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

const smddp__algo_t smddp__algo_reduce_scatter_twoshot = {
    "two-shot", SMDDP_OP_REDUCE_SCATTER, SMDDP_PATH_SHM, false, NULL, reduce_scatter, in_pools,
    "two-shot's first half, written straight into the output"};
