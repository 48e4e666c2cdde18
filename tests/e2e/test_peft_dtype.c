// PEFT's float32 adapters beside a 16-bit base (get_peft_model's autocast_adapter_dtype=True,
// src/peft/tuners/tuners_utils.py cast_adapter_dtype: float16 and bfloat16 adapter weights become
// float32): the adapters, their gradients and their Adam state are float32, and each adapted
// projection runs lora/layer.py's Linear.forward:
//   result = base_layer(x)                       [T, out] bf16
//   x = x.to(float32)                            [T, in]  f32, kept by lora_A for its weight's grad
//   result = result + lora_B(lora_A(x)) * s      lora_A [T, r] f32, lora_B and * s [T, out] f32,
//                                                the sum promoted to f32
//   result = result.to(bfloat16)                 [T, out] bf16
// and over a quantised base (bnb.py's Linear4bit, gptq.py) the adapters' output is cast back to
// the base's dtype before the sum, which stays 16-bit. Sizes from the tiny model; the real run's
// loss and gradients against the float32 reference (tests/golden/tiny_lora) at bfloat16's precision.
// Under torch.autocast(bfloat16) over the bf16 base (the Trainer's bf16=True, --dtype bf16-autocast)
// the base's product runs as it is; the float32 copy of x goes through dropout, and lora_A's matmul
// casts it to bf16 (the copy it keeps for backward: the float32 one is freed) and takes its weight's
// cached bf16 cast (autocast_mode.cpp cached_cast: a float32 leaf that requires grad), as lora_B
// does; their outputs, the scaling and the sum are bf16, so result.to(bfloat16) copies nothing.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "blocks.h"
#include "model.h"
#include "optim.h"

#include "golden_util.h"

#define B 2
#define T 7
#define RANK 4

typedef struct {
    ag_ctx *ctx;
    llama_model *m;
} run;

static ag_precision bf16(int weight_bits) {
    ag_precision p = ag_precision_f32();
    p.act_bits = p.grad_bits = 16;
    p.weight_bits = weight_bits;
    if (weight_bits == 4) p.nf4 = true;
    return p;
}

static void run_open_as(run *r, bool meta, int adapter_bits, int base_bits, bool autocast) {
    memset(r, 0, sizeof *r);
    assert_int_equal(mp_init(&(mp_options){.meta = meta, .keep_timeline = true}), MP_OK);
    r->ctx = ag_ctx_new();
    ag_ctx_set_framework(r->ctx, AG_FRAMEWORK_PYTORCH);
    llama_config cfg;
    ag_err err = {{0}};
    char path[4096];
    snprintf(path, sizeof path, "%s/tiny_untied/config.json", MEMBILL_GOLDEN_DIR);
    if (llama_config_load(&cfg, path, &err) != 0) fail_msg("%s", err.msg);
    ag_precision p = bf16(16), proj = bf16(base_bits);
    p.autocast = autocast;
    assert_true(ag_ctx_set_precision(r->ctx, &p));
    if (llama_model_new_proj_dtype(&r->m, r->ctx, &cfg, base_bits < 16 ? &proj : NULL, &err) != 0)
        fail_msg("%s", err.msg);
    if (!meta && llama_model_load(r->m, MEMBILL_GOLDEN_DIR "/tiny_untied/model.safetensors", &err) != 0)
        fail_msg("%s", err.msg);
    llama_lora_config l = {.rank = RANK, .alpha = 8.0, .targets = LLAMA_LORA_ALL, .adapter_bits = adapter_bits};
    if (llama_model_add_lora(r->m, r->ctx, &l, 7, &err) != 0) fail_msg("%s", err.msg);
    if (!meta && llama_adapter_load(r->m, MEMBILL_GOLDEN_DIR "/tiny_lora", &err) != 0) fail_msg("%s", err.msg);
}

static void run_open(run *r, bool meta, int adapter_bits, int base_bits) {
    run_open_as(r, meta, adapter_bits, base_bits, false);
}

static void run_close(run *r) {
    llama_model_free(r->m);
    ag_ctx_free(r->ctx);
    for (int c = 0; c < MP_OTHER; c++) assert_int_equal(mp_get_counter(c).live, 0);
    mp_shutdown();
}

// One adapted projection's forward on x [B, T, in] (bf16, wanting a gradient): the allocations
// from the first after x, in order, as (label suffix, bytes); frees skipped.
typedef struct {
    const char *suffix;
    int64_t bytes;
} alloc;

