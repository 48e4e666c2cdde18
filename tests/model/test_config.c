// Llama config: presets against published parameter counts, parameter names and shapes, and
// config.json files, good and broken.
#include <jansson.h>
#include <math.h>
#include <sys/types.h>

#include "model.h"
#include "test_util.h"

// Published parameter counts (model cards / safetensors metadata of each checkpoint).
static const struct {
    const char *name;
    uint64_t params;
} published[] = {
    {"smollm2-135m", 134515008ULL},
    {"smollm2-360m", 361821120ULL},
    {"smollm2-1.7b", 1711376384ULL},
    {"llama-2-7b", 6738415616ULL},
    {"llama-2-13b", 13015864320ULL},
    {"llama-2-70b", 68976648192ULL},
    {"llama-3-8b", 8030261248ULL},
    {"llama-3-70b", 70553706496ULL},
    {"llama-3.1-405b", 405853388800ULL},
    {"mistral-7b", 7241732096ULL},
    {"llama-65b", 65285660672ULL},
    // the mixtures of experts (tests/model/test_families.c checks their tables)
    {"mixtral-8x7b", 46702792704ULL},
    {"qwen1.5-moe-a2.7b", 14315784192ULL},
    {"qwen3-30b-a3b", 30532122624ULL},
    {"qwen3-235b-a22b", 235093634560ULL},
    {"gpt-oss-20b", 20914757184ULL},
    {"gpt-oss-120b", 116829156672ULL},
    {"gemma-2-9b", 9241705984ULL},    // tied; two more norms a layer
    {"gemma-3-1b", 999885952ULL},     // and q_norm, k_norm
    {"phi-3-mini", 3821079552ULL},    // fused qkv_proj and gate_up_proj
    {"deepseek-v3", 671026404352ULL}, // its e_score_correction_bias buffers left out, as num_parameters()
};
#define NPUBLISHED (sizeof published / sizeof published[0])

static void test_preset_param_counts(void **state) {
    (void)state;
    assert_int_equal(llama_preset_count(), NPUBLISHED);
    for (size_t i = 0; i < NPUBLISHED; i++) {
        llama_config c;
        ag_err err = {{0}};
        assert_int_equal(llama_config_preset(&c, published[i].name, &err), 0);
        assert_string_equal(c.name, published[i].name);
        assert_int_equal(llama_config_validate(&c, &err), 0);
        if (llama_param_count(&c) != published[i].params)
            fail_msg("%s: %llu parameters, published %llu", published[i].name,
                     (unsigned long long)llama_param_count(&c), (unsigned long long)published[i].params);
    }
}

// The closed form of llama_param_count against the sum over the listed shapes.
static void test_count_is_sum_of_specs(void **state) {
    (void)state;
    for (size_t p = 0; p < llama_preset_count(); p++) {
        llama_config c;
        assert_int_equal(llama_config_preset(&c, llama_preset_name(p), NULL), 0);
        uint64_t sum = 0;
        size_t n = llama_param_count_tensors(&c);
        const size_t per = c.ff_norms ? 11 : c.fused_proj ? 6 : 9; // phi3: qkv_proj and gate_up_proj fused
        if (c.moe.experts == 0)
            assert_int_equal(n, 2 + per * (size_t)c.layers + (c.qk_norm ? 2 : 0) * (size_t)c.layers + (c.tied ? 0 : 1));
        for (size_t i = 0; i < n; i++) {
            char name[LLAMA_PARAM_NAME_MAX];
            int ndim;
            int64_t shape[LLAMA_PARAM_MAX_DIMS];
            assert_int_equal(llama_param_spec(&c, i, name, sizeof name, &ndim, shape), 0);
            sum += (uint64_t)shape[0] * (uint64_t)shape[1] * (uint64_t)shape[2];
        }
        assert_int_equal(sum, llama_param_count(&c) + llama_buffer_count(&c)); // the listed buffers: not counted
    }
}

static void test_smollm2_135m_fields(void **state) {
    (void)state;
    llama_config c;
    assert_int_equal(llama_config_preset(&c, "smollm2-135m", NULL), 0);
    assert_int_equal(c.hidden, 576);
    assert_int_equal(c.intermediate, 1536);
    assert_int_equal(c.layers, 30);
    assert_int_equal(c.heads, 9);
    assert_int_equal(c.kv_heads, 3);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.vocab, 49152);
    assert_int_equal(c.max_positions, 8192);
    assert_true(c.rope_theta == 100000.0);
    assert_true(c.rms_eps == 1e-5);
    assert_true(c.tied);
    // W1: float32 weights
    assert_int_equal(llama_param_count(&c) * 4, 538060032ULL);
}

static void expect_same_shape(const llama_config *a, const llama_config *b) {
    assert_int_equal(a->hidden, b->hidden);
    assert_int_equal(a->intermediate, b->intermediate);
    assert_int_equal(a->layers, b->layers);
    assert_int_equal(a->heads, b->heads);
    assert_int_equal(a->kv_heads, b->kv_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->vocab, b->vocab);
    assert_int_equal(a->max_positions, b->max_positions);
    assert_true(a->rope_theta == b->rope_theta);
    assert_true(a->rms_eps == b->rms_eps);
    assert_int_equal(a->tied, b->tied);
}

static void expect_spec(const llama_config *c, size_t i, const char *name, int ndim, int64_t rows, int64_t cols) {
    char got[LLAMA_PARAM_NAME_MAX];
    int nd;
    int64_t shape[LLAMA_PARAM_MAX_DIMS];
    assert_int_equal(llama_param_spec(c, i, got, sizeof got, &nd, shape), 0);
    assert_string_equal(got, name);
    assert_int_equal(nd, ndim);
    assert_int_equal(shape[0], rows);
    assert_int_equal(shape[1], cols);
}

