// PYTORCH_CUDA_ALLOC_CONF as c10's AllocatorConfig::parseArgs reads it: tokens split at ',', ':',
// '[' and ']', spaces dropped, "key:value" pairs separated by commas, PyTorch's own checks.
#include "cuda_internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS 256
#define TOKEN_LEN 64

typedef struct {
    char tok[MAX_TOKENS][TOKEN_LEN];
    size_t n, i;
    char *err;
    size_t errlen;
} lexer;

static bool fail(lexer *l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->err, l->errlen, fmt, ap);
    va_end(ap);
    return false;
}

static bool lex(lexer *l, const char *text) {
    size_t len = 0;
    for (const char *p = text;; p++) {
        bool sep = *p == ',' || *p == ':' || *p == '[' || *p == ']';
        if ((sep || !*p) && len) { // the word so far
            l->tok[l->n++][len] = 0;
            len = 0;
        }
        if (!*p) return true;
        if (l->n >= MAX_TOKENS - 1) return fail(l, "more than %d items", MAX_TOKENS - 1);
        if (sep) {
            l->tok[l->n][0] = *p;
            l->tok[l->n++][1] = 0;
        } else if (*p != ' ') {
            if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) return fail(l, "a character that is not printable ASCII");
            if (len + 1 >= TOKEN_LEN) return fail(l, "an item longer than %d characters", TOKEN_LEN - 1);
            l->tok[l->n][len++] = *p;
        }
    }
}

static const char *next(lexer *l) { return l->i < l->n ? l->tok[l->i++] : NULL; }

static bool expect(lexer *l, const char *what, const char *after) {
    const char *t = next(l);
    if (t && strcmp(t, what) == 0) return true;
    return fail(l, "expected '%s' after %s, not '%s'", what, after, t ? t : "the end");
}

// A whole number in digits (PyTorch's stoi also takes "12abc" as 12: here it is a mistake).
static bool number(lexer *l, const char *key, uint64_t *out) {
    const char *t = next(l);
    if (!t || !*t || strspn(t, "0123456789") != strlen(t) || strlen(t) > 18)
        return fail(l, "%s expects a whole number, not '%s'", key, t ? t : "nothing");
    *out = strtoull(t, NULL, 10);
    return true;
}

static bool boolean(lexer *l, const char *key, bool *out) {
    const char *t = next(l);
    if (t && (strcmp(t, "True") == 0 || strcmp(t, "False") == 0)) {
        *out = strcmp(t, "True") == 0;
        return true;
    }
    return fail(l, "%s expects True or False, not '%s'", key, t ? t : "nothing");
}

static bool pow2(uint64_t v) { return v && !(v & (v - 1)); }

static bool size_mb(lexer *l, const char *key, uint64_t *out) {
    uint64_t mb = 0;
    if (!expect(l, ":", key) || !number(l, key, &mb)) return false;
    if (mb < CU_LARGE_BUFFER >> 20) return fail(l, "%s must be at least %llu, not %llu", key, CU_LARGE_BUFFER >> 20, (unsigned long long)mb);
    *out = mb > (UINT64_MAX >> 20) ? UINT64_MAX : mb << 20;
    return true;
}

// roundup_power2_divisions:N, or [1:4,64:8,>:16]: sizes in MiB (powers of two) and divisions
// (powers of two or 0). As PyTorch fills it: the first entry also covers the intervals below it,
// and '>' every interval from the previous entry's (that one included) on.
static bool divisions(lexer *l, mp_cuda_conf *c) {
    const char *key = "roundup_power2_divisions";
    uint32_t *d = c->roundup_power2_divisions;
    if (!expect(l, ":", key)) return false;
    if (l->i < l->n && strcmp(l->tok[l->i], "[") != 0) {
        uint64_t v = 0;
        if (!number(l, key, &v)) return false;
        if (!pow2(v) || v > (1u << 20)) return fail(l, "%s must be a power of two, not %llu", key, (unsigned long long)v);
        for (int i = 0; i < MP_CUDA_ROUNDUP_INTERVALS; i++) d[i] = (uint32_t)v;
        return true;
    }
    if (!expect(l, "[", key)) return false;
    bool first = true;
    size_t last = 0;
    for (;;) {
        const char *k = next(l);
        if (!k) return fail(l, "%s: the list is not closed with ']'", key);
        if (strcmp(k, "]") == 0) return true;
        bool rest = strcmp(k, ">") == 0;
        uint64_t mb = 0, v = 0;
        if (!rest) {
            l->i--;
            if (!number(l, key, &mb)) return false;
            if (!pow2(mb)) return fail(l, "%s: the sizes must be powers of two (MiB), not %llu", key, (unsigned long long)mb);
        }
        if (!expect(l, ":", key) || !number(l, key, &v)) return false;
        if (v && (!pow2(v) || v > (1u << 20)))
            return fail(l, "%s: divisions must be powers of two or 0, not %llu", key, (unsigned long long)v);
        if (rest) {
            for (size_t i = last; i < MP_CUDA_ROUNDUP_INTERVALS; i++) d[i] = (uint32_t)v;
        } else {
            size_t idx = (size_t)(63 - __builtin_clzll(mb));
            if (idx > MP_CUDA_ROUNDUP_INTERVALS - 1) idx = MP_CUDA_ROUNDUP_INTERVALS - 1;
            if (first)
                for (size_t i = 0; i < idx; i++) d[i] = (uint32_t)v;
            first = false;
            d[idx] = (uint32_t)v;
            last = idx;
        }
        if (l->i < l->n && strcmp(l->tok[l->i], "]") != 0 && !expect(l, ",", key)) return false;
    }
}

