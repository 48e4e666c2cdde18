// Greedy generation of the tiny models against the PyTorch reference (tests/golden, written by
// tests/reference/make_golden.py with HF generate semantics): solo prompt, cached and uncached,
// the left-padded batch, and each row of it generated alone.
#include "infer_util.h"

#define T 7 // golden prompts
#define N 8 // golden new tokens

// The attention the checks below generate with (the families run both).
static ag_attention_kind attention = AG_ATTENTION_EAGER;

// new ids [B, N] of prompt [B, t] (mask may be NULL), checking the bill on the way out.
static void generate(it_run *r, bool cache, const int32_t *ids, const int32_t *mask, int64_t B, int64_t t,
                     int32_t *out) {
    ag_err err = {{0}};
    llama_generate_opts o = {.use_cache = cache};
    llama_generate_stats st;
    if (llama_generate(r->ctx, r->m, &o, ids, mask, B, t, N, out, &st, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(st.steps, N);
    for (int k = 0; k < N; k++) assert_true(st.step_s[k] >= 0);
    llama_generate_stats_free(&st);
    it_assert_only_weights(); // activations released, the cache freed
}

static void check_solo(const char *folder) {
    it_run r;
    it_open_golden(&r, folder);
    ag_ctx_set_attention(r.ctx, attention);
    int32_t *ids = it_golden_ids(&r, "input_ids", 2, T);
    int32_t *want = it_golden_ids(&r, "greedy", 1, N);
    int32_t cached[N], uncached[N];
    generate(&r, true, ids, NULL, 1, T, cached);
    it_assert_ids(cached, want, N, "greedy with the cache");
    generate(&r, false, ids, NULL, 1, T, uncached);
    it_assert_ids(uncached, cached, N, "greedy without the cache");
    free(ids);
    free(want);
    it_close(&r);
}

static void test_tied_solo(void **s) {
    (void)s;
    check_solo("tiny_tied");
}
static void test_untied_solo(void **s) {
    (void)s;
    check_solo("tiny_untied");
}

// The padded batch equals the golden one, with and without the cache, and each row equals its
// prompt generated alone, without pads.
static void check_batch(const char *folder) {
    it_run r;
    it_open_golden(&r, folder);
    ag_ctx_set_attention(r.ctx, attention);
    int32_t *ids = it_golden_ids(&r, "prompt_batch", 2, T);
    int32_t *mask = it_golden_ids(&r, "mask_batch", 2, T);
    int32_t *want = it_golden_ids(&r, "greedy_batch", 2, N);
    int32_t got[2 * N], solo[N];
    generate(&r, true, ids, mask, 2, T, got);
    it_assert_ids(got, want, 2 * N, "padded batch with the cache");
    generate(&r, false, ids, mask, 2, T, got);
    it_assert_ids(got, want, 2 * N, "padded batch without the cache");
    for (int b = 0; b < 2; b++) {
        int pads = 0;
        while (mask[b * T + pads] == 0) pads++;
        generate(&r, true, ids + b * T + pads, NULL, 1, T - pads, solo);
        it_assert_ids(got + b * N, solo, N, b ? "row 1 against its prompt alone" : "row 0 alone");
    }
    free(ids);
    free(mask);
    free(want);
    it_close(&r);
}

static void test_tied_batch(void **s) {
    (void)s;
    check_batch("tiny_tied");
}
static void test_untied_batch(void **s) {
    (void)s;
    check_batch("tiny_untied");
}

// The batch comparison can fail: with the mask ignored, the pads of row 1 are read as tokens
// (id 0 at positions 0 to 2) and row 1 generates something else.
static void test_mask_matters(void **s) {
    (void)s;
    it_run r;
    it_open_golden(&r, "tiny_tied");
    int32_t *ids = it_golden_ids(&r, "prompt_batch", 2, T);
    int32_t *want = it_golden_ids(&r, "greedy_batch", 2, N);
    int32_t got[2 * N];
    generate(&r, true, ids, NULL, 2, T, got);
    it_assert_ids(got, want, N, "row 0 (no pads)");
    assert_true(memcmp(got + N, want + N, N * sizeof(int32_t)) != 0);
    free(ids);
    free(want);
    it_close(&r);
}

// Qwen2 (biases, a window on its second layer), Qwen3 (q/k norms, head_dim 24), Mistral (a
// window of 3 over a 7-token prompt and 8 new tokens): the reference's tokens, solo and as a
// padded batch, with and without the cache, eager and flash. The mixtures of experts route every
// token of each forward (pads included, as transformers' sparse blocks do).
static void test_families(void **s) {
    (void)s;
    const char *folders[] = {"tiny_qwen2",   "tiny_qwen3",     "tiny_mistral",
                             "tiny_mixtral", "tiny_qwen2_moe", "tiny_qwen3_moe"};
    for (int a = 0; a < 2; a++) {
        attention = a ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER;
        for (int f = 0; f < 6; f++) {
            check_solo(folders[f]);
            check_batch(folders[f]);
        }
    }
    attention = AG_ATTENTION_EAGER;
}

// gpt_oss (tests/reference/gpt_oss_ref.py): the sinks in the cached attention, the alternating
// window, YaRN, the stacked experts: the reference's greedy tokens, with and without the cache,
// eager and flash (the lean framework, the context's default).
static void test_gpt_oss(void **s) {
    (void)s;
    for (int a = 0; a < 2; a++) {
        attention = a ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER;
        check_solo("tiny_gpt_oss");
    }
    attention = AG_ATTENTION_EAGER;
}

// deepseek_v3 (tests/reference/deepseek_ref.py): the latent attention over transformers' expanded
// cache (keys at nope + rope, values at v_head_dim) and over DeepSeek's latent one (kv_b_proj
// absorbed), the sigmoid router: the reference's greedy tokens with either cache and without one;
// a left-padded batch of two rows gives each row's tokens alone (the pads hidden from the keys).
static void test_deepseek_v3(void **s) {
    (void)s;
    check_solo("tiny_deepseek_v3");
    it_run r;
    it_open_golden(&r, "tiny_deepseek_v3");
    int32_t *ids = it_golden_ids(&r, "input_ids", 2, T), *want = it_golden_ids(&r, "greedy", 1, N);
    for (int latent = 0; latent < 2; latent++) {
        r.m->cfg.mla.latent_cache = latent;
        int32_t got[2 * N], solo[N], batch[2 * T], mask[2 * T];
        generate(&r, true, ids, NULL, 1, T, got);
        it_assert_ids(got, want, N, latent ? "greedy with the latent cache" : "greedy with the expanded cache");
        for (int j = 0; j < T; j++) { // row 1: its last 4 tokens, left-padded
            batch[j] = ids[j], mask[j] = 1;
            batch[T + j] = j < 3 ? 0 : ids[T + j], mask[T + j] = j >= 3;
        }
        generate(&r, true, batch, mask, 2, T, got);
        it_assert_ids(got, want, N, "row 0 of a padded batch");
        generate(&r, true, ids + T + 3, NULL, 1, T - 3, solo);
        it_assert_ids(got + N, solo, N, "row 1 of a padded batch against its prompt alone");
    }
    free(ids);
    free(want);
    it_close(&r);
}

// Gemma 2 (tests/reference/gemma_ref.py's greedy tokens): the embeddings scaled, the cached
// attention's scale and soft-cap, the final soft-cap; eager under both frameworks (flash refuses a
// soft-cap by name).
static void test_gemma2(void **s) {
    (void)s;
    check_solo("tiny_gemma2");
    check_solo("tiny_gemma3"); // q_norm, k_norm, the local RoPE of the sliding layers
    it_run r;
    it_open_golden(&r, "tiny_gemma2");
    ag_ctx_set_framework(r.ctx, AG_FRAMEWORK_PYTORCH);
    int32_t *ids = it_golden_ids(&r, "input_ids", 2, T), *want = it_golden_ids(&r, "greedy", 1, N), got[N];
    generate(&r, true, ids, NULL, 1, T, got);
    it_assert_ids(got, want, N, "greedy under --framework pytorch");
    ag_ctx_set_attention(r.ctx, AG_ATTENTION_FLASH);
    ag_err err = {{0}};
    assert_int_equal(llama_generate(r.ctx, r.m, NULL, ids, NULL, 1, T, N, got, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "soft-cap"));
    free(ids);
    free(want);
    it_close(&r);
}

// Phi-3 (tests/reference/phi3_ref.py's greedy tokens): the fused projections split in the cached
// forward, the window; longrope's long factors (a prompt past the original context), with and
// without the cache, eager and flash, lean and pytorch. A generation crossing the original context
// is refused.
static void test_phi3(void **s) {
    (void)s;
    for (int a = 0; a < 2; a++) {
        attention = a ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER;
        check_solo("tiny_phi3");
        check_solo("tiny_phi3_longrope");
    }
    attention = AG_ATTENTION_EAGER;
    it_run r;
    it_open_golden(&r, "tiny_phi3_longrope");
    ag_ctx_set_framework(r.ctx, AG_FRAMEWORK_PYTORCH);
    int32_t *ids = it_golden_ids(&r, "input_ids", 2, T), *want = it_golden_ids(&r, "greedy", 1, N), got[N];
    generate(&r, true, ids, NULL, 1, T, got);
    it_assert_ids(got, want, N, "greedy under --framework pytorch");
    ag_err err = {{0}};
    assert_int_equal(llama_generate(r.ctx, r.m, NULL, ids, NULL, 1, 3, 4, got, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "longrope"));
    free(ids);
    free(want);
    it_close(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tied_solo),    cmocka_unit_test(test_untied_solo),  cmocka_unit_test(test_tied_batch),
        cmocka_unit_test(test_untied_batch), cmocka_unit_test(test_mask_matters), cmocka_unit_test(test_families),
        cmocka_unit_test(test_gpt_oss),      cmocka_unit_test(test_gemma2),       cmocka_unit_test(test_phi3),
        cmocka_unit_test(test_deepseek_v3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
