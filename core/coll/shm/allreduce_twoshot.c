/*
 * Two-shot allreduce (large messages): reduce-scatter then allgather, in
 * rounds of one staging half. In each round every rank copies the pieces of
 * its input that belong to its peers into its half, reduces its own piece
 * across all halves (its own input read in place) into its half, and finally
 * copies every reduced piece out. Each element is reduced by exactly one
 * rank, in rank order, so every rank gets bit-identical results.
 * Consecutive rounds use alternate halves, so a fast rank can start the next
 * round while slower ones are still copying out.
 *
 * When every input and output lies in a pool (transport/shm_pool.c), each
 * rank reduces its block of the whole message from every input and writes
 * it into every output: one step, no staging ("in pools"). Reduce
 * (reduce_twoshot.c) is this without the final copy off the root.
 */
#include <string.h>

#include "shm_algo.h"

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

/* Two-shot; with root_lr >= 0 only that local rank copies the result out (reduce). */
smddp_status_t smddp__shm_twoshot(smddp_comm_t comm, smddp__op_t *op, int root_lr)
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

static smddp_status_t allreduce_twoshot(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__shm_twoshot(comm, op, -1);
}

static const char *const in_pools[] = {"in pools", NULL};

SMDDP_SHM_ALGO(allreduce_twoshot, "two-shot", ALLREDUCE, NULL, allreduce_twoshot, in_pools,
               "reduce-scatter then allgather in rounds of one staging half");
