// The profiler's report as text and JSON, and the byte sizes that users type and read.
#include "mp_internal.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

bool mp_parse_bytes(const char *text, uint64_t *out) {
    // A number as people write it: digits, a point, an exponent; no sign, space or hex.
    if (!text || !((*text >= '0' && *text <= '9') || *text == '.')) return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno == ERANGE || !isfinite(v) || v < 0) return false;
    for (const char *p = text; p < end; p++)
        if (!strchr("0123456789.eE+-", *p)) return false;
    while (*end == ' ') end++;
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},
                 {"b", 1},
                 {"kb", 1e3},
                 {"mb", 1e6},
                 {"gb", 1e9},
                 {"tb", 1e12},
                 {"k", 1e3},
                 {"m", 1e6},
                 {"g", 1e9},
                 {"t", 1e12},
                 {"kib", 1024.0},
                 {"mib", 1048576.0},
                 {"gib", 1073741824.0},
                 {"tib", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].unit) == 0) {
            double b = nearbyint(v * units[i].mult);
            // Whole bytes below 2^64; a positive size that rounds to nothing is a mistake.
            if (b >= 18446744073709551616.0 || (b == 0 && v > 0)) return false;
            *out = (uint64_t)b;
            return true;
        }
    }
    return false;
}

static const char *with_commas(char *buf, size_t n, uint64_t v) {
    char digits[32];
    int len = snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
    size_t o = 0;
    for (int i = 0; i < len && o + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = 0;
    return buf;
}

const char *mp_format_bytes(char *buf, size_t n, uint64_t bytes) {
    char c[40];
    // The unit follows the exact count (GB from 10^9 bytes), so a figure never names a unit the
    // count beside it has not reached: 999,999 bytes is "1000.00 kB".
    double scale = bytes >= 1000000000ULL ? 1e9 : bytes >= 1000000ULL ? 1e6 : 1e3;
    const char *unit = bytes >= 1000000000ULL ? "GB" : bytes >= 1000000ULL ? "MB" : "kB";
    snprintf(buf, n, "%.2f %s (%s bytes)", (double)bytes / scale, unit, with_commas(c, sizeof c, bytes));
    return buf;
}

static json_t *composition_json(const mp_moment *m) {
    json_t *o = json_object();
    for (int c = 0; c < MP_NCATEGORIES; c++)
        json_object_set_new(o, mp_category_name(c), json_integer((json_int_t)m->bytes[c]));
    return o;
}

static json_t *categories_json(void) {
    json_t *cats = json_object();
    for (int c = 0; c < MP_NCATEGORIES; c++) {
        mp_counter k = mp_get_counter(c);
        json_t *o = json_object();
        json_object_set_new(o, "peak_bytes", json_integer((json_int_t)k.peak));
        json_object_set_new(o, "live_bytes", json_integer((json_int_t)k.live));
        json_object_set_new(o, "peak_usable_bytes", json_integer((json_int_t)k.peak_usable));
        json_object_set_new(o, "live_usable_bytes", json_integer((json_int_t)k.live_usable));
        json_object_set_new(o, "allocations", json_integer((json_int_t)k.allocations));
        json_object_set_new(o, "frees", json_integer((json_int_t)k.frees));
        if (c == MP_OTHER) json_object_set_new(o, "tracked", json_boolean(mp_other_available()));
        json_object_set_new(cats, mp_category_name(c), o);
    }
    return cats;
}

static json_t *phases_json(void) {
    json_t *arr = json_array();
    for (int p = 0; p < MP_NPHASES; p++) {
        mp_phase_stats s = mp_get_phase_stats(p);
        if (!s.entries || p == MP_PHASE_SETUP || p == MP_PHASE_TEARDOWN) continue;
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(mp_phase_name(p)));
        json_object_set_new(o, "peak_bytes", json_integer((json_int_t)s.peak));
        json_object_set_new(o, "seconds", json_real(s.seconds));
        json_object_set_new(o, "entries", json_integer(s.entries));
        json_object_set_new(o, "site", json_string(mp_site_name(s.at_peak.site)));
        json_object_set_new(o, "composition", composition_json(&s.at_peak));
        json_array_append_new(arr, o);
    }
    return arr;
}

static json_t *process_json(void) {
    mp_process pk = mp_process_peak();
    json_t *o = json_object();
    json_object_set_new(o, "peak_rss_bytes", json_integer((json_int_t)pk.hwm));
    json_object_set_new(o, "checkpoint_rss_bytes", json_integer((json_int_t)pk.rss));
    json_object_set_new(o, "jemalloc_resident_bytes", json_integer((json_int_t)pk.jemalloc_resident));
    json_object_set_new(o, "untracked_bytes", json_integer((json_int_t)pk.untracked));
    return o;
}

