// --framework: the bill of PyTorch + transformers against PyTorch 1.13's own profiler
// (tests/golden/pytorch, written by tests/reference/profile_step.py), the lean bill unchanged,
// and meta == real under every framework.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>
#include <jansson.h>

#include "cli_run.h"

#ifndef MEMBILL_GOLDEN_DIR
#error "MEMBILL_GOLDEN_DIR must name the tests/golden folder"
#endif

static int64_t num(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) print_error("no integer %s\n", key);
    assert_true(json_is_integer(v));
    return (int64_t)json_integer_value(v);
}

static int64_t live_sum(const json_t *end_live) {
    const char *k;
    const json_t *v;
    int64_t s = 0;
    json_object_foreach((json_t *)end_live, k, v) s += (int64_t)json_integer_value(v);
    return s;
}

static double worst_phase, worst_role;

static void close_to(const char *what, int64_t got, int64_t want, double rtol, double *worst) {
    double rel = want ? fabs((double)(got - want)) / (double)want : (double)(got != 0);
    if (rel > *worst) *worst = rel;
    if (rel > rtol)
        print_error("%s: membill %lld, PyTorch %lld (%.4f%%)\n", what, (long long)got, (long long)want, 100 * rel);
    assert_true(rel <= rtol);
}

static const json_t *phase_named(const json_t *phases, const char *name) {
    size_t i;
    const json_t *p;
    json_array_foreach((json_t *)phases, i,
                       p) if (!strcmp(json_string_value(json_object_get(p, "name")), name)) return p;
    print_error("no phase %s\n", name);
    fail();
    return NULL;
}

// A golden's "routing" ([step][layer][expert] tokens) as membill's routing file.
static void write_routing(const char *path, const json_t *taken, const json_t *model, int64_t tokens) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"membill_routing\": 1, \"experts\": %lld, \"top_k\": %lld, \"layers\": [",
            (long long)num(model, "num_local_experts"), (long long)num(model, "num_experts_per_tok"));
    size_t s, l;
    const json_t *step, *layer;
    bool first = true;
    json_array_foreach((json_t *)taken, s, step) json_array_foreach((json_t *)step, l, layer) {
        char *c = json_dumps(layer, JSON_COMPACT);
        fprintf(f, "%s{\"forward\": %zu, \"layer\": %zu, \"tokens\": %lld, \"count\": %s}", first ? "" : ", ", s, l,
                (long long)tokens, c);
        free(c);
        first = false;
    }
    fprintf(f, "]}\n");
    fclose(f);
}

