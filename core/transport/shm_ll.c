/*
 * Low-latency exchanges: the smallest collectives inside a node (allreduce
 * and allgather of up to SMDDP_SHM_LL_MAX bytes per rank, broadcast of up
 * to 1 KiB, barrier) in as few cache-line transfers as the data allows.
 *
 * Staged, a small op moves several lines from each rank to each peer: the
 * data in the staging half, the counter that says it is there, and the desc
 * the peers compare, each a separate transfer (and a pool or cross-memory
 * record besides). Here each rank writes its payload, its desc and a tag
 * into one slot of its own, the tag last (a release store), and peers wait
 * on the tag itself: up to 16 bytes of payload share the tag's line, so an
 * 8-byte allreduce between two ranks moves one line each way.
 *
 * Slots alternate. A rank rewrites a slot only for the exchange after next,
 * having seen every peer's tag of the next one, which each peer wrote after
 * it had read this slot: so only exchanges in which every rank waits for
 * every other may use them, and ranks must agree on which ops do (the size
 * limit, SMDDP_SHM_LL_MAX, is agreed at creation: the smallest holds, param.h).
 *
 * Each exchange also posts the rank's counter, once on every rank, so the
 * counters stay in step for the staged ops around it; a peer asleep in its
 * wait sleeps on that counter, and the post wakes it.
 */
#include <string.h>

#include "../param.h"
#include "shm_segment.h"

static shm_ll_head_t *head_of(smddp__shm_t *s, int lr, uint64_t n)
{
    char *slot = s->ll + ((size_t)lr * 2 + (size_t)(n & 1)) * SHM_LL_SLOT;
    return (shm_ll_head_t *)(slot + SHM_LL_SLOT - sizeof(shm_ll_head_t));
}

size_t smddp__shm_ll_max(smddp_comm_t comm) { return comm->shm->ll_max; }

size_t smddp__shm_default_ll_max(void)
{
    return (size_t)SMDDP_MIN(SMDDP_MAX(smddp__params()->shm_ll_max, 0), SHM_LL_PAYLOAD_MAX);
}

/* Writes this rank's part of exchange n: payload (NULL: none), desc, flags, then the tag. */
static void post(smddp_comm_t comm, uint64_t n, const void *mine, size_t bytes, uint64_t flags)
{
    smddp__shm_t *s = comm->shm;
    shm_ll_head_t *h = head_of(s, comm->local_rank, n);
    if (mine) memcpy((char *)h - bytes, mine, bytes);
    h->desc = s->desc;
    h->flags = flags;
    atomic_store_explicit(&h->tag, n + 1, memory_order_release);
    smddp__shm_post(comm);
}

typedef struct ll_arg {
    int lr;
    uint64_t n;      /* the exchange */
    uint32_t target; /* this rank's counter after its post for it */
    unsigned polls;
} ll_arg_t;

/*
 * Every POST_EVERY polls a waiter also reads the peer's counter (see
 * tag_or_post); after POST_ALWAYS polls (past spinning, when waits yield or
 * sleep) at every poll.
 */
#define POST_EVERY 256
#define POST_ALWAYS 4096

static bool tag_is(smddp__shm_t *s, int lr, uint64_t n)
{
    return atomic_load_explicit(&head_of(s, lr, n)->tag, memory_order_acquire) == n + 1;
}

/*
 * The peer's tag, or a post of the peer's that this exchange does not
 * explain: a peer that runs another op (or this one another way) posts
 * without writing its slot, and would otherwise be waited for until the
 * timeout. Its counter is read only now and then: it lies on the line the
 * peer's post writes, and reading it on every poll would cost that post a
 * transfer.
 */
static bool tag_or_post(smddp__shm_t *s, void *arg)
{
    ll_arg_t *a = arg;
    if (tag_is(s, a->lr, a->n)) return true;
    if (++a->polls % POST_EVERY && a->polls < POST_ALWAYS) return false;
    uint32_t v = atomic_load_explicit(&s->ctrl[a->lr].ctr, memory_order_acquire);
    return (int32_t)(v - a->target) >= 0;
}

static bool tag_there(smddp__shm_t *s, int lr, const void *arg)
{
    return tag_is(s, lr, *(const uint64_t *)arg);
}

/*
 * The peer did not write its slot for the exchange: where it posted for
 * another op (it published that op's desc first), that op; else the wait's
 * own failure, else the paths' disagreement (which the settings agreed at
 * setup should rule out).
 */
static smddp_status_t not_exchanged(smddp_comm_t comm, smddp__op_t *op, const ll_arg_t *a,
                                    smddp_status_t st)
{
    smddp__shm_t *s = comm->shm;
    int lr = a->lr;
    uint64_t n = a->n;
    uint32_t v = atomic_load_explicit(&s->ctrl[lr].ctr, memory_order_acquire);
    smddp__op_desc_t theirs;
    if (s->op_active && (int32_t)(v - a->target) >= 0 &&
        smddp__shm_read_desc(comm, lr, s->desc.seq, &theirs) &&
        memcmp(&theirs, &s->desc, sizeof(theirs)) != 0)
        return smddp__op_mismatch_error(op, comm->rank, comm->local_ranks[lr], &theirs);
    if (st == SMDDP_ERR_TIMEOUT) return smddp__shm_timeout_all(comm, op, tag_there, &n);
    if (st != SMDDP_OK) return st;
    char desc[256];
    smddp__op_describe(op, desc, sizeof(desc));
    return smddp__error_quiet(SMDDP_ERR_INTERNAL,
                              "%s: rank %d posted for it without writing its low-latency slot, "
                              "which this rank waits for: the ranks chose different paths",
                              desc, comm->local_ranks[lr]);
}

smddp_status_t smddp__shm_ll_exchange(smddp_comm_t comm, smddp__op_t *op, const void *mine,
                                      size_t bytes, uint64_t *flags, const void **payloads)
{
    smddp__shm_t *s = comm->shm;
    uint64_t n = s->ll_next++;
    post(comm, n, mine, bytes, flags ? *flags : 0);
    for (int q = 0; q < comm->local_size; q++) {
        shm_ll_head_t *h = head_of(s, q, n);
        if (payloads) payloads[q] = (const char *)h - bytes;
        if (q == comm->local_rank) continue;
        ll_arg_t arg = {q, n, s->my_ctr, 0};
        smddp_status_t st = smddp__shm_wait_until(comm, op, &s->ctrl[q].ctr, &s->ctrl[q].sleepers,
                                                  tag_or_post, &arg, q, "arrive");
        if (st != SMDDP_OK || !tag_is(s, q, n)) return not_exchanged(comm, op, &arg, st);
        /* The peer rewrites this slot only after this rank's next exchange: a plain read. */
        if (s->op_active && memcmp(&h->desc, &s->desc, sizeof(s->desc)) != 0) {
            smddp__op_desc_t theirs = h->desc;
            return smddp__op_mismatch_error(op, comm->rank, comm->local_ranks[q], &theirs);
        }
        if (flags) *flags &= h->flags;
    }
    return SMDDP_OK;
}
