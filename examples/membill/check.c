// membill check: every claim of the lessons (CLAIMS.md) that a run can measure, each with the
// claim, the measured figure and pass or fail. Memory figures come from meta runs of the same
// code (exact, and quick); the speed claims from real runs, judged by direction and ratio.
#include "cli.h"
#include "outputs.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char id[4], text[96], figure[48], measured[200];
    double value; // the measured figure as a number (bytes, a ratio, seconds)
    bool pass;
    bool measurable; // false: its evidence needs trained weights, and the run had random ones
} claim_row;

typedef struct {
    claim_row rows[32];
    int n, failed, total, unmeasurable;
} checker;

static void claim_num(checker *k, const char *id, const char *text, const char *claimed, const char *measured,
                      double value, bool pass) {
    if (k->n == (int)(sizeof k->rows / sizeof k->rows[0])) return;
    claim_row *r = &k->rows[k->n++];
    snprintf(r->id, sizeof r->id, "%s", id);
    snprintf(r->text, sizeof r->text, "%s", text);
    snprintf(r->figure, sizeof r->figure, "%s", claimed);
    snprintf(r->measured, sizeof r->measured, "%s", measured);
    r->value = value;
    r->pass = pass;
    r->measurable = true;
    k->failed += !pass;
    cli_progress("claim %d/%d", k->n, k->total);
}

// A claim about what trained weights do, on random ones: its figure is shown, never judged.
static void claim_unmeasurable(checker *k, const char *id, const char *text, const char *claimed, const char *measured,
                               double value) {
    claim_num(k, id, text, claimed, measured, value, true);
    claim_row *r = &k->rows[k->n - 1];
    char m[sizeof r->measured];
    snprintf(m, sizeof m, "not measurable on random weights (%.160s)", measured);
    snprintf(r->measured, sizeof r->measured, "%s", m);
    r->pass = r->measurable = false;
    k->unmeasurable++;
}

// W, T, K, A, S, Q, B, and by number within each.
static int claim_order(const void *a, const void *b) {
    static const char order[] = "WTKASQB";
    const claim_row *x = a, *y = b;
    long dx = strchr(order, x->id[0]) - order, dy = strchr(order, y->id[0]) - order;
    if (dx != dy) return dx < dy ? -1 : 1;
    return atoi(x->id + 1) - atoi(y->id + 1);
}

// --framework: the memory semantics every run of the check is billed under.
static ag_framework check_framework = CLI_DEFAULT_FRAMEWORK;
static ag_attention_kind check_attention = AG_ATTENTION_EAGER;

// What the speed and output claims generate from: check's own 25 ids on random weights, or, with
// --model naming a Hub checkpoint, its weights and the --prompt's ids.
typedef struct {
    const char *st_path; // "": the seeded random init
    const int32_t *ids;  // NULL: check's own ids
    long n;              // the prompt's tokens
} check_input;
static check_input input = {"", NULL, 25};
static bool trained(void) { return input.st_path[0] != 0; }

static const char *mb(char *buf, size_t n, uint64_t bytes) { return mp_format_bytes(buf, n, bytes); }

// A training step on shapes alone: each category's peak.
static uint64_t first_alloc_at(const char *site);

// logits (NULL: not asked): the bytes of the forward's logits, [B, T, V] under every framework.
static int meta_train(const llama_config *c, long B, long T, uint64_t peak[MP_NCATEGORIES], uint64_t *logits,
                      ag_err *err) {
    mp_options mo = {.meta = true, .keep_timeline = logits != NULL};
    if (mp_init(&mo) != MP_OK) return -1;
    train_run r;
    memset(&r, 0, sizeof r);
    step_record rec;
    memset(&rec, 0, sizeof rec);
    r.cfg = *c;
    r.batch = B;
    r.seq_len = T;
    r.ocfg = optim_defaults(OPTIM_ADAM);
    cli_parse_dtype("fp32", &r.dtype);
    r.steps = &rec;
    r.nsteps = 1;
    r.meta = true;
    r.framework = check_framework;
    r.attention = check_attention;
    int rc = cli_train_run(&r, err);
    for (int i = 0; i < MP_NCATEGORIES; i++) peak[i] = mp_get_counter(i).peak;
    if (logits) *logits = first_alloc_at("lm_head:logits");
    mp_shutdown();
    return rc;
}

