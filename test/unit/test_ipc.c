/*
 * CUDA collectives inside a node through CUDA IPC (core/cuda/ipc.c),
 * on the CPU against the stand-in runtime (fake_cudart.c): "device" memory
 * is shared memory peers map through IPC handles, streams are threads,
 * interprocess events are counters in shared memory, and the collective
 * kernels of SMDDP_CUDA_SYNC=kernel run as the CPU model of ks_model.c.
 * This checks the host side of both synchronisations (setup and the handle
 * exchange, chunks, in place and unaligned buffers, stream order across
 * streams, the kernels' failure record, abort, teardown) where no GPU is;
 * test/gpu/test_cuda.c runs the same on one.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "harness.h"
#include "ks_model.h"
#include "param.h"
#include "reduce/half.h"
#include "reduce/reduce.h"

#define ENV_SMALL "SMDDP_CUDA_BUFFER_SIZE=65536 SMDDP_CUDA_ONESHOT_MAX=1024"

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* n elements of dt for rank r: integers anywhere, floats on a grid (sums stay exact-ish). */
static void fill(smddp_dtype_t dt, void *buf, size_t n, int r, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t x = mix(seed * 1000003u + (uint64_t)r * 7919u + i);
        double v = (double)(int64_t)(x % 2001) / 16.0 - 62.5;
        switch (dt) {
        case SMDDP_FLOAT32: ((float *)buf)[i] = (float)v; break;
        case SMDDP_FLOAT64: ((double *)buf)[i] = v; break;
        case SMDDP_FLOAT16: ((uint16_t *)buf)[i] = smddp__fp32_to_fp16((float)v); break;
        case SMDDP_BFLOAT16: ((uint16_t *)buf)[i] = smddp__fp32_to_bf16((float)v); break;
        default: memcpy((char *)buf + i * smddp_dtype_size(dt), &x, smddp_dtype_size(dt)); break;
        }
    }
}

static void *dev(size_t bytes)
{
    void *p = NULL;
    H_CHECK(cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess, "cudaMalloc");
    return p;
}

static smddp_coll_attr_t cuda_attr(cudaStream_t st)
{
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.mem_type = SMDDP_MEM_CUDA;
    attr.stream = st;
    attr.premul_factor = 0.5;
    return attr;
}

/* After the stream's work so far, bytes at d must equal want. */
static void expect(cudaStream_t st, const void *want, const void *d, size_t bytes,
                   const char *what, int rank)
{
    char *got = malloc(bytes + 1);
    cudaMemcpyAsync(got, d, bytes, cudaMemcpyDeviceToHost, st);
    cudaStreamSynchronize(st);
    for (size_t i = 0; i < bytes; i++)
        H_CHECK(got[i] == ((const char *)want)[i], "rank %d: %s: byte %zu of %zu differs", rank,
                what, i, bytes);
    free(got);
}

typedef struct kase {
    smddp_dtype_t dt;
    smddp_op_t op;
} kase_t;

static const kase_t kases[] = {
    {SMDDP_INT32, SMDDP_SUM},   {SMDDP_FLOAT32, SMDDP_SUM},         {SMDDP_BFLOAT16, SMDDP_AVG},
    {SMDDP_INT8, SMDDP_BXOR},   {SMDDP_FLOAT64, SMDDP_MIN},         {SMDDP_FLOAT16, SMDDP_PREMUL_SUM},
    {SMDDP_UINT8, SMDDP_MAX},   {SMDDP_INT64, SMDDP_PROD},
};
static const size_t counts[] = {0, 1, 17, 4097, 100003};

/*
 * allreduce, reduce_scatter and allgather of every case at every count,
 * aligned and one element off, out of place; allreduce in place too. The
 * 64 KiB buffer makes the larger ones go in chunks; one-shot up to 1 KiB.
 */
