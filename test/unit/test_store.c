/*
 * The built-in TCP store: round trips, blocking GETs, concurrent ADDs, the
 * size limits, and a server that must survive malformed and random input
 * while a client must fail (not hang) when its server dies, stops answering
 * or speaks nonsense. Every test starts its own server on a loopback port.
 * Last, the core's wrapper around any store (smddp__store_get in comm.c):
 * a waiting get lets other threads in, and never asks for a 0 ms wait.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "param.h"
#include "store/store.h"

#define LOOPBACK "127.0.0.1"

/* ---- helpers ---------------------------------------------------------------- */

static double now_s(void) { return (double)smddp__now_ns() / 1e9; }

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static smddp__tcp_server_t *start_server(int *port)
{
    smddp__tcp_server_t *srv = NULL;
    assert_int_equal(smddp__tcp_server_start(LOOPBACK, 0, &srv, port), SMDDP_OK);
    assert_non_null(srv);
    assert_true(*port > 0);
    return srv;
}

static smddp_store_t connect_client(int port)
{
    smddp_store_t st;
    smddp_status_t rc = smddp__tcp_client_connect(LOOPBACK, port, 5000, NULL, &st);
    if (rc != SMDDP_OK) fail_msg("connect: %s", smddp__last_error());
    assert_int_equal(st.size, sizeof(smddp_store_t));
    return st;
}

static void set_str(smddp_store_t *s, const char *key, const char *value)
{
    assert_int_equal(s->set(s->ctx, key, value, strlen(value)), SMDDP_OK);
}

/* GETs key and checks that its value is exactly (value, len). */
static void check_value(smddp_store_t *s, const char *key, const void *value, size_t len)
{
    void *v = NULL;
    size_t n = 12345;
    smddp_status_t rc = s->get(s->ctx, key, 1000, &v, &n);
    if (rc != SMDDP_OK) fail_msg("get %s: %s", key, smddp__last_error());
    assert_non_null(v);
    assert_int_equal(n, len);
    if (len) assert_memory_equal(v, value, len);
    free(v);
}

/* A fresh client can still set and get: the server survived whatever came before. */
static void check_server_alive(int port)
{
    static int round;
    char key[64], value[64];
    snprintf(key, sizeof(key), "alive/%d", round);
    snprintf(value, sizeof(value), "value %d", round++);
    smddp_store_t s = connect_client(port);
    set_str(&s, key, value);
    check_value(&s, key, value, strlen(value));
    s.release(s.ctx);
}

/* A port on loopback that nothing listens on (free at the time of the call). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    socklen_t len = sizeof(sa);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void raw_send(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return; /* the server may already have dropped us */
        p += n;
        len -= (size_t)n;
    }
}

/* Reads exactly len bytes within 5 s; false on EOF, error or timeout. */
static bool raw_recv(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) <= 0) return false;
        ssize_t n = recv(fd, (char *)buf + got, len - got, 0);
        if (n <= 0) return false;
        got += (size_t)n;
    }
    return true;
}

/* True when the peer closes fd (EOF or reset) within 5 s; whatever arrives first is discarded. */
static bool closed_by_peer(int fd)
{
    char buf[4096];
    double end = now_s() + 5.0;
    while (now_s() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) < 0 && errno != EINTR) return false;
        if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
    }
    return false;
}

static void header(uint8_t *p, uint32_t magic, uint8_t cmd, uint32_t klen, uint32_t vlen)
{
    uint32_t w[3] = {htonl(magic), htonl(klen), htonl(vlen)};
    memcpy(p, &w[0], 4);
    p[4] = cmd;
    memcpy(p + 5, &w[1], 4);
    memcpy(p + 9, &w[2], 4);
}

/* Sends msg on a fresh raw connection and asserts that the server drops it. */
static void expect_dropped(int port, const void *msg, size_t len)
{
    int fd = raw_connect(port);
    raw_send(fd, msg, len);
    assert_true(closed_by_peer(fd));
    close(fd);
}

/* Sets an SMDDP_* variable for one test; restore_env() puts back what was there. */
static char *saved_env_value;
static const char *saved_env_name;

static void override_env(const char *name, const char *value)
{
    const char *old = getenv(name);
    saved_env_name = name;
    saved_env_value = old ? strdup(old) : NULL;
    setenv(name, value, 1);
    smddp__params_reload();
}

static void restore_env(void)
{
    if (saved_env_value)
        setenv(saved_env_name, saved_env_value, 1);
    else
        unsetenv(saved_env_name);
    free(saved_env_value);
    saved_env_value = NULL;
    smddp__params_reload();
}

/* ---- round trips -------------------------------------------------------------- */

