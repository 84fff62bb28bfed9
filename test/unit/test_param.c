/*
 * The settings table (core/param.c): defaults, the parsers for each type
 * (sizes with K/M/G, booleans, case-insensitive enums, seconds, integers,
 * strings), malformed values falling back to the default with a warning that
 * names the variable, warnings for unknown SMDDP_* variables, the table
 * smddp_print_settings() prints, and the logger that SMDDP_DEBUG and
 * SMDDP_DEBUG_FILE control.
 *
 * Settings are re-read in this process with smddp__params_reload(), with
 * stderr redirected to a file to catch the warnings. The logger reads its
 * settings once per process, so its tests re-execute this program in a child
 * with the environment under test ("--log-child MODE").
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "param.h"

extern char **environ;

/* Every row of the table in core/param.c. */
static const char *const row_names[] = {
    "SMDDP_DEBUG",
    "SMDDP_DEBUG_FILE",
    "SMDDP_TIMEOUT",
    "SMDDP_RANK",
    "SMDDP_WORLD_SIZE",
    "SMDDP_MASTER_ADDR",
    "SMDDP_MASTER_PORT",
    "SMDDP_HOSTNAME",
    "SMDDP_JOB_ID",
    "SMDDP_ALLREDUCE_ALGO",
    "SMDDP_ALLREDUCE_ONESHOT_MAX",
    "SMDDP_SHM_BUFFER_SIZE",
    "SMDDP_STREAM_MIN",
    "SMDDP_P2P_BUFFER_SIZE",
    "SMDDP_P2P_SET_ASIDE_MAX",
    "SMDDP_SPIN",
    "SMDDP_CHECK_ORDER",
    "SMDDP_SIMD",
    "SMDDP_INLINE",
    "SMDDP_COMMUNICATION_BACKEND",
};
#define NROWS (sizeof(row_names) / sizeof(row_names[0]))

/* ---- helpers ------------------------------------------------------------------ */

/* Removes every SMDDP_* variable from the environment. */
static void clear_smddp_env(void)
{
    for (;;) {
        char name[256] = "";
        for (char **e = environ; e && *e; e++) {
            if (strncmp(*e, "SMDDP_", 6) != 0) continue;
            const char *eq = strchr(*e, '=');
            size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
            if (len >= sizeof(name)) len = sizeof(name) - 1;
            memcpy(name, *e, len);
            name[len] = '\0';
            break;
        }
        if (!name[0]) return;
        unsetenv(name);
    }
}

/* Reads a whole file into buf (NUL-terminated); returns its length. */
static size_t slurp(FILE *f, char *buf, size_t cap)
{
    fflush(f);
    rewind(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    return n;
}

static char warnings[16384];

/* Re-reads the settings; whatever they print to stderr lands in `warnings`. */
static const smddp__params_t *reload(void)
{
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(tmp), STDERR_FILENO) >= 0);
    smddp__params_reload();
    fflush(stderr);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    slurp(tmp, warnings, sizeof(warnings));
    fclose(tmp);
    return smddp__params();
}

/* Sets one variable (NULL value: unsets it) and re-reads the settings. */
static const smddp__params_t *with(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    return reload();
}

static void assert_no_warning(void)
{
    if (warnings[0]) fail_msg("unexpected output while parsing settings: %s", warnings);
}

/* The warning for a malformed value must name the variable and quote the value. */
static void assert_warned(const char *name, const char *value)
{
    char quoted[512];
    if (!strstr(warnings, name)) fail_msg("no warning naming %s in: \"%s\"", name, warnings);
    snprintf(quoted, sizeof(quoted), "%s=\"%s\"", name, value);
    if (!strstr(warnings, quoted)) fail_msg("warning does not quote %s: \"%s\"", quoted, warnings);
    if (!strstr(warnings, "default")) fail_msg("warning does not say a default is used: %s",
                                               warnings);
}

/*
 * The default smddp_print_settings() shows for a row, parsed as a size. Tuning
 * defaults (buffer sizes, switch points) change with measurements, so the
 * tests take them from the table and check that parsing agrees with it.
 */
static int64_t table_default(const char *name)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    smddp_print_settings(f);
    rewind(f);
    char line[1024], n[128], type[32], def[64];
    int64_t v = INT64_MIN;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "%127s %31s %63s", n, type, def) == 3 && strcmp(n, name) == 0)
            v = strtoll(def, NULL, 10);
    fclose(f);
    if (v == INT64_MIN) fail_msg("no default for %s in the table", name);
    return v;
}

