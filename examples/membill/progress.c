// Progress on stderr for work that takes more than about a second: on a terminal one line
// redrawn in place, with --progress elsewhere one line per update. stdout never changes. The
// last update is kept, shown or not, so that Ctrl-C can say where the command stopped.
#include "cli.h"
#include "outputs.h"

#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct {
    bool on, tty, shown;
    const char *command;
    double start, last;
} pg;

// Where the command is, for the signal handler: two buffers, the one to read published with an
// atomic index once it is written.
static struct {
    char text[2][160];
    atomic_int current;
    atomic_bool line_shown; // a progress line is on the terminal, to be erased first
    const char *command;
} where = {.text = {"setting up the run", ""}};

static void where_set(const char *text) {
    int next = !atomic_load(&where.current);
    snprintf(where.text[next], sizeof where.text[next], "%.159s", text);
    atomic_store(&where.current, next);
}

static void say(const char *s) {
    if (write(STDERR_FILENO, s, strlen(s)) < 0) {
        // stderr is gone: nothing left to tell it with
    }
}

// In the signal handler: write(2) only.
static void interrupted(int sig, bool written) {
    if (atomic_load(&where.line_shown)) say("\r\033[K");
    say("membill ");
    say(where.command ? where.command : "");
    say(sig == SIGINT ? ": interrupted (" : sig == SIGTERM ? ": terminated (" : ": stopped by a signal (");
    say(where.text[atomic_load(&where.current)]);
    say(written ? "); its outputs had been written\n" : "); nothing was written\n");
}

void cli_catch_interrupts(const cli_options *o) {
    where.command = o->command;
    cli_outputs_catch_signals(interrupted);
}

void cli_progress_where(const char *text) { where_set(text); }

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
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    where_set(line);
    if (!pg.on) return;
    double t = now_s();
    // On a terminal: nothing for the first second, then at most ten redraws a second.
    if (pg.tty && (t - pg.start < 1.0 || t - pg.last < 0.1)) return;
    pg.last = t;
    fprintf(stderr, pg.tty ? "\r\033[Kmembill %s: %s" : "membill %s: %s\n", pg.command, line);
    pg.shown = true;
    atomic_store(&where.line_shown, pg.tty);
}

void cli_progress_end(void) {
    if (pg.on && pg.tty && pg.shown) fputs("\r\033[K", stderr);
    pg.on = pg.shown = false;
    atomic_store(&where.line_shown, false);
}
