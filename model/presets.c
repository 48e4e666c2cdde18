// Built-in configs, copied from the models' Hugging Face config.json files. Each one's
// parameter count is checked against the published figure in tests/model/test_config.c.
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "model_internal.h"

typedef struct {
    const char *name;
    int64_t hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_positions;
    double rope_theta, rms_eps;
    bool tied;
    llama_family family;
    int64_t sliding_window; // every layer's (Mistral-7B-v0.1's config.json: 4096)
} preset;

static const preset presets[] = {
    // name             hidden inter  layers heads kv  hdim vocab   positions theta  eps  tied
    {"smollm2-135m", 576, 1536, 30, 9, 3, 64, 49152, 8192, 100000.0, 1e-5, true, LLAMA_FAMILY_LLAMA, 0},
    {"smollm2-360m", 960, 2560, 32, 15, 5, 64, 49152, 8192, 100000.0, 1e-5, true, LLAMA_FAMILY_LLAMA, 0},
    {"smollm2-1.7b", 2048, 8192, 24, 32, 32, 64, 49152, 8192, 130000.0, 1e-5, true, LLAMA_FAMILY_LLAMA, 0},
    {"llama-2-7b", 4096, 11008, 32, 32, 32, 128, 32000, 4096, 10000.0, 1e-5, false, LLAMA_FAMILY_LLAMA, 0},
    {"llama-2-13b", 5120, 13824, 40, 40, 40, 128, 32000, 4096, 10000.0, 1e-5, false, LLAMA_FAMILY_LLAMA, 0},
    // LLaMA (1) 65B: the model the QLoRA paper fine-tunes on one 48 GB GPU
    {"llama-65b", 8192, 22016, 80, 64, 64, 128, 32000, 2048, 10000.0, 1e-6, false, LLAMA_FAMILY_LLAMA, 0},
    {"llama-2-70b", 8192, 28672, 80, 64, 8, 128, 32000, 4096, 10000.0, 1e-5, false, LLAMA_FAMILY_LLAMA, 0},
    {"llama-3-8b", 4096, 14336, 32, 32, 8, 128, 128256, 8192, 500000.0, 1e-5, false, LLAMA_FAMILY_LLAMA, 0},
    {"llama-3-70b", 8192, 28672, 80, 64, 8, 128, 128256, 8192, 500000.0, 1e-5, false, LLAMA_FAMILY_LLAMA, 0},
    {"llama-3.1-405b", 16384, 53248, 126, 128, 8, 128, 128256, 131072, 500000.0, 1e-5, false, LLAMA_FAMILY_LLAMA, 0},
    {"mistral-7b", 4096, 14336, 32, 32, 8, 128, 32000, 32768, 10000.0, 1e-5, false, LLAMA_FAMILY_MISTRAL, 4096},
};

#define NPRESETS (sizeof presets / sizeof presets[0])

