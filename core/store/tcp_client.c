/*
 * The built-in TCP store's client: the smddp_store_t table every rank uses.
 *
 * One connection per table, guarded by a mutex. Every wait uses poll() with a
 * deadline: the request's own wait (a GET's timeout) plus a margin of
 * silence, re-armed whenever bytes move, so a server that dies or stops
 * answering yields an error, never a hang. After any transport or protocol
 * failure the stream position is unknown, so the connection is closed and
 * later calls fail fast.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../param.h"
#include "tcp_wire.h"

/* Pause between connection attempts. */
#define CONNECT_RETRY_NS (20 * NS_PER_MS)
/* After this long without a connection, a warning says why (once). */
#define CONNECT_WARN_NS (10000 * NS_PER_MS)
#define NAME_MAX_LEN 300

typedef struct client {
    pthread_mutex_t lock;
    int fd; /* -1 once a failure left the stream in an unknown state */
    char name[NAME_MAX_LEN];
    smddp__tcp_server_t *owned_server;
} client_t;

/* Silence after which a server counts as gone: min(SMDDP_TIMEOUT, 30 s), at least 100 ms. */
static int64_t margin_ns(void)
{
    int64_t ms = smddp__params()->timeout_ms;
    ms = SMDDP_MAX(SMDDP_MIN(ms, 30000), 100);
    return ms * NS_PER_MS;
}

/* Waits for events on fd until *deadline. Returns 0 when ready, else an errno value. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, wire_poll_timeout(deadline));
        if (rc > 0) return 0; /* errors and hang-ups show in the following call */
        if (rc == 0) return ETIMEDOUT;
        if (errno != EINTR) return errno;
    }
}

/* Closes the connection after a failure and records the error (key NULL for PING). */
static smddp_status_t client_fail(client_t *c, const char *what, const char *key,
                                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static smddp_status_t client_fail(client_t *c, const char *what, const char *key,
                                  const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    if (!key)
        return smddp__error(SMDDP_ERR_STORE, "TCP store at %s: %s failed: %s", c->name, what, why);
    return smddp__error(SMDDP_ERR_STORE, "TCP store at %s: %s of key '%.200s' failed: %s",
                        c->name, what, key, why);
}

/* Sends all iovecs; on failure returns an errno value (ETIMEDOUT, EPIPE, ...). */
static int send_all(client_t *c, struct iovec *iov, int niov, int64_t *deadline)
{
    while (niov > 0) {
        if (iov->iov_len == 0) {
            iov++;
            niov--;
            continue;
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
            int err = wait_fd(c->fd, POLLOUT, *deadline);
            if (err) return err;
            continue;
        }
        *deadline = SMDDP_MAX(*deadline, smddp__now_ns() + margin_ns());
        for (size_t left = (size_t)n; left > 0;) {
            size_t k = SMDDP_MIN(left, iov->iov_len);
            iov->iov_base = (char *)iov->iov_base + k;
            iov->iov_len -= k;
            left -= k;
            if (iov->iov_len == 0) {
                iov++;
                niov--;
            }
        }
    }
    return 0;
}

/* Receives exactly len bytes; returns 0, an errno value, or EPIPE when the server closed. */
static int recv_all(client_t *c, void *buf, size_t len, int64_t *deadline)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(c->fd, (char *)buf + got, len - got, 0);
        if (n == 0) return EPIPE;
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
            int err = wait_fd(c->fd, POLLIN, *deadline);
            if (err) return err;
            continue;
        }
        got += (size_t)n;
        *deadline = SMDDP_MAX(*deadline, smddp__now_ns() + margin_ns());
    }
    return 0;
}

static const char *io_error(int err)
{
    if (err == EPIPE) return "the server closed the connection";
    if (err == ETIMEDOUT) return "the server stopped answering";
    return strerror(err);
}