static json_t *jemalloc_json(void) {
    mp_crosscheck x = mp_crosscheck_jemalloc(MP_WEIGHT, 0);
    json_t *o = json_object();
    json_object_set_new(o, "backend", json_string(mp_backend()));
    json_object_set_new(o, "available", json_boolean(x.available));
    json_object_set_new(o, "agrees", x.available ? json_boolean(x.agrees) : json_null());
    json_object_set_new(o, "other_hooks", json_boolean(mp_other_available()));
    if (x.available) {
        json_t *arenas = json_object();
        for (int c = 0; c < MP_OTHER; c++) {
            json_t *a = json_object();
            json_object_set_new(a, "jemalloc_bytes", json_integer((json_int_t)x.jemalloc_bytes[c]));
            json_object_set_new(a, "difference", json_integer((json_int_t)x.difference[c]));
            json_object_set_new(arenas, mp_category_name(c), a);
        }
        json_object_set_new(o, "arenas", arenas);
    }
    return o;
}

static json_t *oom_json(void) {
    const mp_oom_record *r = mp_oom();
    json_t *o = json_object();
    json_object_set_new(o, "bytes", json_integer((json_int_t)mp_budget()));
    json_object_set_new(o, "exceeded", json_boolean(r->happened));
    if (r->happened) {
        json_object_set_new(o, "category", json_string(mp_category_name(r->category)));
        json_object_set_new(o, "site", json_string(mp_site_name(r->site)));
        // Plain malloc names no tensor: the tensor allocated last before it.
        if (r->category == MP_OTHER) json_object_set_new(o, "after_site", json_string(mp_site_name(r->live.site)));
        json_object_set_new(o, "requested_bytes", json_integer((json_int_t)r->requested));
        json_object_set_new(o, "phase", json_string(mp_phase_name(r->live.phase)));
        json_object_set_new(o, "live_bytes", json_integer((json_int_t)r->live.total));
        json_object_set_new(o, "live", composition_json(&r->live));
    }
    return o;
}

int mp_report_json(json_t *root) {
    if (!mp_g.active || !root) return -1;
    json_object_set_new(root, "categories", categories_json());
    mp_moment pk = mp_peak();
    json_t *peak = json_object();
    json_object_set_new(peak, "total_bytes", json_integer((json_int_t)pk.total));
    json_object_set_new(peak, "phase", json_string(mp_phase_name(pk.phase)));
    json_object_set_new(peak, "site", json_string(mp_site_name(pk.site)));
    json_object_set_new(peak, "crossed_by_malloc", json_boolean(pk.by_malloc));
    json_object_set_new(peak, "seconds", json_real(pk.seconds));
    json_object_set_new(peak, "composition", composition_json(&pk));
    json_object_set_new(root, "peak", peak);
    json_object_set_new(root, "phases", phases_json());
    json_object_set_new(root, "process", process_json());
    json_object_set_new(root, "jemalloc", jemalloc_json());
    json_object_set_new(root, "timeline",
                        json_pack("{s:I, s:I}", "events", (json_int_t)mp_timeline_count(), "dropped_events",
                                  (json_int_t)mp_timeline_dropped()));
    if (mp_budget()) json_object_set_new(root, "budget", oom_json());
    return 0;
}

static void text_moment(FILE *f, const mp_moment *m) {
    char b[80];
    for (int c = 0; c < MP_NCATEGORIES; c++)
        if (m->bytes[c]) fprintf(f, "      %-11s %s\n", mp_category_name(c), mp_format_bytes(b, sizeof b, m->bytes[c]));
}

// What made a moment: the tensor site, or plain malloc after the last tensor.
static const char *moment_cause(char *buf, size_t n, const mp_moment *m) {
    if (!m->by_malloc)
        snprintf(buf, n, "%s", mp_site_name(m->site));
    else if (m->site)
        snprintf(buf, n, "plain malloc (not a tensor), after %s", mp_site_name(m->site));
    else
        snprintf(buf, n, "plain malloc (not a tensor), before any tensor");
    return buf;
}

// Why "other" has no figures, when it has none.
static const char *other_untracked_reason(void) {
    if (mp_g.opt.meta) return "not tracked in meta mode (no data is allocated)";
    if (!mp_g.opt.track_other) return "not tracked in this run";
    if (strcmp(mp_backend(), "jemalloc") != 0) return "not tracked (the system allocator has no allocation hooks)";
    return "not tracked (this jemalloc has no allocation hooks)";
}

