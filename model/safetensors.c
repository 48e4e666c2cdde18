// Safetensors reader. Layout: 8 bytes little-endian header length N, N bytes of JSON header,
// then the data section; each header entry gives dtype, shape and [begin, end) byte offsets
// into the data. Nothing in the file is trusted: every size and offset is checked before a
// descriptor is handed out. Tensor data is read with pread straight into the caller's buffer,
// so a file that shrinks while open makes a read fail with a message (a mapping would raise
// SIGBUS) and none of the file's pages count in the process's resident set.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "model_internal.h"

// The format's own limit on the header, which also bounds what jansson is asked to parse.
#define ST_HEADER_MAX 100000000ULL

// The most one pread asks for (Linux moves at most 0x7ffff000 bytes a call).
#define ST_READ_CHUNK (1u << 30)

// No descriptor is held between reads: a checkpoint of thousands of shards must open under the
// usual limit on open files. Each read opens the file again and checks that it is the same one.
struct llama_st_file {
    char *path;
    bool on_disk; // opened from path (else from a header alone: no data to read)
    dev_t dev;    // the file that was opened and checked
    ino_t ino;
    uint64_t data_start;      // 8 + header length
    uint64_t data_len;        // bytes after the header when the file was opened
    llama_st_tensor *tensors; // in data order
    size_t n;
    const llama_st_tensor **by_name; // sorted by name
};

static const struct {
    const char *name;
    llama_st_dtype dtype;
    unsigned size;
} dtypes[] = {
    {"F32", LLAMA_ST_F32, 4}, {"F16", LLAMA_ST_F16, 2}, {"BF16", LLAMA_ST_BF16, 2},
    {"I64", LLAMA_ST_I64, 8}, {"I32", LLAMA_ST_I32, 4},
};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])
_Static_assert(NDTYPES == LLAMA_ST_NDTYPES, "model.h counts the dtypes");

const char *llama_st_dtype_name(llama_st_dtype d) {
    for (size_t i = 0; i < NDTYPES; i++)
        if (dtypes[i].dtype == d) return dtypes[i].name;
    return "?";
}

static unsigned dtype_size(llama_st_dtype d) {
    for (size_t i = 0; i < NDTYPES; i++)
        if (dtypes[i].dtype == d) return dtypes[i].size;
    return 0;
}

void llama_format_shape(char *buf, size_t len, const int64_t *shape, int ndim) {
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (used < len) snprintf(buf + used, len - used, "]");
}

