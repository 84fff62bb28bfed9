/*
 * Liveness across nodes; see watch.h.
 *
 * Rank r listens on the IP address of its libfabric endpoint and rank r - 1
 * connects to it at communicator creation. Nothing is ever sent but one
 * byte, 'B', when rank r destroys its communicator: it accepts the waiting
 * connection, says goodbye and closes. When rank r's process ends any other
 * way, its kernel closes the listening socket and resets the connection
 * still in its queue, which rank r - 1 sees as end-of-file or a reset.
 *
 * Rank r - 1 looks at the connection only while one of its operations waits
 * for another node (smddp__comm_poll_remote_abort, twice a second), and
 * calls rank r dead only SMDDP__WATCH_GRACE_NS after the reset, so that the
 * last transfers of a rank that simply exited still land. It then aborts the
 * communicator and publishes why through the store, so that every rank
 * learns it within a poll.
 *
 * The watch never fails anything by itself: a connection that cannot be made
 * turns it off (no false deaths), and a silent connection means nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ofi.h"
#include "watch.h"

struct smddp__watch {
    pthread_mutex_t lock; /* checks come from the progress, p2p and callers' threads */
    int listen_fd;        /* watched by the previous rank */
    int fd;               /* to the next rank's listening socket; -1: not watching */
    int next;
    bool established;
    int64_t reset_ns;     /* when the connection broke without a goodbye (0: it has not) */
};

static void watch_off(smddp__watch_t *w, const char *why, int err)
{
    SMDDP_INFO("liveness watch of rank %d off: %s%s%s", w->next, why, err ? ": " : "",
               err ? strerror(err) : "");
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
}

#define CONNECT_WAIT_MS 2000

static void look(smddp__watch_t *w, int64_t now_ns);

smddp_status_t smddp__watch_open(smddp_comm_t comm)
{
    if (comm->node_count < 2 || comm->size < 2) return SMDDP_OK;
    smddp__watch_t *w = calloc(1, sizeof(*w));
    if (!w) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate the liveness watch");
    pthread_mutex_init(&w->lock, NULL);
    w->listen_fd = w->fd = -1;
    w->next = (comm->rank + 1) % comm->size;
    comm->watch = w;

    struct sockaddr_storage me, peer;
    socklen_t me_len, peer_len;
    if (!smddp__ofi_sockaddr(comm, comm->rank, &me, &me_len) ||
        !smddp__ofi_sockaddr(comm, w->next, &peer, &peer_len)) {
        watch_off(w, "the network provider's addresses are not IP addresses", 0);
        return SMDDP_OK;
    }
    /* Listen on the endpoint's own address, any port. */
    ((struct sockaddr_in *)&me)->sin_port = 0; /* the same field for IPv6 */
    w->listen_fd = socket(me.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (w->listen_fd < 0 || bind(w->listen_fd, (struct sockaddr *)&me, me_len) != 0 ||
        listen(w->listen_fd, 8) != 0 ||
        getsockname(w->listen_fd, (struct sockaddr *)&me, &me_len) != 0) {
        int err = errno;
        if (w->listen_fd >= 0) close(w->listen_fd);
        w->listen_fd = -1;
        SMDDP_INFO("rank %d cannot be watched for liveness: cannot listen: %s", comm->rank,
                   strerror(err));
        /* Port 0 tells the previous rank not to watch this one. */
        ((struct sockaddr_in *)&me)->sin_port = 0;
    }
    char key[320], port[16];
    snprintf(key, sizeof(key), "%s/watch/%d", comm->prefix, comm->rank);
    snprintf(port, sizeof(port), "%u", (unsigned)ntohs(((struct sockaddr_in *)&me)->sin_port));
    SMDDP_CHECK(smddp__store_set(comm->store, key, port, strlen(port) + 1));

    void *v = NULL;
    size_t vlen = 0;
    snprintf(key, sizeof(key), "%s/watch/%d", comm->prefix, w->next);
    SMDDP_CHECK(smddp__store_get(comm->store, key, comm->timeout_ms, &v, &vlen));
    long p = vlen > 0 && vlen < 16 && ((char *)v)[vlen - 1] == '\0' ? strtol(v, NULL, 10) : -1;
    free(v);
    if (p <= 0) {
        watch_off(w, p < 0 ? "it published no port" : "it cannot listen", 0);
        return SMDDP_OK;
    }
    ((struct sockaddr_in *)&peer)->sin_port = htons((uint16_t)p);
    w->fd = socket(peer.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (w->fd < 0) {
        watch_off(w, "socket", errno);
        return SMDDP_OK;
    }
    if (connect(w->fd, (struct sockaddr *)&peer, peer_len) != 0 && errno != EINPROGRESS) {
        watch_off(w, "connect", errno);
        return SMDDP_OK;
    }
    /* Its socket listens already (it published the port after listen): one round trip. */
    struct pollfd pfd = {.fd = w->fd, .events = POLLOUT};
    if (poll(&pfd, 1, CONNECT_WAIT_MS) == 1) look(w, smddp__now_ns());
    if (w->fd >= 0 && !w->established)
        SMDDP_INFO("liveness watch of rank %d: not connected after %d ms; trying on", w->next,
                   CONNECT_WAIT_MS);
    SMDDP_TRACE("rank %d watches rank %d on port %ld", comm->rank, w->next, p);
    return SMDDP_OK;
}

void smddp__watch_close(smddp_comm_t comm)
{
    smddp__watch_t *w = comm->watch;
    if (!w) return;
    if (w->listen_fd >= 0) {
        /* Goodbye to the watcher, whose connection waits in the queue. */
        int c;
        while ((c = accept4(w->listen_fd, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
            (void)send(c, "B", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            close(c);
        }
        close(w->listen_fd);
    }
    if (w->fd >= 0) close(w->fd);
    pthread_mutex_destroy(&w->lock);
    free(w);
    comm->watch = NULL;
}

/* Looks at the connection once (lock held). */
static void look(smddp__watch_t *w, int64_t now_ns)
{
    struct pollfd pfd = {.fd = w->fd, .events = w->established ? POLLIN : POLLOUT};
    if (poll(&pfd, 1, 0) <= 0) return;
    if (!w->established) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(w->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (err == ECONNRESET || err == EPIPE) {
            w->reset_ns = now_ns; /* it answered, then went */
        } else if (err) {
            /* Never connected: a wrong address or a rank gone early; not a death. */
            watch_off(w, "connect", err);
        } else {
            w->established = true;
        }
        return;
    }
    char c;
    ssize_t n = recv(w->fd, &c, 1, MSG_DONTWAIT);
    if (n == 1 && c == 'B') {
        SMDDP_TRACE("rank %d destroyed its communicator", w->next);
        close(w->fd);
        w->fd = -1;
    } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        w->reset_ns = now_ns;
    }
}

int smddp__watch_dead(smddp_comm_t comm, int64_t now_ns)
{
    smddp__watch_t *w = comm->watch;
    if (!w || pthread_mutex_trylock(&w->lock) != 0) return -1;
    if (w->fd >= 0 && w->reset_ns == 0) look(w, now_ns);
    int dead = w->reset_ns && now_ns - w->reset_ns >= SMDDP__WATCH_GRACE_NS ? w->next : -1;
    pthread_mutex_unlock(&w->lock);
    return dead;
}
