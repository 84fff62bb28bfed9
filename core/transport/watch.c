/*
 * Liveness across nodes; see watch.h.
 *
 * Every rank listens on the IP address of its libfabric endpoint and
 * publishes the port. Rank r - 1 connects to rank r at communicator
 * creation (so every rank has a watcher), and a rank that waits for a rank
 * on another node connects to that one too, the first time it asks. Nothing
 * is ever sent on these connections but one byte, 'B', when the watched rank
 * destroys its communicator: it accepts the connections waiting in its
 * queue, says goodbye and closes. When the watched rank's process ends any
 * other way, its kernel closes the listening socket and resets the
 * connections still queued there, which the watchers see as end-of-file or
 * a reset.
 *
 * Watchers look only while one of their operations waits for another node
 * (smddp__comm_poll_remote_abort, twice a second), and call a rank dead only
 * SMDDP__WATCH_GRACE_NS after the reset, so that the last transfers of a
 * rank that simply exited still land. The watcher then aborts the
 * communicator and publishes why through the store, so that every rank
 * learns it within a poll.
 *
 * The watch never fails anything by itself: a connection that cannot be made
 * turns that watch off (no false deaths), and a silent connection means
 * nothing. An on-demand connection waits in the watched rank's accept queue
 * until it destroys its communicator; beyond the queue's length, connects
 * just stay pending, which is harmless.
 *
 * Only a connection that was up and then reset without a goodbye means a
 * death whatever this rank waits for. A connect that is refused (or reset
 * before it was up) means the rank's listening socket is closed: its process
 * ended, or it destroyed its communicator, lawfully, while a connect of ours
 * was still pending. That only matters for a rank an operation waits for, so
 * it counts only while this rank waits for that one. At creation a refusal
 * turns the watch off instead: the next rank has just published its port,
 * so it was listening, and something between the two refused (a firewall
 * that rejects ports outside libfabric's range). That rank also counts the
 * refusal in the store, and a refusal is then never taken for a death by
 * any rank of the communicator.
 *
 * Each rank publishes its listening IP address and port ("port address")
 * in the store; a watcher reads a peer's only when it starts watching it (the
 * next rank at creation, others when an op waits for them), so creation
 * reads one key, and libfabric's address vector, which belongs to the
 * progress thread (FI_THREAD_DOMAIN), is never looked into from here.
 */
#include <errno.h>
#include <stdbool.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net.h"
#include "watch.h"

#define CONNECT_WAIT_MS 2000
#define LISTEN_QUEUE 64
#define STORE_MS 50                    /* on demand */
#define VALUE_MAX (8 + INET6_ADDRSTRLEN) /* "port address" */
#define RETRY_NS (1000 * 1000000LL)

enum { W_NONE, W_CONNECTING, W_UP, W_OFF };

typedef struct watched {
    int fd;
    int state;
    int64_t reset_ns; /* when the connection broke without a goodbye (0: it has not) */
    bool refused;     /* it broke before it was up: the rank's socket was closed already */
    int64_t retry_ns; /* W_NONE: not before this (its port was not to be had) */
} watched_t;

struct smddp__watch {
    pthread_mutex_t lock; /* looks come from the progress, p2p and callers' threads */
    int listen_fd;        /* -1: this rank cannot be watched */
    bool refusals_seen;   /* the network refused a connection to a listening rank */
    watched_t *peers;     /* per rank */
};

/* "<prefix>/watch/refused": how many ranks saw a listening rank's port refuse them. */
static void refused_key(smddp_comm_t comm, char *key, size_t cap)
{
    snprintf(key, cap, "%s/watch/refused", comm->prefix);
}

/* A watch that is off tells nothing: not even a break it saw before. */
static void watch_off(watched_t *p, int rank, const char *why, int err)
{
    SMDDP_INFO("liveness watch of rank %d off: %s%s%s", rank, why, err ? ": " : "",
               err ? strerror(err) : "");
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    p->state = W_OFF;
    p->reset_ns = 0;
    p->refused = false;
}

