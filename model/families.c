// The families of config.json (model_type) and what each one's transformers config class
// defaults to; the fields that change the numbers, implemented or refused; rope_scaling.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model_internal.h"

typedef int (*family_fields)(llama_config *c, const json_t *root, const char *path, ag_err *err);

static int llama_fields(llama_config *c, const json_t *root, const char *path, ag_err *err);
static int mistral_fields(llama_config *c, const json_t *root, const char *path, ag_err *err);
static int qwen2_fields(llama_config *c, const json_t *root, const char *path, ag_err *err);
static int qwen3_fields(llama_config *c, const json_t *root, const char *path, ag_err *err);

// What each family is and what its transformers config class defaults to.
typedef struct {
    const char *type; // model_type
    const char *cls;  // the causal LM's class
    llama_family family;
    bool modelled;         // the forward runs; else the family is refused by name
    bool moe;              // its expert fields are its own (a dense family refuses them)
    int64_t max_positions; // the config class's default
    int64_t head_dim;      // its default, 0: hidden_size / num_attention_heads
    double rope_theta, rms_eps;
    bool tied;
    family_fields fields;
} family_info;

static const family_info families[] = {
    {"llama", "LlamaForCausalLM", LLAMA_FAMILY_LLAMA, true, false, 2048, 0, 10000.0, 1e-6, false, llama_fields},
    {"mistral", "MistralForCausalLM", LLAMA_FAMILY_MISTRAL, true, false, 131072, 0, 10000.0, 1e-6, false,
     mistral_fields},
    {"qwen2", "Qwen2ForCausalLM", LLAMA_FAMILY_QWEN2, true, false, 32768, 0, 10000.0, 1e-6, false, qwen2_fields},
    {"qwen3", "Qwen3ForCausalLM", LLAMA_FAMILY_QWEN3, true, false, 32768, 128, 10000.0, 1e-6, false, qwen3_fields},
    {"mixtral", "MixtralForCausalLM", LLAMA_FAMILY_MIXTRAL, true, true, 131072, 0, 1e6, 1e-5, false,
     llama_mixtral_fields},
    {"qwen2_moe", "Qwen2MoeForCausalLM", LLAMA_FAMILY_QWEN2_MOE, true, true, 32768, 0, 10000.0, 1e-6, false,
     llama_qwen2_moe_fields},
    {"qwen3_moe", "Qwen3MoeForCausalLM", LLAMA_FAMILY_QWEN3_MOE, true, true, 32768, 0, 10000.0, 1e-6, false,
     llama_qwen3_moe_fields},
    {"gemma2", "Gemma2ForCausalLM", LLAMA_FAMILY_GEMMA2, true, false, 8192, 256, 10000.0, 1e-6, true,
     llama_gemma_fields},
    {"gemma3_text", "Gemma3ForCausalLM", LLAMA_FAMILY_GEMMA3, true, false, 131072, 256, 1e6, 1e-6, true,
     llama_gemma_fields},
    {"phi3", "Phi3ForCausalLM", LLAMA_FAMILY_PHI3, true, false, 4096, 0, 10000.0, 1e-5, false, llama_phi3_fields},
    {"gpt_oss", "GptOssForCausalLM", LLAMA_FAMILY_GPT_OSS, true, true, 131072, 64, 150000.0, 1e-5, false,
     llama_gpt_oss_fields},
    {"deepseek_v3", "DeepseekV3ForCausalLM", LLAMA_FAMILY_DEEPSEEK_V3, true, true, 4096, 0, 10000.0, 1e-6, false,
     llama_deepseek_v3_fields},
};
#define NFAMILIES (sizeof families / sizeof families[0])

// Gemma's own fields: its soft-caps, and hidden_activation (not hidden_act) naming its MLP's.
static bool gemma(llama_family f) { return f == LLAMA_FAMILY_GEMMA2 || f == LLAMA_FAMILY_GEMMA3; }

static const family_info *info_of(llama_family f) {
    for (size_t i = 0; i < NFAMILIES; i++)
        if (families[i].family == f) return &families[i];
    return NULL;
}

const llama_moe_names *llama_family_moe_names(llama_family f) {
    // transformers' eager dispatch: experts hit kept as a tensor in every family's current code
    static const llama_moe_names mixtral = {"block_sparse_moe", true, {"w1", "w3", "w2"}};
    static const llama_moe_names qwen = {"mlp", true, {"gate_proj", "up_proj", "down_proj"}};
    return f == LLAMA_FAMILY_MIXTRAL ? &mixtral : &qwen;
}

