/*
 * Point-to-point messages (send/recv) on their own progress thread.
 *
 * Collectives run one at a time in issue order, but send/recv must not: the
 * usual exchange "irecv from prev, isend to next" on every rank would
 * deadlock if each rank's receive blocked its own send. So send/recv ops
 * bypass the collective queue and the p2p thread moves bytes for all of them
 * at once, never blocking on any single one.
 *
 * Messages match by (source, tag), as in MPI and gloo: a receive takes the
 * oldest message from its source with its tag that no receive has taken, so
 * messages with the same source and tag arrive in send order, and a receive
 * for tag 7 posted before one for tag 3 gets the message sent with tag 7,
 * whichever was sent first. Each message carries its number among those of
 * its (sender, receiver, tag), counted on both sides (seq_map).
 *
 * Between ranks of a node, a message is a 16-byte header (magic, tag,
 * length) and the payload, in the pair's ring, in send order. The receiving
 * side reads a header, then streams the payload into the oldest receive
 * waiting for that tag; when none is, but some receive waits for a later
 * message of the pair (or from any rank), the message is set aside in an
 * unexpected buffer so that the ring moves on. With no receive waiting, it
 * stays in the ring, to be copied once into the receive posted later. A
 * receive looks at the set-aside messages of its source first.
 *
 * A peer on another node is reached through the communicator's send/recv
 * endpoint (comm->net_p2p), which only this thread drives (p2p_net.c): each
 * op is posted tagged (message number, user tag), and libfabric matches the
 * exact tag, whatever the order messages come in.
 *
 * A receive from any rank waits in its own FIFO until some rank's message
 * with its tag is there: one set aside or coming up in a pair ring, or one a
 * peek (FI_PEEK, tagged with that rank's next number for the tag) finds on
 * the network. It is then bound to that rank and goes on as a directed
 * receive. Receives from any rank are matched in posting order; a directed
 * receive waiting for a rank takes that rank's messages ahead of them.
 */
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../transport/shm.h"
#include "../cuda/cuda.h"
#include "../fail.h"
#include "../param.h"
#include "../request.h"
#include "../topo.h"
#include "p2p_engine.h"

#define P2P_MAGIC 0x50325031u
#define CHECK_EVERY_NS (50 * 1000 * 1000LL)

static void fifo_push(smddp__op_t **head, smddp__op_t *op)
{
    op->next = NULL;
    while (*head) head = &(*head)->next;
    *head = op;
}

/* Completes a send or receive the engine holds. */
static void complete(smddp_comm_t comm, smddp__op_t *op, smddp_status_t st)
{
    comm->p2p->active--;
    smddp__op_complete(op, st);
    smddp__request_unref(op);
}

static void finish_send(smddp_comm_t comm, int lr, smddp_status_t st)
{
    smddp__p2p_t *p = comm->p2p;
    smddp__op_t *op = p->sendq[lr];
    p->sendq[lr] = op->next;
    memset(&p->sends[lr], 0, sizeof(p->sends[lr]));
    complete(comm, op, st);
}

static size_t op_bytes(const smddp__op_t *op) { return op->count * smddp__dtype_size(op->dtype); }

/* The error of a receive given a message of another size (the message is dropped). */
static smddp_status_t size_mismatch(const smddp__op_t *op, uint64_t bytes)
{
    char desc[256];
    smddp__op_describe(op, desc, sizeof(desc));
    return smddp__error_quiet(SMDDP_ERR_MISMATCH,
                              "%s: the message from rank %d with tag %d has %" PRIu64 " bytes, "
                              "but this recv expects %zu; the message was discarded",
                              desc, op->root, op->tag, bytes, op_bytes(op));
}