// One configuration of the golden set: every phase's peak and end-live of both steps within
// 0.05%, the saved set after the forward by role within 0.1%.
static void against_golden(const char *name, const char *extra) {
    char path[512], args[1600];
    snprintf(path, sizeof path, "%s/pytorch/%s.json", MEMBILL_GOLDEN_DIR, name);
    json_t *g = json_load_file(path, 0, NULL);
    assert_non_null(g);
    const json_t *cfg = json_object_get(g, "config");
    // a family other than SmolLM2's: its config.json, written from the golden file's own fields
    char model[600] = "";
    const json_t *fields = json_object_get(cfg, "model");
    if (json_object_get(fields, "model_type")) {
        char cpath[512];
        snprintf(cpath, sizeof cpath, "%s/%s.json", cli_run_dir, name);
        assert_int_equal(json_dump_file(fields, cpath, 0), 0);
        snprintf(model, sizeof model, "--config %s", cpath);
    }
    // a mixture of experts: the routing PyTorch's run took, for the meta run to bill
    char routing[700] = "";
    const json_t *taken = json_object_get(g, "routing");
    if (taken) {
        char rpath[512];
        snprintf(rpath, sizeof rpath, "%s/%s.routing.json", cli_run_dir, name);
        write_routing(rpath, taken, fields, num(cfg, "batch") * num(cfg, "seq_len"));
        snprintf(routing, sizeof routing, "--routing %s", rpath);
    }
    snprintf(args, sizeof args, "train --meta --framework pytorch-1.13 --steps 2 --batch %lld --seq-len %lld %s %s %s",
             (long long)num(cfg, "batch"), (long long)num(cfg, "seq_len"), model, extra, routing);
    json_t *m = cli_run_json(args);
    const json_t *gsteps = json_object_get(g, "steps"), *msteps = json_object_get(m, "steps");
    assert_int_equal(json_array_size(msteps), 2);
    for (size_t s = 0; s < 2; s++) {
        const json_t *gs = json_array_get(gsteps, s), *ms = json_array_get(msteps, s);
        size_t i;
        const json_t *gp;
        json_array_foreach(json_object_get(gs, "phases"), i, gp) {
            const char *ph = json_string_value(json_object_get(gp, "name"));
            const json_t *mp = phase_named(json_object_get(ms, "phases"), ph);
            char what[256];
            snprintf(what, sizeof what, "%s step %zu %s peak", name, s + 1, ph);
            close_to(what, num(mp, "peak_bytes"), num(gp, "peak_bytes"), 5e-4, &worst_phase);
            snprintf(what, sizeof what, "%s step %zu %s end live", name, s + 1, ph);
            close_to(what, live_sum(json_object_get(mp, "end_live")), num(gp, "end_live_bytes"), 5e-4, &worst_phase);
        }
        const char *role;
        const json_t *gv;
        json_object_foreach(json_object_get(gs, "saved_by_role"), role, gv) {
            const json_t *mv = json_object_get(json_object_get(ms, "saved_by_role"), role);
            char what[256];
            snprintf(what, sizeof what, "%s step %zu saved %s", name, s + 1, role);
            close_to(what, mv ? (int64_t)json_integer_value(mv) : 0, (int64_t)json_integer_value(gv), 1e-3,
                     &worst_role);
        }
    }
    json_decref(m);
    json_decref(g);
}

static void golden_fp32_forloop(void **state) {
    (void)state;
    against_golden("smollm2_135m_b1_t25_fp32_forloop", "--adam-impl for-loop");
    against_golden("smollm2_135m_b1_t128_fp32_forloop", "--adam-impl for-loop");
    against_golden("smollm2_135m_b1_t512_fp32_forloop", "--adam-impl for-loop");
    against_golden("smollm2_135m_b2_t64_fp32_forloop", "--adam-impl for-loop");
}

static void golden_fp32_foreach(void **state) {
    (void)state;
    against_golden("smollm2_135m_b1_t25_fp32_foreach", "--adam-impl foreach");
    against_golden("smollm2_135m_b1_t128_fp32_foreach", "--adam-impl foreach");
    against_golden("smollm2_135m_b1_t512_fp32_foreach", "--adam-impl foreach");
    against_golden("smollm2_135m_b2_t64_fp32_foreach", "--adam-impl foreach");
}

// The model cast to bfloat16 (model.to(torch.bfloat16)) and float32 parameters under
// torch.autocast(bfloat16): a dtype per tensor, as PyTorch's type promotion and autocast give.
// Qwen3's attention (q, k, v and o biases, q_norm and k_norm) on SmolLM2-135M's shape.
static void golden_qwen3(void **state) {
    (void)state;
    against_golden("qwen3_135m_b1_t128_fp32_forloop", "--adam-impl for-loop");
}

// Head layouts SmolLM2 has not (a small untied Llama, 4 layers): multi-head attention, where
// repeat_kv returns k and v as they are, and one key-value head, whose expand + reshape is a view
// (no copy at batch 1; at batch 2 the matmuls copy them).
static void golden_heads(void **state) {
    (void)state;
    against_golden("tiny_mha_b1_t128_fp32_forloop", "--adam-impl for-loop");
    against_golden("tiny_mha_b2_t64_fp32_forloop", "--adam-impl for-loop");
    against_golden("tiny_mqa_b1_t128_fp32_forloop", "--adam-impl for-loop");
    against_golden("tiny_mqa_b2_t64_fp32_forloop", "--adam-impl for-loop");
}

