// membill check: every claim of the lessons (CLAIMS.md) that a run can measure, each with the
// claim, the measured figure and pass or fail. Memory figures come from meta runs of the same
// code (exact, and quick); the speed claims from real runs, judged by direction and ratio.
#include "cli.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    json_t *rows;
    int failed;
    bool quiet;
} checker;

static void claim(checker *k, const char *id, const char *text, const char *claimed, const char *measured, bool pass) {
    if (!k->quiet) printf("  %-3s %-4s %-58s claim %-34s measured %s\n", id, pass ? "pass" : "FAIL", text, claimed, measured);
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "claim", json_string(text));
    json_object_set_new(o, "figure", json_string(claimed));
    json_object_set_new(o, "measured", json_string(measured));
    json_object_set_new(o, "pass", json_boolean(pass));
    json_array_append_new(k->rows, o);
    k->failed += !pass;
}

static const char *mb(char *buf, size_t n, uint64_t bytes) { return mp_format_bytes(buf, n, bytes); }

// A training step on shapes alone: each category's peak.
static int meta_train(const llama_config *c, long B, long T, uint64_t peak[MP_NCATEGORIES], ag_err *err) {
    mp_options mo = {.meta = true};
    if (mp_init(&mo) != MP_OK) return -1;
    cli_options o;
    memset(&o, 0, sizeof o);
    o.meta = true;
    train_run r;
    memset(&r, 0, sizeof r);
    step_record rec;
    r.cfg = *c;
    r.batch = B;
    r.seq_len = T;
    r.ocfg = optim_defaults(OPTIM_ADAM);
    r.steps = &rec;
    r.nsteps = 1;
    r.ids = calloc((size_t)(B * T), sizeof *r.ids);
    int rc = r.ids ? cli_train_run(&o, &r, err) : -1;
    for (int i = 0; i < MP_NCATEGORIES; i++) peak[i] = mp_get_counter(i).peak;
    free(r.ids);
    mp_shutdown();
    return rc;
}

// A generation, meta or real, read by `look` before the profiler goes away.
typedef void (*infer_look)(const infer_run *r, void *arg);

static int generate(const llama_config *c, long B, long T, long N, bool cache, bool meta, infer_look look, void *arg,
                    infer_run *out, ag_err *err) {
    mp_options mo = {.meta = meta, .keep_timeline = true};
    if (mp_init(&mo) != MP_OK) return -1;
    cli_options o;
    memset(&o, 0, sizeof o);
    o.meta = meta;
    infer_run r;
    memset(&r, 0, sizeof r);
    r.cfg = *c;
    r.batch = B;
    r.seq_len = T;
    r.new_tokens = N;
    r.use_cache = cache;
    r.ids = malloc((size_t)(B * T) * sizeof *r.ids);
    for (long i = 0; r.ids && i < B * T; i++) r.ids[i] = (int32_t)((i * 7919 + 13) % c->vocab);
    int rc = r.ids ? cli_infer_run(&o, &r, err) : -1;
    if (rc == 0 && look) look(&r, arg);
    mp_shutdown();
    if (out) *out = r;
    else cli_infer_free(&r);
    return rc;
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
    uint64_t hidden, logits, probs, weights, cache_peak;
} prefill_look;

static void look_prefill(const infer_run *r, void *arg) {
    (void)r;
    prefill_look *p = arg;
    p->hidden = first_alloc_at("embed_tokens:out");
    p->logits = first_alloc_at("lm_head:logits");
    p->probs = first_alloc_at("layers.0.self_attn:probs");
    p->weights = mp_get_counter(MP_WEIGHT).peak;
    p->cache_peak = mp_get_counter(MP_CACHE).peak;
}

