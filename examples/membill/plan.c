// membill plan: the bill of a training step (or, with --infer, of a generation) for any model,
// dtype and setting, run on shapes alone (meta mode: the same code path, every allocation and
// free at the dtype's element sizes, no data), beside its closed form, per GPU when ZeRO
// shards the model states, and whether it fits a device.
#include "plan.h"
#include "outputs.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

// Two meta training steps of the setting at batch B and length T, inside an initialised
// profiler: the first allocates the optimizer's state, the second is the steady state. Meta mode
// reads no ids, so none are made: a plan takes no memory per token.
#define PLAN_STEPS PLAN_STEPS_BILLED

bool plan_simulates_rank(const plan_setting *s) { return !s->infer && (s->gpus > 1 || s->zero > 0 || s->fsdp); }

const char *plan_strategy_name(const plan_setting *s) {
    return par_strategy_of(s->fsdp ? 3 : (int)s->zero, (par_fsdp)s->fsdp)->name;
}

// The simulated rank's run fills *z (NULL: one device, no rank).
static int meta_step(const plan_setting *s, long B, long T, step_record *steps, cli_zero *z, ag_err *err) {
    train_run r;
    memset(&r, 0, sizeof r);
    memset(steps, 0, (size_t)s->nsteps * sizeof *steps);
    r.cfg = s->cfg;
    r.batch = B;
    r.seq_len = T;
    r.seq_lens = s->seq_lens;
    r.ocfg = s->ocfg;
    r.dtype = s->dt;
    r.steps = steps;
    r.nsteps = s->nsteps;
    r.meta = true;
    r.checkpointing = s->checkpointing;
    r.framework = s->framework;
    r.attention = s->attention;
    r.device = s->device;
    r.lora = s->lora;
    r.grad_accum = s->grad_accum > 1 ? s->grad_accum : 1;
    r.routing = s->routing;
    return z ? cli_zero_train_run(&r, z, err) : cli_train_run(&r, err);
}

// One meta generation: the prefill over B prompts of T tokens, then new_tokens - 1 decode steps.
static int meta_generate(const plan_setting *s, long B, long T, ag_err *err) {
    infer_run r;
    memset(&r, 0, sizeof r);
    r.cfg = s->cfg;
    r.batch = B;
    r.seq_len = T;
    r.new_tokens = s->new_tokens;
    r.use_cache = true;
    r.dtype = s->dt;
    r.meta = true;
    r.framework = s->framework;
    r.attention = s->attention;
    r.device = s->device;
    r.routing = s->routing;
    int rc = cli_infer_run(&r, err);
    r.routing = (cli_routing){0}; // the plan's
    cli_infer_free(&r);
    return rc;
}

static int meta_run(const plan_setting *s, long B, long T, step_record *steps, ag_err *err) {
    return s->infer ? meta_generate(s, B, T, err) : meta_step(s, B, T, steps, NULL, err);
}

// --device cuda: the run just made through the caching allocator (training: by its steps, the
// steady state from step 2, or from the lengths' second pass; a generation: by its phases).
static int device_replay(const plan_setting *s, const step_record *steps, cli_device_result *out) {
    cli_device_mark *marks = NULL;
    size_t n;
    if (s->infer) {
        n = cli_device_marks_phases(&marks);
    } else {
        train_run r;
        memset(&r, 0, sizeof r);
        r.steps = (step_record *)steps;
        r.nsteps = s->nsteps;
        r.seq_len = s->seq_len;
        r.seq_lens = s->seq_lens;
        n = cli_device_marks_train(&r, &marks);
    }
    int oom = cli_device_replay(&s->dev, marks, n, s->seq_lens ? s->nlens + 1 : 2, out);
    free(marks);
    return oom;
}

