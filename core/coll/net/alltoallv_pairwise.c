/*
 * The flat all-to-all across nodes with per-pair counts: pairwise exchange,
 * at step s each rank sends to rank + s and receives from rank - s.
 * alltoall_pairwise.c runs it with equal counts.
 */
#include <string.h>

#include "net_algo.h"

#define exchange smddp__net_exchange

smddp_status_t smddp__net_pairwise(smddp_comm_t comm, smddp__op_t *op, const int64_t *scounts,
                                   const int64_t *sdispls, const int64_t *rcounts,
                                   const int64_t *rdispls)
{
    int p = comm->size, me = comm->rank;
    size_t es = smddp__dtype_size(op->dtype);
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    if (scounts[me] != rcounts[me]) {
        char desc[256];
        smddp__op_describe(op, desc, sizeof(desc));
        return smddp__error_quiet(SMDDP_ERR_MISMATCH,
                                  "%s: rank %d sends itself %lld elements but expects to receive "
                                  "%lld from itself: sendcounts[%d] and recvcounts[%d] must be "
                                  "equal", desc, me, (long long)scounts[me],
                                  (long long)rcounts[me], me, me);
    }
    memmove(recv + (size_t)rdispls[me] * es, send + (size_t)sdispls[me] * es,
            (size_t)scounts[me] * es);
    for (int s = 1; s < p; s++) {
        int to = (me + s) % p, from = (me - s + p) % p;
        SMDDP_CHECK(exchange(comm, op, (uint32_t)s, to, send + (size_t)sdispls[to] * es,
                             (size_t)scounts[to] * es, from, recv + (size_t)rdispls[from] * es,
                             (size_t)rcounts[from] * es));
    }
    return SMDDP_OK;
}

static smddp_status_t alltoallv_pairwise(smddp_comm_t comm, smddp__op_t *op)
{
    int p = comm->size;
    return smddp__net_pairwise(comm, op, op->v, op->v + p, op->v + 2 * p, op->v + 3 * p);
}

SMDDP_NET_ALGO(net_alltoallv_pairwise, "pairwise", ALLTOALLV, alltoallv_pairwise,
               "every pair exchanges directly, counts checked first");
