// Input files: every file membill reads is opened here, so that a FIFO, a device or a folder is
// refused at once, naming what it is, instead of blocking on an open or a read.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"

static const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a folder";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a plain file";
}

int llama_open_regular(const char *path, uint64_t *size, ag_err *err) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        ag_err_set(err, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ag_err_set(err, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        ag_err_set(err, "%s: not a regular file (it is %s)", path, file_kind(st.st_mode));
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (size) *size = (uint64_t)st.st_size;
    return fd;
}

int llama_read_file(const char *path, const char *what, uint64_t max, char **out, size_t *len, ag_err *err) {
    uint64_t size;
    int fd = llama_open_regular(path, &size, err);
    if (fd < 0) return -1;
    if (size > max) {
        ag_err_set(err, "%s: %llu bytes is too large for %s (at most %llu)", path, (unsigned long long)size, what,
                   (unsigned long long)max);
        close(fd);
        return -1;
    }
    size_t got = 0;
    char *buf = malloc((size_t)size + 1);
    if (!buf) {
        ag_err_set(err, "%s: out of memory", path);
        close(fd);
        return -1;
    }
    int errnum = 0;
    while (got < size) {
        ssize_t k = read(fd, buf + got, (size_t)size - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) errnum = errno;
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd);
    if (got != size) {
        ag_err_set(err, "%s: read failed: %s", path, errnum ? strerror(errnum) : "the file shrank while being read");
        free(buf);
        return -1;
    }
    buf[size] = '\0';
    *out = buf;
    *len = (size_t)size;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// --weights PATH

static int join(char *out, size_t len, const char *dir, const char *file, ag_err *err) {
    int k = snprintf(out, len, "%s/%s", dir, file);
    if (k < 0 || (size_t)k >= len) {
        ag_err_set(err, "%s: path too long", dir);
        return -1;
    }
    return 0;
}

// A file the folder must hold: 1 absent, 0 a regular file that opens, -1 anything else (with
// the message: a FIFO, a folder, a device, unreadable).
static int folder_file(const char *path, ag_err *err) {
    struct stat st;
    if (stat(path, &st) != 0 && (errno == ENOENT || errno == ENOTDIR)) return 1;
    int fd = llama_open_regular(path, NULL, err);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}

int llama_weights_resolve(const char *path, char *config_path, char *st_path, size_t len, ag_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) {
        ag_err_set(err, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISREG(st.st_mode)) {
        if (strlen(path) >= len) {
            ag_err_set(err, "%s: path too long", path);
            return -1;
        }
        strcpy(st_path, path);
        if (len) config_path[0] = '\0';
        return 0;
    }
    if (!S_ISDIR(st.st_mode)) {
        ag_err_set(err, "%s: neither a .safetensors file nor a folder (it is %s)", path, file_kind(st.st_mode));
        return -1;
    }
    if (join(config_path, len, path, "config.json", err) != 0 ||
        join(st_path, len, path, "model.safetensors", err) != 0)
        return -1;
    int r = folder_file(config_path, err);
    if (r < 0) return -1;
    if (r > 0) {
        ag_err_set(err, "%s: folder holds no config.json", path);
        return -1;
    }
    // transformers' order: the single file first, else the index of the shards
    r = folder_file(st_path, err);
    if (r < 0) return -1;
    if (r == 0) return 0;
    if (join(st_path, len, path, "model.safetensors.index.json", err) != 0) return -1;
    r = folder_file(st_path, err);
    if (r < 0) return -1;
    if (r > 0) {
        ag_err_set(err, "%s: folder holds no model.safetensors nor model.safetensors.index.json", path);
        return -1;
    }
    return 0;
}
