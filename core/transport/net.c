/*
 * See net.h: which network transport this build has, opening and closing a
 * communicator's endpoints, and the waits, which are the same whatever
 * carries the bytes.
 */
#include "net.h"

#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "shm.h"
#if SMDDP_HAVE_OFI
#include "ofi.h"
#endif

const smddp__net_transport_t *smddp__net_transport(void)
{
#if SMDDP_HAVE_OFI
    return &smddp__ofi_transport;
#else
    return NULL;
#endif
}

smddp_status_t smddp__net_open(smddp_comm_t comm)
{
    const smddp__net_transport_t *t = smddp__net_transport();
    if (!t)
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "this libsmddp was built without libfabric (install libfabric-dev and "
                            "rebuild) and cannot reach ranks on other nodes");
    smddp__net_ep_t *coll = NULL, *p2p = NULL;
    SMDDP_CHECK(t->setup(comm, &coll, &p2p));
    comm->net = t;
    comm->net_ep = coll;
    comm->net_p2p = p2p;
    return SMDDP_OK;
}

void smddp__net_close_p2p(smddp_comm_t comm)
{
    if (!comm->net) return;
    comm->net->teardown(comm->net_p2p);
    comm->net_p2p = NULL;
}

void smddp__net_close(smddp_comm_t comm)
{
    if (!comm->net) return;
    comm->net->teardown(comm->net_ep);
    comm->net_ep = NULL;
    smddp__net_close_p2p(comm);
    comm->net = NULL;
}

const smddp__transport_t smddp__net_endpoints = {"network", true, smddp__net_open,
                                                 smddp__net_close, NULL};

/* How often a wait looks at the deadline and the abort flag, in polls. */
#define CHECK_EVERY 1024

smddp_status_t smddp__xfer_wait_until(smddp_comm_t comm, const smddp__op_t *op,
                                      smddp__xfer_poll_fn poll, void *arg)
{
    /*
     * A software transport progresses only when polled, so keep polling, but
     * like the shared-memory waits spin, then yield, then sleep between
     * polls: when ranks outnumber cores, a polling rank must not keep a core
     * from a rank that has work (4 ranks polling on 2 cores made a 1 MiB
     * allreduce 35x slower).
     */
    int64_t spin_ns = 50 * 1000, yield_ns = 2 * 1000 * 1000;
    if (comm->shm) smddp__shm_wait_policy(comm, &spin_ns, &yield_ns);
    int64_t start = smddp__now_ns(), idle = 0;
    for (unsigned i = 1;; i++) {
        smddp__xfer_blame_t blame = {-1, 0};
        smddp_status_t st = poll(arg, &blame);
        if (st != SMDDP_IN_PROGRESS) return st;
        if (i % 64 == 0) idle = smddp__now_ns() - start;
        if (idle > spin_ns + yield_ns) {
            struct timespec ts = {0, 50 * 1000};
            nanosleep(&ts, NULL);
        } else if (idle > spin_ns) {
            sched_yield();
        }
        if (i % CHECK_EVERY) continue;
        char desc[256];
        if (smddp__comm_poll_abort(comm, smddp__now_ns(), blame.peer)) {
            smddp__op_describe(op, desc, sizeof(desc));
            return smddp__error_quiet(SMDDP_ERR_ABORTED, "%s failed: communicator aborted: %s",
                                      desc, comm->abort_msg);
        }
        if (op->deadline_ns && smddp__now_ns() >= op->deadline_ns) {
            smddp__op_describe(op, desc, sizeof(desc));
            return smddp__error_quiet(SMDDP_ERR_TIMEOUT,
                                      "%s timed out after %.3f s: rank %d did not %s", desc,
                                      (double)smddp__op_timeout_ms(comm, op) / 1000.0, blame.peer,
                                      blame.is_send ? "receive it" : "send it");
        }
    }
}

smddp_status_t smddp__xfer_status(const smddp__op_t *op, const smddp__xfer_t *x)
{
    if (x->status >= 0) return SMDDP_OK;
    char desc[256];
    smddp__op_describe(op, desc, sizeof(desc));
    return smddp__error_quiet(x->status, "%s failed: %s", desc, x->err);
}

typedef struct xfer_wait {
    smddp_comm_t comm;
    smddp__xfer_t *x;
} xfer_wait_t;

static smddp_status_t poll_xfer(void *arg, smddp__xfer_blame_t *blame)
{
    xfer_wait_t *w = arg;
    if (!w->x->done) SMDDP_CHECK(w->comm->net->progress(w->comm->net_ep));
    if (w->x->done) return SMDDP_OK;
    blame->peer = w->x->peer;
    blame->is_send = w->x->is_send;
    return SMDDP_IN_PROGRESS;
}

smddp_status_t smddp__xfer_wait(smddp_comm_t comm, const smddp__op_t *op, smddp__xfer_t *x)
{
    xfer_wait_t w = {comm, x};
    SMDDP_CHECK(smddp__xfer_wait_until(comm, op, poll_xfer, &w));
    return smddp__xfer_status(op, x);
}
