// QLoRA end to end against tests/reference/qlora_ref.py: the tiny untied model with its blocks'
// linear weights in NF4 (bitsandbytes' layout, double-quantised), frozen, the golden adapters of
// tests/golden/tiny_lora on all seven projections. The NF4 weights dequantise to the reference's
// values (to float32's rounding of the absmaxes' mean) and hold the layout's bytes; loss, every adapter gradient and
// the adapters after two Adam steps in float32 and in bfloat16 compute; meta mode's bill equal to the real one in every
// category for each low-bit base, dtype and framework; a quantised weight that asks for a gradient refused.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/ag_nf4.h"
#include "model.h"
#include "optim.h"

#include "golden_util.h"

#ifndef MEMBILL_GOLDEN_DIR
#error "MEMBILL_GOLDEN_DIR must name the tests/golden folder"
#endif

#define B 2
#define T 7
#define RANK 4

// float32 compute: the reference's own float32 math on the same dequantised values, so the
// tolerances of the float32 LoRA test (e2e_lora) hold.
#define F32_LOSS_RTOL 1e-5
#define F32_TOL 1e-4 // x max|golden|
// bfloat16 compute: every op's output is rounded to 8 bits of mantissa (relative steps of 2^-8
// to 2^-7), and the two sides round at different places (PyTorch's CPU kernels round some
// intermediate sums to bfloat16, membill's accumulate in float32 and round once), so a gradient
// differs by a few roundings of its largest terms: measured up to 4.9% of max|golden| over the
// tiny model, against the order-one change a wrong dequantisation or a missing dx makes. The
// loss (float32 log-sum-exp over bfloat16 logits) measured within 0.16%.
#define BF16_LOSS_RTOL 3e-3
#define BF16_TOL 6e-2
// Two Adam steps of lr 1e-3. In float32 the adapters' move itself (adapter - start) is compared:
// measured within 8e-4 of max|move| (an element whose gradient is near eps amplifies the last bits).
// In bfloat16 a step of 1e-3 is one or two ulps of an adapter near max|A| (0.125), so the
// adapters themselves are compared: within a few ulps (measured 2.6% of max|golden|); float32's
// comparison is the one that checks the steps.
#define F32_ADAM_TOL 2e-3  // x max|move|
#define BF16_ADAM_TOL 4e-2 // x max|golden|

static const char *const ADAPTER_DIR = MEMBILL_GOLDEN_DIR "/tiny_lora";
static const char *const GOLDEN = MEMBILL_GOLDEN_DIR "/tiny_qlora/golden.safetensors";

typedef enum { BASE_NF4, BASE_INT4, BASE_INT8 } base_kind;

typedef struct {
    ag_ctx *ctx;
    llama_model *m;
    llama_st_file *g;
    int32_t ids[B * T];
} run;

static uint64_t live(mp_category c) { return mp_get_counter(c).live; }

static ag_precision compute(bool bf16, bool mixed) {
    ag_precision p = ag_precision_f32();
    if (bf16) p.act_bits = p.weight_bits = p.grad_bits = 16;
    (void)mixed;
    return p;
}

// The frozen base's storage over the compute precision, as the command line sets it.
static ag_precision base_precision(ag_precision p, base_kind k) {
    p.group = 0, p.scale_bytes = 0, p.nf4 = false;
    if (k == BASE_NF4)
        p.weight_bits = 4, p.nf4 = true;
    else if (k == BASE_INT4)
        p.weight_bits = 4, p.group = 64, p.scale_bytes = 2;
    else
        p.weight_bits = 8, p.group = (int64_t)1 << 40, p.scale_bytes = 4;
    return p;
}

static void run_open(run *r, bool meta, ag_framework fw, ag_precision p, base_kind k) {
    memset(r, 0, sizeof *r);
    assert_int_equal(mp_init(&(mp_options){.meta = meta}), MP_OK);
    r->ctx = ag_ctx_new();
    ag_ctx_set_framework(r->ctx, fw);
    assert_true(ag_ctx_set_precision(r->ctx, &p));
    llama_config cfg;
    ag_err err = {{0}};
    if (llama_config_load(&cfg, MEMBILL_GOLDEN_DIR "/tiny_untied/config.json", &err) != 0) fail_msg("%s", err.msg);
    ag_precision bp = base_precision(p, k);
    if (llama_model_new_proj_dtype(&r->m, r->ctx, &cfg, &bp, &err) != 0) fail_msg("%s", err.msg);
    if (!meta && llama_model_load(r->m, MEMBILL_GOLDEN_DIR "/tiny_untied/model.safetensors", &err) != 0)
        fail_msg("%s", err.msg);
    llama_lora_config l = {.rank = RANK, .alpha = 8.0, .targets = LLAMA_LORA_ALL, .dropout = 0.0};
    if (llama_model_add_lora(r->m, r->ctx, &l, 7, &err) != 0) fail_msg("%s", err.msg);
    if (meta) return;
    if (llama_adapter_load(r->m, ADAPTER_DIR, &err) != 0) fail_msg("%s", err.msg);
    if (llama_st_open(&r->g, GOLDEN, &err) != 0) fail_msg("%s", err.msg);
    golden_ids_of(r->g, r->ids, B, T);
}