static bool threshold(lexer *l, mp_cuda_conf *c) {
    const char *key = "garbage_collection_threshold";
    if (!expect(l, ":", key)) return false;
    const char *t = next(l);
    char *end = NULL;
    errno = 0;
    double v = t && ((*t >= '0' && *t <= '9') || *t == '.') ? strtod(t, &end) : NAN;
    if (!t || errno || !end || *end || !(v > 0 && v < 1))
        return fail(l, "%s must be a number between 0 and 1 (both excluded), not '%s'", key, t ? t : "nothing");
    c->garbage_collection_threshold = v;
    return true;
}

// One key and its value; false with the message.
static bool item(lexer *l, const char *key, mp_cuda_conf *c) {
    bool ignored_flag;
    uint64_t ignored;
    if (strcmp(key, "max_split_size_mb") == 0) return size_mb(l, key, &c->max_split_size);
    if (strcmp(key, "max_non_split_rounding_mb") == 0) return size_mb(l, key, &c->max_non_split_rounding);
    if (strcmp(key, "garbage_collection_threshold") == 0) return threshold(l, c);
    if (strcmp(key, "roundup_power2_divisions") == 0) return divisions(l, c);
    if (strcmp(key, "expandable_segments") == 0) return expect(l, ":", key) && boolean(l, key, &c->expandable_segments);
    if (strcmp(key, "backend") == 0) {
        const char *v = expect(l, ":", key) ? next(l) : NULL;
        if (v && strcmp(v, "native") == 0) return true;
        if (v && strcmp(v, "cudaMallocAsync") == 0)
            return fail(l, "backend:cudaMallocAsync is CUDA's own allocator, not the caching allocator membill replays");
        return fail(l, "backend must be native or cudaMallocAsync, not '%s'", v ? v : "nothing");
    }
    // settings of pinned host memory and locking: nothing of where device blocks go
    if (strcmp(key, "release_lock_on_cudamalloc") == 0 || strcmp(key, "pinned_use_cuda_host_register") == 0 ||
        strcmp(key, "pinned_use_background_threads") == 0 || strcmp(key, "graph_capture_record_stream_reuse") == 0)
        return expect(l, ":", key) && boolean(l, key, &ignored_flag);
    if (strcmp(key, "pinned_num_register_threads") == 0 || strcmp(key, "pinned_reserve_segment_size_mb") == 0)
        return expect(l, ":", key) && number(l, key, &ignored);
    return fail(l, "unknown option '%s' (PyTorch's are expandable_segments, max_split_size_mb, "
                   "roundup_power2_divisions, garbage_collection_threshold, max_non_split_rounding_mb, backend, ...)",
                key);
}

bool mp_cuda_parse_conf(const char *text, mp_cuda_conf *c, char *err, size_t errlen) {
    static _Thread_local lexer l; // 16 kB: not on the stack
    memset(&l, 0, sizeof l);
    char scratch[8];
    l.err = err && errlen ? err : scratch;
    l.errlen = err && errlen ? errlen : sizeof scratch;
    l.err[0] = 0;
    if (!text) return true;
    mp_cuda_conf out = *c;
    if (!lex(&l, text)) return false;
    while (l.i < l.n) {
        const char *key = next(&l);
        if (strchr(",:[]", key[0]) && !key[1]) return fail(&l, "expected an option name, not '%s'", key);
        if (!item(&l, key, &out)) return false;
        if (l.i < l.n && !expect(&l, ",", key)) return false;
    }
    *c = out;
    return true;
}
