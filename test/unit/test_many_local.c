/*
 * Many ranks on one node (CPU servers run one rank per core group: 8 to 128
 * per node): every collective at 16 local ranks with coll_ranks.c's full
 * checks, and at 16, 64 and 128 each kind at one element, at a size in the
 * small-message paths and at one beyond a rank's staging buffer. This
 * machine has fewer CPUs than ranks, so these also check that waits give
 * the CPU up.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_ranks.h"
#include "common.h"

/* Element i of rank r's input: small integers, exact in float32 sums of 128 ranks. */
static float input(int r, size_t i) { return (float)((r + 3 * (int)i) % 7); }

/*
 * One of each collective (float32, sum): allreduce and broadcast of count
 * elements, the others of block elements per rank.
 */
static void each_kind(smddp_comm_t comm, int rank, int size, size_t count, size_t block)
{
    size_t all = SMDDP_MAX(count, block * (size_t)size);
    float *in = malloc(all * sizeof(float)), *out = malloc(all * sizeof(float));
    H_CHECK(in && out, "out of memory");
    for (size_t i = 0; i < all; i++) in[i] = input(rank, i);

    H_OK(smddp_allreduce(comm, in, out, (int64_t)count, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL));
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < size; r++) want += input(r, i);
        H_CHECK(out[i] == want, "allreduce of %zu on %d ranks: [%zu] = %g, expected %g", count,
                size, i, out[i], want);
    }
    int root = size - 1;
    memcpy(out, in, count * sizeof(float));
    H_OK(smddp_broadcast(comm, out, (int64_t)count, SMDDP_FLOAT32, root, NULL, NULL));
    for (size_t i = 0; i < count; i++)
        H_CHECK(out[i] == input(root, i), "broadcast of %zu from rank %d on %d ranks: [%zu] = %g",
                count, root, size, i, out[i]);
    /* reduce_scatter: rank gets block `rank` of the sum of every rank's blocks. */
    H_OK(smddp_reduce_scatter(comm, in, out, (int64_t)block, SMDDP_FLOAT32, SMDDP_SUM, NULL,
                              NULL));
    for (size_t i = 0; i < block; i++) {
        size_t at = (size_t)rank * block + i;
        float want = 0;
        for (int r = 0; r < size; r++) want += input(r, at);
        H_CHECK(out[i] == want, "reduce_scatter of %zu on %d ranks: rank %d [%zu] = %g, "
                "expected %g", block, size, rank, i, out[i], want);
    }
    H_OK(smddp_allgather(comm, in, out, (int64_t)block, SMDDP_FLOAT32, NULL, NULL));
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < block; i++)
            H_CHECK(out[(size_t)r * block + i] == input(r, i),
                    "allgather of %zu on %d ranks: block %d [%zu] = %g, expected %g", block,
                    size, r, i, out[(size_t)r * block + i], input(r, i));
    /* alltoall: block r of rank q's input goes to block q of rank r's output. */
    H_OK(smddp_alltoall(comm, in, out, (int64_t)block, SMDDP_FLOAT32, NULL, NULL));
    for (int q = 0; q < size; q++)
        for (size_t i = 0; i < block; i++) {
            float want = input(q, (size_t)rank * block + i);
            H_CHECK(out[(size_t)q * block + i] == want,
                    "alltoall of %zu on %d ranks: rank %d block %d [%zu] = %g, expected %g",
                    block, size, rank, q, i, out[(size_t)q * block + i], want);
        }
    H_OK(smddp_barrier(comm, NULL, NULL));
    free(in);
    free(out);
}

static void kinds_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    int local = 0;
    H_CHECK(smddp_comm_local_size(comm, &local) == SMDDP_OK && local == size,
            "rank %d: %d local ranks of %d", rank, local, size);
    each_kind(comm, rank, size, 1, 1);
    each_kind(comm, rank, size, 3000, 3000 / (size_t)size + 1); /* in the slots and segment */
    /* 4.8 MB: beyond one rank's 4 MiB staging buffer; the blocks 8 MB in all. */
    each_kind(comm, rank, size, 1200000, (2u << 20) / (size_t)size);
}

static void test_local_16(void **state)
{
    (void)state;
    run(16, allreduce_rank, NULL);
    run(16, reduce_rank, NULL);
    run(16, movement_rank, NULL);
    run(16, kinds_rank, NULL);
}

static void test_local_64(void **state) { (void)state; run(64, kinds_rank, NULL); }

static void test_local_128(void **state) { (void)state; run(128, kinds_rank, NULL); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local_16),
        cmocka_unit_test(test_local_64),
        cmocka_unit_test(test_local_128),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
