// Encoding: the added tokens found first (longest at the leftmost place), the text between them
// through the pre-tokenizer and the BPE model, then the post-processor's template.
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static bool is_word(unsigned char c) {
    return c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c >= 0x80;
}

// Where an added token matches at or after `from`: [*start, *end) with its stripped spaces.
static const tok_added *find_added(const tok_tokenizer *t, const char *s, size_t len, size_t from, size_t *start,
                                   size_t *end) {
    for (size_t i = from; i < len; i++) {
        for (size_t k = 0; k < t->n_added; k++) { // longest first
            const tok_added *a = &t->added[k];
            if (a->content[0] != s[i] || a->len > len - i || memcmp(s + i, a->content, a->len) != 0) continue;
            size_t e = i + a->len;
            if (a->single_word &&
                ((i > 0 && is_word((unsigned char)s[i - 1])) || (e < len && is_word((unsigned char)s[e]))))
                continue;
            size_t b = i;
            if (a->lstrip)
                while (b > from && is_space(s[b - 1])) b--;
            if (a->rstrip)
                while (e < len && is_space(s[e])) e++;
            *start = b, *end = e;
            return a;
        }
    }
    return NULL;
}

// Pre-tokens already encoded in this text: long texts repeat their words.
typedef struct {
    tok_strmap index; // word -> entry
    size_t *first, *count;
    size_t n, cap;
    tok_ids ids;
} word_cache;

static int cache_add(word_cache *c, const char *w, size_t len, size_t first, size_t count) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        size_t *f = realloc(c->first, cap * sizeof *f);
        if (!f) return -1;
        c->first = f;
        size_t *k = realloc(c->count, cap * sizeof *k);
        if (!k) return -1;
        c->count = k, c->cap = cap;
    }
    c->first[c->n] = first, c->count[c->n] = count;
    return tok_strmap_put(&c->index, w, len, (int32_t)c->n++);
}

static int encode_word(const tok_tokenizer *t, word_cache *c, const char *w, size_t len, tok_ids *out, tok_err *err) {
    int32_t e = tok_strmap_get(&c->index, w, len);
    if (e < 0) {
        size_t first = c->ids.n;
        if (tok_bpe_word(t, w, len, &c->ids, err) != 0) return -1;
        e = (int32_t)c->n;
        if (c->n >= INT32_MAX || cache_add(c, w, len, first, c->ids.n - first) != 0)
            return tok_err_set(err, "text: out of memory"), -1;
    }
    for (size_t i = 0; i < c->count[e]; i++)
        if (tok_ids_add(out, c->ids.v[c->first[e] + i]) != 0) return tok_err_set(err, "text: out of memory"), -1;
    return 0;
}

static int encode_plain(const tok_tokenizer *t, word_cache *c, const char *s, size_t len, tok_ids *out, tok_err *err) {
    if (len == 0) return 0;
    tok_pieces p = {0};
    int rc = tok_pieces_add(&p, s, len) == 0 ? 0 : (tok_err_set(err, "text: out of memory"), -1);
    if (rc == 0 && t->pre) rc = tok_pre_apply(t, t->pre, &p, err);
    for (size_t i = 0; i < p.n && rc == 0; i++) rc = encode_word(t, c, p.s[i], p.len[i], out, err);
    tok_pieces_free(&p);
    return rc;
}

static int check_utf8(const char *text, size_t len, tok_err *err) {
    for (size_t i = 0; i < len;) {
        size_t k = tok_utf8_len((const unsigned char *)text + i, len - i);
        if (k == 0) return tok_err_set(err, "text: byte %zu is not valid UTF-8", i), -1;
        i += k;
    }
    return 0;
}

static int add_all(tok_ids *out, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (tok_ids_add(out, ids[i]) != 0) return -1;
    return 0;
}

int tok_encode(const tok_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n,
               tok_err *err) {
    if (err) err->msg[0] = 0;
    *ids = NULL, *n = 0;
    if (check_utf8(text, len, err) != 0) return -1;
    tok_ids out = {0};
    word_cache cache = {0};
    int rc = add_special && add_all(&out, t->post.before, t->post.n_before) != 0 ? -1 : 0;
    for (size_t at = 0; at <= len && rc == 0;) {
        size_t start = len, end = len;
        const tok_added *a = find_added(t, text, len, at, &start, &end);
        rc = encode_plain(t, &cache, text + at, start - at, &out, err);
        if (rc == 0 && a && tok_ids_add(&out, a->id) != 0) rc = -1;
        if (!a) break;
        at = end;
    }
    if (rc == 0 && add_special && add_all(&out, t->post.after, t->post.n_after) != 0) rc = -1;
    if (rc == 0 && !out.v && !(out.v = malloc(sizeof *out.v))) rc = -1;
    if (rc != 0 && !err->msg[0]) tok_err_set(err, "text: out of memory");
    tok_strmap_free(&cache.index);
    free(cache.first), free(cache.count), free(cache.ids.v);
    if (rc != 0) {
        free(out.v);
        return -1;
    }
    *ids = out.v, *n = out.n;
    return 0;
}

int32_t tok_vocab_size(const tok_tokenizer *t) { return t->vocab_size; }

const char *tok_token(const tok_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->vocab_size ? t->id_to_token[id] : NULL;
}

int32_t tok_token_id(const tok_tokenizer *t, const char *token) {
    return tok_strmap_get(&t->vocab, token, strlen(token));
}

bool tok_is_special(const tok_tokenizer *t, int32_t id) { return id >= 0 && id < t->vocab_size && t->special[id]; }
