/*
 * smddp_single_copy: does a single-copy allreduce beat libsmddp's staged one
 * on this machine? Three float32 sum allreduces over the same ranks, per
 * size, in one run:
 *
 *   smddp   smddp_allreduce, out of place (shared-memory staging: each rank
 *           copies its input in, reduces its share, copies the result out)
 *   cma     cross-memory attach: rank r reads block r of every peer's input
 *           with process_vm_readv, reduces it into its output, then reads
 *           every other block of the result from the peer that owns it
 *   inshm   every rank's input and output already live in one shared
 *           mapping, as they would if the backend handed torch its tensors
 *           (Backend::allocateTensor): rank r sums block r across all inputs
 *           and writes it into every rank's output; no staging at all
 *   pooled  smddp_allreduce on buffers from smddp_mem_alloc: the library's
 *           own in-place path (what allocateTensor hands torch)
 *
 * With -o allgather, the same four for a float32 allgather of SIZE bytes
 * per rank: smddp_allgather staged (each rank copies its input in, then
 * every block out: 1 + RANKS copies of SIZE); cma (its own block copied,
 * every peer's input read with process_vm_readv straight into the output:
 * RANKS copies, as Open MPI's vader does above its eager limit); inshm
 * (every input read in place from the shared mapping); pooled.
 *
 * Each reference is timed between two smddp barriers per call (the least
 * any real implementation needs); its result is checked. A single-thread
 * memcpy rate of the same size is printed beside them. Ratios are each
 * other's time over smddp's (above 1: smddp on its staging is faster).
 *
 *   smddp_single_copy -p 2 [-o allreduce|allgather] [-b 64K] [-e 64M] [-n 20] [--bind]
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "smddp/smddp.h"
#include "spawn.h"

static smddp_comm_t comm;
static int rank, nranks;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check(smddp_status_t st, const char *what)
{
    if (st == SMDDP_OK) return;
    fprintf(stderr, "smddp_single_copy: rank %d: %s: %s\n", rank, what,
            smddp_get_last_error(comm));
    exit(1);
}

static void barrier(void) { check(smddp_barrier(comm, NULL, NULL), "smddp_barrier"); }

static double max_over_ranks(double v)
{
    double out;
    check(smddp_allreduce(comm, &v, &out, 1, SMDDP_FLOAT64, SMDDP_MAX, NULL, NULL),
          "smddp_allreduce");
    return out;
}

static void add_into(float *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* Reads len bytes at addr in process pid into dst, however many calls it takes. */
static void cma_read(pid_t pid, void *dst, uint64_t addr, size_t len)
{
    while (len) {
        struct iovec local = {dst, len}, remote = {(void *)(uintptr_t)addr, len};
        ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (got <= 0) {
            fprintf(stderr,
                    "smddp_single_copy: process_vm_readv from pid %d failed: %s (cross-memory "
                    "attach needs ptrace permission over the peer: same user, and Yama's "
                    "ptrace_scope 0, or CAP_SYS_PTRACE)\n",
                    (int)pid, strerror(errno));
            exit(1);
        }
        dst = (char *)dst + got;
        addr += (uint64_t)got;
        len -= (size_t)got;
    }
}

/* Block b of n elements split over nranks: [*off, *off + *len). */
static void block(size_t n, int b, size_t *off, size_t *len)
{
    size_t per = (n + (size_t)nranks - 1) / (size_t)nranks;
    *off = per * (size_t)b < n ? per * (size_t)b : n;
    *len = *off + per < n ? per : n - *off;
}

typedef struct peer_addr {
    uint64_t pid, in, out;
} peer_addr_t;

static void cma_allreduce(const peer_addr_t *peers, const float *in, float *out, float *tmp,
                          size_t n)
{
    size_t off, len;
    block(n, rank, &off, &len);
    barrier(); /* every input is ready */
    memcpy(out + off, in + off, len * sizeof(float));
    for (int q = 0; q < nranks; q++) {
        if (q == rank) continue;
        cma_read((pid_t)peers[q].pid, tmp, peers[q].in + off * sizeof(float), len * sizeof(float));
        add_into(out + off, tmp, len);
    }
    barrier(); /* every block of the result is ready */
    for (int q = 0; q < nranks; q++) {
        if (q == rank) continue;
        size_t qoff, qlen;
        block(n, q, &qoff, &qlen);
        cma_read((pid_t)peers[q].pid, out + qoff, peers[q].out + qoff * sizeof(float),
                 qlen * sizeof(float));
    }
}

