/*
 * The registration cache (mr_cache.h): a small table searched linearly. It
 * holds tens of entries (the staging segment, a scratch block or two, the
 * user's buffers of one collective), so a scan beats any index, and every
 * lookup is followed by a network transfer that costs far more.
 */
#include "mr_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct smddp__mr_entry {
    uintptr_t lo, hi; /* [lo, hi), page aligned */
    void *handle, *desc;
    int refs;
    bool persistent;
    bool transient; /* made for one transfer: not in the table, on the transients list */
    uint64_t used;  /* LRU clock */
    struct smddp__mr_entry *prev, *next; /* transients list */
};

struct smddp__mr_cache {
    smddp__mr_reg_fn reg;
    smddp__mr_dereg_fn dereg;
    smddp__mr_strerror_fn strerr;
    void *ctx;
    char what[64];
    int cap, n;
    smddp__mr_entry_t **e; /* n live table entries */
    smddp__mr_entry_t *transients;
    int holds;
    uint64_t clock;
    smddp__mr_stats_t stats;
};

smddp_status_t smddp__mr_cache_new(int capacity, smddp__mr_reg_fn reg, smddp__mr_dereg_fn dereg,
                                   smddp__mr_strerror_fn strerr, void *ctx, const char *what,
                                   smddp__mr_cache_t **out)
{
    smddp__mr_cache_t *c = calloc(1, sizeof(*c));
    if (capacity < 1) capacity = 1;
    if (c) c->e = calloc((size_t)capacity, sizeof(*c->e));
    if (!c || !c->e) {
        free(c);
        return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate a registration cache of %d "
                            "entries", capacity);
    }
    c->reg = reg;
    c->dereg = dereg;
    c->strerr = strerr;
    c->ctx = ctx;
    c->cap = capacity;
    snprintf(c->what, sizeof(c->what), "%s", what);
    *out = c;
    return SMDDP_OK;
}

static void drop(smddp__mr_cache_t *c, smddp__mr_entry_t *e)
{
    c->dereg(c->ctx, e->handle);
    c->stats.live--;
    free(e);
}

void smddp__mr_cache_free(smddp__mr_cache_t *c)
{
    if (!c) return;
    for (int i = 0; i < c->n; i++) drop(c, c->e[i]);
    /* Pinned by transfers that never completed (abandoned, or in flight at teardown). */
    while (c->transients) {
        smddp__mr_entry_t *e = c->transients;
        c->transients = e->next;
        drop(c, e);
    }
    free(c->e);
    free(c);
}

static smddp_status_t make(smddp__mr_cache_t *c, const void *addr, size_t len,
                           smddp__mr_entry_t **out)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)addr & ~(page - 1);
    uintptr_t hi = ((uintptr_t)addr + len + page - 1) & ~(page - 1);
    if (hi == lo) hi = lo + page; /* a zero-length transfer still needs a descriptor */
    smddp__mr_entry_t *e = calloc(1, sizeof(*e));
    if (!e) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate a registration entry");
    int rc = c->reg(c->ctx, (void *)lo, hi - lo, &e->handle, &e->desc);
    if (rc != 0) {
        free(e);
        return smddp__error(SMDDP_ERR_SYSTEM, "%s: registering %zu bytes at %p for the network "
                            "failed: %s", c->what, (size_t)(hi - lo), (void *)lo,
                            c->strerr ? c->strerr(rc) : strerror(rc < 0 ? -rc : rc));
    }
    e->lo = lo;
    e->hi = hi;
    c->stats.live++;
    *out = e;
    return SMDDP_OK;
}

/* Index of the least recently used unpinned, non-persistent entry; -1 if none. */
static int victim(const smddp__mr_cache_t *c)
{
    int best = -1;
    for (int i = 0; i < c->n; i++) {
        const smddp__mr_entry_t *e = c->e[i];
        if (e->refs || e->persistent) continue;
        if (best < 0 || e->used < c->e[best]->used) best = i;
    }
    return best;
}

static void remove_at(smddp__mr_cache_t *c, int i)
{
    drop(c, c->e[i]);
    c->e[i] = c->e[--c->n];
}

/* Room for one more table entry: false when every entry is pinned or persistent. */
static bool make_room(smddp__mr_cache_t *c)
{
    if (c->n < c->cap) return true;
    int v = victim(c);
    if (v < 0) return false;
    remove_at(c, v);
    c->stats.evictions++;
    return true;
}

smddp_status_t smddp__mr_cache_get(smddp__mr_cache_t *c, const void *addr, size_t len,
                                   smddp__mr_entry_t **out)
{
    uintptr_t a = (uintptr_t)addr;
    for (int i = 0; i < c->n; i++) {
        smddp__mr_entry_t *e = c->e[i];
        if (e->lo <= a && a + len <= e->hi) {
            e->refs++;
            e->used = ++c->clock;
            c->stats.hits++;
            *out = e;
            return SMDDP_OK;
        }
    }
    c->stats.misses++;
    smddp__mr_entry_t *e;
    bool room = make_room(c);
    SMDDP_CHECK(make(c, addr, len, &e));
    e->refs = 1;
    e->used = ++c->clock;
    if (room) {
        c->e[c->n++] = e;
    } else {
        e->transient = true;
        e->next = c->transients;
        if (e->next) e->next->prev = e;
        c->transients = e;
        c->stats.uncached++;
    }
    *out = e;
    return SMDDP_OK;
}

smddp_status_t smddp__mr_cache_add_persistent(smddp__mr_cache_t *c, const void *addr, size_t len)
{
    smddp__mr_entry_t *e;
    if (!make_room(c))
        return smddp__error(SMDDP_ERR_INTERNAL, "%s: no room for a persistent registration (%d "
                            "entries, all in use)", c->what, c->cap);
    SMDDP_CHECK(make(c, addr, len, &e));
    e->persistent = true;
    c->e[c->n++] = e;
    return SMDDP_OK;
}

void *smddp__mr_desc(const smddp__mr_entry_t *e) { return e->desc; }

void smddp__mr_cache_put(smddp__mr_cache_t *c, smddp__mr_entry_t *e)
{
    if (--e->refs > 0) return;
    if (e->transient) {
        if (e->prev) e->prev->next = e->next;
        else c->transients = e->next;
        if (e->next) e->next->prev = e->prev;
        drop(c, e);
        return;
    }
    if (c->holds || e->persistent) return;
    for (int i = 0; i < c->n; i++)
        if (c->e[i] == e) {
            remove_at(c, i);
            return;
        }
}

void smddp__mr_cache_hold(smddp__mr_cache_t *c) { c->holds++; }

void smddp__mr_cache_release(smddp__mr_cache_t *c)
{
    if (c->holds > 0 && --c->holds > 0) return;
    for (int i = 0; i < c->n;) {
        smddp__mr_entry_t *e = c->e[i];
        if (!e->refs && !e->persistent)
            remove_at(c, i);
        else
            i++;
    }
}

smddp__mr_stats_t smddp__mr_cache_stats(const smddp__mr_cache_t *c) { return c->stats; }