static int check_weights_and_training(checker *k, const llama_config *c, ag_err *err) {
    char m[128], f[64];
    uint64_t P = llama_param_count(c), peak[MP_NCATEGORIES], peak2[MP_NCATEGORIES], peak_b[MP_NCATEGORIES];
    if (meta_train(c, 1, 25, peak, err) != 0) return -1;
    claim(k, "W1", "float32 weights: parameters x 4", "538,060,032 bytes", mb(m, sizeof m, peak[MP_WEIGHT]),
          peak[MP_WEIGHT] == 538060032ULL);
    snprintf(m, sizeof m, "%.0f / %.0f / %.0f MB", P * 2 / 1e6, P / 1e6, P * 0.5 / 1e6);
    claim(k, "W2", "bf16 / int8 / int4 weights (parameters x 2, 1, 0.5)", "269 / 135 / 67 MB", m,
          llround(P * 2 / 1e6) == 269 && llround(P / 1e6) == 135 && llround(P * 0.5 / 1e6) == 67);
    claim(k, "T1", "training step, float32, Adam: weights", "538 MB", mb(m, sizeof m, peak[MP_WEIGHT]),
          llround(peak[MP_WEIGHT] / 1e6) == 538);
    claim(k, "T2", "gradients, the same size as the weights", "538 MB", mb(m, sizeof m, peak[MP_GRADIENT]),
          peak[MP_GRADIENT] == peak[MP_WEIGHT]);
    claim(k, "T3", "Adam state (exp_avg + exp_avg_sq)", "1,076 MB", mb(m, sizeof m, peak[MP_OPTIMIZER]),
          peak[MP_OPTIMIZER] == 2 * peak[MP_WEIGHT] && llround(peak[MP_OPTIMIZER] / 1e6) == 1076);
    uint64_t four = peak[MP_WEIGHT] + peak[MP_GRADIENT] + peak[MP_OPTIMIZER];
    claim(k, "T4", "weights + gradients + Adam: four copies", "2,152,240,128 bytes", mb(m, sizeof m, four),
          four == 2152240128ULL);
    // T5: activations of every block until backward; they grow with batch x length.
    if (meta_train(c, 1, 50, peak2, err) != 0 || meta_train(c, 2, 25, peak_b, err) != 0) return -1;
    snprintf(m, sizeof m, "%.2f MB at 25 tokens, x%.2f at 50, x%.2f at batch 2", peak[MP_ACTIVATION] / 1e6,
             (double)peak2[MP_ACTIVATION] / (double)peak[MP_ACTIVATION], (double)peak_b[MP_ACTIVATION] / (double)peak[MP_ACTIVATION]);
    claim(k, "T5", "activations grow with batch x length", "grow", m,
          peak2[MP_ACTIVATION] > 19 * peak[MP_ACTIVATION] / 10 && peak_b[MP_ACTIVATION] > 19 * peak[MP_ACTIVATION] / 10);
    llama_config big;
    if (llama_config_preset(&big, "llama-3-70b", err) != 0 || meta_train(&big, 1, 25, peak2, err) != 0) return -1;
    uint64_t P70 = llama_param_count(&big), states = peak2[MP_WEIGHT] + peak2[MP_GRADIENT] + peak2[MP_OPTIMIZER];
    snprintf(m, sizeof m, "%s (%.1f bytes a parameter, %llu parameters)", mb(f, sizeof f, states), (double)states / (double)P70,
             (unsigned long long)P70);
    claim(k, "T7", "a 70B model in float32 with Adam: 16 bytes a parameter", "70e9 x 16 = 1,120 GB", m, states == 16 * P70);
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
    claim(k, "K1", "KV cache per token, float32: 2 x 30 x 3 x 64 x 4", "46,080 bytes", m, per == 46080);
    const int64_t *s0 = st->cache_shape[0], *s1 = st->cache_shape[1];
    snprintf(m, sizeof m, "%llu bytes, keys (%lld, %lld, %lld, %lld)", (unsigned long long)st->cache_bytes[0],
             (long long)s0[0], (long long)s0[1], (long long)s0[2], (long long)s0[3]);
    claim(k, "K2", "KV cache of the 25-token prompt", "1,152,000 bytes; (1, 3, 25, 64)", m,
          st->cache_bytes[0] == 1152000 && s0[0] == 1 && s0[1] == 3 && s0[2] == 25 && s0[3] == 64);
    snprintf(m, sizeof m, "(%lld, %lld, %lld, %lld)", (long long)s1[0], (long long)s1[1], (long long)s1[2], (long long)s1[3]);
    claim(k, "K3", "one decode step adds a token to every block's cache", "(1, 3, 26, 64)", m, s1[2] == 26 && s1[1] == 3);
    snprintf(m, sizeof m, "%llu bytes", (unsigned long long)p.hidden);
    claim(k, "A1", "one hidden state for 25 tokens, (1, 25, 576)", "57,600 bytes", m, p.hidden == 57600);
    snprintf(m, sizeof m, "%llu bytes", (unsigned long long)p.logits);
    claim(k, "A2", "the logits for 25 tokens, (1, 25, 49152)", "4,915,200 bytes", m, p.logits == 4915200);
    uint64_t probs25 = p.probs;
    cli_infer_free(&r);
    prefill_look p50;
    if (generate(c, 1, 50, 1, true, true, look_prefill, &p50, NULL, err) != 0) return -1;
    snprintf(m, sizeof m, "%llu bytes (9 x 25 x 25 x 4); x%.1f at 50 tokens", (unsigned long long)probs25,
             (double)p50.probs / (double)probs25);
    claim(k, "A3", "attention scores of a block grow with length squared", "9 x 25 x 25", m,
          probs25 == 9 * 25 * 25 * 4 && p50.probs == 4 * probs25);
    snprintf(m, sizeof m, "%.2f MB weights + %.2f MB cache", p.weights / 1e6, p.cache_peak / 1e6);
    claim(k, "T6", "inference: the weights plus a cache of a few MB", "538 MB + cache", m,
          p.weights == 538060032ULL && p.cache_peak < 10000000);
    // K4 and K6: long texts and many of them.
    uint64_t at[2];
    long lens[2] = {1024, 8192};
    for (int i = 0; i < 2; i++) {
        if (generate(c, 1, lens[i], 1, true, true, look_prefill, &p, NULL, err) != 0) return -1;
        at[i] = p.cache_peak;
    }
    snprintf(m, sizeof m, "%.0f MB / %.0f MB (%llu bytes)", at[0] / 1e6, at[1] / 1e6, (unsigned long long)at[1]);
    claim(k, "K4", "KV cache at 1,024 / 8,192 tokens", "47 MB / 377,487,360 bytes", m,
          llround(at[0] / 1e6) == 47 && at[1] == 377487360ULL);
    if (generate(c, 10, 1024, 1, true, true, look_prefill, &p, NULL, err) != 0) return -1;
    snprintf(m, sizeof m, "%.0f + %.0f = %.0f MB", p.weights / 1e6, p.cache_peak / 1e6, (p.weights + p.cache_peak) / 1e6);
    claim(k, "K6", "10 texts of 1,024 tokens: weights + caches", "538 + 472 = 1,010 MB", m,
          llround(p.cache_peak / 1e6) == 472 && llround((p.weights + p.cache_peak) / 1e6) == 1010);
    llama_config mha = *c;
    mha.kv_heads = mha.heads;
    if (generate(&mha, 1, 8192, 1, true, true, look_prefill, &p, NULL, err) != 0) return -1;
    snprintf(m, sizeof m, "%llu bytes a token; %.2f GB at 8,192", (unsigned long long)(p.cache_peak / 8192), p.cache_peak / 1e9);
    claim(k, "K5", "9 key-value heads instead of 3 (no GQA)", "138,240 bytes; 1.13 GB", m,
          p.cache_peak == 138240ULL * 8192 && llround(p.cache_peak / 1e7) == 113);
    return 0;
}

