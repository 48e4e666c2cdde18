// One training run inside an initialised profiler: build or load the model, N steps of
// forward, loss, backward and optimizer, teardown. It takes its own settings (train_run), not
// the command line, so plan and check run it as train does.
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_parse_seq_lens(const char *text, long min, long max, long **out, long *n, ag_err *err) {
    *out = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *p = text; *p; p++) cap += *p == ',';
    long *v = malloc(cap * sizeof *v);
    if (!v) {
        ag_err_set(err, "--seq-lens: out of memory");
        return EXIT_RUN_FAILED;
    }
    const char *p = text;
    for (size_t k = 0; k < cap; k++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[32];
        long x = -1;
        if (len && len < sizeof item && strspn(p, "0123456789") >= len) {
            memcpy(item, p, len);
            item[len] = 0;
            x = len <= 9 ? strtol(item, NULL, 10) : -1;
        }
        if (x < min || x > max) {
            ag_err_set(err, "--seq-lens: item %zu ('%.*s') is not a length from %ld to %ld", k + 1,
                       (int)(len < 24 ? len : 24), p, min, max);
            free(v);
            return x > max ? EXIT_RUN_FAILED : EXIT_USAGE; // the model's positions decide the most (docs/cli.md)
        }
        v[k] = x;
        p = end ? end + 1 : p + len;
    }
    *out = v;
    *n = (long)cap;
    return 0;
}

// --seq-lens: each step its own length. Real runs take the first T ids of each row for a step of
// T tokens; the steps' ids lie one after another.
static int step_lengths(const cli_options *o, train_run *r, ag_err *err) {
    long n = 0;
    int rc = cli_parse_seq_lens(o->seq_lens, 2, (long)r->cfg.max_positions, &r->owned_lens, &n, err);
    if (rc != 0) return rc;
    if (cli_given(o, "--steps") && o->steps != n) {
        ag_err_set(err, "--seq-lens gives %ld lengths, one a step, but --steps says %ld", n, o->steps);
        return EXIT_USAGE;
    }
    r->seq_lens = r->owned_lens;
    r->nsteps = n;
    long most = 0;
    for (long s = 0; s < n; s++) most = r->seq_lens[s] > most ? r->seq_lens[s] : most;
    r->seq_len = most;
    return 0;
}

// --seq-lens: the ids made at the longest length, laid out step by step, each step's rows (every
// micro-batch's) cut to its own length.
static int lay_out_steps(train_run *r, ag_err *err) {
    if (!r->seq_lens || !r->ids) return 0; // meta: no ids
    long rows = r->batch * cli_micro_batches(r), total = 0;
    for (long s = 0; s < r->nsteps; s++) total += r->seq_lens[s];
    int32_t *all = malloc((size_t)(rows * total) * sizeof *all), *at = all;
    if (!all) {
        ag_err_set(err, "out of memory");
        return EXIT_RUN_FAILED;
    }
    for (long s = 0; s < r->nsteps; s++)
        for (long b = 0; b < rows; b++, at += r->seq_lens[s])
            memcpy(at, r->ids + b * r->seq_len, (size_t)r->seq_lens[s] * sizeof *at);
    free(r->ids);
    r->ids = all;
    return 0;
}

