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

#define PLOT_X 90
#define PLOT_Y 128 // room above for the phases' names, upright where a phase is narrow
#define PLOT_W 660
#define PLOT_H 290
#define INSET_Y (PLOT_Y + PLOT_H + 26)
#define INSET_H 100
#define AXIS_Y (INSET_Y + INSET_H)
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

// A round step that gives about five ticks below max, for any magnitude (a tiny model's 0.3 MB too).
static double nice_step(double max) {
    double raw = max / 5, p = 1;
    if (raw <= 0) return 1;
    while (p * 10 <= raw) p *= 10;
    while (p > raw) p /= 10;
    return raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
}

// The unit the axis reads in: the largest of GB, MB, kB, bytes that max holds at least once.
static void axis_unit(double max, double *unit, const char **name) {
    static const double units[] = {1e9, 1e6, 1e3, 1};
    static const char *const names[] = {"GB", "MB", "kB", "bytes"};
    int k = 0;
    while (k < 3 && max < units[k]) k++;
    *unit = units[k];
    *name = names[k];
}

// Which categories the inset shows: those that held something, under a tenth of the largest.
static bool is_small(const svg_point *pts, size_t np, int c) {
    int64_t own = 0, largest = 0;
    for (size_t i = 0; i < np; i++)
        for (int k = 0; k < MP_NCATEGORIES; k++) {
            if (pts[i].live[k] > largest) largest = pts[i].live[k];
            if (k == c && pts[i].live[k] > own) own = pts[i].live[k];
        }
    return own > 0 && own * 10 < largest;
}

typedef struct {
    int y0, h;   // the panel's top and height
    double ymax; // bytes at its top
} svg_panel;

static double panel_y(const svg_panel *p, int64_t v) { return p->y0 + p->h - (double)v / p->ymax * p->h; }

static int64_t stacked(const svg_point *pt, const bool *shown, int upto) {
    int64_t v = 0;
    for (int k = 0; k < upto; k++)
        if (shown[k]) v += pt->live[k];
    return v;
}

static void svg_areas(FILE *f, const svg_point *pts, size_t np, const svg_panel *p, const bool *shown) {
    // Each category's band sits on the sum of those before it.
    for (int c = 0; c < MP_NCATEGORIES; c++) {
        if (!shown[c]) continue;
        fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.85\" data-cat=\"%s\" points=\"", colors[c],
                mp_category_name(c));
        for (size_t i = 0; i < np; i++)
            fprintf(f, "%.1f,%.1f ", PLOT_X + pts[i].t, panel_y(p, stacked(&pts[i], shown, c + 1)));
        for (size_t i = np; i-- > 0;)
            fprintf(f, "%.1f,%.1f ", PLOT_X + pts[i].t, panel_y(p, stacked(&pts[i], shown, c)));
        fprintf(f, "\"/>\n");
    }
}

// Every phase is named: above its band where it is wide enough, upright (nudged off its
// neighbour's name, with a leader) where it is not.
static void svg_phases(FILE *f, const svg_point *pts, size_t np) {
    size_t start = 0;
    double last_label = -1e9;
    for (size_t i = 1; i <= np; i++) {
        if (i < np && pts[i].phase == pts[start].phase) continue;
        double x0 = pts[start].t, x1 = i < np ? pts[i].t : PLOT_W, mid = PLOT_X + (x0 + x1) / 2;
        const char *name = mp_phase_name(pts[start].phase);
        fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"><title>%s</title></rect>\n",
                PLOT_X + x0, PLOT_Y, x1 - x0, AXIS_Y - PLOT_Y, phase_fill[pts[start].phase], name);
        if (x1 - x0 > 6.5 * (double)strlen(name) + 6) {
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" fill=\"#444\" text-anchor=\"middle\">%s</text>\n",
                    mid, PLOT_Y - 6, name);
            last_label = mid + 3.25 * (double)strlen(name);
        } else {
            double x = mid > last_label + 13 ? mid : last_label + 13;
            fprintf(f,
                    "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#999\"/>\n<text x=\"%.1f\" y=\"%d\" "
                    "font-size=\"11\" fill=\"#444\" transform=\"rotate(-90 %.1f %d)\">%s</text>\n",
                    mid, x - 3, PLOT_Y, PLOT_Y - 4, x + 4, PLOT_Y - 6, x + 4, PLOT_Y - 6, name);
            last_label = x;
        }
        start = i;
    }
}

