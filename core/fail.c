/*
 * The failure protocol. The first failure on a communicator wins: its
 * message is what every later op reports. A failure found on this rank is
 * spread to its node's ranks through shared memory and, across nodes, to
 * the others through the store, which ranks poll while they wait; a rank
 * of another node that dies is found through the liveness watch.
 *
 * The transports sit below this file: they learn of an abort through the
 * hook the communicator installs (comm->poll_abort), not by calling here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fail.h"
#include "param.h"
#include "progress.h"
#include "trace.h"
#include "transport/transport.h"
#include "transport/shm.h"
#include "transport/watch.h"

void smddp__comm_set_last_error(smddp_comm_t comm, const char *msg)
{
    pthread_mutex_lock(&comm->err_lock);
    snprintf(comm->last_error, sizeof(comm->last_error), "%s", msg);
    pthread_mutex_unlock(&comm->err_lock);
}

/* Store calls and dumps on the abort path must not replace the error the caller reports. */
typedef struct saved_error {
    char msg[SMDDP_ERRMSG_MAX];
} saved_error_t;

static void save_error(saved_error_t *e) { snprintf(e->msg, sizeof(e->msg), "%s", smddp__last_error()); }

static void restore_error(const saved_error_t *e)
{
    smddp__clear_error();
    if (e->msg[0]) smddp__error_quiet(SMDDP_ERR_INTERNAL, "%s", e->msg);
}

/* SMDDP_TRACE_DIR: the flight recorder of a communicator that has just failed. */
static void dump_on_failure(smddp_comm_t comm)
{
    char path[4096];
    saved_error_t saved;
    save_error(&saved);
    char *arrivals = smddp__progress_json_new(comm);
    smddp_status_t st = smddp__trace_dump(comm->trace, NULL, comm->prefix, comm->rank, comm->size,
                                          arrivals && arrivals[0] ? arrivals : NULL, path,
                                          sizeof(path));
    free(arrivals);
    if (st == SMDDP_OK)
        SMDDP_WARN("rank %d: flight recorder written to %s", comm->rank, path);
    else
        SMDDP_WARN("rank %d: cannot write the flight recorder: %s", comm->rank,
                   smddp__last_error());
    restore_error(&saved);
}

void smddp__comm_abort(smddp_comm_t comm, smddp_status_t status, const char *msg)
{
    /*
     * The first failure's message is the one every later op reports; it is
     * written before the flag, which is read without err_lock.
     */
    pthread_mutex_lock(&comm->err_lock);
    bool first = !atomic_load(&comm->aborted);
    if (first) {
        snprintf(comm->abort_msg, sizeof(comm->abort_msg), "%s", msg);
        comm->abort_status = status;
        atomic_store(&comm->aborted, 1);
    }
    pthread_mutex_unlock(&comm->err_lock);
    char shared[SMDDP_ERRMSG_MAX];
    snprintf(shared, sizeof(shared), "%s", comm->abort_msg);
    for (int i = 0; i < comm->n_transports; i++)
        if (comm->transports[i]->abort) comm->transports[i]->abort(comm, shared);
    if (first && comm->trace && smddp__params()->trace_dir[0]) dump_on_failure(comm);
}

void smddp__comm_adopt_peer_abort(smddp_comm_t comm)
{
    const char *peer_msg = NULL;
    int peer = comm->shm ? smddp__shm_abort_flag(comm, &peer_msg) : -1;
    if (peer < 0 || atomic_load(&comm->aborted)) return;
    char msg[SMDDP_ERRMSG_MAX];
    snprintf(msg, sizeof(msg), "rank %d aborted the communicator: %s", peer, peer_msg);
    smddp__comm_abort(comm, SMDDP_ERR_ABORTED, msg);
}

#define REMOTE_ABORT_POLL_NS (500 * 1000000LL)

/* How long smddp_comm_abort waits for the store's lock before giving up telling other nodes. */
#define ABORT_STORE_WAIT_MS 500

/*
 * Tells the ranks of other nodes, which poll the store while they wait, why
 * this one failed. With bounded, waits at most ABORT_STORE_WAIT_MS for the
 * store's lock: smddp_comm_abort must not hang behind a store call that
 * hangs, or deadlock with a thread that holds the store while it waits for
 * something the caller holds (a Python store and the GIL).
 */
