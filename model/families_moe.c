// The mixtures of experts' config fields (mixtral, qwen2_moe, qwen3_moe), with their config
// classes' defaults; what would change the numbers and is not modelled is refused by name.
#include <math.h>
#include <string.h>

#include "model_internal.h"

#define MAX_EXPERTS (1 << 16)

// An integer field: dflt when absent or null; refused below lo or above hi, naming it.
static int int_field(const json_t *root, const char *path, const char *field, int64_t dflt, int64_t lo, int64_t hi,
                     int64_t *out, ag_err *err) {
    *out = dflt;
    if (llama_json_int(root, path, field, false, out, err) < 0) return -1;
    if (*out < lo || *out > hi) {
        ag_err_set(err, "%s: field %s (%lld) must be from %lld to %lld", path, field, (long long)*out, (long long)lo,
                   (long long)hi);
        return -1;
    }
    return 0;
}

// The experts and their top-k: top_k at most experts.
static int experts_fields(llama_moe *m, const json_t *root, const char *path, const char *count_field, int64_t experts,
                          int64_t top_k, ag_err *err) {
    if (int_field(root, path, count_field, experts, 0, MAX_EXPERTS, &m->experts, err) != 0 ||
        int_field(root, path, "num_experts_per_tok", top_k, 1, MAX_EXPERTS, &m->top_k, err) != 0)
        return -1;
    if (m->experts > 0 && m->top_k > m->experts) {
        ag_err_set(err, "%s: field num_experts_per_tok (%lld) must be at most %s (%lld)", path, (long long)m->top_k,
                   count_field, (long long)m->experts);
        return -1;
    }
    return 0;
}

// output_router_logits (the load-balancing loss joins the loss) and its coefficient.
static int aux_fields(llama_moe *m, const json_t *root, const char *path, ag_err *err) {
    m->aux_coef = 0.001;
    if (llama_json_bool(root, path, "output_router_logits", &m->aux_loss, err) < 0 ||
        llama_json_number(root, path, "router_aux_loss_coef", &m->aux_coef, err) < 0)
        return -1;
    if (!isfinite(m->aux_coef) || m->aux_coef < 0) {
        ag_err_set(err, "%s: field router_aux_loss_coef (%g) must be a number of at least 0", path, m->aux_coef);
        return -1;
    }
    return 0;
}

// decoder_sparse_step and mlp_only_layers: which layers are sparse (qwen2_moe, qwen3_moe).
static int sparse_layers(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    llama_moe *m = &c->moe;
    if (int_field(root, path, "decoder_sparse_step", 1, 1, c->layers, &m->sparse_step, err) != 0) return -1;
    const json_t *only = json_object_get(root, "mlp_only_layers");
    if (!only || json_is_null(only)) return 0;
    if (!json_is_array(only) || json_array_size(only) > LLAMA_MAX_MLP_ONLY) {
        ag_err_set(err, "%s: field mlp_only_layers must be an array of at most %d layer indices", path,
                   LLAMA_MAX_MLP_ONLY);
        return -1;
    }
    for (size_t i = 0; i < json_array_size(only); i++) {
        const json_t *v = json_array_get(only, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->layers) {
            ag_err_set(err, "%s: field mlp_only_layers[%zu] must be a layer index, 0 to %lld", path, i,
                       (long long)c->layers - 1);
            return -1;
        }
        m->mlp_only[m->n_mlp_only++] = (int32_t)json_integer_value(v);
    }
    return 0;
}

// What the expert parsers of every family check last: each expert's intermediate size in bounds.
static int check_inter(const char *path, const char *field, int64_t v, ag_err *err) {
    if (v < 1 || v > LLAMA_MAX_INTERMEDIATE) {
        ag_err_set(err, "%s: field %s (%lld) must be from 1 to %d", path, field, (long long)v, LLAMA_MAX_INTERMEDIATE);
        return -1;
    }
    return 0;
}

