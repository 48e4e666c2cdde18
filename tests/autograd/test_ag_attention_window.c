// Sliding-window attention (ag_attention_window, ag_attention_flash_window,
// ag_attention_cached_window): the eager op against a double-precision reference and finite
// differences, flash against eager (AVX-512 and portable, lean and PyTorch semantics, windows
// inside one tile and across tiles), the cached op (eager and flash) against the training op,
// and window 0 equal to plain causal attention to the bit.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ag_kernels.h"
#include "ag_test_util.h"

typedef struct {
    int64_t B, T;
    int Hq, Hkv, D;
    int64_t window;
} win_case;

static const char *SITE = "layers.0.self_attn";

static ag_tensor *g_window(ag_ctx *ctx, ag_tensor **in, const void *arg) {
    const win_case *c = arg;
    return ag_attention_window(ctx, SITE, in[0], in[1], in[2], c->Hq, c->Hkv, c->D, c->window);
}

// out[b, i, h] = Σ_{i - W < j <= i} softmax_j(cap(q·k scale)) v[b, j, g]; scale 0: 1 / sqrt(D),
// cap(s) = softcap tanh(s / softcap), or s when softcap is 0.
static void reference_capped(double *out, const float *q, const float *k, const float *v, const win_case *c,
                             double scale, double softcap) {
    int rep = c->Hq / c->Hkv;
    for (int64_t b = 0; b < c->B; b++)
        for (int h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->T; i++) {
                int g = h / rep;
                int64_t lo = c->window && i - c->window + 1 > 0 ? i - c->window + 1 : 0;
                double s[64], mx = -INFINITY, z = 0.0;
                const float *qi = q + ((b * c->T + i) * c->Hq + h) * c->D;
                for (int64_t j = lo; j <= i; j++) {
                    const float *kj = k + ((b * c->T + j) * c->Hkv + g) * c->D;
                    s[j] = 0.0;
                    for (int d = 0; d < c->D; d++) s[j] += (double)qi[d] * kj[d];
                    s[j] *= scale > 0.0 ? scale : 1.0 / sqrt((double)c->D);
                    if (softcap > 0.0) s[j] = softcap * tanh(s[j] / softcap);
                    mx = fmax(mx, s[j]);
                }
                for (int64_t j = lo; j <= i; j++) z += (s[j] = exp(s[j] - mx));
                double *o = out + ((b * c->T + i) * c->Hq + h) * c->D;
                for (int d = 0; d < c->D; d++) {
                    o[d] = 0.0;
                    for (int64_t j = lo; j <= i; j++) o[d] += s[j] / z * v[((b * c->T + j) * c->Hkv + g) * c->D + d];
                }
            }
}

static void reference(double *out, const float *q, const float *k, const float *v, const win_case *c) {
    reference_capped(out, q, k, v, c, 0.0, 0.0);
}

static void make_inputs(ag_ctx *ctx, const win_case *c, ag_tensor **in, bool leaves) {
    const int64_t sq[3] = {c->B, c->T, (int64_t)c->Hq * c->D}, skv[3] = {c->B, c->T, (int64_t)c->Hkv * c->D};
    const char *names[] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++) {
        in[i] = leaves ? ag_test_param(ctx, 3, i ? skv : sq, names[i], 41 + (uint64_t)i)
                       : ag_test_const(ctx, 3, i ? skv : sq, names[i], 41 + (uint64_t)i);
        ag_fill(in[i], 41 + (uint64_t)i, -2.0f, 2.0f);
        in[i]->requires_grad = true;
    }
}

static void test_eager_reference(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    const win_case cases[] = {
        {2, 7, 4, 2, 3, 1}, {2, 7, 4, 2, 3, 2}, {1, 9, 3, 1, 4, 3}, {2, 6, 2, 2, 3, 6}, {1, 8, 6, 2, 2, 5},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const win_case *c = &cases[k];
        ag_tensor *in[3];
        make_inputs(ctx, c, in, true);
        ag_tensor *o = g_window(ctx, in, c);
        assert_non_null(o);
        double ref[512];
        reference(ref, in[0]->data, in[1]->data, in[2]->data, c);
        assert_true(ag_max_diff(o->data, ref, o->numel) < 1e-5);
        // a window shorter than the sequence does change the output
        win_case causal = *c;
        causal.window = 0;
        double full[512];
        reference(full, in[0]->data, in[1]->data, in[2]->data, &causal);
        if (c->window < c->T) assert_true(ag_max_diff(o->data, full, o->numel) > 1e-3);
        ag_release(o);
        ag_tape_clear(ctx);
        ag_fd_check(ctx, g_window, c, 3, in);
        for (int i = 0; i < 3; i++) ag_release(in[i]);
    }
}

