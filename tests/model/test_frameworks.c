// --framework's semantics change what is kept, never the math: the loss and every parameter's
// gradient under PYTORCH and PYTORCH_113 equal the lean ones (checked against PyTorch itself in
// e2e_golden), for tied and untied heads, batch 1 and 2, and a few entries against central
// finite differences.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

static llama_config tiny(bool tied) {
    llama_config c = {.hidden = 64,
                      .intermediate = 96,
                      .layers = 2,
                      .heads = 4,
                      .kv_heads = 2,
                      .head_dim = 16,
                      .vocab = 300,
                      .max_positions = 64,
                      .rope_theta = 10000,
                      .rms_eps = 1e-5,
                      .tied = tied};
    snprintf(c.name, sizeof c.name, "tiny");
    return c;
}

// Loss and gradients (copied into grads[nparams][numel]) of one forward and backward.
static float loss_and_grads(const llama_config *c, ag_framework fw, const int32_t *ids, int64_t B, int64_t T,
                            float ***grads) {
    ag_ctx *ctx = ag_ctx_new();
    ag_ctx_set_framework(ctx, fw);
    llama_model *m = NULL;
    ag_err err;
    assert_int_equal(llama_model_new(&m, ctx, c, &err), 0);
    llama_model_init_random(m, 3);
    ag_tensor *loss = llama_forward_loss(ctx, m, ids, B, T, &err);
    assert_non_null(loss);
    float l = ag_f32(loss)[0];
    assert_int_equal(ag_backward(ctx, loss), AG_OK);
    ag_release(loss);
    if (grads) {
        *grads = calloc(m->nparams, sizeof **grads);
        for (size_t i = 0; i < m->nparams; i++) {
            assert_non_null(m->params[i]->grad);
            (*grads)[i] = malloc((size_t)m->params[i]->numel * sizeof(float));
            memcpy((*grads)[i], m->params[i]->grad->data, (size_t)m->params[i]->numel * sizeof(float));
        }
    }
    llama_model_free(m);
    ag_ctx_free(ctx);
    return l;
}

static void compare_frameworks(bool tied, int64_t B, int64_t T) {
    llama_config c = tiny(tied);
    int32_t ids[64];
    for (int64_t i = 0; i < B * T; i++) ids[i] = (int32_t)((i * 37 + 11) % c.vocab);
    float **ref, **got;
    float l0 = loss_and_grads(&c, AG_FRAMEWORK_LEAN, ids, B, T, &ref);
    size_t n = llama_param_count_tensors(&c);
    for (ag_framework fw = AG_FRAMEWORK_PYTORCH; fw < AG_NFRAMEWORKS; fw++) {
        float l = loss_and_grads(&c, fw, ids, B, T, &got);
        assert_true(fabsf(l - l0) <= 1e-6f * fabsf(l0));
        for (size_t i = 0; i < n; i++) {
            char name[LLAMA_PARAM_NAME_MAX];
            int nd;
            int64_t sh[LLAMA_PARAM_MAX_DIMS];
            assert_int_equal(llama_param_spec(&c, i, name, sizeof name, &nd, sh), 0);
            int64_t numel = sh[0] * sh[1];
            double mx = 0, diff = 0;
            for (int64_t j = 0; j < numel; j++) {
                mx = fmax(mx, fabs(ref[i][j]));
                diff = fmax(diff, fabs((double)got[i][j] - ref[i][j]));
            }
            if (diff > 1e-5 * mx + 1e-9) print_error("%s: max diff %g of max %g\n", name, diff, mx);
            assert_true(diff <= 1e-5 * mx + 1e-9);
            free(got[i]);
        }
        free(got);
    }
    for (size_t i = 0; i < n; i++) free(ref[i]);
    free(ref);
}

static void test_same_gradients(void **state) {
    (void)state;
    mp_options o = {0};
    assert_int_equal(mp_init(&o), MP_OK);
    compare_frameworks(true, 1, 9);
    compare_frameworks(true, 2, 7);
    compare_frameworks(false, 2, 5);
    for (int c = 0; c < MP_OTHER; c++) assert_int_equal(mp_get_counter(c).live, 0);
    mp_shutdown();
}