// torch.utils.checkpoint (reentrant) around every layer, as transformers 4.4x calls it: each
// layer keeps a CPU RNG state and its tensor arguments (the causal mask and the positions, until
// its backward ran) and the rotary tables (until the loss goes), at two lengths.
static void golden_checkpointing(void **state) {
    (void)state;
    against_golden("tiny_gqa_ckpt_b1_t128_fp32_forloop", "--adam-impl for-loop --checkpointing");
    against_golden("tiny_gqa_ckpt_b1_t512_fp32_forloop", "--adam-impl for-loop --checkpointing");
}

// A tiny Mixtral: its router and its experts' eager loop, under the routing PyTorch's run took.
static void golden_mixtral(void **state) {
    (void)state;
    against_golden("mixtral_tiny_b1_t128_fp32_forloop", "--adam-impl for-loop");
}

static void golden_16_bit(void **state) {
    (void)state;
    against_golden("smollm2_135m_b1_t128_bf16_forloop", "--adam-impl for-loop --dtype bf16");
    against_golden("smollm2_135m_b1_t128_autocast_forloop", "--adam-impl for-loop --dtype autocast-bf16");
    print_message("worst against PyTorch 1.13: phase peaks and end-live %.5f%%, saved set by role %.5f%%\n",
                  100 * worst_phase, 100 * worst_role);
}

static int64_t cat_peak(const json_t *j, const char *cat) {
    return num(json_object_get(json_object_get(j, "categories"), cat), "peak_bytes");
}

// The lean framework is the bill membill gave before frameworks existed.
static void lean_unchanged(void **state) {
    (void)state;
    json_t *j = cli_run_json("train --meta --framework lean --adam-impl fused");
    assert_int_equal(cat_peak(j, "activation"), 40578804);
    assert_int_equal(cat_peak(j, "weight") + cat_peak(j, "gradient") + cat_peak(j, "optimizer"), 2152240128);
    assert_int_equal(cat_peak(j, "temporary"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "run"), "framework")), "lean");
    json_decref(j);
}

// A real run and a meta run bill every tensor category, and every phase, alike. A mixture of
// experts (routed) bills in meta mode the routing the real run recorded.
static void meta_equals_real_fws(const char *model_args, bool routed, int f0) {
    static const char *const fws[] = {"pytorch", "pytorch-1.13", "lean"};
    static const char *const cats[] = {"weight", "gradient", "optimizer", "activation", "cache", "temporary"};
    for (int f = f0; f < 3; f++) {
        char a[1024], rec[256] = "", use[256] = "";
        if (strstr(model_args, "flash") && f == 1) continue; // PyTorch 1.13 has no SDPA
        if (routed) {
            snprintf(rec, sizeof rec, "--routing-out %s/routing.json", cli_run_dir);
            snprintf(use, sizeof use, "--routing %s/routing.json", cli_run_dir);
        }
        snprintf(a, sizeof a, "train --framework %s --steps 2 %s %s", fws[f], model_args, rec);
        json_t *real = cli_run_json(a);
        snprintf(a, sizeof a, "train --meta --framework %s --steps 2 %s %s", fws[f], model_args, use);
        json_t *meta = cli_run_json(a);
        if (routed) {
            assert_string_equal(json_string_value(json_object_get(json_object_get(real, "run"), "routing")),
                                "measured");
            assert_string_equal(json_string_value(json_object_get(json_object_get(meta, "run"), "routing")), "file");
        }
        for (int c = 0; c < 6; c++) assert_int_equal(cat_peak(meta, cats[c]), cat_peak(real, cats[c]));
        for (size_t s = 0; s < 2; s++) {
            const json_t *rs = json_array_get(json_object_get(real, "steps"), s),
                         *ms = json_array_get(json_object_get(meta, "steps"), s);
            assert_int_equal(num(rs, "saved_after_forward_bytes"), num(ms, "saved_after_forward_bytes"));
            size_t i;
            const json_t *rp;
            json_array_foreach(json_object_get(rs, "phases"), i, rp) {
                const json_t *mp = json_array_get(json_object_get(ms, "phases"), i);
                const json_t *re = json_object_get(rp, "end_live"), *me = json_object_get(mp, "end_live");
                for (int c = 0; c < 6; c++) assert_int_equal(num(re, cats[c]), num(me, cats[c]));
            }
        }
        json_decref(real);
        json_decref(meta);
    }
}

