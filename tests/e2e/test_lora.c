// LoRA end to end against the PyTorch reference of PEFT's LoRA (tests/reference/lora_ref.py):
// the tiny untied model with an adapter on every linear layer, its non-zero B read from the
// golden adapter folder. Loss, every adapter gradient, the adapters after two Adam steps; the bill
// to the byte (gradients and Adam state of the adapters alone, none for the frozen base); meta
// mode's bill equal to the real one; saved adapters reloaded; wrong adapters refused.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model.h"
#include "optim.h"

#include "golden_util.h"

#ifndef MEMBILL_GOLDEN_DIR
#error "MEMBILL_GOLDEN_DIR must name the tests/golden folder"
#endif

#define TOL 1e-4 // x max|golden|, as test_golden's
#define B 2
#define T 7
#define RANK 4

static const char *const ADAPTER_DIR = MEMBILL_GOLDEN_DIR "/tiny_lora";

typedef struct {
    ag_ctx *ctx;
    llama_model *m;
    llama_st_file *g;
    int32_t ids[B * T];
} run;

static uint64_t live(mp_category c) { return mp_get_counter(c).live; }

static void load_config(llama_config *c, const char *folder) {
    char path[4096];
    ag_err err = {{0}};
    snprintf(path, sizeof path, "%s/%s/config.json", MEMBILL_GOLDEN_DIR, folder);
    if (llama_config_load(c, path, &err) != 0) fail_msg("%s", err.msg);
}

static llama_lora_config all_linear(int64_t rank) {
    return (llama_lora_config){.rank = rank, .alpha = 8.0, .targets = LLAMA_LORA_ALL, .dropout = 0.0};
}

// The base from tiny_untied's weights, frozen, with adapters of `rank` (loaded from the golden
// folder when load).
static void run_open(run *r, bool meta, ag_framework fw, bool load) {
    memset(r, 0, sizeof *r);
    assert_int_equal(mp_init(&(mp_options){.meta = meta, .keep_timeline = true}), MP_OK);
    r->ctx = ag_ctx_new();
    ag_ctx_set_framework(r->ctx, fw);
    llama_config cfg;
    ag_err err = {{0}};
    load_config(&cfg, "tiny_untied");
    if (llama_model_new(&r->m, r->ctx, &cfg, &err) != 0) fail_msg("%s", err.msg);
    if (!meta && llama_model_load(r->m, MEMBILL_GOLDEN_DIR "/tiny_untied/model.safetensors", &err) != 0)
        fail_msg("%s", err.msg);
    llama_lora_config l = all_linear(RANK);
    if (llama_model_add_lora(r->m, r->ctx, &l, 7, &err) != 0) fail_msg("%s", err.msg);
    if (load && !meta && llama_adapter_load(r->m, ADAPTER_DIR, &err) != 0) fail_msg("%s", err.msg);
    if (meta) return;
    if (llama_st_open(&r->g, MEMBILL_GOLDEN_DIR "/tiny_lora/golden.safetensors", &err) != 0) fail_msg("%s", err.msg);
    golden_ids_of(r->g, r->ids, B, T);
}

static void run_close(run *r) {
    llama_st_close(r->g);
    llama_model_free(r->m);
    ag_ctx_free(r->ctx);
    for (int c = 0; c < MP_OTHER; c++) assert_int_equal(mp_get_counter(c).live, 0);
    mp_shutdown();
}

// Every adapter (or its gradient) against golden "<prefix>.base_model.model.<name>".
static void check_adapters(const run *r, const char *prefix, bool grads) {
    assert_int_equal(r->m->nadapters, 2 * 7 * 2);
    for (size_t i = 0; i < r->m->nadapters; i++) {
        const ag_tensor *a = r->m->adapters[i];
        const ag_tensor *src = grads ? a->grad : a;
        char key[256];
        snprintf(key, sizeof key, "%s.base_model.model.%s", prefix, ag_tensor_name(a));
        size_t n;
        float *want = golden_f32(r->g, key, &n);
        assert_non_null(src);
        assert_int_equal(n, (size_t)a->numel);
        double mx = 0, diff = 0;
        for (size_t j = 0; j < n; j++) {
            mx = fmax(mx, fabs(want[j]));
            diff = fmax(diff, fabs(want[j] - ag_f32(src)[j]));
        }
        if (!(mx > 0) || diff > TOL * mx) fail_msg("%s: max diff %.3g, max|golden| %.3g", key, diff, mx);
        free(want);
    }
}