static bool same_tokens(const infer_run *a, const infer_run *b) {
    return memcmp(a->out, b->out, (size_t)(a->batch * a->new_tokens) * sizeof *a->out) == 0;
}

// Speed: the direction and the rough ratio on this machine, beside the course's seconds.
static int check_speed(checker *k, const llama_config *c, ag_err *err) {
    char m[200];
    infer_run with, without;
    if (generate(c, 1, 25, 40, true, false, NULL, NULL, &with, err) != 0) return -1;
    if (generate(c, 1, 25, 40, false, false, NULL, NULL, &without, err) != 0) {
        cli_infer_free(&with);
        return -1;
    }
    double s1 = without.stats.generate_s / with.stats.generate_s;
    snprintf(m, sizeof m, "%.2f s vs %.2f s: x%.1f, same tokens: %s", with.stats.generate_s, without.stats.generate_s, s1,
             same_tokens(&with, &without) ? "yes" : "no");
    claim(k, "S1", "40 new tokens with the cache vs without", "0.46 s vs 1.01 s (x2.2)", m,
          s1 > 1.2 && same_tokens(&with, &without));
    double s3 = with.stats.prefill_s / with.stats.decode_step_s;
    snprintf(m, sizeof m, "%.4f s vs %.4f s (x%.1f)", with.stats.prefill_s, with.stats.decode_step_s, s3);
    claim(k, "S3", "prefill of 25 tokens vs one decode step", "0.02 s vs 0.011 s (x1.8)", m, s3 > 1.0);
    cli_infer_free(&with);
    cli_infer_free(&without);
    // S2: eight prompts one after another, then as one batch (the same prompt here).
    double one_by_one = 0;
    for (int i = 0; i < 8; i++) {
        infer_run r;
        if (generate(c, 1, 25, 20, true, false, NULL, NULL, &r, err) != 0) return -1;
        one_by_one += r.stats.generate_s;
        cli_infer_free(&r);
    }
    infer_run batch;
    if (generate(c, 8, 25, 20, true, false, NULL, NULL, &batch, err) != 0) return -1;
    double s2 = one_by_one / batch.stats.generate_s;
    snprintf(m, sizeof m, "%.2f s vs %.2f s: batching x%.1f faster", one_by_one, batch.stats.generate_s, s2);
    claim(k, "S2", "8 prompts x 20 tokens: one after another vs a batch of 8", "1.92 s vs 0.47 s (x4)", m, s2 > 1.5);
    cli_infer_free(&batch);
    return 0;
}