// d loss / d w for a few entries under PYTORCH, by central differences of the float32 loss.
static void test_finite_differences(void **state) {
    (void)state;
    mp_options o = {0};
    assert_int_equal(mp_init(&o), MP_OK);
    llama_config c = tiny(true);
    const int64_t B = 2, T = 6;
    int32_t ids[12];
    for (int64_t i = 0; i < B * T; i++) ids[i] = (int32_t)((i * 53 + 5) % c.vocab);
    ag_ctx *ctx = ag_ctx_new();
    ag_ctx_set_framework(ctx, AG_FRAMEWORK_PYTORCH);
    llama_model *m = NULL;
    ag_err err;
    assert_int_equal(llama_model_new(&m, ctx, &c, &err), 0);
    llama_model_init_random(m, 5);
    ag_tensor *loss = llama_forward_loss(ctx, m, ids, B, T, &err);
    assert_int_equal(ag_backward(ctx, loss), AG_OK);
    ag_release(loss);
    ag_tensor *probe[] = {m->embed,       m->layers[0].q,    m->layers[0].k,
                          m->layers[1].v, m->layers[1].down, m->layers[0].input_norm};
    for (size_t p = 0; p < sizeof probe / sizeof *probe; p++)
        for (int k = 0; k < 3; k++) {
            // the embedding: rows the ids picked (its head gradient is dense, its lookup sparse)
            int64_t j = p == 0 ? (int64_t)ids[k] * c.hidden + 3 * k : (k * 97 + 13) % probe[p]->numel;
            float w = ag_f32(probe[p])[j], h = 1e-2f, g = ag_f32(probe[p]->grad)[j];
            ag_set_grad_enabled(ctx, false);
            ag_f32(probe[p])[j] = w + h;
            ag_tensor *lp = llama_forward_loss(ctx, m, ids, B, T, &err);
            ag_f32(probe[p])[j] = w - h;
            ag_tensor *lm = llama_forward_loss(ctx, m, ids, B, T, &err);
            ag_f32(probe[p])[j] = w;
            ag_set_grad_enabled(ctx, true);
            double fd = ((double)ag_f32(lp)[0] - ag_f32(lm)[0]) / (2.0 * h);
            ag_release(lp);
            ag_release(lm);
            if (fabs(fd - g) > 2e-3 + 0.05 * fabs(g))
                print_error("param %zu entry %lld: fd %g grad %g\n", p, (long long)j, fd, g);
            assert_true(fabs(fd - g) <= 2e-3 + 0.05 * fabs(g));
        }
    llama_model_free(m);
    ag_ctx_free(ctx);
    mp_shutdown();
}

// The forward's peak under PYTORCH semantics, meta mode: with use_cache (the default) the
// output's DynamicCache holds every layer's k and v until the loss is out.
static uint64_t forward_peak(const llama_config *c) {
    assert_int_equal(mp_init(&(mp_options){.meta = true}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    ag_ctx_set_framework(ctx, AG_FRAMEWORK_PYTORCH);
    llama_model *m = NULL;
    ag_err err;
    assert_int_equal(llama_model_new(&m, ctx, c, &err), 0);
    mp_set_phase(MP_PHASE_FORWARD);
    ag_tensor *loss = llama_forward_loss(ctx, m, NULL, 1, 32, &err);
    assert_non_null(loss);
    uint64_t peak = mp_get_phase_stats(MP_PHASE_FORWARD).peak;
    ag_release(loss);
    ag_tape_clear(ctx);
    llama_model_free(m);
    ag_ctx_free(ctx);
    mp_shutdown();
    return peak;
}

// config.json's use_cache: false drops the DynamicCache, and only it: k after RoPE and v of
// every layer, which nothing else keeps (repeat_kv copies them), at the loss.
static void test_use_cache(void **state) {
    (void)state;
    llama_config c = tiny(true);
    uint64_t with = forward_peak(&c);
    c.no_cache = true;
    uint64_t without = forward_peak(&c);
    const uint64_t kv = 2 * 2 * 32 * 2 * 16 * 4; // layers x (k, v) x tokens x kv heads x head_dim x 4
    print_message("forward peak %llu with the cache, %llu without\n", (unsigned long long)with,
                  (unsigned long long)without);
    assert_true(with > without);
    assert_int_equal(with - without, kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_same_gradients), cmocka_unit_test(test_finite_differences),
                                       cmocka_unit_test(test_use_cache)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
