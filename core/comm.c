/*
 * Communicator life cycle: create (topology, the shared-memory segment, the
 * network and its liveness watch across nodes, the progress thread), split
 * and destroy. Abort and the last error are fail.c's.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "cuda/ipc.h"
#include "cuda/nccl.h"
#include "cuda/stage.h"
#include "fail.h"
#include "p2p/p2p.h"
#include "param.h"
#include "queue.h"
#include "select.h"
#include "topo.h"
#include "progress.h"
#include "trace.h"
#include "transport/net.h"
#include "transport/shm.h"
#include "transport/watch.h"

#define TIMEOUT_MAX_MS 1000000000000LL /* see smddp__timeout_ms */

int64_t smddp__timeout_ms(int64_t requested_ms)
{
    return requested_ms > 0 ? SMDDP_MIN(requested_ms, TIMEOUT_MAX_MS) : smddp__params()->timeout_ms;
}

/* ---- creation ------------------------------------------------------------- */

static void comm_free(smddp_comm_t comm)
{
    for (int i = 0; i < SMDDP_SCRATCH_SLOTS; i++) free(comm->scratch[i]);
    free(comm->node_of);
    free(comm->node_ranks);
    free(comm->local_ranks);
    free((void *)comm->seen_dead);
    free(comm->algo_rules);
    free(comm->params);
    smddp__trace_free(comm->trace);
    smddp__progress_free(comm->progress);
    pthread_mutex_destroy(&comm->lock);
    pthread_mutex_destroy(&comm->exec_lock);
    pthread_mutex_destroy(&comm->err_lock);
    pthread_cond_destroy(&comm->cond);
    free(comm);
}

/*
 * What a communicator holds open (transport/transport.h), in the order it
 * sets them up; teardown runs the list backwards, on destroy and on a
 * creation that failed part way. The network registers the segment; the
 * watch says goodbye before anything else closes. CUDA's are in the list
 * only in a build with CUDA.
 */
static const smddp__transport_t *const transports[] = {
    &smddp__shm_transport,
    &smddp__pool_transport, /* inside the segment */
    &smddp__cma_transport,
    &smddp__net_endpoints,
#if SMDDP_HAVE_CUDA
    &smddp__cuda_ipc_transport,
    &smddp__cuda_stage_transport,
    &smddp__nccl_transport,
#endif
    &smddp__watch_transport,
};
enum { N_TRANSPORTS = sizeof(transports) / sizeof(transports[0]) };

static smddp_status_t transports_setup(smddp_comm_t comm)
{
    for (int i = 0; i < N_TRANSPORTS; i++) {
        const smddp__transport_t *t = transports[i];
        if (!t->setup || (t->across_nodes && comm->node_count == 1)) continue;
        SMDDP_TRACE("rank %d: setting up %s", comm->rank, t->name);
        SMDDP_CHECK(t->setup(comm));
    }
    return SMDDP_OK;
}

static void transports_teardown(smddp_comm_t comm)
{
    for (int i = N_TRANSPORTS - 1; i >= 0; i--)
        if (transports[i]->teardown) transports[i]->teardown(comm);
}

/*
 * The topology, and the settings every rank must agree on (param.h), whose
 * records travel with the node names: one exchange for both.
 */
static smddp_status_t discover(smddp_comm_t comm)
{
    size_t len = smddp__params_agree_record(NULL, 0) + 1;
    char *record = malloc(len);
    comm->params = malloc(sizeof(*comm->params));
    if (!record || !comm->params) {
        free(record);
        return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate the settings' record");
    }
    smddp__params_agree_record(record, len);
    smddp_status_t st = smddp__topo_discover(comm, record, comm->params);
    free(record);
    return st;
}

