/*
 * Collective kernels over peers' scratch mapped through CUDA IPC, with the
 * ranks synchronised by flags in device memory (ksync.h): one launch per
 * chunk, no interprocess event, no host barrier.
 *
 * Each block copies its vectors of this rank's input into this rank's
 * scratch (unless the input is registered: then peers read it in place),
 * meets its peers' block of the same index, and reads their data: a
 * one-shot allreduce reduces every rank's copy in rank order; a
 * two-shot one reduces only this rank's piece, in place, meets again, and
 * gathers the pieces; a reduce-scatter reduces row `rank` of every copy; an
 * allgather copies every rank's scratch into its row of the output. The
 * arithmetic is elem.cuh's, so the results are the CPU kernels' bits.
 *
 * A launch has at most smddp__ks_comm_t::max_blocks blocks (ipc.c:
 * half the SMs of the smallest GPU, divided among the ranks sharing one),
 * and one block fits per SM, so every block of a launch is resident at once
 * and a block never waits for one that cannot start, even beside another
 * communicator's kernel or, under MPS, the kernels of ranks sharing the GPU.
 * Ranks that share a GPU without MPS run in turns (time slices), and a
 * barrier then waits for the next turn.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "elem.cuh"
#include "ipc_kernels.h"
#include "ksync.h"

using smddp_cuda::Elem;

namespace {

constexpr int kThreads = 512;

/* 16 bytes at p, of which valid (> 0) are the job's; the rest read as zero. */
__device__ __forceinline__ uint4 load16(const char *p, size_t valid)
{
    if (valid >= 16 && ((uintptr_t)p & 15) == 0) return *reinterpret_cast<const uint4 *>(p);
    uint4 v = make_uint4(0, 0, 0, 0);
    char *b = reinterpret_cast<char *>(&v);
    size_t n = valid < 16 ? valid : 16;
    for (size_t k = 0; k < n; k++) b[k] = p[k];
    return v;
}

/* The first min(valid, 16) bytes of v to p. */
__device__ __forceinline__ void store16(char *p, uint4 v, size_t valid)
{
    if (valid >= 16 && ((uintptr_t)p & 15) == 0) {
        *reinterpret_cast<uint4 *>(p) = v;
        return;
    }
    const char *b = reinterpret_cast<const char *>(&v);
    size_t n = valid < 16 ? valid : 16;
    for (size_t k = 0; k < n; k++) p[k] = b[k];
}

/* A peer's vector, past L1 (written by another GPU or context during this launch). */
__device__ __forceinline__ uint4 load_peer(const char *p)
{
    return __ldcg(reinterpret_cast<const uint4 *>(p));
}

/* This block's barrier at stage; false if the rank's kernels gave up. */
__device__ __forceinline__ bool barrier(const smddp__ks_comm_t &c, int stage, uint32_t e)
{
    __syncthreads();
    uint32_t r = smddp__ks_arrive_wait(&c, stage, (int)blockIdx.x, e, (int)threadIdx.x,
                                       (int)blockDim.x);
    return __syncthreads_or(r != SMDDP_KS_OK) == 0;
}

/* This block's number for the launch in *e; false if the rank's kernels have stopped. */
__device__ __forceinline__ bool begin(const smddp__ks_comm_t &c, uint32_t *e)
{
    __shared__ uint32_t se;
    __shared__ int go;
    if (threadIdx.x == 0) go = smddp__ks_begin(&c, (int)blockIdx.x, &se);
    __syncthreads();
    *e = se;
    return go != 0;
}

/* Copies rows of bytes (pitch apart in src) into the scratch, a row per padded stride. */
__device__ __forceinline__ void copy_in(char *scratch, const char *src, size_t bytes, size_t pitch,
                                       int rows)
{
    const size_t nvec = smddp__ks_vectors(bytes), stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int r = 0; r < rows; r++)
        for (size_t i = tid; i < nvec; i += stride) {
            size_t off = i * SMDDP_KS_VEC;
            uint4 v = load16(src + (size_t)r * pitch + off, bytes - off);
            *reinterpret_cast<uint4 *>(scratch + (size_t)r * nvec * SMDDP_KS_VEC + off) = v;
        }
}

/*
 * Block-wide, after barrier 0: where every rank's data for this launch is
 * (its scratch or its registered buffer), at row `row` of it.
 */
__device__ __forceinline__ void sources(const smddp__ks_comm_t &c, const smddp__ks_job_t &j,
                                        int row, const char **src)
{
    if ((int)threadIdx.x < c.nranks) {
        size_t stride;
        const char *p = smddp__ks_src(&c, &j, (int)blockIdx.x, (int)threadIdx.x, &stride);
        src[threadIdx.x] = p + (size_t)row * stride;
    }
    __syncthreads();
}

/* The reduction, in rank order, of every rank's vector at offset off of src. */
template <smddp_dtype_t DT, smddp_op_t ACC, smddp_op_t OUT>
__device__ __forceinline__ uint4 reduce_vec(const smddp__ks_comm_t &c, const char *const *src,
                                            size_t off, typename Elem<DT>::A p,
                                            typename Elem<DT>::D d)
{
    uint4 w[SMDDP_KS_MAX_RANKS];
    /* Every load in flight before any arithmetic. */
#pragma unroll
    for (int q = 0; q < SMDDP_KS_MAX_RANKS; q++)
        if (q < c.nranks) w[q] = load_peer(src[q] + off);
    smddp_cuda::Vec<DT, ACC, OUT> acc;
    acc.first(w[0], p);
#pragma unroll
    for (int q = 1; q < SMDDP_KS_MAX_RANKS; q++) {
        if (q >= c.nranks) break;
        acc.comb(w[q], p);
    }
    return acc.finish(d);
}