/* Moves what it can for the head send to lr; true if any byte moved. */
static bool progress_send(smddp_comm_t comm, int lr)
{
    smddp__p2p_t *p = comm->p2p;
    smddp__op_t *op = p->sendq[lr];
    p2p_state_t *st = &p->sends[lr];
    size_t moved = 0;
    if (st->hdr_done == 0 && st->hdr.magic == 0) {
        st->hdr.magic = P2P_MAGIC;
        st->hdr.tag = op->tag;
        st->hdr.bytes = op_bytes(op);
    }
    if (st->hdr_done < sizeof(st->hdr)) {
        size_t n = smddp__shm_ring_put(comm, lr, (char *)&st->hdr + st->hdr_done,
                                       sizeof(st->hdr) - st->hdr_done);
        st->hdr_done += n;
        moved += n;
        if (st->hdr_done < sizeof(st->hdr)) return moved > 0;
    }
    if (st->payload_done < st->hdr.bytes) {
        size_t n = smddp__shm_ring_put(comm, lr, (const char *)op->sendbuf + st->payload_done,
                                       (size_t)st->hdr.bytes - st->payload_done);
        st->payload_done += n;
        moved += n;
    }
    if (st->payload_done == st->hdr.bytes) {
        finish_send(comm, lr, SMDDP_OK);
        return true;
    }
    return moved > 0;
}

/*
 * A receive from any rank bound to a rank of the node takes the pair's next
 * number for its tag, as a directed receive does when issued: messages name
 * it in errors. (Inside a node the numbers match nothing.)
 */
static void bind_local(smddp_comm_t comm, smddp__op_t *op, int lr)
{
    op->root = comm->local_ranks[lr];
    pthread_mutex_lock(&comm->lock);
    uint64_t *next = smddp__p2p_count(&comm->p2p->seqs, op->root, true, op->tag);
    if (next) op->seq = (*next)++;
    pthread_mutex_unlock(&comm->lock);
}

/* Unlinks and returns the first op of the list with this tag (NULL: none). */
static smddp__op_t *take_tagged(smddp__op_t **list, int32_t tag)
{
    for (; *list; list = &(*list)->next) {
        if ((*list)->tag != tag) continue;
        smddp__op_t *op = *list;
        *list = op->next;
        op->next = NULL;
        return op;
    }
    return NULL;
}

/* The link to the oldest message set aside from lr with this tag (NULL: none). */
static unexpected_t **find_unexpected(smddp__p2p_t *p, int lr, int32_t tag)
{
    for (unexpected_t **u = &p->ux[lr]; *u; u = &(*u)->next)
        if ((*u)->tag == tag) return u;
    return NULL;
}

/* Starts the payload of the message coming in from lr towards receive op. */
static void stream_into(smddp__p2p_t *p, int lr, smddp__op_t *op)
{
    p2p_state_t *st = &p->recvs[lr];
    st->op = op;
    st->mismatch = st->hdr.bytes != op_bytes(op);
}

/*
 * Hands receive op the message set aside at *link (from local rank lr):
 * copied if it is whole, else it is the one coming in, and the rest of it
 * goes straight to op.
 */
static void take_unexpected(smddp_comm_t comm, int lr, unexpected_t **link, smddp__op_t *op)
{
    smddp__p2p_t *p = comm->p2p;
    unexpected_t *u = *link;
    *link = u->next;
    if (p->ux_tail[lr] == u) {
        p->ux_tail[lr] = NULL;
        for (unexpected_t *t = p->ux[lr]; t; t = t->next) p->ux_tail[lr] = t;
    }
    bool fits = u->bytes == op_bytes(op);
    if (u->whole) {
        if (fits && u->bytes) memcpy(op->recvbuf, u->data, u->bytes);
        complete(comm, op, fits ? SMDDP_OK : size_mismatch(op, u->bytes));
    } else {
        p2p_state_t *st = &p->recvs[lr];
        if (fits && st->payload_done) memcpy(op->recvbuf, u->data, st->payload_done);
        st->ux = NULL;
        stream_into(p, lr, op);
    }
    p->set_aside -= u->bytes;
    p->set_aside_full = false; /* room again: held messages are tried on the next pass */
    free(u->data);
    free(u);
}

/* Whether lr's next message has its header read and is not yet placed. */
static bool placeable(const p2p_state_t *st)
{
    return st->hdr_done == sizeof(st->hdr) && !st->op && !st->ux && !st->mismatch;
}

/* Where a directed receive from local rank lr starts: a message there, or its FIFO. */
static void sort_recv(smddp_comm_t comm, int lr, smddp__op_t *op)
{
    smddp__p2p_t *p = comm->p2p;
    unexpected_t **u = find_unexpected(p, lr, op->tag);
    if (u) {
        take_unexpected(comm, lr, u, op);
    } else if (placeable(&p->recvs[lr]) && p->recvs[lr].hdr.tag == op->tag) {
        stream_into(p, lr, op);
    } else {
        fifo_push(&p->recvq[lr], op);
    }
}