/* ins[q], outs[q]: rank q's buffers, all in one shared mapping. */
static void inshm_allreduce(float **ins, float **outs, size_t n)
{
    size_t off, len;
    block(n, rank, &off, &len);
    barrier();
    float *mine = outs[rank] + off;
    memcpy(mine, ins[0] + off, len * sizeof(float));
    for (int q = 1; q < nranks; q++) add_into(mine, ins[q] + off, len);
    for (int q = 0; q < nranks; q++)
        if (q != rank) memcpy(outs[q] + off, mine, len * sizeof(float));
    barrier();
}

/* outs: every rank's output, RANKS x n; ins[q] is rank q's input. */
static void cma_allgather(const peer_addr_t *peers, const float *in, float *out, size_t n)
{
    barrier(); /* every input is ready */
    memcpy(out + (size_t)rank * n, in, n * sizeof(float));
    for (int q = 0; q < nranks; q++)
        if (q != rank) cma_read((pid_t)peers[q].pid, out + (size_t)q * n, peers[q].in,
                                n * sizeof(float));
    barrier(); /* no input is read any more */
}

static void inshm_allgather(float **ins, float **outs, size_t n)
{
    barrier();
    for (int q = 0; q < nranks; q++)
        memcpy(outs[rank] + (size_t)q * n, ins[q], n * sizeof(float));
    barrier();
}

static double memcpy_rate(size_t bytes)
{
    char *src = malloc(bytes), *dst = malloc(bytes);
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    int reps = 1;
    while ((double)reps * (double)bytes < 2.5e8) reps *= 2;
    memcpy(dst, src, bytes);
    double t0 = now_s();
    for (int k = 0; k < reps; k++) {
        memcpy(dst, src, bytes);
        __asm__ volatile("" : : "r"(dst) : "memory");
    }
    double t = (now_s() - t0) / reps;
    free(src);
    free(dst);
    return (double)bytes / t / 1e9;
}

static void fill(float *in, size_t n)
{
    for (size_t i = 0; i < n; i++) in[i] = (float)((i % 97) + (size_t)rank);
}

/* The allgather's output: block q is rank q's fill(). */
static long count_wrong_gather(const float *out, size_t n)
{
    long wrong = 0;
    for (int q = 0; q < nranks; q++)
        for (size_t i = 0; i < n; i++)
            wrong += out[(size_t)q * n + i] != (float)((i % 97) + (size_t)q);
    return wrong;
}

static long count_wrong(const float *out, size_t n)
{
    long wrong = 0;
    for (size_t i = 0; i < n; i++) {
        float want = (float)(nranks * (int)(i % 97) + nranks * (nranks - 1) / 2);
        wrong += out[i] != want;
    }
    return wrong;
}

static size_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0) {
        fprintf(stderr, "smddp_single_copy: bad size \"%s\" (examples: 64K, 16M)\n", s);
        exit(2);
    }
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    else if (*end) {
        fprintf(stderr, "smddp_single_copy: bad size suffix in \"%s\" (K or M)\n", s);
        exit(2);
    }
    return (size_t)v;
}

