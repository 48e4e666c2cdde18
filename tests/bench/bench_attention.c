// Flash against eager attention, forward and backward of one layer at SmolLM2-135M shapes
// (9 query heads, 3 key-value heads, head dim 64, batch 1), at 512, 2048 and 8192 tokens: median
// milliseconds, the ratio eager / flash, and each one's activation peak. Eager's probabilities at
// 8192 tokens are 9 x 8192² x 4 = 2.4 GB (and one head's dP beside them): it runs once there, or
// not at all with --no-eager-8192. Prints figures, asserts nothing about time.
// Usage: bench_attention [reps] [--no-eager-8192]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autograd.h"
#include "bench_util.h"

enum { HQ = 9, HKV = 3, HD = 64 };

static ag_tensor *leaf(ag_ctx *ctx, int64_t T, int64_t width, float amp) {
    ag_tensor *t = bench_checked("bench_attention", ctx,
                                 ag_tensor_new(ctx, 3, (int64_t[]){1, T, width}, MP_ACTIVATION, "bench:input"));
    t->requires_grad = true;
    for (int64_t i = 0; i < t->numel; i++) ag_f32(t)[i] = amp * (bench_uniform() - 0.5f);
    return t;
}

typedef struct {
    double fwd, bwd; // median seconds
    uint64_t peak;   // activation bytes
} result;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Forward, then backward seeded with a fixed random d(out); one warm-up run first when reps > 1.
static result run(ag_ctx *ctx, ag_attention_kind kind, int64_t T, int reps) {
    ag_ctx_set_attention(ctx, kind);
    ag_tensor *q = leaf(ctx, T, HQ * HD, 4.0f), *k = leaf(ctx, T, HKV * HD, 4.0f), *v = leaf(ctx, T, HKV * HD, 1.0f);
    double fwd[64], bwd[64];
    result r = {0};
    for (int i = reps > 1 ? -1 : 0; i < reps; i++) {
        mp_reset_peaks();
        uint64_t base = mp_get_counter(MP_ACTIVATION).live;
        double t0 = bench_now();
        ag_tensor *o =
            bench_checked("bench_attention", ctx, ag_attention(ctx, "layers.0.self_attn", q, k, v, HQ, HKV, HD));
        double t1 = bench_now();
        ag_tensor *seed = bench_checked("bench_attention", ctx, ag_tensor_new(ctx, 3, o->shape, MP_ACTIVATION, "seed"));
        for (int64_t e = 0; e < seed->numel; e++) ag_f32(seed)[e] = bench_uniform() - 0.5f;
        double t2 = bench_now();
        if (ag_backward_grad(ctx, o, seed) != AG_OK) bench_checked("bench_attention", ctx, NULL);
        double t3 = bench_now();
        ag_release(seed);
        ag_release(o);
        ag_zero_grad(q), ag_zero_grad(k), ag_zero_grad(v);
        if (i < 0) continue;
        fwd[i] = t1 - t0, bwd[i] = t3 - t2;
        r.peak = mp_get_counter(MP_ACTIVATION).peak - base;
    }
    ag_release(q), ag_release(k), ag_release(v);
    r.fwd = median(fwd, reps), r.bwd = median(bwd, reps);
    return r;
}

static void print_row(const char *name, int64_t T, int reps, result r) {
    printf("%6lld %-6s %5d %10.2f %10.2f %10.2f %12.1f\n", (long long)T, name, reps, 1e3 * r.fwd, 1e3 * r.bwd,
           1e3 * (r.fwd + r.bwd), (double)r.peak / 1e6);
}

int main(int argc, char **argv) {
    int reps = 5;
    bool eager_8192 = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-eager-8192") == 0)
            eager_8192 = false;
        else
            reps = atoi(argv[i]);
    }
    if (reps < 1 || reps > 64) {
        fprintf(stderr, "usage: bench_attention [reps 1..64] [--no-eager-8192]\n");
        return 2;
    }
    if (mp_init(&(mp_options){0}) != MP_OK) {
        fprintf(stderr, "bench_attention: the profiler did not start\n");
        return 1;
    }
    ag_ctx *ctx = ag_ctx_new();
    printf("bench_attention: one layer's causal GQA, 9/3 heads x 64, batch 1, float32 (lean)\n");
    printf("%6s %-6s %5s %10s %10s %10s %12s\n", "T", "op", "runs", "fwd ms", "bwd ms", "total ms", "act peak MB");
    const int64_t lengths[] = {512, 2048, 8192};
    for (int i = 0; i < 3; i++) {
        int64_t T = lengths[i];
        int n = T >= 8192 ? 1 : (T >= 2048 && reps > 3 ? 3 : reps);
        result f = run(ctx, AG_ATTENTION_FLASH, T, n);
        print_row("flash", T, n, f);
        if (T >= 8192 && !eager_8192) {
            printf("%6lld %-6s skipped (--no-eager-8192)\n", (long long)T, "eager");
            continue;
        }
        result e = run(ctx, AG_ATTENTION_EAGER, T, n);
        print_row("eager", T, n, e);
        printf("%6lld eager / flash: %.2fx time, %.1fx activation peak\n", (long long)T,
               (e.fwd + e.bwd) / (f.fwd + f.bwd), (double)e.peak / (double)f.peak);
    }
    ag_ctx_free(ctx);
    mp_shutdown();
    return 0;
}
