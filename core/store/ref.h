/*
 * The store reference (ref.c): a store table shared by a communicator and
 * those split from it, with its callbacks serialised and errors that name
 * the key.
 */
#ifndef SMDDP_CORE_STORE_REF_H
#define SMDDP_CORE_STORE_REF_H

#include <pthread.h>
#include <stdatomic.h>

#include "../common.h"

/* A store shared by a communicator and those split from it. */
typedef struct smddp__store_ref {
    smddp_store_t table;
    atomic_int refs;
    pthread_mutex_t lock;    /* one callback at a time */
    atomic_int queued;       /* threads waiting for lock (a get lets them in between slices) */
    void (*on_free)(struct smddp__store_ref *self); /* optional, before it is freed */
    _Atomic uint64_t ops;    /* set, get and add calls made through this reference */
    _Atomic uint64_t bytes;  /* the keys and values they sent and received */
} smddp__store_ref_t;

/*
 * A reference (count 1) to a copy of table, or an empty table to be filled
 * by the caller when table is NULL; NULL when out of memory (error set).
 */
smddp__store_ref_t *smddp__store_ref_new(const smddp_store_t *table);

/* Store access, serialised per store. Errors carry the key in the message. */
smddp_status_t smddp__store_set(smddp__store_ref_t *s, const char *key, const void *v, size_t len);
smddp_status_t smddp__store_get(smddp__store_ref_t *s, const char *key, int64_t timeout_ms,
                                void **v, size_t *len);
smddp_status_t smddp__store_add(smddp__store_ref_t *s, const char *key, int64_t delta,
                                int64_t *result);
void smddp__store_unref(smddp__store_ref_t *s);
/*
 * What went through s so far: calls (a get is one however long it waits
 * for its key) and the bytes of their keys and values.
 */
void smddp__store_counts(smddp__store_ref_t *s, uint64_t *ops, uint64_t *bytes);

/* The store's lock, for a caller that makes several calls on the table at once. */
void smddp__store_lock(smddp__store_ref_t *s);
/* Takes s's lock, giving up after ms (a get in progress lets go within 400 ms). */
bool smddp__store_lock_within(smddp__store_ref_t *s, int64_t ms);

#endif /* SMDDP_CORE_STORE_REF_H */