static void test_spec_order_and_shapes(void **state) {
    (void)state;
    llama_config c;
    assert_int_equal(llama_config_preset(&c, "smollm2-135m", NULL), 0);
    assert_int_equal(llama_param_count_tensors(&c), 272);
    expect_spec(&c, 0, "model.embed_tokens.weight", 2, 49152, 576);
    expect_spec(&c, 1, "model.layers.0.input_layernorm.weight", 1, 576, 1);
    expect_spec(&c, 2, "model.layers.0.self_attn.q_proj.weight", 2, 576, 576);
    expect_spec(&c, 3, "model.layers.0.self_attn.k_proj.weight", 2, 192, 576);
    expect_spec(&c, 4, "model.layers.0.self_attn.v_proj.weight", 2, 192, 576);
    expect_spec(&c, 5, "model.layers.0.self_attn.o_proj.weight", 2, 576, 576);
    expect_spec(&c, 6, "model.layers.0.post_attention_layernorm.weight", 1, 576, 1);
    expect_spec(&c, 7, "model.layers.0.mlp.gate_proj.weight", 2, 1536, 576);
    expect_spec(&c, 8, "model.layers.0.mlp.up_proj.weight", 2, 1536, 576);
    expect_spec(&c, 9, "model.layers.0.mlp.down_proj.weight", 2, 576, 1536);
    expect_spec(&c, 10, "model.layers.1.input_layernorm.weight", 1, 576, 1);
    expect_spec(&c, 270, "model.layers.29.mlp.down_proj.weight", 2, 576, 1536);
    expect_spec(&c, 271, "model.norm.weight", 1, 576, 1);
    char name[LLAMA_PARAM_NAME_MAX];
    int nd;
    int64_t shape[LLAMA_PARAM_MAX_DIMS];
    assert_int_equal(llama_param_spec(&c, 272, name, sizeof name, &nd, shape), -1);
    assert_int_equal(llama_param_spec(&c, 0, name, 10, &nd, shape), -1); // name does not fit

    assert_int_equal(llama_config_preset(&c, "llama-2-7b", NULL), 0);
    size_t n = llama_param_count_tensors(&c);
    assert_int_equal(n, 291);
    expect_spec(&c, n - 2, "model.norm.weight", 1, 4096, 1);
    expect_spec(&c, n - 1, "lm_head.weight", 2, 32000, 4096);
}

static void test_preset_lookup(void **state) {
    (void)state;
    llama_config c;
    ag_err err = {{0}};
    assert_int_equal(llama_config_preset(&c, "SmolLM2-135M", &err), 0);
    assert_string_equal(c.name, "smollm2-135m");
    assert_int_equal(llama_config_preset(&c, "gpt-5", &err), -1);
    TU_MENTIONS(err.msg, "gpt-5", "smollm2-135m", "mistral-7b", "llama-3.1-405b");
    assert_null(llama_preset_name(llama_preset_count()));
    for (size_t i = 0; i < llama_preset_count(); i++) assert_non_null(llama_preset_name(i));
}

static void test_validate_messages(void **state) {
    (void)state;
    llama_config c;
    ag_err err = {{0}};
    assert_int_equal(llama_config_preset(&c, "smollm2-135m", NULL), 0);
    c.kv_heads = 4;
    assert_int_equal(llama_config_validate(&c, &err), -1);
    assert_string_equal(err.msg, "field num_key_value_heads (4) must divide num_attention_heads (9)");
    c.kv_heads = 3;
    c.vocab = 0;
    assert_int_equal(llama_config_validate(&c, &err), -1);
    TU_MENTIONS(err.msg, "vocab_size", "positive");
    c.layers = 2000000000;
    assert_int_equal(llama_config_validate(&c, &err), -1);
    TU_MENTIONS(err.msg, "num_hidden_layers", "at most 100000");
    c.layers = 30;
    c.vocab = LLAMA_MAX_VOCAB; // each size within bounds, the total past 10^13
    c.hidden = LLAMA_MAX_HIDDEN;
    assert_int_equal(llama_config_validate(&c, &err), -1);
    TU_MENTIONS(err.msg, "parameters");
    c.vocab = 49152;
    c.hidden = 576;
    c.rms_eps = NAN;
    assert_int_equal(llama_config_validate(&c, &err), -1);
    TU_MENTIONS(err.msg, "rms_norm_eps");
}

