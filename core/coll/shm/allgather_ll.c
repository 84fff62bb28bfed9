/* Allgather through the low-latency slots (transport/shm_ll.c): one exchange. */
#include <string.h>

#include "shm_algo.h"

static smddp_status_t allgather_ll(smddp_comm_t comm, smddp__op_t *op)
{
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    const void *in[SMDDP_MAX_LOCAL];
    char *recv = op->recvbuf;
    SMDDP_CHECK(smddp__shm_ll_exchange(comm, op, op->sendbuf, bytes, NULL, in));
    /* Own data from the slot too: the input may lie in the output at another rank's place. */
    for (int q = 0; q < comm->local_size; q++) {
        char *dst = recv + (size_t)comm->local_ranks[q] * bytes;
        if (q != comm->local_rank || dst != op->sendbuf) memcpy(dst, in[q], bytes);
    }
    return SMDDP_OK;
}

SMDDP_SHM_ALGO(allgather_ll, "low-latency", ALLGATHER, smddp__ll_fits, allgather_ll, NULL,
               "one exchange through the low-latency slots");
