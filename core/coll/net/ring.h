/*
 * Building blocks of the collectives across nodes (ring.c), shared by the
 * flat algorithms (coll/net/) and the hierarchical ones (coll/hier/).
 */
#ifndef SMDDP_CORE_RING_H
#define SMDDP_CORE_RING_H

#include "../../reduce/half.h"
#include "../../reduce/reduce.h"
#include "../../transport/net.h"
#include "../../comm.h"

/* The most local sources a fused ring task combines (coll/hier/'s MAX_LOCAL). */
#define SMDDP_NET_MAX_FUSE 256

/* A group that a ring or chain runs over: member i is comm rank ranks[i] (NULL: i). */
typedef struct smddp__ring {
    int p;
    int me;
    const int *ranks;
} smddp__ring_t;

/*
 * How a chain of partial reductions combines: PREMUL_SUM scales each rank's
 * own input once (pre_scale) and then sums; AVG sums and divides once at
 * the end (post_divide); every other op chains as it is (step).
 */
typedef struct smddp__chain {
    smddp__reduce_spec_t step;
    bool pre_scale;
    bool post_divide;
} smddp__chain_t;

smddp__chain_t smddp__chain_ops(const smddp__op_t *op);

/*
 * Scratch memory for the collectives across nodes, one buffer per slot, kept
 * by the communicator between ops and freed with it (ops on a communicator
 * run one at a time). A 64 MiB flat reduce-scatter used to malloc 96 MiB and
 * give it back every call: faulting those pages in took longer than the
 * ring. The slots are for the nesting levels: the outer op (a non-root
 * reduce's result, an in-place all-to-all's input), the fp32 copy of
 * fp16/bf16 data, then the ring's work and its incoming blocks. More than
 * 256 MiB in all is given back at the end of the op. NULL when out of
 * memory.
 */
void *smddp__net_scratch(smddp_comm_t comm, int slot, size_t bytes);
/* Gives back scratch over 256 MiB in all (after an op). */
void smddp__net_scratch_trim(smddp_comm_t comm);
/* Applies op's dtype with `which` (PREMUL_SUM: scale; AVG: divide by avg_div) to buf in place. */
void smddp__net_unary(const smddp__op_t *op, smddp_op_t which, int avg_div, void *buf, size_t n);

/*
 * Sends slen bytes to comm rank `to` and receives rlen from `from` at once
 * (either may be -1), tagged with (op->seq, step). Counts the bytes sent.
 */
smddp_status_t smddp__net_exchange(smddp_comm_t comm, const smddp__op_t *op, uint32_t step,
                                   int to, const void *sbuf, size_t slen, int from, void *rbuf,
                                   size_t rlen);

/*
 * A ring's block table: p offsets and lengths (elements), freed by the
 * caller. each == 0: the even split of n (block 0 is the largest); else p
 * blocks of `each`, block q at q * each.
 */
smddp_status_t smddp__net_blocks(int p, size_t n, size_t each, size_t **off, size_t **len);

/*
 * Ring reduce-scatter over work (g->p blocks; block q at off[q], len[q]
 * elements of spec's dtype): afterwards block g->me holds every member's
 * block g->me combined with spec. tmp holds the largest block. Uses steps
 * step0 .. step0 + p - 2.
 */
smddp_status_t smddp__ring_reduce_scatter(smddp_comm_t comm, const smddp__op_t *op,
                                          const smddp__ring_t *g,
                                          const smddp__reduce_spec_t *spec, char *work,
                                          const size_t *off, const size_t *len, char *tmp,
                                          uint32_t step0);
/* Ring allgather: block g->me of buf is this member's; afterwards every block is filled. */
smddp_status_t smddp__ring_allgather(smddp_comm_t comm, const smddp__op_t *op,
                                     const smddp__ring_t *g, char *buf, const size_t *off,
                                     const size_t *len, size_t es, uint32_t step0);