static uint64_t load_le(const uint8_t *p, unsigned bytes) {
    uint64_t v = 0;
    for (unsigned i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

// ---------------------------------------------------------------------------------------------
// Header parsing

// A non-negative JSON integer, or -1.
static int64_t json_index(const json_t *v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    return (int64_t)json_integer_value(v);
}

static int parse_dtype(llama_st_tensor *t, const json_t *entry, const char *path, ag_err *err) {
    const json_t *d = json_object_get(entry, "dtype");
    if (!json_is_string(d)) {
        ag_err_set(err, "%s: tensor %s: field dtype missing or not a string", path, t->name);
        return -1;
    }
    for (size_t i = 0; i < NDTYPES; i++) {
        if (strcmp(dtypes[i].name, json_string_value(d)) == 0) {
            t->dtype = dtypes[i].dtype;
            return 0;
        }
    }
    ag_err_set(err, "%s: tensor %s: unsupported dtype \"%s\" (expected F32, BF16, F16, I64 or I32)", path, t->name,
               json_string_value(d));
    return -1;
}

static int parse_shape(llama_st_tensor *t, const json_t *entry, const char *path, ag_err *err) {
    const json_t *s = json_object_get(entry, "shape");
    if (!json_is_array(s) || json_array_size(s) > LLAMA_ST_MAX_DIMS) {
        ag_err_set(err, "%s: tensor %s: field shape must be an array of at most %d integers", path, t->name,
                   LLAMA_ST_MAX_DIMS);
        return -1;
    }
    t->ndim = (int)json_array_size(s);
    t->numel = 1;
    bool overflow = false;
    for (int d = 0; d < t->ndim; d++) {
        t->shape[d] = json_index(json_array_get(s, (size_t)d));
        if (t->shape[d] < 0) {
            ag_err_set(err, "%s: tensor %s: field shape must hold non-negative integers", path, t->name);
            return -1;
        }
        overflow |= __builtin_mul_overflow(t->numel, (uint64_t)t->shape[d], &t->numel);
    }
    unsigned size = dtype_size(t->dtype);
    if (overflow || __builtin_mul_overflow(t->numel, (uint64_t)size, &t->nbytes)) {
        char sh[160];
        llama_format_shape(sh, sizeof sh, t->shape, t->ndim);
        ag_err_set(err, "%s: tensor %s: shape %s is absurd (its byte size overflows 64 bits)", path, t->name, sh);
        return -1;
    }
    return 0;
}

static int parse_offsets(llama_st_tensor *t, const json_t *entry, uint64_t data_len, const char *path, ag_err *err) {
    const json_t *o = json_object_get(entry, "data_offsets");
    int64_t begin = json_index(json_array_get(o, 0)), end = json_index(json_array_get(o, 1));
    if (!json_is_array(o) || json_array_size(o) != 2 || begin < 0 || end < begin) {
        ag_err_set(err,
                   "%s: tensor %s: field data_offsets must be [begin, end] with "
                   "0 <= begin <= end",
                   path, t->name);
        return -1;
    }
    if ((uint64_t)end > data_len) {
        ag_err_set(err,
                   "%s: tensor %s: data_offsets [%lld, %lld] go past the end of the data "
                   "(%llu bytes; is the file truncated?)",
                   path, t->name, (long long)begin, (long long)end, (unsigned long long)data_len);
        return -1;
    }
    t->offset = (uint64_t)begin;
    if ((uint64_t)(end - begin) != t->nbytes) {
        char sh[160];
        llama_format_shape(sh, sizeof sh, t->shape, t->ndim);
        ag_err_set(err,
                   "%s: tensor %s: data_offsets span %llu bytes but shape %s of %s "
                   "needs %llu",
                   path, t->name, (unsigned long long)(end - begin), sh, llama_st_dtype_name(t->dtype),
                   (unsigned long long)t->nbytes);
        return -1;
    }
    return 0;
}

static int parse_entry(llama_st_tensor *t, const char *key, const json_t *entry, uint64_t data_len, const char *path,
                       ag_err *err) {
    if (key[0] == '\0') {
        ag_err_set(err, "%s: a tensor has an empty name", path);
        return -1;
    }
    t->name = strdup(key);
    if (!t->name) {
        ag_err_set(err, "%s: out of memory", path);
        return -1;
    }
    if (!json_is_object(entry)) {
        ag_err_set(err, "%s: tensor %s: expected an object with dtype, shape, data_offsets", path, key);
        return -1;
    }
    if (parse_dtype(t, entry, path, err) != 0 || parse_shape(t, entry, path, err) != 0 ||
        parse_offsets(t, entry, data_len, path, err) != 0)
        return -1;
    return 0;
}

static int by_offset(const void *a, const void *b) {
    const llama_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

// Tensors sorted by offset: a non-empty tensor may not start before the previous one ends.
static int check_overlaps(const llama_st_file *f, ag_err *err) {
    const llama_st_tensor *prev = NULL;
    for (size_t i = 0; i < f->n; i++) {
        const llama_st_tensor *t = &f->tensors[i];
        if (t->nbytes == 0) continue; // occupies no bytes
        if (prev && t->offset < prev->offset + prev->nbytes) {
            ag_err_set(err, "%s: tensors %s and %s overlap (bytes [%llu, %llu) and [%llu, %llu))", f->path, prev->name,
                       t->name, (unsigned long long)prev->offset, (unsigned long long)(prev->offset + prev->nbytes),
                       (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes));
            return -1;
        }
        prev = t;
    }
    return 0;
}

static int by_name_cmp(const void *a, const void *b) {
    return strcmp((*(const llama_st_tensor *const *)a)->name, (*(const llama_st_tensor *const *)b)->name);
}

static int parse_header(llama_st_file *f, const json_t *root, ag_err *err) {
    if (!json_is_object(root)) {
        ag_err_set(err, "%s: header is not a JSON object", f->path);
        return -1;
    }
    size_t n = json_object_size(root) - (json_object_get(root, "__metadata__") ? 1 : 0);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    f->by_name = calloc(n ? n : 1, sizeof *f->by_name);
    if (!f->tensors || !f->by_name) {
        ag_err_set(err, "%s: out of memory", f->path);
        return -1;
    }
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)root, key, value) {
        if (strcmp(key, "__metadata__") == 0) continue;
        if (parse_entry(&f->tensors[f->n++], key, value, f->data_len, f->path, err) != 0) return -1;
    }
    qsort(f->tensors, f->n, sizeof *f->tensors, by_offset);
    if (check_overlaps(f, err) != 0) return -1;
    for (size_t i = 0; i < f->n; i++) f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, f->n, sizeof *f->by_name, by_name_cmp);
    return 0;
}