// The bill of the run just made (its step records for training). Training replays the timeline
// step by step: the headline is the steady state's total peak (step 2, or the highest of the
// lengths' second pass); one device is the run itself (a simulated rank's run is read the same
// way by measure_rank).
static void read_bill(const plan_setting *s, const step_record *steps, plan_bill *b) {
    memset(b, 0, sizeof *b);
    if (s->dev.cuda) {
        b->dev_oom = device_replay(s, steps, &b->dev) != 0;
        cli_device_result_free(&b->dev); // the figures stay; the phases are the report's own
    }
    for (int c = 0; c < MP_NCATEGORIES; c++) b->peak[c] = mp_get_counter(c).peak;
    mp_moment pk = mp_peak();
    b->total = pk.total;
    memcpy(b->at_peak, pk.bytes, sizeof b->at_peak);
    b->peak_events = pk.events;
    b->peak_phase = pk.phase;
    if (s->infer) return;
    train_run r;
    memset(&r, 0, sizeof r);
    r.steps = (step_record *)steps;
    r.nsteps = s->nsteps;
    step_figures *whole = calloc((size_t)s->nsteps, sizeof *whole);
    if (!whole) return;
    cli_replay_steps(&r, NULL, whole);
    long from = s->seq_lens ? s->nlens : s->nsteps - 1;
    const step_figures *last = &whole[from];
    for (long k = from + 1; k < s->nsteps; k++)
        if (whole[k].peak > last->peak) last = &whole[k];
    const step_figures *dev = last;
    b->first_step = whole[0].peak;
    b->total = last->peak;
    memcpy(b->at_peak, last->at_peak, sizeof b->at_peak);
    b->peak_events = last->peak_events;
    b->peak_phase = last->peak_phase;
    b->device_peak = dev->peak;
    memcpy(b->device_at, dev->at_peak, sizeof b->device_at);
    b->device_phase = dev->peak_phase;
    memcpy(b->device_own, b->peak, sizeof b->device_own);
    free(whole);
}

// The simulated rank's snapshot, while its run is the profiler's: into b->snapshot.
static int rank_snapshot(const plan_setting *s, plan_bill *b, ag_err *err) {
    FILE *f = open_memstream(&b->snapshot, &b->snapshot_len);
    if (!f) return ag_err_set(err, "out of memory for the snapshot"), -1;
    int rc = cli_snapshot_writer(f, (void *)&s->dev, err);
    if (fclose(f) != 0 && rc == 0) rc = -1, ag_err_set(err, "out of memory for the snapshot");
    if (rc != 0) free(b->snapshot), b->snapshot = NULL;
    return rc;
}

// One device as a simulated rank: rank 0 of --gpus running membill train --zero's step in meta
// mode, its collectives counted and skipped. Its own bill fills the device's figures of *b.
static int measure_rank(const plan_setting *s, long B, long T, plan_bill *b, ag_err *err) {
    par_comm *c = NULL;
    if (par_comm_simulated(&c, 0, (int)s->gpus, err) != 0) return -1;
    mp_options mo = {.meta = true, .keep_timeline = true};
    if (mp_init(&mo) != MP_OK) {
        par_comm_free(c);
        ag_err_set(err, "cannot start the profiler");
        return -1;
    }
    step_record *steps = calloc((size_t)s->nsteps, sizeof *steps);
    cli_zero z = {.stage = s->fsdp ? 3 : (int)s->zero,
                  .prefetch = (int)s->prefetch,
                  .bucket_bytes = (size_t)s->bucket_mb << 20,
                  .fsdp = s->fsdp,
                  .offload = s->offload,
                  .comm = c};
    plan_setting ranked = *s; // expert parallelism: the rank holds its share of the experts
    if (s->ep > 1) ranked.cfg.moe.ep = s->ep;
    int rc = steps ? meta_step(&ranked, B, T, steps, &z, err) : (ag_err_set(err, "out of memory"), -1);
    plan_bill rank;
    plan_setting one = *s;
    one.infer = false;
    if (steps) read_bill(&one, steps, &rank);
    if (steps && rc == 0 && s->rank_snapshot && rank_snapshot(s, b, err) != 0) rc = -1;
    free(steps);
    mp_shutdown();
    if (!steps) {
        par_comm_free(c);
        return -1;
    }
    b->device_peak = rank.total;
    memcpy(b->device_at, rank.at_peak, sizeof b->device_at);
    b->device_phase = rank.peak_phase;
    memcpy(b->device_own, rank.peak, sizeof b->device_own);
    memcpy(b->device_host, z.host_peak, sizeof b->device_host);
    b->simulated_rank = true;
    b->dev = rank.dev;
    b->dev_oom = rank.dev_oom;
    b->strategy = plan_strategy_name(s);
    b->comm = par_get_stats(c);
    par_comm_free(c);
    return rc;
}

