/*
 * The agreement cache: a few sizes with the pooled verdict their last
 * allreduce reached, and the CUDA route's NCCL verdict.
 */
#include <string.h>

#include "verdicts.h"

void smddp__verdicts_init(smddp__verdicts_t *v)
{
    memset(v->pooled, 0, sizeof(v->pooled));
    v->nccl_everywhere = -1;
}

smddp__pool_verdict_t smddp__verdict_pooled(const smddp__verdicts_t *v, size_t bytes)
{
    for (size_t i = 0; i < SMDDP_VERDICT_SIZES; i++)
        if (v->pooled[i] >> 2 == bytes && v->pooled[i]) return (smddp__pool_verdict_t)(v->pooled[i] & 3u);
    return SMDDP_POOLED_NONE;
}

void smddp__verdict_set_pooled(smddp__verdicts_t *v, size_t bytes, smddp__pool_verdict_t verdict)
{
    uint64_t *p = v->pooled;
    size_t i = 0, n = SMDDP_VERDICT_SIZES;
    while (i < n && !(p[i] && p[i] >> 2 == bytes)) i++;
    if (verdict && i == n) { /* newest first, the oldest dropped */
        memmove(p + 1, p, (n - 1) * sizeof(*p));
        p[0] = (uint64_t)bytes << 2 | verdict;
    } else if (verdict) {
        p[i] = (uint64_t)bytes << 2 | verdict;
    } else if (i < n) {
        memmove(p + i, p + i + 1, (n - 1 - i) * sizeof(*p));
        p[n - 1] = 0;
    }
}
