// Decoding: ids to token strings, the byte-level characters back to bytes, and the bytes to
// UTF-8 with U+FFFD where they do not form it (a model may stop inside a character).
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

int tok_decoder_parse(tok_tokenizer *t, json_t *o, const char *origin, tok_err *err);

static bool decoder_is_byte_level(json_t *o) {
    const char *type = json_string_value(json_object_get(o, "type"));
    if (type && strcmp(type, "ByteLevel") == 0) return true;
    json_t *items = json_object_get(o, "decoders");
    if (!type || strcmp(type, "Sequence") != 0 || !json_is_array(items) || json_array_size(items) == 0) return false;
    for (size_t i = 0; i < json_array_size(items); i++)
        if (!decoder_is_byte_level(json_array_get(items, i))) return false;
    return true;
}

int tok_decoder_parse(tok_tokenizer *t, json_t *o, const char *origin, tok_err *err) {
    if (!o || json_is_null(o)) return 0; // no decoder: tokens joined by spaces, as the library does
    if (decoder_is_byte_level(o)) return t->byte_level_decoder = true, 0;
    const char *type = json_string_value(json_object_get(o, "type"));
    tok_err_set(err, "%s: decoder '%.40s' is not supported (ByteLevel is)", origin, type ? type : "?");
    return -1;
}

// A token's bytes: each character's byte when all of them are byte-level characters, else the
// token as written (an added token with a plain space in it).
static int token_bytes(const tok_tokenizer *t, const char *s, size_t len, tok_buf *out) {
    size_t start = out->n;
    for (size_t i = 0; i < len;) {
        size_t k = tok_utf8_len((const unsigned char *)s + i, len - i);
        int b = k ? tok_bytemap_byte(&t->bytes, (const unsigned char *)s + i, k) : -1;
        if (b < 0) {
            out->n = start;
            return tok_buf_add(out, s, len);
        }
        unsigned char c = (unsigned char)b;
        if (tok_buf_add(out, &c, 1) != 0) return -1;
        i += k;
    }
    return 0;
}

// The bytes of an ill-formed sequence that one U+FFFD replaces: its maximal subpart (WHATWG, and
// Rust's from_utf8_lossy).
static size_t bad_prefix(const unsigned char *s, size_t n) {
    size_t need = s[0] >= 0xc2 && s[0] <= 0xdf   ? 1
                  : s[0] >= 0xe0 && s[0] <= 0xef ? 2
                  : s[0] >= 0xf0 && s[0] <= 0xf4 ? 3
                                                 : 0;
    size_t j = 1;
    for (; j <= need && j < n; j++) {
        unsigned char lo = 0x80, hi = 0xbf;
        if (j == 1 && s[0] == 0xe0) lo = 0xa0;
        if (j == 1 && s[0] == 0xed) hi = 0x9f;
        if (j == 1 && s[0] == 0xf0) lo = 0x90;
        if (j == 1 && s[0] == 0xf4) hi = 0x8f;
        if (s[j] < lo || s[j] > hi) break;
    }
    return j;
}

static int lossy_utf8(const tok_buf *in, tok_buf *out) {
    static const char replacement[] = "\xef\xbf\xbd";
    int rc = tok_buf_add(out, "", 0);
    for (size_t i = 0; i < in->n && rc == 0;) {
        const unsigned char *s = (const unsigned char *)in->p + i;
        size_t k = tok_utf8_len(s, in->n - i);
        if (k) {
            rc = tok_buf_add(out, s, k);
            i += k;
        } else {
            rc = tok_buf_add(out, replacement, 3);
            i += bad_prefix(s, in->n - i);
        }
    }
    return rc;
}

int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **text, size_t *len,
               tok_err *err) {
    if (err) err->msg[0] = 0;
    *text = NULL, *len = 0;
    tok_buf raw = {0}, out = {0};
    int rc = tok_buf_add(&raw, "", 0);
    bool first = true;
    for (size_t i = 0; i < n && rc == 0; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->vocab_size || !t->id_to_token[id]) {
            tok_err_set(err, "ids: %d (item %zu) is not a token of this tokenizer", id, i);
            free(raw.p);
            return -1;
        }
        if (skip_special && t->special[id]) continue;
        if (t->byte_level_decoder)
            rc = token_bytes(t, t->id_to_token[id], t->id_len[id], &raw);
        else
            rc = (first ? 0 : tok_buf_add(&raw, " ", 1)) || tok_buf_add(&raw, t->id_to_token[id], t->id_len[id]);
        first = false;
    }
    if (rc == 0) rc = lossy_utf8(&raw, &out);
    free(raw.p);
    if (rc != 0) {
        free(out.p);
        tok_err_set(err, "ids: out of memory");
        return -1;
    }
    *text = out.p, *len = out.n;
    return 0;
}
