// Llama config: validation, Hugging Face config.json, and the parameter list it implies.
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "model.h"

// A config.json is a few kB; anything past this is not one.
#define CONFIG_MAX_BYTES (16u << 20)

// ---------------------------------------------------------------------------------------------
// Parameter shapes

size_t llama_param_count_tensors(const llama_config *c) {
    if (c->layers < 0) return 0;
    return 2 + (size_t)c->layers * LLAMA_PARAMS_PER_LAYER + (c->tied ? 0 : 1);
}

int llama_param_spec(const llama_config *c, size_t i, char *name, size_t name_len, int *ndim,
                     int64_t shape[2]) {
    static const char *const layer_names[LLAMA_PARAMS_PER_LAYER] = {
        "input_layernorm",  "self_attn.q_proj", "self_attn.k_proj",
        "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj",
    };
    size_t n = llama_param_count_tensors(c);
    if (i >= n) return -1;
    int64_t h = c->hidden, q, kv;
    if (__builtin_mul_overflow(c->heads, c->head_dim, &q) ||
        __builtin_mul_overflow(c->kv_heads, c->head_dim, &kv))
        return -1;
    int k;
    shape[1] = 1;
    if (i == 0) {
        k = snprintf(name, name_len, "model.embed_tokens.weight");
        *ndim = 2, shape[0] = c->vocab, shape[1] = h;
    } else if (i == n - 1 && !c->tied) {
        k = snprintf(name, name_len, "lm_head.weight");
        *ndim = 2, shape[0] = c->vocab, shape[1] = h;
    } else if (i == 1 + (size_t)c->layers * LLAMA_PARAMS_PER_LAYER) {
        k = snprintf(name, name_len, "model.norm.weight");
        *ndim = 1, shape[0] = h;
    } else {
        size_t layer = (i - 1) / LLAMA_PARAMS_PER_LAYER, j = (i - 1) % LLAMA_PARAMS_PER_LAYER;
        k = snprintf(name, name_len, "model.layers.%zu.%s.weight", layer, layer_names[j]);
        // rows (out features), columns (in features) of each tensor of a block, in order;
        // the two norms (j = 0 and 5) are vectors
        const int64_t rows[LLAMA_PARAMS_PER_LAYER] = {h, q, kv, kv, h, h, c->intermediate,
                                                      c->intermediate, h};
        const int64_t cols[LLAMA_PARAMS_PER_LAYER] = {1, h, h, h, q, 1, h, h, c->intermediate};
        *ndim = (j == 0 || j == 5) ? 1 : 2;
        shape[0] = rows[j];
        shape[1] = cols[j];
    }
    return (k < 0 || (size_t)k >= name_len) ? -1 : 0;
}

static bool mul_ovf(uint64_t a, uint64_t b, uint64_t *r) { return __builtin_mul_overflow(a, b, r); }
static bool add_ovf(uint64_t a, uint64_t b, uint64_t *r) { return __builtin_add_overflow(a, b, r); }

// Total parameters in closed form (the tests check it against the sum over
// llama_param_spec), or -1 if a size is negative or a sum or product overflows 64 bits.
static int param_total(const llama_config *c, uint64_t *out) {
    const int64_t v[] = {c->hidden, c->intermediate, c->layers, c->heads, c->kv_heads,
                         c->head_dim, c->vocab};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i] < 0) return -1;
    uint64_t h = (uint64_t)c->hidden, q, kv, attn, mlp, layer, embed, t;
    // per layer: q and o are q x h, k and v are kv x h, three MLP matrices, two norms
    if (mul_ovf((uint64_t)c->heads, (uint64_t)c->head_dim, &q) ||
        mul_ovf((uint64_t)c->kv_heads, (uint64_t)c->head_dim, &kv) ||
        add_ovf(q, kv, &attn) || mul_ovf(attn, h, &attn) || mul_ovf(attn, 2, &attn) ||
        mul_ovf((uint64_t)c->intermediate, h, &mlp) || mul_ovf(mlp, 3, &mlp) ||
        add_ovf(attn, mlp, &layer) || add_ovf(layer, h, &layer) || add_ovf(layer, h, &layer) ||
        mul_ovf(layer, (uint64_t)c->layers, &t) || mul_ovf((uint64_t)c->vocab, h, &embed) ||
        add_ovf(t, embed, &t) || add_ovf(t, h, &t) || (!c->tied && add_ovf(t, embed, &t)))
        return -1;
    *out = t;
    return 0;
}

