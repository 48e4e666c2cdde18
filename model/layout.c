// The model described once: the table of a decoder block's parameters, with the rows that only
// some families or configs have. Names, shapes, order, the tensor count, the parameter count and
// the model struct's slots all come from it (llama_param_spec, llama_param_count, params.c).
#include <stddef.h>
#include <stdio.h>

#include "model_internal.h"

// A size of the config a shape is made of.
typedef enum { DIM_ONE, DIM_HIDDEN, DIM_Q, DIM_KV, DIM_INTER, DIM_HEAD } dim;

// When a row is there.
typedef enum { ALWAYS, QKV_BIAS, O_BIAS, MLP_BIAS, QK_NORM } when;

typedef struct {
    const char *name; // after "model.layers.{i}."
    dim rows, cols;   // cols DIM_ONE: a vector of `rows`
    when cond;
    size_t slot; // in llama_layer
} layer_row;

// In Hugging Face's names and membill's order: each norm before what it feeds, each bias after
// its weight, Qwen3's q_norm and k_norm after o_proj (where Qwen3Attention registers them).
static const layer_row rows[] = {
    {"input_layernorm.weight", DIM_HIDDEN, DIM_ONE, ALWAYS, offsetof(llama_layer, input_norm)},
    {"self_attn.q_proj.weight", DIM_Q, DIM_HIDDEN, ALWAYS, offsetof(llama_layer, q)},
    {"self_attn.q_proj.bias", DIM_Q, DIM_ONE, QKV_BIAS, offsetof(llama_layer, q_bias)},
    {"self_attn.k_proj.weight", DIM_KV, DIM_HIDDEN, ALWAYS, offsetof(llama_layer, k)},
    {"self_attn.k_proj.bias", DIM_KV, DIM_ONE, QKV_BIAS, offsetof(llama_layer, k_bias)},
    {"self_attn.v_proj.weight", DIM_KV, DIM_HIDDEN, ALWAYS, offsetof(llama_layer, v)},
    {"self_attn.v_proj.bias", DIM_KV, DIM_ONE, QKV_BIAS, offsetof(llama_layer, v_bias)},
    {"self_attn.o_proj.weight", DIM_HIDDEN, DIM_Q, ALWAYS, offsetof(llama_layer, o)},
    {"self_attn.o_proj.bias", DIM_HIDDEN, DIM_ONE, O_BIAS, offsetof(llama_layer, o_bias)},
    {"self_attn.q_norm.weight", DIM_HEAD, DIM_ONE, QK_NORM, offsetof(llama_layer, q_norm)},
    {"self_attn.k_norm.weight", DIM_HEAD, DIM_ONE, QK_NORM, offsetof(llama_layer, k_norm)},
    {"post_attention_layernorm.weight", DIM_HIDDEN, DIM_ONE, ALWAYS, offsetof(llama_layer, post_norm)},
    {"mlp.gate_proj.weight", DIM_INTER, DIM_HIDDEN, ALWAYS, offsetof(llama_layer, gate)},
    {"mlp.gate_proj.bias", DIM_INTER, DIM_ONE, MLP_BIAS, offsetof(llama_layer, gate_bias)},
    {"mlp.up_proj.weight", DIM_INTER, DIM_HIDDEN, ALWAYS, offsetof(llama_layer, up)},
    {"mlp.up_proj.bias", DIM_INTER, DIM_ONE, MLP_BIAS, offsetof(llama_layer, up_bias)},
    {"mlp.down_proj.weight", DIM_HIDDEN, DIM_INTER, ALWAYS, offsetof(llama_layer, down)},
    {"mlp.down_proj.bias", DIM_HIDDEN, DIM_ONE, MLP_BIAS, offsetof(llama_layer, down_bias)},
};
#define NROWS (sizeof rows / sizeof rows[0])

static bool present(const llama_config *c, when w) {
    switch (w) {
    case ALWAYS: return true;
    case QKV_BIAS: return c->qkv_bias;
    case O_BIAS: return c->o_bias;
    case MLP_BIAS: return c->mlp_bias;
    case QK_NORM: return c->qk_norm;
    }
    return false;
}

