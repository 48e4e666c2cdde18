// membill snapshot FILE.pickle: a CUDA memory snapshot read back (a user's real
// torch.cuda.memory._dump_snapshot, or membill's --snapshot): its figures at the end, its peaks
// over the trace, a timeline, the largest blocks at the peak, and beside a membill report of the
// same run (--against), where the two differ.
#include "cli.h"
#include "outputs.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_FILE ((size_t)2 << 30) // a snapshot of 100,000 trace entries is tens of MB
#define POINTS 24
#define LARGEST 10

typedef struct {
    const cli_options *o;
    mp_snapshot *snap;
    json_t *plan;     // --against's report
    json_t *plan_dev; // its "device"
} snapshot_cmd;

// The whole snapshot, through llama_read_file (a FIFO or a device is refused, naming it).
static int read_file(const char *path, uint8_t **out, size_t *n, ag_err *err) {
    char *text = NULL;
    if (llama_read_file(path, "a snapshot membill reads", MAX_FILE, &text, n, err) != 0) return -1;
    *out = (uint8_t *)text;
    return 0;
}

// --against: a membill report with its device figures.
static int read_plan(snapshot_cmd *c, ag_err *err) {
    json_error_t je;
    char *text = NULL;
    size_t len = 0;
    ag_err e;
    if (llama_read_file(c->o->against, "a membill report", 1u << 30, &text, &len, &e) != 0) {
        ag_err_set(err, "--against %s", e.msg);
        return -1;
    }
    c->plan = json_loadb(text, len, 0, &je);
    free(text);
    if (!c->plan) {
        ag_err_set(err, "--against %s: not JSON (line %d: %s)", c->o->against, je.line, je.text);
        return -1;
    }
    c->plan_dev = json_object_get(c->plan, "device");
    if (!json_is_object(c->plan_dev) || !json_is_integer(json_object_get(c->plan_dev, "reserved_peak_bytes"))) {
        ag_err_set(err, "--against %s: no device figures in it (make it with --device cuda or --gpu)", c->o->against);
        return -1;
    }
    return 0;
}

static uint64_t plan_u64(const snapshot_cmd *c, const char *key) {
    return (uint64_t)json_integer_value(json_object_get(c->plan_dev, key));
}

static const char *entry_text(char *buf, size_t n, size_t entry) {
    if (entry == SIZE_MAX)
        snprintf(buf, n, "before the trace");
    else
        snprintf(buf, n, "after entry %zu", entry);
    return buf;
}

static void text_device(FILE *f, const snapshot_cmd *c, size_t i) {
    const mp_snapshot_device *d = mp_snapshot_device_at(c->snap, i);
    char a[64], b[64], e[48];
    fprintf(f,
            "\n  device %d: %llu segment%s, %zu trace entries (%llu allocations, %llu frees, %llu segments made, %llu "
            "handed back, %llu out-of-memory)\n",
            d->device, (unsigned long long)d->segments, d->segments == 1 ? "" : "s", d->trace_entries,
            (unsigned long long)d->allocs, (unsigned long long)d->frees, (unsigned long long)d->segment_allocs,
            (unsigned long long)d->segment_frees, (unsigned long long)d->ooms);
    fprintf(f, "    at the end: reserved %s, allocated (blocks) ", mp_format_bytes(a, sizeof a, d->reserved_bytes));
    fprintf(f, "%s, requested %s\n", mp_format_bytes(a, sizeof a, d->allocated_bytes),
            mp_format_bytes(b, sizeof b, d->requested_bytes));
    fprintf(f, "    requested at its peak %s (%s)\n", mp_format_bytes(a, sizeof a, d->requested_peak_bytes),
            entry_text(e, sizeof e, d->requested_peak_entry));
    fprintf(f, "    reserved at its peak  %s (%s)\n", mp_format_bytes(a, sizeof a, d->reserved_peak_bytes),
            entry_text(e, sizeof e, d->reserved_peak_entry));
    mp_snapshot_point pts[POINTS];
    size_t np = mp_snapshot_timeline(c->snap, i, pts, POINTS);
    if (np) fprintf(f, "    %-18s %-16s %-30s %s\n", "timeline", "time (us)", "requested", "reserved");
    for (size_t k = 0; k < np; k++)
        fprintf(f, "    %-18s %-16lld %-30s %s\n", entry_text(e, sizeof e, pts[k].entry), (long long)pts[k].time_us,
                mp_format_bytes(a, sizeof a, pts[k].requested), mp_format_bytes(b, sizeof b, pts[k].reserved));
    mp_snapshot_block blk[LARGEST];
    size_t live = mp_snapshot_largest(c->snap, i, blk, LARGEST);
    if (live) fprintf(f, "    the largest of the %zu blocks live at the requested peak:\n", live);
    for (size_t k = 0; k < live && k < LARGEST; k++)
        fprintf(f, "      %-34s %s\n", mp_format_bytes(a, sizeof a, blk[k].bytes), blk[k].where);
}

