/*
 * Communicators from the environment: rank, size and rendezvous address from
 * SMDDP_* settings or from whatever launcher started us (torchrun, Open MPI,
 * Slurm), and the built-in TCP store served by rank 0.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bootstrap.h"
#include "param.h"
#include "store/store.h"

static pthread_mutex_t env_lock = PTHREAD_MUTEX_INITIALIZER;
static smddp__store_ref_t *env_store;
static int env_comm_count;

/* First of the variables that is set to an integer; -1 if none. */
static int env_int(const char *const *names, const char **which)
{
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v) continue;
        char *end;
        long x = strtol(v, &end, 10);
        if (*end == '\0' && x >= 0 && x <= 1 << 24) {
            if (which) *which = names[i];
            return (int)x;
        }
    }
    return -1;
}

/* FNV-1a, to turn a launcher's job id into a port every rank agrees on. */
static uint32_t hash_str(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/*
 * Rank 0's store keeps one connection per rank until exit: raise the soft
 * limit on open files towards the hard one when the job needs more (a
 * soft limit of 1024 stopped jobs of about a thousand ranks at bootstrap),
 * and say so when even the hard limit is too low.
 */
static void ensure_fds(int size)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)size + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
        return;
    rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    struct rlimit raised = {want, rl.rlim_max};
    if (want > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &raised) == 0)
        SMDDP_INFO("rank 0: raised the open-file limit from %llu to %llu for the store's %d "
                   "connections", (unsigned long long)rl.rlim_cur, (unsigned long long)want, size);
    else
        want = rl.rlim_cur;
    if (want < need)
        SMDDP_WARN("rank 0: the store needs a connection per rank (%d) but this process may open "
                   "only %llu files (ulimit -n, hard limit %llu): raise it, or ranks will fail to "
                   "connect", size, (unsigned long long)want, (unsigned long long)rl.rlim_max);
}

