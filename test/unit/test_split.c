/*
 * smddp_comm_split: evens and odds with keys that reverse the order, a rank
 * that joins no sub-communicator, on one node and across fake nodes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "coll_ranks.h"

static void split_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    smddp_comm_t sub = NULL;
    /* Evens and odds, reversed order within each; the last rank joins none. */
    int color = rank == size - 1 && size > 2 ? SMDDP_SPLIT_NOCOLOR : rank % 2;
    H_OK(smddp_comm_split(comm, color, -rank, &sub));
    if (color == SMDDP_SPLIT_NOCOLOR) {
        H_CHECK(sub == NULL, "NOCOLOR must give NULL");
    } else {
        int srank, ssize, expect = 0;
        for (int r = 0; r < size; r++)
            if ((r % 2) == color && !(r == size - 1 && size > 2)) expect++;
        H_OK(smddp_comm_rank(sub, &srank));
        H_OK(smddp_comm_size(sub, &ssize));
        H_CHECK(ssize == expect, "sub size %d, expected %d", ssize, expect);
        int64_t v = rank, sum = -1;
        H_OK(smddp_allreduce(sub, &v, &sum, 1, SMDDP_INT64, SMDDP_SUM, NULL, NULL));
        int64_t want = 0;
        for (int r = 0; r < size; r++)
            if ((r % 2) == color && !(r == size - 1 && size > 2)) want += r;
        H_CHECK(sum == want, "sub allreduce gave %lld, expected %lld", (long long)sum, (long long)want);
        /* Highest parent rank gets sub rank 0 (keys are -rank). */
        int higher = 0;
        for (int r = rank + 1; r < size; r++)
            if ((r % 2) == color && !(r == size - 1 && size > 2)) higher++;
        H_CHECK(srank == higher, "sub rank %d, expected %d", srank, higher);
        H_OK(smddp_comm_destroy(sub));
    }
    /* The parent still works after the split. */
    int64_t one = 1, total = 0;
    H_OK(smddp_allreduce(comm, &one, &total, 1, SMDDP_INT64, SMDDP_SUM, NULL, NULL));
    H_CHECK(total == size, "parent allreduce after split gave %lld", (long long)total);
}

static void test_split_3(void **state) { (void)state; run(3, split_rank, NULL); }
static void test_split_4(void **state) { (void)state; run(4, split_rank, NULL); }

static void test_nodes_split_2x2(void **state) { (void)state; run_nodes(4, 2, split_rank); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_3),
        cmocka_unit_test(test_split_4),
        cmocka_unit_test(test_nodes_split_2x2),
    };
    /* TEST_FILTER=pattern runs only the matching tests (cmocka's wildcards). */
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
