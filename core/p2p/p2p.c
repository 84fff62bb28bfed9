/*
 * Point-to-point messages (send/recv) on their own progress thread.
 *
 * Collectives run one at a time in issue order, but send/recv must not: the
 * usual exchange "irecv from prev, isend to next" on every rank would
 * deadlock if each rank's receive blocked its own send. So send/recv ops
 * bypass the collective queue. Each goes into a FIFO per (direction, peer),
 * which keeps messages between two ranks in order, and the p2p thread moves
 * bytes for the head of every FIFO at once through the pair rings, never
 * blocking on any single one. A message is a 16-byte header (magic, tag,
 * length) and the payload.
 *
 * A peer on another node is reached through the communicator's send/recv
 * endpoint (comm->ofi_p2p), which only this thread drives (p2p_net.c; the
 * peeks for receives from any rank below): each op is posted as soon as it
 * arrives, tagged (per-peer message number, user tag); a receive matches the
 * next message number whatever its tag and then checks tag and size, so
 * messages between two ranks match in order, as inside a node.
 *
 * A receive from any rank waits in its own FIFO until some rank's next
 * message is there for it: a pair ring with bytes in it, or a message that
 * a peek (FI_PEEK, tagged with the pair's next message number) finds on the
 * network, from a rank no directed receive is waiting for. It is then bound
 * to that rank, takes the pair's next message number, and goes on as a
 * directed receive. Receives from any rank are matched in posting order; a
 * directed receive waiting for a rank keeps that rank's messages for itself.
 */
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../transport/shm.h"
#include "../cuda/stage.h"
#include "../fail.h"
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

static void finish(smddp_comm_t comm, smddp__op_t **head, p2p_state_t *state, smddp_status_t st)
{
    smddp__op_t *op = *head;
    *head = op->next;
    memset(state, 0, sizeof(*state));
    comm->p2p->active--;
    smddp__op_complete(op, st);
    smddp__request_unref(op);
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
        st->hdr.bytes = op->count * smddp__dtype_size(op->dtype);
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
        finish(comm, &p->sendq[lr], st, SMDDP_OK);
        return true;
    }
    return moved > 0;
}

static bool progress_recv(smddp_comm_t comm, int lr)
{
    smddp__p2p_t *p = comm->p2p;
    smddp__op_t *op = p->recvq[lr];
    p2p_state_t *st = &p->recvs[lr];
    size_t moved = 0;
    if (st->hdr_done < sizeof(st->hdr)) {
        size_t n = smddp__shm_ring_get(comm, lr, (char *)&st->hdr + st->hdr_done,
                                       sizeof(st->hdr) - st->hdr_done);
        st->hdr_done += n;
        moved += n;
        if (st->hdr_done < sizeof(st->hdr)) return moved > 0;
        uint64_t want = op->count * smddp__dtype_size(op->dtype);
        if (st->hdr.magic != P2P_MAGIC) {
            char desc[256];
            smddp__op_describe(op, desc, sizeof(desc));
            smddp_status_t err = smddp__error_quiet(SMDDP_ERR_INTERNAL,
                                                    "%s: corrupt message header from rank %d",
                                                    desc, op->root);
            finish(comm, &p->recvq[lr], st, err);
            return true;
        }
        st->mismatch = st->hdr.tag != op->tag || st->hdr.bytes != want;
    }
    if (st->payload_done < st->hdr.bytes) {
        /* A mismatched message is drained and dropped, so the stream stays in step. */
        char *dst = st->mismatch ? NULL : (char *)op->recvbuf + st->payload_done;
        size_t n = smddp__shm_ring_get(comm, lr, dst, (size_t)st->hdr.bytes - st->payload_done);
        st->payload_done += n;
        moved += n;
    }
    if (st->payload_done == st->hdr.bytes) {
        smddp_status_t result = SMDDP_OK;
        if (st->mismatch) {
            char desc[256];
            smddp__op_describe(op, desc, sizeof(desc));
            result = smddp__error_quiet(
                SMDDP_ERR_MISMATCH,
                "%s: the next message from rank %d has tag %d and %" PRIu64 " bytes, but this "
                "recv expects tag %d and %zu bytes (messages between two ranks are matched in "
                "order); the message was discarded",
                desc, op->root, (int)st->hdr.tag, st->hdr.bytes, op->tag,
                op->count * smddp__dtype_size(op->dtype));
        }
        finish(comm, &p->recvq[lr], st, result);
        return true;
    }
    return moved > 0;
}

