// --device cuda: the run's allocations replayed through PyTorch's CUDA caching allocator (the
// profiler's mp_cuda), with the card's memory, its CUDA context and NCCL's buffers beside it.
#include "cli.h"
#include "outputs.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

// NCCL's buffers per rank: NCCL_BUFFSIZE (4 MiB, NCCL's documented default) for each channel, in
// each direction, to each of a ring's two neighbours, over up to 32 channels (NCCL's most): 512 MiB.
uint64_t cli_nccl_bytes(long gpus) { return gpus > 1 ? 2ULL * 2ULL * 32ULL * (4ULL << 20) : 0; }

#define CONTEXT_UNNAMED (400 * 1000 * 1000ULL) // as gpus.c's lazy-loading context

int cli_device_prepare(const cli_options *o, long gpus, cli_device *d, ag_err *err) {
    memset(d, 0, sizeof *d);
    mp_cuda_conf_default(&d->conf);
    d->gpus = gpus > 0 ? gpus : 1;
    d->cuda = (o->device && strcmp(o->device, "cuda") == 0) || o->gpu;
    if (!d->cuda) return 0;
    if (o->gpu && !(d->gpu = cli_gpu_find(o->gpu))) {
        char names[512];
        ag_err_set(err, "--gpu: unknown GPU '%s' (membill plan --list-gpus names them: %s)", o->gpu,
                   cli_gpu_names(names, sizeof names));
        return EXIT_USAGE;
    }
    const char *env = getenv("PYTORCH_CUDA_ALLOC_CONF");
    const char *text = o->cuda_alloc_conf ? o->cuda_alloc_conf : env;
    d->conf_from = o->cuda_alloc_conf ? "--cuda-alloc-conf" : env ? "PYTORCH_CUDA_ALLOC_CONF" : NULL;
    char why[256];
    if (text && !mp_cuda_parse_conf(text, &d->conf, why, sizeof why)) {
        ag_err_set(err, "%s: %s", d->conf_from, why);
        return EXIT_USAGE;
    }
    snprintf(d->conf_text, sizeof d->conf_text, "%s", text ? text : "");
    d->total = d->gpu ? d->gpu->total_bytes : o->device_memory;
    d->context = d->gpu ? d->gpu->context_bytes : CONTEXT_UNNAMED;
    // the flat allowance was for what the allocator, the context and NCCL now bill themselves
    d->overhead = cli_given(o, "--overhead") ? o->overhead : 0;
    // CUBLAS_WORKSPACE_CONFIG's default (aten/src/ATen/cuda/CublasHandlePool.cpp): :4096:8 on
    // compute capability 9.0, :4096:2:16:8 before it
    d->cublas_workspace = d->gpu && d->gpu->sm90 ? 8ULL * 4096 * 1024 : 2ULL * 4096 * 1024 + 8ULL * 16 * 1024;
    d->conf.total_bytes = d->total;
    d->conf.memory_fraction = o->memory_fraction;
    cli_device_set_gpus(d, d->gpus);
    return 0;
}

void cli_device_set_gpus(cli_device *d, long gpus) {
    d->gpus = gpus > 0 ? gpus : 1;
    d->nccl = d->cuda ? cli_nccl_bytes(d->gpus) : 0;
    if (d->cuda && d->total) {
        uint64_t other = d->context + d->nccl + d->overhead;
        d->conf.capacity = d->total > other ? d->total - other : 1; // nothing fits
    }
}

// ---- marks ----

static const char *const train_phase_names[4] = {"zero_grad", "forward", "backward", "optimizer"};

size_t cli_device_marks_train(const train_run *r, cli_device_mark **out) {
    cli_device_mark *m = malloc((size_t)(r->nsteps * 4 + 1) * sizeof *m);
    size_t n = 0;
    if (!m) return 0;
    for (long s = 0; s < r->nsteps && r->steps[s].phases_done; s++) {
        const step_record *rec = &r->steps[s];
        long T = r->seq_lens ? r->seq_lens[s] : r->seq_len;
        size_t first = rec->zero_grad ? rec->zero_grad_events[0] : rec->events[0];
        if (!n && first) m[n++] = (cli_device_mark){first, 0, "load", 0};
        if (rec->zero_grad) m[n++] = (cli_device_mark){rec->zero_grad_events[1], s + 1, train_phase_names[0], T};
        for (int p = 0; p < rec->phases_done; p++)
            m[n++] = (cli_device_mark){rec->events[p + 1], s + 1, train_phase_names[p + 1], T};
    }
    *out = m;
    return n;
}