// Attention sinks (gpt_oss): one more logit per head in the denominator, with no value.
typedef struct {
    win_case c;
    float sink_scale; // the sinks drawn from [-sink_scale, sink_scale]
} sink_case;

static ag_tensor *g_sinks(ag_ctx *ctx, ag_tensor **in, const void *arg) {
    const win_case *c = arg;
    return ag_attention_sinks(ctx, SITE, in[0], in[1], in[2], c->Hq, c->Hkv, c->D, c->window, in[3]);
}

// reference() with each row's weights divided by (z + e^(sink - mx)) instead of z.
static void reference_sinks(double *out, const float *q, const float *k, const float *v, const float *sinks,
                            const win_case *c) {
    reference(out, q, k, v, c);
    int rep = c->Hq / c->Hkv;
    for (int64_t b = 0; b < c->B; b++)
        for (int h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->T; i++) {
                int64_t lo = c->window && i - c->window + 1 > 0 ? i - c->window + 1 : 0;
                const float *qi = q + ((b * c->T + i) * c->Hq + h) * c->D;
                double z = 0.0; // Σ e^s over the keys seen, against which the sink weighs
                for (int64_t j = lo; j <= i; j++) {
                    const float *kj = k + ((b * c->T + j) * c->Hkv + h / rep) * c->D;
                    double sj = 0.0;
                    for (int d = 0; d < c->D; d++) sj += (double)qi[d] * kj[d];
                    z += exp(sj / sqrt((double)c->D));
                }
                double keep = z / (z + exp((double)sinks[h]));
                double *o = out + ((b * c->T + i) * c->Hq + h) * c->D;
                for (int d = 0; d < c->D; d++) o[d] *= keep;
            }
}

static void test_sinks(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    const sink_case cases[] = {{{2, 7, 4, 2, 3, 0}, 1.0f}, {{2, 7, 4, 2, 3, 2}, 2.0f}, {{1, 9, 3, 1, 4, 3}, 0.5f}};
    for (size_t n = 0; n < sizeof cases / sizeof *cases; n++) {
        const win_case *c = &cases[n].c;
        ag_tensor *in[4];
        make_inputs(ctx, c, in, true);
        in[3] = ag_test_param(ctx, 1, (int64_t[]){c->Hq}, "sinks", 47);
        ag_fill(in[3], 47, -cases[n].sink_scale, cases[n].sink_scale);
        ag_tensor *o = g_sinks(ctx, in, c);
        assert_non_null(o);
        double ref[512], plain[512];
        reference_sinks(ref, in[0]->data, in[1]->data, in[2]->data, in[3]->data, c);
        reference(plain, in[0]->data, in[1]->data, in[2]->data, c);
        assert_true(ag_max_diff(o->data, ref, o->numel) < 1e-5);
        assert_true(ag_max_diff(o->data, plain, o->numel) > 1e-3); // the sinks do take their share
        ag_release(o);
        ag_tape_clear(ctx);
        ag_fd_check(ctx, g_sinks, c, 4, in); // q, k, v and the sinks
        for (int i = 0; i < 4; i++) ag_release(in[i]);
    }
    // the PyTorch frameworks' op-by-op attention with sinks is refused, naming the op
    ag_ctx *f = ag_ctx_new();
    ag_ctx_set_framework(f, AG_FRAMEWORK_PYTORCH);
    ag_tensor *in[4];
    make_inputs(f, &cases[0].c, in, false);
    in[3] = ag_test_const(f, 1, (int64_t[]){cases[0].c.Hq}, "sinks", 47);
    assert_null(g_sinks(f, in, &cases[0].c));
    assert_non_null(strstr(ag_ctx_error(f), "sinks"));
    for (int i = 0; i < 4; i++) ag_release(in[i]);
    ag_ctx_free(f);
}

