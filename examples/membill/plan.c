// membill plan: the bill of a training step (or, with --infer, of a generation) for any model,
// dtype and setting, run on shapes alone (meta mode: the same code path, every allocation and
// free at the dtype's element sizes, no data), beside its closed form, per GPU when ZeRO
// shards the model states, and whether it fits a device.
#include "plan.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>



// One meta training step of the setting at batch B and length T, inside an initialised
// profiler. The ids are zeros: meta mode reads none of them.
static int meta_step(const plan_setting *s, long B, long T, ag_err *err) {
    cli_options o;
    memset(&o, 0, sizeof o);
    o.meta = true;
    o.checkpointing = s->checkpointing;
    train_run r;
    memset(&r, 0, sizeof r);
    step_record rec;
    r.cfg = s->cfg;
    r.batch = B;
    r.seq_len = T;
    r.ocfg = s->ocfg;
    r.dtype = s->dt;
    r.steps = &rec;
    r.nsteps = 1;
    r.ids = calloc((size_t)(B * T), sizeof *r.ids);
    if (!r.ids) {
        ag_err_set(err, "out of memory for %ld x %ld token ids", B, T);
        return -1;
    }
    int rc = cli_train_run(&o, &r, err);
    free(r.ids);
    return rc;
}

// One meta generation: the prefill over B prompts of T tokens, then new_tokens - 1 decode steps.
static int meta_generate(const plan_setting *s, long B, long T, ag_err *err) {
    cli_options o;
    memset(&o, 0, sizeof o);
    o.meta = true;
    infer_run r;
    memset(&r, 0, sizeof r);
    r.cfg = s->cfg;
    r.batch = B;
    r.seq_len = T;
    r.new_tokens = s->new_tokens;
    r.use_cache = true;
    r.dtype = s->dt;
    r.ids = calloc((size_t)(B * T), sizeof *r.ids);
    int rc = -1;
    if (!r.ids) ag_err_set(err, "out of memory for %ld x %ld token ids", B, T);
    else rc = cli_infer_run(&o, &r, err);
    cli_infer_free(&r);
    return rc;
}

static int meta_run(const plan_setting *s, long B, long T, ag_err *err) {
    return s->infer ? meta_generate(s, B, T, err) : meta_step(s, B, T, err);
}

static void read_bill(plan_bill *b) {
    for (int c = 0; c < MP_NCATEGORIES; c++) b->peak[c] = mp_get_counter(c).peak;
    b->total = mp_peak().total;
}

static int measure(const plan_setting *s, long B, long T, plan_bill *b, ag_err *err) {
    mp_options mo = {.meta = true};
    if (mp_init(&mo) != MP_OK) {
        ag_err_set(err, "cannot start the profiler");
        return -1;
    }
    int rc = meta_run(s, B, T, err);
    read_bill(b);
    mp_shutdown();
    return rc;
}

static uint64_t shard(uint64_t bytes, long gpus, bool sharded) {
    return sharded ? (bytes + (uint64_t)gpus - 1) / (uint64_t)gpus : bytes;
}


static gpu_share per_gpu(const plan_setting *s, const plan_bill *b) {
    gpu_share g;
    g.weights = shard(b->peak[MP_WEIGHT], s->gpus, s->zero >= 3);
    g.gradients = shard(b->peak[MP_GRADIENT], s->gpus, s->zero >= 2);
    g.optimizer = shard(b->peak[MP_OPTIMIZER], s->gpus, s->zero >= 1);
    g.activations = b->peak[MP_ACTIVATION];
    g.cache = b->peak[MP_CACHE];
    g.overhead = s->overhead;
    g.total = g.weights + g.gradients + g.optimizer + g.activations + g.cache + g.overhead;
    return g;
}

static int fits(const plan_setting *s, long B, long T, uint64_t device, bool *ok, ag_err *err) {
    plan_bill b;
    if (measure(s, B, T, &b, err) != 0) return -1;
    *ok = per_gpu(s, &b).total <= device;
    return 0;
}

// The largest value in [lo, hi] for which fits() holds (0 if none), by doubling then bisection.
static long largest(const plan_setting *s, bool vary_batch, long lo, long hi, uint64_t device, ag_err *err) {
    long good = 0, probe = lo;
    bool ok;
    while (probe <= hi) {
        if (fits(s, vary_batch ? probe : s->batch, vary_batch ? s->seq_len : probe, device, &ok, err) != 0) return -1;
        if (!ok) {
            if (!good) return 0; // not even the smallest fits
            break;
        }
        good = probe;
        if (probe == hi) return good;
        probe = probe > hi / 2 ? hi : probe * 2;
    }
    long bad = probe;
    while (bad - good > 1) {
        long mid = good + (bad - good) / 2;
        if (fits(s, vary_batch ? mid : s->batch, vary_batch ? s->seq_len : mid, device, &ok, err) != 0) return -1;
        if (ok) good = mid;
        else bad = mid;
    }
    return good;
}

static void list_presets(void) {
    printf("%-16s %20s %8s %8s %6s %4s\n", "preset", "parameters", "hidden", "layers", "heads", "kv");
    for (size_t i = 0; i < llama_preset_count(); i++) {
        llama_config c;
        ag_err e;
        if (llama_config_preset(&c, llama_preset_name(i), &e) != 0) continue;
        printf("%-16s %20llu %8lld %8lld %6lld %4lld\n", c.name, (unsigned long long)llama_param_count(&c),
               (long long)c.hidden, (long long)c.layers, (long long)c.heads, (long long)c.kv_heads);
    }
}

