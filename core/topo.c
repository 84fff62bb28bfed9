/*
 * Topology: which ranks share a node, found by exchanging node names
 * through the store, and the tables the algorithms index by node and by
 * local rank.
 */
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

/* Exchanges node names through the store and fills the topology fields. */
void smddp__topo_attached_free(char **attached, int n)
{
    for (int r = 0; attached && r < n; r++) free(attached[r]);
    free(attached);
}

smddp_status_t smddp__topo_discover(smddp_comm_t comm, const char *attach, char ***attached)
{
    char key[512], host[HOSTNAME_MAX];
    char(*names)[HOSTNAME_MAX] = NULL;
    char **all = NULL;
    smddp_status_t st = SMDDP_OK;

    /* "node name\0attach\0" */
    smddp__node_name(host, sizeof(host));
    size_t hlen = strlen(host) + 1, alen = strlen(attach) + 1;
    char *mine = malloc(hlen + alen);
    if (!mine) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate the node record");
    memcpy(mine, host, hlen);
    memcpy(mine + hlen, attach, alen);
    snprintf(key, sizeof(key), "%s/host/%d", comm->prefix, comm->rank);
    st = smddp__store_set(comm->store, key, mine, hlen + alen);
    free(mine);
    SMDDP_CHECK(st);

    names = calloc((size_t)comm->size, sizeof(*names));
    all = calloc((size_t)comm->size, sizeof(*all));
    comm->node_of = calloc((size_t)comm->size, sizeof(int));
    comm->local_ranks = calloc((size_t)comm->size, sizeof(int));
    if (!names || !all || !comm->node_of || !comm->local_ranks) {
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
        size_t nlen = len ? strnlen(v, len) + 1 : 0;
        if (nlen == len && nlen <= HOSTNAME_MAX && ((char *)v)[len - 1] == '\0') {
            free(v);
            st = smddp__error(SMDDP_ERR_MISMATCH, "rank %d published its node name without the "
                              "settings its ranks agree on (store key %s): every rank of a "
                              "communicator must run the same libsmddp", r, key);
            goto out;
        }
        if (len == 0 || nlen > HOSTNAME_MAX || nlen >= len || ((char *)v)[len - 1] != '\0') {
            free(v);
            st = smddp__error(SMDDP_ERR_STORE, "malformed node record from rank %d (store key %s)",
                              r, key);
            goto out;
        }
        memcpy(names[r], v, nlen);
        all[r] = strdup((char *)v + nlen);
        free(v);
        if (!all[r]) {
            st = smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate rank %d's node record", r);
            goto out;
        }
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
    if (st == SMDDP_OK) *attached = all;
    else smddp__topo_attached_free(all, comm->size);
    return st;
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