size_t cli_device_marks_phases(cli_device_mark **out) {
    size_t events = mp_timeline_count(), n = 0, cap = 16;
    cli_device_mark *m = malloc(cap * sizeof *m);
    if (!m) return 0;
    int last = -1;
    for (size_t i = 0; i <= events; i++) {
        const mp_event *e = i < events ? mp_timeline_get(i) : NULL;
        if (e && e->category == MP_OTHER) continue; // plain malloc's events carry no phase of tensors
        int ph = e ? e->phase : -1;
        if (last >= 0 && ph != last) {
            if (n == cap) {
                cli_device_mark *nm = realloc(m, (cap *= 2) * sizeof *m);
                if (!nm) break;
                m = nm;
            }
            m[n++] = (cli_device_mark){i, 0, mp_phase_name((mp_phase)last), 0};
        }
        if (e) last = ph;
    }
    *out = m;
    return n;
}

// ---- the replay ----

// The timeline through the allocator, with what PyTorch allocates there that membill's tensors
// are not: a cuBLAS workspace for each handle and stream at its first product, kept for the
// process (the forward's thread, then autograd's backward thread, which holds a handle of its
// own).
typedef struct {
    mp_cuda *c;
    const cli_device *d;
    bool forward, backward;
} replayer;

#define WORKSPACE_SERIAL (UINT32_MAX - 8) // past any tensor's serial a run reaches

static mp_status workspace(replayer *rp, bool backward, double seconds) {
    uint32_t site = mp_site_id(backward ? "cuBLAS workspace (autograd's thread)" : "cuBLAS workspace");
    return mp_cuda_malloc(rp->c, WORKSPACE_SERIAL + backward, rp->d->cublas_workspace, MP_OTHER, site, seconds);
}

static mp_status replay_to(replayer *rp, size_t end) {
    for (size_t i = mp_cuda_cursor(rp->c); i < end && !(rp->forward && rp->backward); i++) {
        const mp_event *e = mp_timeline_get(i);
        bool fwd = !rp->forward && (e->phase == MP_PHASE_FORWARD || e->phase == MP_PHASE_PREFILL);
        bool bwd = !rp->backward && e->phase == MP_PHASE_BACKWARD;
        if (!fwd && !bwd) continue;
        mp_status st = mp_cuda_replay_to(rp->c, i);
        if (st == MP_OK) st = workspace(rp, bwd, e->seconds);
        rp->forward |= fwd;
        rp->backward |= bwd;
        if (st != MP_OK) return st;
    }
    return mp_cuda_replay_to(rp->c, end);
}

static void note_phase(cli_device_phase *ph, const cli_device_mark *mk, const mp_cuda_stats *st) {
    *ph = (cli_device_phase){mk->step,          mk->phase,          mk->seq_len,
                             st->allocated,     st->reserved,       st->requested,
                             st->inactive_split, st->window_allocated_peak, st->window_reserved_peak};
}

// What took reserved to its peak, and the free space of split segments then: the timeline
// replayed again up to that allocation.
static void peak_moment(const cli_device *d, const cli_device_mark *marks, size_t n, cli_device_result *out) {
    size_t ev = out->st.reserved_peak_event;
    const mp_event *e = out->st.reserved_peak ? mp_timeline_get(ev) : NULL;
    if (!e) return;
    out->peak_site = e->site;
    out->peak_category = e->category;
    for (size_t k = 0; k < n; k++)
        if (ev < marks[k].end) {
            out->peak_step = marks[k].step;
            out->peak_phase = marks[k].phase;
            break;
        }
    mp_cuda *c = NULL;
    if (mp_cuda_new(&c, &d->conf) != MP_OK) return;
    bool training = false;
    for (size_t k = 0; k < n; k++) training |= strcmp(marks[k].phase, "backward") == 0;
    replayer rp = {c, d, false, !training};
    replay_to(&rp, ev + 1);
    out->ngaps_all = mp_cuda_gaps(c, out->gaps, CLI_DEVICE_GAPS);
    out->ngaps = out->ngaps_all < CLI_DEVICE_GAPS ? out->ngaps_all : CLI_DEVICE_GAPS;
    mp_cuda_delete(c);
}

