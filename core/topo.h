/*
 * Topology (topo.c): the ranks of a communicator grouped into nodes.
 */
#ifndef SMDDP_CORE_TOPO_H
#define SMDDP_CORE_TOPO_H

#include "comm.h"

/* This process's node name (SMDDP_HOSTNAME, else the host name). */
void smddp__node_name(char *out, size_t cap);

/*
 * Exchanges node names through comm's store and fills comm's topology:
 * node_count, node, node_of, local_rank, local_size, local_ranks, and
 * node_ranks when every node holds as many ranks. attach (a string) travels
 * with this rank's node name; on success *attached holds every rank's, in
 * rank order (free with smddp__topo_attached_free), at no extra store
 * operation.
 */
smddp_status_t smddp__topo_discover(smddp_comm_t comm, const char *attach, char ***attached);
void smddp__topo_attached_free(char **attached, int n);

/*
 * The most ranks one node may hold: the algorithms inside a node keep a
 * table of every local rank's buffer on the stack.
 */
#define SMDDP_MAX_LOCAL 256

/*
 * The limits a communicator's topology must meet, checked once at creation
 * rather than in every collective: SMDDP_ERR_NOT_SUPPORTED saying which.
 */
smddp_status_t smddp__topo_check(smddp_comm_t comm);

/* Local index of a comm rank on this node, or -1. */
int smddp__local_index(smddp_comm_t comm, int rank);

#endif /* SMDDP_CORE_TOPO_H */