int cli_train_prepare(const cli_options *o, train_run *r, ag_err *err) {
    memset(r, 0, sizeof *r);
    optim_kind kind = OPTIM_ADAM;
    optim_parse_kind(o->optimizer, &kind); // the table allows only known names
    cli_parse_dtype(o->dtype, &r->dtype);
    cli_parse_framework(o->framework, &r->framework); // the table allows only known names
    cli_parse_attention(o->attention, &r->attention);
    r->device = cli_device_kind(o);
    r->ocfg = optim_defaults(kind);
    r->ocfg.lr = (float)o->lr;
    // torch.optim's default implementation is the device's (foreach on CUDA, for-loop on the CPU)
    bool foreach = ag_device_row_of(r->device)->adam_foreach;
    optim_parse_adam_impl(foreach && !cli_given(o, "--adam-impl") ? "foreach" : o->adam_impl, &r->ocfg.adam_impl);
    cli_dtype_optim(&r->dtype, &r->ocfg);
    r->nsteps = o->steps ? o->steps : 1;
    r->grad_accum = o->grad_accum > 1 ? o->grad_accum : 1;
    r->meta = o->meta;
    r->checkpointing = o->checkpointing;
    r->seed = o->seed;
    r->dump_grads = o->dump_grads != NULL;
    r->save_weights = o->save_weights != NULL;
    r->saves_adapter = o->save_adapter != NULL;
    int rc = cli_load_config(o, &r->cfg, r->st_path, sizeof r->st_path, err);
    if (rc == 0) rc = cli_lora_from_options(o, &r->lora, err);
    if (rc == 0) rc = cli_routing_prepare(o, &r->cfg, &r->routing, err);
    if (rc == 0) rc = cli_text_prepare(o, &r->cfg, &r->text, err);
    cli_options rows = *o; // every micro-batch's rows, one after the other (the longest of --seq-lens)
    rows.batch = o->batch * r->grad_accum;
    if (rc == 0 && o->seq_lens && (rc = step_lengths(o, r, err)) == 0) rows.seq_len = r->seq_len;
    if (rc == 0) rc = cli_make_tokens(&rows, &r->cfg, &r->text, o->meta, &r->ids, &r->batch, &r->seq_len, err);
    r->batch = o->batch;
    if (rc == 0) rc = lay_out_steps(r, err);
    if (rc == 0 && r->seq_len < 2) {
        ag_err_set(err, "a training step needs at least 2 tokens (the loss predicts each next one), not %ld",
                   r->seq_len);
        rc = r->text.ids ? EXIT_RUN_FAILED : EXIT_USAGE; // a prompt's count is the tokenizer's
    }
    if (rc == 0 && !(r->steps = calloc((size_t)r->nsteps, sizeof *r->steps))) {
        ag_err_set(err, "out of memory");
        rc = EXIT_RUN_FAILED;
    }
    return rc;
}

void cli_train_free(train_run *r) {
    cli_routing_free(&r->routing);
    free(r->ids);
    free(r->owned_lens);
    r->owned_lens = NULL;
    r->seq_lens = NULL;
    cli_text_free(&r->text);
    free(r->steps);
    r->ids = NULL;
    r->steps = NULL;
}

// A step's failure says which step and phase: "step 2, backward: ...".
static int step_failed(long s, const char *phase, ag_err *err) {
    char msg[sizeof err->msg];
    const char *inner = err->msg;
    size_t skip = strncmp(inner, phase, strlen(phase)) == 0 && inner[strlen(phase)] == ':' ? strlen(phase) + 2 : 0;
    snprintf(msg, sizeof msg, "%s", inner + skip);
    ag_err_set(err, "step %ld, %s: %s", s + 1, phase, msg);
    return -1;
}

long cli_micro_batches(const train_run *r) { return r->grad_accum > 1 ? r->grad_accum : 1; }

