/*
 * Shared-memory transport among the ranks of one node.
 *
 * Local rank 0 creates one segment per communicator under an unguessable
 * name (O_EXCL, mode 0600), publishes the name through the store, and every
 * local rank maps it; the last one to map it unlinks the name, so a job that
 * crashes later leaves nothing in /dev/shm. Layout:
 *
 *   header | ctrl[P] | meta[P][2] | progress[P] | ring ctrl[P][P] | ll[P][2] |
 *   data[P][2 halves] | ring data[P][P]
 *
 * (shm_segment.h; the pair rings that carry send/recv are in shm_ring.c; the
 * low-latency slots of the smallest collectives in shm_ll.c; the pools,
 * memory peers read and write in place, in shm_pool.c, above this file).
 *
 * Each rank owns one counter (ctrl[r].ctr) that only it increments. Waiting
 * for a peer is "wait until its counter reaches a value": spin for a few
 * microseconds, then yield, then sleep on a futex on the counter, waking every
 * slice to check the deadline, the segment's abort flag and whether the peer
 * process still exists.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/futex.h>
#include <limits.h>
#include <sched.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../param.h"
#include "shm_segment.h"

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

void smddp__shm_wake(_Atomic uint32_t *word, _Atomic uint32_t *sleepers)
{
    if (atomic_load(sleepers) > 0) futex(word, FUTEX_WAKE, INT_MAX, NULL);
}

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Each staging half's size under these settings. */
static size_t half_of(const smddp__params_t *params)
{
    return align_up((size_t)SMDDP_MAX(params->shm_buffer / 2, SMDDP_SHM_HALF_MIN), 4096);
}

#define LAYOUT_PARTS 9

static void layout(smddp__shm_t *s, int nranks, size_t *sizes)
{
    size_t p = (size_t)nranks;
    sizes[0] = align_up(sizeof(shm_header_t), CACHELINE);
    sizes[1] = p * sizeof(shm_ctrl_t);
    sizes[2] = p * 2 * SMDDP_SHM_META_SIZE;
    sizes[3] = p * sizeof(shm_progress_t);
    sizes[4] = p * p * sizeof(ring_ctrl_t);
    size_t head = sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4];
    sizes[5] = align_up(head, 4096) - head;
    sizes[6] = align_up(p * 2 * SHM_LL_SLOT, 4096);
    sizes[7] = p * 2 * s->half;
    sizes[8] = p * p * s->ring_size;
}

static void assign(smddp__shm_t *s, int nranks)
{
    size_t sizes[LAYOUT_PARTS];
    layout(s, nranks, sizes);
    char *b = s->base;
    s->hdr = (shm_header_t *)b;
    b += sizes[0];
    s->ctrl = (shm_ctrl_t *)b;
    b += sizes[1];
    s->meta = b;
    b += sizes[2];
    s->progress = (shm_progress_t *)b;
    b += sizes[3];
    s->rings = (ring_ctrl_t *)b;
    b += sizes[4] + sizes[5];
    s->ll = b;
    b += sizes[6];
    s->data = b;
    b += sizes[7];
    s->ring_data = b;
}

static size_t total_size(smddp__shm_t *s, int nranks)
{
    size_t sizes[LAYOUT_PARTS], total = 0;
    layout(s, nranks, sizes);
    for (int i = 0; i < LAYOUT_PARTS; i++) total += sizes[i];
    return total;
}

smddp_status_t smddp__shm_random_name(char *out, size_t cap)
{
    unsigned char rnd[16];
    size_t got = 0;
    while (got < sizeof(rnd)) {
        ssize_t n = getrandom(rnd + got, sizeof(rnd) - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return smddp__error(SMDDP_ERR_SYSTEM, "getrandom failed: %s", strerror(errno));
        }
        got += (size_t)n;
    }
    int len = snprintf(out, cap, "/smddp-%d-", (int)getpid());
    for (size_t i = 0; i < sizeof(rnd) && (size_t)len + 2 < cap; i++)
        len += snprintf(out + len, cap - (size_t)len, "%02x", rnd[i]);
    return SMDDP_OK;
}