static int measure(const plan_setting *s, long B, long T, plan_bill *b, ag_err *err) {
    mp_options mo = {.meta = true, .keep_timeline = !s->infer || s->dev.cuda}; // replayed from it
    step_record *steps = calloc((size_t)s->nsteps, sizeof *steps);
    if (!steps || mp_init(&mo) != MP_OK) {
        free(steps);
        ag_err_set(err, steps ? "cannot start the profiler" : "out of memory");
        return -1;
    }
    int rc = meta_run(s, B, T, steps, err);
    read_bill(s, steps, b);
    mp_shutdown();
    free(steps);
    return rc;
}

gpu_share plan_per_gpu(const plan_setting *s, const plan_bill *b) {
    gpu_share g;
    memset(&g, 0, sizeof g);
    memcpy(g.host, b->device_host, sizeof g.host);
    for (int c = 0; c < MP_NCATEGORIES; c++) g.host_total += g.host[c];
    memcpy(g.own_peak, s->infer ? b->peak : b->device_own, sizeof g.own_peak);
    // Training: the moment of the device's own peak; a generation: each category's peak.
    const uint64_t *at = s->infer ? g.own_peak : b->device_at;
    g.weights = at[MP_WEIGHT];
    g.gradients = at[MP_GRADIENT];
    g.optimizer = at[MP_OPTIMIZER];
    g.activations = at[MP_ACTIVATION];
    g.cache = at[MP_CACHE];
    g.temporary = at[MP_TEMPORARY];
    g.overhead = s->overhead;
    g.phase = s->infer ? b->peak_phase : b->device_phase;
    g.total = g.overhead + at[MP_OTHER]; // "other" is not tracked in meta mode: 0
    g.total += g.weights + g.gradients + g.optimizer + g.activations + g.cache + g.temporary;
    if (s->dev.cuda && b->dev.done) { // the card holds the allocator's reserve, the context and NCCL
        const uint64_t tensors = g.total - g.overhead;
        g.overhead = s->dev.overhead;
        g.total = cli_device_need(&s->dev, &b->dev);
        // Out of memory the replay stops at the failure, so its reserve is not the run's need; that
        // is at least the tensors' bytes at the peak beside the context and NCCL.
        const uint64_t least = tensors + s->dev.context + s->dev.nccl + s->dev.overhead;
        if (b->dev_oom && least > g.total) g.total = least;
    }
    return g;
}

// The device's bill: the whole run's, or the simulated rank's.
int plan_measure_device(const plan_setting *s, long B, long T, plan_bill *b, ag_err *err) {
    memset(b, 0, sizeof *b);
    return plan_simulates_rank(s) ? measure_rank(s, B, T, b, err) : measure(s, B, T, b, err);
}

