/*
 * Liveness across nodes (watch.c): each rank of a communicator that spans
 * nodes keeps a TCP connection to the next rank's listening socket, and to
 * that of any rank on another node it has waited for. A rank whose process
 * ends closes that socket: its watchers see the connection reset, unless
 * they first got a goodbye (the rank destroyed its communicator). Without
 * this, a rank alone on its node that died left the others waiting for
 * SMDDP_TIMEOUT: nothing else on the network tells.
 */
#ifndef SMDDP_TRANSPORT_WATCH_H
#define SMDDP_TRANSPORT_WATCH_H

#include "../comm.h"
#include "transport.h"

/*
 * For a communicator that spans nodes. setup listens, publishes the port
 * through the store and connects to the next rank; it never fails the
 * communicator: where the provider's addresses are not IP (efa) or a step
 * fails, the watch is off for this rank (INFO says why). teardown says
 * goodbye to whoever watches this rank, then closes everything.
 */
extern const smddp__transport_t smddp__watch_transport;

/*
 * A rank this rank watches whose connection broke without a goodbye at
 * least SMDDP__WATCH_GRACE_NS ago (or, for waiting_for only, whose port
 * refused the connection, unless the network is known to refuse listening
 * ranks), with what happened in why; else -1. waiting_for (>= 0) is a rank an
 * operation waits for: if it is on another node and not watched yet, it is
 * from now on. The grace lets a rank that ended right after its last
 * transfer (a script that exits without destroying the group) finish what
 * it sent before anyone calls it dead.
 */
int smddp__watch_dead(smddp_comm_t comm, int64_t now_ns, int waiting_for, char *why,
                     size_t why_len);

#define SMDDP__WATCH_GRACE_NS (2000 * 1000000LL)

/*
 * Whether peer, a rank on another node, is gone as far as this rank's watch
 * of it can tell (its connection reset, or refused, SMDDP__WATCH_GRACE_NS
 * ago); starts watching it if it is not watched yet, so that asking again
 * later tells. False when the watch is busy or off.
 */
bool smddp__watch_peer_gone(smddp_comm_t comm, int peer, int64_t now_ns);

#endif /* SMDDP_TRANSPORT_WATCH_H */
