/*
 * Send/recv with ranks on other nodes, the network half of the send/recv
 * engine (p2p.c has the overview): each op is posted to the communicator's
 * send/recv endpoint (comm->net_p2p) tagged (message number of its (peer,
 * tag), user tag), and matches that exact tag; sends of a tag wait while
 * SMDDP_OFI_MAX_INFLIGHT of that tag to that peer are on the network. Runs
 * on the engine's thread only.
 */
#include <stdio.h>
#include <stdlib.h>

#include "../param.h"
#include "../fail.h"
#include "../request.h"
#include "p2p_engine.h"

/* The (peer, direction) queue of an op for another node: 2 * peer (+1 for receives). */
static int queue_of(const smddp__op_t *op) { return 2 * op->root + (op->kind == SMDDP_OP_RECV); }

static void complete_remote(smddp_comm_t comm, remote_t *r, smddp_status_t st)
{
    smddp__op_t *op = r->op;
    r->op = NULL;
    comm->p2p->active--;
    smddp__op_complete(op, st);
    smddp__request_unref(op);
}

/*
 * Posts op to its peer on another node. False, leaving op alone, when the
 * endpoint cannot take it yet (full, or rxm still connecting to that peer):
 * it is tried again on a later pass, and smddp__p2p_net_check ends the wait
 * at its deadline. This thread never blocks on one peer. Failures complete
 * op.
 */
static bool post_remote(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__p2p_t *p = comm->p2p;
    remote_t *r = calloc(1, sizeof(*r));
    smddp_status_t st;
    if (!r) {
        st = smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate a send/recv");
        smddp__op_complete(op, st);
        smddp__request_unref(op);
        return true;
    }
    size_t bytes = op->count * smddp__dtype_size(op->dtype);
    uint64_t tag = op->seq << 32 | (uint32_t)op->tag;
    st = op->kind == SMDDP_OP_SEND
             ? comm->net->post(comm->net_p2p, &r->x, 1, op->root, tag, 0, (void *)op->sendbuf,
                               bytes, false)
             : comm->net->post(comm->net_p2p, &r->x, 0, op->root, tag, 0, op->recvbuf, bytes,
                               false);
    if (st == SMDDP_IN_PROGRESS) {
        free(r);
        return false;
    }
    r->op = op;
    r->queue = queue_of(op);
    r->tag = op->tag;
    p->active++;
    if (st < 0) {
        complete_remote(comm, r, st);
        free(r);
        return true;
    }
    r->next = p->remote;
    p->remote = r;
    if (op->kind == SMDDP_OP_SEND) {
        uint64_t *n = smddp__p2p_count(&p->sending, op->root, false, op->tag);
        if (n) (*n)++;
        r->counted = n != NULL;
    }
    return true;
}

/*
 * Posts queue q's waiting ops in order, but for sends of a tag that has
 * SMDDP_OFI_MAX_INFLIGHT on the network: those wait, and later sends of other
 * tags go past them (the receiver may wait for one of those first). Receives
 * have no cap: a later one may be the one whose message lets the sender go on.
 */
static void post_waiting(smddp_comm_t comm, int q)
{
    smddp__p2p_t *p = comm->p2p;
    int cap = q % 2 ? 0 : smddp__params()->ofi_max_inflight;
    smddp__op_t **link = &p->waiting[q], *prev = NULL;
    while (*link) {
        smddp__op_t *op = *link, *next = op->next;
        uint64_t *inflight =
            cap > 0 ? smddp__p2p_count(&p->sending, op->root, false, op->tag) : NULL;
        if (inflight && *inflight >= (uint64_t)cap) { /* so do its tag's later sends */
            prev = op;
            link = &op->next;
            continue;
        }
        p->active--; /* post_remote counts it again */
        if (!post_remote(comm, op)) {
            p->active++;
            p->stalled = true;
            return;
        }
        *link = next; /* op may be gone: completed at once, with an error */
        if (!next) p->waiting_tail[q] = prev;
    }
}

void smddp__p2p_net_queue(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__p2p_t *p = comm->p2p;
    int q = queue_of(op);
    op->next = NULL;
    if (p->waiting_tail[q]) p->waiting_tail[q]->next = op;
    else p->waiting[q] = op;
    p->waiting_tail[q] = op;
    p->active++;
    post_waiting(comm, q);
}

static void free_remotes(remote_t **list)
{
    while (*list) {
        remote_t *r = *list;
        *list = r->next;
        free(r);
    }
}