static void test_set_get_roundtrip(void **state)
{
    (void)state;
    int port;
    smddp__tcp_server_t *srv = start_server(&port);
    smddp_store_t s = connect_client(port);

    set_str(&s, "a", "hello");
    check_value(&s, "a", "hello", 5);
    set_str(&s, "a", "replaced, longer than before");
    check_value(&s, "a", "replaced, longer than before", 28);

    /* An empty value is a real value: GET returns it with a non-NULL buffer. */
    assert_int_equal(s.set(s.ctx, "empty", "", 0), SMDDP_OK);
    check_value(&s, "empty", "", 0);
    assert_int_equal(s.set(s.ctx, "empty-null", NULL, 0), SMDDP_OK);
    check_value(&s, "empty-null", "", 0);

    /* Every byte value, NULs included, at sizes 1, odd and unaligned. */
    uint8_t bin[1031];
    for (size_t i = 0; i < sizeof(bin); i++) bin[i] = (uint8_t)(i * 7);
    bin[0] = 0;
    size_t sizes[] = {1, 7, 256, 1031};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        char key[32];
        snprintf(key, sizeof(key), "bin/%zu", sizes[i]);
        assert_int_equal(s.set(s.ctx, key, bin, sizes[i]), SMDDP_OK);
        check_value(&s, key, bin, sizes[i]);
    }

    /* The empty key, and many keys so the table grows past its first size. */
    set_str(&s, "", "empty key");
    check_value(&s, "", "empty key", 9);
    for (int i = 0; i < 500; i++) {
        char key[32], value[32];
        snprintf(key, sizeof(key), "many/%d", i);
        snprintf(value, sizeof(value), "%d", i * 3);
        set_str(&s, key, value);
    }
    for (int i = 0; i < 500; i += 37) {
        char key[32], value[32];
        snprintf(key, sizeof(key), "many/%d", i);
        snprintf(value, sizeof(value), "%d", i * 3);
        check_value(&s, key, value, strlen(value));
    }

    /* A second client sees what the first one wrote. */
    smddp_store_t s2 = connect_client(port);
    check_value(&s2, "a", "replaced, longer than before", 28);
    s2.release(s2.ctx);

    s.release(s.ctx);
    smddp__tcp_server_stop(srv);
}

static void test_get_missing_times_out(void **state)
{
    (void)state;
    int port;
    smddp__tcp_server_t *srv = start_server(&port);
    smddp_store_t s = connect_client(port);
    void *v = (void *)0x1;
    size_t n = 99;

    double t0 = now_s();
    assert_int_equal(s.get(s.ctx, "missing", 200, &v, &n), SMDDP_ERR_TIMEOUT);
    double dt = now_s() - t0;
    assert_true(dt >= 0.15);
    assert_true(dt < 2.0);
    assert_ptr_equal(v, (void *)0x1); /* outputs untouched on error */
    assert_int_equal(n, 99);
    assert_non_null(strstr(smddp__last_error(), "missing"));
    assert_non_null(strstr(smddp__last_error(), "200 ms"));

    /* 0 and negative timeouts only check. */
    t0 = now_s();
    assert_int_equal(s.get(s.ctx, "missing", 0, &v, &n), SMDDP_ERR_TIMEOUT);
    assert_int_equal(s.get(s.ctx, "missing", -5, &v, &n), SMDDP_ERR_TIMEOUT);
    assert_true(now_s() - t0 < 1.0);

    /* A timeout leaves the connection usable. */
    set_str(&s, "missing", "now here");
    check_value(&s, "missing", "now here", 8);

    s.release(s.ctx);
    smddp__tcp_server_stop(srv);
}

typedef struct getter {
    int port;
    const char *key;
    int64_t timeout_ms;
    smddp_status_t rc;
    void *value;
    size_t len;
    double elapsed, end;
    smddp_store_t *shared; /* use this client instead of a fresh one */
    pthread_barrier_t *ready; /* passed once connected, before the GET */
} getter_t;

static void *getter_main(void *arg)
{
    getter_t *g = arg;
    smddp_store_t own, *s = g->shared;
    if (!s) {
        own = connect_client(g->port);
        s = &own;
    }
    if (g->ready) pthread_barrier_wait(g->ready);
    double t0 = now_s();
    g->rc = s->get(s->ctx, g->key, g->timeout_ms, &g->value, &g->len);
    g->end = now_s();
    g->elapsed = g->end - t0;
    if (!g->shared) own.release(own.ctx);
    return NULL;
}

static void test_get_blocks_until_set(void **state)
{
    (void)state;
    int port;
    smddp__tcp_server_t *srv = start_server(&port);
    getter_t g[3];
    pthread_t t[3];
    pthread_barrier_t ready;
    pthread_barrier_init(&ready, NULL, 4);
    for (int i = 0; i < 3; i++) {
        g[i] = (getter_t){.port = port, .key = i < 2 ? "late" : "later", .timeout_ms = 5000,
                          .ready = &ready};
        assert_int_equal(pthread_create(&t[i], NULL, getter_main, &g[i]), 0);
    }
    smddp_store_t s = connect_client(port);
    pthread_barrier_wait(&ready);
    sleep_ms(150); /* time for the GETs to reach the server */
    double t_set = now_s();
    set_str(&s, "late", "arrived");
    int64_t r;
    assert_int_equal(s.add(s.ctx, "later", 3, &r), SMDDP_OK); /* ADD creates a key too */
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(g[i].rc, SMDDP_OK);
        assert_true(g[i].end >= t_set); /* answered only once the key was written */
        assert_true(g[i].elapsed < 4.0);
        if (i < 2) {
            assert_int_equal(g[i].len, 7);
            assert_memory_equal(g[i].value, "arrived", 7);
        } else {
            assert_int_equal(g[i].len, 1);
            assert_memory_equal(g[i].value, "3", 1);
        }
        free(g[i].value);
    }
    pthread_barrier_destroy(&ready);
    s.release(s.ctx);
    smddp__tcp_server_stop(srv);
}

/* ---- ADD ------------------------------------------------------------------------ */

