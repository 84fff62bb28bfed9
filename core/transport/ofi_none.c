/*
 * The network transport in a build without libfabric (see ofi.h): every
 * entry point answers as a transport that does not exist, so that a
 * communicator spanning nodes fails at creation with a message saying so.
 */
#include "ofi.h"

void smddp__ofi_op_begin(smddp_comm_t comm, const smddp__op_t *op) { (void)comm, (void)op; }
void smddp__ofi_op_end(smddp_comm_t comm) { (void)comm; }
void smddp__ofi_mr_stats(smddp_comm_t comm, uint64_t *hits, uint64_t *misses, bool *registering)
{
    (void)comm;
    *hits = *misses = 0;
    *registering = false;
}

bool smddp__ofi_built(void) { return false; }
bool smddp__ofi_offers(const char *provider)
{
    (void)provider;
    return false;
}
bool smddp__efa_present(const char *class_dir)
{
    (void)class_dir;
    return false;
}
bool smddp__ofi_hmem(smddp_comm_t comm)
{
    (void)comm;
    return false;
}
const char *smddp__ofi_provider(smddp_comm_t comm)
{
    (void)comm;
    return NULL;
}
bool smddp__ofi_sockaddr(smddp_comm_t comm, int rank, struct sockaddr_storage *addr, unsigned *len)
{
    (void)comm, (void)rank, (void)addr, (void)len;
    return false;
}
smddp_status_t smddp__ofi_setup(smddp_comm_t comm)
{
    (void)comm;
    return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                        "this libsmddp was built without libfabric (install libfabric-dev and "
                        "rebuild) and cannot reach ranks on other nodes");
}
void smddp__ofi_teardown(smddp_comm_t comm) { (void)comm; }
void smddp__ofi_teardown_p2p(smddp_comm_t comm) { (void)comm; }
smddp_status_t smddp__ofi_post(smddp_comm_t comm, smddp__ofi_xfer_t *x, int is_send, int peer,
                               uint64_t tag, void *buf, size_t len)
{
    (void)comm, (void)x, (void)is_send, (void)peer, (void)tag, (void)buf, (void)len;
    return smddp__error(SMDDP_ERR_NOT_SUPPORTED, "built without libfabric");
}
smddp_status_t smddp__ofi_wait(smddp_comm_t comm, const smddp__op_t *op, smddp__ofi_xfer_t *x)
{
    (void)comm, (void)op, (void)x;
    return smddp__error(SMDDP_ERR_NOT_SUPPORTED, "built without libfabric");
}
smddp_status_t smddp__ofi_wait_until(smddp_comm_t comm, const smddp__op_t *op,
                                     smddp__ofi_poll_fn poll, void *arg)
{
    (void)comm, (void)op, (void)poll, (void)arg;
    return smddp__error(SMDDP_ERR_NOT_SUPPORTED, "built without libfabric");
}
smddp_status_t smddp__ofi_xfer_status(const smddp__op_t *op, const smddp__ofi_xfer_t *x)
{
    (void)op, (void)x;
    return smddp__error(SMDDP_ERR_NOT_SUPPORTED, "built without libfabric");
}
smddp_status_t smddp__ofi_post_on(smddp__ofi_t *o, smddp__ofi_xfer_t *x, int is_send, int peer,
                                  uint64_t tag, uint64_t ignore, void *buf, size_t len)
{
    (void)o, (void)x, (void)is_send, (void)peer, (void)tag, (void)ignore, (void)buf, (void)len;
    return smddp__error(SMDDP_ERR_NOT_SUPPORTED, "built without libfabric");
}
smddp_status_t smddp__ofi_try_post_on(smddp__ofi_t *o, smddp__ofi_xfer_t *x, int is_send,
                                      int peer, uint64_t tag, uint64_t ignore, void *buf,
                                      size_t len)
{
    (void)o, (void)x, (void)is_send, (void)peer, (void)tag, (void)ignore, (void)buf, (void)len;
    return smddp__error(SMDDP_ERR_NOT_SUPPORTED, "built without libfabric");
}
smddp_status_t smddp__ofi_progress(smddp__ofi_t *o)
{
    (void)o;
    return smddp__error(SMDDP_ERR_NOT_SUPPORTED, "built without libfabric");
}
smddp_status_t smddp__ofi_peek_on(smddp__ofi_t *o, smddp__ofi_xfer_t *x, int peer, uint64_t tag,
                                  uint64_t ignore)
{
    (void)o, (void)x, (void)peer, (void)tag, (void)ignore;
    return smddp__error(SMDDP_ERR_NOT_SUPPORTED, "built without libfabric");
}

void smddp__ofi_cancel(smddp__ofi_t *o, smddp__ofi_xfer_t *x) { (void)o, (void)x; }
void smddp__ofi_abandon(smddp__ofi_t *o, smddp__ofi_xfer_t *x) { (void)o, (void)x; }