static void meta_equals_real_routed(const char *model_args, bool routed) {
    meta_equals_real_fws(model_args, routed, 0);
}

static void meta_equals_real_at(const char *model_args) { meta_equals_real_routed(model_args, false); }

static const char *write_tiny_config(void) {
    static char path[256];
    snprintf(path, sizeof path, "%s/tiny.json", cli_run_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 300, "
               "\"tie_word_embeddings\": true}\n");
    fclose(f);
    return path;
}

static void meta_equals_real_tiny(void **state) {
    (void)state;
    char a[512];
    const char *cfg = write_tiny_config();
    snprintf(a, sizeof a, "--config %s --seq-len 9", cfg);
    meta_equals_real_at(a);
    snprintf(a, sizeof a, "--config %s --seq-len 6 --batch 3 --adam-impl foreach", cfg);
    meta_equals_real_at(a);
    snprintf(a, sizeof a, "--config %s --seq-len 70 --batch 2 --attention flash", cfg);
    meta_equals_real_at(a);
    // checkpointed layers and what each keeps beside its input (Qwen2's: the sliding layer's own mask)
    snprintf(a, sizeof a, "--config %s --seq-len 9 --checkpointing", cfg);
    meta_equals_real_at(a);
    snprintf(a, sizeof a, "--config %s/tiny_qwen2/config.json --seq-len 9 --checkpointing", MEMBILL_GOLDEN_DIR);
    meta_equals_real_at(a);
    // the families: biases, q/k norms, windows (masks of both kinds; flash's past the window)
    const char *families[] = {"tiny_qwen2", "tiny_qwen3", "tiny_mistral"};
    for (int i = 0; i < 3; i++)
        for (int flash = 0; flash < 2; flash++) {
            snprintf(a, sizeof a, "--config %s/%s/config.json --seq-len 9%s", MEMBILL_GOLDEN_DIR, families[i],
                     flash ? " --attention flash" : "");
            meta_equals_real_at(a);
        }
    // Gemma 2: the norms around each sub-block, the soft-caps (tanh's output kept under the
    // PyTorch frameworks), its two masks; eager (flash refuses the cap), with checkpointing too
    for (int ck = 0; ck < 4; ck++) { // and Gemma 3's two rotary tables
        snprintf(a, sizeof a, "--config %s/tiny_gemma%d/config.json --seq-len 9 --batch 2%s", MEMBILL_GOLDEN_DIR,
                 ck < 2 ? 2 : 3, ck % 2 ? " --checkpointing" : "");
        meta_equals_real_at(a);
    }
}

// A tiny config of this family with one key-value head per query head (no repeat_kv copies).
static const char *write_mha_config(const char *family) {
    static char path[2][256];
    char *p = path[strcmp(family, "phi3") == 0];
    snprintf(p, 256, "%s/mha_%s.json", cli_run_dir, family);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"model_type\": \"%s\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, "
            "\"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"vocab_size\": 300, "
            "\"tie_word_embeddings\": false, \"rms_norm_eps\": 1e-05}\n",
            family);
    fclose(f);
    return p;
}

static int64_t saved_after_forward(const char *args) {
    json_t *j = cli_run_json(args);
    int64_t n = num(json_array_get(json_object_get(j, "steps"), 0), "saved_after_forward_bytes");
    json_decref(j);
    return n;
}

// Phi-3: the fused projections' parts, meta and real alike under every framework (batch 1 and 2,
// grouped and not: repeat_kv's copies, or v itself kept by the context's product), with the
// window, flash and checkpointing.
static void meta_equals_real_phi3(void **state) {
    (void)state;
    char a[512];
    static const char *const opts[] = {"--seq-len 9", "--seq-len 9 --batch 2", "--seq-len 40 --attention flash",
                                       "--seq-len 9 --checkpointing"};
    for (int i = 0; i < 4; i++) {
        snprintf(a, sizeof a, "--config %s/tiny_phi3/config.json %s", MEMBILL_GOLDEN_DIR, opts[i]);
        meta_equals_real_at(a);
    }
    snprintf(a, sizeof a, "--config %s --seq-len 9", write_mha_config("phi3"));
    meta_equals_real_at(a);
}