void smddp__p2p_net_retry(smddp_comm_t comm)
{
    smddp__p2p_t *p = comm->p2p;
    p->stalled = false;
    for (int q = 0; q < 2 * comm->size; q++)
        if (p->waiting[q]) post_waiting(comm, q);
}

bool smddp__p2p_net_progress(smddp_comm_t comm)
{
    smddp__p2p_t *p = comm->p2p;
    bool any = false;
    smddp_status_t st = comm->net->progress(comm->net_p2p);
    if (st < 0) {
        /*
         * The completion queue failed: nothing posted can be trusted to finish,
         * and send/recv across nodes cannot go on. The communicator fails;
         * smddp__p2p_net_fail gives the endpoint up before it hands any buffer back.
         */
        smddp__p2p_abort_all(comm, st);
        return true;
    }
    for (remote_t **link = &p->remote; *link;) {
        remote_t *r = *link;
        if (!r->x.done) {
            link = &r->next;
            continue;
        }
        if (r->op) {
            smddp__op_t *op = r->op;
            char desc[256];
            smddp__op_describe(op, desc, sizeof(desc));
            size_t want = op->count * smddp__dtype_size(op->dtype);
            smddp_status_t result = SMDDP_OK;
            if (r->x.status < 0)
                result = smddp__error_quiet(r->x.status, "%s failed: %s", desc, r->x.err);
            else if (!r->x.is_send && r->x.received != want)
                result = smddp__error_quiet(
                    SMDDP_ERR_MISMATCH,
                    "%s: the message from rank %d with tag %d has %zu bytes, but this recv "
                    "expects %zu; the message was discarded",
                    desc, op->root, op->tag, r->x.received, want);
            /*
             * A message cut off at the receive buffer leaves the provider unable to match
             * what follows from that peer (tcp;ofi_rxm), so nothing from it can be trusted
             * any more: abort rather than let later receives wait for their deadline.
             */
            if (r->x.status == SMDDP_ERR_MISMATCH) {
                char msg[SMDDP_ERRMSG_MAX];
                snprintf(msg, sizeof(msg), "%s; later messages between these two ranks cannot "
                         "be matched, so the communicator is aborted", smddp__last_error());
                smddp__comm_fail(comm, SMDDP_ERR_MISMATCH, msg);
                result = smddp__error_quiet(SMDDP_ERR_MISMATCH, "%s", msg);
            }
            complete_remote(comm, r, result);
        }
        *link = r->next;
        int q = r->queue;
        if (r->counted) {
            uint64_t *n = smddp__p2p_count(&p->sending, q / 2, false, r->tag);
            if (n && *n) (*n)--;
        }
        free(r);
        post_waiting(comm, q);
        any = true;
    }
    return any;
}

/*
 * The message number is claimed under comm->lock, so no directed receive
 * takes it. One peek per (rank, tag) looked for, made on first use.
 */
bool smddp__p2p_net_match(smddp_comm_t comm, int q, int32_t tag, uint64_t *seq,
                          smddp_status_t *err)
{
    smddp__p2p_t *p = comm->p2p;
    peek_t *pk = p->peeks;
    while (pk && (pk->peer != q || pk->tag != tag)) pk = pk->next;
    if (!pk) {
        pk = calloc(1, sizeof(*pk));
        if (!pk) {
            *err = smddp__error_quiet(SMDDP_ERR_NO_MEMORY, "cannot allocate a receive from any "
                                      "rank");
            return false;
        }
        pk->peer = q;
        pk->tag = tag;
        pk->next = p->peeks;
        p->peeks = pk;
    }
    if (!pk->busy) {
        pthread_mutex_lock(&comm->lock);
        uint64_t *next = smddp__p2p_count(&p->seqs, q, true, tag);
        if (next) pk->seq = *next;
        pthread_mutex_unlock(&comm->lock);
        if (!next) {
            *err = smddp__error_quiet(SMDDP_ERR_NO_MEMORY, "cannot allocate send/recv state");
            return false;
        }
        smddp_status_t st =
            comm->net->peek(comm->net_p2p, &pk->x, q, pk->seq << 32 | (uint32_t)tag, 0);
        if (st < 0) *err = st;
        pk->busy = st == SMDDP_OK; /* SMDDP_IN_PROGRESS: the endpoint was full, next pass */
        return false;
    }
    if (!pk->x.done) return false;
    pk->busy = false;
    if (pk->x.nomsg || pk->x.status < 0) return false;
    pthread_mutex_lock(&comm->lock);
    uint64_t *next = smddp__p2p_count(&p->seqs, q, true, tag); /* made above */
    bool claimed = next && *next == pk->seq;
    if (claimed) (*next)++;
    pthread_mutex_unlock(&comm->lock);
    *seq = pk->seq;
    return claimed;
}

