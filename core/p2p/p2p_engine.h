/*
 * The send/recv engine's state, shared by its two halves (private to
 * core/p2p): p2p.c runs the thread, the FIFOs between ranks of one node
 * and the receives from any rank; p2p_net.c the messages to and from ranks
 * on other nodes, over comm->ofi_p2p. The functions declared here run on
 * the engine's thread (smddp__p2p_net_free after it has stopped); submit and
 * stop touch the state under its lock.
 */
#ifndef SMDDP_CORE_P2P_ENGINE_H
#define SMDDP_CORE_P2P_ENGINE_H

#include "../transport/ofi.h"
#include "p2p.h"

/* A message between ranks of a node: this header, then the payload. */
typedef struct p2p_header {
    uint32_t magic;
    int32_t tag;
    uint64_t bytes;
} p2p_header_t;

/* Progress of one message between ranks of a node: header bytes first, then payload bytes. */
typedef struct p2p_state {
    p2p_header_t hdr;
    size_t hdr_done;
    size_t payload_done;
    bool mismatch;
} p2p_state_t;

/* An op posted to the network; a failed receive stays here, cancelled, until libfabric lets go. */
typedef struct remote {
    smddp__ofi_xfer_t x;
    smddp__op_t *op; /* NULL once the op has been completed */
    int queue;       /* index of its (peer, direction) queue */
    struct remote *next;
} remote_t;

/* A peek for the next message from one rank on another node. */
typedef struct peek {
    smddp__ofi_xfer_t x;
    uint64_t seq; /* the message number looked for */
    bool busy;    /* posted, not yet done */
} peek_t;

struct smddp__p2p {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stopping;
    smddp__op_t *incoming, *incoming_tail; /* submitted, not yet sorted */
    smddp__op_t **sendq, **recvq;          /* per local rank: FIFO heads */
    /*
     * Per local rank: receives from it sorted into recvq so far, directed or
     * bound from any rank. Equal to comm->p2p_recv_seq[rank] unless a directed
     * receive was issued and is still in `incoming`: its number comes first.
     */
    uint64_t *recvs_sorted;
    p2p_state_t *sends, *recvs;            /* state of each FIFO head */
    remote_t *remote;                      /* posted to peers on other nodes */
    remote_t *given_up;                    /* left posted by a failure: freed at teardown */
    /*
     * Per (peer, direction): ops beyond SMDDP_OFI_MAX_INFLIGHT wait in order,
     * and how many are on the network. Messages of a pair match in order, so
     * the oldest are always the ones posted, and one pair never holds up another.
     */
    smddp__op_t **waiting, **waiting_tail;
    int *posted;
    bool stalled; /* some queue's head was not taken by the endpoint yet: try again */
    int active;
    smddp__op_t *anyq;  /* receives from any rank, not yet matched */
    int any_next;       /* the rank the next search for a sender starts at */
    struct peek *peeks; /* per comm rank, for receives from any rank */
};

/* p2p.c, for p2p_net.c. */
/* Hands the oldest receive from any rank to src as its next directed receive, message seq. */
void smddp__p2p_bind_any(smddp_comm_t comm, int src, uint64_t seq);
/* Aborts the communicator with the current error and fails every queued op. */
void smddp__p2p_abort_all(smddp_comm_t comm, smddp_status_t st);

/* p2p_net.c: ops for ranks on other nodes. */
/* Queues op for its peer, then posts what the network has room for. */
void smddp__p2p_net_queue(smddp_comm_t comm, smddp__op_t *op);
/* Completes what the network finished and posts what then fits; true if anything did. */
bool smddp__p2p_net_progress(smddp_comm_t comm);
/* Tries again to post queues the endpoint did not take (p->stalled). */
void smddp__p2p_net_retry(smddp_comm_t comm);
/*
 * Whether rank q (on another node) has a message for the oldest receive
 * from any rank, peeking for it if need be; if so binds the receive to it.
 */
bool smddp__p2p_net_match(smddp_comm_t comm, int q, smddp_status_t *err);
/* Abort and deadline checks of every op waiting for or on the network. */
smddp_status_t smddp__p2p_net_check(smddp_comm_t comm, int64_t now);
/* Fails every op waiting for or on the network with st and msg, and gives the endpoint up. */
void smddp__p2p_net_fail(smddp_comm_t comm, smddp_status_t st, const char *msg);
/* At teardown, the engine's thread stopped: the endpoint's transfers and their records go. */
void smddp__p2p_net_free(smddp_comm_t comm);

#endif /* SMDDP_CORE_P2P_ENGINE_H */
