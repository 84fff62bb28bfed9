/*
 * See ofi_lib.h: libfabric opened at run time, the EFA check, the provider.
 */
#include "ofi_lib.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <rdma/fi_errno.h>

#include "../dl.h"
#include "../param.h"
#include "ofi.h"

static smddp__fab_t fab;
static char fab_error[512];   /* why libfabric could not be opened ("" once it is) */
static pthread_once_t fab_once = PTHREAD_ONCE_INIT;
static pthread_once_t efa_once = PTHREAD_ONCE_INIT;
static void drop_absent_efa(void);

static void fab_open(void)
{
    /* FI_PROVIDER is read when libfabric initialises: settle it before. */
    pthread_once(&efa_once, drop_absent_efa);
    /*
     * With a shared receive context (its default), tcp;ofi_rxm posts 4,096
     * receive buffers of 16 KiB per endpoint: 64 MiB written at fi_enable,
     * a fifth of a second of system time per rank and most of the start-up
     * of many ranks on one machine. 128 (its default without one) serve the
     * messages that arrive before their receive is posted; larger ones go by
     * rendezvous and need no buffer. A value set by the user stays.
     */
    setenv("FI_OFI_RXM_MSG_RX_SIZE", "128", 0);
    const char *path = smddp__params()->ofi_library[0] ? smddp__params()->ofi_library
                                                       : "libfabric.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(fab_error, sizeof(fab_error), "libfabric cannot be opened (%s); install it "
                 "(Debian, Ubuntu: libfabric1) or name it in SMDDP_OFI_LIBRARY", dlerror());
        return;
    }
    const smddp__dl_sym_t syms[] = {
        {"fi_getinfo", SMDDP_DL_SLOT(fab.getinfo)},   {"fi_freeinfo", SMDDP_DL_SLOT(fab.freeinfo)},
        {"fi_dupinfo", SMDDP_DL_SLOT(fab.dupinfo)},   {"fi_fabric", SMDDP_DL_SLOT(fab.fabric)},
        {"fi_strerror", SMDDP_DL_SLOT(fab.strerror)},
    };
    const char *missing = smddp__dl_resolve(lib, syms, sizeof(syms) / sizeof(syms[0]));
    if (missing) {
        snprintf(fab_error, sizeof(fab_error), "%s is not libfabric: it has no %s", path,
                 missing);
        fab = (smddp__fab_t){0}; /* smddp__fab_strerror must not call into it */
        return;
    }
    SMDDP_INFO("libfabric opened from %s", path);
}

/* Whether libfabric is open (opening it on first call); false sets why in fab_error. */
static bool fab_ready(void)
{
    pthread_once(&fab_once, fab_open);
    return fab_error[0] == '\0';
}

const smddp__fab_t *smddp__fab(void) { return &fab; }

const char *smddp__fab_strerror(int errnum)
{
    return fab.strerror ? fab.strerror(errnum) : "libfabric is not open";
}

bool smddp__efa_present(const char *class_dir)
{
    DIR *dir = opendir(class_dir);
    if (!dir) return false;
    bool found = false;
    const struct dirent *e;
    while (!found && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char link[PATH_MAX], target[PATH_MAX];
        int n = snprintf(link, sizeof(link), "%s/%s/device/driver", class_dir, e->d_name);
        if (n < 0 || (size_t)n >= sizeof(link)) continue;
        ssize_t len = readlink(link, target, sizeof(target) - 1);
        if (len <= 0) continue;
        target[len] = '\0';
        const char *base = strrchr(target, '/');
        found = strcmp(base ? base + 1 : target, "efa") == 0;
    }
    closedir(dir);
    return found;
}

/*
 * FI_PROVIDER=efa on a machine without an EFA device: SageMaker's runner
 * exports it on every instance type. Unless SMDDP_OFI_PROVIDER names a
 * provider (then the choice stays strict), the variable is dropped before
 * libfabric first reads it (libfabric keeps only the providers it names, for
 * the life of the process), and tcp;ofi_rxm is used; open_endpoint says so.
 */