/*
 * Hands the oldest receive from any rank to src as its next directed receive,
 * with the message number claimed under comm->lock (a directed receive
 * submitted meanwhile takes the next one).
 */
void smddp__p2p_bind_any(smddp_comm_t comm, int src, uint64_t seq)
{
    smddp__p2p_t *p = comm->p2p;
    smddp__op_t *op = p->anyq;
    p->anyq = op->next;
    op->root = src;
    op->seq = seq;
    int lr = smddp__local_index(comm, src);
    if (lr >= 0) {
        fifo_push(&p->recvq[lr], op);
    } else {
        p->active--; /* smddp__p2p_net_queue counts it again */
        smddp__p2p_net_queue(comm, op);
    }
}

/* Binds receives from any rank to ranks whose next message has come; true if any was. */
static bool progress_any(smddp_comm_t comm, smddp_status_t *err)
{
    smddp__p2p_t *p = comm->p2p;
    bool any = false;
    if (p->peeks && comm->ofi_p2p) {
        smddp_status_t st = smddp__ofi_progress(comm->ofi_p2p);
        if (st < 0) {
            *err = st;
            return false;
        }
    }
    while (p->anyq) {
        int src = -1;
        for (int i = 0; i < comm->size && src < 0; i++) {
            int q = (p->any_next + i) % comm->size;
            if (q == comm->rank) continue;
            int lr = smddp__local_index(comm, q);
            if (lr >= 0) {
                if (!p->recvq[lr] && smddp__shm_ring_avail(comm, lr) > 0) {
                    /*
                     * The pair's rings match in order: the number only names it
                     * in messages. A directed receive from q issued but not
                     * sorted yet takes q's next message, not this one.
                     */
                    pthread_mutex_lock(&comm->lock);
                    uint64_t seq = comm->p2p_recv_seq[q];
                    bool free_to_take = seq == p->recvs_sorted[lr];
                    if (free_to_take) comm->p2p_recv_seq[q]++;
                    pthread_mutex_unlock(&comm->lock);
                    if (free_to_take) {
                        p->recvs_sorted[lr]++;
                        smddp__p2p_bind_any(comm, q, seq);
                        src = q;
                    }
                }
            } else if (p->peeks && smddp__p2p_net_match(comm, q, err)) {
                src = q;
            }
            if (*err < 0) return any;
        }
        if (src < 0) break;
        p->any_next = (src + 1) % comm->size; /* the next search starts past it: no starving */
        any = true;
    }
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
            finish(comm, &p->sendq[lr], &p->sends[lr], st);
        }
        while (p->recvq[lr]) {
            smddp__error_quiet(st, "%s", msg);
            finish(comm, &p->recvq[lr], &p->recvs[lr], st);
        }
    }
    while (p->anyq) {
        smddp__op_t *op = p->anyq;
        p->anyq = op->next;
        p->active--;
        smddp__error_quiet(st, "%s", msg);
        smddp__op_complete(op, st);
        smddp__request_unref(op);
    }
    smddp__p2p_net_fail(comm, st, msg);
}

