// model: the Llama family in membill. Config (presets, Hugging Face config.json), parameter
// shapes in Hugging Face order and names, and safetensors I/O.
//
// Every function that can fail returns 0 on success and -1 on error, with one line in *err
// naming the file, tensor or field at fault and what was expected. Nothing here prints or exits.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "autograd.h"

// ================================================================================================
// Config
// ================================================================================================

#define LLAMA_NAME_MAX 128

// The families a config.json may name (model_type). They share LlamaForCausalLM's shape and
// differ in the rows of the parameter table (layout.c), in attention and in the MLP:
//   llama: attention_bias (q, k, v and o_proj biases) and mlp_bias (gate, up, down) optional;
//   mistral: a sliding window over every layer (sliding_window, 4096 unless given, null: none);
//   qwen2: q, k and v biases always; a sliding window from layer max_window_layers on when
//     use_sliding_window is true;
//   qwen3: per-head RMSNorm of q and k (q_norm, k_norm [head_dim]) before RoPE, head_dim 128
//     unless given, attention_bias optional, a sliding window as qwen2's;
//   mixtral: mistral's attention, every MLP a mixture of experts (block_sparse_moe);
//   qwen2_moe: qwen2's attention, mixtures of experts with a gated shared expert;
//   qwen3_moe: qwen3's attention, mixtures of experts;
//   gpt_oss: biases and sinks in attention, a window on every other layer, stacked experts
//     through a clamped SwiGLU (the lean framework);
//   gemma2: (1 + w) norms before and after attention and MLP, GeLU-tanh, scaled embeddings,
//     query_pre_attn_scalar, soft-capped scores and logits, sliding layers alternating;
//   gemma3_text: gemma2's with q_norm and k_norm, a local RoPE base on its sliding layers.
//   deepseek_v3: multi-head latent attention (low-rank q and kv, RoPE on a part of each head, a
//     value head of its own), sigmoid routing with group-limited top-k, shared experts, the first
//     layers dense (the lean framework, eager attention, training and plans).
// phi3 has its parameter table here (names,
// shapes, counts) but no forward yet: llama_config_parse and the presets refuse them by name
// (llama_family_modelled).
typedef enum {
    LLAMA_FAMILY_LLAMA,
    LLAMA_FAMILY_MISTRAL,
    LLAMA_FAMILY_QWEN2,
    LLAMA_FAMILY_QWEN3,
    LLAMA_FAMILY_MIXTRAL,
    LLAMA_FAMILY_QWEN2_MOE,
    LLAMA_FAMILY_QWEN3_MOE,
    LLAMA_FAMILY_GEMMA2,
    LLAMA_FAMILY_GEMMA3,
    LLAMA_FAMILY_PHI3,
    LLAMA_FAMILY_GPT_OSS,
    LLAMA_FAMILY_DEEPSEEK_V3,
} llama_family;

// How a mixture of experts picks each token's experts from its router's logits.
typedef enum {
    LLAMA_ROUTER_SOFTMAX_TOPK, // mixtral, qwen: softmax over every expert (float32), top-k, renormalised
                               // when norm_topk_prob
    LLAMA_ROUTER_TOPK_SOFTMAX, // gpt_oss: top-k of the logits, softmax over those k
    LLAMA_ROUTER_SIGMOID_GROUP // deepseek_v3: sigmoid scores, group-limited top-k, routed_scaling_factor
} llama_router_kind;

#define LLAMA_MAX_MLP_ONLY 64 // mlp_only_layers: at most this many layer indices

// The mixture of experts of a config (experts 0: every MLP dense).
typedef struct {
    int64_t experts;             // routed experts per sparse layer (num_local_experts, num_experts, n_routed_experts)
    int64_t top_k;               // num_experts_per_tok
    int64_t intermediate;        // each routed expert's (moe_intermediate_size; mixtral: intermediate_size)
    int64_t shared_intermediate; // the shared expert's MLP, 0: none (qwen2_moe shared_expert_intermediate_size,
                                 // deepseek_v3 n_shared_experts x moe_intermediate_size)
    bool shared_gate;            // qwen2_moe: sigmoid(shared_expert_gate(x)) scales the shared expert
    bool norm_topk_prob;         // the k weights renormalised to sum to 1
    int64_t sparse_step;         // decoder_sparse_step: layer i is sparse when (i + 1) % step == 0
    int64_t dense_first;         // first_k_dense_replace: layers 0 .. dense_first - 1 dense
    int n_mlp_only;              // mlp_only_layers: these layers dense
    int32_t mlp_only[LLAMA_MAX_MLP_ONLY];
    bool aux_loss;   // output_router_logits: the load-balancing loss joins the loss
    double aux_coef; // router_aux_loss_coef
    llama_router_kind router;
    int64_t n_group, topk_group; // deepseek_v3's group-limited routing
    double routed_scaling;       // routed_scaling_factor (1 unless given)
    bool router_bias;            // gpt_oss: the router has a bias
    bool expert_bias;            // gpt_oss: the experts' projections have biases
    bool score_bias;             // deepseek_v3: e_score_correction_bias, a buffer (billed, not counted)
    double swiglu_limit;         // gpt_oss: the clamp of the SwiGLU (0: none)
    // Expert parallelism (plans: a simulated rank): the experts split over ep ranks; this table
    // holds rank 0's experts / ep of each sparse layer (the router still scores all of them), and
    // each sparse block sends its tokens to their experts' ranks and back (all-to-all). 0 or 1:
    // every expert here.
    int64_t ep;
} llama_moe;

// Multi-head latent attention (deepseek_v3; kv_lora_rank 0: not MLA).
typedef struct {
    int64_t q_lora_rank; // 0: q_proj [heads x (nope + rope), hidden]
    int64_t kv_lora_rank;
    int64_t qk_nope, qk_rope, v_head; // qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    int64_t nextn_layers;             // num_nextn_predict_layers (the MTP module; not billed)
    bool rope_interleave;             // rope_interleave: q_pe and k_pe de-interleaved before RoPE (true)
    // A generation's cache (--mla-cache): false, transformers' (each head's keys at nope + rope and
    // values at v_head_dim); true, DeepSeek's own latent one (the normed compressed kv and the
    // rotated k_pe a token, kv_lora_rank + qk_rope_head_dim), attended with kv_b_proj absorbed.
    bool latent_cache;
} llama_mla;

// rope_scaling (transformers' modeling_rope_utils): how the inverse frequencies of RoPE, and
// for yarn the scale of cos and sin, differ from the default ones.
typedef enum {
    LLAMA_ROPE_DEFAULT,
    LLAMA_ROPE_LINEAR,
    LLAMA_ROPE_DYNAMIC,
    LLAMA_ROPE_YARN,
    LLAMA_ROPE_LLAMA3,
    LLAMA_ROPE_LONGROPE
} llama_rope_type;

typedef struct {
    llama_rope_type type;
    double factor;                            // linear, dynamic, yarn, llama3
    double low_freq_factor, high_freq_factor; // llama3
    int64_t original_max_positions;           // llama3 (required), yarn (0: max_position_embeddings)
    double attention_factor;                  // yarn: 0 when not given (from factor and mscale)
    double beta_fast, beta_slow;              // yarn: 32 and 1 unless given
    double mscale, mscale_all_dim;            // yarn: 0 when not given
    bool truncate;                            // yarn: floor / ceil of the correction range (true)
    // longrope: a factor a frequency [head_dim / 2], short_factor while a sequence stays within
    // original_max_positions (rope_scaling's, else the config's), long_factor past it
    double short_factor[AG_ROPE_MAX_HEAD_DIM / 2], long_factor[AG_ROPE_MAX_HEAD_DIM / 2];
    // What the ops use, filled by llama_rope_prepare (llama_model_new does it for the model's
    // own copy of the config): the inverse frequencies [head_dim / 2] and the factor on cos and
    // sin (yarn's attention factor, else 1).
    bool prepared;
    float inv_freq[AG_ROPE_MAX_HEAD_DIM / 2];
    float long_inv_freq[AG_ROPE_MAX_HEAD_DIM / 2]; // longrope's past original_max_positions
    float scale;
} llama_rope_scaling;

