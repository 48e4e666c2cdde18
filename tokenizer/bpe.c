// The BPE model on one pre-token: its characters as symbols, then the lowest-ranked merge of two
// neighbours, again and again, ties to the leftmost pair (as the library's priority queue does).
// A heap keeps a long word (a 100 kB run of spaces) at n log n.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

typedef struct {
    int32_t rank, pos, left, right;
} cand;

typedef struct {
    cand *v;
    size_t n, cap;
} heap;

static bool before(const cand *a, const cand *b) { return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos; }

static int heap_push(heap *h, cand c) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        cand *v = realloc(h->v, cap * sizeof *v);
        if (!v) return -1;
        h->v = v, h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && before(&c, &h->v[(i - 1) / 2])) h->v[i] = h->v[(i - 1) / 2], i = (i - 1) / 2;
    h->v[i] = c;
    return 0;
}

static cand heap_pop(heap *h) {
    cand top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && before(&h->v[c + 1], &h->v[c])) c++;
        if (!before(&h->v[c], &last)) break;
        h->v[i] = h->v[c], i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

typedef struct {
    int32_t *id, *prev, *next;
    size_t n;
} symbols;

static void sym_add(symbols *s, int32_t id) {
    s->id[s->n] = id;
    s->prev[s->n] = (int32_t)s->n - 1;
    s->next[s->n] = -1;
    if (s->n) s->next[s->n - 1] = (int32_t)s->n;
    s->n++;
}

// A character the vocabulary lacks: its bytes as <0xNN> tokens, or the unknown token, or nothing.
static void unknown_char(const tok_tokenizer *t, const unsigned char *c, size_t k, symbols *s, bool *last_unk) {
    if (t->byte_fallback) {
        int32_t ids[4];
        size_t found = 0;
        for (size_t i = 0; i < k; i++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", c[i]);
            if ((ids[i] = tok_strmap_get(&t->vocab, name, 6)) >= 0) found++;
        }
        if (found == k) {
            for (size_t i = 0; i < k; i++) sym_add(s, ids[i]);
            *last_unk = false;
            return;
        }
    }
    if (t->unk < 0) return;
    if (!(t->fuse_unk && *last_unk)) sym_add(s, t->unk);
    *last_unk = true;
}

// The word's characters as symbols, with the subword prefix and word suffix where they go.
static int initial_symbols(const tok_tokenizer *t, const char *word, size_t len, symbols *s) {
    size_t plen = strlen(t->prefix), slen = strlen(t->suffix);
    char *tmp = malloc(plen + slen + 5);
    if (!tmp) return -1;
    bool last_unk = false;
    for (size_t i = 0; i < len;) {
        size_t k = tok_utf8_len((const unsigned char *)word + i, len - i);
        if (k == 0) k = 1; // the caller checked the text; a pre-token from the file may still cut a char
        size_t n = 0;
        if (i > 0) memcpy(tmp, t->prefix, plen), n = plen;
        memcpy(tmp + n, word + i, k), n += k;
        if (i + k == len) memcpy(tmp + n, t->suffix, slen), n += slen;
        int32_t id = tok_strmap_get(&t->vocab, tmp, n);
        if (id >= 0) {
            sym_add(s, id);
            last_unk = false;
        } else {
            unknown_char(t, (const unsigned char *)word + i, k, s, &last_unk);
        }
        i += k;
    }
    free(tmp);
    return 0;
}

static int push_pair(const tok_tokenizer *t, heap *h, const symbols *s, int32_t pos) {
    if (pos < 0) return 0; // the merge was at the word's start: nothing on its left
    int32_t nx = s->next[pos], rank, merged;
    if (nx < 0 || !tok_pairmap_get(&t->merges, s->id[pos], s->id[nx], &rank, &merged)) return 0;
    return heap_push(h, (cand){rank, pos, s->id[pos], s->id[nx]});
}

static int merge_all(const tok_tokenizer *t, symbols *s) {
    heap h = {0};
    int rc = 0;
    for (int32_t i = 0; i + 1 < (int32_t)s->n && rc == 0; i++) rc = push_pair(t, &h, s, i);
    while (h.n && rc == 0) {
        cand c = heap_pop(&h);
        int32_t nx = s->next[c.pos], rank, merged;
        // stale: one side was merged since the pair was queued
        if (s->id[c.pos] != c.left || nx < 0 || s->id[nx] != c.right) continue;
        tok_pairmap_get(&t->merges, c.left, c.right, &rank, &merged);
        s->id[c.pos] = merged;
        s->id[nx] = -1;
        s->next[c.pos] = s->next[nx];
        if (s->next[nx] >= 0) s->prev[s->next[nx]] = c.pos;
        rc = push_pair(t, &h, s, s->prev[c.pos]);
        if (rc == 0) rc = push_pair(t, &h, s, c.pos);
    }
    free(h.v);
    return rc;
}

int tok_bpe_word(const tok_tokenizer *t, const char *word, size_t len, tok_ids *out, tok_err *err) {
    if (len == 0) return 0;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(&t->vocab, word, len);
        if (id >= 0) return tok_ids_add(out, id) == 0 ? 0 : (tok_err_set(err, "text: out of memory"), -1);
    }
    // at most one symbol per byte (byte fallback gives one per byte of a character)
    symbols s = {.id = malloc(len * sizeof(int32_t)), .prev = malloc(len * sizeof(int32_t))};
    s.next = malloc(len * sizeof(int32_t));
    int rc = s.id && s.prev && s.next ? initial_symbols(t, word, len, &s) : -1;
    if (rc == 0 && merge_all(t, &s) != 0) rc = -1;
    // the leftmost symbol survives every merge it takes part in: index 0 stays the head
    for (int32_t i = s.n ? 0 : -1; rc == 0 && i >= 0; i = s.next[i])
        if (tok_ids_add(out, s.id[i]) != 0) rc = -1;
    if (rc != 0) tok_err_set(err, "text: out of memory");
    free(s.id), free(s.prev), free(s.next);
    return rc;
}
