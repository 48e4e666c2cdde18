// The timeline as pictures: a stacked-area SVG of live bytes by category, and a Chrome
// trace-event file (a counter track per category, phase slices, instants at the peaks).
#include "cli.h"
#include "outputs.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *const colors[MP_NCATEGORIES] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                   "#59a14f", "#edc948", "#bab0ac"};
static const char *const phase_fill[MP_NPHASES] = {"#ffffff", "#f4f4f4", "#f9f9f4", "#eef5fb", "#fbf1ea",
                                                   "#f6eef6", "#eef7ee", "#f7f7e8", "#ffffff"};

// One x position of the chart: the state after the event with the highest total among those
// that fall in it, so that no peak is lost to the downsampling.
typedef struct {
    double t;
    int64_t live[MP_NCATEGORIES];
    int64_t total;
    int phase;
} svg_point;

#define SVG_W 1080
#define SVG_H 540
#define PLOT_X 90
#define PLOT_Y 70
#define PLOT_W 660
#define PLOT_H 380
#define NPOINTS PLOT_W

// The horizontal axis: seconds, or in meta mode (which takes no time) the event number.
static double x_of(size_t i, const mp_event *e) { return mp_is_meta() ? (double)i : e->seconds; }

static size_t sample(svg_point *pts, double *t_end) {
    size_t n = mp_timeline_count(), np = 0;
    const mp_event *last = n ? mp_timeline_get(n - 1) : NULL;
    double span = last && x_of(n - 1, last) > 0 ? x_of(n - 1, last) : 1;
    int64_t live[MP_NCATEGORIES] = {0};
    for (size_t i = 0; i < n; i++) {
        const mp_event *e = mp_timeline_get(i);
        live[e->category] += e->bytes;
        int64_t total = 0;
        for (int c = 0; c < MP_NCATEGORIES; c++) total += live[c];
        size_t x = (size_t)(x_of(i, e) / span * (NPOINTS - 1));
        if (x >= NPOINTS) x = NPOINTS - 1;
        if (np == 0 || pts[np - 1].t < (double)x) { // a new column
            pts[np].t = (double)x;
            pts[np].total = -1;
            np++;
        }
        svg_point *p = &pts[np - 1];
        if (total > p->total) {
            memcpy(p->live, live, sizeof live);
            p->total = total;
            p->phase = e->phase;
        }
    }
    *t_end = span;
    return np;
}

static double nice_step(double max) {
    double raw = max / 5, p = 1;
    while (p * 10 <= raw) p *= 10;
    return raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
}

static void svg_areas(FILE *f, const svg_point *pts, size_t np, double ymax) {
    // Each category's band sits on the sum of those before it.
    for (int c = 0; c < MP_NCATEGORIES; c++) {
        fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.85\" points=\"", colors[c]);
        for (size_t i = 0; i < np; i++) {
            int64_t top = 0;
            for (int k = 0; k <= c; k++) top += pts[i].live[k];
            fprintf(f, "%.1f,%.1f ", PLOT_X + pts[i].t, PLOT_Y + PLOT_H - (double)top / ymax * PLOT_H);
        }
        for (size_t i = np; i-- > 0;) {
            int64_t base = 0;
            for (int k = 0; k < c; k++) base += pts[i].live[k];
            fprintf(f, "%.1f,%.1f ", PLOT_X + pts[i].t, PLOT_Y + PLOT_H - (double)base / ymax * PLOT_H);
        }
        fprintf(f, "\"/>\n");
    }
}

static void svg_phases(FILE *f, const svg_point *pts, size_t np) {
    size_t start = 0;
    for (size_t i = 1; i <= np; i++) {
        if (i < np && pts[i].phase == pts[start].phase) continue;
        double x0 = pts[start].t, x1 = i < np ? pts[i].t : PLOT_W;
        int ph = pts[start].phase;
        // Narrow phases keep their name as a tooltip.
        fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"><title>%s</title></rect>\n",
                PLOT_X + x0, PLOT_Y, x1 - x0, PLOT_H, phase_fill[ph], mp_phase_name(ph));
        if (x1 - x0 > 40)
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" fill=\"#666\" text-anchor=\"middle\">%s</text>\n",
                    PLOT_X + (x0 + x1) / 2, PLOT_Y - 6, mp_phase_name(ph));
        start = i;
    }
}