static int setup(void **state)
{
    (void)state;
    clear_smddp_env();
    reload();
    return 0;
}

/* Every test starts and ends with no SMDDP_* variable set. */
static int reset(void **state)
{
    (void)state;
    clear_smddp_env();
    reload();
    return 0;
}

/* ---- defaults and parsers ---------------------------------------------------------- */

static void test_defaults(void **state)
{
    (void)state;
    const smddp__params_t *p = reload();
    assert_no_warning();
    assert_int_equal(p->debug_level, SMDDP_LOG_WARN);
    assert_string_equal(p->debug_file, "");
    assert_int_equal(p->timeout_ms, 1800 * 1000);
    assert_int_equal(p->rank, -1);
    assert_int_equal(p->world_size, -1);
    assert_string_equal(p->master_addr, "");
    assert_int_equal(p->master_port, -1);
    assert_string_equal(p->hostname, "");
    assert_int_equal(p->algo, 0);
    assert_int_equal(p->spin, -1);
    /* Tuning defaults: whatever the table says, and sane. */
    assert_int_equal(p->oneshot_max, table_default("SMDDP_ALLREDUCE_ONESHOT_MAX"));
    assert_int_equal(p->shm_buffer, table_default("SMDDP_SHM_BUFFER_SIZE"));
    assert_int_equal(p->stream_min, table_default("SMDDP_STREAM_MIN"));
    assert_int_equal(p->p2p_buffer, table_default("SMDDP_P2P_BUFFER_SIZE"));
    assert_true(p->oneshot_max > 0 && p->shm_buffer >= 4096 && p->p2p_buffer >= 4096);
    assert_int_equal(p->check, 0);
    assert_int_equal(p->simd, 0);
    assert_int_equal(p->inline_exec, 1);
    assert_int_equal(p->comm_backend, 0);
    /* The same table every time. */
    assert_ptr_equal(smddp__params(), p);
}

static void test_sizes(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int64_t value;
    } good[] = {
        {"123", 123},          {"0", 0},
        {"4K", 4096},          {"4k", 4096},
        {"4KiB", 4096},        {"4kb", 4096},
        {"2M", 2 << 20},       {"2MB", 2 << 20},
        {"1G", 1LL << 30},     {"3g", 3LL << 30},
        {"8589934592", 8LL << 30},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        const smddp__params_t *p = with("SMDDP_SHM_BUFFER_SIZE", good[i].text);
        assert_no_warning();
        if (p->shm_buffer != good[i].value)
            fail_msg("SMDDP_SHM_BUFFER_SIZE=%s gave %lld, expected %lld", good[i].text,
                     (long long)p->shm_buffer, (long long)good[i].value);
    }
    static const char *const bad[] = {"4X",  "-1",  "",    "abc", "1.5M",
                                      "4 K", "4KK", "4Kx", "99999999999G", "4iB", "4i"};
    const int64_t def = table_default("SMDDP_ALLREDUCE_ONESHOT_MAX");
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        /* A good value first: a malformed one must restore the default, not keep it. */
        with("SMDDP_ALLREDUCE_ONESHOT_MAX", "1K");
        const smddp__params_t *p = with("SMDDP_ALLREDUCE_ONESHOT_MAX", bad[i]);
        assert_warned("SMDDP_ALLREDUCE_ONESHOT_MAX", bad[i]);
        if (p->oneshot_max != def)
            fail_msg("SMDDP_ALLREDUCE_ONESHOT_MAX=\"%s\" gave %lld, expected the default", bad[i],
                     (long long)p->oneshot_max);
        assert_non_null(strstr(warnings, "bytes"));
    }
    /* Each size setting goes to its own field. */
    with("SMDDP_ALLREDUCE_ONESHOT_MAX", NULL);
    setenv("SMDDP_STREAM_MIN", "1M", 1);
    setenv("SMDDP_P2P_BUFFER_SIZE", "64K", 1);
    const smddp__params_t *p = with("SMDDP_ALLREDUCE_ONESHOT_MAX", "16K");
    assert_no_warning();
    assert_int_equal(p->stream_min, 1 << 20);
    assert_int_equal(p->p2p_buffer, 64 << 10);
    assert_int_equal(p->oneshot_max, 16 << 10);
}