int main(int argc, char **argv)
{
    int procs = 2, iters = 20, bind = 0, gather = 0;
    size_t min_b = 64 * 1024, max_b = 64 * 1024 * 1024;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(arg, "--bind")) bind = 1;
        else if (val && !strcmp(arg, "-p")) procs = atoi(argv[++i]);
        else if (val && !strcmp(arg, "-n")) iters = atoi(argv[++i]);
        else if (val && !strcmp(arg, "-o") && !strcmp(val, "allreduce")) gather = 0, i++;
        else if (val && !strcmp(arg, "-o") && !strcmp(val, "allgather")) gather = 1, i++;
        else if (val && !strcmp(arg, "-b")) min_b = parse_bytes(argv[++i]);
        else if (val && !strcmp(arg, "-e")) max_b = parse_bytes(argv[++i]);
        else {
            fprintf(stderr, "usage: smddp_single_copy -p RANKS [-o allreduce|allgather] [-b MIN] "
                            "[-e MAX] [-n ITERS] [--bind]\n");
            return 2;
        }
    }
    if (procs < 2 || iters < 1 || min_b > max_b) {
        fprintf(stderr, "smddp_single_copy: give -p 2 or more, -n 1 or more and -b <= -e\n");
        return 2;
    }
    /* The shared inputs and outputs of inshm, mapped before the ranks fork. */
    size_t slot = (max_b + 4095) / 4096 * 4096;
    size_t oslot = gather ? slot * (size_t)procs : slot; /* an output */
    char *shared = mmap(NULL, (slot + oslot) * (size_t)procs, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        perror("smddp_single_copy: mmap");
        return 1;
    }
    rank = bench_spawn(procs);
    if (bind) bench_bind_to_cpu(rank);
    check(smddp_comm_create_from_env(NULL, &comm), "smddp_comm_create_from_env");
    smddp_comm_size(comm, &nranks);

    float **ins = calloc((size_t)nranks, sizeof(float *)), **outs = calloc((size_t)nranks, sizeof(float *));
    for (int q = 0; q < nranks; q++) {
        ins[q] = (float *)(shared + (slot + oslot) * (size_t)q);
        outs[q] = (float *)(shared + (slot + oslot) * (size_t)q + slot);
    }
    float *in = aligned_alloc(4096, slot), *out = aligned_alloc(4096, oslot);
    float *tmp = aligned_alloc(4096, slot);
    float *pin, *pout;
    check(smddp_mem_alloc(comm, slot, (void **)&pin), "smddp_mem_alloc");
    check(smddp_mem_alloc(comm, oslot, (void **)&pout), "smddp_mem_alloc");
    memset(out, 0, oslot);
    memset(tmp, 0, slot);
    peer_addr_t me = {(uint64_t)getpid(), (uint64_t)(uintptr_t)in, (uint64_t)(uintptr_t)out};
    peer_addr_t *peers = calloc((size_t)nranks, sizeof(peer_addr_t));
    check(smddp_allgather(comm, &me, peers, 3, SMDDP_INT64, NULL, NULL), "smddp_allgather");

    if (rank == 0) {
        printf("# float32 %s, %d ranks, time in us (slowest rank's mean of %d)%s\n",
               gather ? "allgather" : "sum allreduce", nranks, iters,
               gather ? "; size per rank" : "");
        printf("%10s %10s %10s %10s %10s %12s %10s %10s %12s\n", "size(B)", "smddp", "cma",
               "inshm", "pooled", "memcpy GB/s", "cma/smddp", "inshm/smddp", "pooled/smddp");
    }
    long wrong_total = 0;
    for (size_t bytes = min_b; bytes <= max_b; bytes *= 4) {
        size_t n = bytes / sizeof(float);
        fill(in, n);
        fill(ins[rank], n);
        fill(pin, n);
        barrier();
        double t[4];
        for (int which = 0; which < 4; which++) {
            for (int k = -2; k < iters; k++) { /* two warm-up calls */
                if (k == 0) {
                    barrier();
                    t[which] = now_s();
                }
                if (gather && which == 0)
                    check(smddp_allgather(comm, in, out, (int64_t)n, SMDDP_FLOAT32, NULL, NULL),
                          "smddp_allgather");
                else if (gather && which == 1) cma_allgather(peers, in, out, n);
                else if (gather && which == 2) inshm_allgather(ins, outs, n);
                else if (gather)
                    check(smddp_allgather(comm, pin, pout, (int64_t)n, SMDDP_FLOAT32, NULL, NULL),
                          "smddp_allgather");
                else if (which == 0)
                    check(smddp_allreduce(comm, in, out, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM,
                                          NULL, NULL), "smddp_allreduce");
                else if (which == 1) cma_allreduce(peers, in, out, tmp, n);
                else if (which == 2) inshm_allreduce(ins, outs, n);
                else
                    check(smddp_allreduce(comm, pin, pout, (int64_t)n, SMDDP_FLOAT32, SMDDP_SUM,
                                          NULL, NULL), "smddp_allreduce");
            }
            t[which] = max_over_ranks((now_s() - t[which]) / iters);
            float *result = which == 2 ? outs[rank] : which == 3 ? pout : out;
            long wrong = gather ? count_wrong_gather(result, n) : count_wrong(result, n);
            if (wrong) {
                static const char *const names[] = {"smddp", "cma", "inshm", "pooled"};
                fprintf(stderr, "smddp_single_copy: rank %d: %s: %ld wrong element(s) at %zu B\n",
                        rank, names[which], wrong, bytes);
                wrong_total += wrong;
            }
            memset(result, 0, gather ? bytes * (size_t)nranks : bytes);
            barrier();
        }
        double mc = 0;
        if (rank == 0) mc = memcpy_rate(bytes);
        barrier();
        if (rank == 0) {
            printf("%10zu %10.1f %10.1f %10.1f %10.1f %12.2f %10.2f %10.2f %12.2f\n", bytes,
                   t[0] * 1e6, t[1] * 1e6, t[2] * 1e6, t[3] * 1e6, mc, t[1] / t[0], t[2] / t[0],
                   t[3] / t[0]);
            fflush(stdout);
        }
    }
    smddp_mem_free(pin);
    smddp_mem_free(pout);
    smddp_comm_destroy(comm);
    return wrong_total ? 1 : 0;
}
