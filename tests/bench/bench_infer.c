// Greedy generation on SmolLM2-135M (random init; float32, or --dtype bf16 and --weight-dtype
// int8 | int4): the prefill of a 25-token prompt,
// the median decode step, and 40 new tokens with the KV cache against recomputing the whole
// sequence at each step (claims S1, S3); optionally 8 prompts one after another against one
// batch of 8 (S2). Usage: bench_infer [--threads N] [--tokens T] [--new-tokens N] [--repeat R]
// [--batch-claim] [--steps] [--json FILE] [--dtype bf16] [--weight-dtype int8|int4] (--steps prints every step's time
// of the best runs;
// --json also writes the figures as one JSON object, for tests/bench/bench_infer.sh)
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

typedef struct {
    int threads, tokens, new_tokens, repeat;
    bool batch_claim, steps;
    const char *json;
    int act_bits, weight_bits; // --dtype bf16: 16; --weight-dtype int8 / int4: 8 / 4
} bench_args;

static int parse(bench_args *a, int argc, char **argv) {
    *a = (bench_args){.threads = 2, .tokens = 25, .new_tokens = 40, .repeat = 3, .act_bits = 32, .weight_bits = 32};
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--threads")      ? &a->threads
                   : !strcmp(argv[i], "--tokens")     ? &a->tokens
                   : !strcmp(argv[i], "--new-tokens") ? &a->new_tokens
                   : !strcmp(argv[i], "--repeat")     ? &a->repeat
                                                      : NULL;
        if (!strcmp(argv[i], "--batch-claim")) {
            a->batch_claim = true;
        } else if (!strcmp(argv[i], "--steps")) {
            a->steps = true;
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            a->json = argv[++i];
        } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc && !strcmp(argv[i + 1], "bf16")) {
            a->act_bits = a->weight_bits = 16, i++;
        } else if (!strcmp(argv[i], "--weight-dtype") && i + 1 < argc &&
                   (!strcmp(argv[i + 1], "int8") || !strcmp(argv[i + 1], "int4"))) {
            a->weight_bits = argv[++i][3] - '0';
        } else if (!dst || i + 1 >= argc || (*dst = atoi(argv[++i])) < 1) {
            fprintf(
                stderr,
                "bench_infer: bad argument %s (options: --threads N --tokens T "
                "--new-tokens N --repeat R --batch-claim --steps --json FILE --dtype bf16 --weight-dtype int8|int4, "
                "numbers >= 1)\n",
                argv[i]);
            return -1;
        }
    }
    return 0;
}

// The best of `repeat` runs (timings: the fastest generate_s); exits on error.
// products_s (NULL: not wanted) gets the best run's time in products (every linear, attention's).
static llama_generate_stats run(ag_ctx *ctx, llama_model *m, bool cache, const int32_t *ids, int64_t B, int64_t T,
                                int64_t n, int repeat, int32_t *out, double *products_s) {
    llama_generate_stats best = {0};
    for (int r = 0; r < repeat; r++) {
        llama_generate_stats st;
        ag_err err = {{0}};
        llama_generate_opts o = {.use_cache = cache};
        ag_reset_blas_stats();
        if (llama_generate(ctx, m, &o, ids, NULL, B, T, n, out, &st, &err) != 0) {
            fprintf(stderr, "bench_infer: %s\n", err.msg);
            exit(1);
        }
        if (r == 0 || st.generate_s < best.generate_s) {
            if (products_s) *products_s = ag_get_blas_stats().seconds;
            llama_generate_stats_free(&best);
            best = st;
        } else {
            llama_generate_stats_free(&st);
        }
    }
    return best;
}

// S2: 8 prompts of `tokens` ids, 20 new tokens each, one after another and as one batch (whose
// rows must be what each prompt generates alone). Figures go to `report` when not NULL.
static bool batch_claim(ag_ctx *ctx, llama_model *m, const int32_t *ids, int T, int repeat, json_t *report) {
    enum { B = 8, N = 20 };
    int32_t solo[B * N], batch[B * N];
    double seq = 0;
    for (int b = 0; b < B; b++) {
        llama_generate_stats st = run(ctx, m, true, ids + b * T, 1, T, N, repeat, solo + b * N, NULL);
        seq += st.generate_s;
        llama_generate_stats_free(&st);
    }
    llama_generate_stats st = run(ctx, m, true, ids, B, T, N, repeat, batch, NULL);
    bool same = memcmp(solo, batch, sizeof solo) == 0;
    printf("S2: 8 prompts x 20 new tokens: one after another %.3f s, one batch of 8 %.3f s "
           "(%.2fx); same tokens: %s\n",
           seq, st.generate_s, seq / st.generate_s, same ? "yes" : "NO");
    printf("    the batch: prefill of 8 x %d tokens %.4f s, median decode step %.4f s\n", T, st.prefill_s,
           st.decode_step_s);
    if (report)
        json_object_set_new(report, "batch",
                            json_pack("{s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:b}", "prompts", B, "new_tokens", N,
                                      "sequential_s", seq, "batched_s", st.generate_s, "speedup", seq / st.generate_s,
                                      "batch_prefill_s", st.prefill_s, "batch_decode_step_s", st.decode_step_s,
                                      "same_tokens", same));
    llama_generate_stats_free(&st);
    return same;
}