// A generation, meta or real, read by `look` before the profiler goes away.
typedef void (*infer_look)(const infer_run *r, void *arg);

// in NULL: check's own ids and random weights.
static int generate_dt(const llama_config *c, long B, long T, long N, bool cache, bool meta, const cli_dtype *dt,
                       const check_input *in, infer_look look, void *arg, infer_run *out, ag_err *err) {
    mp_options mo = {.meta = meta, .keep_timeline = true};
    if (mp_init(&mo) != MP_OK) return -1;
    infer_run r;
    memset(&r, 0, sizeof r);
    r.meta = meta;
    if (dt)
        r.dtype = *dt;
    else
        cli_parse_dtype("fp32", &r.dtype);
    r.cfg = *c;
    r.batch = B;
    r.seq_len = T;
    r.new_tokens = N;
    r.use_cache = cache;
    r.framework = check_framework;
    r.attention = check_attention;
    if (in) snprintf(r.st_path, sizeof r.st_path, "%s", in->st_path);
    r.ids = meta ? NULL : malloc((size_t)(B * T) * sizeof *r.ids);
    for (long i = 0; r.ids && i < B * T; i++)
        r.ids[i] = in && in->ids ? in->ids[i % T] : (int32_t)((i * 7919 + 13) % c->vocab);
    int rc = r.ids || meta ? cli_infer_run(&r, err) : -1;
    if (rc == 0 && look) look(&r, arg);
    mp_shutdown();
    if (out)
        *out = r;
    else
        cli_infer_free(&r);
    return rc;
}

static int generate(const llama_config *c, long B, long T, long N, bool cache, bool meta, infer_look look, void *arg,
                    infer_run *out, ag_err *err) {
    return generate_dt(c, B, T, N, cache, meta, NULL, NULL, look, arg, out, err);
}

// A real generation from the check's input (its prompt's length).
static int generate_in(const llama_config *c, long B, long N, bool cache, const cli_dtype *dt, infer_look look,
                       void *arg, infer_run *out, ag_err *err) {
    return generate_dt(c, B, input.n, N, cache, false, dt, &input, look, arg, out, err);
}

// The bytes of the first allocation at a site (the timeline's record of it).
static uint64_t first_alloc_at(const char *site) {
    for (size_t i = 0; i < mp_timeline_count(); i++) {
        const mp_event *e = mp_timeline_get(i);
        if (e->bytes > 0 && strcmp(mp_site_name(e->site), site) == 0) return (uint64_t)e->bytes;
    }
    return 0;
}

typedef struct {
    uint64_t hidden, probs, weights, cache_peak;
} prefill_look;

static void look_prefill(const infer_run *r, void *arg) {
    (void)r;
    prefill_look *p = arg;
    p->hidden = first_alloc_at("embed_tokens:out");
    p->probs = first_alloc_at("layers.0.self_attn:probs");
    p->weights = mp_get_counter(MP_WEIGHT).peak;
    p->cache_peak = mp_get_counter(MP_CACHE).peak;
}

static void look_weights(const infer_run *r, void *arg) {
    (void)r;
    *(uint64_t *)arg = mp_get_counter(MP_WEIGHT).peak;
}