static void test_add(void **state)
{
    (void)state;
    int port;
    smddp__tcp_server_t *srv = start_server(&port);
    smddp_store_t s = connect_client(port);
    int64_t r = 0;

    assert_int_equal(s.add(s.ctx, "n", 5, &r), SMDDP_OK);
    assert_int_equal(r, 5);
    assert_int_equal(s.add(s.ctx, "n", -12, &r), SMDDP_OK);
    assert_int_equal(r, -7);
    check_value(&s, "n", "-7", 2); /* stored as decimal text */
    assert_int_equal(s.add(s.ctx, "n", 0, NULL), SMDDP_OK);

    set_str(&s, "m", "42");
    assert_int_equal(s.add(s.ctx, "m", 1, &r), SMDDP_OK);
    assert_int_equal(r, 43);

    /* Not an integer, or overflow: an error, and the connection stays usable. */
    set_str(&s, "text", "4x2");
    assert_int_equal(s.add(s.ctx, "text", 1, &r), SMDDP_ERR_STORE);
    assert_non_null(strstr(smddp__last_error(), "not a decimal integer"));
    assert_non_null(strstr(smddp__last_error(), LOOPBACK));
    check_value(&s, "text", "4x2", 3);
    set_str(&s, "big", "9223372036854775807");
    assert_int_equal(s.add(s.ctx, "big", 1, &r), SMDDP_ERR_STORE);
    assert_non_null(strstr(smddp__last_error(), "overflows int64"));
    assert_int_equal(s.add(s.ctx, "big", -7, &r), SMDDP_OK);
    assert_int_equal(r, INT64_MAX - 7);
    assert_int_equal(s.add(s.ctx, "min", INT64_MIN, &r), SMDDP_OK);
    assert_int_equal(r, INT64_MIN);
    check_value(&s, "min", "-9223372036854775808", 20);
    assert_int_equal(s.add(s.ctx, "min", -1, &r), SMDDP_ERR_STORE);

    s.release(s.ctx);
    smddp__tcp_server_stop(srv);
}

typedef struct adder {
    int port;
    int count;
    smddp_store_t *shared;
    int failures;
} adder_t;

static void *adder_main(void *arg)
{
    adder_t *a = arg;
    smddp_store_t own, *s = a->shared;
    if (!s) {
        own = connect_client(a->port);
        s = &own;
    }
    for (int i = 0; i < a->count; i++) {
        int64_t r;
        if (s->add(s->ctx, "counter", 1, &r) != SMDDP_OK || r < 1) a->failures++;
    }
    if (!a->shared) own.release(own.ctx);
    return NULL;
}

