// The command's output files as one transaction (outputs.h). Regular files and new paths are
// staged in a temporary beside their target and renamed over it at commit; everything else a
// path can name (standard streams, character devices, FIFOs) is written in place, because
// renaming over /dev/null or a pipe would destroy it.
#include "outputs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#define TEMP_NAME_LEN 16 // ".membill-XXXXXX" and its NUL: short, whatever the target's name

typedef enum { OUT_STREAM, OUT_IN_PLACE, OUT_REPLACE } out_kind;

typedef struct {
    char *key;   // what cli_outputs_write finds it by: the option, else the path
    char *path;  // as given
    char *label; // "--json out.json", for messages
    out_kind kind;
    int std_fd; // OUT_STREAM: 1 or 2
    // Identity, for refusing two outputs on one file: the file's device and inode when it
    // exists, else its folder's and its name.
    bool exists, null_device;
    dev_t dev;
    ino_t ino;
    char *name;                                  // OUT_REPLACE: the name to replace in its folder, links followed
    int dirfd;                                   // OUT_REPLACE: that folder
    int fd;                                      // OUT_REPLACE: the temporary
    char tmp[TEMP_NAME_LEN], bak[TEMP_NAME_LEN]; // names in dirfd ("" none)
    int tmp_slot, bak_slot;                      // their places in the signal registry
    bool written, failed, placed, committed;
} output;

typedef struct {
    char *label;
    dev_t dev;
    ino_t ino;
} input;

struct cli_outputs {
    output *outs;
    size_t n, cap;
    input *ins;
    size_t nin, capin;
    bool broken; // a commit failed and was rolled back: the temporaries are gone
};

// ---- Named temporaries and signals ----
// A signal handler may only touch what is async-signal-safe: fixed slots, each a folder fd and
// a short name, published with an atomic flag after they are filled in.

#define SLOTS 64
static struct {
    atomic_int used; // 0 free, 1 live, 2 being filled in
    int dirfd;
    char name[TEMP_NAME_LEN];
} slots[SLOTS];
static atomic_int committing, pending_signal, committed;
static void (*interrupt_note)(int sig, bool written); // says where the command stopped

void cli_outputs_remove_temporaries(void) {
    for (int i = 0; i < SLOTS; i++)
        if (atomic_load(&slots[i].used) == 1) unlinkat(slots[i].dirfd, slots[i].name, 0);
}

static void on_signal(int sig) {
    if (atomic_load(&committing)) { // the commit finishes (or rolls back) first, then re-raises
        atomic_store(&pending_signal, sig);
        return;
    }
    cli_outputs_remove_temporaries();
    if (interrupt_note) interrupt_note(sig, atomic_load(&committed) != 0);
    signal(sig, SIG_DFL);
    raise(sig);
}

static const int cleanup_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Only over the default action: an ignored SIGHUP (nohup) stays ignored, a handler of the
// command's own stays its own.
static void install_handlers(void) {
    static atomic_int done;
    if (atomic_exchange(&done, 1)) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof *cleanup_signals; i++)
        sigaddset(&sa.sa_mask, cleanup_signals[i]);
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof *cleanup_signals; i++) {
        struct sigaction old;
        if (sigaction(cleanup_signals[i], NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL)
            sigaction(cleanup_signals[i], &sa, NULL);
    }
}

void cli_outputs_catch_signals(void (*note)(int sig, bool written)) {
    interrupt_note = note;
    install_handlers();
}

static int slot_take(int dirfd, const char *name) {
    for (int i = 0; i < SLOTS; i++) {
        int expect = 0;
        if (atomic_compare_exchange_strong(&slots[i].used, &expect, 2)) {
            slots[i].dirfd = dirfd;
            memcpy(slots[i].name, name, TEMP_NAME_LEN);
            atomic_store(&slots[i].used, 1);
            install_handlers();
            return i;
        }
    }
    return -1;
}

static void slot_drop(int *slot) {
    if (*slot >= 0) atomic_store(&slots[*slot].used, 0);
    *slot = -1;
}

