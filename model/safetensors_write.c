// Safetensors writer (float32 only: gradients and weights as membill holds them), to a stream.
// Where the file lands, and that a failed run never damages one, is the caller's (the
// membill command's output files).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "model.h"

#define WRITE_CHUNK 16384 // floats converted per write

// Checks tensor i and adds its header entry at *offset, which it advances.
static int add_entry(json_t *root, const char *name, int ndim, const int64_t *shape, const float *data,
                     uint64_t *offset, ag_err *err) {
    if (!name || !name[0] || strcmp(name, "__metadata__") == 0) {
        ag_err_set(err, "a tensor has an empty or reserved name");
        return -1;
    }
    if (json_object_get(root, name)) {
        ag_err_set(err, "tensor %s is given twice", name);
        return -1;
    }
    if (ndim < 0 || ndim > LLAMA_ST_WRITE_MAX_DIMS) {
        ag_err_set(err, "tensor %s: ndim %d (expected 0 to %d)", name, ndim, LLAMA_ST_WRITE_MAX_DIMS);
        return -1;
    }
    uint64_t numel = 1, nbytes, end;
    bool bad = false;
    json_t *jshape = json_array();
    for (int d = 0; d < ndim; d++) {
        bad |= shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)shape[d], &numel);
        json_array_append_new(jshape, json_integer(shape[d]));
    }
    if (bad || __builtin_mul_overflow(numel, 4, &nbytes) || __builtin_add_overflow(*offset, nbytes, &end) ||
        end > INT64_MAX) {
        json_decref(jshape);
        ag_err_set(err, "tensor %s: negative or absurd shape", name);
        return -1;
    }
    if (numel && !data) {
        json_decref(jshape);
        ag_err_set(err, "tensor %s: no data", name);
        return -1;
    }
    json_t *entry = json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", jshape, "data_offsets",
                              (json_int_t)*offset, (json_int_t)end);
    if (!entry || json_object_set_new(root, name, entry) != 0) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    *offset = end;
    return 0;
}

// The header text, padded with spaces so that the data starts 8-byte aligned.
static char *build_header(size_t n, const char *const *names, const int *ndims,
                          const int64_t (*shapes)[LLAMA_ST_WRITE_MAX_DIMS], const float *const *data, size_t *len,
                          ag_err *err) {
    json_t *root = json_pack("{s:{s:s}}", "__metadata__", "format", "pt");
    uint64_t offset = 0;
    for (size_t i = 0; root && i < n; i++) {
        if (add_entry(root, names[i], ndims[i], shapes[i], data[i], &offset, err) != 0) {
            json_decref(root);
            return NULL;
        }
    }
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    size_t raw = text ? strlen(text) : 0, padded = (raw + 7) / 8 * 8;
    char *out = text ? realloc(text, padded + 1) : NULL;
    if (!out) {
        free(text);
        ag_err_set(err, "out of memory");
        return NULL;
    }
    memset(out + raw, ' ', padded - raw);
    out[padded] = '\0';
    *len = padded;
    return out;
}

static int write_all(FILE *f, const void *buf, size_t len) {
    if (len && fwrite(buf, 1, len, f) != len) {
        if (!errno) errno = EIO;
        return -1;
    }
    return 0;
}

// Little-endian float32, whatever the host's byte order.
static int write_floats(FILE *f, const float *x, uint64_t count) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return write_all(f, x, (size_t)count * 4); // already the file's byte order
#else
    unsigned char buf[WRITE_CHUNK * 4];
    while (count) {
        size_t m = count < WRITE_CHUNK ? (size_t)count : WRITE_CHUNK;
        for (size_t i = 0; i < m; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            for (int b = 0; b < 4; b++) buf[4 * i + (size_t)b] = (unsigned char)(u >> (8 * b));
        }
        if (write_all(f, buf, m * 4) != 0) return -1;
        x += m;
        count -= m;
    }
    return 0;
#endif
}

static int write_body(FILE *f, const char *header, size_t hlen, size_t n, const int *ndims,
                      const int64_t (*shapes)[LLAMA_ST_WRITE_MAX_DIMS], const float *const *data) {
    unsigned char len8[8];
    for (int b = 0; b < 8; b++) len8[b] = (unsigned char)((uint64_t)hlen >> (8 * b));
    if (write_all(f, len8, 8) != 0 || write_all(f, header, hlen) != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < ndims[i]; d++) numel *= (uint64_t)shapes[i][d]; // checked in header
        if (numel && write_floats(f, data[i], numel) != 0) return -1;
    }
    return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}

int llama_st_write_f32_file(FILE *f, size_t n, const char *const *names, const int *ndims,
                            const int64_t (*shapes)[LLAMA_ST_WRITE_MAX_DIMS], const float *const *data, ag_err *err) {
    size_t hlen;
    char *header = build_header(n, names, ndims, shapes, data, &hlen, err);
    if (!header) return -1;
    errno = 0;
    int rc = write_body(f, header, hlen, n, ndims, shapes, data);
    if (rc != 0) ag_err_set(err, "write failed: %s", strerror(errno ? errno : EIO));
    free(header);
    return rc;
}