static bool plan_options(const cli_options *o, plan_setting *s) {
    optim_kind kind = OPTIM_ADAM;
    const char *bad = NULL;
    char msg[256];
    s->infer = o->infer;
    if (o->weights || o->tokens || o->dump_grads || o->save_weights || o->steps)
        bad = "--weights, --tokens, --steps, --dump-grads and --save-weights belong to membill train";
    else if (o->optimizer && !optim_parse_kind(o->optimizer, &kind))
        bad = "--optimizer must be adam, adamw, sgd, sgd-momentum or none";
    else if (s->infer && (o->optimizer || o->gpus || o->zero))
        bad = "--infer plans one device's generation: --optimizer, --gpus and --zero are training settings";
    else if (s->infer && o->checkpointing)
        bad = "--checkpointing recomputes a training step's activations: it does not go with --infer";
    else if (!s->infer && (o->weight_dtype || o->group_size || o->new_tokens))
        bad = "--weight-dtype, --group-size and --new-tokens go with --infer";
    else if (s->infer && cli_infer_dtype(o, true, &s->dt, msg, sizeof msg) != 0)
        bad = msg;
    else if (!s->infer && !cli_parse_dtype(o->dtype, &s->dt))
        bad = "--dtype must be fp32, bf16, fp16, bf16-mixed, fp16-mixed or bf16-mixed-fp32-grads";
    if (bad) {
        fprintf(stderr, "membill plan: %s\n", bad);
        return false;
    }
    s->ocfg = optim_defaults(kind);
    cli_dtype_optim(&s->dt, &s->ocfg);
    s->batch = o->batch ? o->batch : 1;
    s->seq_len = o->seq_len ? o->seq_len : 25;
    s->new_tokens = s->infer ? (o->new_tokens ? o->new_tokens : 1) : 0;
    s->gpus = o->gpus ? o->gpus : 1;
    s->zero = o->zero;
    s->overhead = o->overhead_given ? o->overhead : 2000000000ULL;
    s->checkpointing = o->checkpointing;
    return true;
}

static bool lengths_ok(const plan_setting *s) {
    long most = (long)s->cfg.max_positions - (s->infer ? s->new_tokens - 1 : 0);
    if (s->seq_len < (s->infer ? 1 : 2) || s->seq_len > most) {
        fprintf(stderr, "membill plan: --seq-len must be %d to %ld (max_position_embeddings%s)\n", s->infer ? 1 : 2, most,
                s->infer ? " less the new tokens but one" : "");
        return false;
    }
    return true;
}

static int plan_fit(const plan_setting *s, uint64_t device, long *max_batch, long *max_seq, ag_err *err) {
    long most = (long)s->cfg.max_positions - (s->infer ? s->new_tokens - 1 : 0);
    *max_batch = largest(s, true, 1, 1 << 16, device, err);
    *max_seq = *max_batch < 0 ? -1 : largest(s, false, s->infer ? 1 : 2, most, device, err);
    return *max_batch < 0 || *max_seq < 0 ? -1 : 0;
}

static int plan_report(const cli_options *o, const plan_setting *s, long max_batch, long max_seq) {
    plan_bill b;
    read_bill(&b);
    llama_closed_form cf;
    llama_dtype_bytes d = plan_dtype_bytes(s);
    llama_closed_form_dtype(&s->cfg, s->batch, s->infer ? plan_cache_tokens(s) : s->seq_len, &d, &cf);
    if (s->checkpointing) llama_closed_form_checkpointing(&s->cfg, s->batch, s->seq_len, &d, &cf);
    gpu_share g = per_gpu(s, &b);
    bool to_stdout = o->json && strcmp(o->json, "-") == 0;
    plan_view view = {s, &b, &cf, &g, o->device_memory, max_batch, max_seq};
    if (!o->quiet && !to_stdout) plan_report_text(stdout, &view);
    json_t *root = plan_report_json(&view);
    char title[256], msg[600];
    snprintf(title, sizeof title, "membill plan%s: %s, batch %ld x %ld tokens, %s, %s (meta)", s->infer ? " --infer" : "",
             s->cfg.name, s->batch, s->seq_len, s->infer ? plan_weight_dtype_name(&s->dt) : optim_kind_name(s->ocfg.kind),
             s->dt.long_name);
    int rc = cli_write_outputs(o, root, title, plan_report_text, &view, msg, sizeof msg);
    if (rc != 0) fprintf(stderr, "membill plan: %s\n", msg);
    json_decref(root);
    return rc;
}

int cmd_plan(const cli_options *o) {
    if (o->help) {
        cli_usage_plan(stdout);
        return 0;
    }
    if (o->list) {
        list_presets();
        return 0;
    }
    plan_setting s;
    memset(&s, 0, sizeof s);
    ag_err err = {""};
    if (!plan_options(o, &s)) return EXIT_USAGE;
    char st_path[8];
    if (cli_load_config(o, &s.cfg, st_path, sizeof st_path, &err) != 0) {
        fprintf(stderr, "membill plan: %s\n", err.msg);
        return EXIT_RUN_FAILED;
    }
    if (!lengths_ok(&s)) return EXIT_USAGE;
    long max_batch = 0, max_seq = 0;
    if (o->device_memory && plan_fit(&s, o->device_memory, &max_batch, &max_seq, &err) != 0) {
        fprintf(stderr, "membill plan: %s\n", err.msg);
        return EXIT_RUN_FAILED;
    }
    mp_options mo = {.meta = true, .keep_timeline = true};
    if (mp_init(&mo) != MP_OK) {
        fprintf(stderr, "membill plan: cannot start the profiler\n");
        return EXIT_RUN_FAILED;
    }
    int rc = meta_run(&s, s.batch, s.seq_len, &err);
    if (rc != 0) fprintf(stderr, "membill plan: %s\n", err.msg);
    else rc = plan_report(o, &s, max_batch, max_seq);
    mp_shutdown();
    return rc == 0 ? 0 : EXIT_RUN_FAILED;
}
