/*
 * The operation's vocabulary (core/op.c): every kind has a row of traits with
 * every trait defined, the traits agree with what the API says of each kind,
 * buffer sizes follow from them, and ops are described and compared as the
 * error messages promise. The router's choices (core/exec.c) and the
 * topology's limits (core/topo.c) on a communicator that is only a topology.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "harness.h"
#include "op.h"
#include "param.h"
#include "topo.h"

static bool kind_is(smddp__op_kind_t k, const smddp__op_kind_t *set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (set[i] == k) return true;
    return false;
}

static void test_every_kind_has_every_trait(void **state)
{
    (void)state;
    for (int k = 0; k < SMDDP_OP_KIND_COUNT; k++) {
        const smddp__op_traits_t *t = smddp__op_traits((smddp__op_kind_t)k);
        assert_non_null(t->name);
        assert_string_not_equal(t->name, "unknown");
        assert_int_not_equal(t->in_use, SMDDP_BUF_UNSET);
        assert_int_not_equal(t->out_use, SMDDP_BUF_UNSET);
        assert_int_not_equal(t->in_scale, SMDDP_SCALE_UNSET);
        assert_int_not_equal(t->out_scale, SMDDP_SCALE_UNSET);
        /* Names are distinct. */
        for (int j = 0; j < k; j++)
            assert_string_not_equal(smddp__op_kind_name((smddp__op_kind_t)j), t->name);
    }
    assert_string_equal(smddp__op_kind_name(SMDDP_OP_KIND_COUNT), "unknown");
    assert_string_equal(smddp__op_kind_name((smddp__op_kind_t)-1), "unknown");
}

static void test_traits_match_the_api(void **state)
{
    (void)state;
    const smddp__op_kind_t reducing[] = {SMDDP_OP_ALLREDUCE, SMDDP_OP_REDUCE,
                                         SMDDP_OP_REDUCE_SCATTER};
    const smddp__op_kind_t rooted[] = {SMDDP_OP_REDUCE, SMDDP_OP_BROADCAST, SMDDP_OP_GATHER,
                                       SMDDP_OP_SCATTER};
    const smddp__op_kind_t p2p[] = {SMDDP_OP_SEND, SMDDP_OP_RECV};
    for (int k = 0; k < SMDDP_OP_KIND_COUNT; k++) {
        const smddp__op_traits_t *t = smddp__op_traits((smddp__op_kind_t)k);
        assert_int_equal(t->reduces, kind_is((smddp__op_kind_t)k, reducing, 3));
        assert_int_equal(t->rooted, kind_is((smddp__op_kind_t)k, rooted, 4));
        assert_int_equal(t->p2p, kind_is((smddp__op_kind_t)k, p2p, 2));
    }
    assert_string_equal(smddp__op_kind_name(SMDDP_OP_REDUCE_SCATTER), "reduce_scatter");
}

static void test_dtype_and_op_tables(void **state)
{
    (void)state;
    const size_t sizes[] = {1, 1, 4, 8, 2, 2, 4, 8, 2, 2, 4, 8};
    assert_int_equal(sizeof(sizes) / sizeof(sizes[0]), SMDDP_DTYPE_COUNT);
    for (int d = 0; d < SMDDP_DTYPE_COUNT; d++) {
        assert_int_equal(smddp__dtype_size((smddp_dtype_t)d), sizes[d]);
        assert_string_not_equal(smddp__dtype_name((smddp_dtype_t)d), "unknown");
        /* The ABI only wraps the core's table. */
        assert_int_equal(smddp_dtype_size((smddp_dtype_t)d), sizes[d]);
        assert_string_equal(smddp_dtype_name((smddp_dtype_t)d),
                            smddp__dtype_name((smddp_dtype_t)d));
    }
    assert_int_equal(smddp__dtype_size(SMDDP_DTYPE_COUNT), 0);
    assert_string_equal(smddp__dtype_name(SMDDP_DTYPE_COUNT), "unknown");
    for (int o = 0; o < SMDDP_OP_COUNT; o++)
        assert_string_equal(smddp_op_name((smddp_op_t)o), smddp__redop_name((smddp_op_t)o));
    assert_string_equal(smddp__redop_name(SMDDP_PREMUL_SUM), "premul_sum");
    assert_string_equal(smddp__redop_name(SMDDP_OP_COUNT), "unknown");
}

static smddp__op_t make(smddp__op_kind_t kind, size_t count, smddp_dtype_t dtype, int root)
{
    smddp__op_t op;
    memset(&op, 0, sizeof(op));
    op.kind = kind;
    op.count = count;
    op.dtype = dtype;
    op.spec.dtype = dtype;
    op.spec.op = SMDDP_SUM;
    op.root = root;
    return op;
}

