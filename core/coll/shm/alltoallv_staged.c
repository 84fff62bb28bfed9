/*
 * All-to-all inside a node with per-pair counts, in rounds: each rank
 * stages a piece per peer in its half, and every rank copies its pieces out
 * of every half. alltoall_staged.c runs it with equal counts.
 */
#include <inttypes.h>
#include <string.h>

#include "shm_algo.h"

/*
 * All-to-all with per-pair byte counts. With check set (alltoallv), a first
 * round exchanges send counts so that every rank verifies what it will
 * receive, and agrees with every other rank on the verdict, before any data
 * moves; it also yields the largest pair, which fixes the number of rounds.
 */
smddp_status_t smddp__shm_alltoall_rounds(smddp_comm_t comm, smddp__op_t *op,
                                          const int64_t *scounts, const int64_t *sdispls,
                                          const int64_t *rcounts, const int64_t *rdispls,
                                          bool check)
{
    size_t es = smddp__dtype_size(op->dtype);
    int p = comm->local_size, me = comm->local_rank, h;
    size_t half = smddp__shm_half_size(comm);
    size_t piece = half / (size_t)p / es * es;
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    int64_t max_count = 0;

    /* Every local rank's send counts and verdict fit one half (topo.c bounds the ranks). */
    _Static_assert((SMDDP_MAX_LOCAL + 1) * sizeof(int64_t) <= SMDDP_SHM_HALF_MIN,
                   "alltoallv's count exchange fits a staging half");
    if (!check) {
        max_count = scounts[0];
    } else {
        SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
        int64_t *mine = smddp__shm_buf(comm, me, h);
        memcpy(mine, scounts, (size_t)p * sizeof(int64_t));
        SMDDP_CHECK(smddp__shm_sync(comm, op));
        int bad_from = -1;
        for (int q = 0; q < p; q++) {
            const int64_t *theirs = smddp__shm_buf(comm, q, h);
            if (theirs[me] != rcounts[q] && bad_from < 0) bad_from = q;
            for (int j = 0; j < p; j++) max_count = SMDDP_MAX(max_count, theirs[j]);
        }
        /* Slot p carries the verdict: -1 = fine, else the first bad sender. */
        mine[p] = bad_from;
        SMDDP_CHECK(smddp__shm_sync(comm, op));
        int bad_rank = -1, bad_sender = -1;
        for (int q = 0; q < p && bad_rank < 0; q++) {
            const int64_t *theirs = smddp__shm_buf(comm, q, h);
            if (theirs[p] >= 0) {
                bad_rank = q;
                bad_sender = (int)theirs[p];
            }
        }
        int64_t sent = bad_rank >= 0
                           ? ((const int64_t *)smddp__shm_buf(comm, bad_sender, h))[bad_rank]
                           : 0;
        smddp__shm_step_end(comm, h);
        if (bad_rank >= 0) {
            char desc[256];
            smddp__op_describe(op, desc, sizeof(desc));
            return smddp__error_quiet(
                SMDDP_ERR_MISMATCH,
                "%s: rank %d sends %" PRId64 " elements to rank %d, which expects a different "
                "count in its recvcounts[%d]; send and receive counts must match pairwise",
                desc, comm->local_ranks[bad_sender], sent, comm->local_ranks[bad_rank],
                comm->local_ranks[bad_sender]);
        }
    }

    size_t max_bytes = (size_t)max_count * es;
    int stream = max_bytes * (size_t)p >= (size_t)smddp__params()->stream_min;
    for (size_t off = 0; off < max_bytes; off += piece) {
        SMDDP_CHECK(smddp__shm_step_begin(comm, op, &h));
        char *mine = smddp__shm_buf(comm, me, h);
        for (int q = 0; q < p; q++) {
            int r = comm->local_ranks[q];
            size_t total = (size_t)scounts[r] * es;
            if (off >= total) continue;
            size_t n = SMDDP_MIN(piece, total - off);
            const char *src = send + (size_t)sdispls[r] * es + off;
            if (q == me)
                smddp__copy(recv + (size_t)rdispls[r] * es + off, src, n, stream);
            else
                memcpy(mine + (size_t)q * piece, src, n);
        }
        SMDDP_CHECK(smddp__shm_sync(comm, op));
        for (int q = 0; q < p; q++) {
            int r = comm->local_ranks[q];
            size_t total = (size_t)rcounts[r] * es;
            if (q == me || off >= total) continue;
            size_t n = SMDDP_MIN(piece, total - off);
            smddp__copy(recv + (size_t)rdispls[r] * es + off,
                        (char *)smddp__shm_buf(comm, q, h) + (size_t)me * piece, n, stream);
        }
        smddp__shm_step_end(comm, h);
    }
    return SMDDP_OK;
}

static smddp_status_t alltoallv_staged(smddp_comm_t comm, smddp__op_t *op)
{
    int p = comm->size;
    return smddp__shm_alltoall_rounds(comm, op, op->v, op->v + p, op->v + 2 * p, op->v + 3 * p,
                                      true);
}

SMDDP_SHM_ALGO(alltoallv_staged, "staged", ALLTOALLV, NULL, alltoallv_staged, NULL,
               "counts checked pairwise first, then as alltoall");