static void test_add_concurrent(void **state)
{
    (void)state;
    int port;
    smddp__tcp_server_t *srv = start_server(&port);
    smddp_store_t s = connect_client(port);
    adder_t a[4];
    pthread_t t[4];

    /* Four clients, one per thread. */
    for (int i = 0; i < 4; i++) {
        a[i] = (adder_t){.port = port, .count = 1000};
        assert_int_equal(pthread_create(&t[i], NULL, adder_main, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(a[i].failures, 0);
    }
    check_value(&s, "counter", "4000", 4);

    /* Four threads sharing one client. */
    for (int i = 0; i < 4; i++) {
        a[i] = (adder_t){.port = port, .count = 250, .shared = &s};
        assert_int_equal(pthread_create(&t[i], NULL, adder_main, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(a[i].failures, 0);
    }
    int64_t r;
    assert_int_equal(s.add(s.ctx, "counter", 0, &r), SMDDP_OK);
    assert_int_equal(r, 5000);

    s.release(s.ctx);
    smddp__tcp_server_stop(srv);
}

/* ---- limits ---------------------------------------------------------------------- */

static void test_limits(void **state)
{
    (void)state;
    int port;
    smddp__tcp_server_t *srv = start_server(&port);
    smddp_store_t s = connect_client(port);

    char key[SMDDP_STORE_MAX_KEY + 2];
    memset(key, 'k', sizeof(key));
    key[SMDDP_STORE_MAX_KEY] = '\0';
    set_str(&s, key, "at the key limit");
    check_value(&s, key, "at the key limit", 16);
    int64_t r;
    assert_int_equal(s.add(s.ctx, key, 2, &r), SMDDP_ERR_STORE); /* text value */
    key[SMDDP_STORE_MAX_KEY] = 'k';
    key[SMDDP_STORE_MAX_KEY + 1] = '\0';
    void *v = NULL;
    size_t n = 0;
    assert_int_equal(s.set(s.ctx, key, "x", 1), SMDDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(smddp__last_error(), "key limit"));
    assert_int_equal(s.get(s.ctx, key, 10, &v, &n), SMDDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(s.add(s.ctx, key, 1, &r), SMDDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(s.set(s.ctx, NULL, "x", 1), SMDDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(s.set(s.ctx, "k", NULL, 3), SMDDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(s.get(s.ctx, "k", 10, NULL, &n), SMDDP_ERR_INVALID_ARGUMENT);

    /* The largest value makes the round trip; one byte more is refused. */
    size_t max = SMDDP_STORE_MAX_VALUE;
    uint8_t *big = malloc(max + 1);
    assert_non_null(big);
    for (size_t i = 0; i < max + 1; i++) big[i] = (uint8_t)(i ^ (i >> 11));
    assert_int_equal(s.set(s.ctx, "big", big, max), SMDDP_OK);
    assert_int_equal(s.get(s.ctx, "big", 1000, &v, &n), SMDDP_OK);
    assert_int_equal(n, max);
    assert_memory_equal(v, big, max);
    free(v);
    assert_int_equal(s.set(s.ctx, "big", big, max + 1), SMDDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(smddp__last_error(), "limit"));
    free(big);
    /* Rejected locally: this client never sent anything and still works. */
    set_str(&s, "after", "limits");
    check_value(&s, "after", "limits", 6);

    /* The server enforces the same limits on raw input. */
    uint8_t msg[SMDDP_STORE_HEADER_SIZE];
    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_SET, SMDDP_STORE_MAX_KEY + 1, 1);
    expect_dropped(port, msg, sizeof(msg));
    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_SET, 1, SMDDP_STORE_MAX_VALUE + 1);
    expect_dropped(port, msg, sizeof(msg));
    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_GET, 1, 4); /* timeout must be 8 bytes */
    expect_dropped(port, msg, sizeof(msg));
    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_ADD, 1, 9);
    expect_dropped(port, msg, sizeof(msg));
    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_PING, 1, 0);
    expect_dropped(port, msg, sizeof(msg));
    check_value(&s, "after", "limits", 6);
    check_server_alive(port);

    s.release(s.ctx);
    smddp__tcp_server_stop(srv);
}

/* ---- malformed input ------------------------------------------------------------- */

static void test_malformed(void **state)
{
    (void)state;
    int port;
    smddp__tcp_server_t *srv = start_server(&port);
    /* A client connected throughout must be unaffected by the others' garbage. */
    smddp_store_t s = connect_client(port);
    set_str(&s, "steady", "yes");
    uint8_t msg[64];

    header(msg, 0xdeadbeef, SMDDP_STORE_CMD_SET, 1, 1);
    expect_dropped(port, msg, SMDDP_STORE_HEADER_SIZE);
    check_server_alive(port);

    header(msg, SMDDP_STORE_MAGIC, 0x42, 1, 1);
    expect_dropped(port, msg, SMDDP_STORE_HEADER_SIZE);
    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_REPLY_OK, 0, 0); /* a reply is not a request */
    expect_dropped(port, msg, SMDDP_STORE_HEADER_SIZE);
    check_server_alive(port);

    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_SET, 0xFFFFFFFFu, 1);
    expect_dropped(port, msg, SMDDP_STORE_HEADER_SIZE);
    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_SET, 1, 0xFFFFFFFFu);
    expect_dropped(port, msg, SMDDP_STORE_HEADER_SIZE);
    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_GET, 0xFFFFFFFFu, 0xFFFFFFFFu);
    expect_dropped(port, msg, SMDDP_STORE_HEADER_SIZE);
    check_server_alive(port);

    /* Truncated header, then end of stream (half-close, and a full close). */
    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_SET, 1, 1);
    {
        int fd = raw_connect(port);
        raw_send(fd, msg, 5);
        shutdown(fd, SHUT_WR);
        assert_true(closed_by_peer(fd));
        close(fd);
        fd = raw_connect(port);
        raw_send(fd, msg, 7);
        close(fd);
    }
    /* Valid header, part of the body, then close. */
    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_SET, 3, 100);
    memcpy(msg + SMDDP_STORE_HEADER_SIZE, "keyvalue", 8);
    {
        int fd = raw_connect(port);
        raw_send(fd, msg, SMDDP_STORE_HEADER_SIZE + 8);
        shutdown(fd, SHUT_WR);
        assert_true(closed_by_peer(fd));
        close(fd);
    }
    /* A NUL byte inside the key. */
    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_SET, 3, 1);
    memcpy(msg + SMDDP_STORE_HEADER_SIZE, "a\0bv", 4);
    expect_dropped(port, msg, SMDDP_STORE_HEADER_SIZE + 4);
    check_server_alive(port);

    /* A valid SET sent one byte at a time is parsed across the pieces. */
    {
        int fd = raw_connect(port);
        header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_SET, 4, 6);
        memcpy(msg + SMDDP_STORE_HEADER_SIZE, "slowva\0ue", 10);
        for (size_t i = 0; i < SMDDP_STORE_HEADER_SIZE + 10; i++) {
            raw_send(fd, msg + i, 1);
            sleep_ms(1);
        }
        uint8_t reply[SMDDP_STORE_HEADER_SIZE], want[SMDDP_STORE_HEADER_SIZE];
        assert_true(raw_recv(fd, reply, sizeof(reply)));
        header(want, SMDDP_STORE_MAGIC, SMDDP_STORE_REPLY_OK, 0, 0);
        assert_memory_equal(reply, want, sizeof(want));
        /* A pipelined GET + PING in one send gets two replies in order. */
        header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_GET, 4, 8);
        memcpy(msg + SMDDP_STORE_HEADER_SIZE, "slow\0\0\0\0\0\0\0\x0a", 12);
        header(msg + SMDDP_STORE_HEADER_SIZE + 12, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_PING, 0, 0);
        raw_send(fd, msg, 2 * SMDDP_STORE_HEADER_SIZE + 12);
        uint8_t body[6];
        assert_true(raw_recv(fd, reply, sizeof(reply)));
        header(want, SMDDP_STORE_MAGIC, SMDDP_STORE_REPLY_OK, 0, 6);
        assert_memory_equal(reply, want, sizeof(want));
        assert_true(raw_recv(fd, body, sizeof(body)));
        assert_memory_equal(body, "va\0ue", 6);
        assert_true(raw_recv(fd, reply, sizeof(reply)));
        header(want, SMDDP_STORE_MAGIC, SMDDP_STORE_REPLY_OK, 0, 0);
        assert_memory_equal(reply, want, sizeof(want));
        close(fd);
    }
    /* A client that leaves while its GET waits is cleaned up. */
    {
        int fd = raw_connect(port);
        header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_GET, 4, 8);
        memcpy(msg + SMDDP_STORE_HEADER_SIZE, "nope\0\0\0\0\0\0\x27\x10", 12);
        raw_send(fd, msg, SMDDP_STORE_HEADER_SIZE + 12);
        sleep_ms(20);
        close(fd);
    }

    check_value(&s, "steady", "yes", 3);
    check_value(&s, "slow", "va\0ue", 6);
    check_server_alive(port);
    s.release(s.ctx);
    smddp__tcp_server_stop(srv);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    uint64_t x = rng_state; /* xorshift64 */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static void test_garbage(void **state)
{
    (void)state;
    int port;
    smddp__tcp_server_t *srv = start_server(&port);
    smddp_store_t s = connect_client(port);
    set_str(&s, "steady", "yes");
    override_env("SMDDP_DEBUG", "NONE"); /* hundreds of expected WARN lines otherwise */

    uint8_t buf[512];
    for (int i = 0; i < 300; i++) {
        size_t len = 1 + rng() % sizeof(buf);
        for (size_t j = 0; j < len; j++) buf[j] = (uint8_t)rng();
        /*
         * A third stays pure noise; the rest get a valid magic so the header
         * and body checks see the noise too, half of them with a known
         * command and lengths small enough to be plausible.
         */
        if (i % 3 && len >= SMDDP_STORE_HEADER_SIZE) {
            uint32_t klen = (uint32_t)rng(), vlen = (uint32_t)rng();
            uint8_t cmd = (uint8_t)rng();
            if (i % 3 == 2) {
                cmd = (uint8_t)(1 + rng() % 4);
                klen %= 40;
                vlen = rng() % 4 ? (uint32_t)(rng() % 600) : 8;
            }
            header(buf, SMDDP_STORE_MAGIC, cmd, klen, vlen);
        }
        int fd = raw_connect(port);
        raw_send(fd, buf, len);
        shutdown(fd, SHUT_WR);
        /* Whatever the bytes meant, the server ends up closing this connection. */
        bool closed = closed_by_peer(fd);
        close(fd);
        if (!closed) fail_msg("buffer %d (%zu bytes) left the connection open", i, len);
        if (i % 50 == 0) check_server_alive(port);
    }
    restore_env();
    check_value(&s, "steady", "yes", 3);
    check_server_alive(port);
    s.release(s.ctx);
    smddp__tcp_server_stop(srv);
}