// W2 from real generations in each weight dtype (the weights really stored in 16, 8 or 4 bits):
// what they hold, and which part of it the claim counts (the values; int4 adds its scales).
static int check_w2(checker *k, const llama_config *c, ag_err *err) {
    static const char *const names[3] = {"bf16", "int8", "int4"};
    uint64_t billed[3], P = llama_param_count(c);
    for (int i = 0; i < 3; i++) {
        cli_dtype d;
        cli_parse_dtype(i == 0 ? "bf16" : "fp32", &d);
        cli_parse_weight_dtype(names[i], 0, &d);
        if (generate_dt(c, 1, 1, 1, true, false, &d, NULL, look_weights, &billed[i], NULL, err) != 0) return -1;
    }
    uint64_t vec = (uint64_t)(c->layers * 2 + 1) * (uint64_t)c->hidden; // norm weights, kept at 4 bytes
    uint64_t values4 = llama_weight_bytes(c, 4, 0, 0, 4), scales = billed[2] - values4 - vec * 4 + vec / 2;
    char m[200];
    snprintf(m, sizeof m, "%.0f / %.0f / %.0f MB of values; int4 holds %.2f MB with %.2f MB of fp16 scales",
             billed[0] / 1e6, (billed[1] - vec * 3) / 1e6, values4 / 1e6, billed[2] / 1e6, scales / 1e6);
    claim_num(k, "W2", "bf16 / int8 / int4 weights (parameters x 2, 1, 0.5; the claim counts no scales)",
              "269 / 135 / 67 MB", m, (double)values4,
              billed[0] == 2 * P && llround((billed[1] - vec * 3) / 1e6) == 135 && llround(values4 / 1e6) == 67 &&
                  billed[2] == llama_weight_bytes(c, 4, 32, 2, 32));
    return 0;
}

static int check_weights_and_training(checker *k, const llama_config *c, ag_err *err) {
    char m[128], f[64];
    uint64_t peak[MP_NCATEGORIES], peak2[MP_NCATEGORIES], peak_b[MP_NCATEGORIES];
    uint64_t logits = 0;
    if (meta_train(c, 1, 25, peak, &logits, err) != 0) return -1;
    // A2 from a forward over the 25 tokens: generation under transformers keeps the last
    // position's logits only (logits_to_keep=1).
    snprintf(m, sizeof m, "%llu bytes", (unsigned long long)logits);
    claim_num(k, "A2", "the logits for 25 tokens, (1, 25, 49152)", "4,915,200 bytes", m, (double)logits,
              logits == 4915200);
    claim_num(k, "W1", "float32 weights: parameters x 4", "538,060,032 bytes", mb(m, sizeof m, peak[MP_WEIGHT]),
              (double)(peak[MP_WEIGHT]), peak[MP_WEIGHT] == 538060032ULL);
    if (check_w2(k, c, err) != 0) return -1;
    claim_num(k, "T1", "training step, float32, Adam: weights", "538 MB", mb(m, sizeof m, peak[MP_WEIGHT]),
              (double)(peak[MP_WEIGHT]), llround(peak[MP_WEIGHT] / 1e6) == 538);
    claim_num(k, "T2", "gradients, the same size as the weights", "538 MB", mb(m, sizeof m, peak[MP_GRADIENT]),
              (double)(peak[MP_GRADIENT]), peak[MP_GRADIENT] == peak[MP_WEIGHT]);
    claim_num(k, "T3", "Adam state (exp_avg + exp_avg_sq)", "1,076 MB", mb(m, sizeof m, peak[MP_OPTIMIZER]),
              (double)(peak[MP_OPTIMIZER]),
              peak[MP_OPTIMIZER] == 2 * peak[MP_WEIGHT] && llround(peak[MP_OPTIMIZER] / 1e6) == 1076);
    uint64_t four = peak[MP_WEIGHT] + peak[MP_GRADIENT] + peak[MP_OPTIMIZER];
    claim_num(k, "T4", "weights + gradients + Adam: four copies", "2,152,240,128 bytes", mb(m, sizeof m, four),
              (double)(four), four == 2152240128ULL);
    // T5: activations of every block until backward; they grow with batch x length.
    if (meta_train(c, 1, 50, peak2, NULL, err) != 0 || meta_train(c, 2, 25, peak_b, NULL, err) != 0) return -1;
    snprintf(m, sizeof m, "%.2f MB at 25 tokens, x%.2f at 50, x%.2f at batch 2", peak[MP_ACTIVATION] / 1e6,
             (double)peak2[MP_ACTIVATION] / (double)peak[MP_ACTIVATION],
             (double)peak_b[MP_ACTIVATION] / (double)peak[MP_ACTIVATION]);
    claim_num(k, "T5", "activations grow with batch x length", "grow", m,
              (double)((double)peak2[MP_ACTIVATION] / (double)peak[MP_ACTIVATION]),
              peak2[MP_ACTIVATION] > 19 * peak[MP_ACTIVATION] / 10 &&
                  peak_b[MP_ACTIVATION] > 19 * peak[MP_ACTIVATION] / 10);
    llama_config big;
    if (llama_config_preset(&big, "llama-3-70b", err) != 0 || meta_train(&big, 1, 25, peak2, NULL, err) != 0) return -1;
    uint64_t P70 = llama_param_count(&big), states = peak2[MP_WEIGHT] + peak2[MP_GRADIENT] + peak2[MP_OPTIMIZER];
    snprintf(m, sizeof m, "%s (%.1f bytes a parameter, %llu parameters)", mb(f, sizeof f, states),
             (double)states / (double)P70, (unsigned long long)P70);
    claim_num(k, "T7", "a 70B model in float32 with Adam: 16 bytes a parameter", "70e9 x 16 = 1,120 GB", m,
              (double)(states), states == 16 * P70);
    return 0;
}

