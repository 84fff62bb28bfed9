/*
 * A store shared by a communicator and those split from it: the caller's
 * table (torch's store, or the built-in TCP client) behind one lock, so that
 * its callbacks run one at a time, and a reference count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ref.h"

smddp__store_ref_t *smddp__store_ref_new(const smddp_store_t *table)
{
    smddp__store_ref_t *ref = calloc(1, sizeof(*ref));
    if (!ref) {
        smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate the store reference");
        return NULL;
    }
    if (table) ref->table = *table;
    pthread_mutex_init(&ref->lock, NULL);
    atomic_init(&ref->refs, 1);
    atomic_init(&ref->queued, 0);
    atomic_init(&ref->ops, 0);
    atomic_init(&ref->bytes, 0);
    return ref;
}

static smddp_status_t store_fail(smddp_status_t st, const char *what, const char *key)
{
    char inner[SMDDP_ERRMSG_MAX];
    snprintf(inner, sizeof(inner), "%s", smddp__last_error());
    if (st == SMDDP_ERR_TIMEOUT)
        return smddp__error_quiet(st, "store %s of key %s timed out%s%s", what, key,
                                  inner[0] ? ": " : "", inner);
    return smddp__error_quiet(st < 0 ? st : SMDDP_ERR_STORE, "store %s of key %s failed%s%s", what,
                              key, inner[0] ? ": " : "", inner);
}

static void count(smddp__store_ref_t *s, const char *key, size_t len)
{
    atomic_fetch_add_explicit(&s->ops, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->bytes, strlen(key) + len, memory_order_relaxed);
}

void smddp__store_counts(smddp__store_ref_t *s, uint64_t *ops, uint64_t *bytes)
{
    *ops = atomic_load_explicit(&s->ops, memory_order_relaxed);
    *bytes = atomic_load_explicit(&s->bytes, memory_order_relaxed);
}

void smddp__store_lock(smddp__store_ref_t *s)
{
    atomic_fetch_add(&s->queued, 1);
    pthread_mutex_lock(&s->lock);
    atomic_fetch_sub(&s->queued, 1);
}

smddp_status_t smddp__store_set(smddp__store_ref_t *s, const char *key, const void *v, size_t len)
{
    smddp__clear_error();
    smddp__store_lock(s);
    smddp_status_t st = s->table.set(s->table.ctx, key, v, len);
    pthread_mutex_unlock(&s->lock);
    count(s, key, len);
    return st < 0 ? store_fail(st, "set", key) : SMDDP_OK;
}

/*
 * How long one get holds the store: a get that waits for a key asks in
 * slices, first of STORE_SLICE_MS, each twice the last up to
 * STORE_SLICE_MAX_MS (a long wait, such as many ranks waiting for a late
 * one, then asks a few times a second instead of twenty), and lets go in
 * between, so that other threads' store calls
 * (another communicator being made or split on another thread, an abort
 * poll) are not queued behind it: two threads making communicators at once
 * deadlocked until the timeout when each held the store while waiting for a
 * key that only the other's counterpart on another rank would publish.
 * Letting go is not enough by itself: a mutex is not fair, and this thread
 * would take it again before a woken one runs, so it steps aside for
 * STORE_STEP_ASIDE_US while threads queue for it. A slice is never 0 ms,
 * which some stores (torch's) take as "no timeout".
 */
#define STORE_SLICE_MS 50
#define STORE_SLICE_MAX_MS 400
#define STORE_STEP_ASIDE_US 1000

smddp_status_t smddp__store_get(smddp__store_ref_t *s, const char *key, int64_t timeout_ms,
                                void **v, size_t *len)
{
    smddp__clear_error();
    *v = NULL;
    *len = 0;
    int64_t deadline = smddp__now_ns() + timeout_ms * 1000000LL;
    smddp_status_t st;
    for (int64_t most = STORE_SLICE_MS;; most = SMDDP_MIN(2 * most, (int64_t)STORE_SLICE_MAX_MS)) {
        int64_t left = (deadline - smddp__now_ns()) / 1000000LL;
        int64_t slice = SMDDP_MIN(SMDDP_MAX(left, (int64_t)1), most);
        smddp__store_lock(s);
        st = s->table.get(s->table.ctx, key, slice, v, len);
        pthread_mutex_unlock(&s->lock);
        if (st != SMDDP_ERR_TIMEOUT || left <= slice) break;
        free(*v);
        *v = NULL;
        smddp__clear_error(); /* a slice's timeout is not the caller's */
        if (atomic_load(&s->queued) > 0) {
            struct timespec ts = {0, STORE_STEP_ASIDE_US * 1000L};
            nanosleep(&ts, NULL);
        }
    }
    count(s, key, st < 0 ? 0 : *len);
    if (st < 0) {
        free(*v);
        *v = NULL;
        if (st == SMDDP_ERR_TIMEOUT)
            return smddp__error_quiet(st, "store get of key %s timed out: it did not appear "
                                      "within %lld ms", key, (long long)timeout_ms);
        return store_fail(st, "get", key);
    }
    return SMDDP_OK;
}

smddp_status_t smddp__store_add(smddp__store_ref_t *s, const char *key, int64_t delta,
                                int64_t *result)
{
    smddp__clear_error();
    smddp__store_lock(s);
    smddp_status_t st = s->table.add(s->table.ctx, key, delta, result);
    pthread_mutex_unlock(&s->lock);
    count(s, key, sizeof(delta) + sizeof(*result));
    return st < 0 ? store_fail(st, "add", key) : SMDDP_OK;
}

void smddp__store_unref(smddp__store_ref_t *s)
{
    if (!s) return;
    if (atomic_fetch_sub(&s->refs, 1) == 1) {
        if (s->on_free) s->on_free(s);
        if (s->table.release) s->table.release(s->table.ctx);
        pthread_mutex_destroy(&s->lock);
        free(s);
    }
}

/* Takes s's lock, giving up after ms (a get in progress lets go within 400 ms). */
bool smddp__store_lock_within(smddp__store_ref_t *s, int64_t ms)
{
    int64_t end = smddp__now_ns() + ms * 1000000LL;
    bool locked;
    atomic_fetch_add(&s->queued, 1); /* a waiting get steps aside for this one */
    while (!(locked = pthread_mutex_trylock(&s->lock) == 0) && smddp__now_ns() < end) {
        struct timespec ts = {0, 200 * 1000};
        nanosleep(&ts, NULL);
    }
    atomic_fetch_sub(&s->queued, 1);
    return locked;
}