// MixtralConfig: every layer sparse, 8 experts, 2 a token, each expert intermediate_size wide,
// the two weights renormalised; mistral's attention with no window unless given.
int llama_mixtral_fields(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    llama_moe *m = &c->moe;
    m->intermediate = c->intermediate, m->norm_topk_prob = true, m->sparse_step = 1;
    m->router = LLAMA_ROUTER_SOFTMAX_TOPK;
    double jitter = 0.0;
    if (experts_fields(m, root, path, "num_local_experts", 8, 2, err) != 0 || aux_fields(m, root, path, err) != 0 ||
        llama_json_number(root, path, "router_jitter_noise", &jitter, err) < 0)
        return -1;
    if (jitter != 0.0) { // training multiplies the router's input by uniform noise
        ag_err_set(err, "%s: field router_jitter_noise (%g) must be 0 (the router's noise is not modelled)", path,
                   jitter);
        return -1;
    }
    c->window_from = 0;
    return llama_window_field(root, path, 0, true, &c->sliding_window, err);
}

// The experts of Qwen2MoeConfig and Qwen3MoeConfig (their defaults differ).
static int qwen_moe(llama_config *c, const json_t *root, const char *path, int64_t experts, int64_t top_k,
                    int64_t inter, ag_err *err) {
    llama_moe *m = &c->moe;
    m->router = LLAMA_ROUTER_SOFTMAX_TOPK;
    if (experts_fields(m, root, path, "num_experts", experts, top_k, err) != 0 ||
        int_field(root, path, "moe_intermediate_size", inter, 1, LLAMA_MAX_INTERMEDIATE, &m->intermediate, err) != 0 ||
        llama_json_bool(root, path, "norm_topk_prob", &m->norm_topk_prob, err) < 0 ||
        aux_fields(m, root, path, err) != 0 || sparse_layers(c, root, path, err) != 0)
        return -1;
    return check_inter(path, "moe_intermediate_size", m->intermediate, err);
}

// Qwen2MoeConfig: 60 experts, 4 a token, 1408 wide, a shared expert 5632 wide with its sigmoid
// gate; q, k and v biases (qkv_bias, true unless given).
int llama_qwen2_moe_fields(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    c->qkv_bias = true;
    llama_moe *m = &c->moe;
    if (llama_json_bool(root, path, "qkv_bias", &c->qkv_bias, err) < 0 ||
        qwen_moe(c, root, path, 60, 4, 1408, err) != 0 ||
        int_field(root, path, "shared_expert_intermediate_size", 5632, 1, LLAMA_MAX_INTERMEDIATE,
                  &m->shared_intermediate, err) != 0)
        return -1;
    m->shared_gate = true;
    return llama_qwen_window(c, root, path, err);
}

// Qwen3MoeConfig: 128 experts, 8 a token, 768 wide; qwen3's attention.
int llama_qwen3_moe_fields(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    c->qk_norm = true;
    if (llama_attention_bias(c, root, path, err) != 0 || qwen_moe(c, root, path, 128, 8, 768, err) != 0) return -1;
    return llama_qwen_window(c, root, path, err);
}

// ---------------------------------------------------------------------------------------------
// The families whose parameter tables are known but whose forward is not modelled yet: the
// fields their shapes take, nothing else (the family is refused as a whole).

// A soft-cap: a positive number, or null for none; absent: dflt.
static int softcap_field(const json_t *root, const char *path, const char *field, double dflt, double *out,
                         ag_err *err) {
    const json_t *v = json_object_get(root, field);
    *out = v && json_is_null(v) ? 0.0 : dflt;
    if (llama_json_number(root, path, field, out, err) < 0) return -1;
    if (!(*out >= 0.0 && *out <= 1e6) || (v && !json_is_null(v) && *out == 0.0)) {
        ag_err_set(err, "%s: field %s (%g) must be a positive number up to 1e6, or null for none", path, field, *out);
        return -1;
    }
    return 0;
}