// Output, dq, dk, dv of one forward and backward.
static void run(const win_case *c, ag_framework f, ag_attention_kind kind, float *res[4]) {
    ag_ctx *ctx = ag_ctx_new();
    ag_ctx_set_framework(ctx, f);
    ag_ctx_set_attention(ctx, kind);
    ag_tensor *in[3];
    make_inputs(ctx, c, in, false);
    ag_output_and_grads(ctx, g_window(ctx, in, c), in, 3, res);
    ag_ctx_free(ctx);
}

static const win_case CASES[] = {
    {2, 9, 4, 2, 4, 3},      // inside one tile
    {2, 70, 6, 2, 16, 64},   // the window one tile wide
    {1, 131, 3, 1, 64, 50},  // three key tiles, windows across their edges
    {2, 200, 4, 2, 32, 130}, // wider than two tiles
    {1, 150, 2, 2, 16, 1},   // each query sees itself alone
};

// Output, dq, dk, dv and dsinks of one forward and backward with sinks.
static void run_sinks(const win_case *c, ag_attention_kind kind, float *res[5]) {
    ag_ctx *ctx = ag_ctx_new();
    ag_ctx_set_attention(ctx, kind);
    ag_tensor *in[4];
    make_inputs(ctx, c, in, false);
    in[3] = ag_test_const(ctx, 1, (int64_t[]){c->Hq}, "sinks", 47);
    ag_fill(in[3], 47, -3.0f, 3.0f);
    in[3]->requires_grad = true;
    ag_output_and_grads(ctx, g_sinks(ctx, in, c), in, 4, res);
    ag_ctx_free(ctx);
}

// Flash attention with sinks (the sink added to each row's log-sum-exp after the pass) against
// the eager op, windows and tiles included; and its sinks' gradient against central differences.
static void test_sinks_flash(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++) {
        const win_case *c = &CASES[k];
        float *eager[5], *flash[5];
        run_sinks(c, AG_ATTENTION_EAGER, eager);
        run_sinks(c, AG_ATTENTION_FLASH, flash);
        int64_t nq = c->B * c->T * c->Hq * c->D, nkv = c->B * c->T * c->Hkv * c->D, n[5] = {nq, nq, nkv, nkv, c->Hq};
        for (int i = 0; i < 5; i++) {
            double r = ag_rel_diff(flash[i], eager[i], n[i]);
            if (!(r < 1e-5))
                fail_msg("case %zu: %s differs by %g", k, (const char *[]){"out", "dq", "dk", "dv", "dsinks"}[i], r);
            free(eager[i]), free(flash[i]);
        }
    }
}

static void flash_matches_eager(ag_framework f, ag_framework g) {
    for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++) {
        const win_case *c = &CASES[k];
        float *eager[4], *flash[4];
        run(c, f, AG_ATTENTION_EAGER, eager);
        run(c, g, AG_ATTENTION_FLASH, flash);
        int64_t nq = c->B * c->T * c->Hq * c->D, nkv = c->B * c->T * c->Hkv * c->D, n[4] = {nq, nq, nkv, nkv};
        for (int i = 0; i < 4; i++) {
            double r = ag_rel_diff(flash[i], eager[i], n[i]);
            if (!(r < 1e-5)) fail_msg("case %zu: %s differs by %g", k, (const char *[]){"out", "dq", "dk", "dv"}[i], r);
            free(eager[i]), free(flash[i]);
        }
    }
}

static void test_flash_matches_eager(void **state) {
    (void)state;
    flash_matches_eager(AG_FRAMEWORK_LEAN, AG_FRAMEWORK_LEAN);
    flash_matches_eager(AG_FRAMEWORK_PYTORCH, AG_FRAMEWORK_PYTORCH);
    flash_matches_eager(AG_FRAMEWORK_LEAN, AG_FRAMEWORK_PYTORCH); // eager under PyTorch's mask, too
    ag_flash_force_portable(true);
    flash_matches_eager(AG_FRAMEWORK_LEAN, AG_FRAMEWORK_LEAN);
    ag_flash_force_portable(false);
}