// Every field range-checked in llama_config_validate, naming the field: each bound itself is
// accepted, one past it refused.
static void test_validate_bounds(void **state) {
    (void)state;
    llama_config base = {
        .name = "small",
        .hidden = 64,
        .intermediate = 96,
        .layers = 2,
        .heads = 4,
        .kv_heads = 2,
        .head_dim = 16,
        .vocab = 100,
        .max_positions = 128,
        .rope_theta = 10000.0,
        .rms_eps = 1e-5,
        .tied = true,
    };
    ag_err err = {{0}};
    assert_int_equal(llama_config_validate(&base, &err), 0);
    const struct {
        const char *field;
        size_t off;
        int64_t max;
    } sizes[] = {
        {"hidden_size", offsetof(llama_config, hidden), LLAMA_MAX_HIDDEN},
        {"intermediate_size", offsetof(llama_config, intermediate), LLAMA_MAX_INTERMEDIATE},
        {"num_hidden_layers", offsetof(llama_config, layers), LLAMA_MAX_LAYERS},
        {"num_attention_heads", offsetof(llama_config, heads), LLAMA_MAX_HEADS},
        {"vocab_size", offsetof(llama_config, vocab), LLAMA_MAX_VOCAB},
        {"max_position_embeddings", offsetof(llama_config, max_positions), LLAMA_MAX_POSITIONS},
        {"head_dim", offsetof(llama_config, head_dim), AG_ROPE_MAX_HEAD_DIM},
    };
    const int64_t bad[] = {0, -1, INT64_MIN};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        llama_config c = base;
        int64_t *v = (int64_t *)((char *)&c + sizes[i].off);
        *v = sizes[i].max;
        if (llama_config_validate(&c, &err) != 0) fail_msg("%s at its bound: %s", sizes[i].field, err.msg);
        *v = sizes[i].max + (i == 6 ? 2 : 1); // head_dim stays even
        assert_int_equal(llama_config_validate(&c, &err), -1);
        TU_MENTIONS(err.msg, sizes[i].field, "at most");
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            *v = bad[b];
            assert_int_equal(llama_config_validate(&c, &err), -1);
            TU_MENTIONS(err.msg, sizes[i].field, "positive");
        }
    }
    // the rotation's own limit: what once failed inside RoPE as a shape error
    llama_config c = base;
    c.head_dim = 2048;
    assert_int_equal(llama_config_validate(&c, &err), -1);
    assert_string_equal(err.msg, "field head_dim (2048) is too large (at most 1024, RoPE's limit)");
    const double thetas_bad[] = {1e-300, 0.5, 0, -1, 1.000001e12, 1e300, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof thetas_bad / sizeof thetas_bad[0]; i++) {
        c = base;
        c.rope_theta = thetas_bad[i];
        if (llama_config_validate(&c, &err) != -1) fail_msg("rope_theta %g accepted", c.rope_theta);
        TU_MENTIONS(err.msg, "rope_theta", "from 1 to 1e+12");
    }
    // yarn's correction range divides by log(rope_theta): a theta of 1 would make its frequencies NaN
    c = base;
    c.rope_theta = 1.0;
    c.rope.type = LLAMA_ROPE_YARN;
    c.rope.factor = 2.0;
    assert_int_equal(llama_config_validate(&c, &err), -1);
    TU_MENTIONS(err.msg, "rope_theta", "yarn");
    c.rope_theta = 1.0001;
    assert_int_equal(llama_config_validate(&c, &err), 0);
    const double thetas_good[] = {LLAMA_MIN_ROPE_THETA, 10000, 5e5, 1e8, LLAMA_MAX_ROPE_THETA};
    for (size_t i = 0; i < sizeof thetas_good / sizeof thetas_good[0]; i++) {
        c = base;
        c.rope_theta = thetas_good[i];
        assert_int_equal(llama_config_validate(&c, &err), 0);
    }
    const double eps_bad[] = {1e-300, 1e-31, 0, -1e-5, 1, 2.5, INFINITY, NAN};
    for (size_t i = 0; i < sizeof eps_bad / sizeof eps_bad[0]; i++) {
        c = base;
        c.rms_eps = eps_bad[i];
        if (llama_config_validate(&c, &err) != -1) fail_msg("rms_norm_eps %g accepted", c.rms_eps);
        TU_MENTIONS(err.msg, "rms_norm_eps");
    }
    c = base;
    c.rms_eps = LLAMA_MIN_RMS_EPS;
    assert_int_equal(llama_config_validate(&c, &err), 0);
    c.rms_eps = 0.999;
    assert_int_equal(llama_config_validate(&c, &err), 0);
    // num_key_value_heads is bounded through num_attention_heads, which it must divide
    c = base;
    c.kv_heads = LLAMA_MAX_HEADS + 1;
    assert_int_equal(llama_config_validate(&c, &err), -1);
    TU_MENTIONS(err.msg, "num_key_value_heads");
}

