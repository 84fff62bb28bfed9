/*
 * A stand-in for libnccl.so.2 on machines without NCCL or a GPU: the calls
 * the interposer passes through, each counted, working on host memory as a
 * world of one rank (allreduce, allgather and reduce_scatter copy). The
 * interposer tests link it after libsmddp's copy, so that dlsym(RTLD_NEXT)
 * finds it as it would find the real NCCL.
 */
#include <string.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

static int n_allreduce, n_allgather, n_reduce_scatter, n_group_start, n_group_end, n_destroy,
    n_abort;
static void *last_comm;

FAKE_EXPORT int fake_nccl_calls(const char *name)
{
    if (!strcmp(name, "ncclAllReduce")) return n_allreduce;
    if (!strcmp(name, "ncclAllGather")) return n_allgather;
    if (!strcmp(name, "ncclReduceScatter")) return n_reduce_scatter;
    if (!strcmp(name, "ncclGroupStart")) return n_group_start;
    if (!strcmp(name, "ncclGroupEnd")) return n_group_end;
    if (!strcmp(name, "ncclCommDestroy")) return n_destroy;
    if (!strcmp(name, "ncclCommAbort")) return n_abort;
    return -1;
}

FAKE_EXPORT void *fake_nccl_last_comm(void)
{
    return last_comm;
}

static size_t size_of(int dtype)
{
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
    return dtype >= 0 && dtype < 10 ? sizes[dtype] : 1;
}

FAKE_EXPORT int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op,
                              void *comm, void *stream)
{
    (void)op, (void)stream;
    n_allreduce++;
    last_comm = comm;
    memmove(recv, send, count * size_of(dtype));
    return 0;
}

FAKE_EXPORT int ncclReduceScatter(const void *send, void *recv, size_t count, int dtype, int op,
                                  void *comm, void *stream)
{
    (void)op, (void)stream;
    n_reduce_scatter++;
    last_comm = comm;
    memmove(recv, send, count * size_of(dtype));
    return 0;
}

FAKE_EXPORT int ncclAllGather(const void *send, void *recv, size_t count, int dtype, void *comm,
                              void *stream)
{
    (void)stream;
    n_allgather++;
    last_comm = comm;
    memmove(recv, send, count * size_of(dtype));
    return 0;
}

FAKE_EXPORT int ncclGroupStart(void)
{
    n_group_start++;
    return 0;
}

FAKE_EXPORT int ncclGroupEnd(void)
{
    n_group_end++;
    return 0;
}

FAKE_EXPORT int ncclCommDestroy(void *comm)
{
    n_destroy++;
    last_comm = comm;
    return 0;
}

FAKE_EXPORT int ncclCommAbort(void *comm)
{
    n_abort++;
    last_comm = comm;
    return 0;
}
