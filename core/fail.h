/*
 * The failure protocol (fail.c): the communicator's last error, abort,
 * publishing an abort to other nodes and adopting a peer's.
 */
#ifndef SMDDP_CORE_FAIL_H
#define SMDDP_CORE_FAIL_H

#include "comm.h"

/* Records msg as comm's last error (smddp_get_last_error(comm)). */
void smddp__comm_set_last_error(smddp_comm_t comm, const char *msg);
/* Aborts comm with status and msg; the first abort's message is kept. */
void smddp__comm_abort(smddp_comm_t comm, smddp_status_t status, const char *msg);
/*
 * Aborts comm here too if a peer has aborted it, so that an operation that
 * is about to start fails as the peer's did rather than running alone.
 */
void smddp__comm_adopt_peer_abort(smddp_comm_t comm);
/*
 * Aborts comm on a failure found on this rank (not one it adopted) and,
 * across nodes, tells the other nodes through the store, so that ranks
 * waiting there for a rank that will never come fail at once with the
 * reason instead of at their deadline.
 */
void smddp__comm_fail(smddp_comm_t comm, smddp_status_t status, const char *msg);
/*
 * smddp_comm_abort: aborts comm and, the first time, tells the other nodes as
 * above, unless the store stays busy for half a second (then they fail at
 * their deadline): an abort never hangs on the store.
 */
void smddp__comm_abort_by_user(smddp_comm_t comm, const char *msg);
/*
 * For long waits across nodes: at most every half second, looks in the
 * store for an abort another node published, and adopts it; a store that
 * stopped answering (its host died) aborts comm too, naming waiting_for (the
 * comm rank this rank waits for, or -1). True if comm is now aborted.
 */
bool smddp__comm_poll_remote_abort(smddp_comm_t comm, int64_t now_ns, int waiting_for);
/*
 * Before op starts: adopts a peer's abort, then SMDDP_OK, or
 * SMDDP_ERR_ABORTED naming op and the abort's message if comm is aborted.
 */
smddp_status_t smddp__comm_check_alive(smddp_comm_t comm, const smddp__op_t *op);

#endif /* SMDDP_CORE_FAIL_H */