// The shape of a LlamaForCausalLM (Llama, Mistral, SmolLM2, Qwen2, Qwen3). Every size is
// int64_t and, once validated, within the bounds below (each at most 2^24), so that the
// product of two of them never overflows.
typedef struct {
    char name[LLAMA_NAME_MAX]; // preset name, or the config's "_name_or_path" (else its path)
    llama_family family;       // model_type
    int64_t hidden;            // hidden_size
    int64_t intermediate;      // intermediate_size (MLP)
    int64_t layers;            // num_hidden_layers
    int64_t heads;             // num_attention_heads (query heads)
    int64_t kv_heads;          // num_key_value_heads (grouped-query attention)
    int64_t head_dim;          // head_dim, else hidden / heads (qwen3: 128)
    int64_t vocab;             // vocab_size
    int64_t max_positions;     // max_position_embeddings
    double rope_theta;         // rope_theta
    double rms_eps;            // rms_norm_eps
    bool tied;                 // tie_word_embeddings: lm_head shares model.embed_tokens.weight
    bool qkv_bias, o_bias;     // q, k and v_proj carry a bias; o_proj does
    bool mlp_bias;             // gate, up and down_proj carry a bias
    bool qk_norm;              // qwen3's q_norm and k_norm
    int64_t sliding_window;    // 0: none; else a query sees the last sliding_window keys, itself included
    int64_t window_from;       // the first layer with the window (qwen2's max_window_layers)
    int64_t full_every;        // layer_types alternating (gpt_oss: 2): layer i full when (i + 1) % full_every
                               // == 0, sliding otherwise; 0: window_from says
    bool no_cache;             // use_cache false: the forward returns no DynamicCache
    bool pad_token;            // pad_token_id given: the embedding's padding_idx (no gradient to its row)
    int64_t pad_token_id;
    llama_rope_scaling rope; // rope_scaling
    llama_moe moe;           // mixture of experts (moe.experts 0: dense)
    llama_mla mla;           // deepseek_v3's attention
    // Shapes of the families not modelled yet (their parameter tables): gemma2 and gemma3_text's
    // norms before and after the MLP, phi3's fused qkv_proj and gate_up_proj, gpt_oss's sinks.
    bool ff_norms, fused_proj, sinks;
    // Gemma 2 (ff_norms: the attention's output and the MLP's normed before their residual adds,
    // the MLP's input by pre_feedforward_layernorm; 0 and false in the other families):
    float norm_offset;     // every RMSNorm's weight applied as norm_offset + w (1)
    bool gelu;             // the MLP's activation GeLU-tanh (hidden_activation gelu_pytorch_tanh), else SiLU
    bool embed_scale;      // the embeddings times sqrt(hidden_size)
    double query_scalar;   // query_pre_attn_scalar: attention scaled by its -1/2 power (0: head_dim's)
    double attn_softcap;   // attn_logit_softcapping: scores capped as c tanh(S / c) (0: none)
    double final_softcap;  // final_logit_softcapping: the logits capped alike (0: none)
    int64_t window_period; // layer i under the window unless (i + 1) % window_period == 0 (0: from window_from on)
    double rope_local_theta; // Gemma 3: rope_local_base_freq, the sliding layers' RoPE base (default, unscaled);
                             // 0: every layer's RoPE is the config's
} llama_config;

// The bounds of llama_config_validate, which presets and config.json files both pass through.
// Each is far past any published model and small enough that every product of two sizes stays
// well inside 64 bits and that autograd's int-sized arguments hold any size.
#define LLAMA_MAX_PARAMS 10000000000000ULL // 10^13 parameters; past it the config is absurd
#define LLAMA_MAX_HIDDEN (1 << 20)         // hidden_size
#define LLAMA_MAX_INTERMEDIATE (1 << 22)   // intermediate_size
#define LLAMA_MAX_LAYERS 100000            // num_hidden_layers
#define LLAMA_MAX_HEADS (1 << 16)          // num_attention_heads (num_key_value_heads divides it)
#define LLAMA_MAX_VOCAB (1 << 24)          // vocab_size
#define LLAMA_MAX_POSITIONS (1 << 24)      // max_position_embeddings
// head_dim: even (RoPE rotates pairs) and at most AG_ROPE_MAX_HEAD_DIM (autograd.h).
// rope_theta in [1, 10^12]: RoPE runs in float32, where a smaller base underflows to 0 or makes
// every frequency collapse to 1, and a larger one leaves every frequency but the first at 0.
#define LLAMA_MIN_ROPE_THETA 1.0
#define LLAMA_MAX_ROPE_THETA 1e12
// rms_norm_eps in [10^-30, 1): RMSNorm adds it in float32, where a smaller one is 0 or subnormal.
#define LLAMA_MIN_RMS_EPS 1e-30

// The model_type of a family ("llama"...) and the name of a rope_scaling type ("default"...).
const char *llama_family_name(llama_family f);
// The transformers class of a family's causal LM ("MixtralForCausalLM").
const char *llama_family_class(llama_family f);
// Whether membill runs the family's forward (else its configs are refused by name).
bool llama_family_modelled(llama_family f);
// Layer i's MLP is a mixture of experts (the config's sparse layers).
bool llama_layer_moe(const llama_config *c, int64_t i);
// Parameters a token's forward reads: every parameter but the routed experts a token does not
// visit (top_k of experts per sparse layer); the total for a dense config.
uint64_t llama_active_param_count(const llama_config *c);
const char *llama_rope_type_name(llama_rope_type t);

// Built-in presets: smollm2-135m (the default), smollm2-360m, smollm2-1.7b, llama-65b, llama-2-7b,
// llama-2-13b, llama-2-70b, llama-3-8b, llama-3-70b, llama-3.1-405b, mistral-7b. Names are
// matched without regard to case.
int llama_config_preset(llama_config *out, const char *name, ag_err *err);
size_t llama_preset_count(void);
const char *llama_preset_name(size_t i); // NULL past the end

// A Hugging Face config.json of one of the families above: model_type "llama", "mistral",
// "qwen2" or "qwen3" (anything else is refused, naming the model_type found and the supported
// ones). Required: model_type, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, vocab_size. Optional, with the defaults of transformers' config classes:
// num_key_value_heads (= num_attention_heads), head_dim (= hidden_size / num_attention_heads;
// qwen3 128), max_position_embeddings (2048 llama, 131072 mistral, 32768 qwen2 and qwen3),
// rope_theta (10000; or rope_parameters' when its type is default), rms_norm_eps (1e-6),
// tie_word_embeddings (false), the biases, windows and rope_scaling above, use_cache (true),
// pad_token_id (the embedding's padding_idx). Fields that would change the numbers but membill
// does not compute are refused, naming the field: a hidden_act other than silu, attention_dropout other than 0,
// partial_rotary_factor other than 1, quantization_config, a rope_scaling type other than
// default, linear, dynamic, yarn and llama3, a layer_types that is not full layers then sliding
// ones. Fields that change nothing membill computes (token ids, torch_dtype, initializer_range,
// architectures...) are ignored.
// A size must be a JSON integer (not 64.0, not "64"), rope_theta and rms_norm_eps JSON
// numbers; a field of the wrong type, or one that JSON cannot hold (1e400, NaN), is refused
// naming the field. The result is validated (llama_config_validate); every message starts with
// the path and names the config.json field at fault. The file is opened with
// llama_open_regular (a FIFO or a device is refused at once) and may hold at most 16 MiB.
// The name is "_name_or_path" (else the path), cut to fit at a character boundary, with control
// characters written as \xNN and bytes that are not UTF-8 as '?'.
int llama_config_load(llama_config *out, const char *path, ag_err *err);

// The same from text already in memory (len bytes, no terminator needed); origin names it in
// messages and is the fallback name (NULL: "config.json").
int llama_config_parse(llama_config *out, const char *text, size_t len, const char *origin, ag_err *err);

// Sanity of a config: every size positive and within the bounds above, num_key_value_heads
// divides num_attention_heads, head_dim even and at most AG_ROPE_MAX_HEAD_DIM, rope_theta and
// rms_norm_eps within their bounds (NaN and infinities refused), and at most LLAMA_MAX_PARAMS
// parameters. Messages name the config.json field and its value, then what was expected.
int llama_config_validate(const llama_config *c, ag_err *err);