/* ---- failures seen by the client -------------------------------------------------- */

static void test_connect_nothing_listening(void **state)
{
    (void)state;
    int port = free_port();
    smddp_store_t s;
    memset(&s, 0xab, sizeof(s));
    double t0 = now_s();
    smddp_status_t rc = smddp__tcp_client_connect(LOOPBACK, port, 300, NULL, &s);
    double dt = now_s() - t0;
    assert_true(rc == SMDDP_ERR_TIMEOUT || rc == SMDDP_ERR_STORE);
    assert_true(dt >= 0.25);
    assert_true(dt < 2.0);
    assert_non_null(strstr(smddp__last_error(), LOOPBACK));
    assert_int_equal(s.size, (size_t)0xabababababababab); /* untouched */

    assert_int_equal(smddp__tcp_client_connect(LOOPBACK, 0, 100, NULL, &s),
                     SMDDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(smddp__tcp_client_connect(LOOPBACK, 70000, 100, NULL, &s),
                     SMDDP_ERR_INVALID_ARGUMENT);
}

/*
 * A store address that does not resolve (a typo in MASTER_ADDR) is retried
 * until the timeout, since names can appear late at start-up, but a warning
 * says so at once, and once: with the default timeout of 30 minutes nothing
 * else would. The name has spaces, so the resolver refuses it without asking
 * a DNS server.
 */
static void test_connect_unresolvable_warns(void **state)
{
    (void)state;
    char path[] = "/tmp/smddp-test-stderr-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fd, 2), 2);
    smddp_store_t s;
    double t0 = now_s();
    smddp_status_t rc = smddp__tcp_client_connect("no such host", 29999, 400, NULL, &s);
    double dt = now_s() - t0;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char log[4096] = "";
    ssize_t n = pread(fd, log, sizeof(log) - 1, 0);
    close(fd);
    assert_true(n > 0);
    log[n] = 0;
    print_message("stderr: %s", log);
    assert_int_equal(rc, SMDDP_ERR_TIMEOUT);
    assert_true(dt >= 0.35 && dt < 5.0);
    assert_non_null(strstr(smddp__last_error(), "cannot resolve no such host"));
    const char *w = strstr(log, "cannot connect to no such host:29999 yet (cannot resolve");
    assert_non_null(w);
    assert_non_null(strstr(log, "retrying for up to"));
    assert_null(strstr(strstr(w, "yet (") + 1, "yet (")); /* once, though retried every 20 ms */
}

static void test_server_stopped_during_get(void **state)
{
    (void)state;
    int port;
    smddp__tcp_server_t *srv = start_server(&port);
    smddp_store_t s = connect_client(port);
    getter_t g = {.key = "never", .timeout_ms = 20000, .shared = &s};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, getter_main, &g), 0);
    sleep_ms(100);
    smddp__tcp_server_stop(srv);
    pthread_join(t, NULL);
    assert_int_equal(g.rc, SMDDP_ERR_STORE);
    assert_true(g.elapsed < 3.0);
    /* Later calls fail at once instead of touching the dead connection. */
    double t0 = now_s();
    assert_int_equal(s.set(s.ctx, "x", "y", 1), SMDDP_ERR_STORE);
    assert_non_null(strstr(smddp__last_error(), "earlier error"));
    assert_true(now_s() - t0 < 1.0);
    s.release(s.ctx);
}