/* Deadline, abort and dead-peer checks for every FIFO head. */
static smddp_status_t check_health(smddp_comm_t comm)
{
    smddp__p2p_t *p = comm->p2p;
    const char *amsg = NULL;
    int who = smddp__shm_abort_flag(comm, &amsg);
    int64_t now = smddp__now_ns();
    for (int lr = 0; lr < comm->local_size; lr++) {
        for (int dir = 0; dir < 2; dir++) {
            smddp__op_t *op = dir ? p->recvq[lr] : p->sendq[lr];
            if (!op) continue;
            char desc[256];
            smddp__op_describe(op, desc, sizeof(desc));
            if (atomic_load(&comm->aborted))
                return smddp__error_quiet(SMDDP_ERR_ABORTED, "%s failed: communicator aborted: %s",
                                          desc, comm->abort_msg);
            if (who >= 0)
                return smddp__error_quiet(SMDDP_ERR_ABORTED,
                                          "%s failed: rank %d aborted the communicator: %s", desc,
                                          who, amsg);
            int state = smddp__shm_peer_state(comm, lr);
            /* A receive may still drain what a departed sender left in the ring. */
            bool drained = !dir || smddp__shm_ring_avail(comm, lr) == 0;
            if (state && drained)
                return smddp__error_quiet(SMDDP_ERR_PEER_LOST, "%s failed: rank %d %s", desc,
                                          op->root,
                                          state == 1 ? "died" : "destroyed its communicator");
            if (now >= op->deadline_ns)
                return smddp__error_quiet(SMDDP_ERR_TIMEOUT,
                                          "%s timed out after %.3f s: rank %d did not %s", desc,
                                          (double)smddp__op_timeout_ms(comm, op) / 1000.0, op->root,
                                          dir ? "send it" : "receive it");
        }
    }
    /* Nothing else asks the store or the liveness watch while only these wait. */
    if (p->anyq && comm->node_count > 1) (void)smddp__comm_poll_remote_abort(comm, now, -1);
    for (smddp__op_t *op = p->anyq; op; op = op->next) {
        char desc[256];
        smddp__op_describe(op, desc, sizeof(desc));
        if (atomic_load(&comm->aborted) || who >= 0)
            return smddp__error_quiet(SMDDP_ERR_ABORTED, "%s failed: communicator aborted: %s",
                                      desc, atomic_load(&comm->aborted) ? comm->abort_msg : amsg);
        if (now >= op->deadline_ns)
            return smddp__error_quiet(SMDDP_ERR_TIMEOUT, "%s timed out after %.3f s: no rank "
                                      "sent it a message", desc,
                                      (double)smddp__op_timeout_ms(comm, op) / 1000.0);
    }
    return smddp__p2p_net_check(comm, now);
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
    snprintf(op->errmsg, sizeof(op->errmsg), "%s", smddp__last_error());
    op->next = *failed;
    *failed = op;
}

