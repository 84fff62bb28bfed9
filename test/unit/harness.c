/* See harness.h. */
#include "harness.h"

#ifdef HARNESS_WITH_CMOCKA /* the unit tests; the GPU tests link this file without CMocka */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#endif

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "param.h"
#include "progress_nodes.h"
#include "transport/net.h"
#include "store/store.h"

int harness_store_port;

struct smddp_comm *harness_topology(int nodes, int per_node)
{
    static int node_ranks[4096];
    struct smddp_comm *c = calloc(1, sizeof(*c));
    if (!c || nodes * per_node > 4096) {
        fprintf(stderr, "harness_topology: %d x %d ranks: out of memory or too many\n", nodes,
                per_node);
        exit(1);
    }
    c->size = nodes * per_node;
    c->node_count = nodes;
    c->local_size = per_node;
    smddp__verdicts_init(&c->verdicts);
    for (int i = 0; i < c->size; i++) node_ranks[i] = i;
    c->node_ranks = node_ranks;
    return c;
}

int harness_trace_count(smddp_comm_t comm, const char *what)
{
    char path[256], line[4096];
    snprintf(path, sizeof(path), "/tmp/smddp-test-trace-count-%d.json", (int)getpid());
    H_OK(smddp_comm_dump_trace(comm, path, NULL, 0));
    FILE *f = fopen(path, "r");
    H_CHECK(f != NULL, "cannot read %s", path);
    int n = 0;
    while (fgets(line, sizeof(line), f))
        for (const char *p = line; (p = strstr(p, what)) != NULL; p += strlen(what)) n++;
    fclose(f);
    unlink(path);
    return n;
}

/*
 * Every rank harness_run has forked in this process: the segments they
 * create are named "smddp-<pid>-..." (transport/shm.c), so counting only
 * those leaves out what other test programs running at the same time do.
 */
enum { FORKED_MAX = 1 << 14 };
static pid_t forked[FORKED_MAX];
static int n_forked;

static bool ours(pid_t pid)
{
    if (pid == getpid()) return true;
    for (int i = 0; i < n_forked; i++)
        if (forked[i] == pid) return true;
    return false;
}

int harness_shm_count(void)
{
    int n = 0;
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid = 0;
        if (strncmp(e->d_name, "smddp-", 6) == 0 && sscanf(e->d_name + 6, "%d-", &pid) == 1 &&
            ours((pid_t)pid))
            n++;
    }
    closedir(d);
    return n;
}