// Micro-batch k of step s: its rows' forward and backward, the loss scaled by 1/K with K of them
// (the Trainer's loss / gradient_accumulation_steps), the gradients accumulating in .grad. The
// step's phases run from the first forward to the last forward's end, then to the last
// backward's end.
static int micro_batch(train_run *r, ag_ctx *ctx, llama_model *m, const cli_step_hooks *h, long s, long k, double t0,
                       ag_err *err) {
    step_record *rec = &r->steps[s];
    const long K = cli_micro_batches(r);
    if (h->set_sync) h->set_sync(h->user, k == K - 1);
    cli_progress(K > 1 ? "step %ld/%ld: forward %ld/%ld" : "step %ld/%ld: forward", s + 1, r->nsteps, k + 1, K);
    mp_set_phase(MP_PHASE_FORWARD);
    double f0 = k == 0 ? t0 : now_s(); // step 1's forward time holds its zero_grad, as before
    llama_forward_opts fo = {.checkpointing = r->checkpointing, .on_part = h->on_part, .user = h->user};
    long T = r->seq_lens ? r->seq_lens[s] : r->seq_len;
    const int32_t *ids = r->ids;
    for (long j = 0; ids && r->seq_lens && j < s; j++) ids += r->batch * K * r->seq_lens[j];
    if (ids) ids += (size_t)(k * r->batch * T);
    ag_tensor *loss = llama_forward_loss_opts(ctx, m, &fo, ids, r->batch, T, err);
    if (!loss) return step_failed(s, "forward", err);
    float lv = NAN;
    if (loss->data) ag_tensor_row_f32(loss, 0, &lv);
    rec->loss += lv / (double)K;
    if (K > 1) { // loss / K: a tensor of its own, as the Trainer makes it
        ag_tensor *scaled = ag_scale(ctx, "loss:accumulation_scaled", loss, 1.0f / (float)K);
        ag_release(loss);
        if (!(loss = scaled)) {
            ag_err_set(err, "%s", ag_ctx_error(ctx));
            return step_failed(s, "forward", err);
        }
    }
    cli_saved_by_role(ctx, rec->saved_by_role); // plain malloc: it moves "other" only
    double t1 = now_s();
    rec->forward_s += t1 - f0;
    if (k == K - 1) {
        rec->events[1] = mp_timeline_count();
        rec->phases_done = 1;
    }
    cli_progress(K > 1 ? "step %ld/%ld: backward %ld/%ld" : "step %ld/%ld: backward", s + 1, r->nsteps, k + 1, K);
    mp_set_phase(MP_PHASE_BACKWARD);
    ag_status st = ag_backward(ctx, loss);
    ag_release(loss);
    if (st != AG_OK) {
        ag_err_set(err, "%s", ag_ctx_error(ctx));
        return step_failed(s, "backward", err);
    }
    if (!mp_is_meta() && llama_check_grads(m, ids, (size_t)(r->batch * T), err) != 0)
        return step_failed(s, "backward", err);
    if (h->after_backward && h->after_backward(h->user, err) != 0) return -1;
    rec->backward_s += now_s() - t1;
    if (k == K - 1) {
        rec->events[2] = mp_timeline_count();
        rec->phases_done = 2;
    }
    return 0;
}

// One step: K micro-batches' forward and backward, the optimizer; the gradients are set to none
// afterwards, as optimizer.zero_grad(set_to_none=True) would at the start of the next step.
int cli_train_step(train_run *r, ag_ctx *ctx, llama_model *m, optim *opt, long s, const cli_step_hooks *h,
                   ag_err *err) {
    static const cli_step_hooks none = {0};
    if (!h) h = &none;
    step_record *rec = &r->steps[s];
    double t0 = now_s();
    const bool zero_grad_first = AG_FW(ag_framework_row_of(r->framework), zero_grad_first);
    if (zero_grad_first) { // the Trainer's loop: zero_grad(set_to_none=True) first
        rec->zero_grad = true;
        rec->zero_grad_events[0] = mp_timeline_count();
        mp_set_phase(MP_PHASE_ZERO_GRAD);
        h->zero_grad ? h->zero_grad(h->user) : optim_zero_grad(opt);
        rec->zero_grad_events[1] = mp_timeline_count();
        rec->zero_grad_s = now_s() - t0;
    }
    rec->events[0] = mp_timeline_count();
    rec->loss = 0;
    for (long k = 0; k < cli_micro_batches(r); k++)
        if (micro_batch(r, ctx, m, h, s, k, t0, err) != 0) return -1;
    if (r->dump_grads && r->save && s == r->nsteps - 1 && r->save(r->save_arg, m, true, err) != 0) return -1;
    double t2 = now_s();
    cli_progress("step %ld/%ld: optimizer", s + 1, r->nsteps);
    mp_set_phase(MP_PHASE_OPTIMIZER);
    if (h->before_step) h->before_step(h->user);
    if (optim_step(opt, err) != 0) {
        mp_set_host(false); // a step in host memory (offload) ends here too
        return -1;
    }
    if (h->after_step && h->after_step(h->user, err) != 0) return -1;
    if (!zero_grad_first) h->zero_grad ? h->zero_grad(h->user) : optim_zero_grad(opt);
    double t3 = now_s();
    rec->optimizer_s = t3 - t2;
    rec->step_s = t3 - t0;
    rec->events[3] = mp_timeline_count();
    rec->phases_done = 3;
    ag_tape_clear(ctx); // the Trainer's loss goes after the step, and with it what the graph still held
    return 0;
}