static void sweep_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    cudaStream_t st;
    cudaStreamCreate(&st);
    smddp_coll_attr_t attr = cuda_attr(st);
    int k = 0;
    for (size_t ki = 0; ki < sizeof(kases) / sizeof(kases[0]); ki++)
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++, k++) {
            smddp_dtype_t dt = kases[ki].dt;
            smddp_op_t op = kases[ki].op;
            size_t n = counts[ci], es = smddp_dtype_size(dt), bytes = n * es;
            size_t off = (size_t)(k & 1) * es;
            char **host = malloc((size_t)size * sizeof(char *));
            const void **whole = malloc((size_t)size * sizeof(void *));
            const void **blk = malloc((size_t)size * sizeof(void *));
            for (int r = 0; r < size; r++) {
                host[r] = malloc(bytes * (size_t)size + 1);
                fill(dt, host[r], n * (size_t)size, r, (uint64_t)k);
                whole[r] = host[r];
                blk[r] = host[r] + (size_t)rank * bytes;
            }
            char *want = malloc(bytes * (size_t)size + 1);
            char *in = dev(bytes * (size_t)size + 16), *out = dev(bytes * (size_t)size + 16);
            smddp__reduce_spec_t spec = {dt, op, 0.5, op == SMDDP_AVG ? size : 0};
            char what[128];
            snprintf(what, sizeof(what), "%zu x %s %s%s", n, smddp_dtype_name(dt),
                     smddp_op_name(op), off ? " (unaligned)" : "");

            cudaMemcpyAsync(in + off, host[rank], bytes, cudaMemcpyHostToDevice, st);
            H_OK(smddp_allreduce(comm, in + off, out + off, (int64_t)n, dt, op, &attr, NULL));
            smddp__reduce(&spec, want, whole, size, n);
            expect(st, want, out + off, bytes, what, rank);
            H_OK(smddp_allreduce(comm, in + off, in + off, (int64_t)n, dt, op, &attr, NULL));
            expect(st, want, in + off, bytes, what, rank);

            cudaMemcpyAsync(in + off, host[rank], bytes * (size_t)size, cudaMemcpyHostToDevice, st);
            H_OK(smddp_reduce_scatter(comm, in + off, out + off, (int64_t)n, dt, op, &attr, NULL));
            smddp__reduce(&spec, want, blk, size, n);
            expect(st, want, out + off, bytes, what, rank);

            cudaMemcpyAsync(in + off, host[rank], bytes, cudaMemcpyHostToDevice, st);
            H_OK(smddp_allgather(comm, in + off, out + off, (int64_t)n, dt, &attr, NULL));
            for (int r = 0; r < size; r++) memcpy(want + (size_t)r * bytes, host[r], bytes);
            expect(st, want, out + off, bytes * (size_t)size, what, rank);

            cudaFree(in);
            cudaFree(out);
            for (int r = 0; r < size; r++) free(host[r]);
            free(host);
            free(whole);
            free(blk);
            free(want);
        }
    cudaStreamDestroy(st);
}

/*
 * 12 allreduces and allgathers back to back on two streams, nothing
 * synchronised until the end: each rank's launches must keep their order
 * across streams, whichever synchronisation runs them. Then the collectives
 * that always go through events, between kernel ones.
 */