const char *llama_family_name(llama_family f) { return info_of(f) ? info_of(f)->type : "?"; }
const char *llama_family_class(llama_family f) { return info_of(f) ? info_of(f)->cls : "?"; }
bool llama_family_modelled(llama_family f) { return info_of(f) && info_of(f)->modelled; }

// The model_types membill runs, for messages: "\"llama\", \"mistral\", ...".
static const char *supported(void) {
    static char list[256];
    if (list[0]) return list;
    size_t n = 0;
    for (size_t i = 0; i < NFAMILIES; i++)
        if (families[i].modelled)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s\"%s\"", n ? ", " : "", families[i].type);
    return list;
}

int llama_parse_family(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    const json_t *mt = json_object_get(root, "model_type");
    if (!mt) {
        ag_err_set(err, "%s: field model_type missing (supported: %s)", path, supported());
        return -1;
    }
    for (size_t i = 0; json_is_string(mt) && i < NFAMILIES; i++) {
        const family_info *f = &families[i];
        if (strcmp(json_string_value(mt), f->type) != 0) continue;
        c->family = f->family;
        c->max_positions = f->max_positions;
        c->head_dim = f->head_dim;
        c->rope_theta = f->rope_theta;
        c->rms_eps = f->rms_eps;
        c->tied = f->tied;
        return 0;
    }
    if (json_is_string(mt)) {
        char shown[64];
        ag_escape(shown, sizeof shown, json_string_value(mt));
        ag_err_set(err, "%s: field model_type is \"%s\", a family membill does not model (supported: %s)", path, shown,
                   supported());
    } else {
        ag_err_set(err, "%s: field model_type must be a string (it is %s; supported: %s)", path, llama_json_kind(mt),
                   supported());
    }
    return -1;
}

int llama_family_refuse_unmodelled(const llama_config *c, const char *path, ag_err *err) {
    if (llama_family_modelled(c->family)) return 0;
    ag_err_set(err,
               "%s: model_type \"%s\" (%s): its parameters are known but its forward is not modelled yet "
               "(supported: %s)",
               path, llama_family_name(c->family), llama_family_class(c->family), supported());
    return -1;
}

int llama_family_check_run(const llama_config *c, const ag_ctx *ctx, const char *what, ag_err *err) {
    if (c->fused_proj) { // ag_linear_parts: float weights, no autocast casts
        const ag_precision p = ag_ctx_precision(ctx);
        const bool autocast = p.autocast && AG_FW(ag_ctx_framework_row(ctx), autocast);
        if (!autocast && p.weight_bits >= 16) return 0;
        ag_err_set(err, "%s: phi3's fused qkv_proj and gate_up_proj %s are not modelled", what,
                   autocast ? "under autocast (--dtype autocast-bf16)" : "over a quantised base (--base-dtype)");
        return -1;
    }
    if (c->family == LLAMA_FAMILY_DEEPSEEK_V3) return llama_deepseek_v3_check_run(c, ctx, what, err);
    if (c->family != LLAMA_FAMILY_GPT_OSS) return 0;
    const ag_framework_row *fw = ag_ctx_framework_row(ctx);
    const char *why = AG_FW(fw, moe) != AG_MOE_GROUPED
                          ? "this framework (transformers' GptOssExperts loop and eager attention with sinks are not "
                            "modelled op by op: --framework lean)"
                      : c->moe.ep > 1 ? "--ep (stacked experts split over ranks are not modelled)"
                                      : NULL;
    if (!why) return 0;
    ag_err_set(err, "%s: model_type \"gpt_oss\" (GptOssForCausalLM) runs under --framework lean; not %s", what, why);
    return -1;
}

// ---------------------------------------------------------------------------------------------
// Sliding windows

// sliding_window: an integer, or null (none); absent: dflt. 0 is no window size (transformers
// would mask every key), refused when the window is used.
int llama_window_field(const json_t *root, const char *path, int64_t dflt, bool used, int64_t *out, ag_err *err) {
    const json_t *v = json_object_get(root, "sliding_window");
    if (!v) {
        *out = dflt;
        return 0;
    }
    *out = 0;
    if (llama_json_int(root, path, "sliding_window", false, out, err) < 0) return -1;
    if (used && json_is_integer(v) && *out == 0) {
        ag_err_set(err, "%s: field sliding_window (0) must be from 1 to %d, or null for no window", path,
                   LLAMA_MAX_POSITIONS);
        return -1;
    }
    return 0;
}