// The snapshot's peak beside the plan's: bytes and share of the plan's.
static void text_diff(FILE *f, const char *what, uint64_t snap, uint64_t plan) {
    char a[64], b[64], d[64];
    int64_t diff = (int64_t)snap - (int64_t)plan;
    fprintf(f, "    %-10s snapshot %s, plan %s: ", what, mp_format_bytes(a, sizeof a, snap),
            mp_format_bytes(b, sizeof b, plan));
    fprintf(f, "the snapshot %s by %s (%+.2f%% of the plan's)\n", diff >= 0 ? "is higher" : "is lower",
            mp_format_bytes(d, sizeof d, (uint64_t)(diff < 0 ? -diff : diff)),
            plan ? 100.0 * (double)diff / (double)plan : 0.0);
}

static void report_text(FILE *f, const void *arg) {
    const snapshot_cmd *c = arg;
    fprintf(f, "membill snapshot: %s\n", c->o->input);
    for (size_t i = 0; i < mp_snapshot_devices(c->snap); i++) text_device(f, c, i);
    if (!mp_snapshot_devices(c->snap)) fprintf(f, "  no segments and no trace: the snapshot holds nothing\n");
    if (!c->plan || !mp_snapshot_devices(c->snap)) return;
    const mp_snapshot_device *d = mp_snapshot_device_at(c->snap, 0);
    fprintf(f, "\n  against %s (device %d):\n", c->o->against, d->device);
    text_diff(f, "reserved", d->reserved_peak_bytes, plan_u64(c, "reserved_peak_bytes"));
    text_diff(f, "requested", d->requested_peak_bytes, plan_u64(c, "requested_peak_bytes"));
}

static json_t *device_json(const snapshot_cmd *c, size_t i) {
    const mp_snapshot_device *d = mp_snapshot_device_at(c->snap, i);
    json_t *o = json_object(), *tl = json_array(), *big = json_array();
    json_object_set_new(o, "device", json_integer(d->device));
    json_object_set_new(o, "segments", json_integer((json_int_t)d->segments));
    json_object_set_new(o, "reserved_bytes", json_integer((json_int_t)d->reserved_bytes));
    json_object_set_new(o, "allocated_bytes", json_integer((json_int_t)d->allocated_bytes));
    json_object_set_new(o, "requested_bytes", json_integer((json_int_t)d->requested_bytes));
    json_object_set_new(o, "reserved_peak_bytes", json_integer((json_int_t)d->reserved_peak_bytes));
    json_object_set_new(o, "requested_peak_bytes", json_integer((json_int_t)d->requested_peak_bytes));
    json_object_set_new(o, "trace_entries", json_integer((json_int_t)d->trace_entries));
    json_object_set_new(o, "allocations", json_integer((json_int_t)d->allocs));
    json_object_set_new(o, "frees", json_integer((json_int_t)d->frees));
    json_object_set_new(o, "segment_allocs", json_integer((json_int_t)d->segment_allocs));
    json_object_set_new(o, "segment_frees", json_integer((json_int_t)d->segment_frees));
    json_object_set_new(o, "ooms", json_integer((json_int_t)d->ooms));
    mp_snapshot_point pts[POINTS];
    size_t np = mp_snapshot_timeline(c->snap, i, pts, POINTS);
    for (size_t k = 0; k < np; k++) {
        json_t *p = json_object();
        json_object_set_new(p, "after_entry",
                            pts[k].entry == SIZE_MAX ? json_null() : json_integer((json_int_t)pts[k].entry));
        json_object_set_new(p, "time_us", json_integer(pts[k].time_us));
        json_object_set_new(p, "requested_bytes", json_integer((json_int_t)pts[k].requested));
        json_object_set_new(p, "reserved_bytes", json_integer((json_int_t)pts[k].reserved));
        json_array_append_new(tl, p);
    }
    json_object_set_new(o, "timeline", tl);
    mp_snapshot_block blk[LARGEST];
    size_t live = mp_snapshot_largest(c->snap, i, blk, LARGEST);
    for (size_t k = 0; k < live && k < LARGEST; k++) {
        json_t *b = json_object();
        json_object_set_new(b, "bytes", json_integer((json_int_t)blk[k].bytes));
        json_object_set_new(b, "where", json_string(blk[k].where));
        json_array_append_new(big, b);
    }
    json_object_set_new(o, "live_blocks_at_peak", json_integer((json_int_t)live));
    json_object_set_new(o, "largest_at_peak", big);
    return o;
}

