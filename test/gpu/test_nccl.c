/*
 * NCCL on a GPU (meson test --suite gpu): the interposer serving
 * ncclAllReduce/AllGather/ReduceScatter with smddp and passing the rest to
 * the real NCCL, and smddp's own CUDA collectives routed to NCCL (under the
 * nccl backend; all-to-all with splits under auto). NCCL refuses two ranks on
 * one GPU, and GPU machines here have one, so these run one rank; the
 * multi-rank serving path is smddp's CUDA collectives, tested in test_cuda.c.
 *
 * The real NCCL comes from SMDDP_NCCL_LIBRARY, else libnccl.so.2 (gpu_check.sh
 * finds torch's). Exits 77 where no GPU is usable; fails where one is but NCCL
 * cannot be loaded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/interpose.h"
#include "gpu_util.h"
#include "cuda/nccl.h"
#include "param.h"

/* 0 when a GPU and NCCL are here; 77 without a GPU; 1 with a GPU but no NCCL. */
static int probe(void *arg)
{
    int rc = gpu_probe(arg);
    if (rc) return rc;
    const char *why = NULL;
    if (!smddp__nccl(&why)) {
        printf("FAIL: a GPU is here but NCCL did not load: %s (set SMDDP_NCCL_LIBRARY)\n", why);
        return 1;
    }
    printf("NCCL %d\n", smddp__nccl(NULL)->version);
    return 0;
}

/* Runs fn in a child and says how it ended. */
static int run_named(int (*fn)(void *), const char *name)
{
    int rc = gpu_in_child(fn, NULL);
    printf("%s: %s\n", rc ? "FAIL" : "PASS", name);
    return rc;
}