// ================================================================================================
// Parameters: Hugging Face names and shapes ([out, in] for linear layers), from one table
// (layout.c), in this order:
//   model.embed_tokens.weight                               [vocab, hidden]
//   per layer i, the rows the config has (a family's own rows in layout.c):
//     model.layers.{i}.input_layernorm.weight               [hidden]
//     model.layers.{i}.self_attn.q_proj.weight              [heads * head_dim, hidden]
//     model.layers.{i}.self_attn.q_proj.bias                [heads * head_dim]     (qkv_bias)
//     model.layers.{i}.self_attn.k_proj.weight              [kv_heads * head_dim, hidden]
//     model.layers.{i}.self_attn.k_proj.bias                [kv_heads * head_dim]  (qkv_bias)
//     model.layers.{i}.self_attn.v_proj.weight              [kv_heads * head_dim, hidden]
//     model.layers.{i}.self_attn.v_proj.bias                [kv_heads * head_dim]  (qkv_bias)
//     model.layers.{i}.self_attn.o_proj.weight              [hidden, heads * head_dim]
//     model.layers.{i}.self_attn.o_proj.bias                [hidden]               (o_bias)
//     model.layers.{i}.self_attn.q_norm.weight              [head_dim]             (qk_norm)
//     model.layers.{i}.self_attn.k_norm.weight              [head_dim]             (qk_norm)
//     model.layers.{i}.post_attention_layernorm.weight      [hidden]
//     a dense layer:
//     model.layers.{i}.mlp.gate_proj.weight                 [intermediate, hidden]
//     model.layers.{i}.mlp.gate_proj.bias                   [intermediate]         (mlp_bias)
//     model.layers.{i}.mlp.up_proj.weight                   [intermediate, hidden]
//     model.layers.{i}.mlp.up_proj.bias                     [intermediate]         (mlp_bias)
//     model.layers.{i}.mlp.down_proj.weight                 [hidden, intermediate]
//     model.layers.{i}.mlp.down_proj.bias                   [hidden]               (mlp_bias)
//     a sparse layer of mixtral (e over the experts):
//     model.layers.{i}.block_sparse_moe.gate.weight         [experts, hidden]
//     model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight  [moe intermediate, hidden]  (gate)
//     model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight  [hidden, moe intermediate]  (down)
//     model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight  [moe intermediate, hidden]  (up)
//     a sparse layer of qwen2_moe and qwen3_moe:
//     model.layers.{i}.mlp.gate.weight                      [experts, hidden]
//     model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight   as a dense MLP's, moe intermediate
//     model.layers.{i}.mlp.shared_expert.{gate,up,down}_proj.weight as a dense MLP's, shared intermediate
//     model.layers.{i}.mlp.shared_expert_gate.weight        [1, hidden]            (qwen2_moe)
//   model.norm.weight                                       [hidden]
//   lm_head.weight                                          [vocab, hidden]  (untied only)
// ================================================================================================

#define LLAMA_PARAM_NAME_MAX 96 // enough for any name above
#define LLAMA_PARAM_MAX_DIMS 3  // gpt_oss's stacked experts [experts, in, out]

// RoPE under rope_scaling, as transformers' modeling_rope_utils computes it (in double, then
// float32): default 1 / theta^(2i/d); linear divides by factor; dynamic is the default at every
// length up to max_position_embeddings (transformers recomputes it only past them, which a run
// never reaches); llama3 divides the low frequencies by factor and interpolates the middle ones;
// yarn blends interpolated and extrapolated frequencies over the correction range of beta_fast
// and beta_slow, with factor = max_position_embeddings / original_max_position_embeddings when
// the latter is given, and scales cos and sin by its attention factor.
void llama_rope_prepare(llama_config *c);
// The frequencies the ops take: the config's table once prepared (it must outlive the ops), else
// the default from rope_theta.
ag_rope_freqs llama_rope_freqs(const llama_config *c);
// The same for a forward over positions 0 .. positions - 1: longrope's long factors past
// original_max_position_embeddings (transformers' longrope_frequency_update).
ag_rope_freqs llama_rope_freqs_at(const llama_config *c, int64_t positions);

// The tensors of block i under this config (9 for Llama, 12 for Qwen2, 11 for Qwen3, 4 + 1 + 3 x
// experts for Mixtral's), and the index of its first one in the parameter list.
size_t llama_layer_param_count(const llama_config *c, int64_t i);
size_t llama_layer_first_param(const llama_config *c, int64_t i);

// What the embeddings are multiplied by: sqrt(hidden_size) under Gemma 2 (a float32 run's
// normalizer), else 1.
float llama_embedding_scale(const llama_config *c);
// The scale on attention's Q Kᵀ: query_pre_attn_scalar^-1/2, or 0 for 1/sqrt(head_dim).
float llama_attention_scale(const llama_config *c);
// The KV cache's elements a token of one row holds over every layer: 2 x layers x kv_heads x
// head_dim, or deepseek_v3's transformers cache, layers x heads x (nope + rope + v_head); and the
// same as a formula in words ("2 x 30 layers x 3 kv heads x 64") into buf.
uint64_t llama_kv_cache_elems_per_token(const llama_config *c); // latent_cache: layers x (kv_lora + rope)
const char *llama_kv_cache_formula(const llama_config *c, char *buf, size_t cap);
// deepseek_v3's attention scale: (qk_nope + qk_rope)^-1/2, times yarn's mscale squared when
// rope_scaling gives mscale_all_dim (0.1 mscale_all_dim ln(factor) + 1, factor above 1).
float llama_mla_scale(const llama_config *c);

// Layer i's RoPE frequencies in a forward over positions 0 .. positions - 1: Gemma 3's sliding
// layers' rope_local_base_freq, else the config's (llama_rope_freqs_at).
ag_rope_freqs llama_layer_rope_freqs(const llama_config *c, int64_t i, int64_t positions);

// The sliding window of layer i: 0 (none) or sliding_window.
int64_t llama_layer_window(const llama_config *c, int64_t i);

size_t llama_param_count_tensors(const llama_config *c);

// What the table says of parameter i.
typedef struct {
    char name[LLAMA_PARAM_NAME_MAX];
    int ndim;
    int64_t shape[LLAMA_PARAM_MAX_DIMS]; // 1 past ndim
    int64_t layer;                       // its block, -1 outside the blocks
    int64_t expert;                      // the routed expert it belongs to, -1 otherwise
    bool matrix;                         // a block's projection (what a quantised base stores quantised)
    bool buffer; // a buffer, not a parameter (deepseek_v3's e_score_correction_bias): loaded and
                 // billed as weight, neither counted nor trained
} llama_param_info;
// -1 when i is out of range or a size overflows.
int llama_param_info_of(const llama_config *c, size_t i, llama_param_info *out);

// Name and shape of parameter i (llama_param_info_of's). shape[k] is 1 past ndim. Returns -1 when
// i is out of range or the name does not fit in name_len bytes.
int llama_param_spec(const llama_config *c, size_t i, char *name, size_t name_len, int *ndim,
                     int64_t shape[LLAMA_PARAM_MAX_DIMS]);

// Sum of the parameter shapes (buffers left out: transformers' num_parameters()); 0 if it would
// overflow (a config that passes llama_config_validate never does).
uint64_t llama_param_count(const llama_config *c);
// The elements of the buffers (deepseek_v3's e_score_correction_bias), billed as weight.
uint64_t llama_buffer_count(const llama_config *c);

// ================================================================================================
// Input files
// ================================================================================================

// Opens path for reading when it is a regular file (symbolic links followed). A FIFO, a
// character or block device, a socket or a folder is refused at once, without blocking (a FIFO
// is opened O_NONBLOCK) and without reading from it. Returns the descriptor (O_CLOEXEC, blocking
// again; the caller closes it) and, when size is not NULL, the file's size; -1 with one line in
// err: "PATH: cannot open: REASON" or "PATH: not a regular file (it is a FIFO)".
int llama_open_regular(const char *path, uint64_t *size, ag_err *err);

// The whole of a regular file of at most max bytes, opened with llama_open_regular, into *out
// (malloc'd, NUL-terminated; *len bytes without the terminator). what names the kind of file in
// the message of one too large: "PATH: N bytes is too large for a tokenizer.json (at most M)".
// Every file membill reads whole comes through here (config.json, an index, adapter_config.json,
// generation_config.json, tokenizer.json, a prompt file), so that none of them can hang on a FIFO.
int llama_read_file(const char *path, const char *what, uint64_t max, char **out, size_t *len, ag_err *err);

// ================================================================================================
// End of text (generation.c): the eos_token_id of a config.json or generation_config.json
// ================================================================================================

#define LLAMA_MAX_EOS 16
typedef struct {
    int32_t ids[LLAMA_MAX_EOS];
    int n;
} llama_eos;

// Adds the "eos_token_id" of a JSON object (len bytes of text; origin names it in messages,
// NULL: "generation_config.json") to *eos: an integer or a list of integers, each a token id from
// 0 to vocab - 1; absent, null or [] add nothing; a repeat is dropped. Refused, naming origin and
// the field at fault (eos_token_id[1]) with its value or kind: text that is not a JSON object, a
// string, a real number (2.0 too), a negative id, an id past the vocabulary, a nested list, more
// than LLAMA_MAX_EOS ids in all. *eos may hold the ids added before the one refused.
int llama_eos_parse(const char *text, size_t len, const char *origin, int64_t vocab, llama_eos *eos, ag_err *err);
// The same from a file, read with llama_read_file (at most 16 MiB).
int llama_eos_load(const char *path, int64_t vocab, llama_eos *eos, ag_err *err);

