/*
 * -p N for the benchmarks: forks N local ranks that rendezvous through
 * libsmddp's built-in store (SMDDP_MASTER_ADDR/PORT, SMDDP_WORLD_SIZE,
 * SMDDP_RANK), so smddp_comm_create_from_env() works in each.
 */
#ifndef SMDDP_BENCH_SPAWN_H
#define SMDDP_BENCH_SPAWN_H

#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int bench_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        fprintf(stderr, "cannot find a free port\n");
        exit(1);
    }
    close(fd);
    return ntohs(sa.sin_port);
}

/*
 * In each of the n children, returns its rank (with SMDDP_RANK set). The
 * parent never returns: it waits for every child, kills the others when one
 * fails, and exits 1 if any failed, else 0.
 */
static int bench_spawn(int n)
{
    char buf[32];
    pid_t pids[256];
    if (n < 1 || n > 256) {
        fprintf(stderr, "-p %d: give 1 to 256 ranks\n", n);
        exit(2);
    }
    snprintf(buf, sizeof(buf), "%d", bench_free_port());
    setenv("SMDDP_MASTER_ADDR", "127.0.0.1", 1);
    setenv("SMDDP_MASTER_PORT", buf, 1);
    snprintf(buf, sizeof(buf), "%d", n);
    setenv("SMDDP_WORLD_SIZE", buf, 1);
    fflush(stdout);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            snprintf(buf, sizeof(buf), "%d", r);
            setenv("SMDDP_RANK", buf, 1);
            return r;
        }
    }
    int failed = 0;
    for (int r = 0; r < n; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (!failed)
                for (int q = 0; q < n; q++) kill(pids[q], SIGTERM);
            failed = 1;
        }
    }
    exit(failed);
}

/* Rank r runs on the r-th allowed CPU (round robin), as mpirun binds by default. */
static inline void bench_bind_to_cpu(int r)
{
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
    int n = CPU_COUNT(&allowed), want = r % n, seen = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &allowed)) continue;
        if (seen++ == want) {
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            sched_setaffinity(0, sizeof(one), &one);
            return;
        }
    }
}

#endif /* SMDDP_BENCH_SPAWN_H */
