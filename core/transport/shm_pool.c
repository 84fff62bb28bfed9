/*
 * Pools: memory that the ranks of a node read and write in place.
 *
 * After the segment (shm.c) every local rank makes one shared file of
 * SMDDP_SHM_POOL_SIZE bytes (sparse: nothing is backed until allocated),
 * maps it and publishes its name through the store; after a barrier it maps
 * every peer's, and the names go after a second one.
 * smddp_mem_alloc hands out ranges of this rank's pool, backing each with
 * fallocate first, so that a full /dev/shm is an allocation error and never
 * a SIGBUS later, and refusing to take /dev/shm below
 * SMDDP_SHM_POOL_RESERVE_PCT free. A freed range stays backed, ready for the
 * next allocation, until it has been idle SMDDP_SHM_POOL_RELEASE_MS; then
 * the next collective that publishes into the pool gives its memory back
 * (FALLOC_FL_PUNCH_HOLE), so memory freed once for good (DDP's first
 * buckets, rebuilt after its first step) does not stay taken.
 *
 * A collective whose buffers lie in pools says so before its first post: the
 * pool record in its metadata slot holds the offsets of its input and output
 * (1 + offset; 0: not in the pool), tagged with the value of that post.
 * After waiting for a peer's post, a rank reads the peer's record; a record
 * tagged otherwise belongs to another step, which means the peer's buffers
 * were not in its pool for this one. So a rank that publishes a record its
 * peers act on leaves the step only after every peer is done with it (an
 * input peers read in place, and the in-place buffers whose record decides
 * the next allreduce's algorithm; see coll/).
 *
 * A pool outlives its communicator while allocations from it are alive:
 * each allocation holds a reference, so torch tensors freed late stay valid.
 * smddp_mem_free finds the pool by address in the process's list of pools.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "../param.h"
#include "shm_segment.h"

#define POOL_ALIGN 4096

typedef struct range {
    size_t off, len;
    int64_t free_ns; /* free ranges: when it was last freed (smddp__now_ns) */
    struct range *next;
} range_t;

struct smddp__pool {
    char *base;
    size_t size;
    int fd;
    range_t *free_list; /* sorted by offset, coalesced */
    range_t *used;
    range_t *holes; /* the parts of the file not backed: sorted by offset, coalesced */
    int refs; /* the communicator's, and one per live allocation */
    bool abandoned; /* an op on it failed: freed ranges are not handed out again */
    /* The earliest time a free range is due to be given back (INT64_MAX: none). */
    _Atomic int64_t release_at_ns;
    struct smddp__pool *next;
};

/* tag: the op's seq in the high 32 bits, the post's counter value in the low ones. */
typedef struct pool_record {
    _Atomic uint64_t tag;
    uint64_t in_ref, out_ref;
} pool_record_t;

_Static_assert(META_POOL_RECORD >= sizeof(smddp__op_desc_t) &&
                   META_POOL_RECORD + sizeof(pool_record_t) <= META_CMA_RECORD,
               "the pool record fits the metadata slot after the desc");

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static struct smddp__pool *pools; /* every live pool of the process */

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Unmaps and frees a pool; pools_lock held. */
static void pool_release(struct smddp__pool *pool)
{
    if (--pool->refs > 0) return;
    for (struct smddp__pool **pp = &pools; *pp; pp = &(*pp)->next)
        if (*pp == pool) {
            *pp = pool->next;
            break;
        }
    munmap(pool->base, pool->size);
    close(pool->fd);
    for (range_t *r = pool->free_list, *n; r; r = n) n = r->next, free(r);
    for (range_t *r = pool->used, *n; r; r = n) n = r->next, free(r);
    for (range_t *r = pool->holes, *n; r; r = n) n = r->next, free(r);
    free(pool);
}

