/*
 * Cross-memory attach: a rank reads a local peer's input straight out of the
 * peer's address space (process_vm_readv), so that an allgather copies each
 * block once, from the peer's input into this rank's output, where staging
 * copies it twice (into the peer's staging half, then out of it).
 *
 * Whether the kernel allows it is a property of each pair of processes (same
 * user, Yama's ptrace_scope, seccomp, pid namespaces), so the local ranks
 * find out once, at setup, and agree: each publishes the address of a word
 * that holds a random value, reads every peer's, and publishes whether it
 * found them all. Cross-memory attach is on only when every local rank did
 * and, unless every rank was told SMDDP_SHM_CMA=on, the ranks do not
 * outnumber their CPUs (a rank that reads a peer's memory then holds the
 * core the peer waits for: 4 ranks on 2 CPUs lost). The size range is agreed
 * at creation (the largest SMDDP_SHM_CMA_MIN, the smallest SMDDP_SHM_CMA_MAX), so
 * every rank picks the same path for an op.
 *
 * Per op, each rank publishes in its step record the address of its input,
 * or 0 when peers must read it staged; the peers read it after the post
 * that follows, and the rank leaves its input untouched until every peer
 * has ended the step (coll/shm/allgather_staged.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../param.h"
#include "shm_segment.h"

/* A rank's verdict: it cannot (or will not) read every peer; it can; it can and was told "on". */
#define VERDICT_NO 1u
#define VERDICT_YES 2u
#define VERDICT_ON 3u

typedef struct cma_record {
    _Atomic uint64_t tag;
    uint64_t addr;
} cma_record_t;

_Static_assert(META_CMA_RECORD + sizeof(cma_record_t) <= SMDDP_SHM_META_SIZE,
               "the cross-memory-attach record fits the metadata slot");

static cma_record_t *record(smddp_comm_t comm, int lr, uint64_t seq)
{
    return (cma_record_t *)((char *)smddp__shm_meta(comm, lr, (int)(seq & 1)) + META_CMA_RECORD);
}

/* Reads len bytes at addr of process pid into dst: 0, or the errno that stopped it. */
static int read_from(pid_t pid, void *dst, uint64_t addr, size_t len)
{
    while (len) {
        struct iovec local = {dst, len}, remote = {(void *)(uintptr_t)addr, len};
        ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return got < 0 ? errno : EFAULT;
        dst = (char *)dst + got;
        addr += (uint64_t)got;
        len -= (size_t)got;
    }
    return 0;
}

static uint64_t random_word(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
        v = (uint64_t)smddp__now_ns() ^ (uint64_t)getpid() << 40;
    return v | 1; /* never 0, which a page of zeroes would hold */
}

/* Why this rank cannot read every peer ("" when it can), into why. */
static void probe_peers(smddp_comm_t comm, char *why, size_t cap)
{
    smddp__shm_t *s = comm->shm;
    if (smddp__params()->shm_cma == SMDDP_CMA_OFF) {
        snprintf(why, cap, "SMDDP_SHM_CMA=off");
        return;
    }
    for (int q = 0; q < comm->local_size; q++) {
        if (q == comm->local_rank) continue;
        pid_t pid = atomic_load(&s->ctrl[q].pid);
        uint64_t got = 0;
        int err = read_from(pid, &got, s->ctrl[q].cma_probe_addr, sizeof(got));
        if (err) {
            snprintf(why, cap, "process_vm_readv from local rank %d (pid %d): %s", q, (int)pid,
                     strerror(err));
            return;
        }
        if (got != s->ctrl[q].cma_probe_val) {
            snprintf(why, cap, "local rank %d's pid %d is another process here (are the ranks "
                     "in different pid namespaces?)", q, (int)pid);
            return;
        }
    }
}

