// membill plan: the bill of a training step (or, with --infer, of a generation) for any model,
// dtype and setting, run on shapes alone (meta mode: the same code path, every allocation and
// free at the dtype's element sizes, no data), beside its closed form, per GPU when ZeRO
// shards the model states, and whether it fits a device.
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
    cli_dtype dt;
    bool infer;
    long new_tokens; // --infer: tokens generated after the prompt (the cache ends at seq + new - 1)
    bool checkpointing; // training: every block recomputed in backward
} plan_setting;

// One meta training step of the setting at batch B and length T, inside an initialised
// profiler. The ids are zeros: meta mode reads none of them.
static int meta_step(const plan_setting *s, long B, long T, llama_err *err) {
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
        llama_err_set(err, "out of memory for %ld x %ld token ids", B, T);
        return -1;
    }
    int rc = cli_train_run(&o, &r, err);
    free(r.ids);
    return rc;
}

// One meta generation: the prefill over B prompts of T tokens, then new_tokens - 1 decode steps.
static int meta_generate(const plan_setting *s, long B, long T, llama_err *err) {
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
    if (!r.ids) llama_err_set(err, "out of memory for %ld x %ld token ids", B, T);
    else rc = cli_infer_run(&o, &r, err);
    cli_infer_free(&r);
    return rc;
}

static int meta_run(const plan_setting *s, long B, long T, llama_err *err) {
    return s->infer ? meta_generate(s, B, T, err) : meta_step(s, B, T, err);
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
    int rc = meta_run(s, B, T, err);
    read_bill(b);
    mp_shutdown();
    return rc;
}

static uint64_t shard(uint64_t bytes, long gpus, bool sharded) {
    return sharded ? (bytes + (uint64_t)gpus - 1) / (uint64_t)gpus : bytes;
}

// One device's share: model states as ZeRO shards them (stage 1 the optimizer state, 2 also
// the gradients, 3 also the weights), its own activations (and, generating, its KV cache), and
// the framework overhead. Each category's peak is added: an upper bound, since the activations
// are mostly gone by the optimizer step.
typedef struct {
    uint64_t weights, gradients, optimizer, activations, cache, overhead, total;
} gpu_share;

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
            closed ? mp_format_bytes(b, sizeof b, closed) : "(measured only)", formula);
}

// The closed form's element sizes for the setting.
static llama_dtype_bytes dtype_bytes(const plan_setting *s) {
    llama_dtype_bytes d = {(uint64_t)s->dt.weight_bits / 8, (uint64_t)s->dt.grad_bits / 8,
                           (uint64_t)s->dt.act_bits / 8, optim_state_bytes(&s->ocfg)};
    return d;
}

// The exact weight bytes of an inference setting (quantised matrices, norms in the compute dtype).
static uint64_t infer_weight_bytes(const plan_setting *s) {
    return llama_weight_bytes(&s->cfg, s->dt.weight_bits, s->dt.group, s->dt.scale_bytes, s->dt.act_bits);
}

// Tokens the cache holds at the end: the prompt, and every new token but the last (only chosen).
static long cache_tokens(const plan_setting *s) { return s->seq_len + s->new_tokens - 1; }

typedef struct {
    const plan_setting *s;
    const plan_bill *b;
    const llama_closed_form *cf;
    const gpu_share *g;
    uint64_t device;
    long max_batch, max_seq;
} plan_view;