static void test_bools(void **state)
{
    (void)state;
    static const char *const yes[] = {"1", "true", "TRUE", "True", "yes", "YES", "on", "On"};
    static const char *const no[] = {"0", "false", "FALSE", "no", "No", "off", "OFF"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        assert_int_equal(with("SMDDP_CHECK_ORDER", yes[i])->check, 1);
        assert_no_warning();
    }
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        assert_int_equal(with("SMDDP_INLINE", no[i])->inline_exec, 0);
        assert_no_warning();
    }
    static const char *const bad[] = {"2", "enable", "", "y", "tru", "1 "};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const smddp__params_t *p = with("SMDDP_INLINE", bad[i]);
        assert_warned("SMDDP_INLINE", bad[i]);
        assert_int_equal(p->inline_exec, 1);
        assert_non_null(strstr(warnings, "bool"));
    }
}

static void test_enums(void **state)
{
    (void)state;
    static const struct {
        const char *name, *text;
        size_t offset;
        int value;
    } good[] = {
        {"SMDDP_DEBUG", "none", offsetof(smddp__params_t, debug_level), SMDDP_LOG_NONE},
        {"SMDDP_DEBUG", "WARN", offsetof(smddp__params_t, debug_level), SMDDP_LOG_WARN},
        {"SMDDP_DEBUG", "info", offsetof(smddp__params_t, debug_level), SMDDP_LOG_INFO},
        {"SMDDP_DEBUG", "Info", offsetof(smddp__params_t, debug_level), SMDDP_LOG_INFO},
        {"SMDDP_DEBUG", "TrAcE", offsetof(smddp__params_t, debug_level), SMDDP_LOG_TRACE},
        {"SMDDP_ALLREDUCE_ALGO", "ONESHOT", offsetof(smddp__params_t, algo), 1},
        {"SMDDP_ALLREDUCE_ALGO", "TwoShot", offsetof(smddp__params_t, algo), 2},
        {"SMDDP_ALLREDUCE_ALGO", "auto", offsetof(smddp__params_t, algo), 0},
        {"SMDDP_SIMD", "Scalar", offsetof(smddp__params_t, simd), 1},
        {"SMDDP_SIMD", "AVX2", offsetof(smddp__params_t, simd), 2},
        {"SMDDP_SIMD", "avx512", offsetof(smddp__params_t, simd), 3},
        {"SMDDP_COMMUNICATION_BACKEND", "NCCL", offsetof(smddp__params_t, comm_backend), 1},
        {"SMDDP_THREAD_SCHED", "Normal", offsetof(smddp__params_t, thread_sched), 1},
        {"SMDDP_THREAD_SCHED", "batch", offsetof(smddp__params_t, thread_sched), 0},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        const smddp__params_t *p = with(good[i].name, good[i].text);
        assert_no_warning();
        int got = *(const int *)((const char *)p + good[i].offset);
        if (got != good[i].value)
            fail_msg("%s=%s gave %d, expected %d", good[i].name, good[i].text, got, good[i].value);
        unsetenv(good[i].name);
    }
    /* Prefixes, suffixes and numbers are not choices; the warning lists the choices. */
    static const char *const bad[] = {"verbose", "inf", "INFOS", "2", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const smddp__params_t *p = with("SMDDP_DEBUG", bad[i]);
        assert_warned("SMDDP_DEBUG", bad[i]);
        assert_non_null(strstr(warnings, "NONE|WARN|INFO|TRACE"));
        assert_int_equal(p->debug_level, SMDDP_LOG_WARN);
    }
    const smddp__params_t *p = with("SMDDP_SIMD", "sse");
    assert_warned("SMDDP_SIMD", "sse");
    assert_non_null(strstr(warnings, "auto|scalar|avx2|avx512"));
    assert_int_equal(p->simd, 0);
}

