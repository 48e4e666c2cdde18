// End of text: the eos_token_id of a config.json or generation_config.json, checked against the
// vocabulary, so that a generation never runs all its tokens because an id was silently dropped.
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

#define GENERATION_CONFIG_MAX (16u << 20)

// One id of the field: an integer from 0 to vocab - 1; field names it ("eos_token_id[1]").
static int add_id(llama_eos *eos, const json_t *v, const char *path, const char *field, int64_t vocab, ag_err *err) {
    if (!json_is_integer(v)) {
        ag_err_set(err, "%s: field %s must be a token id, an integer (it is %s)", path, field, llama_json_kind(v));
        return -1;
    }
    json_int_t id = json_integer_value(v);
    if (id < 0 || id >= vocab) {
        ag_err_set(err, "%s: field %s (%lld) must be a token id from 0 to %lld (vocab_size %lld)", path, field,
                   (long long)id, (long long)(vocab - 1), (long long)vocab);
        return -1;
    }
    for (int k = 0; k < eos->n; k++)
        if (eos->ids[k] == id) return 0;
    if (eos->n == LLAMA_MAX_EOS) {
        ag_err_set(err, "%s: field eos_token_id: more than %d end-of-text ids in all", path, LLAMA_MAX_EOS);
        return -1;
    }
    eos->ids[eos->n++] = (int32_t)id;
    return 0;
}

int llama_eos_parse(const char *text, size_t len, const char *origin, int64_t vocab, llama_eos *eos, ag_err *err) {
    const char *path = origin ? origin : "generation_config.json";
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    int rc = -1;
    if (!root) {
        ag_err_set(err, "%s: not valid JSON (line %d, column %d: %s)", path, je.line, je.column, je.text);
        return -1;
    }
    const json_t *v = json_object_get(root, "eos_token_id");
    if (!json_is_object(root)) {
        ag_err_set(err, "%s: expected a JSON object", path);
    } else if (!v || json_is_null(v)) {
        rc = 0;
    } else if (json_is_array(v)) {
        size_t i;
        const json_t *one;
        rc = 0;
        json_array_foreach(v, i, one) {
            char field[48];
            snprintf(field, sizeof field, "eos_token_id[%zu]", i);
            if ((rc = add_id(eos, one, path, field, vocab, err)) != 0) break;
        }
    } else if (json_is_integer(v)) {
        rc = add_id(eos, v, path, "eos_token_id", vocab, err);
    } else {
        ag_err_set(err, "%s: field eos_token_id must be a token id or a list of them (it is %s)", path,
                   llama_json_kind(v));
    }
    json_decref(root);
    return rc;
}

int llama_eos_load(const char *path, int64_t vocab, llama_eos *eos, ag_err *err) {
    char *text;
    size_t len;
    if (llama_read_file(path, "a generation_config.json", GENERATION_CONFIG_MAX, &text, &len, err) != 0) return -1;
    int rc = llama_eos_parse(text, len, path, vocab, eos, err);
    free(text);
    return rc;
}