// Reads len bytes at off into buf, retrying short reads; returns the bytes read (less than len
// only at the end of the file), or -1 with errno set.
static int64_t pread_full(int fd, void *buf, uint64_t len, uint64_t off) {
    uint64_t got = 0;
    while (got < len) {
        uint64_t want = len - got < ST_READ_CHUNK ? len - got : ST_READ_CHUNK;
        ssize_t k = pread(fd, (uint8_t *)buf + got, (size_t)want, (off_t)(off + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) break;
        got += (uint64_t)k;
    }
    return (int64_t)got;
}

static uint64_t current_size(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
}

// ---------------------------------------------------------------------------------------------
// Open and close

// The header length of a file of size bytes, checked: inside the file and within the format's
// limit; sets where the data starts and how long it is.
static int check_header_length(llama_st_file *f, const uint8_t len8[8], uint64_t size, ag_err *err) {
    uint64_t hlen = load_le(len8, 8);
    // JSON where the length should be: most likely an index of shards under another name
    const char *hint = len8[0] == '{' ? " (it starts like JSON: a model.safetensors.index.json? Name it *.json)" : "";
    if (hlen > size - 8) {
        ag_err_set(err, "%s: header length %llu goes past the end of the file (%llu bytes)%s", f->path,
                   (unsigned long long)hlen, (unsigned long long)size, hint);
        return -1;
    }
    if (hlen > ST_HEADER_MAX) {
        ag_err_set(err, "%s: header length %llu is absurd (at most %llu)", f->path, (unsigned long long)hlen,
                   ST_HEADER_MAX);
        return -1;
    }
    f->data_start = 8 + hlen;
    f->data_len = size - 8 - hlen;
    return 0;
}

static int parse_header_text(llama_st_file *f, const char *text, ag_err *err) {
    json_error_t jerr;
    json_t *root = json_loadb(text, (size_t)(f->data_start - 8), JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        ag_err_set(err, "%s: header is not valid JSON (column %d: %s)", f->path, jerr.column, jerr.text);
        return -1;
    }
    int rc = parse_header(f, root, err);
    json_decref(root);
    return rc;
}

static const char too_short[] = "%s: %llu bytes is too short for a safetensors file (8-byte header length first)";

static int read_header(llama_st_file *f, int fd, uint64_t size, ag_err *err) {
    if (size < 8) {
        ag_err_set(err, too_short, f->path, (unsigned long long)size);
        return -1;
    }
    uint8_t len8[8];
    int64_t k = pread_full(fd, len8, 8, 0);
    if (k != 8) {
        ag_err_set(err, "%s: cannot read the header length: %s", f->path,
                   k < 0 ? strerror(errno) : "the file shrank while being opened");
        return -1;
    }
    if (check_header_length(f, len8, size, err) != 0) return -1;
    uint64_t hlen = f->data_start - 8;
    char *text = malloc(hlen ? (size_t)hlen : 1);
    if (!text) {
        ag_err_set(err, "%s: out of memory for a header of %llu bytes", f->path, (unsigned long long)hlen);
        return -1;
    }
    k = pread_full(fd, text, hlen, 8);
    if (k < 0 || (uint64_t)k != hlen) {
        ag_err_set(err, "%s: cannot read the header: %s", f->path,
                   k < 0 ? strerror(errno) : "the file shrank while being opened");
        free(text);
        return -1;
    }
    int rc = parse_header_text(f, text, err);
    free(text);
    return rc;
}

static int open_file(llama_st_file *f, ag_err *err) {
    uint64_t size;
    struct stat st;
    int fd = llama_open_regular(f->path, &size, err);
    if (fd < 0) return -1;
    int rc = fstat(fd, &st) == 0 ? read_header(f, fd, size, err) : (ag_err_set(err, "%s: cannot stat", f->path), -1);
    f->on_disk = rc == 0, f->dev = st.st_dev, f->ino = st.st_ino;
    close(fd);
    return rc;
}

// The file again, for a read: the one opened (a file put in its place since is refused).
static int reopen(const llama_st_file *f, ag_err *err) {
    int fd = llama_open_regular(f->path, NULL, err);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_dev != f->dev || st.st_ino != f->ino)) {
        ag_err_set(err, "%s: another file is at this path since it was opened", f->path);
        close(fd);
        fd = -1;
    }
    return fd;
}

