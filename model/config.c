// Llama config: validation, Hugging Face config.json, and the parameter list it implies.
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "model_internal.h"

// A config.json is a few kB; anything past this is not one.
#define CONFIG_MAX_BYTES (16u << 20)

// ---------------------------------------------------------------------------------------------
// Validation

static int check_size(const char *field, int64_t v, int64_t max, ag_err *err) {
    if (v <= 0) {
        ag_err_set(err, "field %s (%lld) must be positive", field, (long long)v);
        return -1;
    }
    if (v > max) {
        ag_err_set(err, "field %s (%lld) is absurd (at most %lld)", field, (long long)v, (long long)max);
        return -1;
    }
    return 0;
}

// The experts of a config built in code (a config.json's fields are checked as they are read,
// each by its name): sizes in bounds, top-k within the experts.
static int validate_moe(const llama_config *c, ag_err *err) {
    const llama_moe *m = &c->moe;
    if (m->experts == 0) return 0;
    if (m->experts < 0 || m->experts > (1 << 16) || m->top_k < 1 || m->top_k > m->experts) {
        ag_err_set(err,
                   "the mixture of experts (%lld experts, %lld a token) must have 1 to 65536 experts and 1 to "
                   "that many a token",
                   (long long)m->experts, (long long)m->top_k);
        return -1;
    }
    if (m->ep < 0 || (m->ep > 1 && m->experts % m->ep != 0)) {
        ag_err_set(err, "expert parallelism over %lld ranks must divide the %lld experts", (long long)m->ep,
                   (long long)m->experts);
        return -1;
    }
    if (m->intermediate < 1 || m->intermediate > LLAMA_MAX_INTERMEDIATE || m->shared_intermediate < 0 ||
        m->shared_intermediate > LLAMA_MAX_INTERMEDIATE || m->sparse_step < 1 || m->dense_first < 0) {
        ag_err_set(err, "the mixture of experts' sizes (expert intermediate %lld, shared %lld) are out of bounds",
                   (long long)m->intermediate, (long long)m->shared_intermediate);
        return -1;
    }
    return 0;
}

// head_dim_derived: head_dim was not in the config.json but hidden_size / num_attention_heads,
// which the message then names.
static int validate(const llama_config *c, bool head_dim_derived, ag_err *err) {
    const struct {
        const char *field;
        int64_t v, max;
    } sizes[] = {
        {"hidden_size", c->hidden, LLAMA_MAX_HIDDEN},
        {"intermediate_size", c->intermediate, LLAMA_MAX_INTERMEDIATE},
        {"num_hidden_layers", c->layers, LLAMA_MAX_LAYERS},
        {"num_attention_heads", c->heads, LLAMA_MAX_HEADS},
        {"num_key_value_heads", c->kv_heads, LLAMA_MAX_HEADS},
        {"vocab_size", c->vocab, LLAMA_MAX_VOCAB},
        {"max_position_embeddings", c->max_positions, LLAMA_MAX_POSITIONS},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (check_size(sizes[i].field, sizes[i].v, sizes[i].max, err) != 0) return -1;
    if (c->heads % c->kv_heads != 0) {
        ag_err_set(err, "field num_key_value_heads (%lld) must divide num_attention_heads (%lld)",
                   (long long)c->kv_heads, (long long)c->heads);
        return -1;
    }
    const char *hd = head_dim_derived ? ", hidden_size / num_attention_heads as head_dim is absent" : "";
    if (c->head_dim <= 0) {
        ag_err_set(err, "field head_dim (%lld%s) must be positive", (long long)c->head_dim, hd);
        return -1;
    }
    if (c->head_dim > AG_ROPE_MAX_HEAD_DIM) {
        ag_err_set(err, "field head_dim (%lld%s) is too large (at most %d, RoPE's limit)", (long long)c->head_dim, hd,
                   AG_ROPE_MAX_HEAD_DIM);
        return -1;
    }
    if (c->head_dim % 2 != 0) {
        ag_err_set(err, "field head_dim (%lld%s) must be even (RoPE rotates pairs)", (long long)c->head_dim, hd);
        return -1;
    }
    if (c->sliding_window < 0 || c->sliding_window > LLAMA_MAX_POSITIONS) {
        ag_err_set(err, "field sliding_window (%lld) must be from 1 to %d, or null", (long long)c->sliding_window,
                   LLAMA_MAX_POSITIONS);
        return -1;
    }
    if (c->window_from < 0) {
        ag_err_set(err, "field max_window_layers (%lld) must not be negative", (long long)c->window_from);
        return -1;
    }
    // written so that NaN fails every comparison
    if (!(c->rope_theta >= LLAMA_MIN_ROPE_THETA && c->rope_theta <= LLAMA_MAX_ROPE_THETA)) {
        ag_err_set(err, "field rope_theta (%g) must be a number from %g to %g", c->rope_theta, LLAMA_MIN_ROPE_THETA,
                   LLAMA_MAX_ROPE_THETA);
        return -1;
    }
    if (c->rope.type == LLAMA_ROPE_YARN && !(c->rope_theta > 1.0)) { // log(theta) divides its ramp
        ag_err_set(err,
                   "field rope_theta (%g) must be above 1 under rope_scaling yarn, whose correction range "
                   "divides by log(rope_theta)",
                   c->rope_theta);
        return -1;
    }
    if (!(c->rms_eps >= LLAMA_MIN_RMS_EPS && c->rms_eps < 1)) {
        ag_err_set(err, "field rms_norm_eps (%g) must be at least %g and below 1", c->rms_eps, LLAMA_MIN_RMS_EPS);
        return -1;
    }
    if (validate_moe(c, err) != 0) return -1;
    uint64_t total;
    if (llama_param_total(c, &total) != 0 || total > LLAMA_MAX_PARAMS) {
        ag_err_set(err, "the config describes an absurd number of parameters (more than 10^13)");
        return -1;
    }
    return 0;
}

int llama_config_validate(const llama_config *c, ag_err *err) { return validate(c, false, err); }

// ---------------------------------------------------------------------------------------------
// config.json

const char *llama_json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

// 1 found, 0 absent or null, -1 error (wrong type, or absent when required).
int llama_json_int(const json_t *root, const char *path, const char *field, bool required, int64_t *out, ag_err *err) {
    const json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) {
        if (!required) return 0;
        ag_err_set(err, "%s: field %s missing", path, field);
        return -1;
    }
    if (!json_is_integer(v)) {
        if (json_is_real(v))
            ag_err_set(err,
                       "%s: field %s must be an integer written without a fraction or an "
                       "exponent (it is the real number %g)",
                       path, field, json_real_value(v));
        else
            ag_err_set(err, "%s: field %s must be an integer (it is %s)", path, field, llama_json_kind(v));
        return -1;
    }
    *out = (int64_t)json_integer_value(v);
    return 1;
}