// The families whose configs need more than the table above: each model's published config.json
// (its fields that matter), parsed as --config parses one. Those of a family not modelled yet are
// refused by name, and left out of the list.
static const struct {
    const char *name, *json;
} json_presets[] = {
    {"mixtral-8x7b", "{\"architectures\":[\"MixtralForCausalLM\"],\"attention_dropout\":0.0,\"hidden_act\":\"silu\","
                     "\"hidden_size\":4096,\"intermediate_size\":14336,\"max_position_embeddings\":32768,"
                     "\"model_type\":\"mixtral\",\"num_attention_heads\":32,\"num_experts_per_tok\":2,"
                     "\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"num_local_experts\":8,"
                     "\"output_router_logits\":false,\"rms_norm_eps\":1e-05,\"rope_theta\":1000000.0,"
                     "\"router_aux_loss_coef\":0.02,\"sliding_window\":null,\"tie_word_embeddings\":false,"
                     "\"vocab_size\":32000}"},
    {"qwen1.5-moe-a2.7b",
     "{\"architectures\":[\"Qwen2MoeForCausalLM\"],\"attention_dropout\":0.0,"
     "\"decoder_sparse_step\":1,\"hidden_act\":\"silu\",\"hidden_size\":2048,\"intermediate_size\":5632,"
     "\"max_position_embeddings\":8192,\"max_window_layers\":21,\"model_type\":\"qwen2_moe\","
     "\"moe_intermediate_size\":1408,\"norm_topk_prob\":false,\"num_attention_heads\":16,"
     "\"num_experts\":60,\"num_experts_per_tok\":4,\"num_hidden_layers\":24,"
     "\"num_key_value_heads\":16,\"output_router_logits\":false,\"rms_norm_eps\":1e-06,"
     "\"rope_theta\":1000000.0,\"router_aux_loss_coef\":0.001,"
     "\"shared_expert_intermediate_size\":5632,\"sliding_window\":32768,"
     "\"tie_word_embeddings\":false,\"use_sliding_window\":false,\"vocab_size\":151936}"},
    {"qwen3-30b-a3b", "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
                      "\"decoder_sparse_step\":1,\"head_dim\":128,\"hidden_act\":\"silu\",\"hidden_size\":2048,"
                      "\"intermediate_size\":6144,\"max_position_embeddings\":40960,\"max_window_layers\":48,"
                      "\"mlp_only_layers\":[],\"model_type\":\"qwen3_moe\",\"moe_intermediate_size\":768,"
                      "\"norm_topk_prob\":true,\"num_attention_heads\":32,\"num_experts\":128,"
                      "\"num_experts_per_tok\":8,\"num_hidden_layers\":48,\"num_key_value_heads\":4,"
                      "\"output_router_logits\":false,\"rms_norm_eps\":1e-06,\"rope_scaling\":null,"
                      "\"rope_theta\":1000000.0,\"router_aux_loss_coef\":0.001,\"sliding_window\":null,"
                      "\"tie_word_embeddings\":false,\"use_sliding_window\":false,\"vocab_size\":151936}"},
    {"qwen3-235b-a22b",
     "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
     "\"decoder_sparse_step\":1,\"head_dim\":128,\"hidden_act\":\"silu\",\"hidden_size\":4096,"
     "\"intermediate_size\":12288,\"max_position_embeddings\":40960,\"max_window_layers\":94,"
     "\"mlp_only_layers\":[],\"model_type\":\"qwen3_moe\",\"moe_intermediate_size\":1536,"
     "\"norm_topk_prob\":true,\"num_attention_heads\":64,\"num_experts\":128,"
     "\"num_experts_per_tok\":8,\"num_hidden_layers\":94,\"num_key_value_heads\":4,"
     "\"output_router_logits\":false,\"rms_norm_eps\":1e-06,\"rope_scaling\":null,"
     "\"rope_theta\":1000000.0,\"router_aux_loss_coef\":0.001,\"sliding_window\":null,"
     "\"tie_word_embeddings\":false,\"use_sliding_window\":false,\"vocab_size\":151936}"},
    {"gemma-2-9b", "{\"architectures\":[\"Gemma2ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
                   "\"attn_logit_softcapping\":50.0,\"final_logit_softcapping\":30.0,\"head_dim\":256,"
                   "\"hidden_act\":\"gelu_pytorch_tanh\",\"hidden_activation\":\"gelu_pytorch_tanh\","
                   "\"hidden_size\":3584,\"intermediate_size\":14336,\"max_position_embeddings\":8192,"
                   "\"model_type\":\"gemma2\",\"num_attention_heads\":16,\"num_hidden_layers\":42,"
                   "\"num_key_value_heads\":8,\"query_pre_attn_scalar\":256,\"rms_norm_eps\":1e-06,"
                   "\"rope_theta\":10000.0,\"sliding_window\":4096,\"vocab_size\":256000}"},
    {"gemma-3-1b", "{\"architectures\":[\"Gemma3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
                   "\"attn_logit_softcapping\":null,\"final_logit_softcapping\":null,\"head_dim\":256,"
                   "\"hidden_activation\":\"gelu_pytorch_tanh\",\"hidden_size\":1152,\"intermediate_size\":6912,"
                   "\"max_position_embeddings\":32768,\"model_type\":\"gemma3_text\",\"num_attention_heads\":4,"
                   "\"num_hidden_layers\":26,\"num_key_value_heads\":1,\"query_pre_attn_scalar\":256,"
                   "\"rms_norm_eps\":1e-06,\"rope_local_base_freq\":10000,\"rope_scaling\":null,"
                   "\"rope_theta\":1000000,\"sliding_window\":512,\"sliding_window_pattern\":6,"
                   "\"vocab_size\":262144}"},
    {"phi-3-mini", "{\"architectures\":[\"Phi3ForCausalLM\"],\"attention_dropout\":0.0,\"embd_pdrop\":0.0,"
                   "\"hidden_act\":\"silu\",\"hidden_size\":3072,\"intermediate_size\":8192,"
                   "\"max_position_embeddings\":4096,\"model_type\":\"phi3\",\"num_attention_heads\":32,"
                   "\"num_hidden_layers\":32,\"num_key_value_heads\":32,\"original_max_position_embeddings\":4096,"
                   "\"resid_pdrop\":0.0,\"rms_norm_eps\":1e-05,\"rope_scaling\":null,\"rope_theta\":10000.0,"
                   "\"sliding_window\":2047,\"tie_word_embeddings\":false,\"vocab_size\":32064}"},
    {"gpt-oss-20b", "{\"architectures\":[\"GptOssForCausalLM\"],\"attention_bias\":true,\"attention_dropout\":0.0,"
                    "\"head_dim\":64,\"hidden_act\":\"silu\",\"hidden_size\":2880,\"intermediate_size\":2880,"
                    "\"max_position_embeddings\":131072,\"model_type\":\"gpt_oss\","
                    "\"num_attention_heads\":64,\"num_experts_per_tok\":4,\"num_hidden_layers\":24,"
                    "\"num_key_value_heads\":8,\"num_local_experts\":32,\"output_router_logits\":false,"
                    "\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"beta_fast\":32.0,\"beta_slow\":1.0,\"factor\":32.0,"
                    "\"original_max_position_embeddings\":4096,\"rope_type\":\"yarn\",\"truncate\":false},"
                    "\"rope_theta\":150000,\"router_aux_loss_coef\":0.9,\"sliding_window\":128,\"swiglu_limit\":7.0,"
                    "\"tie_word_embeddings\":false,\"vocab_size\":201088}"},
    {"gpt-oss-120b", "{\"architectures\":[\"GptOssForCausalLM\"],\"attention_bias\":true,\"attention_dropout\":0.0,"
                     "\"head_dim\":64,\"hidden_act\":\"silu\",\"hidden_size\":2880,\"intermediate_size\":2880,"
                     "\"max_position_embeddings\":131072,\"model_type\":\"gpt_oss\","
                     "\"num_attention_heads\":64,\"num_experts_per_tok\":4,\"num_hidden_layers\":36,"
                     "\"num_key_value_heads\":8,\"num_local_experts\":128,\"output_router_logits\":false,"
                     "\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"beta_fast\":32.0,\"beta_slow\":1.0,\"factor\":32.0,"
                     "\"original_max_position_embeddings\":4096,\"rope_type\":\"yarn\",\"truncate\":false},"
                     "\"rope_theta\":150000,\"router_aux_loss_coef\":0.9,\"sliding_window\":128,\"swiglu_limit\":7.0,"
                     "\"tie_word_embeddings\":false,\"vocab_size\":201088}"},
    {"deepseek-v3",
     "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"attention_bias\":false,"
     "\"attention_dropout\":0.0,\"first_k_dense_replace\":3,\"hidden_act\":\"silu\","
     "\"hidden_size\":7168,\"intermediate_size\":18432,\"kv_lora_rank\":512,"
     "\"max_position_embeddings\":163840,\"model_type\":\"deepseek_v3\","
     "\"moe_intermediate_size\":2048,\"moe_layer_freq\":1,\"n_group\":8,\"n_routed_experts\":256,"
     "\"n_shared_experts\":1,\"norm_topk_prob\":true,\"num_attention_heads\":128,"
     "\"num_experts_per_tok\":8,\"num_hidden_layers\":61,\"num_key_value_heads\":128,"
     "\"num_nextn_predict_layers\":1,\"q_lora_rank\":1536,\"qk_nope_head_dim\":128,"
     "\"qk_rope_head_dim\":64,\"rms_norm_eps\":1e-06,\"rope_scaling\":{\"beta_fast\":32,\"beta_slow\":1,"
     "\"factor\":40,\"mscale\":1.0,\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":4096,"
     "\"type\":\"yarn\"},\"rope_theta\":10000,\"routed_scaling_factor\":2.5,\"scoring_func\":\"sigmoid\","
     "\"tie_word_embeddings\":false,\"topk_group\":4,\"topk_method\":\"noaux_tc\",\"v_head_dim\":128,"
     "\"vocab_size\":129280}"},
};
#define NJSON (sizeof json_presets / sizeof json_presets[0])

