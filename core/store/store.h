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
 * owned_server is not NULL, stops that server afterwards).
 */
smddp_status_t smddp__tcp_client_connect(const char *addr, int port, int64_t timeout_ms,
                                         smddp__tcp_server_t *owned_server,
                                         smddp_store_t *store);

/* Limits the server enforces on every message; larger ones are rejected. */
#define SMDDP_STORE_MAX_KEY 1024
#define SMDDP_STORE_MAX_VALUE (64u << 20)

#endif /* SMDDP_CORE_STORE_H */
