/*
 * The built-in TCP store's server (wire format in store.h).
 *
 * One thread runs poll() over an eventfd (stop() wakes it through that), the
 * listening socket and every client connection, all non-blocking. Each
 * connection has an incremental parser, so a header and body may arrive in
 * any number of pieces. The header is validated before anything is
 * allocated, and a value buffer grows only as its bytes actually arrive, so
 * a client cannot make the server reserve memory it has not sent. A
 * connection carries one request at a time: while its reply is being sent or
 * its GET waits for a key, the server does not read from it, which bounds
 * what it buffers per connection to one message each way. Anything malformed
 * drops that one connection with a WARN line; the others carry on.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tcp_wire.h"

/* First size of a value buffer; it doubles as bytes arrive. */
#define VALUE_CHUNK (64u << 10)
/* recv() calls per connection per wakeup, so one busy client cannot starve others. */
#define READS_PER_WAKEUP 64
/* How long accept() rests after running out of file descriptors. */
#define ACCEPT_PAUSE_NS (100 * NS_PER_MS)

/* ---- the map --------------------------------------------------------------- */

typedef struct entry {
    struct entry *next;
    uint64_t hash;
    uint8_t *value;
    size_t vlen;
    uint32_t klen;
    char key[];
} entry_t;

typedef struct table {
    entry_t **buckets;
    size_t nbuckets; /* a power of two */
    size_t count;
} table_t;

static uint64_t hash_key(const char *key, size_t len)
{
    uint64_t h = 14695981039346656037ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)key[i]) * 1099511628211ull;
    return h;
}

static entry_t *table_find(const table_t *t, const char *key, size_t klen)
{
    uint64_t h = hash_key(key, klen);
    for (entry_t *e = t->buckets[h & (t->nbuckets - 1)]; e; e = e->next)
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0) return e;
    return NULL;
}

static void table_grow(table_t *t)
{
    size_t n = t->nbuckets * 2;
    entry_t **b = calloc(n, sizeof(*b));
    if (!b) return; /* longer chains, still correct */
    for (size_t i = 0; i < t->nbuckets; i++) {
        for (entry_t *e = t->buckets[i], *next; e; e = next) {
            next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    }
    free(t->buckets);
    t->buckets = b;
    t->nbuckets = n;
}

/* Stores value (taking ownership) under key. Returns the entry, NULL when out of memory. */
static entry_t *table_put(table_t *t, const char *key, size_t klen, uint8_t *value, size_t vlen)
{
    entry_t *e = table_find(t, key, klen);
    if (!e) {
        e = malloc(sizeof(*e) + klen + 1);
        if (!e) return NULL;
        e->hash = hash_key(key, klen);
        e->klen = (uint32_t)klen;
        memcpy(e->key, key, klen);
        e->key[klen] = '\0';
        e->value = NULL;
        e->next = t->buckets[e->hash & (t->nbuckets - 1)];
        t->buckets[e->hash & (t->nbuckets - 1)] = e;
        if (++t->count > t->nbuckets) table_grow(t);
    }
    free(e->value);
    e->value = value;
    e->vlen = vlen;
    return e;
}

static void table_free(table_t *t)
{
    for (size_t i = 0; t->buckets && i < t->nbuckets; i++) {
        for (entry_t *e = t->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e->value);
            free(e);
        }
    }
    free(t->buckets);
}

/* ---- connections ------------------------------------------------------------ */

typedef enum conn_state {
    CONN_READ_HEADER,
    CONN_READ_KEY,
    CONN_READ_VALUE,
    CONN_WAITING, /* a GET waits for its key */
    CONN_WRITING  /* a reply is being sent */
} conn_state_t;

typedef struct conn {
    int fd;
    bool dead; /* dropped; closed and freed at the end of the loop iteration */
    conn_state_t state;
    char peer[64];
    uint8_t hdr[SMDDP_STORE_HEADER_SIZE];
    size_t got; /* bytes of the current part (header, key or value) received */
    uint8_t cmd;
    uint32_t klen, vlen;
    char *key; /* klen + 1 bytes, NUL-terminated once complete */
    uint8_t *value;
    size_t value_cap;
    int64_t deadline_ns; /* CONN_WAITING: when the GET times out */
    uint8_t *out;
    size_t out_len, out_off;
} conn_t;

