/*
 * The built-in TCP key-value store (wire format in store.h).
 *
 * Server: one thread runs poll() over an eventfd (stop() wakes it through
 * that), the listening socket and every client connection, all non-blocking.
 * Each connection has an incremental parser, so a header and body may arrive
 * in any number of pieces. The header is validated before anything is
 * allocated, and a value buffer grows only as its bytes actually arrive, so
 * a client cannot make the server reserve memory it has not sent. A
 * connection carries one request at a time: while its reply is being sent or
 * its GET waits for a key, the server does not read from it, which bounds
 * what it buffers per connection to one message each way. Anything malformed
 * drops that one connection with a WARN line; the others carry on.
 *
 * Client: one blocking-style connection per store table, guarded by a mutex.
 * Every wait uses poll() with a deadline: the request's own wait (a GET's
 * timeout) plus a margin of silence, re-armed whenever bytes move, so a
 * server that dies or stops answering yields an error, never a hang. After
 * any transport or protocol failure the stream position is unknown, so the
 * connection is closed and later calls fail fast.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
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
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../param.h"
#include "store.h"

#define NS_PER_MS 1000000LL
/* Longest wait accepted, ~31 years, so that deadlines never overflow. */
#define MAX_WAIT_MS 1000000000000LL
/* First size of a value buffer; it doubles as bytes arrive. */
#define VALUE_CHUNK (64u << 10)
/* recv() calls per connection per wakeup, so one busy client cannot starve others. */
#define READS_PER_WAKEUP 64
/* How long accept() rests after running out of file descriptors. */
#define ACCEPT_PAUSE_NS (100 * NS_PER_MS)
/* Client: pause between connection attempts. */
#define CONNECT_RETRY_NS (20 * NS_PER_MS)
#define NAME_MAX_LEN 300

/* ---- shared helpers --------------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_i64(uint8_t *p, int64_t v)
{
    put_u32(p, (uint32_t)((uint64_t)v >> 32));
    put_u32(p + 4, (uint32_t)v);
}

static int64_t get_i64(const uint8_t *p)
{
    return (int64_t)((uint64_t)get_u32(p) << 32 | get_u32(p + 4));
}

static void put_header(uint8_t *p, uint8_t cmd, uint32_t klen, uint32_t vlen)
{
    put_u32(p, SMDDP_STORE_MAGIC);
    p[4] = cmd;
    put_u32(p + 5, klen);
    put_u32(p + 9, vlen);
}

static const char *cmd_name(uint8_t cmd)
{
    switch (cmd) {
    case SMDDP_STORE_CMD_SET: return "SET";
    case SMDDP_STORE_CMD_GET: return "GET";
    case SMDDP_STORE_CMD_ADD: return "ADD";
    case SMDDP_STORE_CMD_PING: return "PING";
    default: return "unknown";
    }
}

/* Resolves an IPv4 address; NULL or "" gives `any` (INADDR_ANY or loopback). */
static smddp_status_t resolve(const char *addr, int port, in_addr_t any, struct sockaddr_in *out)
{
    memset(out, 0, sizeof(*out));
    out->sin_family = AF_INET;
    out->sin_port = htons((uint16_t)port);
    if (!addr || !addr[0]) {
        out->sin_addr.s_addr = htonl(any);
        return SMDDP_OK;
    }
    if (inet_pton(AF_INET, addr, &out->sin_addr) == 1) return SMDDP_OK;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(addr, NULL, &hints, &res);
    if (rc != 0 || !res)
        return smddp__error_quiet(SMDDP_ERR_INVALID_ARGUMENT, "cannot resolve %s: %s", addr,
                                  rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    out->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return SMDDP_OK;
}

static void format_addr(const struct sockaddr_in *sa, char *out, size_t cap)
{
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof(ip));
    snprintf(out, cap, "%s:%d", ip, (int)ntohs(sa->sin_port));
}