static void svg_y_axis(FILE *f, const svg_panel *p, const char *label) {
    double unit;
    const char *uname;
    axis_unit(p->ymax, &unit, &uname);
    double step = nice_step(p->ymax / unit);
    for (double v = 0; v * unit <= p->ymax; v += step) {
        double y = panel_y(p, (int64_t)(v * unit));
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", PLOT_X, PLOT_X + PLOT_W, y,
                y);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%g</text>\n", PLOT_X - 6, y + 4, v);
    }
    int mid = p->y0 + p->h / 2;
    fprintf(f,
            "<text x=\"22\" y=\"%d\" font-size=\"12\" transform=\"rotate(-90 22 %d)\" text-anchor=\"middle\">%s "
            "(%s)</text>\n",
            mid, mid, label, uname);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", PLOT_X, p->y0,
            PLOT_W, p->h);
}

static void svg_x_axis(FILE *f, double t_end, bool normalised) {
    for (int i = 0; i <= 4; i++) {
        double v = t_end * i / 4.0;
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">", PLOT_X + PLOT_W * i / 4.0,
                AXIS_Y + 16);
        if (normalised)
            fprintf(f, "%d%%</text>\n", i * 25);
        else
            fprintf(f, "%.*f</text>\n", mp_is_meta() ? 0 : t_end < 0.1 ? 4 : 2, v);
    }
    const char *label = normalised     ? "share of the run (runs of different lengths on one axis)"
                        : mp_is_meta() ? "allocations and frees, in order (meta mode: no time passes)"
                                       : "seconds into the run";
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n", PLOT_X + PLOT_W / 2,
            AXIS_Y + 34, label);
}

static void svg_legend_and_peak(FILE *f, const svg_panel *p, double t_end) {
    char b[64];
    mp_moment pk = mp_peak();
    double at = mp_is_meta() ? (double)(pk.events ? pk.events - 1 : 0) : pk.seconds;
    double x = PLOT_X + at / t_end * PLOT_W;
    if (x > PLOT_X + PLOT_W) x = PLOT_X + PLOT_W;
    double y = panel_y(p, (int64_t)pk.total);
    fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%d\" stroke=\"#000\" stroke-dasharray=\"4 3\"/>\n", x, x,
            y, AXIS_Y);
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
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">%s %s</text>\n", lx + 18, ly, mp_category_name(c),
                mp_format_bytes(b, sizeof b, pk.bytes[c]));
        ly += 20;
    }
}

// The small categories again, below, on a scale of their own: 40 MB of activations beside 2 GB
// of weights and state is a sliver on the main scale.
static void svg_inset(FILE *f, const svg_point *pts, size_t np) {
    bool shown[MP_NCATEGORIES];
    svg_panel p = {INSET_Y, INSET_H, 1};
    for (int c = 0; c < MP_NCATEGORIES; c++) shown[c] = is_small(pts, np, c);
    for (size_t i = 0; i < np; i++) {
        double v = (double)stacked(&pts[i], shown, MP_NCATEGORIES);
        if (v > p.ymax) p.ymax = v;
    }
    p.ymax *= 1.1;
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#555\">", PLOT_X, INSET_Y - 6);
    int any = 0;
    for (int c = 0; c < MP_NCATEGORIES; c++)
        if (shown[c]) fprintf(f, "%s%s", any++ ? ", " : "", mp_category_name(c));
    fprintf(f, "%s</text>\n",
            any ? ": under a tenth of the largest category, on a scale of their own"
                : "no category under a tenth of the largest: nothing to enlarge");
    if (!any) return;
    svg_y_axis(f, &p, "small");
    svg_areas(f, pts, np, &p, shown);
}

