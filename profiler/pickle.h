// Private to the profiler: Python's pickle for plain data only, as torch.cuda.memory's snapshots
// use it. The writer emits protocol 4 as Python's pickle.dump does (framed, memoized); the reader
// accepts only the opcodes of dicts, lists, tuples, strings, numbers, booleans and None, and
// refuses anything else (a class, a call) without running or guessing it.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// ---- writing ----
typedef struct pk_writer pk_writer;
pk_writer *pk_writer_new(FILE *f);
// Finishes the stream (STOP, the last frame) and frees the writer; 0, or -1 if any write failed.
int pk_writer_finish(pk_writer *w);
void pk_dict_begin(pk_writer *w);
void pk_dict_end(pk_writer *w);
void pk_list_begin(pk_writer *w);
void pk_list_end(pk_writer *w);
void pk_key(pk_writer *w, const char *key); // inside a dict: the next value's key
void pk_str(pk_writer *w, const char *s);
void pk_int(pk_writer *w, int64_t v);
void pk_float(pk_writer *w, double v);
void pk_bool(pk_writer *w, bool v);
void pk_pair(pk_writer *w, int64_t a, int64_t b); // a 2-tuple of ints

// ---- reading ----
typedef enum { PK_NONE, PK_BOOL, PK_INT, PK_FLOAT, PK_STR, PK_LIST, PK_DICT } pk_type; // tuples read as lists

typedef struct pk_value pk_value;
struct pk_value {
    pk_type type;
    bool b;
    union {
        int64_t i;
        double f;
    };
    const char *s; // PK_STR: NUL-terminated UTF-8 (a NUL inside refuses the file)
    size_t n;      // items (PK_LIST), pairs (PK_DICT)
    size_t cap;
    pk_value **items, **keys; // PK_DICT: keys[k] maps to items[k]; a later equal key wins
};

typedef struct pk_doc pk_doc;
// Parses data[0..n); NULL with one line in err ("byte N: ...") on anything else, or past
// PK_MAX_VALUES values (about 56 bytes each: a hostile stream of one-byte opcodes cannot take
// the machine's memory).
#define PK_MAX_VALUES ((size_t)16 << 20)
pk_doc *pk_parse(const uint8_t *data, size_t n, char *err, size_t errlen);
const pk_value *pk_root(const pk_doc *d);
void pk_doc_free(pk_doc *d);
// A dict's value under a string key; NULL when absent or when d is not a dict.
const pk_value *pk_get(const pk_value *d, const char *key);