static int check_cache(checker *k, const llama_config *c, ag_err *err) {
    char m[160];
    infer_run r;
    prefill_look p;
    if (generate(c, 1, 25, 2, true, true, look_prefill, &p, &r, err) != 0) return -1;
    const llama_generate_stats *st = &r.stats;
    uint64_t per = st->cache_bytes[1] - st->cache_bytes[0];
    snprintf(m, sizeof m, "%llu bytes", (unsigned long long)per);
    claim_num(k, "K1", "KV cache per token, float32: 2 x 30 x 3 x 64 x 4", "46,080 bytes", m, (double)(per),
              per == 46080);
    const int64_t *s0 = st->cache_shape[0], *s1 = st->cache_shape[1];
    snprintf(m, sizeof m, "%llu bytes, keys (%lld, %lld, %lld, %lld)", (unsigned long long)st->cache_bytes[0],
             (long long)s0[0], (long long)s0[1], (long long)s0[2], (long long)s0[3]);
    claim_num(k, "K2", "KV cache of the 25-token prompt", "1,152,000 bytes; (1, 3, 25, 64)", m,
              (double)(st->cache_bytes[0]),
              st->cache_bytes[0] == 1152000 && s0[0] == 1 && s0[1] == 3 && s0[2] == 25 && s0[3] == 64);
    snprintf(m, sizeof m, "(%lld, %lld, %lld, %lld)", (long long)s1[0], (long long)s1[1], (long long)s1[2],
             (long long)s1[3]);
    claim_num(k, "K3", "one decode step adds a token to every block's cache", "(1, 3, 26, 64)", m, (double)(s1[2]),
              s1[2] == 26 && s1[1] == 3);
    snprintf(m, sizeof m, "%llu bytes", (unsigned long long)p.hidden);
    claim_num(k, "A1", "one hidden state for 25 tokens, (1, 25, 576)", "57,600 bytes", m, (double)(p.hidden),
              p.hidden == 57600);
    uint64_t probs25 = p.probs;
    cli_infer_free(&r);
    prefill_look p50;
    if (generate(c, 1, 50, 1, true, true, look_prefill, &p50, NULL, err) != 0) return -1;
    snprintf(m, sizeof m, "%llu bytes (9 x 25 x 25 x 4); x%.1f at 50 tokens", (unsigned long long)probs25,
             (double)p50.probs / (double)probs25);
    claim_num(k, "A3", "attention scores of a block grow with length squared", "9 x 25 x 25", m, (double)(probs25),
              probs25 == 9 * 25 * 25 * 4 && p50.probs == 4 * probs25);
    snprintf(m, sizeof m, "%.2f MB weights + %.2f MB cache", p.weights / 1e6, p.cache_peak / 1e6);
    claim_num(k, "T6", "inference: the weights plus a cache of a few MB", "538 MB + cache", m, (double)(p.cache_peak),
              p.weights == 538060032ULL && p.cache_peak < 10000000);
    // K4 and K6: long texts and many of them.
    uint64_t at[2];
    long lens[2] = {1024, 8192};
    for (int i = 0; i < 2; i++) {
        if (generate(c, 1, lens[i], 1, true, true, look_prefill, &p, NULL, err) != 0) return -1;
        at[i] = p.cache_peak;
    }
    snprintf(m, sizeof m, "%.0f MB / %.0f MB (%llu bytes)", at[0] / 1e6, at[1] / 1e6, (unsigned long long)at[1]);
    claim_num(k, "K4", "KV cache at 1,024 / 8,192 tokens", "47 MB / 377,487,360 bytes", m, (double)(at[1]),
              llround(at[0] / 1e6) == 47 && at[1] == 377487360ULL);
    if (generate(c, 10, 1024, 1, true, true, look_prefill, &p, NULL, err) != 0) return -1;
    snprintf(m, sizeof m, "%.0f + %.0f = %.0f MB", p.weights / 1e6, p.cache_peak / 1e6,
             (p.weights + p.cache_peak) / 1e6);
    claim_num(k, "K6", "10 texts of 1,024 tokens: weights + caches", "538 + 472 = 1,010 MB", m, (double)(p.cache_peak),
              llround(p.cache_peak / 1e6) == 472 && llround((p.weights + p.cache_peak) / 1e6) == 1010);
    llama_config mha = *c;
    mha.kv_heads = mha.heads;
    if (generate(&mha, 1, 8192, 1, true, true, look_prefill, &p, NULL, err) != 0) return -1;
    snprintf(m, sizeof m, "%llu bytes a token; %.2f GB at 8,192", (unsigned long long)(p.cache_peak / 8192),
             p.cache_peak / 1e9);
    claim_num(k, "K5", "9 key-value heads instead of 3 (no GQA)", "138,240 bytes; 1.13 GB", m,
              (double)(p.cache_peak / 8192), p.cache_peak == 138240ULL * 8192 && llround(p.cache_peak / 1e7) == 113);
    return 0;
}