// ZeRO's model states a device holds (ZeRO paper, section 5: Psi parameters, K bytes of
// optimizer state each, N devices): stage 0 (w+g+K)Psi; 1 wPsi + gPsi + KPsi/N; 2 wPsi +
// (g+K)Psi/N; 3 (w+g+K)Psi/N. The paper's mixed-precision Adam has w = g = 2, K = 12.
static uint64_t zero_formula(const plan_setting *s, const llama_dtype_bytes *d, uint64_t P, char *text, size_t len) {
    uint64_t w = d->weight * P, g = d->gradient * P, k = d->optimizer * P, N = (uint64_t)s->gpus;
    static const char *const forms[] = {"(%llu + %llu + K)Psi, K = %llu", "%lluPsi + %lluPsi + KPsi/N, K = %llu",
                                        "%lluPsi + (%llu + K)Psi/N, K = %llu", "(%llu + %llu + K)Psi/N, K = %llu"};
    snprintf(text, len, forms[s->zero], (unsigned long long)d->weight, (unsigned long long)d->gradient,
             (unsigned long long)d->optimizer);
    switch (s->zero) {
    case 0: return w + g + k;
    case 1: return w + g + k / N;
    case 2: return w + (g + k) / N;
    default: return (w + g + k) / N;
    }
}

static void text_states(FILE *out, const plan_view *v) {
    const plan_setting *s = v->s;
    const plan_bill *b = v->b;
    char f[200], x[64], y[64];
    unsigned long long P = (unsigned long long)v->cf->params;
    llama_dtype_bytes d = dtype_bytes(s);
    snprintf(f, sizeof f, "P x %llu = %llu x %llu (%s)", (unsigned long long)d.weight, P,
             (unsigned long long)d.weight, s->dt.weight_bits == 32 ? "float32" : "16-bit");
    row(out, "weight", b->peak[MP_WEIGHT], v->cf->weights, f);
    snprintf(f, sizeof f, "P x %llu%s", (unsigned long long)d.gradient,
             s->dt.grad_bits > s->dt.weight_bits ? " (float32 main_grad beside 16-bit weights)" : ", the size of the weights");
    row(out, "gradient", b->peak[MP_GRADIENT], v->cf->gradients, f);
    int states = (int)(optim_state_bytes_per_element(s->ocfg.kind) / sizeof(float)), sb = s->dt.state_bits / 8;
    snprintf(f, sizeof f, "P x %llu (%s%s%s)", (unsigned long long)d.optimizer,
             s->ocfg.master && states ? "fp32 master 4 + " : s->ocfg.master ? "fp32 master 4" : "",
             states == 2 ? (sb == 4 ? "exp_avg 4 + exp_avg_sq 4" : "exp_avg 2 + exp_avg_sq 2, in the parameters' dtype")
             : states == 1 ? (sb == 4 ? "momentum_buffer 4" : "momentum_buffer 2") : "",
             !states && !s->ocfg.master ? "no state" : "");
    row(out, "optimizer", b->peak[MP_OPTIMIZER], v->cf->optimizer, f);
    if (s->checkpointing)
        snprintf(f, sizeof f, "%lld block inputs (%s) + the larger of the head and one block recomputed (%s)",
                 (long long)s->cfg.layers, mp_format_bytes(x, sizeof x, v->cf->act_block_inputs),
                 mp_format_bytes(y, sizeof y, v->cf->act_recompute));
    else
        snprintf(f, sizeof f, "%lld blocks x %s (attention probabilities %s of it) + head", (long long)s->cfg.layers,
                 mp_format_bytes(x, sizeof x, v->cf->act_per_block), mp_format_bytes(y, sizeof y, v->cf->act_probs_per_block));
    row(out, "activation", b->peak[MP_ACTIVATION], v->cf->activations, f);
    fprintf(out, "  %-11s %-36s\n", "total peak", mp_format_bytes(x, sizeof x, b->total));
    uint64_t states_bytes = b->peak[MP_WEIGHT] + b->peak[MP_GRADIENT] + b->peak[MP_OPTIMIZER];
    char sum[64];
    cli_dtype_bytes_text(&s->dt, s->ocfg.kind, sum, sizeof sum);
    fprintf(out, "\n  bytes a parameter before activations: %s = %llu", sum, P ? (unsigned long long)(states_bytes / P) : 0ULL);
    if (s->dt.master && s->dt.grad_bits == 16)
        fprintf(out, " (mixed precision: 16-bit weights and gradients for the\n  forward and backward, a float32 master copy and "
                     "float32 Adam state for the update: DeepSpeed's 2 + 2 + 12 = 16;\n  Megatron-LM accumulates gradients in a "
                     "float32 main_grad: 2 + 4 + 12 = 18, --dtype bf16-mixed-fp32-grads)");
    else if (s->dt.master)
        fprintf(out, " (Megatron-LM's count: 16-bit weights, gradients accumulated\n  in a float32 main_grad, a float32 master "
                     "copy and float32 Adam state: 2 + 4 + 12 = 18; DeepSpeed keeps 16-bit\n  gradients: 2 + 2 + 12 = 16, "
                     "--dtype bf16-mixed)");
    fprintf(out, "\n  activations at %s, except RMSNorm's rstd and the loss's log-sum-exp rows, float32 as autocast keeps them\n",
            s->dt.act_bits == 32 ? "float32" : "16 bits");
    fprintf(out, "\n  lesson claim T7: 70e9 parameters x 16 bytes = 1,120 GB before activations;\n"
                 "  this model, %s: %llu x %llu = %s before activations, %s with them (batch %ld x %ld)\n",
            s->dt.long_name, P, P ? (unsigned long long)(states_bytes / P) : 0ULL, mp_format_bytes(x, sizeof x, states_bytes),
            mp_format_bytes(y, sizeof y, states_bytes + b->peak[MP_ACTIVATION]), s->batch, s->seq_len);
}