static smddp_status_t cma_setup(smddp_comm_t comm)
{
    smddp__shm_t *s = comm->shm;
    const smddp__params_t *params = smddp__params();
    int p = comm->local_size;
    shm_ctrl_t *mine = &s->ctrl[comm->local_rank];
    s->cma_on = false;
    if (p < 2) return SMDDP_OK;

    s->cma_probe = random_word();
    mine->cma_probe_addr = (uint64_t)(uintptr_t)&s->cma_probe;
    mine->cma_probe_val = s->cma_probe;
    smddp__op_t setup = shm_setup_op(comm);
    smddp_status_t st = smddp__shm_sync(comm, &setup);
    char why[200] = "";
    if (st == SMDDP_OK) {
        probe_peers(comm, why, sizeof(why));
        /* sysconf may follow this rank's own affinity: each says what it sees. */
        atomic_store(&mine->cma_crowded, s->oversubscribed);
        atomic_store(&mine->cma_verdict, why[0]                            ? VERDICT_NO
                                         : params->shm_cma == SMDDP_CMA_ON ? VERDICT_ON
                                                                           : VERDICT_YES);
        st = smddp__shm_sync(comm, &setup);
    }
    if (st < 0) {
        char msg[SMDDP_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", smddp__last_error());
        return smddp__error(st, "cross-memory attach setup failed: %s", msg);
    }

    /*
     * Every rank reads the same words, so every rank reaches the same verdict;
     * the range is the one every rank allows (agreed at creation, param.h).
     */
    uint64_t lo = (uint64_t)SMDDP_MAX(comm->params->shm_cma_min, 0);
    uint64_t hi = (uint64_t)SMDDP_MAX(comm->params->shm_cma_max, 0);
    int refused = -1;
    bool forced = true; /* every rank was told "on": sharing CPUs does not turn it off */
    bool crowded = false;
    for (int q = 0; q < p; q++) {
        uint32_t verdict = atomic_load(&s->ctrl[q].cma_verdict);
        if (refused < 0 && verdict != VERDICT_YES && verdict != VERDICT_ON) refused = q;
        forced &= verdict == VERDICT_ON;
        crowded |= atomic_load(&s->ctrl[q].cma_crowded) != 0;
    }
    if (refused == comm->local_rank)
        SMDDP_INFO("rank %d: cross-memory attach off: %s", comm->rank, why);
    else if (refused >= 0)
        SMDDP_INFO("rank %d: cross-memory attach off: local rank %d cannot use it", comm->rank,
                   refused);
    else if (crowded && !forced)
        SMDDP_INFO("rank %d: cross-memory attach off: the %d local ranks outnumber their CPUs "
                   "(SMDDP_SHM_CMA=on on every rank uses it all the same)",
                   comm->rank, p);
    else if (lo > hi)
        SMDDP_INFO("rank %d: cross-memory attach off: the ranks' SMDDP_SHM_CMA_MIN and "
                   "SMDDP_SHM_CMA_MAX leave no size",
                   comm->rank);
    if (refused >= 0 || (crowded && !forced) || lo > hi) return SMDDP_OK;
    s->cma_on = true;
    s->cma_min = (size_t)lo;
    s->cma_max = (size_t)hi;
    SMDDP_INFO("rank %d: allgathers of %zu to %zu bytes per rank read local peers' inputs by "
               "cross-memory attach",
               comm->rank, s->cma_min, s->cma_max);
    return SMDDP_OK;
}

const smddp__transport_t smddp__cma_transport = {"cross-memory attach", false, cma_setup, NULL,
                                                 NULL};

bool smddp__cma_use(smddp_comm_t comm, size_t bytes)
{
    const smddp__shm_t *s = comm->shm;
    return s->cma_on && bytes >= s->cma_min && bytes <= s->cma_max;
}

bool smddp__cma_range(smddp_comm_t comm, size_t *lo, size_t *hi)
{
    const smddp__shm_t *s = comm->shm;
    *lo = s->cma_min;
    *hi = s->cma_max;
    return s->cma_on;
}

void smddp__cma_publish(smddp_comm_t comm, const smddp__op_t *op, const void *in)
{
    cma_record_t *r = record(comm, comm->local_rank, op->seq);
    shm_record_open(&r->tag);
    *(volatile uint64_t *)&r->addr = (uint64_t)(uintptr_t)in;
    shm_record_close(&r->tag, shm_record_tag(op->seq, comm->shm->my_ctr + 1)); /* the next post */
}

/*
 * A record tagged otherwise, or rewritten while read, is the next op's with
 * the same parity: only a rank whose input is staged leaves an op before its
 * peers have read its record, so this op's address was 0.
 */
uint64_t smddp__cma_peer(smddp_comm_t comm, const smddp__op_t *op, int lr, uint32_t tag)
{
    cma_record_t *r = record(comm, lr, op->seq);
    uint64_t want = shm_record_tag(op->seq, tag);
    if (!shm_record_is(&r->tag, want)) return 0;
    uint64_t addr = *(volatile uint64_t *)&r->addr;
    return shm_record_still(&r->tag, want) ? addr : 0;
}

smddp_status_t smddp__cma_read(smddp_comm_t comm, smddp__op_t *op, int lr, void *dst,
                               uint64_t addr, size_t len)
{
    pid_t pid = atomic_load(&comm->shm->ctrl[lr].pid);
    int err = read_from(pid, dst, addr, len);
    if (!err) return SMDDP_OK;
    char desc[256];
    smddp__op_describe(op, desc, sizeof(desc));
    return smddp__error(err == ESRCH ? SMDDP_ERR_PEER_LOST : SMDDP_ERR_SYSTEM,
                        "%s failed: cannot read rank %d's input (pid %d, %zu bytes at 0x%" PRIx64
                        ") by cross-memory attach: %s",
                        desc, comm->local_ranks[lr], (int)pid, len, addr, strerror(err));
}