// A very deep config (a planning what-if) passes, and its parameter list names every layer.
static void test_many_layers(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[8192];
    const char *text = "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
                       "\"num_hidden_layers\":30000,\"num_attention_heads\":4,\"vocab_size\":100,"
                       "\"tie_word_embeddings\":true}";
    tu_path(path, sizeof path, dir, "config.json");
    tu_write(path, text, strlen(text));
    llama_config c;
    ag_err err = {{0}};
    if (llama_config_load(&c, path, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(c.layers, 30000);
    assert_int_equal(llama_config_validate(&c, &err), 0);
    assert_int_equal(llama_param_count_tensors(&c), 2 + 30000 * llama_layer_param_count(&c, 0));
    expect_spec(&c, 1 + 29999 * llama_layer_param_count(&c, 0) + 5,
                "model.layers.29999.post_attention_layernorm.weight", 1, 64, 1);
    expect_spec(&c, 1 + 30000 * llama_layer_param_count(&c, 0), "model.norm.weight", 1, 64, 1);
    uint64_t sum = 0;
    for (size_t i = 0; i < llama_param_count_tensors(&c); i++) {
        char name[LLAMA_PARAM_NAME_MAX];
        int nd;
        int64_t shape[LLAMA_PARAM_MAX_DIMS];
        assert_int_equal(llama_param_spec(&c, i, name, sizeof name, &nd, shape), 0);
        sum += (uint64_t)(shape[0] * shape[1]);
    }
    assert_int_equal(llama_param_count(&c), sum);
    // and the bound itself, as parsed
    c.layers = LLAMA_MAX_LAYERS;
    assert_int_equal(llama_config_validate(&c, &err), 0);
    tu_rmtree(dir);
}

// ---------------------------------------------------------------------------------------------
// config.json

// SmolLM2-135M's config.json, in the hub's layout.
static const char smollm2_json[] = "{\n"
                                   "  \"_name_or_path\": \"HuggingFaceTB/SmolLM2-135M\",\n"
                                   "  \"architectures\": [\"LlamaForCausalLM\"],\n"
                                   "  \"attention_bias\": false,\n"
                                   "  \"attention_dropout\": 0.0,\n"
                                   "  \"bos_token_id\": 0,\n"
                                   "  \"eos_token_id\": 0,\n"
                                   "  \"head_dim\": 64,\n"
                                   "  \"hidden_act\": \"silu\",\n"
                                   "  \"hidden_size\": 576,\n"
                                   "  \"initializer_range\": 0.041666666666666664,\n"
                                   "  \"intermediate_size\": 1536,\n"
                                   "  \"is_llama_config\": true,\n"
                                   "  \"max_position_embeddings\": 8192,\n"
                                   "  \"mlp_bias\": false,\n"
                                   "  \"model_type\": \"llama\",\n"
                                   "  \"num_attention_heads\": 9,\n"
                                   "  \"num_hidden_layers\": 30,\n"
                                   "  \"num_key_value_heads\": 3,\n"
                                   "  \"pretraining_tp\": 1,\n"
                                   "  \"rms_norm_eps\": 1e-05,\n"
                                   "  \"rope_interleaved\": false,\n"
                                   "  \"rope_scaling\": null,\n"
                                   "  \"rope_theta\": 100000,\n"
                                   "  \"tie_word_embeddings\": true,\n"
                                   "  \"torch_dtype\": \"bfloat16\",\n"
                                   "  \"transformers_version\": \"4.40.1\",\n"
                                   "  \"use_cache\": true,\n"
                                   "  \"vocab_size\": 49152\n"
                                   "}\n";

// Mistral-7B-v0.1's config.json (head_dim absent, sliding_window present).
static const char mistral_json[] =
    "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 32768,"
    " \"model_type\": \"mistral\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,"
    " \"sliding_window\": 4096, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.34.0.dev0\", \"use_cache\": true, \"vocab_size\": 32000}";

static int load_text(const char *text, llama_config *c, ag_err *err, char *dir) {
    char path[8192];
    tu_path(path, sizeof path, dir, "config.json");
    tu_write(path, text, strlen(text));
    return llama_config_load(c, path, err);
}

static void test_load_smollm2(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    llama_config c, p;
    ag_err err = {{0}};
    assert_int_equal(load_text(smollm2_json, &c, &err, dir), 0);
    assert_int_equal(llama_config_preset(&p, "smollm2-135m", NULL), 0);
    assert_string_equal(c.name, "HuggingFaceTB/SmolLM2-135M");
    expect_same_shape(&c, &p);
    assert_int_equal(llama_param_count(&c), 134515008ULL);
    tu_rmtree(dir);
}

static void test_load_mistral(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    llama_config c, p;
    ag_err err = {{0}};
    assert_int_equal(load_text(mistral_json, &c, &err, dir), 0);
    assert_int_equal(llama_config_preset(&p, "mistral-7b", NULL), 0);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.max_positions, 32768);
    assert_false(c.tied);
    assert_int_equal(llama_param_count(&c), 7241732096ULL);
    assert_string_equal(strrchr(c.name, '/') + 1, "config.json"); // no _name_or_path: the path
    expect_same_shape(&c, &p);
    tu_rmtree(dir);
}

// The hand-written config.json files of tests/model/configs, from the published hyperparameters:
// each parameter count against the published one, and what each family adds to a block.
static void load_config_file(llama_config *c, const char *name) {
    char path[4096];
    ag_err err = {{0}};
    snprintf(path, sizeof path, "%s/%s.json", MEMBILL_CONFIGS_DIR, name);
    if (llama_config_load(c, path, &err) != 0) fail_msg("%s", err.msg);
}

static void expect_tensor(const llama_config *c, const char *want, int ndim, int64_t rows) {
    for (size_t i = 0; i < llama_param_count_tensors(c); i++) {
        char name[LLAMA_PARAM_NAME_MAX];
        int nd;
        int64_t shape[LLAMA_PARAM_MAX_DIMS];
        assert_int_equal(llama_param_spec(c, i, name, sizeof name, &nd, shape), 0);
        if (strcmp(name, want) != 0) continue;
        assert_int_equal(nd, ndim);
        assert_int_equal(shape[0], rows);
        return;
    }
    fail_msg("no tensor %s", want);
}

static void test_families(void **state) {
    (void)state;
    llama_config c;
    load_config_file(&c, "qwen2.5-0.5b"); // Qwen2.5-0.5B: 494,032,768 (its model card: 0.49B)
    assert_int_equal(c.family, LLAMA_FAMILY_QWEN2);
    assert_true(c.qkv_bias && !c.o_bias && !c.qk_norm && c.tied);
    assert_int_equal(c.sliding_window, 0); // use_sliding_window false
    assert_int_equal(llama_layer_param_count(&c, 0), 12);
    assert_int_equal(llama_param_count(&c), 494032768ULL);
    expect_tensor(&c, "model.layers.23.self_attn.k_proj.bias", 1, 128);
    load_config_file(&c, "qwen3-0.6b"); // 596,049,920: 0.44B outside the embedding, as published
    assert_int_equal(c.family, LLAMA_FAMILY_QWEN3);
    assert_true(c.qk_norm && !c.qkv_bias && c.head_dim == 128);
    assert_int_equal(llama_layer_param_count(&c, 0), 11);
    assert_int_equal(llama_param_count(&c), 596049920ULL);
    assert_int_equal(llama_param_count(&c) - 151936ULL * 1024, 440467456ULL);
    expect_tensor(&c, "model.layers.0.self_attn.q_norm.weight", 1, 128);
    expect_tensor(&c, "model.layers.0.self_attn.q_proj.weight", 2, 2048); // 16 heads x 128, not hidden
    load_config_file(&c, "llama-3.1-8b");                                 // 8,030,261,248, Llama 3.1 8B's
    assert_int_equal(llama_param_count(&c), 8030261248ULL);
    assert_int_equal(c.rope.type, LLAMA_ROPE_LLAMA3);
    assert_int_equal(c.rope.original_max_positions, 8192);
    assert_true(c.rope.factor == 8.0 && c.rope.high_freq_factor == 4.0);
}

// The optional rows, each from its field: Llama's attention_bias and mlp_bias, Qwen3's, windows.
static void test_family_fields(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    llama_config c;
    ag_err err = {{0}};
    const char *head = "{\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":4,"
                       "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":100,";
    char text[1024];
    snprintf(text, sizeof text, "%s\"model_type\":\"llama\",\"attention_bias\":true,\"mlp_bias\":true}", head);
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_true(c.qkv_bias && c.o_bias && c.mlp_bias);
    assert_int_equal(llama_layer_param_count(&c, 0), 9 + 4 + 3);
    expect_tensor(&c, "model.layers.3.mlp.down_proj.bias", 1, 64);
    snprintf(text, sizeof text, "%s\"model_type\":\"qwen3\",\"attention_bias\":true}", head);
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_int_equal(c.head_dim, 128); // Qwen3Config's default, not hidden / heads
    assert_int_equal(llama_layer_param_count(&c, 0), 9 + 4 + 2);
    // Mistral: 4096 unless given, null for none, every layer
    snprintf(text, sizeof text, "%s\"model_type\":\"mistral\"}", head);
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_int_equal(llama_layer_window(&c, 0), 4096);
    assert_int_equal(c.max_positions, 131072);
    snprintf(text, sizeof text, "%s\"model_type\":\"mistral\",\"sliding_window\":null}", head);
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_int_equal(llama_layer_window(&c, 3), 0);
    // 0 is no window size (every key masked): refused where the window is used, with the range
    snprintf(text, sizeof text, "%s\"model_type\":\"mistral\",\"sliding_window\":0}", head);
    assert_int_equal(load_text(text, &c, &err, dir), -1);
    TU_MENTIONS(err.msg, "sliding_window (0)", "from 1 to 16777216, or null");
    snprintf(text, sizeof text, "%s\"model_type\":\"qwen2\",\"use_sliding_window\":true,\"sliding_window\":0}", head);
    assert_int_equal(load_text(text, &c, &err, dir), -1);
    TU_MENTIONS(err.msg, "sliding_window (0)", "from 1 to 16777216");
    snprintf(text, sizeof text, "%s\"model_type\":\"qwen2\",\"use_sliding_window\":false,\"sliding_window\":0}",
             head); // unused, as Qwen2Config drops it
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_int_equal(llama_layer_window(&c, 3), 0);
    // rope_scaling {}: no rope_type, which transformers cannot read either
    snprintf(text, sizeof text, "%s\"model_type\":\"llama\",\"rope_scaling\":{}}", head);
    assert_int_equal(load_text(text, &c, &err, dir), -1);
    TU_MENTIONS(err.msg, "rope_scaling is an empty object", "rope_type");
    // Qwen2: from max_window_layers on, when use_sliding_window; layer_types agreeing
    const char *qwen = "\"model_type\":\"qwen2\",\"use_sliding_window\":true,\"sliding_window\":8,";
    snprintf(text, sizeof text, "%s%s\"max_window_layers\":2}", head, qwen);
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_int_equal(llama_layer_window(&c, 1), 0);
    assert_int_equal(llama_layer_window(&c, 2), 8);
    const char *full = "\"full_attention\"", *slide = "\"sliding_attention\"";
    snprintf(text, sizeof text, "%s%s\"layer_types\":[%s,%s,%s,%s]}", head, qwen, full, slide, slide, slide);
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_int_equal(llama_layer_window(&c, 0), 0);
    assert_int_equal(llama_layer_window(&c, 1), 8);
    // every other layer full (gpt_oss's pattern, any family's layer_types): alternating windows
    snprintf(text, sizeof text, "%s%s\"layer_types\":[%s,%s,%s,%s]}", head, qwen, slide, full, slide, full);
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    for (int64_t i = 0; i < 4; i++) assert_int_equal(llama_layer_window(&c, i), i % 2 ? 0 : 8);
    snprintf(text, sizeof text, "%s%s\"layer_types\":[%s,%s,%s,%s]}", head, qwen, slide, full, full, slide);
    assert_int_equal(load_text(text, &c, &err, dir), -1);
    TU_MENTIONS(err.msg, "layer_types", "layer 1 is full");
    // use_cache false is kept; a llama config's sliding_window changes nothing (LlamaConfig has none)
    snprintf(text, sizeof text, "%s\"model_type\":\"llama\",\"use_cache\":false,\"sliding_window\":4}", head);
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_true(c.no_cache);
    assert_int_equal(llama_layer_window(&c, 0), 0);
    // transformers 5's rope_parameters: its theta, not the default
    snprintf(text, sizeof text,
             "%s\"model_type\":\"llama\",\"rope_parameters\":{\"rope_type\":\"default\","
             "\"rope_theta\":500000.0}}",
             head);
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_true(c.rope_theta == 500000.0);
    // pad_token_id: the embedding's padding_idx; null: none
    snprintf(text, sizeof text, "%s\"model_type\":\"qwen2\",\"pad_token_id\":7}", head);
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_true(c.pad_token && c.pad_token_id == 7);
    snprintf(text, sizeof text, "%s\"model_type\":\"qwen2\",\"pad_token_id\":null}", head);
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_false(c.pad_token);
    tu_rmtree(dir);
}

// head_dim given and not hidden / heads: q and o take heads * head_dim.
static void test_load_explicit_head_dim(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    llama_config c;
    ag_err err = {{0}};
    const char *text = "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
                       "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                       "\"head_dim\":32,\"vocab_size\":100}";
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_int_equal(c.head_dim, 32);
    expect_spec(&c, 2, "model.layers.0.self_attn.q_proj.weight", 2, 128, 64);
    expect_spec(&c, 3, "model.layers.0.self_attn.k_proj.weight", 2, 64, 64);
    expect_spec(&c, 5, "model.layers.0.self_attn.o_proj.weight", 2, 64, 128);
    // embed 6400 + lm_head 6400 + norm 64 + 2 x (2*64 + 128*64*2 + 64*64*2 + 3*96*64)
    assert_int_equal(llama_param_count(&c), 6400 + 6400 + 64 + 2 * (128 + 16384 + 8192 + 18432));
    tu_rmtree(dir);
}

// What transformers' LlamaConfig fills in for absent optional fields.
static void test_load_defaults(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    llama_config c;
    ag_err err = {{0}};
    const char *text = "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
                       "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100,"
                       "\"num_key_value_heads\":null}";
    assert_int_equal(load_text(text, &c, &err, dir), 0);
    assert_int_equal(c.kv_heads, 4);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.max_positions, 2048);
    assert_true(c.rope_theta == 10000.0);
    assert_true(c.rms_eps == 1e-6);
    assert_false(c.tied);
    tu_rmtree(dir);
}