uint64_t llama_param_count(const llama_config *c) {
    uint64_t total;
    return param_total(c, &total) == 0 ? total : 0;
}

// ---------------------------------------------------------------------------------------------
// Validation

static int check_size(const char *field, int64_t v, ag_err *err) {
    if (v <= 0) {
        ag_err_set(err, "field %s (%lld) must be positive", field, (long long)v);
        return -1;
    }
    if (v > INT32_MAX) {
        ag_err_set(err, "field %s (%lld) is absurd (at most %d)", field, (long long)v,
                      INT32_MAX);
        return -1;
    }
    return 0;
}

int llama_config_validate(const llama_config *c, ag_err *err) {
    const struct {
        const char *field;
        int64_t v;
    } sizes[] = {
        {"hidden_size", c->hidden},       {"intermediate_size", c->intermediate},
        {"num_hidden_layers", c->layers}, {"num_attention_heads", c->heads},
        {"num_key_value_heads", c->kv_heads}, {"head_dim", c->head_dim},
        {"vocab_size", c->vocab},         {"max_position_embeddings", c->max_positions},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (check_size(sizes[i].field, sizes[i].v, err) != 0) return -1;
    if (c->heads % c->kv_heads != 0) {
        ag_err_set(err,
                      "field num_key_value_heads (%lld) must divide num_attention_heads (%lld)",
                      (long long)c->kv_heads, (long long)c->heads);
        return -1;
    }
    if (c->head_dim % 2 != 0) {
        ag_err_set(err, "field head_dim (%lld) must be even (RoPE rotates pairs)",
                      (long long)c->head_dim);
        return -1;
    }
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta)) {
        ag_err_set(err, "field rope_theta (%g) must be a positive number", c->rope_theta);
        return -1;
    }
    if (!(c->rms_eps > 0 && c->rms_eps < 1)) {
        ag_err_set(err, "field rms_norm_eps (%g) must be between 0 and 1", c->rms_eps);
        return -1;
    }
    uint64_t total;
    if (param_total(c, &total) != 0 || total > LLAMA_MAX_PARAMS) {
        ag_err_set(err, "the config describes an absurd number of parameters (more than 10^13)");
        return -1;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// config.json

static int read_small_file(const char *path, char **out, size_t *len, ag_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ag_err_set(err, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ag_err_set(err, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    if ((uint64_t)st.st_size > CONFIG_MAX_BYTES) {
        ag_err_set(err, "%s: %lld bytes is too large for a config.json (at most %u)", path,
                      (long long)st.st_size, CONFIG_MAX_BYTES);
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size, got = 0;
    char *buf = malloc(size + 1);
    if (!buf) {
        ag_err_set(err, "%s: out of memory", path);
        close(fd);
        return -1;
    }
    while (got < size) {
        ssize_t k = read(fd, buf + got, size - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd);
    if (got != size) {
        ag_err_set(err, "%s: read failed", path);
        free(buf);
        return -1;
    }
    *out = buf;
    *len = size;
    return 0;
}

// 1 found, 0 absent or null, -1 error (wrong type, or absent when required).
static int get_int(const json_t *root, const char *path, const char *field, bool required,
                   int64_t *out, ag_err *err) {
    const json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) {
        if (!required) return 0;
        ag_err_set(err, "%s: field %s missing", path, field);
        return -1;
    }
    if (!json_is_integer(v)) {
        ag_err_set(err, "%s: field %s must be an integer", path, field);
        return -1;
    }
    *out = (int64_t)json_integer_value(v);
    return 1;
}

static int get_number(const json_t *root, const char *path, const char *field, double *out,
                      ag_err *err) {
    const json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) {
        ag_err_set(err, "%s: field %s must be a number", path, field);
        return -1;
    }
    *out = json_number_value(v);
    return 1;
}

// Fields that would add tensors or change the MLP that this model does not have.
static int check_unsupported(const json_t *root, const char *path, ag_err *err) {
    const char *bias_fields[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *v = json_object_get(root, bias_fields[i]);
        if (v && !json_is_null(v) && !json_is_false(v)) {
            ag_err_set(err, "%s: field %s must be false (biases are not supported)", path,
                          bias_fields[i]);
            return -1;
        }
    }
    const json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        ag_err_set(err, "%s: field hidden_act must be \"silu\"", path);
        return -1;
    }
    return 0;
}

static int parse_config(llama_config *c, const json_t *root, const char *path, ag_err *err) {
    const json_t *mt = json_object_get(root, "model_type");
    if (!mt) {
        ag_err_set(err, "%s: field model_type missing (expected \"llama\" or \"mistral\")",
                      path);
        return -1;
    }
    const char *type = json_is_string(mt) ? json_string_value(mt) : "";
    bool mistral = strcmp(type, "mistral") == 0;
    if (!mistral && strcmp(type, "llama") != 0) {
        ag_err_set(err, "%s: field model_type must be \"llama\" or \"mistral\"", path);
        return -1;
    }
    if (check_unsupported(root, path, err) != 0) return -1;
    memset(c, 0, sizeof *c);
    c->max_positions = mistral ? 131072 : 2048; // transformers' defaults
    c->rope_theta = 10000.0;
    c->rms_eps = 1e-6;
    if (get_int(root, path, "hidden_size", true, &c->hidden, err) < 0 ||
        get_int(root, path, "intermediate_size", true, &c->intermediate, err) < 0 ||
        get_int(root, path, "num_hidden_layers", true, &c->layers, err) < 0 ||
        get_int(root, path, "num_attention_heads", true, &c->heads, err) < 0 ||
        get_int(root, path, "vocab_size", true, &c->vocab, err) < 0 ||
        get_int(root, path, "max_position_embeddings", false, &c->max_positions, err) < 0 ||
        get_number(root, path, "rope_theta", &c->rope_theta, err) < 0 ||
        get_number(root, path, "rms_norm_eps", &c->rms_eps, err) < 0)
        return -1;
    int r = get_int(root, path, "num_key_value_heads", false, &c->kv_heads, err);
    if (r < 0) return -1;
    if (r == 0) c->kv_heads = c->heads;
    r = get_int(root, path, "head_dim", false, &c->head_dim, err);
    if (r < 0) return -1;
    if (r == 0 && c->heads > 0) {
        if (c->hidden % c->heads != 0) {
            ag_err_set(err,
                          "%s: field hidden_size (%lld) is not a multiple of num_attention_heads "
                          "(%lld) and head_dim is not given",
                          path, (long long)c->hidden, (long long)c->heads);
            return -1;
        }
        c->head_dim = c->hidden / c->heads;
    }
    const json_t *tied = json_object_get(root, "tie_word_embeddings");
    if (tied && !json_is_null(tied) && !json_is_boolean(tied)) {
        ag_err_set(err, "%s: field tie_word_embeddings must be true or false", path);
        return -1;
    }
    c->tied = tied && json_is_true(tied);
    const json_t *nm = json_object_get(root, "_name_or_path");
    const char *name = json_is_string(nm) && json_string_length(nm) ? json_string_value(nm) : path;
    snprintf(c->name, sizeof c->name, "%s", name);
    return 0;
}

int llama_config_load(llama_config *out, const char *path, ag_err *err) {
    char *text;
    size_t len;
    if (read_small_file(path, &text, &len, err) != 0) return -1;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root) {
        ag_err_set(err, "%s: not valid JSON (line %d, column %d: %s)", path, jerr.line,
                      jerr.column, jerr.text);
        return -1;
    }
    int rc = -1;
    llama_config c;
    if (!json_is_object(root)) {
        ag_err_set(err, "%s: expected a JSON object", path);
    } else if (parse_config(&c, root, path, err) == 0) {
        ag_err verr;
        if (llama_config_validate(&c, &verr) != 0) {
            ag_err_set(err, "%s: %s", path, verr.msg);
        } else {
            *out = c;
            rc = 0;
        }
    }
    json_decref(root);
    return rc;
}
