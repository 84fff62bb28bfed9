/*
 * What a communicator holds open, as the communicator sees it: one table per
 * transport (shared memory and what lives in its segment, the network, CUDA
 * IPC, CUDA staging, NCCL, the liveness watch), each defined next to its
 * code with its state in a struct of its own. comm.c lists the tables in
 * the order they are set up; a transport this build lacks is a table that
 * is absent from that list. The calls an algorithm makes on a transport are
 * that transport's own (shm.h, net.h, cuda/cuda.h).
 */
#ifndef SMDDP_CORE_TRANSPORT_H
#define SMDDP_CORE_TRANSPORT_H

#include "../comm.h"

typedef struct smddp__transport {
    const char *name;
    bool across_nodes; /* set up only in a communicator that spans nodes */
    /*
     * At creation, collective over the ranks that take part (NULL: set up by
     * the first op that needs it). On failure holds nothing.
     */
    smddp_status_t (*setup)(smddp_comm_t comm);
    /*
     * On destroy and after a creation that failed part way, in the list's
     * reverse order: safe for what was never set up, or set up already torn
     * down. NULL: nothing to tear down.
     */
    void (*teardown)(smddp_comm_t comm);
    /*
     * The communicator was aborted (msg: the first failure's message): wakes
     * whatever of this transport waits for peers. Any thread, err_lock not
     * held, once per smddp__comm_abort call. NULL: its waits see
     * comm->aborted by themselves.
     */
    void (*abort)(smddp_comm_t comm, const char *msg);
} smddp__transport_t;

#endif /* SMDDP_CORE_TRANSPORT_H */