static smddp_status_t map_segment(smddp__shm_t *s, int fd)
{
    s->base = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s->base == MAP_FAILED) {
        s->base = NULL;
        return smddp__error(SMDDP_ERR_SYSTEM, "mmap of %zu bytes of shared memory %s failed: %s",
                            s->len, s->name, strerror(errno));
    }
    return SMDDP_OK;
}

static smddp_status_t shm_setup(smddp_comm_t comm)
{
    const smddp__params_t *params = smddp__params();
    smddp_status_t st = SMDDP_OK;
    smddp__shm_t *s = calloc(1, sizeof(*s));
    char key[512];
    void *val = NULL;
    size_t vlen = 0;
    int fd = -1;

    if (!s) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate shared-memory state");
    int p = comm->local_size;
    s->half = half_of(params);
    s->ring_size = align_up((size_t)SMDDP_MAX(params->p2p_buffer, 4096), 4096);
    s->len = total_size(s, p);

    /* Until every rank's affinity is known (after the setup barrier): wait politely. */
    s->spin_ns = 1000;
    s->yield_ns = 200 * 1000;

    snprintf(key, sizeof(key), "%s/shm/%d", comm->prefix, comm->node);
    if (comm->local_rank == 0) {
        SMDDP_CHECK_GOTO(smddp__shm_random_name(s->name, sizeof(s->name)), st, fail);
        fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0) {
            st = smddp__error(SMDDP_ERR_SYSTEM, "shm_open(%s) failed: %s", s->name,
                              strerror(errno));
            goto fail;
        }
        if (ftruncate(fd, (off_t)s->len) != 0) {
            st = smddp__error(SMDDP_ERR_SYSTEM,
                              "cannot size shared memory %s to %zu bytes: %s (is /dev/shm full?)",
                              s->name, s->len, strerror(errno));
            goto fail;
        }
        SMDDP_CHECK_GOTO(map_segment(s, fd), st, fail);
        assign(s, p);
        s->hdr->magic = SHM_MAGIC;
        s->hdr->nranks = (uint32_t)p;
        SMDDP_CHECK_GOTO(smddp__store_set(comm->store, key, s->name, strlen(s->name) + 1), st,
                         fail);
    } else {
        SMDDP_CHECK_GOTO(smddp__store_get(comm->store, key, comm->timeout_ms, &val, &vlen), st,
                         fail);
        if (vlen == 0 || vlen > sizeof(s->name) || ((char *)val)[vlen - 1] != '\0' ||
            strncmp(val, "/smddp-", 7) != 0) {
            st = smddp__error(SMDDP_ERR_STORE, "malformed shared-memory name under store key %s",
                              key);
            goto fail;
        }
        memcpy(s->name, val, vlen);
        fd = shm_open(s->name, O_RDWR, 0600);
        if (fd < 0) {
            st = smddp__error(SMDDP_ERR_SYSTEM,
                              "cannot open shared memory %s created by local rank 0: %s",
                              s->name, strerror(errno));
            goto fail;
        }
        struct stat sb;
        if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != s->len) {
            st = smddp__error(SMDDP_ERR_INVALID_ARGUMENT,
                              "shared memory %s has %lld bytes, expected %zu: do all ranks use "
                              "the same SMDDP_SHM_BUFFER_SIZE and SMDDP_P2P_BUFFER_SIZE?",
                              s->name, (long long)sb.st_size, s->len);
            goto fail;
        }
        SMDDP_CHECK_GOTO(map_segment(s, fd), st, fail);
        assign(s, p);
        if (s->hdr->magic != SHM_MAGIC || s->hdr->nranks != (uint32_t)p) {
            st = smddp__error(SMDDP_ERR_INTERNAL, "shared memory %s has a bad header", s->name);
            goto fail;
        }
    }
    close(fd);
    fd = -1;
    atomic_store(&s->ctrl[comm->local_rank].pid, (int32_t)getpid());
    smddp__shm_publish_affinity(&s->ctrl[comm->local_rank]);

    /*
     * A barrier on the segment itself proves every local rank has mapped it;
     * then the name can go, so that nothing is left in /dev/shm even if the
     * job is killed later. On failure the name is removed below.
     */
    comm->shm = s;
    smddp__op_t setup = shm_setup_op(comm);
    st = smddp__shm_sync(comm, &setup);
    if (st < 0) {
        char msg[SMDDP_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", smddp__last_error());
        comm->shm = NULL;
        st = smddp__error(st, "shared-memory setup failed: %s", msg);
        goto fail;
    }
    shm_unlink(s->name);
    free(val);
    comm->shm = s;
    smddp__shm_set_wait_policy(s, p);
    /* Every rank takes the same path for an op: the smallest setting holds (agreed at creation). */
    s->ll_max = (size_t)SMDDP_MIN(SMDDP_MAX(comm->params->shm_ll_max, 0), SHM_LL_PAYLOAD_MAX);
    SMDDP_INFO("rank %d: shared memory %s mapped, %zu bytes (%d local ranks, %zu-byte halves); "
               "waits spin %lld us, then yield %lld us",
               comm->rank, s->name, s->len, p, s->half, (long long)(s->spin_ns / 1000),
               (long long)(s->yield_ns / 1000));
    return SMDDP_OK;

fail:
    if (fd >= 0) close(fd);
    /* Any rank that knows the name removes it, so a failed setup leaves nothing behind. */
    if (s->name[0]) shm_unlink(s->name);
    if (s->base) munmap(s->base, s->len);
    free(val);
    free(s);
    return st;
}

