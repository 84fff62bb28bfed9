/*
 * The built-in TCP key-value store for jobs without torch: rank 0 runs a
 * server thread, every rank (rank 0 too) connects a client, which is exposed
 * as an smddp_store_t table.
 */
#ifndef SMDDP_CORE_STORE_H
#define SMDDP_CORE_STORE_H

#include "../common.h"

typedef struct smddp__tcp_server smddp__tcp_server_t;

/*
 * Starts a server thread listening on addr:port (port 0 picks a free port;
 * addr NULL or "" means all interfaces). The actual port is in *port_out.
 */
smddp_status_t smddp__tcp_server_start(const char *addr, int port,
                                       smddp__tcp_server_t **server, int *port_out);
/* Stops the thread, closes every connection and frees the server. NULL ok. */
void smddp__tcp_server_stop(smddp__tcp_server_t *server);

/*
 * Connects to a server, retrying until timeout_ms passes, and fills *store
 * with a client table whose release() closes the connection (and, if
 * owned_server is not NULL, stops that server afterwards). On error *store is
 * untouched and the caller still owns owned_server. addr NULL or "" means
 * 127.0.0.1. The table's callbacks are thread-safe (one request at a time per
 * connection). A reply that does not arrive within the request's own wait
 * plus min(SMDDP_TIMEOUT, 30 s) of silence fails with SMDDP_ERR_STORE, and
 * the connection is unusable after any such failure.
 */
smddp_status_t smddp__tcp_client_connect(const char *addr, int port, int64_t timeout_ms,
                                         smddp__tcp_server_t *owned_server,
                                         smddp_store_t *store);

/* Limits the server enforces on every message; larger ones are rejected. */
#define SMDDP_STORE_MAX_KEY 1024
#define SMDDP_STORE_MAX_VALUE (64u << 20)

/*
 * Wire format, both directions: a 13-byte header {u32 magic, u8 command,
 * u32 key length, u32 value length} (big-endian) followed by the key bytes
 * (no NUL inside) and the value bytes.
 *
 *   SET  key, value                -> OK
 *   GET  key, i64 timeout_ms       -> OK + value, or TIMEOUT once it passes
 *   ADD  key, i64 delta            -> OK + i64 new value, or ERROR + text
 *   PING (no key, no value)        -> OK
 *
 * Replies carry no key; an ERROR's value is a message of at most
 * SMDDP_STORE_MAX_ERROR bytes. ADD keeps its integer as decimal text, so a
 * GET of an added key returns e.g. "4000" (no NUL). A GET timeout <= 0 only
 * checks whether the key exists. A server drops a connection that sends a
 * malformed message; it handles one request per connection at a time.
 */
#define SMDDP_STORE_MAGIC 0x534d4b56u /* "SMKV" */
#define SMDDP_STORE_HEADER_SIZE 13
#define SMDDP_STORE_MAX_ERROR 1024

enum {
    SMDDP_STORE_CMD_SET = 1,
    SMDDP_STORE_CMD_GET = 2,
    SMDDP_STORE_CMD_ADD = 3,
    SMDDP_STORE_CMD_PING = 4,
    SMDDP_STORE_REPLY_OK = 0x80,
    SMDDP_STORE_REPLY_TIMEOUT = 0x81,
    SMDDP_STORE_REPLY_ERROR = 0x82
};

#endif /* SMDDP_CORE_STORE_H */
