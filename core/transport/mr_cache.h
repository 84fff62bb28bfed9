/*
 * A memory-registration cache for the network transport. Providers that
 * need local buffers registered (FI_MR_LOCAL: efa, verbs) take a descriptor
 * with every transfer; registering costs a system call and page pinning, so
 * a collective that sends from the same buffers round after round looks
 * them up here instead.
 *
 * Entries cover page-aligned ranges; a lookup hits any entry that contains
 * the whole buffer. Posted transfers pin their entry (get/put). Persistent
 * entries (the communicator's own shared-memory segment) live until the
 * cache is freed; every other entry is the caller's memory, which may be
 * freed and its addresses reused once the operation returns, so those are
 * kept only while the caller holds the cache open (smddp__mr_cache_hold,
 * one collective) and dropped when it lets go, or at once when it does not
 * hold it (send/recv). At capacity the least recently used unpinned entry
 * is evicted; when every entry is pinned, a registration is made for that
 * transfer alone.
 *
 * The cache knows nothing of libfabric: it calls reg and dereg, so it is
 * unit-tested with fakes.
 */
#ifndef SMDDP_CORE_MR_CACHE_H
#define SMDDP_CORE_MR_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common.h"

/* Registers [addr, addr + len): 0 or a negative errno-style code; *handle for dereg, *desc for transfers. */
typedef int (*smddp__mr_reg_fn)(void *ctx, void *addr, size_t len, void **handle, void **desc);
typedef void (*smddp__mr_dereg_fn)(void *ctx, void *handle);

typedef struct smddp__mr_entry smddp__mr_entry_t;
typedef struct smddp__mr_cache smddp__mr_cache_t;

typedef struct smddp__mr_stats {
    uint64_t hits, misses, evictions, uncached;
    int live; /* registrations held now */
} smddp__mr_stats_t;

/* The text of reg's error code. */
typedef const char *(*smddp__mr_strerror_fn)(int rc);

/* capacity: entries kept (>= 1). what names the user in messages ("libfabric tcp"). */
smddp_status_t smddp__mr_cache_new(int capacity, smddp__mr_reg_fn reg, smddp__mr_dereg_fn dereg,
                                   smddp__mr_strerror_fn strerr, void *ctx, const char *what,
                                   smddp__mr_cache_t **out);
/* Deregisters everything, pinned or not. NULL is fine. */
void smddp__mr_cache_free(smddp__mr_cache_t *c);

/* The entry covering [addr, addr + len), pinned; registers on a miss. */
smddp_status_t smddp__mr_cache_get(smddp__mr_cache_t *c, const void *addr, size_t len,
                                   smddp__mr_entry_t **e);
/* Registers [addr, addr + len) for good (the caller's own long-lived memory). */
smddp_status_t smddp__mr_cache_add_persistent(smddp__mr_cache_t *c, const void *addr,
                                              size_t len);
void *smddp__mr_desc(const smddp__mr_entry_t *e);
/* Unpins e; an entry made for one transfer, or one nobody holds the cache for, goes now. */
void smddp__mr_cache_put(smddp__mr_cache_t *c, smddp__mr_entry_t *e);

/* Keep the caller's entries between transfers until release (which drops the unpinned ones). */
void smddp__mr_cache_hold(smddp__mr_cache_t *c);
void smddp__mr_cache_release(smddp__mr_cache_t *c);

smddp__mr_stats_t smddp__mr_cache_stats(const smddp__mr_cache_t *c);

#endif /* SMDDP_CORE_MR_CACHE_H */
