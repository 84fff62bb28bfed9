/*
 * CUDA collectives across nodes staged through pinned host memory, and
 * send/recv of CUDA memory (core/cuda/stage.c), run on the CPU against a
 * stand-in CUDA runtime (fake_cudart.c) whose streams are threads that keep
 * stream order and really wait for the host's flags. This checks the
 * staging logic (sizes, chunks, sequence numbers, stream order, releases on
 * failure) where no GPU is; test/gpu/test_cuda.c runs the same paths on one.
 */
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

#define STAGED_ENV "SMDDP_CUDA_NET=staged SMDDP_CUDA_STAGE_CHUNK=4096"

static int32_t val(int r, size_t i) { return (int32_t)(r * 1000003 + (int64_t)i * 7 % 100000); }

static void *dev(size_t bytes)
{
    void *p = NULL;
    H_CHECK(cudaMalloc(&p, bytes) == cudaSuccess, "cudaMalloc");
    return p;
}

/* A new stream, and attributes for CUDA memory on it. */
static smddp_coll_attr_t cuda_attr(cudaStream_t *st)
{
    cudaStreamCreate(st);
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.mem_type = SMDDP_MEM_CUDA;
    attr.stream = *st;
    return attr;
}

/* Copies a device buffer back after the stream's work so far, and compares. */
static void expect(cudaStream_t st, const int32_t *want, const int32_t *d, size_t n,
                   const char *what, int rank)
{
    int32_t *got = malloc(n * 4 + 4);
    cudaMemcpyAsync(got, d, n * 4, cudaMemcpyDeviceToHost, st);
    cudaStreamSynchronize(st);
    for (size_t i = 0; i < n; i++)
        H_CHECK(got[i] == want[i], "rank %d: %s: element %zu of %zu is %d, want %d", rank, what, i,
                n, got[i], want[i]);
    free(got);
}

/*
 * Every collective on "device" memory across nodes. Inputs are written on
 * the stream right before each call, with no synchronisation, and results
 * are read back on the stream right after it, without smddp_wait: so the
 * copies to the host must follow the stream's earlier work, and the stream
 * must wait for the host's results.
 */