static void run_close(run *r) {
    llama_st_close(r->g);
    llama_model_free(r->m);
    ag_ctx_free(r->ctx);
    for (int c = 0; c < MP_OTHER; c++) assert_int_equal(mp_get_counter(c).live, 0);
    mp_shutdown();
}

static bool is_base_matrix(const ag_tensor *p) {
    return p->ndim == 2 && strncmp(ag_tensor_name(p), "model.layers.", 13) == 0;
}

static float step(run *r) {
    ag_err err = {{0}};
    ag_tensor *loss = llama_forward_loss(r->ctx, r->m, r->ids, B, T, &err);
    if (!loss) fail_msg("%s", err.msg);
    if (ag_backward(r->ctx, loss) != AG_OK) fail_msg("%s", ag_ctx_error(r->ctx));
    float l = 0;
    if (loss->data) ag_tensor_row_f32(loss, 0, &l);
    ag_release(loss);
    return l;
}

// Each adapter (its gradient, or its move from `start` when given) against golden "<key>.<name>".
static void check_adapters(const run *r, const char *prefix, bool grads, float *const *start, double tol) {
    assert_int_equal(r->m->nadapters, 2 * 7 * 2);
    for (size_t i = 0; i < r->m->nadapters; i++) {
        const ag_tensor *a = r->m->adapters[i], *src = grads ? a->grad : a;
        char key[256];
        snprintf(key, sizeof key, "%s.base_model.model.%s", prefix, ag_tensor_name(a));
        size_t n;
        float *want = golden_f32(r->g, key, &n), *got = malloc(n * sizeof *got);
        assert_non_null(src);
        assert_non_null(got);
        assert_int_equal(n, (size_t)a->numel);
        ag_tensor_to_f32(src, got);
        double mx = 0, diff = 0;
        for (size_t j = 0; j < n; j++) {
            double w = want[j], g = got[j];
            if (start) w -= start[i][j], g -= start[i][j];
            mx = fmax(mx, fabs(w));
            diff = fmax(diff, fabs(w - g));
        }
        if (!(mx > 0) || diff > tol * mx) fail_msg("%s: max diff %.3g, max|golden| %.3g", key, diff, mx);
        free(want);
        free(got);
    }
}

static void check_loss(const run *r, const char *key, size_t k, float got, double rtol) {
    size_t n;
    float *want = golden_f32(r->g, key, &n);
    assert_true(k < n);
    if (!(fabs(got - want[k]) <= rtol * fabs(want[k])))
        fail_msg("%s[%zu]: got %.7g, golden %.7g", key, k, got, want[k]);
    free(want);
}

// The NF4 weights: each the reference's dequantised values bit for bit, and the layout's bytes;
// the weight category is exactly the NF4 base, the rest in float32 and the adapters.
static void test_nf4_weights(void **s) {
    (void)s;
    run r;
    run_open(&r, false, AG_FRAMEWORK_LEAN, compute(false, false), BASE_NF4);
    uint64_t want_bytes = 0;
    int nf4 = 0;
    for (size_t i = 0; i < r.m->nparams; i++) {
        const ag_tensor *p = r.m->params[i];
        if (!is_base_matrix(p)) {
            assert_int_equal(p->dtype, AG_F32);
            want_bytes += (uint64_t)p->numel * 4;
            continue;
        }
        nf4++;
        assert_int_equal(p->dtype, AG_NF4);
        assert_false(p->requires_grad);
        assert_int_equal(p->block.bytes, ag_nf4_layout_of((uint64_t)p->numel).total);
        want_bytes += ag_nf4_layout_of((uint64_t)p->numel).total;
        char key[256];
        snprintf(key, sizeof key, "deq.%s", ag_tensor_name(p));
        size_t n;
        float *want = golden_f32(r.g, key, &n), *got = malloc(n * sizeof *got);
        assert_int_equal(n, (size_t)p->numel);
        ag_tensor_to_f32(p, got);
        for (size_t j = 0; j < n; j++) // the offset is a float32 mean: PyTorch sums in another order
            if (!(fabsf(got[j] - want[j]) <= 1e-6f * fabsf(want[j])))
                fail_msg("%s[%zu]: %.9g, reference %.9g", ag_tensor_name(p), j, got[j], want[j]);
        free(want);
        free(got);
    }
    assert_int_equal(nf4, 2 * 7);
    for (size_t i = 0; i < r.m->nadapters; i++) want_bytes += (uint64_t)r.m->adapters[i]->numel * 4;
    assert_int_equal(live(MP_WEIGHT), want_bytes);
    run_close(&r);
}