static void text_per_gpu(FILE *out, const plan_view *v) {
    const plan_setting *s = v->s;
    const gpu_share *g = v->g;
    char x[64], y[64], f[128];
    llama_dtype_bytes d = dtype_bytes(s);
    fprintf(out, "\n  per device (%ld GPU%s, ZeRO stage %ld; activations of its own batch of %ld):\n", s->gpus,
            s->gpus > 1 ? "s" : "", s->zero, s->batch);
    const char *names[] = {"weights", "gradients", "optimizer", "activations", "overhead allowance"};
    const uint64_t vals[] = {g->weights, g->gradients, g->optimizer, g->activations, g->overhead};
    for (int i = 0; i < 5; i++) fprintf(out, "    %-19s %s\n", names[i], mp_format_bytes(x, sizeof x, vals[i]));
    fprintf(out, "    %-19s %s\n", "total", mp_format_bytes(x, sizeof x, g->total));
    uint64_t formula = zero_formula(s, &d, v->cf->params, f, sizeof f);
    fprintf(out, "    model states %s; ZeRO's formula %s, N = %ld: %s\n",
            mp_format_bytes(x, sizeof x, g->weights + g->gradients + g->optimizer), f, s->gpus,
            mp_format_bytes(y, sizeof y, formula));
}

static void text_fit(FILE *out, const plan_view *v) {
    char x[64], y[64];
    const plan_setting *s = v->s;
    fprintf(out, "\n  on a %s device, with %s of framework overhead (the lesson's \"1 to 2 GB\"; --overhead): %s",
            mp_format_bytes(x, sizeof x, v->device), mp_format_bytes(y, sizeof y, s->overhead),
            v->g->total <= v->device ? "fits" : "does NOT fit");
    fprintf(out, ";\n  largest batch at %ld tokens: %ld; longest %s at batch %ld: %ld tokens\n", s->seq_len, v->max_batch,
            s->infer ? "prompt" : "sequence", s->batch, v->max_seq);
}

static void report_train_text(FILE *out, const plan_view *v) {
    const plan_setting *s = v->s;
    fprintf(out, "membill plan: %s, %llu parameters, batch %ld x %ld tokens, %s, %s\n", s->cfg.name,
            (unsigned long long)v->cf->params, s->batch, s->seq_len, optim_kind_name(s->ocfg.kind), s->dt.long_name);
    fprintf(out, "measured: the training step's own code run on shapes alone (meta mode); closed form: from the shapes\n");
    if (s->checkpointing) fprintf(out, "checkpointing: each block's input kept, activations recomputed in backward\n");
    fprintf(out, "\n  %-11s %-36s %-36s %s\n", "category", "meta bill (peak)", "closed form", "formula");
    text_states(out, v);
    if (s->gpus > 1 || s->zero > 0 || v->device) text_per_gpu(out, v);
    if (v->device) text_fit(out, v);
}