// ================================================================================================
// Safetensors reading
//
// The file is opened with llama_open_regular and its header read and checked before anything is
// returned: header length within the file, a JSON object (jansson), known dtypes, shapes of at
// most LLAMA_ST_MAX_DIMS non-negative integers, offsets inside the data section and not
// overlapping, and byte size equal to the product of the shape times the dtype size (every
// product checked for overflow). "__metadata__" is ignored. Tensors are listed in the order of
// their data in the file. No descriptor is held once it is open (a checkpoint of thousands of shards
// opens under the usual limit on open files): tensor data is read only when asked for, the file
// opened again (and checked to be the same file) and read with pread straight into the destination.
// ================================================================================================

#define LLAMA_ST_MAX_DIMS 8

typedef enum {
    LLAMA_ST_F32,
    LLAMA_ST_F16,
    LLAMA_ST_BF16,
    LLAMA_ST_I64,
    LLAMA_ST_I32,
} llama_st_dtype;

typedef struct {
    const char *name; // owned by the file
    llama_st_dtype dtype;
    int ndim;
    int64_t shape[LLAMA_ST_MAX_DIMS];
    uint64_t numel;  // product of the shape (1 for a scalar)
    uint64_t offset; // from the start of the data section
    uint64_t nbytes;
} llama_st_tensor;

typedef struct llama_st_file llama_st_file;

int llama_st_open(llama_st_file **out, const char *path, ag_err *err);
void llama_st_close(llama_st_file *f); // NULL is ignored
const char *llama_st_path(const llama_st_file *f);
size_t llama_st_count(const llama_st_file *f);
const llama_st_tensor *llama_st_get(const llama_st_file *f, size_t i);          // NULL past the end
const llama_st_tensor *llama_st_find(const llama_st_file *f, const char *name); // NULL if absent
const char *llama_st_dtype_name(llama_st_dtype d);                              // "F32", "BF16"...

// Copy a floating-point tensor (F32, BF16 or F16) into dst as float32; every conversion is
// exact. count must equal the tensor's numel. The data is read straight into dst (16-bit values
// widened in place), so nothing of the file stays in the resident set beyond dst itself, and no
// other buffer is allocated. A file that has shrunk since it was opened makes the read fail,
// naming the file and the tensor (never a SIGBUS). Safe to call from several threads at once.
int llama_st_read_f32(const llama_st_file *f, const llama_st_tensor *t, float *dst, size_t count, ag_err *err);
// The same for an integer tensor (I64 or I32, e.g. token ids), as int64.
int llama_st_read_i64(const llama_st_file *f, const llama_st_tensor *t, int64_t *dst, size_t count, ag_err *err);

// Every parameter of c is present, floating point, and shaped as the config says. A tied
// config accepts lm_head.weight when it has the embedding's shape. Any other tensor is an
// error naming it unless allow_extra. The message names the first tensor at fault and how
// many more there are.
int llama_st_check_params(const llama_st_file *f, const llama_config *c, bool allow_extra, ag_err *err);

// --weights PATH: a .safetensors file, a model.safetensors.index.json (the shards it names), or
// a folder holding config.json and model.safetensors, else model.safetensors.index.json (the
// order transformers looks for them in). For a folder both paths are filled and both files must
// be regular files that open (a FIFO, a device or a folder in their place is refused, naming
// it); for a file st_path is the file and config_path is "" (the config then comes from --model
// or --config). Any other kind of path (a FIFO, a device) is refused at once. Both buffers hold
// len bytes.
int llama_weights_resolve(const char *path, char *config_path, char *st_path, size_t len, ag_err *err);

// ================================================================================================
// Checkpoints: one safetensors file, or a sharded one (checkpoint.c)
//
// A path ending in ".json" is a model.safetensors.index.json: {"weight_map": {tensor: file}},
// each file a name in the index's folder (a name with a '/', ".." or "." is refused). Every shard
// is opened with llama_st_open, so checked as a single file is; then the index and the shards
// must agree: each tensor in the shard the weight map names (not in another as well), and each
// tensor of a shard in the weight map. Any other path is one safetensors file. Messages name the
// index and the shard at fault.
// ================================================================================================

typedef struct llama_ckpt llama_ckpt;

bool llama_ckpt_is_index(const char *path); // ends in ".json"
int llama_ckpt_open(llama_ckpt **out, const char *path, ag_err *err);
void llama_ckpt_close(llama_ckpt *c); // NULL is ignored
const char *llama_ckpt_path(const llama_ckpt *c);
size_t llama_ckpt_files(const llama_ckpt *c);                        // 1 for a single file
const llama_st_file *llama_ckpt_file(const llama_ckpt *c, size_t i); // NULL past the end
// The tensor of that name in whichever file holds it (*in, when not NULL, gets the file).
const llama_st_tensor *llama_ckpt_find(const llama_ckpt *c, const char *name, const llama_st_file **in);
// llama_st_check_params over every tensor of the checkpoint as one set.
int llama_ckpt_check_params(const llama_ckpt *c, const llama_config *cfg, bool allow_extra, ag_err *err);

// A safetensors file known by its first bytes alone (the 8-byte length and the JSON header, as a
// range request returns them; len at least 8 + that length) and its whole size: checked as
// llama_st_open checks a file of file_size bytes (a header longer than the file is refused). Its
// tensors' data cannot be read (llama_st_read_* fail, naming it). name names it in messages.
int llama_st_open_header(llama_st_file **out, const char *name, const void *bytes, size_t len, uint64_t file_size,
                         ag_err *err);

// How llama_ckpt_open_with opens each safetensors file of a checkpoint, by its name in the
// checkpoint's folder (llama_ckpt_open: llama_st_open on the folder's file).
typedef int (*llama_st_opener)(void *arg, const char *name, llama_st_file **out, ag_err *err);
// llama_ckpt_open with the files opened by open (the index itself is read from path; a single
// file is opened by its name alone), checked the same way.
int llama_ckpt_open_with(llama_ckpt **out, const char *path, llama_st_opener open, void *arg, ag_err *err);

// What a checkpoint holds, by dtype: elements and bytes of every tensor, and its parameters (the
// elements, less a tied config's lm_head.weight, which repeats the embedding).
#define LLAMA_ST_NDTYPES 5
typedef struct {
    uint64_t params, bytes;
    uint64_t elements[LLAMA_ST_NDTYPES]; // by llama_st_dtype
} llama_ckpt_stats;
void llama_ckpt_stats_of(const llama_ckpt *c, bool tied, llama_ckpt_stats *s);
// The dtype that holds most of the elements (F32, BF16 or F16 among them).
llama_st_dtype llama_ckpt_stats_dtype(const llama_ckpt_stats *s);

// ================================================================================================
// Models by Hub id (hub.c, hub_fetch.c; HTTP in hub_http.c): "org/name[@revision]" from the
// Hugging Face cache, in the layout huggingface_hub writes and transformers reads,
//   CACHE/models--org--name/refs/REVISION       a branch's or tag's commit hash (40 hex digits)
//   CACHE/models--org--name/snapshots/COMMIT/F  a relative symlink to ../../blobs/ETAG
//   CACHE/models--org--name/blobs/ETAG          the file, named by the Hub's ETag
//   CACHE/models--org--name/.no_exist/COMMIT/F  empty: the Hub has no F at COMMIT
// the cache first (a revision the cache knows stays at its cached commit); else, unless offline,
// from the Hub's HTTP API, GET ENDPOINT/org/name/resolve/REVISION/F, written into that layout: the
// body into a temporary file under blobs/ renamed to blobs/ETAG (X-Linked-Etag, else ETag), then
// the snapshot's symlink of the commit the Hub names (X-Repo-Commit), then the ref. A failed or
// killed fetch leaves no file under its own name; nothing already in the cache is replaced.
// Safetensors headers fetched alone (two range requests: the 8-byte length, then the header) are
// kept beside, in CACHE/models--org--name/.membill_headers/COMMIT/F, which no other tool reads.
// Messages name the repo, the file and what to do; the token is never written anywhere.
// ================================================================================================

#define LLAMA_HUB_PATH_MAX 4096
#define LLAMA_HUB_ID_MAX 200
#define LLAMA_HUB_REV_MAX 256

