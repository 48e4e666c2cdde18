// Running the membill command from a test: its exit code, stdout and stderr, in a temporary
// folder made once per test program (cli_run_dir).
#pragma once

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char cli_run_dir[64];

static int cli_run_make_dir(void **state) {
    (void)state;
    snprintf(cli_run_dir, sizeof cli_run_dir, "/tmp/membill_test_XXXXXX");
    return mkdtemp(cli_run_dir) ? 0 : -1;
}

static int cli_run_remove_dir(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cli_run_dir);
    return system(cmd) == 0 ? 0 : -1;
}

typedef struct {
    int code;
    char out[1 << 18], err[1 << 14];
} run_result;

static void slurp(const char *path, char *buf, size_t n) {
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t k = fread(buf, 1, n - 1, f);
    buf[k] = 0;
    fclose(f);
}

// membill with the arguments (a shell command line), stdin closed; killed after `seconds` (0:
// never) so that a run that hangs fails its test (exit 124) instead of stalling it.
static void membill_within(run_result *r, int seconds, const char *args) {
    char cmd[8192], p[512], limit[32] = "";
    if (seconds > 0) snprintf(limit, sizeof limit, "timeout -s KILL %d ", seconds);
    snprintf(cmd, sizeof cmd, "%s%s %s >%s/out 2>%s/err </dev/null", limit, MEMBILL_BIN, args, cli_run_dir,
             cli_run_dir);
    int st = system(cmd);
    r->code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    snprintf(p, sizeof p, "%s/out", cli_run_dir);
    slurp(p, r->out, sizeof r->out);
    snprintf(p, sizeof p, "%s/err", cli_run_dir);
    slurp(p, r->err, sizeof r->err);
}

static inline void membill(run_result *r, const char *args) { membill_within(r, 0, args); }

// A shell command made as printf makes text; the test fails naming it unless it succeeds.
static inline void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0) fail_msg("failed: %s", cmd);
}

static inline int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

// membill with the arguments, --json to a file and --quiet: it must succeed; its report (the
// caller decrefs). cmocka is included before this header.
static inline json_t *cli_run_json(const char *args) {
    static run_result r;
    char a[4096], path[512];
    snprintf(path, sizeof path, "%s/run.json", cli_run_dir);
    if (snprintf(a, sizeof a, "%s --json %s --quiet", args, path) >= (int)sizeof a) fail_msg("too long: %s", args);
    membill(&r, a);
    if (r.code != 0) print_error("%s: exit %d: %s\n", args, r.code, r.err);
    assert_int_equal(r.code, 0);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    return root;
}