/* SMDDP_ALGO, checked against the registry before anything is set up. */
static smddp_status_t parse_algo_rules(smddp_comm_t comm)
{
    const char *spec = smddp__params()->algo_rules;
    if (!spec[0]) return SMDDP_OK;
    enum { MAX_RULES = 64 };
    comm->algo_rules = calloc(MAX_RULES, sizeof(*comm->algo_rules));
    if (!comm->algo_rules) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate SMDDP_ALGO's rules");
    return smddp__select_parse(spec, comm->algo_rules, MAX_RULES, &comm->n_algo_rules);
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
    smddp__verdicts_init(&comm->verdicts);
    comm->store = store;
    int64_t began = smddp__now_ns();
    smddp__store_counts(store, &comm->store_ops0, &comm->store_bytes0);
    comm->poll_abort = smddp__comm_poll_remote_abort;
    comm->transports = transports;
    comm->n_transports = N_TRANSPORTS;
    snprintf(comm->prefix, sizeof(comm->prefix), "%s", prefix);
    pthread_mutex_init(&comm->lock, NULL);
    pthread_mutex_init(&comm->exec_lock, NULL);
    pthread_mutex_init(&comm->err_lock, NULL);
    pthread_cond_init(&comm->cond, NULL);
    atomic_init(&comm->aborted, 0);
    comm->seen_dead = calloc((size_t)size, sizeof(*comm->seen_dead));
    if (!comm->seen_dead) {
        st = smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate a communicator of %d ranks", size);
        goto fail;
    }

    SMDDP_CHECK_GOTO(parse_algo_rules(comm), st, fail);
    comm->trace = smddp__trace_new();
    SMDDP_CHECK_GOTO(discover(comm), st, fail);
    SMDDP_CHECK_GOTO(smddp__topo_check(comm), st, fail);
    SMDDP_CHECK_GOTO(transports_setup(comm), st, fail_transports);
    comm->progress = smddp__progress_new(comm);
    SMDDP_CHECK_GOTO(smddp__sched_start(comm), st, fail_transports);
    /* Counted before the straggler telemetry's thread starts its clock ping-pongs. */
    comm->create_ns = smddp__now_ns() - began;
    smddp__store_counts(store, &comm->create_store_ops, &comm->create_store_bytes);
    comm->create_store_ops -= comm->store_ops0;
    comm->create_store_bytes -= comm->store_bytes0;
    smddp__progress_start_nodes(comm);

    atomic_fetch_add(&store->refs, 1);
    SMDDP_INFO("communicator %s: rank %d of %d, local rank %d of %d, %d node(s), transports: "
               "shm%s%s%s%s", comm->prefix, comm->rank, comm->size, comm->local_rank,
               comm->local_size, comm->node_count, comm->net ? ", " : "",
               comm->net ? comm->net->name : "", comm->net ? " " : "",
               comm->net ? comm->net->provider(comm->net_ep) : "");
    static atomic_int said_nccl_mode;
    if (smddp__params()->comm_backend == SMDDP_BACKEND_NCCL && !atomic_exchange(&said_nccl_mode, 1))
        SMDDP_INFO("SMDDP_COMMUNICATION_BACKEND=nccl: CUDA collectives go through NCCL; "
                   "host-memory ones stay on smddp's core");
    *out = comm;
    return SMDDP_OK;

fail_transports:
    transports_teardown(comm);
fail:
    comm_free(comm);
    return st;
}

void smddp__comm_costs(smddp_comm_t comm, smddp_comm_stats_t *out)
{
    uint64_t ops, bytes;
    smddp__store_counts(comm->store, &ops, &bytes);
    out->create_ns = comm->create_ns;
    out->create_store_ops = comm->create_store_ops;
    out->create_store_bytes = comm->create_store_bytes;
    out->store_ops = ops - comm->store_ops0;
    out->store_bytes = bytes - comm->store_bytes0;
    out->connections = atomic_load(&comm->connections);
    out->threads = atomic_load(&comm->threads);
}