/*
 * In-place ring allreduce of n elements of spec's dtype (no pre-scaling or
 * final division: the caller does those). off and len are scratch for the
 * block table (g->p entries each); tmp holds n / p + 1 elements. Uses steps
 * step0 .. step0 + 2p - 3. It is the ring task below, started and waited for,
 * so it must not run while pollers are registered (pollers.h).
 */
smddp_status_t smddp__ring_allreduce(smddp_comm_t comm, const smddp__op_t *op,
                                     const smddp__ring_t *g, const smddp__reduce_spec_t *spec,
                                     char *buf, size_t n, size_t *off, size_t *len, char *tmp,
                                     uint32_t step0);
/*
 * The same ring allreduce run in the background of its caller, so that the
 * caller can work on something else (the hierarchical allreduce stages the
 * next round in shared memory) while the network moves this one: start
 * posts the first step, advance (never blocking) completes finished steps
 * and posts the next ones, wait blocks until the last step. The caller
 * drives the transport (comm->net->progress) before advance; wait drives it
 * through the registered pollers (pollers.h) when there are any, so every task
 * of the op moves while it waits for one. Uses steps
 * step0 .. step0 + 2p - 3; buf, off, len and tmp as above, until done.
 */
typedef struct smddp__ring_task {
    smddp_comm_t comm;
    const smddp__op_t *op;
    const smddp__ring_t *g;
    smddp__reduce_spec_t spec;
    char *buf, *tmp;
    const size_t *off, *len;
    const void *const *local; /* see smddp__ring_task_fuse */
    int nlocal;
    uint32_t step0;
    int s, nsteps;
    bool posted, done;
    smddp__xfer_t rx, tx;
} smddp__ring_task_t;

smddp_status_t smddp__ring_task_start(smddp__ring_task_t *t, smddp_comm_t comm,
                                      const smddp__op_t *op, const smddp__ring_t *g,
                                      const smddp__reduce_spec_t *spec, char *buf, size_t n,
                                      size_t *off, size_t *len, char *tmp, uint32_t step0,
                                      const void *const *local, int nlocal);
/*
 * A fused task (local != NULL): buf holds this rank's value only of block
 * smddp__ring_task_first(g) when the task starts; every other block is the
 * combination of nlocal sources (local[i], laid out as buf), reduced with
 * spec together with the incoming partial block in one pass when that block
 * arrives. That saves writing and re-reading those blocks, and the network
 * starts after 1/p of the local reduction. Not for PREMUL_SUM (the incoming
 * block must not be scaled again). local must stay valid until done.
 */
int smddp__ring_task_first(const smddp__ring_t *g);
smddp_status_t smddp__ring_task_advance(smddp__ring_task_t *t);
smddp_status_t smddp__ring_task_wait(smddp__ring_task_t *t);
/* After a failure: drops t's posted transfers for good (the transport's abort). */
void smddp__ring_task_abandon(smddp__ring_task_t *t);

/* Chain broadcast of bytes from member root, pipelined in 1 MiB steps from step0. */
smddp_status_t smddp__chain_broadcast(smddp_comm_t comm, const smddp__op_t *op,
                                      const smddp__ring_t *g, int root, char *buf, size_t bytes,
                                      uint32_t step0);

/*
 * fp16/bf16: runs `run` on an fp32 copy of op's in_count inputs and rounds
 * its out_count results once into op->recvbuf; other dtypes: run(op).
 */
smddp_status_t smddp__net_via_fp32(smddp_comm_t comm, smddp__op_t *op, size_t in_count,
                                   size_t out_count,
                                   smddp_status_t (*run)(smddp_comm_t, smddp__op_t *));

/*
 * Runs algo for op across nodes: registrations of the op's buffers are kept
 * until it ends, and scratch over the limit is given back after it.
 */
smddp_status_t smddp__net_run(smddp_comm_t comm, smddp__op_t *op, smddp__algo_fn algo);

#endif /* SMDDP_CORE_RING_H */
