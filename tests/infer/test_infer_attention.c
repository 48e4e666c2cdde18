// The cached attention op and its cache: against the training op's eager attention on the same
// keys and values, against a float64 reference with a key mask, the cache's layout and bill,
// meta mode, and what it refuses.
#include <math.h>

#include "infer_util.h"

enum { B = 2, HQ = 4, HKV = 2, D = 12 }; // D not a multiple of 8: the loops' tails run too

static float value(uint64_t seed, int64_t i) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ULL + (uint64_t)i * 0xbf58476d1ce4e5b9ULL;
    z ^= z >> 31;
    z *= 0x94d049bb133111ebULL;
    z ^= z >> 29;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static ag_tensor *tensor(ag_ctx *ctx, int64_t t, int heads, uint64_t seed, const char *site) {
    ag_tensor *x = ag_tensor_new(ctx, 3, (int64_t[]){B, t, (int64_t)heads * D}, MP_ACTIVATION, site);
    assert_non_null(x);
    for (int64_t i = 0; x->data && i < x->numel; i++) ag_f32(x)[i] = 2.0f * value(seed, i);
    return x;
}

// Rows [from, from + t) of x[B, T, W] as a new tensor.
static ag_tensor *rows(ag_ctx *ctx, const ag_tensor *x, int64_t from, int64_t t) {
    int64_t T = x->shape[1], W = x->shape[2];
    ag_tensor *y = ag_tensor_new(ctx, 3, (int64_t[]){B, t, W}, MP_ACTIVATION, "rows");
    assert_non_null(y);
    for (int64_t b = 0; b < B; b++)
        memcpy(ag_f32(y) + b * t * W, ag_f32(x) + (b * T + from) * W, (size_t)(t * W) * sizeof(float));
    return y;
}

static void setup(void) { assert_int_equal(mp_init(&(mp_options){0}), MP_OK); }

static void teardown(ag_ctx *ctx) {
    ag_ctx_free(ctx);
    assert_int_equal(mp_live_total() - it_live(MP_OTHER), 0);
    mp_shutdown();
}