// The j-th row the config has (NULL past the last).
static const layer_row *row_of(const llama_config *c, size_t j) {
    for (size_t r = 0; r < NROWS; r++)
        if (present(c, rows[r].cond) && j-- == 0) return &rows[r];
    return NULL;
}

size_t llama_params_per_layer(const llama_config *c) {
    size_t n = 0;
    for (size_t r = 0; r < NROWS; r++) n += present(c, rows[r].cond);
    return n;
}

size_t llama_param_count_tensors(const llama_config *c) {
    if (c->layers < 0) return 0;
    return 2 + (size_t)c->layers * llama_params_per_layer(c) + (c->tied ? 0 : 1);
}

// The size d stands for; false if it overflows.
static bool size_of(const llama_config *c, dim d, int64_t *out) {
    switch (d) {
    case DIM_ONE: *out = 1; return true;
    case DIM_HIDDEN: *out = c->hidden; return true;
    case DIM_Q: return !__builtin_mul_overflow(c->heads, c->head_dim, out);
    case DIM_KV: return !__builtin_mul_overflow(c->kv_heads, c->head_dim, out);
    case DIM_INTER: *out = c->intermediate; return true;
    case DIM_HEAD: *out = c->head_dim; return true;
    }
    return false;
}

ag_tensor **llama_layer_slot(llama_layer *L, const llama_config *c, size_t j) {
    const layer_row *r = row_of(c, j);
    return r ? (ag_tensor **)((char *)L + r->slot) : NULL;
}

int llama_param_spec(const llama_config *c, size_t i, char *name, size_t name_len, int *ndim, int64_t shape[2]) {
    size_t n = llama_param_count_tensors(c), per = llama_params_per_layer(c);
    if (i >= n) return -1;
    int k;
    shape[1] = 1;
    if (i == 0 || (i == n - 1 && !c->tied)) {
        k = snprintf(name, name_len, i == 0 ? "model.embed_tokens.weight" : "lm_head.weight");
        *ndim = 2, shape[0] = c->vocab, shape[1] = c->hidden;
    } else if (i == 1 + (size_t)c->layers * per) {
        k = snprintf(name, name_len, "model.norm.weight");
        *ndim = 1, shape[0] = c->hidden;
    } else {
        const layer_row *r = row_of(c, (i - 1) % per);
        k = snprintf(name, name_len, "model.layers.%zu.%s", (i - 1) / per, r->name);
        *ndim = r->cols == DIM_ONE ? 1 : 2;
        if (!size_of(c, r->rows, &shape[0]) || !size_of(c, r->cols, &shape[1])) return -1;
    }
    return (k < 0 || (size_t)k >= name_len) ? -1 : 0;
}

static bool mul_ovf(uint64_t a, uint64_t b, uint64_t *r) { return __builtin_mul_overflow(a, b, r); }
static bool add_ovf(uint64_t a, uint64_t b, uint64_t *r) { return __builtin_add_overflow(a, b, r); }

int llama_param_total(const llama_config *c, uint64_t *out) {
    const int64_t v[] = {c->hidden, c->intermediate, c->layers, c->heads, c->kv_heads, c->head_dim, c->vocab};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i] < 0) return -1;
    uint64_t layer = 0, t, embed;
    for (size_t r = 0; r < NROWS; r++) {
        int64_t a, b;
        uint64_t e;
        if (!present(c, rows[r].cond)) continue;
        if (!size_of(c, rows[r].rows, &a) || !size_of(c, rows[r].cols, &b) || mul_ovf((uint64_t)a, (uint64_t)b, &e) ||
            add_ovf(layer, e, &layer))
            return -1;
    }
    // the blocks, the embedding, the final norm, and an untied head
    if (mul_ovf(layer, (uint64_t)c->layers, &t) || mul_ovf((uint64_t)c->vocab, (uint64_t)c->hidden, &embed) ||
        add_ovf(t, embed, &t) || add_ovf(t, (uint64_t)c->hidden, &t) || (!c->tied && add_ovf(t, embed, &t)))
        return -1;
    *out = t;
    return 0;
}

uint64_t llama_param_count(const llama_config *c) {
    uint64_t total;
    return llama_param_total(c, &total) == 0 ? total : 0;
}

int64_t llama_layer_window(const llama_config *c, int64_t i) {
    return c->sliding_window > 0 && i >= c->window_from ? c->sliding_window : 0;
}
