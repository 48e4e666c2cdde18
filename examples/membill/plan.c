// membill plan: the training step's bill for any model and setting, run on shapes alone
// (meta mode: the same code path, every allocation and free, no data), beside its closed form,
// per GPU when ZeRO shards the model states, and whether it fits a device.
#include "cli.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t peak[MP_NCATEGORIES];
    uint64_t total;
} plan_bill;

typedef struct {
    llama_config cfg;
    long batch, seq_len, gpus, zero;
    optim_config ocfg;
    uint64_t overhead;
} plan_setting;

// One meta training step of the setting at batch B and length T, inside an initialised
// profiler. The ids are zeros: meta mode reads none of them.
static int meta_step(const plan_setting *s, long B, long T, llama_err *err) {
    cli_options o;
    memset(&o, 0, sizeof o);
    o.meta = true;
    train_run r;
    memset(&r, 0, sizeof r);
    step_record rec;
    r.cfg = s->cfg;
    r.batch = B;
    r.seq_len = T;
    r.ocfg = s->ocfg;
    r.steps = &rec;
    r.nsteps = 1;
    r.ids = calloc((size_t)(B * T), sizeof *r.ids);
    if (!r.ids) {
        llama_err_set(err, "out of memory for %ld x %ld token ids", B, T);
        return -1;
    }
    int rc = cli_train_run(&o, &r, err);
    free(r.ids);
    return rc;
}

static void read_bill(plan_bill *b) {
    for (int c = 0; c < MP_NCATEGORIES; c++) b->peak[c] = mp_get_counter(c).peak;
    b->total = mp_peak().total;
}

static int measure(const plan_setting *s, long B, long T, plan_bill *b, llama_err *err) {
    mp_options mo = {.meta = true};
    if (mp_init(&mo) != MP_OK) {
        llama_err_set(err, "cannot start the profiler");
        return -1;
    }
    int rc = meta_step(s, B, T, err);
    read_bill(b);
    mp_shutdown();
    return rc;
}

static uint64_t shard(uint64_t bytes, long gpus, bool sharded) {
    return sharded ? (bytes + (uint64_t)gpus - 1) / (uint64_t)gpus : bytes;
}

// One device's share: model states as ZeRO shards them (stage 1 the optimizer state, 2 also
// the gradients, 3 also the weights), its own activations, and the framework overhead. The
// activation peak and the states' peak are added: an upper bound, since the activations are
// mostly gone by the optimizer step.
typedef struct {
    uint64_t weights, gradients, optimizer, activations, overhead, total;
} gpu_share;

static gpu_share per_gpu(const plan_setting *s, const plan_bill *b) {
    gpu_share g;
    g.weights = shard(b->peak[MP_WEIGHT], s->gpus, s->zero >= 3);
    g.gradients = shard(b->peak[MP_GRADIENT], s->gpus, s->zero >= 2);
    g.optimizer = shard(b->peak[MP_OPTIMIZER], s->gpus, s->zero >= 1);
    g.activations = b->peak[MP_ACTIVATION];
    g.overhead = s->overhead;
    g.total = g.weights + g.gradients + g.optimizer + g.activations + g.overhead;
    return g;
}

static int fits(const plan_setting *s, long B, long T, uint64_t device, bool *ok, llama_err *err) {
    plan_bill b;
    if (measure(s, B, T, &b, err) != 0) return -1;
    *ok = per_gpu(s, &b).total <= device;
    return 0;
}

// The largest value in [lo, hi] for which fits() holds (0 if none), by doubling then bisection.
static long largest(const plan_setting *s, bool vary_batch, long lo, long hi, uint64_t device, llama_err *err) {
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
        llama_err e;
        if (llama_config_preset(&c, llama_preset_name(i), &e) != 0) continue;
        printf("%-16s %20llu %8lld %8lld %6lld %4lld\n", c.name, (unsigned long long)llama_param_count(&c),
               (long long)c.hidden, (long long)c.layers, (long long)c.heads, (long long)c.kv_heads);
    }
}

static void row(FILE *out, const char *name, uint64_t measured, uint64_t closed, const char *formula) {
    char a[64], b[64];
    fprintf(out, "  %-11s %-36s %-36s %s\n", name, mp_format_bytes(a, sizeof a, measured),
            mp_format_bytes(b, sizeof b, closed), formula);
}

typedef struct {
    const plan_setting *s;
    const plan_bill *b;
    const llama_closed_form *cf;
    const gpu_share *g;
    uint64_t device;
    long max_batch, max_seq;
} plan_view;