static smddp_status_t map_file(int fd, size_t size, const char *name, char **out)
{
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (base == MAP_FAILED)
        return smddp__error(SMDDP_ERR_SYSTEM,
                            "cannot map the %zu-byte pool %s: %s (SMDDP_SHM_POOL_SIZE sets its "
                            "size; 0 turns pools off)",
                            size, name, strerror(errno));
    *out = base;
    return SMDDP_OK;
}

static smddp_status_t create_own(smddp__shm_t *s, size_t size)
{
    struct smddp__pool *pool = calloc(1, sizeof(*pool));
    range_t *all = calloc(1, sizeof(*all)), *hole = calloc(1, sizeof(*hole));
    smddp_status_t st = SMDDP_OK;
    if (!pool || !all || !hole) {
        free(pool);
        free(all);
        free(hole);
        return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate a pool");
    }
    pool->fd = -1;
    SMDDP_CHECK_GOTO(smddp__shm_random_name(s->pool_name, sizeof(s->pool_name)), st, fail);
    pool->fd = shm_open(s->pool_name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (pool->fd < 0) {
        st = smddp__error(SMDDP_ERR_SYSTEM, "shm_open(%s) failed: %s", s->pool_name,
                          strerror(errno));
        s->pool_name[0] = '\0';
        goto fail;
    }
    if (ftruncate(pool->fd, (off_t)size) != 0) {
        st = smddp__error(SMDDP_ERR_SYSTEM,
                          "cannot size the pool %s to %zu bytes: %s (SMDDP_SHM_POOL_SIZE sets "
                          "its size; 0 turns pools off)",
                          s->pool_name, size, strerror(errno));
        goto fail;
    }
    SMDDP_CHECK_GOTO(map_file(pool->fd, size, s->pool_name, &pool->base), st, fail);
    pool->size = size;
    all->len = size;
    pool->free_list = all;
    hole->len = size;
    pool->holes = hole;
    atomic_init(&pool->release_at_ns, INT64_MAX);
    pool->refs = 1;
    pthread_mutex_lock(&pools_lock);
    pool->next = pools;
    pools = pool;
    pthread_mutex_unlock(&pools_lock);
    s->pool = pool;
    return SMDDP_OK;

fail:
    if (pool->fd >= 0) close(pool->fd);
    free(pool);
    free(all);
    free(hole);
    return st;
}

/* Unmaps every peer's pool and drops this rank's (its allocations keep it). */
static void unmap_all(smddp_comm_t comm, smddp__shm_t *s)
{
    if (s->pool_name[0]) shm_unlink(s->pool_name);
    s->pool_name[0] = '\0';
    if (s->peer_pool) {
        for (int q = 0; q < comm->local_size; q++)
            if (q != comm->local_rank && s->peer_pool[q]) munmap(s->peer_pool[q], s->pool_size);
        free(s->peer_pool);
        s->peer_pool = NULL;
    }
    if (s->pool) {
        pthread_mutex_lock(&pools_lock);
        pool_release(s->pool);
        pthread_mutex_unlock(&pools_lock);
        s->pool = NULL;
    }
}

/* Every local rank's published value under <prefix>/<what>/<node>/<lr> into vals[lr]. */
static smddp_status_t gather_values(smddp_comm_t comm, const char *what, char (*vals)[96])
{
    char key[512];
    for (int q = 0; q < comm->local_size; q++) {
        if (q == comm->local_rank) continue;
        void *val = NULL;
        size_t vlen = 0;
        snprintf(key, sizeof(key), "%s/%s/%d/%d", comm->prefix, what, comm->node, q);
        SMDDP_CHECK(smddp__store_get(comm->store, key, comm->timeout_ms, &val, &vlen));
        if (vlen == 0 || vlen > 96 || ((char *)val)[vlen - 1] != '\0') {
            free(val);
            return smddp__error(SMDDP_ERR_STORE, "malformed value under store key %s", key);
        }
        memcpy(vals[q], val, vlen);
        free(val);
    }
    return SMDDP_OK;
}

static smddp_status_t publish_value(smddp_comm_t comm, const char *what, const char *val)
{
    char key[512];
    snprintf(key, sizeof(key), "%s/%s/%d/%d", comm->prefix, what, comm->node, comm->local_rank);
    return smddp__store_set(comm->store, key, val, strlen(val) + 1);
}

/* Maps local rank q's pool, named in val ("NAME SIZE"); false (with the reason in why) if not. */
static bool map_peer(smddp__shm_t *s, int q, char *val, char *why, size_t cap)
{
    char *sep = strchr(val, ' ');
    if (!sep || strncmp(val, "/smddp-", 7) != 0) {
        snprintf(why, cap, "local rank %d published a malformed pool name", q);
        return false;
    }
    *sep = '\0';
    int fd = shm_open(val, O_RDWR, 0600);
    struct stat sb;
    bool ok = false;
    if (fd < 0)
        snprintf(why, cap, "cannot open local rank %d's pool %s: %s", q, val, strerror(errno));
    else if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != s->pool_size)
        snprintf(why, cap, "local rank %d's pool %s is not %zu bytes", q, val, s->pool_size);
    else if (map_file(fd, s->pool_size, val, &s->peer_pool[q]) != SMDDP_OK)
        snprintf(why, cap, "%s", smddp__last_error());
    else
        ok = true;
    if (fd >= 0) close(fd);
    return ok;
}