static void colls_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    const size_t n = 10007; /* int32: 10 chunks of 4096 bytes */
    const int root = size - 1;
    cudaStream_t st;
    smddp_coll_attr_t attr = cuda_attr(&st);
    size_t all = n * (size_t)size;
    int32_t *mine = malloc(all * 4), *want = malloc(all * 4);
    for (size_t i = 0; i < all; i++) mine[i] = val(rank, i);
    int32_t *in = dev(all * 4), *out = dev(all * 4);

    /* allreduce, out of place, with a request */
    cudaMemcpyAsync(in, mine, n * 4, cudaMemcpyHostToDevice, st);
    smddp_request_t req;
    H_OK(smddp_allreduce(comm, in, out, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, &req));
    H_CHECK(smddp_request_enqueued(req) == 1, "a staged allreduce is not enqueued");
    for (size_t i = 0; i < n; i++) {
        want[i] = 0;
        for (int r = 0; r < size; r++) want[i] += val(r, i);
    }
    expect(st, want, out, n, "allreduce", rank);
    H_OK(smddp_wait(req, SMDDP_WAIT_DEFAULT));
    smddp_request_free(req);

    /* allreduce in place, blocking; max */
    cudaMemcpyAsync(in, mine, n * 4, cudaMemcpyHostToDevice, st);
    H_OK(smddp_allreduce(comm, in, in, (int64_t)n, SMDDP_INT32, SMDDP_MAX, &attr, NULL));
    for (size_t i = 0; i < n; i++) want[i] = val(size - 1, i); /* val grows with r */
    expect(st, want, in, n, "allreduce in place (max)", rank);

    /* reduce to the last rank: only it gets a result */
    cudaMemcpyAsync(in, mine, n * 4, cudaMemcpyHostToDevice, st);
    int32_t *zero = calloc(n, 4);
    cudaMemcpyAsync(out, zero, n * 4, cudaMemcpyHostToDevice, st);
    H_OK(smddp_reduce(comm, in, rank == root ? out : NULL, (int64_t)n, SMDDP_INT32, SMDDP_SUM,
                      root, &attr, NULL));
    for (size_t i = 0; i < n; i++) {
        want[i] = 0;
        for (int r = 0; r < size; r++) want[i] += val(r, i);
    }
    expect(st, rank == root ? want : zero, out, n, "reduce", rank);

    /* broadcast from rank 1 */
    cudaMemcpyAsync(in, mine, n * 4, cudaMemcpyHostToDevice, st);
    H_OK(smddp_broadcast(comm, in, (int64_t)n, SMDDP_INT32, 1, &attr, NULL));
    for (size_t i = 0; i < n; i++) want[i] = val(1, i);
    expect(st, want, in, n, "broadcast", rank);

    /* allgather and gather to 0: rank order */
    cudaMemcpyAsync(in, mine, n * 4, cudaMemcpyHostToDevice, st);
    H_OK(smddp_allgather(comm, in, out, (int64_t)n, SMDDP_INT32, &attr, NULL));
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++) want[(size_t)r * n + i] = val(r, i);
    expect(st, want, out, all, "allgather", rank);
    cudaMemcpyAsync(out, zero, n * 4, cudaMemcpyHostToDevice, st);
    H_OK(smddp_gather(comm, in, rank == 0 ? out : NULL, (int64_t)n, SMDDP_INT32, 0, &attr, NULL));
    if (rank == 0) expect(st, want, out, all, "gather", rank);

    /* reduce_scatter: block `rank` of everyone's input, summed */
    cudaMemcpyAsync(in, mine, all * 4, cudaMemcpyHostToDevice, st);
    H_OK(smddp_reduce_scatter(comm, in, out, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL));
    for (size_t i = 0; i < n; i++) {
        want[i] = 0;
        for (int r = 0; r < size; r++) want[i] += val(r, (size_t)rank * n + i);
    }
    expect(st, want, out, n, "reduce_scatter", rank);

    /* alltoall: block `rank` of every rank's input, in rank order */
    H_OK(smddp_alltoall(comm, in, out, (int64_t)n, SMDDP_INT32, &attr, NULL));
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++) want[(size_t)r * n + i] = val(r, (size_t)rank * n + i);
    expect(st, want, out, all, "alltoall", rank);

    /* scatter from 0 */
    H_OK(smddp_scatter(comm, rank == 0 ? in : NULL, out, (int64_t)n, SMDDP_INT32, 0, &attr, NULL));
    for (size_t i = 0; i < n; i++) want[i] = val(0, (size_t)rank * n + i);
    expect(st, want, out, n, "scatter", rank);

    /* alltoallv: rank s sends (s + d) % 3 * 100 + 1 elements to rank d */
    {
        int64_t sc[16], sd[16], rc[16], rd[16], so = 0, ro = 0;
        for (int d = 0; d < size; d++) {
            sc[d] = (rank + d) % 3 * 100 + 1;
            sd[d] = so;
            so += sc[d];
            rc[d] = (d + rank) % 3 * 100 + 1;
            rd[d] = ro;
            ro += rc[d];
        }
        H_OK(smddp_alltoallv(comm, in, sc, sd, out, rc, rd, SMDDP_INT32, &attr, NULL));
        for (int s = 0; s < size; s++) {
            int64_t their = 0; /* where rank s's block for me starts in its input */
            for (int d = 0; d < rank; d++) their += (s + d) % 3 * 100 + 1;
            for (int64_t i = 0; i < rc[s]; i++) want[rd[s] + i] = val(s, (size_t)(their + i));
        }
        expect(st, want, out, (size_t)ro, "alltoallv", rank);
    }

    /* Many allreduces on two streams, never waited for, then checked together. */
    {
        enum { K = 8 };
        cudaStream_t s2;
        cudaStreamCreate(&s2);
        int32_t *b[K];
        for (int k = 0; k < K; k++) {
            b[k] = dev(n * 4);
            smddp_coll_attr_t a = attr;
            a.stream = (k & 1) ? s2 : st;
            for (size_t i = 0; i < n; i++) mine[i] = val(rank + k, i);
            cudaMemcpy(b[k], mine, n * 4, cudaMemcpyHostToDevice);
            H_OK(smddp_allreduce(comm, b[k], b[k], (int64_t)n, SMDDP_INT32, SMDDP_SUM, &a, &req));
            smddp_request_free(req);
        }
        for (int k = 0; k < K; k++) {
            for (size_t i = 0; i < n; i++) {
                want[i] = 0;
                for (int r = 0; r < size; r++) want[i] += val(r + k, i);
            }
            expect((k & 1) ? s2 : st, want, b[k], n, "back-to-back allreduce", rank);
            cudaFree(b[k]);
        }
        cudaStreamDestroy(s2);
    }
    /* Every rank is done reading before anyone's comm goes. */
    H_OK(smddp_barrier(comm, NULL, NULL));
    cudaFree(in);
    cudaFree(out);
    free(zero);
    free(mine);
    free(want);
    cudaStreamDestroy(st);
}

/*
 * send/recv of device memory: a ring exchange posted receive first on one
 * stream (which must not deadlock), with the send's data written on the
 * stream just before; then receives from any rank.
 */
