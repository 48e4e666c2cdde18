// The tokenizer's parts, shared by its files: string and pair maps, the byte-level alphabet,
// lists of text pieces, and the loaded pipeline.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tok.h"

// printf-style into *err, control characters written as \xNN so that it stays one line.
void tok_err_set(tok_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Strings (any bytes) to ids: open addressing, keys copied.
typedef struct {
    char **keys;
    size_t *lens;
    int32_t *vals;
    size_t cap, n;
} tok_strmap;
int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val); // -1: out of memory
int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len);    // -1 if absent
void tok_strmap_free(tok_strmap *m);

// Merges: the pair (left id, right id) to its rank and the merged id.
typedef struct {
    uint64_t *keys;
    int32_t *rank, *merged; // rank -1: empty slot
    size_t cap, n;
} tok_pairmap;
int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged); // keeps the first
bool tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged);
void tok_pairmap_free(tok_pairmap *m);

// UTF-8: the length of the valid sequence at s (n bytes left), 0 if it is not one.
size_t tok_utf8_len(const unsigned char *s, size_t n);
// GPT-2's byte-level alphabet: each byte as a printable character (UTF-8, 1 or 2 bytes).
typedef struct {
    char chars[256][3];
    unsigned char lens[256];
    short byte_of[512]; // code point -> byte, -1 for none
} tok_bytemap;
void tok_bytemap_init(tok_bytemap *b);
// The byte a character stands for; -1 if it is none of the 256.
int tok_bytemap_byte(const tok_bytemap *m, const unsigned char *s, size_t len);

// A growing byte buffer.
typedef struct {
    char *p;
    size_t n, cap;
} tok_buf;
int tok_buf_add(tok_buf *b, const void *data, size_t n);

// Pieces of text between the pre-tokenizers, each owning its bytes.
typedef struct {
    char **s;
    size_t *len;
    size_t n, cap;
} tok_pieces;
int tok_pieces_add(tok_pieces *p, const char *s, size_t len); // an empty piece is not added
void tok_pieces_free(tok_pieces *p);

// Split's behaviors, as the library names them.
typedef enum {
    SPLIT_REMOVED,
    SPLIT_ISOLATED,
    SPLIT_WITH_PREVIOUS,
    SPLIT_WITH_NEXT,
    SPLIT_CONTIGUOUS
} tok_split_behavior;

typedef enum { PRE_BYTE_LEVEL, PRE_SPLIT, PRE_DIGITS, PRE_SEQUENCE } tok_pre_kind;

typedef struct tok_pre {
    tok_pre_kind kind;
    pcre2_code *re; // Split's pattern, ByteLevel's regex (when use_regex), Digits' digit class
    tok_split_behavior behavior;
    bool invert, add_prefix_space;
    struct tok_pre *items; // Sequence
    size_t n_items;
} tok_pre;

// One added token: matched in the text before anything else.
typedef struct {
    char *content;
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip, single_word;
} tok_added;

// The post-processor's template: ids before and after the sequence.
typedef struct {
    int32_t *before, *after;
    size_t n_before, n_after;
} tok_template;

struct tok_tokenizer {
    tok_strmap vocab;       // token string -> id (model vocab and added tokens)
    char **id_to_token;     // [vocab_size], NULL for holes
    size_t *id_len;         // byte length of each
    unsigned char *special; // [vocab_size]: 1 for special added tokens
    int32_t vocab_size;
    tok_pairmap merges;
    bool ignore_merges, byte_fallback, fuse_unk;
    int32_t unk;           // -1: none
    char *prefix, *suffix; // continuing_subword_prefix, end_of_word_suffix ("" when none)
    tok_pre *pre;          // NULL: none
    tok_added *added;      // sorted by length, longest first
    size_t n_added;
    tok_template post;
    bool byte_level_decoder; // else tokens are joined as they are
    tok_bytemap bytes;
    pcre2_match_context *mctx; // limits that keep a pathological regex from running away
};

// Pre-tokenizers (pretok.c).
int tok_pre_parse(tok_tokenizer *t, const void *json, tok_pre *out, const char *origin, tok_err *err);
void tok_pre_free(tok_pre *p);
// Replaces *pieces by what the pre-tokenizer makes of them.
int tok_pre_apply(const tok_tokenizer *t, const tok_pre *p, tok_pieces *pieces, tok_err *err);
// PCRE2 pattern (UTF, Unicode properties) or a refusal naming it.
pcre2_code *tok_regex(const char *pattern, size_t len, bool literal, const char *origin, const char *what,
                      tok_err *err);

// The BPE model on one pre-token (bpe.c): its ids appended to out.
typedef struct {
    int32_t *v;
    size_t n, cap;
} tok_ids;
int tok_ids_add(tok_ids *ids, int32_t id);
int tok_bpe_word(const tok_tokenizer *t, const char *word, size_t len, tok_ids *out, tok_err *err);
