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

// layout.c: the slot of the j-th parameter a block has under this config (NULL past the last).
ag_tensor **llama_layer_slot(llama_layer *L, const llama_config *c, size_t j);
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

// A tensor's values as float32: its own data when it is float32, else a malloc'd copy left in
// *own for the caller to free (NULL and err set when out of memory).
const float *llama_f32_view(const ag_tensor *t, float **own, ag_err *err);
// A checkpoint tensor read into p, converted to p's dtype (rounded or quantised).
int llama_read_into(const llama_st_file *f, const llama_st_tensor *t, ag_tensor *p, ag_err *err);
