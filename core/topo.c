/*
 * Topology: which ranks share a node, found by exchanging node names
 * through the store (with the settings every rank must agree on), and the
 * tables the algorithms index by node and by local rank.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "param.h"
#include "topo.h"

#define HOSTNAME_MAX 256

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

/*
 * The rendezvous is a gather up a tree of ranks and one table down, so that
 * a rank's store calls stay few however large the job (at most FANOUT + 2;
 * they were 3 per rank of the job when every rank read every rank's
 * record), and the store's load grows linearly with the ranks:
 *
 * - Rank lo heads the ranks [lo, hi): the ranks after it, split into up to
 *   FANOUT runs of nearly equal length, each headed by its first rank. A
 *   rank reads what the heads below it published, "<prefix>/host/<head>",
 *   and publishes its own range's records under its own rank.
 * - Rank 0 heads every rank. It checks the records and the settings every
 *   rank must agree on, numbers the nodes by their first rank, and
 *   publishes "<prefix>/topo": the node of every rank and the distinct
 *   settings' records, or the error every rank then returns.
 *
 * A range's value: MAGIC, then 'R' and per rank, in rank order, a 32-bit
 * length and "node name\0settings\0"; or 'E', a 32-bit status and the
 * message (a rank below could not gather its range). The table: MAGIC, 'T',
 * 32-bit node and record counts, the node names and the records, each
 * ending in '\0', and a 32-bit node per rank; or 'E' as above.
 *
 * A head waits for a head below, whose range is h levels deep, for the
 * timeout plus h x LEVEL_MS, so that the rank nearest a missing one gives
 * up first and its message, naming the missing rank, is the one everybody
 * sees.
 */
#define FANOUT 8
#define LEVEL_MS 1000
static const char MAGIC[] = "smddp-rendezvous-1\n";
#define MAGIC_LEN (sizeof(MAGIC) - 1)

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static bool put(buf_t *b, const void *v, size_t len)
{
    if (b->len + len > b->cap) {
        size_t cap = SMDDP_MAX(2 * b->cap, b->len + len + 256);
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, v, len);
    b->len += len;
    return true;
}

static bool put_u32(buf_t *b, uint32_t v) { return put(b, &v, sizeof(v)); }