// Whether layer_types alternates with a period: every p-th layer full, the others sliding
// (gpt_oss: p 2); sets full_every.
static bool periodic_types(llama_config *c, const json_t *lt) {
    int64_t p = 0;
    for (size_t i = 0; i < json_array_size(lt) && p == 0; i++)
        if (strcmp(json_string_value(json_array_get(lt, i)), "full_attention") == 0) p = (int64_t)i + 1;
    if (p < 2) return false;
    for (size_t i = 0; i < json_array_size(lt); i++) {
        bool full = strcmp(json_string_value(json_array_get(lt, i)), "full_attention") == 0;
        if (full != (((int64_t)i + 1) % p == 0)) return false;
    }
    c->full_every = p, c->window_from = 0;
    return true;
}

// layer_types (newer transformers): each "full_attention" or "sliding_attention": the sliding
// ones after the full ones (the window's first layer says which), or every n-th layer full.
int llama_layer_types(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    const json_t *lt = json_object_get(root, "layer_types");
    if (!lt || json_is_null(lt)) return 0;
    if (!json_is_array(lt) || (int64_t)json_array_size(lt) != c->layers) {
        ag_err_set(err, "%s: field layer_types must be an array of num_hidden_layers (%lld) strings", path,
                   (long long)c->layers);
        return -1;
    }
    int64_t first = c->layers, full_after = -1;
    for (size_t i = 0; i < json_array_size(lt); i++) {
        const char *t = json_string_value(json_array_get(lt, i));
        bool sliding = t && strcmp(t, "sliding_attention") == 0, full = t && strcmp(t, "full_attention") == 0;
        if (!sliding && !full) {
            ag_err_set(err, "%s: field layer_types[%zu] must be \"full_attention\" or \"sliding_attention\"", path, i);
            return -1;
        }
        if (sliding && first == c->layers) first = (int64_t)i;
        if (full && first < c->layers && full_after < 0) full_after = (int64_t)i;
    }
    c->full_every = 0;
    if (full_after >= 0 && !periodic_types(c, lt)) {
        ag_err_set(err,
                   "%s: field layer_types: layer %lld is full after sliding layer %lld (only full layers then "
                   "sliding ones, or every n-th layer full, are supported)",
                   path, (long long)full_after, (long long)first);
        return -1;
    }
    if (first < c->layers && c->sliding_window == 0) {
        ag_err_set(err, "%s: field layer_types has sliding layers but sliding_window is null", path);
        return -1;
    }
    if (c->full_every) return 0;
    c->window_from = first;
    if (first == c->layers) c->sliding_window = 0;
    return 0;
}

// Qwen2 and Qwen3: the window from layer max_window_layers on, when use_sliding_window is true.
int llama_qwen_window(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    bool use = false;
    int64_t w, from = 28; // Qwen2Config's and Qwen3Config's defaults
    if (llama_json_bool(root, path, "use_sliding_window", &use, err) < 0 ||
        llama_window_field(root, path, 4096, use, &w, err) ||
        llama_json_int(root, path, "max_window_layers", false, &from, err) < 0)
        return -1;
    c->sliding_window = use ? w : 0;
    c->window_from = from < 0 ? 0 : from;
    return llama_layer_types(c, root, path, err);
}

// ---------------------------------------------------------------------------------------------
// The family's own fields

// attention_bias: q, k, v and o_proj biases (LlamaConfig, Qwen3Config).
int llama_attention_bias(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    bool b = false;
    if (llama_json_bool(root, path, "attention_bias", &b, err) < 0) return -1;
    c->qkv_bias = c->o_bias = b;
    return 0;
}

// What changes the numbers and is not modelled: refused, naming the field.
static int refuse_unsupported(const llama_config *c, const json_t *root, const char *path, ag_err *err) {
    const json_t *act = gemma(c->family) ? NULL : json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        ag_err_set(err, "%s: field hidden_act must be \"silu\" (the MLP is SwiGLU)", path);
        return -1;
    }
    double v = 0.0;
    if (llama_json_number(root, path, "attention_dropout", &v, err) < 0) return -1;
    if (v != 0.0) {
        ag_err_set(err, "%s: field attention_dropout (%g) must be 0 (dropout is not modelled)", path, v);
        return -1;
    }
    v = 1.0;
    if (llama_json_number(root, path, "partial_rotary_factor", &v, err) < 0) return -1;
    if (v != 1.0) {
        ag_err_set(err, "%s: field partial_rotary_factor (%g) must be 1 (RoPE rotates the whole head)", path, v);
        return -1;
    }
    const json_t *q = json_object_get(root, "quantization_config");
    if (q && !json_is_null(q)) {
        ag_err_set(err, "%s: field quantization_config: quantized checkpoints are not supported", path);
        return -1;
    }
    return 0;
}

