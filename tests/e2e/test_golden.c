// End to end against the PyTorch reference (tests/golden, written by tests/reference/*.py):
// loss and every parameter gradient of the tiny models, the weights after two steps of Adam,
// AdamW and SGD with momentum, the BF16 weights, and the bill of each category along the way.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model.h"
#include "optim.h"

#include "golden_util.h"

// A tensor compares as max|got - want| <= TOL x max|want|. The reference measured float32
// noise at 1.5e-6 of max|grad|; typical bugs move gradients by 0.3 to 2 (README.md). Adam
// normalises each element's step, so an element whose gradient is below the float32 noise
// (untied up_proj holds one at 4e-8) moves by a noise-driven fraction of lr: weights after
// Adam differ by up to ~1.5e-5 x max|w| from the reference, still far inside WEIGHT_TOL.
#define GRAD_TOL 1e-4
#define WEIGHT_TOL 1e-4
#define LOSS_RTOL 1e-5

#define B 2
#define T 7

// Worst figures seen per check, printed at the end of the run.
typedef enum { W_LOSS, W_GRAD, W_ADAM, W_ADAMW, W_SGDM, W_STEP_LOSS, W_BF16_LOSS, W_BF16_GRAD, W_N } worst_kind;
static const char *const worst_names[W_N] = {
    "loss (relative)",        "grad.* (x max|golden|)", "adam.* (x max|golden|)", "adamw.* (x max|golden|)",
    "sgdm.* (x max|golden|)", "*_losses (relative)",    "loss_bf16 (relative)",   "grad_bf16.* (x max|golden|)"};
static double worst[W_N];

static void note(worst_kind k, double v) {
    if (v > worst[k]) worst[k] = v;
}

// ---------------------------------------------------------------------------------------------
// Reading the golden files

static llama_st_file *golden_open(const char *folder) { return golden_open_file(folder, "golden.safetensors"); }

static bool golden_has(const llama_st_file *g, const char *key) { return llama_st_find(g, key) != NULL; }

static float golden_scalar(const llama_st_file *g, const char *key, size_t i) {
    size_t n;
    float *v = golden_f32(g, key, &n);
    assert_true(i < n);
    float x = v[i];
    free(v);
    return x;
}

static void golden_ids(const llama_st_file *g, int32_t ids[B * T]) { golden_ids_of(g, ids, B, T); }

static size_t golden_count_prefix(const llama_st_file *g, const char *prefix) {
    size_t n = 0;
    for (size_t i = 0; i < llama_st_count(g); i++)
        if (strncmp(llama_st_get(g, i)->name, prefix, strlen(prefix)) == 0) n++;
    return n;
}

// ---------------------------------------------------------------------------------------------
// Comparing

static void check_loss(float got, float want, worst_kind k, const char *what) {
    double rel = fabs((double)got - (double)want) / fabs((double)want);
    note(k, rel);
    if (!(rel <= LOSS_RTOL)) fail_msg("%s: got %.9g, golden %.9g (relative %.3g)", what, got, want, rel);
}

// Every parameter (data, or .grad when grads) against "<prefix><name>".
static void check_params(const llama_model *m, const llama_st_file *g, const char *prefix, bool grads, double tol,
                         worst_kind k) {
    assert_int_equal(golden_count_prefix(g, prefix), m->nparams);
    for (size_t i = 0; i < m->nparams; i++) {
        const ag_tensor *p = m->params[i];
        const ag_tensor *src = grads ? p->grad : p;
        char key[256];
        snprintf(key, sizeof key, "%s%s", prefix, ag_tensor_name(p));
        size_t n;
        float *want = golden_f32(g, key, &n);
        assert_int_equal(n, (size_t)p->numel);
        // an expert no token reached has no gradient (as in PyTorch): the golden's is zero
        for (size_t j = 0; !src && j < n; j++)
            if (want[j] != 0.0f) fail_msg("%s: no gradient where the reference has one", ag_tensor_name(p));
        if (!src) {
            free(want);
            continue;
        }
        double e = scaled_diff(src->data, want, n);
        free(want);
        note(k, e);
        if (!(e <= tol)) fail_msg("%s: max|diff| = %.3g x max|golden| (tolerance %g)", key, e, tol);
    }
}