template <smddp_dtype_t DT, smddp_op_t ACC, smddp_op_t OUT>
__global__ void __launch_bounds__(kThreads, 1)
    reduce_kernel(smddp__ks_comm_t c, smddp__ks_job_t j, typename Elem<DT>::A p,
                  typename Elem<DT>::D d)
{
    uint32_t e;
    if (!begin(c, &e)) return;
    const int me = c.rank;
    const size_t nvec = smddp__ks_vectors(j.bytes), stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    char *own = smddp__ks_scratch(&c, me);
    char *out = static_cast<char *>(j.out);
    const bool rs = j.kind == SMDDP_KS_REDUCE_SCATTER;
    __shared__ const char *src[SMDDP_KS_MAX_RANKS];

    if (threadIdx.x == 0) smddp__ks_publish_src(&c, &j, (int)blockIdx.x);
    if (!j.slot)
        copy_in(own, static_cast<const char *>(j.in), j.bytes, j.pitch, rs ? c.nranks : 1);
    if (!barrier(c, 0, e)) return;
    /* One-shot and two-shot: every rank's data; the reduce-scatter: row me of it. */
    sources(c, j, rs ? me : 0, src);

    if (j.kind != SMDDP_KS_ALLREDUCE_TWOSHOT) {
        for (size_t i = tid; i < nvec; i += stride) {
            size_t off = i * SMDDP_KS_VEC;
            store16(out + off, reduce_vec<DT, ACC, OUT>(c, src, off, p, d), j.bytes - off);
        }
        barrier(c, 1, e);
        return;
    }

    size_t lo, hi;
    smddp__ks_piece(nvec, c.nranks, me, &lo, &hi);
    for (size_t i = smddp__ks_first(lo, tid, stride); i < hi; i += stride) {
        size_t off = i * SMDDP_KS_VEC;
        *reinterpret_cast<uint4 *>(own + off) = reduce_vec<DT, ACC, OUT>(c, src, off, p, d);
    }
    if (!barrier(c, 1, e)) return;
    for (size_t i = tid; i < nvec; i += stride) {
        size_t off = i * SMDDP_KS_VEC;
        int q = smddp__ks_piece_of(nvec, c.nranks, i);
        store16(out + off, load_peer(smddp__ks_scratch(&c, q) + off), j.bytes - off);
    }
    barrier(c, 2, e);
}

__global__ void __launch_bounds__(kThreads, 1) gather_kernel(smddp__ks_comm_t c, smddp__ks_job_t j)
{
    uint32_t e;
    if (!begin(c, &e)) return;
    const size_t nvec = smddp__ks_vectors(j.bytes), stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    char *out = static_cast<char *>(j.out);
    __shared__ const char *src[SMDDP_KS_MAX_RANKS];

    if (threadIdx.x == 0) smddp__ks_publish_src(&c, &j, (int)blockIdx.x);
    if (!j.slot)
        copy_in(smddp__ks_scratch(&c, c.rank), static_cast<const char *>(j.in), j.bytes, 0, 1);
    if (!barrier(c, 0, e)) return;
    sources(c, j, 0, src);
    for (int q = 0; q < c.nranks; q++) {
        const char *theirs = src[q];
        /* In place, this rank's row of the output is its input: already there. */
        if (theirs == out + (size_t)q * j.pitch) continue;
        for (size_t i = tid; i < nvec; i += stride) {
            size_t off = i * SMDDP_KS_VEC;
            store16(out + (size_t)q * j.pitch + off, load_peer(theirs + off), j.bytes - off);
        }
    }
    barrier(c, 1, e);
}

unsigned grid_of(const smddp__ks_comm_t *c, size_t bytes)
{
    size_t blocks = (smddp__ks_vectors(bytes) + kThreads - 1) / kThreads;
    if (blocks > (size_t)c->max_blocks) blocks = (size_t)c->max_blocks;
    if (blocks > SMDDP_KS_MAX_BLOCKS) blocks = SMDDP_KS_MAX_BLOCKS;
    return blocks ? (unsigned)blocks : 1u;
}

/* The reduce kernel for one (dtype, op), through smddp_cuda::dispatch. */
struct ReduceLaunch {
    const smddp__ks_comm_t *c;
    const smddp__ks_job_t *j;
    const smddp__reduce_spec_t *spec;
    cudaStream_t st;
    template <smddp_dtype_t DT, smddp_op_t ACC, smddp_op_t OUT>
    int run() const
    {
        using E = Elem<DT>;
        reduce_kernel<DT, ACC, OUT><<<grid_of(c, j->bytes), kThreads, 0, st>>>(
            *c, *j, E::kFloat ? (typename E::A)spec->premul : (typename E::A)0,
            (typename E::D)spec->avg_div);
        return (int)cudaGetLastError();
    }
};

} // namespace

extern "C" int smddp__ks_launch(const smddp__ks_comm_t *c, const smddp__ks_job_t *job,
                                const smddp__reduce_spec_t *spec, void *stream)
{
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (c->nranks < 1 || c->nranks > SMDDP_KS_MAX_RANKS || c->max_blocks < 1)
        return (int)cudaErrorInvalidValue;
    if (job->bytes == 0) return 0;
    if (job->kind == SMDDP_KS_ALLGATHER) {
        gather_kernel<<<grid_of(c, job->bytes), kThreads, 0, st>>>(*c, *job);
        return (int)cudaGetLastError();
    }
    return smddp_cuda::dispatch(spec, ReduceLaunch{c, job, spec, st});
}