// pad_token_id: nn.Embedding's padding_idx in every family's model, so its row gets no gradient.
static int pad_token(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    int r = llama_json_int(root, path, "pad_token_id", false, &c->pad_token_id, err);
    if (r < 0) return -1;
    c->pad_token = r == 1;
    if (c->pad_token && (c->pad_token_id < 0 || c->pad_token_id >= c->vocab)) {
        ag_err_set(err, "%s: field pad_token_id (%lld) must be a token id, 0 to vocab_size - 1 (%lld)", path,
                   (long long)c->pad_token_id, (long long)c->vocab - 1);
        return -1;
    }
    return 0;
}

// Fields another family models, which would change this one's numbers: refused by name.
static int refuse_foreign(const llama_config *c, const json_t *root, const char *path, ag_err *err) {
    static const char *const experts[] = {"num_local_experts", "num_experts", "n_routed_experts"};
    static const char *const others[] = {"q_lora_rank", "kv_lora_rank", "attn_logit_softcapping",
                                         "final_logit_softcapping"};
    const family_info *f = info_of(c->family);
    for (size_t i = 0; !f->moe && i < sizeof experts / sizeof experts[0]; i++) {
        int64_t n = 0;
        if (llama_json_int(root, path, experts[i], false, &n, err) < 0) return -1;
        if (n > 0) {
            ag_err_set(err,
                       "%s: field %s (%lld): model_type \"%s\" has no mixture of experts (%s is dense; its experts "
                       "would be left out)",
                       path, experts[i], (long long)n, f->type, f->cls);
            return -1;
        }
    }
    for (size_t i = f->family == LLAMA_FAMILY_DEEPSEEK_V3 ? 2 : 0; f->modelled && i < sizeof others / sizeof others[0];
         i++) {
        const json_t *v =
            gemma(f->family) && strstr(others[i], "softcapping") ? NULL : json_object_get(root, others[i]);
        if (v && !json_is_null(v)) {
            ag_err_set(err, "%s: field %s: model_type \"%s\" (%s) has none, and membill does not model it", path,
                       others[i], f->type, f->cls);
            return -1;
        }
    }
    return 0;
}

static int llama_fields(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    // LlamaConfig has no window: a sliding_window there changes nothing
    return llama_attention_bias(c, root, path, err) != 0 ||
                   llama_json_bool(root, path, "mlp_bias", &c->mlp_bias, err) < 0
               ? -1
               : 0;
}

static int mistral_fields(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    c->window_from = 0; // every layer, MistralConfig's default 4096
    return llama_window_field(root, path, 4096, true, &c->sliding_window, err);
}

static int qwen2_fields(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    c->qkv_bias = true; // Qwen2Attention: bias=True on q, k and v; none on o_proj
    return llama_qwen_window(c, root, path, err);
}

static int qwen3_fields(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    c->qk_norm = true;
    return llama_attention_bias(c, root, path, err) != 0 ? -1 : llama_qwen_window(c, root, path, err);
}

int llama_parse_family_fields(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    // a family not modelled yet is parsed for its parameter table alone, and refused as a whole
    if ((llama_family_modelled(c->family) && refuse_unsupported(c, root, path, err) != 0) ||
        refuse_foreign(c, root, path, err) != 0 || pad_token(c, root, path, err) != 0)
        return -1;
    bool use_cache = true;
    if (llama_json_bool(root, path, "use_cache", &use_cache, err) < 0) return -1;
    c->no_cache = !use_cache;
    return info_of(c->family)->fields(c, root, path, err);
}

// ---------------------------------------------------------------------------------------------
// rope_scaling

static const struct {
    const char *name;
    llama_rope_type type;
} rope_types[] = {
    {"default", LLAMA_ROPE_DEFAULT}, {"linear", LLAMA_ROPE_LINEAR}, {"dynamic", LLAMA_ROPE_DYNAMIC},
    {"yarn", LLAMA_ROPE_YARN},       {"llama3", LLAMA_ROPE_LLAMA3}, {"longrope", LLAMA_ROPE_LONGROPE},
};
#define NROPE (sizeof rope_types / sizeof rope_types[0])

