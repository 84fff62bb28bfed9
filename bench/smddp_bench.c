/*
 * smddp_bench: collective bandwidth and latency, nccl-tests style.
 *
 * The same source builds two programs: smddp_bench (libsmddp) and, where
 * Open MPI is installed, smddp_bench_mpi (MPI's collectives, -DBENCH_MPI), so
 * that both can be run side by side with the same flags and columns.
 *
 *   smddp_bench -p 2 -o allreduce -b 8 -e 64M -f 2 --ref memcpy
 *   smddp_bench -p 2 -o allgather -b 8 -e 64M -f 2 --ref memcpy --mem pool
 *   mpirun -np 2 smddp_bench_mpi -o allreduce -b 8 -e 64M -f 2
 *
 * smddp_bench also prints the mean skew per call: how much later the last
 * rank arrived than the first (smddp_comm_get_stats), which with every rank
 * on a core of its own should be far below the time.
 *
 * busbw uses nccl-tests' factors: allreduce 2(n-1)/n; allgather and
 * reduce_scatter (n-1)/n with bytes = the whole gathered array; alltoall
 * (n-1)/n; broadcast and reduce (to rank 0) 1. Time is the slowest rank's
 * mean per iteration.
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef BENCH_MPI
#include <mpi.h>
#endif
#include "smddp/smddp.h"
#ifndef BENCH_MPI
#include "spawn.h"
#endif

typedef enum {
    OP_ALLREDUCE,
    OP_ALLGATHER,
    OP_REDUCE_SCATTER,
    OP_BROADCAST,
    OP_ALLTOALL,
    OP_REDUCE
} bench_op_t;
static const char *const op_names[] = {"allreduce", "allgather", "reduce_scatter", "broadcast",
                                       "alltoall",  "reduce"};

typedef struct bench_args {
    bench_op_t op;
    smddp_dtype_t dtype;
    smddp_op_t redop;
    size_t min_bytes, max_bytes;
    double factor;
    int iters, warmup;
    int check;
    int spawn;
    int csv;
    int ref_memcpy;
    int inplace;
    int bind;
    int pool; /* --mem pool: buffers from smddp_mem_alloc */
    double startup_at; /* --startup: measure start-up from this Unix time (0: from now) */
    int startup;
} bench_args_t;

static int rank, nranks;
#ifndef BENCH_MPI
static smddp_comm_t comm;
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *fmt, const char *arg)
{
    fprintf(stderr, "smddp_bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    exit(2);
}

static size_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) die("bad size \"%s\" (examples: 8, 4K, 64M, 1G)", s);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    case '\0': break;
    default: die("bad size suffix in \"%s\" (K, M or G)", s);
    }
    return (size_t)v;
}

static smddp_dtype_t parse_dtype(const char *s)
{
    const char *names[][2] = {{"int8", "i8"},    {"uint8", "u8"},     {"int32", "int"},
                              {"int64", "i64"},  {"float16", "half"}, {"bfloat16", "bf16"},
                              {"float32", "float"}, {"float64", "double"}};
    for (int i = 0; i < SMDDP_DTYPE_COUNT; i++)
        if (!strcasecmp(s, names[i][0]) || !strcasecmp(s, names[i][1])) return (smddp_dtype_t)i;
    die("unknown dtype \"%s\"; accepted: int8 uint8 int32 int64 float16 bfloat16 float32 float64", s);
    return SMDDP_FLOAT32;
}

static smddp_op_t parse_redop(const char *s)
{
    for (int i = 0; i < SMDDP_OP_COUNT; i++)
        if (!strcasecmp(s, smddp_op_name((smddp_op_t)i))) return (smddp_op_t)i;
    die("unknown op \"%s\"; accepted: sum prod min max avg premul_sum band bor bxor", s);
    return SMDDP_SUM;
}

