/*
 * Allgather inside a node in rounds of one staging half: every rank copies
 * its input into its half and posts, every rank copies every half out. With
 * root >= 0 it is a gather, and only the root copies out (gather_staged.c).
 *
 * An allgather input that peers can reach where it lies is not staged: one
 * in a pool (transport/shm_pool.c) they copy, any other they read by
 * cross-memory attach (transport/shm_cma.c) when the size calls for it.
 * When every input is reached so, the whole op is one step.
 */
#include <stdio.h>
#include <string.h>

#include "shm_algo.h"

smddp_status_t smddp__shm_gather_rounds(smddp_comm_t comm, smddp__op_t *op, int root)
{
    size_t es = smddp__dtype_size(op->dtype);
    size_t bytes = op->count * es;
    size_t half = smddp__shm_half_size(comm);
    int p = comm->local_size, me = comm->local_rank, h = 0;
    const char *send = op->sendbuf;
    char *recv = op->recvbuf;
    int stream = bytes * (size_t)p >= (size_t)smddp__params()->stream_min;
    smddp__pooled_t pl = {0};
    uint64_t in_ref = 0, addr[SMDDP_MAX_LOCAL]; /* peers' inputs by cross-memory attach */
    bool pools = root < 0 && smddp__pool_on(comm);
    bool cma = root < 0 && p > 1 && smddp__cma_use(comm, bytes);
    bool in_place_ok = false, one_step = false;
    if (root < 0) {
        /* Peers may read the input in place unless this rank's output overlaps it elsewhere. */
        const char *own = recv + (size_t)comm->local_ranks[me] * bytes;
        in_place_ok = send == own || smddp__disjoint(send, bytes, recv, bytes * (size_t)comm->size);
    }
    if (pools) {
        if (in_place_ok) in_ref = smddp__pool_ref(comm, send, bytes);
        smddp__pool_publish(comm, op, in_ref, 0);
    }
    if (cma) smddp__cma_publish(comm, op, in_place_ok ? send : NULL);
    bool direct = in_ref || (cma && in_place_ok); /* peers read this rank's input in place */
    smddp_status_t st = SMDDP_OK;
    for (size_t off = 0; off < bytes; off += half) {
        size_t n = SMDDP_MIN(half, bytes - off);
        SMDDP_CHECK_GOTO(smddp__shm_step_begin(comm, op, &h), st, out);
        if (!direct) memcpy(smddp__shm_buf(comm, me, h), send + off, n);
        uint32_t t = smddp__shm_post(comm);
        if (root >= 0 && root != me) SMDDP_CHECK_GOTO(smddp__shm_wait(comm, op, root, t), st, out);
        if (root < 0 || root == me) {
            SMDDP_CHECK_GOTO(smddp__shm_wait_all(comm, op, t), st, out);
            if (off == 0 && (pools || cma)) {
                if (pools) smddp__pool_peers(comm, op, t, &pl);
                one_step = true;
                for (int q = 0; q < p; q++) {
                    addr[q] = 0;
                    if (cma && q != me) addr[q] = smddp__cma_peer(comm, op, q, t);
                    one_step &= q == me ? direct : (pl.in && pl.in[q]) || addr[q];
                }
                if (one_step) {
                    op->algo = pl.all_in ? "in pools" : "cross-memory attach";
                    n = bytes;
                    off = bytes;
                }
            }
            size_t at = one_step ? 0 : off;
            for (int q = 0; q < p; q++) {
                char *dst = recv + (size_t)comm->local_ranks[q] * bytes + at;
                if (q == me) {
                    /* Own data comes from staging unless in place: recv may overlap send. */
                    const char *src =
                        direct || dst == send + at ? send + at : smddp__shm_buf(comm, q, h);
                    if (dst != src) smddp__copy(dst, src, n, stream);
                } else if (pl.in && pl.in[q]) {
                    smddp__copy(dst, pl.in[q] + at, n, stream);
                } else if (cma && addr[q]) {
                    SMDDP_CHECK_GOTO(smddp__cma_read(comm, op, q, dst, addr[q] + at, n), st, out);
                } else {
                    smddp__copy(dst, smddp__shm_buf(comm, q, h), n, stream);
                }
            }
        }
        smddp__shm_step_end(comm, h);
    }
out:
    /*
     * Peers read my input in place: it is mine again once they all ended
     * their last step, also when this rank failed (a peer may be reading).
     */
    if (direct) {
        char msg[SMDDP_ERRMSG_MAX];
        if (st < 0) snprintf(msg, sizeof(msg), "%s", smddp__last_error());
        smddp_status_t waited = smddp__shm_step_wait(comm, op, h);
        if (st == SMDDP_OK) st = waited;
        else if (waited < 0) smddp__error_quiet(st, "%s", msg); /* the first failure's message */
    }
    return st;
}

static smddp_status_t allgather_staged(smddp_comm_t comm, smddp__op_t *op)
{
    return smddp__shm_gather_rounds(comm, op, -1);
}

static const char *const read_in_place[] = {"in pools", "cross-memory attach", NULL};

SMDDP_SHM_ALGO(allgather_staged, "staged", ALLGATHER, NULL, allgather_staged, read_in_place,
               "rounds of one half; inputs in pools or reachable by cross-memory attach "
               "read in place");