// --seq-lens: the lengths, then the same lengths again (the second pass is the steady state).
static int plan_lengths(const cli_options *o, plan_setting *s, ag_err *err) {
    s->nsteps = PLAN_STEPS;
    if (!o->seq_lens) return 0;
    long *lens = NULL, n = 0;
    int rc = cli_parse_seq_lens(o->seq_lens, 2, (long)s->cfg.max_positions, &lens, &n, err);
    if (rc != 0) return rc;
    s->seq_lens = malloc((size_t)(2 * n) * sizeof *s->seq_lens);
    if (!s->seq_lens) {
        free(lens);
        ag_err_set(err, "out of memory");
        return EXIT_RUN_FAILED;
    }
    long most = 0;
    for (long k = 0; k < 2 * n; k++) s->seq_lens[k] = lens[k % n], most = lens[k % n] > most ? lens[k % n] : most;
    free(lens);
    s->nlens = n;
    s->nsteps = 2 * n;
    s->seq_len = most;
    return 0;
}

static void list_presets(void) {
    printf("%-16s %20s %8s %8s %6s %4s\n", "preset", "parameters", "hidden", "layers", "heads", "kv");
    for (size_t i = 0; i < llama_preset_count(); i++) {
        llama_config c;
        ag_err e;
        if (llama_config_preset(&c, llama_preset_name(i), &e) != 0) continue;
        char params[32], hidden[16]; // thousands separated, as every report writes them
        printf("%-16s %20s %8s %8lld %6lld %4lld\n", c.name, cli_commas(params, sizeof params, llama_param_count(&c)),
               cli_commas(hidden, sizeof hidden, (uint64_t)c.hidden), (long long)c.layers, (long long)c.heads,
               (long long)c.kv_heads);
    }
}

static void plan_setting_from(const cli_options *o, plan_setting *s) {
    optim_kind kind = OPTIM_ADAM;
    s->infer = o->infer;
    cli_parse_framework(o->framework, &s->framework);
    cli_parse_attention(o->attention, &s->attention);
    s->device = cli_device_kind(o);
    optim_parse_kind(o->optimizer, &kind);
    if (s->infer) {
        ag_err e;
        cli_infer_dtype(o, &s->dt, &e); // checked with the other combinations
    } else {
        cli_parse_dtype(o->dtype, &s->dt);
    }
    s->ocfg = optim_defaults(kind);
    optim_parse_adam_impl(o->adam_impl, &s->ocfg.adam_impl);
    cli_dtype_optim(&s->dt, &s->ocfg);
    s->batch = o->batch;
    s->seq_len = o->seq_len;
    s->new_tokens = s->infer ? o->new_tokens : 0;
    s->gpus = o->gpus;
    s->ep = o->ep;
    s->zero = o->zero;
    cli_zero z;
    cli_zero_from_options(o, &z);
    s->fsdp = z.fsdp;
    s->offload = z.offload;
    s->grad_accum = o->grad_accum > 1 ? o->grad_accum : 1;
    s->bucket_mb = o->bucket_mb;
    s->prefetch = o->prefetch_layers;
    s->overhead = o->overhead;
    s->checkpointing = o->checkpointing;
}

static bool lengths_ok(const plan_setting *s, ag_err *err) {
    long most = (long)s->cfg.max_positions - (s->infer ? s->new_tokens - 1 : 0);
    if (s->seq_len < (s->infer ? 1 : 2) || s->seq_len > most) {
        ag_err_set(err, "--seq-len must be %d to %ld (max_position_embeddings %lld%s)", s->infer ? 1 : 2, most,
                   (long long)s->cfg.max_positions, s->infer ? " less the new tokens but one" : "");
        return false;
    }
    return true;
}

// What the fit search found, beside the bill.
typedef struct {
    plan_fit_result fit;
    bool gpus_auto;
    long min_gpus;
    plan_suggestion suggestions[PLAN_SUGGESTIONS];
    int nsuggestions;
} plan_answers;