// ---- Temporaries ----

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

// A new name in dirfd for a file: make(dirfd, name, arg) creates it, failing with EEXIST when
// the name is taken (a stale file of an earlier run, say), which only draws another name.
static int fresh_name(int dirfd, char name[TEMP_NAME_LEN], int (*make)(int, const char *, void *), void *arg) {
    for (int k = 0; k < 100; k++) {
        random_name(name);
        int rc = make(dirfd, name, arg);
        if (rc >= 0) return rc;
        if (errno != EEXIST) break;
    }
    name[0] = '\0';
    return -1;
}

static int make_file(int dirfd, const char *name, void *arg) {
    (void)arg;
    return openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
}

static int make_link_to_fd(int dirfd, const char *name, void *arg) {
    int fd = *(int *)arg;
    char proc[40];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    if (linkat(AT_FDCWD, proc, dirfd, name, AT_SYMLINK_FOLLOW) == 0) return 0;
    if (errno == EEXIST) return -1;
    return linkat(fd, "", dirfd, name, AT_EMPTY_PATH); // needs CAP_DAC_READ_SEARCH
}

typedef struct {
    int dirfd;
    const char *name;
} link_src;

static int make_link_to_name(int dirfd, const char *name, void *arg) {
    const link_src *src = arg;
    return linkat(src->dirfd, src->name, dirfd, name, 0);
}

