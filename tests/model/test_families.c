// The families beyond Llama's: parameter counts of the published configs to the unit, active
// parameters, names and shapes from the table, expert counts on dense families refused, and the
// families not modelled yet refused by name.
#include <jansson.h>
#include <math.h>

#include "model_internal.h"
#include "test_util.h"

// Published totals: each model's safetensors or model card (transformers' num_parameters()).
static const struct {
    const char *name;
    const char *cls;
    uint64_t params, active, buffers;
} published[] = {
    // 12.9B active: 2 of 8 experts
    {"mixtral-8x7b", "MixtralForCausalLM", 46702792704ULL, 12879925248ULL, 0},
    {"qwen1.5-moe-a2.7b", "Qwen2MoeForCausalLM", 14315784192ULL, 2689173504ULL, 0},
    // "30.5B, 3.3B activated" (its model card)
    {"qwen3-30b-a3b", "Qwen3MoeForCausalLM", 30532122624ULL, 3353032704ULL, 0},
    {"qwen3-235b-a22b", "Qwen3MoeForCausalLM", 235093634560ULL, 22190763520ULL, 0},
    {"gemma-2-9b", "Gemma2ForCausalLM", 9241705984ULL, 9241705984ULL, 0},
    {"gemma-3-1b", "Gemma3ForCausalLM", 999885952ULL, 999885952ULL, 0},
    {"phi-3-mini", "Phi3ForCausalLM", 3821079552ULL, 3821079552ULL, 0},
    // 20.9B; OpenAI's 3.6B active leaves out the embedding (579,133,440 here)
    {"gpt-oss-20b", "GptOssForCausalLM", 20914757184ULL, 4187440704ULL, 0},
    {"gpt-oss-120b", "GptOssForCausalLM", 116829156672ULL, 5711982912ULL, 0},
    // 671B, 37B activated; e_score_correction_bias is a buffer (58 sparse layers x 256), not counted;
    // the MTP layer (num_nextn_predict_layers) is not in it either
    {"deepseek-v3", "DeepseekV3ForCausalLM", 671026404352ULL, 37552282624ULL, 14848},
};
#define NPUBLISHED (sizeof published / sizeof published[0])

static void test_published_counts(void **state) {
    (void)state;
    for (size_t i = 0; i < NPUBLISHED; i++) {
        llama_config c;
        ag_err err = {{0}};
        if (llama_config_preset_any(&c, published[i].name, &err) != 0) fail_msg("%s", err.msg);
        assert_string_equal(c.name, published[i].name);
        assert_string_equal(llama_family_class(c.family), published[i].cls);
        if (llama_param_count(&c) != published[i].params)
            fail_msg("%s: %llu parameters, published %llu", published[i].name,
                     (unsigned long long)llama_param_count(&c), (unsigned long long)published[i].params);
        if (llama_active_param_count(&c) != published[i].active)
            fail_msg("%s: %llu active", published[i].name, (unsigned long long)llama_active_param_count(&c));
        assert_int_equal(llama_buffer_count(&c), published[i].buffers);
        // the count is the sum over the listed shapes, buffers apart
        uint64_t sum = 0, buffers = 0;
        for (size_t t = 0; t < llama_param_count_tensors(&c); t++) {
            llama_param_info p;
            assert_int_equal(llama_param_info_of(&c, t, &p), 0);
            uint64_t n = (uint64_t)p.shape[0] * (uint64_t)p.shape[1] * (uint64_t)p.shape[2];
            *(p.buffer ? &buffers : &sum) += n;
        }
        assert_int_equal(sum, published[i].params);
        assert_int_equal(buffers, published[i].buffers);
    }
}

static void expect_info(const llama_config *c, size_t i, const char *name, int64_t d0, int64_t d1, int64_t d2) {
    llama_param_info p;
    assert_int_equal(llama_param_info_of(c, i, &p), 0);
    assert_string_equal(p.name, name);
    assert_int_equal(p.shape[0], d0);
    assert_int_equal(p.shape[1], d1);
    assert_int_equal(p.shape[2], d2);
}