// A small valid config.json that each bad case alters in one field.
static const char base_json[] = "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
                                "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                                "\"vocab_size\":100,\"max_position_embeddings\":128,\"rope_theta\":10000.0,"
                                "\"rms_norm_eps\":1e-5,\"tie_word_embeddings\":true}";

static const struct {
    const char *field; // the field to set (NULL: the raw text is the whole file)
    const char *value; // JSON text of its new value, NULL to remove the field; "raw:TEXT" for
                       // text that is not JSON (NaN, 1e400), pasted in as the last field
    const char *expect1, *expect2;
} bad_configs[] = {
    {NULL, "not json at all", "not valid JSON", NULL},
    {NULL, "", "not valid JSON", NULL},
    {NULL, "{\"model_type\": \"llama\", \"hidden_size\": 5", "not valid JSON", NULL},
    {NULL, "[1, 2, 3]", "JSON object", NULL},
    {NULL, "{\"model_type\":\"llama\",\"hidden_size\":64,\"hidden_size\":64}", "not valid JSON", "duplicate"},
    {NULL, "{\"model_type\":\"llama\",\"hidden_size\":100000000000000000000000000000}", "not valid JSON",
     "in field hidden_size"},
    {"hidden_size", NULL, "hidden_size", "missing"},
    {"intermediate_size", NULL, "intermediate_size", "missing"},
    {"num_hidden_layers", NULL, "num_hidden_layers", "missing"},
    {"num_attention_heads", NULL, "num_attention_heads", "missing"},
    {"vocab_size", NULL, "vocab_size", "missing"},
    {"model_type", NULL, "model_type", "missing"},
    {"model_type", "\"gpt2\"", "model_type", NULL},
    {"model_type", "7", "model_type", NULL},
    {"hidden_size", "\"64\"", "hidden_size", "integer"},
    {"hidden_size", "64.0", "hidden_size", "integer"},
    {"hidden_size", "0", "hidden_size", "positive"},
    {"hidden_size", "1099511627776", "hidden_size", "absurd"},
    {"intermediate_size", "-96", "intermediate_size", "positive"},
    {"num_hidden_layers", "0", "num_hidden_layers", "positive"},
    {"num_key_value_heads", "3", "num_key_value_heads (3) must divide num_attention_heads (4)", NULL},
    {"num_key_value_heads", "0", "num_key_value_heads", "positive"},
    {"num_attention_heads", "5", "hidden_size (64)", "head_dim"},
    {"head_dim", "15", "head_dim (15)", "even"},
    {"head_dim", "-16", "head_dim", "positive"},
    {"vocab_size", "[100]", "vocab_size", "integer"},
    {"max_position_embeddings", "0", "max_position_embeddings", NULL},
    {"rope_theta", "\"big\"", "rope_theta", "number"},
    {"rope_theta", "-1", "rope_theta", NULL},
    {"rms_norm_eps", "0", "rms_norm_eps", NULL},
    {"rms_norm_eps", "2.5", "rms_norm_eps", NULL},
    {"tie_word_embeddings", "\"yes\"", "tie_word_embeddings", NULL},
    {"attention_bias", "\"yes\"", "attention_bias", "true or false"},
    {"mlp_bias", "1", "mlp_bias", "true or false"},
    {"hidden_act", "\"gelu\"", "hidden_act", NULL},
    {"model_type", "\"gemma\"", "\"gemma\"", "\"qwen3\""},
    // what would change the numbers and is not modelled
    {"attention_dropout", "0.1", "attention_dropout (0.1)", "must be 0"},
    {"partial_rotary_factor", "0.5", "partial_rotary_factor", "must be 1"},
    {"quantization_config", "{\"quant_method\": \"gptq\"}", "quantization_config", "not supported"},
    {"rope_scaling", "{\"rope_type\": \"longrope\", \"factor\": 2.0}", "short_factor", "head_dim / 2"},
    {"rope_scaling", "{\"type\": \"su\"}", "\"su\"", "llama3"},
    {"rope_scaling", "{\"rope_type\": \"linear\"}", "rope_scaling", "factor missing"},
    {"rope_scaling", "{\"rope_type\": \"linear\", \"factor\": -2.0}", "factor (-2)", "positive"},
    {"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0}", "low_freq_factor", "missing"},
    {"rope_scaling", "[1]", "rope_scaling", "object"},
    {"use_cache", "\"no\"", "use_cache", "true or false"},
    {"rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", "rope_parameters", "rope_scaling"},
    {"pad_token_id", "100", "pad_token_id (100)", "vocab_size - 1 (99)"},
    {"pad_token_id", "-1", "pad_token_id (-1)", "token id"},
    {"rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": \"big\"}", "rope_theta", "number"},
    {"num_hidden_layers", "2000000000", "num_hidden_layers (2000000000)", "at most 100000"},
    // every size allowed, the whole absurd: 2^20 x 2^24 embedding
    {NULL,
     "{\"model_type\":\"llama\",\"hidden_size\":1048576,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"head_dim\":16,"
     "\"vocab_size\":16777216}",
     "parameters", NULL},
    // ranges, each naming its field
    {"hidden_size", "1048580", "hidden_size (1048580)", "at most 1048576"},
    {"intermediate_size", "4194305", "intermediate_size (4194305)", "at most 4194304"},
    {"num_hidden_layers", "100001", "num_hidden_layers (100001)", "at most 100000"},
    {"num_hidden_layers", "-2", "num_hidden_layers", "positive"},
    {NULL,
     "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":65537,\"head_dim\":16,\"vocab_size\":100}",
     "num_attention_heads (65537)", "at most 65536"},
    {"num_key_value_heads", "65537", "num_key_value_heads (65537)", "at most 65536"},
    {"vocab_size", "16777217", "vocab_size (16777217)", "at most 16777216"},
    {"max_position_embeddings", "16777217", "max_position_embeddings", "at most 16777216"},
    {"max_position_embeddings", "-1", "max_position_embeddings", "positive"},
    {"head_dim", "0", "head_dim", "positive"},
    {"head_dim", "2048", "head_dim (2048)", "at most 1024"},
    {"head_dim", "1026", "head_dim (1026)", "at most 1024"},
    {"hidden_size", "8192", "head_dim (2048, hidden_size / num_attention_heads", "at most 1024"},
    {"rope_theta", "1e-300", "rope_theta (1e-300)", "from 1 to 1e+12"},
    {"rope_theta", "0.5", "rope_theta (0.5)", "from 1 to 1e+12"},
    {"rope_theta", "0", "rope_theta (0)", "from 1 to 1e+12"},
    {"rope_theta", "1e13", "rope_theta (1e+13)", "from 1 to 1e+12"},
    {"rms_norm_eps", "1e-300", "rms_norm_eps (1e-300)", "at least 1e-30"},
    {"rms_norm_eps", "-1e-5", "rms_norm_eps", NULL},
    {"rms_norm_eps", "1", "rms_norm_eps", "below 1"},
    // wrong JSON types, each naming its field and what it got
    {"num_hidden_layers", "2.0", "num_hidden_layers", "without a fraction or an exponent (it is the real number 2)"},
    {"num_hidden_layers", "2e3", "num_hidden_layers", "must be an integer"},
    {"num_hidden_layers", "true", "num_hidden_layers", "integer (it is a boolean)"},
    {"num_hidden_layers", "null", "num_hidden_layers", "missing"},
    {"num_hidden_layers", "{}", "num_hidden_layers", "integer (it is an object)"},
    {"num_key_value_heads", "1.5", "num_key_value_heads", "integer"},
    {"max_position_embeddings", "1e6", "max_position_embeddings", "integer"},
    {"head_dim", "\"16\"", "head_dim", "integer (it is a string)"},
    {"rope_theta", "\"nan\"", "rope_theta", "number (it is a string)"},
    {"rope_theta", "true", "rope_theta", "number (it is a boolean)"},
    {"rope_theta", "[10000]", "rope_theta", "number (it is an array)"},
    {"rms_norm_eps", "\"1e-5\"", "rms_norm_eps", "number"},
    {"tie_word_embeddings", "1", "tie_word_embeddings", "(it is an integer)"},
    // values JSON cannot hold, written as Python's json module writes them
    {"rope_theta", "raw:NaN", "not valid JSON", "in field rope_theta"},
    {"rope_theta", "raw:Infinity", "not valid JSON", "in field rope_theta"},
    {"rms_norm_eps", "raw:-Infinity", "not valid JSON", "in field rms_norm_eps"},
    {"rms_norm_eps", "raw:nan", "not valid JSON", "in field rms_norm_eps"},
    {"rope_theta", "raw:1e400", "real number overflow", "in field rope_theta"},
    {"vocab_size", "raw:1e400", "real number overflow", "in field vocab_size"},
    {"vocab_size", "raw:-99999999999999999999", "too big", "in field vocab_size"},
    {"vocab_size", "raw:0x100", "not valid JSON", "in field vocab_size"},
};

