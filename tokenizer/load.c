// tokenizer.json into the pipeline: the BPE model, added tokens, pre-tokenizer, post-processor
// and decoder. Whatever it cannot honour exactly is refused here, naming the part, so that an
// encoding never silently differs from the library's.
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tok_internal.h"

// Ids beyond this are a broken file, not a vocabulary (the largest ones are a few 10^5).
#define TOK_MAX_ID (1 << 24)
// Backtracking steps one regex match may take: far above what these families' regexes need on
// any text, and a bound on a pathological pattern from a file.
#define TOK_MATCH_LIMIT 10000000

static int oom(const char *origin, tok_err *err) {
    tok_err_set(err, "%s: out of memory", origin);
    return -1;
}

static int parse_vocab(tok_tokenizer *t, json_t *vocab, const char *origin, tok_err *err) {
    if (!json_is_object(vocab)) {
        tok_err_set(err, "%s: model.vocab must be an object of token -> id", origin);
        return -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= TOK_MAX_ID) {
            tok_err_set(err, "%s: model.vocab: '%.60s' must map to an id from 0 to %d", origin, key, TOK_MAX_ID - 1);
            return -1;
        }
        if (tok_strmap_put(&t->vocab, key, strlen(key), (int32_t)id) != 0) return oom(origin, err);
        if (id >= t->vocab_size) t->vocab_size = (int32_t)id + 1;
    }
    return 0;
}

// One merge, "a b" or ["a", "b"], into its two parts.
static bool merge_parts(json_t *m, const char **a, size_t *alen, const char **b, size_t *blen) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) return false;
        *a = s, *alen = (size_t)(sp - s), *b = sp + 1, *blen = strlen(sp + 1);
        return *alen && *blen;
    }
    if (!json_is_array(m) || json_array_size(m) != 2) return false;
    json_t *x = json_array_get(m, 0), *y = json_array_get(m, 1);
    if (!json_is_string(x) || !json_is_string(y)) return false;
    *a = json_string_value(x), *alen = json_string_length(x), *b = json_string_value(y), *blen = json_string_length(y);
    return true;
}

static int parse_merges(tok_tokenizer *t, json_t *merges, const char *origin, tok_err *err) {
    if (!merges) return 0;
    if (!json_is_array(merges)) {
        tok_err_set(err, "%s: model.merges must be a list", origin);
        return -1;
    }
    size_t plen = strlen(t->prefix);
    for (size_t i = 0; i < json_array_size(merges); i++) {
        const char *a, *b;
        size_t alen, blen;
        if (!merge_parts(json_array_get(merges, i), &a, &alen, &b, &blen)) {
            tok_err_set(err, "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", origin, i);
            return -1;
        }
        int32_t ia = tok_strmap_get(&t->vocab, a, alen), ib = tok_strmap_get(&t->vocab, b, blen);
        // the right part's subword prefix does not repeat inside the merged token
        size_t skip = plen && blen >= plen && memcmp(b, t->prefix, plen) == 0 ? plen : 0;
        char *ab = malloc(alen + blen + 1);
        if (!ab) return oom(origin, err);
        memcpy(ab, a, alen), memcpy(ab + alen, b + skip, blen - skip);
        int32_t im = tok_strmap_get(&t->vocab, ab, alen + blen - skip);
        free(ab);
        if (ia < 0 || ib < 0 || im < 0) {
            tok_err_set(err, "%s: model.merges[%zu]: '%.*s', '%.*s' or their merge is not in the vocabulary", origin, i,
                        (int)(alen < 40 ? alen : 40), a, (int)(blen < 40 ? blen : 40), b);
            return -1;
        }
        if (tok_pairmap_put(&t->merges, ia, ib, (int32_t)i, im) != 0) return oom(origin, err);
    }
    return 0;
}

static int dup_string(json_t *v, char **out, const char *what, const char *origin, tok_err *err) {
    if (v && !json_is_null(v) && !json_is_string(v)) {
        tok_err_set(err, "%s: model.%s must be a string or null", origin, what);
        return -1;
    }
    *out = strdup(json_is_string(v) ? json_string_value(v) : "");
    return *out ? 0 : oom(origin, err);
}