static smddp_status_t setup_failed(smddp_status_t st)
{
    char msg[SMDDP_ERRMSG_MAX];
    snprintf(msg, sizeof(msg), "%s", smddp__last_error());
    return smddp__error(st, "pool setup failed: %s", msg);
}

/*
 * Pools are an optimisation: when they cannot be had on every local rank
 * alike, no rank has one (s->pool_off says why), and creation goes on.
 */
static smddp_status_t pool_setup(smddp_comm_t comm)
{
    smddp__shm_t *s = comm->shm;
    size_t size = align_up((size_t)smddp__params()->shm_pool, POOL_ALIGN);
    int p = comm->local_size, me = comm->local_rank;
    char mine[96], (*vals)[96] = NULL;
    smddp_status_t st = SMDDP_OK;
    if (comm->node_count > 1) {
        snprintf(s->pool_off, sizeof(s->pool_off),
                 "the communicator spans %d nodes; pools serve collectives inside one node",
                 comm->node_count);
        return SMDDP_OK;
    }
    s->peer_pool = calloc((size_t)p * 3, sizeof(*s->peer_pool));
    vals = calloc((size_t)p, sizeof(*vals));
    if (!s->peer_pool || !vals) {
        free(vals);
        return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate pool state");
    }
    s->pooled_in = s->peer_pool + p;
    s->pooled_out = s->peer_pool + 2 * p;
    s->pool_size = size;
    /*
     * Every rank publishes its pool's name and size; "- 0" when pools are
     * off here, "! 0" when this rank could not make one.
     */
    if (size == 0) {
        snprintf(s->pool_off, sizeof(s->pool_off), "SMDDP_SHM_POOL_SIZE=0");
        snprintf(mine, sizeof(mine), "- 0");
    } else if (create_own(s, size) == SMDDP_OK) {
        s->peer_pool[me] = s->pool->base;
        snprintf(mine, sizeof(mine), "%s %zu", s->pool_name, size);
    } else {
        snprintf(s->pool_off, sizeof(s->pool_off), "local rank %d: %s", me, smddp__last_error());
        snprintf(mine, sizeof(mine), "! 0");
    }
    memcpy(vals[me], mine, sizeof(mine));
    smddp__op_t setup = shm_setup_op(comm);
    SMDDP_CHECK_GOTO(publish_value(comm, "pool", mine), st, out);
    st = smddp__shm_sync(comm, &setup);
    if (st < 0) goto failed;
    SMDDP_CHECK_GOTO(gather_values(comm, "pool", vals), st, out);
    /* Every rank reads the same values, so every rank reaches the same verdict. */
    bool all_off = true;
    for (int q = 0; q < p; q++) all_off &= !strcmp(vals[q], "- 0");
    if (all_off) goto quiet;
    for (int q = 0; q < p && !s->pool_off[0]; q++) {
        unsigned long long theirs = 0;
        const char *sep = strchr(vals[q], ' ');
        if (!sep || sscanf(sep + 1, "%llu", &theirs) != 1 || theirs == 0)
            snprintf(s->pool_off, sizeof(s->pool_off), "local rank %d has no pool", q);
        else if (theirs != size)
            snprintf(s->pool_off, sizeof(s->pool_off),
                     "local rank %d's pool has %llu bytes, this rank's %zu: every rank of a "
                     "node needs the same SMDDP_SHM_POOL_SIZE", q, theirs, size);
    }
    if (s->pool_off[0]) goto off;
    /* Then each maps every peer's, and all learn whether everybody could. */
    for (int q = 0; q < p && !s->pool_off[0]; q++)
        if (q != me) map_peer(s, q, vals[q], s->pool_off, sizeof(s->pool_off));
    snprintf(mine, sizeof(mine), "%s", s->pool_off[0] ? "0" : "1");
    SMDDP_CHECK_GOTO(publish_value(comm, "pool_ok", mine), st, out);
    st = smddp__shm_sync(comm, &setup);
    if (st < 0) goto failed;
    SMDDP_CHECK_GOTO(gather_values(comm, "pool_ok", vals), st, out);
    for (int q = 0; q < p && !s->pool_off[0]; q++)
        if (q != me && strcmp(vals[q], "1") != 0)
            snprintf(s->pool_off, sizeof(s->pool_off), "local rank %d could not map every pool", q);
    if (s->pool_off[0]) goto off;
    shm_unlink(s->pool_name);
    s->pool_name[0] = '\0';
    free(vals);
    return SMDDP_OK;

off:
    SMDDP_WARN("rank %d: communicator %s has no pools: %s", comm->rank, comm->prefix, s->pool_off);
quiet:
    unmap_all(comm, s);
    free(vals);
    return SMDDP_OK;
failed:
    st = setup_failed(st);
out:
    free(vals);
    return st;
}