static void shm_teardown(smddp_comm_t comm)
{
    smddp__shm_t *s = comm->shm;
    if (!s) return;
    shm_ctrl_t *me = &s->ctrl[comm->local_rank];
    atomic_store(&me->left, 1);
    /* Wake anyone sleeping on this rank so they notice it left. */
    futex(&me->ctr, FUTEX_WAKE, INT_MAX, NULL);
    munmap(s->base, s->len);
    free(s);
    comm->shm = NULL;
}

static void shm_abort(smddp_comm_t comm, const char *msg)
{
    smddp__shm_t *s = comm->shm;
    if (!s) return;
    /*
     * Claim the flag with the "writing" bit set, write the message, then
     * publish: readers ignore a flag whose message is still being written.
     */
    uint32_t expected = 0, mine = (uint32_t)comm->local_rank + 1;
    if (atomic_compare_exchange_strong(&s->hdr->abort_flag, &expected, mine | ABORT_WRITING)) {
        snprintf(s->hdr->abort_msg, sizeof(s->hdr->abort_msg), "%s", msg);
        atomic_store(&s->hdr->abort_flag, mine);
    }
    /* Sleepers wait on counters and ring ticks: wake them all to see the flag. */
    for (int i = 0; i < comm->local_size; i++) {
        futex(&s->ctrl[i].ctr, FUTEX_WAKE, INT_MAX, NULL);
        for (int j = 0; j < comm->local_size; j++) {
            ring_ctrl_t *r = &s->rings[i * comm->local_size + j];
            futex(&r->tail.tick, FUTEX_WAKE, INT_MAX, NULL);
            futex(&r->head.tick, FUTEX_WAKE, INT_MAX, NULL);
        }
    }
}

const smddp__transport_t smddp__shm_transport = {"shared memory", false, shm_setup, shm_teardown,
                                                 shm_abort};

static bool pid_gone(pid_t pid)
{
    return kill(pid, 0) != 0 && errno == ESRCH;
}

/*
 * True when the process behind local rank lr is gone (or a zombie). A zombie
 * can be reaped between the checks, so a /proc entry that vanished counts.
 */