static void test_seconds(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int64_t ms;
    } good[] = {
        {"1", 1000}, {"2.5", 2500}, {"0.25", 250}, {"1e3", 1000000}, {"86400", 86400000},
        {"0.001", 1},
        /* Positive but under a millisecond: must not become 0 (an instant deadline). */
        {"0.0001", 1},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        const smddp__params_t *p = with("SMDDP_TIMEOUT", good[i].text);
        assert_no_warning();
        if (p->timeout_ms != good[i].ms)
            fail_msg("SMDDP_TIMEOUT=%s gave %lld ms, expected %lld", good[i].text,
                     (long long)p->timeout_ms, (long long)good[i].ms);
    }
    static const char *const bad[] = {"0", "-5", "abc", "5s", "1e10", "nan", "inf", "", "1,5"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        with("SMDDP_TIMEOUT", "7");
        const smddp__params_t *p = with("SMDDP_TIMEOUT", bad[i]);
        assert_warned("SMDDP_TIMEOUT", bad[i]);
        assert_non_null(strstr(warnings, "seconds"));
        assert_non_null(strstr(warnings, "1800"));
        if (p->timeout_ms != 1800 * 1000)
            fail_msg("SMDDP_TIMEOUT=\"%s\" gave %lld ms, expected the default", bad[i],
                     (long long)p->timeout_ms);
    }
}

static void test_ints_and_strings(void **state)
{
    (void)state;
    setenv("SMDDP_RANK", "3", 1);
    setenv("SMDDP_WORLD_SIZE", "16", 1);
    setenv("SMDDP_MASTER_PORT", "29500", 1);
    setenv("SMDDP_SPIN", "0", 1);
    setenv("SMDDP_MASTER_ADDR", "node-17.cluster", 1);
    const smddp__params_t *p = with("SMDDP_HOSTNAME", "rack3-node7");
    assert_no_warning();
    assert_int_equal(p->rank, 3);
    assert_int_equal(p->world_size, 16);
    assert_int_equal(p->master_port, 29500);
    assert_int_equal(p->spin, 0);
    assert_string_equal(p->master_addr, "node-17.cluster");
    assert_string_equal(p->hostname, "rack3-node7");

    static const char *const bad[] = {"3x", "", "1.5", "99999999999", "-99999999999", " 3 "};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p = with("SMDDP_RANK", bad[i]);
        assert_warned("SMDDP_RANK", bad[i]);
        assert_non_null(strstr(warnings, "int"));
        assert_int_equal(p->rank, -1);
    }
    unsetenv("SMDDP_RANK");

    /* Strings up to the field's capacity minus the NUL; longer ones are refused. */
    char longest[256], too_long[257];
    memset(longest, 'h', sizeof(longest) - 1);
    longest[sizeof(longest) - 1] = '\0';
    memset(too_long, 'h', sizeof(too_long) - 1);
    too_long[sizeof(too_long) - 1] = '\0';
    p = with("SMDDP_HOSTNAME", longest);
    assert_no_warning();
    assert_string_equal(p->hostname, longest);
    p = with("SMDDP_HOSTNAME", too_long);
    assert_non_null(strstr(warnings, "SMDDP_HOSTNAME"));
    assert_string_equal(p->hostname, "");
    /* An empty string is a valid string. */
    p = with("SMDDP_HOSTNAME", "");
    assert_no_warning();
    assert_string_equal(p->hostname, "");
}

static void test_unknown_variables(void **state)
{
    (void)state;
    with("SMDDP_FOO", "1");
    assert_non_null(strstr(warnings, "unknown setting SMDDP_FOO"));
    /* A typo of a real name, and a variable with an empty value. */
    unsetenv("SMDDP_FOO");
    setenv("SMDDP_TIMEOUTS", "5", 1);
    const smddp__params_t *p = with("SMDDP_BAR", "");
    assert_non_null(strstr(warnings, "SMDDP_TIMEOUTS"));
    assert_non_null(strstr(warnings, "SMDDP_BAR"));
    assert_null(strstr(warnings, "SMDDP_TIMEOUT "));
    assert_int_equal(p->timeout_ms, 1800 * 1000);
    unsetenv("SMDDP_TIMEOUTS");
    unsetenv("SMDDP_BAR");
    /* Names of other programs that merely share the prefix's start are not ours. */
    setenv("SMDDPX", "1", 1);
    with("SMDDP", "1");
    assert_null(strstr(warnings, "SMDDPX"));
    unsetenv("SMDDPX");
    unsetenv("SMDDP");
    /* Every row's name is known: setting each to its default warns about nothing. */
    for (size_t i = 0; i < NROWS; i++) {
        with(row_names[i], NULL);
        if (strstr(warnings, "unknown"))
            fail_msg("%s is reported unknown: %s", row_names[i], warnings);
    }
    setenv("SMDDP_JOB_ID", "job-42", 1);
    reload();
    if (strstr(warnings, "SMDDP_JOB_ID"))
        fail_msg("SMDDP_JOB_ID, which smddp_comm_create_from_env reads, is reported: %s",
                 warnings);
}

