// Safetensors writer (float32 only: gradients and weights as membill holds them), to a stream,
// or to a path that it replaces only once the new file is complete.
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

// ---- A path replaced only by a complete file ----
// The same rules as the membill command's output files (examples/membill/outputs.c), for one
// file: regular files and new paths are written to a temporary in the target's folder and
// renamed over it (keeping the old file's mode); character devices and FIFOs are written in
// place, never replaced.

typedef int (*emit_fn)(FILE *f, void *arg, ag_err *err);

#define TEMP_NAME_LEN 16 // ".membill-XXXXXX" and its NUL

static void random_name(char name[TEMP_NAME_LEN]) {
    static const char set[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    static unsigned counter;
    unsigned char r[6];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32) ^ (uint64_t)++counter * 0x9e3779b97f4a7c15ULL;
        for (int i = 0; i < 6; i++, x >>= 8) r[i] = (unsigned char)(x ^ (x >> 29));
    }
    memcpy(name, ".membill-", 9);
    for (int i = 0; i < 6; i++) name[9 + i] = set[r[i] % (sizeof set - 1)];
    name[15] = '\0';
}

// A new file in dirfd: unnamed (O_TMPFILE: nothing is left behind whatever happens; name "")
// where the file system has it and /proc can name it later, else a fresh random name.
static int open_temp(int dirfd, char name[TEMP_NAME_LEN]) {
    name[0] = '\0';
    if (access("/proc/self/fd", X_OK) == 0) {
        int fd = openat(dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
        if (fd >= 0) return fd;
    }
    for (int k = 0; k < 100; k++) {
        random_name(name);
        int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

// Gives an O_TMPFILE file a random name in dirfd.
static int link_temp(int fd, int dirfd, char name[TEMP_NAME_LEN]) {
    char proc[40];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    for (int k = 0; k < 100; k++) {
        random_name(name);
        if (linkat(AT_FDCWD, proc, dirfd, name, AT_SYMLINK_FOLLOW) == 0) return 0;
        if (errno == EEXIST) continue;
        if (linkat(fd, "", dirfd, name, AT_EMPTY_PATH) == 0) return 0;
        if (errno != EEXIST) break;
    }
    name[0] = '\0';
    return -1;
}

// path with each symbolic link of its last component followed, a dangling one included (so
// that writing through a link creates its target and keeps the link). malloc'd.
static char *follow_links(const char *path) {
    char *cur = strdup(path);
    for (int hops = 0; cur && hops < 40; hops++) {
        struct stat st;
        char buf[PATH_MAX];
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) return cur;
        ssize_t k = readlink(cur, buf, sizeof buf - 1);
        if (k < 0) return cur;
        buf[k] = '\0';
        const char *slash = strrchr(cur, '/');
        size_t dl = buf[0] == '/' || !slash ? 0 : (size_t)(slash - cur) + 1;
        char *next = malloc(dl + (size_t)k + 1);
        if (next) {
            memcpy(next, cur, dl);
            memcpy(next + dl, buf, (size_t)k + 1);
        }
        free(cur);
        cur = next;
    }
    free(cur);
    return NULL;
}

// Runs fn on f and flushes f; a failure is reported with fn's reason or the stream's.
static int emit(FILE *f, const char *path, emit_fn fn, void *arg, ag_err *err) {
    ag_err inner = {{0}};
    errno = 0;
    int rc = fn(f, arg, &inner), saved = errno;
    if (fflush(f) != 0 && rc == 0) rc = -1, saved = errno;
    if (ferror(f) && rc == 0) rc = -1;
    if (rc == 0) return 0;
    if (inner.msg[0])
        ag_err_set(err, "%s: %s", path, inner.msg);
    else
        ag_err_set(err, "%s: write failed: %s", path, strerror(saved ? saved : EIO));
    return -1;
}

static int write_in_place(const char *path, emit_fn fn, void *arg, ag_err *err) {
    int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) { // swapped for a file since
        close(fd);
        fd = -1;
        errno = EBUSY;
    }
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        ag_err_set(err, "%s: cannot be written: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    int rc = emit(f, path, fn, arg, err);
    if (fclose(f) != 0 && rc == 0) {
        ag_err_set(err, "%s: write failed: %s", path, strerror(errno));
        rc = -1;
    }
    return rc;
}

// The temporary, complete and synced, takes the place of name in dirfd.
static int place(int fd, int dirfd, char tmp[TEMP_NAME_LEN], const char *name) {
    if (!tmp[0] && link_temp(fd, dirfd, tmp) != 0) return -1;
    return renameat(dirfd, tmp, dirfd, name);
}

static int replace_file(const char *path, emit_fn fn, void *arg, ag_err *err) {
    struct stat st;
    bool exists = stat(path, &st) == 0;
    if (!exists && errno != ENOENT) {
        ag_err_set(err, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (exists && S_ISDIR(st.st_mode)) {
        ag_err_set(err, "%s: is a folder, not a file", path);
        return -1;
    }
    if (exists && (S_ISBLK(st.st_mode) || S_ISSOCK(st.st_mode))) {
        ag_err_set(err, "%s: is a block device or a socket, not a file", path);
        return -1;
    }
    if (exists && !S_ISREG(st.st_mode)) return write_in_place(path, fn, arg, err);

    char *target = exists ? realpath(path, NULL) : follow_links(path);
    if (!target) {
        ag_err_set(err, "%s: %s", path, strerror(errno));
        return -1;
    }
    int rc = -1, dirfd = -1, fd = -1;
    char tmp[TEMP_NAME_LEN] = "";
    char *slash = strrchr(target, '/');
    const char *name = slash ? slash + 1 : target, *dir = slash ? target : ".";
    if (slash == target) dir = "/";
    if (!*name || !strcmp(name, ".") || !strcmp(name, "..")) {
        ag_err_set(err, "%s: names a folder, not a file", path);
        goto done;
    }
    if (slash && slash != target) *slash = '\0';
    dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0 && errno == EACCES) dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0) {
        if (errno == ENOENT)
            ag_err_set(err, "%s: the folder %s does not exist", path, dir);
        else
            ag_err_set(err, "%s: the folder %s: %s", path, dir, strerror(errno));
        goto done;
    }
    fd = open_temp(dirfd, tmp);
    if (fd < 0) {
        ag_err_set(err, "%s: cannot create a file beside it: %s", path, strerror(errno));
        goto done;
    }
    if (exists) {
        // The new file is the old one's successor: the same owner (where allowed) and mode.
        if ((st.st_uid != geteuid() || st.st_gid != getegid()) && fchown(fd, st.st_uid, st.st_gid) != 0) {
            // keeps ours: only root may give a file away
        }
        if (fchmod(fd, st.st_mode & 07777) != 0) {
            ag_err_set(err, "%s: cannot keep its mode: %s", path, strerror(errno));
            goto done;
        }
    }
    int dupfd = dup(fd);
    FILE *f = dupfd >= 0 ? fdopen(dupfd, "w") : NULL;
    if (!f) {
        if (dupfd >= 0) close(dupfd);
        ag_err_set(err, "%s: %s", path, strerror(errno));
        goto done;
    }
    rc = emit(f, path, fn, arg, err);
    if (fclose(f) != 0 && rc == 0) {
        ag_err_set(err, "%s: write failed: %s", path, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && fsync(fd) != 0 && errno != EINVAL) {
        ag_err_set(err, "%s: write failed: %s", path, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && place(fd, dirfd, tmp, name) != 0) {
        ag_err_set(err, "%s: cannot be replaced: %s", path, strerror(errno));
        rc = -1;
    }
    if (rc == 0) {
        tmp[0] = '\0'; // it is the target now
        if (fsync(dirfd) != 0) {
            // best effort: an O_PATH folder cannot be synced, and the rename is done
        }
    }
done:
    if (tmp[0]) unlinkat(dirfd, tmp, 0);
    if (fd >= 0) close(fd);
    if (dirfd >= 0) close(dirfd);
    free(target);
    return rc;
}

typedef struct {
    size_t n;
    const char *const *names;
    const int *ndims;
    const int64_t (*shapes)[LLAMA_ST_WRITE_MAX_DIMS];
    const float *const *data;
} st_args;

static int st_emit(FILE *f, void *arg, ag_err *err) {
    const st_args *a = arg;
    return llama_st_write_f32_file(f, a->n, a->names, a->ndims, a->shapes, a->data, err);
}

int llama_st_write_f32(const char *path, size_t n, const char *const *names, const int *ndims,
                       const int64_t (*shapes)[LLAMA_ST_WRITE_MAX_DIMS], const float *const *data, ag_err *err) {
    // A bad tensor list is reported before anything is created.
    size_t hlen;
    ag_err inner = {{0}};
    char *header = build_header(n, names, ndims, shapes, data, &hlen, &inner);
    if (!header) {
        ag_err_set(err, "%s: %s", path, inner.msg);
        return -1;
    }
    free(header);
    st_args a = {n, names, ndims, shapes, data};
    return replace_file(path, st_emit, &a, err);
}