typedef enum fake_mode {
    FAKE_HANG,        /* answers the PING, then never again */
    FAKE_BAD_MAGIC,   /* answers the PING with a wrong magic */
    FAKE_HUGE,        /* answers the PING with a 4 GiB body */
    FAKE_BAD_STATUS,  /* answers the PING with an unknown status */
    FAKE_CLOSE,       /* closes after reading the PING */
    FAKE_SHORT        /* announces a GET body and closes halfway */
} fake_mode_t;

typedef struct fake_server {
    int listen_fd;
    int port;
    fake_mode_t mode;
} fake_server_t;

static void *fake_main(void *arg)
{
    fake_server_t *f = arg;
    struct pollfd p = {.fd = f->listen_fd, .events = POLLIN};
    if (poll(&p, 1, 5000) <= 0) return NULL;
    int fd = accept(f->listen_fd, NULL, NULL);
    if (fd < 0) return NULL;
    uint8_t req[SMDDP_STORE_HEADER_SIZE + 64], reply[SMDDP_STORE_HEADER_SIZE + 4] = {0};
    if (raw_recv(fd, req, SMDDP_STORE_HEADER_SIZE)) {
        switch (f->mode) {
        case FAKE_HANG:
        case FAKE_SHORT:
            header(reply, SMDDP_STORE_MAGIC, SMDDP_STORE_REPLY_OK, 0, 0);
            raw_send(fd, reply, SMDDP_STORE_HEADER_SIZE);
            if (f->mode == FAKE_SHORT && raw_recv(fd, req, SMDDP_STORE_HEADER_SIZE + 1 + 8)) {
                header(reply, SMDDP_STORE_MAGIC, SMDDP_STORE_REPLY_OK, 0, 100);
                raw_send(fd, reply, SMDDP_STORE_HEADER_SIZE + 4);
                close(fd);
                return NULL;
            }
            break;
        case FAKE_BAD_MAGIC:
            header(reply, 0x48545450, SMDDP_STORE_REPLY_OK, 0, 0); /* "HTTP" */
            raw_send(fd, reply, SMDDP_STORE_HEADER_SIZE);
            break;
        case FAKE_HUGE:
            header(reply, SMDDP_STORE_MAGIC, SMDDP_STORE_REPLY_OK, 0, 0xFFFFFFFFu);
            raw_send(fd, reply, SMDDP_STORE_HEADER_SIZE);
            break;
        case FAKE_BAD_STATUS:
            header(reply, SMDDP_STORE_MAGIC, 0x7f, 0, 0);
            raw_send(fd, reply, SMDDP_STORE_HEADER_SIZE);
            break;
        case FAKE_CLOSE:
            break;
        }
    }
    /* Hold the connection until the client goes away. */
    if (f->mode != FAKE_CLOSE) closed_by_peer(fd);
    close(fd);
    return NULL;
}

static void fake_start(fake_server_t *f, fake_mode_t mode, pthread_t *t)
{
    f->mode = mode;
    f->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(f->listen_fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(f->listen_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(f->listen_fd, 4), 0);
    socklen_t len = sizeof(sa);
    assert_int_equal(getsockname(f->listen_fd, (struct sockaddr *)&sa, &len), 0);
    f->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(t, NULL, fake_main, f), 0);
}

static void fake_stop(fake_server_t *f, pthread_t t)
{
    pthread_join(t, NULL);
    close(f->listen_fd);
}

static void test_server_not_answering(void **state)
{
    (void)state;
    /* SMDDP_TIMEOUT bounds how long the client tolerates silence. */
    override_env("SMDDP_TIMEOUT", "0.5");
    fake_server_t f;
    pthread_t t;
    fake_start(&f, FAKE_HANG, &t);
    smddp_store_t s;
    assert_int_equal(smddp__tcp_client_connect(LOOPBACK, f.port, 2000, NULL, &s), SMDDP_OK);
    void *v;
    size_t n;
    double t0 = now_s();
    assert_int_equal(s.get(s.ctx, "k", 200, &v, &n), SMDDP_ERR_STORE);
    double dt = now_s() - t0;
    assert_true(dt >= 0.6);
    assert_true(dt < 3.0);
    assert_non_null(strstr(smddp__last_error(), "stopped answering"));
    s.release(s.ctx);
    fake_stop(&f, t);

    /* A reply cut short is an error too. */
    fake_start(&f, FAKE_SHORT, &t);
    assert_int_equal(smddp__tcp_client_connect(LOOPBACK, f.port, 2000, NULL, &s), SMDDP_OK);
    assert_int_equal(s.get(s.ctx, "k", 200, &v, &n), SMDDP_ERR_STORE);
    assert_non_null(strstr(smddp__last_error(), "truncated"));
    s.release(s.ctx);
    fake_stop(&f, t);
    restore_env();
}