static bool peer_dead(smddp__shm_t *s, int lr)
{
    pid_t pid = atomic_load(&s->ctrl[lr].pid);
    if (pid <= 0) return false;
    if (pid_gone(pid)) return true;
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pid_gone(pid);
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) return pid_gone(pid);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/* The one wait loop (shm_segment.h): spin, yield, then sleep on `word` in slices. */
smddp_status_t smddp__shm_wait_until(smddp_comm_t comm, smddp__op_t *op, _Atomic uint32_t *word,
                                     _Atomic uint32_t *sleepers, shm_ready_fn ready, void *arg,
                                     int blame, const char *what)
{
    smddp__shm_t *s = comm->shm;
    if (ready(s, arg)) return SMDDP_OK;

    int64_t start = smddp__now_ns();
    int64_t now = start;
    unsigned iter = 0;
    while (now - start < s->spin_ns) {
        for (int i = 0; i < 64; i++) {
            smddp__cpu_relax();
            if (ready(s, arg)) return SMDDP_OK;
        }
        if (comm->pollers.n) SMDDP_CHECK(smddp__pollers_run(&comm->pollers));
        if (atomic_load_explicit(&s->hdr->abort_flag, memory_order_relaxed)) break;
        now = smddp__now_ns();
        iter++;
    }
    while (now - start < s->spin_ns + s->yield_ns) {
        sched_yield();
        if (ready(s, arg)) return SMDDP_OK;
        if (comm->pollers.n) SMDDP_CHECK(smddp__pollers_run(&comm->pollers));
        if (atomic_load_explicit(&s->hdr->abort_flag, memory_order_relaxed)) break;
        now = smddp__now_ns();
    }

    char desc[256];
    int64_t last_check = 0;
    for (;;) {
        if (ready(s, arg)) return SMDDP_OK;
        if (comm->pollers.n) {
            SMDDP_CHECK(smddp__pollers_run(&comm->pollers));
            if (ready(s, arg)) return SMDDP_OK;
        }
        uint32_t flag = atomic_load(&s->hdr->abort_flag);
        if (flag && !(flag & ABORT_WRITING)) {
            smddp__op_describe(op, desc, sizeof(desc));
            int who = (int)flag - 1;
            if (who == comm->local_rank)
                return smddp__error_quiet(SMDDP_ERR_ABORTED, "%s failed: communicator aborted: %s",
                                          desc, comm->abort_msg[0] ? comm->abort_msg : "by this rank");
            return smddp__error_quiet(SMDDP_ERR_ABORTED,
                                      "%s failed: rank %d aborted the communicator: %s", desc,
                                      comm->local_ranks[who], s->hdr->abort_msg);
        }
        if (atomic_load(&comm->aborted)) {
            smddp__op_describe(op, desc, sizeof(desc));
            return smddp__error_quiet(SMDDP_ERR_ABORTED, "%s failed: communicator aborted: %s",
                                      desc, comm->abort_msg);
        }
        now = smddp__now_ns();
        if (now - last_check >= SLICE_NS) {
            last_check = now;
            if (smddp__comm_poll_abort(comm, now, blame >= 0 ? comm->local_ranks[blame] : -1))
                continue;
            if (blame >= 0 && atomic_load(&s->ctrl[blame].left) && !ready(s, arg)) {
                smddp__op_describe(op, desc, sizeof(desc));
                return smddp__error_quiet(SMDDP_ERR_PEER_LOST,
                                          "%s failed: rank %d left (destroyed its communicator) "
                                          "while this rank waited for it to %s",
                                          desc, comm->local_ranks[blame], what);
            }
            if (blame >= 0 && peer_dead(s, blame) && !ready(s, arg)) {
                smddp__op_describe(op, desc, sizeof(desc));
                return smddp__error_quiet(SMDDP_ERR_PEER_LOST,
                                          "%s failed: rank %d (pid %d) died while this rank "
                                          "waited for it to %s", desc,
                                          comm->local_ranks[blame],
                                          (int)atomic_load(&s->ctrl[blame].pid), what);
            }
        }
        if (op->deadline_ns && now >= op->deadline_ns) {
            smddp__op_describe(op, desc, sizeof(desc));
            return smddp__error_quiet(SMDDP_ERR_TIMEOUT,
                                      "%s timed out after %.3f s: rank %d did not %s", desc,
                                      (double)smddp__op_timeout_ms(comm, op) / 1000.0,
                                      blame >= 0 ? comm->local_ranks[blame] : -1, what);
        }
        /* Transfers in flight progress only when polled: sleep briefly between polls. */
        int64_t sleep_ns = comm->pollers.n ? 50 * 1000 : SLICE_NS;
        if (op->deadline_ns && op->deadline_ns - now < sleep_ns) sleep_ns = op->deadline_ns - now;
        if (sleep_ns < 1000) sleep_ns = 1000;
        struct timespec ts = {sleep_ns / 1000000000, sleep_ns % 1000000000};
        atomic_fetch_add(sleepers, 1);
        uint32_t seen = atomic_load(word);
        if (!ready(s, arg)) futex(word, FUTEX_WAIT, seen, &ts);
        atomic_fetch_sub(sleepers, 1);
    }
    (void)iter;
}