// Hugging Face's names, so that checkpoints load: Mixtral's w1/w2/w3 expert by expert.
static void test_names(void **state) {
    (void)state;
    llama_config c;
    assert_int_equal(llama_config_preset_any(&c, "mixtral-8x7b", NULL), 0);
    assert_int_equal(llama_layer_param_count(&c, 0), 6 + 1 + 3 * 8);
    expect_info(&c, 1, "model.layers.0.input_layernorm.weight", 4096, 1, 1);
    expect_info(&c, 7, "model.layers.0.block_sparse_moe.gate.weight", 8, 4096, 1);
    expect_info(&c, 8, "model.layers.0.block_sparse_moe.experts.0.w1.weight", 14336, 4096, 1);
    expect_info(&c, 9, "model.layers.0.block_sparse_moe.experts.0.w2.weight", 4096, 14336, 1);
    expect_info(&c, 10, "model.layers.0.block_sparse_moe.experts.0.w3.weight", 14336, 4096, 1);
    expect_info(&c, 31, "model.layers.0.block_sparse_moe.experts.7.w3.weight", 14336, 4096, 1);
    expect_info(&c, 32, "model.layers.1.input_layernorm.weight", 4096, 1, 1);
    llama_param_info p;
    assert_int_equal(llama_param_info_of(&c, 31, &p), 0);
    assert_true(p.layer == 0 && p.expert == 7 && p.matrix && !p.buffer);

    assert_int_equal(llama_config_preset_any(&c, "qwen1.5-moe-a2.7b", NULL), 0);
    size_t per = llama_layer_param_count(&c, 0); // 9 attention and norms, router, 60 x 3, shared 3 + gate
    assert_int_equal(per, 9 + 1 + 180 + 4);
    expect_info(&c, 1 + per - 4, "model.layers.0.mlp.shared_expert.gate_proj.weight", 5632, 2048, 1);
    expect_info(&c, 1 + per - 1, "model.layers.0.mlp.shared_expert_gate.weight", 1, 2048, 1);

    assert_int_equal(llama_config_preset_any(&c, "gpt-oss-20b", NULL), 0);
    size_t g = llama_layer_first_param(&c, 1);
    expect_info(&c, g - 5, "model.layers.0.mlp.router.bias", 32, 1, 1);
    expect_info(&c, g - 4, "model.layers.0.mlp.experts.gate_up_proj", 32, 2880, 5760);
    expect_info(&c, g - 2, "model.layers.0.mlp.experts.down_proj", 32, 2880, 2880);

    assert_int_equal(llama_config_preset_any(&c, "deepseek-v3", NULL), 0);
    assert_true(!llama_layer_moe(&c, 2) && llama_layer_moe(&c, 3));
    expect_info(&c, 2, "model.layers.0.self_attn.q_a_proj.weight", 1536, 7168, 1);
    expect_info(&c, 4, "model.layers.0.self_attn.q_b_proj.weight", 128 * 192, 1536, 1);
    expect_info(&c, 5, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 576, 7168, 1);
    expect_info(&c, 7, "model.layers.0.self_attn.kv_b_proj.weight", 128 * 256, 512, 1);
    expect_info(&c, 8, "model.layers.0.self_attn.o_proj.weight", 7168, 128 * 128, 1);
    size_t s = llama_layer_first_param(&c, 3);
    expect_info(&c, s + 10, "model.layers.3.mlp.gate.e_score_correction_bias", 256, 1, 1);
    assert_int_equal(llama_param_info_of(&c, s + 10, &p), 0);
    assert_true(p.buffer);
    expect_info(&c, s + 11 + 256 * 3, "model.layers.3.mlp.shared_experts.gate_proj.weight", 2048, 7168, 1);

    assert_int_equal(llama_config_preset_any(&c, "phi-3-mini", NULL), 0);
    expect_info(&c, 2, "model.layers.0.self_attn.qkv_proj.weight", 9216, 3072, 1);
    expect_info(&c, 5, "model.layers.0.mlp.gate_up_proj.weight", 16384, 3072, 1);
    assert_int_equal(llama_config_preset_any(&c, "gemma-2-9b", NULL), 0);
    expect_info(&c, 7, "model.layers.0.pre_feedforward_layernorm.weight", 3584, 1, 1);
    expect_info(&c, 11, "model.layers.0.post_feedforward_layernorm.weight", 3584, 1, 1);
}

static int parse(const char *text, llama_config *c, ag_err *err) {
    return llama_config_parse(c, text, strlen(text), "config.json", err);
}

#define HEAD                                                                                                           \
    "{\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":4,\"num_attention_heads\":4,"                  \
    "\"num_key_value_heads\":2,\"vocab_size\":100,"