/*
 * Where a receive from any rank starts: the oldest message with its tag set
 * aside from a rank of the node, else one coming up in a pair ring, else it
 * waits in anyq (and peeks at other nodes).
 */
static void sort_any(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__p2p_t *p = comm->p2p;
    unexpected_t **best = NULL;
    int best_lr = -1;
    for (int lr = 0; lr < comm->local_size; lr++) {
        unexpected_t **u = find_unexpected(p, lr, op->tag);
        if (u && (!best || (*u)->arrival < (*best)->arrival)) {
            best = u;
            best_lr = lr;
        }
    }
    if (best) {
        bind_local(comm, op, best_lr);
        take_unexpected(comm, best_lr, best, op);
        return;
    }
    for (int i = 0; i < comm->local_size; i++) {
        int lr = (p->any_next_local + i) % comm->local_size;
        if (lr == comm->local_rank || !placeable(&p->recvs[lr]) ||
            p->recvs[lr].hdr.tag != op->tag)
            continue;
        bind_local(comm, op, lr);
        p->any_next_local = (lr + 1) % comm->local_size; /* no starving */
        stream_into(p, lr, op);
        return;
    }
    fifo_push(&p->anyq, op);
}

/*
 * Places the message whose header came in from lr: the oldest receive
 * waiting for lr with its tag, else the oldest from any rank; else, when some
 * receive waits for a later message of lr (or from any rank), a buffer it is
 * set aside in. False: nothing waits, the payload stays in the ring.
 */
static bool place(smddp_comm_t comm, int lr, smddp_status_t *err)
{
    smddp__p2p_t *p = comm->p2p;
    p2p_state_t *st = &p->recvs[lr];
    smddp__op_t *op = take_tagged(&p->recvq[lr], st->hdr.tag);
    if (!op && (op = take_tagged(&p->anyq, st->hdr.tag))) {
        bind_local(comm, op, lr);
        p->any_next_local = (lr + 1) % comm->local_size; /* no starving */
    }
    if (op) {
        stream_into(p, lr, op);
        return true;
    }
    if (!p->recvq[lr] && !p->anyq) return false;
    uint64_t max = (uint64_t)smddp__params()->p2p_set_aside_max;
    if (p->set_aside && p->set_aside + st->hdr.bytes > max) {
        p->set_aside_full = true; /* back-pressure: the sender waits for room */
        return false;
    }
    unexpected_t *u = calloc(1, sizeof(*u));
    char *data = st->hdr.bytes ? malloc((size_t)st->hdr.bytes) : NULL;
    if (!u || (st->hdr.bytes && !data)) {
        free(u);
        free(data);
        *err = smddp__error_quiet(SMDDP_ERR_NO_MEMORY,
                                  "send/recv: cannot set aside a message of %" PRIu64 " bytes "
                                  "with tag %d from rank %d, which no receive waits for, to "
                                  "reach the messages behind it",
                                  st->hdr.bytes, (int)st->hdr.tag, comm->local_ranks[lr]);
        return false;
    }
    u->tag = st->hdr.tag;
    u->bytes = st->hdr.bytes;
    u->arrival = p->arrivals++;
    u->data = data;
    p->set_aside += u->bytes;
    if (p->ux_tail[lr]) p->ux_tail[lr]->next = u;
    else p->ux[lr] = u;
    p->ux_tail[lr] = u;
    st->ux = u;
    return true;
}

