/* All-to-all inside a node: the staged all-to-all (alltoallv_staged.c) with equal counts. */
#include <stdlib.h>

#include "shm_algo.h"

static smddp_status_t alltoall_staged(smddp_comm_t comm, smddp__op_t *op)
{
    int p = comm->size;
    int64_t *v = malloc(sizeof(int64_t) * 2 * (size_t)p);
    if (!v) return smddp__error(SMDDP_ERR_NO_MEMORY, "alltoall: out of memory");
    for (int q = 0; q < p; q++) {
        v[q] = (int64_t)op->count;
        v[p + q] = (int64_t)op->count * q;
    }
    smddp_status_t st = smddp__shm_alltoall_rounds(comm, op, v, v + p, v, v + p, false);
    free(v);
    return st;
}

SMDDP_SHM_ALGO(alltoall_staged, "staged", ALLTOALL, NULL, alltoall_staged, NULL,
               "each rank stages a piece per peer in rounds of one half");
