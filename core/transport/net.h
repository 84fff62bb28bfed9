/*
 * The network between nodes as the rest of the core sees it: one table of
 * calls (smddp__net_transport_t), endpoints it keeps opaque, and transfers
 * in the caller's memory. The algorithms across nodes (coll/net/,
 * coll/hier/), the send/recv engine (p2p/) and the liveness watch use only
 * this; libfabric (ofi.c) is the one table there is. A build without
 * libfabric has no table, and a communicator that spans nodes fails at
 * creation saying so.
 *
 * A communicator has two endpoints: comm->net_ep, driven by the thread that
 * runs its collectives, and comm->net_p2p, driven by the send/recv thread,
 * so no lock is needed. Transfers are posted, then completed by progress
 * (which marks them done) or waited for with smddp__xfer_wait. A failed
 * transfer's message names the peer and carries the transport's error text.
 */
#ifndef SMDDP_CORE_NET_H
#define SMDDP_CORE_NET_H

#include "../comm.h"
#include "transport.h"

/* One posted transfer, in the caller's memory until it is done or abandoned. */
typedef struct smddp__xfer {
    void *ctx[8];          /* the transport's context for it (libfabric: struct fi_context2) */
    int peer;              /* comm rank */
    int is_send;
    size_t len;
    uint64_t tag;          /* completed receive: the sender's tag */
    size_t received;       /* completed receive: bytes that arrived */
    int done;
    int peek;              /* a peek ... */
    int nomsg;             /* ... that found no message */
    smddp_status_t status;
    char err[256];         /* why it failed */
    void *pin;             /* the transport's registration of its buffer, held until done */
} smddp__xfer_t;

struct sockaddr_storage;

typedef struct smddp__net_transport {
    const char *name;
    /*
     * Collective over every rank of comm, through its store: opens comm's
     * two endpoints and publishes their addresses (a peer's is read when it
     * is first named). On failure opens none.
     */
    smddp_status_t (*setup)(smddp_comm_t comm, smddp__net_ep_t **coll, smddp__net_ep_t **p2p);
    /* Closes ep (NULL: nothing); transfers still posted are dropped. */
    void (*teardown)(smddp__net_ep_t *ep);
    /* Completes what has finished, marking those transfers done; never blocks. */
    smddp_status_t (*progress)(smddp__net_ep_t *ep);
    /*
     * For an operation that failed with x still posted (x, or the buffer it
     * names, about to be freed): no completion, and no data, may land there
     * afterwards; ep is not read again. No-op when x is done.
     */
    void (*abort)(smddp__net_ep_t *ep, smddp__xfer_t *x);
    /*
     * Posts a tagged send of len bytes to, or a receive from, comm rank peer;
     * a receive matches a send from peer whose tag equals tag in every bit
     * not set in ignore. With wait false it gives up at once
     * (SMDDP_IN_PROGRESS, nothing posted) when ep cannot take it yet (full,
     * or still connecting to peer), else it retries until the op's deadline
     * or an abort. An error posts nothing.
     */
    smddp_status_t (*post)(smddp__net_ep_t *ep, smddp__xfer_t *x, int is_send, int peer,
                           uint64_t tag, uint64_t ignore, void *buf, size_t len, bool wait);
    /*
     * Whether a message from peer matching (tag, ignore) has arrived, without
     * receiving it: x completes with x->nomsg when none has, else with x->tag
     * and x->received of the message, which a receive posted next matches.
     * SMDDP_IN_PROGRESS, nothing posted, when ep is full.
     */
    smddp_status_t (*peek)(smddp__net_ep_t *ep, smddp__xfer_t *x, int peer, uint64_t tag,
                           uint64_t ignore);
    /*
     * Collectives bracket their transfers with these: buffers used again are
     * registered once per collective where the transport needs registration,
     * and a post it keeps refusing gives up at deadline_ns (0: the timeout).
     */
    void (*op_begin)(smddp__net_ep_t *ep, int64_t deadline_ns);
    void (*op_end)(smddp__net_ep_t *ep);
    /* Registration counters (all 0, registering false, without registration). */
    void (*mr_stats)(const smddp__net_ep_t *ep, uint64_t *hits, uint64_t *misses,
                     bool *registering);
    /* What carries the traffic, for messages, e.g. "tcp;ofi_rxm". */
    const char *(*provider)(const smddp__net_ep_t *ep);
    /*
     * This rank's address on ep as an IP socket address, when the transport's
     * are (tcp); else false. Peers learn theirs from the store (watch.c).
     */
    bool (*own_sockaddr)(smddp__net_ep_t *ep, struct sockaddr_storage *addr, unsigned *len);
} smddp__net_transport_t;

/* The network transport this build has; NULL without one. */
const smddp__net_transport_t *smddp__net_transport(void);

/* Opens comm's endpoints (collective over comm); an error names what is missing. */
smddp_status_t smddp__net_open(smddp_comm_t comm);
/* Closes both endpoints and forgets the transport; safe when none is open. */
void smddp__net_close(smddp_comm_t comm);
/* comm.c's entry for the two: smddp__net_open and smddp__net_close. */
extern const smddp__transport_t smddp__net_endpoints;
/* Closes the send/recv endpoint only (the send/recv thread has stopped). */
void smddp__net_close_p2p(smddp_comm_t comm);

/* A post on the collectives' endpoint that waits for room (ignore 0). */
static inline smddp_status_t smddp__xfer_post(smddp_comm_t comm, smddp__xfer_t *x, int is_send,
                                              int peer, uint64_t tag, void *buf, size_t len)
{
    return comm->net->post(comm->net_ep, x, is_send, peer, tag, 0, buf, len, true);
}

/* Who a wait is stuck on, for its timeout message. */
typedef struct smddp__xfer_blame {
    int peer;    /* comm rank, -1: unknown */
    int is_send; /* waiting for it to receive (1) or to send (0) */
} smddp__xfer_blame_t;
/*
 * Polls a condition (SMDDP_OK: met; SMDDP_IN_PROGRESS: not yet, *blame set;
 * an error: failed); the poll function drives progress itself.
 */
typedef smddp_status_t (*smddp__xfer_poll_fn)(void *arg, smddp__xfer_blame_t *blame);
/* Polls until the condition holds, op's deadline passes or comm is aborted (spin, yield, sleep). */
smddp_status_t smddp__xfer_wait_until(smddp_comm_t comm, const smddp__op_t *op,
                                      smddp__xfer_poll_fn poll, void *arg);
/* Drives the collectives' endpoint until x is done; then smddp__xfer_status. */
smddp_status_t smddp__xfer_wait(smddp_comm_t comm, const smddp__op_t *op, smddp__xfer_t *x);
/* SMDDP_OK, or x's failure as an error that names op. */
smddp_status_t smddp__xfer_status(const smddp__op_t *op, const smddp__xfer_t *x);

#endif /* SMDDP_CORE_NET_H */