// What the split keeps, against the same model unfused (llama, the same sizes), batch 1 without
// grouping: under pytorch, v is a view of qkv_proj's output kept by the context's product, so the
// whole output stays (q's and k's parts too: 2 layers x 9 tokens x (64 + 64) x 4 bytes more);
// gate and up keep gate_up_proj's output, the two tensors the unfused MLP keeps. Under lean, v is
// copied out: the same saved set as the unfused model.
static void phi3_split_keeps(void **state) {
    (void)state;
    char a[1024];
    const char *phi3 = write_mha_config("phi3"), *llama = write_mha_config("llama");
    static const char *const fws[] = {"pytorch", "lean"};
    for (int f = 0; f < 2; f++) {
        snprintf(a, sizeof a, "train --meta --framework %s --config %s --seq-len 9", fws[f], phi3);
        int64_t fused = saved_after_forward(a);
        snprintf(a, sizeof a, "train --meta --framework %s --config %s --seq-len 9", fws[f], llama);
        int64_t apart = saved_after_forward(a);
        assert_int_equal(fused - apart, f == 0 ? 2 * 9 * (64 + 64) * 4 : 0);
    }
}

// The mixtures of experts: every bill follows the routing, so the meta run takes the real one's.
static void meta_equals_real_moe(void **state) {
    (void)state;
    char a[512];
    const char *families[] = {"tiny_mixtral", "tiny_qwen2_moe", "tiny_qwen3_moe"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "--config %s/%s/config.json --seq-len 23 --batch 2", MEMBILL_GOLDEN_DIR, families[i]);
        meta_equals_real_routed(a, true);
    }
}

// gpt_oss (sinks, alternating windows, the top-k-then-softmax router, stacked experts) runs under
// lean, eager and flash, training and generation, meta == real under the recorded routing; the
// PyTorch frameworks are refused by name.
static void meta_equals_real_gpt_oss(void **state) {
    (void)state;
    char a[512];
    snprintf(a, sizeof a, "--config %s/tiny_gpt_oss/config.json --seq-len 23 --batch 2", MEMBILL_GOLDEN_DIR);
    meta_equals_real_fws(a, true, 2);
    snprintf(a, sizeof a, "--config %s/tiny_gpt_oss/config.json --seq-len 70 --attention flash", MEMBILL_GOLDEN_DIR);
    meta_equals_real_fws(a, true, 2);
    // a generation (the sinks in the cached attention): meta == real under the recorded routing
    static const char *const cats[] = {"weight", "activation", "cache", "temporary"};
    for (int flash = 0; flash < 2; flash++) {
        snprintf(a, sizeof a,
                 "infer --framework lean --config %s/tiny_gpt_oss/config.json --seq-len 9 --new-tokens 5 --routing-out "
                 "%s/routing.json%s",
                 MEMBILL_GOLDEN_DIR, cli_run_dir, flash ? " --attention flash" : "");
        json_t *real = cli_run_json(a);
        snprintf(a, sizeof a,
                 "infer --meta --framework lean --config %s/tiny_gpt_oss/config.json --seq-len 9 --new-tokens 5 "
                 "--routing %s/routing.json%s",
                 MEMBILL_GOLDEN_DIR, cli_run_dir, flash ? " --attention flash" : "");
        json_t *meta = cli_run_json(a);
        for (int c = 0; c < 4; c++) assert_int_equal(cat_peak(meta, cats[c]), cat_peak(real, cats[c]));
        assert_true(cat_peak(real, "cache") > 0);
        json_decref(real);
        json_decref(meta);
    }
    static const char *const refused[][2] = {{"--framework pytorch", "GptOssExperts"},
                                             {"--framework pytorch-1.13", "GptOssExperts"}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        snprintf(a, sizeof a, "train --config %s/tiny_gpt_oss/config.json --seq-len 9 %s", MEMBILL_GOLDEN_DIR,
                 refused[i][0]);
        static run_result r;
        membill(&r, a);
        assert_int_equal(r.code, 1);
        if (!strstr(r.err, "gpt_oss") || !strstr(r.err, refused[i][1])) fail_msg("%s: %s", refused[i][0], r.err);
    }
}