static double max_diff(const ag_tensor *a, const ag_tensor *b) {
    assert_int_equal(a->numel, b->numel);
    double m = 0;
    for (int64_t i = 0; i < a->numel; i++) {
        double d = fabs((double)ag_f32(a)[i] - ag_f32(b)[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

// Chunks of 20 (read through sgemm), then 3, 1 and 1 tokens (read by loops): after each
// append, the queries of the new tokens give what ag_attention gives over the whole prefix.
static void test_matches_eager(void **s) {
    (void)s;
    setup();
    ag_ctx *ctx = ag_ctx_new();
    ag_set_grad_enabled(ctx, false);
    const int64_t sizes[] = {20, 3, 1, 1}, total = 25;
    ag_tensor *q = tensor(ctx, total, HQ, 1, "q"), *k = tensor(ctx, total, HKV, 2, "k"),
              *v = tensor(ctx, total, HKV, 3, "v");
    ag_kv_cache *c = ag_kv_cache_new(ctx, "layers.0.self_attn", MP_CACHE, B, HKV, D);
    assert_non_null(c);
    int64_t done = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        int64_t t = sizes[i];
        ag_tensor *kn = rows(ctx, k, done, t), *vn = rows(ctx, v, done, t);
        assert_true(ag_kv_cache_append(ctx, c, kn, vn));
        ag_release(kn);
        ag_release(vn);
        done += t;
        assert_int_equal(ag_kv_cache_tokens(c), done);
        assert_int_equal(it_live(MP_CACHE), 2 * B * HKV * D * done * 4);
        ag_tensor *qn = rows(ctx, q, done - t, t), *kp = rows(ctx, k, 0, done), *vp = rows(ctx, v, 0, done);
        ag_tensor *got = ag_attention_cached(ctx, "layers.0.self_attn", qn, c, NULL, 0, HQ);
        ag_tensor *want = ag_attention(ctx, "eager", qn, kp, vp, HQ, HKV, D);
        assert_non_null(got);
        assert_non_null(want);
        double e = max_diff(got, want);
        if (!(e < 1e-5)) fail_msg("after %lld tokens: max|cached - eager| = %g", (long long)done, e);
        ag_release(got), ag_release(want), ag_release(qn), ag_release(kp), ag_release(vp);
    }
    assert_int_equal(ag_kv_cache_chunks(c), 4);
    // The cache reads back as [B, Hkv, tokens, D]: HF's layout.
    float *kc = malloc(sizeof(float) * B * HKV * total * D);
    assert_true(ag_kv_cache_read(c, false, kc));
    for (int b = 0; b < B; b++)
        for (int g = 0; g < HKV; g++)
            for (int t = 0; t < total; t++)
                for (int d = 0; d < D; d++)
                    assert_true(kc[((b * HKV + g) * total + t) * D + d] ==
                                ag_f32(k)[((b * total + t) * HKV + g) * D + d]);
    free(kc);
    ag_kv_cache_free(c);
    assert_int_equal(it_live(MP_CACHE), 0);
    ag_release(q), ag_release(k), ag_release(v);
    teardown(ctx);
}

// float64 reference of one query (b, h, i) over Tk keys with a key mask.
static void reference(double *out, const float *q, const float *k, const float *v, const int32_t *mask, int64_t Tq,
                      int64_t Tk, int64_t b, int h, int64_t i) {
    int g = h / (HQ / HKV);
    double sc[64], mx = -INFINITY, sum = 0;
    int64_t pos = Tk - Tq + i;
    for (int64_t j = 0; j < Tk; j++) {
        sc[j] = -INFINITY;
        if (j > pos || !mask[b * Tk + j]) continue;
        double dot = 0;
        for (int d = 0; d < D; d++)
            dot += (double)q[((b * Tq + i) * HQ + h) * D + d] * k[((b * Tk + j) * HKV + g) * D + d];
        sc[j] = dot / sqrt((double)D);
        mx = fmax(mx, sc[j]);
    }
    for (int d = 0; d < D; d++) out[d] = 0;
    for (int64_t j = 0; j < Tk; j++) sum += isinf(sc[j]) ? 0 : exp(sc[j] - mx);
    for (int64_t j = 0; j < Tk; j++) {
        if (isinf(sc[j])) continue;
        double p = exp(sc[j] - mx) / sum;
        for (int d = 0; d < D; d++) out[d] += p * v[((b * Tk + j) * HKV + g) * D + d];
    }
}

// Row 1 is left-padded by 3: its pad keys are hidden from every query; a pad query that sees
// no real key gives zeros; the real queries match the reference.
static void test_key_mask(void **s) {
    (void)s;
    setup();
    ag_ctx *ctx = ag_ctx_new();
    ag_set_grad_enabled(ctx, false);
    enum { T = 9 };
    int32_t mask[B * T] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1};
    ag_tensor *q = tensor(ctx, T, HQ, 4, "q"), *k = tensor(ctx, T, HKV, 5, "k"), *v = tensor(ctx, T, HKV, 6, "v");
    ag_kv_cache *c = ag_kv_cache_new(ctx, "l", MP_ACTIVATION, B, HKV, D);
    ag_tensor *k1 = rows(ctx, k, 0, 5), *v1 = rows(ctx, v, 0, 5);
    ag_tensor *k2 = rows(ctx, k, 5, 4), *v2 = rows(ctx, v, 5, 4);
    assert_true(ag_kv_cache_append(ctx, c, k1, v1));
    assert_true(ag_kv_cache_append(ctx, c, k2, v2));
    assert_int_equal(it_live(MP_CACHE), 0); // billed to the category asked for
    ag_tensor *qn = rows(ctx, q, 3, 6);     // the last 6 queries: positions 3 .. 8
    ag_tensor *o = ag_attention_cached(ctx, "l", qn, c, mask, T, HQ);
    assert_non_null(o);
    double worst = 0;
    for (int64_t b = 0; b < B; b++)
        for (int h = 0; h < HQ; h++)
            for (int64_t i = 0; i < 6; i++) {
                double ref[D];
                reference(ref, qn->data, k->data, v->data, mask, 6, T, b, h, i);
                for (int d = 0; d < D; d++)
                    worst = fmax(worst, fabs(ref[d] - ag_f32(o)[((b * 6 + i) * HQ + h) * D + d]));
            }
    if (!(worst < 1e-5)) fail_msg("max|cached - float64| = %g", worst);
    // Without the mask, row 1's real queries read the pads and differ.
    ag_tensor *u = ag_attention_cached(ctx, "l", qn, c, NULL, 0, HQ);
    assert_true(fabs(ag_f32(u)[(6 + 5) * HQ * D] - ag_f32(o)[(6 + 5) * HQ * D]) > 1e-3);
    // A query that sees only pads (row 1, position 1, as the 2-token prefix of the cache).
    ag_kv_cache *p = ag_kv_cache_new(ctx, "p", MP_ACTIVATION, B, HKV, D);
    ag_tensor *k0 = rows(ctx, k, 0, 2), *v0 = rows(ctx, v, 0, 2), *q0 = rows(ctx, q, 0, 2);
    assert_true(ag_kv_cache_append(ctx, p, k0, v0));
    ag_tensor *z = ag_attention_cached(ctx, "p", q0, p, mask, T, HQ);
    for (int64_t j = 2 * HQ * D; j < 4 * HQ * D; j++) assert_true(ag_f32(z)[j] == 0.0f);
    for (int64_t j = 0; j < 2 * HQ * D; j++) assert_true(isfinite(ag_f32(z)[j]));
    ag_release(z), ag_release(k0), ag_release(v0), ag_release(q0), ag_kv_cache_free(p);
    ag_release(u), ag_release(o), ag_release(qn);
    ag_release(k1), ag_release(v1), ag_release(k2), ag_release(v2);
    ag_release(q), ag_release(k), ag_release(v);
    ag_kv_cache_free(c);
    teardown(ctx);
}

// Meta mode: the same bytes, the probabilities a temporary of [B, Hq, Tq, Tk].
static void test_meta(void **s) {
    (void)s;
    assert_int_equal(mp_init(&(mp_options){.meta = true}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    ag_set_grad_enabled(ctx, false);
    ag_tensor *k = tensor(ctx, 30, HKV, 0, "k"), *v = tensor(ctx, 30, HKV, 0, "v");
    ag_tensor *q = tensor(ctx, 1, HQ, 0, "q");
    ag_kv_cache *c = ag_kv_cache_new(ctx, "m", MP_CACHE, B, HKV, D);
    assert_true(ag_kv_cache_append(ctx, c, k, v));
    uint64_t usable;
    assert_int_equal(ag_kv_cache_bytes(c, &usable), 2 * B * HKV * 30 * D * 4);
    assert_int_equal(usable, 2 * B * HKV * 30 * D * 4);
    assert_false(ag_kv_cache_read(c, false, (float[1]){0}));
    uint64_t before = it_live(MP_ACTIVATION);
    mp_reset_peaks();
    ag_tensor *o = ag_attention_cached(ctx, "m", q, c, NULL, 0, HQ);
    assert_non_null(o);
    assert_null(o->data);
    assert_int_equal(it_live(MP_ACTIVATION) - before, B * HQ * D * 4); // the output alone
    assert_int_equal(mp_get_counter(MP_ACTIVATION).peak - before, B * HQ * D * 4 + B * HQ * 1 * 30 * 4);
    ag_release(o), ag_release(q), ag_release(k), ag_release(v);
    ag_kv_cache_free(c);
    teardown(ctx);
}

// Refused: grad mode on, a q that does not fit, more queries than cached tokens, a short mask.
static void test_errors(void **s) {
    (void)s;
    setup();
    ag_ctx *ctx = ag_ctx_new();
    ag_set_grad_enabled(ctx, false);
    ag_tensor *k = tensor(ctx, 3, HKV, 1, "k"), *v = tensor(ctx, 3, HKV, 2, "v");
    ag_tensor *q = tensor(ctx, 3, HQ, 3, "q");
    ag_tensor *q4 = tensor(ctx, 4, HQ, 3, "q4");
    ag_kv_cache *c = ag_kv_cache_new(ctx, "e", MP_CACHE, B, HKV, D);
    assert_true(ag_kv_cache_append(ctx, c, k, v));
    struct {
        ag_tensor *q;
        int hq;
        const int32_t *mask;
        int64_t ld;
        bool grad;
        const char *needle;
    } cases[] = {
        {q, HQ, NULL, 0, true, "grad mode"},
        {q, 3, NULL, 0, false, "does not fit 3 query heads"},
        {q4, HQ, NULL, 0, false, "Tq <= cached tokens"},
        {q, HQ, (int32_t[4]){1, 1, 1, 1}, 2, false, "key mask rows of 2 entries"},
        {k, HQ, NULL, 0, false, "does not fit"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ag_set_grad_enabled(ctx, cases[i].grad);
        assert_null(ag_attention_cached(ctx, "e", cases[i].q, c, cases[i].mask, cases[i].ld, cases[i].hq));
        assert_int_not_equal(ag_ctx_status(ctx), AG_OK);
        it_mentions(ag_ctx_error(ctx), cases[i].needle);
        ag_ctx_clear_error(ctx);
    }
    ag_set_grad_enabled(ctx, true);
    assert_false(ag_kv_cache_append(ctx, c, k, v));
    it_mentions(ag_ctx_error(ctx), "grad mode");
    ag_ctx_clear_error(ctx);
    ag_set_grad_enabled(ctx, false);
    assert_false(ag_kv_cache_append(ctx, c, q, v));
    it_mentions(ag_ctx_error(ctx), "expected both [2, t, 24]");
    ag_ctx_clear_error(ctx);
    assert_int_equal(ag_kv_cache_tokens(c), 3); // nothing appended by the refusals
    assert_int_equal(it_live(MP_CACHE), 2 * B * HKV * 3 * D * 4);
    ag_kv_cache_free(c);
    ag_release(k), ag_release(v), ag_release(q), ag_release(q4);
    teardown(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_eager),
        cmocka_unit_test(test_key_mask),
        cmocka_unit_test(test_meta),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