/* Largest reply body a request may legitimately get with this status. */
static bool reply_len_ok(uint8_t cmd, uint8_t status, uint32_t vlen)
{
    switch (status) {
    case SMDDP_STORE_REPLY_OK:
        if (cmd == SMDDP_STORE_CMD_GET) return vlen <= SMDDP_STORE_MAX_VALUE;
        if (cmd == SMDDP_STORE_CMD_ADD) return vlen == 8;
        return vlen == 0;
    case SMDDP_STORE_REPLY_TIMEOUT: return cmd == SMDDP_STORE_CMD_GET && vlen == 0;
    case SMDDP_STORE_REPLY_ERROR: return vlen <= SMDDP_STORE_MAX_ERROR;
    default: return false;
    }
}

/*
 * Runs one request (key NULL for PING): sends it, then reads and validates
 * the reply. On success *status is the reply's status and *body (malloc()ed,
 * never NULL) holds *body_len bytes. The caller holds c->lock.
 */
static smddp_status_t client_call(client_t *c, uint8_t cmd, const char *key, const void *value,
                                  size_t vlen, int64_t wait_ms, uint8_t *status, uint8_t **body,
                                  size_t *body_len)
{
    const char *what = wire_cmd_name(cmd);
    if (c->fd < 0)
        return smddp__error(SMDDP_ERR_STORE, "TCP store at %s: %s of key '%.200s': the "
                            "connection was closed after an earlier error", c->name, what,
                            key ? key : "");
    size_t klen = key ? strlen(key) : 0;
    uint8_t hdr[SMDDP_STORE_HEADER_SIZE];
    wire_put_header(hdr, cmd, (uint32_t)klen, (uint32_t)vlen);
    struct iovec iov[3] = {{hdr, sizeof(hdr)}, {(void *)key, klen}, {(void *)value, vlen}};
    int64_t deadline = smddp__now_ns() + wire_clamp_wait_ms(wait_ms) * NS_PER_MS + margin_ns();
    int err = send_all(c, iov, 3, &deadline);
    if (err) return client_fail(c, what, key, "cannot send the request: %s", io_error(err));
    if ((err = recv_all(c, hdr, sizeof(hdr), &deadline)))
        return client_fail(c, what, key, "no reply: %s", io_error(err));
    uint32_t magic = wire_get_u32(hdr);
    uint32_t rklen = wire_get_u32(hdr + 5), rvlen = wire_get_u32(hdr + 9);
    if (magic != SMDDP_STORE_MAGIC)
        return client_fail(c, what, key, "reply has bad magic 0x%08" PRIx32
                           " (is this a smddp store?)", magic);
    if (rklen != 0 || !reply_len_ok(cmd, hdr[4], rvlen))
        return client_fail(c, what, key, "malformed reply (status 0x%02x, key length %" PRIu32
                           ", value length %" PRIu32 ")", hdr[4], rklen, rvlen);
    uint8_t *b = malloc(rvlen ? rvlen : 1);
    if (!b) return client_fail(c, what, key, "out of memory for a %" PRIu32 "-byte reply", rvlen);
    if ((err = recv_all(c, b, rvlen, &deadline))) {
        free(b);
        return client_fail(c, what, key, "truncated reply: %s", io_error(err));
    }
    *status = hdr[4];
    *body = b;
    *body_len = rvlen;
    return SMDDP_OK;
}

static smddp_status_t check_key(client_t *c, const char *what, const char *key)
{
    if (!key)
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT, "TCP store at %s: %s with a NULL key",
                            c->name, what);
    if (strnlen(key, SMDDP_STORE_MAX_KEY + 1) > SMDDP_STORE_MAX_KEY)
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT,
                            "TCP store at %s: %s of key '%.200s...' exceeds the key limit of %d "
                            "bytes", c->name, what, key, SMDDP_STORE_MAX_KEY);
    return SMDDP_OK;
}

/* Turns an ERROR reply into SMDDP_ERR_STORE with the server's text. */
static smddp_status_t server_error(client_t *c, const char *what, const char *key,
                                   const uint8_t *msg, size_t len)
{
    char text[SMDDP_STORE_MAX_ERROR + 1];
    for (size_t i = 0; i < len; i++)
        text[i] = msg[i] >= 0x20 && msg[i] < 0x7f ? (char)msg[i] : '?';
    text[len] = '\0';
    return smddp__error(SMDDP_ERR_STORE, "TCP store at %s: %s of key '%.200s' failed: %s",
                        c->name, what, key, text);
}

