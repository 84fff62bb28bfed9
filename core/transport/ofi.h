/*
 * The network transport between nodes, on libfabric: one reliable-datagram
 * endpoint per communicator with tagged messages, peers' addresses exchanged
 * through the store.
 *
 * Transfers are posted with smddp__ofi_post and completed by smddp__ofi_wait,
 * which drives the completion queue on the calling thread (the thread that
 * runs the communicator's operations), so no lock is needed. A failed
 * transfer's message names the peer and carries libfabric's error text.
 */
#ifndef SMDDP_CORE_OFI_H
#define SMDDP_CORE_OFI_H

#include "../comm.h"

/* True when the library was built with libfabric. */
bool smddp__ofi_built(void);
/* Whether libfabric offers provider here (reliable datagrams, tagged messages). */
bool smddp__ofi_offers(const char *provider);
/* Where RDMA devices are listed (sysfs); an EFA device is one whose driver is "efa". */
#define SMDDP_EFA_CLASS_DIR "/sys/class/infiniband"
/* Whether class_dir lists a device driven by efa (false where it cannot be read). */
bool smddp__efa_present(const char *class_dir);

/*
 * Collective over every rank of comm, through its store: opens two endpoints
 * (collectives, send/recv), publishes their addresses and inserts every peer's. The provider is
 * SMDDP_OFI_PROVIDER, else libfabric's choice under FI_PROVIDER, else efa
 * where present, else tcp;ofi_rxm. FI_PROVIDER=efa on a machine with no EFA
 * device counts as unset (one warning says so) unless SMDDP_OFI_PROVIDER is set.
 */
smddp_status_t smddp__ofi_setup(smddp_comm_t comm);
/* Closes the endpoints; transfers still posted are dropped. Safe without setup. */
void smddp__ofi_teardown(smddp_comm_t comm);
/* Whether the provider moves device memory (FI_HMEM): recorded for the GPU path. */
bool smddp__ofi_hmem(smddp_comm_t comm);
/* Closes only the send/recv endpoint (the p2p thread has stopped). */
void smddp__ofi_teardown_p2p(smddp_comm_t comm);
/*
 * Collectives bracket their transfers with these, so that buffers they use
 * again (rings send from the same blocks every round) are registered once
 * per collective where the provider needs registration (FI_MR_LOCAL, or
 * SMDDP_OFI_MR=always), and so that a post the provider keeps refusing
 * (a connection to a dead peer) gives up at op's deadline.
 */
void smddp__ofi_op_begin(smddp_comm_t comm, const smddp__op_t *op);
void smddp__ofi_op_end(smddp_comm_t comm);
/* Registration counters of comm's collective endpoint (all 0 without registration). */
void smddp__ofi_mr_stats(smddp_comm_t comm, uint64_t *hits, uint64_t *misses, bool *registering);

/* The provider in use, e.g. "tcp;ofi_rxm" (NULL before setup). */
const char *smddp__ofi_provider(smddp_comm_t comm);

/*
 * The IP address (with the endpoint's port) of rank's collective endpoint,
 * when the provider's addresses are IP socket addresses (tcp); false if not.
 */
struct sockaddr_storage;
bool smddp__ofi_sockaddr(smddp_comm_t comm, int rank, struct sockaddr_storage *addr,
                         unsigned *len);

/* One posted transfer, in the caller's memory until smddp__ofi_wait returns. */
typedef struct smddp__ofi_xfer {
    void *ctx[8];          /* libfabric's operation context (struct fi_context2) */
    int peer;              /* comm rank */
    int is_send;
    size_t len;
    uint64_t tag;          /* completed receive: the sender's tag */
    size_t received;       /* completed receive: bytes that arrived */
    int done;
    int peek;              /* a peek (smddp__ofi_peek_on) ... */
    int nomsg;             /* ... that found no message */
    smddp_status_t status;
    char err[256];         /* why it failed */
    struct smddp__mr_entry *mr; /* its registration, pinned until done (FI_MR_LOCAL) */
} smddp__ofi_xfer_t;