// deepseek_v3 (latent attention, the sigmoid router with group-limited top-k, shared experts, a
// dense first layer) runs under lean with eager attention: meta == real under the recorded
// routing, training (with checkpointing too) and generation; the PyTorch frameworks and flash
// refused by name.
static void meta_equals_real_deepseek_v3(void **state) {
    (void)state;
    char a[512];
    for (int ck = 0; ck < 2; ck++) {
        snprintf(a, sizeof a, "--config %s/tiny_deepseek_v3/config.json --seq-len 23 --batch 2%s", MEMBILL_GOLDEN_DIR,
                 ck ? " --checkpointing" : "");
        meta_equals_real_fws(a, true, 2);
    }
    // a generation over transformers' expanded cache and over the latent one: meta == real under
    // the recorded routing, each cache to the byte
    static const char *const cats[] = {"weight", "activation", "cache", "temporary"};
    for (int run = 0; run < 4; run++) { // each cache in float32, then in bfloat16 (16-bit probabilities)
        const int latent = run % 2;
        const char *mc = latent ? "latent" : "expanded", *dt = run < 2 ? "fp32" : "bf16";
        snprintf(a, sizeof a,
                 "infer --framework lean --config %s/tiny_deepseek_v3/config.json --seq-len 9 --new-tokens 5 --batch 2 "
                 "--mla-cache %s --dtype %s --routing-out %s/routing.json",
                 MEMBILL_GOLDEN_DIR, mc, dt, cli_run_dir);
        json_t *real = cli_run_json(a);
        snprintf(a, sizeof a,
                 "infer --meta --framework lean --config %s/tiny_deepseek_v3/config.json --seq-len 9 --new-tokens 5 "
                 "--batch 2 --mla-cache %s --dtype %s --routing %s/routing.json",
                 MEMBILL_GOLDEN_DIR, mc, dt, cli_run_dir);
        json_t *meta = cli_run_json(a);
        for (int c = 0; c < 4; c++) assert_int_equal(cat_peak(meta, cats[c]), cat_peak(real, cats[c]));
        // 3 layers x 2 rows x 13 tokens x: 4 heads x (nope 8 + rope 4 keys, 10 values), or the latent
        // 16 + the rope key 4; x 4 bytes
        const int per = latent ? 16 + 4 : 4 * (12 + 10);
        const int bytes = run < 2 ? 4 : 2;
        assert_int_equal(cat_peak(real, "cache"), 3 * 2 * 13 * per * bytes);
        assert_int_equal(json_integer_value(json_object_get(json_object_get(real, "cache"), "bytes_per_token")),
                         3 * per * bytes);
        assert_string_equal(json_string_value(json_object_get(json_object_get(real, "run"), "mla_cache")), mc);
        json_decref(real);
        json_decref(meta);
    }
    static const char *const refused[][2] = {
        {"train --framework pytorch", "DeepseekV3Attention"},
        {"train --framework pytorch-1.13", "DeepseekV3Attention"},
        {"train --framework lean --attention flash", "--attention"},
        {"infer --framework lean --attention flash", "--attention"},
        {"train --framework lean --lora-rank 2", "q_proj"},
        {"train --framework lean --lora-rank 2 --lora-targets o_proj --base-dtype nf4", "--base-dtype"}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        snprintf(a, sizeof a, "%s --config %s/tiny_deepseek_v3/config.json --seq-len 9", refused[i][0],
                 MEMBILL_GOLDEN_DIR);
        static run_result r;
        membill(&r, a);
        assert_int_equal(r.code, 1);
        if (!strstr(r.err, "DeepseekV3") || !strstr(r.err, refused[i][1])) fail_msg("%s: %s", refused[i][0], r.err);
    }
}

