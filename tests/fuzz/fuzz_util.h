// What the harnesses share: invariants that abort (libFuzzer then saves the input), the
// contract on error messages, and an in-memory file standing for a path.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_REQUIRE(cond)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);                               \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

// A failure leaves one non-empty, printable line that starts with the name of the input.
static inline void fz_check_message(const char *msg, const char *prefix) {
    size_t n = strlen(msg);
    FZ_REQUIRE(n > 0);
    for (size_t i = 0; i < n; i++) FZ_REQUIRE((unsigned char)msg[i] >= 0x20 && msg[i] != 0x7f);
    if (prefix) FZ_REQUIRE(strncmp(msg, prefix, strlen(prefix)) == 0);
}

// One anonymous in-memory file (memfd) for the whole run, rewritten with each input: the code
// under test opens it by name, as it opens a file on disk, with no disk involved.
typedef struct {
    int fd;
    char path[64];
} fz_file;

static inline void fz_file_write(fz_file *f, const uint8_t *data, size_t size) {
    if (f->fd <= 0) {
        f->fd = memfd_create("membill-fuzz", MFD_CLOEXEC);
        FZ_REQUIRE(f->fd >= 0);
        snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
    }
    FZ_REQUIRE(ftruncate(f->fd, 0) == 0);
    size_t done = 0;
    while (done < size) {
        ssize_t k = pwrite(f->fd, data + done, size - done, (off_t)done);
        FZ_REQUIRE(k > 0);
        done += (size_t)k;
    }
}
