/*
 * Encoding helpers shared by the TCP store's server (tcp_server.c) and client
 * (tcp_client.c). The wire format itself is described in store.h.
 */
#ifndef SMDDP_CORE_STORE_TCP_WIRE_H
#define SMDDP_CORE_STORE_TCP_WIRE_H

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "store.h"

#define NS_PER_MS 1000000LL
/* Longest wait accepted, ~31 years, so that deadlines never overflow. */
#define MAX_WAIT_MS 1000000000000LL

static inline void wire_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline uint32_t wire_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void wire_put_i64(uint8_t *p, int64_t v)
{
    wire_put_u32(p, (uint32_t)((uint64_t)v >> 32));
    wire_put_u32(p + 4, (uint32_t)v);
}

static inline int64_t wire_get_i64(const uint8_t *p)
{
    return (int64_t)((uint64_t)wire_get_u32(p) << 32 | wire_get_u32(p + 4));
}

static inline void wire_put_header(uint8_t *p, uint8_t cmd, uint32_t klen, uint32_t vlen)
{
    wire_put_u32(p, SMDDP_STORE_MAGIC);
    p[4] = cmd;
    wire_put_u32(p + 5, klen);
    wire_put_u32(p + 9, vlen);
}

static inline const char *wire_cmd_name(uint8_t cmd)
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
static inline smddp_status_t wire_resolve(const char *addr, int port, in_addr_t any,
                                          struct sockaddr_in *out)
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

static inline void wire_format_addr(const struct sockaddr_in *sa, char *out, size_t cap)
{
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof(ip));
    snprintf(out, cap, "%s:%d", ip, (int)ntohs(sa->sin_port));
}

/* Milliseconds until deadline for poll(): rounded up, 0 if passed, -1 for none. */
static inline int wire_poll_timeout(int64_t deadline_ns)
{
    if (deadline_ns == INT64_MAX) return -1;
    int64_t left = deadline_ns - smddp__now_ns();
    if (left <= 0) return 0;
    int64_t ms = (left + NS_PER_MS - 1) / NS_PER_MS;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static inline int64_t wire_clamp_wait_ms(int64_t ms)
{
    return ms < 0 ? 0 : ms > MAX_WAIT_MS ? MAX_WAIT_MS : ms;
}

#endif /* SMDDP_CORE_STORE_TCP_WIRE_H */