int cli_svg_chart(FILE *f, const char *title, double scale, bool normalised) {
    svg_point *pts = calloc(NPOINTS, sizeof *pts);
    if (!pts) return -1;
    double t_end;
    size_t np = sample(pts, &t_end);
    double ymax = 1;
    for (size_t i = 0; i < np; i++)
        if ((double)pts[i].total > ymax) ymax = (double)pts[i].total;
    // The highest plotted total, so a reader (or a test) can check the chart against the report.
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100%%\" "
            "viewBox=\"0 0 %d %d\" preserveAspectRatio=\"xMidYMid meet\" font-family=\"sans-serif\" "
            "data-plotted-peak-bytes=\"%.0f\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
            CLI_SVG_W, CLI_SVG_H, ymax);
    fprintf(f, "<text x=\"%d\" y=\"28\" font-size=\"16\" font-weight=\"bold\">", PLOT_X);
    cli_xml_escape(f, title);
    fprintf(f,
            "</text>\n<text x=\"%d\" y=\"46\" font-size=\"12\" fill=\"#555\">live bytes by category over the run "
            "(stacked); phases shaded and named; the dashed line marks the total peak</text>\n",
            PLOT_X);
    if (scale > ymax) ymax = scale;
    svg_panel main = {PLOT_Y, PLOT_H, ymax * 1.08}; // headroom above the peak
    bool all[MP_NCATEGORIES];
    for (int c = 0; c < MP_NCATEGORIES; c++) all[c] = true;
    svg_phases(f, pts, np);
    svg_y_axis(f, &main, "live");
    svg_areas(f, pts, np, &main, all);
    svg_inset(f, pts, np);
    svg_x_axis(f, t_end, normalised);
    svg_legend_and_peak(f, &main, t_end);
    fprintf(f, "</svg>\n");
    free(pts);
    return 0;
}

int cli_svg_scaled(FILE *f, const char *title, double scale) { return cli_svg_chart(f, title, scale, false); }

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
// Counter tracks per category, a slice per phase on the one named thread ("phases"), and every
// tensor an async slice from its allocation to its free (name: the site, on the process's track
// of that name; cat and args: its category, bytes, shape and dtype), so that Perfetto can say
// which tensors were live at any moment. Plain malloc ("other": thousands of parser and tape
// allocations a step) is its counter track alone: as slices it would be most of the trace.

// Microseconds, made strictly increasing (a nanosecond apart at least): "what was live at the
// peak's timestamp" then has one answer even where two events share a clock tick.
static double *trace_times(size_t n) {
    double *ts = malloc((n + 1) * sizeof *ts);
    for (size_t i = 0; ts && i < n; i++) {
        ts[i] = mp_timeline_get(i)->seconds * 1e6;
        if (i && ts[i] < ts[i - 1] + 1e-3) ts[i] = ts[i - 1] + 1e-3;
    }
    return ts;
}

static void trace_sep(FILE *f, bool *first) {
    fputs(*first ? "\n" : ",\n", f);
    *first = false;
}

static void trace_metadata(FILE *f, bool *first, const char *title) {
    trace_sep(f, first);
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":");
    cli_json_string(f, title ? title : "membill");
    fprintf(f, "}}");
    // Async slices go on the process's tracks, named by the slices: the one thread named is the
    // one that carries slices of its own.
    trace_sep(f, first);
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"phases\"}}");
}

static void trace_counter(FILE *f, bool *first, int cat, double ts, int64_t live) {
    trace_sep(f, first);
    fprintf(f, "{\"name\":\"%s\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":1,\"tid\":1,\"args\":{\"bytes\":%lld}}",
            mp_category_name(cat), ts, (long long)live);
}

static void trace_phase(FILE *f, bool *first, int phase, double start, double end) {
    trace_sep(f, first);
    fprintf(f, "{\"name\":\"%s\",\"cat\":\"phase\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":1}",
            mp_phase_name(phase), start, end - start);
}

// A tensor's "[25, 576] float32" as the args "shape": [25, 576] and "dtype": "float32".
static void trace_detail(FILE *f, const char *d) {
    const char *close = d && d[0] == '[' ? strchr(d, ']') : NULL;
    if (!close || close[1] != ' ') return;
    fprintf(f, ",\"shape\":%.*s,\"dtype\":", (int)(close - d + 1), d);
    cli_json_string(f, close + 2);
}

