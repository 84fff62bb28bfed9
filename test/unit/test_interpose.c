/*
 * The NCCL interposer's dispatch (core/cuda/interpose.c), on the CPU: the routing
 * decision for every reason a call goes to NCCL, and the pass-through to a
 * fake NCCL library (fake_nccl.c) linked after libsmddp, as the real one is
 * found behind a preloaded libsmddp. Serving on a GPU is tested in
 * test/gpu/test_interpose_gpu.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda/interpose.h"
#include "cuda/nccl.h"
#include "param.h"

/* The fake's own counters. */
int fake_nccl_calls(const char *name);
void *fake_nccl_last_comm(void);

static smddp__ipose_call_t servable(void)
{
    smddp__ipose_call_t c = {SMDDP_IPOSE_ALLREDUCE, SMDDP_NCCL_FLOAT32, SMDDP_NCCL_SUM, true,
                             false, true, NULL};
    return c;
}

static void test_route(void **state)
{
    (void)state;
    smddp_dtype_t dt;
    smddp_op_t op;
    smddp__ipose_call_t c = servable();
#if SMDDP_HAVE_CUDA
    assert_null(smddp__ipose_route(&c, &dt, &op));
    assert_int_equal(dt, SMDDP_FLOAT32);
    assert_int_equal(op, SMDDP_SUM);
    const struct {
        int nccl;
        smddp_dtype_t want;
    } dts[] = {{0, SMDDP_INT8},    {1, SMDDP_UINT8},   {2, SMDDP_INT32},   {3, SMDDP_UINT32},
               {4, SMDDP_INT64},   {5, SMDDP_UINT64},  {6, SMDDP_FLOAT16}, {7, SMDDP_FLOAT32},
               {8, SMDDP_FLOAT64}, {9, SMDDP_BFLOAT16}};
    for (size_t i = 0; i < sizeof(dts) / sizeof(dts[0]); i++) {
        c = servable();
        c.nccl_dtype = dts[i].nccl;
        assert_null(smddp__ipose_route(&c, &dt, &op));
        assert_int_equal(dt, dts[i].want);
    }
    const struct {
        int nccl;
        smddp_op_t want;
    } ops[] = {{0, SMDDP_SUM}, {1, SMDDP_PROD}, {2, SMDDP_MAX}, {3, SMDDP_MIN}, {4, SMDDP_AVG}};
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        c = servable();
        c.nccl_op = ops[i].nccl;
        assert_null(smddp__ipose_route(&c, &dt, &op));
        assert_int_equal(op, ops[i].want);
    }
    /* allgather ignores the op */
    c = servable();
    c.kind = SMDDP_IPOSE_ALLGATHER;
    c.nccl_op = 99;
    assert_null(smddp__ipose_route(&c, &dt, &op));
#endif
    /* every reason to hand a call to NCCL */
    c = servable();
    c.enabled = false;
    assert_non_null(strstr(smddp__ipose_route(&c, &dt, &op), "USE_SMDDP_COLLECTIVES"));
#if SMDDP_HAVE_CUDA
    c = servable();
    c.in_group = true;
    assert_non_null(strstr(smddp__ipose_route(&c, &dt, &op), "ncclGroupStart"));
    const int bad_dtypes[] = {10, 11, 12, -1}; /* fp8 e4m3, e5m2; none */
    for (size_t i = 0; i < sizeof(bad_dtypes) / sizeof(bad_dtypes[0]); i++) {
        c = servable();
        c.nccl_dtype = bad_dtypes[i];
        assert_non_null(strstr(smddp__ipose_route(&c, &dt, &op), "dtype"));
    }
    c = servable();
    c.kind = SMDDP_IPOSE_REDUCE_SCATTER;
    c.nccl_op = 5; /* the first op ncclRedOpCreatePreMulSum hands out */
    assert_non_null(strstr(smddp__ipose_route(&c, &dt, &op), "custom"));
    c = servable();
    c.device_memory = false;
    assert_non_null(strstr(smddp__ipose_route(&c, &dt, &op), "device memory"));
    c = servable();
    c.comm_refused = "its ranks span nodes";
    assert_string_equal(smddp__ipose_route(&c, &dt, &op), "its ranks span nodes");