// A download's progress: bytes of file done so far out of total (0: unknown).
typedef void (*llama_hub_progress_fn)(void *arg, const char *file, uint64_t done, uint64_t total);

typedef struct {
    char cache[LLAMA_HUB_PATH_MAX];      // HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else HF_HOME/hub
    char home[LLAMA_HUB_PATH_MAX];       // HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface
    char endpoint[1024];                 // HF_ENDPOINT (https://huggingface.co), no trailing '/'
    char token[1024];                    // HF_TOKEN, else HUGGING_FACE_HUB_TOKEN, else the token file; "" none
    char token_file[LLAMA_HUB_PATH_MAX]; // HF_TOKEN_PATH, else HF_HOME/token (read or not)
    const char *token_from;              // "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", token_file, or NULL
    bool offline;                        // HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE: the cache alone
    long timeout_s;                      // HF_HUB_DOWNLOAD_TIMEOUT (10): connecting, and a stall
    llama_hub_progress_fn progress;      // downloads of weights (NULL: none)
    void *progress_arg;
} llama_hub;

// The settings from the environment, as huggingface_hub reads them.
int llama_hub_init(llama_hub *h, ag_err *err);
// Whether this build can reach the Hub (libcurl); without it only the cache is read.
bool llama_hub_has_http(void);

typedef struct {
    char id[LLAMA_HUB_ID_MAX];         // "org/name"
    char revision[LLAMA_HUB_REV_MAX];  // after '@', else "main"
    char dir[LLAMA_HUB_PATH_MAX];      // CACHE/models--org--name
    char commit[48];                   // "" until the cache or the Hub names it
    char snapshot[LLAMA_HUB_PATH_MAX]; // dir/snapshots/COMMIT once known
    bool fetched;                      // something came from the Hub
} llama_hub_repo;

// A model name with a '/' is a Hub id (presets have none).
bool llama_hub_is_id(const char *name);
// "org/name[@revision]", checked as huggingface_hub checks a repo id (letters, digits, '-', '_',
// '.'; no "--" or ".."; at most 96 characters a part) and a revision (no "..", no control
// characters); the commit from the cache when it knows the revision.
int llama_hub_repo_init(const llama_hub *h, const char *text, llama_hub_repo *r, ag_err *err);

enum { LLAMA_HUB_FOUND = 0, LLAMA_HUB_ABSENT = 1, LLAMA_HUB_NOT_CACHED = 2 };
// The path of the repo's file in the snapshot: from the cache, else (with fetch, unless offline)
// from the Hub into the cache. LLAMA_HUB_FOUND; LLAMA_HUB_ABSENT when the repo has no such file
// (the Hub's 404, or the cache's .no_exist); LLAMA_HUB_NOT_CACHED, with the reason in err, when the
// cache lacks it and the Hub is not to be asked; -1 on a fault (a broken cache entry, a refusal
// of the Hub, no network), with err.
int llama_hub_file(const llama_hub *h, llama_hub_repo *r, const char *file, bool fetch, char *path, size_t len,
                   ag_err *err);

// The repo's safetensors checkpoint: model.safetensors, else model.safetensors.index.json and
// its shards, each opened from the cache when it is there, else from its header alone.
typedef struct {
    char name[256];
    uint64_t size;
    char etag[160];
    bool cached; // in the snapshot: the data can be read
} llama_hub_shard;
typedef struct {
    char path[LLAMA_HUB_PATH_MAX]; // the snapshot's model.safetensors or model.safetensors.index.json
    llama_ckpt *ckpt;
    llama_hub_shard *files; // in the checkpoint's order
    size_t n;
    uint64_t bytes, missing_bytes; // every file's, and those not in the cache
} llama_hub_weights;
// LLAMA_HUB_FOUND, LLAMA_HUB_ABSENT (no safetensors checkpoint: w->path names what was looked
// for), LLAMA_HUB_NOT_CACHED or -1 as llama_hub_file (headers fetched unless offline).
int llama_hub_weights_open(const llama_hub *h, llama_hub_repo *r, llama_hub_weights *w, ag_err *err);
void llama_hub_weights_close(llama_hub_weights *w);
// The files of w not in the cache, downloaded into it: each into blobs/ETAG.incomplete first
// (resumed from where a previous attempt stopped, with a range request), renamed when whole.
// Progress through h->progress. Afterwards every file is cached (the checkpoint is not reopened).
int llama_hub_download(const llama_hub *h, llama_hub_repo *r, llama_hub_weights *w, ag_err *err);

// ================================================================================================
// Safetensors writing
// ================================================================================================

#define LLAMA_ST_WRITE_MAX_DIMS 4

// Write n float32 tensors (names unique and non-empty, 0 <= ndims[i] <= 4, shapes[i][0..ndim)
// non-negative, data[i] holding the product of the shape) as an F32 safetensors file to f from
// its current position, then flush (f stays open). A bad tensor list is refused before anything
// is written; a write error is reported from errno. Messages name the tensor at fault, not the
// file (the caller knows it, and decides where the file lands).
int llama_st_write_f32_file(FILE *f, size_t n, const char *const *names, const int *ndims,
                            const int64_t (*shapes)[LLAMA_ST_WRITE_MAX_DIMS], const float *const *data, ag_err *err);

// ================================================================================================
// The model: parameters and the training forward
// ================================================================================================

#include "autograd.h"

// The linear layers of a block, by PEFT's module names (phi3 has qkv_proj and gate_up_proj in
// place of q, k, v_proj and gate, up_proj).
typedef enum {
    LLAMA_PROJ_Q,
    LLAMA_PROJ_K,
    LLAMA_PROJ_V,
    LLAMA_PROJ_O,
    LLAMA_PROJ_GATE,
    LLAMA_PROJ_UP,
    LLAMA_PROJ_DOWN,
    LLAMA_PROJ_QKV,
    LLAMA_PROJ_GATE_UP,
    LLAMA_NPROJ
} llama_proj;

const char *llama_proj_name(llama_proj p);   // "q_proj", ..., "down_proj", "qkv_proj", "gate_up_proj"
const char *llama_proj_module(llama_proj p); // "self_attn.q_proj", ..., "mlp.gate_up_proj"

// LoRA as PEFT's LoraConfig sets it (init_lora_weights=True, bias "none", no DoRA or rsLoRA):
// each target's frozen weight W [out, in] gains A [rank, in] (Kaiming-uniform, a = sqrt(5)) and
// B [out, rank] (zeros), and computes y = W x + B (A dropout(x)) x alpha / rank.
typedef struct {
    int64_t rank;     // r; 0: no adapters
    double alpha;     // lora_alpha (PEFT's default 8)
    unsigned targets; // bit 1 << llama_proj per target module
    double dropout;   // lora_dropout, on the adapter's input only
    // The adapters' element size: 0, the context's (the base's); 32, float32 beside a 16-bit base, as
    // PEFT's get_peft_model leaves them (autocast_adapter_dtype=True, its default). The input is
    // then cast to float32 for them, and their output back to the base's dtype.
    int adapter_bits;
} llama_lora_config;

// all-linear: a Llama block's seven; on phi3 its four (llama_model_add_lora resolves it).
#define LLAMA_LORA_ALL ((1u << LLAMA_PROJ_QKV) - 1)
#define LLAMA_LORA_FUSED                                                                                               \
    ((1u << LLAMA_PROJ_QKV) | (1u << LLAMA_PROJ_O) | (1u << LLAMA_PROJ_GATE_UP) | (1u << LLAMA_PROJ_DOWN))
#define LLAMA_LORA_ANY ((1u << LLAMA_NPROJ) - 1) // every module name membill knows
// The targets under this config: all-linear (LLAMA_LORA_ALL) is phi3's four on phi3.
unsigned llama_lora_targets_of(const llama_config *c, unsigned targets);
#define LLAMA_LORA_DEFAULT_TARGETS ((1u << LLAMA_PROJ_Q) | (1u << LLAMA_PROJ_V)) // PEFT's for Llama

// "q_proj,v_proj" (PEFT's names, any order, each once) or "all-linear" into a bit set; the
// message names the item at fault.
int llama_lora_parse_targets(const char *list, unsigned *out, ag_err *err);
// The targets as "q_proj,v_proj" into buf.
const char *llama_lora_targets_text(unsigned targets, char *buf, size_t len);
// rank >= 1, alpha from LLAMA_LORA_MIN_ALPHA to LLAMA_LORA_MAX_ALPHA (a scale alpha / rank past
// them makes every adapted output 0 or infinite), 0 <= dropout < 1, a target at least.
#define LLAMA_LORA_MIN_ALPHA 1e-9
#define LLAMA_LORA_MAX_ALPHA 1e9
int llama_lora_validate(const llama_lora_config *l, ag_err *err);