/* ---- smddp_print_settings ------------------------------------------------------------ */

/* The line of the table for name, copied into line (asserts there is exactly one). */
static void table_line(const char *table, const char *name, char *line, size_t cap)
{
    const char *found = NULL;
    size_t len = strlen(name);
    for (const char *p = table; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, name, len) == 0 && p[len] == ' ') {
            if (found) fail_msg("%s is listed twice", name);
            found = p;
        }
    }
    if (!found) fail_msg("%s is not listed in:\n%s", name, table);
    const char *end = strchr(found, '\n');
    size_t n = end ? (size_t)(end - found) : strlen(found);
    if (n >= cap) n = cap - 1;
    memcpy(line, found, n);
    line[n] = '\0';
}

static void test_print_settings(void **state)
{
    (void)state;
    setenv("SMDDP_DEBUG", "trace", 1);
    setenv("SMDDP_TIMEOUT", "2.5", 1);
    setenv("SMDDP_ALLREDUCE_ONESHOT_MAX", "8K", 1);
    setenv("SMDDP_HOSTNAME", "printed-host", 1);
    setenv("SMDDP_CHECK_ORDER", "yes", 1);
    setenv("SMDDP_ALLREDUCE_ALGO", "TWOSHOT", 1);
    reload();
    assert_no_warning();

    FILE *f = tmpfile();
    assert_non_null(f);
    smddp_print_settings(f);
    static char table[32768];
    slurp(f, table, sizeof(table));
    fclose(f);

    char line[1024];
    for (size_t i = 0; i < NROWS; i++) table_line(table, row_names[i], line, sizeof(line));
    /* Every line but the header is a setting. */
    int lines = 0;
    for (const char *p = table; *p; p = strchr(p, '\n') + 1) {
        if (lines > 0 && strncmp(p, "SMDDP_", 6) != 0) fail_msg("stray line in the table: %s", p);
        lines++;
        if (!strchr(p, '\n')) break;
    }
    assert_true(lines >= (int)NROWS + 1);

    /* Current values, with type, default and description. */
    static const struct {
        const char *name;
        const char *words[3];
    } want[] = {
        {"SMDDP_DEBUG", {"TRACE", "WARN", "enum"}},
        {"SMDDP_TIMEOUT", {"2.5", "1800", "seconds"}},
        {"SMDDP_ALLREDUCE_ONESHOT_MAX", {"8192", "one-shot", "bytes"}},
        {"SMDDP_HOSTNAME", {"printed-host", "string", "node"}},
        {"SMDDP_CHECK_ORDER", {" 1 ", "bool", "check"}},
        {"SMDDP_ALLREDUCE_ALGO", {"twoshot", "auto|oneshot|twoshot", "enum"}},
        {"SMDDP_RANK", {"-1", "int", "rank"}},
        {"SMDDP_SHM_BUFFER_SIZE", {"bytes", "shared-memory", " match "}},
        {"SMDDP_SHM_LL_MAX", {"bytes", " min ", "slots"}},
        {"SMDDP_SHM_CMA_MIN", {"bytes", " max ", "allgather"}},
        {"SMDDP_TIMEOUT", {"seconds", " own ", "deadline"}},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        table_line(table, want[i].name, line, sizeof(line));
        for (int w = 0; w < 3; w++)
            if (!strstr(line, want[i].words[w]))
                fail_msg("the line for %s lacks \"%s\": %s", want[i].name, want[i].words[w], line);
    }

    /* NULL prints to stdout. */
    FILE *out = tmpfile();
    assert_non_null(out);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    dup2(fileno(out), STDOUT_FILENO);
    smddp_print_settings(NULL);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    static char table2[32768];
    slurp(out, table2, sizeof(table2));
    fclose(out);
    assert_string_equal(table2, table);
}

/* ---- agreement across ranks ------------------------------------------------------------ */

/* This process's agreement record with the given settings ("NAME=value ...", NULL: none). */
static char *record_with(const char *env)
{
    clear_smddp_env();
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", env ? env : "");
    for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
        char *eq = strchr(tok, '=');
        *eq = '\0';
        setenv(tok, eq + 1, 1);
    }
    reload();
    size_t len = smddp__params_agree_record(NULL, 0) + 1;
    char *rec = malloc(len);
    assert_non_null(rec);
    assert_int_equal(smddp__params_agree_record(rec, len), len - 1);
    clear_smddp_env();
    reload();
    return rec;
}