static void p2p_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    cudaStream_t st;
    smddp_coll_attr_t attr = cuda_attr(&st);
    const size_t sizes[] = {1, 300001};
    for (int k = 0; k < 2; k++) {
        size_t n = sizes[k];
        int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        int32_t *h = malloc(n * 4), *want = malloc(n * 4);
        for (size_t i = 0; i < n; i++) {
            h[i] = val(rank, i);
            want[i] = val(prev, i);
        }
        int32_t *sb = dev(n * 4), *rb = dev(n * 4);
        smddp_request_t rr, sr;
        H_OK(smddp_recv(comm, rb, (int64_t)n, SMDDP_INT32, prev, 3, &attr, &rr));
        cudaMemcpyAsync(sb, h, n * 4, cudaMemcpyHostToDevice, st);
        H_OK(smddp_send(comm, sb, (int64_t)n, SMDDP_INT32, next, 3, &attr, &sr));
        H_CHECK(smddp_request_enqueued(sr) == 1 && smddp_request_enqueued(rr) == 0,
                "enqueued: send %d, recv %d", smddp_request_enqueued(sr), smddp_request_enqueued(rr));
        H_OK(smddp_wait(rr, SMDDP_WAIT_DEFAULT));
        H_OK(smddp_wait(sr, SMDDP_WAIT_DEFAULT));
        smddp_request_free(rr);
        smddp_request_free(sr);
        expect(st, want, rb, n, "ring recv", rank);

        if (rank == 0) {
            int seen = 0;
            for (int j = 1; j < size; j++) {
                int src = -1;
                H_OK(smddp_recv(comm, rb, (int64_t)n, SMDDP_INT32, SMDDP_ANY_SOURCE, 4, &attr, &rr));
                H_OK(smddp_wait(rr, SMDDP_WAIT_DEFAULT));
                H_OK(smddp_request_source(rr, &src));
                smddp_request_free(rr);
                H_CHECK(src > 0 && src < size, "source %d", src);
                for (size_t i = 0; i < n; i++) want[i] = val(src, i);
                expect(st, want, rb, n, "recv from any rank", rank);
                seen |= 1 << src;
            }
            H_CHECK(seen == (1 << size) - 2, "heard from %#x", seen);
        } else {
            H_OK(smddp_send(comm, sb, (int64_t)n, SMDDP_INT32, 0, 4, &attr, NULL));
        }
        H_OK(smddp_barrier(comm, NULL, NULL));
        cudaFree(sb);
        cudaFree(rb);
        free(h);
        free(want);
    }
    cudaStreamDestroy(st);
}

/*
 * A staged collective that fails (its peer never issues it) releases the
 * stream: work queued behind it runs, nothing hangs.
 */
static void failure_rank(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    cudaStream_t st;
    smddp_coll_attr_t attr = cuda_attr(&st);
    size_t n = 5000;
    int32_t *d = dev(n * 4), *h = calloc(n, 4);
    if (rank == 0) {
        smddp_status_t s = smddp_allreduce(comm, d, d, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL);
        H_CHECK(s == SMDDP_ERR_TIMEOUT || s == SMDDP_ERR_PEER_LOST || s == SMDDP_ERR_ABORTED,
                "allreduce without its peer returned %s: %s", smddp_status_string(s),
                smddp_get_last_error(comm));
        /* The stream is free again: a copy queued behind the failed op completes. */
        time_t t0 = time(NULL);
        cudaMemcpyAsync(h, d, n * 4, cudaMemcpyDeviceToHost, st);
        cudaStreamSynchronize(st);
        H_CHECK(time(NULL) - t0 < 5, "the stream stayed blocked after the failure");
    } else {
        sleep(4); /* past rank 0's 1 s timeout, then leave */
    }
    cudaFree(d);
    free(h);
    cudaStreamDestroy(st);
}

static void run_nodes(int nranks, int per_node, harness_fn_t fn, const char *env)
{
    harness_opts_t opts = {.timeout_s = 300, .ranks_per_node = per_node, .env = env};
    int shm_before = harness_shm_count();
    assert_int_equal(harness_run(nranks, fn, NULL, &opts), 0);
    assert_int_equal(harness_shm_count(), shm_before);
}

static void test_stage_colls_2x1(void **state) { (void)state; run_nodes(2, 1, colls_rank, STAGED_ENV); }
static void test_stage_colls_2x2(void **state) { (void)state; run_nodes(4, 2, colls_rank, STAGED_ENV); }
/* Staging inside the chunked pipeline with one big chunk (the default size). */
static void test_stage_colls_default_chunk(void **state)
{
    (void)state;
    run_nodes(2, 1, colls_rank, "SMDDP_CUDA_NET=staged");
}
/* auto, where NCCL does not load: the ranks agree on staging at the first collective. */
static void test_stage_colls_auto_without_nccl(void **state)
{
    (void)state;
    run_nodes(4, 2, colls_rank,
              "SMDDP_NCCL_LIBRARY=/nonexistent/libnccl.so.2 SMDDP_CUDA_STAGE_CHUNK=4096");
}
static void test_stage_p2p_1x3(void **state) { (void)state; run_nodes(3, 3, p2p_rank, NULL); }
static void test_stage_p2p_2x2(void **state) { (void)state; run_nodes(4, 2, p2p_rank, NULL); }
static void test_stage_failure_releases_stream(void **state)
{
    (void)state;
    run_nodes(2, 1, failure_rank, STAGED_ENV " SMDDP_TIMEOUT=1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stage_colls_2x1),
        cmocka_unit_test(test_stage_colls_2x2),
        cmocka_unit_test(test_stage_colls_default_chunk),
        cmocka_unit_test(test_stage_colls_auto_without_nccl),
        cmocka_unit_test(test_stage_p2p_1x3),
        cmocka_unit_test(test_stage_p2p_2x2),
        cmocka_unit_test(test_stage_failure_releases_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