const char *llama_rope_type_name(llama_rope_type t) {
    for (size_t i = 0; i < NROPE; i++)
        if (rope_types[i].type == t) return rope_types[i].name;
    return "?";
}

// A number that is required (1) or optional (0: stays as it is), refused outside [ROPE_MIN,
// ROPE_MAX]: every scaling's factors and betas are of order 1 to 100, and one that float32 cannot
// hold (a factor of 1e-300 is 0 in float32) would give infinite frequencies.
#define ROPE_MIN 1e-6
#define ROPE_MAX 1e6
static int rope_number(const json_t *rs, const char *path, const char *field, bool required, double *out, ag_err *err) {
    int r = llama_json_number(rs, path, field, out, err);
    if (r < 0) return -1;
    if (r == 0 && required) {
        ag_err_set(err, "%s: field %s missing", path, field);
        return -1;
    }
    if (r == 1 && !(*out >= ROPE_MIN && *out <= ROPE_MAX)) {
        ag_err_set(err, "%s: field %s (%g) must be a positive number from %g to %g", path, field, *out, ROPE_MIN,
                   ROPE_MAX);
        return -1;
    }
    return 0;
}

static int rope_type_of(const json_t *rs, const char *path, llama_rope_type *type, ag_err *err) {
    // "rope_type", or "type" as older configs write it
    const json_t *t = json_object_get(rs, "rope_type");
    if (!t) t = json_object_get(rs, "type");
    const char *name = json_is_string(t) ? json_string_value(t) : t && !json_is_null(t) ? "?" : "default";
    for (size_t i = 0; i < NROPE; i++)
        if (strcmp(name, rope_types[i].name) == 0) {
            *type = rope_types[i].type;
            return 0;
        }
    char shown[64];
    ag_escape(shown, sizeof shown, name);
    ag_err_set(err,
               "%s: field rope_type is \"%s\", which membill does not compute (supported: default, linear, dynamic, "
               "yarn, llama3, longrope)",
               path, shown);
    return -1;
}

static int rope_llama3(llama_rope_scaling *r, const json_t *rs, const char *path, ag_err *err) {
    if (rope_number(rs, path, "low_freq_factor", true, &r->low_freq_factor, err) != 0 ||
        rope_number(rs, path, "high_freq_factor", true, &r->high_freq_factor, err) != 0 ||
        llama_json_int(rs, path, "original_max_position_embeddings", true, &r->original_max_positions, err) < 0)
        return -1;
    if (r->high_freq_factor == r->low_freq_factor || r->original_max_positions < 1) {
        ag_err_set(err,
                   "%s: fields high_freq_factor and low_freq_factor must differ and "
                   "original_max_position_embeddings be positive",
                   path);
        return -1;
    }
    return 0;
}

static int rope_yarn(llama_rope_scaling *r, const json_t *rs, const char *path, ag_err *err) {
    r->beta_fast = 32.0, r->beta_slow = 1.0, r->truncate = true;
    if (rope_number(rs, path, "attention_factor", false, &r->attention_factor, err) != 0 ||
        rope_number(rs, path, "beta_fast", false, &r->beta_fast, err) != 0 ||
        rope_number(rs, path, "beta_slow", false, &r->beta_slow, err) != 0 ||
        rope_number(rs, path, "mscale", false, &r->mscale, err) != 0 ||
        rope_number(rs, path, "mscale_all_dim", false, &r->mscale_all_dim, err) != 0 ||
        llama_json_int(rs, path, "original_max_position_embeddings", false, &r->original_max_positions, err) < 0 ||
        llama_json_bool(rs, path, "truncate", &r->truncate, err) < 0)
        return -1;
    if (r->original_max_positions < 0) {
        ag_err_set(err, "%s: field original_max_position_embeddings must be positive", path);
        return -1;
    }
    return 0;
}