int cmd_check(const cli_options *o) {
    if (o->help) {
        fputs("usage: membill check [--json FILE] [--threads N] [--no-speed]\n"
              "Every claim of the lessons that a run can measure, on SmolLM2-135M: the claim, the measured\n"
              "figure, pass or fail. Memory claims run in meta mode (exact, quick); speed claims (S1-S3)\n"
              "run for real and are judged by direction and ratio. Exits 1 if any claim fails.\n",
              stdout);
        return 0;
    }
    llama_config c;
    ag_err err = {""};
    if (llama_config_preset(&c, "smollm2-135m", &err) != 0) {
        fprintf(stderr, "membill check: %s\n", err.msg);
        return EXIT_RUN_FAILED;
    }
    checker k = {json_array(), 0, o->quiet || (o->json && strcmp(o->json, "-") == 0)};
    ag_set_num_threads((int)(o->threads ? o->threads : 2));
    if (!k.quiet) printf("membill check: the lessons' claims on %s (%llu parameters)\n\n", c.name,
                         (unsigned long long)llama_param_count(&c));
    int rc = check_weights_and_training(&k, &c, &err);
    if (rc == 0) rc = check_cache(&k, &c, &err);
    if (rc == 0 && !o->no_speed) rc = check_speed(&k, &c, &err);
    if (rc != 0) {
        fprintf(stderr, "membill check: %s\n", err.msg[0] ? err.msg : "a run failed");
        json_decref(k.rows);
        return EXIT_RUN_FAILED;
    }
    if (!k.quiet) printf("\n  %zu claims, %d failed\n", json_array_size(k.rows), k.failed);
    if (o->json) {
        json_t *root = json_object();
        json_object_set_new(root, "membill_version", json_string(MEMBILL_VERSION));
        json_object_set_new(root, "claims", k.rows);
        json_object_set_new(root, "failed", json_integer(k.failed));
        char msg[600];
        if (cli_write_json(o->json, root, msg, sizeof msg) != 0) {
            fprintf(stderr, "membill check: %s\n", msg);
            json_decref(root);
            return EXIT_RUN_FAILED;
        }
        json_decref(root);
    } else {
        json_decref(k.rows);
    }
    if (k.failed) fprintf(stderr, "membill check: %d claim%s failed\n", k.failed, k.failed == 1 ? "" : "s");
    return k.failed ? EXIT_RUN_FAILED : 0;
}
