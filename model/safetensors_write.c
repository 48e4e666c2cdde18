// Safetensors writer (float32 only: gradients and weights as membill holds them). The file is
// assembled under a temporary name beside the target and renamed over it only once complete,
// so a failure at any point leaves the target as it was and no partial file behind.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "model.h"

#define WRITE_CHUNK 16384 // floats converted per write

// Checks tensor i and adds its header entry at *offset, which it advances.
static int add_entry(json_t *root, const char *path, const char *name, int ndim,
                     const int64_t *shape, const float *data, uint64_t *offset, ag_err *err) {
    if (!name || !name[0] || strcmp(name, "__metadata__") == 0) {
        ag_err_set(err, "%s: a tensor has an empty or reserved name", path);
        return -1;
    }
    if (json_object_get(root, name)) {
        ag_err_set(err, "%s: tensor %s is given twice", path, name);
        return -1;
    }
    if (ndim < 0 || ndim > LLAMA_ST_WRITE_MAX_DIMS) {
        ag_err_set(err, "%s: tensor %s: ndim %d (expected 0 to %d)", path, name, ndim,
                      LLAMA_ST_WRITE_MAX_DIMS);
        return -1;
    }
    uint64_t numel = 1, nbytes, end;
    bool bad = false;
    json_t *jshape = json_array();
    for (int d = 0; d < ndim; d++) {
        bad |= shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)shape[d], &numel);
        json_array_append_new(jshape, json_integer(shape[d]));
    }
    if (bad || __builtin_mul_overflow(numel, 4, &nbytes) ||
        __builtin_add_overflow(*offset, nbytes, &end) || end > INT64_MAX) {
        json_decref(jshape);
        ag_err_set(err, "%s: tensor %s: negative or absurd shape", path, name);
        return -1;
    }
    if (numel && !data) {
        json_decref(jshape);
        ag_err_set(err, "%s: tensor %s: no data", path, name);
        return -1;
    }
    json_t *entry = json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", jshape,
                              "data_offsets", (json_int_t)*offset, (json_int_t)end);
    if (!entry || json_object_set_new(root, name, entry) != 0) {
        ag_err_set(err, "%s: out of memory", path);
        return -1;
    }
    *offset = end;
    return 0;
}

// The header text, padded with spaces so that the data starts 8-byte aligned.
static char *build_header(const char *path, size_t n, const char *const *names, const int *ndims,
                          const int64_t (*shapes)[LLAMA_ST_WRITE_MAX_DIMS],
                          const float *const *data, size_t *len, ag_err *err) {
    json_t *root = json_pack("{s:{s:s}}", "__metadata__", "format", "pt");
    uint64_t offset = 0;
    for (size_t i = 0; root && i < n; i++) {
        if (add_entry(root, path, names[i], ndims[i], shapes[i], data[i], &offset, err) != 0) {
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
        ag_err_set(err, "%s: out of memory", path);
        return NULL;
    }
    memset(out + raw, ' ', padded - raw);
    out[padded] = '\0';
    *len = padded;
    return out;
}

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t k = write(fd, p, len);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) {
            errno = EIO;
            return -1;
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

// Little-endian float32, whatever the host's byte order.
static int write_floats(int fd, const float *x, uint64_t count) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return write_all(fd, x, (size_t)count * 4); // already the file's byte order
#else
    unsigned char buf[WRITE_CHUNK * 4];
    while (count) {
        size_t m = count < WRITE_CHUNK ? (size_t)count : WRITE_CHUNK;
        for (size_t i = 0; i < m; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            for (int b = 0; b < 4; b++) buf[4 * i + (size_t)b] = (unsigned char)(u >> (8 * b));
        }
        if (write_all(fd, buf, m * 4) != 0) return -1;
        x += m;
        count -= m;
    }
    return 0;
#endif
}

static int write_body(int fd, const char *header, size_t hlen, size_t n, const int *ndims,
                      const int64_t (*shapes)[LLAMA_ST_WRITE_MAX_DIMS], const float *const *data) {
    unsigned char len8[8];
    for (int b = 0; b < 8; b++) len8[b] = (unsigned char)((uint64_t)hlen >> (8 * b));
    if (write_all(fd, len8, 8) != 0 || write_all(fd, header, hlen) != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < ndims[i]; d++) numel *= (uint64_t)shapes[i][d]; // checked in header
        if (numel && write_floats(fd, data[i], numel) != 0) return -1;
    }
    return 0;
}

// A fresh file beside path; its name goes to tmp.
static int open_temp(const char *path, char *tmp, size_t len) {
    for (int k = 0; k < 100; k++) {
        int w = snprintf(tmp, len, "%s.tmp-%ld-%d", path, (long)getpid(), k);
        if (w < 0 || (size_t)w >= len) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

int llama_st_write_f32(const char *path, size_t n, const char *const *names, const int *ndims,
                       const int64_t (*shapes)[LLAMA_ST_WRITE_MAX_DIMS],
                       const float *const *data, ag_err *err) {
    size_t hlen;
    char *header = build_header(path, n, names, ndims, shapes, data, &hlen, err);
    if (!header) return -1;
    size_t tlen = strlen(path) + 64;
    char *tmp = malloc(tlen);
    int fd = tmp ? open_temp(path, tmp, tlen) : -1;
    if (fd < 0) {
        ag_err_set(err, "%s: cannot create a file beside it: %s", path,
                      tmp ? strerror(errno) : "out of memory");
        free(header);
        free(tmp);
        return -1;
    }
    int rc = write_body(fd, header, hlen, n, ndims, shapes, data);
    int saved = errno;
    if (close(fd) != 0 && rc == 0) rc = -1, saved = errno;
    if (rc == 0 && rename(tmp, path) != 0) rc = -1, saved = errno;
    if (rc != 0) {
        unlink(tmp);
        ag_err_set(err, "%s: write failed: %s", path, strerror(saved));
    }
    free(header);
    free(tmp);
    return rc;
}