static void usage(void)
{
    printf("usage: smddp_bench [options]\n"
           "  -o, --op NAME        allreduce | allgather | reduce_scatter | broadcast | alltoall |\n"
           "                       reduce (to rank 0)\n"
           "  -d, --datatype T     int8 uint8 int32 int64 float16 bfloat16 float32 (default) float64\n"
           "  -r, --redop OP       sum (default) prod min max avg premul_sum band bor bxor\n"
           "  -b, --minbytes N     smallest size (default 8)\n"
           "  -e, --maxbytes N     largest size (default 64M)\n"
           "  -f, --stepfactor F   multiply the size by F each step (default 2)\n"
           "  -n, --iters N        timed iterations per size (default 20)\n"
           "  -w, --warmup_iters N untimed iterations per size (default 5)\n"
           "  -c, --check 0|1      check results (default 1)\n"
           "  -i, --inplace 0|1    in-place operation (default 0)\n"
           "  -p, --procs N        spawn N local ranks (smddp_bench only; otherwise join\n"
           "                       through the launcher's environment)\n"
           "  -F, --format csv     print CSV instead of a table\n"
           "      --ref memcpy     add a single-thread memcpy rate per size, and the ratio\n"
           "      --bind 0|1       with -p, pin rank r to the r-th allowed CPU, round robin, as\n"
           "                       mpirun does by default (default 1)\n"
           "      --mem pool       buffers from smddp_mem_alloc, which peers read and write in\n"
           "                       place (smddp_bench only; default: aligned_alloc)\n"
           "      --startup AT     measure start-up instead: every rank waits until Unix time AT\n"
           "                       (0: starts at once), creates the communicator (MPI: MPI_Init)\n"
           "                       and runs one 8-byte allreduce; rank 0 prints the slowest\n"
           "                       rank's time from AT and, for smddp, the store calls, bytes,\n"
           "                       connections and threads per rank (most and total), and the\n"
           "                       store calls per second while allreduces run for 3 s\n");
}

static void parse_args(int argc, char **argv, bench_args_t *a)
{
    static const struct option longopts[] = {
        {"op", 1, NULL, 'o'},       {"datatype", 1, NULL, 'd'},    {"redop", 1, NULL, 'r'},
        {"minbytes", 1, NULL, 'b'}, {"maxbytes", 1, NULL, 'e'},    {"stepfactor", 1, NULL, 'f'},
        {"iters", 1, NULL, 'n'},    {"warmup_iters", 1, NULL, 'w'}, {"check", 1, NULL, 'c'},
        {"inplace", 1, NULL, 'i'},  {"procs", 1, NULL, 'p'},       {"format", 1, NULL, 'F'},
        {"ref", 1, NULL, 'R'},      {"help", 0, NULL, 'h'},        {"bind", 1, NULL, 'B'},
        {"mem", 1, NULL, 'M'},      {"startup", 1, NULL, 'S'},     {NULL, 0, NULL, 0}};
    *a = (bench_args_t){OP_ALLREDUCE, SMDDP_FLOAT32, SMDDP_SUM, 8, 64 << 20, 2.0, 20, 5, 1, 0, 0, 0, 0, 1, 0, 0, 0};
    int c;
    while ((c = getopt_long(argc, argv, "o:d:r:b:e:f:n:w:c:i:p:F:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': {
            int found = -1;
            for (int i = 0; i < (int)(sizeof(op_names) / sizeof(op_names[0])); i++)
                if (!strcasecmp(optarg, op_names[i])) found = i;
            if (found < 0)
                die("unknown collective \"%s\"; accepted: allreduce allgather reduce_scatter "
                    "broadcast alltoall reduce", optarg);
            a->op = (bench_op_t)found;
            break;
        }
        case 'd': a->dtype = parse_dtype(optarg); break;
        case 'r': a->redop = parse_redop(optarg); break;
        case 'b': a->min_bytes = parse_bytes(optarg); break;
        case 'e': a->max_bytes = parse_bytes(optarg); break;
        case 'f': a->factor = atof(optarg); break;
        case 'n': a->iters = atoi(optarg); break;
        case 'w': a->warmup = atoi(optarg); break;
        case 'c': a->check = atoi(optarg); break;
        case 'i': a->inplace = atoi(optarg); break;
        case 'p': a->spawn = atoi(optarg); break;
        case 'F':
            if (strcasecmp(optarg, "csv") != 0) die("unknown format \"%s\"; accepted: csv", optarg);
            a->csv = 1;
            break;
        case 'R':
            if (strcasecmp(optarg, "memcpy") != 0) die("unknown reference \"%s\"; accepted: memcpy", optarg);
            a->ref_memcpy = 1;
            break;
        case 'B': a->bind = atoi(optarg); break;
        case 'M':
            if (strcasecmp(optarg, "pool") != 0) die("unknown memory \"%s\"; accepted: pool", optarg);
#ifdef BENCH_MPI
            die("%s", "--mem pool is smddp_bench's only");
#endif
            a->pool = 1;
            break;
        case 'S':
            a->startup = 1;
            a->startup_at = atof(optarg);
            break;
        case 'h': usage(); exit(0);
        default: usage(); exit(2);
        }
    }
    if (a->factor <= 1.0) die("step factor must be > 1 (got %s)", "-f");
    if (a->iters < 1 || a->warmup < 0) die("%s", "iterations must be >= 1 and warmup >= 0");
    if (a->min_bytes > a->max_bytes) die("%s", "-b must not exceed -e");
}