struct smddp__tcp_server {
    int listen_fd;
    int wake_fd;
    atomic_bool stopping;
    pthread_t thread;
    char name[64];
    table_t table;
    conn_t **conns;
    size_t nconns, conns_cap;
    struct pollfd *pfds;
    size_t pfds_cap;
    int64_t accept_resume_ns; /* accept() paused until then; 0 when not */
};

typedef struct smddp__tcp_server server_t;

static void conn_drop(server_t *s, conn_t *c, bool warn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void conn_drop(server_t *s, conn_t *c, bool warn, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (warn)
        SMDDP_WARN("TCP store server %s: dropping connection from %s: %s", s->name, c->peer, why);
    else
        SMDDP_TRACE("TCP store server %s: connection from %s closed: %s", s->name, c->peer, why);
    c->dead = true;
}

static void conn_free(conn_t *c)
{
    if (c->fd >= 0) close(c->fd);
    free(c->key);
    free(c->value);
    free(c->out);
    free(c);
}

/* Forgets the request just answered and waits for the next header. */
static void conn_reset(conn_t *c)
{
    free(c->key);
    free(c->value);
    c->key = NULL;
    c->value = NULL;
    c->value_cap = 0;
    c->got = 0;
    c->state = CONN_READ_HEADER;
}

/* Sends what it can of the pending reply. Returns false if the connection was dropped. */
static bool conn_flush(server_t *s, conn_t *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
            conn_drop(s, c, false, "send failed: %s", strerror(errno));
            return false;
        }
        c->out_off += (size_t)n;
    }
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_off = 0;
    conn_reset(c);
    return true;
}

/* Queues a reply and starts sending it. Returns false if the connection was dropped. */
static bool conn_reply(server_t *s, conn_t *c, uint8_t status, const void *data, size_t len)
{
    c->out = malloc(SMDDP_STORE_HEADER_SIZE + len);
    if (!c->out) {
        conn_drop(s, c, true, "out of memory for a %zu-byte reply", len);
        return false;
    }
    wire_put_header(c->out, status, 0, (uint32_t)len);
    if (len) memcpy(c->out + SMDDP_STORE_HEADER_SIZE, data, len);
    c->out_len = SMDDP_STORE_HEADER_SIZE + len;
    c->out_off = 0;
    c->state = CONN_WRITING;
    return conn_flush(s, c);
}