int cli_device_replay(const cli_device *d, const cli_device_mark *marks, size_t n, long steady_from,
                      cli_device_result *out) {
    memset(out, 0, sizeof *out);
    mp_cuda *c = NULL;
    if (!d->cuda || mp_cuda_new(&c, &d->conf) != MP_OK) return 0;
    out->phases = calloc(n ? n : 1, sizeof *out->phases);
    int rc = 0;
    bool training = false;
    for (size_t k = 0; k < n; k++) training |= strcmp(marks[k].phase, "backward") == 0;
    replayer rp = {c, d, false, !training}; // a generation has no backward thread
    for (size_t k = 0; k < n && out->phases; k++) {
        mp_cuda_window(c);
        mp_status st = replay_to(&rp, marks[k].end);
        mp_cuda_stats now = mp_cuda_get_stats(c);
        cli_device_phase *ph = &out->phases[out->nphases++];
        note_phase(ph, &marks[k], &now);
        if (steady_from > 0 && ph->step >= steady_from && ph->reserved_peak > out->steady_reserved_peak) {
            out->steady_reserved_peak = ph->reserved_peak;
            out->steady = true;
        }
        if (ph->step == 1) out->first_step_reserved = ph->reserved;
        if (st == MP_ERR_BUDGET) {
            rc = 1;
            break;
        }
    }
    out->st = mp_cuda_get_stats(c);
    out->oom = *mp_cuda_get_oom(c);
    mp_cuda_delete(c);
    if (!out->steady) out->steady_reserved_peak = out->st.reserved_peak;
    out->done = true;
    peak_moment(d, marks, n, out);
    return rc;
}

int cli_device_after_run(const cli_device *d, cli_device_mark *marks, size_t n, long steady_from,
                         cli_device_result *out, ag_err *err) {
    int oom = cli_device_replay(d, marks, n, steady_from, out);
    free(marks);
    if (!oom && cli_device_fits(d, out)) return 0;
    if (oom) {
        cli_device_oom_message(d, out, err->msg, sizeof err->msg);
    } else {
        char a[64], b[64];
        ag_err_set(err, "does not fit the %s: it needs %s (reserved, context%s) of its %s",
                   d->gpu ? d->gpu->name : "device", mp_format_bytes(a, sizeof a, cli_device_need(d, out)),
                   d->nccl ? ", NCCL" : "", mp_format_bytes(b, sizeof b, d->total));
    }
    return -1;
}

void cli_device_result_free(cli_device_result *r) {
    free(r->phases);
    r->phases = NULL;
    r->nphases = 0;
}

uint64_t cli_device_need(const cli_device *d, const cli_device_result *r) {
    return r->st.reserved_peak + d->context + d->nccl + d->overhead;
}

bool cli_device_fits(const cli_device *d, const cli_device_result *r) {
    return !r->oom.happened && (!d->total || cli_device_need(d, r) <= d->total);
}

void cli_device_oom_message(const cli_device *d, const cli_device_result *r, char *buf, size_t len) {
    char a[64], b[64], c[64], t[64];
    const mp_cuda_oom *o = &r->oom;
    snprintf(buf, len,
             "out of memory on the %s: %s (%s) tried to allocate %s with %s allocated and %s reserved, of the %s the "
             "allocator can have there",
             d->gpu ? d->gpu->name : "device", mp_site_name(o->site), mp_category_name((mp_category)o->category),
             mp_format_bytes(a, sizeof a, o->requested), mp_format_bytes(b, sizeof b, o->allocated),
             mp_format_bytes(c, sizeof c, o->reserved), mp_format_bytes(t, sizeof t, d->conf.capacity));
}

// ---- reports ----

static json_t *phase_json(const cli_device_phase *p) {
    json_t *o = json_object();
    json_object_set_new(o, "step", p->step ? json_integer(p->step) : json_null());
    json_object_set_new(o, "name", json_string(p->phase));
    if (p->seq_len) json_object_set_new(o, "seq_len", json_integer(p->seq_len));
    json_object_set_new(o, "allocated_bytes", json_integer((json_int_t)p->allocated));
    json_object_set_new(o, "reserved_bytes", json_integer((json_int_t)p->reserved));
    json_object_set_new(o, "requested_bytes", json_integer((json_int_t)p->requested));
    json_object_set_new(o, "inactive_split_bytes", json_integer((json_int_t)p->inactive_split));
    json_object_set_new(o, "allocated_peak_bytes", json_integer((json_int_t)p->allocated_peak));
    json_object_set_new(o, "reserved_peak_bytes", json_integer((json_int_t)p->reserved_peak));
    return o;
}

