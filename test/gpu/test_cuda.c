/*
 * GPU tests (meson test --suite gpu): the CUDA reduction kernels against the
 * CPU kernels, bit for bit, and every CUDA collective on 2 and 4 ranks that
 * share the machine's GPUs (all on device 0 when there is one).
 *
 * Plain C with the unit tests' fork harness and no CMocka, so that it builds
 * on GPU machines that lack it. Exits 77 (meson's "skipped") with the reason
 * when no CUDA device is usable. CUDA is only touched in forked children: a
 * CUDA context does not survive fork().
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "gpu_util.h"
#include "cuda/kernels.h"
#include "reduce/half.h"
#include "reduce/reduce.h"

static int failures;

/* ---- inputs ------------------------------------------------------------- */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/*
 * Element i of source s: spread values with a sprinkling of the special
 * cases (NaN, infinities, signed zeros, subnormals) for float types.
 */
static void fill(smddp_dtype_t dt, void *buf, size_t n, int s, uint64_t seed, bool specials)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = mix(seed * 1000003u + (uint64_t)s * 7919u + i);
        double v = (double)(int64_t)(r % 2001) / 16.0 - 62.5;
        int special = specials ? (int)(r >> 40) % 64 : -1;
        if (special == 0) v = NAN;
        if (special == 1) v = INFINITY;
        if (special == 2) v = -INFINITY;
        if (special == 3) v = -0.0;
        if (special == 4) v = 1e-40;  /* fp32 subnormal */
        if (special == 5) v = 3e-6;   /* fp16 subnormal */
        switch (dt) {
        case SMDDP_INT8: ((int8_t *)buf)[i] = (int8_t)r; break;
        case SMDDP_UINT8: ((uint8_t *)buf)[i] = (uint8_t)r; break;
        case SMDDP_INT32: ((int32_t *)buf)[i] = (int32_t)(r >> 7); break;
        case SMDDP_INT64: ((int64_t *)buf)[i] = (int64_t)(r >> 3); break;
        case SMDDP_FLOAT16: ((uint16_t *)buf)[i] = smddp__fp32_to_fp16((float)v); break;
        case SMDDP_BFLOAT16: ((uint16_t *)buf)[i] = smddp__fp32_to_bf16((float)v); break;
        case SMDDP_FLOAT32: ((float *)buf)[i] = (float)v; break;
        case SMDDP_FLOAT64: ((double *)buf)[i] = v; break;
        default: break;
        }
    }
}

/* ---- kernels against the CPU ------------------------------------------- */

static const smddp_op_t all_ops[] = {SMDDP_SUM, SMDDP_PROD, SMDDP_MIN, SMDDP_MAX, SMDDP_AVG,
                                     SMDDP_PREMUL_SUM, SMDDP_BAND, SMDDP_BOR, SMDDP_BXOR};

static int kernels(void *arg)
{
    (void)arg;
    const int nsrcs[] = {1, 2, 3, 5, 16};
    const size_t counts[] = {1, 7, 4099, 100003};
    const size_t maxn = 100003 + 8, es_max = 8;
    CU(cudaSetDevice(0));
    char *dsrc[16], *ddst;
    for (int s = 0; s < 16; s++) CU(cudaMalloc((void **)&dsrc[s], maxn * es_max + 64));
    CU(cudaMalloc((void **)&ddst, maxn * es_max + 64));
    char *hsrc[16], *want = malloc(maxn * es_max), *got = malloc(maxn * es_max);
    for (int s = 0; s < 16; s++) hsrc[s] = malloc(maxn * es_max);
    int checked = 0, bad = 0;
    for (int dt = 0; dt < SMDDP_DTYPE_COUNT; dt++) {
        size_t es = smddp_dtype_size((smddp_dtype_t)dt);
        for (size_t oi = 0; oi < sizeof(all_ops) / sizeof(all_ops[0]); oi++) {
            smddp_op_t op = all_ops[oi];
            if (!smddp__reduce_valid((smddp_dtype_t)dt, op)) continue;
            for (size_t ni = 0; ni < sizeof(nsrcs) / sizeof(nsrcs[0]); ni++)
                for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
                    for (int shift = 0; shift < 2; shift++) {
                        int nsrc = nsrcs[ni];
                        size_t n = counts[ci];
                        /* shift 1: every pointer off 16-byte alignment by one element. */
                        size_t off = shift ? es : 0;
                        const void *hs[16], *ds[16];
                        for (int s = 0; s < nsrc; s++) {
                            fill((smddp_dtype_t)dt, hsrc[s], n, s, (uint64_t)(dt * 100 + oi), true);
                            CU(cudaMemcpy(dsrc[s] + off, hsrc[s], n * es, cudaMemcpyHostToDevice));
                            hs[s] = hsrc[s];
                            ds[s] = dsrc[s] + off;
                        }
                        smddp__reduce_spec_t spec = {(smddp_dtype_t)dt, op, 0.375, op == SMDDP_AVG ? nsrc : 0};
                        if (op == SMDDP_AVG && ci % 2) spec.avg_div = 0; /* a partial step */
                        smddp__reduce(&spec, want, hs, nsrc, n);
                        int e = smddp__cuda_reduce(&spec, ddst + off, ds, nsrc, n, NULL);
                        H_CHECK(e == 0, "smddp__cuda_reduce: %s", cudaGetErrorString((cudaError_t)e));
                        CU(cudaDeviceSynchronize());
                        CU(cudaMemcpy(got, ddst + off, n * es, cudaMemcpyDeviceToHost));
                        checked++;
                        if (memcmp(want, got, n * es) != 0) {
                            size_t i = 0;
                            while (memcmp(want + i * es, got + i * es, es) == 0) i++;
                            if (bad++ < 10)
                                fprintf(stderr, "kernel mismatch: %s %s nsrc %d count %zu%s: element "
                                        "%zu differs\n", smddp_dtype_name((smddp_dtype_t)dt),
                                        smddp_op_name(op), nsrc, n, shift ? " (unaligned)" : "", i);
                        }
                    }
        }
    }
    /* dst == a source: in place. */
    {
        size_t n = 4099;
        const void *ds[2] = {dsrc[0], dsrc[1]}, *hs[2] = {hsrc[0], hsrc[1]};
        fill(SMDDP_FLOAT32, hsrc[0], n, 0, 9, false);
        fill(SMDDP_FLOAT32, hsrc[1], n, 1, 9, false);
        CU(cudaMemcpy(dsrc[0], hsrc[0], n * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dsrc[1], hsrc[1], n * 4, cudaMemcpyHostToDevice));
        smddp__reduce_spec_t spec = {SMDDP_FLOAT32, SMDDP_SUM, 1.0, 0};
        smddp__reduce(&spec, want, hs, 2, n);
        H_CHECK(smddp__cuda_reduce(&spec, dsrc[0], ds, 2, n, NULL) == 0, "in-place launch");
        CU(cudaMemcpy(got, dsrc[0], n * 4, cudaMemcpyDeviceToHost));
        checked++;
        if (memcmp(want, got, n * 4) != 0) bad++, fprintf(stderr, "in-place reduction differs\n");
    }
    printf("kernels: %d cases against the CPU kernels, %d differ\n", checked, bad);
    return bad ? 1 : 0;
}

