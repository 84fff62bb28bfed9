/*
 * libfabric, opened (dlopen) when a communicator first needs the network,
 * so that a process that never spans nodes never loads it nor what it
 * loads (verbs, PSM and their signal handlers); and the provider chosen
 * from it. Only ofi.c uses this.
 */
#ifndef SMDDP_CORE_OFI_LIB_H
#define SMDDP_CORE_OFI_LIB_H

#include <stdbool.h>
#include <stdint.h>

#include <rdma/fabric.h>

#include "../common.h"

/* The libfabric API version libsmddp asks for. */
#define SMDDP_OFI_VERSION FI_VERSION(1, 17)

/*
 * libfabric's exported entry points that libsmddp calls; the rest of its API
 * is inline calls through its objects' operation tables.
 */
typedef struct smddp__fab {
    int (*getinfo)(uint32_t version, const char *node, const char *service, uint64_t flags,
                   const struct fi_info *hints, struct fi_info **info);
    void (*freeinfo)(struct fi_info *info);
    struct fi_info *(*dupinfo)(const struct fi_info *info);
    int (*fabric)(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);
    const char *(*strerror)(int errnum);
} smddp__fab_t;

/*
 * The entry points of libfabric, once open: smddp__ofi_choose_provider and
 * smddp__ofi_offers_caps open it (SMDDP_OFI_LIBRARY, else libfabric.so.1)
 * on their first call.
 */
const smddp__fab_t *smddp__fab(void);
/* libfabric's text for a (positive) error number; a fixed text before it is open. */
const char *smddp__fab_strerror(int errnum);

/*
 * The provider between nodes, for reliable datagrams with tagged messages:
 * SMDDP_OFI_PROVIDER, else libfabric's choice under FI_PROVIDER, else efa,
 * else tcp;ofi_rxm. Opens libfabric first; fails saying which and why.
 */
smddp_status_t smddp__ofi_choose_provider(struct fi_info **out);
/* Whether provider offers reliable tagged datagrams plus the capabilities extra. */
bool smddp__ofi_offers_caps(const char *provider, uint64_t extra);
/* Whether FI_PROVIDER=efa was dropped because no EFA device is here (see ofi_lib.c). */
bool smddp__ofi_efa_dropped(void);

#endif