static int plan_report(const cli_options *o, const plan_setting *s, const plan_bill *b, const plan_bill *other,
                       const plan_answers *a, uint64_t device, const cli_device_result *devr, ag_err *err) {
    const plan_fit_result *f = &a->fit;
    llama_closed_form cf;
    llama_dtype_bytes d = plan_dtype_bytes(s);
    llama_closed_form_dtype(&s->cfg, s->batch, s->infer ? plan_cache_tokens(s) : s->seq_len, &d, &cf);
    if (!s->infer && s->attention != AG_ATTENTION_EAGER) llama_closed_form_flash(&s->cfg, s->batch, s->seq_len, &cf);
    if (s->checkpointing) llama_closed_form_checkpointing(&s->cfg, s->batch, s->seq_len, &d, &cf);
    // a mixture of experts: the experts no token reaches in the billed steps train nothing
    if (!s->infer && !s->lora.cfg.rank && !s->seq_lens &&
        llama_closed_form_routing(&s->cfg, s->routing.assume, s->batch * s->seq_len, s->nsteps, s->grad_accum, &d, &cf,
                                  err) != 0)
        return EXIT_RUN_FAILED;
    gpu_share g = plan_per_gpu(s, b);
    bool to_stdout = o->json && strcmp(o->json, "-") == 0;
    plan_view view = {
        s,           b,     &cf,  &g,           device, f->max_batch, f->max_seq,  f->batch_capped, f->seq_capped,
        f->smallest, other, devr, !s->seq_lens, o->hub, a->gpus_auto, a->min_gpus, a->suggestions,  a->nsuggestions};
    if (!o->quiet && !to_stdout) plan_report_text(stdout, &view);
    json_t *root = plan_report_json(&view);
    char title[256];
    snprintf(title, sizeof title, "membill plan%s: %s, batch %ld x %ld tokens, %s, %s (meta)",
             s->infer ? " --infer" : "", s->cfg.name, s->batch, s->seq_len,
             s->infer ? plan_weight_dtype_name(&s->dt) : optim_kind_name(s->ocfg.kind), s->dt.long_name);
    struct cli_outputs *outs = NULL;
    cli_report rep = {title, plan_report_text, &view, NULL, NULL, NULL, 0, &s->dev};
    int rc = cli_outputs_declare(o, &outs, err);
    if (rc == 0) rc = cli_outputs_finish(o, outs, root, &rep, err);
    cli_outputs_free(outs);
    json_decref(root);
    return rc;
}

// When the setting does not fit the device: the settings that do.
static int suggest(const plan_setting *s, uint64_t device, plan_answers *a, ag_err *err) {
    plan_bill b;
    if (plan_measure_device(s, s->batch, s->seq_len, &b, err) != 0) {
        if (!strstr(err->msg, "too large for one tensor")) return -1;
        err->msg[0] = 0;
    } else if (plan_per_gpu(s, &b).total <= device && !b.dev_oom) {
        return 0;
    }
    return plan_suggest(s, device, a->suggestions, &a->nsuggestions, err);
}