static bool same_tokens(const infer_run *a, const infer_run *b) {
    return memcmp(a->out, b->out, (size_t)(a->batch * a->new_tokens) * sizeof *a->out) == 0;
}

// Speed: the direction and the rough ratio on this machine, beside the course's seconds.
static int check_speed(checker *k, const llama_config *c, ag_err *err) {
    char m[200];
    infer_run with, without;
    if (generate_in(c, 1, 40, true, NULL, NULL, NULL, &with, err) != 0) return -1;
    if (generate_in(c, 1, 40, false, NULL, NULL, NULL, &without, err) != 0) {
        cli_infer_free(&with);
        return -1;
    }
    double s1 = without.stats.generate_s / with.stats.generate_s;
    snprintf(m, sizeof m, "%.2f s vs %.2f s: x%.1f, same tokens: %s", with.stats.generate_s, without.stats.generate_s,
             s1, same_tokens(&with, &without) ? "yes" : "no");
    claim_num(k, "S1", "40 new tokens with the cache vs without", "0.46 s vs 1.01 s (x2.2)", m, (double)(s1),
              s1 > 1.2 && same_tokens(&with, &without));
    double s3 = with.stats.prefill_s / with.stats.decode_step_s;
    snprintf(m, sizeof m, "%.4f s vs %.4f s (x%.1f)", with.stats.prefill_s, with.stats.decode_step_s, s3);
    char what[64];
    snprintf(what, sizeof what, "prefill of %ld tokens vs one decode step", input.n);
    claim_num(k, "S3", what, "0.02 s vs 0.011 s (x1.8)", m, (double)(s3), s3 > 1.0);
    cli_infer_free(&with);
    cli_infer_free(&without);
    // S2: eight prompts one after another, then as one batch (the same prompt here).
    double one_by_one = 0;
    for (int i = 0; i < 8; i++) {
        infer_run r;
        if (generate_in(c, 1, 20, true, NULL, NULL, NULL, &r, err) != 0) return -1;
        one_by_one += r.stats.generate_s;
        cli_infer_free(&r);
    }
    infer_run batch;
    if (generate_in(c, 8, 20, true, NULL, NULL, NULL, &batch, err) != 0) return -1;
    double s2 = one_by_one / batch.stats.generate_s;
    snprintf(m, sizeof m, "%.2f s vs %.2f s: batching x%.1f faster", one_by_one, batch.stats.generate_s, s2);
    claim_num(k, "S2", "8 prompts x 20 tokens: one after another vs a batch of 8", "1.92 s vs 0.47 s (x4)", m,
              (double)(s2), s2 > 1.5);
    cli_infer_free(&batch);
    return 0;
}