static void test_agreement(void **state)
{
    (void)state;
    /* Ranks 0 and 1 alike, rank 2 and 4 on another SMDDP_NET_ALGO: refused, naming them. */
    char *recs[5] = {record_with(NULL), record_with("SMDDP_NET_ALGO=auto"),
                     record_with("SMDDP_NET_ALGO=flat"), record_with(NULL),
                     record_with("SMDDP_NET_ALGO=hier")};
    smddp__params_t out;
    char msg[SMDDP_ERRMSG_MAX];
    assert_int_equal(smddp__params_agree((const char *const *)recs, 5, &out, msg, sizeof(msg)),
                     SMDDP_ERR_MISMATCH);
    static const char *const says[] = {"SMDDP_NET_ALGO must be the same on every rank",
                                       "rank 0 has \"auto\"", "rank 2 has \"flat\"",
                                       "differ from rank 0: 2, 4)"};
    for (size_t i = 0; i < sizeof(says) / sizeof(says[0]); i++)
        if (!strstr(msg, says[i])) fail_msg("\"%s\" does not say \"%s\"", msg, says[i]);
    for (int r = 0; r < 5; r++) free(recs[r]);

    /* The same value spelled two ways matches; sizes take the smallest or largest. */
    char *sized[3] = {record_with("SMDDP_SHM_BUFFER_SIZE=4M SMDDP_SHM_LL_MAX=4096"),
                      record_with("SMDDP_SHM_BUFFER_SIZE=4194304 SMDDP_SHM_CMA_MIN=64K"),
                      record_with("SMDDP_SHM_CMA_MAX=1M SMDDP_SHM_LL_MAX=2K")};
    assert_int_equal(smddp__params_agree((const char *const *)sized, 3, &out, msg, sizeof(msg)),
                     SMDDP_OK);
    assert_int_equal(out.shm_ll_max, 2048);
    assert_int_equal(out.shm_cma_min, 65536);
    assert_int_equal(out.shm_cma_max, 1 << 20);
    /* A setting each rank keeps: this process's own value. */
    assert_int_equal(out.timeout_ms, smddp__params()->timeout_ms);
    for (int r = 0; r < 3; r++) free(sized[r]);

    /* SMDDP_ALGO's rules, compared as text. */
    char *rules[2] = {record_with("SMDDP_ALGO=allreduce:two-shot"), record_with(NULL)};
    assert_int_equal(smddp__params_agree((const char *const *)rules, 2, &out, msg, sizeof(msg)),
                     SMDDP_ERR_MISMATCH);
    if (!strstr(msg, "rank 0 has \"allreduce:two-shot\", rank 1 has \"\"")) fail_msg("%s", msg);
    for (int r = 0; r < 2; r++) free(rules[r]);
}

/* ---- the logger ------------------------------------------------------------------------- */

static void test_debug_level(void **state)
{
    (void)state;
    assert_int_equal(with("SMDDP_DEBUG", "INFO")->debug_level, SMDDP_LOG_INFO);
    assert_int_equal(smddp__log_level(), SMDDP_LOG_INFO);
    with("SMDDP_DEBUG", "trace");
    assert_int_equal(smddp__log_level(), SMDDP_LOG_TRACE);
    with("SMDDP_DEBUG", "none");
    assert_int_equal(smddp__log_level(), SMDDP_LOG_NONE);
    /* At NONE an error still sets its message but prints nothing. */
    FILE *tmp = tmpfile();
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fileno(tmp), STDERR_FILENO);
    smddp_status_t st = smddp__error(SMDDP_ERR_SYSTEM, "quiet failure %d", 7);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char buf[1024];
    slurp(tmp, buf, sizeof(buf));
    fclose(tmp);
    assert_int_equal(st, SMDDP_ERR_SYSTEM);
    assert_string_equal(smddp_get_last_error(NULL), "quiet failure 7");
    assert_string_equal(buf, "");
    with("SMDDP_DEBUG", NULL);
    assert_int_equal(smddp__log_level(), SMDDP_LOG_WARN);
}

static char self_exe[PATH_MAX];

/* In a child started by run_log_child: log a little with the environment it was given. */
static int log_child(const char *mode)
{
    (void)mode;
    SMDDP_INFO("hello from the child %d", 42);
    SMDDP_TRACE("this trace line must not appear");
    smddp__error(SMDDP_ERR_TIMEOUT, "a warning with context %s", "xyz");
    return 0;
}

