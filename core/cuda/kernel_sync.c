/*
 * The host side of SMDDP_CUDA_SYNC=kernel (kernel_sync.h): per chunk, one
 * launch of ipc_kernels.cu on the op's stream. The host neither waits nor
 * meets its peers; before each collective it reads the kernels' verdict
 * (host memory the device writes), and smddp__comm_abort sets the abort
 * word the kernels poll.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../comm.h"

#if SMDDP_HAVE_CUDA
#include "kernel_sync.h"
#include "../param.h"
#include "cuda_error.h"
#include "ipc_kernels.h"

smddp_status_t smddp__ksync_prepare(smddp_comm_t comm, smddp__ksync_t *k, void *region)
{
    /*
     * Flags and launch counters start at zero before any peer can see them;
     * on a stream of its own, beside whatever stream is being captured.
     */
    cudaStream_t zs;
    CUDA_TRY(comm, cudaStreamCreateWithFlags(&zs, cudaStreamNonBlocking));
    cudaError_t e = cudaMemsetAsync(region, 0, SMDDP_KS_SCRATCH_OFFSET, zs);
    if (e == cudaSuccess) e = cudaStreamSynchronize(zs);
    cudaStreamDestroy(zs);
    if (e != cudaSuccess) return smddp__cuda_error(comm, "zeroing the kernels' flags", e);
    CUDA_TRY(comm, cudaHostAlloc((void **)&k->ctl, sizeof(*k->ctl), cudaHostAllocMapped));
    memset(k->ctl, 0, sizeof(*k->ctl));
    CUDA_TRY(comm, cudaHostGetDevicePointer((void **)&k->ks.control, k->ctl, 0));
    CUDA_TRY(comm, cudaEventCreateWithFlags(&k->done, cudaEventDisableTiming));
    return SMDDP_OK;
}

void smddp__ksync_attach(smddp_comm_t comm, smddp__ksync_t *k, char *const *regions,
                         int max_blocks)
{
    for (int q = 0; q < comm->local_size; q++) k->ks.region[q] = (smddp__ks_region_t *)regions[q];
    k->ks.rank = comm->local_rank;
    k->ks.nranks = comm->local_size;
    k->ks.max_blocks = max_blocks;
    pthread_mutex_lock(&comm->err_lock);
    comm->cuda_abort = &k->ctl->abort;
    if (atomic_load(&comm->aborted)) k->ctl->abort = 1;
    pthread_mutex_unlock(&comm->err_lock);
}

/* Why this rank's kernels gave up, in words (the control block says they did). */
static const char *verdict(smddp_comm_t comm, const smddp__ksync_t *k)
{
    static _Thread_local char why[320];
    const smddp__ks_control_t *ctl = k->ctl;
    int q = (int)ctl->peer;
    int rank = q >= 0 && q < comm->local_size ? comm->local_ranks[q] : -1;
    switch (__atomic_load_n(&ctl->failed, __ATOMIC_ACQUIRE)) {
    case SMDDP_KS_TIMEOUT:
        snprintf(why, sizeof(why), "it stopped waiting for rank %d (barrier %u of block %u's "
                 "launch %u): rank %d did not arrive within SMDDP_TIMEOUT (did it die, or issue "
                 "another collective?)", rank, ctl->stage, ctl->block, ctl->epoch, rank);
        break;
    case SMDDP_KS_PEER:
        snprintf(why, sizeof(why), "rank %d's kernel gave up waiting (timeout or abort there) "
                 "and stopped this rank's (block %u)", rank, ctl->block);
        break;
    default:
        snprintf(why, sizeof(why), "it stopped waiting for rank %d (barrier %u of block %u's "
                 "launch %u): the communicator was aborted", rank, ctl->stage, ctl->block,
                 ctl->epoch);
        break;
    }
    return why;
}

smddp_status_t smddp__ksync_check(smddp_comm_t comm, const smddp__ksync_t *k)
{
    uint32_t why = __atomic_load_n(&k->ctl->failed, __ATOMIC_ACQUIRE);
    if (why == SMDDP_KS_OK) return SMDDP_OK;
    return smddp__error(why == SMDDP_KS_ABORTED ? SMDDP_ERR_ABORTED : SMDDP_ERR_TIMEOUT,
                        "rank %d: a CUDA collective kernel gave up, so its output is not valid: %s",
                        comm->rank, verdict(comm, k));
}

