/* The state every hierarchical op allocates (hier.h). */
#include <stdlib.h>

#include "hier.h"

/* The ring of local rank lr's counterparts, one per node (ranks holds node_count). */
static smddp__ring_t counterparts(smddp_comm_t comm, int lr, int *ranks)
{
    for (int n = 0; n < comm->node_count; n++) ranks[n] = smddp__hier_at(comm, n, lr);
    return (smddp__ring_t){.p = comm->node_count, .me = comm->node, .ranks = ranks};
}

void smddp__hier_free(smddp__hier_t *h)
{
    free(h->ranks);
    free(h->off);
    free(h->len);
    free(h->tmp);
}

smddp_status_t smddp__hier_init(smddp_comm_t comm, smddp__hier_t *h, int lr, size_t tmp_bytes)
{
    size_t n = (size_t)comm->node_count;
    h->ranks = malloc(n * sizeof(int));
    h->off = calloc(n, sizeof(size_t));
    h->len = calloc(n, sizeof(size_t));
    h->tmp = malloc(tmp_bytes + 64);
    if (!h->ranks || !h->off || !h->len || !h->tmp) {
        smddp__hier_free(h);
        return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes of scratch",
                            tmp_bytes);
    }
    h->ring = counterparts(comm, lr, h->ranks);
    return SMDDP_OK;
}