static void complete_failed(smddp__op_t *failed)
{
    while (failed) {
        smddp__op_t *op = failed;
        failed = op->next;
        smddp__error_quiet(op->status, "%s", op->errmsg);
        smddp__op_complete(op, op->status);
        smddp__request_unref(op);
    }
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
        smddp__op_t *failed = NULL;
        while (p->incoming) {
            smddp__op_t *op = p->incoming;
            /*
             * A send of CUDA memory waits for its copy to the host; what was
             * issued after it waits too, so that order is kept.
             */
            smddp_status_t ready = op->stage ? smddp__cuda_stage_ready(op) : SMDDP_OK;
            if (ready == SMDDP_IN_PROGRESS) break;
            p->incoming = op->next;
            idle = 0; /* new work: the back-off below starts again from spinning */
            if (ready < 0) {
                int flr = op->root >= 0 ? smddp__local_index(comm, op->root) : -1;
                if (op->kind == SMDDP_OP_RECV && flr >= 0)
                    p->recvs_sorted[flr]++; /* its number is spent */
                set_aside_failed(&failed, op, ready);
                continue;
            }
            if (op->root < 0) { /* a receive from any rank */
                if (!p->peeks && comm->ofi_p2p && comm->node_count > 1) {
                    p->peeks = calloc((size_t)comm->size, sizeof(*p->peeks));
                    if (!p->peeks) {
                        set_aside_failed(&failed, op, smddp__error(SMDDP_ERR_NO_MEMORY, "cannot "
                                         "allocate a receive from any rank"));
                        continue;
                    }
                }
                fifo_push(&p->anyq, op);
                p->active++;
                continue;
            }
            int lr = smddp__local_index(comm, op->root);
            if (lr < 0) {
                smddp__p2p_net_queue(comm, op);
                continue;
            }
            fifo_push(op->kind == SMDDP_OP_SEND ? &p->sendq[lr] : &p->recvq[lr], op);
            if (op->kind == SMDDP_OP_RECV) p->recvs_sorted[lr]++;
            p->active++;
        }
        bool held = p->incoming != NULL;
        if (!held) p->incoming_tail = NULL;
        if (failed) {
            pthread_mutex_unlock(&p->lock);
            complete_failed(failed);
            pthread_mutex_lock(&p->lock);
            continue;
        }
        if (p->active == 0 && !held) {
            if (p->stopping) break;
            pthread_cond_wait(&p->cond, &p->lock);
            continue;
        }
        pthread_mutex_unlock(&p->lock);

        bool moved = false;
        for (int lr = 0; lr < comm->local_size; lr++) {
            /* Keep going while heads complete: many small messages move in one pass. */
            while (p->sendq[lr]) {
                smddp__op_t *head = p->sendq[lr];
                moved |= progress_send(comm, lr);
                if (p->sendq[lr] == head) break;
            }
            while (p->recvq[lr]) {
                smddp__op_t *head = p->recvq[lr];
                moved |= progress_recv(comm, lr);
                if (p->recvq[lr] == head) break;
            }
        }
        smddp_status_t any_err = SMDDP_OK;
        if (p->anyq) moved |= progress_any(comm, &any_err);
        if (p->remote) moved |= smddp__p2p_net_progress(comm);
        if (p->stalled) smddp__p2p_net_retry(comm);
        if (any_err < 0) smddp__p2p_abort_all(comm, any_err);
        int64_t now = smddp__now_ns();
        if (now - last_check > CHECK_EVERY_NS) {
            last_check = now;
            smddp_status_t st = check_health(comm);
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

static void p2p_free(smddp__p2p_t *p)
{
    if (!p) return;
    free(p->peeks);
    free(p->sendq);
    free(p->recvq);
    free(p->recvs_sorted);
    free(p->sends);
    free(p->recvs);
    free(p->waiting);
    free(p->waiting_tail);
    free(p->posted);
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
            p->recvs_sorted = calloc(n, sizeof(*p->recvs_sorted));
            p->sends = calloc(n, sizeof(*p->sends));
            p->recvs = calloc(n, sizeof(*p->recvs));
            p->waiting = calloc(q, sizeof(*p->waiting));
            p->waiting_tail = calloc(q, sizeof(*p->waiting_tail));
            p->posted = calloc(q, sizeof(*p->posted));
        }
        if (!p || !p->sendq || !p->recvq || !p->recvs_sorted || !p->sends || !p->recvs ||
            !p->waiting || !p->waiting_tail || !p->posted) {
            p2p_free(p);
            return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate send/recv state");
        }
        pthread_mutex_init(&p->lock, NULL);
        pthread_cond_init(&p->cond, NULL);
        comm->p2p = p;
        int rc = pthread_create(&p->thread, NULL, p2p_main, comm);
        if (rc != 0) {
            comm->p2p = NULL;
            p2p_free(p);
            return smddp__error(SMDDP_ERR_SYSTEM, "cannot start the send/recv thread: %s",
                                strerror(rc));
        }
    }
    /* A small send would complete before the health check saw a peer's abort. */
    SMDDP_CHECK(smddp__comm_check_alive(comm, op));
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
    p2p_free(p);
    comm->p2p = NULL;
}