void harness_apply_env(const char *env)
{
    if (!env) return;
    char *copy = strdup(env), *save = NULL;
    for (char *tok = strtok_r(copy, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = '\0';
        setenv(tok, eq + 1, 1);
    }
    free(copy);
    smddp__params_reload();
}

smddp_status_t harness_try_comm(int rank, int size, const char *prefix, int64_t timeout_ms,
                                smddp_comm_t *comm)
{
    smddp_store_t store;
    smddp_status_t st = smddp__tcp_client_connect("127.0.0.1", harness_store_port, 30000, NULL,
                                                  &store);
    H_CHECK(st == SMDDP_OK, "cannot reach the harness store: %s", smddp_get_last_error(NULL));
    smddp_comm_config_t cfg = SMDDP_COMM_CONFIG_INIT;
    cfg.prefix = prefix;
    cfg.timeout_ms = timeout_ms;
    st = smddp_comm_create(&store, rank, size, &cfg, comm);
    /* On failure the caller keeps the store. */
    if (st != SMDDP_OK && store.release) store.release(store.ctx);
    return st;
}

smddp_comm_t harness_comm(int rank, int size, const char *prefix)
{
    smddp_comm_t comm = NULL;
    smddp_status_t st = harness_try_comm(rank, size, prefix, -1, &comm);
    H_CHECK(st == SMDDP_OK, "smddp_comm_create: %s: %s", smddp_status_string(st),
            smddp_get_last_error(NULL));
    return comm;
}

static int run_id;

int harness_run(int nranks, harness_fn_t fn, void *arg, harness_opts_t *opts)
{
    harness_opts_t defaults = {0};
    if (!opts) opts = &defaults;
    if (nranks < 1 || nranks > HARNESS_MAX_RANKS) {
        fprintf(stderr, "harness: %d ranks asked for; it runs 1 to %d\n", nranks,
                HARNESS_MAX_RANKS);
        return nranks < 1 ? 1 : nranks;
    }
#ifdef HARNESS_WITH_CMOCKA
    /* Fake nodes talk through libfabric: a build without it skips the test, and says why. */
    if (opts->ranks_per_node > 0 && opts->ranks_per_node < nranks && !smddp__net_transport()) {
        print_message("skipped: %d ranks on %d nodes need libfabric, and this build has none\n",
                      nranks, (nranks + opts->ranks_per_node - 1) / opts->ranks_per_node);
        skip();
    }
#endif
    int timeout_s = opts->timeout_s > 0 ? opts->timeout_s : 120;
    /*
     * The store runs in a process of its own, so that this process has no
     * threads when it forks the ranks (a forked copy of a threaded process
     * confuses LeakSanitizer, and the ranks must not inherit a server).
     */
    int port = 0, fds[2];
    if (pipe(fds) != 0) return nranks;
    pid_t store_pid = fork();
    if (store_pid == 0) {
        smddp__tcp_server_t *server = NULL;
        close(fds[0]);
        if (smddp__tcp_server_start("127.0.0.1", 0, &server, &port) != SMDDP_OK) port = -1;
        ssize_t w = write(fds[1], &port, sizeof(port));
        (void)w;
        close(fds[1]);
        /* Serve until the parent says stop (SIGTERM) or goes away. */
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
        int sig;
        sigwait(&set, &sig);
        smddp__tcp_server_stop(server);
        _exit(0);
    }
    close(fds[1]);
    if (store_pid < 0 || read(fds[0], &port, sizeof(port)) != sizeof(port) || port <= 0) {
        close(fds[0]);
        fprintf(stderr, "harness: cannot start the store\n");
        if (store_pid > 0) {
            kill(store_pid, SIGKILL);
            waitpid(store_pid, NULL, 0);
        }
        return nranks;
    }
    close(fds[0]);
    opts->store_port = port;
    harness_store_port = port;
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "h%d-%d", (int)getpid(), run_id++);
    fflush(stdout);
    fflush(stderr);

    pid_t pids[HARNESS_MAX_RANKS];
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            if (opts->ranks_per_node > 0) {
                char host[64];
                snprintf(host, sizeof(host), "fake-node-%d", r / opts->ranks_per_node);
                setenv("SMDDP_HOSTNAME", host, 1);
                setenv("FI_TCP_IFACE", "lo", 0);
                smddp__nodes_clock_shift_ns = (r / opts->ranks_per_node) * opts->clock_shift_ns;
                smddp__params_reload();
            }
            harness_apply_env(opts->env);
            smddp_comm_t comm = opts->no_comm ? NULL : harness_comm(r, nranks, prefix);
            fn(comm, r, nranks, arg);
            if (comm) {
                smddp_status_t st = smddp_comm_destroy(comm);
                H_CHECK(st == SMDDP_OK, "destroy: %s", smddp_status_string(st));
            }
            fflush(stdout);
            fflush(stderr);
            exit(0);
        }
        if (pids[r] > 0 && n_forked < FORKED_MAX) forked[n_forked++] = pids[r];
    }

    int failed = 0, left = nranks, status;
    int done[HARNESS_MAX_RANKS] = {0};
    time_t start = time(NULL);
    while (left > 0) {
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            for (int r = 0; r < nranks; r++) {
                if (pids[r] != pid) continue;
                done[r] = 1;
                left--;
                int want = r < 16 ? opts->expect_signal[r] : 0;
                bool ok = want ? (WIFSIGNALED(status) && WTERMSIG(status) == want)
                               : (WIFEXITED(status) && WEXITSTATUS(status) == 0);
                if (!ok) {
                    failed++;
                    if (WIFSIGNALED(status))
                        fprintf(stderr, "harness: rank %d died of signal %d\n", r, WTERMSIG(status));
                    else
                        fprintf(stderr, "harness: rank %d exited with %d\n", r, WEXITSTATUS(status));
                }
            }
            continue;
        }
        if (time(NULL) - start > timeout_s) {
            for (int r = 0; r < nranks; r++) {
                if (done[r]) continue;
                fprintf(stderr, "harness: rank %d still running after %d s: killed\n", r,
                        timeout_s);
                kill(pids[r], SIGKILL);
                waitpid(pids[r], &status, 0);
                failed++;
                left--;
            }
            break;
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(store_pid, SIGTERM);
    waitpid(store_pid, &status, 0);
    return failed;
}
