// membill train: forward, loss, backward and optimizer step(s), billed byte by byte.
#include "cli.h"
#include "outputs.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const phase_names[3] = {"forward", "backward", "optimizer"};

// A category's live bytes as one device holds them: its share of `divide` devices, rounded up.
static uint64_t share_of(int64_t live, uint64_t divide) {
    uint64_t b = live > 0 ? (uint64_t)live : 0;
    return divide > 1 ? (b + divide - 1) / divide : b;
}

static uint64_t total_of(const int64_t *live, const uint64_t *divide) {
    uint64_t t = 0;
    for (int c = 0; c < MP_NCATEGORIES; c++) t += share_of(live[c], divide ? divide[c] : 1);
    return t;
}

// The step's peak so far: its total, the events up to it, its phase and composition.
static void note_moment(step_figures *f, uint64_t total, const int64_t *live, const uint64_t *divide, size_t events,
                        mp_phase ph) {
    f->peak = total;
    f->peak_events = events;
    f->peak_phase = ph;
    for (int c = 0; c < MP_NCATEGORIES; c++) f->at_peak[c] = share_of(live[c], divide ? divide[c] : 1);
}

// One replay over the timeline: the live bytes of each category and the phase of the last event.
typedef struct {
    int64_t live[MP_NCATEGORIES];
    const uint64_t *divide;
    size_t i, n;
    mp_phase last;
} replay;

static void apply(replay *rp) {
    const mp_event *e = mp_timeline_get(rp->i++);
    rp->live[e->category] += e->bytes;
    rp->last = (mp_phase)e->phase;
}

// Events up to `end` without watching; then up to `stop`, returning the highest total (at least
// what was live as the span began) and, with f, raising the step's peak moment on the way.
static uint64_t replay_span(replay *rp, size_t end, size_t stop, step_figures *f, bool *seen) {
    while (rp->i < end && rp->i < rp->n) apply(rp);
    uint64_t pk = total_of(rp->live, rp->divide);
    if (f && (!*seen || pk > f->peak)) {
        note_moment(f, pk, rp->live, rp->divide, rp->i, rp->last);
        *seen = true;
    }
    while (rp->i < stop && rp->i < rp->n) {
        apply(rp);
        uint64_t t = total_of(rp->live, rp->divide);
        if (t > pk) pk = t;
        if (f && t > f->peak) note_moment(f, t, rp->live, rp->divide, rp->i, rp->last);
    }
    return pk;
}

static void shares(const replay *rp, int64_t *out) {
    for (int c = 0; c < MP_NCATEGORIES; c++) out[c] = (int64_t)share_of(rp->live[c], rp->divide ? rp->divide[c] : 1);
}

void cli_replay_steps(const train_run *r, const uint64_t *divide, step_figures *out) {
    replay rp = {.divide = divide, .n = mp_timeline_count(), .last = MP_PHASE_SETUP};
    for (long s = 0; s < r->nsteps; s++) {
        const step_record *rec = &r->steps[s];
        step_figures *f = &out[s];
        memset(f, 0, sizeof *f);
        bool seen = false;
        if (rec->zero_grad) { // PYTORCH frameworks: zero_grad opens the step, a phase of its own
            f->zero_grad = true;
            f->zero_grad_peak = replay_span(&rp, rec->zero_grad_events[0], rec->zero_grad_events[1], NULL, &seen);
            shares(&rp, f->zero_grad_end);
        }
        for (int p = 0; p < rec->phases_done; p++) {
            f->phase_peak[p] = replay_span(&rp, rec->events[p], rec->events[p + 1], f, &seen);
            shares(&rp, f->end_live[p]);
        }
    }
}

