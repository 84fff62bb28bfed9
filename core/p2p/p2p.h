/*
 * The send/recv engine (p2p.c, p2p_net.c): point-to-point messages between
 * any two ranks, matched by (source, tag), in send order within a tag, on a thread of their
 * own so that they never wait behind the collectives' queue.
 */
#ifndef SMDDP_CORE_P2P_H
#define SMDDP_CORE_P2P_H

#include "../comm.h"

/* Hands a send or receive to the engine (comm->lock held), starting it on first use. */
smddp_status_t smddp__p2p_submit(smddp_comm_t comm, smddp__op_t *op);
/* Stops the engine's thread and frees its state (destroy). */
void smddp__p2p_stop(smddp_comm_t comm);

#endif /* SMDDP_CORE_P2P_H */
