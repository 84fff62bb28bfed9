/*
 * Communicator lifecycle: rendezvous through the store, grouping ranks into
 * nodes, the shared-memory segment, the progress thread; split, abort and
 * destroy.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "coll/coll.h"
#include "cuda/nccl.h"
#include "cuda/stage.h"
#include "param.h"
#include "transport/ofi.h"
#include "transport/watch.h"
#include "transport/shm.h"

#define HOSTNAME_MAX 256

const char *smddp__op_kind_name(smddp__op_kind_t kind)
{
    static const char *const names[] = {
        "allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall",
        "alltoallv", "gather",  "scatter",   "barrier",   "send",           "recv",
    };
    return (unsigned)kind < SMDDP_OP_KIND_COUNT ? names[kind] : "unknown";
}

void smddp__op_describe(const smddp__op_t *op, char *buf, size_t cap)
{
    const char *name = smddp__op_kind_name(op->kind);
    switch (op->kind) {
    case SMDDP_OP_BARRIER:
        snprintf(buf, cap, "barrier (seq %" PRIu64 ")", op->seq);
        break;
    case SMDDP_OP_SEND:
    case SMDDP_OP_RECV:
        if (op->root < 0) {
            snprintf(buf, cap, "%s (from any rank, tag %d, count %zu, %s)", name, op->tag,
                     op->count, smddp_dtype_name(op->dtype));
            break;
        }
        snprintf(buf, cap, "%s (%s rank %d, message %" PRIu64 ", tag %d, count %zu, %s)", name,
                 op->kind == SMDDP_OP_SEND ? "to" : "from", op->root, op->seq, op->tag, op->count,
                 smddp_dtype_name(op->dtype));
        break;
    case SMDDP_OP_ALLREDUCE:
    case SMDDP_OP_REDUCE:
    case SMDDP_OP_REDUCE_SCATTER:
        snprintf(buf, cap, "%s (seq %" PRIu64 ", count %zu, %s, %s)", name, op->seq, op->count,
                 smddp_dtype_name(op->dtype), smddp_op_name(op->spec.op));
        break;
    default:
        snprintf(buf, cap, "%s (seq %" PRIu64 ", count %zu, %s)", name, op->seq, op->count,
                 smddp_dtype_name(op->dtype));
        break;
    }
    size_t used = strlen(buf);
    if (op->mem_type == SMDDP_MEM_CUDA && used < cap)
        snprintf(buf + used, cap - used, " on CUDA memory");
}

/* ---- store access --------------------------------------------------------- */

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

#define TIMEOUT_MAX_MS 1000000000000LL /* see smddp__timeout_ms */

int64_t smddp__timeout_ms(int64_t requested_ms)
{
    return requested_ms > 0 ? SMDDP_MIN(requested_ms, TIMEOUT_MAX_MS) : smddp__params()->timeout_ms;
}

static void store_lock(smddp__store_ref_t *s)
{
    atomic_fetch_add(&s->queued, 1);
    pthread_mutex_lock(&s->lock);
    atomic_fetch_sub(&s->queued, 1);
}