static void pool_teardown(smddp_comm_t comm)
{
    if (comm->shm) unmap_all(comm, comm->shm);
}

static void pool_abandon(smddp_comm_t comm, const char *msg)
{
    (void)msg;
    smddp__shm_t *s = comm->shm;
    if (!s || !s->pool) return;
    pthread_mutex_lock(&pools_lock);
    s->pool->abandoned = true;
    pthread_mutex_unlock(&pools_lock);
}

const smddp__transport_t smddp__pool_transport = {"pools", false, pool_setup, pool_teardown,
                                                  pool_abandon};

/*
 * Adds [off, off + len) to the holes, merged with those it overlaps or
 * touches; false (nothing changed) when out of memory. Recorded before it is
 * punched: a backed range taken for a hole is only backed again, but a hole
 * taken for backed memory would be written unbacked (SIGBUS on a full
 * /dev/shm).
 */
static bool holes_add(struct smddp__pool *pool, size_t off, size_t len)
{
    range_t *h = malloc(sizeof(*h));
    if (!h) return false;
    size_t end = off + len;
    range_t **hp = &pool->holes;
    while (*hp && (*hp)->off + (*hp)->len < off) hp = &(*hp)->next;
    /* Every hole from *hp that starts at or before end joins [off, end). */
    while (*hp && (*hp)->off <= end) {
        range_t *o = *hp;
        off = SMDDP_MIN(off, o->off);
        end = SMDDP_MAX(end, o->off + o->len);
        *hp = o->next;
        free(o);
    }
    h->off = off;
    h->len = end - off;
    h->next = *hp;
    *hp = h;
    return true;
}

