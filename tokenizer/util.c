// The tokenizer's small parts: errors, maps, UTF-8, the byte-level alphabet, buffers.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

void tok_err_set(tok_err *err, const char *fmt, ...) {
    if (!err) return;
    char raw[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    size_t j = 0;
    for (const unsigned char *p = (const unsigned char *)raw; *p && j + 5 < sizeof err->msg; p++) {
        if (*p < 0x20 || *p == 0x7f)
            j += (size_t)snprintf(err->msg + j, sizeof err->msg - j, "\\x%02x", *p);
        else
            err->msg[j++] = (char)*p;
    }
    err->msg[j] = 0;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; // FNV-1a
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static size_t strmap_slot(const tok_strmap *m, const char *key, size_t len) {
    size_t i = (size_t)hash_bytes(key, len) & (m->cap - 1);
    while (m->keys[i] && !(m->lens[i] == len && memcmp(m->keys[i], key, len) == 0)) i = (i + 1) & (m->cap - 1);
    return i;
}

static int strmap_grow(tok_strmap *m) {
    tok_strmap g = {.cap = m->cap ? m->cap * 2 : 1024};
    g.keys = calloc(g.cap, sizeof *g.keys), g.lens = calloc(g.cap, sizeof *g.lens);
    g.vals = calloc(g.cap, sizeof *g.vals);
    if (!g.keys || !g.lens || !g.vals) {
        free(g.keys), free(g.lens), free(g.vals);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t s = strmap_slot(&g, m->keys[i], m->lens[i]);
        g.keys[s] = m->keys[i], g.lens[s] = m->lens[i], g.vals[s] = m->vals[i];
    }
    g.n = m->n;
    free(m->keys), free(m->lens), free(m->vals);
    *m = g;
    return 0;
}

int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m) != 0) return -1;
    size_t s = strmap_slot(m, key, len);
    if (!m->keys[s]) {
        if (!(m->keys[s] = malloc(len + 1))) return -1;
        memcpy(m->keys[s], key, len);
        m->keys[s][len] = 0;
        m->lens[s] = len;
        m->n++;
    }
    m->vals[s] = val;
    return 0;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    size_t s = strmap_slot(m, key, len);
    return m->keys[s] ? m->vals[s] : -1;
}

void tok_strmap_free(tok_strmap *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
    free(m->keys), free(m->lens), free(m->vals);
    memset(m, 0, sizeof *m);
}

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static size_t pair_slot(const tok_pairmap *m, uint64_t key) {
    size_t i = (size_t)((key * 0x9e3779b97f4a7c15ULL) >> 20) & (m->cap - 1);
    while (m->rank[i] >= 0 && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
    return i;
}

static int pairmap_grow(tok_pairmap *m) {
    tok_pairmap g = {.cap = m->cap ? m->cap * 2 : 1024};
    g.keys = malloc(g.cap * sizeof *g.keys), g.rank = malloc(g.cap * sizeof *g.rank);
    g.merged = malloc(g.cap * sizeof *g.merged);
    if (!g.keys || !g.rank || !g.merged) {
        free(g.keys), free(g.rank), free(g.merged);
        return -1;
    }
    for (size_t i = 0; i < g.cap; i++) g.rank[i] = -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->rank[i] < 0) continue;
        size_t s = pair_slot(&g, m->keys[i]);
        g.keys[s] = m->keys[i], g.rank[s] = m->rank[i], g.merged[s] = m->merged[i];
    }
    g.n = m->n;
    tok_pairmap_free(m);
    *m = g;
    return 0;
}

int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    if ((m->n + 1) * 2 > m->cap && pairmap_grow(m) != 0) return -1;
    size_t s = pair_slot(m, pair_key(a, b));
    if (m->rank[s] >= 0) return 0; // a repeated merge keeps its first (lowest) rank
    m->keys[s] = pair_key(a, b), m->rank[s] = rank, m->merged[s] = merged;
    m->n++;
    return 0;
}

bool tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged) {
    if (!m->cap) return false;
    size_t s = pair_slot(m, pair_key(a, b));
    if (m->rank[s] < 0) return false;
    *rank = m->rank[s], *merged = m->merged[s];
    return true;
}

void tok_pairmap_free(tok_pairmap *m) {
    free(m->keys), free(m->rank), free(m->merged);
    memset(m, 0, sizeof *m);
}

size_t tok_utf8_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    if (s[0] < 0x80) return 1;
    size_t k = s[0] >= 0xc2 && s[0] <= 0xdf   ? 2
               : s[0] >= 0xe0 && s[0] <= 0xef ? 3
               : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4
                                              : 0;
    if (k == 0 || k > n) return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    // no overlong forms, no surrogates, nothing past U+10FFFF
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f) || (s[0] == 0xf0 && s[1] < 0x90) ||
        (s[0] == 0xf4 && s[1] > 0x8f))
        return 0;
    return k;
}

// Printable bytes stand for themselves; the others (controls, space, 127-160, 173) take the
// code points from U+0100 on, in byte order, so that every byte is a visible character.
static bool byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

static int byte_code_point(int b) {
    if (byte_is_printable(b)) return b;
    int k = 0;
    for (int c = 0; c < b; c++) k += !byte_is_printable(c);
    return 256 + k;
}

void tok_bytemap_init(tok_bytemap *m) {
    for (int b = 0; b < 256; b++) {
        int cp = byte_code_point(b);
        unsigned char *c = (unsigned char *)m->chars[b];
        if (cp < 0x80) {
            c[0] = (unsigned char)cp, m->lens[b] = 1;
        } else {
            c[0] = (unsigned char)(0xc0 | cp >> 6), c[1] = (unsigned char)(0x80 | (cp & 0x3f)), m->lens[b] = 2;
        }
    }
    for (int cp = 0; cp < 512; cp++) m->byte_of[cp] = -1;
    for (int b = 0; b < 256; b++) m->byte_of[byte_code_point(b)] = (short)b;
}

int tok_bytemap_byte(const tok_bytemap *m, const unsigned char *s, size_t len) {
    int cp = len == 1 && s[0] < 0x80 ? s[0] : len == 2 ? (s[0] & 0x1f) << 6 | (s[1] & 0x3f) : -1;
    return cp >= 0 && cp < 512 ? m->byte_of[cp] : -1;
}

int tok_buf_add(tok_buf *b, const void *data, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int tok_pieces_add(tok_pieces *p, const char *s, size_t len) {
    if (len == 0) return 0;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        char **ns = realloc(p->s, cap * sizeof *ns);
        if (!ns) return -1;
        p->s = ns;
        size_t *nl = realloc(p->len, cap * sizeof *nl);
        if (!nl) return -1;
        p->len = nl, p->cap = cap;
    }
    char *c = malloc(len + 1);
    if (!c) return -1;
    memcpy(c, s, len);
    c[len] = 0;
    p->s[p->n] = c, p->len[p->n++] = len;
    return 0;
}

void tok_pieces_free(tok_pieces *p) {
    for (size_t i = 0; i < p->n; i++) free(p->s[i]);
    free(p->s), free(p->len);
    memset(p, 0, sizeof *p);
}

int tok_ids_add(tok_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v) return -1;
        ids->v = v, ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}