static void grads_as(ag_framework fw, bool bf16) {
    run r;
    run_open(&r, false, fw, compute(bf16, false), BASE_NF4);
    const char *tag = bf16 ? "bf16" : "fp32";
    char key[64];
    float l = step(&r);
    snprintf(key, sizeof key, "%s.loss", tag);
    check_loss(&r, key, 0, l, bf16 ? BF16_LOSS_RTOL : F32_LOSS_RTOL);
    snprintf(key, sizeof key, "%s.grad", tag);
    check_adapters(&r, key, true, NULL, bf16 ? BF16_TOL : F32_TOL);
    for (size_t i = 0; i < r.m->nparams; i++) assert_null(r.m->params[i]->grad); // nothing for the base
    uint64_t ad = llama_model_trainable_count(r.m);
    assert_int_equal(live(MP_GRADIENT), ad * (bf16 ? 2 : 4));
    run_close(&r);
}

static void test_grads_fp32_lean(void **s) {
    (void)s;
    grads_as(AG_FRAMEWORK_LEAN, false);
}
static void test_grads_fp32_pytorch(void **s) {
    (void)s;
    grads_as(AG_FRAMEWORK_PYTORCH, false);
}
static void test_grads_bf16_lean(void **s) {
    (void)s;
    grads_as(AG_FRAMEWORK_LEAN, true);
}
static void test_grads_bf16_pytorch(void **s) {
    (void)s;
    grads_as(AG_FRAMEWORK_PYTORCH, true);
}

static void adam_as(bool bf16) {
    run r;
    run_open(&r, false, AG_FRAMEWORK_PYTORCH, compute(bf16, false), BASE_NF4);
    ag_err err = {{0}};
    optim_config oc = optim_defaults(OPTIM_ADAM);
    oc.adam_impl = OPTIM_ADAM_FOR_LOOP;
    oc.state_bits = bf16 ? 16 : 32;
    optim *o = optim_new(&oc, r.m->trainable, r.m->ntrainable, &err);
    assert_non_null(o);
    float *start[2 * 7 * 2];
    for (size_t i = 0; i < r.m->nadapters; i++) {
        start[i] = malloc((size_t)r.m->adapters[i]->numel * sizeof(float));
        ag_tensor_to_f32(r.m->adapters[i], start[i]);
    }
    const char *tag = bf16 ? "bf16" : "fp32";
    char key[64];
    snprintf(key, sizeof key, "%s.adam_losses", tag);
    for (size_t k = 0; k < 2; k++) {
        optim_zero_grad(o);
        check_loss(&r, key, k, step(&r), bf16 ? BF16_LOSS_RTOL : F32_LOSS_RTOL);
        if (optim_step(o, &err) != 0) fail_msg("%s", err.msg);
    }
    assert_int_equal(live(MP_OPTIMIZER), 2 * llama_model_trainable_count(r.m) * (bf16 ? 2 : 4));
    snprintf(key, sizeof key, "%s.adam", tag);
    check_adapters(&r, key, false, bf16 ? NULL : start, bf16 ? BF16_ADAM_TOL : F32_ADAM_TOL);
    for (size_t i = 0; i < r.m->nadapters; i++) free(start[i]);
    optim_free(o);
    run_close(&r);
}

static void test_adam_fp32(void **s) {
    (void)s;
    adam_as(false);
}
static void test_adam_bf16(void **s) {
    (void)s;
    adam_as(true);
}

// Two training steps' category peaks and the weight bytes at the end of the first.
static void step_peaks(bool meta, ag_framework fw, ag_precision p, base_kind k, bool master,
                       uint64_t peaks[MP_NCATEGORIES]) {
    run r;
    run_open(&r, meta, fw, p, k);
    ag_err err = {{0}};
    optim_config oc = optim_defaults(OPTIM_ADAM);
    oc.adam_impl = OPTIM_ADAM_FOR_LOOP;
    oc.state_bits = master ? 32 : p.weight_bits;
    oc.master = master;
    optim *o = optim_new(&oc, r.m->trainable, r.m->ntrainable, &err);
    assert_non_null(o);
    for (int s = 0; s < 2; s++) {
        optim_zero_grad(o);
        step(&r);
        assert_int_equal(optim_step(o, &err), 0);
    }
    optim_free(o);
    for (int c = 0; c < MP_OTHER; c++) peaks[c] = mp_get_counter(c).peak;
    run_close(&r);
}