smddp_status_t smddp__store_set(smddp__store_ref_t *s, const char *key, const void *v, size_t len)
{
    smddp__clear_error();
    store_lock(s);
    smddp_status_t st = s->table.set(s->table.ctx, key, v, len);
    pthread_mutex_unlock(&s->lock);
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
        store_lock(s);
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
    store_lock(s);
    smddp_status_t st = s->table.add(s->table.ctx, key, delta, result);
    pthread_mutex_unlock(&s->lock);
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

/* ---- creation ------------------------------------------------------------- */

void smddp__node_name(char *out, size_t cap)
{
    const smddp__params_t *params = smddp__params();
    if (params->hostname[0]) {
        snprintf(out, cap, "%s", params->hostname);
        return;
    }
    if (gethostname(out, cap) != 0) snprintf(out, cap, "localhost");
    out[cap - 1] = '\0';
}

/* Exchanges node names through the store and fills the topology fields. */
static smddp_status_t discover_topology(smddp_comm_t comm)
{
    char key[512], mine[HOSTNAME_MAX];
    char(*names)[HOSTNAME_MAX] = NULL;
    smddp_status_t st = SMDDP_OK;

    smddp__node_name(mine, sizeof(mine));
    snprintf(key, sizeof(key), "%s/host/%d", comm->prefix, comm->rank);
    SMDDP_CHECK(smddp__store_set(comm->store, key, mine, strlen(mine) + 1));

    names = calloc((size_t)comm->size, sizeof(*names));
    comm->node_of = calloc((size_t)comm->size, sizeof(int));
    comm->local_ranks = calloc((size_t)comm->size, sizeof(int));
    if (!names || !comm->node_of || !comm->local_ranks) {
        st = smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate topology for %d ranks", comm->size);
        goto out;
    }
    for (int r = 0; r < comm->size; r++) {
        void *v;
        size_t len;
        snprintf(key, sizeof(key), "%s/host/%d", comm->prefix, r);
        st = smddp__store_get(comm->store, key, comm->timeout_ms, &v, &len);
        if (st == SMDDP_ERR_TIMEOUT) {
            st = smddp__error(SMDDP_ERR_TIMEOUT,
                              "communicator creation timed out after %.3f s: rank %d of %d did "
                              "not join (store key %s)",
                              (double)comm->timeout_ms / 1000.0, r, comm->size, key);
            goto out;
        }
        if (st < 0) goto out;
        if (len == 0 || len > HOSTNAME_MAX || ((char *)v)[len - 1] != '\0') {
            free(v);
            st = smddp__error(SMDDP_ERR_STORE, "malformed node name from rank %d (store key %s)", r,
                              key);
            goto out;
        }
        memcpy(names[r], v, len);
        free(v);
    }
    comm->node_count = 0;
    for (int r = 0; r < comm->size; r++) {
        int node = -1;
        for (int q = 0; q < r && node < 0; q++)
            if (strcmp(names[q], names[r]) == 0) node = comm->node_of[q];
        comm->node_of[r] = node >= 0 ? node : comm->node_count++;
    }
    comm->node = comm->node_of[comm->rank];
    comm->local_size = 0;
    for (int r = 0; r < comm->size; r++) {
        if (comm->node_of[r] != comm->node) continue;
        if (r == comm->rank) comm->local_rank = comm->local_size;
        comm->local_ranks[comm->local_size++] = r;
    }
    /* The node table, for the hierarchical algorithms: only when nodes are alike. */
    int *filled = calloc((size_t)comm->node_count, sizeof(int));
    comm->node_ranks = calloc((size_t)comm->size, sizeof(int));
    if (!filled || !comm->node_ranks) {
        free(filled);
        st = smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate topology for %d ranks", comm->size);
        goto out;
    }
    bool alike = true;
    for (int r = 0; r < comm->size && alike; r++) {
        int node = comm->node_of[r];
        if (filled[node] == comm->local_size) alike = false;
        else comm->node_ranks[node * comm->local_size + filled[node]++] = r;
    }
    for (int n = 0; n < comm->node_count && alike; n++) alike = filled[n] == comm->local_size;
    free(filled);
    if (!alike) {
        free(comm->node_ranks);
        comm->node_ranks = NULL;
    }
out:
    free(names);
    return st;
}

static void comm_free(smddp_comm_t comm)
{
    for (int i = 0; i < SMDDP_SCRATCH_SLOTS; i++) free(comm->scratch[i]);
    free(comm->node_of);
    free(comm->node_ranks);
    free(comm->local_ranks);
    free(comm->p2p_send_seq);
    free(comm->p2p_recv_seq);
    pthread_mutex_destroy(&comm->lock);
    pthread_mutex_destroy(&comm->exec_lock);
    pthread_mutex_destroy(&comm->err_lock);
    pthread_mutex_destroy(&comm->stage_lock);
    pthread_cond_destroy(&comm->cond);
    free(comm);
}

smddp_status_t smddp__comm_create(smddp__store_ref_t *store, int rank, int size,
                                  const char *prefix, int64_t timeout_ms, smddp_comm_t *out)
{
    smddp_status_t st;
    smddp_comm_t comm = calloc(1, sizeof(*comm));
    if (!comm) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate a communicator");
    comm->rank = rank;
    comm->size = size;
    comm->timeout_ms = timeout_ms;
    comm->cuda_nccl_everywhere = -1;
    comm->store = store;
    snprintf(comm->prefix, sizeof(comm->prefix), "%s", prefix);
    pthread_mutex_init(&comm->lock, NULL);
    pthread_mutex_init(&comm->exec_lock, NULL);
    pthread_mutex_init(&comm->err_lock, NULL);
    pthread_mutex_init(&comm->stage_lock, NULL);
    pthread_cond_init(&comm->cond, NULL);
    atomic_init(&comm->aborted, 0);
    comm->p2p_send_seq = calloc((size_t)size, sizeof(uint64_t));
    comm->p2p_recv_seq = calloc((size_t)size, sizeof(uint64_t));
    if (!comm->p2p_send_seq || !comm->p2p_recv_seq) {
        st = smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate a communicator of %d ranks", size);
        goto fail;
    }

    SMDDP_CHECK_GOTO(discover_topology(comm), st, fail);
    SMDDP_CHECK_GOTO(smddp__shm_setup(comm), st, fail);
    if (comm->node_count > 1) {
        SMDDP_CHECK_GOTO(smddp__ofi_setup(comm), st, fail_shm);
        SMDDP_CHECK_GOTO(smddp__watch_open(comm), st, fail_shm);
    }
    SMDDP_CHECK_GOTO(smddp__sched_start(comm), st, fail_shm);

    atomic_fetch_add(&store->refs, 1);
    SMDDP_INFO("communicator %s: rank %d of %d, local rank %d of %d, %d node(s), transports: "
               "shm%s%s", comm->prefix, comm->rank, comm->size, comm->local_rank,
               comm->local_size, comm->node_count, comm->ofi ? ", ofi " : "",
               comm->ofi ? smddp__ofi_provider(comm) : "");
    static atomic_int said_nccl_mode;
    if (smddp__params()->comm_backend == 1 && !atomic_exchange(&said_nccl_mode, 1))
        SMDDP_INFO("SMDDP_COMMUNICATION_BACKEND=nccl: CUDA collectives go through NCCL; "
                   "host-memory ones stay on smddp's core");
    *out = comm;
    return SMDDP_OK;

fail_shm:
    smddp__watch_close(comm);
    smddp__ofi_teardown(comm);
    smddp__shm_teardown(comm);
fail:
    comm_free(comm);
    return st;
}

void smddp__comm_set_last_error(smddp_comm_t comm, const char *msg)
{
    pthread_mutex_lock(&comm->err_lock);
    snprintf(comm->last_error, sizeof(comm->last_error), "%s", msg);
    pthread_mutex_unlock(&comm->err_lock);
}

void smddp__comm_abort(smddp_comm_t comm, smddp_status_t status, const char *msg)
{
    /*
     * The first failure's message is the one every later op reports; it is
     * written before the flag, which is read without err_lock.
     */
    pthread_mutex_lock(&comm->err_lock);
    if (!atomic_load(&comm->aborted)) {
        snprintf(comm->abort_msg, sizeof(comm->abort_msg), "%s", msg);
        comm->abort_status = status;
        atomic_store(&comm->aborted, 1);
    }
    pthread_mutex_unlock(&comm->err_lock);
    char shared[SMDDP_ERRMSG_MAX];
    snprintf(shared, sizeof(shared), "%s", comm->abort_msg);
    smddp__shm_abort(comm, shared);
}

void smddp__comm_adopt_peer_abort(smddp_comm_t comm)
{
    const char *peer_msg = NULL;
    int peer = comm->shm ? smddp__shm_abort_flag(comm, &peer_msg) : -1;
    if (peer < 0 || atomic_load(&comm->aborted)) return;
    char msg[SMDDP_ERRMSG_MAX];
    snprintf(msg, sizeof(msg), "rank %d aborted the communicator: %s", peer, peer_msg);
    smddp__comm_abort(comm, SMDDP_ERR_ABORTED, msg);
}

#define REMOTE_ABORT_POLL_NS (500 * 1000000LL)

/* Store calls on the abort path must not replace the error the caller reports. */
typedef struct saved_error {
    char msg[SMDDP_ERRMSG_MAX];
} saved_error_t;

static void save_error(saved_error_t *e) { snprintf(e->msg, sizeof(e->msg), "%s", smddp__last_error()); }

static void restore_error(const saved_error_t *e)
{
    smddp__clear_error();
    if (e->msg[0]) smddp__error_quiet(SMDDP_ERR_INTERNAL, "%s", e->msg);
}

/* How long smddp_comm_abort waits for the store's lock before giving up telling other nodes. */
#define ABORT_STORE_WAIT_MS 500

/* Takes s's lock, giving up after ms (a get in progress lets go within 400 ms). */
static bool store_lock_within(smddp__store_ref_t *s, int64_t ms)
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

/*
 * Tells the ranks of other nodes, which poll the store while they wait, why
 * this one failed. With bounded, waits at most ABORT_STORE_WAIT_MS for the
 * store's lock: smddp_comm_abort must not hang behind a store call that
 * hangs, or deadlock with a thread that holds the store while it waits for
 * something the caller holds (a Python store and the GIL).
 */
static void publish_abort(smddp_comm_t comm, bool bounded)
{
    if (comm->node_count < 2) return;
    smddp__store_ref_t *s = comm->store;
    char key[320], msg[SMDDP_ERRMSG_MAX + 32];
    int64_t n;
    saved_error_t saved;
    save_error(&saved);
    int len = snprintf(msg, sizeof(msg), "rank %d: %s", comm->rank, comm->abort_msg);
    if (len < 0 || len >= (int)sizeof(msg)) len = (int)sizeof(msg) - 1;
    if (bounded) {
        if (!store_lock_within(s, ABORT_STORE_WAIT_MS)) {
            SMDDP_INFO("rank %d: the store stayed busy for %d ms: other nodes learn of this "
                       "abort only at their deadline", comm->rank, ABORT_STORE_WAIT_MS);
            return;
        }
    } else {
        store_lock(s);
    }
    /* The message first, then the count that pollers read without blocking. */
    snprintf(key, sizeof(key), "%s/abort/msg", comm->prefix);
    if (s->table.set(s->table.ctx, key, msg, (size_t)len + 1) >= 0) {
        snprintf(key, sizeof(key), "%s/abort/count", comm->prefix);
        (void)s->table.add(s->table.ctx, key, 1, &n);
    }
    pthread_mutex_unlock(&s->lock);
    restore_error(&saved);
}

void smddp__comm_fail(smddp_comm_t comm, smddp_status_t status, const char *msg)
{
    smddp__comm_abort(comm, status, msg);
    /* An abort adopted from another rank was published by that rank. */
    if (comm->abort_status != SMDDP_ERR_ABORTED) publish_abort(comm, false);
}

void smddp__comm_abort_by_user(smddp_comm_t comm, const char *msg)
{
    bool first = !atomic_load(&comm->aborted);
    smddp__comm_abort(comm, SMDDP_ERR_ABORTED, msg);
    if (first) publish_abort(comm, true); /* shared memory told this node's ranks */
}

bool smddp__comm_poll_remote_abort(smddp_comm_t comm, int64_t now_ns, int waiting_for)
{
    if (atomic_load(&comm->aborted)) return true;
    if (comm->node_count < 2) return false;
    int64_t last = atomic_load(&comm->remote_abort_polled_ns);
    if (last == 0) {
        /* The first call of an op only starts the clock: quick ops never ask. */
        atomic_store(&comm->remote_abort_polled_ns, now_ns);
        return false;
    }
    if (now_ns - last < REMOTE_ABORT_POLL_NS) return false;
    atomic_store(&comm->remote_abort_polled_ns, now_ns);
    saved_error_t before;
    char gone[SMDDP_ERRMSG_MAX];
    save_error(&before);
    int dead = smddp__watch_dead(comm, now_ns, waiting_for, gone, sizeof(gone));
    restore_error(&before);
    if (dead >= 0) {
        smddp__comm_fail(comm, SMDDP_ERR_PEER_LOST, gone);
        return true;
    }
    char key[320];
    int64_t count = 0;
    void *v = NULL;
    size_t len = 0;
    saved_error_t saved;
    save_error(&saved);
    snprintf(key, sizeof(key), "%s/abort/count", comm->prefix);
    /* Adding 0 reads the count without waiting. */
    smddp_status_t st = smddp__store_add(comm->store, key, 0, &count);
    if (st == SMDDP_OK && count > 0) {
        snprintf(key, sizeof(key), "%s/abort/msg", comm->prefix);
        st = smddp__store_get(comm->store, key, 1000, &v, &len);
    }
    char why[SMDDP_ERRMSG_MAX / 2];
    snprintf(why, sizeof(why), "%s", smddp__last_error());
    restore_error(&saved);
    if (st != SMDDP_OK) {
        /*
         * The store's host is gone (usually after failing itself): nothing can be
         * coordinated any more, and whoever this rank waits for is not coming.
         */
        char msg[SMDDP_ERRMSG_MAX];
        char peer[48] = "another rank";
        if (waiting_for >= 0) snprintf(peer, sizeof(peer), "rank %d", waiting_for);
        snprintf(msg, sizeof(msg), "while this rank waited for %s, the job's store stopped "
                 "answering (its host has probably failed): %s", peer, why);
        smddp__comm_abort(comm, SMDDP_ERR_PEER_LOST, msg);
        return true;
    }
    if (count <= 0) return false;
    char msg[SMDDP_ERRMSG_MAX];
    snprintf(msg, sizeof(msg), "%.*s (aborted on another node)", (int)(len ? len - 1 : 0),
             (const char *)v);
    free(v);
    smddp__comm_abort(comm, SMDDP_ERR_ABORTED, msg);
    return true;
}

smddp_status_t smddp__comm_destroy(smddp_comm_t comm)
{
    smddp__sched_stop(comm);
    smddp__p2p_stop(comm);
    /* The threads that look at the watch are gone; the rank watching this one gets a goodbye. */
    smddp__watch_close(comm);
    smddp__nccl_teardown(comm);
    smddp__cuda_stage_teardown(comm);
    smddp__cuda_teardown(comm);
    if (comm->ofi) {
        uint64_t hits, misses;
        bool registering;
        smddp__ofi_mr_stats(comm, &hits, &misses, &registering);
        if (registering)
            SMDDP_INFO("communicator %s: rank %d registered %llu buffer ranges with the network "
                       "and found %llu transfers' buffers already registered", comm->prefix,
                       comm->rank, (unsigned long long)misses, (unsigned long long)hits);
        SMDDP_INFO("communicator %s: in collectives, rank %d sent %llu bytes over the network, "
                   "%llu of them to ranks on its own node, and staged %llu bytes in shared memory "
                   "for its node's ranks; %llu ring steps completed while it worked in shared "
                   "memory", comm->prefix, comm->rank,
                   (unsigned long long)comm->net_bytes, (unsigned long long)comm->net_bytes_local,
                   (unsigned long long)comm->shm_bytes,
                   (unsigned long long)comm->net_steps_overlapped);
    }
    /* The network first: its registrations cover the shm segment. */
    smddp__ofi_teardown(comm);
    smddp__shm_teardown(comm);
    smddp__store_unref(comm->store);
    comm_free(comm);
    return SMDDP_OK;
}

/* ---- split ---------------------------------------------------------------- */

typedef struct split_entry {
    int32_t color;
    int32_t key;
} split_entry_t;

smddp_status_t smddp__comm_split(smddp_comm_t comm, int color, int key, smddp_comm_t *out)
{
    split_entry_t mine = {color, key};
    split_entry_t *all = calloc((size_t)comm->size, sizeof(*all));
    smddp_status_t st;
    if (!all) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate split table");

    /* The colours travel by an ordinary allgather, so split keeps issue order. */
    smddp__op_t *op = smddp__op_new(comm, SMDDP_OP_ALLGATHER);
    if (!op) {
        free(all);
        return SMDDP_ERR_NO_MEMORY;
    }
    op->sendbuf = &mine;
    op->recvbuf = all;
    op->count = sizeof(mine);
    op->dtype = SMDDP_UINT8;
    /*
     * The allgather's sequence number names the split: the same on every
     * rank, also when threads split one parent at once (a counter bumped
     * here could be bumped in another order on another rank). A reference of
     * our own keeps op readable after the blocking call drops its own.
     */
    atomic_fetch_add(&op->refs, 1);
    st = smddp__submit(comm, op, NULL);
    uint64_t split_id = op->seq;
    smddp__request_unref(op);
    if (st != SMDDP_OK) goto out;
    if (color == SMDDP_SPLIT_NOCOLOR) {
        *out = NULL;
        st = SMDDP_OK;
        goto out;
    }
    /* New rank = position by (key, parent rank) among ranks of my colour. */
    int new_rank = 0, new_size = 0;
    for (int r = 0; r < comm->size; r++) {
        if (all[r].color != color) continue;
        new_size++;
        if (all[r].key < key || (all[r].key == key && r < comm->rank)) new_rank++;
    }
    char prefix[512];
    int len = snprintf(prefix, sizeof(prefix), "%s/split%" PRIu64 "/%d", comm->prefix, split_id,
                       color);
    if (len < 0 || (size_t)len >= sizeof(comm->prefix)) {
        st = smddp__error(SMDDP_ERR_NOT_SUPPORTED, "communicators split too deeply: store prefix "
                          "%s would exceed %zu characters", prefix, sizeof(comm->prefix) - 1);
        goto out;
    }
    st = smddp__comm_create(comm->store, new_rank, new_size, prefix, comm->timeout_ms, out);
out:
    free(all);
    return st;
}