// The sliding layers: all but every period-th (Gemma 2: every other, the first sliding; Gemma 3:
// sliding_window_pattern, 6); a layer_types given must be such a pattern.
static int gemma_layers(llama_config *c, const json_t *root, const char *path, int64_t period, const char *pattern,
                        ag_err *err) {
    c->window_from = 0;
    if (llama_window_field(root, path, 4096, true, &c->sliding_window, err) != 0) return -1;
    if (pattern && llama_json_int(root, path, pattern, false, &period, err) < 0) return -1;
    if (period < 1 || period > LLAMA_MAX_LAYERS + 1) {
        ag_err_set(err, "%s: field %s (%lld) must be from 1 to %d", path, pattern, (long long)period,
                   LLAMA_MAX_LAYERS + 1);
        return -1;
    }
    const json_t *lt = json_object_get(root, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int64_t)json_array_size(lt) != c->layers) {
            ag_err_set(err, "%s: field layer_types must be an array of num_hidden_layers (%lld) strings", path,
                       (long long)c->layers);
            return -1;
        }
        period = c->layers + 1; // every layer sliding, unless a full one says otherwise
        for (size_t i = 0; i < json_array_size(lt); i++) {
            const char *t = json_string_value(json_array_get(lt, i));
            if (t && strcmp(t, "full_attention") == 0 && period == c->layers + 1) period = (int64_t)i + 1;
        }
        for (size_t i = 0; i < json_array_size(lt); i++) {
            const char *t = json_string_value(json_array_get(lt, i));
            const char *want = ((int64_t)i + 1) % period ? "sliding_attention" : "full_attention";
            if (!t || strcmp(t, want) != 0) {
                ag_err_set(err,
                           "%s: field layer_types[%zu] must be \"%s\" (sliding layers with every %lld-th full is "
                           "the pattern modelled)",
                           path, i, want, (long long)period);
                return -1;
            }
        }
    }
    c->window_period = c->sliding_window > 0 ? period : 0; // sliding_window null: no layer slides
    return 0;
}

// Gemma2Config and Gemma3TextConfig: the norms around each sub-block, (1 + w) norms, GeLU-tanh, the
// embeddings scaled, query_pre_attn_scalar (256), sliding layers (4096) between full ones. Gemma 2
// caps the scores and the logits (50 and 30); Gemma 3 has q_norm and k_norm, no caps unless given,
// and its sliding layers' RoPE on rope_local_base_freq (10000).
int llama_gemma_fields(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    const bool g3 = c->family == LLAMA_FAMILY_GEMMA3;
    c->ff_norms = true, c->qk_norm = g3;
    c->norm_offset = 1.0f, c->gelu = true, c->embed_scale = true, c->query_scalar = 256.0;
    if (llama_attention_bias(c, root, path, err) != 0) return -1;
    const json_t *act = json_object_get(root, "hidden_activation");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "gelu_pytorch_tanh") != 0)) {
        ag_err_set(err, "%s: field hidden_activation must be \"gelu_pytorch_tanh\" (Gemma's MLP)", path);
        return -1;
    }
    if (llama_json_number(root, path, "query_pre_attn_scalar", &c->query_scalar, err) < 0) return -1;
    if (!(c->query_scalar >= 1e-6 && c->query_scalar <= 1e12)) {
        ag_err_set(err, "%s: field query_pre_attn_scalar (%g) must be a positive number", path, c->query_scalar);
        return -1;
    }
    if (softcap_field(root, path, "attn_logit_softcapping", g3 ? 0.0 : 50.0, &c->attn_softcap, err) != 0 ||
        softcap_field(root, path, "final_logit_softcapping", g3 ? 0.0 : 30.0, &c->final_softcap, err) != 0)
        return -1;
    if (!g3) return gemma_layers(c, root, path, 2, NULL, err);
    bool bidirectional = false;
    if (llama_json_bool(root, path, "use_bidirectional_attention", &bidirectional, err) < 0) return -1;
    if (bidirectional) {
        ag_err_set(err, "%s: field use_bidirectional_attention: a bidirectional Gemma 3 is not modelled", path);
        return -1;
    }
    c->rope_local_theta = 10000.0;
    if (llama_json_number(root, path, "rope_local_base_freq", &c->rope_local_theta, err) < 0) return -1;
    if (!(c->rope_local_theta >= LLAMA_MIN_ROPE_THETA && c->rope_local_theta <= LLAMA_MAX_ROPE_THETA)) {
        ag_err_set(err, "%s: field rope_local_base_freq (%g) must be a number from %g to %g", path, c->rope_local_theta,
                   LLAMA_MIN_ROPE_THETA, LLAMA_MAX_ROPE_THETA);
        return -1;
    }
    return gemma_layers(c, root, path, 6, "sliding_window_pattern", err);
}

