/*
 * The flight recorder: every communicator keeps a ring of its last
 * SMDDP_TRACE_BUFFER operations (0 turns it off): what each was, the path
 * and algorithm it took, when it was issued, started and finished, and how
 * it ended. Recording takes no lock and allocates nothing: an op claims a
 * slot with one atomic increment at issue and later fills in its own slot,
 * unless SMDDP_TRACE_BUFFER newer ops have taken it over since. A dump
 * (smddp_comm_dump_trace) copies each slot and keeps it only if no writer
 * claimed the slot while it was being read.
 */
#ifndef SMDDP_CORE_TRACE_H
#define SMDDP_CORE_TRACE_H

#include <stdatomic.h>

#include "op.h"

typedef enum smddp__trace_state {
    SMDDP_TRACE_QUEUED = 1, /* issued, not started */
    SMDDP_TRACE_RUNNING,
    SMDDP_TRACE_DONE,
    SMDDP_TRACE_FAILED
} smddp__trace_state_t;

typedef struct smddp__trace_entry {
    _Atomic uint64_t id;     /* 1 + the op's number on this communicator; 0 while written */
    uint64_t seq;
    uint64_t count;
    int32_t root;            /* root, or the peer of a send/recv; -1 for none */
    uint8_t kind, dtype, redop, mem_type;
    _Atomic(const char *) path;  /* static names, set when the op starts */
    _Atomic(const char *) algo;
    int64_t issued_ns;       /* smddp__now_ns() (CLOCK_MONOTONIC) */
    _Atomic int64_t started_ns;
    _Atomic int64_t finished_ns;
    _Atomic int32_t state;   /* smddp__trace_state_t */
    _Atomic int32_t status;  /* smddp_status_t, once finished */
} smddp__trace_entry_t;

typedef struct smddp__trace {
    uint32_t capacity;
    _Atomic uint64_t issued; /* ops recorded so far */
    smddp__trace_entry_t *ring;
} smddp__trace_t;

/* The recorder for a new communicator; NULL when SMDDP_TRACE_BUFFER is 0 (or on no memory). */
smddp__trace_t *smddp__trace_new(void);
void smddp__trace_free(smddp__trace_t *t);

/*
 * At issue: claims op's slot (op->trace_id) and records what it is; returns
 * the issue time (smddp__now_ns()), for a start that follows at once, or 0
 * when t is NULL (recorder off: all three do nothing then).
 */
int64_t smddp__trace_issue(smddp__trace_t *t, smddp__op_t *op);
/* After op's sequence number changed while it was queued (see smddp__submit). */
void smddp__trace_reseq(smddp__trace_t *t, const smddp__op_t *op);
/* When it starts running, at now_ns. */
void smddp__trace_start(smddp__trace_t *t, const smddp__op_t *op, int64_t now_ns);
/* When it has finished: its path and algorithm (op->path, op->algo) and status. */
void smddp__trace_finish(smddp__trace_t *t, const smddp__op_t *op, smddp_status_t st);

/*
 * Writes the recorder as JSON to path, oldest op first: who wrote it
 * (rank, size, communicator name), both clocks at the time of the dump (to
 * relate the monotonic times of the entries to wall time), extra (JSON
 * members for the header, without a trailing comma; may be NULL), then the
 * entries. path NULL: SMDDP_TRACE_DIR/smddp-trace-<job>-<comm>-r<rank>.json
 * (job: SMDDP_JOB_ID, else TORCHELASTIC_RUN_ID, else "job"; comm: comm_name
 * with every character but letters, digits, '.' and '-' made '_'), an error
 * when SMDDP_TRACE_DIR is not set. The path written goes to written (cap
 * bytes) when that is not NULL. Safe while ops run and after the
 * communicator failed.
 */
smddp_status_t smddp__trace_dump(smddp__trace_t *t, const char *path, const char *comm_name,
                                 int rank, int size, const char *extra, char *written,
                                 size_t cap);

#endif
