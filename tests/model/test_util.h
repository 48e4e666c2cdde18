// Helpers shared by the model tests: a scratch folder, raw files, and message checks.
#pragma once

#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

// A fresh folder under $TMPDIR (or /tmp); removed by tu_rmtree.
static inline char *tu_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    char *dir = malloc(4096);
    assert_non_null(dir);
    snprintf(dir, 4096, "%s/membill_model_XXXXXX", base && base[0] ? base : "/tmp");
    assert_non_null(mkdtemp(dir));
    return dir;
}

// Removes dir and what it holds (files and empty folders one level down).
static inline void tu_rmtree(char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    char p[8192];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) != 0) rmdir(p);
    }
    closedir(d);
    assert_int_equal(rmdir(dir), 0);
    free(dir);
}

// A safetensors file at path through the stream writer (tests own their folders: no staging).
static inline int tu_write_f32(const char *path, size_t n, const char *const *names, const int *ndims,
                               const int64_t (*shapes)[LLAMA_ST_WRITE_MAX_DIMS], const float *const *data,
                               ag_err *err) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        ag_err_set(err, "%s: cannot write", path);
        return -1;
    }
    int rc = llama_st_write_f32_file(f, n, names, ndims, shapes, data, err);
    return fclose(f) != 0 ? -1 : rc;
}

static inline size_t tu_count_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static inline void tu_path(char *out, size_t len, const char *dir, const char *file) {
    int k = snprintf(out, len, "%s/%s", dir, file);
    assert_true(k > 0 && (size_t)k < len);
}

static inline void tu_write(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

// The whole file; *len gets its size.
static inline unsigned char *tu_read(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    assert_true(size >= 0);
    rewind(f);
    unsigned char *buf = malloc((size_t)size + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    *len = (size_t)size;
    return buf;
}

// A safetensors file from its parts: the stated header length (which may lie), the header
// text, and data_len bytes of data (when data is NULL, byte i holds i & 0xff).
static inline void tu_write_st(const char *path, uint64_t stated_len, const char *header, const void *data,
                               size_t data_len) {
    size_t hlen = strlen(header);
    unsigned char *buf = malloc(8 + hlen + data_len + 1);
    assert_non_null(buf);
    for (int b = 0; b < 8; b++) buf[b] = (unsigned char)(stated_len >> (8 * b));
    memcpy(buf + 8, header, hlen);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hlen + i] = data ? ((const unsigned char *)data)[i] : (unsigned char)i;
    tu_write(path, buf, 8 + hlen + data_len);
    free(buf);
}

// v as little-endian bytes.
static inline void tu_put_le(unsigned char *p, uint64_t v, int bytes) {
    for (int b = 0; b < bytes; b++) p[b] = (unsigned char)(v >> (8 * b));
}

static inline uint64_t tu_get_le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int b = 0; b < bytes; b++) v |= (uint64_t)p[b] << (8 * b);
    return v;
}

// Fails, showing the message, unless msg holds every one of the NULL-terminated needles.
static inline void tu_mentions(const char *msg, ...) {
    va_list ap;
    va_start(ap, msg);
    const char *needle;
    while ((needle = va_arg(ap, const char *))) {
        if (!strstr(msg, needle)) {
            print_error("message \"%s\" does not mention \"%s\"\n", msg, needle);
            va_end(ap);
            fail();
        }
    }
    va_end(ap);
}

#define TU_MENTIONS(msg, ...) tu_mentions((msg), __VA_ARGS__, (const char *)NULL)

// Character devices to give where a file is expected: those of /dev/null, /dev/zero, /dev/full
// that are one here (a program run as root that renames a file over /dev/null turns it into a
// regular file). NULL-terminated; fails unless there is at least one.
static inline const char *const *tu_char_devices(void) {
    static const char *const all[] = {"/dev/null", "/dev/zero", "/dev/full"};
    static const char *found[4];
    size_t n = 0;
    for (size_t i = 0; i < 3; i++) {
        struct stat st;
        if (stat(all[i], &st) == 0 && S_ISCHR(st.st_mode))
            found[n++] = all[i];
        else
            print_message("%s is not a character device here: left out\n", all[i]);
    }
    found[n] = NULL;
    assert_true(n > 0);
    return found;
}