// Q1 to Q3 and B1: real generations of 40 tokens in float32, int8 weights and bfloat16 from the
// same weights, and the next-token distributions along float32's text. Q3 and B1 are claims about
// trained weights: on random ones (near-uniform distributions) they are shown, not judged.
static int check_quant(checker *k, const llama_config *c, bool speed, ag_err *err) {
    enum { N = 40 };
    const long T = input.n;
    cli_dtype dt[3];
    cli_parse_dtype("fp32", &dt[0]);
    cli_parse_dtype("fp32", &dt[1]);
    cli_parse_weight_dtype("int8", 0, &dt[1]);
    cli_parse_dtype("bf16", &dt[2]);
    infer_run run[3];
    uint64_t weights[3];
    for (int i = 0; i < 3; i++)
        if (generate_in(c, 1, N, true, &dt[i], look_weights, &weights[i], &run[i], err) != 0) {
            for (int j = 0; j < i; j++) cli_infer_free(&run[j]);
            return -1;
        }
    cli_dtype_outcome q = {0}, b = {0};
    long n = N; // the tokens every run made (a row ends at an end-of-text id)
    for (int i = 0; i < 3; i++)
        if (run[i].out_len && run[i].out_len[0] < n) n = run[i].out_len[0];
    int rc =
        n < 1 ? -1 : cli_dtype_compare(c, input.st_path, T, n, &dt[1], run[0].ids, run[0].out, run[1].out, &q, err);
    if (rc == 0) rc = cli_dtype_compare(c, input.st_path, T, n, &dt[2], run[0].ids, run[0].out, run[2].out, &b, err);
    if (n < 1) ag_err_set(err, "check: a generation ended before its first token");
    char m[200];
    // Norm weights are vectors, kept at 4 bytes: the matrices are what quantize_dynamic packs.
    uint64_t vec = (uint64_t)(c->layers * 2 + 1) * (uint64_t)c->hidden * 4;
    double ratio = (double)(weights[1] - vec) / (double)(weights[0] - vec);
    snprintf(m, sizeof m, "%.2f MB of int8 matrices vs %.2f MB in float32 (x%.4f), measured in real runs",
             (weights[1] - vec) / 1e6, (weights[0] - vec) / 1e6, ratio);
    claim_num(k, "Q1", "dynamic int8 stores every Linear layer's weights in 1 byte", "a quarter of float32's", m, ratio,
              weights[1] - vec == (weights[0] - vec) / 4);
    if (rc == 0 && speed) {
        double s0 = run[0].stats.generate_s, s1 = run[1].stats.generate_s;
        snprintf(m, sizeof m, "int8 %.2f s vs float32 %.2f s: int8 x%.2f %s here", s1, s0, s1 > s0 ? s1 / s0 : s0 / s1,
                 s1 > s0 ? "slower" : "faster");
        claim_num(k, "Q2", "40 tokens, int8 vs float32 (may or may not save time)", "0.60 s vs 0.46 s (int8 slower)", m,
                  s0 / s1, s0 > 0 && s1 > 0);
    }
    if (rc == 0) {
        char part[2][48];
        cli_dtype_outcome *o2[2] = {&q, &b};
        for (int i = 0; i < 2; i++)
            if (o2[i]->diverge < 0)
                snprintf(part[i], sizeof part[i], "the same %ld tokens", n);
            else
                snprintf(part[i], sizeof part[i], "texts part at new token %ld", o2[i]->diverge + 1);
        snprintf(m, sizeof m, "top-1 agreement %.0f%%, KL %.2e nats, p %.4f -> %.4f, %s", 100 * q.top1, q.kl, q.p_ref,
                 q.p, part[0]);
        // trained weights: the distribution moves visibly, or the greedy text takes another path
        if (trained())
            claim_num(k, "Q3", "int8 changes the outputs", "p 0.107 -> 0.195; another text", m, q.kl,
                      q.kl > 0 && (q.diverge >= 0 || fabs(q.p - q.p_ref) >= 0.01));
        else
            claim_unmeasurable(k, "Q3", "int8 changes the outputs", "p 0.107 -> 0.195; another text", m, q.kl);
        snprintf(m, sizeof m, "top-1 agreement %.0f%%, KL %.2e nats (int8's / %.1f), p %.4f -> %.4f, %s", 100 * b.top1,
                 b.kl, q.kl / (b.kl > 0 ? b.kl : 1), b.p_ref, b.p, part[1]);
        if (trained())
            claim_num(k, "B1", "bfloat16 moves the numbers a little (less than int8)",
                      "p 0.102 for 0.107; ~10 tokens same", m, b.kl, b.kl > 0 && b.kl < q.kl);
        else
            claim_unmeasurable(k, "B1", "bfloat16 moves the numbers a little (less than int8)",
                               "p 0.102 for 0.107; ~10 tokens same", m, b.kl);
    }
    for (int i = 0; i < 3; i++) cli_infer_free(&run[i]);
    return rc;
}