static json_t *side_json(bool have, uint32_t site, uint8_t cat) {
    if (!have) return json_null();
    json_t *o = json_object();
    json_object_set_new(o, "site", json_string(mp_site_name(site)));
    json_object_set_new(o, "category", json_string(mp_category_name((mp_category)cat)));
    return o;
}

static json_t *conf_json(const cli_device *d) {
    const mp_cuda_conf *c = &d->conf;
    json_t *o = json_object();
    json_object_set_new(o, "text", json_string(d->conf_text));
    json_object_set_new(o, "from", d->conf_from ? json_string(d->conf_from) : json_null());
    json_object_set_new(o, "expandable_segments", json_boolean(c->expandable_segments));
    json_object_set_new(o, "max_split_size_bytes",
                        c->max_split_size == UINT64_MAX ? json_null() : json_integer((json_int_t)c->max_split_size));
    json_object_set_new(o, "garbage_collection_threshold", json_real(c->garbage_collection_threshold));
    json_object_set_new(o, "memory_fraction", json_real(c->memory_fraction));
    json_t *div = json_array();
    for (int i = 0; i < MP_CUDA_ROUNDUP_INTERVALS; i++) json_array_append_new(div, json_integer(c->roundup_power2_divisions[i]));
    json_object_set_new(o, "roundup_power2_divisions", div);
    return o;
}

json_t *cli_device_json(const cli_device *d, const cli_device_result *r) {
    json_t *o = json_object();
    const mp_cuda_stats *s = &r->st;
    json_object_set_new(o, "kind", json_string("cuda"));
    json_object_set_new(o, "name", d->gpu ? json_string(d->gpu->name) : json_null());
    json_object_set_new(o, "product", d->gpu ? json_string(d->gpu->product) : json_null());
    json_object_set_new(o, "total_bytes", d->total ? json_integer((json_int_t)d->total) : json_null());
    json_object_set_new(o, "total_source", json_string(d->gpu ? d->gpu->total_source : d->total ? "--device-memory" : "no card named"));
    json_object_set_new(o, "context_bytes", json_integer((json_int_t)d->context));
    json_object_set_new(o, "context_source",
                        json_string(d->gpu ? d->gpu->context_source : "estimate: PyTorch's lazy-loading context, "
                                                                      "about 400 MB (pytorch/pytorch#109888)"));
    json_object_set_new(o, "nccl_bytes", json_integer((json_int_t)d->nccl));
    json_object_set_new(o, "cublas_workspace_bytes", json_integer((json_int_t)d->cublas_workspace));
    json_object_set_new(o, "overhead_bytes", json_integer((json_int_t)d->overhead));
    json_object_set_new(o, "allocator_capacity_bytes", d->conf.capacity ? json_integer((json_int_t)d->conf.capacity) : json_null());
    json_object_set_new(o, "allocator_conf", conf_json(d));
    json_object_set_new(o, "allocated_peak_bytes", json_integer((json_int_t)s->allocated_peak));
    json_object_set_new(o, "reserved_peak_bytes", json_integer((json_int_t)s->reserved_peak));
    json_object_set_new(o, "requested_peak_bytes", json_integer((json_int_t)s->requested_peak));
    json_object_set_new(o, "inactive_split_bytes_at_peak", json_integer((json_int_t)s->inactive_split_at_reserved_peak));
    json_object_set_new(o, "inactive_split_peak_bytes", json_integer((json_int_t)s->inactive_split_peak));
    json_object_set_new(o, "steady_state_reserved_peak_bytes", json_integer((json_int_t)r->steady_reserved_peak));
    json_object_set_new(o, "segments", json_integer((json_int_t)s->segments));
    json_object_set_new(o, "segment_allocs", json_integer((json_int_t)s->segment_allocs));
    json_object_set_new(o, "segment_frees", json_integer((json_int_t)s->segment_frees));
    json_object_set_new(o, "alloc_retries", json_integer((json_int_t)s->alloc_retries));
    json_object_set_new(o, "need_bytes", json_integer((json_int_t)cli_device_need(d, r)));
    json_object_set_new(o, "fits", d->total ? json_boolean(cli_device_fits(d, r)) : json_null());
    if (r->oom.happened) {
        json_t *e = json_object();
        json_object_set_new(e, "site", json_string(mp_site_name(r->oom.site)));
        json_object_set_new(e, "category", json_string(mp_category_name((mp_category)r->oom.category)));
        json_object_set_new(e, "bytes", json_integer((json_int_t)r->oom.requested));
        json_object_set_new(e, "allocated_bytes", json_integer((json_int_t)r->oom.allocated));
        json_object_set_new(e, "reserved_bytes", json_integer((json_int_t)r->oom.reserved));
        json_object_set_new(o, "oom", e);
    } else {
        json_object_set_new(o, "oom", json_null());
    }
    json_t *peak = json_object();
    json_object_set_new(peak, "site", json_string(mp_site_name(r->peak_site)));
    json_object_set_new(peak, "category", json_string(mp_category_name((mp_category)r->peak_category)));
    json_object_set_new(peak, "step", r->peak_step ? json_integer(r->peak_step) : json_null());
    json_object_set_new(peak, "phase", r->peak_phase ? json_string(r->peak_phase) : json_null());
    json_object_set_new(o, "reserved_peak_at", peak);
    json_t *gaps = json_array();
    for (size_t i = 0; i < r->ngaps; i++) {
        const mp_cuda_gap *g = &r->gaps[i];
        json_t *x = json_object();
        json_object_set_new(x, "bytes", json_integer((json_int_t)g->bytes));
        json_object_set_new(x, "before", side_json(g->before, g->before_site, g->before_category));
        json_object_set_new(x, "after", side_json(g->after, g->after_site, g->after_category));
        json_array_append_new(gaps, x);
    }
    json_object_set_new(o, "fragments_at_peak", gaps);
    json_t *ph = json_array();
    for (size_t i = 0; i < r->nphases; i++) json_array_append_new(ph, phase_json(&r->phases[i]));
    json_object_set_new(o, "phases", ph);
    return o;
}

