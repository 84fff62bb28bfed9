/*
 * GPU benchmarks, each against a reference measured in the same run:
 *
 *   smddp_gpu_bench kernel [-e 1G]
 *       the reduction kernel (2 inputs, 1 output) on sizes up to -e bytes per
 *       buffer, fp32 and bf16, against cudaMemcpy device to device, both
 *       counted as bytes read + written (3 N for the kernel, 2 N for the copy);
 *   smddp_gpu_bench coll -p N [-b 1M] [-e 256M]
 *       allreduce, allgather and reduce_scatter on CUDA memory among N forked
 *       ranks on GPU 0 (or GPU rank % count), algbw and busbw as nccl-tests
 *       define them, beside the reduction kernel's own rate on one rank.
 */
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda/kernels.h"
#include "reduce/reduce.h"
#include "spawn.h"

#define CU(call)                                                                    \
    do {                                                                            \
        cudaError_t e_ = (call);                                                    \
        if (e_ != cudaSuccess) {                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,           \
                    cudaGetErrorString(e_));                                        \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

static size_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

/* Mean milliseconds per launch of fn over iters launches after warm-ups. */
typedef void (*launch_fn)(void *ctx);
static double time_ms(launch_fn fn, void *ctx, int iters)
{
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) fn(ctx);
    CU(cudaEventRecord(a, 0));
    for (int i = 0; i < iters; i++) fn(ctx);
    CU(cudaEventRecord(b, 0));
    CU(cudaEventSynchronize(b));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / iters;
}

typedef struct kctx {
    smddp__reduce_spec_t spec;
    void *dst;
    const void *srcs[2];
    size_t count, bytes;
} kctx_t;

static void run_kernel(void *p)
{
    kctx_t *k = p;
    if (smddp__cuda_reduce(&k->spec, k->dst, k->srcs, 2, k->count, NULL) != 0) {
        fprintf(stderr, "kernel launch failed\n");
        exit(1);
    }
}

static void run_memcpy(void *p)
{
    kctx_t *k = p;
    CU(cudaMemcpyAsync(k->dst, k->srcs[0], k->bytes, cudaMemcpyDeviceToDevice, 0));
}