// Phi3Config: qkv_proj and gate_up_proj fused; a window on every layer when sliding_window is given
// (none by default: create_causal_mask); resid_pdrop and embd_pdrop are dropout, refused unless 0.
int llama_phi3_fields(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    static const char *const drops[] = {"resid_pdrop", "embd_pdrop"};
    c->fused_proj = true, c->window_from = 0;
    for (size_t i = 0; i < sizeof drops / sizeof drops[0]; i++) {
        double v = 0;
        if (llama_json_number(root, path, drops[i], &v, err) < 0) return -1;
        if (v != 0) {
            ag_err_set(err, "%s: field %s (%g) must be 0 (dropout is not modelled)", path, drops[i], v);
            return -1;
        }
    }
    return llama_window_field(root, path, 0, true, &c->sliding_window, err);
}

// GptOssConfig: 128 experts, 4 a token, intermediate_size wide, stacked with biases; a router with
// a bias (top-k of the logits, then their softmax); biases in attention (attention_bias, true
// unless given), one sink per head, the clamped SwiGLU (swiglu_limit 7); a window of 128 on every
// other layer (layer_types, sliding first). output_router_logits is refused: its load-balancing
// loss reads the routers' scattered scores, which membill does not model.
int llama_gpt_oss_fields(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    llama_moe *m = &c->moe;
    c->qkv_bias = c->o_bias = true, c->sinks = true;
    m->intermediate = c->intermediate, m->sparse_step = 1, m->router = LLAMA_ROUTER_TOPK_SOFTMAX;
    m->router_bias = m->expert_bias = true, m->swiglu_limit = 7.0;
    if (llama_json_bool(root, path, "attention_bias", &c->qkv_bias, err) < 0 ||
        experts_fields(m, root, path, "num_local_experts", 128, 4, err) != 0 || aux_fields(m, root, path, err) != 0 ||
        llama_json_number(root, path, "swiglu_limit", &m->swiglu_limit, err) < 0 ||
        llama_window_field(root, path, 128, true, &c->sliding_window, err) != 0)
        return -1;
    c->o_bias = c->qkv_bias;
    if (!isfinite(m->swiglu_limit) || m->swiglu_limit <= 0) {
        ag_err_set(err, "%s: field swiglu_limit (%g) must be a positive number", path, m->swiglu_limit);
        return -1;
    }
    if (m->aux_loss) {
        ag_err_set(err,
                   "%s: field output_router_logits: gpt_oss's load-balancing loss (over the routers' scattered "
                   "scores) is not modelled",
                   path);
        return -1;
    }
    c->full_every = c->sliding_window > 0 ? 2 : 0, c->window_from = 0; // GptOssConfig's layer_types
    return llama_layer_types(c, root, path, err);
}