// The same math under every framework: the same losses, step after step.
static void same_losses(void **state) {
    (void)state;
    char a[512];
    const char *cfg = write_tiny_config();
    double loss[3][3];
    static const char *const fws[] = {"pytorch", "pytorch-1.13", "lean"};
    for (int f = 0; f < 3; f++) {
        snprintf(a, sizeof a, "train --config %s --seq-len 9 --batch 2 --steps 3 --lr 1e-2 --framework %s", cfg,
                 fws[f]);
        json_t *j = cli_run_json(a);
        for (int s = 0; s < 3; s++)
            loss[f][s] = json_real_value(json_object_get(json_array_get(json_object_get(j, "steps"), s), "loss"));
        json_decref(j);
    }
    for (int s = 0; s < 3; s++)
        for (int f = 1; f < 3; f++) assert_true(fabs(loss[f][s] - loss[0][s]) <= 1e-5 * fabs(loss[0][s]));
    assert_true(loss[0][2] < loss[0][0]); // and it learns
}

// --attention flash at 1,024 tokens (lean): the activation peak is eager's less every block's
// probabilities (batch x 9 heads x T x T x 4) plus its log-sum-exp rows (batch x 9 x T x 4), to
// the byte, and no allocation of the timeline is a T x T matrix of the heads.
static void flash_against_eager_at(const char *extra, bool meta) {
    const long long L = 30, H = 9, T = 1024;
    char a[512], csv[256];
    snprintf(a, sizeof a, "train --framework lean --seq-len 1024 %s%s", extra, meta ? " --meta" : "");
    json_t *eager = cli_run_json(a);
    snprintf(csv, sizeof csv, "%s/flash.csv", cli_run_dir);
    snprintf(a, sizeof a, "train --framework lean --seq-len 1024 --attention flash --timeline %s %s%s", csv, extra,
             meta ? " --meta" : "");
    json_t *flash = cli_run_json(a);
    assert_int_equal(cat_peak(flash, "activation"), cat_peak(eager, "activation") - L * H * T * T * 4 + L * H * T * 4);
    assert_string_equal(json_string_value(json_object_get(json_object_get(flash, "run"), "attention")), "flash");
    FILE *f = fopen(csv, "r");
    assert_non_null(f);
    char line[1024];
    long long bytes, squares = 0, rows = 0;
    while (fgets(line, sizeof line, f)) {
        const char *p = line; // seconds,phase,site,category,bytes,...
        for (int c = 0; c < 4 && p; c++) p = strchr(p + 1, ',');
        if (p && sscanf(p + 1, "%lld", &bytes) == 1) {
            rows++;
            squares += bytes == H * T * T * 4 || bytes == T * T * 4;
        }
    }
    fclose(f);
    assert_true(rows > 1000);
    assert_int_equal(squares, 0);
    json_decref(eager);
    json_decref(flash);
}

static void flash_memory_meta(void **state) {
    (void)state;
    flash_against_eager_at("--adam-impl fused", true);
    // plan's closed form gains the flash term: within the 4 bytes of the loss, as eager's.
    static const char *const models[] = {"smollm2-135m", "llama-2-7b", "llama-3-70b"};
    for (int m = 0; m < 3; m++) {
        char a[256];
        snprintf(a, sizeof a, "plan --model %s --seq-len 4096 --framework lean --attention flash", models[m]);
        json_t *j = cli_run_json(a);
        int64_t closed = num(json_object_get(j, "closed_form"), "activation");
        assert_true(llabs(cat_peak(j, "activation") - closed) <= 4);
        assert_string_equal(json_string_value(json_object_get(json_object_get(j, "other_attention"), "attention")),
                            "eager");
        assert_true(num(json_object_get(j, "other_attention"), "activation_bytes") > cat_peak(j, "activation"));
        json_decref(j);
    }
}