/* Bytes of the holes within [off, end). */
static size_t holes_within(const struct smddp__pool *pool, size_t off, size_t end)
{
    size_t n = 0;
    for (const range_t *h = pool->holes; h && h->off < end; h = h->next)
        if (h->off + h->len > off) n += SMDDP_MIN(end, h->off + h->len) - SMDDP_MAX(off, h->off);
    return n;
}

/*
 * Backs the holes within [off, off + len) of the pool's file, unless that
 * would leave less than SMDDP_SHM_POOL_RESERVE_PCT of the shared-memory
 * filesystem free: the pool is an optimisation, and /dev/shm also carries
 * other processes' data (a data loader's batches). Only holes are backed:
 * fallocate over backed pages costs about a millisecond per 25 MiB, which
 * buffers reallocated every step (FSDP2's) would pay each time. pools_lock
 * held.
 */
static smddp_status_t back(struct smddp__pool *pool, size_t off, size_t len)
{
    size_t end = off + len, grow = holes_within(pool, off, end);
    if (grow == 0) return SMDDP_OK;
    int pct = SMDDP_MIN(SMDDP_MAX(smddp__params()->shm_pool_reserve_pct, 0), 100);
    struct statvfs fs;
    if (pct > 0 && fstatvfs(pool->fd, &fs) == 0) {
        uint64_t total = (uint64_t)fs.f_blocks * fs.f_frsize;
        uint64_t avail = (uint64_t)fs.f_bavail * fs.f_frsize;
        uint64_t keep = total / 100 * (uint64_t)pct;
        if (avail < grow || avail - grow < keep)
            return smddp__error(SMDDP_ERR_NO_MEMORY,
                                "backing %zu more bytes of the pool would leave %llu MiB of the "
                                "%llu MiB shared-memory filesystem free, under its "
                                "SMDDP_SHM_POOL_RESERVE_PCT=%d%% kept for others",
                                grow, (unsigned long long)((avail < grow ? 0 : avail - grow) >> 20),
                                (unsigned long long)(total >> 20), pct);
    }
    /* Back each hole's part, then cut it out of the list (a hole may split in two). */
    for (range_t **hp = &pool->holes; *hp && (*hp)->off < end;) {
        range_t *h = *hp;
        size_t h_end = h->off + h->len;
        if (h_end <= off) {
            hp = &h->next;
            continue;
        }
        size_t a = SMDDP_MAX(off, h->off), b = SMDDP_MIN(end, h_end);
        int e = posix_fallocate(pool->fd, (off_t)a, (off_t)(b - a));
        if (e != 0) {
            /* The range is free: give back what this call backed, and all of it is a hole again. */
            if (holes_add(pool, off, len))
                (void)fallocate(pool->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                                (off_t)len);
            return smddp__error(SMDDP_ERR_NO_MEMORY,
                                "cannot back %zu bytes of the pool in shared memory: %s (is "
                                "/dev/shm full?)",
                                b - a, strerror(e));
        }
        if (a > h->off && b < h_end) { /* [h->off, a) stays, [b, h_end) a new hole after it */
            range_t *tail = malloc(sizeof(*tail));
            if (!tail) return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate a pool range");
            tail->off = b;
            tail->len = h_end - b;
            tail->next = h->next;
            h->len = a - h->off;
            h->next = tail;
            hp = &tail->next;
        } else if (a > h->off) { /* the hole's head stays */
            h->len = a - h->off;
            hp = &h->next;
        } else if (b < h_end) { /* its tail stays */
            h->off = b;
            h->len = h_end - b;
            hp = &h->next;
        } else { /* all of it is backed now */
            *hp = h->next;
            free(h);
        }
    }
    return SMDDP_OK;
}