static void streams_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    enum { ROUNDS = 12 };
    size_t n = 30001;
    cudaStream_t st[2];
    cudaStreamCreate(&st[0]);
    cudaStreamCreate(&st[1]);
    int32_t *h = malloc(n * 4 * (size_t)size), *want = malloc(n * 4 * (size_t)size);
    int32_t *in[ROUNDS], *out[ROUNDS];
    for (int k = 0; k < ROUNDS; k++) {
        in[k] = dev(n * 4);
        out[k] = dev(n * 4 * (size_t)size);
        for (size_t i = 0; i < n; i++) h[i] = (int32_t)mix(((uint64_t)k * 64 + (uint64_t)rank) * n + i);
        cudaMemcpy(in[k], h, n * 4, cudaMemcpyHostToDevice);
    }
    for (int k = 0; k < ROUNDS; k++) {
        smddp_coll_attr_t a = cuda_attr(st[k & 1]);
        if (k % 3 == 2)
            H_OK(smddp_allgather(comm, in[k], out[k], (int64_t)n, SMDDP_INT32, &a, NULL));
        else
            H_OK(smddp_allreduce(comm, in[k], out[k], (int64_t)n, SMDDP_INT32, SMDDP_SUM, &a, NULL));
    }
    cudaDeviceSynchronize();
    cudaStreamSynchronize(st[0]);
    cudaStreamSynchronize(st[1]);
    for (int k = 0; k < ROUNDS; k++) {
        size_t bytes = n * 4;
        if (k % 3 == 2) {
            for (int r = 0; r < size; r++)
                for (size_t i = 0; i < n; i++)
                    want[(size_t)r * n + i] = (int32_t)mix(((uint64_t)k * 64 + (uint64_t)r) * n + i);
            bytes *= (size_t)size;
        } else {
            for (size_t i = 0; i < n; i++) {
                uint32_t v = 0;
                for (int r = 0; r < size; r++) v += (uint32_t)mix(((uint64_t)k * 64 + (uint64_t)r) * n + i);
                want[i] = (int32_t)v;
            }
        }
        char what[64];
        snprintf(what, sizeof(what), "back-to-back collective %d of %d", k, ROUNDS);
        expect(st[k & 1], want, out[k], bytes, what, rank);
    }

    /* broadcast (events) between two allreduces (kernel, when on), one stream, no sync */
    smddp_coll_attr_t a = cuda_attr(st[0]);
    H_OK(smddp_allreduce(comm, in[0], out[0], (int64_t)n, SMDDP_INT32, SMDDP_SUM, &a, NULL));
    H_OK(smddp_broadcast(comm, out[0], (int64_t)n, SMDDP_INT32, size - 1, &a, NULL));
    H_OK(smddp_allreduce(comm, out[0], out[1], (int64_t)n, SMDDP_INT32, SMDDP_SUM, &a, NULL));
    for (size_t i = 0; i < n; i++) {
        uint32_t v = 0;
        for (int r = 0; r < size; r++) v += (uint32_t)mix((uint64_t)r * n + i);
        want[i] = (int32_t)(v * (uint32_t)size);
    }
    expect(st[0], want, out[1], n * 4, "allreduce, broadcast, allreduce", rank);

    for (int k = 0; k < ROUNDS; k++) {
        cudaFree(in[k]);
        cudaFree(out[k]);
    }
    free(h);
    free(want);
    cudaStreamDestroy(st[0]);
    cudaStreamDestroy(st[1]);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * The last rank leaves after one allreduce. The others' next allreduce
 * returns at once; its kernel gives up after SMDDP_TIMEOUT (2 s), so their
 * stream finishes; the allreduce after it fails, naming the missing rank.
 */
static void dead_peer_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    cudaStream_t st;
    cudaStreamCreate(&st);
    smddp_coll_attr_t attr = cuda_attr(st);
    size_t n = 5000;
    int32_t *buf = dev(n * 4);
    H_OK(smddp_allreduce(comm, buf, buf, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL));
    cudaStreamSynchronize(st);
    if (rank == size - 1) _exit(0);
    usleep(300 * 1000);
    double t0 = now_s();
    H_OK(smddp_allreduce(comm, buf, buf, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL));
    double issued = now_s() - t0;
    cudaStreamSynchronize(st);
    double ended = now_s() - t0;
    H_CHECK(issued < 1.0, "rank %d: the allreduce took %.2f s to return; the host should not wait",
            rank, issued);
    H_CHECK(ended >= 1.9 && ended < 10.0,
            "rank %d: the kernel waiting for a dead rank ended after %.2f s (SMDDP_TIMEOUT 2 s)", rank,
            ended);
    /* The stream finished; the communicator says it failed, before any later call. */
    H_CHECK(smddp_comm_status(comm) != SMDDP_OK, "rank %d: smddp_comm_status is OK after the "
            "kernel gave up", rank);
    smddp_status_t s = smddp_allreduce(comm, buf, buf, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL);
    /*
     * This rank's kernel timed out waiting for the dead one, or the other
     * survivor's did first and stopped it; or that survivor failed its next
     * collective first and the abort reached this rank before its own check.
     */
    char dead[32];
    snprintf(dead, sizeof(dead), "waiting for rank %d", size - 1);
    const char *msg = smddp_get_last_error(comm);
    H_CHECK((s == SMDDP_ERR_TIMEOUT || s == SMDDP_ERR_ABORTED) &&
                (strstr(msg, dead) || strstr(msg, "gave up waiting")),
            "rank %d: the allreduce after the kernel gave up: status %d, \"%s\"", rank, (int)s, msg);
    _exit(0); /* the dead rank cannot say goodbye: skip destroy */
}

