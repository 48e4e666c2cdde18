// PEFT's adapter files: adapter_model.safetensors (the adapters under
// "base_model.model.<name>") and adapter_config.json, written and read back.
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>

#define PEFT_PREFIX "base_model.model."
#define ADAPTER_CONFIG_MAX (1 << 20)

int llama_adapter_write_weights(const llama_model *m, FILE *f, ag_err *err) {
    size_t n = m->nadapters;
    if (!n) {
        ag_err_set(err, "the model has no adapters to save");
        return -1;
    }
    char(*names)[LLAMA_PARAM_NAME_MAX + 64] = calloc(n, sizeof *names);
    const char **np = calloc(n, sizeof *np);
    int *ndims = calloc(n, sizeof *ndims);
    int64_t(*shapes)[LLAMA_ST_WRITE_MAX_DIMS] = calloc(n, sizeof *shapes);
    const float **data = calloc(n, sizeof *data);
    float **wide = calloc(n, sizeof *wide); // float32 copies of adapters of other dtypes
    int rc = -1;
    if (!names || !np || !ndims || !shapes || !data || !wide) {
        ag_err_set(err, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const ag_tensor *a = m->adapters[i];
        if (!a->data) {
            ag_err_set(err, "%s has no data (meta mode)", ag_tensor_name(a));
            goto done;
        }
        snprintf(names[i], sizeof names[i], PEFT_PREFIX "%s", ag_tensor_name(a));
        np[i] = names[i];
        ndims[i] = 2;
        shapes[i][0] = a->shape[0], shapes[i][1] = a->shape[1];
        if (!(data[i] = llama_f32_view(a, &wide[i], err))) goto done;
    }
    rc = llama_st_write_f32_file(f, n, np, ndims, (const int64_t(*)[LLAMA_ST_WRITE_MAX_DIMS])shapes, data, err);
done:
    for (size_t i = 0; wide && i < n; i++) free(wide[i]);
    free(names), free(np), free(ndims), free(shapes), free(data), free(wide);
    return rc;
}

int llama_adapter_write_config(const llama_model *m, FILE *f, ag_err *err) {
    const llama_lora_config *l = &m->lora.cfg;
    if (!m->nadapters) {
        ag_err_set(err, "the model has no adapters to save");
        return -1;
    }
    json_t *targets = json_array();
    for (int k = 0; k < LLAMA_NPROJ; k++)
        if (l->targets & (1u << k)) json_array_append_new(targets, json_string(llama_proj_name((llama_proj)k)));
    // LoraConfig's fields as save_pretrained writes them; the ones PEFT fills in by default are
    // written too, so that a reader sees every setting that was used.
    json_t *root = json_pack(
        "{s:s, s:s, s:s, s:I, s:f, s:f, s:o, s:s, s:b, s:b, s:b, s:b, s:b, s:n, s:n, s:n, s:{}, s:{}, s:n, s:n}",
        "peft_type", "LORA", "task_type", "CAUSAL_LM", "base_model_name_or_path", m->cfg.name, "r", (json_int_t)l->rank,
        "lora_alpha", l->alpha, "lora_dropout", l->dropout, "target_modules", targets, "bias", "none", "fan_in_fan_out",
        0, "inference_mode", 1, "init_lora_weights", 1, "use_rslora", 0, "use_dora", 0, "modules_to_save",
        "layers_to_transform", "layers_pattern", "rank_pattern", "alpha_pattern", "revision", "megatron_config");
    if (!root) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    int rc = json_dumpf(root, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) == 0 &&
                     fputc('\n', f) != EOF
                 ? 0
                 : -1;
    json_decref(root);
    if (rc) ag_err_set(err, "write failed");
    return rc;
}

// A field that must hold its default for what membill computes to be what PEFT computes.
static int refuse_unless(bool ok, const char *path, const char *field, const char *expected, ag_err *err) {
    if (ok) return 0;
    ag_err_set(err, "%s: %s must be %s (membill computes plain LoRA only)", path, field, expected);
    return -1;
}

static bool is_null_or_empty(const json_t *v) {
    return !v || json_is_null(v) || (json_is_object(v) && json_object_size(v) == 0) ||
           (json_is_array(v) && json_array_size(v) == 0);
}

static int read_targets(const json_t *t, const char *path, unsigned *out, ag_err *err) {
    if (json_is_string(t)) {
        if (llama_lora_parse_targets(json_string_value(t), out, err) == 0) return 0;
    } else if (json_is_array(t) && json_array_size(t) > 0) {
        char list[512];
        size_t n = 0, i;
        json_t *v;
        list[0] = 0;
        json_array_foreach(t, i, v) {
            if (!json_is_string(v) || n >= sizeof list) break; // too long a list names no PEFT module set
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? "," : "", json_string_value(v));
        }
        if (i == json_array_size(t) && n < sizeof list && llama_lora_parse_targets(list, out, err) == 0) return 0;
    }
    ag_err_set(err, "%s: target_modules must list PEFT's linear module names (q_proj ... down_proj) or be all-linear",
               path);
    return -1;
}

