/*
 * Point-to-point through shared memory: a byte stream per ordered pair of
 * local ranks (a ring buffer in the segment), never blocking: put and get
 * move what fits or what is there and return how much.
 */
#include <string.h>

#include "shm_segment.h"

static ring_ctrl_t *ring_of(smddp__shm_t *s, int p, int src, int dst)
{
    return &s->rings[src * p + dst];
}

static char *ring_data_of(smddp__shm_t *s, int p, int src, int dst)
{
    return s->ring_data + ((size_t)src * (size_t)p + (size_t)dst) * s->ring_size;
}

size_t smddp__shm_ring_put(smddp_comm_t comm, int dst_lr, const void *src, size_t len)
{
    smddp__shm_t *s = comm->shm;
    ring_ctrl_t *r = ring_of(s, comm->local_size, comm->local_rank, dst_lr);
    char *data = ring_data_of(s, comm->local_size, comm->local_rank, dst_lr);
    const char *p = src;
    size_t done = 0;
    uint64_t tail = atomic_load_explicit(&r->tail.bytes, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&r->head.bytes, memory_order_acquire);
    while (done < len && tail - head < s->ring_size) {
        size_t space = s->ring_size - (size_t)(tail - head);
        size_t off = (size_t)(tail % s->ring_size);
        size_t n = SMDDP_MIN(len - done, SMDDP_MIN(space, s->ring_size - off));
        if (p) memcpy(data + off, p + done, n);
        done += n;
        tail += n;
    }
    if (done) {
        atomic_store(&r->tail.bytes, tail);
        atomic_fetch_add(&r->tail.tick, 1);
        smddp__shm_wake(&r->tail.tick, &r->tail.sleepers);
    }
    return done;
}

size_t smddp__shm_ring_get(smddp_comm_t comm, int src_lr, void *dst, size_t len)
{
    smddp__shm_t *s = comm->shm;
    ring_ctrl_t *r = ring_of(s, comm->local_size, src_lr, comm->local_rank);
    char *data = ring_data_of(s, comm->local_size, src_lr, comm->local_rank);
    char *p = dst;
    size_t done = 0;
    uint64_t head = atomic_load_explicit(&r->head.bytes, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->tail.bytes, memory_order_acquire);
    while (done < len && tail > head) {
        size_t off = (size_t)(head % s->ring_size);
        size_t n = SMDDP_MIN(len - done, SMDDP_MIN((size_t)(tail - head), s->ring_size - off));
        if (p) memcpy(p + done, data + off, n);
        done += n;
        head += n;
    }
    if (done) {
        atomic_store(&r->head.bytes, head);
        atomic_fetch_add(&r->head.tick, 1);
        smddp__shm_wake(&r->head.tick, &r->head.sleepers);
    }
    return done;
}

size_t smddp__shm_ring_avail(smddp_comm_t comm, int src_lr)
{
    smddp__shm_t *s = comm->shm;
    ring_ctrl_t *r = ring_of(s, comm->local_size, src_lr, comm->local_rank);
    return (size_t)(atomic_load_explicit(&r->tail.bytes, memory_order_acquire) -
                    atomic_load_explicit(&r->head.bytes, memory_order_relaxed));
}