/* Gives back free ranges idle since release_at_ns or earlier, and schedules the next. pools_lock held. */
static void release_idle(struct smddp__pool *pool, int64_t now_ns)
{
    int64_t idle_ns = (int64_t)smddp__params()->shm_pool_release_ms * 1000000LL;
    int64_t next = INT64_MAX;
    for (range_t *r = pool->free_list; r; r = r->next) {
        if (holes_within(pool, r->off, r->off + r->len) == r->len) continue; /* nothing backed */
        if (r->free_ns + idle_ns > now_ns) {
            next = SMDDP_MIN(next, r->free_ns + idle_ns);
            continue;
        }
        /* Where punching fails (a filesystem without holes), the range stays backed. */
        if (holes_add(pool, r->off, r->len))
            (void)fallocate(pool->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)r->off,
                            (off_t)r->len);
    }
    atomic_store_explicit(&pool->release_at_ns, next, memory_order_relaxed);
}

smddp_status_t smddp__pool_alloc(smddp_comm_t comm, size_t bytes, void **out)
{
    smddp__shm_t *s = comm->shm;
    if (!s || !s->pool)
        return smddp__error(SMDDP_ERR_NOT_SUPPORTED, "this communicator has no pool: %s",
                            s && s->pool_off[0] ? s->pool_off : "no shared memory");
    struct smddp__pool *pool = s->pool;
    size_t len = align_up(bytes, POOL_ALIGN);
    range_t *used = malloc(sizeof(*used));
    if (!used || len < bytes) {
        free(used);
        return smddp__error(SMDDP_ERR_NO_MEMORY, "cannot allocate %zu bytes from the pool", bytes);
    }
    pthread_mutex_lock(&pools_lock);
    range_t **pp = &pool->free_list;
    while (*pp && (*pp)->len < len) pp = &(*pp)->next;
    range_t *r = *pp;
    if (!r) {
        pthread_mutex_unlock(&pools_lock);
        free(used);
        return smddp__error(SMDDP_ERR_NO_MEMORY,
                            "the pool has no free range of %zu bytes (SMDDP_SHM_POOL_SIZE=%zu "
                            "per rank)",
                            len, pool->size);
    }
    size_t off = r->off;
    if (pool->holes) {
        smddp_status_t st = back(pool, off, len);
        if (st != SMDDP_OK) {
            pthread_mutex_unlock(&pools_lock);
            free(used);
            return st;
        }
    }
    if (r->len == len) {
        *pp = r->next;
        free(r);
    } else {
        r->off += len;
        r->len -= len;
    }
    used->off = off;
    used->len = len;
    used->next = pool->used;
    pool->used = used;
    pool->refs++;
    pthread_mutex_unlock(&pools_lock);
    *out = pool->base + off;
    return SMDDP_OK;
}

/* Merges r's successor into r, freed at the later time. */
static void merge_next(range_t *r)
{
    range_t *n = r->next;
    r->len += n->len;
    r->free_ns = SMDDP_MAX(r->free_ns, n->free_ns);
    r->next = n->next;
    free(n);
}

smddp_status_t smddp__pool_free(void *ptr)
{
    pthread_mutex_lock(&pools_lock);
    for (struct smddp__pool *pool = pools; pool; pool = pool->next) {
        if ((char *)ptr < pool->base || (char *)ptr >= pool->base + pool->size) continue;
        size_t off = (size_t)((char *)ptr - pool->base);
        range_t **up = &pool->used;
        while (*up && (*up)->off != off) up = &(*up)->next;
        if (!*up) break;
        range_t *r = *up;
        *up = r->next;
        if (pool->abandoned) {
            /* A failed op's peers may still write it: the range is never handed out again. */
            free(r);
            pool_release(pool);
            pthread_mutex_unlock(&pools_lock);
            return SMDDP_OK;
        }
        /* Back into the free list, merged with its neighbours. */
        int64_t idle_ns = (int64_t)smddp__params()->shm_pool_release_ms * 1000000LL;
        r->free_ns = smddp__now_ns();
        int64_t due = r->free_ns + idle_ns;
        range_t **pp = &pool->free_list, *prev = NULL;
        while (*pp && (*pp)->off < r->off) prev = *pp, pp = &(*pp)->next;
        r->next = *pp;
        *pp = r;
        if (r->next && r->off + r->len == r->next->off) merge_next(r);
        if (prev && prev->off + prev->len == r->off) merge_next(prev);
        /* (r may have been merged into prev and freed.) */
        if (idle_ns <= 0)
            release_idle(pool, INT64_MAX); /* at once */
        else if (due < atomic_load_explicit(&pool->release_at_ns, memory_order_relaxed))
            atomic_store_explicit(&pool->release_at_ns, due, memory_order_relaxed);
        pool_release(pool);
        pthread_mutex_unlock(&pools_lock);
        return SMDDP_OK;
    }
    pthread_mutex_unlock(&pools_lock);
    return smddp__error(SMDDP_ERR_INVALID_ARGUMENT,
                        "smddp_mem_free: %p is not an allocation of smddp_mem_alloc (or was "
                        "freed already)",
                        ptr);
}