/* One launch of job on the op's stream. */
static smddp_status_t run(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op,
                          const smddp__ks_job_t *job)
{
    cudaStream_t stream = (cudaStream_t)op->stream;
    int64_t ms = smddp__op_timeout_ms(comm, op);
    k->ks.timeout_ns = ms <= 0 || (uint64_t)ms >= UINT64_MAX / 1000000u ? UINT64_MAX
                                                                         : (uint64_t)ms * 1000000u;
    smddp__reduce_spec_t spec = op->spec;
    spec.avg_div = spec.op == SMDDP_AVG ? comm->size : 0;
    /*
     * Every launch waits for the one before it, wherever that ran: another
     * stream, or a CUDA graph replayed since. Launches running side by side
     * would share the launch counters and the scratch. Under capture, the
     * wait and the record are "external" nodes, so that every replay waits
     * for the latest launch and records its own.
     */
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUDA_TRY(comm, cudaStreamIsCapturing(stream, &cap));
    bool captured = cap == cudaStreamCaptureStatusActive;
    if (k->launched) {
        cudaError_t w = cudaStreamWaitEvent(stream, k->done, captured ? cudaEventWaitExternal : 0);
        if (w != cudaSuccess)
            return smddp__error(SMDDP_ERR_SYSTEM,
                                "rank %d: ordering this CUDA %s after this communicator's previous "
                                "one failed: %s",
                                comm->rank, smddp__op_kind_name(op->kind), cudaGetErrorString(w));
    }
    int e = smddp__ks_launch(&k->ks, job, &spec, stream);
    if (e != 0) return smddp__cuda_error(comm, "the collective kernel's launch", (cudaError_t)e);
    if (captured)
        CUDA_TRY(comm, cudaEventRecordWithFlags(k->done, stream, cudaEventRecordExternal));
    else
        CUDA_TRY(comm, cudaEventRecord(k->done, stream));
    k->launched = true;
    return SMDDP_OK;
}

/*
 * Runs kind over bytes per rank in chunks that fit the scratch (rows of the
 * input, or of the output, pitch apart): chunk k of every row in launch k.
 */
static smddp_status_t chunks(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op,
                             smddp__ks_kind_t kind, size_t bytes, size_t pitch)
{
    size_t room = k->scratch;
    if (kind == SMDDP_KS_REDUCE_SCATTER) room /= (size_t)comm->local_size;
    size_t chunk = room / SMDDP_KS_VEC * SMDDP_KS_VEC;
    for (size_t off = 0; off < bytes; off += chunk) {
        smddp__ks_job_t job = {kind, (const char *)op->sendbuf + off, (char *)op->recvbuf + off,
                               SMDDP_MIN(chunk, bytes - off), pitch};
        SMDDP_CHECK(run(comm, k, op, &job));
    }
    return SMDDP_OK;
}

smddp_status_t smddp__ksync_allreduce(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    bool oneshot = bytes <= (uint64_t)k->oneshot_max || comm->local_size == 1;
    op->algo = oneshot ? "kernel one-shot" : "kernel two-shot";
    return chunks(comm, k, op, oneshot ? SMDDP_KS_ALLREDUCE_ONESHOT : SMDDP_KS_ALLREDUCE_TWOSHOT,
                  bytes, 0);
}

smddp_status_t smddp__ksync_reduce_scatter(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op)
{
    size_t block = op->count * smddp__dtype_size(op->dtype);
    op->algo = "kernel";
    return chunks(comm, k, op, SMDDP_KS_REDUCE_SCATTER, block, block);
}

smddp_status_t smddp__ksync_allgather(smddp_comm_t comm, smddp__ksync_t *k, smddp__op_t *op)
{
    size_t block = op->count * smddp__dtype_size(op->dtype);
    op->algo = "kernel";
    return chunks(comm, k, op, SMDDP_KS_ALLGATHER, block, block);
}

void smddp__ksync_release(smddp_comm_t comm, smddp__ksync_t *k)
{
    if (k->done) {
        /* This rank's kernels may wait for peers: at most SMDDP_TIMEOUT. */
        cudaEventSynchronize(k->done);
        cudaEventDestroy(k->done);
        k->done = NULL;
        if (k->ctl && __atomic_load_n(&k->ctl->failed, __ATOMIC_ACQUIRE))
            SMDDP_WARN("rank %d: a CUDA collective kernel of this communicator gave up before "
                       "it was destroyed (its output is not valid): %s",
                       comm->rank, verdict(comm, k));
    }
    if (k->ctl) {
        pthread_mutex_lock(&comm->err_lock);
        if (comm->cuda_abort == &k->ctl->abort) comm->cuda_abort = NULL;
        pthread_mutex_unlock(&comm->err_lock);
        cudaFreeHost(k->ctl);
        k->ctl = NULL;
    }
}

#endif /* SMDDP_HAVE_CUDA */