static void svg_axes(FILE *f, double ymax, double t_end) {
    double step = nice_step(ymax / 1e6);
    for (double v = 0; v * 1e6 <= ymax; v += step) {
        double y = PLOT_Y + PLOT_H - v * 1e6 / ymax * PLOT_H;
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", PLOT_X, PLOT_X + PLOT_W, y,
                y);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%g</text>\n", PLOT_X - 6, y + 4, v);
    }
    fprintf(f,
            "<text x=\"20\" y=\"%d\" font-size=\"12\" transform=\"rotate(-90 20 %d)\" text-anchor=\"middle\">live MB "
            "(10^6 bytes)</text>\n",
            PLOT_Y + PLOT_H / 2, PLOT_Y + PLOT_H / 2);
    for (int i = 0; i <= 4; i++)
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%.*f</text>\n",
                PLOT_X + PLOT_W * i / 4.0, PLOT_Y + PLOT_H + 16, mp_is_meta() ? 0 : 2, t_end * i / 4.0);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n", PLOT_X + PLOT_W / 2,
            PLOT_Y + PLOT_H + 34,
            mp_is_meta() ? "allocations and frees (meta mode: no time passes)" : "seconds into the run");
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", PLOT_X, PLOT_Y,
            PLOT_W, PLOT_H);
}

static void svg_legend_and_peak(FILE *f, double ymax, double t_end) {
    char b[64];
    mp_moment pk = mp_peak();
    double at = mp_is_meta() ? (double)(pk.events ? pk.events - 1 : 0) : pk.seconds;
    double x = PLOT_X + at / t_end * PLOT_W;
    if (x > PLOT_X + PLOT_W) x = PLOT_X + PLOT_W;
    double y = PLOT_Y + PLOT_H - (double)pk.total / ymax * PLOT_H;
    fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%d\" stroke=\"#000\" stroke-dasharray=\"4 3\"/>\n", x, x,
            y, PLOT_Y + PLOT_H);
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#000\"><title>total peak %s</title></circle>\n", x, y,
            mp_format_bytes(b, sizeof b, pk.total));
    int lx = PLOT_X + PLOT_W + 20, ly = PLOT_Y + 10;
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" font-weight=\"bold\">total peak</text>\n", lx, ly);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">%s</text>\n", lx, ly + 16,
            mp_format_bytes(b, sizeof b, pk.total));
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#555\">in %s; it held:</text>\n", lx, ly + 32,
            mp_phase_name(pk.phase));
    ly += 52;
    for (int c = MP_NCATEGORIES - 1; c >= 0; c--) {
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", lx, ly - 10, colors[c]);
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">%s %.2f MB</text>\n", lx + 18, ly, mp_category_name(c),
                (double)pk.bytes[c] / 1e6);
        ly += 20;
    }
}

// scale: the highest total the vertical axis must hold (0: this run's own peak), so that two
// charts can share one scale.
int cli_svg_scaled(FILE *f, const char *title, double scale) {
    svg_point *pts = calloc(NPOINTS, sizeof *pts);
    if (!pts) return -1;
    double t_end;
    size_t np = sample(pts, &t_end);
    double ymax = 1;
    for (size_t i = 0; i < np; i++)
        if ((double)pts[i].total > ymax) ymax = (double)pts[i].total;
    // The highest plotted total, so a reader (or a test) can check the chart against the report.
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
            "height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" data-plotted-peak-bytes=\"%.0f\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
            SVG_W, SVG_H, SVG_W, SVG_H, ymax);
    fprintf(f, "<text x=\"%d\" y=\"28\" font-size=\"16\" font-weight=\"bold\">", PLOT_X);
    cli_xml_escape(f, title);
    fprintf(f,
            "</text>\n<text x=\"%d\" y=\"46\" font-size=\"12\" fill=\"#555\">live bytes by category over the run "
            "(stacked); "
            "phases shaded; the dashed line marks the total peak</text>\n",
            PLOT_X);
    if (scale > ymax) ymax = scale;
    ymax *= 1.08; // headroom above the peak
    svg_phases(f, pts, np);
    svg_axes(f, ymax, t_end);
    svg_areas(f, pts, np, ymax);
    svg_legend_and_peak(f, ymax, t_end);
    fprintf(f, "</svg>\n");
    free(pts);
    return 0;
}