// Window 0 is causal attention itself.
static void test_window_zero(void **state) {
    (void)state;
    const win_case c = {2, 70, 6, 2, 16, 0};
    for (int kind = 0; kind < 2; kind++) {
        float *a[4], *b[4];
        run(&c, AG_FRAMEWORK_LEAN, kind ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER, a);
        ag_ctx *ctx = ag_ctx_new();
        ag_ctx_set_attention(ctx, kind ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER);
        ag_tensor *in[3];
        make_inputs(ctx, &c, in, false);
        ag_tensor *o = ag_attention(ctx, SITE, in[0], in[1], in[2], c.Hq, c.Hkv, c.D);
        b[0] = ag_copy_of(o);
        assert_memory_equal(a[0], b[0], (size_t)o->numel * sizeof(float));
        ag_release(o);
        for (int i = 0; i < 3; i++) ag_release(in[i]);
        ag_ctx_free(ctx);
        for (int i = 0; i < 4; i++) free(a[i]);
        free(b[0]);
    }
}

// The cache: a prefill of T tokens (every query) then decode steps of one, under eager and flash,
// against the training op over the whole sequence.
// sinks: gpt_oss's, against the training op with the same sinks (run_sinks').
static void cached_matches(ag_framework f, ag_attention_kind kind, const win_case *c, bool sinks) {
    float *train[5] = {NULL};
    if (sinks)
        run_sinks(c, AG_ATTENTION_EAGER, train);
    else
        run(c, AG_FRAMEWORK_LEAN, AG_ATTENTION_EAGER, train);
    ag_ctx *ctx = ag_ctx_new();
    ag_ctx_set_framework(ctx, f);
    ag_ctx_set_attention(ctx, kind);
    ag_set_grad_enabled(ctx, false);
    ag_tensor *in[4];
    make_inputs(ctx, c, in, false);
    in[3] = ag_test_const(ctx, 1, (int64_t[]){c->Hq}, "sinks", 47);
    ag_fill(in[3], 47, -3.0f, 3.0f);
    const int64_t prefill = c->T - 3, wq = (int64_t)c->Hq * c->D, wk = (int64_t)c->Hkv * c->D;
    ag_kv_cache *cache = ag_kv_cache_new(ctx, SITE, MP_CACHE, c->B, c->Hkv, c->D);
    for (int64_t t0 = 0; t0 < c->T; t0 += t0 ? 1 : prefill) {
        int64_t t = t0 ? 1 : prefill;
        ag_tensor *part[3];
        for (int i = 0; i < 3; i++) {
            int64_t w = i ? wk : wq;
            part[i] = ag_tensor_new(ctx, 3, (int64_t[]){c->B, t, w}, MP_ACTIVATION, "test:part");
            for (int64_t b = 0; b < c->B; b++)
                memcpy(ag_f32(part[i]) + b * t * w, ag_f32(in[i]) + (b * c->T + t0) * w,
                       (size_t)(t * w) * sizeof(float));
        }
        assert_true(ag_kv_cache_append(ctx, cache, part[1], part[2]));
        ag_tensor *o =
            ag_attention_cached_sinks(ctx, SITE, part[0], cache, NULL, 0, c->Hq, c->window, sinks ? in[3] : NULL);
        if (!o) fail_msg("attention_cached: %s", ag_ctx_error(ctx));
        for (int64_t b = 0; b < c->B; b++) {
            const float *want = train[0] + (b * c->T + t0) * wq;
            float *got = ag_f32(o) + b * t * wq;
            double r = ag_rel_diff(got, want, t * wq);
            if (!(r < 1e-5))
                fail_msg("window %lld, tokens from %lld: differs by %g", (long long)c->window, (long long)t0, r);
        }
        ag_release(o);
        for (int i = 0; i < 3; i++) ag_release(part[i]);
    }
    ag_kv_cache_free(cache);
    for (int i = 0; i < 4; i++) ag_release(in[i]);
    ag_ctx_free(ctx);
    for (int i = 0; i < 5; i++) free(train[i]);
}

