// The pre-tokenizers: ByteLevel, Split, Digits and Sequence of them, each turning the list of
// pieces into a finer one, with the library's semantics (tokenizers/src/pre_tokenizers).
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

// GPT-2's split, as ByteLevel's use_regex applies it.
static const char gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// The files' regexes are Oniguruma's, whose Unicode \s is the White_Space property; PCRE2's lacks
// U+0085 (NEL), so \s and \S say it: "a \x{85}b" splits as the library splits it.
static char *white_space_as_oniguruma(const char *p, size_t len, size_t *out_len) {
    tok_buf b = {0};
    bool in_class = false;
    int rc = tok_buf_add(&b, "", 0);
    for (size_t i = 0; i < len && rc == 0; i++) {
        if (p[i] == '\\' && i + 1 < len) {
            char n = p[++i];
            const char *w = n == 's'                ? (in_class ? "\\s\\x{85}" : "[\\s\\x{85}]")
                            : n == 'S' && !in_class ? "[^\\s\\x{85}]"
                                                    : NULL;
            rc = w ? tok_buf_add(&b, w, strlen(w)) : tok_buf_add(&b, p + i - 1, 2);
            continue;
        }
        if (p[i] == '[' && !in_class) {
            in_class = true;
            rc = tok_buf_add(&b, p + i, 1);
            if (rc == 0 && i + 1 < len && p[i + 1] == '^') rc = tok_buf_add(&b, p + ++i, 1);
            if (rc == 0 && i + 1 < len && p[i + 1] == ']') rc = tok_buf_add(&b, p + ++i, 1); // a literal ]
            continue;
        }
        if (p[i] == ']') in_class = false;
        rc = tok_buf_add(&b, p + i, 1);
    }
    if (rc != 0) {
        free(b.p);
        return NULL;
    }
    *out_len = b.n;
    return b.p;
}

pcre2_code *tok_regex(const char *pattern, size_t len, bool literal, const char *origin, const char *what,
                      tok_err *err) {
    int code = 0;
    PCRE2_SIZE at = 0;
    uint32_t flags = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); // LITERAL takes no UCP
    size_t n = len;
    char *p = literal ? NULL : white_space_as_oniguruma(pattern, len, &n);
    if (!literal && !p) return tok_err_set(err, "%s: out of memory", origin), NULL;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(p ? p : pattern), n, flags, &code, &at, NULL);
    free(p);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        char where[48] = ""; // an offset into the rewritten pattern would mislead
        if (n == len) snprintf(where, sizeof where, " at offset %zu", (size_t)at);
        tok_err_set(err, "%s: %s: the regex does not compile%s: %s", origin, what, where, (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); // faster where the JIT exists; the interpreter otherwise
    return re;
}

// --- parsing ---------------------------------------------------------------------------------

static bool flag(json_t *o, const char *key, bool def) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static int parse_behavior(json_t *o, tok_split_behavior *b, const char *origin, tok_err *err) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    const char *s = json_string_value(json_object_get(o, "behavior"));
    for (int i = 0; s && i < 5; i++)
        if (strcmp(s, names[i]) == 0) return *b = (tok_split_behavior)i, 0;
    tok_err_set(err,
                "%s: pre_tokenizer Split: behavior must be Removed, Isolated, MergedWithPrevious, MergedWithNext or "
                "Contiguous, not '%.40s'",
                origin, s ? s : "(missing)");
    return -1;
}

static int parse_split(json_t *o, tok_pre *p, const char *origin, tok_err *err) {
    json_t *pat = json_object_get(o, "pattern");
    json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
    json_t *v = json_is_string(re) ? re : str;
    if (!json_is_string(v)) {
        tok_err_set(err, "%s: pre_tokenizer Split: pattern must be {\"Regex\": \"...\"} or {\"String\": \"...\"}",
                    origin);
        return -1;
    }
    if (parse_behavior(o, &p->behavior, origin, err) != 0) return -1;
    p->invert = flag(o, "invert", false);
    p->re = tok_regex(json_string_value(v), json_string_length(v), v == str, origin, "pre_tokenizer Split", err);
    return p->re ? 0 : -1;
}