int cli_model_build(ag_ctx *ctx, const llama_config *cfg, const cli_dtype *dtype, const char *st_path, uint64_t seed,
                    llama_model **out, ag_err *err) {
    return cli_model_build_lora(ctx, cfg, dtype, NULL, st_path, seed, out, err);
}

int cli_model_build_lora(ag_ctx *ctx, const llama_config *cfg, const cli_dtype *dtype, const cli_lora *l,
                         const char *st_path, uint64_t seed, llama_model **out, ag_err *err) {
    ag_precision md = cli_precision(dtype), base;
    if (!ag_ctx_set_precision(ctx, &md)) {
        ag_err_set(err, "%s", ag_ctx_error(ctx));
        return -1;
    }
    bool quantised = l && cli_lora_base_dtype(l, dtype, &base);
    if (llama_model_new_proj_dtype(out, ctx, cfg, quantised ? &base : NULL, err) != 0) return -1;
    if (!st_path[0])
        llama_model_init_random(*out, seed);
    else if (llama_model_load(*out, st_path, err) != 0)
        return -1;
    if (!l || l->cfg.rank == 0) return 0;
    if (llama_model_add_lora(*out, ctx, &l->cfg, seed, err) != 0) return -1;
    return l->adapter[0] && !mp_is_meta() ? llama_adapter_load(*out, l->adapter, err) : 0;
}

int cli_train_run(train_run *r, ag_err *err) {
    int rc = -1;
    ag_ctx *ctx = ag_ctx_new();
    llama_model *m = NULL;
    optim *opt = NULL;
    if (!ctx) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    ag_ctx_set_framework(ctx, r->framework);
    ag_ctx_set_attention(ctx, r->attention);
    ag_ctx_set_device(ctx, r->device);
    mp_set_phase(MP_PHASE_LOAD);
    cli_progress("building the model");
    if (cli_model_build_lora(ctx, &r->cfg, &r->dtype, &r->lora, r->st_path, r->seed, &m, err) != 0) goto done;
    cli_routing_attach(&r->routing, m);
    optim_config oc = r->ocfg; // foreach's temporaries are the framework's version's
    oc.framework = r->framework;
    opt = optim_new(&oc, m->trainable, m->ntrainable, err); // a frozen base gets no state
    if (!opt) goto done;
    for (long s = 0; s < r->nsteps; s++)
        if (cli_train_step(r, ctx, m, opt, s, NULL, err) != 0) goto done;
    if (r->save_weights && r->save && r->save(r->save_arg, m, false, err) != 0) goto done;
    if (r->save_adapter && r->save_adapter(r->save_arg, m, err) != 0) goto done;
    rc = 0;
done:
    mp_set_phase(MP_PHASE_TEARDOWN);
    optim_free(opt);
    llama_model_free(m);
    ag_ctx_free(ctx);
    return cli_run_end(rc, &r->torn_down_clean, err);
}