static smddp_status_t client_set(void *ctx, const char *key, const void *value, size_t len)
{
    client_t *c = ctx;
    SMDDP_CHECK(check_key(c, "SET", key));
    if (len > SMDDP_STORE_MAX_VALUE || (!value && len))
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT,
                            "TCP store at %s: SET of key '%.200s' with %zu bytes at %p (limit "
                            "%u bytes)", c->name, key, len, value, SMDDP_STORE_MAX_VALUE);
    uint8_t status, *body;
    size_t blen;
    pthread_mutex_lock(&c->lock);
    smddp_status_t st = client_call(c, SMDDP_STORE_CMD_SET, key, value, len, 0, &status, &body,
                                    &blen);
    pthread_mutex_unlock(&c->lock);
    if (st < 0) return st;
    if (status != SMDDP_STORE_REPLY_OK) st = server_error(c, "SET", key, body, blen);
    free(body);
    return st;
}

static smddp_status_t client_get(void *ctx, const char *key, int64_t timeout_ms, void **value,
                                 size_t *len)
{
    client_t *c = ctx;
    SMDDP_CHECK(check_key(c, "GET", key));
    if (!value || !len)
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT, "TCP store at %s: GET of key '%.200s' "
                            "without output pointers", c->name, key);
    uint8_t arg[8], status, *body;
    size_t blen;
    wire_put_i64(arg, wire_clamp_wait_ms(timeout_ms));
    pthread_mutex_lock(&c->lock);
    smddp_status_t st = client_call(c, SMDDP_STORE_CMD_GET, key, arg, sizeof(arg), timeout_ms,
                                    &status, &body, &blen);
    pthread_mutex_unlock(&c->lock);
    if (st < 0) return st;
    if (status == SMDDP_STORE_REPLY_OK) {
        *value = body;
        *len = blen;
        return SMDDP_OK;
    }
    if (status == SMDDP_STORE_REPLY_TIMEOUT)
        /* Quiet: the caller decides whether a missing key is worth a warning. */
        st = smddp__error_quiet(SMDDP_ERR_TIMEOUT,
                                "TCP store at %s: key '%.200s' did not appear within %" PRId64
                                " ms", c->name, key, wire_clamp_wait_ms(timeout_ms));
    else
        st = server_error(c, "GET", key, body, blen);
    free(body);
    return st;
}

static smddp_status_t client_add(void *ctx, const char *key, int64_t delta, int64_t *result)
{
    client_t *c = ctx;
    SMDDP_CHECK(check_key(c, "ADD", key));
    uint8_t arg[8], status, *body;
    size_t blen;
    wire_put_i64(arg, delta);
    pthread_mutex_lock(&c->lock);
    smddp_status_t st = client_call(c, SMDDP_STORE_CMD_ADD, key, arg, sizeof(arg), 0, &status,
                                    &body, &blen);
    pthread_mutex_unlock(&c->lock);
    if (st < 0) return st;
    if (status == SMDDP_STORE_REPLY_OK) {
        if (result) *result = wire_get_i64(body);
    } else {
        st = server_error(c, "ADD", key, body, blen);
    }
    free(body);
    return st;
}

static void client_release(void *ctx)
{
    client_t *c = ctx;
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    pthread_mutex_destroy(&c->lock);
    smddp__tcp_server_stop(c->owned_server);
    free(c);
}

/*
 * One connection attempt before deadline. Returns a connected socket, or -1
 * with the reason in why and *unresolved set when the name did not resolve
 * (every failure is worth retrying: the server may not be up yet, or its
 * name not resolvable yet).
 */