static void expect_floats(const float *dptr, size_t n, float want, const char *what)
{
    float *h = malloc(n * sizeof(float));
    CU(cudaMemcpy(h, dptr, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        H_CHECK(h[i] == want, "%s: element %zu is %g, want %g", what, i, h[i], want);
    free(h);
}

/* The interposer on a one-rank NCCL communicator. */
static int interposer(void *arg)
{
    (void)arg;
    const smddp__nccl_api_t *nccl = smddp__nccl(NULL);
    CU(cudaSetDevice(0));
    smddp__nccl_id_t id;
    smddp__nccl_comm_t nc = NULL;
    H_CHECK(nccl->GetUniqueId(&id) == 0, "ncclGetUniqueId");
    H_CHECK(nccl->CommInitRank(&nc, 1, id, 0) == 0, "ncclCommInitRank");
    setenv("USE_SMDDP_COLLECTIVES", "1", 1);
    setenv("SMDDP_COMMUNICATION_BACKEND", "auto", 1);
    smddp__params_reload();
    cudaStream_t stream;
    CU(cudaStreamCreate(&stream));
    size_t n = 1 << 20;
    float *a, *b, *h = malloc(n * sizeof(float));
    CU(cudaMalloc((void **)&a, n * sizeof(float)));
    CU(cudaMalloc((void **)&b, n * sizeof(float)));
    for (size_t i = 0; i < n; i++) h[i] = 3.0f;
    CU(cudaMemcpy(a, h, n * sizeof(float), cudaMemcpyHostToDevice));
    long s0, f0, s, f;
    smddp__ipose_counts(&s0, &f0);

    H_CHECK(ncclAllReduce(a, b, n, SMDDP_NCCL_FLOAT32, SMDDP_NCCL_SUM, nc, stream) == 0, "allreduce");
    H_CHECK(ncclAllGather(a, b, n, SMDDP_NCCL_FLOAT32, nc, stream) == 0, "allgather");
    H_CHECK(ncclReduceScatter(a, b, n, SMDDP_NCCL_FLOAT32, SMDDP_NCCL_MAX, nc, stream) == 0, "reduce_scatter");
    CU(cudaStreamSynchronize(stream));
    smddp__ipose_counts(&s, &f);
    H_CHECK(s - s0 == 3 && f == f0, "served %ld, forwarded %ld; want 3 and 0", s - s0, f - f0);
    expect_floats(b, n, 3.0f, "served calls");

    /* uint32 (smddp has none) and calls inside a group go to the real NCCL. */
    CU(cudaMemset(b, 0, n * sizeof(float)));
    H_CHECK(ncclAllReduce(a, b, n, 3 /* ncclUint32 */, SMDDP_NCCL_SUM, nc, stream) == 0, "uint32");
    H_CHECK(ncclGroupStart() == 0, "group start");
    H_CHECK(ncclAllGather(a, b, n, SMDDP_NCCL_FLOAT32, nc, stream) == 0, "grouped allgather");
    H_CHECK(ncclGroupEnd() == 0, "group end");
    CU(cudaStreamSynchronize(stream));
    smddp__ipose_counts(&s, &f);
    H_CHECK(s - s0 == 3 && f - f0 == 2, "served %ld, forwarded %ld; want 3 and 2", s - s0, f - f0);
    expect_floats(b, n, 3.0f, "forwarded calls");
    H_CHECK(ncclCommDestroy(nc) == 0, "ncclCommDestroy");
    printf("interposer: 3 calls served by smddp, 2 handed to NCCL %d, results right\n",
           nccl->version);
    return 0;
}

/* smddp's own collectives handed to NCCL, on a one-rank communicator. */
static void routed(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)rank, (void)arg;
    CU(cudaSetDevice(0));
    size_t n = 4096;
    float *a, *b;
    CU(cudaMalloc((void **)&a, n * sizeof(float)));
    CU(cudaMalloc((void **)&b, n * sizeof(float)));
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = (float)i;
    CU(cudaMemcpy(a, h, n * sizeof(float), cudaMemcpyHostToDevice));
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.mem_type = SMDDP_MEM_CUDA;
    attr.premul_factor = 2.0;
    /* auto: all-to-all with splits is NCCL's */
    int64_t cnt[1] = {(int64_t)n}, displ[1] = {0};
    H_CHECK(smddp_alltoallv(comm, a, cnt, displ, b, cnt, displ, SMDDP_FLOAT32, &attr, NULL) == SMDDP_OK,
            "alltoallv: %s", smddp_get_last_error(comm));
    CU(cudaDeviceSynchronize());
    float *g = malloc(n * sizeof(float));
    CU(cudaMemcpy(g, b, n * sizeof(float), cudaMemcpyDeviceToHost));
    H_CHECK(memcmp(g, h, n * sizeof(float)) == 0, "alltoallv through NCCL");
    /* nccl: every collective NCCL has, premul_sum included */
    setenv("SMDDP_COMMUNICATION_BACKEND", "nccl", 1);
    smddp__params_reload();
    H_CHECK(smddp_allreduce(comm, a, b, (int64_t)n, SMDDP_FLOAT32, SMDDP_PREMUL_SUM, &attr, NULL) ==
                SMDDP_OK, "premul allreduce: %s", smddp_get_last_error(comm));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(g, b, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) H_CHECK(g[i] == 2.0f * h[i], "premul element %zu: %g", i, g[i]);
    H_CHECK(smddp_allgather(comm, a, b, (int64_t)n, SMDDP_FLOAT32, &attr, NULL) == SMDDP_OK,
            "allgather: %s", smddp_get_last_error(comm));
    H_CHECK(smddp_broadcast(comm, b, (int64_t)n, SMDDP_FLOAT32, 0, &attr, NULL) == SMDDP_OK,
            "broadcast: %s", smddp_get_last_error(comm));
    /* bitwise ops are not NCCL's: smddp's own path serves them */
    H_CHECK(smddp_allreduce(comm, a, b, (int64_t)n, SMDDP_INT32, SMDDP_BXOR, &attr, NULL) == SMDDP_OK,
            "bxor: %s", smddp_get_last_error(comm));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(g, b, n * sizeof(float), cudaMemcpyDeviceToHost));
    H_CHECK(memcmp(g, h, n * sizeof(float)) == 0, "bxor of one rank is the input");
    printf("routed: alltoallv (auto), premul allreduce, allgather, broadcast (nccl) through NCCL, "
           "bxor through smddp, %d rank\n", size);
}

static int routed_child(void)
{
    harness_opts_t opts = {0};
    opts.env = "SMDDP_DEBUG=INFO";
    return harness_run(1, routed, NULL, &opts) ? 1 : 0;
}

int main(void)
{
    int st = gpu_in_child(probe, NULL);
    if (st == 77) return 77;
    if (st) return 1;
    int bad = run_named(interposer, "interposer serves and forwards") != 0;
    int rc = routed_child();
    printf("%s: smddp's collectives routed to NCCL\n", rc ? "FAIL" : "PASS");
    return bad || rc ? 1 : 0;
}