int cli_svg_writer(FILE *f, void *title, ag_err *err) {
    if (cli_svg_scaled(f, title, 0) == 0) return 0;
    ag_err_set(err, "out of memory");
    return -1;
}

void cli_xml_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

// ---- Chrome trace-event format ----

static void trace_event(FILE *f, bool *first, const char *fmt_name, const char *ph, double ts_us, const char *extra) {
    fprintf(f, "%s\n{\"name\":\"%s\",\"ph\":\"%s\",\"ts\":%.3f,\"pid\":1,\"tid\":1%s}", *first ? "" : ",", fmt_name, ph,
            ts_us, extra);
    *first = false;
}

int cli_trace_writer(FILE *f, void *unused, ag_err *err) {
    (void)unused;
    (void)err;
    bool first = true;
    char extra[160];
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
    int64_t live[MP_NCATEGORIES] = {0};
    size_t n = mp_timeline_count();
    int phase = -1;
    double phase_start = 0;
    // Every category's track starts at zero, so each has one even when it never holds a byte.
    double t0 = n ? mp_timeline_get(0)->seconds * 1e6 : 0;
    for (int c = 0; c < MP_NCATEGORIES; c++)
        trace_event(f, &first, mp_category_name(c), "C", t0, ",\"args\":{\"bytes\":0}");
    for (size_t i = 0; i <= n; i++) {
        const mp_event *e = i < n ? mp_timeline_get(i) : NULL;
        double t = e ? e->seconds * 1e6 : (n ? mp_timeline_get(n - 1)->seconds * 1e6 : 0);
        if (!e || e->phase != phase) { // a phase slice ends
            if (phase >= 0) {
                snprintf(extra, sizeof extra, ",\"dur\":%.3f,\"cat\":\"phase\"", t - phase_start);
                trace_event(f, &first, mp_phase_name(phase), "X", phase_start, extra);
            }
            if (!e) break;
            phase = e->phase;
            phase_start = t;
        }
        live[e->category] += e->bytes;
        snprintf(extra, sizeof extra, ",\"args\":{\"bytes\":%lld}", (long long)live[e->category]);
        trace_event(f, &first, mp_category_name(e->category), "C", t, extra);
    }
    mp_moment pk = mp_peak();
    snprintf(extra, sizeof extra, ",\"s\":\"g\",\"args\":{\"bytes\":%llu,\"site\":\"%s\"}",
             (unsigned long long)pk.total, mp_site_name(pk.site));
    trace_event(f, &first, "total peak", "i", pk.seconds * 1e6, extra);
    fprintf(f, "\n]}\n");
    return 0;
}

// ---- one self-contained HTML page: the chart, the bill (with the top sites), what it means ----

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
    "MB means 10<sup>6</sup> bytes. The peak, not the current allocation, decides an out-of-memory error.</p>";

int cli_html_writer(FILE *f, void *page, ag_err *err) {
    const cli_html_page *h = page;
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
    cli_xml_escape(f, h->title);
    fprintf(f, "</title><style>body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
               "pre{background:#f7f7f7;padding:1em;overflow-x:auto;font-size:12px}</style></head><body>\n<h1>");
    cli_xml_escape(f, h->title);
    fprintf(f, "</h1>\n<figure id=\"chart\">\n");
    if (cli_svg_writer(f, (void *)h->title, err) != 0) return -1;
    fprintf(f, "</figure>\n<h2>The bill</h2>\n<pre id=\"bill\">");
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (!mem) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    h->text(mem, h->arg);
    fclose(mem);
    cli_xml_escape(f, buf);
    free(buf);
    fprintf(f, "</pre>\n%s\n</body></html>\n", explanation);
    return 0;
}