static char *bad_config_text(size_t i) {
    if (!bad_configs[i].field) return strdup(bad_configs[i].value);
    const char *value = bad_configs[i].value;
    bool raw = value && strncmp(value, "raw:", 4) == 0;
    json_t *root = json_loads(base_json, 0, NULL);
    assert_non_null(root);
    if (value && !raw) {
        json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        json_object_set_new(root, bad_configs[i].field, v);
    } else {
        json_object_del(root, bad_configs[i].field);
    }
    char *text = json_dumps(root, 0);
    json_decref(root);
    assert_non_null(text);
    if (raw) { // pasted in before the closing brace
        size_t n = strlen(text);
        assert_true(n > 2 && text[n - 1] == '}');
        char *with = malloc(n + strlen(bad_configs[i].field) + strlen(value) + 8);
        assert_non_null(with);
        sprintf(with, "%.*s, \"%s\": %s}", (int)(n - 1), text, bad_configs[i].field, value + 4);
        free(text);
        text = with;
    }
    return text;
}

static void test_bad_configs(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    llama_config c;
    ag_err err;
    assert_int_equal(load_text(base_json, &c, &err, dir), 0); // the base itself is good
    for (size_t i = 0; i < sizeof bad_configs / sizeof bad_configs[0]; i++) {
        char *text = bad_config_text(i);
        memset(&err, 0, sizeof err);
        if (load_text(text, &c, &err, dir) != -1) fail_msg("case %zu accepted: %s", i, text);
        print_message("%s\n", err.msg);
        TU_MENTIONS(err.msg, "config.json", bad_configs[i].expect1, bad_configs[i].expect2);
        free(text);
    }
    char path[8192];
    tu_path(path, sizeof path, dir, "absent.json");
    assert_int_equal(llama_config_load(&c, path, &err), -1);
    TU_MENTIONS(err.msg, "absent.json", "cannot open");
    assert_int_equal(llama_config_load(&c, dir, &err), -1);
    TU_MENTIONS(err.msg, dir, "not a regular file");
    tu_rmtree(dir);
}