// DeepseekV3Config's routing and the attention fields its forward reads: n_group 8, topk_group 4,
// routed_scaling_factor 2.5, norm_topk_prob true, rope_interleave true; attention_bias (biases on
// q_a_proj, kv_a_proj_with_mqa and o_proj) and key-value heads other than the query heads (which
// transformers' repeat_kv would repeat again) are refused by name.
static int deepseek_v3_routing(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    llama_moe *m = &c->moe;
    bool bias = false;
    m->routed_scaling = 2.5, c->mla.rope_interleave = true;
    if (int_field(root, path, "n_group", 8, 1, MAX_EXPERTS, &m->n_group, err) != 0 ||
        int_field(root, path, "topk_group", 4, 1, MAX_EXPERTS, &m->topk_group, err) != 0 ||
        llama_json_number(root, path, "routed_scaling_factor", &m->routed_scaling, err) < 0 ||
        llama_json_bool(root, path, "norm_topk_prob", &m->norm_topk_prob, err) < 0 ||
        llama_json_bool(root, path, "rope_interleave", &c->mla.rope_interleave, err) < 0 ||
        llama_json_bool(root, path, "attention_bias", &bias, err) < 0)
        return -1;
    if (!isfinite(m->routed_scaling) || m->routed_scaling <= 0) {
        ag_err_set(err, "%s: field routed_scaling_factor (%g) must be a positive number", path, m->routed_scaling);
        return -1;
    }
    const char *why = bias ? "attention_bias: biases on deepseek_v3's latent projections are not modelled"
                      : c->kv_heads != c->heads
                          ? "num_key_value_heads: deepseek_v3's keys have one head a query head (num_attention_heads)"
                      : c->mla.qk_nope < 1 ? "qk_nope_head_dim: 0 (no position-free part of a head) is not modelled"
                      : c->mla.qk_rope % 2 ? "qk_rope_head_dim: an odd RoPE part is not rotated by pairs"
                      : m->experts > 0 && (m->experts % m->n_group || m->experts / m->n_group < 2 ||
                                           m->topk_group > m->n_group ||
                                           m->topk_group * (m->experts / m->n_group) < m->top_k)
                          ? "n_group: n_routed_experts in n_group groups of at least 2, topk_group of them holding "
                            "at least num_experts_per_tok, are what the router takes"
                          : NULL;
    if (why) {
        ag_err_set(err, "%s: field %s", path, why);
        return -1;
    }
    return 0;
}

// DeepseekV3Config: latent attention, 256 sigmoid-routed experts 2048 wide, 8 a token, a shared
// expert, the first 3 layers dense; head_dim is qk_rope_head_dim.
int llama_deepseek_v3_fields(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    llama_moe *m = &c->moe;
    llama_mla *a = &c->mla;
    int64_t shared;
    const json_t *q = json_object_get(root, "q_lora_rank");
    const bool q_lora_null = q && json_is_null(q); // null: q_proj, no low-rank query
    m->router = LLAMA_ROUTER_SIGMOID_GROUP, m->norm_topk_prob = true, m->score_bias = true, m->sparse_step = 1;
    if (experts_fields(m, root, path, "n_routed_experts", 256, 8, err) != 0 ||
        int_field(root, path, "moe_intermediate_size", 2048, 1, LLAMA_MAX_INTERMEDIATE, &m->intermediate, err) != 0 ||
        int_field(root, path, "n_shared_experts", 1, 0, 64, &shared, err) != 0 ||
        int_field(root, path, "first_k_dense_replace", 3, 0, c->layers, &m->dense_first, err) != 0 ||
        int_field(root, path, "q_lora_rank", q_lora_null ? 0 : 1536, 0, LLAMA_MAX_HIDDEN, &a->q_lora_rank, err) != 0 ||
        int_field(root, path, "kv_lora_rank", 512, 1, LLAMA_MAX_HIDDEN, &a->kv_lora_rank, err) != 0 ||
        int_field(root, path, "qk_nope_head_dim", 128, 0, AG_ROPE_MAX_HEAD_DIM, &a->qk_nope, err) != 0 ||
        int_field(root, path, "qk_rope_head_dim", 64, 2, AG_ROPE_MAX_HEAD_DIM, &a->qk_rope, err) != 0 ||
        int_field(root, path, "v_head_dim", 128, 1, AG_ROPE_MAX_HEAD_DIM, &a->v_head, err) != 0 ||
        int_field(root, path, "num_nextn_predict_layers", 0, 0, 16, &a->nextn_layers, err) != 0)
        return -1;
    m->shared_intermediate = shared * m->intermediate;
    c->head_dim = a->qk_rope;
    return deepseek_v3_routing(c, root, path, err);
}