// One of longrope's lists: head_dim / 2 factors from ROPE_MIN to ROPE_MAX.
static int rope_factors(const json_t *rs, const char *path, const char *field, int64_t half, double *out, ag_err *err) {
    const json_t *a = json_object_get(rs, field);
    if (!json_is_array(a) || (int64_t)json_array_size(a) != half) {
        ag_err_set(err, "%s: field %s must be a list of head_dim / 2 = %lld numbers", path, field, (long long)half);
        return -1;
    }
    for (int64_t i = 0; i < half; i++) {
        const json_t *v = json_array_get(a, (size_t)i);
        out[i] = json_is_number(v) ? json_number_value(v) : 0.0;
        if (!(out[i] >= ROPE_MIN && out[i] <= ROPE_MAX)) {
            ag_err_set(err, "%s: field %s: item %lld must be a number from %g to %g", path, field, (long long)i,
                       ROPE_MIN, ROPE_MAX);
            return -1;
        }
    }
    return 0;
}

// longrope (Phi-3's 128k configs): short_factor and long_factor, the original context from
// rope_scaling, else from the config (Phi3Config's original_max_position_embeddings, 4096), an
// attention_factor when given; factor is not read (transformers takes max_position_embeddings /
// original).
static int rope_longrope(llama_config *c, const json_t *root, const json_t *rs, const char *path, ag_err *err) {
    llama_rope_scaling *r = &c->rope;
    const int64_t half = c->head_dim / 2;
    if (half < 1 || half > AG_ROPE_MAX_HEAD_DIM / 2) return 0; // head_dim itself is refused after
    if (c->family == LLAMA_FAMILY_PHI3) r->original_max_positions = 4096;
    if (rope_factors(rs, path, "short_factor", half, r->short_factor, err) != 0 ||
        rope_factors(rs, path, "long_factor", half, r->long_factor, err) != 0 ||
        rope_number(rs, path, "attention_factor", false, &r->attention_factor, err) != 0 ||
        llama_json_int(root, path, "original_max_position_embeddings", false, &r->original_max_positions, err) < 0 ||
        llama_json_int(rs, path, "original_max_position_embeddings", false, &r->original_max_positions, err) < 0)
        return -1;
    if (r->original_max_positions < 0) {
        ag_err_set(err, "%s: field original_max_position_embeddings must be positive", path);
        return -1;
    }
    return 0;
}

// transformers 5 writes rope_parameters ({"rope_type", "rope_theta", ...}) in place of
// rope_theta and rope_scaling: its theta is taken; a scaled type there is refused (its yarn
// reads factor and original_max_position_embeddings otherwise than rope_scaling's).
static int rope_parameters(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    const json_t *rp = json_object_get(root, "rope_parameters");
    if (!rp || json_is_null(rp)) return 0;
    char where[600];
    snprintf(where, sizeof where, "%s: rope_parameters", path);
    const json_t *t = json_is_object(rp) ? json_object_get(rp, "rope_type") : NULL;
    if (!json_is_string(t) || strcmp(json_string_value(t), "default") != 0) {
        ag_err_set(err,
                   "%s: field rope_parameters must be an object with rope_type \"default\" (a scaled RoPE is read "
                   "from rope_scaling)",
                   path);
        return -1;
    }
    return llama_json_number(rp, where, "rope_theta", &c->rope_theta, err) < 0 ? -1 : 0;
}

int llama_parse_rope_scaling(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    if (rope_parameters(c, root, path, err) != 0) return -1;
    const json_t *rs = json_object_get(root, "rope_scaling");
    if (!rs || json_is_null(rs)) return 0;
    char where[600];
    snprintf(where, sizeof where, "%s: rope_scaling", path);
    if (!json_is_object(rs)) {
        ag_err_set(err, "%s: field rope_scaling must be an object or null (it is %s)", path, llama_json_kind(rs));
        return -1;
    }
    if (json_object_size(rs) == 0) { // transformers reads no rope_type there and fails
        ag_err_set(err,
                   "%s: field rope_scaling is an empty object: give its rope_type (default, linear, dynamic, yarn, "
                   "llama3, longrope) or null for none",
                   path);
        return -1;
    }
    llama_rope_scaling *r = &c->rope;
    memset(r, 0, sizeof *r);
    r->factor = 1.0;
    if (rope_type_of(rs, where, &r->type, err) != 0) return -1;
    if (r->type == LLAMA_ROPE_DEFAULT) return 0;
    if (r->type == LLAMA_ROPE_LONGROPE) return rope_longrope(c, root, rs, where, err);
    if (rope_number(rs, where, "factor", true, &r->factor, err) != 0) return -1;
    if (r->type == LLAMA_ROPE_LLAMA3) return rope_llama3(r, rs, where, err);
    if (r->type == LLAMA_ROPE_YARN) return rope_yarn(r, rs, where, err);
    return 0;
}