/*
 * Runs this program as "--log-child" with NAME=value pairs added to a clean
 * environment; its stderr goes to err_path. Returns the child's pid.
 */
static pid_t run_log_child(const char *const *env, const char *err_path)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        clear_smddp_env();
        for (int i = 0; env[i]; i += 2) setenv(env[i], env[i + 1], 1);
        int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(126);
        execl(self_exe, self_exe, "--log-child", "1", (char *)NULL);
        _exit(127);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    return pid;
}

static size_t read_file(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s: %s", path, strerror(errno));
    size_t n = slurp(f, buf, cap);
    fclose(f);
    return n;
}

static void test_debug_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/smddp-test-param-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char pattern[256], err_path[300], host[256];
    snprintf(pattern, sizeof(pattern), "%s/log-%%h-%%p.txt", dir);
    snprintf(err_path, sizeof(err_path), "%s/stderr.txt", dir);
    assert_int_equal(gethostname(host, sizeof(host)), 0);
    host[sizeof(host) - 1] = '\0';

    const char *const env[] = {"SMDDP_DEBUG", "INFO", "SMDDP_DEBUG_FILE", pattern, NULL};
    pid_t pid = run_log_child(env, err_path);

    char path[600], text[8192], prefix[400];
    snprintf(path, sizeof(path), "%s/log-%s-%d.txt", dir, host, (int)pid);
    read_file(path, text, sizeof(text));
    snprintf(prefix, sizeof(prefix), "%s:%d:", host, (int)pid);
    if (!strstr(text, prefix)) fail_msg("log lines lack \"%s\": %s", prefix, text);
    assert_non_null(strstr(text, "INFO"));
    assert_non_null(strstr(text, "hello from the child 42"));
    assert_non_null(strstr(text, "WARN"));
    assert_non_null(strstr(text, "a warning with context xyz"));
    assert_non_null(strstr(text, "test_param.c:")); /* file:line of the call site */
    assert_null(strstr(text, "must not appear"));
    /* Nothing went to stderr. */
    read_file(err_path, text, sizeof(text));
    assert_string_equal(text, "");
    unlink(path);

    /* A file that cannot be opened: a warning on stderr, and the log goes there instead. */
    char bad[300];
    snprintf(bad, sizeof(bad), "%s/no-such-dir/log-%%p.txt", dir);
    const char *const env2[] = {"SMDDP_DEBUG", "INFO", "SMDDP_DEBUG_FILE", bad, NULL};
    pid = run_log_child(env2, err_path);
    read_file(err_path, text, sizeof(text));
    char expanded[400];
    snprintf(expanded, sizeof(expanded), "%s/no-such-dir/log-%d.txt", dir, (int)pid);
    assert_non_null(strstr(text, "cannot open SMDDP_DEBUG_FILE"));
    if (!strstr(text, expanded)) fail_msg("warning does not name %s: %s", expanded, text);
    assert_non_null(strstr(text, "hello from the child 42"));

    /* At the default level, INFO is silent and WARN reaches stderr. */
    const char *const env3[] = {NULL};
    run_log_child(env3, err_path);
    read_file(err_path, text, sizeof(text));
    assert_null(strstr(text, "hello from the child"));
    assert_non_null(strstr(text, "a warning with context xyz"));

    unlink(err_path);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--log-child") == 0) return log_child(argv[2]);
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
    if (n <= 0) return 1;
    self_exe[n] = '\0';

    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_defaults, reset, reset),
        cmocka_unit_test_setup_teardown(test_sizes, reset, reset),
        cmocka_unit_test_setup_teardown(test_bools, reset, reset),
        cmocka_unit_test_setup_teardown(test_enums, reset, reset),
        cmocka_unit_test_setup_teardown(test_seconds, reset, reset),
        cmocka_unit_test_setup_teardown(test_ints_and_strings, reset, reset),
        cmocka_unit_test_setup_teardown(test_unknown_variables, reset, reset),
        cmocka_unit_test_setup_teardown(test_print_settings, reset, reset),
        cmocka_unit_test_setup_teardown(test_agreement, reset, reset),
        cmocka_unit_test_setup_teardown(test_debug_level, reset, reset),
        cmocka_unit_test_setup_teardown(test_debug_file, reset, reset),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