int cmd_plan(const cli_options *o) {
    if (o->list) {
        list_presets();
        return 0;
    }
    if (o->list_gpus) {
        cli_gpu_list(stdout);
        return 0;
    }
    plan_setting s;
    memset(&s, 0, sizeof s);
    ag_err err = {""};
    plan_setting_from(o, &s);
    char st_path[8];
    int rc = cli_load_config(o, &s.cfg, st_path, sizeof st_path, &err);
    if (rc == 0) rc = cli_lora_from_options(o, &s.lora, &err);
    if (rc == 0) rc = cli_routing_prepare(o, &s.cfg, &s.routing, &err);
    if (rc == 0 && s.ep > 1 && (s.cfg.moe.experts == 0 || s.cfg.moe.experts % s.ep != 0)) {
        if (s.cfg.moe.experts == 0)
            ag_err_set(&err, "--ep: %s has no experts to split", s.cfg.name);
        else
            ag_err_set(&err, "--ep %ld must divide %s's %lld experts", s.ep, s.cfg.name, (long long)s.cfg.moe.experts);
        rc = EXIT_USAGE;
    }
    if (rc == 0) rc = plan_lengths(o, &s, &err);
    if (rc == 0) rc = cli_device_prepare(o, s.infer ? 1 : s.gpus, &s.dev, &err);
    if (rc == 0 && !lengths_ok(&s, &err)) rc = EXIT_RUN_FAILED; // the model's positions decide it
    // The device: the named card's memory, else --device-memory.
    uint64_t device = s.dev.cuda && s.dev.total ? s.dev.total : o->device_memory;
    static plan_answers ans;
    memset(&ans, 0, sizeof ans);
    if (rc == 0 && s.gpus == 0) { // --gpus auto
        ans.gpus_auto = true;
        if (plan_min_gpus(&s, device, &ans.min_gpus, &err) != 0) rc = EXIT_RUN_FAILED;
        long most = PLAN_MAX_GPUS / plan_gpus_step(&s) * plan_gpus_step(&s); // the search's last
        s.gpus = ans.min_gpus ? ans.min_gpus : most > 0 ? most : plan_gpus_step(&s);
        cli_device_set_gpus(&s.dev, s.gpus);
    }
    if (rc == 0 && device && !s.seq_lens && plan_fit(&s, device, &ans.fit, &err) != 0) rc = EXIT_RUN_FAILED;
    if (rc == 0 && device && !s.infer && !s.seq_lens && suggest(&s, device, &ans, &err) != 0) rc = EXIT_RUN_FAILED;
    // What the other attention would change, in one line: the same plan measured with it.
    plan_bill other_bill, *other = NULL;
    if (rc == 0 && !s.infer) {
        plan_setting os = s;
        os.attention = plan_other_attention(s.attention);
        ag_err oe = {""};
        if (measure(&os, s.batch, s.seq_len, &other_bill, &oe) == 0) other = &other_bill;
    }
    plan_bill rank = {0};
    s.rank_snapshot = o->snapshot != NULL;
    if (rc == 0 && plan_simulates_rank(&s) && measure_rank(&s, s.batch, s.seq_len, &rank, &err) != 0)
        rc = EXIT_RUN_FAILED;
    s.rank_snapshot = false;
    s.dev.snapshot = rank.snapshot, s.dev.snapshot_len = rank.snapshot_len; // written by the rank's run
    if (rc == 0) {
        mp_options mo = {.meta = true, .keep_timeline = true};
        if (mp_init(&mo) != MP_OK) {
            ag_err_set(&err, "cannot start the profiler");
            rc = EXIT_RUN_FAILED;
        } else {
            step_record *steps = calloc((size_t)s.nsteps, sizeof *steps);
            plan_bill b;
            cli_device_result devr = {0};
            if (!steps || meta_run(&s, s.batch, s.seq_len, steps, &err) != 0) {
                if (!steps) ag_err_set(&err, "out of memory");
                rc = EXIT_RUN_FAILED;
            } else {
                read_bill(&s, steps, &b);
                if (s.dev.cuda && !rank.simulated_rank) device_replay(&s, steps, &devr); // its phases too
            }
            if (rc == 0 && rank.simulated_rank) { // the device is the simulated rank
                b.device_peak = rank.device_peak;
                memcpy(b.device_at, rank.device_at, sizeof b.device_at);
                b.device_phase = rank.device_phase;
                memcpy(b.device_own, rank.device_own, sizeof b.device_own);
                memcpy(b.device_host, rank.device_host, sizeof b.device_host);
                b.strategy = rank.strategy;
                b.simulated_rank = true;
                b.comm = rank.comm;
                b.dev = rank.dev;
                b.dev_oom = rank.dev_oom;
            }
            if (rc == 0 && plan_report(o, &s, &b, other, &ans, device, devr.done ? &devr : NULL, &err) != 0)
                rc = EXIT_RUN_FAILED;
            cli_device_result_free(&devr);
            free(steps);
            mp_shutdown();
        }
    }
    free(s.seq_lens);
    free(rank.snapshot);
    if (rc != 0) fprintf(stderr, "membill plan: %s\n", err.msg);
    cli_routing_free(&s.routing);
    return rc;
}