// What the adapted model shares with its blocks (set by llama_model_add_lora).
typedef struct {
    llama_lora_config cfg;
    float scale;       // alpha / rank
    uint64_t seed;     // of the dropout masks
    uint64_t forwards; // training forwards so far: each draws new masks (a recomputation the same)
    bool training;     // dropout applies (a training forward), not in generation
} llama_lora_state;

// ================================================================================================
// Routing of a mixture of experts (routing.c)
//
// How many tokens each expert of each sparse layer gets, forward by forward. A real run routes by
// its routers and can record what they chose; a meta run has no router output and takes the
// counts from an assumption or from a recorded file, so that meta == real to the byte when both
// route alike. Every bill of a sparse layer follows from these counts.
// ================================================================================================

typedef enum {
    LLAMA_ROUTING_BALANCED, // every expert gets tokens x k / experts (the remainder to the first ones)
    LLAMA_ROUTING_WORST,    // every token to the same k experts: each of them gets all the tokens
    LLAMA_ROUTING_FILE,     // as a real run recorded it (llama_routing_load)
    LLAMA_ROUTING_MEASURED, // a real run's own (llama_routing_add records it)
} llama_routing_kind;

typedef struct llama_routing llama_routing;

// An empty routing of a kind (FILE: use llama_routing_load); -1 out of memory.
int llama_routing_new(llama_routing **out, llama_routing_kind kind, ag_err *err);
void llama_routing_free(llama_routing *r);                        // NULL is ignored
llama_routing_kind llama_routing_kind_of(const llama_routing *r); // NULL: balanced
// The assumption in words, for reports: "balanced (...)", "worst (...)", "recorded (FILE, ...)".
const char *llama_routing_describe(const llama_routing *r, char *buf, size_t len);
// The tokens each of the E experts gets in `layer` of forward `forward` (0 the first forward of
// the run: a training step's, a generation's prefill, then each decode step), tokens routed k each.
// -1 when a file lacks that layer or routed other sizes, naming the file.
int llama_routing_counts(const llama_routing *r, int64_t forward, int64_t layer, int64_t tokens, int E, int k,
                         int64_t *count, ag_err *err);
// Records a layer's counts (a second record of the same forward and layer, a recomputation, is
// ignored).
int llama_routing_add(llama_routing *r, int64_t forward, int64_t layer, int64_t tokens, int E, int k,
                      const int64_t *count, ag_err *err);
// As JSON: {"membill_routing": 1, "experts", "top_k", "layers": [{"forward", "layer", "tokens",
// "count": [...]}]}; llama_routing_load reads it back for a model of that config (its sparse
// layers, experts and top-k), every count checked.
int llama_routing_write(const llama_routing *r, FILE *f, ag_err *err);
int llama_routing_load(llama_routing **out, const char *path, const llama_config *c, ag_err *err);
// The parameters training's gradients and optimizer state cover under a routing: all but the
// routed experts no token reaches (their .grad stays none, so Adam keeps no state for them).
// steps of accum forwards each, tokens routed in each; most: the most one step's gradients
// cover; any: those some step's cover (the optimizer's state). P for a dense config.
int llama_routing_trained(const llama_routing *r, const llama_config *c, int64_t tokens, int64_t steps, int64_t accum,
                          uint64_t *most, uint64_t *any, ag_err *err);

// What a model's sparse layers share during a run.
typedef struct {
    const llama_routing *assume; // meta mode: the routing to bill (NULL: balanced)
    llama_routing *record;       // a real run records its routing here (NULL: not recorded)
    int64_t forward;             // the forward under way (the index of its routing)
    ag_tensor **logits;          // [layers]: each sparse layer's router logits, kept for the aux loss
} llama_moe_run;

// One block's parameters; a row the config lacks (a bias, q_norm) is NULL.
typedef struct {
    ag_tensor *input_norm, *q, *k, *v, *o, *post_norm, *gate, *up, *down;
    ag_tensor *q_bias, *k_bias, *v_bias, *o_bias, *q_norm, *k_norm, *gate_bias, *up_bias, *down_bias;
    // A sparse layer: the router [experts, hidden] and each routed expert's projections
    // ([experts] arrays, owned by the layer), the shared expert and its gate [1, hidden].
    ag_tensor *router, *router_bias;
    ag_tensor **expert_gate, **expert_up, **expert_down;
    ag_tensor *shared_gate, *shared_up, *shared_down, *shared_expert_gate;
    // gpt_oss's sinks and stacked experts; the families not modelled yet: phi3's fused
    // projections, deepseek_v3's latent attention, gemma's norms around the MLP.
    ag_tensor *qkv, *gate_up, *sinks;
    ag_tensor *experts_gate_up, *experts_gate_up_bias, *experts_down, *experts_down_bias;
    ag_tensor *q_a, *q_a_norm, *q_b, *kv_a, *kv_a_norm, *kv_b;
    ag_tensor *pre_ff_norm, *post_ff_norm;
    ag_tensor *lora_a[LLAMA_NPROJ], *lora_b[LLAMA_NPROJ]; // NULL where the projection has no adapter
    const llama_lora_state *lora;                         // NULL without adapters
    llama_moe_run *moe;                                   // the model's (sparse layers)
} llama_layer;

// Parameters as autograd leaves (category weight), named as Hugging Face names them.
typedef struct {
    llama_config cfg;
    ag_tensor *embed; // [vocab, hidden]
    llama_layer *layers;
    ag_tensor *norm;    // [hidden]
    ag_tensor *lm_head; // [vocab, hidden]; the embedding itself when tied
    ag_tensor **params; // every parameter once, in Hugging Face order (owned references)
    size_t nparams;
    // What trains: every parameter, or with adapters only the adapters (block by block, each
    // target's A then B, in llama_proj order), the base frozen (no .grad, no optimizer state).
    ag_tensor **trainable;
    size_t ntrainable;
    ag_tensor **adapters; // the adapters (owned references); NULL without
    size_t nadapters;
    llama_lora_state lora;
    llama_moe_run moe; // its sparse layers' routing (set assume and record before a run)
} llama_model;

// Allocates every parameter (no data in meta mode; contents undefined until init or load).
int llama_model_new(llama_model **out, ag_ctx *ctx, const llama_config *cfg, ag_err *err);
// The same with the block's linear weights (the seven projections) billed under proj (meta mode:
// a quantised frozen base, autograd.h's ag_precision) and every other parameter under the
// context's dtype; proj NULL is llama_model_new.
int llama_model_new_proj_dtype(llama_model **out, ag_ctx *ctx, const llama_config *cfg, const ag_precision *proj,
                               ag_err *err);
void llama_model_free(llama_model *m); // NULL is ignored; frees the weights and their .grad
// Normal(0, 0.02) for matrices and the embedding, 1 for norms, 0 for biases, from the seed (the
// same values whatever the thread count).
void llama_model_init_random(llama_model *m, uint64_t seed);
// Reads every parameter from a checkpoint (a safetensors file or an index of shards, as
// llama_ckpt_open; F32, BF16, F16), checking names and shapes.
int llama_model_load(llama_model *m, const char *st_path, ag_err *err);
// Writes the weights (or, with grads, each trainable parameter's .grad) as F32 safetensors with HF names
// to f, as llama_st_write_f32_file does.
int llama_model_save_file(const llama_model *m, FILE *f, bool grads, ag_err *err);

// ================================================================================================
// LoRA adapters (lora.c, adapter.c)
// ================================================================================================

// Freezes every parameter (requires_grad off) and adds an adapter to each target of every block,
// billed as weight under the context's dtype ("model.layers.{i}.self_attn.q_proj.lora_A.weight"
// and "...lora_B.weight"), initialised as PEFT does from the seed (A uniform in
// +-1/sqrt(in), B zeros); the trainable parameters become the adapters. Once per model.
int llama_model_add_lora(llama_model *m, ag_ctx *ctx, const llama_lora_config *l, uint64_t seed, ag_err *err);
// The adapters' init of llama_model_add_lora from the seed, for each pair (A, B) that has its
// data (meta mode and parameters without storage are skipped): a sharded run fills its
// parameters unit by unit (ZeRO-3's zero.Init).
void llama_lora_init(llama_model *m, uint64_t seed);
// Parameter counts: the trainable ones (the adapters, or every parameter without) and all.
uint64_t llama_model_trainable_count(const llama_model *m);
uint64_t llama_model_param_total(const llama_model *m); // base + adapters
// The adapter parameters a config adds to a model: rank x (in + out) summed over the targets.
uint64_t llama_lora_param_count(const llama_config *c, const llama_lora_config *l);