static bool conn_reply_error(server_t *s, conn_t *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static bool conn_reply_error(server_t *s, conn_t *c, const char *fmt, ...)
{
    char msg[SMDDP_STORE_MAX_ERROR];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : SMDDP_MIN((size_t)n, sizeof(msg) - 1);
    return conn_reply(s, c, SMDDP_STORE_REPLY_ERROR, msg, len);
}

/* Answers every GET waiting for the key of e. */
static void wake_waiters(server_t *s, const entry_t *e)
{
    for (size_t i = 0; i < s->nconns; i++) {
        conn_t *w = s->conns[i];
        if (w->dead || w->state != CONN_WAITING || w->klen != e->klen ||
            memcmp(w->key, e->key, e->klen) != 0)
            continue;
        conn_reply(s, w, SMDDP_STORE_REPLY_OK, e->value, e->vlen);
    }
}

/* Parses a stored value as a decimal int64 the way ADD wrote it. */
static bool parse_int(const uint8_t *v, size_t len, int64_t *out)
{
    char buf[24];
    if (len == 0 || len >= sizeof(buf)) return false;
    for (size_t i = 0; i < len; i++)
        if (!((v[i] >= '0' && v[i] <= '9') || (i == 0 && v[i] == '-' && len > 1))) return false;
    memcpy(buf, v, len);
    buf[len] = '\0';
    errno = 0;
    long long x = strtoll(buf, NULL, 10);
    if (errno) return false;
    *out = x;
    return true;
}

static bool handle_add(server_t *s, conn_t *c)
{
    int64_t delta = wire_get_i64(c->value), cur = 0, sum;
    entry_t *e = table_find(&s->table, c->key, c->klen);
    if (e && !parse_int(e->value, e->vlen, &cur))
        return conn_reply_error(s, c, "its value (%zu bytes) is not a decimal integer",
                                e->vlen);
    if (__builtin_add_overflow(cur, delta, &sum))
        return conn_reply_error(s, c, "%" PRId64 " + %" PRId64 " overflows int64", cur, delta);
    char text[24];
    int n = snprintf(text, sizeof(text), "%" PRId64, sum);
    uint8_t *v = malloc((size_t)n);
    if (v) memcpy(v, text, (size_t)n);
    if (!v || !(e = table_put(&s->table, c->key, c->klen, v, (size_t)n))) {
        free(v);
        conn_drop(s, c, true, "out of memory storing key '%.200s'", c->key);
        return false;
    }
    wake_waiters(s, e);
    uint8_t result[8];
    wire_put_i64(result, sum);
    return conn_reply(s, c, SMDDP_STORE_REPLY_OK, result, sizeof(result));
}

/* Runs a complete request. Returns false if the connection was dropped. */
static bool handle_request(server_t *s, conn_t *c)
{
    entry_t *e;
    switch (c->cmd) {
    case SMDDP_STORE_CMD_SET:
        if (!c->value) c->value = malloc(1); /* an empty value still gets a buffer */
        if (!c->value || !(e = table_put(&s->table, c->key, c->klen, c->value, c->vlen))) {
            conn_drop(s, c, true, "out of memory storing key '%.200s'", c->key);
            return false;
        }
        c->value = NULL; /* now owned by the table */
        wake_waiters(s, e);
        return conn_reply(s, c, SMDDP_STORE_REPLY_OK, NULL, 0);
    case SMDDP_STORE_CMD_GET: {
        int64_t wait_ms = wire_clamp_wait_ms(wire_get_i64(c->value));
        e = table_find(&s->table, c->key, c->klen);
        if (e) return conn_reply(s, c, SMDDP_STORE_REPLY_OK, e->value, e->vlen);
        if (wait_ms == 0) return conn_reply(s, c, SMDDP_STORE_REPLY_TIMEOUT, NULL, 0);
        c->deadline_ns = smddp__now_ns() + wait_ms * NS_PER_MS;
        c->state = CONN_WAITING;
        return true;
    }
    case SMDDP_STORE_CMD_ADD:
        return handle_add(s, c);
    default: /* PING; parse_header let nothing else through */
        return conn_reply(s, c, SMDDP_STORE_REPLY_OK, NULL, 0);
    }
}

/* Validates a complete header and prepares for the key. */
static bool parse_header(server_t *s, conn_t *c)
{
    uint32_t magic = wire_get_u32(c->hdr);
    c->cmd = c->hdr[4];
    c->klen = wire_get_u32(c->hdr + 5);
    c->vlen = wire_get_u32(c->hdr + 9);
    if (magic != SMDDP_STORE_MAGIC) {
        conn_drop(s, c, true, "bad magic 0x%08" PRIx32 " (not a smddp store client?)", magic);
        return false;
    }
    bool ok;
    char rule[80];
    switch (c->cmd) {
    case SMDDP_STORE_CMD_SET:
        ok = c->klen <= SMDDP_STORE_MAX_KEY && c->vlen <= SMDDP_STORE_MAX_VALUE;
        snprintf(rule, sizeof(rule), "key <= %d bytes, value <= %u bytes", SMDDP_STORE_MAX_KEY,
                 SMDDP_STORE_MAX_VALUE);
        break;
    case SMDDP_STORE_CMD_GET:
    case SMDDP_STORE_CMD_ADD:
        ok = c->klen <= SMDDP_STORE_MAX_KEY && c->vlen == 8;
        snprintf(rule, sizeof(rule), "key <= %d bytes, value 8 bytes", SMDDP_STORE_MAX_KEY);
        break;
    case SMDDP_STORE_CMD_PING:
        ok = c->klen == 0 && c->vlen == 0;
        snprintf(rule, sizeof(rule), "no key, no value");
        break;
    default:
        conn_drop(s, c, true, "unknown command %u", c->cmd);
        return false;
    }
    if (!ok) {
        conn_drop(s, c, true, "%s with key length %" PRIu32 " and value length %" PRIu32
                  " (allowed: %s)", wire_cmd_name(c->cmd), c->klen, c->vlen, rule);
        return false;
    }
    c->key = malloc((size_t)c->klen + 1);
    if (!c->key) {
        conn_drop(s, c, true, "out of memory for a %" PRIu32 "-byte key", c->klen);
        return false;
    }
    return true;
}

/*
 * Moves the parser on after bytes arrived, running the request once it is
 * complete. Empty parts are skipped here, so the reader never asks recv() for
 * 0 bytes. Returns false if the connection was dropped.
 */
static bool conn_advance(server_t *s, conn_t *c)
{
    if (c->state == CONN_READ_HEADER) {
        if (c->got < SMDDP_STORE_HEADER_SIZE) return true;
        if (!parse_header(s, c)) return false;
        c->state = CONN_READ_KEY;
        c->got = 0;
    }
    if (c->state == CONN_READ_KEY) {
        if (c->got < c->klen) return true;
        c->key[c->klen] = '\0';
        if (memchr(c->key, '\0', c->klen)) {
            conn_drop(s, c, true, "%s with a NUL byte inside its %" PRIu32 "-byte key",
                      wire_cmd_name(c->cmd), c->klen);
            return false;
        }
        c->state = CONN_READ_VALUE;
        c->got = 0;
    }
    if (c->state == CONN_READ_VALUE && c->got == c->vlen) return handle_request(s, c);
    return true;
}

/* Reads and runs requests until the socket is drained, the connection is busy, or dropped. */
static void conn_read(server_t *s, conn_t *c)
{
    for (int reads = 0; reads < READS_PER_WAKEUP; reads++) {
        void *dst;
        size_t want;
        switch (c->state) {
        case CONN_READ_HEADER:
            dst = c->hdr + c->got;
            want = SMDDP_STORE_HEADER_SIZE - c->got;
            break;
        case CONN_READ_KEY:
            dst = c->key + c->got;
            want = c->klen - c->got;
            break;
        case CONN_READ_VALUE:
            if (c->got == c->value_cap) {
                size_t cap = c->value_cap ? c->value_cap * 2 : VALUE_CHUNK;
                cap = SMDDP_MIN(cap, (size_t)c->vlen);
                uint8_t *v = realloc(c->value, cap);
                if (!v) {
                    conn_drop(s, c, true, "out of memory for a %" PRIu32 "-byte value", c->vlen);
                    return;
                }
                c->value = v;
                c->value_cap = cap;
            }
            dst = c->value + c->got;
            want = c->value_cap - c->got;
            break;
        default:
            return; /* busy with a reply or a waiting GET */
        }
        ssize_t n = recv(c->fd, dst, want, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn_drop(s, c, false, "recv failed: %s", strerror(errno));
            return;
        }
        if (n == 0) {
            if (c->state == CONN_READ_HEADER && c->got == 0)
                conn_drop(s, c, false, "closed by the client");
            else
                conn_drop(s, c, true, "closed in the middle of a message");
            return;
        }
        c->got += (size_t)n;
        if (!conn_advance(s, c)) return;
    }
}

static void accept_all(server_t *s)
{
    for (;;) {
        struct sockaddr_in sa;
        socklen_t len = sizeof(sa);
        int fd = accept4(s->listen_fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            SMDDP_WARN("TCP store server %s: accept failed: %s; pausing 100 ms", s->name,
                       strerror(errno));
            s->accept_resume_ns = smddp__now_ns() + ACCEPT_PAUSE_NS;
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conn_t *c = calloc(1, sizeof(*c));
        if (c && s->nconns == s->conns_cap) {
            size_t cap = s->conns_cap ? s->conns_cap * 2 : 16;
            conn_t **v = realloc(s->conns, cap * sizeof(*v));
            if (v) {
                s->conns = v;
                s->conns_cap = cap;
            }
        }
        if (!c || s->nconns == s->conns_cap) {
            SMDDP_WARN("TCP store server %s: out of memory accepting a connection", s->name);
            free(c);
            close(fd);
            continue;
        }
        c->fd = fd;
        wire_format_addr(&sa, c->peer, sizeof(c->peer));
        s->conns[s->nconns++] = c;
        SMDDP_TRACE("TCP store server %s: connection from %s", s->name, c->peer);
    }
}

/* The poll() events a connection waits for in its state. */
static short conn_events(const conn_t *c)
{
    switch (c->state) {
    case CONN_WRITING: return POLLOUT;
    case CONN_WAITING: return POLLRDHUP; /* only to notice the client leaving */
    default: return POLLIN;
    }
}

static void server_iterate(server_t *s)
{
    size_t n = s->nconns;
    if (s->pfds_cap < n + 2) {
        struct pollfd *p = realloc(s->pfds, (n + 2) * 2 * sizeof(*p));
        if (!p) {
            SMDDP_WARN("TCP store server %s: out of memory for poll()", s->name);
            struct timespec ts = {0, 10 * NS_PER_MS};
            nanosleep(&ts, NULL);
            return;
        }
        s->pfds = p;
        s->pfds_cap = (n + 2) * 2;
    }
    int64_t now = smddp__now_ns(), next = INT64_MAX;
    if (s->accept_resume_ns && now >= s->accept_resume_ns) s->accept_resume_ns = 0;
    s->pfds[0] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
    s->pfds[1] = (struct pollfd){.fd = s->accept_resume_ns ? -1 : s->listen_fd, .events = POLLIN};
    if (s->accept_resume_ns) next = s->accept_resume_ns;
    for (size_t i = 0; i < n; i++) {
        conn_t *c = s->conns[i];
        s->pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = conn_events(c)};
        if (c->state == CONN_WAITING) next = SMDDP_MIN(next, c->deadline_ns);
    }

    int rc = poll(s->pfds, n + 2, wire_poll_timeout(next));
    if (rc < 0 && errno != EINTR) {
        SMDDP_WARN("TCP store server %s: poll failed: %s", s->name, strerror(errno));
        struct timespec ts = {0, 10 * NS_PER_MS};
        nanosleep(&ts, NULL);
        return;
    }
    if (rc > 0 && (s->pfds[0].revents & POLLIN)) {
        uint64_t v;
        ssize_t unused = read(s->wake_fd, &v, sizeof(v));
        (void)unused;
    }
    for (size_t i = 0; rc > 0 && i < n; i++) {
        conn_t *c = s->conns[i];
        short re = s->pfds[i + 2].revents;
        if (c->dead || !re) continue;
        if (re & POLLNVAL) {
            conn_drop(s, c, true, "socket became invalid");
        } else if (c->state == CONN_WAITING) {
            if (re & (POLLRDHUP | POLLHUP | POLLERR))
                conn_drop(s, c, false, "closed by the client while waiting for a key");
        } else if (c->state == CONN_WRITING) {
            if (re & (POLLOUT | POLLHUP | POLLERR)) conn_flush(s, c);
        } else if (re & (POLLIN | POLLHUP | POLLERR | POLLRDHUP)) {
            conn_read(s, c);
        }
    }
    now = smddp__now_ns();
    for (size_t i = 0; i < n; i++) {
        conn_t *c = s->conns[i];
        if (!c->dead && c->state == CONN_WAITING && c->deadline_ns <= now)
            conn_reply(s, c, SMDDP_STORE_REPLY_TIMEOUT, NULL, 0);
    }
    if (rc > 0 && (s->pfds[1].revents & POLLIN)) accept_all(s);

    size_t kept = 0;
    for (size_t i = 0; i < s->nconns; i++) {
        if (s->conns[i]->dead)
            conn_free(s->conns[i]);
        else
            s->conns[kept++] = s->conns[i];
    }
    s->nconns = kept;
}

static void *server_main(void *arg)
{
    server_t *s = arg;
    while (!atomic_load(&s->stopping)) server_iterate(s);
    return NULL;
}

static void server_free(server_t *s)
{
    for (size_t i = 0; i < s->nconns; i++) conn_free(s->conns[i]);
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (s->wake_fd >= 0) close(s->wake_fd);
    table_free(&s->table);
    free(s->conns);
    free(s->pfds);
    free(s);
}

smddp_status_t smddp__tcp_server_start(const char *addr, int port, smddp__tcp_server_t **server,
                                       int *port_out)
{
    struct sockaddr_in sa;
    smddp_status_t st;
    if (!server || port < 0 || port > 65535)
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT,
                            "TCP store server: bad arguments (port %d, server %p)", port,
                            (void *)server);
    if ((st = wire_resolve(addr, port, INADDR_ANY, &sa)) < 0) {
        char why[SMDDP_ERRMSG_MAX];
        snprintf(why, sizeof(why), "%s", smddp__last_error());
        return smddp__error(st, "TCP store server: %s", why);
    }

    server_t *s = calloc(1, sizeof(*s));
    if (!s) return smddp__error(SMDDP_ERR_NO_MEMORY, "TCP store server: out of memory");
    s->wake_fd = -1;
    atomic_init(&s->stopping, false);
    wire_format_addr(&sa, s->name, sizeof(s->name));
    s->table.nbuckets = 64;
    s->listen_fd = -1;
    s->table.buckets = calloc(s->table.nbuckets, sizeof(*s->table.buckets));
    if (!s->table.buckets) {
        st = smddp__error(SMDDP_ERR_NO_MEMORY, "TCP store server: out of memory");
        goto fail;
    }
    s->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (s->listen_fd < 0 ||
        setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
        st = smddp__error(SMDDP_ERR_SYSTEM, "TCP store server: cannot create a socket: %s",
                          strerror(errno));
        goto fail;
    }
    if (bind(s->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(s->listen_fd, SOMAXCONN) != 0) {
        st = smddp__error(SMDDP_ERR_SYSTEM, "TCP store server: cannot listen on %s: %s", s->name,
                          strerror(errno));
        goto fail;
    }
    socklen_t len = sizeof(sa);
    if (getsockname(s->listen_fd, (struct sockaddr *)&sa, &len) != 0) {
        st = smddp__error(SMDDP_ERR_SYSTEM, "TCP store server: getsockname failed: %s",
                          strerror(errno));
        goto fail;
    }
    wire_format_addr(&sa, s->name, sizeof(s->name));
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->wake_fd < 0) {
        st = smddp__error(SMDDP_ERR_SYSTEM, "TCP store server %s: eventfd failed: %s", s->name,
                          strerror(errno));
        goto fail;
    }
    int rc = pthread_create(&s->thread, NULL, server_main, s);
    if (rc != 0) {
        st = smddp__error(SMDDP_ERR_SYSTEM, "TCP store server %s: cannot start its thread: %s",
                          s->name, strerror(rc));
        goto fail;
    }
    SMDDP_INFO("TCP store server listening on %s", s->name);
    *server = s;
    if (port_out) *port_out = (int)ntohs(sa.sin_port);
    return SMDDP_OK;
fail:
    server_free(s);
    return st;
}

void smddp__tcp_server_stop(smddp__tcp_server_t *s)
{
    if (!s) return;
    atomic_store(&s->stopping, true);
    uint64_t one = 1;
    while (write(s->wake_fd, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    pthread_join(s->thread, NULL);
    SMDDP_INFO("TCP store server %s stopped", s->name);
    server_free(s);
}