static json_t *claims_json(const checker *k) {
    json_t *root = json_object(), *rows = json_array();
    json_object_set_new(root, "membill_version", json_string(MEMBILL_VERSION));
    for (int i = 0; i < k->n; i++) {
        const claim_row *r = &k->rows[i];
        json_t *o = json_object();
        json_object_set_new(o, "id", json_string(r->id));
        json_object_set_new(o, "claim", json_string(r->text));
        json_object_set_new(o, "figure", json_string(r->figure));
        json_object_set_new(o, "measured", json_real(r->value));
        json_object_set_new(o, "measured_text", json_string(r->measured));
        json_object_set_new(o, "pass", r->measurable ? json_boolean(r->pass) : json_null());
        json_object_set_new(o, "measurable", json_boolean(r->measurable));
        json_array_append_new(rows, o);
    }
    json_object_set_new(root, "claims", rows);
    json_object_set_new(root, "failed", json_integer(k->failed));
    json_object_set_new(root, "not_measurable", json_integer(k->unmeasurable));
    json_object_set_new(root, "weights", json_string(trained() ? input.st_path : "random"));
    return root;
}

static void claims_text(FILE *f, const void *arg) {
    const checker *k = arg;
    for (int i = 0; i < k->n; i++) {
        const claim_row *r = &k->rows[i];
        fprintf(f, "  %-3s %-4s %-58s claim %-34s measured %s\n", r->id,
                !r->measurable ? "n/a"
                : r->pass      ? "pass"
                               : "FAIL",
                r->text, r->figure, r->measured);
    }
    fprintf(f, "\n  %d claims, %d failed", k->n, k->failed);
    if (k->unmeasurable)
        fprintf(f,
                ", %d not measurable on random weights (--model HuggingFaceTB/SmolLM2-135M --download measures "
                "them)",
                k->unmeasurable);
    fputc('\n', f);
}