static void report_text(FILE *out, const void *arg) {
    const plan_view *v = arg;
    const plan_setting *s = v->s;
    const plan_bill *b = v->b;
    const llama_closed_form *cf = v->cf;
    const gpu_share *g = v->g;
    uint64_t device = v->device;
    long max_batch = v->max_batch, max_seq = v->max_seq;
    char f[160], x[64], y[64];
    uint64_t per = optim_state_bytes_per_element(s->ocfg.kind);
    fprintf(out, "membill plan: %s, %llu parameters, batch %ld x %ld tokens, %s, float32\n", s->cfg.name,
           (unsigned long long)cf->params, s->batch, s->seq_len, optim_kind_name(s->ocfg.kind));
    fprintf(out, "measured: the training step's own code run on shapes alone (meta mode); closed form: from the shapes\n\n");
    fprintf(out, "  %-11s %-36s %-36s %s\n", "category", "meta bill (peak)", "closed form", "formula");
    snprintf(f, sizeof f, "P x 4 = %llu x 4", (unsigned long long)cf->params);
    row(out, "weight", b->peak[MP_WEIGHT], cf->weights, f);
    row(out, "gradient", b->peak[MP_GRADIENT], cf->gradients, "P x 4, the same size as the weights");
    snprintf(f, sizeof f, "P x %llu (%s)", (unsigned long long)per,
             per == 8 ? "exp_avg + exp_avg_sq" : per == 4 ? "momentum_buffer" : "no state");
    row(out, "optimizer", b->peak[MP_OPTIMIZER], cf->optimizer, f);
    snprintf(f, sizeof f, "%lld blocks x %s (attention probabilities %s of it) + head",
             (long long)s->cfg.layers, mp_format_bytes(x, sizeof x, cf->act_per_block),
             mp_format_bytes(y, sizeof y, cf->act_probs_per_block));
    row(out, "activation", b->peak[MP_ACTIVATION], cf->activations, f);
    fprintf(out, "  %-11s %-36s\n", "total peak", mp_format_bytes(x, sizeof x, b->total));
    fprintf(out, "\n  lesson claim T7: 70e9 parameters x 16 bytes = 1,120 GB before activations;\n"
           "  this model: weights + gradients + optimizer = %s\n",
           mp_format_bytes(x, sizeof x, b->peak[MP_WEIGHT] + b->peak[MP_GRADIENT] + b->peak[MP_OPTIMIZER]));
    if (s->gpus > 1 || s->zero > 0 || device) {
        fprintf(out, "\n  per device (%ld GPU%s, ZeRO stage %ld; activations of its own batch of %ld):\n", s->gpus,
               s->gpus > 1 ? "s" : "", s->zero, s->batch);
        const char *names[] = {"weights", "gradients", "optimizer", "activations", "overhead allowance"};
        const uint64_t vals[] = {g->weights, g->gradients, g->optimizer, g->activations, g->overhead};
        for (int i = 0; i < 5; i++) fprintf(out, "    %-19s %s\n", names[i], mp_format_bytes(x, sizeof x, vals[i]));
        fprintf(out, "    %-19s %s\n", "total", mp_format_bytes(x, sizeof x, g->total));
    }
    if (device) {
        fprintf(out, "\n  on a %s device: %s", mp_format_bytes(x, sizeof x, device), g->total <= device ? "fits" : "does NOT fit");
        fprintf(out, "; largest batch at %ld tokens: %ld; longest sequence at batch %ld: %ld tokens\n", s->seq_len,
               max_batch, s->batch, max_seq);
    }
}

static json_t *closed_form_json(const llama_closed_form *cf, const plan_bill *b) {
    json_t *o = json_object();
    json_object_set_new(o, "parameters", json_integer((json_int_t)cf->params));
    json_object_set_new(o, "weight", json_integer((json_int_t)cf->weights));
    json_object_set_new(o, "gradient", json_integer((json_int_t)cf->gradients));
    json_object_set_new(o, "optimizer", json_integer((json_int_t)cf->optimizer));
    json_object_set_new(o, "activation", json_integer((json_int_t)cf->activations));
    json_object_set_new(o, "activation_per_block", json_integer((json_int_t)cf->act_per_block));
    json_object_set_new(o, "attention_probs_per_block", json_integer((json_int_t)cf->act_probs_per_block));
    json_object_set_new(o, "activation_head", json_integer((json_int_t)cf->act_head));
    json_object_set_new(o, "kv_cache", json_integer((json_int_t)cf->kv_cache));
    json_object_set_new(o, "activation_ratio_to_meta",
                        json_real(b->peak[MP_ACTIVATION] ? (double)cf->activations / (double)b->peak[MP_ACTIVATION] : 0));
    return o;
}