static int parse_sequence(tok_tokenizer *t, json_t *o, tok_pre *p, const char *origin, tok_err *err) {
    json_t *items = json_object_get(o, "pretokenizers");
    if (!json_is_array(items)) {
        tok_err_set(err, "%s: pre_tokenizer Sequence: pretokenizers must be a list", origin);
        return -1;
    }
    p->items = calloc(json_array_size(items) + 1, sizeof *p->items);
    if (!p->items) return tok_err_set(err, "%s: out of memory", origin), -1;
    for (size_t i = 0; i < json_array_size(items); i++) {
        if (tok_pre_parse(t, json_array_get(items, i), &p->items[i], origin, err) != 0) return -1;
        p->n_items++;
    }
    return 0;
}

int tok_pre_parse(tok_tokenizer *t, const void *json, tok_pre *p, const char *origin, tok_err *err) {
    json_t *o = (json_t *)json;
    const char *type = json_string_value(json_object_get(o, "type"));
    memset(p, 0, sizeof *p);
    if (!type) {
        tok_err_set(err, "%s: pre_tokenizer: expected an object with a \"type\"", origin);
        return -1;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        p->kind = PRE_BYTE_LEVEL;
        p->add_prefix_space = flag(o, "add_prefix_space", true);
        if (!flag(o, "use_regex", true)) return 0;
        p->re = tok_regex(gpt2_regex, sizeof gpt2_regex - 1, false, origin, "pre_tokenizer ByteLevel", err);
        return p->re ? 0 : -1;
    }
    if (strcmp(type, "Digits") == 0) {
        // char::is_numeric, as the library splits: Unicode numbers, not only 0-9
        p->kind = PRE_DIGITS;
        p->behavior = flag(o, "individual_digits", false) ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
        p->re = tok_regex("\\p{N}", 5, false, origin, "pre_tokenizer Digits", err);
        return p->re ? 0 : -1;
    }
    if (strcmp(type, "Split") == 0) return p->kind = PRE_SPLIT, parse_split(o, p, origin, err);
    if (strcmp(type, "Sequence") == 0) return p->kind = PRE_SEQUENCE, parse_sequence(t, o, p, origin, err);
    tok_err_set(err, "%s: pre_tokenizer '%.40s' is not supported (ByteLevel, Split, Digits and Sequence are)", origin,
                type);
    return -1;
}

void tok_pre_free(tok_pre *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_items; i++) tok_pre_free(&p->items[i]);
    free(p->items);
    pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

// --- applying --------------------------------------------------------------------------------

typedef struct {
    size_t start, end;
    bool match;
} segment;

typedef struct {
    segment *v;
    size_t n, cap;
} segments;

static int seg_add(segments *s, size_t start, size_t end, bool match) {
    if (start == end) return 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        segment *v = realloc(s->v, cap * sizeof *v);
        if (!v) return -1;
        s->v = v, s->cap = cap;
    }
    s->v[s->n++] = (segment){start, end, match};
    return 0;
}

// The text cut into what the regex matches and what lies between; empty matches are skipped.
static int find_segments(const tok_tokenizer *t, const pcre2_code *re, const char *s, size_t len, segments *out,
                         tok_err *err) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return tok_err_set(err, "text: out of memory"), -1;
    size_t start = 0, off = 0;
    int rc = 0;
    while (off <= len && rc == 0) {
        int m = pcre2_match(re, (PCRE2_SPTR)s, len, off, 0, md, t->mctx);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(m, msg, sizeof msg);
            tok_err_set(err, "text: a pre-tokenizer's regex failed at byte %zu: %s", off, (const char *)msg);
            rc = -1;
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) { // an empty match: move on by one character
            if (ov[0] >= len) break;
            size_t k = tok_utf8_len((const unsigned char *)s + ov[0], len - ov[0]);
            off = ov[0] + (k ? k : 1);
            continue;
        }
        if (seg_add(out, start, ov[0], false) != 0 || seg_add(out, ov[0], ov[1], true) != 0) rc = -1;
        start = off = ov[1];
    }
    if (rc == 0 && seg_add(out, start, len, false) != 0) rc = -1;
    if (rc != 0 && !err->msg[0]) tok_err_set(err, "text: out of memory");
    pcre2_match_data_free(md);
    return rc;
}

