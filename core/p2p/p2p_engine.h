/*
 * The send/recv engine's state, shared by its parts (private to core/p2p):
 * p2p.c runs the thread, the FIFOs between ranks of one node and the
 * receives from any rank; p2p_net.c the messages to and from ranks on other
 * nodes, over comm->net_p2p; p2p_seq.c the counters per (peer, tag). The functions declared here run on
 * the engine's thread (smddp__p2p_net_free after it has stopped); submit and
 * stop touch the state under its lock.
 */
#ifndef SMDDP_CORE_P2P_ENGINE_H
#define SMDDP_CORE_P2P_ENGINE_H

#include "../transport/net.h"
#include "p2p.h"

/* A message between ranks of a node: this header, then the payload. */
typedef struct p2p_header {
    uint32_t magic;
    int32_t tag;
    uint64_t bytes;
} p2p_header_t;

/*
 * A message from a rank of the node that no receive waited for when it came
 * up in the pair's ring, set aside so that the messages behind it could
 * reach theirs. Receives look here first.
 */
typedef struct unexpected {
    int32_t tag;
    uint64_t bytes;
    uint64_t arrival;  /* order of arrival over all ranks: receives from any rank take the oldest */
    bool whole;        /* all of its payload is here */
    char *data;
    struct unexpected *next;
} unexpected_t;

/*
 * Progress of one message between ranks of a node: header bytes first, then
 * payload bytes. A message coming in goes to a receive (op) or is set aside
 * (ux); with neither, its header is read and its payload waits in the ring.
 */
typedef struct p2p_state {
    p2p_header_t hdr;
    size_t hdr_done;
    size_t payload_done;
    smddp__op_t *op;  /* the receive the message goes to */
    unexpected_t *ux;
    bool mismatch;    /* a receive of another size, or none (failed): the payload is dropped */
} p2p_state_t;

/* An op posted to the network; a failed receive stays here, cancelled, until libfabric lets go. */
typedef struct remote {
    smddp__xfer_t x;
    smddp__op_t *op; /* NULL once the op has been completed */
    int queue;       /* index of its (peer, direction) queue */
    int32_t tag;
    bool counted;    /* a send counted in p->sending */
    struct remote *next;
} remote_t;

/* A peek for the next message with one tag from one rank on another node. */
typedef struct peek {
    smddp__xfer_t x;
    int peer;
    int32_t tag;
    uint64_t seq; /* the message number looked for */
    bool busy;    /* posted, not yet done */
    struct peek *next;
} peek_t;

/* Counters per (peer, direction, tag): message numbers, sends on the network. */
typedef struct seq_map {
    uint64_t *keys; /* 0: empty slot; else the key + 1 */
    uint64_t *next; /* the next message number */
    size_t cap, used;
} seq_map_t;

struct smddp__p2p {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stopping;
    smddp__op_t *incoming, *incoming_tail; /* submitted, not yet sorted */
    seq_map_t seqs;                        /* message numbers, guarded by comm->lock */
    seq_map_t sending;                     /* sends on the network per (peer, tag) */
    smddp__op_t **sendq;                   /* per local rank: sends in order */
    smddp__op_t **recvq;                   /* per local rank: receives waiting, in posting order */
    unexpected_t **ux, **ux_tail;          /* per local rank: messages set aside, in order */
    uint64_t arrivals;                     /* messages set aside so far */
    uint64_t set_aside;                    /* bytes set aside now */
    bool set_aside_full;                   /* a message waits in its ring for room */
    p2p_state_t *sends, *recvs;            /* per local rank: the message going out, coming in */
    remote_t *remote;                      /* posted to peers on other nodes */
    remote_t *given_up;                    /* left posted by a failure: freed at teardown */
    /*
     * Per (peer, direction): ops waiting to be posted, in order. Sends of one
     * tag beyond SMDDP_OFI_MAX_INFLIGHT on the network
     * wait (p->sending counts them), so one pair never holds up another, and
     * those of other tags go past them: the receiver may wait for one of
     * those first. Receives are posted at once, unless the endpoint is full.
     */
    smddp__op_t **waiting, **waiting_tail;
    bool stalled; /* some queue's head was not taken by the endpoint yet: try again */
    int active;
    smddp__op_t *anyq;  /* receives from any rank, not yet matched, in posting order */
    int any_next;       /* the rank the next search on other nodes starts at */
    int any_next_local; /* the local rank the next search on this node starts at */
    peek_t *peeks;      /* per (rank on another node, tag) looked for */
};

/* p2p_seq.c. */
/*
 * m's counter of (peer, receives or sends, tag), made at 0 on first use;
 * NULL when out of memory. For p->seqs, comm->lock held.
 */
uint64_t *smddp__p2p_count(seq_map_t *m, int peer, bool recv, int32_t tag);

/* p2p_health.c. */
/*
 * Deadline, abort and dead-peer checks of every op waiting on this node or
 * for a receive from any rank (smddp__p2p_net_check does those on the
 * network); the first failure.
 */
smddp_status_t smddp__p2p_check_health(smddp_comm_t comm, int64_t now);

/* p2p.c, for p2p_net.c. */
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
 * Whether rank q (on another node) has sent a message with this tag that no
 * receive has claimed, peeking for it if need be; if so claims it and sets
 * *seq to its number.
 */
bool smddp__p2p_net_match(smddp_comm_t comm, int q, int32_t tag, uint64_t *seq,
                          smddp_status_t *err);
/* Frees the peeks that are done and that no receive from any rank looks for. */
void smddp__p2p_net_prune_peeks(smddp_comm_t comm);
/* Abort and deadline checks of every op waiting for or on the network. */
smddp_status_t smddp__p2p_net_check(smddp_comm_t comm, int64_t now);
/* Fails every op waiting for or on the network with st and msg, and gives the endpoint up. */
void smddp__p2p_net_fail(smddp_comm_t comm, smddp_status_t st, const char *msg);
/* At teardown, the engine's thread stopped: the endpoint's transfers and their records go. */
void smddp__p2p_net_free(smddp_comm_t comm);

#endif /* SMDDP_CORE_P2P_ENGINE_H */
