/*
 * The send/recv engine's checks (see p2p_engine.h): aborts, dead peers and
 * deadlines of every op waiting, and what a receive that timed out may be
 * missing.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>

#include "../fail.h"
#include "../transport/shm.h"
#include "p2p_engine.h"

/*
 * What a receive from lr that timed out may be missing: " (it sent messages
 * with tags 5, 9 that no receive took)", and whether set-aside messages
 * fill SMDDP_P2P_SET_ASIDE_MAX; "" when neither.
 */
static void describe_unexpected(const smddp__p2p_t *p, int lr, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    if (p->ux[lr]) {
        len += (size_t)snprintf(buf, cap, " (it sent messages with tags");
        int listed = 0;
        for (const unexpected_t *u = p->ux[lr]; u && len < cap; u = u->next) {
            bool seen = false;
            for (const unexpected_t *v = p->ux[lr]; v != u && !seen; v = v->next)
                seen = v->tag == u->tag;
            if (seen) continue;
            if (++listed > 8) {
                len += (size_t)snprintf(buf + len, cap - len, ", ...");
                break;
            }
            len += (size_t)snprintf(buf + len, cap - len, "%s %d", listed > 1 ? "," : "",
                                    (int)u->tag);
        }
        if (len < cap) len += (size_t)snprintf(buf + len, cap - len, " that no receive took");
    }
    if (p->set_aside_full && len < cap)
        len += (size_t)snprintf(buf + len, cap - len,
                                "%s messages set aside for later receives fill "
                                "SMDDP_P2P_SET_ASIDE_MAX (%" PRIu64 " bytes), so later ones "
                                "wait in their rings",
                                len ? ";" : " (", p->set_aside);
    if (len && len < cap) snprintf(buf + len, cap - len, ")");
}

/* Abort, dead-peer and deadline checks of a send or receive between ranks of the node. */
static smddp_status_t check_local(smddp_comm_t comm, int lr, const smddp__op_t *op, int who,
                                  const char *amsg, int64_t now)
{
    bool recv = op->kind == SMDDP_OP_RECV;
    char desc[256];
    smddp__op_describe(op, desc, sizeof(desc));
    if (atomic_load(&comm->aborted))
        return smddp__error_quiet(SMDDP_ERR_ABORTED, "%s failed: communicator aborted: %s", desc,
                                  comm->abort_msg);
    if (who >= 0)
        return smddp__error_quiet(SMDDP_ERR_ABORTED,
                                  "%s failed: rank %d aborted the communicator: %s", desc, who,
                                  amsg);
    int state = smddp__shm_peer_state(comm, lr);
    /* A receive may still drain what a departed sender left in the ring. */
    bool drained = !recv || smddp__shm_ring_avail(comm, lr) == 0;
    if (state && drained)
        return smddp__error_quiet(SMDDP_ERR_PEER_LOST, "%s failed: rank %d %s", desc, op->root,
                                  state == 1 ? "died" : "destroyed its communicator");
    if (now < op->deadline_ns) return SMDDP_OK;
    char others[320];
    describe_unexpected(comm->p2p, lr, others, sizeof(others));
    return smddp__error_quiet(SMDDP_ERR_TIMEOUT, "%s timed out after %.3f s: rank %d did not %s%s",
                              desc, (double)smddp__op_timeout_ms(comm, op) / 1000.0, op->root,
                              recv ? "send it" : "receive it", recv ? others : "");
}

smddp_status_t smddp__p2p_check_health(smddp_comm_t comm, int64_t now)
{
    smddp__p2p_t *p = comm->p2p;
    const char *amsg = NULL;
    int who = smddp__shm_abort_flag(comm, &amsg);
    for (int lr = 0; lr < comm->local_size; lr++) {
        /* Sends go in order: the first is the oldest. */
        if (p->sendq[lr]) SMDDP_CHECK(check_local(comm, lr, p->sendq[lr], who, amsg, now));
        if (p->recvs[lr].op) SMDDP_CHECK(check_local(comm, lr, p->recvs[lr].op, who, amsg, now));
        for (const smddp__op_t *op = p->recvq[lr]; op; op = op->next)
            SMDDP_CHECK(check_local(comm, lr, op, who, amsg, now));
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
                                      "sent it a message with tag %d", desc,
                                      (double)smddp__op_timeout_ms(comm, op) / 1000.0, op->tag);
    }
    return SMDDP_OK;
}