typedef struct ctr_arg {
    int lr;
    uint32_t target;
} ctr_arg_t;

static bool ctr_ready(smddp__shm_t *s, void *arg)
{
    const ctr_arg_t *a = arg;
    uint32_t v = atomic_load_explicit(&s->ctrl[a->lr].ctr, memory_order_acquire);
    return (int32_t)(v - a->target) >= 0;
}

uint32_t smddp__shm_post(smddp_comm_t comm)
{
    smddp__shm_t *s = comm->shm;
    shm_ctrl_t *me = &s->ctrl[comm->local_rank];
    uint32_t v = ++s->my_ctr;
    /* seq_cst store, then the sleeper check: pairs with the waiter's increment-then-load. */
    atomic_store(&me->ctr, v);
    smddp__shm_wake(&me->ctr, &me->sleepers);
    return v;
}

smddp_status_t smddp__shm_wait(smddp_comm_t comm, smddp__op_t *op, int lr, uint32_t target)
{
    smddp__shm_t *s = comm->shm;
    ctr_arg_t arg = {lr, target};
    SMDDP_CHECK(smddp__shm_wait_until(comm, op, &s->ctrl[lr].ctr, &s->ctrl[lr].sleepers,
                                      ctr_ready, &arg, lr, "arrive"));
    /*
     * The peer made a post that belongs to this op, so it published what it
     * is running first (its counter store orders the two). A peer already
     * past this op has moved to the other slot; only a same-seq desc counts.
     */
    if (s->op_active && (int32_t)(target - s->op_base) > 0) {
        smddp__op_desc_t theirs;
        if (smddp__shm_read_desc(comm, lr, s->desc.seq, &theirs) &&
            memcmp(&theirs, &s->desc, sizeof(theirs)) != 0)
            return smddp__op_mismatch_error(op, comm->rank, comm->local_ranks[lr], &theirs);
    }
    return SMDDP_OK;
}

/*
 * The desc slots are a seqlock keyed by the seq field: the writer marks the
 * slot as being written, fills it, then stores the seq last. A peer is not
 * always at most one op ahead (an op with count 0 runs no step at all), so a
 * slot can be rewritten for seq + 2 while this rank reads it for seq; the
 * reader then sees the seq change and the desc does not count.
 */
#define DESC_WRITING UINT64_MAX

static _Atomic uint64_t *desc_seq(void *slot)
{
    return (_Atomic uint64_t *)((char *)slot + offsetof(smddp__op_desc_t, seq));
}