static bool efa_dropped;

bool smddp__ofi_efa_dropped(void) { return efa_dropped; }

static void drop_absent_efa(void)
{
    const char *fp = getenv("FI_PROVIDER");
    if (smddp__params()->ofi_provider[0] || !fp) return;
    while (*fp == ' ') fp++;
    if (strncasecmp(fp, "efa", 3) != 0 || fp[3 + strspn(fp + 3, " ")] != '\0') return;
    if (smddp__efa_present(SMDDP_EFA_CLASS_DIR)) return;
    unsetenv("FI_PROVIDER");
    efa_dropped = true;
}

/*
 * fi_getinfo for reliable datagrams with tagged messages from provider
 * (NULL: any), plus extra capabilities.
 */
static int get_info_caps(const char *provider, uint64_t extra, struct fi_info **out)
{
    if (!fab_ready()) return -FI_ENOSYS;
    struct fi_info *hints = fab.dupinfo(NULL);
    if (!hints) return -FI_ENOMEM;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_TAGGED | FI_DIRECTED_RECV | extra;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    /* Local buffers are registered (through the cache) where the provider asks for it. */
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    if (provider) hints->fabric_attr->prov_name = strdup(provider);
    int rc = fab.getinfo(SMDDP_OFI_VERSION, NULL, NULL, 0, hints, out);
    fab.freeinfo(hints);
    return rc;
}

static int get_info(const char *provider, struct fi_info **out)
{
    return get_info_caps(provider, 0, out);
}

bool smddp__ofi_offers_caps(const char *provider, uint64_t extra)
{
    struct fi_info *info = NULL;
    bool yes = get_info_caps(provider, extra, &info) == 0 && info;
    if (info) fab.freeinfo(info);
    return yes;
}

bool smddp__ofi_offers(const char *provider) { return smddp__ofi_offers_caps(provider, 0); }

smddp_status_t smddp__ofi_choose_provider(struct fi_info **out)
{
    if (!fab_ready()) return smddp__error(SMDDP_ERR_NOT_SUPPORTED, "%s", fab_error);
    const char *setting = smddp__params()->ofi_provider;
    int rc;
    if (setting[0]) {
        rc = get_info(setting, out);
        if (rc != 0)
            return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                                "libfabric provider \"%s\" (SMDDP_OFI_PROVIDER) is not usable "
                                "here: %s", setting, smddp__fab_strerror(-rc));
        return SMDDP_OK;
    }
    if (getenv("FI_PROVIDER")) {
        /* libfabric itself keeps only the providers FI_PROVIDER names. */
        rc = get_info(NULL, out);
        if (rc != 0)
            return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                                "no libfabric provider among FI_PROVIDER=%s offers reliable "
                                "datagrams with tagged messages: %s", getenv("FI_PROVIDER"),
                                smddp__fab_strerror(-rc));
        return SMDDP_OK;
    }
    /* Without EFA here (FI_PROVIDER=efa dropped), efa is not even tried. */
    if (!efa_dropped && get_info("efa", out) == 0) return SMDDP_OK;
    rc = get_info("tcp;ofi_rxm", out);
    if (rc != 0 && efa_dropped)
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "FI_PROVIDER=efa, but this machine has no EFA device, and "
                            "libfabric's tcp;ofi_rxm is not usable either: %s (libfabric "
                            "keeps FI_PROVIDER from its first use in the process); set "
                            "FI_PROVIDER=tcp or SMDDP_OFI_PROVIDER", smddp__fab_strerror(-rc));
    if (rc != 0)
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED,
                            "neither libfabric's efa nor tcp;ofi_rxm provider is usable: %s",
                            smddp__fab_strerror(-rc));
    return SMDDP_OK;
}