static int parse_model(tok_tokenizer *t, json_t *m, const char *origin, tok_err *err) {
    const char *type = json_string_value(json_object_get(m, "type"));
    if (!json_is_object(m) || (type && strcmp(type, "BPE") != 0)) {
        tok_err_set(err, "%s: model must be BPE (byte-level families), not '%.40s'", origin,
                    type                ? type
                    : json_is_object(m) ? "(no type)"
                                        : "(missing)");
        return -1;
    }
    json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0) {
        tok_err_set(err, "%s: model.dropout makes encoding random: only null or 0 is supported", origin);
        return -1;
    }
    t->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
    t->byte_fallback = json_is_true(json_object_get(m, "byte_fallback"));
    t->fuse_unk = json_is_true(json_object_get(m, "fuse_unk"));
    if (dup_string(json_object_get(m, "continuing_subword_prefix"), &t->prefix, "continuing_subword_prefix", origin,
                   err) != 0 ||
        dup_string(json_object_get(m, "end_of_word_suffix"), &t->suffix, "end_of_word_suffix", origin, err) != 0 ||
        parse_vocab(t, json_object_get(m, "vocab"), origin, err) != 0 ||
        parse_merges(t, json_object_get(m, "merges"), origin, err) != 0)
        return -1;
    json_t *unk = json_object_get(m, "unk_token");
    t->unk = -1;
    if (json_is_string(unk) &&
        (t->unk = tok_strmap_get(&t->vocab, json_string_value(unk), json_string_length(unk))) < 0) {
        tok_err_set(err, "%s: model.unk_token '%.40s' is not in the vocabulary", origin, json_string_value(unk));
        return -1;
    }
    return 0;
}

static int cmp_added(const void *a, const void *b) {
    const tok_added *x = a, *y = b;
    return x->len != y->len ? (x->len < y->len ? 1 : -1) : (x->id > y->id) - (x->id < y->id);
}

static int parse_added(tok_tokenizer *t, json_t *list, const char *origin, tok_err *err) {
    if (!list || json_is_null(list)) return 0;
    if (!json_is_array(list)) return tok_err_set(err, "%s: added_tokens must be a list", origin), -1;
    if (!(t->added = calloc(json_array_size(list) + 1, sizeof *t->added))) return oom(origin, err);
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *o = json_array_get(list, i), *c = json_object_get(o, "content"), *id = json_object_get(o, "id");
        json_int_t v = json_integer_value(id);
        if (!json_is_string(c) || !json_string_length(c) || !json_is_integer(id) || v < 0 || v >= TOK_MAX_ID) {
            tok_err_set(err, "%s: added_tokens[%zu] needs a non-empty \"content\" and an \"id\" from 0 to %d", origin,
                        i, TOK_MAX_ID - 1);
            return -1;
        }
        tok_added *a = &t->added[t->n_added];
        if (!(a->content = strdup(json_string_value(c)))) return oom(origin, err);
        t->n_added++;
        a->len = strlen(a->content), a->id = (int32_t)v;
        a->special = json_is_true(json_object_get(o, "special"));
        a->lstrip = json_is_true(json_object_get(o, "lstrip"));
        a->rstrip = json_is_true(json_object_get(o, "rstrip"));
        a->single_word = json_is_true(json_object_get(o, "single_word"));
        if (tok_strmap_put(&t->vocab, a->content, a->len, a->id) != 0) return oom(origin, err);
        if (a->id >= t->vocab_size) t->vocab_size = a->id + 1;
    }
    // longest first: where two added tokens start at one place, the longer one is taken
    qsort(t->added, t->n_added, sizeof *t->added, cmp_added);
    return 0;
}