static int parse_config(const json_t *root, const char *path, llama_lora_config *l, char *base, size_t len,
                        ag_err *err) {
    const json_t *pt = json_object_get(root, "peft_type"), *bias = json_object_get(root, "bias");
    if (refuse_unless(json_is_string(pt) && strcmp(json_string_value(pt), "LORA") == 0, path, "peft_type", "\"LORA\"",
                      err) ||
        refuse_unless(!bias || (json_is_string(bias) && strcmp(json_string_value(bias), "none") == 0), path, "bias",
                      "\"none\"", err))
        return -1;
    static const char *const falsy[] = {"use_dora", "use_rslora", "fan_in_fan_out"};
    for (size_t i = 0; i < sizeof falsy / sizeof falsy[0]; i++) {
        const json_t *v = json_object_get(root, falsy[i]);
        if (refuse_unless(!v || json_is_false(v) || json_is_null(v), path, falsy[i], "false", err)) return -1;
    }
    static const char *const empty[] = {"rank_pattern", "alpha_pattern", "layers_to_transform", "modules_to_save"};
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++)
        if (refuse_unless(is_null_or_empty(json_object_get(root, empty[i])), path, empty[i], "null or empty", err))
            return -1;
    const json_t *r = json_object_get(root, "r"), *a = json_object_get(root, "lora_alpha"),
                 *d = json_object_get(root, "lora_dropout");
    if (!json_is_integer(r) || (a && !json_is_number(a)) || (d && !json_is_number(d))) {
        ag_err_set(err, "%s: %s must be %s", path,
                   !json_is_integer(r)  ? "r"
                   : !json_is_number(a) ? "lora_alpha"
                                        : "lora_dropout",
                   !json_is_integer(r) ? "an integer" : "a number");
        return -1;
    }
    *l = (llama_lora_config){.rank = json_integer_value(r),
                             .alpha = a ? json_number_value(a) : 8.0,
                             .dropout = d ? json_number_value(d) : 0.0};
    if (read_targets(json_object_get(root, "target_modules"), path, &l->targets, err) != 0) return -1;
    const json_t *bn = json_object_get(root, "base_model_name_or_path");
    if (base && len) snprintf(base, len, "%s", json_is_string(bn) ? json_string_value(bn) : "");
    if (llama_lora_validate(l, err) == 0) return 0;
    char m[sizeof err->msg];
    memcpy(m, err->msg, sizeof m);
    ag_err_set(err, "%s: %s", path, m);
    return -1;
}

int llama_adapter_parse_config(const char *text, size_t len, const char *origin, llama_lora_config *l, char *base,
                               size_t base_len, ag_err *err) {
    const char *path = origin ? origin : LLAMA_ADAPTER_CONFIG;
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!json_is_object(root)) {
        ag_err_set(err, "%s: not a JSON object (line %d: %s)", path, je.line, root ? "another value" : je.text);
        json_decref(root);
        return -1;
    }
    int rc = parse_config(root, path, l, base, base_len, err);
    json_decref(root);
    return rc;
}