static int try_connect(const char *addr, int port, int64_t deadline, char *why, size_t cap,
                       bool *unresolved)
{
    struct sockaddr_in sa, self, peer;
    *unresolved = false;
    if (wire_resolve(addr, port, INADDR_LOOPBACK, &sa) < 0) {
        snprintf(why, cap, "%s", smddp__last_error());
        *unresolved = true;
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, cap, "socket failed: %s", strerror(errno));
        return -1;
    }
    int err = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        err = errno;
        if (err == EINPROGRESS || err == EINTR) {
            socklen_t len = sizeof(err);
            err = wait_fd(fd, POLLOUT, deadline);
            if (!err && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
    }
    /*
     * Connecting to a free local port in the ephemeral range can succeed by
     * TCP simultaneous open with itself; that is "nothing listening" too.
     */
    socklen_t l1 = sizeof(self), l2 = sizeof(peer);
    if (!err && getsockname(fd, (struct sockaddr *)&self, &l1) == 0 &&
        getpeername(fd, (struct sockaddr *)&peer, &l2) == 0 && self.sin_port == peer.sin_port &&
        self.sin_addr.s_addr == peer.sin_addr.s_addr)
        err = ECONNREFUSED;
    if (err) {
        snprintf(why, cap, "%s", strerror(err));
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

smddp_status_t smddp__tcp_client_connect(const char *addr, int port, int64_t timeout_ms,
                                         smddp__tcp_server_t *owned_server, smddp_store_t *store)
{
    if (!store || port <= 0 || port > 65535)
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT,
                            "TCP store client: bad arguments (port %d, store %p)", port,
                            (void *)store);
    client_t *c = calloc(1, sizeof(*c));
    if (!c) return smddp__error(SMDDP_ERR_NO_MEMORY, "TCP store client: out of memory");
    snprintf(c->name, sizeof(c->name), "%.255s:%d", addr && addr[0] ? addr : "127.0.0.1", port);
    pthread_mutex_init(&c->lock, NULL);
    c->fd = -1;

    int64_t start = smddp__now_ns();
    int64_t deadline = start + wire_clamp_wait_ms(timeout_ms) * NS_PER_MS;
    char why[256] = "no attempt made";
    smddp_status_t st = SMDDP_OK;
    bool warned = false, unresolved;
    for (;;) {
        c->fd = try_connect(addr, port, deadline, why, sizeof(why), &unresolved);
        if (c->fd >= 0) break;
        int64_t now = smddp__now_ns(), left = deadline - now;
        /*
         * Waiting for the store's host is normal at start-up, but not for the
         * whole timeout (30 min by default) in silence: a name that does not
         * resolve (often a typo in MASTER_ADDR) is said at once, anything
         * else after CONNECT_WARN_NS. Once.
         */
        if (!warned && left > 0 && (unresolved || now - start >= CONNECT_WARN_NS)) {
            SMDDP_WARN("TCP store client: cannot connect to %s yet (%s); retrying for up to "
                       "%.1f s more (the timeout, SMDDP_TIMEOUT)", c->name, why,
                       (double)left / 1e9);
            warned = true;
        }
        if (left <= 0) {
            st = smddp__error(SMDDP_ERR_TIMEOUT,
                              "TCP store client: cannot connect to %s within %" PRId64
                              " ms: %s", c->name, wire_clamp_wait_ms(timeout_ms), why);
            goto fail;
        }
        struct timespec ts = {0, (long)SMDDP_MIN(left, CONNECT_RETRY_NS)};
        nanosleep(&ts, NULL);
    }
    SMDDP_TRACE("TCP store client: connected to %s after %.3f s", c->name,
                (double)(smddp__now_ns() - start) / 1e9);

    /* A PING proves that a smddp store, not some other service, answers. */
    uint8_t status, *body;
    size_t blen;
    st = client_call(c, SMDDP_STORE_CMD_PING, NULL, NULL, 0, 0, &status, &body, &blen);
    if (st < 0) goto fail;
    free(body);
    if (status != SMDDP_STORE_REPLY_OK) {
        st = smddp__error(SMDDP_ERR_STORE, "TCP store at %s: PING was refused", c->name);
        goto fail;
    }
    c->owned_server = owned_server;
    *store = (smddp_store_t){.size = sizeof(smddp_store_t),
                             .ctx = c,
                             .set = client_set,
                             .get = client_get,
                             .add = client_add,
                             .release = client_release};
    return SMDDP_OK;
fail:
    client_release(c); /* owned_server is still NULL here: the caller keeps it */
    return st;
}