static const char *weight_dtype_name(const cli_dtype *d) { return d->weight_name ? d->weight_name : d->long_name; }

static void report_infer_text(FILE *out, const plan_view *v) {
    const plan_setting *s = v->s;
    const plan_bill *b = v->b;
    const gpu_share *g = v->g;
    char f[200], x[64];
    unsigned long long P = (unsigned long long)v->cf->params;
    fprintf(out, "membill plan --infer: %s, %llu parameters, batch %ld x %ld-token prompt, %ld new token%s, %s, weights %s\n",
            s->cfg.name, P, s->batch, s->seq_len, s->new_tokens, s->new_tokens > 1 ? "s" : "", s->dt.long_name,
            weight_dtype_name(&s->dt));
    fprintf(out, "measured: the generation's own code (prefill, decode, KV cache) run on shapes alone (meta mode)\n\n");
    fprintf(out, "  %-11s %-36s %-36s %s\n", "category", "meta bill (peak)", "closed form", "formula");
    if (s->dt.weight_bits < 16)
        snprintf(f, sizeof f, "matrices %d bits an element%s%lld%s, norms at %d bits", s->dt.weight_bits,
                 s->dt.group ? " + one fp16 scale per " : "", (long long)s->dt.group,
                 s->dt.group ? " elements of a row" : "", s->dt.act_bits);
    else snprintf(f, sizeof f, "P x %d", s->dt.weight_bits / 8);
    if (s->dt.weight_bits < 16 && !s->dt.group) snprintf(f, sizeof f, "P x 1 (no scales billed), norms at %d bits", s->dt.act_bits);
    row(out, "weight", b->peak[MP_WEIGHT], infer_weight_bytes(s), f);
    snprintf(f, sizeof f, "2 x %lld layers x %lld kv heads x %lld x %d bytes x %ld tokens x batch %ld", (long long)s->cfg.layers,
             (long long)s->cfg.kv_heads, (long long)s->cfg.head_dim, s->dt.act_bits / 8, cache_tokens(s), s->batch);
    row(out, "cache", b->peak[MP_CACHE], v->cf->kv_cache, f);
    row(out, "activation", b->peak[MP_ACTIVATION], 0, "the prefill's peak (the logits of every prompt position)");
    fprintf(out, "  %-11s %-36s\n", "total peak", mp_format_bytes(x, sizeof x, b->total));
    fprintf(out, "\n  the lesson: weights = parameters x bytes a parameter (fp32 4, bf16 2, int8 1, int4 about 0.5 plus\n"
                 "  scales): %s here, %.4f bytes a parameter; inference = weights + KV cache + 1 to 2 GB of overhead\n",
            mp_format_bytes(x, sizeof x, b->peak[MP_WEIGHT]), P ? (double)b->peak[MP_WEIGHT] / (double)P : 0.0);
    fprintf(out, "\n  one device: weights %s", mp_format_bytes(x, sizeof x, g->weights));
    fprintf(out, " + cache %s", mp_format_bytes(x, sizeof x, g->cache));
    fprintf(out, " + activations %s", mp_format_bytes(x, sizeof x, g->activations));
    fprintf(out, " + overhead %s", mp_format_bytes(x, sizeof x, g->overhead));
    fprintf(out, " = %s\n", mp_format_bytes(x, sizeof x, g->total));
    if (v->device) text_fit(out, v);
}

static void report_text(FILE *out, const void *arg) {
    const plan_view *v = arg;
    if (v->s->infer) report_infer_text(out, v);
    else report_train_text(out, v);
}