static float step_forward_backward(run *r) {
    ag_err err = {{0}};
    ag_tensor *loss = llama_forward_loss(r->ctx, r->m, r->ids, B, T, &err);
    if (!loss) fail_msg("%s", err.msg);
    if (ag_backward(r->ctx, loss) != AG_OK) fail_msg("%s", ag_ctx_error(r->ctx));
    float l = loss->data ? ag_f32(loss)[0] : 0;
    ag_release(loss);
    return l;
}

static uint64_t adapter_params(const llama_model *m) {
    uint64_t n = 0;
    for (size_t i = 0; i < m->nadapters; i++) n += (uint64_t)m->adapters[i]->numel;
    return n;
}

// Loss and gradients under each framework: the same math. The bill to the byte on the way.
static void grads_as(ag_framework fw) {
    run r;
    run_open(&r, false, fw, true);
    const uint64_t base = llama_param_count(&r.m->cfg), ad = adapter_params(r.m);
    assert_int_equal(ad, llama_lora_param_count(&r.m->cfg, &r.m->lora.cfg));
    assert_int_equal(llama_model_trainable_count(r.m), ad);
    assert_int_equal(live(MP_WEIGHT), 4 * (base + ad));
    float l = step_forward_backward(&r);
    size_t n;
    float *want = golden_f32(r.g, "loss", &n);
    assert_true(fabs(l - want[0]) <= 1e-5 * fabs(want[0]));
    free(want);
    check_adapters(&r, "grad", true);
    assert_int_equal(live(MP_GRADIENT), 4 * ad); // trainable x bytes, nothing for the base
    for (size_t i = 0; i < r.m->nparams; i++) assert_null(r.m->params[i]->grad);
    run_close(&r);
}

