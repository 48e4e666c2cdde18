// The post-processor: the special tokens a template puts around the text (Llama-3's BOS).
// TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel (nothing to ids) and Sequence.
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

int tok_post_parse(tok_tokenizer *t, json_t *o, const char *origin, tok_err *err);

static int append(int32_t **v, size_t *n, const int32_t *ids, size_t k, bool front) {
    if (k == 0) return 0; // ids may be NULL then
    int32_t *g = realloc(*v, (*n + k + 1) * sizeof *g);
    if (!g) return -1;
    if (front) memmove(g + k, g, *n * sizeof *g);
    memcpy(front ? g : g + *n, ids, k * sizeof *g);
    *v = g, *n += k;
    return 0;
}

// A template item {"SpecialToken": {"id": NAME}}: the ids special_tokens gives NAME.
static int special_ids(tok_tokenizer *t, json_t *specials, const char *name, int32_t *ids, size_t *k,
                       const char *origin, tok_err *err) {
    json_t *list = json_object_get(json_object_get(specials, name), "ids");
    *k = 0;
    for (size_t i = 0; json_is_array(list) && i < json_array_size(list) && i < 8; i++) {
        json_int_t v = json_integer_value(json_array_get(list, i));
        if (!json_is_integer(json_array_get(list, i)) || v < 0 || v >= t->vocab_size || !t->id_to_token[v]) break;
        ids[(*k)++] = (int32_t)v;
    }
    if (*k == 0 || *k != json_array_size(list)) {
        tok_err_set(
            err,
            "%s: post_processor: special token '%.40s' needs \"ids\" in special_tokens (1 to 8 of the tokenizer's ids)",
            origin, name);
        return -1;
    }
    return 0;
}

// The single-sequence template, split at its sequence "A" into what goes before and after.
static int parse_template(tok_tokenizer *t, json_t *o, tok_template *tp, const char *origin, tok_err *err) {
    json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
    bool seen = false;
    if (!json_is_array(single))
        return tok_err_set(err, "%s: post_processor TemplateProcessing: single must be a list", origin), -1;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *item = json_array_get(single, i), *sp = json_object_get(item, "SpecialToken");
        const char *seq = json_string_value(json_object_get(json_object_get(item, "Sequence"), "id"));
        if (seq && strcmp(seq, "A") == 0 && !seen) {
            seen = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        if (!name) {
            tok_err_set(
                err, "%s: post_processor TemplateProcessing: single[%zu] must be a SpecialToken or the one Sequence A",
                origin, i);
            return -1;
        }
        int32_t ids[8];
        size_t k;
        if (special_ids(t, specials, name, ids, &k, origin, err) != 0) return -1;
        if (seen ? append(&tp->after, &tp->n_after, ids, k, false) : append(&tp->before, &tp->n_before, ids, k, false))
            return tok_err_set(err, "%s: out of memory", origin), -1;
    }
    if (!seen) return tok_err_set(err, "%s: post_processor TemplateProcessing: single has no Sequence A", origin), -1;
    return 0;
}

// RobertaProcessing and BertProcessing: [cls] A [sep], each given as ["<s>", 0].
static int parse_cls_sep(tok_tokenizer *t, json_t *o, tok_template *tp, const char *origin, tok_err *err) {
    json_t *cls = json_array_get(json_object_get(o, "cls"), 1), *sep = json_array_get(json_object_get(o, "sep"), 1);
    json_int_t c = json_integer_value(cls), s = json_integer_value(sep);
    if (!json_is_integer(cls) || !json_is_integer(sep) || c < 0 || s < 0 || c >= t->vocab_size || s >= t->vocab_size ||
        !t->id_to_token[c] || !t->id_to_token[s]) {
        tok_err_set(err, "%s: post_processor: cls and sep must be [token, id] with ids of the tokenizer", origin);
        return -1;
    }
    int32_t ci = (int32_t)c, si = (int32_t)s;
    if (append(&tp->before, &tp->n_before, &ci, 1, false) || append(&tp->after, &tp->n_after, &si, 1, false))
        return tok_err_set(err, "%s: out of memory", origin), -1;
    return 0;
}

// One processor wrapping what the earlier ones of a Sequence made.
static int parse_one(tok_tokenizer *t, json_t *o, const char *origin, tok_err *err) {
    const char *type = json_string_value(json_object_get(o, "type"));
    tok_template tp = {0};
    int rc = -1;
    if (type && strcmp(type, "ByteLevel") == 0) return 0;
    if (type && strcmp(type, "Sequence") == 0) {
        json_t *items = json_object_get(o, "processors");
        if (!json_is_array(items))
            return tok_err_set(err, "%s: post_processor Sequence: processors must be a list", origin), -1;
        for (size_t i = 0; i < json_array_size(items); i++)
            if (parse_one(t, json_array_get(items, i), origin, err) != 0) return -1;
        return 0;
    }
    if (type && strcmp(type, "TemplateProcessing") == 0)
        rc = parse_template(t, o, &tp, origin, err);
    else if (type && (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0))
        rc = parse_cls_sep(t, o, &tp, origin, err);
    else
        tok_err_set(err,
                    "%s: post_processor '%.40s' is not supported (TemplateProcessing, ByteLevel, RobertaProcessing, "
                    "BertProcessing and Sequence are)",
                    origin, type ? type : "?");
    if (rc == 0 && (append(&t->post.before, &t->post.n_before, tp.before, tp.n_before, true) ||
                    append(&t->post.after, &t->post.n_after, tp.after, tp.n_after, false))) {
        tok_err_set(err, "%s: out of memory", origin);
        rc = -1;
    }
    free(tp.before), free(tp.after);
    return rc;
}

int tok_post_parse(tok_tokenizer *t, json_t *o, const char *origin, tok_err *err) {
    if (!o || json_is_null(o)) return 0;
    return parse_one(t, o, origin, err);
}
