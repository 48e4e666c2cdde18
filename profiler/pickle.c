// Python's pickle for plain data: the writer of membill's snapshots and the strict reader of
// anyone's (see pickle.h).
#include "pickle.h"
#include "mp_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

// The opcodes used (Lib/pickle.py's names).
enum {
    OP_MARK = '(',
    OP_STOP = '.',
    OP_BININT = 'J',
    OP_BININT1 = 'K',
    OP_BININT2 = 'M',
    OP_NONE = 'N',
    OP_BINUNICODE = 'X',
    OP_APPEND = 'a',
    OP_DICT = 'd',
    OP_APPENDS = 'e',
    OP_BINGET = 'h',
    OP_LONG_BINGET = 'j',
    OP_LIST = 'l',
    OP_BINPUT = 'q',
    OP_LONG_BINPUT = 'r',
    OP_SETITEM = 's',
    OP_TUPLE = 't',
    OP_SETITEMS = 'u',
    OP_EMPTY_DICT = '}',
    OP_EMPTY_LIST = ']',
    OP_EMPTY_TUPLE = ')',
    OP_BINFLOAT = 'G',
    OP_PROTO = 0x80,
    OP_TUPLE1 = 0x85,
    OP_TUPLE2 = 0x86,
    OP_TUPLE3 = 0x87,
    OP_NEWTRUE = 0x88,
    OP_NEWFALSE = 0x89,
    OP_LONG1 = 0x8a,
    OP_SHORT_BINUNICODE = 0x8c,
    OP_BINUNICODE8 = 0x8d,
    OP_MEMOIZE = 0x94,
    OP_FRAME = 0x95,
};

// ==== writing: protocol 4, framed as Python frames it (frames of at least 64 KiB, cut between
// values), strings memoized once each so that repeated keys cost a BINGET ====

#define FRAME_TARGET 65536
#define BATCH 1000 // items a SETITEMS or APPENDS takes, as Python batches them

typedef struct {
    bool dict;
    size_t items; // items (dict: values) since the open MARK
} pk_level;

typedef struct {
    char *key;
    uint32_t memo;
} pk_memo_entry;

struct pk_writer {
    FILE *f;
    bool failed;
    unsigned char *buf; // the frame being built
    size_t len, cap;
    pk_level levels[32];
    int depth;
    uint32_t memo; // entries memoized so far
    pk_memo_entry *strings;
    size_t nstrings, cap_strings; // open addressing by string
};