// The model the claims are measured on: SmolLM2-135M's shape (the claims are its figures), from
// the preset or a Hub id's config.json; with a Hub id, its weights when they are in the cache and
// the --prompt through its tokenizer. An exit code.
static int check_model(const cli_options *o, llama_config *c, cli_text *text, char *st, size_t len, ag_err *err) {
    llama_config want;
    int rc = cli_load_config(o, c, st, len, err);
    if (rc != 0 || llama_config_preset(&want, "smollm2-135m", err) != 0) return rc ? rc : EXIT_RUN_FAILED;
    if (llama_param_count(c) != llama_param_count(&want) || c->layers != want.layers || c->hidden != want.hidden ||
        c->heads != want.heads || c->kv_heads != want.kv_heads || c->head_dim != want.head_dim ||
        c->vocab != want.vocab) {
        char pc[32];
        ag_err_set(err,
                   "check measures the claims of SmolLM2-135M: --model %s has another shape (%s parameters, %lld "
                   "layers); give smollm2-135m or a Hub id of that model (HuggingFaceTB/SmolLM2-135M)",
                   o->model, cli_commas(pc, sizeof pc, llama_param_count(c)), (long long)c->layers);
        return EXIT_USAGE;
    }
    if (o->prompt && (rc = cli_text_prepare(o, c, text, err)) != 0) return rc;
    if (text->ids && text->n + 40 > c->max_positions) {
        ag_err_set(err, "--prompt gives %ld tokens: with 40 new ones that passes the model's %lld positions", text->n,
                   (long long)c->max_positions);
        return EXIT_RUN_FAILED; // the tokenizer's count against the model's positions (docs/cli.md)
    }
    input = (check_input){st, text->ids, text->ids ? text->n : 25};
    return 0;
}

int cmd_check(const cli_options *o) {
    llama_config c;
    ag_err err = {""};
    struct cli_outputs *outs = NULL;
    static char st[4096];
    static cli_text text;
    int code =
        cli_outputs_declare(o, &outs, &err) != 0 ? EXIT_RUN_FAILED : check_model(o, &c, &text, st, sizeof st, &err);
    if (code != 0) {
        fprintf(stderr, "membill check: %s\n", err.msg);
        cli_outputs_free(outs);
        cli_text_free(&text);
        return code;
    }
    static checker k;
    memset(&k, 0, sizeof k);
    k.total = o->no_speed ? 21 : 25;
    bool quiet = o->quiet || (o->json && strcmp(o->json, "-") == 0);
    ag_set_num_threads((int)o->threads);
    cli_parse_framework(o->framework, &check_framework);
    cli_parse_attention(o->attention, &check_attention);
    cli_progress_begin(o);
    int rc = check_weights_and_training(&k, &c, &err);
    if (rc == 0) rc = check_cache(&k, &c, &err);
    if (rc == 0 && !o->no_speed) rc = check_speed(&k, &c, &err);
    if (rc == 0) rc = check_quant(&k, &c, !o->no_speed, &err);
    cli_progress_end();
    if (rc != 0) {
        cli_text_free(&text);
        fprintf(stderr, "membill check: %s\n", err.msg[0] ? err.msg : "a run failed");
        cli_outputs_free(outs);
        return EXIT_RUN_FAILED;
    }
    qsort(k.rows, (size_t)k.n, sizeof k.rows[0], claim_order);
    char pc[32];
    if (!quiet) {
        printf("membill check: the claims on %s (%s parameters), %s\n\n", c.name,
               cli_commas(pc, sizeof pc, llama_param_count(&c)),
               st[0] ? "its weights" : "random weights (seed 0): Q3 and B1 need trained ones");
        claims_text(stdout, &k);
    }
    json_t *root = claims_json(&k);
    // The page shows the claims and the bill; no timeline (the claims take many runs).
    static const char *const no_runs[1];
    cli_report rep = {"membill check", claims_text, &k, NULL, NULL, no_runs, 0, NULL};
    rc = cli_outputs_finish(o, outs, root, &rep, &err);
    json_decref(root);
    cli_outputs_free(outs);
    cli_text_free(&text);
    if (rc != 0) {
        fprintf(stderr, "membill check: %s\n", err.msg);
        return EXIT_RUN_FAILED;
    }
    if (k.failed) fprintf(stderr, "membill check: %d claim%s failed\n", k.failed, k.failed == 1 ? "" : "s");
    return k.failed ? EXIT_RUN_FAILED : 0;
}