uint64_t smddp__pool_ref(smddp_comm_t comm, const void *ptr, size_t bytes)
{
    smddp__shm_t *s = comm->shm;
    if (!s->pool || bytes == 0) return 0;
    const char *p = ptr, *base = s->pool->base;
    if (p < base || p >= base + s->pool->size || bytes > (size_t)(base + s->pool->size - p))
        return 0;
    return (uint64_t)(p - base) + 1;
}

bool smddp__pool_on(smddp_comm_t comm) { return comm->shm->pool != NULL; }

static pool_record_t *record(smddp_comm_t comm, int lr, uint64_t seq)
{
    return (pool_record_t *)((char *)smddp__shm_meta(comm, lr, (int)(seq & 1)) + META_POOL_RECORD);
}

void smddp__pool_tick(smddp_comm_t comm, int64_t now_ns)
{
    struct smddp__pool *pool = comm->shm->pool;
    if (pool && now_ns >= atomic_load_explicit(&pool->release_at_ns, memory_order_relaxed)) {
        pthread_mutex_lock(&pools_lock);
        release_idle(pool, now_ns);
        pthread_mutex_unlock(&pools_lock);
    }
}

void smddp__pool_publish(smddp_comm_t comm, const smddp__op_t *op, uint64_t in_ref,
                         uint64_t out_ref)
{
    pool_record_t *r = record(comm, comm->local_rank, op->seq);
    shm_record_open(&r->tag);
    *(volatile uint64_t *)&r->in_ref = in_ref;
    *(volatile uint64_t *)&r->out_ref = out_ref;
    shm_record_close(&r->tag, shm_record_tag(op->seq, comm->shm->my_ctr + 1)); /* the next post */
}

static void pool_peer(smddp_comm_t comm, const smddp__op_t *op, int lr, uint32_t tag,
                      char **in, char **out)
{
    smddp__shm_t *s = comm->shm;
    pool_record_t *r = record(comm, lr, op->seq);
    uint64_t want = shm_record_tag(op->seq, tag);
    *in = *out = NULL;
    if (!shm_record_is(&r->tag, want)) return;
    uint64_t in_ref = *(volatile uint64_t *)&r->in_ref;
    uint64_t out_ref = *(volatile uint64_t *)&r->out_ref;
    if (!shm_record_still(&r->tag, want)) return;
    if (in_ref && in_ref <= s->pool_size) *in = s->peer_pool[lr] + in_ref - 1;
    if (out_ref && out_ref <= s->pool_size) *out = s->peer_pool[lr] + out_ref - 1;
}

void smddp__pool_peers(smddp_comm_t comm, const smddp__op_t *op, uint32_t tag,
                       smddp__pooled_t *out)
{
    smddp__shm_t *s = comm->shm;
    out->in = s->pooled_in;
    out->out = s->pooled_out;
    out->all_in = out->all_out = true;
    for (int q = 0; q < comm->local_size; q++) {
        pool_peer(comm, op, q, tag, &out->in[q], &out->out[q]);
        out->all_in &= out->in[q] != NULL;
        out->all_out &= out->out[q] != NULL;
    }
}