static json_t *closed_form_json(const llama_closed_form *cf, const plan_bill *b, bool checkpointing) {
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
    if (checkpointing) {
        json_object_set_new(o, "activation_block_inputs", json_integer((json_int_t)cf->act_block_inputs));
        json_object_set_new(o, "activation_head_moment", json_integer((json_int_t)cf->act_head_moment));
        json_object_set_new(o, "activation_recompute", json_integer((json_int_t)cf->act_recompute));
    }
    json_object_set_new(o, "activation_ratio_to_meta",
                        json_real(b->peak[MP_ACTIVATION] ? (double)cf->activations / (double)b->peak[MP_ACTIVATION] : 0));
    return o;
}

static json_t *per_gpu_json(const gpu_share *g) {
    json_t *pg = json_object();
    json_object_set_new(pg, "weight", json_integer((json_int_t)g->weights));
    json_object_set_new(pg, "gradient", json_integer((json_int_t)g->gradients));
    json_object_set_new(pg, "optimizer", json_integer((json_int_t)g->optimizer));
    json_object_set_new(pg, "activation", json_integer((json_int_t)g->activations));
    json_object_set_new(pg, "cache", json_integer((json_int_t)g->cache));
    json_object_set_new(pg, "overhead", json_integer((json_int_t)g->overhead));
    json_object_set_new(pg, "total_bytes", json_integer((json_int_t)g->total));
    return pg;
}

// Bytes a parameter of each model state, measured, and ZeRO's formula for the device.
static json_t *states_json(const plan_view *v) {
    const plan_bill *b = v->b;
    uint64_t P = v->cf->params, states = b->peak[MP_WEIGHT] + b->peak[MP_GRADIENT] + b->peak[MP_OPTIMIZER];
    json_t *o = json_object();
    json_object_set_new(o, "weight", json_real(P ? (double)b->peak[MP_WEIGHT] / (double)P : 0));
    json_object_set_new(o, "gradient", json_real(P ? (double)b->peak[MP_GRADIENT] / (double)P : 0));
    json_object_set_new(o, "optimizer", json_real(P ? (double)b->peak[MP_OPTIMIZER] / (double)P : 0));
    json_object_set_new(o, "total", json_real(P ? (double)states / (double)P : 0));
    json_object_set_new(o, "states_bytes", json_integer((json_int_t)states));
    json_object_set_new(o, "lesson_70b_claim_bytes", json_integer((json_int_t)1120000000000LL));
    char f[128];
    llama_dtype_bytes d = dtype_bytes(v->s);
    json_object_set_new(o, "zero_formula_bytes", json_integer((json_int_t)zero_formula(v->s, &d, P, f, sizeof f)));
    json_object_set_new(o, "zero_formula", json_string(f));
    return o;
}

static json_t *infer_json(const plan_view *v) {
    const plan_setting *s = v->s;
    json_t *o = json_object();
    json_object_set_new(o, "weights_bytes", json_integer((json_int_t)v->b->peak[MP_WEIGHT]));
    json_object_set_new(o, "weights_closed_form", json_integer((json_int_t)infer_weight_bytes(s)));
    json_object_set_new(o, "weight_bits", json_integer(s->dt.weight_bits));
    json_object_set_new(o, "group_size", json_integer((json_int_t)s->dt.group));
    json_object_set_new(o, "scale_bytes", json_integer(s->dt.scale_bytes));
    json_object_set_new(o, "norm_bits", json_integer(s->dt.weight_bits < 16 ? s->dt.act_bits : s->dt.weight_bits));
    json_object_set_new(o, "cache_bytes", json_integer((json_int_t)v->b->peak[MP_CACHE]));
    json_object_set_new(o, "cache_closed_form", json_integer((json_int_t)v->cf->kv_cache));
    json_object_set_new(o, "cache_tokens", json_integer(cache_tokens(s)));
    json_object_set_new(o, "activation_bytes", json_integer((json_int_t)v->b->peak[MP_ACTIVATION]));
    return o;
}