bool smddp__shm_read_desc(smddp_comm_t comm, int lr, uint64_t seq, smddp__op_desc_t *out)
{
    void *slot = smddp__shm_meta(comm, lr, (int)(seq & 1));
    uint64_t before = atomic_load_explicit(desc_seq(slot), memory_order_acquire);
    if (before != seq) return false;
    /* volatile: the copy must really read the slot between the two loads of seq. */
    const volatile char *src = slot;
    char *dst = (char *)out;
    for (size_t i = 0; i < sizeof(*out); i++) dst[i] = src[i];
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(desc_seq(slot), memory_order_relaxed) == seq && out->seq == seq;
}

void smddp__shm_op_begin(smddp_comm_t comm, const smddp__op_desc_t *desc, int64_t now_ns)
{
    smddp__shm_t *s = comm->shm;
    s->desc = *desc;
    void *slot = smddp__shm_meta(comm, comm->local_rank, (int)(desc->seq & 1));
    atomic_store_explicit(desc_seq(slot), DESC_WRITING, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    volatile char *dst = slot;
    const char *src = (const char *)desc;
    for (size_t i = offsetof(smddp__op_desc_t, seq) + sizeof(desc->seq); i < sizeof(*desc); i++)
        dst[i] = src[i];
    atomic_store_explicit(desc_seq(slot), desc->seq, memory_order_release);
    s->op_base = s->my_ctr;
    s->op_active = true;

    shm_progress_t *me = &s->progress[comm->local_rank];
    uint64_t tag = desc->seq + 1;
    uint64_t word = (tag << ARRIVAL_NS_BITS) |
                    ((uint64_t)now_ns & ((1ULL << ARRIVAL_NS_BITS) - 1));
    atomic_store_explicit(&me->arrived[desc->seq % ARRIVALS], word, memory_order_relaxed);
    atomic_store_explicit(&me->running, tag, memory_order_release);
}

void smddp__shm_op_end(smddp_comm_t comm, bool ok)
{
    smddp__shm_t *s = comm->shm;
    shm_progress_t *me = &s->progress[comm->local_rank];
    s->op_active = false;
    if (ok) atomic_store_explicit(&me->finished, s->desc.seq + 1, memory_order_release);
    else atomic_store_explicit(&me->failed, s->desc.seq + 1, memory_order_release);
    atomic_store_explicit(&me->running, 0, memory_order_release);
}

int smddp__shm_arrival(smddp_comm_t comm, int lr, uint64_t seq, int64_t *ns)
{
    shm_progress_t *p = &comm->shm->progress[lr];
    uint64_t word = atomic_load_explicit(&p->arrived[seq % ARRIVALS], memory_order_relaxed);
    if (word == 0) return 0;
    /* The tags' distance modulo 2^16: behind (not arrived yet), ahead (slot reused), or it. */
    int16_t ahead = (int16_t)(uint16_t)((word >> ARRIVAL_NS_BITS) - (seq + 1));
    if (ahead < 0) return 0;
    if (ahead > 0) return -1;
    *ns = (int64_t)(word & ((1ULL << ARRIVAL_NS_BITS) - 1));
    return 1;
}

void smddp__shm_position(smddp_comm_t comm, int lr, smddp__shm_position_t *out)
{
    shm_progress_t *p = &comm->shm->progress[lr];
    out->running = atomic_load_explicit(&p->running, memory_order_acquire);
    out->finished = atomic_load_explicit(&p->finished, memory_order_acquire);
    out->failed = atomic_load_explicit(&p->failed, memory_order_acquire);
    out->state = smddp__shm_peer_state(comm, lr);
}

smddp_status_t smddp__shm_timeout_all(smddp_comm_t comm, smddp__op_t *op,
                                      bool (*ready)(smddp__shm_t *s, int lr, const void *arg),
                                      const void *arg)
{
    /* Name every rank that is missing, not just the first one checked. */
    char list[256];
    size_t len = 0;
    list[0] = '\0';
    for (int j = 0; j < comm->local_size; j++) {
        if (j == comm->local_rank || ready(comm->shm, j, arg)) continue;
        len += (size_t)snprintf(list + len, sizeof(list) - SMDDP_MIN(len, sizeof(list)), "%s%d",
                                len ? "," : "", comm->local_ranks[j]);
        if (len >= sizeof(list)) break;
    }
    char desc[256];
    smddp__op_describe(op, desc, sizeof(desc));
    return smddp__error_quiet(SMDDP_ERR_TIMEOUT, "%s timed out after %.3f s waiting for rank(s) %s",
                              desc, (double)smddp__op_timeout_ms(comm, op) / 1000.0, list);
}

static bool ctr_reached(smddp__shm_t *s, int lr, const void *arg)
{
    ctr_arg_t a = {lr, *(const uint32_t *)arg};
    return ctr_ready(s, &a);
}

smddp_status_t smddp__shm_wait_all(smddp_comm_t comm, smddp__op_t *op, uint32_t target)
{
    for (int i = 0; i < comm->local_size; i++) {
        if (i == comm->local_rank) continue;
        smddp_status_t st = smddp__shm_wait(comm, op, i, target);
        if (st == SMDDP_ERR_TIMEOUT) return smddp__shm_timeout_all(comm, op, ctr_reached, &target);
        if (st != SMDDP_OK) return st;
    }
    return SMDDP_OK;
}

smddp_status_t smddp__shm_sync(smddp_comm_t comm, smddp__op_t *op)
{
    uint32_t t = smddp__shm_post(comm);
    return smddp__shm_wait_all(comm, op, t);
}

smddp_status_t smddp__shm_step_begin(smddp_comm_t comm, smddp__op_t *op, int *half)
{
    smddp__shm_t *s = comm->shm;
    int h = s->next_half;
    s->next_half ^= 1;
    *half = h;
    return smddp__shm_wait_all(comm, op, s->free_at[h]);
}

void smddp__shm_step_end(smddp_comm_t comm, int half)
{
    comm->shm->free_at[half] = smddp__shm_post(comm);
}

smddp_status_t smddp__shm_step_wait(smddp_comm_t comm, smddp__op_t *op, int half)
{
    return smddp__shm_wait_all(comm, op, comm->shm->free_at[half]);
}

void *smddp__shm_buf(smddp_comm_t comm, int lr, int half)
{
    smddp__shm_t *s = comm->shm;
    return s->data + ((size_t)lr * 2 + (size_t)half) * s->half;
}

size_t smddp__shm_half_size(smddp_comm_t comm) { return comm->shm->half; }

size_t smddp__shm_default_half(void) { return half_of(smddp__params()); }

void smddp__shm_wait_policy(smddp_comm_t comm, int64_t *spin_ns, int64_t *yield_ns)
{
    *spin_ns = comm->shm->spin_ns;
    *yield_ns = comm->shm->yield_ns;
}

void smddp__shm_segment(smddp_comm_t comm, void **base, size_t *len)
{
    *base = comm->shm->base;
    *len = comm->shm->len;
}

void *smddp__shm_meta(smddp_comm_t comm, int lr, int parity)
{
    smddp__shm_t *s = comm->shm;
    return s->meta + ((size_t)lr * 2 + (size_t)(parity & 1)) * SMDDP_SHM_META_SIZE;
}

_Atomic uint32_t *smddp__shm_words(smddp_comm_t comm, int lr)
{
    return comm->shm->progress[lr].words;
}

int smddp__shm_peer_state(smddp_comm_t comm, int lr)
{
    smddp__shm_t *s = comm->shm;
    if (atomic_load(&s->ctrl[lr].left)) return 2;
    return peer_dead(s, lr) ? 1 : 0;
}

int smddp__shm_abort_flag(smddp_comm_t comm, const char **msg)
{
    smddp__shm_t *s = comm->shm;
    uint32_t flag = atomic_load(&s->hdr->abort_flag);
    if (!flag || (flag & ABORT_WRITING)) return -1;
    if (msg) *msg = s->hdr->abort_msg;
    return comm->local_ranks[flag - 1];
}
