/*
 * Last-error messages and leveled logging. The error text lives in a
 * thread-local buffer so that concurrent failures on different threads do not
 * overwrite each other; abi/ copies it into a communicator when needed.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "param.h"

/* What the calling thread is: its last error, and whether libsmddp started it. */
static _Thread_local char tls_error[SMDDP_ERRMSG_MAX];
_Thread_local bool smddp__library_thread;

void smddp__library_thread_begin(const char *what)
{
    smddp__library_thread = true;
    if (smddp__params()->thread_sched != SMDDP_THREAD_BATCH) return;
    /*
     * SCHED_BATCH keeps the thread's fair share of the CPU but drops its
     * wake-up preemption: a thread signalled for a new operation does not
     * take the core from the application's thread that issued it, which,
     * when it waits at once, runs the operation itself (queue.c). Otherwise
     * each such operation costs two context switches on that core.
     */
    struct sched_param sp = {0};
    if (sched_setscheduler(0, SCHED_BATCH, &sp) != 0)
        SMDDP_INFO("%s thread keeps its scheduling policy (SCHED_BATCH refused: %s)", what,
                   strerror(errno));
}

static FILE *log_file;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

const char *smddp__status_string(smddp_status_t status)
{
    switch (status) {
    case SMDDP_OK: return "success";
    case SMDDP_IN_PROGRESS: return "in progress";
    case SMDDP_ERR_INVALID_ARGUMENT: return "invalid argument";
    case SMDDP_ERR_NO_MEMORY: return "out of memory";
    case SMDDP_ERR_SYSTEM: return "system error";
    case SMDDP_ERR_TIMEOUT: return "timed out";
    case SMDDP_ERR_PEER_LOST: return "peer lost";
    case SMDDP_ERR_ABORTED: return "communicator aborted";
    case SMDDP_ERR_MISMATCH: return "operation mismatch across ranks";
    case SMDDP_ERR_NOT_SUPPORTED: return "not supported";
    case SMDDP_ERR_STORE: return "store error";
    case SMDDP_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

int64_t smddp__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Expands %h (host) and %p (pid) in the SMDDP_DEBUG_FILE pattern. */
static void expand_log_path(const char *pattern, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = pattern; *p && n + 1 < cap; p++) {
        if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
            char tmp[256];
            if (p[1] == 'h') {
                if (gethostname(tmp, sizeof(tmp)) != 0) strcpy(tmp, "unknown");
                tmp[sizeof(tmp) - 1] = '\0';
            } else {
                snprintf(tmp, sizeof(tmp), "%d", (int)getpid());
            }
            size_t len = strlen(tmp);
            if (len > cap - 1 - n) len = cap - 1 - n;
            memcpy(out + n, tmp, len);
            n += len;
            p++;
        } else {
            out[n++] = *p;
        }
    }
    out[n] = '\0';
}

static void log_init(void)
{
    const smddp__params_t *params = smddp__params();
    log_file = stderr;
    if (params->debug_file[0]) {
        char path[512];
        expand_log_path(params->debug_file, path, sizeof(path));
        FILE *f = fopen(path, "a");
        if (f) {
            setvbuf(f, NULL, _IOLBF, 0);
            log_file = f;
        } else {
            fprintf(stderr, "smddp WARN cannot open SMDDP_DEBUG_FILE %s; logging to stderr\n",
                    path);
        }
    }
    __atomic_store_n(&smddp__log_level_cached, (int)params->debug_level, __ATOMIC_RELEASE);
}

int smddp__log_level(void)
{
    int level = __atomic_load_n(&smddp__log_level_cached, __ATOMIC_ACQUIRE);
    if (level < 0) {
        pthread_once(&log_once, log_init);
        level = __atomic_load_n(&smddp__log_level_cached, __ATOMIC_ACQUIRE);
    }
    return level;
}

void smddp__log(smddp__log_level_t level, const char *file, int line, const char *fmt, ...)
{
    static const char *const names[] = {"NONE", "WARN", "INFO", "TRACE"};
    char host[64];
    char msg[SMDDP_ERRMSG_MAX + 128];
    va_list ap;

    pthread_once(&log_once, log_init);
    if (gethostname(host, sizeof(host)) != 0) strcpy(host, "?");
    host[sizeof(host) - 1] = '\0';
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    pthread_mutex_lock(&log_lock);
    fprintf(log_file, "%s:%d:%d smddp %s %s:%d %s\n", host, (int)getpid(),
            (int)gettid(), names[level], base, line, msg);
    pthread_mutex_unlock(&log_lock);
}

static void set_error_va(smddp_status_t status, const char *fmt, va_list ap)
{
    (void)status;
    vsnprintf(tls_error, sizeof(tls_error), fmt, ap);
}

smddp_status_t smddp__error_at(const char *file, int line, smddp_status_t status,
                               const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error_va(status, fmt, ap);
    va_end(ap);
    if (smddp__log_level() >= SMDDP_LOG_WARN)
        smddp__log(SMDDP_LOG_WARN, file, line, "%s: %s", smddp__status_string(status),
                   tls_error);
    return status;
}

smddp_status_t smddp__error_quiet(smddp_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error_va(status, fmt, ap);
    va_end(ap);
    return status;
}

const char *smddp__last_error(void) { return tls_error; }

void smddp__clear_error(void) { tls_error[0] = '\0'; }
