// Private to model/: file helpers that the config, safetensors and checkpoint readers share.
#pragma once

#include <jansson.h>

#include "model.h"

// finite.c: a forward's logits and loss hold finite values only; else -1 with the first
// non-finite value and where the forward first saved one (the tape is walked for it).
int llama_check_logits(const ag_ctx *ctx, const llama_model *m, const ag_tensor *logits, const ag_tensor *loss,
                       ag_err *err);

// "[2, 3]" into buf (len bytes).
void llama_format_shape(char *buf, size_t len, const int64_t *shape, int ndim);

// layout.c: the slot of the j-th parameter block `layer` has under this config (NULL past the
// last, or an expert's before llama_layer_alloc). llama_layer_alloc makes the block's arrays of
// per-expert slots (-1 out of memory); llama_layer_release frees them.
ag_tensor **llama_layer_slot(llama_layer *L, const llama_config *c, int64_t layer, size_t j);
int llama_layer_alloc(llama_layer *L, const llama_config *c, int64_t layer);
void llama_layer_release(llama_layer *L);
// The parameter count from the table, or -1 if a size is negative or a sum or product overflows.
int llama_param_total(const llama_config *c, uint64_t *out);

// config.c: fields of a config.json object. 1 found, 0 absent or null, -1 wrong type (or absent
// when required), the message starting with path and naming the field.
int llama_json_int(const json_t *root, const char *path, const char *field, bool required, int64_t *out, ag_err *err);
int llama_json_number(const json_t *root, const char *path, const char *field, double *out, ag_err *err);
int llama_json_bool(const json_t *root, const char *path, const char *field, bool *out, ag_err *err);
const char *llama_json_kind(const json_t *v); // "an integer", "a string"...

// families.c: model_type, and the defaults of its transformers config class (before the shared
// fields are read); then the fields of that family (biases, windows, use_cache), refusing those
// that would change the numbers but are not computed; then rope_scaling.
int llama_parse_family(llama_config *c, const json_t *root, const char *path, ag_err *err);
int llama_parse_family_fields(llama_config *c, const json_t *root, const char *path, ag_err *err);
int llama_parse_rope_scaling(llama_config *c, const json_t *root, const char *path, ag_err *err);
// What a family's sparse layers are called and how transformers loops over their experts:
// the module ("block_sparse_moe", "mlp"), and the projections' names (gate, up, down).
typedef struct {
    const char *prefix;
    bool hit_tensor; // ag_moe_eager's
    const char *proj[3];
} llama_moe_names;
const llama_moe_names *llama_family_moe_names(llama_family f);
// A family membill does not run yet: -1 with its name in err (0 for the others).
int llama_family_refuse_unmodelled(const llama_config *c, const char *path, ag_err *err);
// families.c, shared with the families' own fields: sliding_window (an integer or null; absent:
// dflt); qwen2's window from max_window_layers when use_sliding_window (and layer_types);
// attention_bias on q, k, v and o_proj.
int llama_window_field(const json_t *root, const char *path, int64_t dflt, bool used, int64_t *out, ag_err *err);
int llama_qwen_window(llama_config *c, const json_t *root, const char *path, ag_err *err);
int llama_attention_bias(llama_config *c, const json_t *root, const char *path, ag_err *err);
// families_moe.c: the mixtures of experts' fields, and the fields the parameter tables of the
// families not modelled yet take.
int llama_mixtral_fields(llama_config *c, const json_t *root, const char *path, ag_err *err);
int llama_qwen2_moe_fields(llama_config *c, const json_t *root, const char *path, ag_err *err);
int llama_qwen3_moe_fields(llama_config *c, const json_t *root, const char *path, ag_err *err);
int llama_gemma_fields(llama_config *c, const json_t *root, const char *path, ag_err *err);
int llama_phi3_fields(llama_config *c, const json_t *root, const char *path, ag_err *err);
// What a family's forward (training or generation) does not model under this context
// (framework, --ep): -1 with "<what>: ..." in err naming the family and the setting; 0 otherwise.
int llama_family_check_run(const llama_config *c, const ag_ctx *ctx, const char *what, ag_err *err);
// layer_types: full then sliding layers (window_from), or every n-th full (full_every); absent:
// what the caller set stays.
int llama_layer_types(llama_config *c, const json_t *root, const char *path, ag_err *err);
int llama_gpt_oss_fields(llama_config *c, const json_t *root, const char *path, ag_err *err);
// What deepseek_v3 runs under (blocks_mla.c): the lean framework, eager attention.
int llama_deepseek_v3_check_run(const llama_config *c, const ag_ctx *ctx, const char *what, ag_err *err);
int llama_deepseek_v3_fields(llama_config *c, const json_t *root, const char *path, ag_err *err);
// config.c: a config.json text parsed and validated whatever its family, modelled or not (the
// parameter tables of those not modelled yet, for tests); llama_config_parse refuses those.
int llama_config_parse_any(llama_config *out, const char *text, size_t len, const char *origin, ag_err *err);
// presets.c: a preset whatever its family, modelled or not (llama_config_preset refuses those).
int llama_config_preset_any(llama_config *out, const char *name, ag_err *err);

// A tensor's values as float32: its own data when it is float32, else a malloc'd copy left in
// *own for the caller to free (NULL and err set when out of memory).
const float *llama_f32_view(const ag_tensor *t, float **own, ag_err *err);
// A checkpoint tensor read into p, converted to p's dtype (rounded or quantised).
int llama_read_into(const llama_st_file *f, const llama_st_tensor *t, ag_tensor *p, ag_err *err);