static const char *fmt(char *buf, size_t n, uint64_t v) { return mp_format_bytes(buf, n, v); }

static void text_phases(FILE *f, const cli_device_result *r) {
    char a[64], b[64];
    if (!r->nphases) return;
    fprintf(f, "    %-6s %-10s %-8s %-36s %s\n", "step", "phase", "tokens", "allocated at its end", "reserved at its end");
    for (size_t i = 0; i < r->nphases; i++) {
        const cli_device_phase *p = &r->phases[i];
        char step[16] = "-", len[16] = "-";
        if (p->step) snprintf(step, sizeof step, "%ld", p->step);
        if (p->seq_len) snprintf(len, sizeof len, "%ld", p->seq_len);
        fprintf(f, "    %-6s %-10s %-8s %-36s %s\n", step, p->phase, len, fmt(a, sizeof a, p->allocated),
                fmt(b, sizeof b, p->reserved));
    }
}

static void text_gaps(FILE *f, const cli_device_result *r) {
    if (!r->ngaps) return;
    char a[64];
    fprintf(f, "  free space in split segments when reserved peaked (%zu block%s), the largest around:\n", r->ngaps_all,
            r->ngaps_all == 1 ? "" : "s");
    for (size_t i = 0; i < r->ngaps; i++) {
        const mp_cuda_gap *g = &r->gaps[i];
        fprintf(f, "    %s after %s%s%s, before %s%s%s\n", fmt(a, sizeof a, g->bytes),
                g->before ? mp_site_name(g->before_site) : "(the segment's start or a free block)",
                g->before ? " " : "", g->before ? mp_category_name((mp_category)g->before_category) : "",
                g->after ? mp_site_name(g->after_site) : "(the segment's end or a free block)", g->after ? " " : "",
                g->after ? mp_category_name((mp_category)g->after_category) : "");
    }
}