#else
    c = servable();
    assert_non_null(strstr(smddp__ipose_route(&c, &dt, &op), "without CUDA"));
#endif
}

/* Every call reaches the fake NCCL untouched, whatever the settings, on the CPU. */
static void test_pass_through(void **state)
{
    (void)state;
    float send[8] = {1, 2, 3, 4, 5, 6, 7, 8}, recv[8] = {0};
    void *comm = (void *)0x1234, *stream = NULL;
    long served0, fwd0, served, fwd;
    smddp__ipose_counts(&served0, &fwd0);

    unsetenv("USE_SMDDP_COLLECTIVES");
    assert_int_equal(ncclAllReduce(send, recv, 8, SMDDP_NCCL_FLOAT32, SMDDP_NCCL_SUM, comm, stream), 0);
    assert_int_equal(fake_nccl_calls("ncclAllReduce"), 1);
    assert_ptr_equal(fake_nccl_last_comm(), comm);
    assert_memory_equal(send, recv, sizeof(send));

    /* auto with smddp's collectives on: host memory is still NCCL's */
    setenv("USE_SMDDP_COLLECTIVES", "1", 1);
    setenv("SMDDP_COMMUNICATION_BACKEND", "auto", 1);
    smddp__params_reload();
    memset(recv, 0, sizeof(recv));
    assert_int_equal(ncclAllReduce(send, recv, 8, SMDDP_NCCL_FLOAT32, SMDDP_NCCL_SUM, comm, stream), 0);
    assert_int_equal(fake_nccl_calls("ncclAllReduce"), 2);
    assert_memory_equal(send, recv, sizeof(send));
    assert_int_equal(ncclAllGather(send, recv, 4, SMDDP_NCCL_FLOAT32, comm, stream), 0);
    assert_int_equal(fake_nccl_calls("ncclAllGather"), 1);
    assert_int_equal(ncclReduceScatter(send, recv, 2, SMDDP_NCCL_FLOAT32, SMDDP_NCCL_MAX, comm, stream), 0);
    assert_int_equal(fake_nccl_calls("ncclReduceScatter"), 1);

    /* groups pass through, and calls inside them too */
    assert_int_equal(ncclGroupStart(), 0);
    assert_int_equal(ncclAllReduce(send, recv, 8, SMDDP_NCCL_FLOAT32, SMDDP_NCCL_SUM, comm, stream), 0);
    assert_int_equal(ncclGroupEnd(), 0);
    assert_int_equal(fake_nccl_calls("ncclGroupStart"), 1);
    assert_int_equal(fake_nccl_calls("ncclGroupEnd"), 1);
    assert_int_equal(fake_nccl_calls("ncclAllReduce"), 3);

    /* under nccl nothing is served */
    setenv("SMDDP_COMMUNICATION_BACKEND", "nccl", 1);
    smddp__params_reload();
    assert_int_equal(ncclAllReduce(send, recv, 8, SMDDP_NCCL_FLOAT32, SMDDP_NCCL_SUM, comm, stream), 0);
    assert_int_equal(fake_nccl_calls("ncclAllReduce"), 4);

    assert_int_equal(ncclCommDestroy(comm), 0);
    assert_int_equal(fake_nccl_calls("ncclCommDestroy"), 1);
    assert_int_equal(ncclCommAbort((void *)0x5678), 0);
    assert_int_equal(fake_nccl_calls("ncclCommAbort"), 1);
    assert_ptr_equal(fake_nccl_last_comm(), (void *)0x5678);

    smddp__ipose_counts(&served, &fwd);
    assert_int_equal(served - served0, 0);
    assert_int_equal(fwd - fwd0, 6); /* 4 allreduce, 1 allgather, 1 reduce_scatter */
    unsetenv("USE_SMDDP_COLLECTIVES");
    unsetenv("SMDDP_COMMUNICATION_BACKEND");
    smddp__params_reload();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_pass_through),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