static void test_meta_equals_real(void **s) {
    (void)s;
    const ag_framework fws[] = {AG_FRAMEWORK_LEAN, AG_FRAMEWORK_PYTORCH, AG_FRAMEWORK_PYTORCH_113};
    const char *const kinds[] = {"nf4", "int4", "int8"};
    for (int k = 0; k < 3; k++)
        for (int d = 0; d < 3; d++) // fp32, bf16, bf16-mixed
            for (size_t f = 0; f < 3; f++) {
                uint64_t real[MP_NCATEGORIES] = {0}, meta[MP_NCATEGORIES] = {0};
                ag_precision p = compute(d > 0, d == 2);
                step_peaks(false, fws[f], p, (base_kind)k, d == 2, real);
                step_peaks(true, fws[f], p, (base_kind)k, d == 2, meta);
                assert_true(real[MP_WEIGHT] > 0 && real[MP_ACTIVATION] > 0);
                for (int c = 0; c < MP_OTHER; c++)
                    if (real[c] != meta[c])
                        fail_msg("%s base, dtype %d, framework %zu: %s real %llu, meta %llu", kinds[k], d, f,
                                 mp_category_name(c), (unsigned long long)real[c], (unsigned long long)meta[c]);
            }
}

// Under PyTorch semantics each NF4 linear dequantises its whole weight into a temporary (as
// bitsandbytes' MatMul4Bit), so the temporary peak is at least the largest weight in the compute
// dtype; under lean semantics tiles of rows go through a kernel's workspace and bill nothing.
static void test_dequantized_temporary(void **s) {
    (void)s;
    uint64_t lean[MP_NCATEGORIES], pt[MP_NCATEGORIES];
    ag_precision p = compute(true, false);
    step_peaks(true, AG_FRAMEWORK_LEAN, p, BASE_NF4, false, lean);
    step_peaks(true, AG_FRAMEWORK_PYTORCH, p, BASE_NF4, false, pt);
    llama_config cfg;
    ag_err err = {{0}};
    assert_int_equal(llama_config_load(&cfg, MEMBILL_GOLDEN_DIR "/tiny_untied/config.json", &err), 0);
    uint64_t largest = (uint64_t)cfg.hidden * (uint64_t)cfg.intermediate * 2; // a bf16 gate_proj
    assert_true(pt[MP_TEMPORARY] >= largest);
    assert_true(lean[MP_TEMPORARY] < largest);
}

// A quantised weight that requires a gradient: one line, no crash.
static void test_refused(void **s) {
    (void)s;
    assert_int_equal(mp_init(&(mp_options){0}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    llama_config cfg;
    ag_err err = {{0}};
    assert_int_equal(llama_config_load(&cfg, MEMBILL_GOLDEN_DIR "/tiny_untied/config.json", &err), 0);
    llama_model *m = NULL;
    ag_precision bp = base_precision(ag_precision_f32(), BASE_NF4);
    assert_int_equal(llama_model_new_proj_dtype(&m, ctx, &cfg, &bp, &err), 0);
    int32_t ids[T] = {1, 2, 3, 4, 5, 6, 7};
    ag_tensor *loss = llama_forward_loss(ctx, m, ids, 1, T, &err);
    assert_null(loss);
    if (!strstr(err.msg, "is nf4, which gets no gradient")) fail_msg("message: %s", err.msg);
    assert_null(strchr(err.msg, '\n'));
    ag_tape_clear(ctx);
    llama_model_free(m);
    ag_ctx_free(ctx);
    for (int c = 0; c < MP_OTHER; c++) assert_int_equal(mp_get_counter(c).live, 0);
    mp_shutdown();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nf4_weights),
        cmocka_unit_test(test_grads_fp32_lean),
        cmocka_unit_test(test_grads_fp32_pytorch),
        cmocka_unit_test(test_grads_bf16_lean),
        cmocka_unit_test(test_grads_bf16_pytorch),
        cmocka_unit_test(test_adam_fp32),
        cmocka_unit_test(test_adam_bf16),
        cmocka_unit_test(test_meta_equals_real),
        cmocka_unit_test(test_dequantized_temporary),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
