// The HTML page: one self-contained file, the report and every run's lifetimes embedded as JSON,
// the script and style embedded from html/ at build time, so that it opens offline.
#include "cli.h"
#include "outputs.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

extern const char cli_page_js[], cli_page_css[];

static const char *const explanation =
    "<h2>Reading the bill</h2><ul>"
    "<li><b>weight</b>: the parameters, allocated when the model is built or loaded.</li>"
    "<li><b>gradient</b>: one <code>.grad</code> per parameter, the same size as the weights, allocated at the first "
    "accumulation in backward and set to none after the optimizer step.</li>"
    "<li><b>optimizer</b>: Adam keeps exp_avg and exp_avg_sq, two more copies of the weights, allocated at the first "
    "step. Weights, gradients and Adam together: four copies of the weights.</li>"
    "<li><b>activation</b>: what the forward saves for backward (each block's inputs, attention probabilities, MLP "
    "intermediates, the logits), freed as backward consumes it; it grows with batch and sequence length.</li>"
    "<li><b>cache</b>: the KV cache of inference.</li>"
    "<li><b>temporary</b>: scratch that is neither saved for backward, nor a gradient, nor optimizer state (an "
    "optimizer's per-step temporaries, the autograd engine's out-of-place gradient sums), as PyTorch's memory profiler "
    "calls it TEMPORARY; freed within the op or step that made it. Not one of the four copies, but it can lift the "
    "total peak above them.</li>"
    "<li><b>other</b>: plain malloc no tensor owns (tape nodes, parsers, libraries).</li></ul>"
    "<p>Requested bytes are what tensors asked for; the allocator's size classes are what jemalloc reserved. "
    "MB means 10<sup>6</sup> bytes. The peak, not the current allocation, decides an out-of-memory error.</p>"
    "<p>The chart: hover to read what was live at any moment, click to pin it, drag to zoom, double-click to see "
    "the whole run again; click a phase's name to zoom to it and pin its peak.</p>";

void cli_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch == '<' || ch == '>' || ch == '&')
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void run_sites(FILE *f, size_t n) {
    uint32_t max = 0;
    for (size_t i = 0; i < n; i++)
        if (mp_timeline_get(i)->site > max) max = mp_timeline_get(i)->site;
    fprintf(f, ",\"sites\":[");
    for (uint32_t s = 0; s <= max; s++) {
        if (s) fputc(',', f);
        cli_json_string(f, mp_site_name(s));
    }
    fputc(']', f);
}

// Times as whole microseconds since the previous event (a run's deltas are short numbers);
// none in meta mode, where no time passes.
static void run_times(FILE *f, size_t n) {
    fprintf(f, ",\"t\":[");
    long long prev = 0;
    for (size_t i = 0; i < n && !mp_is_meta(); i++) {
        long long us = (long long)(mp_timeline_get(i)->seconds * 1e6 + 0.5);
        fprintf(f, "%s%lld", i ? "," : "", us - prev);
        prev = us;
    }
    fputc(']', f);
}

static void run_phases(FILE *f, size_t n) {
    fprintf(f, ",\"ph\":[");
    int phase = -1;
    for (size_t i = 0; i < n; i++) {
        const mp_event *e = mp_timeline_get(i);
        if (e->phase == phase) continue;
        fprintf(f, "%s%d,%zu", phase < 0 ? "" : ",", e->phase, i);
        phase = e->phase;
    }
    fputc(']', f);
}

int cli_html_run_data(FILE *f, const char *name) {
    size_t nl, n = mp_timeline_count(); // fixed now: this writer's own mallocs add events
    cli_lifetime *l = cli_lifetimes(n, &nl);
    if (!l) return -1;
    mp_moment pk = mp_peak();
    fprintf(f, "{\"name\":");
    cli_json_string(f, name);
    fprintf(f, ",\"meta\":%s,\"n\":%zu,\"peak_event\":%lld", mp_is_meta() ? "true" : "false", n,
            (long long)pk.events - 1);
    run_sites(f, n);
    run_times(f, n);
    run_phases(f, n);
    fprintf(f, ",\"life\":[");
    for (size_t i = 0; i < nl; i++)
        fprintf(f, "%s%u,%u,%lld,%zu,%lld", i ? "," : "", l[i].site, l[i].category, (long long)l[i].bytes, l[i].start,
                l[i].end == CLI_LIVE_TO_END ? -1LL : (long long)l[i].end);
    fprintf(f, "]}");
    free(l);
    return 0;
}

static int page_data(FILE *f, const cli_html_page *h) {
    fprintf(f, "<script>window.MEMBILL={\"phases\":[");
    for (int p = 0; p < MP_NPHASES; p++) {
        if (p) fputc(',', f);
        cli_json_string(f, mp_phase_name(p));
    }
    fprintf(f, "],\"report\":");
    char *rep = h->report ? json_dumps(h->report, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) : NULL;
    if (rep) {
        // json_dumps escapes quotes and controls; '<' still needs hiding from the HTML parser.
        for (const char *s = rep; *s; s++) *s == '<' ? fputs("\\u003c", f) : fputc(*s, f);
    } else
        fputs("null", f);
    free(rep);
    fprintf(f, ",\"runs\":[");
    int rc = 0;
    if (h->runs)
        for (int i = 0; i < h->nruns; i++) {
            if (!h->runs[i]) return -1; // a run that could not be captured
            fprintf(f, "%s%s", i ? "," : "", h->runs[i]);
        }
    else
        rc = cli_html_run_data(f, "this run");
    fprintf(f, "]};</script>\n");
    return rc;
}

static int page_bill(FILE *f, const cli_html_page *h) {
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (!mem) return -1;
    h->text(mem, h->arg);
    fclose(mem);
    fprintf(f, "<h2>The bill</h2>\n<pre id=\"bill\">");
    cli_xml_escape(f, buf);
    free(buf);
    fprintf(f, "</pre>\n%s\n", explanation);
    return 0;
}

int cli_html_writer(FILE *f, void *page, ag_err *err) {
    const cli_html_page *h = page;
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
    cli_xml_escape(f, h->title);
    fprintf(f, "</title>\n<style>%s</style></head><body>\n<h1>", cli_page_css);
    cli_xml_escape(f, h->title);
    fprintf(f, "</h1>\n<noscript><p>The chart needs JavaScript; the bill below does not.</p></noscript>\n"
               "<div id=\"controls\"></div>\n<div id=\"peaks\"></div>\n<div id=\"charts\"></div>\n"
               "<div id=\"pictures\"></div>\n");
    if (page_bill(f, h) != 0 || page_data(f, h) != 0) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    fprintf(f, "<script>%s</script>\n</body></html>\n", cli_page_js);
    return 0;
}
