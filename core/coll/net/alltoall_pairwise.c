/* The flat all-to-all across nodes: the pairwise exchange (alltoallv_pairwise.c), equal counts. */
#include <stdlib.h>
#include <string.h>

#include "net_algo.h"

static smddp_status_t alltoall_pairwise(smddp_comm_t comm, smddp__op_t *op)
{
    int p = comm->size;
    int64_t *v = malloc(4 * (size_t)p * sizeof(int64_t));
    if (!v) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate the all-to-all table");
    for (int q = 0; q < p; q++) {
        v[q] = v[2 * p + q] = (int64_t)op->count;
        v[p + q] = v[3 * p + q] = (int64_t)op->count * q;
    }
    smddp_status_t st = SMDDP_OK;
    if (op->sendbuf == op->recvbuf) {
        /* In place: send from a copy. */
        size_t bytes = op->count * (size_t)p * smddp__dtype_size(op->dtype);
        void *copy = smddp__net_scratch(comm, SMDDP_SCRATCH_OUTER, bytes);
        if (!copy) st = smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes", bytes);
        if (copy) {
            memcpy(copy, op->sendbuf, bytes);
            smddp__op_t tmp = *op;
            tmp.sendbuf = copy;
            st = smddp__net_pairwise(comm, &tmp, v, v + p, v + 2 * p, v + 3 * p);
        }
    } else {
        st = smddp__net_pairwise(comm, op, v, v + p, v + 2 * p, v + 3 * p);
    }
    free(v);
    return st;
}

SMDDP_NET_ALGO(net_alltoall_pairwise, "pairwise", ALLTOALL, alltoall_pairwise,
               "every pair exchanges directly");