smddp_status_t smddp__comm_destroy(smddp_comm_t comm)
{
    smddp__sched_stop(comm);
    smddp__progress_stop_nodes(comm);
    smddp__p2p_stop(comm);
    if (comm->net) {
        uint64_t hits, misses;
        bool registering;
        comm->net->mr_stats(comm->net_ep, &hits, &misses, &registering);
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
    /*
     * The threads that look at the watch are gone, so the rank watching this
     * one gets a goodbye first; the network goes before the shared memory
     * its registrations cover.
     */
    transports_teardown(comm);
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
    smddp__op_t *op = smddp__op_make(comm, SMDDP_OP_ALLGATHER, &mine, all, sizeof(mine),
                                     SMDDP_UINT8, SMDDP_SUM, -1);
    if (!op) {
        free(all);
        return SMDDP_ERR_NO_MEMORY;
    }
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

/* ---- shrink --------------------------------------------------------------- */

/* "1,3" for the sorted ranks of excluded (nothing for none). */
static void exclude_text(const bool *excluded, int size, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (int r = 0; r < size && len < cap; r++)
        if (excluded[r]) len += (size_t)snprintf(out + len, cap - len, "%s%d", len ? "," : "", r);
}

smddp_status_t smddp__comm_shrink(smddp_comm_t comm, const bool *excluded, int flags,
                                  smddp_comm_t *out)
{
    *out = NULL;
    if (flags & SMDDP_SHRINK_ABORT) {
        char msg[128];
        snprintf(msg, sizeof(msg), "aborted to shrink the communicator (rank %d)", comm->rank);
        smddp__comm_abort_by_user(comm, msg);
    }
    int new_size = 0, new_rank = 0;
    for (int r = 0; r < comm->size; r++) {
        if (excluded[r]) continue;
        if (r < comm->rank) new_rank++;
        new_size++;
    }
    /*
     * Agreement: every survivor publishes its list under the shrink's number
     * (the same on every survivor: each counts the shrinks of this parent)
     * and reads every other survivor's, by one deadline.
     */
    uint64_t id = atomic_fetch_add(&comm->shrinks, 1);
    char mine[4096], key[512], prefix[512];
    exclude_text(excluded, comm->size, mine, sizeof(mine));
    snprintf(key, sizeof(key), "%s/shrink%llu/r%d", comm->prefix, (unsigned long long)id,
             comm->rank);
    SMDDP_CHECK(smddp__store_set(comm->store, key, mine, strlen(mine) + 1));
    int64_t deadline = smddp__now_ns() + comm->timeout_ms * 1000000LL;
    for (int r = 0; r < comm->size; r++) {
        if (excluded[r] || r == comm->rank) continue;
        snprintf(key, sizeof(key), "%s/shrink%llu/r%d", comm->prefix, (unsigned long long)id, r);
        void *v = NULL;
        size_t len = 0;
        smddp_status_t st;
        /* In slices, so that a survivor that dies meanwhile fails the shrink at once. */
        for (;;) {
            int64_t left_ms = SMDDP_MAX((deadline - smddp__now_ns()) / 1000000, 1);
            st = smddp__store_get(comm->store, key, SMDDP_MIN(left_ms, 100), &v, &len);
            if (st != SMDDP_ERR_TIMEOUT || left_ms <= 100) break;
            if (smddp__comm_peer_state(comm, r) == SMDDP_PEER_GONE)
                return smddp__error(SMDDP_ERR_PEER_LOST,
                                    "smddp_comm_shrink: rank %d died before it joined the "
                                    "shrink; exclude it as well", r);
        }
        if (st == SMDDP_ERR_TIMEOUT)
            return smddp__error(SMDDP_ERR_TIMEOUT,
                                "smddp_comm_shrink: rank %d did not join the shrink within %.3f s "
                                "(every rank not excluded must call it; if rank %d is gone too, "
                                "exclude it as well)", r, (double)comm->timeout_ms / 1000.0, r);
        if (st != SMDDP_OK) return st;
        bool same = len == strlen(mine) + 1 && memcmp(v, mine, len) == 0;
        char theirs[4096];
        snprintf(theirs, sizeof(theirs), "%.*s", (int)SMDDP_MIN(len, sizeof(theirs) - 1),
                 (const char *)v);
        free(v);
        if (!same)
            return smddp__error(SMDDP_ERR_MISMATCH,
                                "smddp_comm_shrink: rank %d excludes [%s] but rank %d excludes "
                                "[%s]; every surviving rank must pass the same ranks", r, theirs,
                                comm->rank, mine);
    }
    int len = snprintf(prefix, sizeof(prefix), "%s/shrink%llu", comm->prefix,
                       (unsigned long long)id);
    if (len < 0 || (size_t)len >= sizeof(comm->prefix))
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED, "communicators shrunk too deeply: store "
                            "prefix %s would exceed %zu characters", prefix,
                            sizeof(comm->prefix) - 1);
    int64_t left_ms = SMDDP_MAX((deadline - smddp__now_ns()) / 1000000, 1);
    return smddp__comm_create(comm->store, new_rank, new_size, prefix,
                              SMDDP_MIN(comm->timeout_ms, left_ms), out);
}

int smddp__comm_peer_state(smddp_comm_t comm, int peer)
{
    if (peer == comm->rank) return SMDDP_PEER_ALIVE;
    if (comm->node_of[peer] == comm->node && comm->shm) {
        for (int lr = 0; lr < comm->local_size; lr++)
            if (comm->local_ranks[lr] == peer) return smddp__shm_peer_state(comm, lr);
    }
    if (!atomic_load(&comm->seen_dead[peer])) {
        /*
         * Asking is what makes the liveness watch look at peer (it connects
         * on demand): a peer whose process ended is seen within the watch's
         * grace, so a caller that asks again and again (survivors agreeing
         * whom to exclude) learns it.
         */
        if (smddp__watch_peer_gone(comm, peer, smddp__now_ns()))
            atomic_store(&comm->seen_dead[peer], true);
    }
    return atomic_load(&comm->seen_dead[peer]) ? SMDDP_PEER_GONE : SMDDP_PEER_UNKNOWN;
}