// ---------------------------------------------------------------------------------------------
// Fixture: the profiler, a context, a model loaded from a golden folder

typedef struct {
    ag_ctx *ctx;
    llama_model *m;
    llama_st_file *g;
    uint64_t nparams; // llama_param_count(cfg)
    uint64_t buffers; // llama_buffer_count(cfg): deepseek_v3's correction bias, weight but no parameter
    int32_t ids[B * T];
} run;

static const mp_category tensor_cats[] = {MP_WEIGHT, MP_GRADIENT, MP_OPTIMIZER, MP_ACTIVATION, MP_CACHE};

static void assert_all_zero(void) {
    for (size_t c = 0; c < sizeof tensor_cats / sizeof *tensor_cats; c++) {
        mp_counter k = mp_get_counter(tensor_cats[c]);
        if (k.live != 0)
            fail_msg("%s still holds %llu bytes", mp_category_name(tensor_cats[c]), (unsigned long long)k.live);
    }
}

static uint64_t live(mp_category c) { return mp_get_counter(c).live; }

static void run_open(run *r, const char *folder, const char *weights) {
    memset(r, 0, sizeof *r);
    assert_int_equal(mp_init(&(mp_options){0}), MP_OK);
    r->ctx = ag_ctx_new();
    assert_non_null(r->ctx);
    char path[4096];
    llama_config cfg;
    ag_err err = {{0}};
    golden_path(path, sizeof path, folder, "config.json");
    if (llama_config_load(&cfg, path, &err) != 0) fail_msg("%s", err.msg);
    r->nparams = llama_param_count(&cfg);
    r->buffers = llama_buffer_count(&cfg);
    assert_true(r->nparams > 0);
    if (llama_model_new(&r->m, r->ctx, &cfg, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(live(MP_WEIGHT), 4 * (r->nparams + r->buffers));
    golden_path(path, sizeof path, folder, weights);
    if (llama_model_load(r->m, path, &err) != 0) fail_msg("%s", err.msg);
    r->g = golden_open(folder);
    golden_ids(r->g, r->ids);
}

static void run_close(run *r) {
    llama_st_close(r->g);
    llama_model_free(r->m);
    ag_ctx_free(r->ctx);
    assert_all_zero();
    mp_shutdown();
}

// Forward and backward; returns the loss. Checks the bill of weights, gradients and
// activations on the way.
static float forward_backward_opts(run *r, const llama_forward_opts *opts) {
    ag_err err = {{0}};
    ag_tensor *loss = llama_forward_loss_opts(r->ctx, r->m, opts, r->ids, B, T, &err);
    if (!loss) fail_msg("%s", err.msg);
    assert_int_equal(live(MP_WEIGHT), 4 * (r->nparams + r->buffers));
    assert_int_equal(live(MP_GRADIENT), 0);
    assert_true(live(MP_ACTIVATION) > 0); // what the tape saved
    if (ag_backward(r->ctx, loss) != AG_OK) fail_msg("backward: %s", ag_ctx_error(r->ctx));
    float l = ag_f32(loss)[0];
    ag_release(loss);
    assert_int_equal(live(MP_WEIGHT), 4 * (r->nparams + r->buffers));
    // every parameter the loss reached has its gradient (an expert no token reached has none)
    uint64_t reached = 0;
    for (size_t i = 0; i < r->m->nparams; i++) reached += r->m->params[i]->grad ? (uint64_t)r->m->params[i]->numel : 0;
    assert_true(reached * 10 >= r->nparams * 9);
    assert_int_equal(live(MP_GRADIENT), 4 * reached);
    assert_int_equal(live(MP_ACTIVATION), 0); // the tape gave everything back
    assert_int_equal(ag_tape_size(r->ctx), 0);
    return l;
}

static float forward_backward(run *r) { return forward_backward_opts(r, NULL); }

// ---------------------------------------------------------------------------------------------
// Loss and gradients

// Under a framework and an attention: the same math, so the same loss and gradients.
static void check_grads_as(const char *folder, const char *weights, const char *loss_key, const char *grad_prefix,
                           worst_kind wl, worst_kind wg, ag_framework fw, ag_attention_kind att) {
    run r;
    run_open(&r, folder, weights);
    ag_ctx_set_framework(r.ctx, fw);
    ag_ctx_set_attention(r.ctx, att);
    float l = forward_backward(&r);
    check_loss(l, golden_scalar(r.g, loss_key, 0), wl, loss_key);
    check_params(r.m, r.g, grad_prefix, true, GRAD_TOL, wg);
    for (size_t i = 0; i < r.m->nparams; i++) ag_zero_grad(r.m->params[i]);
    assert_int_equal(live(MP_GRADIENT), 0);
    run_close(&r);
}

static void check_grads(const char *folder, const char *weights, const char *loss_key, const char *grad_prefix,
                        worst_kind wl, worst_kind wg) {
    check_grads_as(folder, weights, loss_key, grad_prefix, wl, wg, AG_FRAMEWORK_LEAN, AG_ATTENTION_EAGER);
}

// Every framework and attention against the same PyTorch reference (eager math).
static void test_frameworks_and_attention_grads(void **s) {
    (void)s;
    static const char *const folders[] = {"tiny_tied", "tiny_untied", "tiny_mha"};
    for (int f = 0; f < 3; f++)
        for (ag_framework fw = AG_FRAMEWORK_LEAN; fw <= AG_FRAMEWORK_PYTORCH_113; fw++)
            for (int a = 0; a < 2; a++) {
                if (fw == AG_FRAMEWORK_LEAN && a == 0) continue; // the plain tests above
                check_grads_as(folders[f], "model.safetensors", "loss", "grad.", W_LOSS, W_GRAD, fw,
                               a ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER);
            }
}

// The families and RoPE variants (tests/golden/tiny_qwen2, ...): loss and every gradient under
// every framework and attention, against the reference written from transformers' code.
static const char *const family_folders[] = {"tiny_qwen2",       "tiny_qwen3",          "tiny_mistral",
                                             "tiny_rope_linear", "tiny_rope_dynamic",   "tiny_rope_llama3",
                                             "tiny_rope_yarn",   "tiny_rope_yarn_orig", "tiny_mixtral",
                                             "tiny_qwen2_moe",   "tiny_qwen3_moe"};
#define NFAMILY (sizeof family_folders / sizeof family_folders[0])
#define NROPE_END 8 // family_folders[3 .. NROPE_END) are the RoPE variants

static void test_family_grads(void **s) {
    (void)s;
    for (size_t f = 0; f < NFAMILY; f++)
        for (ag_framework fw = AG_FRAMEWORK_LEAN; fw <= AG_FRAMEWORK_PYTORCH_113; fw++)
            for (int a = 0; a < 2; a++) {
                if (fw == AG_FRAMEWORK_PYTORCH_113 && a) continue; // PyTorch 1.13 has no SDPA
                check_grads_as(family_folders[f], "model.safetensors", "loss", "grad.", W_LOSS, W_GRAD, fw,
                               a ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER);
            }
}

// gpt_oss (tests/reference/gpt_oss_ref.py): sinks, a window on every other layer, YaRN, the
// top-k-then-softmax router with its bias, stacked experts through the clamped SwiGLU. The lean
// framework runs it, eager and flash (the others are refused: test_framework.c).
static void test_gpt_oss_grads(void **s) {
    (void)s;
    for (int a = 0; a < 2; a++)
        check_grads_as("tiny_gpt_oss", "model.safetensors", "loss", "grad.", W_LOSS, W_GRAD, AG_FRAMEWORK_LEAN,
                       a ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER);
}

// deepseek_v3 (tests/reference/deepseek_ref.py): latent attention (low-rank q and kv, RoPE on
// de-interleaved parts, a value head of its own, yarn's mscale on the scale), sigmoid routing with
// group-limited top-k and the correction bias, shared experts, a dense first layer. The lean
// framework with eager attention runs it (the others are refused: test_framework.c).
static void test_deepseek_v3_grads(void **s) {
    (void)s;
    check_grads_as("tiny_deepseek_v3", "model.safetensors", "loss", "grad.", W_LOSS, W_GRAD, AG_FRAMEWORK_LEAN,
                   AG_ATTENTION_EAGER);
}

// Gemma 2 (tests/golden/tiny_gemma2, tests/reference/gemma_ref.py): (1 + w) norms around each
// sub-block, GeLU-tanh, the embeddings scaled, query_pre_attn_scalar, both soft-caps, sliding and
// full layers alternating; eager attention under every framework, with and without checkpointing
// (flash refuses a soft-cap, as its message says).
// Gemma 3 (tests/golden/tiny_gemma3): Gemma's block with q_norm and k_norm, no caps, one full layer
// in three, the sliding layers' RoPE on rope_local_base_freq.
static void test_gemma2_grads(void **s) {
    (void)s;
    for (int g = 0; g < 2; g++)
        for (ag_framework fw = AG_FRAMEWORK_LEAN; fw <= AG_FRAMEWORK_PYTORCH_113; fw++)
            check_grads_as(g ? "tiny_gemma3" : "tiny_gemma2", "model.safetensors", "loss", "grad.", W_LOSS, W_GRAD, fw,
                           AG_ATTENTION_EAGER);
    run r;
    run_open(&r, "tiny_gemma2", "model.safetensors");
    float l = forward_backward_opts(&r, &(llama_forward_opts){.checkpointing = true});
    check_loss(l, golden_scalar(r.g, "loss", 0), W_LOSS, "loss");
    check_params(r.m, r.g, "grad.", true, GRAD_TOL, W_GRAD);
    for (size_t i = 0; i < r.m->nparams; i++) ag_zero_grad(r.m->params[i]);
    ag_ctx_set_attention(r.ctx, AG_ATTENTION_FLASH);
    ag_err err = {{0}};
    assert_null(llama_forward_loss(r.ctx, r.m, r.ids, B, T, &err));
    assert_non_null(strstr(err.msg, "soft-cap"));
    run_close(&r);
}

// Phi-3 (tests/golden/tiny_phi3, tests/reference/phi3_ref.py): the fused qkv_proj sliced into q,
// k and v, the fused gate_up_proj chunked into gate and up, a window on every layer; every
// framework (each splits the fused outputs its own way), eager and flash, and with checkpointing.
// tests/golden/tiny_phi3_longrope: rope_scaling longrope past original_max_position_embeddings.
static void test_phi3_grads(void **s) {
    (void)s;
    for (int g = 0; g < 2; g++)
        for (ag_framework fw = AG_FRAMEWORK_LEAN; fw <= AG_FRAMEWORK_PYTORCH_113; fw++)
            for (int a = 0; a < (fw == AG_FRAMEWORK_PYTORCH_113 ? 1 : 2); a++)
                check_grads_as(g ? "tiny_phi3_longrope" : "tiny_phi3", "model.safetensors", "loss", "grad.", W_LOSS,
                               W_GRAD, fw, a ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER);
    run r;
    run_open(&r, "tiny_phi3", "model.safetensors");
    float l = forward_backward_opts(&r, &(llama_forward_opts){.checkpointing = true});
    check_loss(l, golden_scalar(r.g, "loss", 0), W_LOSS, "loss");
    check_params(r.m, r.g, "grad.", true, GRAD_TOL, W_GRAD);
    run_close(&r);
}

// The RoPE variants' logits, eager and flash, against the reference's.
static void test_rope_logits(void **s) {
    (void)s;
    for (size_t f = 3; f < NROPE_END; f++)
        for (int a = 0; a < 2; a++) {
            run r;
            run_open(&r, family_folders[f], "model.safetensors");
            ag_ctx_set_attention(r.ctx, a ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER);
            ag_set_grad_enabled(r.ctx, false);
            ag_err err = {{0}};
            ag_tensor *logits = llama_forward_logits(r.ctx, r.m, r.ids, B, T, &err);
            if (!logits) fail_msg("%s", err.msg);
            size_t n;
            float *want = golden_f32(r.g, "logits", &n);
            assert_int_equal(n, (size_t)logits->numel);
            double d = scaled_diff(logits->data, want, n);
            if (!(d <= GRAD_TOL)) fail_msg("%s: logits differ by %g x max|golden|", family_folders[f], d);
            note(W_GRAD, d);
            free(want);
            ag_release(logits);
            run_close(&r);
        }
}

static void test_tied_grads(void **s) {
    (void)s;
    check_grads("tiny_tied", "model.safetensors", "loss", "grad.", W_LOSS, W_GRAD);
}
static void test_untied_grads(void **s) {
    (void)s;
    check_grads("tiny_untied", "model.safetensors", "loss", "grad.", W_LOSS, W_GRAD);
}
static void test_mha_grads(void **s) {
    (void)s;
    check_grads("tiny_mha", "model.safetensors", "loss", "grad.", W_LOSS, W_GRAD);
}
static void test_tied_bf16(void **s) {
    (void)s;
    check_grads("tiny_tied", "model_bf16.safetensors", "loss_bf16", "grad_bf16.", W_BF16_LOSS, W_BF16_GRAD);
}
static void test_untied_bf16(void **s) {
    (void)s;
    check_grads("tiny_untied", "model_bf16.safetensors", "loss_bf16", "grad_bf16.", W_BF16_LOSS, W_BF16_GRAD);
}

// The BF16 file is a different model: its golden loss and every gradient differ from the F32
// ones by far more than the tolerance, so the BF16 checks above could not pass on the F32
// weights (a loader that ignored the dtype, say).
static void test_bf16_is_distinct(void **s) {
    (void)s;
    llama_st_file *g = golden_open("tiny_untied");
    float l32 = golden_scalar(g, "loss", 0), l16 = golden_scalar(g, "loss_bf16", 0);
    assert_true(fabs((double)l32 - l16) > 10 * LOSS_RTOL * fabs((double)l32));
    size_t checked = 0;
    for (size_t i = 0; i < llama_st_count(g); i++) {
        const char *key = llama_st_get(g, i)->name;
        if (strncmp(key, "grad.", 5) != 0) continue;
        char key16[256];
        snprintf(key16, sizeof key16, "grad_bf16.%s", key + 5);
        size_t n, n16;
        float *a = golden_f32(g, key, &n);
        float *b = golden_f32(g, key16, &n16);
        assert_int_equal(n, n16);
        if (!(scaled_diff(a, b, n) > 10 * GRAD_TOL)) fail_msg("%s: too close to %s", key16, key);
        free(a);
        free(b);
        checked++;
    }
    assert_int_equal(checked, golden_count_prefix(g, "grad_bf16."));
    assert_true(checked > 0);
    llama_st_close(g);
}

// With every block checkpointed: the golden loss and gradients again (the recomputation runs the
// same ops on the same inputs), the tape keeps one hidden-sized tensor per block (on one
// checkpoint node each) where the plain run keeps every block's saved set, and the activation
// peak is lower.
static void test_tied_checkpointing(void **s) {
    (void)s;
    uint64_t kept[2], peak[2];
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        run r;
        run_open(&r, "tiny_tied", "model.safetensors");
        llama_forward_opts opts = {.checkpointing = ckpt};
        ag_err err = {{0}};
        ag_tensor *loss = llama_forward_loss_opts(r.ctx, r.m, &opts, r.ids, B, T, &err);
        if (!loss) fail_msg("%s", err.msg);
        kept[ckpt] = ag_tape_saved_bytes(r.ctx);
        uint64_t ckpt_bytes = 0;
        size_t ckpt_nodes = 0;
        ag_node_info info;
        for (size_t i = 0; ag_tape_node(r.ctx, i, &info); i++)
            if (strcmp(info.op, "checkpoint") == 0) ckpt_nodes++, ckpt_bytes += info.saved_bytes;
        assert_int_equal(ckpt_nodes, ckpt ? (size_t)r.m->cfg.layers : 0);
        assert_int_equal(ckpt_bytes, ckpt ? (uint64_t)(r.m->cfg.layers * B * T * r.m->cfg.hidden) * sizeof(float) : 0);
        ag_tape_clear(r.ctx);
        ag_release(loss);
        float l = forward_backward_opts(&r, &opts);
        peak[ckpt] = mp_get_counter(MP_ACTIVATION).peak;
        if (ckpt) {
            check_loss(l, golden_scalar(r.g, "loss", 0), W_LOSS, "loss (checkpointing)");
            check_params(r.m, r.g, "grad.", true, GRAD_TOL, W_GRAD);
            assert_true(kept[1] > ckpt_bytes); // and the head's saved tensors
            assert_true(kept[1] < kept[0]);
        }
        for (size_t i = 0; i < r.m->nparams; i++) ag_zero_grad(r.m->params[i]);
        run_close(&r);
    }
    assert_true(peak[1] < peak[0]);
}

// ---------------------------------------------------------------------------------------------
// Two optimizer steps

static void check_optim(const char *folder, optim_kind kind, float lr, float wd, float momentum, const char *prefix,
                        const char *losses_key, worst_kind wk) {
    run r;
    run_open(&r, folder, "model.safetensors");
    optim_config oc = optim_defaults(kind);
    oc.lr = lr;
    oc.weight_decay = wd;
    oc.momentum = momentum;
    ag_err err = {""};
    optim *o = optim_new(&oc, r.m->params, r.m->nparams, &err);
    if (!o) fail_msg("%s", err.msg);
    uint64_t state = optim_state_bytes_per_element(kind) * r.nparams;
    assert_true(state > 0);
    float losses[2];
    for (int step = 0; step < 2; step++) {
        losses[step] = forward_backward(&r);
        assert_int_equal(live(MP_OPTIMIZER), step == 0 ? 0 : state); // lazily, at the first step
        if (optim_step(o, &err) != 0) fail_msg("%s", err.msg);
        assert_int_equal(live(MP_OPTIMIZER), state);
        assert_int_equal(live(MP_WEIGHT), 4 * r.nparams);
        assert_int_equal(live(MP_GRADIENT), 4 * r.nparams);
        optim_zero_grad(o);
        assert_int_equal(live(MP_GRADIENT), 0);
        assert_int_equal(live(MP_ACTIVATION), 0);
    }
    assert_int_equal(optim_steps_taken(o), 2);
    check_params(r.m, r.g, prefix, false, WEIGHT_TOL, wk);
    if (golden_has(r.g, losses_key)) {
        for (size_t i = 0; i < 2; i++)
            check_loss(losses[i], golden_scalar(r.g, losses_key, i), W_STEP_LOSS, losses_key);
    }
    // The second loss ran on updated weights: the step did something.
    assert_true(losses[1] < losses[0]);
    optim_free(o);
    assert_int_equal(live(MP_OPTIMIZER), 0);
    run_close(&r);
}

static void test_tied_adam(void **s) {
    (void)s;
    check_optim("tiny_tied", OPTIM_ADAM, 1e-3f, 0.0f, 0.0f, "adam.", "adam_losses", W_ADAM);
}
static void test_untied_adam(void **s) {
    (void)s;
    check_optim("tiny_untied", OPTIM_ADAM, 1e-3f, 0.0f, 0.0f, "adam.", "adam_losses", W_ADAM);
}
static void test_tied_adamw(void **s) {
    (void)s;
    check_optim("tiny_tied", OPTIM_ADAMW, 1e-3f, 0.01f, 0.0f, "adamw.", "adamw_losses", W_ADAMW);
}
static void test_untied_adamw(void **s) {
    (void)s;
    check_optim("tiny_untied", OPTIM_ADAMW, 1e-3f, 0.01f, 0.0f, "adamw.", "adamw_losses", W_ADAMW);
}
static void test_tied_sgdm(void **s) {
    (void)s;
    check_optim("tiny_tied", OPTIM_SGD_MOMENTUM, 1e-2f, 0.0f, 0.9f, "sgdm.", "sgdm_losses", W_SGDM);
}
static void test_untied_sgdm(void **s) {
    (void)s;
    check_optim("tiny_untied", OPTIM_SGD_MOMENTUM, 1e-2f, 0.0f, 0.9f, "sgdm.", "sgdm_losses", W_SGDM);
}

// ---------------------------------------------------------------------------------------------
// The comparison itself must be able to fail: a gradient computed on the wrong batch (ids of
// the second row swapped with the first) is far outside the tolerance.
static void test_detects_wrong_batch(void **s) {
    (void)s;
    run r;
    run_open(&r, "tiny_tied", "model.safetensors");
    for (int t = 0; t < T; t++) {
        int32_t x = r.ids[t];
        r.ids[t] = r.ids[T + t];
        r.ids[T + t] = x;
    }
    for (int t = 0; t < T / 2; t++) { // and reverse row 0, so the pair differs from the golden
        int32_t x = r.ids[t];
        r.ids[t] = r.ids[T - 1 - t];
        r.ids[T - 1 - t] = x;
    }
    forward_backward(&r);
    size_t n;
    const ag_tensor *q = r.m->layers[0].q;
    float *want = golden_f32(r.g, "grad.model.layers.0.self_attn.q_proj.weight", &n);
    assert_int_equal(n, (size_t)q->numel);
    assert_true(scaled_diff(q->grad->data, want, n) > 100 * GRAD_TOL);
    free(want);
    run_close(&r);
}

static int print_worst(void **s) {
    (void)s;
    printf("worst observed errors:\n");
    for (int k = 0; k < W_N; k++) printf("  %-30s %.3g\n", worst_names[k], worst[k]);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tied_grads),         cmocka_unit_test(test_untied_grads),
        cmocka_unit_test(test_mha_grads),          cmocka_unit_test(test_frameworks_and_attention_grads),
        cmocka_unit_test(test_tied_bf16),          cmocka_unit_test(test_untied_bf16),
        cmocka_unit_test(test_bf16_is_distinct),   cmocka_unit_test(test_tied_adam),
        cmocka_unit_test(test_untied_adam),        cmocka_unit_test(test_tied_adamw),
        cmocka_unit_test(test_untied_adamw),       cmocka_unit_test(test_tied_sgdm),
        cmocka_unit_test(test_untied_sgdm),        cmocka_unit_test(test_detects_wrong_batch),
        cmocka_unit_test(test_tied_checkpointing), cmocka_unit_test(test_family_grads),
        cmocka_unit_test(test_gpt_oss_grads), cmocka_unit_test(test_deepseek_v3_grads),      cmocka_unit_test(test_rope_logits),
        cmocka_unit_test(test_rope_logits),        cmocka_unit_test(test_gemma2_grads),
        cmocka_unit_test(test_phi3_grads),
    };
    return cmocka_run_group_tests(tests, NULL, print_worst);
}