// The temporary of o: unnamed (O_TMPFILE: nothing outlives the process, even a SIGKILL) where
// the file system has it and /proc can give it a name at commit, else a fresh named file.
static int open_temp(output *o) {
    o->tmp[0] = '\0';
#ifndef CLI_OUTPUTS_NO_TMPFILE
    if (access("/proc/self/fd", X_OK) == 0) {
        o->fd = openat(o->dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
        if (o->fd >= 0) return 0;
    }
#endif
    o->fd = fresh_name(o->dirfd, o->tmp, make_file, NULL);
    if (o->fd < 0) return -1;
    o->tmp_slot = slot_take(o->dirfd, o->tmp);
    if (o->tmp_slot < 0) {
        unlinkat(o->dirfd, o->tmp, 0);
        o->tmp[0] = '\0';
        errno = EMFILE;
        return -1;
    }
    return 0;
}

// ---- Declaring ----

static bool is_null_device(const struct stat *st) {
    return S_ISCHR(st->st_mode) && major(st->st_rdev) == 1 && minor(st->st_rdev) == 3;
}

// "-" and the names of the standard streams: 1 or 2, else 0.
static int std_stream(const char *path) {
    static const char *const out[] = {"-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"};
    static const char *const err[] = {"/dev/stderr", "/dev/fd/2", "/proc/self/fd/2"};
    for (size_t i = 0; i < sizeof out / sizeof *out; i++)
        if (strcmp(path, out[i]) == 0) return 1;
    for (size_t i = 0; i < sizeof err / sizeof *err; i++)
        if (strcmp(path, err[i]) == 0) return 2;
    return 0;
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
    errno = ELOOP;
    return NULL;
}

// Where a regular file or new path o->path is replaced: its folder (opened) and name.
static int locate(output *o, ag_err *err) {
    char *target = o->exists ? realpath(o->path, NULL) : follow_links(o->path);
    if (!target) {
        ag_err_set(err, "%s: %s", o->label, strerror(errno));
        return -1;
    }
    int rc = -1;
    char *slash = strrchr(target, '/');
    const char *name = slash ? slash + 1 : target, *dir = slash == target ? "/" : slash ? target : ".";
    if (!*name || !strcmp(name, ".") || !strcmp(name, "..")) {
        ag_err_set(err, "%s: names a folder; give a file name", o->label);
        goto done;
    }
    if (slash && slash != target) *slash = '\0';
    o->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (o->dirfd < 0 && errno == EACCES) o->dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (o->dirfd < 0 || fstat(o->dirfd, &st) != 0) {
        if (errno == ENOENT)
            ag_err_set(err, "%s: the folder %s does not exist", o->label, dir);
        else
            ag_err_set(err, "%s: the folder %s: %s", o->label, dir, strerror(errno));
        goto done;
    }
    if (!o->exists) {
        o->dev = st.st_dev;
        o->ino = st.st_ino;
    }
    o->name = strdup(name);
    if (!o->name) {
        ag_err_set(err, "%s: out of memory", o->label);
        goto done;
    }
    if (open_temp(o) != 0) {
        ag_err_set(err, "%s: cannot create a file in %s: %s", o->label, dir, strerror(errno));
        goto done;
    }
    rc = 0;
done:
    free(target);
    return rc;
}

// What kind of output o->path is, and where it goes.
static int resolve(output *o, ag_err *err) {
    o->std_fd = std_stream(o->path);
    struct stat st;
    if (o->std_fd) {
        o->kind = OUT_STREAM;
        if (fstat(o->std_fd, &st) == 0) {
            o->exists = true;
            o->dev = st.st_dev;
            o->ino = st.st_ino;
            o->null_device = is_null_device(&st);
        }
        return 0;
    }
    if (stat(o->path, &st) == 0) {
        o->exists = true;
        o->dev = st.st_dev;
        o->ino = st.st_ino;
        o->null_device = is_null_device(&st);
        if (S_ISDIR(st.st_mode)) {
            ag_err_set(err, "%s: is a folder; give a file name", o->label);
            return -1;
        }
        if (S_ISBLK(st.st_mode) || S_ISSOCK(st.st_mode)) {
            ag_err_set(err, "%s: is a %s; give a file, a character device or a FIFO", o->label,
                       S_ISBLK(st.st_mode) ? "block device" : "socket");
            return -1;
        }
        if (access(o->path, W_OK) != 0) {
            ag_err_set(err, "%s: cannot be written: %s", o->label, strerror(errno));
            return -1;
        }
        if (!S_ISREG(st.st_mode)) {
            o->kind = OUT_IN_PLACE;
            return 0;
        }
    } else if (errno != ENOENT) {
        ag_err_set(err, "%s: %s", o->label, strerror(errno));
        return -1;
    } else if (o->path[strlen(o->path) - 1] == '/') {
        ag_err_set(err, "%s: names a folder; give a file name", o->label);
        return -1;
    }
    o->kind = OUT_REPLACE;
    return locate(o, err);
}

static bool same_file(const output *a, const output *b) {
    if (a->kind == OUT_STREAM && b->kind == OUT_STREAM && a->std_fd == b->std_fd) return true;
    if (a->exists != b->exists || a->dev != b->dev || a->ino != b->ino) return false;
    if (!a->exists) return a->name && b->name && strcmp(a->name, b->name) == 0;
    return !a->null_device; // discarding twice harms nothing
}

static output *find(cli_outputs *s, const char *key) {
    for (size_t i = 0; key && i < s->n; i++)
        if (strcmp(s->outs[i].key, key) == 0) return &s->outs[i];
    return NULL;
}

cli_outputs *cli_outputs_new(void) { return calloc(1, sizeof(cli_outputs)); }

static char *make_label(const char *option, const char *path) {
    size_t n = (option ? strlen(option) + 1 : 0) + strlen(path) + 1;
    char *l = malloc(n);
    if (l) snprintf(l, n, "%s%s%s", option ? option : "", option ? " " : "", path);
    return l;
}

static void output_release(output *o) {
    if (o->tmp[0] && !o->placed) unlinkat(o->dirfd, o->tmp, 0);
    slot_drop(&o->tmp_slot);
    slot_drop(&o->bak_slot);
    if (o->fd >= 0) close(o->fd);
    if (o->dirfd >= 0) close(o->dirfd);
    free(o->key);
    free(o->path);
    free(o->label);
    free(o->name);
}

int cli_outputs_add(cli_outputs *s, const char *option, const char *path, ag_err *err) {
    if (!path) return 0;
    if (!*path) {
        ag_err_set(err, "%s: no file name given", option ? option : "output");
        return -1;
    }
    if (find(s, option ? option : path)) {
        ag_err_set(err, "%s is given twice", option ? option : path);
        return -1;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 8;
        output *o = realloc(s->outs, cap * sizeof *o);
        if (!o) {
            ag_err_set(err, "out of memory");
            return -1;
        }
        s->outs = o;
        s->cap = cap;
    }
    output o = {.dirfd = -1, .fd = -1, .tmp_slot = -1, .bak_slot = -1};
    o.key = strdup(option ? option : path);
    o.path = strdup(path);
    o.label = make_label(option, path);
    if (!o.key || !o.path || !o.label) {
        ag_err_set(err, "out of memory");
        output_release(&o);
        return -1;
    }
    int rc = resolve(&o, err);
    for (size_t i = 0; rc == 0 && i < s->n; i++)
        if (same_file(&o, &s->outs[i])) {
            ag_err_set(err, "%s: the same file as %s", o.label, s->outs[i].label);
            rc = -1;
        }
    for (size_t i = 0; rc == 0 && i < s->nin; i++)
        if (o.exists && !o.null_device && o.dev == s->ins[i].dev && o.ino == s->ins[i].ino) {
            ag_err_set(err, "%s: the same file as %s, which the run reads", o.label, s->ins[i].label);
            rc = -1;
        }
    if (rc != 0) {
        output_release(&o);
        return -1;
    }
    s->outs[s->n++] = o;
    return 0;
}

int cli_outputs_input(cli_outputs *s, const char *option, const char *path, ag_err *err) {
    struct stat st;
    if (!path || stat(path, &st) != 0) return 0;
    for (size_t i = 0; i < s->n; i++) {
        const output *o = &s->outs[i];
        if (o->exists && !o->null_device && o->dev == st.st_dev && o->ino == st.st_ino) {
            ag_err_set(err, "%s: the same file as %s %s, which the run reads", o->label, option ? option : "input",
                       path);
            return -1;
        }
    }
    if (s->nin == s->capin) {
        size_t cap = s->capin ? 2 * s->capin : 8;
        input *in = realloc(s->ins, cap * sizeof *in);
        if (!in) {
            ag_err_set(err, "out of memory");
            return -1;
        }
        s->ins = in;
        s->capin = cap;
    }
    input in = {make_label(option, path), st.st_dev, st.st_ino};
    if (!in.label) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    s->ins[s->nin++] = in;
    return 0;
}

// ---- Writing ----

// Runs fn on f and flushes f; a failure is reported with fn's reason or the stream's.
static int run_writer(const output *o, FILE *f, cli_output_writer fn, void *arg, ag_err *err) {
    ag_err inner = {{0}};
    errno = 0;
    int rc = fn(f, arg, &inner), saved = errno;
    if (fflush(f) != 0 && rc == 0) rc = -1, saved = errno;
    if (ferror(f) && rc == 0) rc = -1;
    if (rc == 0) return 0;
    if (inner.msg[0])
        ag_err_set(err, "%s: %s", o->label, inner.msg);
    else
        ag_err_set(err, "%s: write failed: %s", o->label, strerror(saved ? saved : EIO));
    return -1;
}

static int write_stream(const output *o, cli_output_writer fn, void *arg, ag_err *err) {
    FILE *f = o->std_fd == 1 ? stdout : stderr;
    if (fflush(f) != 0 || ferror(f)) {
        ag_err_set(err, "%s: write failed: %s", o->label, strerror(errno ? errno : EIO));
        return -1;
    }
    return run_writer(o, f, fn, arg, err);
}

static int write_in_place(const output *o, cli_output_writer fn, void *arg, ag_err *err) {
    int fd = open(o->path, O_WRONLY | O_NOCTTY | O_CLOEXEC); // a FIFO waits for its reader here
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) {
        close(fd); // not what was declared: it was swapped during the run
        fd = -1;
        errno = EBUSY;
    }
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        ag_err_set(err, "%s: cannot be written: %s", o->label, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    int rc = run_writer(o, f, fn, arg, err);
    if (fclose(f) != 0 && rc == 0) {
        ag_err_set(err, "%s: write failed: %s", o->label, strerror(errno));
        rc = -1;
    }
    return rc;
}

static int write_temp(const output *o, cli_output_writer fn, void *arg, ag_err *err) {
    int dupfd = dup(o->fd); // the temporary's own fd stays open for the commit
    FILE *f = dupfd >= 0 ? fdopen(dupfd, "w") : NULL;
    if (!f) {
        if (dupfd >= 0) close(dupfd);
        ag_err_set(err, "%s: %s", o->label, strerror(errno));
        return -1;
    }
    int rc = run_writer(o, f, fn, arg, err);
    if (fclose(f) != 0 && rc == 0) {
        ag_err_set(err, "%s: write failed: %s", o->label, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && fsync(o->fd) != 0 && errno != EINVAL) {
        ag_err_set(err, "%s: write failed: %s", o->label, strerror(errno));
        rc = -1;
    }
    return rc;
}

int cli_outputs_write(cli_outputs *s, const char *option, cli_output_writer fn, void *arg, ag_err *err) {
    output *o = find(s, option);
    if (!o) {
        ag_err_set(err, "%s: no such output was declared", option ? option : "(null)");
        return -1;
    }
    if (o->written || o->failed) {
        ag_err_set(err, "%s: is written twice", o->label);
        return -1;
    }
    int rc;
    if (o->kind == OUT_REPLACE) {
        rc = write_temp(o, fn, arg, err);
    } else {
        // A reader that went away is a write error naming the file, not a silent death.
        struct sigaction ign, old;
        memset(&ign, 0, sizeof ign);
        ign.sa_handler = SIG_IGN;
        sigemptyset(&ign.sa_mask);
        sigaction(SIGPIPE, &ign, &old);
        rc = o->kind == OUT_STREAM ? write_stream(o, fn, arg, err) : write_in_place(o, fn, arg, err);
        sigaction(SIGPIPE, &old, NULL);
    }
    o->written = rc == 0;
    o->failed = rc != 0;
    return rc;
}

// ---- Committing ----

// Before anything moves: a name for the temporary, the old file's owner and mode on it, and a
// backup link to the old file (none where the file system has no hard links: placed last).
static int prepare(output *o, ag_err *err) {
    struct stat st;
    if (fstatat(o->dirfd, o->name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (!S_ISREG(st.st_mode)) {
            ag_err_set(err, "%s: is no longer a regular file; left as it is", o->label);
            return -1;
        }
        if ((st.st_uid != geteuid() || st.st_gid != getegid()) && fchown(o->fd, st.st_uid, st.st_gid) != 0) {
            // keeps ours: only root may give a file away
        }
        if (fchmod(o->fd, st.st_mode & 07777) != 0) {
            ag_err_set(err, "%s: cannot keep its mode: %s", o->label, strerror(errno));
            return -1;
        }
        link_src src = {o->dirfd, o->name};
        if (fresh_name(o->dirfd, o->bak, make_link_to_name, &src) == 0) {
            o->bak_slot = slot_take(o->dirfd, o->bak);
        } else if (errno != EPERM && errno != EMLINK && errno != ENOTSUP && errno != EOPNOTSUPP) {
            ag_err_set(err, "%s: cannot be replaced: %s", o->label, strerror(errno));
            return -1;
        }
    } else if (errno != ENOENT) {
        ag_err_set(err, "%s: %s", o->label, strerror(errno));
        return -1;
    }
    if (!o->tmp[0]) {
        if (fresh_name(o->dirfd, o->tmp, make_link_to_fd, &o->fd) != 0) {
            ag_err_set(err, "%s: cannot be replaced: %s", o->label, strerror(errno));
            return -1;
        }
        o->tmp_slot = slot_take(o->dirfd, o->tmp);
    }
    return 0;
}

// Puts back what the placed outputs replaced; false when one could not be (its backup stays).
static bool roll_back(cli_outputs *s, ag_err *err) {
    bool ok = true;
    for (size_t i = 0; i < s->n; i++) {
        output *o = &s->outs[i];
        if (!o->placed) continue;
        if (o->bak[0] ? renameat(o->dirfd, o->bak, o->dirfd, o->name) == 0 : unlinkat(o->dirfd, o->name, 0) == 0) {
            o->bak[0] = '\0';
            o->placed = false;
            o->tmp[0] = '\0'; // the new file is gone with the rollback
            slot_drop(&o->bak_slot);
            slot_drop(&o->tmp_slot);
        } else {
            if (ok) {
                char first[sizeof err->msg];
                memcpy(first, err->msg, sizeof first);
                ag_err_set(err, "%s; %s could not be restored%s%s", first, o->label,
                           o->bak[0] ? ", the previous file is kept beside it as " : "", o->bak);
            }
            o->bak[0] = '\0'; // never removed: it is the only copy
            slot_drop(&o->bak_slot);
            ok = false;
        }
    }
    return ok;
}

int cli_outputs_commit(cli_outputs *s, ag_err *err) {
    if (s->broken) {
        ag_err_set(err, "an earlier commit of the outputs failed; no output was replaced");
        return -1;
    }
    for (size_t i = 0; i < s->n; i++) {
        const output *o = &s->outs[i];
        if (o->failed || !o->written) {
            ag_err_set(err, "%s: %s; no output was replaced", o->label,
                       o->failed ? "its write failed" : "was never written");
            return -1;
        }
    }
    atomic_store(&committing, 1);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < s->n; i++)
        if (s->outs[i].kind == OUT_REPLACE && !s->outs[i].committed) rc = prepare(&s->outs[i], err);
    // Files with a backup first: if one fails, every file placed before it can be restored.
    for (int pass = 0; rc == 0 && pass < 2; pass++)
        for (size_t i = 0; rc == 0 && i < s->n; i++) {
            output *o = &s->outs[i];
            if (o->kind != OUT_REPLACE || o->committed || (pass == 0) != (o->bak[0] != '\0')) continue;
            if (renameat(o->dirfd, o->tmp, o->dirfd, o->name) != 0) {
                ag_err_set(err, "%s: cannot be replaced: %s", o->label, strerror(errno));
                rc = -1;
            } else {
                o->placed = true;
            }
        }
    if (rc != 0 && roll_back(s, err)) {
        char first[sizeof err->msg];
        memcpy(first, err->msg, sizeof first);
        ag_err_set(err, "%s; no output was replaced", first);
    }
    for (size_t i = 0; i < s->n; i++) {
        output *o = &s->outs[i];
        if (o->kind != OUT_REPLACE || o->committed) continue;
        if (o->bak[0]) unlinkat(o->dirfd, o->bak, 0);
        o->bak[0] = '\0';
        slot_drop(&o->bak_slot);
        if (o->placed) {
            o->tmp[0] = '\0';
            slot_drop(&o->tmp_slot);
            o->committed = true;
            if (fsync(o->dirfd) != 0) {
                // best effort: the rename is done, and an O_PATH folder cannot be synced
            }
        } else if (o->tmp[0] && (unlinkat(o->dirfd, o->tmp, 0) == 0 || errno == ENOENT)) {
            o->tmp[0] = '\0'; // not needed now (else cli_outputs_free tries again)
            slot_drop(&o->tmp_slot);
        }
    }
    s->broken = rc != 0;
    if (rc == 0) atomic_store(&committed, 1);
    atomic_store(&committing, 0);
    int sig = atomic_exchange(&pending_signal, 0);
    if (sig) on_signal(sig);
    return rc;
}

void cli_outputs_free(cli_outputs *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) output_release(&s->outs[i]);
    for (size_t i = 0; i < s->nin; i++) free(s->ins[i].label);
    free(s->outs);
    free(s->ins);
    free(s);
}

// ---- The model's safetensors ----

int cli_model_writer(FILE *f, void *arg, ag_err *err) {
    const cli_model_file *m = arg;
    return llama_model_save_file(m->model, f, m->grads, err);
}
