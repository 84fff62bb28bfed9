/*
 * Pollers: what a wait in one transport drives so that another transport's
 * transfers keep moving. An op with network transfers in flight while it
 * works or waits in shared memory (the hierarchical allreduce's pipelined
 * rings) registers one for as long as they are in flight; every wait in
 * shared memory, and every wait for a ring, runs the registered pollers
 * between its own polls (and a shared-memory wait then sleeps at most
 * 50 us at a time). Only the thread running the op touches them.
 */
#ifndef SMDDP_CORE_POLLERS_H
#define SMDDP_CORE_POLLERS_H

#include "common.h"

#define SMDDP_MAX_POLLERS 4

typedef struct smddp__poller {
    smddp_status_t (*fn)(void *arg);
    void *arg;
} smddp__poller_t;

typedef struct smddp__pollers {
    smddp__poller_t p[SMDDP_MAX_POLLERS];
    int n;
} smddp__pollers_t;

/* Registers fn(arg); an error when SMDDP_MAX_POLLERS are registered already. */
static inline smddp_status_t smddp__poller_add(smddp__pollers_t *ps, smddp_status_t (*fn)(void *),
                                               void *arg)
{
    if (ps->n == SMDDP_MAX_POLLERS)
        return smddp__error(SMDDP_ERR_INTERNAL, "more than %d pollers at once",
                            SMDDP_MAX_POLLERS);
    ps->p[ps->n++] = (smddp__poller_t){fn, arg};
    return SMDDP_OK;
}

/* Removes fn(arg) if registered. */
static inline void smddp__poller_remove(smddp__pollers_t *ps, smddp_status_t (*fn)(void *),
                                        void *arg)
{
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i].fn == fn && ps->p[i].arg == arg) {
            ps->p[i] = ps->p[--ps->n];
            return;
        }
}

/* Runs every registered poller once; the first error stops them. */
static inline smddp_status_t smddp__pollers_run(const smddp__pollers_t *ps)
{
    for (int i = 0; i < ps->n; i++) SMDDP_CHECK(ps->p[i].fn(ps->p[i].arg));
    return SMDDP_OK;
}

#endif /* SMDDP_CORE_POLLERS_H */