/* Whether some rank saw the network refuse a rank that was listening (asks the store once). */
static bool refusals_untrusted(smddp_comm_t comm, smddp__watch_t *w)
{
    if (!w->refusals_seen) {
        char key[320];
        int64_t n = 0;
        refused_key(comm, key, sizeof(key));
        if (smddp__store_add(comm->store, key, 0, &n) == SMDDP_OK && n > 0) w->refusals_seen = true;
        smddp__clear_error();
    }
    return w->refusals_seen;
}

/* Looks at the connection to rank once (lock held). */
static void look(watched_t *p, int rank, int64_t now_ns)
{
    struct pollfd pfd = {.fd = p->fd, .events = p->state == W_UP ? POLLIN : POLLOUT};
    if (poll(&pfd, 1, 0) <= 0) return;
    if (p->state == W_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (err == ECONNREFUSED || err == ECONNRESET || err == EPIPE) {
            /* Its host answered, but nothing listens on its port any more. */
            p->reset_ns = now_ns;
            p->refused = true;
        } else if (err) {
            /* Never connected (no route, no answer): not a death. */
            watch_off(p, rank, "connect", err);
        } else {
            p->state = W_UP;
        }
        return;
    }
    char c;
    ssize_t n = recv(p->fd, &c, 1, MSG_DONTWAIT);
    if (n == 1 && c == 'B') {
        SMDDP_TRACE("rank %d destroyed its communicator", rank);
        close(p->fd);
        p->fd = -1;
        p->state = W_OFF;
    } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        p->reset_ns = now_ns;
    }
}

/*
 * Starts watching rank (lock held). store_ms: how long to wait for its port
 * in the store (on demand, briefly: the store may be what is unreachable,
 * and a rank still creating its communicator has not published yet, so that
 * is tried again later); wait_ms: how long to wait for the connection.
 */
/* The ranks this one may watch: the next rank, and ranks on other nodes. */
static bool watchable(smddp_comm_t comm, int rank)
{
    return rank != comm->rank &&
           (rank == (comm->rank + 1) % comm->size || comm->node_of[rank] != comm->node);
}

/*
 * The socket address a rank published as "port address" (v: the store's
 * value, vlen bytes); its length, 0 when it cannot be watched (port 0).
 */