static void test_bad_server_replies(void **state)
{
    (void)state;
    override_env("SMDDP_TIMEOUT", "1");
    fake_mode_t modes[] = {FAKE_BAD_MAGIC, FAKE_HUGE, FAKE_BAD_STATUS, FAKE_CLOSE};
    const char *expect[] = {"magic", "malformed", "malformed", "closed"};
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        fake_server_t f;
        pthread_t t;
        smddp_store_t s;
        fake_start(&f, modes[i], &t);
        double t0 = now_s();
        assert_int_equal(smddp__tcp_client_connect(LOOPBACK, f.port, 2000, NULL, &s),
                         SMDDP_ERR_STORE);
        assert_true(now_s() - t0 < 1.5);
        if (!strstr(smddp__last_error(), expect[i]))
            fail_msg("mode %zu: unexpected message: %s", i, smddp__last_error());
        fake_stop(&f, t);
    }
    restore_env();
}

typedef struct late_start {
    int port;
    smddp__tcp_server_t *server;
    smddp_status_t rc;
} late_start_t;

static void *late_start_main(void *arg)
{
    late_start_t *l = arg;
    sleep_ms(100);
    int bound;
    l->rc = smddp__tcp_server_start(LOOPBACK, l->port, &l->server, &bound);
    if (l->rc == SMDDP_OK && bound != l->port) l->rc = SMDDP_ERR_INTERNAL;
    return NULL;
}

static void test_connect_before_server_starts(void **state)
{
    (void)state;
    late_start_t l = {.port = free_port()};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, late_start_main, &l), 0);
    smddp_store_t s;
    double t0 = now_s();
    smddp_status_t rc = smddp__tcp_client_connect(LOOPBACK, l.port, 5000, NULL, &s);
    double dt = now_s() - t0;
    pthread_join(t, NULL);
    assert_int_equal(l.rc, SMDDP_OK);
    if (rc != SMDDP_OK) fail_msg("connect: %s", smddp__last_error());
    assert_true(dt >= 0.05);
    set_str(&s, "k", "v");
    check_value(&s, "k", "v", 1);
    s.release(s.ctx);
    smddp__tcp_server_stop(l.server);
}

static void test_server_lifecycle(void **state)
{
    (void)state;
    int port;
    smddp__tcp_server_t *srv = NULL, *other = NULL;

    /* "localhost" resolves, and release() stops an owned server. */
    assert_int_equal(smddp__tcp_server_start("localhost", 0, &srv, &port), SMDDP_OK);
    smddp_store_t s;
    assert_int_equal(smddp__tcp_client_connect("localhost", port, 2000, srv, &s), SMDDP_OK);

    /* The port is taken while the server runs. */
    int p2;
    assert_int_equal(smddp__tcp_server_start(LOOPBACK, port, &other, &p2), SMDDP_ERR_SYSTEM);
    assert_null(other);
    assert_non_null(strstr(smddp__last_error(), "cannot listen"));

    set_str(&s, "k", "v");
    check_value(&s, "k", "v", 1);
    s.release(s.ctx); /* also stops srv; LeakSanitizer checks it freed everything */

    assert_int_equal(smddp__tcp_server_start(LOOPBACK, -1, &other, &p2),
                     SMDDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(smddp__tcp_server_start(LOOPBACK, 65536, &other, &p2),
                     SMDDP_ERR_INVALID_ARGUMENT);
    assert_null(other);
    smddp__tcp_server_stop(NULL);

    /* A server with clients still connected and a GET still waiting stops cleanly. */
    srv = start_server(&port);
    int fd = raw_connect(port);
    uint8_t msg[SMDDP_STORE_HEADER_SIZE + 12];
    header(msg, SMDDP_STORE_MAGIC, SMDDP_STORE_CMD_GET, 4, 8);
    memcpy(msg + SMDDP_STORE_HEADER_SIZE, "wait\0\0\0\0\0\0\x27\x10", 12);
    raw_send(fd, msg, sizeof(msg));
    int fd2 = raw_connect(port);
    raw_send(fd2, msg, 5);
    sleep_ms(20);
    smddp__tcp_server_stop(srv);
    assert_true(closed_by_peer(fd));
    close(fd);
    close(fd2);
}

/* ---- the core's wrapper (comm.c) over a store that waits server-side -------- */

/*
 * A store whose get waits for the key the way a server does, for the whole
 * timeout it is given, while the caller holds the wrapper's lock. A 0 ms
 * timeout would mean "forever" to torch's stores: it is counted and answered
 * at once here, so that the test cannot hang. `overshoot_ms` is added to
 * every wait, as FileStore's polling does.
 */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int has_key;
    int zero_waits;
    int overshoot_ms;
} fake_store_t;

static smddp_status_t fake_set(void *ctx, const char *key, const void *v, size_t len)
{
    (void)key, (void)v, (void)len;
    fake_store_t *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->has_key = 1;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return SMDDP_OK;
}