void mp_report_text(FILE *f) {
    if (!mp_g.active) return;
    char b[80], u[80], why[400];
    bool meta = mp_g.opt.meta; // shapes only: usable bytes would merely repeat the requested ones
    if (meta)
        fprintf(f, "  %-11s %-36s %s\n", "category", "peak (requested)", "allocations");
    else
        fprintf(f, "  %-11s %-36s %-36s %s\n", "category", "peak (requested)", "peak (allocator size classes)",
                "allocations");
    for (int c = 0; c < MP_NCATEGORIES; c++) {
        mp_counter k = mp_get_counter(c);
        if (c == MP_OTHER && !mp_other_available()) {
            fprintf(f, "  %-11s %s\n", "other", other_untracked_reason());
            continue;
        }
        if (meta)
            fprintf(f, "  %-11s %-36s %llu\n", mp_category_name(c), mp_format_bytes(b, sizeof b, k.peak),
                    (unsigned long long)k.allocations);
        else
            fprintf(f, "  %-11s %-36s %-36s %llu\n", mp_category_name(c), mp_format_bytes(b, sizeof b, k.peak),
                    mp_format_bytes(u, sizeof u, k.peak_usable), (unsigned long long)k.allocations);
    }
    mp_moment pk = mp_peak();
    fprintf(f, "\n  total peak  %s\n    when: phase %s, %.3f s into the run, allocating %s\n    held then:\n",
            mp_format_bytes(b, sizeof b, pk.total), mp_phase_name(pk.phase), pk.seconds,
            moment_cause(why, sizeof why, &pk));
    text_moment(f, &pk);
    fprintf(f, "\n  %-10s %-36s %s\n", "phase", "peak", "seconds");
    for (int p = 0; p < MP_NPHASES; p++) {
        mp_phase_stats s = mp_get_phase_stats(p);
        if (!s.entries || p == MP_PHASE_SETUP || p == MP_PHASE_TEARDOWN) continue;
        fprintf(f, "  %-10s %-36s %.4f\n", mp_phase_name(p), mp_format_bytes(b, sizeof b, s.peak), s.seconds);
    }
    mp_process pr = mp_process_peak();
    fprintf(f, "\n  process peak RSS %s%s\n", mp_format_bytes(b, sizeof b, pr.hwm),
            meta ? " (this process: meta mode allocates no tensor data)" : "");
    if (pr.jemalloc_resident) {
        fprintf(f, "  jemalloc resident at most %s\n", mp_format_bytes(b, sizeof b, pr.jemalloc_resident));
        // jemalloc's own definition (stats.resident): an upper bound, not a measurement.
        fprintf(f, "    (an upper bound, so it can exceed RSS: it counts the pages of live allocations, dirty pages and"
                   " metadata, touched or not)\n");
        fprintf(f, "  untracked (RSS jemalloc never saw: BLAS and kernel buffers, code, stacks): up to %s\n",
                mp_format_bytes(b, sizeof b, pr.untracked));
    }
    mp_crosscheck x = mp_crosscheck_jemalloc(MP_WEIGHT, 0);
    if (meta) {
        fprintf(f, "  jemalloc cross-check: not applicable in meta mode (nothing is allocated)\n");
    } else if (!x.available) {
        fprintf(f, "  jemalloc cross-check: not available (%s)\n",
                strcmp(mp_backend(), "jemalloc") == 0 ? "jemalloc built without statistics" : "system allocator");
    } else if (x.agrees) {
        fprintf(f, "  jemalloc cross-check: per-arena statistics agree with the profiler to the byte\n");
    } else {
        fprintf(f, "  jemalloc cross-check: DISAGREES:");
        for (int c = 0; c < MP_OTHER; c++)
            if (x.difference[c]) fprintf(f, " %s %+lld bytes", mp_category_name(c), (long long)x.difference[c]);
        fprintf(f, "\n");
    }
    if (mp_timeline_dropped())
        fprintf(f, "  timeline: %zu events lost (out of memory while growing it)\n", mp_timeline_dropped());
    const mp_oom_record *r = mp_oom();
    if (r->happened && r->category == MP_OTHER) {
        // Seen after the fact, it could not be refused: the run fails at its next tensor or its end.
        fprintf(f,
                "\n  OUT OF BUDGET: other (plain malloc, not a tensor) took %s %s%s in phase %s, past the budget %s;"
                " live before it:\n",
                mp_format_bytes(b, sizeof b, r->requested), r->live.site ? "after " : "before any tensor",
                r->live.site ? mp_site_name(r->live.site) : "", mp_phase_name(r->live.phase),
                mp_format_bytes(u, sizeof u, r->budget));
        text_moment(f, &r->live);
    } else if (r->happened) {
        fprintf(f, "\n  OUT OF BUDGET: %s asked for %s at %s in phase %s; budget %s; live then:\n",
                mp_category_name(r->category), mp_format_bytes(b, sizeof b, r->requested), mp_site_name(r->site),
                mp_phase_name(r->live.phase), mp_format_bytes(u, sizeof u, r->budget));
        text_moment(f, &r->live);
    }
}