/* ---- collectives ---------------------------------------------------------- */

typedef struct coll_case {
    smddp_dtype_t dt;
    smddp_op_t op;
    size_t count;
} coll_case_t;

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    CU(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static void expect_same(const void *want, const void *dptr, size_t bytes, const char *what, int rank)
{
    char *got = malloc(bytes ? bytes : 1);
    CU(cudaMemcpy(got, dptr, bytes, cudaMemcpyDeviceToHost));
    if (memcmp(want, got, bytes) != 0) {
        size_t i = 0;
        while (((const char *)want)[i] == got[i]) i++;
        H_CHECK(false, "rank %d: %s: byte %zu of %zu differs", rank, what, i, bytes);
    }
    free(got);
}

/* arg: NULL, or an int that is 1 when the ranks sit on two fake nodes and stage through host memory. */
static void run_colls(smddp_comm_t comm, int rank, int size, void *arg)
{
    const int staged = arg ? *(const int *)arg : 0;
    CU(cudaSetDevice(0));
    cudaStream_t stream;
    CU(cudaStreamCreate(&stream));
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.mem_type = SMDDP_MEM_CUDA;
    attr.stream = stream;
    attr.premul_factor = 0.5;

    const coll_case_t cases[] = {
        {SMDDP_FLOAT32, SMDDP_SUM, 1000},      /* one-shot */
        {SMDDP_FLOAT32, SMDDP_AVG, 700001},    /* two-shot, chunked (1 MiB buffer) */
        {SMDDP_BFLOAT16, SMDDP_SUM, 300007},
        {SMDDP_FLOAT16, SMDDP_PREMUL_SUM, 5000},
        {SMDDP_INT32, SMDDP_MAX, 262147},
        {SMDDP_INT8, SMDDP_BXOR, 33},
        {SMDDP_FLOAT64, SMDDP_MIN, 140000},
    };
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        coll_case_t c = cases[ci];
        size_t es = smddp_dtype_size(c.dt), n = c.count, bytes = n * es;
        char **host = malloc((size_t)size * sizeof(char *));
        const void **hp = malloc((size_t)size * sizeof(void *));
        for (int r = 0; r < size; r++) {
            host[r] = malloc(bytes * (size_t)size);
            fill(c.dt, host[r], n * (size_t)size, r, ci, false);
            hp[r] = host[r];
        }
        char *want = malloc(bytes * (size_t)size);
        smddp__reduce_spec_t spec = {c.dt, c.op, 0.5, c.op == SMDDP_AVG ? size : 0};
        char desc[96];
        snprintf(desc, sizeof(desc), "%zu x %s %s", n, smddp_dtype_name(c.dt), smddp_op_name(c.op));

        /* allreduce, out of place and in place */
        char *in = dalloc(bytes * (size_t)size), *out = dalloc(bytes * (size_t)size);
        CU(cudaMemcpy(in, host[rank], bytes, cudaMemcpyHostToDevice));
        smddp_request_t req;
        H_CHECK(smddp_allreduce(comm, in, out, (int64_t)n, c.dt, c.op, &attr, &req) == SMDDP_OK,
                "allreduce: %s", smddp_get_last_error(comm));
        H_CHECK(smddp_request_enqueued(req) == staged, "rank %d: smddp_request_enqueued gave %d "
                "for a %s allreduce", rank, smddp_request_enqueued(req),
                staged ? "staged" : "one-node");
        H_CHECK(smddp_wait(req, SMDDP_WAIT_DEFAULT) == SMDDP_OK, "allreduce wait: %s",
                smddp_get_last_error(comm));
        smddp_request_free(req);
        CU(cudaStreamSynchronize(stream));
        smddp__reduce(&spec, want, hp, size, n);
        char what[160];
        snprintf(what, sizeof(what), "allreduce %s", desc);
        expect_same(want, out, bytes, what, rank);
        if (staged) {
            /*
             * The stream waits for the host's result on the GPU: a copy
             * enqueued right after the call, with no smddp_wait, sees it.
             */
            CU(cudaMemset(out, 0, bytes));
            H_CHECK(smddp_allreduce(comm, in, out, (int64_t)n, c.dt, c.op, &attr, &req) == SMDDP_OK,
                    "allreduce: %s", smddp_get_last_error(comm));
            char *seen = malloc(bytes);
            CU(cudaMemcpyAsync(seen, out, bytes, cudaMemcpyDeviceToHost, stream));
            CU(cudaStreamSynchronize(stream));
            H_CHECK(memcmp(want, seen, bytes) == 0, "rank %d: staged allreduce %s: a copy enqueued "
                    "after it on the stream saw another result", rank, desc);
            free(seen);
            H_CHECK(smddp_wait(req, SMDDP_WAIT_DEFAULT) == SMDDP_OK, "allreduce wait: %s",
                    smddp_get_last_error(comm));
            smddp_request_free(req);
        }
        H_CHECK(smddp_allreduce(comm, in, in, (int64_t)n, c.dt, c.op, &attr, NULL) == SMDDP_OK,
                "allreduce in place: %s", smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        snprintf(what, sizeof(what), "allreduce in place %s", desc);
        expect_same(want, in, bytes, what, rank);

        /* reduce_scatter: block r of every rank's input */
        CU(cudaMemcpy(in, host[rank], bytes * (size_t)size, cudaMemcpyHostToDevice));
        H_CHECK(smddp_reduce_scatter(comm, in, out, (int64_t)n, c.dt, c.op, &attr, NULL) == SMDDP_OK,
                "reduce_scatter: %s", smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        {
            const void **blk = malloc((size_t)size * sizeof(void *));
            for (int r = 0; r < size; r++) blk[r] = host[r] + (size_t)rank * bytes;
            smddp__reduce(&spec, want, blk, size, n);
            free(blk);
        }
        snprintf(what, sizeof(what), "reduce_scatter %s", desc);
        expect_same(want, out, bytes, what, rank);

        /* reduce to the last rank */
        CU(cudaMemcpy(in, host[rank], bytes, cudaMemcpyHostToDevice));
        CU(cudaMemset(out, 0, bytes));
        H_CHECK(smddp_reduce(comm, in, out, (int64_t)n, c.dt, c.op, size - 1, &attr, NULL) == SMDDP_OK,
                "reduce: %s", smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        if (rank == size - 1) {
            smddp__reduce(&spec, want, hp, size, n);
            snprintf(what, sizeof(what), "reduce %s", desc);
            expect_same(want, out, bytes, what, rank);
        }

        /* allgather and gather: rank order */
        for (int r = 0; r < size; r++) memcpy(want + (size_t)r * bytes, host[r], bytes);
        CU(cudaMemcpy(in, host[rank], bytes, cudaMemcpyHostToDevice));
        H_CHECK(smddp_allgather(comm, in, out, (int64_t)n, c.dt, &attr, NULL) == SMDDP_OK,
                "allgather: %s", smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        expect_same(want, out, bytes * (size_t)size, "allgather", rank);
        CU(cudaMemset(out, 0, bytes * (size_t)size));
        H_CHECK(smddp_gather(comm, in, out, (int64_t)n, c.dt, 0, &attr, NULL) == SMDDP_OK,
                "gather: %s", smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        if (rank == 0) expect_same(want, out, bytes * (size_t)size, "gather", rank);

        /* broadcast from rank 1 */
        CU(cudaMemcpy(in, host[rank], bytes, cudaMemcpyHostToDevice));
        H_CHECK(smddp_broadcast(comm, in, (int64_t)n, c.dt, 1, &attr, NULL) == SMDDP_OK,
                "broadcast: %s", smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        expect_same(host[1], in, bytes, "broadcast", rank);

        /* scatter from rank 0; alltoall */
        CU(cudaMemcpy(in, host[rank], bytes * (size_t)size, cudaMemcpyHostToDevice));
        H_CHECK(smddp_scatter(comm, in, out, (int64_t)n, c.dt, 0, &attr, NULL) == SMDDP_OK,
                "scatter: %s", smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        expect_same(host[0] + (size_t)rank * bytes, out, bytes, "scatter", rank);
        H_CHECK(smddp_alltoall(comm, in, out, (int64_t)n, c.dt, &attr, NULL) == SMDDP_OK,
                "alltoall: %s", smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        for (int r = 0; r < size; r++)
            memcpy(want + (size_t)r * bytes, host[r] + (size_t)rank * bytes, bytes);
        expect_same(want, out, bytes * (size_t)size, "alltoall", rank);

        CU(cudaFree(in));
        CU(cudaFree(out));
        for (int r = 0; r < size; r++) free(host[r]);
        free(host);
        free(hp);
        free(want);
    }

    /*
     * 40 allreduces back to back with no host sync, alternating two streams,
     * each on its own buffers, then one check of them all: a rank reusing a
     * staging half before every peer has read it (on either stream) would
     * corrupt some result.
     */
    {
        enum { ROUNDS = 40 };
        size_t n = 1 << 18;
        cudaStream_t s2;
        CU(cudaStreamCreate(&s2));
        uint32_t *h = malloc(n * 4), *want = malloc(n * 4);
        uint32_t *bufs[ROUNDS];
        for (int k = 0; k < ROUNDS; k++) {
            bufs[k] = dalloc(n * 4);
            for (size_t i = 0; i < n; i++) h[i] = (uint32_t)mix(((uint64_t)k * 64 + rank) * n + i);
            CU(cudaMemcpy(bufs[k], h, n * 4, cudaMemcpyHostToDevice));
        }
        for (int k = 0; k < ROUNDS; k++) {
            smddp_coll_attr_t a = attr;
            a.stream = (k & 1) ? s2 : stream;
            H_CHECK(smddp_allreduce(comm, bufs[k], bufs[k], (int64_t)n, SMDDP_INT32, SMDDP_SUM, &a,
                                    NULL) == SMDDP_OK,
                    "round %d: %s", k, smddp_get_last_error(comm));
        }
        CU(cudaDeviceSynchronize());
        for (int k = 0; k < ROUNDS; k++) {
            for (size_t i = 0; i < n; i++) {
                uint32_t v = 0;
                for (int r = 0; r < size; r++) v += (uint32_t)mix(((uint64_t)k * 64 + r) * n + i);
                want[i] = v;
            }
            char what[64];
            snprintf(what, sizeof(what), "back-to-back allreduce %d of %d", k, ROUNDS);
            expect_same(want, bufs[k], n * 4, what, rank);
            CU(cudaFree(bufs[k]));
        }
        CU(cudaStreamDestroy(s2));
        free(h);
        free(want);
    }

    /*
     * Send and receive (staged through host memory): every rank receives
     * from the previous one, then sends to the next, on one stream, without
     * waiting in between; then a receive from any rank. Sizes: one element,
     * and 5 MB.
     */
    for (int k = 0; k < 2; k++) {
        size_t n = k == 0 ? 1 : 1250003;
        int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        uint32_t *h = malloc(n * 4), *want = malloc(n * 4);
        for (size_t i = 0; i < n; i++) {
            h[i] = (uint32_t)mix((uint64_t)rank * n + i);
            want[i] = (uint32_t)mix((uint64_t)prev * n + i);
        }
        uint32_t *sbuf = dalloc(n * 4), *rbuf = dalloc(n * 4);
        CU(cudaMemcpy(sbuf, h, n * 4, cudaMemcpyHostToDevice));
        CU(cudaMemset(rbuf, 0, n * 4));
        smddp_request_t rr, sr;
        H_CHECK(smddp_recv(comm, rbuf, (int64_t)n, SMDDP_INT32, prev, 7, &attr, &rr) == SMDDP_OK,
                "recv: %s", smddp_get_last_error(comm));
        H_CHECK(smddp_send(comm, sbuf, (int64_t)n, SMDDP_INT32, next, 7, &attr, &sr) == SMDDP_OK,
                "send: %s", smddp_get_last_error(comm));
        H_CHECK(smddp_request_enqueued(sr) == 1 && smddp_request_enqueued(rr) == 0,
                "rank %d: enqueued: send %d, recv %d (want 1, 0)", rank, smddp_request_enqueued(sr),
                smddp_request_enqueued(rr));
        H_CHECK(smddp_wait(rr, SMDDP_WAIT_DEFAULT) == SMDDP_OK, "recv wait: %s",
                smddp_get_last_error(comm));
        H_CHECK(smddp_wait(sr, SMDDP_WAIT_DEFAULT) == SMDDP_OK, "send wait: %s",
                smddp_get_last_error(comm));
        smddp_request_free(rr);
        smddp_request_free(sr);
        CU(cudaStreamSynchronize(stream));
        char what[96];
        snprintf(what, sizeof(what), "recv of %zu int32 from rank %d", n, prev);
        expect_same(want, rbuf, n * 4, what, rank);

        /* Rank 0 receives from any rank, size - 1 times; the others send to it. */
        if (rank == 0) {
            int seen = 0;
            for (int j = 1; j < size; j++) {
                int src = -1;
                H_CHECK(smddp_recv(comm, rbuf, (int64_t)n, SMDDP_INT32, SMDDP_ANY_SOURCE, 8, &attr,
                                   &rr) == SMDDP_OK, "recv any: %s", smddp_get_last_error(comm));
                H_CHECK(smddp_wait(rr, SMDDP_WAIT_DEFAULT) == SMDDP_OK &&
                        smddp_request_source(rr, &src) == SMDDP_OK && src > 0 && src < size,
                        "recv any: source %d: %s", src, smddp_get_last_error(comm));
                smddp_request_free(rr);
                CU(cudaStreamSynchronize(stream));
                for (size_t i = 0; i < n; i++) want[i] = (uint32_t)mix((uint64_t)src * n + i);
                snprintf(what, sizeof(what), "recv from any rank (rank %d's)", src);
                expect_same(want, rbuf, n * 4, what, rank);
                seen |= 1 << src;
            }
            H_CHECK(seen == (1 << size) - 2, "rank 0 heard from ranks %#x", seen);
        } else {
            H_CHECK(smddp_send(comm, sbuf, (int64_t)n, SMDDP_INT32, 0, 8, &attr, NULL) == SMDDP_OK,
                    "send to 0: %s", smddp_get_last_error(comm));
        }
        CU(cudaFree(sbuf));
        CU(cudaFree(rbuf));
        free(h);
        free(want);
    }

    /* A host buffer passed as CUDA memory is refused with a clear error. */
    {
        float hbuf[4] = {0};
        smddp_status_t st = smddp_allreduce(comm, hbuf, hbuf, 4, SMDDP_FLOAT32, SMDDP_SUM, &attr, NULL);
        H_CHECK(st == SMDDP_ERR_INVALID_ARGUMENT && strstr(smddp_get_last_error(comm), "not CUDA device memory"),
                "host buffer as CUDA: status %d, %s", (int)st, smddp_get_last_error(comm));
    }
    CU(cudaStreamDestroy(stream));
}

/* ---- SMDDP_CUDA_SYNC=kernel ------------------------------------------------ */

/* One allreduce, reduce_scatter and allgather of n elements, checked; shift: one element off alignment. */
static void ks_case(smddp_comm_t comm, int rank, int size, cudaStream_t stream, smddp_dtype_t dt,
                    smddp_op_t op, size_t n, int shift, uint64_t seed)
{
    size_t es = smddp_dtype_size(dt), bytes = n * es, off = shift ? es : 0;
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.mem_type = SMDDP_MEM_CUDA;
    attr.stream = stream;
    attr.premul_factor = 0.5;
    char **host = malloc((size_t)size * sizeof(char *));
    const void **hp = malloc((size_t)size * sizeof(void *)), **blk = malloc((size_t)size * sizeof(void *));
    for (int r = 0; r < size; r++) {
        host[r] = malloc(bytes * (size_t)size + 1);
        fill(dt, host[r], n * (size_t)size, r, seed, true);
        hp[r] = host[r];
        blk[r] = host[r] + (size_t)rank * bytes;
    }
    char *want = malloc(bytes * (size_t)size + 1);
    char *in = dalloc(bytes * (size_t)size + 16), *out = dalloc(bytes * (size_t)size + 16);
    smddp__reduce_spec_t spec = {dt, op, 0.5, op == SMDDP_AVG ? size : 0};
    char what[160];

    static const char *const names[] = {"allreduce", "reduce_scatter", "allgather"};
    for (int k = 0; k < 3; k++) {
        size_t in_bytes = k == 1 ? bytes * (size_t)size : bytes;
        size_t out_bytes = k == 2 ? bytes * (size_t)size : bytes;
        CU(cudaMemcpy(in + off, host[rank], in_bytes, cudaMemcpyHostToDevice));
        smddp_status_t st =
            k == 0 ? smddp_allreduce(comm, in + off, out + off, (int64_t)n, dt, op, &attr, NULL)
            : k == 1 ? smddp_reduce_scatter(comm, in + off, out + off, (int64_t)n, dt, op, &attr, NULL)
                     : smddp_allgather(comm, in + off, out + off, (int64_t)n, dt, &attr, NULL);
        H_CHECK(st == SMDDP_OK, "kernel %s: %s", names[k], smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        if (k == 2)
            for (int r = 0; r < size; r++) memcpy(want + (size_t)r * bytes, host[r], bytes);
        else
            smddp__reduce(&spec, want, k == 0 ? hp : blk, size, n);
        snprintf(what, sizeof(what), "kernel %s %zu x %s %s%s", names[k], n, smddp_dtype_name(dt),
                 k == 2 ? "" : smddp_op_name(op), shift ? " (unaligned)" : "");
        expect_same(want, out + off, out_bytes, what, rank);
    }

    CU(cudaFree(in));
    CU(cudaFree(out));
    for (int r = 0; r < size; r++) free(host[r]);
    free(host);
    free(hp);
    free(blk);
    free(want);
}

/* A sum allreduce of n elements on attr's stream, captured (relaxed mode) and instantiated. */
static cudaGraphExec_t capture_allreduce(smddp_comm_t comm, void *in, void *out, size_t n,
                                        smddp_dtype_t dt, const smddp_coll_attr_t *attr,
                                        cudaGraph_t *graph)
{
    cudaStream_t stream = (cudaStream_t)attr->stream;
    cudaGraphExec_t exec;
    smddp_request_t req;
    CU(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    H_CHECK(smddp_allreduce(comm, in, out, (int64_t)n, dt, SMDDP_SUM, attr, &req) == SMDDP_OK,
            "allreduce under capture: %s", smddp_get_last_error(comm));
    H_CHECK(smddp_wait(req, SMDDP_WAIT_DEFAULT) == SMDDP_OK, "allreduce under capture: %s",
            smddp_get_last_error(comm));
    smddp_request_free(req);
    CU(cudaStreamEndCapture(stream, graph));
    CU(cudaGraphInstantiate(&exec, *graph, 0));
    return exec;
}

/*
 * Every dtype x op at 0, 1, 17 and 4097 elements (one-shot up to 1 KiB,
 * two-shot above: SMDDP_CUDA_ONESHOT_MAX=1024), aligned and not; float32
 * sum and bfloat16 avg at 1,000,003 elements (chunks of the 1 MiB scratch);
 * then an allreduce captured in a CUDA graph and replayed on new inputs.
 */
static void run_ks_sweep(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    CU(cudaSetDevice(0));
    cudaStream_t stream;
    CU(cudaStreamCreate(&stream));
    const size_t counts[] = {0, 1, 17, 4097};
    int cases = 0;
    for (int dt = 0; dt < SMDDP_DTYPE_COUNT; dt++)
        for (size_t oi = 0; oi < sizeof(all_ops) / sizeof(all_ops[0]); oi++) {
            if (!smddp__reduce_valid((smddp_dtype_t)dt, all_ops[oi])) continue;
            for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++, cases++)
                ks_case(comm, rank, size, stream, (smddp_dtype_t)dt, all_ops[oi], counts[ci],
                        (int)(ci & 1), (uint64_t)cases);
        }
    ks_case(comm, rank, size, stream, SMDDP_FLOAT32, SMDDP_SUM, 1000003, 0, 1);
    ks_case(comm, rank, size, stream, SMDDP_BFLOAT16, SMDDP_AVG, 1000003, 1, 2);

    /* Captured once, replayed five times: the launch counters live on the GPU. */
    {
        size_t n = 100000;
        float *in = dalloc(n * 4), *out = dalloc(n * 4), *h = malloc(n * 4), *want = malloc(n * 4);
        smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
        attr.mem_type = SMDDP_MEM_CUDA;
        attr.stream = stream;
        cudaGraph_t graph;
        cudaGraphExec_t exec = capture_allreduce(comm, in, out, n, SMDDP_FLOAT32, &attr, &graph);
        for (int k = 0; k < 5; k++) {
            for (size_t i = 0; i < n; i++) h[i] = (float)((rank + 1) * (k + 1)) + (float)(i % 7);
            CU(cudaMemcpy(in, h, n * 4, cudaMemcpyHostToDevice));
            CU(cudaGraphLaunch(exec, stream));
            CU(cudaStreamSynchronize(stream));
            for (size_t i = 0; i < n; i++) {
                float v = 0;
                for (int r = 0; r < size; r++) v += (float)((r + 1) * (k + 1)) + (float)(i % 7);
                want[i] = v;
            }
            char what[64];
            snprintf(what, sizeof(what), "graph replay %d of a kernel allreduce", k);
            expect_same(want, out, n * 4, what, rank);
        }
        CU(cudaGraphExecDestroy(exec));
        CU(cudaGraphDestroy(graph));
        CU(cudaFree(in));
        CU(cudaFree(out));
        free(h);
        free(want);
    }
    CU(cudaStreamDestroy(stream));
}

/* ---- registered inputs, read in place --------------------------------------- */

static int32_t reg_value(int round, int r, size_t i)
{
    return (int32_t)mix(((uint64_t)round * 64 + (uint64_t)r) * 1000003u + i);
}

/* Whether this rank's flight recorder saw a collective whose input peers read in place. */
static bool traced_in_place(smddp_comm_t comm, int rank)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/smddp-gpu-trace-%d-%d.json", (int)getpid(), rank);
    if (smddp_comm_dump_trace(comm, path, NULL, 0) != SMDDP_OK) return false;
    FILE *f = fopen(path, "r");
    bool found = false;
    char line[4096];
    while (f && !found && fgets(line, sizeof(line), f)) found = strstr(line, "input in place") != NULL;
    if (f) fclose(f);
    unlink(path);
    return found;
}

/*
 * SMDDP_CUDA_REGISTER_MIN=4096: the same buffers through rounds of
 * allreduce (out of place and in place), reduce_scatter and allgather (also
 * in place), so that from the third op on peers read the inputs where they
 * lie; then a second input buffer (the first stays allocated, as
 * registration requires), and a graph captured on registered buffers is
 * replayed on new inputs. The flight recorder must show inputs read in place.
 */
static void run_ks_registered(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    CU(cudaSetDevice(0));
    enum { ROUNDS = 4 };
    size_t n = 3000000, bytes = n * 4, P = (size_t)size;
    cudaStream_t stream;
    CU(cudaStreamCreate(&stream));
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.mem_type = SMDDP_MEM_CUDA;
    attr.stream = stream;
    int32_t *h = malloc(bytes * P), *want = malloc(bytes * P);
    char *in = dalloc(bytes * P), *out = dalloc(bytes * P);
    char what[96];
    for (int round = 0; round < 2 * ROUNDS; round++) {
        if (round == ROUNDS) in = dalloc(bytes * P); /* the first stays allocated */
        for (size_t i = 0; i < n * P; i++) h[i] = reg_value(round, rank, i);
        CU(cudaMemcpy(in, h, bytes, cudaMemcpyHostToDevice));
        for (size_t i = 0; i < n; i++) {
            uint32_t v = 0;
            for (int r = 0; r < size; r++) v += (uint32_t)reg_value(round, r, i);
            want[i] = (int32_t)v;
        }
        H_CHECK(smddp_allreduce(comm, in, out, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL) ==
                    SMDDP_OK, "allreduce: %s", smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        snprintf(what, sizeof(what), "round %d: registered allreduce", round);
        expect_same(want, out, bytes, what, rank);
        H_CHECK(smddp_allreduce(comm, in, in, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr, NULL) ==
                    SMDDP_OK, "allreduce: %s", smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        snprintf(what, sizeof(what), "round %d: registered allreduce in place", round);
        expect_same(want, in, bytes, what, rank);

        CU(cudaMemcpy(in, h, bytes * P, cudaMemcpyHostToDevice));
        for (size_t i = 0; i < n; i++) {
            uint32_t v = 0;
            for (int r = 0; r < size; r++) v += (uint32_t)reg_value(round, r, (size_t)rank * n + i);
            want[i] = (int32_t)v;
        }
        H_CHECK(smddp_reduce_scatter(comm, in, out, (int64_t)n, SMDDP_INT32, SMDDP_SUM, &attr,
                                     NULL) == SMDDP_OK, "reduce_scatter: %s",
                smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        snprintf(what, sizeof(what), "round %d: registered reduce_scatter", round);
        expect_same(want, out, bytes, what, rank);

        for (int r = 0; r < size; r++)
            for (size_t i = 0; i < n; i++) want[(size_t)r * n + i] = reg_value(round, r, i);
        CU(cudaMemcpy(in, h, bytes, cudaMemcpyHostToDevice));
        H_CHECK(smddp_allgather(comm, in, out, (int64_t)n, SMDDP_INT32, &attr, NULL) == SMDDP_OK,
                "allgather: %s", smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        snprintf(what, sizeof(what), "round %d: registered allgather", round);
        expect_same(want, out, bytes * P, what, rank);
        CU(cudaMemcpy(in + (size_t)rank * bytes, h, bytes, cudaMemcpyHostToDevice));
        H_CHECK(smddp_allgather(comm, in + (size_t)rank * bytes, in, (int64_t)n, SMDDP_INT32,
                                &attr, NULL) == SMDDP_OK,
                "allgather: %s", smddp_get_last_error(comm));
        CU(cudaStreamSynchronize(stream));
        snprintf(what, sizeof(what), "round %d: registered allgather in place", round);
        expect_same(want, in, bytes * P, what, rank);
    }
    H_CHECK(traced_in_place(comm, rank), "rank %d: no collective read its input in place", rank);

    /* A graph captured on the registered buffers, replayed on new inputs. */
    cudaGraph_t graph;
    cudaGraphExec_t exec = capture_allreduce(comm, in, out, n, SMDDP_INT32, &attr, &graph);
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < n; i++) h[i] = reg_value(100 + k, rank, i);
        CU(cudaMemcpy(in, h, bytes, cudaMemcpyHostToDevice));
        CU(cudaGraphLaunch(exec, stream));
        CU(cudaStreamSynchronize(stream));
        for (size_t i = 0; i < n; i++) {
            uint32_t v = 0;
            for (int r = 0; r < size; r++) v += (uint32_t)reg_value(100 + k, r, i);
            want[i] = (int32_t)v;
        }
        snprintf(what, sizeof(what), "graph replay %d of a registered allreduce", k);
        expect_same(want, out, bytes, what, rank);
    }
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));
    /*
     * Registered buffers must outlive the communicator: they are left to the
     * process's exit, after the harness destroyed it (once every rank is done).
     */
    CU(cudaStreamDestroy(stream));
    H_CHECK(smddp_barrier(comm, NULL, NULL) == SMDDP_OK, "barrier: %s", smddp_get_last_error(comm));
    free(h);
    free(want);
}

/*
 * The last rank dies after the first allreduce. The others' next allreduce
 * returns at once (the host does not wait); its kernel gives up after
 * SMDDP_TIMEOUT (3 s), so the stream finishes and the GPU is free; the
 * allreduce after it fails, naming the rank that did not come.
 */
static void run_ks_dead_peer(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    CU(cudaSetDevice(0));
    cudaStream_t stream;
    CU(cudaStreamCreate(&stream));
    size_t n = 1 << 16;
    float *buf = dalloc(n * 4);
    CU(cudaMemset(buf, 0, n * 4));
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.mem_type = SMDDP_MEM_CUDA;
    attr.stream = stream;
    H_CHECK(smddp_allreduce(comm, buf, buf, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM, &attr, NULL) ==
                SMDDP_OK, "first allreduce: %s", smddp_get_last_error(comm));
    CU(cudaStreamSynchronize(stream));
    if (rank == size - 1) _exit(0);
    usleep(500 * 1000);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    H_CHECK(smddp_allreduce(comm, buf, buf, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM, &attr, NULL) ==
                SMDDP_OK, "second allreduce (the launch): %s", smddp_get_last_error(comm));
    CU(cudaStreamSynchronize(stream));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    H_CHECK(s >= 2.9 && s < 15.0, "rank %d: the kernel waiting for a dead rank ended after %.2f s "
            "(SMDDP_TIMEOUT is 3 s)", rank, s);
    H_CHECK(smddp_comm_status(comm) != SMDDP_OK, "rank %d: smddp_comm_status is OK after the "
            "kernel gave up", rank);
    smddp_status_t st = smddp_allreduce(comm, buf, buf, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM, &attr, NULL);
    /* Timed out here, or stopped by the other survivor's kernel, or its abort came first. */
    char dead[32];
    snprintf(dead, sizeof(dead), "waiting for rank %d", size - 1);
    const char *msg = smddp_get_last_error(comm);
    H_CHECK((st == SMDDP_ERR_TIMEOUT || st == SMDDP_ERR_ABORTED) &&
                (strstr(msg, dead) || strstr(msg, "gave up waiting")),
            "rank %d: allreduce after the kernel gave up: status %d, %s", rank, (int)st, msg);
    /* The GPU is not hung: ordinary work still runs. */
    CU(cudaMemsetAsync(buf, 0, n * 4, stream));
    CU(cudaStreamSynchronize(stream));
    _exit(0); /* destroy would wait for the dead rank's shared-memory goodbye */
}

/* smddp_comm_abort on rank 0 while its kernel waits for rank 1 (which never calls): it stops at once. */
static void run_ks_abort(smddp_comm_t comm, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    CU(cudaSetDevice(0));
    cudaStream_t stream;
    CU(cudaStreamCreate(&stream));
    size_t n = 1 << 10;
    float *buf = dalloc(n * 4);
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    attr.mem_type = SMDDP_MEM_CUDA;
    attr.stream = stream;
    H_CHECK(smddp_allreduce(comm, buf, buf, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM, &attr, NULL) ==
                SMDDP_OK, "first allreduce: %s", smddp_get_last_error(comm));
    CU(cudaStreamSynchronize(stream));
    if (rank != 0) {
        sleep(3);
        _exit(0);
    }
    H_CHECK(smddp_allreduce(comm, buf, buf, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM, &attr, NULL) ==
                SMDDP_OK, "second allreduce (the launch): %s", smddp_get_last_error(comm));
    usleep(300 * 1000);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    smddp_comm_abort(comm);
    CU(cudaStreamSynchronize(stream));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    H_CHECK(s < 2.0, "rank 0: the kernel went on %.2f s after smddp_comm_abort (SMDDP_TIMEOUT 60 s)", s);
    _exit(0);
}

int main(void)
{
    int st = gpu_in_child(gpu_probe, NULL);
    if (st == 77) return 77;
    if (st != 0) {
        printf("FAIL: probing the GPU failed (status %d)\n", st);
        return 1;
    }
    for (int n = 2; n <= 4; n += 2) {
        harness_opts_t opts = {0};
        opts.env = "SMDDP_CUDA_BUFFER_SIZE=1048576";
        opts.timeout_s = 240;
        int bad = harness_run(n, run_colls, NULL, &opts);
        printf("%s: CUDA collectives on %d ranks sharing GPU 0\n", bad ? "FAIL" : "PASS", n);
        failures += bad != 0;
    }
#if SMDDP_HAVE_OFI
    /* Two fake nodes on this machine (libfabric over loopback): staged through host memory. */
    for (int n = 2; n <= 4; n += 2) {
        harness_opts_t opts = {0};
        opts.env = "SMDDP_CUDA_NET=staged SMDDP_CUDA_STAGE_CHUNK=65536";
        opts.timeout_s = 300;
        opts.ranks_per_node = n / 2;
        int staged = 1;
        int bad = harness_run(n, run_colls, &staged, &opts);
        printf("%s: CUDA collectives across 2 nodes x %d rank(s), staged through host memory\n",
               bad ? "FAIL" : "PASS", n / 2);
        failures += bad != 0;
    }
#else
    printf("SKIP: CUDA collectives across nodes: this libsmddp has no libfabric\n");
#endif
    /* The same collectives with the kernels synchronising on the GPU. */
    for (int n = 2; n <= 4; n += 2) {
        harness_opts_t opts = {0};
        opts.env = "SMDDP_CUDA_BUFFER_SIZE=1048576 SMDDP_CUDA_SYNC=kernel";
        opts.timeout_s = 240;
        int bad = harness_run(n, run_colls, NULL, &opts);
        printf("%s: CUDA collectives on %d ranks sharing GPU 0, SMDDP_CUDA_SYNC=kernel\n",
               bad ? "FAIL" : "PASS", n);
        failures += bad != 0;
        opts.env = "SMDDP_CUDA_BUFFER_SIZE=1048576 SMDDP_CUDA_SYNC=kernel SMDDP_CUDA_ONESHOT_MAX=1024";
        opts.timeout_s = 400;
        bad = harness_run(n, run_ks_sweep, NULL, &opts);
        printf("%s: kernel allreduce/reduce_scatter/allgather, every dtype x op at 0, 1, 17, 4097 "
               "and 1000003 elements, and under graph capture, on %d ranks\n",
               bad ? "FAIL" : "PASS", n);
        failures += bad != 0;
        opts.env = "SMDDP_CUDA_BUFFER_SIZE=1048576 SMDDP_CUDA_SYNC=kernel "
                   "SMDDP_CUDA_REGISTER_MIN=4096";
        opts.timeout_s = 240;
        bad = harness_run(n, run_ks_registered, NULL, &opts);
        printf("%s: registered inputs read in place by peers (allreduce, also in place; "
               "reduce_scatter; allgather, also in place; a new buffer at a freed one's "
               "address; graph replay), %d ranks\n", bad ? "FAIL" : "PASS", n);
        failures += bad != 0;
    }
    {
        harness_opts_t opts = {0};
        opts.env = "SMDDP_CUDA_SYNC=kernel SMDDP_TIMEOUT=3";
        opts.timeout_s = 60;
        int bad = harness_run(3, run_ks_dead_peer, NULL, &opts);
        printf("%s: a rank dies while the others' kernels wait for it: they give up after "
               "SMDDP_TIMEOUT\n", bad ? "FAIL" : "PASS");
        failures += bad != 0;
        opts.env = "SMDDP_CUDA_SYNC=kernel SMDDP_TIMEOUT=60";
        bad = harness_run(2, run_ks_abort, NULL, &opts);
        printf("%s: smddp_comm_abort stops a kernel that waits for a peer\n", bad ? "FAIL" : "PASS");
        failures += bad != 0;
    }
    st = gpu_in_child(kernels, NULL);
    printf("%s: CUDA kernels bit for bit against the CPU kernels\n", st ? "FAIL" : "PASS");
    failures += st != 0;
    return failures ? 1 : 0;
}
