// membill train: forward, loss, backward and optimizer step(s), billed byte by byte.
#include "cli.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what) {
    fprintf(stderr, "membill train: %s\n", what);
    return EXIT_RUN_FAILED;
}

// One step: forward, backward, optimizer; the gradients are set to none afterwards, as
// optimizer.zero_grad(set_to_none=True) would at the start of the next step.
static int run_step(const cli_options *o, train_run *r, ag_ctx *ctx, llama_model *m, optim *opt,
                    long s, ag_err *err) {
    step_record *rec = &r->steps[s];
    double t0 = now_s();
    mp_set_phase(MP_PHASE_FORWARD);
    llama_forward_opts fo = {.checkpointing = o->checkpointing};
    ag_tensor *loss = llama_forward_loss_opts(ctx, m, &fo, r->ids, r->batch, r->seq_len, err);
    if (!loss) return -1;
    rec->loss = loss->data ? loss->data[0] : NAN;
    double t1 = now_s();
    mp_set_phase(MP_PHASE_BACKWARD);
    ag_status st = ag_backward(ctx, loss);
    ag_release(loss);
    if (st != AG_OK) {
        ag_err_set(err, "backward: %s", ag_ctx_error(ctx));
        return -1;
    }
    if (o->dump_grads && s == r->nsteps - 1 && llama_model_save(m, o->dump_grads, true, err) != 0)
        return -1;
    double t2 = now_s();
    mp_set_phase(MP_PHASE_OPTIMIZER);
    if (optim_step(opt, err) != 0) return -1;
    optim_zero_grad(opt);
    double t3 = now_s();
    rec->forward_s = t1 - t0;
    rec->backward_s = t2 - t1;
    rec->optimizer_s = t3 - t2;
    rec->step_s = t3 - t0;
    return 0;
}