// Paths that are not regular files are refused at once: a FIFO with no writer once made the
// open wait forever (alarm: a hang fails the test instead of stalling the suite).
static void test_not_regular_files(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), fifo[8192];
    tu_path(fifo, sizeof fifo, dir, "config.json");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    llama_config c;
    ag_err err = {{0}};
    alarm(20);
    assert_int_equal(llama_config_load(&c, fifo, &err), -1);
    TU_MENTIONS(err.msg, fifo, "not a regular file", "FIFO");
    for (const char *const *dev = tu_char_devices(); *dev; dev++) {
        assert_int_equal(llama_config_load(&c, *dev, &err), -1);
        TU_MENTIONS(err.msg, *dev, "not a regular file", "character device");
    }
    assert_int_equal(llama_config_load(&c, dir, &err), -1);
    TU_MENTIONS(err.msg, dir, "not a regular file", "folder");
    // a symbolic link to a good file is followed, one to the FIFO refused
    char good[8192], link_good[8192], link_fifo[8192];
    tu_path(good, sizeof good, dir, "good.json");
    tu_write(good, base_json, strlen(base_json));
    tu_path(link_good, sizeof link_good, dir, "link-good");
    tu_path(link_fifo, sizeof link_fifo, dir, "link-fifo");
    assert_int_equal(symlink(good, link_good), 0);
    assert_int_equal(symlink(fifo, link_fifo), 0);
    assert_int_equal(llama_config_load(&c, link_good, &err), 0);
    assert_int_equal(llama_config_load(&c, link_fifo, &err), -1);
    TU_MENTIONS(err.msg, "link-fifo", "FIFO");
    alarm(0);
    tu_rmtree(dir);
}