/* Moves what it can for the message coming in from lr; true if any byte moved. */
static bool progress_recv(smddp_comm_t comm, int lr, smddp_status_t *err)
{
    smddp__p2p_t *p = comm->p2p;
    p2p_state_t *st = &p->recvs[lr];
    size_t moved = 0;
    if (st->hdr_done < sizeof(st->hdr)) {
        size_t n = smddp__shm_ring_get(comm, lr, (char *)&st->hdr + st->hdr_done,
                                       sizeof(st->hdr) - st->hdr_done);
        st->hdr_done += n;
        moved += n;
        if (st->hdr_done < sizeof(st->hdr)) return moved > 0;
        if (st->hdr.magic != P2P_MAGIC) {
            *err = smddp__error_quiet(SMDDP_ERR_INTERNAL, "send/recv: corrupt message header "
                                      "from rank %d", comm->local_ranks[lr]);
            return true;
        }
    }
    if (!st->op && !st->ux && !st->mismatch && !place(comm, lr, err)) return moved > 0;
    if (st->payload_done < st->hdr.bytes) {
        /* A mismatched message is drained and dropped, so the stream stays in step. */
        char *dst = st->ux   ? st->ux->data + st->payload_done
                    : st->mismatch ? NULL
                                   : (char *)st->op->recvbuf + st->payload_done;
        size_t n = smddp__shm_ring_get(comm, lr, dst, (size_t)st->hdr.bytes - st->payload_done);
        st->payload_done += n;
        moved += n;
    }
    if (st->payload_done < st->hdr.bytes) return moved > 0;
    smddp__op_t *op = st->op;
    bool fits = !st->mismatch;
    uint64_t bytes = st->hdr.bytes;
    if (st->ux) st->ux->whole = true;
    memset(st, 0, sizeof(*st));
    if (op) complete(comm, op, fits ? SMDDP_OK : size_mismatch(op, bytes));
    return true;
}

/* Binds receives from any rank to ranks on other nodes whose message has come; true if any was. */
static bool progress_any(smddp_comm_t comm, smddp_status_t *err)
{
    smddp__p2p_t *p = comm->p2p;
    bool any = false;
    smddp_status_t st = comm->net->progress(comm->net_p2p);
    if (st < 0) {
        *err = st;
        return false;
    }
    for (smddp__op_t **link = &p->anyq; *link;) {
        smddp__op_t *op = *link;
        bool older_same_tag = false; /* only the oldest receive of a tag looks */
        for (smddp__op_t *o = p->anyq; o != op && !older_same_tag; o = o->next)
            older_same_tag = o->tag == op->tag;
        int src = -1;
        uint64_t seq = 0;
        for (int i = 0; i < comm->size && src < 0 && !older_same_tag; i++) {
            int q = (p->any_next + i) % comm->size;
            if (q == comm->rank || smddp__local_index(comm, q) >= 0) continue;
            if (smddp__p2p_net_match(comm, q, op->tag, &seq, err)) src = q;
            if (*err < 0) return any;
        }
        if (src < 0) {
            link = &op->next;
            continue;
        }
        *link = op->next; /* bound: goes on as a directed receive */
        op->root = src;
        op->seq = seq;
        p->active--; /* smddp__p2p_net_queue counts it again */
        smddp__p2p_net_queue(comm, op);
        p->any_next = (src + 1) % comm->size; /* the next search starts past it: no starving */
        any = true;
    }
    smddp__p2p_net_prune_peeks(comm);
    return any;
}

/* Fails every queued op with the current error message. */
static void fail_all(smddp_comm_t comm, smddp_status_t st)
{
    smddp__p2p_t *p = comm->p2p;
    char msg[SMDDP_ERRMSG_MAX];
    snprintf(msg, sizeof(msg), "%s", smddp__last_error());
    for (int lr = 0; lr < comm->local_size; lr++) {
        while (p->sendq[lr]) {
            smddp__error_quiet(st, "%s", msg);
            finish_send(comm, lr, st);
        }
        p2p_state_t *in = &p->recvs[lr];
        if (in->op) {
            /* The rest of its message is dropped (the communicator is failing anyway). */
            smddp__op_t *op = in->op;
            in->op = NULL;
            in->mismatch = true;
            smddp__error_quiet(st, "%s", msg);
            complete(comm, op, st);
        }
        while (p->recvq[lr]) {
            smddp__op_t *op = p->recvq[lr];
            p->recvq[lr] = op->next;
            smddp__error_quiet(st, "%s", msg);
            complete(comm, op, st);
        }
    }
    while (p->anyq) {
        smddp__op_t *op = p->anyq;
        p->anyq = op->next;
        smddp__error_quiet(st, "%s", msg);
        complete(comm, op, st);
    }
    smddp__p2p_net_fail(comm, st, msg);
}

void smddp__p2p_abort_all(smddp_comm_t comm, smddp_status_t st)
{
    SMDDP_WARN("rank %d: %s", comm->rank, smddp__last_error());
    smddp__comm_fail(comm, st, smddp__last_error()); /* other nodes learn of it through the store */
    fail_all(comm, st);
}