static json_t *report_json(const plan_setting *s, const plan_bill *b, const llama_closed_form *cf,
                           const gpu_share *g, uint64_t device, long max_batch, long max_seq) {
    json_t *root = json_object();
    json_object_set_new(root, "membill_version", json_string(MEMBILL_VERSION));
    json_object_set_new(root, "model", cli_model_json(&s->cfg));
    json_t *run = json_object();
    json_object_set_new(run, "kind", json_string("plan"));
    json_object_set_new(run, "batch", json_integer(s->batch));
    json_object_set_new(run, "seq_len", json_integer(s->seq_len));
    json_object_set_new(run, "optimizer", json_string(optim_kind_name(s->ocfg.kind)));
    json_object_set_new(run, "dtype", json_string("float32"));
    json_object_set_new(run, "meta", json_true());
    json_object_set_new(run, "gpus", json_integer(s->gpus));
    json_object_set_new(run, "zero", json_integer(s->zero));
    json_object_set_new(root, "run", run);
    mp_report_json(root);
    json_object_set_new(root, "closed_form", closed_form_json(cf, b));
    json_t *pg = json_object();
    json_object_set_new(pg, "weight", json_integer((json_int_t)g->weights));
    json_object_set_new(pg, "gradient", json_integer((json_int_t)g->gradients));
    json_object_set_new(pg, "optimizer", json_integer((json_int_t)g->optimizer));
    json_object_set_new(pg, "activation", json_integer((json_int_t)g->activations));
    json_object_set_new(pg, "overhead", json_integer((json_int_t)g->overhead));
    json_object_set_new(pg, "total_bytes", json_integer((json_int_t)g->total));
    json_object_set_new(root, "per_gpu", pg);
    if (device) {
        json_t *fit = json_object();
        json_object_set_new(fit, "device_memory_bytes", json_integer((json_int_t)device));
        json_object_set_new(fit, "fits", json_boolean(g->total <= device));
        json_object_set_new(fit, "largest_batch", json_integer(max_batch));
        json_object_set_new(fit, "longest_seq_len", json_integer(max_seq));
        json_object_set_new(root, "fit", fit);
    }
    return root;
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
    if (o->weights || o->tokens || o->dump_grads || o->save_weights || o->steps) {
        fprintf(stderr, "membill plan: --weights, --tokens, --steps, --dump-grads and --save-weights belong to membill train\n");
        return EXIT_USAGE;
    }
    plan_setting s;
    memset(&s, 0, sizeof s);
    llama_err err = {""};
    optim_kind kind = OPTIM_ADAM;
    if (o->optimizer && !optim_parse_kind(o->optimizer, &kind)) {
        fprintf(stderr, "membill plan: --optimizer must be adam, adamw, sgd, sgd-momentum or none, not '%s'\n", o->optimizer);
        return EXIT_USAGE;
    }
    char st_path[8];
    if (cli_load_config(o, &s.cfg, st_path, sizeof st_path, &err) != 0) {
        fprintf(stderr, "membill plan: %s\n", err.msg);
        return EXIT_RUN_FAILED;
    }
    s.ocfg = optim_defaults(kind);
    s.batch = o->batch ? o->batch : 1;
    s.seq_len = o->seq_len ? o->seq_len : 25;
    s.gpus = o->gpus ? o->gpus : 1;
    s.zero = o->zero;
    s.overhead = o->overhead_given ? o->overhead : 2000000000ULL;
    if (s.seq_len < 2 || s.seq_len > s.cfg.max_positions) {
        fprintf(stderr, "membill plan: --seq-len must be 2 to %lld (max_position_embeddings)\n", (long long)s.cfg.max_positions);
        return EXIT_USAGE;
    }
    long max_batch = 0, max_seq = 0;
    if (o->device_memory) {
        max_batch = largest(&s, true, 1, 1 << 16, o->device_memory, &err);
        max_seq = max_batch < 0 ? -1 : largest(&s, false, 2, (long)s.cfg.max_positions, o->device_memory, &err);
        if (max_batch < 0 || max_seq < 0) {
            fprintf(stderr, "membill plan: %s\n", err.msg);
            return EXIT_RUN_FAILED;
        }
    }
    mp_options mo = {.meta = true, .keep_timeline = true};
    if (mp_init(&mo) != MP_OK) {
        fprintf(stderr, "membill plan: cannot start the profiler\n");
        return EXIT_RUN_FAILED;
    }
    int rc = meta_step(&s, s.batch, s.seq_len, &err);
    if (rc != 0) {
        fprintf(stderr, "membill plan: %s\n", err.msg);
    } else {
        plan_bill b;
        read_bill(&b);
        llama_closed_form cf;
        llama_closed_form_compute(&s.cfg, s.batch, s.seq_len, optim_state_bytes_per_element(kind), &cf);
        gpu_share g = per_gpu(&s, &b);
        bool to_stdout = o->json && strcmp(o->json, "-") == 0;
        plan_view view = {&s, &b, &cf, &g, o->device_memory, max_batch, max_seq};
        if (!o->quiet && !to_stdout) report_text(stdout, &view);
        json_t *root = report_json(&s, &b, &cf, &g, o->device_memory, max_batch, max_seq);
        char title[256], msg[600];
        snprintf(title, sizeof title, "membill plan: %s, batch %ld x %ld tokens, %s, float32 (meta)", s.cfg.name, s.batch,
                 s.seq_len, optim_kind_name(kind));
        if (cli_write_outputs(o, root, title, report_text, &view, msg, sizeof msg) != 0) {
            fprintf(stderr, "membill plan: %s\n", msg);
            rc = -1;
        }
        json_decref(root);
    }
    mp_shutdown();
    return rc == 0 ? 0 : EXIT_RUN_FAILED;
}