static void test_op_bytes(void **state)
{
    (void)state;
    size_t in, out;
    smddp__op_t op = make(SMDDP_OP_ALLGATHER, 3, SMDDP_FLOAT32, -1);
    smddp__op_bytes(&op, 4, 1, &in, &out);
    assert_int_equal(in, 12);
    assert_int_equal(out, 48);
    op = make(SMDDP_OP_REDUCE_SCATTER, 5, SMDDP_BFLOAT16, -1);
    smddp__op_bytes(&op, 3, 0, &in, &out);
    assert_int_equal(in, 30);
    assert_int_equal(out, 10);
    op = make(SMDDP_OP_BROADCAST, 7, SMDDP_UINT8, 2);
    smddp__op_bytes(&op, 4, 2, &in, &out); /* the root sends */
    assert_int_equal(in, 7);
    assert_int_equal(out, 0);
    smddp__op_bytes(&op, 4, 1, &in, &out); /* the others receive */
    assert_int_equal(in, 0);
    assert_int_equal(out, 7);
    op = make(SMDDP_OP_GATHER, 2, SMDDP_INT64, 0);
    smddp__op_bytes(&op, 3, 0, &in, &out);
    assert_int_equal(out, 48);
    smddp__op_bytes(&op, 3, 1, &in, &out);
    assert_int_equal(in, 16);
    assert_int_equal(out, 0);
    op = make(SMDDP_OP_BARRIER, 0, SMDDP_UINT8, -1);
    smddp__op_bytes(&op, 8, 3, &in, &out);
    assert_int_equal(in + out, 0);
    /* alltoallv: the furthest element either side touches. */
    int64_t v[8] = {2, 1, 0, 3, 1, 0, 4, 0}; /* sendcounts, sdispls, recvcounts, rdispls */
    op = make(SMDDP_OP_ALLTOALLV, 3, SMDDP_INT32, -1);
    op.v = v;
    smddp__op_bytes(&op, 2, 0, &in, &out);
    assert_int_equal(in, 4 * 4);  /* max(0 + 2, 3 + 1) elements */
    assert_int_equal(out, 4 * 5); /* max(4 + 1, 0 + 0) elements */
}

static void test_describe_and_mismatch(void **state)
{
    (void)state;
    char buf[256];
    smddp__op_t op = make(SMDDP_OP_ALLREDUCE, 1024, SMDDP_FLOAT32, -1);
    op.seq = 5;
    smddp__op_describe(&op, buf, sizeof(buf));
    assert_string_equal(buf, "allreduce (seq 5, count 1024, float32, sum)");
    op = make(SMDDP_OP_SEND, 3, SMDDP_INT8, 2);
    op.seq = 7;
    op.tag = 9;
    smddp__op_describe(&op, buf, sizeof(buf));
    assert_string_equal(buf, "send (to rank 2, message 7, tag 9, count 3, int8)");
    op = make(SMDDP_OP_RECV, 3, SMDDP_INT8, -1);
    op.mem_type = SMDDP_MEM_CUDA;
    smddp__op_describe(&op, buf, sizeof(buf));
    assert_string_equal(buf, "recv (from any rank, tag 0, count 3, int8) on CUDA memory");

    /* Descriptors: equal for equal ops; counts of alltoallv and barrier are not compared. */
    smddp__op_t a = make(SMDDP_OP_REDUCE, 10, SMDDP_FLOAT64, 1), b = a;
    smddp__op_desc_t da, db;
    smddp__op_desc(&a, &da);
    smddp__op_desc(&b, &db);
    assert_memory_equal(&da, &db, sizeof(da));
    b.spec.op = SMDDP_MAX;
    smddp__op_desc(&b, &db);
    assert_memory_not_equal(&da, &db, sizeof(da));
    smddp__op_t v1 = make(SMDDP_OP_ALLTOALLV, 4, SMDDP_INT32, -1), v2 = v1;
    v2.count = 9;
    smddp__op_desc(&v1, &da);
    smddp__op_desc(&v2, &db);
    assert_memory_equal(&da, &db, sizeof(da));
    smddp__op_t g = make(SMDDP_OP_BROADCAST, 4, SMDDP_INT32, 0);
    smddp__op_desc(&g, &db);
    assert_int_equal(db.redop, -1);

    smddp__op_desc(&b, &db);
    assert_int_equal(smddp__op_mismatch_error(&a, 0, 3, &db), SMDDP_ERR_MISMATCH);
    const char *msg = smddp__last_error();
    assert_non_null(strstr(msg, "rank 0 issued reduce (seq 0, count 10, float64, sum) with root 1"));
    assert_non_null(strstr(msg, "rank 3 issued reduce (seq 0, count 10, float64, max) with root 1"));
}

static void test_topology_limits(void **state)
{
    (void)state;
    struct smddp_comm *c = harness_topology(1, SMDDP_MAX_LOCAL);
    assert_int_equal(smddp__topo_check(c), SMDDP_OK);
    free(c);
    c = harness_topology(2, 1);
    c->local_size = SMDDP_MAX_LOCAL + 1; /* 257 ranks on this rank's node */
    c->size = 300;
    c->node = 1;
    assert_int_equal(smddp__topo_check(c), SMDDP_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(smddp__last_error(), "257 of its 300 ranks share node 1"));
    assert_non_null(strstr(smddp__last_error(), "at most 256 ranks per node"));
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind_has_every_trait),
        cmocka_unit_test(test_traits_match_the_api),
        cmocka_unit_test(test_dtype_and_op_tables),
        cmocka_unit_test(test_op_bytes),
        cmocka_unit_test(test_describe_and_mismatch),
        cmocka_unit_test(test_topology_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