// From memory: the text need not be NUL-terminated, origin names it.
static void test_parse_in_memory(void **state) {
    (void)state;
    llama_config c, d;
    ag_err err = {{0}};
    size_t n = strlen(base_json);
    char *text = malloc(n + 16);
    assert_non_null(text);
    memcpy(text, base_json, n);
    memcpy(text + n, "garbage", 7); // past len: never read
    assert_int_equal(llama_config_parse(&c, text, n, "mem.json", &err), 0);
    assert_string_equal(c.name, "mem.json");
    assert_int_equal(c.hidden, 64);
    assert_int_equal(llama_config_parse(&d, text, n, NULL, &err), 0);
    assert_string_equal(d.name, "config.json");
    assert_int_equal(llama_config_parse(&c, text, n + 7, "mem.json", &err), -1);
    TU_MENTIONS(err.msg, "mem.json", "not valid JSON");
    assert_int_equal(llama_config_parse(&c, text, 0, NULL, &err), -1);
    TU_MENTIONS(err.msg, "config.json", "not valid JSON");
    free(text);
    // a NUL inside the text
    const char nul[] = "{\"model_type\":\"llama\"\0}";
    assert_int_equal(llama_config_parse(&c, nul, sizeof nul - 1, NULL, &err), -1);
    TU_MENTIONS(err.msg, "not valid JSON");
}

static void expect_clean_name(const char *name) {
    const unsigned char *p = (const unsigned char *)name;
    size_t n = strlen(name);
    assert_true(n < LLAMA_NAME_MAX);
    for (size_t i = 0; i < n; i++) assert_false(p[i] < 0x20 || p[i] == 0x7f);
    // valid UTF-8 throughout (jansson refuses anything else)
    json_t *s = json_stringn(name, n);
    assert_non_null(s);
    json_decref(s);
}

// The name goes to terminals and JSON reports: printable, valid UTF-8, cut at a character.
static void test_name_sanitised(void **state) {
    (void)state;
    llama_config c;
    ag_err err = {{0}};
    json_t *root = json_loads(base_json, 0, NULL);
    assert_non_null(root);
    json_object_set_new(root, "_name_or_path", json_string("evil\x1b[2J\r\nname\x7f"));
    char *text = json_dumps(root, 0);
    assert_int_equal(llama_config_parse(&c, text, strlen(text), NULL, &err), 0);
    assert_string_equal(c.name, "evil\\x1b[2J\\x0d\\x0aname\\x7f");
    expect_clean_name(c.name);
    free(text);
    // 200 three-byte characters: cut at a character boundary, not inside one
    char long_name[601];
    for (int i = 0; i < 200; i++) memcpy(long_name + 3 * i, "\xe2\x82\xac", 3);
    long_name[600] = '\0';
    json_object_set_new(root, "_name_or_path", json_string(long_name));
    text = json_dumps(root, 0);
    assert_int_equal(llama_config_parse(&c, text, strlen(text), NULL, &err), 0);
    assert_int_equal(strlen(c.name), 3 * ((LLAMA_NAME_MAX - 1) / 3));
    expect_clean_name(c.name);
    free(text);
    json_decref(root);
    // without _name_or_path the origin is the name: bytes that are not UTF-8 become '?'
    assert_int_equal(llama_config_parse(&c, base_json, strlen(base_json), "/x/\xff\xfe\x01.json", &err), 0);
    assert_string_equal(c.name, "/x/??\\x01.json");
    expect_clean_name(c.name);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preset_param_counts),
        cmocka_unit_test(test_count_is_sum_of_specs),
        cmocka_unit_test(test_smollm2_135m_fields),
        cmocka_unit_test(test_spec_order_and_shapes),
        cmocka_unit_test(test_preset_lookup),
        cmocka_unit_test(test_validate_messages),
        cmocka_unit_test(test_load_smollm2),
        cmocka_unit_test(test_load_mistral),
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_family_fields),
        cmocka_unit_test(test_load_explicit_head_dim),
        cmocka_unit_test(test_load_defaults),
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_validate_bounds),
        cmocka_unit_test(test_many_layers),
        cmocka_unit_test(test_not_regular_files),
        cmocka_unit_test(test_parse_in_memory),
        cmocka_unit_test(test_name_sanitised),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