static json_t *single_report(const bench_args *a, const llama_generate_stats *c, double products_s,
                             const llama_generate_stats *u, bool same) {
    return json_pack("{s:s, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:b}", "engine", "membill", "threads",
                     a->threads, "tokens", a->tokens, "new_tokens", a->new_tokens, "repeat", a->repeat, "prefill_s",
                     c->prefill_s, "decode_step_s", c->decode_step_s, "cached_s", c->generate_s, "cached_products_s",
                     products_s, "uncached_s", u->generate_s, "same_tokens", same);
}

int main(int argc, char **argv) {
    bench_args a;
    if (parse(&a, argc, argv) != 0) return 2;
    ag_set_num_threads(a.threads);
    if (mp_init(&(mp_options){0}) != MP_OK) {
        fprintf(stderr, "bench_infer: cannot start the profiler\n");
        return 1;
    }
    ag_ctx *ctx = ag_ctx_new();
    llama_config cfg;
    llama_model *m = NULL;
    ag_err err = {{0}};
    ag_precision prec = ag_precision_f32();
    prec.act_bits = a.act_bits, prec.weight_bits = a.weight_bits, prec.grad_bits = a.act_bits;
    if (a.weight_bits == 4) prec.group = 32, prec.scale_bytes = 2;
    if (ctx) ag_ctx_set_precision(ctx, &prec);
    if (!ctx || llama_config_preset(&cfg, "smollm2-135m", &err) != 0 || llama_model_new(&m, ctx, &cfg, &err) != 0) {
        fprintf(stderr, "bench_infer: %s\n", err.msg[0] ? err.msg : "out of memory");
        return 1;
    }
    llama_model_init_random(m, 1);
    ag_set_grad_enabled(ctx, false);
    int32_t *ids = malloc(sizeof(int32_t) * 8 * (size_t)a.tokens);
    int32_t *out = malloc(sizeof(int32_t) * (size_t)a.new_tokens);
    uint64_t s = 12345;
    for (int i = 0; i < 8 * a.tokens; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        ids[i] = (int32_t)((s >> 33) % (uint64_t)cfg.vocab);
    }
    printf("SmolLM2-135M, random init, %s activations, %s weights, %d threads, prompt %d tokens, %d new tokens, "
           "best of %d\n",
           a.act_bits == 16 ? "bfloat16" : "float32",
           a.weight_bits == 8   ? "int8"
           : a.weight_bits == 4 ? "int4"
           : a.act_bits == 16   ? "bfloat16"
                                : "float32",
           a.threads, a.tokens, a.new_tokens, a.repeat);
    run(ctx, m, true, ids, 1, a.tokens, 2, 1, out, NULL); // warm-up: thread pools, page faults
    double c_products = 0;
    llama_generate_stats c = run(ctx, m, true, ids, 1, a.tokens, a.new_tokens, a.repeat, out, &c_products);
    int32_t *out2 = malloc(sizeof(int32_t) * (size_t)a.new_tokens);
    llama_generate_stats u = run(ctx, m, false, ids, 1, a.tokens, a.new_tokens, a.repeat, out2, NULL);
    bool same = memcmp(out, out2, sizeof(int32_t) * (size_t)a.new_tokens) == 0;
    int last = a.new_tokens - 1;
    printf("S3: prefill %.4f s, median decode step %.4f s\n", c.prefill_s, c.decode_step_s);
    printf("    of the %.3f s with the cache, %.3f s in products (%.0f%%), %.3f s in the rest\n", c.generate_s,
           c_products, 100 * c_products / c.generate_s, c.generate_s - c_products);
    printf("    cache after the prefill %llu bytes (usable %llu), after step %d %llu (usable %llu)\n",
           (unsigned long long)c.cache_bytes[0], (unsigned long long)c.cache_usable[0], last,
           (unsigned long long)c.cache_bytes[last], (unsigned long long)c.cache_usable[last]);
    printf("S1: %d new tokens with the cache %.3f s (%.1f tokens/s), without %.3f s: %.2fx; "
           "same tokens: %s\n",
           a.new_tokens, c.generate_s, a.new_tokens / c.generate_s, u.generate_s, u.generate_s / c.generate_s,
           same ? "yes" : "NO");
    printf("    without the cache: first step %.4f s, last step %.4f s\n", u.step_s[0], u.step_s[a.new_tokens - 1]);
    for (int k = 0; a.steps && k < a.new_tokens; k++)
        printf("    step %2d: with the cache %.4f s, without %.4f s\n", k, c.step_s[k], u.step_s[k]);
    json_t *report = a.json ? single_report(&a, &c, c_products, &u, same) : NULL;
    if (report) // what a decode step reads: every weight once, in its dtype
        json_object_set_new(report, "weight_bytes", json_integer((json_int_t)mp_get_counter(MP_WEIGHT).peak));
    llama_generate_stats_free(&c);
    llama_generate_stats_free(&u);
    if (a.batch_claim) same = batch_claim(ctx, m, ids, a.tokens, a.repeat, report) && same;
    int rc = same ? 0 : 1;
    if (report && json_dump_file(report, a.json, JSON_INDENT(1)) != 0) {
        fprintf(stderr, "bench_infer: cannot write %s\n", a.json);
        rc = 1;
    }
    json_decref(report);
    free(ids);
    free(out);
    free(out2);
    llama_model_free(m);
    ag_ctx_free(ctx);
    mp_shutdown();
    return rc;
}
