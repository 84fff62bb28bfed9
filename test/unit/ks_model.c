/* The CPU model of the collective kernels (ks_model.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "ks_model.h"

#define LANES 4 /* "threads" per model block, as blockDim.x */
#define THREADS 512 /* ipc_kernels.cu's kThreads, for the grid's size */

typedef struct block_arg {
    const smddp__ks_comm_t *c;
    const smddp__ks_job_t *j;
    const smddp__reduce_spec_t *spec;
    const ks_model_opts_t *o;
    int b, blocks;
    unsigned seed;
    uint32_t result;
} block_arg_t;

static void nap(block_arg_t *a)
{
    if (a->o->delay_us > 0 && rand_r(&a->seed) % 3 == 0)
        usleep((useconds_t)(rand_r(&a->seed) % (unsigned)a->o->delay_us));
}

/* The job's bytes of vector at off (the rest of a last, partial vector is not the job's). */
static void copy_valid(char *dst, const char *src, size_t off, size_t bytes)
{
    size_t n = bytes - off < SMDDP_KS_VEC ? bytes - off : SMDDP_KS_VEC;
    memcpy(dst, src, n);
}

/* Peers' data read where it was registered, not from their scratch (ks_model.h). */
_Atomic unsigned long ks_model_in_place_reads;

/* sources(): every rank's data for the launch, at row `row` of it. */
static void sources(const block_arg_t *a, int row, const char **src)
{
    for (int q = 0; q < a->c->nranks; q++) {
        size_t stride;
        src[q] = smddp__ks_src(a->c, a->j, a->b, q, &stride) + (size_t)row * stride;
        if (q != a->c->rank && src[q] != smddp__ks_scratch(a->c, q) + (size_t)row * stride)
            ks_model_in_place_reads++;
    }
}

/* reduce_vec: every rank's vector at offset off of src, in rank order. */
static void reduce_vec(const block_arg_t *a, const char *const *src, size_t off,
                       char out[SMDDP_KS_VEC])
{
    const void *srcs[SMDDP_KS_MAX_RANKS];
    for (int q = 0; q < a->c->nranks; q++) srcs[q] = src[q] + off;
    smddp__reduce(a->spec, out, srcs, a->c->nranks, SMDDP_KS_VEC / smddp__dtype_size(a->spec->dtype));
}

#define FOR_OWNED(i, lo, hi)                                                                  \
    for (size_t t_ = 0; t_ < LANES; t_++)                                                     \
        for (size_t i = smddp__ks_first((lo), (size_t)a->b * LANES + t_, stride); i < (hi); \
             i += stride)

/* One block: reduce_kernel's or gather_kernel's phases, in the same order. */
static uint32_t model_block(block_arg_t *a)
{
    const smddp__ks_comm_t *c = a->c;
    const smddp__ks_job_t *j = a->j;
    const size_t nvec = smddp__ks_vectors(j->bytes), stride = (size_t)a->blocks * LANES;
    const bool rs = j->kind == SMDDP_KS_REDUCE_SCATTER;
    const int last = j->kind == SMDDP_KS_ALLREDUCE_TWOSHOT ? 2 : 1;
    char *own = smddp__ks_scratch(c, c->rank);
    const char *in = j->in;
    char *out = j->out;
    const char *src[SMDDP_KS_MAX_RANKS];
    uint32_t e, r;
    if (!smddp__ks_begin(c, a->b, &e)) return SMDDP_KS_ABORTED;

    smddp__ks_publish_src(c, j, a->b);
    if (!j->slot)
        for (int row = 0; row < (rs ? c->nranks : 1); row++)
            FOR_OWNED(i, 0, nvec) {
                size_t off = i * SMDDP_KS_VEC;
                char v[SMDDP_KS_VEC] = {0};
                copy_valid(v, in + (size_t)row * j->pitch + off, off, j->bytes);
                memcpy(own + (size_t)row * nvec * SMDDP_KS_VEC + off, v, sizeof(v));
            }
    nap(a);
    if ((r = smddp__ks_arrive_wait(c, 0, a->b, e, 0, 1)) != SMDDP_KS_OK) return r;
    if (a->o->slow_us > 0 && c->rank == a->o->slow_rank) usleep((useconds_t)a->o->slow_us);
    nap(a);
    sources(a, rs ? c->rank : 0, src);

    if (j->kind == SMDDP_KS_ALLGATHER) {
        for (int q = 0; q < c->nranks; q++) {
            if (src[q] == out + (size_t)q * j->pitch) continue;
            FOR_OWNED(i, 0, nvec) {
                size_t off = i * SMDDP_KS_VEC;
                copy_valid(out + (size_t)q * j->pitch + off, src[q] + off, off, j->bytes);
            }
        }
    } else if (j->kind != SMDDP_KS_ALLREDUCE_TWOSHOT) {
        FOR_OWNED(i, 0, nvec) {
            size_t off = i * SMDDP_KS_VEC;
            char v[SMDDP_KS_VEC];
            reduce_vec(a, src, off, v);
            copy_valid(out + off, v, off, j->bytes);
        }
    } else {
        size_t lo, hi;
        smddp__ks_piece(nvec, c->nranks, c->rank, &lo, &hi);
        FOR_OWNED(i, lo, hi) {
            char v[SMDDP_KS_VEC];
            reduce_vec(a, src, i * SMDDP_KS_VEC, v);
            memcpy(own + i * SMDDP_KS_VEC, v, sizeof(v));
        }
        nap(a);
        if ((r = smddp__ks_arrive_wait(c, 1, a->b, e, 0, 1)) != SMDDP_KS_OK) return r;
        FOR_OWNED(i, 0, nvec) {
            size_t off = i * SMDDP_KS_VEC;
            int q = smddp__ks_piece_of(nvec, c->nranks, i);
            copy_valid(out + off, smddp__ks_scratch(c, q) + off, off, j->bytes);
        }
    }
    nap(a);
    if (a->o->skip_last) return SMDDP_KS_OK;
    return smddp__ks_arrive_wait(c, last, a->b, e, 0, 1);
}

static void *block_main(void *p)
{
    block_arg_t *a = p;
    a->result = model_block(a);
    return NULL;
}

uint32_t ks_model_launch(const smddp__ks_comm_t *c, const smddp__ks_job_t *job,
                         const smddp__reduce_spec_t *spec, int blocks, const ks_model_opts_t *opts)
{
    static const ks_model_opts_t none = {0};
    if (job->bytes == 0) return SMDDP_KS_OK;
    if (blocks < 1 || blocks > 64) abort();
    pthread_t th[64];
    block_arg_t args[64];
    for (int b = 0; b < blocks; b++) {
        args[b] = (block_arg_t){c, job, spec, opts ? opts : &none, b, blocks,
                                (opts ? opts->seed : 0) * 131u + (unsigned)b, 0};
        if (pthread_create(&th[b], NULL, block_main, &args[b]) != 0) abort();
    }
    uint32_t worst = SMDDP_KS_OK;
    for (int b = 0; b < blocks; b++) {
        pthread_join(th[b], NULL);
        if (args[b].result != SMDDP_KS_OK) worst = args[b].result;
    }
    return worst;
}

int ks_model_grid(const smddp__ks_comm_t *c, const smddp__ks_job_t *job)
{
    size_t blocks = (smddp__ks_vectors(job->bytes) + THREADS - 1) / THREADS;
    if (blocks > (size_t)c->max_blocks) blocks = (size_t)c->max_blocks;
    if (blocks > SMDDP_KS_MAX_BLOCKS) blocks = SMDDP_KS_MAX_BLOCKS;
    return blocks ? (int)blocks : 1;
}