static llama_st_file *st_new(const char *path, ag_err *err) {
    llama_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        ag_err_set(err, "%s: out of memory", path);
        return NULL;
    }
    return f;
}

int llama_st_open_header(llama_st_file **out, const char *name, const void *bytes, size_t len, uint64_t file_size,
                         ag_err *err) {
    *out = NULL;
    llama_st_file *f = st_new(name, err);
    if (!f) return -1;
    int rc = -1;
    if (file_size < 8 || len < 8)
        ag_err_set(err, too_short, name, (unsigned long long)(file_size < len ? file_size : len));
    else if (check_header_length(f, bytes, file_size, err) == 0) {
        if (f->data_start > len)
            ag_err_set(err, "%s: %zu bytes hold only part of the header (%llu bytes)", name, len,
                       (unsigned long long)(f->data_start - 8));
        else
            rc = parse_header_text(f, (const char *)bytes + 8, err);
    }
    if (rc != 0) {
        llama_st_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

int llama_st_open(llama_st_file **out, const char *path, ag_err *err) {
    *out = NULL;
    llama_st_file *f = st_new(path, err);
    if (!f) return -1;
    if (open_file(f, err) != 0) {
        llama_st_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

void llama_st_close(llama_st_file *f) {
    if (!f) return;
    if (f->tensors)
        for (size_t i = 0; i < f->n; i++) free((char *)f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    free(f->path);
    free(f);
}

const char *llama_st_path(const llama_st_file *f) { return f->path; }

size_t llama_st_count(const llama_st_file *f) { return f->n; }

const llama_st_tensor *llama_st_get(const llama_st_file *f, size_t i) { return i < f->n ? &f->tensors[i] : NULL; }

const llama_st_tensor *llama_st_find(const llama_st_file *f, const char *name) {
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const llama_st_tensor *t = f->by_name[mid];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// Reading

// IEEE half to float: every half is exactly a float.
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); // inf, nan (payload kept)
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13); // rebias 15 -> 127
    } else if (man == 0) {
        bits = sign; // +-0
    } else {
        // subnormal half: man * 2^-24; normalise it into a float
        int shift = 0;
        while (!(man & 0x400)) man <<= 1, shift++;
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static float bits_to_float(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static int check_read(const llama_st_file *f, const llama_st_tensor *t, size_t count, ag_err *err) {
    if (t < f->tensors || t >= f->tensors + f->n) {
        ag_err_set(err, "%s: tensor descriptor does not belong to this file", f->path);
        return -1;
    }
    if ((uint64_t)count != t->numel) {
        ag_err_set(err, "%s: tensor %s holds %llu elements, the destination %zu", f->path, t->name,
                   (unsigned long long)t->numel, count);
        return -1;
    }
    return 0;
}

// The tensor's bytes into dst (t->nbytes of them). The file was checked at open to hold them:
// a short read means it shrank since.
static int read_raw(const llama_st_file *f, const llama_st_tensor *t, void *dst, ag_err *err) {
    if (!f->on_disk) {
        ag_err_set(err, "%s: tensor %s: only the header of this file is at hand, not its data", f->path, t->name);
        return -1;
    }
    uint64_t begin = f->data_start + t->offset;
    int fd = reopen(f, err);
    if (fd < 0) return -1;
    int64_t got = pread_full(fd, dst, t->nbytes, begin);
    uint64_t now = current_size(fd);
    int errnum = errno;
    close(fd);
    if (got < 0) {
        ag_err_set(err, "%s: tensor %s: read failed: %s", f->path, t->name, strerror(errnum));
        return -1;
    }
    if ((uint64_t)got != t->nbytes) {
        ag_err_set(err,
                   "%s: tensor %s: the file now ends at byte %llu, inside the tensor's "
                   "bytes [%llu, %llu) (was it truncated while open?)",
                   f->path, t->name, (unsigned long long)now, (unsigned long long)begin,
                   (unsigned long long)(begin + t->nbytes));
        return -1;
    }
    return 0;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ST_HOST_LE 1
#else
#define ST_HOST_LE 0
#endif

int llama_st_read_f32(const llama_st_file *f, const llama_st_tensor *t, float *dst, size_t count, ag_err *err) {
    if (check_read(f, t, count, err) != 0) return -1;
    if (t->dtype != LLAMA_ST_F32 && t->dtype != LLAMA_ST_BF16 && t->dtype != LLAMA_ST_F16) {
        ag_err_set(err, "%s: tensor %s has dtype %s, expected F32, BF16 or F16", f->path, t->name,
                   llama_st_dtype_name(t->dtype));
        return -1;
    }
    if (count == 0) return 0;
    // 16-bit values land in the second half of dst and widen in place from the front: float i
    // (bytes 4i..4i+3) never reaches a value not yet read (bytes 2 count + 2j, j > i).
    uint8_t *raw = (uint8_t *)dst + (t->dtype == LLAMA_ST_F32 ? 0 : 2 * count);
    if (read_raw(f, t, raw, err) != 0) return -1;
    switch (t->dtype) {
    case LLAMA_ST_F32:
        if (!ST_HOST_LE)
            for (size_t i = 0; i < count; i++) dst[i] = bits_to_float((uint32_t)load_le(raw + 4 * i, 4));
        break;
    case LLAMA_ST_BF16: // the top half of a float32
        for (size_t i = 0; i < count; i++) dst[i] = bits_to_float((uint32_t)load_le(raw + 2 * i, 2) << 16);
        break;
    default:
        for (size_t i = 0; i < count; i++) dst[i] = half_to_float((uint16_t)load_le(raw + 2 * i, 2));
        break;
    }
    return 0;
}

int llama_st_read_i64(const llama_st_file *f, const llama_st_tensor *t, int64_t *dst, size_t count, ag_err *err) {
    if (check_read(f, t, count, err) != 0) return -1;
    if (t->dtype != LLAMA_ST_I64 && t->dtype != LLAMA_ST_I32) {
        ag_err_set(err, "%s: tensor %s has dtype %s, expected I64 or I32", f->path, t->name,
                   llama_st_dtype_name(t->dtype));
        return -1;
    }
    if (count == 0) return 0;
    // I32 widens in place from the front, as the 16-bit floats do above
    uint8_t *raw = (uint8_t *)dst + (t->dtype == LLAMA_ST_I64 ? 0 : 4 * count);
    if (read_raw(f, t, raw, err) != 0) return -1;
    if (t->dtype == LLAMA_ST_I64) {
        if (!ST_HOST_LE)
            for (size_t i = 0; i < count; i++) dst[i] = (int64_t)load_le(raw + 8 * i, 8);
    } else {
        for (size_t i = 0; i < count; i++) dst[i] = (int32_t)(uint32_t)load_le(raw + 4 * i, 4);
    }
    return 0;
}