// The step (1-based) whose events hold the total peak; 0 when it fell outside every step.
static long peak_step(const train_run *r) {
    size_t at = mp_peak().events;
    for (long s = 0; s < r->nsteps; s++)
        if (r->steps[s].phases_done && at > r->steps[s].events[0] && at <= r->steps[s].events[r->steps[s].phases_done])
            return s + 1;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median of one field over the steady-state steps (the second onward), or step 1 alone.
static double steady(const train_run *r, size_t field_offset) {
    long first = r->nsteps >= 2 ? 1 : 0, n = r->nsteps - first;
    double v[n];
    for (long i = 0; i < n; i++) v[i] = *(const double *)((const char *)&r->steps[first + i] + field_offset);
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static long steps_completed(const train_run *r) {
    long n = 0;
    while (n < r->nsteps && r->steps[n].phases_done == 3) n++;
    return n;
}

static json_t *step_timing_json(const step_record *s) {
    json_t *o = json_object();
    json_object_set_new(o, "forward_s", json_real(s->forward_s));
    json_object_set_new(o, "backward_s", json_real(s->backward_s));
    json_object_set_new(o, "optimizer_s", json_real(s->optimizer_s));
    json_object_set_new(o, "step_s", json_real(s->step_s));
    return o;
}

static json_t *timing_json(const train_run *r) {
    json_t *t = json_object();
    json_object_set_new(t, "forward_s", json_real(steady(r, offsetof(step_record, forward_s))));
    json_object_set_new(t, "backward_s", json_real(steady(r, offsetof(step_record, backward_s))));
    json_object_set_new(t, "optimizer_s", json_real(steady(r, offsetof(step_record, optimizer_s))));
    json_object_set_new(t, "step_s", json_real(steady(r, offsetof(step_record, step_s))));
    json_t *arr = json_array();
    for (long s = 0; s < r->nsteps; s++) json_array_append_new(arr, step_timing_json(&r->steps[s]));
    json_object_set_new(t, "steps", arr);
    return t;
}

static json_t *phase_json(const char *name, uint64_t peak, double seconds, const int64_t *end_live) {
    json_t *ph = json_object(), *end = json_object();
    json_object_set_new(ph, "name", json_string(name));
    json_object_set_new(ph, "peak_bytes", json_integer((json_int_t)peak));
    json_object_set_new(ph, "seconds", json_real(seconds));
    for (int c = 0; c < MP_NCATEGORIES; c++)
        json_object_set_new(end, mp_category_name(c), json_integer((json_int_t)end_live[c]));
    json_object_set_new(ph, "end_live", end);
    return ph;
}

// The top-level "steps": one entry per step that began, with only the phases that finished.
static json_t *steps_json(const train_run *r, const step_figures *fig) {
    json_t *arr = json_array();
    for (long s = 0; s < r->nsteps && r->steps[s].phases_done; s++) {
        const step_record *rec = &r->steps[s];
        json_t *o = json_object(), *phases = json_array();
        json_object_set_new(o, "step", json_integer(s + 1));
        json_object_set_new(o, "loss", r->meta ? json_null() : json_real(rec->loss));
        json_object_set_new(o, "peak_bytes", json_integer((json_int_t)fig[s].peak));
        const double secs[3] = {rec->forward_s, rec->backward_s, rec->optimizer_s};
        if (fig[s].zero_grad)
            json_array_append_new(
                phases, phase_json("zero_grad", fig[s].zero_grad_peak, rec->zero_grad_s, fig[s].zero_grad_end));
        for (int p = 0; p < rec->phases_done; p++)
            json_array_append_new(phases,
                                  phase_json(phase_names[p], fig[s].phase_peak[p], secs[p], fig[s].end_live[p]));
        json_object_set_new(o, "phases", phases);
        json_t *roles = json_object();
        uint64_t saved = 0;
        for (int k = 0; k < CLI_NROLES; k++) {
            saved += rec->saved_by_role[k];
            if (rec->saved_by_role[k])
                json_object_set_new(roles, cli_role_name(k), json_integer((json_int_t)rec->saved_by_role[k]));
        }
        json_object_set_new(o, "saved_after_forward_bytes", json_integer((json_int_t)saved));
        json_object_set_new(o, "saved_by_role", roles);
        json_array_append_new(arr, o);
    }
    return arr;
}

// Weights, gradients and optimizer state against four times the weights (claim T4).
static json_t *four_copies_json(void) {
    uint64_t w = mp_get_counter(MP_WEIGHT).peak, g = mp_get_counter(MP_GRADIENT).peak,
             a = mp_get_counter(MP_OPTIMIZER).peak;
    json_t *o = json_object();
    json_object_set_new(o, "weights_bytes", json_integer((json_int_t)w));
    json_object_set_new(o, "gradients_bytes", json_integer((json_int_t)g));
    json_object_set_new(o, "optimizer_bytes", json_integer((json_int_t)a));
    json_object_set_new(o, "total_bytes", json_integer((json_int_t)(w + g + a)));
    json_object_set_new(o, "four_times_weights_bytes", json_integer((json_int_t)(4 * w)));
    json_object_set_new(o, "ratio_to_weights", json_real(w ? (double)(w + g + a) / (double)w : 0));
    // What lifts the total peak past them (temporaries, activations, plain malloc): 0 if nothing.
    uint64_t peak = mp_peak().total;
    json_object_set_new(o, "total_peak_above_bytes",
                        json_integer((json_int_t)(peak > w + g + a ? peak - (w + g + a) : 0)));
    return o;
}

typedef struct {
    const cli_options *o;
    train_run r;
    cli_job job;
    cli_device dev;
    cli_device_result devr;
} train_cmd;

static bool adam(const train_run *r) { return r->ocfg.kind == OPTIM_ADAM || r->ocfg.kind == OPTIM_ADAMW; }

json_t *cli_train_json(const cli_options *o, const train_run *r, bool failed) {
    json_t *root = cli_report_root(&r->cfg), *run = json_object();
    json_object_set_new(run, "kind", json_string("train"));
    json_object_set_new(run, "batch", json_integer(r->batch));
    json_object_set_new(run, "seq_len", json_integer(r->seq_len));
    json_object_set_new(run, "steps", json_integer(r->nsteps));
    json_object_set_new(run, "optimizer", json_string(optim_kind_name(r->ocfg.kind)));
    json_object_set_new(run, "framework", json_string(cli_framework_name(r->framework)));
    cli_mtp_json(run, &r->cfg);
    if (r->cfg.moe.experts > 0)
        json_object_set_new(run, "routing", json_string(cli_routing_name(&r->routing, r->meta)));
    json_object_set_new(run, "attention", json_string(cli_attention_name(r->attention)));
    json_object_set_new(run, "adam_impl", adam(r) ? json_string(optim_adam_impl_name(r->ocfg.adam_impl)) : json_null());
    json_object_set_new(run, "lr", json_real(o->lr));
    json_object_set_new(run, "dtype", json_string(r->dtype.long_name));
    json_object_set_new(run, "meta", json_boolean(r->meta));
    json_object_set_new(run, "checkpointing", json_boolean(r->checkpointing));
    json_object_set_new(run, "grad_accum", json_integer(cli_micro_batches(r)));
    json_object_set_new(run, "threads", json_integer(o->threads));
    json_object_set_new(run, "seed", json_integer((json_int_t)r->seed));
    json_object_set_new(run, "weights", json_string(r->st_path[0] ? r->st_path : "random"));
    json_object_set_new(root, "run", run);
    if (r->text.ids) json_object_set_new(root, "prompt_ids", cli_prompt_ids_json(&r->text, r->batch));
    bool have_loss = !r->meta && r->steps[0].phases_done >= 1;
    json_object_set_new(root, "loss", have_loss ? json_real(r->steps[0].loss) : json_null());
    json_t *losses = json_array();
    for (long s = 0; s < r->nsteps && !r->meta && r->steps[s].phases_done >= 1; s++)
        json_array_append_new(losses, json_real(r->steps[s].loss));
    json_object_set_new(root, "losses", losses);
    mp_report_json(root);
    step_figures *fig = calloc((size_t)r->nsteps, sizeof *fig);
    if (fig) {
        cli_replay_steps(r, NULL, fig);
        json_object_set_new(root, "steps", steps_json(r, fig));
        free(fig);
    }
    long ps = peak_step(r);
    json_t *peak = json_object_get(root, "peak");
    if (peak) json_object_set_new(peak, "step", ps ? json_integer(ps) : json_null());
    if (steps_completed(r) > 0) json_object_set_new(root, "four_copies", four_copies_json());
    if (r->lora.cfg.rank) json_object_set_new(root, "lora", cli_lora_json(&r->cfg, &r->lora));
    json_object_set_new(root, "breakdown", cli_breakdown_json((long)r->cfg.layers));
    if (!failed) json_object_set_new(root, "timing", timing_json(r));
    json_object_set_new(root, "teardown_all_zero", json_boolean(r->torn_down_clean));
    return root;
}

static json_t *report_json(const void *arg, bool failed) {
    const train_cmd *t = arg;
    json_t *root = cli_train_json(t->o, &t->r, failed);
    if (t->devr.done) {
        cli_device_annotate_steps(json_object_get(root, "steps"), &t->devr);
        json_object_set_new(root, "device", cli_device_json(&t->dev, &t->devr));
    }
    return root;
}

// The report's question answered in one line, before the detail: do the model states make four
// copies of the weights, and what the total peak holds beyond them.
static void text_answer(FILE *f) {
    char b[64], c[64], d[64];
    uint64_t w = mp_get_counter(MP_WEIGHT).peak, g = mp_get_counter(MP_GRADIENT).peak,
             a = mp_get_counter(MP_OPTIMIZER).peak;
    mp_moment pk = mp_peak();
    fprintf(f, "answer: weights + gradients + optimizer state = %s, %.3f x the weights; total peak %s",
            cli_short_bytes(b, sizeof b, w + g + a), w ? (double)(w + g + a) / (double)w : 0.0,
            cli_short_bytes(c, sizeof c, pk.total));
    if (pk.total > w + g + a) fprintf(f, " (%s more)", cli_short_bytes(d, sizeof d, pk.total - (w + g + a)));
    fprintf(f, ", in the %s phase\n", mp_phase_name(pk.phase));
}

static void text_four_copies(FILE *f) {
    char b[80], c[80];
    uint64_t w = mp_get_counter(MP_WEIGHT).peak, g = mp_get_counter(MP_GRADIENT).peak,
             a = mp_get_counter(MP_OPTIMIZER).peak;
    // The optimizer phase is where all three are live at once (its peak is after the state).
    mp_moment op = mp_get_phase_stats(MP_PHASE_OPTIMIZER).at_peak;
    bool together = op.bytes[MP_WEIGHT] + op.bytes[MP_GRADIENT] + op.bytes[MP_OPTIMIZER] == w + g + a;
    fprintf(f, "\n  four copies: weights + gradients + optimizer state = %s\n",
            mp_format_bytes(b, sizeof b, w + g + a));
    fprintf(f, "    = %.3f x the weights (%s); all live at once during the optimizer step: %s\n",
            w ? (double)(w + g + a) / (double)w : 0.0, mp_format_bytes(c, sizeof c, w), together ? "yes" : "no");
    fprintf(f, "    activations on top, at their peak: %s\n",
            mp_format_bytes(b, sizeof b, mp_get_counter(MP_ACTIVATION).peak));
    mp_moment pk = mp_peak();
    cli_above_four_copies_text(f, "    ", pk.total, pk.bytes, w + g + a, pk.events);
}

// One line per step: loss, total peak, each phase's time; and which step holds the peak.
static void text_steps(FILE *f, const train_run *r) {
    step_figures *fig = calloc((size_t)r->nsteps, sizeof *fig);
    if (!fig) return;
    cli_replay_steps(r, NULL, fig);
    char b[80];
    fprintf(f, "\n  %-5s %-9s %-36s %-9s %-9s %-9s %s\n", "step", "loss", "total peak", "forward", "backward",
            "optimizer", "step");
    for (long s = 0; s < r->nsteps && r->steps[s].phases_done; s++) {
        const step_record *rec = &r->steps[s];
        char loss[32] = "-", t[3][24] = {"-", "-", "-"}, st[24] = "-";
        if (!r->meta) snprintf(loss, sizeof loss, "%.4f", rec->loss);
        const double secs[3] = {rec->forward_s, rec->backward_s, rec->optimizer_s};
        for (int p = 0; p < rec->phases_done && !r->meta; p++) snprintf(t[p], sizeof t[p], "%.3f s", secs[p]);
        if (rec->phases_done == 3 && !r->meta) snprintf(st, sizeof st, "%.3f s", rec->step_s);
        fprintf(f, "  %-5ld %-9s %-36s %-9s %-9s %-9s %s\n", s + 1, loss, mp_format_bytes(b, sizeof b, fig[s].peak),
                t[0], t[1], t[2], st);
    }
    long ps = peak_step(r);
    if (ps) fprintf(f, "  the total peak is in step %ld\n", ps);
    free(fig);
}

// The text report. A failed run says only what it measured before the failure.
void cli_train_text(FILE *f, const cli_options *o, const train_run *r, bool failed) {
    char p[32], impl[32] = "";
    if (adam(r)) snprintf(impl, sizeof impl, " (%s)", optim_adam_impl_name(r->ocfg.adam_impl));
    fprintf(f, "membill train: %s, %s parameters, batch %ld x %ld tokens, %s%s lr %g, %s%s%s\n", r->cfg.name,
            cli_commas(p, sizeof p, llama_param_count(&r->cfg)), r->batch, r->seq_len, optim_kind_name(r->ocfg.kind),
            impl, o->lr, r->dtype.long_name, r->meta ? ", meta (shapes only)" : "",
            failed ? " (FAILED: see below)" : "");
    char fw[192];
    fprintf(f, "framework: %s; attention: %s\n", cli_framework_text(r->framework, r->cfg.family, fw, sizeof fw),
            cli_attention_text(r->attention));
    cli_routing_text(f, &r->cfg, &r->routing, r->meta);
    if (r->checkpointing) fprintf(f, "checkpointing: each block's input kept, activations recomputed in backward\n");
    if (r->grad_accum > 1)
        fprintf(f, "gradient accumulation: %ld micro-batches of %ld rows, one optimizer step (each loss / %ld)\n",
                r->grad_accum, r->batch, r->grad_accum);
    char lt[256];
    if (r->lora.cfg.rank) {
        fprintf(f, "%s%s%s\n", cli_lora_text(&r->cfg, &r->lora, lt, sizeof lt), r->lora.adapter[0] ? "; loaded from " : "",
                r->lora.adapter);
        cli_lora_params_text(f, &r->cfg, &r->lora);
    }
    cli_text_line(f, &r->text);
    if (!r->meta && r->steps[0].phases_done >= 1)
        fprintf(f, "loss %.4f (a random init is near ln(vocab) = %.4f)\n", r->steps[0].loss, log((double)r->cfg.vocab));
    if (!failed && steps_completed(r) > 0) text_answer(f);
    fprintf(f, "\n");
    mp_report_text(f);
    cli_breakdown_text(f, (long)r->cfg.layers);
    long done = steps_completed(r);
    if (done > 0) text_four_copies(f);
    if (done > 0 && r->lora.cfg.rank) cli_lora_bill_text(f, &r->cfg, &r->lora);
    if (r->nsteps >= 2 || failed) {
        text_steps(f, r);
    } else if (!r->meta && done) {
        const step_record *s = &r->steps[0];
        fprintf(f, "\n  step 1: forward %.3f s, backward %.3f s, optimizer %.3f s, step %.3f s\n", s->forward_s,
                s->backward_s, s->optimizer_s, s->step_s);
    }
    if (r->nsteps >= 2 && !r->meta && done == r->nsteps)
        fprintf(
            f,
            "  steady state (median of steps 2..%ld): forward %.3f s, backward %.3f s, optimizer %.3f s, step %.3f s\n",
            r->nsteps, steady(r, offsetof(step_record, forward_s)), steady(r, offsetof(step_record, backward_s)),
            steady(r, offsetof(step_record, optimizer_s)), steady(r, offsetof(step_record, step_s)));
    fprintf(f, "  teardown: weight, gradient, optimizer, activation, cache and temporary back at zero: %s\n",
            r->torn_down_clean ? "yes" : "NO");
    if (failed || !o->explain) return;
    if (cli_dtype_is_f32(&r->dtype))
        cli_explain_train(f, &r->cfg, r->batch, r->seq_len, &r->ocfg, r->framework, r->attention);
    else // the worked formulas are float32's; plan has each dtype's closed form
        fprintf(
            f, "\n  --explain works out the float32 formulas: membill plan --dtype %s gives this dtype's closed form\n",
            r->dtype.name);
}

static void report_text(FILE *f, const void *arg, bool failed) {
    const train_cmd *t = arg;
    cli_train_text(f, t->o, &t->r, failed);
    if (t->devr.done) cli_device_text(f, &t->dev, &t->devr);
}

// --dump-grads and --save-weights go to their temporaries now, committed with the rest.
static int save(void *arg, const llama_model *m, bool grads, ag_err *err) {
    const train_cmd *t = arg;
    cli_model_file file = {m, grads};
    return cli_outputs_write(t->job.outs, grads ? "--dump-grads" : "--save-weights", cli_model_writer, &file, err);
}

static int adapter_weights(FILE *f, void *m, ag_err *err) { return llama_adapter_write_weights(m, f, err); }
static int adapter_config(FILE *f, void *m, ag_err *err) { return llama_adapter_write_config(m, f, err); }

// --save-adapter: both files of the folder, committed with the other outputs.
static int save_adapter(void *arg, const llama_model *m, ag_err *err) {
    const train_cmd *t = arg;
    if (cli_outputs_write(t->job.outs, "--save-adapter", adapter_weights, (void *)m, err) != 0) return -1;
    return cli_outputs_write(t->job.outs, "--save-adapter " LLAMA_ADAPTER_CONFIG, adapter_config, (void *)m, err);
}

// The run, then (--device cuda) its allocations through the CUDA caching allocator: a card it
// does not fit fails the run, as it would have failed there.
static int run(void *arg, ag_err *err) {
    train_cmd *t = arg;
    int rc = cli_train_run(&t->r, err);
    if (rc == 0 && t->r.routing.record && t->o->routing_out)
        rc = cli_outputs_write(t->job.outs, "--routing-out", cli_routing_writer, t->r.routing.record, err);
    if (rc != 0 || !t->dev.cuda) return rc;
    cli_device_mark *marks = NULL;
    size_t n = cli_device_marks_train(&t->r, &marks);
    return cli_device_after_run(&t->dev, marks, n, 2, &t->devr, err);
}

// The same run on shapes alone, for the fit check (two steps: the second holds the state).
static uint64_t meta_peak(void *arg, ag_err *err) {
    const train_cmd *t = arg;
    train_run m = t->r;
    step_record recs[2];
    m.meta = true;
    m.save = NULL;
    m.save_adapter = NULL;
    m.lora.adapter[0] = 0; // shapes alone: nothing is read
    m.nsteps = m.nsteps < 2 ? m.nsteps : 2;
    m.steps = recs;
    memset(recs, 0, sizeof recs);
    mp_options mo = {.meta = true};
    if (mp_init(&mo) != MP_OK) return 0;
    uint64_t peak = cli_train_run(&m, err) == 0 ? mp_peak().total : 0;
    mp_shutdown();
    return peak;
}

int cmd_train(const cli_options *o) {
    if (cli_sharded(o)) return cli_train_zero(o); // data parallel: zero.c
    train_cmd t = {.o = o};
    ag_err err = {""};
    int rc = cli_train_prepare(o, &t.r, &err);
    if (rc == 0) rc = cli_device_prepare(o, 1, &t.dev, &err);
    if (rc != 0) {
        fprintf(stderr, "membill train: %s\n", err.msg);
        cli_train_free(&t.r);
        return rc;
    }
    char title[256];
    snprintf(title, sizeof title, "membill train: %s, batch %ld x %ld tokens, %s, %s%s", t.r.cfg.name, t.r.batch,
             t.r.seq_len, optim_kind_name(t.r.ocfg.kind), t.r.dtype.long_name, o->meta ? ", meta" : "");
    t.r.save = save;
    t.r.save_arg = &t;
    if (o->save_adapter) t.r.save_adapter = save_adapter;
    t.job = (cli_job){.arg = &t,
                      .run = run,
                      .meta_peak = meta_peak,
                      .text = report_text,
                      .json = report_json,
                      .title = title,
                      .device = &t.dev};
    rc = cli_job_main(o, &t.job);
    cli_device_result_free(&t.devr);
    cli_train_free(&t.r);
    return rc;
}
