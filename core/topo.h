/*
 * Topology (topo.c): the ranks of a communicator grouped into nodes.
 */
#ifndef SMDDP_CORE_TOPO_H
#define SMDDP_CORE_TOPO_H

#include "comm.h"
#include "param.h"

/* This process's node name (SMDDP_HOSTNAME, else the host name). */
void smddp__node_name(char *out, size_t cap);

/*
 * The rendezvous: exchanges node names and the settings' agreement records
 * (smddp__params_agree_record) through comm's store, fills comm's topology
 * (node_count, node, node_of, local_rank, local_size, local_ranks, and
 * node_ranks when every node holds as many ranks), and the settings every
 * rank agreed on into *agreed. Every rank returns the same error when a
 * rank is missing or the ranks disagree.
 */
smddp_status_t smddp__topo_discover(smddp_comm_t comm, const char *settings,
                                    smddp__params_t *agreed);

/*
 * The value a rank heading no other publishes under "<prefix>/host/<rank>"
 * (for tests that act as a rank): the length it needs; written when cap
 * holds it.
 */
size_t smddp__topo_record(char *out, size_t cap, const char *node, const char *settings);

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