/*
 * Posts a tagged send of len bytes to, or a receive from, comm rank peer. A
 * receive matches only a send from that peer with the same tag. Returns an
 * error (and posts nothing) if the endpoint refuses the transfer.
 */
smddp_status_t smddp__ofi_post(smddp_comm_t comm, smddp__ofi_xfer_t *x, int is_send, int peer,
                               uint64_t tag, void *buf, size_t len);
/*
 * Drives completions until x is done, op's deadline passes or comm is
 * aborted. op names the collective in messages (its deadline_ns bounds the
 * wait; 0: no deadline).
 */
smddp_status_t smddp__ofi_wait(smddp_comm_t comm, const smddp__op_t *op, smddp__ofi_xfer_t *x);

/* Who a wait is stuck on, for its timeout message. */
typedef struct smddp__ofi_blame {
    int peer;    /* comm rank, -1: unknown */
    int is_send; /* waiting for it to receive (1) or to send (0) */
} smddp__ofi_blame_t;
/*
 * Polls a condition (SMDDP_OK: met; SMDDP_IN_PROGRESS: not yet, *blame set;
 * an error: failed); the poll function drives the completion queue itself.
 */
typedef smddp_status_t (*smddp__ofi_poll_fn)(void *arg, smddp__ofi_blame_t *blame);
/* smddp__ofi_wait's loop (spin, yield, sleep; aborts; op's deadline) around any condition. */
smddp_status_t smddp__ofi_wait_until(smddp_comm_t comm, const smddp__op_t *op,
                                     smddp__ofi_poll_fn poll, void *arg);
/* SMDDP_OK, or x's failure as an error that names op. */
smddp_status_t smddp__ofi_xfer_status(const smddp__op_t *op, const smddp__ofi_xfer_t *x);

/*
 * The same on a given endpoint (comm->ofi: collectives' thread; comm->ofi_p2p:
 * the send/recv thread), never blocking; a receive matches tags that equal
 * tag in every bit not set in ignore.
 */
smddp_status_t smddp__ofi_post_on(smddp__ofi_t *o, smddp__ofi_xfer_t *x, int is_send, int peer,
                                  uint64_t tag, uint64_t ignore, void *buf, size_t len);
/*
 * The same, but gives up at once (SMDDP_IN_PROGRESS, nothing posted) when
 * the endpoint cannot take the transfer yet: full, or (rxm) still connecting
 * to peer. For the send/recv thread, which must not stall every pair for one.
 */
smddp_status_t smddp__ofi_try_post_on(smddp__ofi_t *o, smddp__ofi_xfer_t *x, int is_send,
                                      int peer, uint64_t tag, uint64_t ignore, void *buf,
                                      size_t len);
/*
 * Asks o whether a message from rank peer whose tag matches (tag, ignore)
 * has arrived, without receiving it (FI_PEEK). x reports done with
 * x->nomsg set when none has, else with x->tag and x->received of the
 * message, which a receive posted next is certain to match. Returns
 * SMDDP_IN_PROGRESS, posting nothing, when the endpoint is full.
 */
smddp_status_t smddp__ofi_peek_on(smddp__ofi_t *o, smddp__ofi_xfer_t *x, int peer, uint64_t tag,
                                  uint64_t ignore);
/* Reads o's completion queue once, marking finished transfers done. */
smddp_status_t smddp__ofi_progress(smddp__ofi_t *o);
/*
 * For an operation that failed with x still posted in memory (x, or the
 * buffer it names) about to be freed or handed back: stops o from ever
 * reading its completion queue again (the communicator is aborted by then),
 * so no completion can land in freed memory, and on providers whose hardware
 * moves data by itself (efa, verbs) cancels x and closes the endpoint, so no
 * data can either. No-op when x is done.
 */
void smddp__ofi_abandon(smddp__ofi_t *o, smddp__ofi_xfer_t *x);

#endif /* SMDDP_CORE_OFI_H */