static void expect_allocs(const alloc *want, size_t n, size_t from) {
    size_t k = 0;
    for (size_t i = from; i < mp_timeline_count() && k < n; i++) {
        const mp_event *e = mp_timeline_get(i);
        if (e->bytes <= 0 || e->category != MP_ACTIVATION) continue;
        const char *name = mp_site_name(e->site);
        size_t a = strlen(name), b = strlen(want[k].suffix);
        if (a < b || strcmp(name + a - b, want[k].suffix) != 0)
            fail_msg("allocation %zu: %s (%lld bytes), expected ...%s", k, name, (long long)e->bytes, want[k].suffix);
        assert_int_equal(e->bytes, want[k].bytes);
        k++;
    }
    assert_int_equal(k, n);
}

static void projection_as(int adapter_bits, int base_bits, bool autocast, const alloc *want, size_t n, int out_bits) {
    run r;
    run_open_as(&r, true, adapter_bits, base_bits, autocast);
    const int64_t in = r.m->cfg.hidden;
    ag_tensor *x = ag_tensor_new(r.ctx, 3, (int64_t[]){B, T, in}, MP_ACTIVATION, "x");
    x->requires_grad = true;
    size_t from = mp_timeline_count();
    ag_tensor *y = llama_proj_forward(r.ctx, &r.m->layers[0], 0, LLAMA_PROJ_GATE, x);
    assert_non_null(y);
    assert_int_equal(y->bits, out_bits);
    expect_allocs(want, n, from);
    // the float32 copy of x outlives the projection only when lora_A keeps it (no autocast)
    bool freed = false;
    for (size_t i = from; i < mp_timeline_count(); i++)
        freed = freed || (mp_timeline_get(i)->bytes < 0 && strstr(mp_site_name(mp_timeline_get(i)->site), "input_to_adapter"));
    assert_int_equal(freed, autocast && adapter_bits == 32);
    ag_release(y);
    ag_tape_clear(r.ctx);
    ag_release(x);
    run_close(&r);
}

static void projection(int adapter_bits, int base_bits, const alloc *want, size_t n, int out_bits) {
    projection_as(adapter_bits, base_bits, false, want, n, out_bits);
}

// gate_proj of the tiny model: in = hidden, out = intermediate.
static void test_projection_bill(void **s) {
    (void)s;
    llama_config c;
    ag_err err = {{0}};
    char path[4096];
    snprintf(path, sizeof path, "%s/tiny_untied/config.json", MEMBILL_GOLDEN_DIR);
    if (llama_config_load(&c, path, &err) != 0) fail_msg("%s", err.msg);
    const int64_t BT = B * T, in = c.hidden, out = c.intermediate;
    const alloc peft[] = {
        {":base_out", BT * out * 2},   {":input_to_adapter", BT * in * 4}, {".lora_A:out", BT * RANK * 4},
        {".lora_B:out", BT * out * 4}, {".lora_scale:out", BT * out * 4},  {":sum", BT * out * 4},
        {":out", BT * out * 2}};
    projection(32, 16, peft, 7, 16);
    // Adapters of the base's dtype: no cast, every tensor 16-bit.
    const alloc same[] = {{":base_out", BT * out * 2},
                          {".lora_A:out", BT * RANK * 2},
                          {".lora_B:out", BT * out * 2},
                          {".lora_scale:out", BT * out * 2},
                          {":out", BT * out * 2}};
    projection(0, 16, same, 5, 16);
    // Under autocast: lora_A's bf16 copy of its input and the adapters' cached bf16 casts.
    const alloc autocast[] = {{":base_out", BT * out * 2},         {":input_to_adapter", BT * in * 4},
                              {".lora_A:input_bf16", BT * in * 2}, {".lora_A:weight_bf16", RANK * in * 2},
                              {".lora_A:out", BT * RANK * 2},      {".lora_B:weight_bf16", out * RANK * 2},
                              {".lora_B:out", BT * out * 2},       {".lora_scale:out", BT * out * 2},
                              {":sum", BT * out * 2}};
    projection_as(32, 16, true, autocast, 9, 16);
}

