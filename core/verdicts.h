/*
 * What the ranks of a communicator settled together on earlier ops, kept so
 * that the selection (select.c) reads it before it chooses, never during an
 * op (verdicts.c). Every rank records the same verdict for the same op, so
 * every rank's cache holds the same entries and the choice stays the same
 * on every rank.
 */
#ifndef SMDDP_CORE_VERDICTS_H
#define SMDDP_CORE_VERDICTS_H

#include <stddef.h>
#include <stdint.h>

/* What the last allreduce of a size found in its first exchange. */
typedef enum smddp__pool_verdict {
    SMDDP_POOLED_NONE = 0,     /* not every buffer in a pool, or no verdict */
    SMDDP_POOLED_IN_PLACE = 1, /* every buffer in place in a pool */
    SMDDP_POOLED_INPUTS = 2    /* every input in a pool, out of place */
} smddp__pool_verdict_t;

#define SMDDP_VERDICT_SIZES 4

typedef struct smddp__verdicts {
    /* Per size, newest first: bytes << 2 | smddp__pool_verdict_t; 0 is an empty slot. */
    uint64_t pooled[SMDDP_VERDICT_SIZES];
    /*
     * SMDDP_CUDA_NET=auto across nodes: whether NCCL loads on every rank,
     * agreed before the first CUDA collective (queue.c); -1 not yet.
     */
    int nccl_everywhere;
} smddp__verdicts_t;

void smddp__verdicts_init(smddp__verdicts_t *v);

/* The verdict for allreduces of `bytes` (SMDDP_POOLED_NONE if none is kept). */
smddp__pool_verdict_t smddp__verdict_pooled(const smddp__verdicts_t *v, size_t bytes);

/*
 * Records the verdict for `bytes`: a new size goes first and the oldest is
 * dropped when all slots are taken; SMDDP_POOLED_NONE forgets the size.
 */
void smddp__verdict_set_pooled(smddp__verdicts_t *v, size_t bytes, smddp__pool_verdict_t verdict);

#endif /* SMDDP_CORE_VERDICTS_H */