/* smddp_comm_abort while rank 0's kernel waits for rank 1 (which never comes): it stops at once. */
static void abort_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    cudaStream_t st;
    cudaStreamCreate(&st);
    smddp_coll_attr_t attr = cuda_attr(st);
    size_t n = 100;
    int32_t *buf = dev(n * 4);
    H_OK(smddp_allreduce(comm, buf, buf, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL));
    cudaStreamSynchronize(st);
    if (rank != 0) {
        sleep(2);
        _exit(0);
    }
    H_OK(smddp_allreduce(comm, buf, buf, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL));
    usleep(200 * 1000);
    double t0 = now_s();
    smddp_comm_abort(comm);
    cudaStreamSynchronize(st);
    double t = now_s() - t0;
    H_CHECK(t < 1.5, "rank 0: the kernel went on %.2f s after smddp_comm_abort (SMDDP_TIMEOUT 60 s)", t);
    _exit(0);
}

/* The expected allreduce (int32 sum) of fill_round's inputs, element i. */
static int32_t round_value(int round, int r, size_t i)
{
    return (int32_t)mix(((uint64_t)round * 64 + (uint64_t)r) * 1000003u + i);
}

static void fill_round(int32_t *h, size_t n, int round, int r, size_t first)
{
    for (size_t i = 0; i < n; i++) h[i] = round_value(round, r, first + i);
}

/*
 * Registered inputs (SMDDP_CUDA_REGISTER_MIN=4096): the same buffers
 * through rounds of allreduce (out of place and in place), reduce-scatter
 * and allgather (also in place); from the third op on, peers read them
 * where they lie. Then the input is freed and allocated again, most likely
 * at the same address. A program must not do that to a registered
 * allocation on a GPU (peers keep it mapped); the stand-in runtime keeps
 * the freed memory mapped, which shows the cache is keyed by the buffer ID:
 * the new allocation is registered anew, not read through the old slot.
 * Then an unaligned input and a reduce-scatter in place are copied in.
 * With arg set, rank 1 turns registration off: its launches copy in beside
 * peers that do not, and it still maps theirs.
 */