static json_t *diff_json(uint64_t snap, uint64_t plan) {
    json_t *o = json_object();
    json_object_set_new(o, "snapshot_bytes", json_integer((json_int_t)snap));
    json_object_set_new(o, "plan_bytes", json_integer((json_int_t)plan));
    json_object_set_new(o, "difference_bytes", json_integer((json_int_t)snap - (json_int_t)plan));
    json_object_set_new(o, "difference_share", json_real(plan ? ((double)snap - (double)plan) / (double)plan : 0));
    return o;
}

static json_t *report_json(const snapshot_cmd *c) {
    json_t *root = json_object(), *devs = json_array();
    json_object_set_new(root, "membill_version", json_string(MEMBILL_VERSION));
    json_object_set_new(root, "snapshot", json_string(c->o->input));
    for (size_t i = 0; i < mp_snapshot_devices(c->snap); i++) json_array_append_new(devs, device_json(c, i));
    json_object_set_new(root, "devices", devs);
    if (c->plan && mp_snapshot_devices(c->snap)) {
        const mp_snapshot_device *d = mp_snapshot_device_at(c->snap, 0);
        json_t *a = json_object();
        json_object_set_new(a, "file", json_string(c->o->against));
        json_object_set_new(a, "reserved_peak", diff_json(d->reserved_peak_bytes, plan_u64(c, "reserved_peak_bytes")));
        json_object_set_new(a, "requested_peak",
                            diff_json(d->requested_peak_bytes, plan_u64(c, "requested_peak_bytes")));
        json_object_set_new(root, "against", a);
    }
    return root;
}

int cmd_snapshot(const cli_options *o) {
    snapshot_cmd c = {.o = o};
    ag_err err = {""};
    cli_outputs *outs = NULL;
    uint8_t *data = NULL;
    size_t n = 0;
    int rc = cli_outputs_declare(o, &outs, &err) != 0 ? EXIT_RUN_FAILED : 0;
    if (rc == 0 && (cli_outputs_input(outs, "snapshot", o->input, &err) != 0 ||
                    (o->against && cli_outputs_input(outs, "--against", o->against, &err) != 0)))
        rc = EXIT_RUN_FAILED;
    if (rc == 0 && read_file(o->input, &data, &n, &err) != 0) rc = EXIT_RUN_FAILED;
    char why[300];
    if (rc == 0 && !(c.snap = mp_snapshot_parse(data, n, why, sizeof why))) {
        ag_err_set(&err, "%s: %s", o->input, why);
        rc = EXIT_RUN_FAILED;
    }
    free(data);
    if (rc == 0 && o->against && read_plan(&c, &err) != 0) rc = EXIT_RUN_FAILED;
    if (rc == 0) {
        bool to_stdout = o->json && strcmp(o->json, "-") == 0;
        if (!o->quiet && !to_stdout) report_text(stdout, &c);
        json_t *root = report_json(&c);
        cli_report rep = {"membill snapshot", report_text, &c, NULL, NULL, NULL, 0, NULL};
        if (cli_outputs_finish(o, outs, root, &rep, &err) != 0) rc = EXIT_RUN_FAILED;
        json_decref(root);
    }
    cli_outputs_free(outs);
    mp_snapshot_free(c.snap);
    json_decref(c.plan);
    if (rc) fprintf(stderr, "membill snapshot: %s\n", err.msg);
    return rc;
}