void cli_device_text(FILE *f, const cli_device *d, const cli_device_result *r) {
    char a[64], b[64], c[64], e[64];
    const mp_cuda_stats *s = &r->st;
    fprintf(f, "\n  device: cuda%s%s%s; PyTorch's CUDA caching allocator replayed over these allocations (%s%s%s)\n",
            d->gpu ? ", " : "", d->gpu ? d->gpu->name : "", d->gpu ? "" : " (no card named)",
            d->conf_from ? d->conf_from : "PyTorch's default settings", d->conf_from ? " " : "", d->conf_text);
    fprintf(f, "    %-46s %s\n", "allocated at its peak (max_memory_allocated)", fmt(a, sizeof a, s->allocated_peak));
    fprintf(f, "    %-46s %s\n", "reserved at its peak (max_memory_reserved)", fmt(a, sizeof a, s->reserved_peak));
    fprintf(f, "    %-46s %s\n", "requested at its peak (what the tensors asked)", fmt(a, sizeof a, s->requested_peak));
    fprintf(f, "    %-46s %s (their own peak %s)\n", "inactive split bytes when reserved peaked",
            fmt(a, sizeof a, s->inactive_split_at_reserved_peak), fmt(b, sizeof b, s->inactive_split_peak));
    if (r->peak_phase)
        fprintf(f, "    reserved peaked in %s%s%s when %s (%s) took a new segment\n", r->peak_step ? "step " : "",
                r->peak_step ? (snprintf(e, sizeof e, "%ld ", r->peak_step), e) : "", r->peak_phase,
                mp_site_name(r->peak_site), mp_category_name((mp_category)r->peak_category));
    if (r->steady)
        fprintf(f, "    steady state: reserved at most %s in the steps after the first (the first step ended at %s)\n",
                fmt(a, sizeof a, r->steady_reserved_peak), fmt(b, sizeof b, r->first_step_reserved));
    fprintf(f, "    segments: %llu cudaMalloc%s, %llu handed back (retries after a failed cudaMalloc: %llu)\n",
            (unsigned long long)s->segment_allocs, d->conf.expandable_segments ? " or page mappings" : "",
            (unsigned long long)s->segment_frees, (unsigned long long)s->alloc_retries);
    text_phases(f, r);
    text_gaps(f, r);
    if (r->oom.happened) {
        char line[512];
        cli_device_oom_message(d, r, line, sizeof line);
        fprintf(f, "  %s\n", line);
    }
    if (!d->total) return;
    fprintf(f, "  on the card: reserved %s + CUDA context %s", fmt(a, sizeof a, s->reserved_peak), fmt(b, sizeof b, d->context));
    if (d->nccl) fprintf(f, " + NCCL %s", fmt(c, sizeof c, d->nccl));
    if (d->overhead) fprintf(f, " + overhead %s", fmt(c, sizeof c, d->overhead));
    fprintf(f, " = %s of %s: %s\n", fmt(c, sizeof c, cli_device_need(d, r)), fmt(e, sizeof e, d->total),
            cli_device_fits(d, r) ? "fits" : "does NOT fit");
}

int cli_snapshot_writer(FILE *f, void *arg, ag_err *err) {
    const cli_device *d = arg;
    if (d->snapshot) return fwrite(d->snapshot, 1, d->snapshot_len, f) == d->snapshot_len ? 0 : -1;
    mp_cuda *c = NULL;
    mp_cuda_conf conf = d->conf;
    conf.record_history = true;
    if (mp_cuda_new(&c, &conf) != MP_OK) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    // up to the teardown: the model and its state still held, as a snapshot taken after the last step
    size_t end = mp_timeline_count();
    for (size_t i = 0; i < end; i++) {
        const mp_event *e = mp_timeline_get(i);
        if (e->phase == MP_PHASE_TEARDOWN) {
            end = i;
            break;
        }
    }
    replayer rp = {c, d, false, false};
    replay_to(&rp, end); // an allocation that did not fit ends the trace (its oom entry)
    int rc = mp_cuda_write_snapshot(c, f, d->conf_text);
    mp_cuda_delete(c);
    if (rc != 0 && !ferror(f)) ag_err_set(err, "out of memory");
    return rc;
}

void cli_device_annotate_steps(json_t *steps, const cli_device_result *r) {
    size_t i;
    json_t *step;
    json_array_foreach(steps, i, step) {
        json_int_t n = json_integer_value(json_object_get(step, "step"));
        size_t k;
        json_t *ph;
        json_array_foreach(json_object_get(step, "phases"), k, ph) {
            const char *name = json_string_value(json_object_get(ph, "name"));
            for (size_t j = 0; name && j < r->nphases; j++) {
                const cli_device_phase *p = &r->phases[j];
                if (p->step != n || strcmp(p->phase, name) != 0) continue;
                json_object_set_new(ph, "allocated_bytes", json_integer((json_int_t)p->allocated));
                json_object_set_new(ph, "reserved_bytes", json_integer((json_int_t)p->reserved));
                break;
            }
        }
    }
}