// id -> token for decoding: an added token's content wins over the model's string for its id;
// an id given to two model tokens is a broken file.
static int build_id_table(tok_tokenizer *t, const char *origin, tok_err *err) {
    size_t n = (size_t)t->vocab_size + 1;
    t->id_to_token = calloc(n, sizeof *t->id_to_token);
    t->id_len = calloc(n, sizeof *t->id_len);
    t->special = calloc(n, 1);
    unsigned char *added = calloc(n, 1);
    int rc = t->id_to_token && t->id_len && t->special && added ? 0 : oom(origin, err);
    for (size_t i = 0; i < t->n_added && rc == 0; i++) {
        const tok_added *a = &t->added[i];
        t->id_to_token[a->id] = a->content, t->id_len[a->id] = a->len;
        t->special[a->id] = a->special, added[a->id] = 1;
    }
    for (size_t s = 0; s < t->vocab.cap && rc == 0; s++) {
        int32_t id = t->vocab.vals[s];
        if (!t->vocab.keys[s] || added[id]) continue;
        if (t->id_to_token[id]) {
            tok_err_set(err, "%s: model.vocab: id %d is given to two tokens", origin, id);
            rc = -1;
        }
        t->id_to_token[id] = t->vocab.keys[s], t->id_len[id] = t->vocab.lens[s];
    }
    free(added);
    return rc;
}

static tok_tokenizer *fail(tok_tokenizer *t) {
    tok_free(t);
    return NULL;
}

int tok_post_parse(tok_tokenizer *t, json_t *o, const char *origin, tok_err *err);
int tok_decoder_parse(tok_tokenizer *t, json_t *o, const char *origin, tok_err *err);

static int parse_parts(tok_tokenizer *t, json_t *root, const char *origin, tok_err *err) {
    json_t *norm = json_object_get(root, "normalizer"), *pre = json_object_get(root, "pre_tokenizer");
    if (norm && !json_is_null(norm)) {
        const char *type = json_string_value(json_object_get(norm, "type"));
        tok_err_set(err, "%s: normalizer '%.40s' is not supported (the byte-level families have none)", origin,
                    type ? type : "?");
        return -1;
    }
    if (parse_model(t, json_object_get(root, "model"), origin, err) != 0 ||
        parse_added(t, json_object_get(root, "added_tokens"), origin, err) != 0 || build_id_table(t, origin, err) != 0)
        return -1;
    if (pre && !json_is_null(pre)) {
        if (!(t->pre = calloc(1, sizeof *t->pre))) return oom(origin, err);
        if (tok_pre_parse(t, pre, t->pre, origin, err) != 0) return -1;
    }
    return tok_post_parse(t, json_object_get(root, "post_processor"), origin, err) != 0 ||
                   tok_decoder_parse(t, json_object_get(root, "decoder"), origin, err) != 0
               ? -1
               : 0;
}

tok_tokenizer *tok_parse(const char *json, size_t len, const char *origin, tok_err *err) {
    json_error_t je;
    if (err) err->msg[0] = 0;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(root)) {
        if (root)
            tok_err_set(err, "%s: expected a JSON object (a Hugging Face tokenizer.json)", origin);
        else
            tok_err_set(err, "%s: not JSON: %s at line %d, column %d", origin, je.text, je.line, je.column);
        json_decref(root);
        return NULL;
    }
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return oom(origin, err), NULL;
    }
    tok_bytemap_init(&t->bytes);
    t->mctx = pcre2_match_context_create(NULL);
    int rc = t->mctx ? pcre2_set_match_limit(t->mctx, TOK_MATCH_LIMIT) : oom(origin, err);
    if (rc == 0) rc = parse_parts(t, root, origin, err);
    json_decref(root);
    return rc == 0 ? t : fail(t);
}

void tok_free(tok_tokenizer *t) {
    if (!t) return;
    tok_strmap_free(&t->vocab);
    tok_pairmap_free(&t->merges);
    free(t->id_to_token), free(t->id_len), free(t->special);
    free(t->prefix), free(t->suffix);
    tok_pre_free(t->pre);
    free(t->pre);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->post.before), free(t->post.after);
    pcre2_match_context_free(t->mctx);
    free(t);
}