// PEFT's save format: adapter_model.safetensors with the adapters under
// "base_model.model.<name>" (F32) and adapter_config.json (peft_type LORA, task_type CAUSAL_LM,
// r, lora_alpha, lora_dropout, target_modules, base_model_name_or_path...), each to f.
#define LLAMA_ADAPTER_WEIGHTS "adapter_model.safetensors"
#define LLAMA_ADAPTER_CONFIG "adapter_config.json"
int llama_adapter_write_weights(const llama_model *m, FILE *f, ag_err *err);
int llama_adapter_write_config(const llama_model *m, FILE *f, ag_err *err);
// A saved adapter's adapter_config.json (dir/adapter_config.json) into *l; base_name (len bytes,
// may be NULL) gets base_model_name_or_path. Settings that change what is computed and that
// membill does not compute (DoRA, rsLoRA, fan_in_fan_out, bias, patterns, modules_to_save, a
// peft_type other than LORA) are refused, naming the field; the values pass llama_lora_validate.
int llama_adapter_read_config(const char *dir, llama_lora_config *l, char *base_name, size_t len, ag_err *err);
// The same from the file's text (len bytes; origin names it, NULL: "adapter_config.json").
int llama_adapter_parse_config(const char *text, size_t len, const char *origin, llama_lora_config *l, char *base_name,
                               size_t base_len, ag_err *err);
// Loads dir/adapter_model.safetensors into the model's adapters (F32, BF16, F16): every adapter
// of the model there with its shape, and nothing else. A tensor of another rank, of another
// model's sizes, missing or unknown is refused with one line naming it and what was expected.
int llama_adapter_load(llama_model *m, const char *dir, ag_err *err);

// Every id in [0, vocab).
int llama_check_tokens(const llama_config *c, const int32_t *ids, size_t n, ag_err *err);

// Non-finite values (finite.c). A real training forward refuses non-finite logits or loss
// ("non-finite logits: nan at position 3, id 17 (lm_head); the first op that saved one is linear
// at layers.0.self_attn.q_proj.lora_B (... holds nan)"), a generation non-finite logits of the
// position it picks from. The first of n values that is NaN or infinite, -1 if none:
int64_t llama_first_nonfinite(const float *x, int64_t n);
// The same over a tensor of any dtype (as float32; -1 without data), its value in *value.
int64_t llama_tensor_nonfinite(const ag_tensor *t, float *value);
// After a backward: the gradients that sum the whole backward are finite. Those of the 1-D
// parameters (norms, biases: sums over every position of the gradient at their op), the rows of
// the embedding's at the step's ids (the residual stream's gradient, every block's included),
// and with adapters every adapter's; a non-finite value anywhere in the backward reaches one of
// them, unless a product of finite values overflows in a weight's own gradient. They are a few
// hundred kB whatever the model, so the check costs nothing beside a step. -1 with "non-finite
// gradient: the gradient of NAME holds nan at element I", the last parameter first (backward order).
int llama_check_grads(const llama_model *m, const int32_t *ids, size_t n, ag_err *err);

// The training forward: embedding, the blocks, final norm, head, next-token cross-entropy of
// ids[B*T] (labels = ids shifted by one, mean over B*(T-1) positions). Returns the loss
// tensor [1] (owned by the caller), or NULL with the message in err.
ag_tensor *llama_forward_loss(ag_ctx *ctx, llama_model *m, const int32_t *ids, int64_t B, int64_t T, ag_err *err);

// The logits [B, T, V] of ids[B*T] through the plain forward (no loss, nothing shared across
// blocks as transformers does: the op-level math alone); recorded on the tape when grad mode is
// on. NULL with the message in err.
ag_tensor *llama_forward_logits(ag_ctx *ctx, llama_model *m, const int32_t *ids, int64_t B, int64_t T, ag_err *err);

// How the training forward runs.
typedef struct {
    // Full activation recomputation: each block runs under ag_checkpoint, so forward keeps only
    // the blocks' inputs and backward recomputes each block just before its own backward.
    bool checkpointing;
    // Called just before and just after each part of the forward runs (a module's forward pre- and
    // post-hook: ZeRO-3 gathers a part's parameters before it and frees them after): part 0 the
    // embedding, 1 to layers the blocks, layers + 1 the final norm and the head. NULL: none.
    // Returning false stops the forward with the hook's message. With checkpointing, backward's
    // recomputation of block i calls it again (part i + 1, before true; nothing after: the part
    // stays until its backward has run), so that the options must live until backward.
    bool (*on_part)(void *user, int64_t part, bool before, ag_err *err);
    void *user;
} llama_forward_opts;

// llama_forward_loss with options (NULL: the defaults, all false).
ag_tensor *llama_forward_loss_opts(ag_ctx *ctx, llama_model *m, const llama_forward_opts *opts, const int32_t *ids,
                                   int64_t B, int64_t T, ag_err *err);

// ================================================================================================
// The closed form of a training step's bill, term by term (float32, or other dtypes as meta
// mode bills them: autograd.h's ag_precision)
// ================================================================================================

// What each category comes to, derived from the shapes and from what each op saves for
// backward (autograd/ops/*.c), so that it can be read beside the measured bill.
typedef struct {
    uint64_t params;    // P
    uint64_t weights;   // P x 4 (x weight bytes)
    uint64_t gradients; // P x 4 (x gradient bytes)
    uint64_t optimizer; // P x state bytes per parameter
    // Saved per block (bytes): 4 hidden-sized tensors (block input, its norm, the attention
    // output + residual, its norm), 2 rows of rstd, q and the attention output, k and v, the
    // attention probabilities (heads x s^2), 4 intermediate-sized tensors (gate, silu, up, product).
    // Every term at the activation's bytes but the two rows of rstd (float32 under autocast).
    // With q_norm and k_norm (Qwen3) also q and k before RoPE and an rstd per row and head.
    uint64_t act_per_block;
    uint64_t act_probs_per_block; // the s^2 term alone: batch x heads x s x s x 4 (x act bytes)
    // The head when the logits' gradient is allocated, the activation peak: the final norm's
    // input and output, the logits and their gradient, and the rstd and log-sum-exp rows
    // (float32).
    uint64_t act_head;
    uint64_t activations; // layers x act_per_block + act_head: the activation peak
    uint64_t kv_cache;    // 2 x layers x kv_heads x head_dim x seq x batch x act bytes
    // With checkpointing (full recomputation), activations = act_block_inputs + the larger of
    // act_head_moment and act_recompute; the three are 0 without it.
    bool checkpointing;
    uint64_t act_block_inputs; // layers x batch x seq x hidden x 4: each block's input, kept
    uint64_t act_head_moment;  // the head at the start of backward: final norm input and output,
                               // rstd, log-sum-exp rows, logits and their gradient
    // The last block while it is recomputed and backpropagated: its whole saved set (its input
    // counted once) and, at the peak (the MLP product's backward), the gradient of its output
    // and three intermediate-sized gradients (two when intermediate < hidden: see closed_form.c).
    uint64_t act_recompute;
    // Flash attention (llama_closed_form_flash): each block keeps a float32 log-sum-exp per query
    // row (batch x heads x s x 4) instead of the probabilities; act_probs_per_block is then 0.
    bool flash;
    uint64_t act_lse_per_block;
    // A mixture of experts (moe_blocks of the layers sparse): a sparse block keeps, in place of
    // the MLP's four intermediate-sized tensors, the router's float32 softmax (N x experts x 4),
    // the routing weights (N x k), each routed pair's gate and up outputs (2 x N k x its
    // intermediate) and the shared expert's saved set (its four, its gate's sigmoid and its
    // output); act_moe_delta is that difference. The activation peak is the larger of the head's
    // moment and the last sparse block's experts backward (act_experts_moment): every block's
    // saved set up to it (the shared expert's gone), the residual's and the experts' output
    // gradients, the grouped dispatch's scratch (gathered inputs, their gradients and the
    // output gradient's rows: 3 x N k x hidden; the product, its gradient and up's: 3 x N k x
    // intermediate), then the input's gradient and the weights'. With the load-balancing loss
    // (output_router_logits) both moments also hold each sparse layer's router logits'
    // gradient (N x experts), which its backward makes first. closed is false where the closed
    // form does not follow the run (a mixture of experts with checkpointing).
    int64_t moe_blocks;
    uint64_t act_moe_delta, act_shared_saved, act_experts_moment;
    bool closed;
    // The parameters with a gradient (the most one step has) and with optimizer state: params,
    // unless llama_closed_form_routing found routed experts no token reaches.
    uint64_t grad_params, state_params;
} llama_closed_form;

