/*
 * What every core file includes: the public types, the error and logging
 * helpers, and the two propagation macros.
 */
#ifndef SMDDP_CORE_COMMON_H
#define SMDDP_CORE_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "smddp/smddp.h"

#define SMDDP_ERRMSG_MAX 1024

/*
 * Records msg (printf-style) as the calling thread's last error and returns
 * status, so a failure site reads `return smddp__error(SMDDP_ERR_..., ...)`.
 * The message is also logged at WARN with file:line.
 */
#define smddp__error(status, ...) \
    smddp__error_at(__FILE__, __LINE__, (status), __VA_ARGS__)
smddp_status_t smddp__error_at(const char *file, int line, smddp_status_t status,
                               const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Like smddp__error but does not log: for errors the caller may handle. */
smddp_status_t smddp__error_quiet(smddp_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The calling thread's last error message ("" if none). */
const char *smddp__last_error(void);
/* Clears the calling thread's last error message. */
void smddp__clear_error(void);

/*
 * True on libsmddp's own threads (progress, send/recv). CUDA code there
 * must not restore a "previous" device: such a thread has none, and setting
 * device 0 would create a context on GPU 0 in every process.
 */
#ifndef __cplusplus
extern _Thread_local bool smddp__library_thread;
#endif
/*
 * Called first on each of libsmddp's own threads (`what` names it in the
 * log): sets smddp__library_thread and the scheduling policy
 * SMDDP_THREAD_SCHED asks for.
 */
void smddp__library_thread_begin(const char *what);

/* Returns from the function if the status is an error. */
#define SMDDP_CHECK(call)                           \
    do {                                            \
        smddp_status_t smddp__st = (call);          \
        if (smddp__st < 0) return smddp__st;        \
    } while (0)

/* Stores the status in `st` and jumps to `label` if it is an error. */
#define SMDDP_CHECK_GOTO(call, st, label) \
    do {                                  \
        (st) = (call);                    \
        if ((st) < 0) goto label;         \
    } while (0)

/* Logging: levels follow SMDDP_DEBUG. */
typedef enum smddp__log_level {
    SMDDP_LOG_NONE = 0,
    SMDDP_LOG_WARN = 1,
    SMDDP_LOG_INFO = 2,
    SMDDP_LOG_TRACE = 3
} smddp__log_level_t;

extern int smddp__log_level_cached;
void smddp__log(smddp__log_level_t level, const char *file, int line,
                const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int smddp__log_level(void);

#define SMDDP_LOG(level, ...)                                           \
    do {                                                                \
        if (smddp__log_level() >= (level))                              \
            smddp__log((level), __FILE__, __LINE__, __VA_ARGS__);        \
    } while (0)
#define SMDDP_WARN(...) SMDDP_LOG(SMDDP_LOG_WARN, __VA_ARGS__)
#define SMDDP_INFO(...) SMDDP_LOG(SMDDP_LOG_INFO, __VA_ARGS__)
#define SMDDP_TRACE(...) SMDDP_LOG(SMDDP_LOG_TRACE, __VA_ARGS__)

/* Static name of a status. */
const char *smddp__status_string(smddp_status_t status);

/* Monotonic clock in nanoseconds. */
int64_t smddp__now_ns(void);

#define SMDDP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SMDDP_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Splits n elements into p nearly equal pieces; piece q is [off, off + len). */
static inline void smddp__piece(size_t n, int p, int q, size_t *off, size_t *len)
{
    size_t base = n / (size_t)p, rem = n % (size_t)p;
    *off = (size_t)q * base + SMDDP_MIN((size_t)q, rem);
    *len = base + ((size_t)q < rem ? 1 : 0);
}

/* A spin-wait hint to the CPU (x86 pause, Arm yield). */
static inline void smddp__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif /* SMDDP_CORE_COMMON_H */