static void put(pk_writer *w, const void *p, size_t n) {
    if (w->failed) return;
    if (w->len + n > w->cap) {
        size_t ncap = w->cap ? w->cap : 2 * FRAME_TARGET;
        while (ncap < w->len + n) ncap *= 2;
        unsigned char *b = mp_raw_realloc(w->buf, ncap);
        if (!b) {
            w->failed = true;
            return;
        }
        w->buf = b;
        w->cap = ncap;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

static void op(pk_writer *w, unsigned char c) { put(w, &c, 1); }

static void le(pk_writer *w, uint64_t v, int bytes) {
    unsigned char b[8];
    for (int i = 0; i < bytes; i++) b[i] = (unsigned char)(v >> (8 * i));
    put(w, b, (size_t)bytes);
}

static void flush_frame(pk_writer *w, bool force) {
    if (w->failed || (!force && w->len < FRAME_TARGET) || !w->len) return;
    if (w->len >= 4) { // Python's smallest frame
        unsigned char h[9] = {OP_FRAME};
        for (int i = 0; i < 8; i++) h[1 + i] = (unsigned char)((uint64_t)w->len >> (8 * i));
        if (fwrite(h, 1, 9, w->f) != 9) w->failed = true;
    }
    if (fwrite(w->buf, 1, w->len, w->f) != w->len) w->failed = true;
    w->len = 0;
}

pk_writer *pk_writer_new(FILE *f) {
    pk_writer *w = mp_raw_malloc(sizeof *w);
    if (!w) return NULL;
    memset(w, 0, sizeof *w);
    w->f = f;
    unsigned char proto[2] = {OP_PROTO, 4};
    if (fwrite(proto, 1, 2, f) != 2) w->failed = true;
    return w;
}

int pk_writer_finish(pk_writer *w) {
    if (!w) return -1;
    op(w, OP_STOP);
    flush_frame(w, true);
    bool ok = !w->failed && w->depth == 0;
    for (size_t i = 0; i < w->cap_strings; i++) mp_raw_free(w->strings[i].key);
    mp_raw_free(w->strings);
    mp_raw_free(w->buf);
    mp_raw_free(w);
    return ok ? 0 : -1;
}

static void memoize(pk_writer *w) {
    op(w, OP_MEMOIZE);
    w->memo++;
}

// A value finished inside the container open at this depth: batches close at BATCH items.
static void value_done(pk_writer *w) {
    if (w->depth == 0) return;
    pk_level *l = &w->levels[w->depth - 1];
    if (++l->items == BATCH) {
        op(w, l->dict ? OP_SETITEMS : OP_APPENDS);
        op(w, OP_MARK);
        l->items = 0;
    }
    flush_frame(w, false);
}

static void open_level(pk_writer *w, bool dict) {
    op(w, dict ? OP_EMPTY_DICT : OP_EMPTY_LIST);
    memoize(w);
    if (w->depth == (int)(sizeof w->levels / sizeof w->levels[0])) {
        w->failed = true;
        return;
    }
    w->levels[w->depth++] = (pk_level){dict, 0};
    op(w, OP_MARK);
}

// The batch still open: one item as SETITEM/APPEND needs no MARK, but the MARK is written
// already, so the batch closes with SETITEMS/APPENDS (Python's own output for one item uses
// SETITEM; both read the same).
static void close_level(pk_writer *w) {
    if (w->depth == 0) {
        w->failed = true;
        return;
    }
    pk_level *l = &w->levels[--w->depth];
    op(w, l->dict ? OP_SETITEMS : OP_APPENDS);
    value_done(w);
}

void pk_dict_begin(pk_writer *w) { open_level(w, true); }
void pk_dict_end(pk_writer *w) { close_level(w); }
void pk_list_begin(pk_writer *w) { open_level(w, false); }
void pk_list_end(pk_writer *w) { close_level(w); }

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static pk_memo_entry *string_slot(pk_writer *w, const char *s) {
    if ((w->nstrings + 1) * 2 > w->cap_strings) {
        size_t ncap = w->cap_strings ? w->cap_strings * 2 : 256;
        pk_memo_entry *t = mp_raw_malloc(ncap * sizeof *t);
        if (!t) return NULL;
        memset(t, 0, ncap * sizeof *t);
        for (size_t i = 0; i < w->cap_strings; i++) {
            if (!w->strings[i].key) continue;
            size_t j = hash_str(w->strings[i].key) & (ncap - 1);
            while (t[j].key) j = (j + 1) & (ncap - 1);
            t[j] = w->strings[i];
        }
        mp_raw_free(w->strings);
        w->strings = t;
        w->cap_strings = ncap;
    }
    size_t j = hash_str(s) & (w->cap_strings - 1);
    while (w->strings[j].key && strcmp(w->strings[j].key, s) != 0) j = (j + 1) & (w->cap_strings - 1);
    return &w->strings[j];
}

static void string(pk_writer *w, const char *s) {
    pk_memo_entry *e = string_slot(w, s);
    if (!e) {
        w->failed = true;
        return;
    }
    if (e->key) { // memoized already
        if (e->memo < 256) {
            op(w, OP_BINGET);
            op(w, (unsigned char)e->memo);
        } else {
            op(w, OP_LONG_BINGET);
            le(w, e->memo, 4);
        }
        return;
    }
    size_t n = strlen(s);
    if (n < 256) {
        op(w, OP_SHORT_BINUNICODE);
        op(w, (unsigned char)n);
    } else {
        op(w, OP_BINUNICODE);
        le(w, n, 4);
    }
    put(w, s, n);
    size_t len = n + 1;
    if (!(e->key = mp_raw_malloc(len))) {
        w->failed = true;
        return;
    }
    memcpy(e->key, s, len);
    e->memo = w->memo;
    w->nstrings++;
    memoize(w);
}

void pk_key(pk_writer *w, const char *key) { string(w, key); }

void pk_str(pk_writer *w, const char *s) {
    string(w, s);
    value_done(w);
}

static void integer(pk_writer *w, int64_t v) {
    if (v >= 0 && v < 256) {
        op(w, OP_BININT1);
        op(w, (unsigned char)v);
    } else if (v >= 0 && v < 65536) {
        op(w, OP_BININT2);
        le(w, (uint64_t)v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        op(w, OP_BININT);
        le(w, (uint64_t)(uint32_t)(int32_t)v, 4);
    } else { // LONG1: the fewest little-endian two's complement bytes
        int n = 8;
        while (n > 1) {
            int64_t top = v >> (8 * (n - 1) - 1); // the bits the shorter form would drop, and its sign
            if (top != 0 && top != -1) break;
            n--;
        }
        op(w, OP_LONG1);
        op(w, (unsigned char)n);
        le(w, (uint64_t)v, n);
    }
}

void pk_int(pk_writer *w, int64_t v) {
    integer(w, v);
    value_done(w);
}

void pk_float(pk_writer *w, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    op(w, OP_BINFLOAT);
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(bits >> (8 * (7 - i))); // big-endian
    put(w, b, 8);
    value_done(w);
}

void pk_bool(pk_writer *w, bool v) {
    op(w, v ? OP_NEWTRUE : OP_NEWFALSE);
    value_done(w);
}

void pk_pair(pk_writer *w, int64_t a, int64_t b) {
    integer(w, a);
    integer(w, b);
    op(w, OP_TUPLE2);
    memoize(w);
    value_done(w);
}

// ==== reading ====

#define MAX_MARKS 10000 // nesting of MARKs a snapshot never comes near
#define SLAB 4096         // values a slab holds
#define TEXT_CHUNK (256 * 1024)

// Values live in slabs and strings in chunks, freed together: memo references share values,
// and no value is freed alone.
typedef struct pk_slab {
    struct pk_slab *next;
    size_t used;
    pk_value v[SLAB];
} pk_slab;

typedef struct pk_text {
    struct pk_text *next;
    size_t used, cap;
    char data[];
} pk_text;

struct pk_doc {
    pk_slab *slabs;
    pk_text *texts;
    size_t nvalues;
    pk_value *root;
    pk_value none, yes, no, small_ints[256]; // shared: immutable
};

typedef struct {
    const uint8_t *p;
    size_t n, at;
    pk_doc *doc;
    pk_value **stack;
    size_t sp, cap_stack;
    size_t *marks;
    size_t nmarks, cap_marks;
    pk_value **memo;
    size_t nmemo, cap_memo;
    char *err;
    size_t errlen;
    size_t op_at; // where the opcode being read began
} pk_reader;

static bool bad(pk_reader *r, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(r->err, r->errlen, "byte %zu: %s", r->op_at, msg);
    return false;
}

static bool grow(void **v, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need) ncap *= 2;
    void *nv = mp_raw_realloc(*v, ncap * elem);
    if (!nv) return false;
    *v = nv;
    *cap = ncap;
    return true;
}

static pk_value *make(pk_reader *r, pk_type t) {
    pk_doc *d = r->doc;
    if (d->nvalues >= PK_MAX_VALUES) return NULL;
    if (!d->slabs || d->slabs->used == SLAB) {
        pk_slab *s = mp_raw_malloc(sizeof *s);
        if (!s) return NULL;
        s->used = 0;
        s->next = d->slabs;
        d->slabs = s;
    }
    pk_value *v = &d->slabs->v[d->slabs->used++];
    memset(v, 0, sizeof *v);
    v->type = t;
    d->nvalues++;
    return v;
}

static char *text(pk_doc *d, size_t len) {
    if (!d->texts || d->texts->cap - d->texts->used < len + 1) {
        size_t cap = len + 1 > TEXT_CHUNK ? len + 1 : TEXT_CHUNK;
        pk_text *t = mp_raw_malloc(sizeof *t + cap);
        if (!t) return NULL;
        t->used = 0;
        t->cap = cap;
        t->next = d->texts;
        d->texts = t;
    }
    char *s = d->texts->data + d->texts->used;
    d->texts->used += len + 1;
    return s;
}

static bool push(pk_reader *r, pk_value *v) {
    if (!v && r->doc->nvalues >= PK_MAX_VALUES)
        return bad(r, "more than %zu values: not a memory snapshot membill reads", PK_MAX_VALUES);
    if (!v) return bad(r, "out of memory");
    if (!grow((void **)&r->stack, &r->cap_stack, r->sp + 1, sizeof *r->stack)) return bad(r, "out of memory");
    r->stack[r->sp++] = v;
    return true;
}

static bool need(pk_reader *r, size_t k) {
    if (r->n - r->at < k) return bad(r, "the stream ends inside an opcode (a truncated file)");
    return true;
}

static uint64_t read_le(pk_reader *r, int k) {
    uint64_t v = 0;
    for (int i = 0; i < k; i++) v |= (uint64_t)r->p[r->at + (size_t)i] << (8 * i);
    r->at += (size_t)k;
    return v;
}

static bool append_item(pk_reader *r, pk_value *list, pk_value *v) {
    if (!grow((void **)&list->items, &list->cap, list->n + 1, sizeof *list->items)) return bad(r, "out of memory");
    list->items[list->n++] = v;
    return true;
}

// Appended even when the key is there already: lookups take the last (Python's later value).
static bool set_item(pk_reader *r, pk_value *d, pk_value *k, pk_value *v) {
    if (k->type != PK_STR && k->type != PK_INT && k->type != PK_BOOL && k->type != PK_NONE)
        return bad(r, "a dict key that is not a string or a number");
    size_t cap = d->cap;
    if (!grow((void **)&d->items, &cap, d->n + 1, sizeof *d->items) ||
        !grow((void **)&d->keys, &d->cap, d->n + 1, sizeof *d->keys))
        return bad(r, "out of memory");
    d->keys[d->n] = k;
    d->items[d->n++] = v;
    return true;
}

static size_t pop_mark(pk_reader *r, bool *ok) {
    if (!r->nmarks) {
        *ok = bad(r, "no MARK before it");
        return 0;
    }
    *ok = true;
    return r->marks[--r->nmarks];
}

static bool string_op(pk_reader *r, uint64_t len) {
    if (len > r->n - r->at) return bad(r, "a string of %llu bytes past the end of the file", (unsigned long long)len);
    if (memchr(r->p + r->at, 0, len)) return bad(r, "a string holding a NUL byte");
    pk_value *v = make(r, PK_STR);
    char *s = v ? text(r->doc, (size_t)len) : NULL;
    if (!s) return push(r, NULL);
    memcpy(s, r->p + r->at, len);
    s[len] = 0;
    v->s = s;
    v->n = len;
    r->at += len;
    return push(r, v);
}

static bool int_op(pk_reader *r, int64_t i) {
    if (i >= 0 && i < 256) return push(r, &r->doc->small_ints[i]);
    pk_value *v = make(r, PK_INT);
    if (v) v->i = i;
    return push(r, v);
}

static bool memo_put(pk_reader *r, uint64_t idx) {
    if (!r->sp) return bad(r, "nothing on the stack to memoize");
    // indices come in order (MEMOIZE) or close to it (BINPUT): never past the values made
    if (idx > r->doc->nvalues + 256) return bad(r, "a memo index (%llu) past every value made", (unsigned long long)idx);
    if (!grow((void **)&r->memo, &r->cap_memo, (size_t)idx + 1, sizeof *r->memo)) return bad(r, "out of memory");
    while (r->nmemo <= idx) r->memo[r->nmemo++] = NULL;
    r->memo[idx] = r->stack[r->sp - 1];
    return true;
}

static bool memo_get(pk_reader *r, uint64_t idx) {
    if (idx >= r->nmemo || !r->memo[idx]) return bad(r, "a memo index (%llu) never stored", (unsigned long long)idx);
    return push(r, r->memo[idx]);
}

// Items from the mark to the top into a list (a tuple reads as one).
static bool collect(pk_reader *r, size_t from) {
    pk_value *l = make(r, PK_LIST);
    if (!l) return push(r, NULL);
    for (size_t i = from; i < r->sp; i++)
        if (!append_item(r, l, r->stack[i])) return false;
    r->sp = from;
    return push(r, l);
}

static const char *op_name(int c) {
    switch (c) {
    case 'c': return "GLOBAL (a class or function by name)";
    case 0x93: return "STACK_GLOBAL (a class or function by name)";
    case 'R': return "REDUCE (a call)";
    case 'b': return "BUILD (an object's state)";
    case 'i': return "INST (an object)";
    case 'o': return "OBJ (an object)";
    case 0x81: return "NEWOBJ (an object)";
    case 0x92: return "NEWOBJ_EX (an object)";
    case 'P':
    case 'Q': return "PERSID (a persistent reference)";
    case 0x82:
    case 0x83:
    case 0x84: return "EXT (a registered class)";
    default: return NULL;
    }
}

static bool step(pk_reader *r, bool *stop) {
    r->op_at = r->at;
    int c = r->p[r->at++];
    bool ok = true;
    size_t m;
    pk_value *v;
    switch (c) {
    case OP_PROTO:
        if (!need(r, 1)) return false;
        if (r->p[r->at] < 2 || r->p[r->at] > 5) return bad(r, "pickle protocol %d (2 to 5 are read)", r->p[r->at]);
        r->at++;
        return true;
    case OP_FRAME:
        if (!need(r, 8)) return false;
        if (read_le(r, 8) > r->n - r->at) return bad(r, "a frame longer than the rest of the file (truncated)");
        return true;
    case OP_STOP:
        if (r->sp != 1 || r->nmarks) return bad(r, "STOP with %zu values on the stack", r->sp);
        *stop = true;
        return true;
    case OP_MARK:
        if (r->nmarks >= MAX_MARKS) return bad(r, "marks nested deeper than %d", MAX_MARKS);
        if (!grow((void **)&r->marks, &r->cap_marks, r->nmarks + 1, sizeof *r->marks)) return bad(r, "out of memory");
        r->marks[r->nmarks++] = r->sp;
        return true;
    case OP_EMPTY_DICT: return push(r, make(r, PK_DICT));
    case OP_EMPTY_LIST:
    case OP_EMPTY_TUPLE: return push(r, make(r, PK_LIST));
    case OP_NONE: return push(r, &r->doc->none);
    case OP_NEWTRUE: return push(r, &r->doc->yes);
    case OP_NEWFALSE: return push(r, &r->doc->no);
    case OP_BININT1:
        if (!need(r, 1)) return false;
        return int_op(r, (int64_t)read_le(r, 1));
    case OP_BININT2:
        if (!need(r, 2)) return false;
        return int_op(r, (int64_t)read_le(r, 2));
    case OP_BININT:
        if (!need(r, 4)) return false;
        return int_op(r, (int64_t)(int32_t)(uint32_t)read_le(r, 4));
    case OP_LONG1: {
        if (!need(r, 1)) return false;
        int k = r->p[r->at++];
        if (k > 8) return bad(r, "an integer of %d bytes (more than 64 bits)", k);
        if (!need(r, (size_t)k)) return false;
        uint64_t u = read_le(r, k);
        if (k && k < 8 && (u >> (8 * k - 1)) & 1) u |= ~0ULL << (8 * k); // sign
        return int_op(r, (int64_t)u);
    }
    case OP_BINFLOAT: {
        if (!need(r, 8)) return false;
        uint64_t bits = 0;
        for (int i = 0; i < 8; i++) bits = bits << 8 | r->p[r->at++];
        if ((v = make(r, PK_FLOAT))) memcpy(&v->f, &bits, sizeof v->f);
        return push(r, v);
    }
    case OP_SHORT_BINUNICODE:
        if (!need(r, 1)) return false;
        return string_op(r, read_le(r, 1));
    case OP_BINUNICODE:
        if (!need(r, 4)) return false;
        return string_op(r, read_le(r, 4));
    case OP_BINUNICODE8:
        if (!need(r, 8)) return false;
        return string_op(r, read_le(r, 8));
    case OP_MEMOIZE: return memo_put(r, r->nmemo);
    case OP_BINPUT:
        if (!need(r, 1)) return false;
        return memo_put(r, read_le(r, 1));
    case OP_LONG_BINPUT:
        if (!need(r, 4)) return false;
        return memo_put(r, read_le(r, 4));
    case OP_BINGET:
        if (!need(r, 1)) return false;
        return memo_get(r, read_le(r, 1));
    case OP_LONG_BINGET:
        if (!need(r, 4)) return false;
        return memo_get(r, read_le(r, 4));
    case OP_APPEND:
        if (r->sp < 2 || r->stack[r->sp - 2]->type != PK_LIST) return bad(r, "APPEND without a list under its value");
        if (r->nmarks && r->marks[r->nmarks - 1] > r->sp - 2) return bad(r, "APPEND across a MARK");
        r->sp--;
        return append_item(r, r->stack[r->sp - 1], r->stack[r->sp]);
    case OP_APPENDS:
        m = pop_mark(r, &ok);
        if (!ok) return false;
        if (m < 1 || r->stack[m - 1]->type != PK_LIST) return bad(r, "APPENDS without a list under its MARK");
        for (size_t i = m; i < r->sp; i++)
            if (!append_item(r, r->stack[m - 1], r->stack[i])) return false;
        r->sp = m;
        return true;
    case OP_SETITEM:
        if (r->sp < 3 || r->stack[r->sp - 3]->type != PK_DICT) return bad(r, "SETITEM without a dict under its pair");
        if (r->nmarks && r->marks[r->nmarks - 1] > r->sp - 3) return bad(r, "SETITEM across a MARK");
        r->sp -= 2;
        return set_item(r, r->stack[r->sp - 1], r->stack[r->sp], r->stack[r->sp + 1]);
    case OP_SETITEMS:
        m = pop_mark(r, &ok);
        if (!ok) return false;
        if (m < 1 || r->stack[m - 1]->type != PK_DICT) return bad(r, "SETITEMS without a dict under its MARK");
        if ((r->sp - m) % 2) return bad(r, "SETITEMS with a key and no value");
        for (size_t i = m; i < r->sp; i += 2)
            if (!set_item(r, r->stack[m - 1], r->stack[i], r->stack[i + 1])) return false;
        r->sp = m;
        return true;
    case OP_DICT:
        m = pop_mark(r, &ok);
        if (!ok) return false;
        if ((r->sp - m) % 2) return bad(r, "DICT with a key and no value");
        if (!(v = make(r, PK_DICT))) return push(r, NULL);
        for (size_t i = m; i < r->sp; i += 2)
            if (!set_item(r, v, r->stack[i], r->stack[i + 1])) return false;
        r->sp = m;
        return push(r, v);
    case OP_LIST:
    case OP_TUPLE:
        m = pop_mark(r, &ok);
        return ok && collect(r, m);
    case OP_TUPLE1:
    case OP_TUPLE2:
    case OP_TUPLE3: {
        size_t k = (size_t)(c - OP_TUPLE1 + 1);
        if (r->sp < k || (r->nmarks && r->marks[r->nmarks - 1] > r->sp - k)) return bad(r, "a tuple of missing items");
        return collect(r, r->sp - k);
    }
    default: break;
    }
    const char *name = op_name(c);
    if (name) return bad(r, "opcode %s: a snapshot holds only dicts, lists, strings and numbers; refused, not run", name);
    return bad(r, "opcode 0x%02x is not one a memory snapshot uses", c);
}

pk_doc *pk_parse(const uint8_t *data, size_t n, char *err, size_t errlen) {
    char scratch[8];
    pk_reader r = {.p = data, .n = n, .err = err && errlen ? err : scratch, .errlen = err && errlen ? errlen : sizeof scratch};
    r.err[0] = 0;
    pk_doc *d = mp_raw_malloc(sizeof *d);
    if (!d) {
        snprintf(r.err, r.errlen, "out of memory");
        return NULL;
    }
    memset(d, 0, sizeof *d);
    d->yes.type = d->no.type = PK_BOOL;
    d->yes.b = true;
    for (int i = 0; i < 256; i++) d->small_ints[i] = (pk_value){.type = PK_INT, .i = i};
    r.doc = d;
    bool stop = false, ok = true;
    while (ok && !stop) {
        if (r.at >= r.n) {
            r.op_at = r.at;
            ok = bad(&r, "the stream ends before STOP (a truncated file)");
            break;
        }
        ok = step(&r, &stop);
    }
    if (ok && r.at != r.n) {
        r.op_at = r.at;
        ok = bad(&r, "%zu bytes after STOP", r.n - r.at);
    }
    if (ok) d->root = r.stack[0];
    mp_raw_free(r.stack);
    mp_raw_free(r.marks);
    mp_raw_free(r.memo);
    if (!ok) {
        pk_doc_free(d);
        return NULL;
    }
    return d;
}

const pk_value *pk_root(const pk_doc *d) { return d ? d->root : NULL; }

void pk_doc_free(pk_doc *d) {
    if (!d) return;
    for (pk_slab *s = d->slabs, *next; s; s = next) {
        next = s->next;
        for (size_t i = 0; i < s->used; i++) {
            mp_raw_free(s->v[i].items);
            mp_raw_free(s->v[i].keys);
        }
        mp_raw_free(s);
    }
    for (pk_text *t = d->texts, *next; t; t = next) {
        next = t->next;
        mp_raw_free(t);
    }
    mp_raw_free(d);
}

const pk_value *pk_get(const pk_value *d, const char *key) {
    if (!d || d->type != PK_DICT) return NULL;
    for (size_t i = d->n; i-- > 0;)
        if (d->keys[i]->type == PK_STR && strcmp(d->keys[i]->s, key) == 0) return d->items[i];
    return NULL;
}