static void registered_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    if (arg && rank == 1) {
        setenv("SMDDP_CUDA_REGISTER_MIN", "0", 1);
        smddp__params_reload();
    }
    enum { ROUNDS = 5 };
    size_t n = 30000, bytes = n * 4, P = (size_t)size;
    cudaStream_t st;
    cudaStreamCreate(&st);
    smddp_coll_attr_t attr = cuda_attr(st);
    int32_t *h = malloc(bytes * P), *want = malloc(bytes * P);
    char *in = dev(bytes * P + 64), *out = dev(bytes * P + 64);
    unsigned long before = ks_model_in_place_reads;
    for (int round = 0; round < 2 * ROUNDS; round++) {
        char what[96];
        if (round == ROUNDS) { /* a new allocation where the old one was, most likely */
            cudaStreamSynchronize(st);
            cudaFree(in);
            in = dev(bytes * P + 64);
        }
        fill_round(h, n, round, rank, 0);
        cudaMemcpyAsync(in, h, bytes, cudaMemcpyHostToDevice, st);
        for (size_t i = 0; i < n; i++) {
            uint32_t v = 0;
            for (int r = 0; r < size; r++) v += (uint32_t)round_value(round, r, i);
            want[i] = (int32_t)v;
        }
        snprintf(what, sizeof(what), "round %d: registered allreduce", round);
        H_OK(smddp_allreduce(comm, in, out, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL));
        expect(st, want, out, bytes, what, rank);
        snprintf(what, sizeof(what), "round %d: registered allreduce in place", round);
        H_OK(smddp_allreduce(comm, in, in, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL));
        expect(st, want, in, bytes, what, rank);

        fill_round(h, n * P, round, rank, 0);
        cudaMemcpyAsync(in, h, bytes * P, cudaMemcpyHostToDevice, st);
        for (size_t i = 0; i < n; i++) {
            uint32_t v = 0;
            for (int r = 0; r < size; r++)
                v += (uint32_t)round_value(round, r, (size_t)rank * n + i);
            want[i] = (int32_t)v;
        }
        snprintf(what, sizeof(what), "round %d: registered reduce_scatter", round);
        H_OK(smddp_reduce_scatter(comm, in, out, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL));
        expect(st, want, out, bytes, what, rank);

        for (int r = 0; r < size; r++) fill_round(want + (size_t)r * n, n, round, r, 0);
        fill_round(h, n, round, rank, 0);
        cudaMemcpyAsync(in, h, bytes, cudaMemcpyHostToDevice, st);
        snprintf(what, sizeof(what), "round %d: registered allgather", round);
        H_OK(smddp_allgather(comm, in, out, (int64_t)n, SMDDP_INT32, &attr, NULL));
        expect(st, want, out, bytes * P, what, rank);
        /* In place: the input is this rank's row of the output. */
        cudaMemcpyAsync(in + (size_t)rank * bytes, h, bytes, cudaMemcpyHostToDevice, st);
        snprintf(what, sizeof(what), "round %d: registered allgather in place", round);
        H_OK(smddp_allgather(comm, in + (size_t)rank * bytes, in, (int64_t)n, SMDDP_INT32, &attr,
                             NULL));
        expect(st, want, in, bytes * P, what, rank);
    }
    /* Unaligned: copied in. */
    fill_round(h, n, 99, rank, 0);
    cudaMemcpyAsync(in + 4, h, bytes, cudaMemcpyHostToDevice, st);
    for (size_t i = 0; i < n; i++) {
        uint32_t v = 0;
        for (int r = 0; r < size; r++) v += (uint32_t)round_value(99, r, i);
        want[i] = (int32_t)v;
    }
    H_OK(smddp_allreduce(comm, in + 4, out + 4, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL));
    expect(st, want, out + 4, bytes, "unaligned allreduce", rank);
    /* Reduce-scatter in place: the output is this rank's row of the input. */
    fill_round(h, n * P, 98, rank, 0);
    cudaMemcpyAsync(in, h, bytes * P, cudaMemcpyHostToDevice, st);
    for (size_t i = 0; i < n; i++) {
        uint32_t v = 0;
        for (int r = 0; r < size; r++) v += (uint32_t)round_value(98, r, (size_t)rank * n + i);
        want[i] = (int32_t)v;
    }
    H_OK(smddp_reduce_scatter(comm, in, in + (size_t)rank * bytes, (int64_t)n, SMDDP_INT32,
                              SMDDP_SUM, &attr, NULL));
    expect(st, want, in + (size_t)rank * bytes, bytes, "reduce_scatter in place", rank);
    /* Where a peer registers, this rank read its input in place. */
    bool peers_register = !arg || size > 2 || rank == 1;
    H_CHECK(!peers_register || ks_model_in_place_reads > before,
            "rank %d: no launch read a peer's input in place", rank);
    H_CHECK(peers_register || ks_model_in_place_reads == before,
            "rank %d: read in place from a peer that does not register", rank);
    cudaFree(in);
    cudaFree(out);
    free(h);
    free(want);
    cudaStreamDestroy(st);
}

static void run(int n, harness_fn_t fn, const char *env)
{
    harness_opts_t opts = {0};
    opts.env = env;
    opts.timeout_s = 240;
    assert_int_equal(harness_run(n, fn, NULL, &opts), 0);
}