// torch.optim's foreach AdamW by framework, at its step: current PyTorch's sqrt list (W, eps added
// in place), 1.13's and 2.0's a second list for the out-of-place eps sum (2W), W the trained
// parameters' bytes: the whole model, or PEFT's float32 adapters beside a bf16 base. PyTorch 2.0
// has SDPA (--attention flash runs), 1.13 has not.
static void torch20_foreach_temporaries(void **state) {
    (void)state;
    static const struct {
        const char *fw;
        int64_t lists;
    } fws[] = {{"pytorch", 1}, {"pytorch-1.13", 2}, {"pytorch-2.0", 2}};
    for (int f = 0; f < 3; f++) {
        char a[256];
        snprintf(a, sizeof a, "train --meta --seq-len 9 --framework %s --adam-impl foreach --optimizer adamw", fws[f].fw);
        json_t *j = cli_run_json(a);
        assert_int_equal(cat_peak(j, "temporary"), fws[f].lists * 4 * num(json_object_get(j, "model"), "parameters"));
        json_decref(j);
        snprintf(a, sizeof a,
                 "train --meta --seq-len 9 --framework %s --adam-impl foreach --optimizer adamw --dtype bf16 "
                 "--lora-rank 4",
                 fws[f].fw);
        j = cli_run_json(a);
        assert_int_equal(cat_peak(j, "temporary"),
                         fws[f].lists * 4 * num(json_object_get(j, "lora"), "trainable_params"));
        json_decref(j);
    }
    json_decref(cli_run_json("train --meta --seq-len 9 --framework pytorch-2.0 --attention flash"));
    run_result r;
    membill(&r, "train --meta --seq-len 9 --framework pytorch-1.13 --attention flash");
    assert_int_equal(r.code, 2);
}

// torch.autocast over a bf16 model without float32 tensors casts nothing: every product runs on its
// bf16 operands as without autocast, and the ops of autocast's float32 list get transformers'
// float32 already. --dtype bf16-autocast bills what --dtype bf16 does, category by category.
static void bf16_autocast_casts_nothing_in_bf16(void **state) {
    (void)state;
    static const char *const extra[] = {"", "--attention flash", "--checkpointing"};
    for (int e = 0; e < 3; e++) {
        char a[256];
        json_t *j[2];
        for (int k = 0; k < 2; k++) {
            snprintf(a, sizeof a, "train --meta --seq-len 16 --steps 2 --dtype %s %s", k ? "bf16-autocast" : "bf16",
                     extra[e]);
            j[k] = cli_run_json(a);
        }
        static const char *const cats[] = {"weight", "gradient", "optimizer", "activation", "temporary"};
        for (int c = 0; c < 5; c++) assert_int_equal(cat_peak(j[0], cats[c]), cat_peak(j[1], cats[c]));
        json_decref(j[0]);
        json_decref(j[1]);
    }
}

static void flash_memory_real(void **state) {
    (void)state;
    flash_against_eager_at("--adam-impl fused", false);
}

static void meta_equals_real_smollm2(void **state) {
    (void)state;
    meta_equals_real_at("--seq-len 25");
    meta_equals_real_at("--seq-len 128");
    meta_equals_real_at("--seq-len 128 --attention flash");
}

// Two entries of ctest run this program: e2e_framework the quick group, e2e_framework_smollm2
// (MEMBILL_HEAVY set, label heavy) the real SmolLM2-135M runs.
int main(void) {
    const struct CMUnitTest quick[] = {
        cmocka_unit_test(golden_fp32_forloop),   cmocka_unit_test(golden_fp32_foreach),
        cmocka_unit_test(golden_heads),          cmocka_unit_test(golden_checkpointing),
        cmocka_unit_test(golden_16_bit),         cmocka_unit_test(golden_qwen3),
        cmocka_unit_test(lean_unchanged),        cmocka_unit_test(meta_equals_real_tiny),
        cmocka_unit_test(meta_equals_real_phi3), cmocka_unit_test(phi3_split_keeps),
        cmocka_unit_test(meta_equals_real_moe),  cmocka_unit_test(golden_mixtral),
        cmocka_unit_test(same_losses),           cmocka_unit_test(meta_equals_real_gpt_oss),
        cmocka_unit_test(flash_memory_meta),     cmocka_unit_test(torch20_foreach_temporaries),
        cmocka_unit_test(bf16_autocast_casts_nothing_in_bf16), cmocka_unit_test(meta_equals_real_deepseek_v3),
    };
    const struct CMUnitTest heavy[] = {cmocka_unit_test(meta_equals_real_smollm2), cmocka_unit_test(flash_memory_real)};
    if (getenv("MEMBILL_HEAVY")) return cmocka_run_group_tests(heavy, cli_run_make_dir, cli_run_remove_dir);
    return cmocka_run_group_tests(quick, cli_run_make_dir, cli_run_remove_dir);
}