int llama_adapter_read_config(const char *dir, llama_lora_config *l, char *base, size_t len, ag_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, LLAMA_ADAPTER_CONFIG);
    char *text = NULL;
    size_t n = 0;
    if (llama_read_file(path, "an adapter_config.json", ADAPTER_CONFIG_MAX, &text, &n, err) != 0) return -1;
    int rc = llama_adapter_parse_config(text, n, path, l, base, len, err);
    free(text);
    return rc;
}

static const ag_tensor *adapter_named(const llama_model *m, const char *peft_name) {
    if (strncmp(peft_name, PEFT_PREFIX, strlen(PEFT_PREFIX)) != 0) return NULL;
    for (size_t i = 0; i < m->nadapters; i++)
        if (strcmp(ag_tensor_name(m->adapters[i]), peft_name + strlen(PEFT_PREFIX)) == 0) return m->adapters[i];
    return NULL;
}

// Every tensor of the file is one of the model's adapters, shaped as it is, floating point; then
// every adapter is in the file.
static int check_file(const llama_model *m, const llama_st_file *f, ag_err *err) {
    char want[64], got[64];
    for (size_t i = 0; i < llama_st_count(f); i++) {
        const llama_st_tensor *t = llama_st_get(f, i);
        const ag_tensor *a = adapter_named(m, t->name);
        if (!a) {
            ag_err_set(err, "%s: %s is not an adapter of this model (%s, rank %lld, targets as configured)",
                       llama_st_path(f), t->name, m->cfg.name, (long long)m->lora.cfg.rank);
            return -1;
        }
        llama_format_shape(want, sizeof want, a->shape, 2);
        llama_format_shape(got, sizeof got, t->shape, t->ndim);
        if (t->ndim != 2 || t->shape[0] != a->shape[0] || t->shape[1] != a->shape[1]) {
            ag_err_set(err, "%s: %s is %s, expected %s (rank %lld on %s)", llama_st_path(f), t->name, got, want,
                       (long long)m->lora.cfg.rank, m->cfg.name);
            return -1;
        }
        if (t->dtype != LLAMA_ST_F32 && t->dtype != LLAMA_ST_BF16 && t->dtype != LLAMA_ST_F16) {
            ag_err_set(err, "%s: %s is %s, expected F32, BF16 or F16", llama_st_path(f), t->name,
                       llama_st_dtype_name(t->dtype));
            return -1;
        }
    }
    for (size_t i = 0; i < m->nadapters; i++) {
        char name[LLAMA_PARAM_NAME_MAX + 64];
        snprintf(name, sizeof name, PEFT_PREFIX "%s", ag_tensor_name(m->adapters[i]));
        if (!llama_st_find(f, name)) {
            ag_err_set(err, "%s: %s is missing (the adapter has other targets or fewer layers)", llama_st_path(f),
                       name);
            return -1;
        }
    }
    return 0;
}

int llama_adapter_load(llama_model *m, const char *dir, ag_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, LLAMA_ADAPTER_WEIGHTS);
    if (!m->nadapters) {
        ag_err_set(err, "%s: the model has no adapters to load it into", path);
        return -1;
    }
    llama_st_file *f = NULL;
    if (llama_st_open(&f, path, err) != 0) return -1;
    int rc = check_file(m, f, err);
    for (size_t i = 0; rc == 0 && i < m->nadapters; i++) {
        ag_tensor *a = m->adapters[i];
        char name[LLAMA_PARAM_NAME_MAX + 64];
        snprintf(name, sizeof name, PEFT_PREFIX "%s", ag_tensor_name(a));
        if (a->data) rc = llama_read_into(f, llama_st_find(f, name), a, err);
    }
    llama_st_close(f);
    return rc;
}