static uint32_t get_u32(const char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* The first runs' heads of [lo, hi), with their ends: the number of runs. */
static int runs(int lo, int hi, int *head, int *end)
{
    int n = hi - lo - 1, k = SMDDP_MIN(n, FANOUT), at = lo + 1;
    for (int i = 0; i < k; i++) {
        head[i] = at;
        at += n / k + (i < n % k);
        end[i] = at;
    }
    return k;
}

/* Levels below head lo of [lo, hi) (0: it heads itself only). The first run is the longest. */
static int depth(int lo, int hi)
{
    int d = 0;
    while (hi - lo > 1) {
        int head[FANOUT], end[FANOUT];
        runs(lo, hi, head, end);
        lo = head[0];
        hi = end[0];
        d++;
    }
    return d;
}

/* The range rank heads, found from the top. */
static void my_range(int rank, int size, int *lo, int *hi)
{
    *lo = 0;
    *hi = size;
    while (*lo != rank) {
        int head[FANOUT] = {0}, end[FANOUT] = {0}, k = runs(*lo, *hi, head, end), i = 0;
        while (i < k - 1 && rank >= end[i]) i++;
        *lo = head[i];
        *hi = end[i];
    }
}

size_t smddp__topo_record(char *out, size_t cap, const char *node, const char *settings)
{
    size_t nlen = strlen(node) + 1, slen = strlen(settings) + 1;
    uint32_t len = (uint32_t)(nlen + slen);
    size_t need = MAGIC_LEN + 1 + sizeof(len) + len;
    if (need > cap) return need;
    memcpy(out, MAGIC, MAGIC_LEN);
    out[MAGIC_LEN] = 'R';
    memcpy(out + MAGIC_LEN + 1, &len, sizeof(len));
    memcpy(out + MAGIC_LEN + 1 + sizeof(len), node, nlen);
    memcpy(out + MAGIC_LEN + 1 + sizeof(len) + nlen, settings, slen);
    return need;
}

/* Whether p (len bytes) is an error passed on: MAGIC, 'E', a status, a message. */
static bool error_value(const char *p, size_t len)
{
    return len > MAGIC_LEN + 5 && !memcmp(p, MAGIC, MAGIC_LEN) && p[MAGIC_LEN] == 'E' &&
           p[len - 1] == '\0';
}

static bool is_error(const buf_t *b) { return error_value(b->p, b->len); }

/* An error for everybody above and, through the table, every rank. */
static bool put_error(buf_t *b, smddp_status_t st, const char *msg)
{
    b->len = 0;
    return put(b, MAGIC, MAGIC_LEN) && put(b, "E", 1) && put_u32(b, (uint32_t)st) &&
           put(b, msg, strlen(msg) + 1);
}

/*
 * Reads head's range [head, end) into out (its records appended), or turns
 * out into the error to pass on.
 */
static smddp_status_t gather_run(smddp_comm_t comm, int head, int end, buf_t *out)
{
    char key[512], msg[SMDDP_ERRMSG_MAX];
    void *v = NULL;
    size_t len = 0;
    snprintf(key, sizeof(key), "%s/host/%d", comm->prefix, head);
    int64_t wait_ms = comm->timeout_ms + (int64_t)depth(head, end) * LEVEL_MS;
    smddp_status_t st = smddp__store_get(comm->store, key, wait_ms, &v, &len);
    if (st == SMDDP_ERR_TIMEOUT) {
        if (end - head == 1)
            snprintf(msg, sizeof(msg), "communicator creation timed out after %.3f s: rank %d of "
                     "%d did not join (store key %s)", (double)wait_ms / 1000.0, head,
                     comm->size, key);
        else
            snprintf(msg, sizeof(msg), "communicator creation timed out after %.3f s: rank %d of "
                     "%d did not join, or did not hear from one of ranks %d-%d in time (store "
                     "key %s)", (double)wait_ms / 1000.0, head, comm->size, head + 1, end - 1,
                     key);
        return put_error(out, st, msg) ? SMDDP_OK : SMDDP_ERR_NO_MEMORY;
    }
    if (st < 0) return st;
    const char *p = v;
    size_t at = MAGIC_LEN + 1;
    if (error_value(p, len)) { /* passed on as it came */
        out->len = 0;
        bool ok = put(out, p, len);
        free(v);
        return ok ? SMDDP_OK : SMDDP_ERR_NO_MEMORY;
    }
    bool ok = len >= at && !memcmp(p, MAGIC, MAGIC_LEN) && p[MAGIC_LEN] == 'R';
    for (int r = head; ok && r < end; r++) {
        uint32_t n = at + 4 <= len ? get_u32(p + at) : 0;
        ok = n > 0 && at + 4 + n <= len;
        at += 4 + (ok ? n : 0);
    }
    ok = ok && at == len;
    smddp_status_t ret = SMDDP_OK;
    if (ok) {
        if (!put(out, p + MAGIC_LEN + 1, len - MAGIC_LEN - 1)) ret = SMDDP_ERR_NO_MEMORY;
    } else {
        snprintf(msg, sizeof(msg), "communicator creation: rank %d published its node record in "
                 "a form this libsmddp does not read (store key %s): every rank of a "
                 "communicator must run the same libsmddp", head, key);
        if (!put_error(out, SMDDP_ERR_MISMATCH, msg)) ret = SMDDP_ERR_NO_MEMORY;
    }
    free(v);
    return ret;
}

/* Index of s in list[0..*n), added at the end when absent. */
static uint32_t intern(const char **list, uint32_t *n, const char *s)
{
    for (uint32_t i = 0; i < *n; i++)
        if (!strcmp(list[i], s)) return i;
    list[*n] = s;
    return (*n)++;
}

/* Rank 0: the table from every rank's record (all, as gathered), or the error for every rank. */
static smddp_status_t make_table(smddp_comm_t comm, const buf_t *all, buf_t *table)
{
    int n = comm->size;
    const char **hosts = calloc((size_t)n, sizeof(*hosts));
    const char **records = calloc((size_t)n, sizeof(*records));
    const char **nodes = calloc((size_t)n, sizeof(*nodes));
    const char **distinct = calloc((size_t)n, sizeof(*distinct));
    uint32_t *node_of = calloc((size_t)n, sizeof(*node_of));
    smddp__params_t *agreed = malloc(sizeof(*agreed));
    char msg[SMDDP_ERRMSG_MAX] = "";
    smddp_status_t st = SMDDP_OK;
    if (!hosts || !records || !nodes || !distinct || !node_of || !agreed) {
        st = SMDDP_ERR_NO_MEMORY;
        goto out;
    }
    size_t at = MAGIC_LEN + 1;
    for (int r = 0; r < n && !msg[0]; r++) {
        uint32_t len = get_u32(all->p + at); /* checked by gather_run */
        const char *e = all->p + at + 4;
        at += 4 + len;
        size_t nlen = strnlen(e, len) + 1;
        if (nlen > HOSTNAME_MAX || nlen >= len || e[len - 1] != '\0')
            snprintf(msg, sizeof(msg), "malformed node record from rank %d (store key %s/host/%d)",
                     r, comm->prefix, r);
        hosts[r] = e;
        records[r] = e + nlen;
    }
    if (msg[0]) {
        st = put_error(table, SMDDP_ERR_MISMATCH, msg) ? SMDDP_OK : SMDDP_ERR_NO_MEMORY;
        goto out;
    }
    char why[SMDDP_ERRMSG_MAX - 32]; /* room for the words before it */
    smddp_status_t agree = smddp__params_agree(records, n, agreed, why, sizeof(why));
    if (agree < 0) {
        snprintf(msg, sizeof(msg), "communicator creation: %s", why);
        st = put_error(table, agree, msg) ? SMDDP_OK : SMDDP_ERR_NO_MEMORY;
        goto out;
    }
    uint32_t n_nodes = 0, n_records = 0;
    for (int r = 0; r < n; r++) {
        node_of[r] = intern(nodes, &n_nodes, hosts[r]);
        intern(distinct, &n_records, records[r]);
    }
    table->len = 0;
    bool ok = put(table, MAGIC, MAGIC_LEN) && put(table, "T", 1) && put_u32(table, n_nodes) &&
              put_u32(table, n_records);
    for (uint32_t i = 0; ok && i < n_nodes; i++) ok = put(table, nodes[i], strlen(nodes[i]) + 1);
    for (uint32_t i = 0; ok && i < n_records; i++)
        ok = put(table, distinct[i], strlen(distinct[i]) + 1);
    ok = ok && put(table, node_of, (size_t)n * sizeof(*node_of));
    if (!ok) st = SMDDP_ERR_NO_MEMORY;
out:
    free(hosts);
    free(records);
    free(nodes);
    free(distinct);
    free(node_of);
    free(agreed);
    if (st == SMDDP_ERR_NO_MEMORY)
        return smddp__error(st, "cannot allocate the rendezvous table for %d ranks", n);
    return st;
}

/* Every rank: its nodes and agreed settings from the table (or the error in it). */
static smddp_status_t read_table(smddp_comm_t comm, const char *p, size_t len,
                                 smddp__params_t *agreed)
{
    size_t at = MAGIC_LEN + 1;
    if (error_value(p, len))
        return smddp__error((smddp_status_t)(int32_t)get_u32(p + at), "%s", p + at + 4);
    size_t tail = (size_t)comm->size * sizeof(uint32_t);
    bool ok = len >= at + 8 + tail && !memcmp(p, MAGIC, MAGIC_LEN) && p[MAGIC_LEN] == 'T';
    uint32_t n_nodes = ok ? get_u32(p + at) : 0, n_records = ok ? get_u32(p + at + 4) : 0;
    ok = ok && n_nodes >= 1 && n_nodes <= (uint32_t)comm->size && n_records >= 1 &&
         n_records <= (uint32_t)comm->size;
    const char **records = ok ? calloc(n_records, sizeof(*records)) : NULL;
    at += 8;
    for (uint32_t i = 0; records && i < n_nodes + n_records; i++) {
        size_t slen = at < len - tail ? strnlen(p + at, len - tail - at) : 0;
        if (at + slen >= len - tail) { /* no terminator before the nodes */
            free(records);
            records = NULL;
            break;
        }
        if (i >= n_nodes) records[i - n_nodes] = p + at;
        at += slen + 1;
    }
    ok = records && at == len - tail;
    for (int r = 0; ok && r < comm->size; r++) {
        uint32_t node = get_u32(p + at + (size_t)r * 4);
        ok = node < n_nodes;
        comm->node_of[r] = (int)node;
    }
    if (!ok) {
        free(records);
        return smddp__error(SMDDP_ERR_STORE, "communicator creation: the rendezvous table rank 0 "
                            "published (store key %s/topo, %zu bytes) is malformed; every rank "
                            "must run the same libsmddp", comm->prefix, len);
    }
    comm->node_count = (int)n_nodes;
    char why[SMDDP_ERRMSG_MAX];
    smddp_status_t st = smddp__params_agree(records, (int)n_records, agreed, why, sizeof(why));
    free(records);
    if (st < 0) return smddp__error(st, "communicator creation: %s", why);
    return SMDDP_OK;
}

/* The gather and the table: comm->node_of, comm->node_count and *agreed. */
static smddp_status_t rendezvous(smddp_comm_t comm, const char *settings,
                                 smddp__params_t *agreed)
{
    char key[512], host[HOSTNAME_MAX];
    buf_t mine = {0}, table = {0};
    smddp_status_t st = SMDDP_OK;

    /* This rank's range: its own record, then the runs below it. */
    smddp__node_name(host, sizeof(host));
    size_t need = smddp__topo_record(NULL, 0, host, settings);
    mine.p = malloc(need);
    if (!mine.p) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate the node record");
    mine.cap = mine.len = smddp__topo_record(mine.p, need, host, settings);
    int lo, hi, head[FANOUT], end[FANOUT];
    my_range(comm->rank, comm->size, &lo, &hi);
    int k = runs(lo, hi, head, end);
    for (int i = 0; i < k && st == SMDDP_OK && !is_error(&mine); i++)
        st = gather_run(comm, head[i], end[i], &mine);
    if (st == SMDDP_ERR_NO_MEMORY)
        st = smddp__error(st, "cannot allocate the node records of ranks %d-%d", lo, hi - 1);
    if (st < 0) goto out;

    void *v = NULL;
    size_t len = 0;
    if (comm->rank == 0) {
        if (is_error(&mine)) { /* passed on to every rank as the table */
            table = mine;
            mine = (buf_t){0};
        } else {
            SMDDP_CHECK_GOTO(make_table(comm, &mine, &table), st, out);
        }
        snprintf(key, sizeof(key), "%s/topo", comm->prefix);
        SMDDP_CHECK_GOTO(smddp__store_set(comm->store, key, table.p, table.len), st, out);
        st = read_table(comm, table.p, table.len, agreed);
        goto out;
    }
    snprintf(key, sizeof(key), "%s/host/%d", comm->prefix, comm->rank);
    SMDDP_CHECK_GOTO(smddp__store_set(comm->store, key, mine.p, mine.len), st, out);
    snprintf(key, sizeof(key), "%s/topo", comm->prefix);
    int64_t wait_ms = comm->timeout_ms + (int64_t)(depth(0, comm->size) + 1) * LEVEL_MS;
    st = smddp__store_get(comm->store, key, wait_ms, &v, &len);
    if (st == SMDDP_ERR_TIMEOUT) {
        st = smddp__error(SMDDP_ERR_TIMEOUT, "communicator creation timed out after %.3f s: "
                          "rank 0 of %d did not join, or did not publish the rendezvous table "
                          "(store key %s)", (double)wait_ms / 1000.0, comm->size, key);
        goto out;
    }
    if (st < 0) goto out;
    st = read_table(comm, v, len, agreed);
    free(v);
out:
    free(mine.p);
    free(table.p);
    return st;
}

smddp_status_t smddp__topo_discover(smddp_comm_t comm, const char *settings,
                                    smddp__params_t *agreed)
{
    comm->node_of = calloc((size_t)comm->size, sizeof(int));
    comm->local_ranks = calloc((size_t)comm->size, sizeof(int));
    if (!comm->node_of || !comm->local_ranks)
        return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate topology for %d ranks",
                            comm->size);
    SMDDP_CHECK(rendezvous(comm, settings, agreed));
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
        return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate topology for %d ranks",
                            comm->size);
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
    return SMDDP_OK;
}

smddp_status_t smddp__topo_check(smddp_comm_t comm)
{
    if (comm->local_size > SMDDP_MAX_LOCAL)
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "communicator creation: %d of its %d ranks share node %d (this rank's "
                            "node); at most %d ranks per node are supported",
                            comm->local_size, comm->size, comm->node, SMDDP_MAX_LOCAL);
    return SMDDP_OK;
}

int smddp__local_index(smddp_comm_t comm, int rank)
{
    for (int i = 0; i < comm->local_size; i++)
        if (comm->local_ranks[i] == rank) return i;
    return -1;
}