static int kernel_bench(size_t max_bytes)
{
    CU(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("# reduction kernel (2 inputs -> 1 output) vs cudaMemcpy D2D on %s\n", prop.name);
    printf("# bandwidth counts bytes read + written: kernel 3 N, memcpy 2 N\n");
    printf("%12s %9s %12s %12s %12s %8s\n", "bytes", "dtype", "kernel_ms", "kernel_GB/s",
           "memcpy_GB/s", "ratio");
    void *a, *b, *c;
    CU(cudaMalloc(&a, max_bytes));
    CU(cudaMalloc(&b, max_bytes));
    CU(cudaMalloc(&c, max_bytes));
    CU(cudaMemset(a, 0x11, max_bytes));
    CU(cudaMemset(b, 0x22, max_bytes));
    smddp_dtype_t dts[2] = {SMDDP_FLOAT32, SMDDP_BFLOAT16};
    double worst = 1e9;
    for (size_t bytes = 64u << 20; bytes <= max_bytes; bytes *= 4) {
        for (int d = 0; d < 2; d++) {
            kctx_t k = {{dts[d], SMDDP_SUM, 1.0, 0}, c, {a, b}, bytes / smddp_dtype_size(dts[d]), bytes};
            int iters = bytes >= (512u << 20) ? 10 : 30;
            double km = time_ms(run_kernel, &k, iters);
            double mm = time_ms(run_memcpy, &k, iters);
            double kbw = 3.0 * bytes / km / 1e6, mbw = 2.0 * bytes / mm / 1e6;
            printf("%12zu %9s %12.3f %12.1f %12.1f %8.3f\n", bytes, smddp_dtype_name(dts[d]), km,
                   kbw, mbw, kbw / mbw);
            if (bytes >= (256u << 20) && kbw / mbw < worst) worst = kbw / mbw;
        }
    }
    printf("# worst kernel/memcpy ratio at >= 256 MiB: %.3f (target >= 0.85)\n", worst);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return 0;
}

/* ---- collectives among forked ranks --------------------------------------- */

typedef struct cctx {
    smddp_comm_t comm;
    int op;  /* 0 allreduce, 1 allgather, 2 reduce_scatter */
    void *in, *out;
    size_t count;  /* elements per rank's block (allreduce: the whole buffer) */
    smddp_coll_attr_t attr;
} cctx_t;

static void run_coll(void *p)
{
    cctx_t *c = p;
    smddp_status_t st;
    if (c->op == 0)
        st = smddp_allreduce(c->comm, c->in, c->out, (int64_t)c->count, SMDDP_FLOAT32, SMDDP_SUM,
                             &c->attr, NULL);
    else if (c->op == 1)
        st = smddp_allgather(c->comm, c->in, c->out, (int64_t)c->count, SMDDP_FLOAT32, &c->attr, NULL);
    else
        st = smddp_reduce_scatter(c->comm, c->in, c->out, (int64_t)c->count, SMDDP_FLOAT32,
                                  SMDDP_SUM, &c->attr, NULL);
    if (st != SMDDP_OK) {
        fprintf(stderr, "collective failed: %s\n", smddp_get_last_error(c->comm));
        exit(1);
    }
}

static int coll_rank(int procs, int nodes, size_t min_bytes, size_t max_bytes)
{
    smddp_comm_t comm;
    if (nodes > 1) {
        /* Fake nodes on this machine: the network path (libfabric over loopback) between them. */
        char host[64];
        int r = atoi(getenv("SMDDP_RANK"));
        snprintf(host, sizeof(host), "gpu-bench-node-%d", r * nodes / procs);
        setenv("SMDDP_HOSTNAME", host, 1);
    }
    if (smddp_comm_create_from_env(NULL, &comm) != SMDDP_OK) {
        fprintf(stderr, "smddp_comm_create_from_env: %s\n", smddp_get_last_error(NULL));
        return 1;
    }
    int rank, size, ndev = 0;
    smddp_comm_rank(comm, &rank);
    smddp_comm_size(comm, &size);
    CU(cudaGetDeviceCount(&ndev));
    CU(cudaSetDevice(rank % ndev));
    void *in, *out;
    CU(cudaMalloc(&in, max_bytes));
    CU(cudaMalloc(&out, max_bytes));
    CU(cudaMemset(in, 0, max_bytes));
    cctx_t c = {comm, 0, in, out, 0, SMDDP_COLL_ATTR_INIT};
    c.attr.mem_type = SMDDP_MEM_CUDA;
    c.attr.stream = NULL;
    if (rank == 0) {
        const char *net = getenv("SMDDP_CUDA_NET");
        printf("# CUDA collectives, %d ranks on %d GPU(s), %d node(s)%s%s, fp32 sum; bytes = the "
               "whole buffer\n",
               size, ndev, nodes, nodes > 1 ? ", SMDDP_CUDA_NET=" : "",
               nodes > 1 ? (net ? net : "auto") : "");
        printf("%10s %14s %10s %11s %11s %15s\n", "op", "bytes", "time_us", "algbw_GB/s",
               "busbw_GB/s", "add_3N_GB/s");
    }
    const char *names[3] = {"allreduce", "allgather", "reduce_scatter"};
    for (int op = 0; op < 3; op++)
        for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
            c.op = op;
            c.count = op == 0 ? bytes / 4 : bytes / 4 / (size_t)size;
            if (c.count == 0) continue;
            size_t total = op == 0 ? bytes : c.count * 4 * (size_t)size;
            int iters = bytes >= (64u << 20) ? 10 : 40;
            smddp_barrier(comm, NULL, NULL);
            double ms = time_ms(run_coll, &c, iters);
            double algbw = total / ms / 1e6;
            double f = op == 0 ? 2.0 * (size - 1) / size : (double)(size - 1) / size;
            smddp_barrier(comm, NULL, NULL);
            if (rank == 0) {
                /* The reference: one rank's 2-input reduction over the same bytes, alone. */
                kctx_t k = {{SMDDP_FLOAT32, SMDDP_SUM, 1.0, 0}, out, {in, in}, total / 4, total};
                double km = time_ms(run_kernel, &k, iters);
                printf("%10s %14zu %10.1f %11.1f %11.1f %15.1f\n", names[op], total, ms * 1000,
                       algbw, algbw * f, 3.0 * total / km / 1e6);
                fflush(stdout);
            }
            smddp_barrier(comm, NULL, NULL);
        }
    /*
     * in and out are left to the process's exit: with SMDDP_CUDA_REGISTER_MIN
     * peers map them until they destroy the communicator, and freeing them
     * before would be undefined (cudaIpcOpenMemHandle).
     */
    smddp_comm_destroy(comm);
    return 0;
}

static int coll_bench(int n, int nodes, size_t min_bytes, size_t max_bytes)
{
    bench_spawn(n); /* the parent exits there, with the ranks' verdict */
    return coll_rank(n, nodes, min_bytes, max_bytes);
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "kernel") && strcmp(argv[1], "coll"))) {
        fprintf(stderr, "usage: smddp_gpu_bench kernel [-e BYTES]\n"
                        "       smddp_gpu_bench coll -p N [-N NODES] [-b BYTES] [-e BYTES]\n"
                        "  -N: split the ranks over NODES fake nodes on this machine, so that\n"
                        "      collectives cross the network path (SMDDP_CUDA_NET picks staged\n"
                        "      or nccl)\n");
        return 2;
    }
    int procs = 2, nodes = 1;
    size_t min_bytes = 1u << 20, max_bytes = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-p")) procs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-N")) nodes = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-b")) min_bytes = parse_bytes(argv[i + 1]);
        else if (!strcmp(argv[i], "-e")) max_bytes = parse_bytes(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s; accepted: -p N, -N NODES, -b BYTES, -e BYTES\n",
                    argv[i]);
            return 2;
        }
    }
    if (procs < 1 || procs > 64) {
        fprintf(stderr, "-p %d: give 1 to 64 ranks\n", procs);
        return 2;
    }
    if (nodes < 1 || nodes > procs || procs % nodes != 0) {
        fprintf(stderr, "-N %d: give a number of nodes from 1 to -p that divides it\n", nodes);
        return 2;
    }
    if (!strcmp(argv[1], "kernel")) return kernel_bench(max_bytes ? max_bytes : (1u << 30));
    return coll_bench(procs, nodes, min_bytes, max_bytes ? max_bytes : (256u << 20));
}