int cli_train_run(const cli_options *o, train_run *r, ag_err *err) {
    int rc = -1;
    ag_ctx *ctx = ag_ctx_new();
    llama_model *m = NULL;
    optim *opt = NULL;
    if (!ctx) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    mp_set_phase(MP_PHASE_LOAD);
    ag_meta_dtype md = cli_meta_dtype(&r->dtype);
    if (!ag_ctx_set_meta_dtype(ctx, &md)) {
        ag_err_set(err, "%s", ag_ctx_error(ctx));
        goto done;
    }
    if (llama_model_new(&m, ctx, &r->cfg, err) != 0) goto done;
    if (r->st_path[0]) {
        if (llama_model_load(m, r->st_path, err) != 0) goto done;
    } else {
        llama_model_init_random(m, o->seed);
    }
    opt = optim_new(&r->ocfg, m->params, m->nparams, err);
    if (!opt) goto done;
    for (long s = 0; s < r->nsteps; s++)
        if (run_step(o, r, ctx, m, opt, s, err) != 0) goto done;
    if (o->save_weights && llama_model_save(m, o->save_weights, false, err) != 0) goto done;
    rc = 0;
done:
    mp_set_phase(MP_PHASE_TEARDOWN);
    optim_free(opt);
    llama_model_free(m);
    ag_ctx_free(ctx);
    r->torn_down_clean = true;
    for (int c = 0; c < MP_OTHER; c++)
        if (mp_get_counter(c).live != 0) r->torn_down_clean = false;
    if (rc == 0) rc = cli_budget_check(err);
    return rc;
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

static json_t *step_json(const step_record *s) {
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
    for (long s = 0; s < r->nsteps; s++) json_array_append_new(arr, step_json(&r->steps[s]));
    json_object_set_new(t, "steps", arr);
    return t;
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
    return o;
}

static json_t *report_json(const cli_options *o, const train_run *r) {
    json_t *root = cli_report_root(&r->cfg);
    json_t *run = json_object();
    json_object_set_new(run, "kind", json_string("train"));
    json_object_set_new(run, "batch", json_integer(r->batch));
    json_object_set_new(run, "seq_len", json_integer(r->seq_len));
    json_object_set_new(run, "steps", json_integer(r->nsteps));
    json_object_set_new(run, "optimizer", json_string(optim_kind_name(r->ocfg.kind)));
    json_object_set_new(run, "lr", json_real(r->ocfg.lr));
    json_object_set_new(run, "dtype", json_string(r->dtype.name ? r->dtype.long_name : "float32"));
    json_object_set_new(run, "meta", json_boolean(o->meta));
    json_object_set_new(run, "checkpointing", json_boolean(o->checkpointing));
    json_object_set_new(run, "threads", json_integer(o->threads ? o->threads : 2));
    json_object_set_new(run, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(run, "weights", json_string(r->st_path[0] ? r->st_path : "random"));
    json_object_set_new(root, "run", run);
    json_object_set_new(root, "loss", o->meta ? json_null() : json_real(r->steps[0].loss));
    json_t *losses = json_array();
    for (long s = 0; s < r->nsteps && !o->meta; s++) json_array_append_new(losses, json_real(r->steps[s].loss));
    json_object_set_new(root, "losses", losses);
    mp_report_json(root);
    json_object_set_new(root, "four_copies", four_copies_json());
    json_object_set_new(root, "breakdown", cli_breakdown_json((long)r->cfg.layers));
    json_object_set_new(root, "timing", timing_json(r));
    json_object_set_new(root, "teardown_all_zero", json_boolean(r->torn_down_clean));
    return root;
}

typedef struct {
    const cli_options *o;
    const train_run *r;
} train_view;

static void report_text(FILE *f, const void *arg) {
    const cli_options *o = ((const train_view *)arg)->o;
    const train_run *r = ((const train_view *)arg)->r;
    char b[80], c[80];
    fprintf(f, "membill train: %s, %llu parameters, batch %ld x %ld tokens, %s lr %g, %s%s\n",
            r->cfg.name, (unsigned long long)llama_param_count(&r->cfg), r->batch, r->seq_len,
            optim_kind_name(r->ocfg.kind), r->ocfg.lr, r->dtype.name ? r->dtype.long_name : "float32",
            o->meta ? ", meta (shapes only)" : "");
    if (o->checkpointing) fprintf(f, "checkpointing: each block's input kept, activations recomputed in backward\n");
    if (!o->meta)
        fprintf(f, "loss %.4f (a random init is near ln(vocab) = %.4f)\n", r->steps[0].loss, log((double)r->cfg.vocab));
    fprintf(f, "\n");
    mp_report_text(f);
    cli_breakdown_text(f, (long)r->cfg.layers);
    uint64_t w = mp_get_counter(MP_WEIGHT).peak, g = mp_get_counter(MP_GRADIENT).peak,
             a = mp_get_counter(MP_OPTIMIZER).peak;
    // The optimizer phase is where all three are live at once (its peak is after the state).
    mp_moment op = mp_get_phase_stats(MP_PHASE_OPTIMIZER).at_peak;
    bool together = op.bytes[MP_WEIGHT] + op.bytes[MP_GRADIENT] + op.bytes[MP_OPTIMIZER] == w + g + a;
    fprintf(f, "\n  four copies: weights + gradients + optimizer state = %s\n", mp_format_bytes(b, sizeof b, w + g + a));
    fprintf(f, "    = %.3f x the weights (%s); all live at once during the optimizer step: %s\n",
            w ? (double)(w + g + a) / (double)w : 0.0, mp_format_bytes(c, sizeof c, w), together ? "yes" : "no");
    fprintf(f, "    activations on top, at their peak: %s\n", mp_format_bytes(b, sizeof b, mp_get_counter(MP_ACTIVATION).peak));
    if (!o->meta) {
        const step_record *s = &r->steps[0];
        fprintf(f, "\n  step 1: forward %.3f s, backward %.3f s, optimizer %.3f s, step %.3f s\n", s->forward_s,
                s->backward_s, s->optimizer_s, s->step_s);
        if (r->nsteps >= 2)
            fprintf(f, "  steady state (median of steps 2..%ld): forward %.3f s, backward %.3f s, optimizer %.3f s, step %.3f s\n",
                    r->nsteps, steady(r, offsetof(step_record, forward_s)), steady(r, offsetof(step_record, backward_s)),
                    steady(r, offsetof(step_record, optimizer_s)), steady(r, offsetof(step_record, step_s)));
    }
    fprintf(f, "  teardown: weight, gradient, optimizer, activation and cache back at zero: %s\n",
            r->torn_down_clean ? "yes" : "NO");
    if (o->explain && cli_dtype_is_f32(&r->dtype)) cli_explain_train(f, &r->cfg, r->batch, r->seq_len, r->ocfg.kind);
    else if (o->explain) // the worked formulas are float32's; plan has each dtype's closed form
        fprintf(f, "\n  --explain works out the float32 formulas: membill plan --dtype %s gives this dtype's closed form\n",
                r->dtype.name);
}

int cmd_train(const cli_options *o) {
    if (o->help) {
        cli_usage_train(stdout);
        return 0;
    }
    train_run r;
    memset(&r, 0, sizeof r);
    ag_err err = {""};
    optim_kind kind = OPTIM_ADAM;
    if (o->optimizer && !optim_parse_kind(o->optimizer, &kind)) {
        fprintf(stderr, "membill train: --optimizer must be adam, adamw, sgd, sgd-momentum or none, not '%s'\n", o->optimizer);
        return EXIT_USAGE;
    }
    if (o->meta && (o->dump_grads || o->save_weights || o->weights)) {
        fprintf(stderr, "membill train: --meta runs on shapes alone: --weights, --dump-grads and --save-weights need data\n");
        return EXIT_USAGE;
    }
    if (!cli_parse_dtype(o->dtype, &r.dtype)) {
        fprintf(stderr, "membill train: --dtype must be fp32, bf16, fp16, bf16-mixed, fp16-mixed or bf16-mixed-fp32-grads, not '%s'\n",
                o->dtype);
        return EXIT_USAGE;
    }
    if (!cli_dtype_is_f32(&r.dtype) && !o->meta) {
        fprintf(stderr, "membill train: --dtype %s needs --meta: real runs compute in float32\n", r.dtype.name);
        return EXIT_USAGE;
    }
    if (o->weight_dtype || o->group_size || o->infer) {
        fprintf(stderr, "membill train: --weight-dtype, --group-size and --infer belong to membill plan and membill infer\n");
        return EXIT_USAGE;
    }
    r.ocfg = optim_defaults(kind);
    r.ocfg.lr = o->lr_given ? (float)o->lr : 1e-5f;
    cli_dtype_optim(&r.dtype, &r.ocfg);
    r.nsteps = o->steps ? o->steps : 1;
    if (cli_load_config(o, &r.cfg, r.st_path, sizeof r.st_path, &err) != 0) return fail(err.msg);
    r.ids = cli_make_tokens(o, &r.cfg, &r.batch, &r.seq_len, &err);
    if (!r.ids) return fail(err.msg);
    r.steps = calloc((size_t)r.nsteps, sizeof *r.steps);
    mp_options mo = {.meta = o->meta, .budget = o->budget, .track_other = !o->meta,
                     .keep_timeline = true};
    if (!r.steps || mp_init(&mo) != MP_OK) {
        free(r.ids);
        free(r.steps);
        return fail("cannot start the profiler");
    }
    ag_set_num_threads((int)(o->threads ? o->threads : 2));
    int rc = cli_train_run(o, &r, &err);
    train_view view = {o, &r};
    if (rc != 0) {
        if (mp_oom()->happened) report_text(stdout, &view);
        fprintf(stderr, "membill train: %s\n", err.msg);
    } else {
        if (!o->quiet && !(o->json && strcmp(o->json, "-") == 0)) report_text(stdout, &view);
        json_t *root = report_json(o, &r);
        char title[256], msg[600];
        snprintf(title, sizeof title, "membill train: %s, batch %ld x %ld tokens, %s, %s%s", r.cfg.name, r.batch,
                 r.seq_len, optim_kind_name(r.ocfg.kind), r.dtype.long_name, o->meta ? ", meta" : "");
        if (cli_write_outputs(o, root, title, report_text, &view, msg, sizeof msg) != 0) {
            fprintf(stderr, "membill train: %s\n", msg);
            rc = -1;
        }
        json_decref(root);
    }
    mp_shutdown();
    free(r.ids);
    free(r.steps);
    return rc == 0 ? 0 : EXIT_RUN_FAILED;
}
