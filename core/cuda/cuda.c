/* See cuda.h: the table of this build's CUDA calls, or none. */
#include "cuda.h"

#if SMDDP_HAVE_CUDA
#include "ipc.h"
#include "stage.h"

static const smddp__cuda_calls_t calls = {
    .usable = smddp__cuda_usable,
    .execute = smddp__cuda_execute,
    .status = smddp__cuda_status,
    .stage_prepare = smddp__cuda_stage_prepare,
    .stage_run = smddp__cuda_stage_run,
    .stage_finish = smddp__cuda_stage_finish,
    .stage_enqueued = smddp__cuda_stage_enqueued,
    .stage_ready = smddp__cuda_stage_ready,
};
#endif

const smddp__cuda_calls_t *smddp__cuda_calls(void)
{
#if SMDDP_HAVE_CUDA
    return &calls;
#else
    return NULL;
#endif
}