// Over an NF4 base: output.to(bfloat16) before the sum, which stays 16-bit.
static void test_projection_bill_quantised(void **s) {
    (void)s;
    run r;
    run_open(&r, true, 32, 4);
    const int64_t BT = B * T, in = r.m->cfg.hidden, out = r.m->cfg.intermediate;
    run_close(&r);
    const alloc qlora[] = {{":input_to_adapter", BT * in * 4}, {".lora_A:out", BT * RANK * 4},
                           {".lora_B:out", BT * out * 4},      {".lora_scale:out", BT * out * 4},
                           {":adapter_out", BT * out * 2},     {":out", BT * out * 2}};
    run q;
    run_open(&q, true, 32, 4);
    ag_tensor *x = ag_tensor_new(q.ctx, 3, (int64_t[]){B, T, in}, MP_ACTIVATION, "x");
    x->requires_grad = true;
    ag_tensor *y = llama_proj_forward(q.ctx, &q.m->layers[0], 0, LLAMA_PROJ_GATE, x);
    assert_non_null(y);
    assert_int_equal(y->bits, 16);
    // the base's own allocations (its dequantised weight, its output) come first: find the cast
    size_t from = 0;
    for (size_t i = 0; i < mp_timeline_count(); i++)
        if (strstr(mp_site_name(mp_timeline_get(i)->site), "input_to_adapter")) {
            from = i;
            break;
        }
    expect_allocs(qlora, 6, from);
    ag_release(y);
    ag_tape_clear(q.ctx);
    ag_release(x);
    run_close(&q);
}

// The model's bill: adapters, gradients and Adam's two moments at 4 bytes an element.
static void test_states_float32(void **s) {
    (void)s;
    run r;
    run_open(&r, true, 32, 16);
    uint64_t ad = 0;
    for (size_t i = 0; i < r.m->nadapters; i++) {
        assert_int_equal(r.m->adapters[i]->bits, 32);
        ad += (uint64_t)r.m->adapters[i]->numel;
    }
    const uint64_t base_bytes = mp_get_counter(MP_WEIGHT).live - 4 * ad;
    assert_int_equal(base_bytes, 2 * llama_param_count(&r.m->cfg));
    int32_t ids[B * T] = {0};
    ag_err err = {{0}};
    ag_tensor *loss = llama_forward_loss(r.ctx, r.m, ids, B, T, &err);
    assert_non_null(loss);
    assert_int_equal(ag_backward(r.ctx, loss), AG_OK);
    ag_release(loss);
    assert_int_equal(mp_get_counter(MP_GRADIENT).live, 4 * ad);
    for (size_t i = 0; i < r.m->nadapters; i++) assert_int_equal(r.m->adapters[i]->grad->bits, 32);
    optim_config oc = optim_defaults(OPTIM_ADAM);
    oc.state_bits = 16; // the run's dtype: a float32 parameter's state is float32 still
    optim *o = optim_new(&oc, r.m->trainable, r.m->ntrainable, &err);
    assert_non_null(o);
    assert_int_equal(optim_step(o, &err), 0);
    assert_int_equal(mp_get_counter(MP_OPTIMIZER).live, 8 * ad);
    optim_free(o);
    run_close(&r);
}

// A real step: loss and adapter gradients as the float32 reference's, within bfloat16's error,
// without autocast and under it.
static void real_step(bool autocast) {
    run r;
    run_open_as(&r, false, 32, 16, autocast);
    llama_st_file *g = NULL;
    ag_err err = {{0}};
    if (llama_st_open(&g, MEMBILL_GOLDEN_DIR "/tiny_lora/golden.safetensors", &err) != 0) fail_msg("%s", err.msg);
    int32_t ids[B * T];
    golden_ids_of(g, ids, B, T);
    ag_tensor *loss = llama_forward_loss(r.ctx, r.m, ids, B, T, &err);
    if (!loss) fail_msg("%s", err.msg);
    assert_int_equal(ag_backward(r.ctx, loss), AG_OK);
    size_t n;
    float *want = golden_f32(g, "loss", &n), l = ag_f32(loss)[0];
    assert_true(fabs(l - want[0]) <= 1e-2 * fabs(want[0]));
    free(want);
    ag_release(loss);
    for (size_t i = 0; i < r.m->nadapters; i++) {
        const ag_tensor *a = r.m->adapters[i];
        char key[256];
        snprintf(key, sizeof key, "grad.base_model.model.%s", ag_tensor_name(a));
        want = golden_f32(g, key, &n);
        assert_int_equal(a->grad->dtype, AG_F32);
        double mx = 0, diff = 0;
        for (size_t j = 0; j < n; j++) {
            mx = fmax(mx, fabs(want[j]));
            diff = fmax(diff, fabs(want[j] - ag_f32(a->grad)[j]));
        }
        if (!(mx > 0) || diff > 5e-2 * mx) fail_msg("%s: max diff %.3g, max|golden| %.3g", key, diff, mx);
        free(want);
    }
    llama_st_close(g);
    run_close(&r);
}

static void test_real_step(void **s) {
    (void)s;
    real_step(false);
    real_step(true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_projection_bill),
        cmocka_unit_test(test_projection_bill_quantised),
        cmocka_unit_test(test_states_float32),
        cmocka_unit_test(test_real_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