// The JSON preset of that name (NULL: none).
static const char *json_of(const char *name) {
    for (size_t i = 0; name && i < NJSON; i++)
        if (strcasecmp(json_presets[i].name, name) == 0) return json_presets[i].json;
    return NULL;
}

// Parses a JSON preset, modelled or not (any), under its own name.
static int json_preset(llama_config *out, const char *name, bool any, ag_err *err) {
    const char *j = json_of(name);
    if (!j) { // a name json_of knows; said for the optimiser, which cannot see it
        ag_err_set(err, "no preset %s", name ? name : "(none)");
        return -1;
    }
    char origin[LLAMA_NAME_MAX];
    snprintf(origin, sizeof origin, "preset %s", name ? name : "");
    int rc = any ? llama_config_parse_any(out, j, strlen(j), origin, err)
                 : llama_config_parse(out, j, strlen(j), origin, err);
    if (rc == 0) snprintf(out->name, sizeof out->name, "%s", name);
    return rc;
}

// The presets a user may name: the table's, then the JSON ones of modelled families.
static const char *usable(size_t i) {
    if (i < NPRESETS) return presets[i].name;
    for (size_t k = 0; k < NJSON; k++) {
        llama_config c;
        if (json_preset(&c, json_presets[k].name, true, NULL) == 0 && llama_family_modelled(c.family) &&
            i-- == NPRESETS)
            return json_presets[k].name;
    }
    return NULL;
}