// One end of a tensor's slice: "b" at its allocation, "e" at its free.
static void trace_tensor(FILE *f, bool *first, const cli_lifetime *l, size_t id, const char *ph, double ts) {
    trace_sep(f, first);
    fprintf(f, "{\"name\":");
    cli_json_string(f, mp_site_name(l->site));
    fprintf(f, ",\"cat\":\"%s\",\"ph\":\"%s\",\"id\":%zu,\"ts\":%.3f,\"pid\":1,\"tid\":1",
            mp_category_name(l->category), ph, id, ts);
    if (*ph == 'b') {
        fprintf(f, ",\"args\":{\"bytes\":%lld,\"category\":\"%s\"", (long long)l->bytes, mp_category_name(l->category));
        trace_detail(f, mp_detail_name(l->detail));
        fputc('}', f);
    }
    fputc('}', f);
}

// Which lifetime each event begins or ends (SIZE_MAX: none, a zero-byte event).
static size_t *event_owners(const cli_lifetime *l, size_t nl, size_t n) {
    size_t *who = malloc((n + 1) * sizeof *who);
    for (size_t i = 0; who && i < n; i++) who[i] = SIZE_MAX;
    for (size_t k = 0; who && k < nl; k++) {
        who[l[k].start] = k;
        if (l[k].end != CLI_LIVE_TO_END) who[l[k].end] = k;
    }
    return who;
}

static void trace_events(FILE *f, bool *first, size_t n, const double *ts, const cli_lifetime *l, size_t nl,
                         const size_t *who) {
    int64_t live[MP_NCATEGORIES] = {0};
    int phase = -1;
    double phase_start = 0, t0 = n ? ts[0] : 0, t_end = n ? ts[n - 1] : 0;
    // Every category's track starts at zero, so each has one even when it never holds a byte.
    for (int c = 0; c < MP_NCATEGORIES; c++) trace_counter(f, first, c, t0, 0);
    for (size_t i = 0; i < n; i++) {
        const mp_event *e = mp_timeline_get(i);
        if (e->phase != phase) { // a phase slice ends
            if (phase >= 0) trace_phase(f, first, phase, phase_start, ts[i]);
            phase = e->phase;
            phase_start = ts[i];
        }
        live[e->category] += e->bytes;
        trace_counter(f, first, e->category, ts[i], live[e->category]);
        size_t k = who[i];
        // a free that ended nothing recorded, or plain malloc: no slice
        if (k == SIZE_MAX || l[k].bytes < 0 || l[k].category == MP_OTHER) continue;
        trace_tensor(f, first, &l[k], k, l[k].start == i ? "b" : "e", ts[i]);
    }
    if (phase >= 0) trace_phase(f, first, phase, phase_start, t_end);
    for (size_t k = 0; k < nl; k++) // still live when the timeline ends: the slice ends with it
        if (l[k].end == CLI_LIVE_TO_END && l[k].bytes > 0 && l[k].category != MP_OTHER)
            trace_tensor(f, first, &l[k], k, "e", t_end + 1e-3);
}

int cli_trace_writer(FILE *f, void *title, ag_err *err) {
    size_t n = mp_timeline_count(), nl = 0;
    double *ts = trace_times(n);
    cli_lifetime *l = cli_lifetimes(n, &nl);
    size_t *who = l ? event_owners(l, nl, n) : NULL;
    int rc = ts && l && who ? 0 : -1;
    if (rc == 0) {
        bool first = true;
        fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
        trace_metadata(f, &first, title);
        trace_events(f, &first, n, ts, l, nl, who);
        mp_moment pk = mp_peak();
        trace_sep(f, &first);
        // At the peak event's own timestamp: the slices live then hold the peak's composition.
        fprintf(f,
                "{\"name\":\"total "
                "peak\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,\"pid\":1,\"tid\":1,\"args\":{\"bytes\":%llu,"
                "\"site\":",
                pk.events && pk.events <= n ? ts[pk.events - 1] : 0, (unsigned long long)pk.total);
        cli_json_string(f, mp_site_name(pk.site));
        fprintf(f, "}}\n]}\n");
    } else
        ag_err_set(err, "out of memory");
    free(ts);
    free(l);
    free(who);
    return rc;
}