// The segments folded by the behavior, into pieces (Split's SplitDelimiterBehavior).
static int fold_segments(segments *sg, tok_split_behavior b, bool invert) {
    size_t n = 0;
    bool prev = false;
    if (invert)
        for (size_t i = 0; i < sg->n; i++) sg->v[i].match = !sg->v[i].match;
    if (b == SPLIT_WITH_NEXT) { // the delimiter opens the piece after it: fold from the right
        for (size_t i = sg->n; i-- > 0;) {
            segment s = sg->v[i];
            if (s.match && !prev && n)
                sg->v[sg->n - n].start = s.start;
            else
                sg->v[sg->n - ++n] = s;
            prev = s.match;
        }
        memmove(sg->v, sg->v + sg->n - n, n * sizeof *sg->v);
        sg->n = n;
        return 0;
    }
    for (size_t i = 0; i < sg->n; i++) {
        segment s = sg->v[i];
        bool join = (b == SPLIT_WITH_PREVIOUS && s.match && !prev) || (b == SPLIT_CONTIGUOUS && s.match == prev);
        if (b == SPLIT_REMOVED && s.match) {
            prev = s.match;
            continue;
        }
        if (join && n)
            sg->v[n - 1].end = s.end;
        else
            sg->v[n++] = s;
        prev = s.match;
    }
    sg->n = n;
    return 0;
}

static int split_pieces(const tok_tokenizer *t, const pcre2_code *re, tok_split_behavior b, bool invert,
                        tok_pieces *pieces, tok_err *err) {
    tok_pieces out = {0};
    int rc = 0;
    for (size_t i = 0; i < pieces->n && rc == 0; i++) {
        segments sg = {0};
        rc = find_segments(t, re, pieces->s[i], pieces->len[i], &sg, err);
        if (rc == 0) fold_segments(&sg, b, invert);
        for (size_t k = 0; k < sg.n && rc == 0; k++)
            if (tok_pieces_add(&out, pieces->s[i] + sg.v[k].start, sg.v[k].end - sg.v[k].start) != 0) {
                tok_err_set(err, "text: out of memory");
                rc = -1;
            }
        free(sg.v);
    }
    tok_pieces_free(pieces);
    *pieces = out;
    return rc;
}

// Each byte of each piece as its printable character.
static int byte_level_map(const tok_tokenizer *t, tok_pieces *pieces, tok_err *err) {
    for (size_t i = 0; i < pieces->n; i++) {
        tok_buf b = {0};
        int rc = 0;
        for (size_t k = 0; k < pieces->len[i] && rc == 0; k++) {
            unsigned char c = (unsigned char)pieces->s[i][k];
            rc = tok_buf_add(&b, t->bytes.chars[c], t->bytes.lens[c]);
        }
        if (rc != 0) {
            free(b.p);
            return tok_err_set(err, "text: out of memory"), -1;
        }
        free(pieces->s[i]);
        pieces->s[i] = b.p, pieces->len[i] = b.n;
    }
    return 0;
}

// ByteLevel's prefix space goes before its regex, so that the first word splits as the others.
static int add_prefix_spaces(tok_pieces *pieces, tok_err *err) {
    for (size_t i = 0; i < pieces->n; i++) {
        if (pieces->s[i][0] == ' ') continue;
        char *s = malloc(pieces->len[i] + 2);
        if (!s) return tok_err_set(err, "text: out of memory"), -1;
        s[0] = ' ';
        memcpy(s + 1, pieces->s[i], pieces->len[i] + 1);
        free(pieces->s[i]);
        pieces->s[i] = s, pieces->len[i]++;
    }
    return 0;
}

int tok_pre_apply(const tok_tokenizer *t, const tok_pre *p, tok_pieces *pieces, tok_err *err) {
    switch (p->kind) {
    case PRE_SPLIT: return split_pieces(t, p->re, p->behavior, p->invert, pieces, err);
    case PRE_DIGITS: return split_pieces(t, p->re, p->behavior, false, pieces, err);
    case PRE_BYTE_LEVEL:
        if (p->add_prefix_space && add_prefix_spaces(pieces, err) != 0) return -1;
        if (p->re && split_pieces(t, p->re, SPLIT_ISOLATED, false, pieces, err) != 0) return -1;
        return byte_level_map(t, pieces, err);
    case PRE_SEQUENCE:
        for (size_t i = 0; i < p->n_items; i++)
            if (tok_pre_apply(t, &p->items[i], pieces, err) != 0) return -1;
        return 0;
    }
    return 0;
}