void smddp__p2p_net_prune_peeks(smddp_comm_t comm)
{
    smddp__p2p_t *p = comm->p2p;
    for (peek_t **link = &p->peeks; *link;) {
        peek_t *pk = *link;
        bool wanted = false;
        for (const smddp__op_t *op = p->anyq; op && !wanted; op = op->next)
            wanted = op->tag == pk->tag;
        if (wanted || (pk->busy && !pk->x.done)) { /* a done peek is over: no need to look */
            link = &pk->next;
            continue;
        }
        *link = pk->next;
        free(pk);
    }
}

/*
 * Abort and deadline checks of an op for a rank on another node, posted to
 * the network or still waiting for the endpoint to take it.
 */
static smddp_status_t check_remote(smddp_comm_t comm, const smddp__op_t *op, int64_t now,
                                   bool posted)
{
    bool aborted =
        smddp__comm_poll_remote_abort(comm, now, op->root) || atomic_load(&comm->aborted);
    if (!aborted && now < op->deadline_ns) return SMDDP_OK;
    char desc[256];
    smddp__op_describe(op, desc, sizeof(desc));
    if (aborted)
        return smddp__error_quiet(SMDDP_ERR_ABORTED, "%s failed: communicator aborted: %s", desc,
                                  comm->abort_msg);
    double secs = (double)smddp__op_timeout_ms(comm, op) / 1000.0;
    if (!posted)
        return smddp__error_quiet(SMDDP_ERR_TIMEOUT,
                                  "%s timed out after %.3f s: the network did not take it (no "
                                  "connection to rank %d: has it joined, is it alive?)",
                                  desc, secs, op->root);
    return smddp__error_quiet(SMDDP_ERR_TIMEOUT,
                              "%s timed out after %.3f s: rank %d (on another node) did not %s",
                              desc, secs, op->root,
                              op->kind == SMDDP_OP_RECV ? "send it" : "receive it");
}

smddp_status_t smddp__p2p_net_check(smddp_comm_t comm, int64_t now)
{
    smddp__p2p_t *p = comm->p2p;
    for (int q = 0; q < 2 * comm->size; q++) /* a queue's head is its oldest: it times out first */
        if (p->waiting[q]) SMDDP_CHECK(check_remote(comm, p->waiting[q], now, false));
    for (remote_t *r = p->remote; r; r = r->next) SMDDP_CHECK(check_remote(comm, r->op, now, true));
    return SMDDP_OK;
}

void smddp__p2p_net_fail(smddp_comm_t comm, smddp_status_t st, const char *msg)
{
    smddp__p2p_t *p = comm->p2p;
    for (int q = 0; q < 2 * comm->size; q++) {
        while (p->waiting[q]) {
            smddp__op_t *op = p->waiting[q];
            p->waiting[q] = op->next;
            p->active--;
            smddp__error_quiet(st, "%s", msg);
            smddp__op_complete(op, st);
            smddp__request_unref(op);
        }
        p->waiting_tail[q] = NULL;
    }
    /*
     * Nothing may land in a buffer its owner gets back now. A cancel is
     * asynchronous, and a NIC (efa, verbs) may still be writing a matched
     * receive, so the endpoint is given up: closed on such providers, never
     * progressed again on software ones, which move data only then. The
     * communicator is failing anyway. The transfers stay allocated until
     * teardown, off the list that is progressed.
     */
    while (p->remote) {
        remote_t *r = p->remote;
        p->remote = r->next;
        comm->net->abort(comm->net_p2p, &r->x);
        smddp__error_quiet(st, "%s", msg);
        complete_remote(comm, r, st);
        r->next = p->given_up;
        p->given_up = r;
    }
}

void smddp__p2p_net_free(smddp_comm_t comm)
{
    smddp__p2p_t *p = comm->p2p;
    /* Transfers still posted (cancelled receives, peeks) go with the endpoint. */
    bool peeking = false;
    for (const peek_t *pk = p->peeks; pk; pk = pk->next) peeking |= pk->busy;
    if (p->remote || p->given_up || peeking) smddp__net_close_p2p(comm);
    free_remotes(&p->remote);
    free_remotes(&p->given_up);
    while (p->peeks) {
        peek_t *pk = p->peeks;
        p->peeks = pk->next;
        free(pk);
    }
}