// Phi-3 (tests/golden/tiny_phi3_lora, tests/reference/phi3_ref.py): a target is the fused matrix
// as PEFT sees it (qkv_proj, gate_up_proj: B as wide as the fused output, its output split with the
// base's), loaded from PEFT's files; loss and every adapter's gradient under every framework, meta
// equal to real. all-linear is phi3's four linears; the default targets (q_proj, v_proj), which a
// phi3 block lacks, are refused by name (PEFT has no default for phi3).
static void test_phi3_fused_targets(void **s) {
    (void)s;
    ag_err err = {{0}};
    llama_lora_config l;
    char base[64];
    const char *dir = MEMBILL_GOLDEN_DIR "/tiny_phi3_lora";
    if (llama_adapter_read_config(dir, &l, base, sizeof base, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(l.targets, (1u << LLAMA_PROJ_QKV) | (1u << LLAMA_PROJ_O) | (1u << LLAMA_PROJ_GATE_UP) |
                                    (1u << LLAMA_PROJ_DOWN));
    for (ag_framework fw = AG_FRAMEWORK_LEAN; fw <= AG_FRAMEWORK_PYTORCH_113; fw++) {
        uint64_t bill[2][MP_OTHER] = {{0}};
        for (int meta = 1; meta >= 0; meta--) {
            assert_int_equal(mp_init(&(mp_options){.meta = meta}), MP_OK);
            ag_ctx *ctx = ag_ctx_new();
            ag_ctx_set_framework(ctx, fw);
            llama_config cfg;
            llama_model *m;
            load_config(&cfg, "tiny_phi3");
            if (llama_model_new(&m, ctx, &cfg, &err) != 0) fail_msg("%s", err.msg);
            if (!meta && llama_model_load(m, MEMBILL_GOLDEN_DIR "/tiny_phi3/model.safetensors", &err) != 0)
                fail_msg("%s", err.msg);
            if (llama_model_add_lora(m, ctx, &l, 7, &err) != 0) fail_msg("%s", err.msg);
            assert_int_equal(m->nadapters, 2 * 4 * cfg.layers);
            assert_int_equal(adapter_params(m), llama_lora_param_count(&cfg, &l));
            if (!meta && llama_adapter_load(m, dir, &err) != 0) fail_msg("%s", err.msg);
            run r = {.ctx = ctx, .m = m};
            if (!meta) {
                if (llama_st_open(&r.g, MEMBILL_GOLDEN_DIR "/tiny_phi3_lora/golden.safetensors", &err) != 0)
                    fail_msg("%s", err.msg);
                golden_ids_of(r.g, r.ids, B, T);
            }
            float loss = step_forward_backward(&r);
            for (int c = 0; c < MP_OTHER; c++) bill[meta][c] = mp_get_counter(c).peak;
            if (!meta) {
                size_t n;
                float *want = golden_f32(r.g, "loss", &n);
                assert_true(fabs(loss - want[0]) <= 1e-5 * fabs(want[0]));
                free(want);
                for (size_t i = 0; i < m->nadapters; i++) {
                    char key[256];
                    snprintf(key, sizeof key, "grad.base_model.model.%s", ag_tensor_name(m->adapters[i]));
                    float *g = golden_f32(r.g, key, &n);
                    assert_int_equal(n, (size_t)m->adapters[i]->numel);
                    double mx = 0, diff = 0;
                    for (size_t j = 0; j < n; j++)
                        mx = fmax(mx, fabs(g[j])), diff = fmax(diff, fabs(g[j] - ag_f32(m->adapters[i]->grad)[j]));
                    if (!(mx > 0) || diff > TOL * mx) fail_msg("%s: max diff %.3g, max|golden| %.3g", key, diff, mx);
                    free(g);
                }
            }
            llama_st_close(r.g);
            llama_model_free(m);
            ag_ctx_free(ctx);
            mp_shutdown();
        }
        for (int c = 0; c < MP_OTHER; c++) assert_int_equal(bill[1][c], bill[0][c]);
    }
    // all-linear: phi3's four; q_proj and v_proj (the default) refused by name
    assert_int_equal(mp_init(&(mp_options){.meta = true}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    llama_config cfg;
    llama_model *m;
    load_config(&cfg, "tiny_phi3");
    if (llama_model_new(&m, ctx, &cfg, &err) != 0) fail_msg("%s", err.msg);
    llama_lora_config d = all_linear(RANK);
    d.targets = LLAMA_LORA_DEFAULT_TARGETS;
    assert_int_equal(llama_model_add_lora(m, ctx, &d, 7, &err), -1);
    assert_non_null(strstr(err.msg, "q_proj,v_proj are no module of Phi3ForCausalLM"));
    assert_non_null(strstr(err.msg, "PEFT has no default targets for phi3"));
    d = all_linear(RANK);
    assert_int_equal(llama_model_add_lora(m, ctx, &d, 7, &err), 0);
    assert_int_equal(m->lora.cfg.targets, l.targets);
    llama_model_free(m);
    ag_ctx_free(ctx);
    mp_shutdown();
}

static void test_grads_lean(void **s) {
    (void)s;
    grads_as(AG_FRAMEWORK_LEAN);
}
static void test_grads_pytorch(void **s) {
    (void)s;
    grads_as(AG_FRAMEWORK_PYTORCH);
}

// Two Adam steps (lr 1e-3) over the adapters alone: the state is 2 x the adapters, none for the
// frozen base, and the adapters end where PyTorch's do.
static void test_two_adam_steps(void **s) {
    (void)s;
    run r;
    run_open(&r, false, AG_FRAMEWORK_PYTORCH, true);
    ag_err err = {{0}};
    optim_config oc = optim_defaults(OPTIM_ADAM);
    oc.adam_impl = OPTIM_ADAM_FOR_LOOP;
    optim *o = optim_new(&oc, r.m->trainable, r.m->ntrainable, &err);
    assert_non_null(o);
    const uint64_t ad = adapter_params(r.m);
    size_t n;
    float *losses = golden_f32(r.g, "adam_losses", &n);
    for (int k = 0; k < 2; k++) {
        optim_zero_grad(o);
        float l = step_forward_backward(&r);
        assert_true(fabs(l - losses[k]) <= 1e-5 * fabs(losses[k]));
        if (optim_step(o, &err) != 0) fail_msg("%s", err.msg);
        assert_int_equal(live(MP_OPTIMIZER), 8 * ad);
        assert_int_equal(mp_get_counter(MP_GRADIENT).peak, 4 * ad);
    }
    free(losses);
    check_adapters(&r, "adam", false);
    optim_free(o);
    run_close(&r);
}

// One training step's category peaks: meta mode bills what a real run allocates, to the byte.
static void step_peaks(bool meta, ag_framework fw, uint64_t peaks[MP_NCATEGORIES], uint64_t *total) {
    run r;
    run_open(&r, meta, fw, false);
    ag_err err = {{0}};
    optim_config oc = optim_defaults(OPTIM_ADAM);
    oc.adam_impl = OPTIM_ADAM_FOR_LOOP;
    optim *o = optim_new(&oc, r.m->trainable, r.m->ntrainable, &err);
    step_forward_backward(&r);
    assert_int_equal(optim_step(o, &err), 0);
    optim_free(o);
    for (int c = 0; c < MP_OTHER; c++) peaks[c] = mp_get_counter(c).peak;
    *total = mp_peak().total;
    run_close(&r);
}

static void test_meta_equals_real(void **s) {
    (void)s;
    const ag_framework fws[] = {AG_FRAMEWORK_LEAN, AG_FRAMEWORK_PYTORCH, AG_FRAMEWORK_PYTORCH_113};
    for (size_t f = 0; f < 3; f++) {
        uint64_t real[MP_NCATEGORIES] = {0}, meta[MP_NCATEGORIES] = {0}, tr, tm;
        step_peaks(false, fws[f], real, &tr);
        step_peaks(true, fws[f], meta, &tm);
        for (int c = 0; c < MP_OTHER; c++)
            if (real[c] != meta[c])
                fail_msg("framework %zu: %s real %llu, meta %llu", f, mp_category_name(c), (unsigned long long)real[c],
                         (unsigned long long)meta[c]);
    }
}

// With a frozen base nothing saves an input for a weight's gradient that nobody wants: the saved
// set of a LoRA forward is below the full fine-tune's.
static void test_frozen_saves_less(void **s) {
    (void)s;
    uint64_t saved[2];
    for (int lora = 0; lora < 2; lora++) {
        assert_int_equal(mp_init(&(mp_options){.meta = true}), MP_OK);
        ag_ctx *ctx = ag_ctx_new();
        ag_ctx_set_framework(ctx, AG_FRAMEWORK_PYTORCH);
        llama_config cfg;
        load_config(&cfg, "tiny_untied");
        llama_model *m = NULL;
        ag_err err = {{0}};
        assert_int_equal(llama_model_new(&m, ctx, &cfg, &err), 0);
        llama_lora_config l = all_linear(RANK);
        if (lora) assert_int_equal(llama_model_add_lora(m, ctx, &l, 1, &err), 0);
        ag_tensor *loss = llama_forward_loss(ctx, m, NULL, B, T, &err);
        assert_non_null(loss);
        saved[lora] = ag_tape_saved_bytes(ctx);
        ag_release(loss);
        ag_tape_clear(ctx);
        llama_model_free(m);
        ag_ctx_free(ctx);
        mp_shutdown();
    }
    assert_true(saved[1] < saved[0]);
}

// Saved through PEFT's format and read back: the same tensors, bit for bit; the config too.
static void test_save_reload(void **s) {
    (void)s;
    run r;
    run_open(&r, false, AG_FRAMEWORK_LEAN, true);
    char dir[] = "/tmp/membill_lora_XXXXXX", path[256];
    assert_non_null(mkdtemp(dir));
    ag_err err = {{0}};
    snprintf(path, sizeof path, "%s/%s", dir, LLAMA_ADAPTER_WEIGHTS);
    FILE *f = fopen(path, "wb");
    assert_int_equal(llama_adapter_write_weights(r.m, f, &err), 0);
    fclose(f);
    snprintf(path, sizeof path, "%s/%s", dir, LLAMA_ADAPTER_CONFIG);
    f = fopen(path, "w");
    assert_int_equal(llama_adapter_write_config(r.m, f, &err), 0);
    fclose(f);
    llama_lora_config l;
    char base[128];
    assert_int_equal(llama_adapter_read_config(dir, &l, base, sizeof base, &err), 0);
    assert_int_equal(l.rank, RANK);
    assert_true(l.alpha == 8.0 && l.dropout == 0.0 && l.targets == LLAMA_LORA_ALL);
    llama_model *back = NULL;
    assert_int_equal(llama_model_new(&back, r.ctx, &r.m->cfg, &err), 0);
    assert_int_equal(llama_model_add_lora(back, r.ctx, &l, 99, &err), 0); // another init, overwritten
    if (llama_adapter_load(back, dir, &err) != 0) fail_msg("%s", err.msg);
    for (size_t i = 0; i < r.m->nadapters; i++)
        assert_memory_equal(back->adapters[i]->data, r.m->adapters[i]->data,
                            (size_t)r.m->adapters[i]->numel * sizeof(float));
    llama_model_free(back);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s", dir, LLAMA_ADAPTER_WEIGHTS);
    unlink(path);
    rmdir(dir);
    run_close(&r);
}

// The golden adapter into a model it does not fit: one line naming the tensor.
static void refused(const char *folder, int64_t rank, unsigned targets, const char *expect) {
    assert_int_equal(mp_init(&(mp_options){0}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    llama_config cfg;
    load_config(&cfg, folder);
    llama_model *m = NULL;
    ag_err err = {{0}};
    assert_int_equal(llama_model_new(&m, ctx, &cfg, &err), 0);
    llama_lora_config l = all_linear(rank);
    l.targets = targets;
    assert_int_equal(llama_model_add_lora(m, ctx, &l, 1, &err), 0);
    assert_int_equal(llama_adapter_load(m, ADAPTER_DIR, &err), -1);
    if (!strstr(err.msg, expect)) fail_msg("message '%s' lacks '%s'", err.msg, expect);
    assert_null(strchr(err.msg, '\n'));
    llama_model_free(m);
    ag_ctx_free(ctx);
    mp_shutdown();
}

static void test_refusals(void **s) {
    (void)s;
    // another rank: the first tensor, its shape and the one expected
    refused("tiny_untied", 8, LLAMA_LORA_ALL,
            "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight is [4, 160], "
            "expected [8, 160]");
    // another model: tiny_mha has 4 key-value heads, so k_proj's B is [64, 4], not [32, 4]
    refused("tiny_mha", RANK, LLAMA_LORA_ALL, "k_proj.lora_B.weight is [32, 4], expected [64, 4]");
    // fewer targets: the file's others are not adapters of this model
    refused("tiny_untied", RANK, LLAMA_LORA_DEFAULT_TARGETS, "is not an adapter of this model");
}

static void test_targets(void **s) {
    (void)s;
    unsigned t;
    ag_err err = {{0}};
    assert_int_equal(llama_lora_parse_targets("q_proj,v_proj", &t, &err), 0);
    assert_int_equal(t, LLAMA_LORA_DEFAULT_TARGETS);
    assert_int_equal(llama_lora_parse_targets("all-linear", &t, &err), 0);
    assert_int_equal(t, LLAMA_LORA_ALL);
    assert_int_equal(llama_lora_parse_targets("q_proj,q_proj", &t, &err), -1);
    assert_non_null(strstr(err.msg, "given twice"));
    assert_int_equal(llama_lora_parse_targets("q_proj,lm_head", &t, &err), -1);
    assert_non_null(strstr(err.msg, "item 2 'lm_head'"));
    char buf[128];
    assert_string_equal(llama_lora_targets_text(LLAMA_LORA_ALL, buf, sizeof buf),
                        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_targets),
        cmocka_unit_test(test_grads_lean),
        cmocka_unit_test(test_phi3_fused_targets),
        cmocka_unit_test(test_grads_pytorch),
        cmocka_unit_test(test_two_adam_steps),
        cmocka_unit_test(test_meta_equals_real),
        cmocka_unit_test(test_frozen_saves_less),
        cmocka_unit_test(test_save_reload),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