smddp_status_t smddp__comm_create_from_env(const smddp_comm_config_t *config, smddp_comm_t *out)
{
    const smddp__params_t *params = smddp__params();
    static const char *const rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                            "SLURM_PROCID", NULL};
    static const char *const size_vars[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                            "SLURM_NTASKS", NULL};
    static const char *const local_size_vars[] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                  "SLURM_NTASKS_PER_NODE", NULL};
    const char *rank_from = "SMDDP_RANK", *size_from = "SMDDP_WORLD_SIZE";
    int rank = params->rank >= 0 ? params->rank : env_int(rank_vars, &rank_from);
    int size = params->world_size >= 0 ? params->world_size : env_int(size_vars, &size_from);
    int64_t timeout_ms = smddp__timeout_ms(config ? config->timeout_ms : -1);

    if (rank < 0 || size < 1)
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT,
                            "cannot tell this process's rank and the world size from the "
                            "environment: set SMDDP_RANK and SMDDP_WORLD_SIZE, or start it with "
                            "torchrun (RANK, WORLD_SIZE), mpirun (OMPI_COMM_WORLD_RANK/SIZE) or "
                            "srun (SLURM_PROCID, SLURM_NTASKS)");
    if (rank >= size)
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT, "rank %d (from %s) is not below the world "
                            "size %d (from %s)", rank, rank_from, size, size_from);

    /* Where rank 0 serves the store. */
    char addr[256];
    int port = params->master_port;
    const char *port_from = "SMDDP_MASTER_PORT";
    snprintf(addr, sizeof(addr), "%s", params->master_addr);
    if (!addr[0] && getenv("MASTER_ADDR")) snprintf(addr, sizeof(addr), "%s", getenv("MASTER_ADDR"));
    if (port < 0 && getenv("MASTER_PORT") && getenv("MASTER_PORT")[0]) {
        const char *text = getenv("MASTER_PORT");
        char *end;
        errno = 0;
        long v = strtol(text, &end, 10);
        if (errno || *end || v < 1 || v > 65535)
            return smddp__error(SMDDP_ERR_INVALID_ARGUMENT, "MASTER_PORT is \"%s\": it must be "
                                "a port number from 1 to 65535", text);
        port = (int)v;
        port_from = "MASTER_PORT";
        /* torchrun's agent may already serve its own store on MASTER_PORT. */
        const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
        if (agent && (!strcmp(agent, "True") || !strcmp(agent, "1"))) {
            port = port < 65535 ? port + 1 : port - 1;
            port_from = "MASTER_PORT + 1 (torchrun's agent store holds MASTER_PORT)";
        }
    }
    if (port < 0) {
        /* One-node jobs under mpirun or srun: derive a port from the job id. */
        const char *ids[] = {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID", NULL};
        char job[512] = "";
        if (params->job_id[0]) snprintf(job, sizeof(job), "SMDDP_JOB_ID:%s", params->job_id);
        for (int i = 0; ids[i] && !job[0]; i++)
            if (getenv(ids[i])) snprintf(job, sizeof(job), "%s:%s", ids[i], getenv(ids[i]));
        if (job[0] && getenv("SLURM_STEP_ID"))
            snprintf(job + strlen(job), sizeof(job) - strlen(job), ".%s", getenv("SLURM_STEP_ID"));
        if (job[0]) {
            port = 20000 + (int)(hash_str(job) % 20000u);
            port_from = "a hash of the launcher's job id";
        }
    }
    if (!addr[0]) {
        int local_size = env_int(local_size_vars, NULL);
        const char *nnodes = getenv("SLURM_NNODES");
        if (local_size == size || (nnodes && !strcmp(nnodes, "1")) || size == 1)
            snprintf(addr, sizeof(addr), "127.0.0.1");
    }
    if (!addr[0] || port <= 0 || port > 65535)
        return smddp__error(SMDDP_ERR_INVALID_ARGUMENT,
                            "no rendezvous address for the built-in store (rank %d of %d): set "
                            "SMDDP_MASTER_ADDR and SMDDP_MASTER_PORT, or MASTER_ADDR and "
                            "MASTER_PORT (address \"%s\", port %d)",
                            rank, size, addr, port);

    pthread_mutex_lock(&env_lock);
    smddp_status_t st = SMDDP_OK;
    /*
     * One store per process, kept until exit: if rank 0 stopped its server
     * when its last communicator went and started another for the next one,
     * a peer could still reach the old one and lose it mid-rendezvous.
     */
    if (!env_store) {
        smddp__tcp_server_t *server = NULL;
        int bound = 0;
        if (rank == 0) {
            ensure_fds(size);
            st = smddp__tcp_server_start(NULL, port, &server, &bound);
            if (st < 0) {
                char inner[SMDDP_ERRMSG_MAX];
                snprintf(inner, sizeof(inner), "%s", smddp__last_error());
                st = smddp__error(st, "rank 0 cannot serve the store on port %d (from %s): %s",
                                  port, port_from, inner);
                goto out;
            }
        }
        smddp__store_ref_t *ref = smddp__store_ref_new(NULL); /* this module's, never dropped */
        if (!ref) {
            smddp__tcp_server_stop(server);
            st = SMDDP_ERR_NO_MEMORY;
            goto out;
        }
        st = smddp__tcp_client_connect(rank == 0 ? "127.0.0.1" : addr, port, timeout_ms, server,
                                       &ref->table);
        if (st < 0) {
            char inner[SMDDP_ERRMSG_MAX];
            snprintf(inner, sizeof(inner), "%s", smddp__last_error());
            smddp__tcp_server_stop(server);
            free(ref);
            st = smddp__error(st, "rank %d cannot reach rank 0's store at %s:%d: %s", rank, addr,
                              port, inner);
            goto out;
        }
        env_store = ref;
    }
    char prefix[512];
    int len = snprintf(prefix, sizeof(prefix), "%s/env%d",
                       config && config->prefix ? config->prefix : "smddp", env_comm_count++);
    /* Cut short, two communicators could share their store keys. */
    if (len < 0 || (size_t)len >= sizeof(((struct smddp_comm *)0)->prefix)) {
        st = smddp__error(SMDDP_ERR_INVALID_ARGUMENT, "the store prefix %s is too long: at most "
                          "%zu characters with the /envN suffix", prefix,
                          sizeof(((struct smddp_comm *)0)->prefix) - 1);
        goto out;
    }
    st = smddp__comm_create(env_store, rank, size, prefix, timeout_ms, out);
out:
    pthread_mutex_unlock(&env_lock);
    return st;
}