static void test_cached(void **state) {
    (void)state;
    // D 64 and 128: a decode step's one query row takes the cached op's single sweep.
    const win_case cases[] = {{2, 12, 4, 2, 8, 4},  {1, 140, 4, 2, 16, 70}, {1, 20, 2, 1, 8, 1},
                              {2, 12, 4, 2, 64, 4}, {1, 30, 6, 2, 128, 0},  {2, 41, 6, 3, 64, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        for (int f = 0; f < 2; f++)
            for (int kind = 0; kind < 2; kind++)
                cached_matches(f ? AG_FRAMEWORK_PYTORCH : AG_FRAMEWORK_LEAN,
                               kind ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER, &cases[k], false);
    // gpt_oss's sinks (lean): the decode sweep (D 64, 128), chunks and tiles, eager and flash
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        for (int kind = 0; kind < 2; kind++)
            cached_matches(AG_FRAMEWORK_LEAN, kind ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER, &cases[k], true);
}

static int setup_plain(void **state) {
    (void)state;
    mp_options o = {0};
    return mp_init(&o) == MP_OK ? 0 : -1;
}

static int teardown_plain(void **state) {
    (void)state;
    mp_shutdown();
    return 0;
}

typedef struct {
    win_case w;
    ag_attention_spec spec;
} cap_case;

static ag_tensor *g_capped(ag_ctx *ctx, ag_tensor **in, const void *arg) {
    const cap_case *c = arg;
    return ag_attention_spec_run(ctx, SITE, in[0], in[1], in[2], c->w.Hq, c->w.Hkv, c->w.D, &c->spec);
}

// Gemma 2's attention: a scale of its own and the scores soft-capped (tanh) before the softmax,
// with and without a window, against the reference and central differences, under LEAN (the fused
// op recomputing the scores in backward) and PYTORCH (transformers' ops, tanh's output kept);
// flash refuses it by name.
static void test_softcap(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    const cap_case cases[] = {
        {{2, 7, 4, 2, 3, 0}, {0, 0.5f, 1.5f}},
        {{1, 9, 2, 1, 4, 3}, {3, 0.7f, 1.0f}},
        {{2, 6, 2, 2, 3, 0}, {0, 0.3f, 0.0f}},
    };
    for (int f = 0; f < 2; f++) {
        ag_ctx_set_framework(ctx, f ? AG_FRAMEWORK_PYTORCH : AG_FRAMEWORK_LEAN);
        for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
            const cap_case *c = &cases[k];
            ag_tensor *in[3];
            make_inputs(ctx, &c->w, in, true);
            ag_tensor *o = g_capped(ctx, in, c);
            assert_non_null(o);
            double ref[512], plain[512];
            reference_capped(ref, in[0]->data, in[1]->data, in[2]->data, &c->w, c->spec.scale, c->spec.softcap);
            reference(plain, in[0]->data, in[1]->data, in[2]->data, &c->w);
            assert_true(ag_max_diff(o->data, ref, o->numel) < 1e-5);
            assert_true(ag_max_diff(o->data, plain, o->numel) > 1e-3); // the scale and cap change it
            ag_release(o);
            ag_tape_clear(ctx);
            ag_fd_check(ctx, g_capped, c, 3, in);
            for (int i = 0; i < 3; i++) ag_release(in[i]);
        }
    }
    ag_ctx_set_framework(ctx, AG_FRAMEWORK_LEAN);
    ag_ctx_set_attention(ctx, AG_ATTENTION_FLASH);
    ag_tensor *in[3];
    make_inputs(ctx, &cases[0].w, in, true);
    assert_null(g_capped(ctx, in, &cases[0]));
    assert_non_null(strstr(ag_ctx_error(ctx), "flash attention with a scale of its own or a soft-cap"));
    ag_ctx_clear_error(ctx);
    ag_ctx_set_attention(ctx, AG_ATTENTION_EAGER);
    for (int i = 0; i < 3; i++) ag_release(in[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_eager_reference, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_sinks, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_sinks_flash, setup_plain, teardown_plain),
        cmocka_unit_test_setup_teardown(test_softcap, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_flash_matches_eager, setup_plain, teardown_plain),
        cmocka_unit_test_setup_teardown(test_window_zero, setup_plain, teardown_plain),
        cmocka_unit_test_setup_teardown(test_cached, setup_plain, teardown_plain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
