/*
 * The network transport on libfabric (ofi.c, with ofi_lib.c opening the
 * library): the table transport/net.h describes, and what only libfabric
 * has, for its own tests. Built where libfabric's headers are found.
 *
 * The provider is SMDDP_OFI_PROVIDER, else libfabric's choice under
 * FI_PROVIDER, else efa where present, else tcp;ofi_rxm. FI_PROVIDER=efa on
 * a machine with no EFA device counts as unset (one warning says so) unless
 * SMDDP_OFI_PROVIDER is set.
 */
#ifndef SMDDP_CORE_OFI_H
#define SMDDP_CORE_OFI_H

#include "net.h"

extern const smddp__net_transport_t smddp__ofi_transport;

/* Whether libfabric offers provider here (reliable datagrams, tagged messages). */
bool smddp__ofi_offers(const char *provider);
/* Where RDMA devices are listed (sysfs); an EFA device is one whose driver is "efa". */
#define SMDDP_EFA_CLASS_DIR "/sys/class/infiniband"
/* Whether class_dir lists a device driven by efa (false where it cannot be read). */
bool smddp__efa_present(const char *class_dir);

#endif /* SMDDP_CORE_OFI_H */
