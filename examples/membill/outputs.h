// The command's output files as one transaction: declared before the run (a bad path fails at
// once), written when their content is ready (to a temporary beside the target), and moved into
// place together only when the whole run and every output succeeded.
//
// Wiring a command:
//   cli_outputs *outs = cli_outputs_new();
//   cli_outputs_input(outs, "--config", o->config, &err);   // every file the run reads (the
//   cli_outputs_input(outs, "--weights", st_path, &err);    // resolved safetensors, not a folder)
//   cli_outputs_add(outs, "--json", o->json, &err);         // every output, before the run
//   cli_outputs_add(outs, "--dump-grads", o->dump_grads, &err);
//   ... the run; after the last backward, while the gradients exist:
//   cli_outputs_write(outs, "--dump-grads", cli_model_writer, &(cli_model_file){m, true}, &err);
//   ... after the run, only if it succeeded:
//   cli_outputs_write(outs, "--json", cli_json_writer, root, &err);
//   cli_outputs_commit(outs, &err);
//   cli_outputs_free(outs);                                 // always: drops what was not committed
// A failure at any step leaves every file the user had as it was (outputs on standard streams,
// character devices and FIFOs are written as they come: those cannot be taken back).
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "autograd.h"
#include "model.h"

typedef struct cli_outputs cli_outputs;

// Writes one output to f; returns 0, or non-zero with err saying why (err may be left empty:
// the stream's error is reported then). cli_outputs flushes f and checks it for write errors.
typedef int (*cli_output_writer)(FILE *f, void *arg, ag_err *err);

// NULL when out of memory.
cli_outputs *cli_outputs_new(void);

// Declares the output of option ("--json": it names the output in messages, and
// cli_outputs_write finds it by it; NULL: the path does both) at path. A NULL path declares
// nothing, so each option can be passed as it is. "-", /dev/stdout and /dev/fd/1 are standard
// output; /dev/stderr and /dev/fd/2 standard error. Refused, with one line naming the option
// and the path: a folder; a block device or socket; a file in a folder that does not exist or
// cannot be written (the temporary is created here, so this is a real test); a file that cannot
// be written; the same file as another output (however named: links, "..", a hard link; the
// null device excepted, where discarding twice harms nothing) or as an input. Symbolic links
// are followed: the file behind one is replaced, the link stays. Regular files and new paths
// get their temporary now: O_TMPFILE where the file system has it (nothing is left behind even
// by SIGKILL), else a ".membill-XXXXXX" file that SIGINT, SIGTERM, SIGHUP and SIGQUIT remove.
int cli_outputs_add(cli_outputs *s, const char *option, const char *path, ag_err *err);

// Declares a file the run reads (option names it in messages); an output on it is refused,
// whichever is declared first. A NULL path, or one that does not exist, is ignored (the run
// reports the latter itself).
int cli_outputs_input(cli_outputs *s, const char *option, const char *path, ag_err *err);

// Writes the declared output of option now, with fn(f, arg, err): to its temporary (flushed
// and fsynced), or in place for standard streams, character devices and FIFOs (opening a FIFO
// waits for its reader, as any writer of one does). Any write error (a full disk, /dev/full, a
// reader that went away: SIGPIPE is ignored meanwhile) fails it, naming the file. Each output
// is written once.
int cli_outputs_write(cli_outputs *s, const char *option, cli_output_writer fn, void *arg, ag_err *err);

// Moves every written temporary into place, all or none: each target's previous file is kept
// under a backup link until all are in place, and put back if one fails. Refused, nothing
// moved, while a declared output is unwritten or its write failed, and after a failed commit.
// A replaced file keeps its mode (and, for root, its owner). SIGINT and the like wait until it
// is done. A second call after success does nothing.
int cli_outputs_commit(cli_outputs *s, ag_err *err);

// Removes every temporary not committed and closes what the set holds. NULL is ignored.
void cli_outputs_free(cli_outputs *s);

// For a signal handler of the command's own (cli_outputs installs one for SIGINT, SIGTERM,
// SIGHUP and SIGQUIT, only where they have the default action, when it names its first
// temporary): unlinks every named temporary. Async-signal-safe.
void cli_outputs_remove_temporaries(void);

// Installs that handler now (where the signals have the default action), with note(sig, written)
// called in it after the temporaries are gone and before the signal ends the process as it would
// have (a shell sees 128 + sig: 130 for Ctrl-C); written says a commit had put outputs in place.
// A signal during a commit waits for it. note must be async-signal-safe.
void cli_outputs_catch_signals(void (*note)(int sig, bool written));

// ---- Writers for the outputs membill produces ----

// The report with 2-space indent, keys in order; arg is a json_t *.
int cli_json_writer(FILE *f, void *json_root, ag_err *err);
// The profiler's timeline as CSV (one row per event, live bytes per category); arg unused.
int cli_csv_writer(FILE *f, void *unused, ag_err *err);
// The timeline as a stacked-area SVG chart; arg is the title (const char *).
int cli_svg_writer(FILE *f, void *title, ag_err *err);
// The timeline as a Chrome trace-event file: counters, phases, every tensor as an async slice
// from allocation to free on its category's track; arg is the process's name (NULL: membill).
int cli_trace_writer(FILE *f, void *title, ag_err *err);
// s as a JSON string, '<', '>' and '&' escaped too, so that it is safe inside an HTML <script>.
void cli_json_string(FILE *f, const char *s);

// One HTML page: the interactive timeline of every run (hover, pin, zoom, phases, category
// toggles, log or split scale), the four copies, the activation breakdowns, the claims, the
// text bill that text(f, arg) prints, and how to read it. The page script and the data are
// embedded: it opens offline.
typedef void (*cli_html_text_fn)(FILE *f, const void *arg);
typedef struct {
    const char *title;
    cli_html_text_fn text;
    const void *arg;
    const struct json_t *report; // the JSON report (NULL: none)
    // Each run's timeline as cli_html_run_data wrote it; NULL: the profiler's own, now.
    const char *const *runs;
    int nruns;
} cli_html_page;
int cli_html_writer(FILE *f, void *page, ag_err *err); // arg is a cli_html_page *
// The profiler's timeline as one run of the page: every lifetime, the phases, the times.
int cli_html_run_data(FILE *f, const char *name);

// The timeline as lifetimes: each allocation from its event to the event of the free that
// ended it (CLI_LIVE_TO_END: still live when the timeline ends). A free that ends nothing
// recorded is kept as a negative lifetime, so that sums over lifetimes equal the events'.
// Of the first n events (a writer fixes n once: its own mallocs, billed to "other", add events
// while it writes), in event order; NULL when out of memory.
#define CLI_LIVE_TO_END SIZE_MAX
typedef struct {
    uint32_t site;
    uint8_t category;
    int64_t bytes;
    size_t start, end;
    uint32_t detail; // the allocation's description: shape and dtype (mp_detail_name), 0: none
} cli_lifetime;
cli_lifetime *cli_lifetimes(size_t n, size_t *count);

// The weights (or, with grads, every parameter's .grad) as F32 safetensors with HF names.
typedef struct {
    const llama_model *model;
    bool grads;
} cli_model_file;
int cli_model_writer(FILE *f, void *model_file, ag_err *err); // arg is a cli_model_file *