static void test_sweep_events_2(void **s) { (void)s; run(2, sweep_rank, ENV_SMALL " SMDDP_CUDA_SYNC=events"); }
static void test_sweep_kernel_2(void **s) { (void)s; run(2, sweep_rank, ENV_SMALL " SMDDP_CUDA_SYNC=kernel"); }
static void test_sweep_kernel_3(void **s) { (void)s; run(3, sweep_rank, ENV_SMALL " SMDDP_CUDA_SYNC=kernel"); }
static void test_streams_events_3(void **s) { (void)s; run(3, streams_rank, ENV_SMALL " SMDDP_CUDA_SYNC=events"); }
static void test_streams_kernel_3(void **s) { (void)s; run(3, streams_rank, ENV_SMALL " SMDDP_CUDA_SYNC=kernel"); }
static void test_kernel_dead_peer_3(void **s) { (void)s; run(3, dead_peer_rank, "SMDDP_CUDA_SYNC=kernel SMDDP_TIMEOUT=2"); }
static void test_kernel_abort_2(void **s) { (void)s; run(2, abort_rank, "SMDDP_CUDA_SYNC=kernel SMDDP_TIMEOUT=60"); }

#define ENV_REGISTER ENV_SMALL " SMDDP_CUDA_SYNC=kernel SMDDP_CUDA_REGISTER_MIN=4096"

static void run_arg(int n, harness_fn_t fn, void *arg, const char *env)
{
    harness_opts_t opts = {0};
    opts.env = env;
    opts.timeout_s = 240;
    assert_int_equal(harness_run(n, fn, arg, &opts), 0);
}

static void test_registered_2(void **s) { (void)s; run(2, registered_rank, ENV_REGISTER); }
static void test_registered_3(void **s) { (void)s; run(3, registered_rank, ENV_REGISTER); }
/* One-shot too: up to 256 KiB. */
static void test_registered_oneshot_2(void **s)
{
    (void)s;
    run(2, registered_rank, ENV_REGISTER " SMDDP_CUDA_ONESHOT_MAX=262144");
}
/* Rank 1 does not register: launches mix inputs read in place and copied in. */
static void test_registered_mixed_2(void **s)
{
    (void)s;
    static int on = 1;
    run_arg(2, registered_rank, &on, ENV_REGISTER);
}

/* A setting and the value each rank gives it. */
typedef struct differ {
    const char *name, *values[2];
} differ_t;

/* Ranks that disagree on a setting the CUDA path needs the same everywhere fail, saying so. */
static void mismatch_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    const differ_t *d = arg;
    (void)size;
    /* The harness gives every rank the same environment: each sets its own before its first CUDA call. */
    setenv(d->name, d->values[rank], 1);
    smddp__params_reload();
    cudaStream_t st;
    cudaStreamCreate(&st);
    smddp_coll_attr_t attr = cuda_attr(st);
    int32_t *buf = dev(64);
    smddp_status_t s = smddp_allreduce(comm, buf, buf, 16, SMDDP_INT32, SMDDP_SUM, &attr, NULL);
    char want[64];
    snprintf(want, sizeof(want), "%s differs", d->name);
    H_CHECK(s != SMDDP_OK && strstr(smddp_get_last_error(comm), want),
            "rank %d: status %d, \"%s\"", rank, (int)s, smddp_get_last_error(comm));
    _exit(0);
}

static void test_sync_mismatch(void **s)
{
    (void)s;
    static const differ_t settings[] = {
        {"SMDDP_CUDA_SYNC", {"kernel", "events"}},
        {"SMDDP_CUDA_ONESHOT_MAX", {"1024", "4096"}},
        {"SMDDP_CUDA_KERNEL_BLOCKS", {"2", "0"}},
    };
    for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++) {
        harness_opts_t opts = {0};
        opts.timeout_s = 60;
        opts.env = "SMDDP_TIMEOUT=10 SMDDP_CUDA_SYNC=kernel";
        assert_int_equal(harness_run(2, mismatch_rank, (void *)&settings[i], &opts), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sweep_events_2),
        cmocka_unit_test(test_sweep_kernel_2),
        cmocka_unit_test(test_sweep_kernel_3),
        cmocka_unit_test(test_streams_events_3),
        cmocka_unit_test(test_streams_kernel_3),
        cmocka_unit_test(test_kernel_dead_peer_3),
        cmocka_unit_test(test_kernel_abort_2),
        cmocka_unit_test(test_registered_2),
        cmocka_unit_test(test_registered_3),
        cmocka_unit_test(test_registered_oneshot_2),
        cmocka_unit_test(test_registered_mixed_2),
        cmocka_unit_test(test_sync_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