int llama_json_number(const json_t *root, const char *path, const char *field, double *out, ag_err *err) {
    const json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) {
        ag_err_set(err, "%s: field %s must be a number (it is %s)", path, field, llama_json_kind(v));
        return -1;
    }
    *out = json_number_value(v);
    return 1;
}

int llama_json_bool(const json_t *root, const char *path, const char *field, bool *out, ag_err *err) {
    const json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        ag_err_set(err, "%s: field %s must be true or false (it is %s)", path, field, llama_json_kind(v));
        return -1;
    }
    *out = json_is_true(v);
    return 1;
}

// The length of the UTF-8 sequence at p (at most n bytes there), or 0 if it is not one.
static size_t utf8_len(const unsigned char *p, size_t n) {
    size_t k = p[0] < 0x80 ? 1 : (p[0] & 0xe0) == 0xc0 ? 2 : (p[0] & 0xf0) == 0xe0 ? 3 : (p[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (k == 0 || k > n) return 0;
    for (size_t i = 1; i < k; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    uint32_t cp = k == 1 ? p[0] : (uint32_t)(p[0] & (0x7f >> k));
    for (size_t i = 1; i < k; i++) cp = cp << 6 | (p[i] & 0x3f);
    static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return k;
}

// src into dst (len bytes, NUL-terminated) as printable UTF-8: control characters as \xNN,
// bytes that are not UTF-8 as '?', cut before the first character that does not fit.
static void set_name(char *dst, size_t len, const char *src) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)src;
    size_t n = strlen(src), used = 0;
    while (n) {
        char e[5];
        size_t k = utf8_len(p, n), step = k ? k : 1;
        if (k == 1 && (p[0] < 0x20 || p[0] == 0x7f)) {
            e[0] = '\\', e[1] = 'x', e[2] = hex[p[0] >> 4], e[3] = hex[p[0] & 15], k = 4;
        } else if (k == 0) {
            e[0] = '?', k = 1;
        } else {
            memcpy(e, p, k);
        }
        if (used + k >= len) break;
        memcpy(dst + used, e, k);
        used += k, p += step, n -= step;
    }
    dst[used] = '\0';
}

static int parse_config(llama_config *c, bool *head_dim_derived, const json_t *root, const char *path, ag_err *err) {
    memset(c, 0, sizeof *c);
    c->rope_theta = 10000.0;
    c->rms_eps = 1e-6;
    if (llama_parse_family(c, root, path, err) != 0) return -1; // model_type and its defaults
    if (llama_json_int(root, path, "hidden_size", true, &c->hidden, err) < 0 ||
        llama_json_int(root, path, "intermediate_size", true, &c->intermediate, err) < 0 ||
        llama_json_int(root, path, "num_hidden_layers", true, &c->layers, err) < 0 ||
        llama_json_int(root, path, "num_attention_heads", true, &c->heads, err) < 0 ||
        llama_json_int(root, path, "vocab_size", true, &c->vocab, err) < 0 ||
        llama_json_int(root, path, "max_position_embeddings", false, &c->max_positions, err) < 0 ||
        llama_json_number(root, path, "rope_theta", &c->rope_theta, err) < 0 ||
        llama_json_number(root, path, "rms_norm_eps", &c->rms_eps, err) < 0)
        return -1;
    int r = llama_json_int(root, path, "num_key_value_heads", false, &c->kv_heads, err);
    if (r < 0) return -1;
    if (r == 0) c->kv_heads = c->heads;
    r = llama_json_int(root, path, "head_dim", false, &c->head_dim, err);
    if (r < 0) return -1;
    *head_dim_derived = r == 0 && c->head_dim == 0; // qwen3's default is 128, not derived
    if (*head_dim_derived && c->heads > 0) {
        if (c->hidden % c->heads != 0) {
            ag_err_set(err,
                       "%s: field hidden_size (%lld) is not a multiple of num_attention_heads "
                       "(%lld) and head_dim is not given",
                       path, (long long)c->hidden, (long long)c->heads);
            return -1;
        }
        c->head_dim = c->hidden / c->heads;
    }
    if (llama_json_bool(root, path, "tie_word_embeddings", &c->tied, err) < 0) return -1;
    if (llama_parse_family_fields(c, root, path, err) != 0 || llama_parse_rope_scaling(c, root, path, err) != 0)
        return -1;
    const json_t *nm = json_object_get(root, "_name_or_path");
    set_name(c->name, sizeof c->name, json_is_string(nm) && json_string_length(nm) ? json_string_value(nm) : path);
    return 0;
}

static bool is_one_of(char c, const char *set) { return c != '\0' && strchr(set, c); }

// The field whose value jansson stopped in, when the text before pos ends in "name": and at most
// one token; "" otherwise. Lets "rope_theta": NaN or "vocab_size": 1e400 name their field.
static void field_at(char *out, size_t len, const char *text, size_t n, int pos) {
    out[0] = '\0';
    if (pos < 0 || (size_t)pos > n || len < 2) return;
    size_t i = (size_t)pos;
    // back over the token jansson was reading, then blanks, to the colon
    while (i > 0 && (isalnum((unsigned char)text[i - 1]) || is_one_of(text[i - 1], "+-."))) i--;
    while (i > 0 && is_one_of(text[i - 1], " \t\r\n")) i--;
    if (i == 0 || text[i - 1] != ':') return;
    i--;
    while (i > 0 && is_one_of(text[i - 1], " \t\r\n")) i--;
    if (i == 0 || text[i - 1] != '"') return;
    size_t end = --i;
    while (i > 0 && text[i - 1] != '"' && text[i - 1] != '\\' && end - i < 64) i--;
    if (i == 0 || text[i - 1] != '"' || i == end) return;
    size_t k = end - i < len - 1 ? end - i : len - 1;
    memcpy(out, text + i, k);
    out[k] = '\0';
}

// any: a family not modelled yet is parsed for its table, not refused.
static int parse_text(llama_config *out, const char *text, size_t len, const char *origin, bool any, ag_err *err) {
    const char *path = origin ? origin : "config.json";
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        char field[80], in[128] = "";
        field_at(field, sizeof field, text, len, jerr.position);
        if (field[0]) snprintf(in, sizeof in, ", in field %s", field);
        ag_err_set(err, "%s: not valid JSON (line %d, column %d%s: %s)", path, jerr.line, jerr.column, in, jerr.text);
        return -1;
    }
    int rc = -1;
    llama_config c;
    bool derived = false;
    if (!json_is_object(root)) {
        ag_err_set(err, "%s: expected a JSON object", path);
    } else if (parse_config(&c, &derived, root, path, err) == 0 &&
               (any || llama_family_refuse_unmodelled(&c, path, err) == 0)) {
        ag_err verr;
        if (validate(&c, derived, &verr) != 0) {
            ag_err_set(err, "%s: %s", path, verr.msg);
        } else {
            *out = c;
            rc = 0;
        }
    }
    json_decref(root);
    return rc;
}

int llama_config_parse(llama_config *out, const char *text, size_t len, const char *origin, ag_err *err) {
    return parse_text(out, text, len, origin, false, err);
}

int llama_config_parse_any(llama_config *out, const char *text, size_t len, const char *origin, ag_err *err) {
    return parse_text(out, text, len, origin, true, err);
}

int llama_config_load(llama_config *out, const char *path, ag_err *err) {
    char *text;
    size_t len;
    if (llama_read_file(path, "a config.json", CONFIG_MAX_BYTES, &text, &len, err) != 0) return -1;
    int rc = llama_config_parse(out, text, len, path, err);
    free(text);
    return rc;
}