static smddp_status_t fake_get(void *ctx, const char *key, int64_t timeout_ms, void **v,
                               size_t *len)
{
    (void)key;
    fake_store_t *f = ctx;
    pthread_mutex_lock(&f->mu);
    if (timeout_ms == 0) f->zero_waits++;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    int64_t ns = until.tv_nsec + (timeout_ms > 0 ? timeout_ms + f->overshoot_ms : 0) * 1000000LL;
    until.tv_sec += ns / 1000000000LL;
    until.tv_nsec = ns % 1000000000LL;
    while (!f->has_key && timeout_ms > 0 &&
           pthread_cond_timedwait(&f->cv, &f->mu, &until) != ETIMEDOUT) {
    }
    int has = f->has_key;
    pthread_mutex_unlock(&f->mu);
    if (!has) return SMDDP_ERR_TIMEOUT;
    *v = strdup("1");
    *len = 2;
    return SMDDP_OK;
}

static smddp_status_t fake_add(void *ctx, const char *key, int64_t d, int64_t *out)
{
    (void)ctx, (void)key;
    *out = d;
    return SMDDP_OK;
}

static smddp__store_ref_t *fake_ref(fake_store_t *f)
{
    memset(f, 0, sizeof(*f));
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    smddp__store_ref_t *ref = calloc(1, sizeof(*ref));
    assert_non_null(ref);
    ref->table = (smddp_store_t){.size = sizeof(smddp_store_t), .ctx = f, .set = fake_set,
                                 .get = fake_get, .add = fake_add};
    pthread_mutex_init(&ref->lock, NULL);
    atomic_init(&ref->refs, 1);
    atomic_init(&ref->queued, 0);
    return ref;
}

typedef struct {
    smddp__store_ref_t *ref;
    smddp_status_t st;
    double took_s;
} waiter_t;

static void *wrapper_getter(void *arg)
{
    waiter_t *w = arg;
    void *v = NULL;
    size_t len = 0;
    double t0 = now_s();
    w->st = smddp__store_get(w->ref, "k", 4000, &v, &len);
    w->took_s = now_s() - t0;
    free(v);
    return NULL;
}

/*
 * One thread waits for a key that only a second thread's set will publish:
 * the set must get through while the get waits (two threads making
 * communicators at once depend on each other like this across ranks). A get
 * that took the lock back at once after each slice starved the set until the
 * get's own timeout.
 */
static void test_wrapper_get_lets_a_set_in(void **state)
{
    (void)state;
    double best = 1e9;
    for (int round = 0; round < 3; round++) {
        fake_store_t f;
        smddp__store_ref_t *ref = fake_ref(&f);
        waiter_t w = {.ref = ref};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, wrapper_getter, &w), 0);
        sleep_ms(120); /* the get is in its second slice (50 ms, then 100) */
        double t0 = now_s();
        assert_int_equal(smddp__store_set(ref, "k", "1", 2), SMDDP_OK);
        double set_s = now_s() - t0;
        pthread_join(t, NULL);
        assert_int_equal(w.st, SMDDP_OK);
        if (set_s > 0.5 || w.took_s > 1.0)
            fail_msg("round %d: the set waited %.3f s for the store, the get took %.3f s", round,
                     set_s, w.took_s);
        if (set_s < best) best = set_s;
        smddp__store_unref(ref);
        pthread_cond_destroy(&f.cv);
        pthread_mutex_destroy(&f.mu);
    }
    /*
     * The set goes in when the get's current slice ends, 30 ms after it
     * started. Taking the lock straight back made it wait at least one more
     * slice (80-240 ms measured with 50 ms slices); the best of three rounds
     * allows for a slow machine.
     */
    if (best > 0.070)
        fail_msg("the set waited %.3f s at best: more than the get's current slice", best);
}

/*
 * Slices of a get whose store overshoots each wait: the last slice would have
 * been 0 ms, which torch's stores take as "wait forever".
 */
static void test_wrapper_get_never_waits_0_ms(void **state)
{
    (void)state;
    for (int64_t timeout = 51; timeout <= 60; timeout++) {
        fake_store_t f;
        smddp__store_ref_t *ref = fake_ref(&f);
        f.overshoot_ms = 10;
        void *v = NULL;
        size_t len = 0;
        assert_int_equal(smddp__store_get(ref, "k", timeout, &v, &len), SMDDP_ERR_TIMEOUT);
        assert_null(v);
        if (f.zero_waits)
            fail_msg("a get of %lld ms asked the store for a 0 ms wait", (long long)timeout);
        smddp__store_unref(ref);
        pthread_cond_destroy(&f.cv);
        pthread_mutex_destroy(&f.mu);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_get_roundtrip),
        cmocka_unit_test(test_get_missing_times_out),
        cmocka_unit_test(test_get_blocks_until_set),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_add_concurrent),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_connect_nothing_listening),
        cmocka_unit_test(test_connect_unresolvable_warns),
        cmocka_unit_test(test_server_stopped_during_get),
        cmocka_unit_test(test_server_not_answering),
        cmocka_unit_test(test_bad_server_replies),
        cmocka_unit_test(test_connect_before_server_starts),
        cmocka_unit_test(test_server_lifecycle),
        cmocka_unit_test(test_wrapper_get_lets_a_set_in),
        cmocka_unit_test(test_wrapper_get_never_waits_0_ms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