size_t llama_preset_count(void) {
    size_t n = 0;
    while (usable(n)) n++;
    return n;
}

const char *llama_preset_name(size_t i) { return usable(i); }

int llama_config_preset_any(llama_config *out, const char *name, ag_err *err) {
    if (json_of(name)) return json_preset(out, name, true, err);
    return llama_config_preset(out, name, err);
}

static void list_names(char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; usable(i) && used < len; i++) {
        int k = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", usable(i));
        if (k < 0) break;
        used += (size_t)k;
    }
}

int llama_config_preset(llama_config *out, const char *name, ag_err *err) {
    if (json_of(name)) return json_preset(out, name, false, err);
    for (size_t i = 0; name && i < NPRESETS; i++) {
        const preset *p = &presets[i];
        if (strcasecmp(p->name, name) != 0) continue;
        memset(out, 0, sizeof *out);
        snprintf(out->name, sizeof out->name, "%s", p->name);
        out->hidden = p->hidden;
        out->intermediate = p->intermediate;
        out->layers = p->layers;
        out->heads = p->heads;
        out->kv_heads = p->kv_heads;
        out->head_dim = p->head_dim;
        out->vocab = p->vocab;
        out->max_positions = p->max_positions;
        out->rope_theta = p->rope_theta;
        out->rms_eps = p->rms_eps;
        out->tied = p->tied;
        out->family = p->family;
        out->sliding_window = p->sliding_window;
        return 0;
    }
    char known[768];
    list_names(known, sizeof known);
    ag_err_set(err, "unknown model '%s' (presets: %s)", name ? name : "(null)", known);
    return -1;
}
