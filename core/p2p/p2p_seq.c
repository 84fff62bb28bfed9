/*
 * The send/recv engine's counters per (peer, direction, tag): message
 * numbers (p->seqs, under comm->lock) and sends on the network per tag
 * (p->sending, the engine's thread only). An open-addressing table, at most
 * half full, that grows by doubling.
 */
#include <stdlib.h>

#include "p2p_engine.h"

static uint64_t seq_key(int peer, bool recv, int32_t tag)
{
    return ((uint64_t)(uint32_t)peer << 33 | (uint64_t)recv << 32 | (uint32_t)tag) + 1;
}

static size_t seq_slot(const seq_map_t *m, uint64_t key)
{
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    size_t i = (size_t)(h >> 32) & (m->cap - 1);
    while (m->keys[i] && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
    return i;
}

/* Doubles m's table (at least 64 slots); false when out of memory. */
static bool seq_grow(seq_map_t *m)
{
    seq_map_t g = {0};
    g.cap = m->cap ? 2 * m->cap : 64;
    g.keys = calloc(g.cap, sizeof(*g.keys));
    g.next = calloc(g.cap, sizeof(*g.next));
    if (!g.keys || !g.next) {
        free(g.keys);
        free(g.next);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = seq_slot(&g, m->keys[i]);
        g.keys[j] = m->keys[i];
        g.next[j] = m->next[i];
    }
    g.used = m->used;
    free(m->keys);
    free(m->next);
    *m = g;
    return true;
}

uint64_t *smddp__p2p_count(seq_map_t *m, int peer, bool recv, int32_t tag)
{
    uint64_t key = seq_key(peer, recv, tag);
    size_t i = m->cap ? seq_slot(m, key) : 0;
    if (m->cap && m->keys[i]) return &m->next[i];
    /* A new key: the table stays at most half full, so probes stay short. */
    if (2 * (m->used + 1) > m->cap) {
        if (!seq_grow(m)) return NULL;
        i = seq_slot(m, key);
    }
    m->keys[i] = key;
    m->used++;
    return &m->next[i];
}