/*
 * Sets op aside as failed with the current error, to be completed once
 * p->lock is let go: its completion callback may issue a send or receive,
 * which takes p->lock.
 */
static void set_aside_failed(smddp__op_t **failed, smddp__op_t *op, smddp_status_t st)
{
    op->status = st;
    smddp__op_keep_error(op);
    op->next = *failed;
    *failed = op;
}

static void complete_failed(smddp__op_t *failed)
{
    while (failed) {
        smddp__op_t *op = failed;
        failed = op->next;
        smddp__error_quiet(op->status, "%s", smddp__op_errmsg(op));
        smddp__op_complete(op, op->status);
        smddp__request_unref(op);
    }
}

/* Where an op taken from `incoming` goes (the engine's thread, p->lock not held). */
static void sort(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__p2p_t *p = comm->p2p;
    if (op->root < 0) { /* a receive from any rank */
        p->active++;
        sort_any(comm, op);
        return;
    }
    int lr = smddp__local_index(comm, op->root);
    if (lr < 0) {
        smddp__p2p_net_queue(comm, op);
        return;
    }
    p->active++;
    if (op->kind == SMDDP_OP_SEND)
        fifo_push(&p->sendq[lr], op);
    else
        sort_recv(comm, lr, op);
}

static void *p2p_main(void *arg)
{
    smddp_comm_t comm = arg;
    smddp__p2p_t *p = comm->p2p;
    int64_t last_check = 0;
    int idle = 0;
    smddp__library_thread_begin("send/recv");
    pthread_mutex_lock(&p->lock);
    for (;;) {
        smddp__op_t *failed = NULL, *taken = NULL, **taken_tail = &taken;
        while (p->incoming) {
            smddp__op_t *op = p->incoming;
            /*
             * A send of CUDA memory waits for its copy to the host; what was
             * issued after it waits too, so that order is kept.
             */
            smddp_status_t ready = op->stage ? smddp__cuda_calls()->stage_ready(op) : SMDDP_OK;
            if (ready == SMDDP_IN_PROGRESS) break;
            p->incoming = op->next;
            op->next = NULL;
            idle = 0; /* new work: the back-off below starts again from spinning */
            if (ready < 0) {
                set_aside_failed(&failed, op, ready);
                continue;
            }
            *taken_tail = op;
            taken_tail = &op->next;
        }
        bool held = p->incoming != NULL;
        if (!held) p->incoming_tail = NULL;
        if (!failed && !taken && p->active == 0 && !held) {
            if (p->stopping) break;
            pthread_cond_wait(&p->cond, &p->lock);
            continue;
        }
        pthread_mutex_unlock(&p->lock);

        /* Completion callbacks may issue sends and receives: p->lock is not held. */
        complete_failed(failed);
        while (taken) {
            smddp__op_t *op = taken;
            taken = op->next;
            op->next = NULL;
            sort(comm, op);
        }

        bool moved = false;
        smddp_status_t err = SMDDP_OK;
        for (int i = 0; i < comm->local_size && err == SMDDP_OK; i++) {
            int lr = (p->any_next_local + i) % comm->local_size;
            if (lr == comm->local_rank) continue;
            /* Keep going while messages complete: many small ones move in one pass. */
            while (p->sendq[lr]) {
                smddp__op_t *head = p->sendq[lr];
                moved |= progress_send(comm, lr);
                if (p->sendq[lr] == head) break;
            }
            p2p_state_t *in = &p->recvs[lr];
            while (err == SMDDP_OK && (p->recvq[lr] || p->anyq || in->op || in->ux ||
                                       in->mismatch)) {
                if (!progress_recv(comm, lr, &err)) break;
                moved = true;
                if (in->hdr_done) break; /* the message is not all here yet */
            }
        }
        if (err == SMDDP_OK && p->anyq && comm->net_p2p && comm->node_count > 1)
            moved |= progress_any(comm, &err);
        if (p->remote) moved |= smddp__p2p_net_progress(comm);
        if (p->stalled) smddp__p2p_net_retry(comm);
        if (err < 0) smddp__p2p_abort_all(comm, err);
        int64_t now = smddp__now_ns();
        if (now - last_check > CHECK_EVERY_NS) {
            last_check = now;
            smddp_status_t st = smddp__p2p_check_health(comm, now);
            if (st == SMDDP_OK) st = smddp__p2p_net_check(comm, now);
            if (st < 0) smddp__p2p_abort_all(comm, st);
        }
        /* Back off while nothing moves: spin, then yield, then short sleeps. */
        if (moved) {
            idle = 0;
        } else if (++idle > 2000) {
            struct timespec ts = {0, idle > 20000 ? 200 * 1000 : 20 * 1000};
            nanosleep(&ts, NULL);
        } else if (idle > 200) {
            sched_yield();
        }
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

static void free_unexpected(smddp__p2p_t *p, int n)
{
    for (int lr = 0; p->ux && lr < n; lr++) {
        while (p->ux[lr]) {
            unexpected_t *u = p->ux[lr];
            p->ux[lr] = u->next;
            free(u->data);
            free(u);
        }
    }
}

static void p2p_free(smddp__p2p_t *p, int local_size)
{
    if (!p) return;
    free_unexpected(p, local_size);
    free(p->seqs.keys);
    free(p->seqs.next);
    free(p->sending.keys);
    free(p->sending.next);
    free(p->sendq);
    free(p->recvq);
    free(p->ux);
    free(p->ux_tail);
    free(p->sends);
    free(p->recvs);
    free(p->waiting);
    free(p->waiting_tail);
    free(p);
}

smddp_status_t smddp__p2p_submit(smddp_comm_t comm, smddp__op_t *op)
{
    smddp__p2p_t *p = comm->p2p;
    if (!p) {
        p = calloc(1, sizeof(*p));
        size_t n = (size_t)comm->local_size, q = 2 * (size_t)comm->size;
        if (p) {
            p->sendq = calloc(n, sizeof(*p->sendq));
            p->recvq = calloc(n, sizeof(*p->recvq));
            p->ux = calloc(n, sizeof(*p->ux));
            p->ux_tail = calloc(n, sizeof(*p->ux_tail));
            p->sends = calloc(n, sizeof(*p->sends));
            p->recvs = calloc(n, sizeof(*p->recvs));
            p->waiting = calloc(q, sizeof(*p->waiting));
            p->waiting_tail = calloc(q, sizeof(*p->waiting_tail));
        }
        if (!p || !p->sendq || !p->recvq || !p->ux || !p->ux_tail || !p->sends || !p->recvs ||
            !p->waiting || !p->waiting_tail) {
            p2p_free(p, comm->local_size);
            return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate send/recv state");
        }
        pthread_mutex_init(&p->lock, NULL);
        pthread_cond_init(&p->cond, NULL);
        comm->p2p = p;
        int rc = pthread_create(&p->thread, NULL, p2p_main, comm);
        if (rc != 0) {
            comm->p2p = NULL;
            p2p_free(p, comm->local_size);
            return smddp__error(SMDDP_ERR_SYSTEM, "cannot start the send/recv thread: %s",
                                strerror(rc));
        }
        atomic_fetch_add(&comm->threads, 1);
    }
    /* A small send would complete before the health check saw a peer's abort. */
    SMDDP_CHECK(smddp__comm_check_alive(comm, op));
    if (op->root >= 0) { /* a receive from any rank takes its number when it is bound */
        uint64_t *next = smddp__p2p_count(&p->seqs, op->root, op->kind == SMDDP_OP_RECV,
                                          op->tag);
        if (!next) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate send/recv state");
        op->seq = (*next)++;
    }
    op->deadline_ns = smddp__now_ns() + smddp__op_timeout_ms(comm, op) * 1000000LL;
    atomic_fetch_add(&op->refs, 1); /* the engine's reference */
    pthread_mutex_lock(&p->lock);
    op->next = NULL;
    if (p->incoming_tail)
        p->incoming_tail->next = op;
    else
        p->incoming = op;
    p->incoming_tail = op;
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
    return SMDDP_OK;
}

void smddp__p2p_stop(smddp_comm_t comm)
{
    smddp__p2p_t *p = comm->p2p;
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stopping = true;
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    smddp__p2p_net_free(comm);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    p2p_free(p, comm->local_size);
    comm->p2p = NULL;
}
