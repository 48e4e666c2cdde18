// Progress on stderr for work that takes more than about a second: on a terminal one line
// redrawn in place, with --progress elsewhere one line per update. stdout never changes.
#include "cli.h"

#include <stdarg.h>
#include <time.h>
#include <unistd.h>

static struct {
    bool on, tty, shown;
    const char *command;
    double start, last;
} pg;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_progress_begin(const cli_options *o) {
    pg.tty = isatty(STDERR_FILENO);
    pg.on = o->progress || pg.tty;
    pg.shown = false;
    pg.command = o->command;
    pg.start = pg.last = now_s();
}

void cli_progress(const char *fmt, ...) {
    if (!pg.on) return;
    double t = now_s();
    // On a terminal: nothing for the first second, then at most ten redraws a second.
    if (pg.tty && (t - pg.start < 1.0 || t - pg.last < 0.1)) return;
    pg.last = t;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, pg.tty ? "\r\033[Kmembill %s: %s" : "membill %s: %s\n", pg.command, line);
    pg.shown = true;
}

void cli_progress_end(void) {
    if (pg.on && pg.tty && pg.shown) fputs("\r\033[K", stderr);
    pg.on = pg.shown = false;
}