/* ---- the two backends --------------------------------------------------- */

#ifdef BENCH_MPI
static MPI_Datatype mpi_type(smddp_dtype_t t)
{
    switch (t) {
    case SMDDP_INT8: return MPI_INT8_T;
    case SMDDP_UINT8: return MPI_UINT8_T;
    case SMDDP_INT32: return MPI_INT32_T;
    case SMDDP_INT64: return MPI_INT64_T;
    case SMDDP_INT16: return MPI_INT16_T;
    case SMDDP_UINT16: return MPI_UINT16_T;
    case SMDDP_UINT32: return MPI_UINT32_T;
    case SMDDP_UINT64: return MPI_UINT64_T;
    case SMDDP_FLOAT32: return MPI_FLOAT;
    case SMDDP_FLOAT64: return MPI_DOUBLE;
    default: die("MPI has no %s type", smddp_dtype_name(t)); return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(smddp_op_t op)
{
    switch (op) {
    case SMDDP_SUM: return MPI_SUM;
    case SMDDP_PROD: return MPI_PROD;
    case SMDDP_MIN: return MPI_MIN;
    case SMDDP_MAX: return MPI_MAX;
    case SMDDP_BAND: return MPI_BAND;
    case SMDDP_BOR: return MPI_BOR;
    case SMDDP_BXOR: return MPI_BXOR;
    default: die("MPI has no %s reduction", smddp_op_name(op)); return MPI_OP_NULL;
    }
}

static void run_op(const bench_args_t *a, const void *send, void *recv, size_t count)
{
    MPI_Datatype t = mpi_type(a->dtype);
    const void *s = a->inplace ? MPI_IN_PLACE : send;
    switch (a->op) {
    case OP_ALLREDUCE: MPI_Allreduce(s, recv, (int)count, t, mpi_op(a->redop), MPI_COMM_WORLD); break;
    case OP_ALLGATHER: MPI_Allgather(s, (int)count, t, recv, (int)count, t, MPI_COMM_WORLD); break;
    case OP_REDUCE_SCATTER:
        MPI_Reduce_scatter_block(a->inplace ? MPI_IN_PLACE : send, recv, (int)count, t,
                                 mpi_op(a->redop), MPI_COMM_WORLD);
        break;
    case OP_BROADCAST: MPI_Bcast(recv, (int)count, t, 0, MPI_COMM_WORLD); break;
    case OP_REDUCE:
        MPI_Reduce(a->inplace && rank == 0 ? MPI_IN_PLACE : send, recv, (int)count, t,
                   mpi_op(a->redop), 0, MPI_COMM_WORLD);
        break;
    case OP_ALLTOALL: MPI_Alltoall(send, (int)count, t, recv, (int)count, t, MPI_COMM_WORLD); break;
    }
}

static void barrier(void) { MPI_Barrier(MPI_COMM_WORLD); }
static double max_over_ranks(double v)
{
    double out;
    MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return out;
}
static int64_t sum_over_ranks(int64_t v)
{
    int64_t out;
    MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    return out;
}
#else
static void check_call(smddp_status_t st, const char *what)
{
    if (st == SMDDP_OK) return;
    fprintf(stderr, "smddp_bench rank %d: %s failed: %s: %s\n", rank, what, smddp_status_string(st),
            smddp_get_last_error(NULL));
    exit(1);
}

static void run_op(const bench_args_t *a, const void *send, void *recv, size_t count)
{
    smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
    smddp_status_t st = SMDDP_OK;
    size_t es = smddp_dtype_size(a->dtype);
    switch (a->op) {
    case OP_ALLREDUCE:
        st = smddp_allreduce(comm, a->inplace ? recv : send, recv, (int64_t)count, a->dtype,
                             a->redop, &attr, NULL);
        break;
    case OP_ALLGATHER:
        st = smddp_allgather(comm, a->inplace ? (char *)recv + (size_t)rank * count * es : send,
                             recv, (int64_t)count, a->dtype, &attr, NULL);
        break;
    case OP_REDUCE_SCATTER:
        st = smddp_reduce_scatter(comm, send,
                                  a->inplace ? (char *)send + (size_t)rank * count * es : recv,
                                  (int64_t)count, a->dtype, a->redop, &attr, NULL);
        break;
    case OP_BROADCAST: st = smddp_broadcast(comm, recv, (int64_t)count, a->dtype, 0, &attr, NULL); break;
    case OP_REDUCE:
        st = smddp_reduce(comm, a->inplace ? recv : send, recv, (int64_t)count, a->dtype, a->redop,
                          0, &attr, NULL);
        break;
    case OP_ALLTOALL: st = smddp_alltoall(comm, send, recv, (int64_t)count, a->dtype, &attr, NULL); break;
    }
    check_call(st, op_names[a->op]);
}

static void barrier(void) { check_call(smddp_barrier(comm, NULL, NULL), "barrier"); }
static double max_over_ranks(double v)
{
    double out;
    check_call(smddp_allreduce(comm, &v, &out, 1, SMDDP_FLOAT64, SMDDP_MAX, NULL, NULL), "allreduce");
    return out;
}
static int64_t sum_over_ranks(int64_t v)
{
    int64_t out;
    check_call(smddp_allreduce(comm, &v, &out, 1, SMDDP_INT64, SMDDP_SUM, NULL, NULL), "allreduce");
    return out;
}
#endif

/* ---- data and checking ----------------------------------------------------- */

/* Small integers: exact in every dtype, whatever the order of additions. */
static double value(int r, size_t i) { return (double)((r * 3 + i) % 8); }

static uint16_t f32_to_f16(float f);
static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* exact for the small integers used here */
}

static void put(void *buf, smddp_dtype_t t, size_t i, double v)
{
    switch (t) {
    case SMDDP_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case SMDDP_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case SMDDP_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case SMDDP_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case SMDDP_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case SMDDP_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    case SMDDP_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case SMDDP_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case SMDDP_FLOAT16: ((uint16_t *)buf)[i] = f32_to_f16((float)v); break;
    case SMDDP_BFLOAT16: ((uint16_t *)buf)[i] = f32_to_bf16((float)v); break;
    case SMDDP_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case SMDDP_FLOAT64: ((double *)buf)[i] = v; break;
    default: break;
    }
}

/* Small non-negative integers only (the values above and their sums). */
static uint16_t f32_to_f16(float f)
{
    if (f == 0) return 0;
    int e;
    float m = frexpf(f, &e); /* f = m * 2^e, m in [0.5, 1) */
    uint16_t mant = (uint16_t)((m * 2.0f - 1.0f) * 1024.0f + 0.5f);
    return (uint16_t)(((e - 1 + 15) << 10) | mant);
}

static double get(const void *buf, smddp_dtype_t t, size_t i)
{
    switch (t) {
    case SMDDP_INT8: return ((const int8_t *)buf)[i];
    case SMDDP_UINT8: return ((const uint8_t *)buf)[i];
    case SMDDP_INT32: return ((const int32_t *)buf)[i];
    case SMDDP_INT64: return (double)((const int64_t *)buf)[i];
    case SMDDP_INT16: return ((const int16_t *)buf)[i];
    case SMDDP_UINT16: return ((const uint16_t *)buf)[i];
    case SMDDP_UINT32: return ((const uint32_t *)buf)[i];
    case SMDDP_UINT64: return (double)((const uint64_t *)buf)[i];
    case SMDDP_FLOAT16: {
        uint16_t h = ((const uint16_t *)buf)[i];
        if ((h & 0x7fff) == 0) return 0;
        return ldexp(1.0 + (h & 0x3ff) / 1024.0, ((h >> 10) & 0x1f) - 15);
    }
    case SMDDP_BFLOAT16: {
        uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case SMDDP_FLOAT32: return ((const float *)buf)[i];
    case SMDDP_FLOAT64: return ((const double *)buf)[i];
    default: return 0;
    }
}

static double reduce_expected(smddp_op_t op, size_t i)
{
    double acc = value(0, i);
    for (int r = 1; r < nranks; r++) {
        double v = value(r, i);
        switch (op) {
        case SMDDP_PROD: acc *= v; break;
        case SMDDP_MIN: acc = v < acc ? v : acc; break;
        case SMDDP_MAX: acc = v > acc ? v : acc; break;
        case SMDDP_BAND: acc = (double)((int64_t)acc & (int64_t)v); break;
        case SMDDP_BOR: acc = (double)((int64_t)acc | (int64_t)v); break;
        case SMDDP_BXOR: acc = (double)((int64_t)acc ^ (int64_t)v); break;
        default: acc += v; break;
        }
    }
    return acc;
}

/* Fills the send buffer (and recv for in place); returns elements per rank-block. */
static void fill(const bench_args_t *a, void *send, void *recv, size_t count)
{
    size_t n = a->op == OP_ALLREDUCE || a->op == OP_BROADCAST || a->op == OP_REDUCE ? count : count * (size_t)nranks;
    for (size_t i = 0; i < n; i++) put(send, a->dtype, i, value(rank, i));
    if (a->op == OP_BROADCAST)
        for (size_t i = 0; i < count; i++) put(recv, a->dtype, i, rank == 0 ? value(0, i) : 0);
    if (a->inplace && (a->op == OP_ALLREDUCE || a->op == OP_REDUCE))
        for (size_t i = 0; i < count; i++) put(recv, a->dtype, i, value(rank, i));
    if (a->inplace && a->op == OP_ALLGATHER)
        for (size_t i = 0; i < count; i++) put(recv, a->dtype, (size_t)rank * count + i, value(rank, i));
}

/*
 * Relative error allowed in a checked float result: one rounding to the
 * dtype (bf16 keeps 8 bits, fp16 11) on top of the inputs' own rounding.
 */
static double tolerance(smddp_dtype_t dtype)
{
    return dtype == SMDDP_BFLOAT16 ? 1e-2 : dtype == SMDDP_FLOAT16 ? 2e-3 : 1e-3;
}

static int64_t count_wrong(const bench_args_t *a, const void *send, const void *recv, size_t count)
{
    int64_t wrong = 0;
    size_t es = smddp_dtype_size(a->dtype);
    switch (a->op) {
    case OP_REDUCE:
        if (rank != 0) break; /* only the root's output is defined */
        /* fall through */
    case OP_ALLREDUCE:
        for (size_t i = 0; i < count; i++) {
            double want = reduce_expected(a->redop, i);
            if (a->redop == SMDDP_AVG) {
                want /= nranks;
                bool fl = a->dtype == SMDDP_FLOAT16 || a->dtype == SMDDP_BFLOAT16 ||
                          a->dtype == SMDDP_FLOAT32 || a->dtype == SMDDP_FLOAT64;
                if (!fl) want = trunc(want);
            }
            if (a->dtype == SMDDP_INT8) want = (int8_t)(int64_t)want;
            if (a->dtype == SMDDP_UINT8) want = (uint8_t)(int64_t)want;
            wrong += fabs(get(recv, a->dtype, i) - want) > tolerance(a->dtype) * fabs(want) + 1e-6;
        }
        break;
    case OP_ALLGATHER:
        for (int r = 0; r < nranks; r++)
            for (size_t i = 0; i < count; i++)
                wrong += get(recv, a->dtype, (size_t)r * count + i) != value(r, i);
        break;
    case OP_REDUCE_SCATTER: {
        const void *out = a->inplace ? (const char *)send + (size_t)rank * count * es : recv;
        for (size_t i = 0; i < count; i++) {
            double want = reduce_expected(a->redop, (size_t)rank * count + i);
            if (a->dtype == SMDDP_INT8) want = (int8_t)(int64_t)want;
            if (a->dtype == SMDDP_UINT8) want = (uint8_t)(int64_t)want;
            if (a->redop == SMDDP_AVG) want /= nranks;
            wrong += fabs(get(out, a->dtype, i) - want) > tolerance(a->dtype) * fabs(want) + 1e-6;
        }
        break;
    }
    case OP_BROADCAST:
        for (size_t i = 0; i < count; i++) wrong += get(recv, a->dtype, i) != value(0, i);
        break;
    case OP_ALLTOALL:
        for (int r = 0; r < nranks; r++)
            for (size_t i = 0; i < count; i++)
                wrong += get(recv, a->dtype, (size_t)r * count + i) != value(r, (size_t)rank * count + i);
        break;
    }
    return wrong;
}

/* Single-thread memcpy rate for `bytes`, GB/s, measured here and now. */
static double memcpy_rate(size_t bytes, int iters)
{
    size_t n = bytes ? bytes : 1;
    char *src = malloc(n), *dst = malloc(n);
    memset(src, 1, n);
    memset(dst, 2, n);
    memcpy(dst, src, n);
    /* At least ~50 ms of copying, so that timer resolution does not matter. */
    int reps = iters;
    while ((double)reps * (double)n < 2.5e8 && reps < 1000000) reps *= 2;
    double t0 = now_s();
    for (int k = 0; k < reps; k++) {
        memcpy(dst, src, n);
        __asm__ volatile("" : : "r"(dst) : "memory");
    }
    double t = (now_s() - t0) / reps;
    free(src);
    free(dst);
    return (double)n / t / 1e9;
}

/* The mean skew of the ops between two readings of smddp_comm_get_stats (MPI: none). */
typedef struct skew {
    uint64_t ops;
    int64_t sum_ns;
} skew_t;
#ifdef BENCH_MPI
#define SKEW_CSV ""
#define SKEW_HEAD ""
static skew_t skew_now(void) { return (skew_t){0, 0}; }
#else
#define SKEW_CSV ",skew_us"
#define SKEW_HEAD "  skew(us)"
static skew_t skew_now(void)
{
    smddp_comm_stats_t st = {.struct_size = sizeof(st)};
    check_call(smddp_comm_get_stats(comm, &st, NULL, 0), "smddp_comm_get_stats");
    return (skew_t){st.ops, st.skew_sum_ns};
}
#endif
static double skew_mean_us(skew_t before, skew_t after)
{
    uint64_t ops = after.ops - before.ops;
    return ops ? (double)(after.sum_ns - before.sum_ns) / (double)ops / 1e3 : 0;
}

static void run(const bench_args_t *a)
{
    size_t es = smddp_dtype_size(a->dtype);
    size_t max_count = a->max_bytes / es / (a->op == OP_ALLREDUCE || a->op == OP_BROADCAST || a->op == OP_REDUCE ? 1 : (size_t)nranks);
    size_t blocks = a->op == OP_ALLREDUCE || a->op == OP_BROADCAST || a->op == OP_REDUCE ? 1 : (size_t)nranks;
    size_t buf_bytes = (max_count * blocks * es + 64) / 64 * 64;
    char *send = NULL, *recv = NULL;
#ifndef BENCH_MPI
    if (a->pool) {
        if (smddp_mem_alloc(comm, buf_bytes, (void **)&send) != SMDDP_OK ||
            smddp_mem_alloc(comm, buf_bytes, (void **)&recv) != SMDDP_OK)
            die("smddp_mem_alloc: %s", smddp_get_last_error(comm));
    }
#endif
    if (!a->pool) {
        send = aligned_alloc(64, buf_bytes);
        recv = aligned_alloc(64, buf_bytes);
    }
    if (!send || !recv) die("%s", "out of memory");
    memset(send, 0, max_count * blocks * es);
    memset(recv, 0, max_count * blocks * es);

    if (rank == 0) {
        if (a->csv) {
            printf("size,count,type,redop,time_us,algbw_gbs,busbw_gbs,wrong%s%s\n",
                   a->ref_memcpy ? ",memcpy_gbs,algbw_over_memcpy" : "", SKEW_CSV);
        } else {
            printf("# %s, %d ranks, %s, %s, %s%s\n", op_names[a->op], nranks,
                   smddp_dtype_name(a->dtype), smddp_op_name(a->redop),
                   a->inplace ? "in place" : "out of place", a->pool ? ", buffers in pools" : "");
            printf("%12s %12s %8s %10s %12s %12s %12s %8s%s%s\n", "size(B)", "count", "type",
                   "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong",
                   a->ref_memcpy ? "  memcpy(GB/s)  ratio" : "", SKEW_HEAD);
        }
    }
    double busfactor = 1.0;
    switch (a->op) {
    case OP_ALLREDUCE: busfactor = 2.0 * (nranks - 1) / nranks; break;
    case OP_ALLGATHER:
    case OP_REDUCE_SCATTER:
    case OP_ALLTOALL: busfactor = (double)(nranks - 1) / nranks; break;
    case OP_BROADCAST:
    case OP_REDUCE: busfactor = 1.0; break;
    }
    int64_t total_wrong = 0;
    for (size_t bytes = a->min_bytes; bytes <= a->max_bytes;) {
        size_t count = bytes / es / blocks;
        size_t total = count * es * blocks; /* nccl-tests' "size" */
        int64_t wrong = 0;
        if (a->check) {
            fill(a, send, recv, count);
            run_op(a, send, recv, count);
            wrong = sum_over_ranks(count_wrong(a, send, recv, count));
            total_wrong += wrong;
        }
        for (int k = 0; k < a->warmup; k++) run_op(a, send, recv, count);
        barrier();
        skew_t s0 = skew_now();
        double t0 = now_s();
        for (int k = 0; k < a->iters; k++) run_op(a, send, recv, count);
        double elapsed = now_s() - t0;
        double skew_us = skew_mean_us(s0, skew_now());
        double t = max_over_ranks(elapsed / a->iters);
        double ref = 0;
        if (a->ref_memcpy) {
            barrier();
            if (rank == 0) ref = memcpy_rate(total, a->iters);
            barrier();
        }
        if (rank == 0) {
            double algbw = (double)total / t / 1e9;
            double busbw = algbw * busfactor;
            if (a->csv)
                printf("%zu,%zu,%s,%s,%.2f,%.3f,%.3f,%lld", total, count,
                       smddp_dtype_name(a->dtype), smddp_op_name(a->redop), t * 1e6, algbw, busbw,
                       (long long)wrong);
            else
                printf("%12zu %12zu %8s %10s %12.2f %12.3f %12.3f %8lld", total, count,
                       smddp_dtype_name(a->dtype), smddp_op_name(a->redop), t * 1e6, algbw, busbw,
                       (long long)wrong);
            if (a->ref_memcpy) printf(a->csv ? ",%.3f,%.3f" : "  %12.3f %6.3f", ref, algbw / ref);
#ifndef BENCH_MPI
            printf(a->csv ? ",%.2f" : " %9.2f", skew_us);
#else
            (void)skew_us;
#endif
            printf("\n");
            fflush(stdout);
        }
        size_t next = (size_t)((double)bytes * a->factor);
        bytes = next > bytes ? next : bytes + 1;
    }
    if (rank == 0 && !a->csv)
        printf("# %s: %lld wrong element(s) in total\n", total_wrong ? "FAILED" : "OK",
               (long long)total_wrong);
#ifndef BENCH_MPI
    if (a->pool) {
        smddp_mem_free(send);
        smddp_mem_free(recv);
        send = recv = NULL;
    }
#endif
    free(send);
    free(recv);
    if (total_wrong) exit(1);
}

#ifndef BENCH_MPI
/* -p N: fork N ranks that rendezvous through the built-in store. */
static void spawn(int n, int do_bind)
{
    int r = bench_spawn(n);
    if (do_bind) bench_bind_to_cpu(r);
}
#endif

/* ---- start-up ------------------------------------------------------------- */

static double unix_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Until Unix time at (a common start for every rank, after they were all launched). */
static double wait_until(double at)
{
    double now = unix_now();
    if (at <= 0) return now;
    if (now > at) {
        fprintf(stderr, "smddp_bench: --startup %.3f was %.3f s ago when this rank began; "
                "give a later time\n", at, now - at);
        exit(2);
    }
    while ((now = unix_now()) < at) {
        double left = at - now;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
    return at;
}

/* The threads of this process (the Threads line of /proc/self/status), -1 if unknown. */
static int64_t process_threads(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int64_t n = -1;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "Threads:", 8)) n = atoll(line + 8);
    if (f) fclose(f);
    return n;
}

#ifndef BENCH_MPI
/*
 * Store calls per second on this rank while 8-byte allreduces run for about
 * secs (the straggler telemetry's traffic; every rank stops at once).
 */
static double steady_store_rate(double secs)
{
    smddp_comm_stats_t a = {.struct_size = sizeof(a)}, b = {.struct_size = sizeof(b)};
    check_call(smddp_comm_get_stats(comm, &a, NULL, 0), "smddp_comm_get_stats");
    double t0 = unix_now(), t;
    float x = 1, y = 0;
    do {
        for (int i = 0; i < 100; i++)
            check_call(smddp_allreduce(comm, &x, &y, 1, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL),
                       "allreduce");
        t = unix_now();
    } while (max_over_ranks(t - t0 >= secs ? 1.0 : 0.0) == 0);
    check_call(smddp_comm_get_stats(comm, &b, NULL, 0), "smddp_comm_get_stats");
    return (double)(b.store_ops - a.store_ops) / (t - t0);
}
#endif

static void startup_report(double start, double ready)
{
    double secs = max_over_ranks(ready - start);
#ifdef BENCH_MPI
    int64_t threads = (int64_t)max_over_ranks((double)process_threads());
    if (rank == 0)
        printf("# start-up, MPI: %d ranks\nranks,startup_s,process_threads\n%d,%.3f,%lld\n",
               nranks, nranks, secs, (long long)threads);
#else
    smddp_comm_stats_t st = {.struct_size = sizeof(st)};
    check_call(smddp_comm_get_stats(comm, &st, NULL, 0), "smddp_comm_get_stats");
    int nodes = 0;
    smddp_comm_node_count(comm, &nodes);
    /* Each count's most on one rank, and its total (the store's load, for store calls). */
    const int64_t mine[] = {(int64_t)st.create_store_ops, (int64_t)st.store_ops,
                            (int64_t)st.store_bytes, st.connections, st.threads,
                            process_threads()};
    enum { N = sizeof(mine) / sizeof(mine[0]) };
    int64_t most[N], total[N];
    double create_s = max_over_ranks((double)st.create_ns * 1e-9);
    double rate = steady_store_rate(3.0);
    double rate_most = max_over_ranks(rate), rate_total = (double)sum_over_ranks((int64_t)rate);
    for (int i = 0; i < N; i++) {
        most[i] = (int64_t)max_over_ranks((double)mine[i]);
        total[i] = sum_over_ranks(mine[i]);
    }
    if (rank == 0)
        printf("# start-up, smddp: %d ranks on %d node(s); per rank: most (total over ranks)\n"
               "ranks,nodes,startup_s,create_s,create_store_ops,store_ops,store_ops_total,store_bytes,"
               "store_bytes_total,connections,connections_total,threads,process_threads,"
               "steady_store_ops_s,steady_store_ops_s_total\n"
               "%d,%d,%.3f,%.3f,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%.0f,%.0f\n",
               nranks, nodes, nranks, nodes, secs, create_s, (long long)most[0], (long long)most[1],
               (long long)total[1], (long long)most[2], (long long)total[2], (long long)most[3],
               (long long)total[3], (long long)most[4], (long long)most[5], rate_most,
               rate_total);
#endif
}

int main(int argc, char **argv)
{
    bench_args_t a;
    parse_args(argc, argv, &a);
    double start = 0;
    float x = 1, y = 0;
#ifdef BENCH_MPI
    if (a.spawn) die("%s", "-p is for smddp_bench; start smddp_bench_mpi with mpirun -np N");
    if (a.dtype == SMDDP_FLOAT16 || a.dtype == SMDDP_BFLOAT16)
        die("MPI has no %s type", smddp_dtype_name(a.dtype));
    if (a.startup) start = wait_until(a.startup_at);
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (a.startup) {
        MPI_Allreduce(&x, &y, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        startup_report(start, unix_now());
    } else {
        run(&a);
    }
    MPI_Finalize();
#else
    if (a.spawn > 0) spawn(a.spawn, a.bind);
    if (a.startup) start = wait_until(a.startup_at);
    smddp_status_t st = smddp_comm_create_from_env(NULL, &comm);
    check_call(st, "smddp_comm_create_from_env");
    smddp_comm_rank(comm, &rank);
    smddp_comm_size(comm, &nranks);
    if (a.startup) {
        check_call(smddp_allreduce(comm, &x, &y, 1, SMDDP_FLOAT32, SMDDP_SUM, NULL, NULL),
                   "allreduce");
        startup_report(start, unix_now());
        barrier(); /* no rank waits in the report when rank 0, whose process serves the store, exits */
    } else {
        run(&a);
    }
    smddp_comm_destroy(comm);
#endif
    return 0;
}