/* Milliseconds until deadline for poll(): rounded up, 0 if passed, -1 for none. */
static int poll_timeout(int64_t deadline_ns)
{
    if (deadline_ns == INT64_MAX) return -1;
    int64_t left = deadline_ns - smddp__now_ns();
    if (left <= 0) return 0;
    int64_t ms = (left + NS_PER_MS - 1) / NS_PER_MS;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static int64_t clamp_wait_ms(int64_t ms)
{
    return ms < 0 ? 0 : ms > MAX_WAIT_MS ? MAX_WAIT_MS : ms;
}

/* ---- server: the map ------------------------------------------------------- */

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

/* ---- server: connections ----------------------------------------------------- */

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
    put_header(c->out, status, 0, (uint32_t)len);
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
    int64_t delta = get_i64(c->value), cur = 0, sum;
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
    put_i64(result, sum);
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
        int64_t wait_ms = clamp_wait_ms(get_i64(c->value));
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
    uint32_t magic = get_u32(c->hdr);
    c->cmd = c->hdr[4];
    c->klen = get_u32(c->hdr + 5);
    c->vlen = get_u32(c->hdr + 9);
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
                  " (allowed: %s)", cmd_name(c->cmd), c->klen, c->vlen, rule);
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
                      cmd_name(c->cmd), c->klen);
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
        format_addr(&sa, c->peer, sizeof(c->peer));
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

    int rc = poll(s->pfds, n + 2, poll_timeout(next));
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
    if ((st = resolve(addr, port, INADDR_ANY, &sa)) < 0) {
        char why[SMDDP_ERRMSG_MAX];
        snprintf(why, sizeof(why), "%s", smddp__last_error());
        return smddp__error(st, "TCP store server: %s", why);
    }

    server_t *s = calloc(1, sizeof(*s));
    if (!s) return smddp__error(SMDDP_ERR_NO_MEMORY, "TCP store server: out of memory");
    s->wake_fd = -1;
    atomic_init(&s->stopping, false);
    format_addr(&sa, s->name, sizeof(s->name));
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
    format_addr(&sa, s->name, sizeof(s->name));
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

/* ---- client ---------------------------------------------------------------- */

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
        int rc = poll(&p, 1, poll_timeout(deadline));
        if (rc > 0) return 0; /* errors and hang-ups show in the following call */
        if (rc == 0) return ETIMEDOUT;
        if (errno != EINTR) return errno;
    }
}

/* Closes the connection after a failure and records the error. */
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
 * Runs one request: sends it, then reads and validates the reply. On success
 * *status is the reply's status and *body (malloc()ed, never NULL) holds
 * *body_len bytes. The caller holds c->lock.
 */
static smddp_status_t client_call(client_t *c, uint8_t cmd, const char *key, const void *value,
                                  size_t vlen, int64_t wait_ms, uint8_t *status, uint8_t **body,
                                  size_t *body_len)
{
    const char *what = cmd_name(cmd);
    if (c->fd < 0)
        return smddp__error(SMDDP_ERR_STORE, "TCP store at %s: %s of key '%.200s': the "
                            "connection was closed after an earlier error", c->name, what, key);
    size_t klen = strlen(key);
    uint8_t hdr[SMDDP_STORE_HEADER_SIZE];
    put_header(hdr, cmd, (uint32_t)klen, (uint32_t)vlen);
    struct iovec iov[3] = {{hdr, sizeof(hdr)}, {(void *)key, klen}, {(void *)value, vlen}};
    int64_t deadline = smddp__now_ns() + clamp_wait_ms(wait_ms) * NS_PER_MS + margin_ns();
    int err = send_all(c, iov, 3, &deadline);
    if (err) return client_fail(c, what, key, "cannot send the request: %s", io_error(err));
    if ((err = recv_all(c, hdr, sizeof(hdr), &deadline)))
        return client_fail(c, what, key, "no reply: %s", io_error(err));
    uint32_t magic = get_u32(hdr), rklen = get_u32(hdr + 5), rvlen = get_u32(hdr + 9);
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
    for (size_t i = 0; i < len; i++) text[i] = msg[i] >= 0x20 && msg[i] < 0x7f ? (char)msg[i] : '?';
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
    put_i64(arg, clamp_wait_ms(timeout_ms));
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
                                " ms", c->name, key, clamp_wait_ms(timeout_ms));
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
    put_i64(arg, delta);
    pthread_mutex_lock(&c->lock);
    smddp_status_t st = client_call(c, SMDDP_STORE_CMD_ADD, key, arg, sizeof(arg), 0, &status,
                                    &body, &blen);
    pthread_mutex_unlock(&c->lock);
    if (st < 0) return st;
    if (status == SMDDP_STORE_REPLY_OK) {
        if (result) *result = get_i64(body);
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
 * with the reason in why (every failure is worth retrying: the server may
 * not be up yet, or its name not resolvable yet).
 */
static int try_connect(const char *addr, int port, int64_t deadline, char *why, size_t cap)
{
    struct sockaddr_in sa, self, peer;
    if (resolve(addr, port, INADDR_LOOPBACK, &sa) < 0) {
        snprintf(why, cap, "%s", smddp__last_error());
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
    int64_t deadline = start + clamp_wait_ms(timeout_ms) * NS_PER_MS;
    char why[256] = "no attempt made";
    smddp_status_t st = SMDDP_OK;
    for (;;) {
        c->fd = try_connect(addr, port, deadline, why, sizeof(why));
        if (c->fd >= 0) break;
        int64_t left = deadline - smddp__now_ns();
        if (left <= 0) {
            st = smddp__error(SMDDP_ERR_TIMEOUT,
                              "TCP store client: cannot connect to %s within %" PRId64
                              " ms: %s", c->name, clamp_wait_ms(timeout_ms), why);
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
    st = client_call(c, SMDDP_STORE_CMD_PING, "", NULL, 0, 0, &status, &body, &blen);
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