// Float32 throughout; checkpointing: every block under ag_checkpoint (llama_forward_opts).
void llama_closed_form_compute(const llama_config *c, int64_t batch, int64_t seq, uint64_t optimizer_bytes_per_param,
                               bool checkpointing, llama_closed_form *out);

// Bytes per element of each category (4 float32, 2 bf16 / fp16), and of optimizer state per
// parameter (Adam 8 in float32, 4 in bf16; mixed precision 12: fp32 master, exp_avg, exp_avg_sq).
typedef struct {
    uint64_t weight, gradient, activation;
    uint64_t optimizer;
    // The optimizer's bytes per element of a float32 parameter of its own dtype (PEFT's float32
    // adapters): torch.optim's state like the parameter, no master copy.
    uint64_t own_optimizer;
} llama_dtype_bytes;

void llama_closed_form_dtype(const llama_config *c, int64_t batch, int64_t seq, const llama_dtype_bytes *d,
                             llama_closed_form *out);
// Turns a closed form from llama_closed_form_dtype into flash attention's (call it before
// llama_closed_form_checkpointing): the probabilities out of each block, the log-sum-exp in.
void llama_closed_form_flash(const llama_config *c, int64_t batch, int64_t seq, llama_closed_form *out);
// Turns gradients and optimizer into a routing's (llama_routing_trained: steps of accum forwards
// of tokens each): an expert no token reached has neither.
int llama_closed_form_routing(const llama_config *c, const llama_routing *r, int64_t tokens, int64_t steps,
                              int64_t accum, const llama_dtype_bytes *d, llama_closed_form *out, ag_err *err);
// Turns a closed form from llama_closed_form_dtype (the same arguments) into the one with
// checkpointing: sets checkpointing, act_block_inputs, act_head_moment, act_recompute and
// activations; the other fields stay.
void llama_closed_form_checkpointing(const llama_config *c, int64_t batch, int64_t seq, const llama_dtype_bytes *d,
                                     llama_closed_form *out);

// LoRA's model states in closed form: the frozen base (its block matrices under the base's
// storage: base_bits 32/16 plain, 8 or 4 with a scale of scale_bytes per group of a row, nf4 as
// bitsandbytes' NF4; everything else at d->weight), the adapters at d->weight, and gradients and
// optimizer state for the adapters alone.
typedef struct {
    uint64_t base_params, adapter_params;
    uint64_t base_weights, adapter_weights, weights; // bytes
    uint64_t gradients, optimizer;
} llama_lora_closed_form;
void llama_closed_form_lora(const llama_config *c, const llama_lora_config *l, const llama_dtype_bytes *d,
                            int base_bits, int64_t group, int scale_bytes, bool nf4, llama_lora_closed_form *out);

// LoRA's activation peak in closed form (closed_form_lora.c): the saved set of block 0 (whose
// input, the frozen embedding's output, needs no gradient, so that nothing below its first
// adapter is kept), of every later block, and of the head at the start of backward (the final
// norm's, the loss's and its gradients), under the framework's saved sets and attention (flash
// or eager), at the activation bytes of d. The peak is the largest of the head's moment and,
// under the PyTorch frameworks, the forward's end and (eager attention) the last block's softmax
// in forward and its attention backward. The same figures hold for a quantised base (its
// dequantised weight is temporary, not activation). With checkpointing only the head's moment
// (act_block_inputs + act_head) is closed, and closed is false.
typedef struct {
    bool closed; // false where the closed form does not follow the setting
    bool checkpointing;
    uint64_t act_first_block;                 // block 0's saved set
    uint64_t act_block;                       // each later block's
    uint64_t act_head;                        // the head's moment: final norm, loss, their gradients, RoPE tables
    uint64_t act_forward_end;                 // PyTorch frameworks: the forward's end (cache, logits, log_softmax)
    uint64_t act_forward_softmax;             // PyTorch eager: the last block's softmax in forward
    uint64_t act_backward_attention;          // PyTorch eager: the last block's attention backward
    uint64_t act_block_inputs, act_recompute; // checkpointing only (act_recompute: not closed, 0)
    uint64_t activations;                     // the activation peak
} llama_lora_act_form;
void llama_closed_form_lora_activations(const llama_config *c, const llama_lora_config *l, int64_t batch, int64_t seq,
                                        const llama_dtype_bytes *d, ag_framework fw, bool flash, bool checkpointing,
                                        llama_lora_act_form *out);

// The exact bytes of the parameters at `bits` a weight element (32, 16, 8, 4). Under 16 bits
// matrices pack their elements and add one scale of scale_bytes per group of `group` elements
// of each row (group 0: no scales), and vectors (norm weights) keep vector_bits an element.
uint64_t llama_weight_bytes(const llama_config *c, int bits, int64_t group, int scale_bytes, int vector_bits);

// ================================================================================================
// Inference: greedy generation with a KV cache (infer.c)
// ================================================================================================

// What one forward of a generation did, handed to the step callback while its cache is alive.
typedef struct {
    int64_t step;                       // 0: the prefill (the prompt's forward); k >= 1: decode step k
    int64_t positions;                  // tokens the forward ran over: the prompt, 1 per cached decode step, or
                                        // the whole sequence so far without the cache
    double seconds;                     // the forward and the greedy choice
    const int32_t *next;                // [B]: the id each row chose
    uint64_t cache_bytes, cache_usable; // live category cache: requested bytes, size classes
    int64_t cache_shape[4];             // layer 0's keys (B, kv_heads, tokens, head_dim); zeros
                                        // without the cache
    ag_kv_cache *const *cache;          // [layers] (ag_kv_cache_shape, _bytes...); NULL without
} llama_generate_step;

typedef struct {
    bool use_cache; // false: every step recomputes the whole sequence (the same tokens, slower)
    void (*on_step)(void *user, const llama_generate_step *s); // optional, after every forward
    // optional, after on_step: true ends the generation there (every row reached end-of-text)
    bool (*stop)(void *user, const llama_generate_step *s);
    void *user;
} llama_generate_opts;

// Per forward k (0 the prefill, then the decode steps), arrays of new_tokens entries owned by
// the stats (llama_generate_stats_free).
typedef struct {
    int64_t steps;        // forwards that ran: new_tokens when generation completed
    double prefill_s;     // the first forward
    double decode_s;      // every decode step together
    double generate_s;    // prefill_s + decode_s
    double decode_step_s; // the median decode step (0 without any)
    double *step_s;
    uint64_t *cache_bytes;     // live cache bytes (requested) after forward k
    uint64_t *cache_usable;    // the same in size classes (usable bytes)
    int64_t (*cache_shape)[4]; // layer 0's keys after forward k
} llama_generate_stats;

void llama_generate_stats_free(llama_generate_stats *s); // NULL is ignored; zeroes *s

// Greedy generation of new_tokens ids per row after prompt_ids[B, T]: the prefill over the
// prompt (logits at every position, "lm_head:logits" [B, T, V]) picks the first new token, then
// each of the new_tokens - 1 decode steps runs over the token just chosen (logits of the last
// position only, [B, 1, V]) and picks the next. With opts->use_cache (also when opts is NULL)
// each block keeps its keys (after RoPE) and values, [B, kv_heads, tokens, head_dim], in the
// category cache, grown by one chunk per forward ("layers.<i>.self_attn:k_cache" and
// ":v_cache"): 2 x layers x kv_heads x head_dim x 4 x B bytes per token. Without it, every
// decode step runs over the whole sequence and keeps no cache.
//
// mask[B, T] (NULL: every token real) holds 1 for real tokens and 0 for pads, which must come
// first in their row (left padding) and leave at least one real token. Positions are
// cumsum(mask) - 1 and pad keys are hidden, so each row generates what its prompt generates
// alone. The phase is set to prefill, then to decode; the cache is freed before returning, so
// that afterwards every category but weight holds what it held before. Needs grad mode off.
// out_ids[B, new_tokens] gets the new ids (all 0 in meta mode, where nothing is computed).
// prompt + new_tokens - 1 (every token a forward runs over; the last new token is only chosen)
// must fit max_position_embeddings. stats may be NULL; when not, free it
// with llama_generate_stats_free, also after an error (it then holds the steps that ran).
int llama_generate(ag_ctx *ctx, llama_model *m, const llama_generate_opts *opts, const int32_t *prompt_ids,
                   const int32_t *mask, int64_t B, int64_t T, int64_t new_tokens, int32_t *out_ids,
                   llama_generate_stats *stats, ag_err *err);