static json_t *run_json(const plan_setting *s) {
    json_t *run = json_object();
    json_object_set_new(run, "kind", json_string("plan"));
    json_object_set_new(run, "infer", json_boolean(s->infer));
    json_object_set_new(run, "batch", json_integer(s->batch));
    json_object_set_new(run, "seq_len", json_integer(s->seq_len));
    if (s->infer) json_object_set_new(run, "new_tokens", json_integer(s->new_tokens));
    else json_object_set_new(run, "optimizer", json_string(optim_kind_name(s->ocfg.kind)));
    json_object_set_new(run, "dtype", json_string(s->dt.long_name));
    json_object_set_new(run, "weight_dtype", json_string(weight_dtype_name(&s->dt)));
    json_object_set_new(run, "meta", json_true());
    if (!s->infer) json_object_set_new(run, "checkpointing", json_boolean(s->checkpointing));
    json_object_set_new(run, "gpus", json_integer(s->gpus));
    json_object_set_new(run, "zero", json_integer(s->zero));
    json_object_set_new(run, "overhead_bytes", json_integer((json_int_t)s->overhead));
    return run;
}

static json_t *report_json(const plan_view *v) {
    const plan_setting *s = v->s;
    json_t *root = cli_report_root(&s->cfg);
    json_object_set_new(root, "run", run_json(s));
    mp_report_json(root);
    json_object_set_new(root, "closed_form", closed_form_json(v->cf, v->b, s->checkpointing));
    if (s->infer) json_object_set_new(root, "inference", infer_json(v));
    else json_object_set_new(root, "bytes_per_parameter", states_json(v));
    json_object_set_new(root, "per_gpu", per_gpu_json(v->g));
    if (v->device) {
        json_t *fit = json_object();
        json_object_set_new(fit, "device_memory_bytes", json_integer((json_int_t)v->device));
        json_object_set_new(fit, "overhead_bytes", json_integer((json_int_t)s->overhead));
        json_object_set_new(fit, "fits", json_boolean(v->g->total <= v->device));
        json_object_set_new(fit, "largest_batch", json_integer(v->max_batch));
        json_object_set_new(fit, "longest_seq_len", json_integer(v->max_seq));
        json_object_set_new(root, "fit", fit);
    }
    return root;
}

// The options of membill plan into a setting; a usage error prints one line and returns false.
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

static int plan_fit(const plan_setting *s, uint64_t device, long *max_batch, long *max_seq, llama_err *err) {
    long most = (long)s->cfg.max_positions - (s->infer ? s->new_tokens - 1 : 0);
    *max_batch = largest(s, true, 1, 1 << 16, device, err);
    *max_seq = *max_batch < 0 ? -1 : largest(s, false, s->infer ? 1 : 2, most, device, err);
    return *max_batch < 0 || *max_seq < 0 ? -1 : 0;
}

static int plan_report(const cli_options *o, const plan_setting *s, long max_batch, long max_seq) {
    plan_bill b;
    read_bill(&b);
    llama_closed_form cf;
    llama_dtype_bytes d = dtype_bytes(s);
    llama_closed_form_dtype(&s->cfg, s->batch, s->infer ? cache_tokens(s) : s->seq_len, &d, &cf);
    if (s->checkpointing) llama_closed_form_checkpointing(&s->cfg, s->batch, s->seq_len, &d, &cf);
    gpu_share g = per_gpu(s, &b);
    bool to_stdout = o->json && strcmp(o->json, "-") == 0;
    plan_view view = {s, &b, &cf, &g, o->device_memory, max_batch, max_seq};
    if (!o->quiet && !to_stdout) report_text(stdout, &view);
    json_t *root = report_json(&view);
    char title[256], msg[600];
    snprintf(title, sizeof title, "membill plan%s: %s, batch %ld x %ld tokens, %s, %s (meta)", s->infer ? " --infer" : "",
             s->cfg.name, s->batch, s->seq_len, s->infer ? weight_dtype_name(&s->dt) : optim_kind_name(s->ocfg.kind),
             s->dt.long_name);
    int rc = cli_write_outputs(o, root, title, report_text, &view, msg, sizeof msg);
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
    llama_err err = {""};
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