static socklen_t listener_of(const void *v, size_t vlen, struct sockaddr_in6 *addr)
{
    char text[VALUE_MAX];
    memset(addr, 0, sizeof(*addr));
    if (vlen == 0 || vlen > sizeof(text) || ((const char *)v)[vlen - 1] != '\0') return 0;
    memcpy(text, v, vlen);
    char *end = NULL;
    long port = strtol(text, &end, 10);
    if (port <= 0 || port > 65535 || *end != ' ') return 0;
    struct sockaddr_in *v4 = (struct sockaddr_in *)addr;
    socklen_t len = 0;
    if (inet_pton(AF_INET, end + 1, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        len = sizeof(*v4);
    } else if (inet_pton(AF_INET6, end + 1, &addr->sin6_addr) == 1) {
        addr->sin6_family = AF_INET6;
        len = sizeof(*addr);
    }
    addr->sin6_port = htons((uint16_t)port); /* the same field as sin_port */
    return len;
}

static void watch(smddp_comm_t comm, int rank, int64_t store_ms, int wait_ms)
{
    watched_t *p = &comm->watch->peers[rank];
    p->state = W_OFF;
    if (!watchable(comm, rank)) return;
    char key[320];
    void *v = NULL;
    size_t vlen = 0;
    snprintf(key, sizeof(key), "%s/watch/%d", comm->prefix, rank);
    if (smddp__store_get(comm->store, key, store_ms, &v, &vlen) != SMDDP_OK) {
        p->state = W_NONE;
        p->retry_ns = smddp__now_ns() + RETRY_NS;
        return;
    }
    struct sockaddr_in6 addr;
    socklen_t len = listener_of(v, vlen, &addr);
    free(v);
    if (!len) {
        watch_off(p, rank, "it cannot listen", 0);
        return;
    }
    p->fd = socket(addr.sin6_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (p->fd < 0) {
        watch_off(p, rank, "socket", errno);
        return;
    }
    p->state = W_CONNECTING;
    atomic_fetch_add(&comm->connections, 1);
    if (connect(p->fd, (struct sockaddr *)&addr, len) != 0 && errno != EINPROGRESS) {
        if (errno == ECONNREFUSED) {
            p->reset_ns = smddp__now_ns();
            p->refused = true;
        } else {
            watch_off(p, rank, "connect", errno);
        }
        return;
    }
    /* It listens already (it published the port after listen): one round trip. */
    struct pollfd pfd = {.fd = p->fd, .events = POLLOUT};
    if (wait_ms > 0 && poll(&pfd, 1, wait_ms) == 1) look(p, rank, smddp__now_ns());
    SMDDP_TRACE("rank %d watches rank %d on port %u", comm->rank, rank,
                (unsigned)ntohs(addr.sin6_port));
}

static smddp_status_t watch_open(smddp_comm_t comm)
{
    smddp__watch_t *w = calloc(1, sizeof(*w));
    watched_t *peers = calloc((size_t)comm->size, sizeof(*peers));
    if (!w || !peers) {
        free(w);
        free(peers);
        return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate the liveness watch");
    }
    pthread_mutex_init(&w->lock, NULL);
    w->peers = peers;
    w->listen_fd = -1;
    comm->watch = w;
    int next = (comm->rank + 1) % comm->size;
    for (int r = 0; r < comm->size; r++) peers[r].fd = -1;

    /* Listening on this rank's network address; its peers read it with the port. */
    struct sockaddr_storage me = {0};
    unsigned n = 0;
    socklen_t len = 0;
    unsigned port = 0;
    char host[INET6_ADDRSTRLEN] = "";
    if (comm->net->own_sockaddr(comm->net_ep, &me, &n) && n <= sizeof(me)) len = n;
    if (!len) {
        SMDDP_INFO("no liveness watch across nodes: the network provider's addresses are not "
                   "IP addresses");
    } else {
        ((struct sockaddr_in *)&me)->sin_port = 0; /* any port */
        w->listen_fd = socket(me.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (w->listen_fd < 0 || bind(w->listen_fd, (struct sockaddr *)&me, len) != 0 ||
            listen(w->listen_fd, LISTEN_QUEUE) != 0 ||
            getsockname(w->listen_fd, (struct sockaddr *)&me, &len) != 0) {
            SMDDP_INFO("rank %d cannot be watched for liveness: cannot listen: %s", comm->rank,
                       strerror(errno));
            if (w->listen_fd >= 0) close(w->listen_fd);
            w->listen_fd = -1;
        } else {
            port = ntohs(((struct sockaddr_in *)&me)->sin_port);
            const void *ip = me.ss_family == AF_INET
                                 ? (const void *)&((struct sockaddr_in *)&me)->sin_addr
                                 : (const void *)&((struct sockaddr_in6 *)&me)->sin6_addr;
            if (!inet_ntop(me.ss_family, ip, host, sizeof(host))) port = 0;
        }
    }
    /* "port address"; port 0 tells watchers that this rank cannot be watched. */
    char key[320], value[VALUE_MAX];
    snprintf(key, sizeof(key), "%s/watch/%d", comm->prefix, comm->rank);
    snprintf(value, sizeof(value), "%u %s", port, host);
    SMDDP_CHECK(smddp__store_set(comm->store, key, value, strlen(value) + 1));
    if (w->listen_fd >= 0) {
        watched_t *p = &w->peers[next];
        watch(comm, next, comm->timeout_ms, CONNECT_WAIT_MS);
        if (p->state == W_NONE) {
            SMDDP_INFO("liveness watch of rank %d off: its port is not in the store", next);
            p->state = W_OFF;
        } else if (p->refused) {
            int64_t n;
            w->refusals_seen = true;
            refused_key(comm, key, sizeof(key));
            (void)smddp__store_add(comm->store, key, 1, &n);
            smddp__clear_error();
            watch_off(p, next, "its port, published a moment ago, refused the connection (a "
                      "firewall?); refusals are not taken for deaths on this communicator", 0);
        }
    }
    return SMDDP_OK;
}

static void watch_close(smddp_comm_t comm)
{
    smddp__watch_t *w = comm->watch;
    if (!w) return;
    if (w->listen_fd >= 0) {
        /* Goodbye to the watchers, whose connections wait in the queue. */
        int c;
        while ((c = accept4(w->listen_fd, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
            (void)send(c, "B", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            close(c);
        }
        close(w->listen_fd);
    }
    for (int r = 0; r < comm->size; r++)
        if (w->peers[r].fd >= 0) close(w->peers[r].fd);
    pthread_mutex_destroy(&w->lock);
    free(w->peers);
    free(w);
    comm->watch = NULL;
}

const smddp__transport_t smddp__watch_transport = {"liveness watch", true, watch_open,
                                                   watch_close, NULL};

int smddp__watch_dead(smddp_comm_t comm, int64_t now_ns, int waiting_for, char *why,
                     size_t why_len)
{
    smddp__watch_t *w = comm->watch;
    if (!w || pthread_mutex_trylock(&w->lock) != 0) return -1;
    /* A rank this one waits for on another node is watched from now on. */
    if (waiting_for >= 0 && waiting_for < comm->size && waiting_for != comm->rank &&
        comm->node_of[waiting_for] != comm->node && w->peers[waiting_for].state == W_NONE &&
        now_ns >= w->peers[waiting_for].retry_ns)
        watch(comm, waiting_for, STORE_MS, 0);
    int dead = -1;
    for (int r = 0; r < comm->size && dead < 0; r++) {
        watched_t *p = &w->peers[r];
        if (p->fd >= 0 && p->reset_ns == 0) look(p, r, now_ns);
        if (p->reset_ns && now_ns - p->reset_ns >= SMDDP__WATCH_GRACE_NS &&
            (!p->refused || r == waiting_for))
            dead = r;
    }
    if (dead >= 0 && w->peers[dead].refused && refusals_untrusted(comm, w)) {
        watch_off(&w->peers[dead], dead, "its port refused the connection, as the network "
                  "refuses this communicator's liveness connections", 0);
        dead = -1;
    }
    if (dead >= 0)
        snprintf(why, why_len, w->peers[dead].refused
                 ? "rank %d is gone: its process ended or it destroyed its communicator (rank "
                   "%d's liveness connection to it was refused)"
                 : "rank %d died: its process ended without destroying its communicator (rank "
                   "%d's liveness connection to it was reset)", dead, comm->rank);
    pthread_mutex_unlock(&w->lock);
    return dead;
}

bool smddp__watch_peer_gone(smddp_comm_t comm, int peer, int64_t now_ns)
{
    smddp__watch_t *w = comm->watch;
    if (!w || peer < 0 || peer >= comm->size || peer == comm->rank ||
        comm->node_of[peer] == comm->node || pthread_mutex_trylock(&w->lock) != 0)
        return false;
    watched_t *p = &w->peers[peer];
    if (p->state == W_NONE && now_ns >= p->retry_ns) watch(comm, peer, STORE_MS, 0);
    if (p->fd >= 0 && p->reset_ns == 0) look(p, peer, now_ns);
    bool gone = p->reset_ns && now_ns - p->reset_ns >= SMDDP__WATCH_GRACE_NS;
    if (gone && p->refused && refusals_untrusted(comm, w)) {
        watch_off(p, peer, "its port refused the connection, as the network refuses this "
                  "communicator's liveness connections", 0);
        gone = false;
    }
    pthread_mutex_unlock(&w->lock);
    return gone;
}