// Which layers are sparse: decoder_sparse_step, mlp_only_layers; each kind's own rows.
static void test_sparse_layers(void **state) {
    (void)state;
    llama_config c;
    ag_err err = {{0}};
    const char *text = HEAD "\"model_type\":\"qwen3_moe\",\"num_experts\":4,\"num_experts_per_tok\":2,"
                            "\"moe_intermediate_size\":32,\"decoder_sparse_step\":2,\"mlp_only_layers\":[3]}";
    if (llama_config_parse_any(&c, text, strlen(text), "config.json", &err) != 0) fail_msg("%s", err.msg);
    assert_true(!llama_layer_moe(&c, 0) && llama_layer_moe(&c, 1) && !llama_layer_moe(&c, 2) &&
                !llama_layer_moe(&c, 3));
    assert_int_equal(llama_layer_param_count(&c, 0), 11);
    assert_int_equal(llama_layer_param_count(&c, 1), 8 + 1 + 4 * 3);
    assert_int_equal(llama_layer_first_param(&c, 2), 1 + 11 + 21);
    expect_info(&c, 1 + 11 + 8, "model.layers.1.mlp.gate.weight", 4, 64, 1);
    expect_info(&c, 1 + 11 + 9, "model.layers.1.mlp.experts.0.gate_proj.weight", 32, 64, 1);
    expect_info(&c, 1 + 11 + 8 + 12, "model.layers.1.mlp.experts.3.down_proj.weight", 64, 32, 1);
    expect_info(&c, 1 + 11 + 21 + 8, "model.layers.2.mlp.gate_proj.weight", 96, 64, 1);
    // dense layers at intermediate_size, sparse ones at 4 experts of 32; 2 of 4 a token
    uint64_t attn = 64 + 4 * 16 * 64 * 2 + 2 * 16 * 64 * 2 + 2 * 16 + 64, dense = attn + 3 * 96 * 64,
             sparse = attn + 4 * 64 + 4 * 3 * 32 * 64;
    assert_int_equal(llama_param_count(&c), 3 * dense + sparse + 100 * 64 * 2 + 64);
    assert_int_equal(llama_active_param_count(&c), llama_param_count(&c) - 2 * 3 * 32 * 64);
    // bad values named
    const struct {
        const char *text, *want1, *want2;
    } bad[] = {
        {HEAD "\"model_type\":\"qwen3_moe\",\"num_experts\":4,\"num_experts_per_tok\":5}", "num_experts_per_tok (5)",
         "num_experts (4)"},
        {HEAD "\"model_type\":\"qwen3_moe\",\"mlp_only_layers\":[4]}", "mlp_only_layers[0]", "0 to 3"},
        {HEAD "\"model_type\":\"qwen3_moe\",\"mlp_only_layers\":3}", "mlp_only_layers", "array"},
        {HEAD "\"model_type\":\"qwen3_moe\",\"decoder_sparse_step\":0}", "decoder_sparse_step (0)", "from 1"},
        {HEAD "\"model_type\":\"qwen3_moe\",\"moe_intermediate_size\":0}", "moe_intermediate_size (0)", NULL},
        {HEAD "\"model_type\":\"qwen2_moe\",\"shared_expert_intermediate_size\":-1}", "shared_expert_intermediate_size",
         NULL},
        {HEAD "\"model_type\":\"mixtral\",\"router_jitter_noise\":0.1}", "router_jitter_noise (0.1)", "must be 0"},
        {HEAD "\"model_type\":\"mixtral\",\"router_aux_loss_coef\":\"big\"}", "router_aux_loss_coef", "number"},
        {HEAD "\"model_type\":\"mixtral\",\"num_local_experts\":70000}", "num_local_experts (70000)", "65536"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        if (llama_config_parse_any(&c, bad[i].text, strlen(bad[i].text), "config.json", &err) == 0)
            fail_msg("accepted: %s", bad[i].text);
        TU_MENTIONS(err.msg, bad[i].want1, bad[i].want2 ? bad[i].want2 : bad[i].want1);
    }
}

// A Mixtral config relabelled mistral was once planned as a 7.2B dense model: an expert count on
// a dense family is refused, naming the field.
static void test_experts_on_dense_family(void **state) {
    (void)state;
    llama_config c;
    ag_err err = {{0}};
    const char *fields[] = {"num_local_experts", "num_experts", "n_routed_experts"};
    const char *types[] = {"llama", "mistral", "qwen2", "qwen3"};
    for (size_t t = 0; t < 4; t++)
        for (size_t f = 0; f < 3; f++) {
            char text[512];
            snprintf(text, sizeof text, HEAD "\"model_type\":\"%s\",\"%s\":8}", types[t], fields[f]);
            assert_int_equal(parse(text, &c, &err), -1);
            TU_MENTIONS(err.msg, fields[f], "no mixture of experts");
        }
    assert_int_equal(parse(HEAD "\"model_type\":\"mistral\",\"num_local_experts\":0}", &c, &err), 0);
    assert_int_equal(parse(HEAD "\"model_type\":\"llama\",\"kv_lora_rank\":512}", &c, &err), -1);
    TU_MENTIONS(err.msg, "kv_lora_rank", "LlamaForCausalLM");
    assert_int_equal(parse(HEAD "\"model_type\":\"qwen2\",\"final_logit_softcapping\":30.0}", &c, &err), -1);
    TU_MENTIONS(err.msg, "final_logit_softcapping", "Qwen2ForCausalLM");
}

// phi3: fused projections, no window unless given (then on every layer), its dropout fields
// refused unless 0, rope_scaling longrope (its lists checked, the attention factor, the short
// factors within the original context and the long ones past it); phi-3-mini runs.
static void test_phi3_config(void **state) {
    (void)state;
    llama_config c;
    ag_err err = {{0}};
    assert_int_equal(parse(HEAD "\"model_type\":\"phi3\"}", &c, &err), 0);
    assert_true(c.fused_proj && c.sliding_window == 0);
    assert_int_equal(parse(HEAD "\"model_type\":\"phi3\",\"sliding_window\":2047}", &c, &err), 0);
    for (int64_t i = 0; i < c.layers; i++) assert_int_equal(llama_layer_window(&c, i), 2047);
    assert_int_equal(parse(HEAD "\"model_type\":\"phi3\",\"resid_pdrop\":0.1}", &c, &err), -1);
    TU_MENTIONS(err.msg, "resid_pdrop", "dropout");
#define LONGROPE(shortf)                                                                                               \
    HEAD "\"model_type\":\"phi3\",\"max_position_embeddings\":131072,\"original_max_position_embeddings\":4096,"       \
         "\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":" shortf ",\"long_factor\":[2,2,2,2,2,2,2,4]}}"
    assert_int_equal(parse(LONGROPE("[1,1,1,1,1,1,1]"), &c, &err), -1);
    TU_MENTIONS(err.msg, "short_factor", "head_dim / 2 = 8");
    assert_int_equal(parse(LONGROPE("[1,1,1,1,1,1,1,0]"), &c, &err), -1);
    TU_MENTIONS(err.msg, "short_factor", "item 7");
    assert_int_equal(parse(LONGROPE("[1,1,1,1,1,1,1,3]"), &c, &err), 0);
    llama_rope_prepare(&c);
    const double want = sqrt(1.0 + log(32.0) / log(4096.0)); // factor 131072 / 4096
    assert_true(fabs(c.rope.scale - want) < 1e-6);
    ag_rope_freqs s = llama_rope_freqs_at(&c, 4096), l = llama_rope_freqs_at(&c, 4097);
    const double last = 1.0 / pow(10000.0, 14.0 / 16.0);
    assert_true(fabs(s.inv_freq[7] - last / 3) < 1e-6 * last && fabs(l.inv_freq[7] - last / 4) < 1e-6 * last);
    assert_true(s.inv_freq[0] == 1.0f && l.inv_freq[0] == 0.5f && s.scale == l.scale);
    assert_int_equal(llama_config_preset(&c, "phi-3-mini", &err), 0);
    assert_string_equal(llama_family_class(c.family), "Phi3ForCausalLM");
    assert_int_equal(llama_layer_window(&c, 31), 2047);
}

// deepseek_v3: DeepseekV3Config's routing defaults (n_group 8, topk_group 4, routed_scaling_factor
// 2.5, norm_topk_prob, rope_interleave), the attention scale with yarn's mscale, what is refused by
// name; the preset listed.
static void test_deepseek_v3(void **state) {
    (void)state;
    llama_config c;
    ag_err err = {{0}};
#define DS_HEAD                                                                                                        \
    "{\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":4,\"num_attention_heads\":4,\"vocab_size\":"   \
    "100,"                                                                                                             \
    "\"model_type\":\"deepseek_v3\",\"n_routed_experts\":16"
#define DS DS_HEAD ",\"num_key_value_heads\":4,\"num_experts_per_tok\":2"
    assert_int_equal(parse(DS "}", &c, &err), 0);
    assert_true(c.moe.router == LLAMA_ROUTER_SIGMOID_GROUP && c.moe.n_group == 8 && c.moe.topk_group == 4);
    assert_true(c.moe.routed_scaling == 2.5 && c.moe.norm_topk_prob && c.mla.rope_interleave);
    assert_true(llama_mla_scale(&c) == (float)(1.0 / sqrt(192.0))); // no rope_scaling: (128 + 64)^-1/2
    assert_int_equal(parse(DS ",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,\"mscale\":1,\"mscale_all_dim\":1,"
                              "\"original_max_position_embeddings\":4096}}",
                           &c, &err),
                     0);
    const double m = 0.1 * log(40.0) + 1.0;
    assert_true(fabsf(llama_mla_scale(&c) - (float)(m * m / sqrt(192.0))) < 1e-7f);
    static const char *const refused[][2] = {
        {DS ",\"attention_bias\":true}", "attention_bias"},
        {DS_HEAD ",\"num_key_value_heads\":2}", "num_key_value_heads"},
        {DS ",\"n_group\":3}", "n_group"},
        {DS_HEAD ",\"num_key_value_heads\":4,\"n_group\":8,\"topk_group\":1,\"num_experts_per_tok\":4}", "n_group"},
        {DS ",\"qk_rope_head_dim\":7}", "qk_rope_head_dim"},
        {DS ",\"qk_nope_head_dim\":0}", "qk_nope_head_dim"},
        {DS ",\"routed_scaling_factor\":0}", "routed_scaling_factor"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        assert_int_equal(parse(refused[i][0], &c, &err), -1);
        TU_MENTIONS(err.msg, refused[i][1], "field");
    }
#undef DS
#undef DS_HEAD
    assert_int_equal(llama_config_preset(&c, "deepseek-v3", &err), 0);
    bool listed = false;
    for (size_t i = 0; i < llama_preset_count(); i++) listed |= strcmp(llama_preset_name(i), "deepseek-v3") == 0;
    assert_true(listed);
}

// gpt_oss: GptOssConfig's defaults (a window of 128 on every other layer, sliding first; the
// clamp 7), layer_types alternating or not, its fields refused by name; the presets listed.
static void test_gpt_oss(void **state) {
    (void)state;
    llama_config c;
    ag_err err = {{0}};
    assert_int_equal(parse(HEAD "\"model_type\":\"gpt_oss\",\"num_local_experts\":4}", &c, &err), 0);
    assert_true(c.sinks && c.qkv_bias && c.o_bias && c.moe.router_bias && c.moe.expert_bias);
    assert_true(c.moe.router == LLAMA_ROUTER_TOPK_SOFTMAX && c.moe.swiglu_limit == 7.0);
    for (int64_t i = 0; i < c.layers; i++) assert_int_equal(llama_layer_window(&c, i), i % 2 == 0 ? 128 : 0);
        // layer_types: every third layer full; full then sliding (as qwen2's); an irregular list refused
#define TYPES(a, b, c, d)                                                                                              \
    "\"layer_types\":[\"" a "_attention\",\"" b "_attention\",\"" c "_attention\",\"" d "_attention\"]}"
    assert_int_equal(parse(HEAD "\"model_type\":\"gpt_oss\",\"sliding_window\":8,\"swiglu_limit\":3.5," TYPES(
                               "sliding", "sliding", "full", "sliding"),
                           &c, &err),
                     0);
    for (int64_t i = 0; i < 4; i++) assert_int_equal(llama_layer_window(&c, i), (i + 1) % 3 ? 8 : 0);
    assert_true(c.moe.swiglu_limit == 3.5);
    assert_int_equal(
        parse(HEAD "\"model_type\":\"gpt_oss\",\"sliding_window\":8," TYPES("full", "sliding", "sliding", "sliding"),
              &c, &err),
        0);
    for (int64_t i = 0; i < 4; i++) assert_int_equal(llama_layer_window(&c, i), i ? 8 : 0);
    assert_int_equal(parse(HEAD "\"model_type\":\"gpt_oss\"," TYPES("sliding", "full", "full", "sliding"), &c, &err),
                     -1);
    TU_MENTIONS(err.msg, "layer_types", "every n-th layer full");
#undef TYPES
    assert_int_equal(parse(HEAD "\"model_type\":\"gpt_oss\",\"output_router_logits\":true}", &c, &err), -1);
    TU_MENTIONS(err.msg, "output_router_logits", "not modelled");
    assert_int_equal(parse(HEAD "\"model_type\":\"gpt_oss\",\"swiglu_limit\":0}", &c, &err), -1);
    TU_MENTIONS(err.msg, "swiglu_limit", "positive");
    static const char *const presets[] = {"gpt-oss-20b", "gpt-oss-120b"};
    for (size_t p = 0; p < 2; p++) {
        assert_int_equal(llama_config_preset(&c, presets[p], &err), 0);
        bool listed = false;
        for (size_t i = 0; i < llama_preset_count(); i++) listed |= strcmp(llama_preset_name(i), presets[p]) == 0;
        assert_true(listed);
    }
}

// Gemma 2: Gemma2Config's defaults, null soft-caps, the alternating layers, and the fields that
// would change the numbers refused by name.
static void test_gemma2_config(void **state) {
    (void)state;
    llama_config c;
    ag_err err = {{0}};
    assert_int_equal(parse(HEAD "\"model_type\":\"gemma2\",\"hidden_act\":\"gelu_pytorch_tanh\"}", &c, &err), 0);
    assert_true(c.tied && c.ff_norms && c.gelu && c.embed_scale && c.norm_offset == 1.0f);
    assert_true(c.head_dim == 256 && c.query_scalar == 256.0 && c.attn_softcap == 50.0 && c.final_softcap == 30.0);
    assert_true(c.max_positions == 8192 && c.sliding_window == 4096);
    for (int64_t i = 0; i < 4; i++) assert_int_equal(llama_layer_window(&c, i), i % 2 ? 0 : 4096); // the first slides
    assert_true(llama_attention_scale(&c) == 0.0f); // 256 = head_dim: the plain scale
    assert_int_equal(parse(HEAD
                           "\"model_type\":\"gemma2\",\"attn_logit_softcapping\":null,"
                           "\"final_logit_softcapping\":null,\"sliding_window\":null,\"query_pre_attn_scalar\":144,"
                           "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\","
                           "\"full_attention\"]}",
                           &c, &err),
                     0);
    assert_true(c.attn_softcap == 0.0 && c.final_softcap == 0.0 && llama_layer_window(&c, 0) == 0);
    assert_true(llama_attention_scale(&c) == (float)(1.0 / 12.0));
    const struct {
        const char *json, *want1, *want2;
    } bad[] = {
        {HEAD "\"model_type\":\"gemma2\",\"hidden_activation\":\"gelu\"}", "hidden_activation", "gelu_pytorch_tanh"},
        {HEAD "\"model_type\":\"gemma2\",\"attn_logit_softcapping\":0}", "attn_logit_softcapping", "null for none"},
        {HEAD "\"model_type\":\"gemma2\",\"final_logit_softcapping\":-1}", "final_logit_softcapping", "positive"},
        {HEAD "\"model_type\":\"gemma2\",\"query_pre_attn_scalar\":0}", "query_pre_attn_scalar", "positive"},
        {HEAD "\"model_type\":\"gemma2\",\"layer_types\":[\"full_attention\",\"sliding_attention\","
              "\"full_attention\",\"sliding_attention\"]}",
         "layer_types[1]", "full_attention"},
        {HEAD "\"model_type\":\"gemma2\",\"layer_types\":[\"sliding_attention\"]}", "layer_types", "num_hidden_layers"},
        {HEAD "\"model_type\":\"gemma2\",\"attention_dropout\":0.1}", "attention_dropout", "0"},
        {HEAD "\"model_type\":\"gemma2\",\"num_local_experts\":4}", "num_local_experts", "Gemma2ForCausalLM"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(parse(bad[i].json, &c, &err), -1);
        TU_MENTIONS(err.msg, bad[i].want1, bad[i].want2);
    }
    // Gemma 3: q_norm and k_norm, no caps, one full layer in sliding_window_pattern (6), the sliding
    // layers' RoPE on rope_local_base_freq
    assert_int_equal(parse(HEAD "\"model_type\":\"gemma3_text\"}", &c, &err), 0);
    assert_true(c.qk_norm && c.ff_norms && c.attn_softcap == 0.0 && c.final_softcap == 0.0 && c.rope_theta == 1e6);
    assert_true(c.window_period == 6 && c.vocab == 100);
    for (int64_t i = 0; i < 4; i++) assert_true(llama_layer_rope_freqs(&c, i, 1).theta == 10000.0f); // all slide
    assert_int_equal(parse(HEAD "\"model_type\":\"gemma3_text\",\"sliding_window_pattern\":3}", &c, &err), 0);
    for (int64_t i = 0; i < 4; i++) {
        assert_int_equal(llama_layer_window(&c, i), i == 2 ? 0 : 4096);
        assert_true(llama_layer_rope_freqs(&c, i, 1).theta == (i == 2 ? 1e6f : 10000.0f));
    }
    assert_true(llama_attention_scale(&c) == 0.0f); // 256 = head_dim: the plain scale
    assert_int_equal(parse(HEAD "\"model_type\":\"gemma3_text\",\"layer_types\":[\"sliding_attention\","
                                "\"full_attention\",\"sliding_attention\",\"full_attention\"]}",
                           &c, &err),
                     0);
    assert_true(llama_layer_window(&c, 0) == 4096 && llama_layer_window(&c, 1) == 0);
    assert_int_equal(parse(HEAD "\"model_type\":\"gemma3_text\",\"layer_types\":[\"sliding_attention\","
                                "\"full_attention\",\"full_attention\",\"full_attention\"]}",
                           &c, &err),
                     -1);
    TU_MENTIONS(err.msg, "layer_types[2]", "sliding_attention");
    assert_int_equal(parse(HEAD "\"model_type\":\"gemma3_text\",\"use_bidirectional_attention\":true}", &c, &err), -1);
    TU_MENTIONS(err.msg, "use_bidirectional_attention", "not modelled");
    assert_int_equal(parse(HEAD "\"model_type\":\"gemma3_text\",\"rope_local_base_freq\":0}", &c, &err), -1);
    TU_MENTIONS(err.msg, "rope_local_base_freq", "from");
}

// Routings: the assumptions' counts, a recorded routing written and read back, files refused
// naming what is wrong.
static void test_routing(void **state) {
    (void)state;
    llama_config c;
    ag_err err = {{0}};
    const char *text = HEAD "\"model_type\":\"mixtral\",\"num_local_experts\":4,\"num_experts_per_tok\":2}";
    assert_int_equal(parse(text, &c, &err), 0);
    int64_t count[4];
    llama_routing *r = NULL;
    assert_int_equal(llama_routing_new(&r, LLAMA_ROUTING_WORST, &err), 0);
    assert_int_equal(llama_routing_counts(r, 0, 1, 10, 4, 2, count, &err), 0);
    assert_true(count[0] == 10 && count[1] == 10 && count[2] == 0 && count[3] == 0);
    llama_routing_free(r);
    assert_int_equal(llama_routing_counts(NULL, 0, 1, 11, 4, 2, count, &err), 0); // balanced: 22 pairs
    assert_true(count[0] == 6 && count[1] == 6 && count[2] == 5 && count[3] == 5);
    // recorded, written, read back
    assert_int_equal(llama_routing_new(&r, LLAMA_ROUTING_MEASURED, &err), 0);
    assert_int_equal(llama_routing_add(r, 0, 0, 10, 4, 2, (const int64_t[]){7, 3, 10, 0}, &err), 0);
    assert_int_equal(llama_routing_add(r, 0, 1, 10, 4, 2, (const int64_t[]){5, 5, 5, 5}, &err), 0);
    assert_int_equal(llama_routing_add(r, 0, 1, 10, 4, 2, (const int64_t[]){9, 9, 1, 1}, &err), 0); // recomputed
    char *dir = tu_tmpdir(), path[4096];
    snprintf(path, sizeof path, "%s/routing.json", dir);
    FILE *f = fopen(path, "w");
    assert_int_equal(llama_routing_write(r, f, &err), 0);
    fclose(f);
    llama_routing_free(r);
    assert_int_equal(llama_routing_load(&r, path, &c, &err), 0);
    assert_int_equal(llama_routing_counts(r, 0, 0, 10, 4, 2, count, &err), 0);
    assert_true(count[0] == 7 && count[2] == 10 && count[3] == 0);
    assert_int_equal(llama_routing_counts(r, 0, 1, 10, 4, 2, count, &err), 0);
    assert_true(count[0] == 5 && count[3] == 5); // the first record of a forward and layer
    assert_int_equal(llama_routing_counts(r, 1, 0, 10, 4, 2, count, &err), -1);
    TU_MENTIONS(err.msg, "no routing for forward 1, layer 0", "routing.json");
    assert_int_equal(llama_routing_counts(r, 0, 0, 12, 4, 2, count, &err), -1);
    TU_MENTIONS(err.msg, "routed 10 tokens", "this run has 12");
    llama_routing_free(r);
    // What trains: forward 0 leaves layer 0's experts 2 and 3 idle, forward 1 its 0 and 3
    assert_int_equal(llama_routing_new(&r, LLAMA_ROUTING_MEASURED, &err), 0);
    for (int64_t fw = 0; fw < 2; fw++)
        for (int64_t l = 0; l < 4; l++)
            assert_int_equal(llama_routing_add(r, fw, l, 10, 4, 2,
                                               l    ? (const int64_t[]){5, 5, 5, 5}
                                               : fw ? (const int64_t[]){0, 10, 10, 0}
                                                    : (const int64_t[]){10, 10, 0, 0},
                                               &err),
                             0);
    f = fopen(path, "w");
    assert_int_equal(llama_routing_write(r, f, &err), 0);
    fclose(f);
    llama_routing_free(r);
    assert_int_equal(llama_routing_load(&r, path, &c, &err), 0);
    const uint64_t P = llama_param_count(&c), expert = 3 * 64 * 96;
    uint64_t most, any;
    assert_int_equal(llama_routing_trained(r, &c, 10, 2, 1, &most, &any, &err), 0); // two steps
    assert_int_equal(most, P - 2 * expert);
    assert_int_equal(any, P - expert);
    assert_int_equal(llama_routing_trained(r, &c, 10, 1, 2, &most, &any, &err), 0); // one step of two
    assert_true(most == P - expert && any == P - expert);
    assert_int_equal(llama_routing_trained(r, &c, 10, 3, 1, &most, &any, &err), -1);
    TU_MENTIONS(err.msg, "no routing for forward 2", "routing.json");
    llama_routing_free(r);
    assert_int_equal(llama_routing_trained(NULL, &c, 1, 1, 1, &most, &any, &err), 0); // balanced: 2 pairs
    assert_true(most == P - 2 * 4 * expert && any == most);
    const struct {
        const char *json, *want1, *want2;
    } bad[] = {
        {"{\"membill_routing\":1,\"experts\":8,\"top_k\":2,\"layers\":[]}", "8 experts", "the model has 4"},
        {"{\"membill_routing\":1,\"experts\":4,\"top_k\":2,\"layers\":[{\"forward\":0,\"layer\":0,"
         "\"tokens\":10,\"count\":[10,10,1,0]}]}",
         "layers[0] routes 21 pairs", "20"},
        {"{\"membill_routing\":1,\"experts\":4,\"top_k\":2,\"layers\":[{\"forward\":0,\"layer\":0,"
         "\"tokens\":10,\"count\":[11,9,0,0]}]}",
         "count[0]", "0 to tokens (10)"},
        {"{\"membill_routing\":1,\"experts\":4,\"top_k\":2,\"layers\":[{\"forward\":0,\"layer\":9,"
         "\"tokens\":10,\"count\":[10,10,0,0]}]}",
         "layers[0]", "a sparse layer"},
        {"[1]", "membill_routing", "layers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = fopen(path, "w");
        fputs(bad[i].json, f);
        fclose(f);
        memset(&err, 0, sizeof err);
        assert_int_equal(llama_routing_load(&r, path, &c, &err), -1);
        assert_null(r);
        TU_MENTIONS(err.msg, bad[i].want1, bad[i].want2);
    }
    tu_rmtree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_counts),   cmocka_unit_test(test_names),
        cmocka_unit_test(test_sparse_layers),      cmocka_unit_test(test_experts_on_dense_family),
        cmocka_unit_test(test_gpt_oss),            cmocka_unit_test(test_phi3_config),
        cmocka_unit_test(test_deepseek_v3),        cmocka_unit_test(test_routing),
        cmocka_unit_test(test_gemma2_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