static void publish_abort(smddp_comm_t comm, bool bounded)
{
    if (comm->node_count < 2) return;
    smddp__store_ref_t *s = comm->store;
    char key[320], msg[SMDDP_ERRMSG_MAX + 32];
    int64_t n;
    saved_error_t saved;
    save_error(&saved);
    int len = snprintf(msg, sizeof(msg), "rank %d: %s", comm->rank, comm->abort_msg);
    if (len < 0 || len >= (int)sizeof(msg)) len = (int)sizeof(msg) - 1;
    if (bounded) {
        if (!smddp__store_lock_within(s, ABORT_STORE_WAIT_MS)) {
            SMDDP_INFO("rank %d: the store stayed busy for %d ms: other nodes learn of this "
                       "abort only at their deadline", comm->rank, ABORT_STORE_WAIT_MS);
            return;
        }
    } else {
        smddp__store_lock(s);
    }
    /* The message first, then the count that pollers read without blocking. */
    snprintf(key, sizeof(key), "%s/abort/msg", comm->prefix);
    if (s->table.set(s->table.ctx, key, msg, (size_t)len + 1) >= 0) {
        snprintf(key, sizeof(key), "%s/abort/count", comm->prefix);
        (void)s->table.add(s->table.ctx, key, 1, &n);
    }
    pthread_mutex_unlock(&s->lock);
    restore_error(&saved);
}

void smddp__comm_fail(smddp_comm_t comm, smddp_status_t status, const char *msg)
{
    smddp__comm_abort(comm, status, msg);
    /* An abort adopted from another rank was published by that rank. */
    if (comm->abort_status != SMDDP_ERR_ABORTED) publish_abort(comm, false);
}

void smddp__comm_abort_by_user(smddp_comm_t comm, const char *msg)
{
    bool first = !atomic_load(&comm->aborted);
    atomic_store(&comm->aborted_by_app, true);
    smddp__comm_abort(comm, SMDDP_ERR_ABORTED, msg);
    if (first) publish_abort(comm, true); /* shared memory told this node's ranks */
}

bool smddp__comm_poll_remote_abort(smddp_comm_t comm, int64_t now_ns, int waiting_for)
{
    if (atomic_load(&comm->aborted)) return true;
    if (comm->node_count < 2) return false;
    int64_t last = atomic_load(&comm->remote_abort_polled_ns);
    if (last == 0) {
        /* The first call of an op only starts the clock: quick ops never ask. */
        atomic_store(&comm->remote_abort_polled_ns, now_ns);
        return false;
    }
    if (now_ns - last < REMOTE_ABORT_POLL_NS) return false;
    atomic_store(&comm->remote_abort_polled_ns, now_ns);
    saved_error_t before;
    char gone[SMDDP_ERRMSG_MAX];
    save_error(&before);
    int dead = smddp__watch_dead(comm, now_ns, waiting_for, gone, sizeof(gone));
    restore_error(&before);
    if (dead >= 0) {
        atomic_store(&comm->seen_dead[dead], true);
        smddp__comm_fail(comm, SMDDP_ERR_PEER_LOST, gone);
        return true;
    }
    char key[320];
    int64_t count = 0;
    void *v = NULL;
    size_t len = 0;
    saved_error_t saved;
    save_error(&saved);
    snprintf(key, sizeof(key), "%s/abort/count", comm->prefix);
    /* Adding 0 reads the count without waiting. */
    smddp_status_t st = smddp__store_add(comm->store, key, 0, &count);
    if (st == SMDDP_OK && count > 0) {
        snprintf(key, sizeof(key), "%s/abort/msg", comm->prefix);
        st = smddp__store_get(comm->store, key, 1000, &v, &len);
    }
    char why[SMDDP_ERRMSG_MAX / 2];
    snprintf(why, sizeof(why), "%s", smddp__last_error());
    restore_error(&saved);
    if (st != SMDDP_OK) {
        /*
         * The store's host is gone (usually after failing itself): nothing can be
         * coordinated any more, and whoever this rank waits for is not coming.
         */
        char msg[SMDDP_ERRMSG_MAX];
        char peer[48] = "another rank";
        if (waiting_for >= 0) snprintf(peer, sizeof(peer), "rank %d", waiting_for);
        snprintf(msg, sizeof(msg), "while this rank waited for %s, the job's store stopped "
                 "answering (its host has probably failed): %s", peer, why);
        smddp__comm_abort(comm, SMDDP_ERR_PEER_LOST, msg);
        return true;
    }
    if (count <= 0) return false;
    char msg[SMDDP_ERRMSG_MAX];
    snprintf(msg, sizeof(msg), "%.*s (aborted on another node)", (int)(len ? len - 1 : 0),
             (const char *)v);
    free(v);
    smddp__comm_abort(comm, SMDDP_ERR_ABORTED, msg);
    return true;
}

smddp_status_t smddp__comm_check_alive(smddp_comm_t comm, const smddp__op_t *op)
{
    smddp__comm_adopt_peer_abort(comm);
    if (!atomic_load(&comm->aborted)) return SMDDP_OK;
    char desc[256];
    smddp__op_describe(op, desc, sizeof(desc));
    return smddp__error_quiet(SMDDP_ERR_ABORTED, "%s not run: the communicator was aborted: %s",
                              desc, comm->abort_msg);
}
