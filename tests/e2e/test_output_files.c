// The command's output files (examples/membill/outputs.c) on their own: what may be replaced
// and what must be written in place, all-or-none commits, and temporaries that never collide
// nor outlive the run. Built twice: with O_TMPFILE, and with named temporaries only
// (CLI_OUTPUTS_NO_TMPFILE), the fallback for file systems without it.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "outputs.h"

static char dir[64];

static int make_dir(void **state) {
    (void)state;
    umask(022);
    snprintf(dir, sizeof dir, "/tmp/membill_outfiles_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "chmod -R u+rwx '%s'; rm -rf '%s'", dir, dir);
    return system(cmd) == 0 ? 0 : -1;
}

// A fresh folder inside dir for one test.
static const char *sub(const char *name) {
    static char p[4][512];
    static int k;
    char *out = p[k++ % 4];
    snprintf(out, 512, "%s/%s", dir, name);
    if (mkdir(out, 0755) != 0 && errno != EEXIST) fail_msg("mkdir %s", out);
    return out;
}

static const char *at(const char *folder, const char *name) {
    static char p[8][1024];
    static int k;
    char *out = p[k++ % 8];
    snprintf(out, 1024, "%s/%s", folder, name);
    return out;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

// The file's text, or "" when it cannot be read.
static const char *get(const char *path) {
    static char buf[1 << 16];
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

// Entries of folder whose name starts with ".membill-" (temporaries and backups).
static int temporaries(const char *folder) {
    DIR *d = opendir(folder);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strncmp(e->d_name, ".membill-", 9) == 0;
    closedir(d);
    return n;
}

static int entries(const char *folder) {
    DIR *d = opendir(folder);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static int text_writer(FILE *f, void *text, ag_err *err) {
    (void)err;
    return fputs(text, f) < 0 ? -1 : 0;
}

static int failing_writer(FILE *f, void *arg, ag_err *err) {
    (void)arg;
    fputs("half of it", f);
    ag_err_set(err, "the chart could not be drawn");
    return -1;
}

// 1 MiB of text, more than any pipe holds.
static int big_writer(FILE *f, void *arg, ag_err *err) {
    (void)arg;
    (void)err;
    for (int i = 0; i < 1 << 14; i++) fputs("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\n", f);
    return 0;
}

// Declares, writes and commits one output; the error message in err.
static int write_one(const char *option, const char *path, const char *text, ag_err *err) {
    cli_outputs *s = cli_outputs_new();
    assert_non_null(s);
    int rc = cli_outputs_add(s, option, path, err);
    if (rc == 0) rc = cli_outputs_write(s, option ? option : path, text_writer, (void *)text, err);
    if (rc == 0) rc = cli_outputs_commit(s, err);
    cli_outputs_free(s);
    return rc;
}

#define MENTIONS(msg, part)                                                                                            \
    do {                                                                                                               \
        if (!strstr((msg), (part))) fail_msg("\"%s\" does not mention \"%s\"", (msg), (part));                         \
        assert_null(strchr((msg), '\n'));                                                                              \
    } while (0)

static void expect_char_device(const char *path, unsigned maj, unsigned min) {
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    assert_int_equal(major(st.st_rdev), maj);
    assert_int_equal(minor(st.st_rdev), min);
}

// ---------------------------------------------------------------------------------------------

static void test_new_and_replaced_files(void **state) {
    (void)state;
    const char *d = sub("replace");
    ag_err err = {{0}};
    struct stat st, before;
    // A new file: the umask's mode, as any program's.
    assert_int_equal(write_one("--json", at(d, "new.json"), "{}\n", &err), 0);
    assert_string_equal(get(at(d, "new.json")), "{}\n");
    assert_int_equal(stat(at(d, "new.json"), &st), 0);
    assert_int_equal(st.st_mode & 07777, 0644);
    // A replaced file keeps its mode, and is a new file (the old one was never written into).
    put(at(d, "old.json"), "precious");
    assert_int_equal(chmod(at(d, "old.json"), 0600), 0);
    assert_int_equal(stat(at(d, "old.json"), &before), 0);
    assert_int_equal(write_one("--json", at(d, "old.json"), "new text", &err), 0);
    assert_string_equal(get(at(d, "old.json")), "new text");
    assert_int_equal(stat(at(d, "old.json"), &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_not_equal(st.st_ino, before.st_ino);
    assert_int_equal(chmod(at(d, "old.json"), 0640), 0);
    assert_int_equal(write_one(NULL, at(d, "old.json"), "again", &err), 0);
    assert_int_equal(stat(at(d, "old.json"), &st), 0);
    assert_int_equal(st.st_mode & 07777, 0640);
    if (geteuid() == 0) { // root replacing a user's file leaves it the user's
        assert_int_equal(chown(at(d, "old.json"), 65534, 65534), 0);
        assert_int_equal(write_one("--json", at(d, "old.json"), "root's", &err), 0);
        assert_int_equal(stat(at(d, "old.json"), &st), 0);
        assert_int_equal(st.st_uid, 65534);
        assert_int_equal(st.st_gid, 65534);
        assert_int_equal(st.st_mode & 07777, 0640);
    }
    assert_int_equal(temporaries(d), 0);
    assert_int_equal(entries(d), 2);
}

static void test_devices_are_written_in_place(void **state) {
    (void)state;
    const char *d = sub("devices");
    ag_err err = {{0}};
    // Every user, root included: the null device stays the null device.
    expect_char_device("/dev/null", 1, 3);
    assert_int_equal(write_one("--json", "/dev/null", "{}\n", &err), 0);
    expect_char_device("/dev/null", 1, 3);
    // Through a symbolic link: the device is written, the link stays a link.
    assert_int_equal(symlink("/dev/null", at(d, "sink")), 0);
    assert_int_equal(write_one("--svg", at(d, "sink"), "<svg/>", &err), 0);
    expect_char_device("/dev/null", 1, 3);
    struct stat st;
    assert_int_equal(lstat(at(d, "sink"), &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    // Discarding two outputs harms nothing: both may go to the null device.
    cli_outputs *s = cli_outputs_new();
    assert_int_equal(cli_outputs_add(s, "--json", "/dev/null", &err), 0);
    assert_int_equal(cli_outputs_add(s, "--svg", at(d, "sink"), &err), 0);
    assert_int_equal(cli_outputs_write(s, "--json", big_writer, NULL, &err), 0);
    assert_int_equal(cli_outputs_write(s, "--svg", big_writer, NULL, &err), 0);
    assert_int_equal(cli_outputs_commit(s, &err), 0);
    cli_outputs_free(s);
    expect_char_device("/dev/null", 1, 3);
    // A full device is a write error that names it.
    assert_int_equal(write_one("--trace", "/dev/full", "{}", &err), -1);
    MENTIONS(err.msg, "--trace /dev/full");
    MENTIONS(err.msg, strerror(ENOSPC));
    expect_char_device("/dev/full", 1, 7);
    assert_int_equal(entries(d), 1);
}

// A reader on a FIFO gets the whole output, and the FIFO stays one.
static void test_fifo_with_a_reader(void **state) {
    (void)state;
    const char *d = sub("fifo");
    const char *fifo = at(d, "pipe"), *got = at(d, "got");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "cat '%s' > '%s'", fifo, got);
        _exit(system(cmd) == 0 ? 0 : 1);
    }
    ag_err err = {{0}};
    assert_int_equal(write_one("--timeline", fifo, "seconds,phase\n0,load\n", &err), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_string_equal(get(got), "seconds,phase\n0,load\n");
    struct stat sb;
    assert_int_equal(lstat(fifo, &sb), 0);
    assert_true(S_ISFIFO(sb.st_mode));

    // A reader that goes away: a write error naming the file, not a death by SIGPIPE.
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(fifo, O_RDONLY);
        char c;
        _exit(fd >= 0 && read(fd, &c, 1) == 1 ? 0 : 1); // one byte, then gone
    }
    cli_outputs *s = cli_outputs_new();
    assert_int_equal(cli_outputs_add(s, "--trace", fifo, &err), 0);
    assert_int_equal(cli_outputs_write(s, "--trace", big_writer, NULL, &err), -1);
    MENTIONS(err.msg, "--trace");
    MENTIONS(err.msg, strerror(EPIPE));
    assert_int_equal(cli_outputs_commit(s, &err), -1);
    cli_outputs_free(s);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    struct sigaction now;
    assert_int_equal(sigaction(SIGPIPE, NULL, &now), 0);
    assert_true(now.sa_handler == SIG_DFL); // put back as it was
}

static void test_symbolic_links(void **state) {
    (void)state;
    const char *d = sub("links"), *real = sub("links/real");
    ag_err err = {{0}};
    struct stat st;
    // A link to a regular file: the file behind it is replaced, the link stays.
    put(at(real, "r.json"), "precious");
    assert_int_equal(chmod(at(real, "r.json"), 0600), 0);
    assert_int_equal(symlink("real/r.json", at(d, "latest.json")), 0);
    assert_int_equal(write_one("--json", at(d, "latest.json"), "fresh", &err), 0);
    assert_int_equal(lstat(at(d, "latest.json"), &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_string_equal(get(at(real, "r.json")), "fresh");
    assert_int_equal(stat(at(real, "r.json"), &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    // A chain of links, the last one dangling: its target is created.
    assert_int_equal(symlink("real/new.csv", at(d, "b")), 0);
    assert_int_equal(symlink(at(d, "b"), at(d, "a")), 0);
    assert_int_equal(write_one("--timeline", at(d, "a"), "x,y\n", &err), 0);
    assert_string_equal(get(at(real, "new.csv")), "x,y\n");
    assert_int_equal(lstat(at(d, "a"), &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(lstat(at(d, "b"), &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(temporaries(d) + temporaries(real), 0);
}

static void test_refused_before_the_run(void **state) {
    (void)state;
    const char *d = sub("refused");
    ag_err err = {{0}};
    cli_outputs *s = cli_outputs_new();
    // Folders, missing folders, a name that ends in a slash.
    assert_int_equal(cli_outputs_add(s, "--json", d, &err), -1);
    MENTIONS(err.msg, "--json");
    MENTIONS(err.msg, "folder");
    assert_int_equal(cli_outputs_add(s, "--svg", at(d, "nowhere/c.svg"), &err), -1);
    MENTIONS(err.msg, "nowhere");
    MENTIONS(err.msg, "does not exist");
    assert_int_equal(cli_outputs_add(s, "--svg", at(d, "c.svg/"), &err), -1);
    MENTIONS(err.msg, "folder");
    assert_int_equal(cli_outputs_add(s, "--svg", "", &err), -1);
    MENTIONS(err.msg, "--svg");
    // Two outputs on one file, however it is named.
    put(at(d, "r.json"), "precious");
    assert_int_equal(cli_outputs_add(s, "--json", at(d, "r.json"), &err), 0);
    assert_int_equal(cli_outputs_add(s, "--json", at(d, "other.json"), &err), -1);
    MENTIONS(err.msg, "given twice");
    assert_int_equal(link(at(d, "r.json"), at(d, "hard.json")), 0);
    assert_int_equal(cli_outputs_add(s, "--trace", at(d, "hard.json"), &err), -1);
    MENTIONS(err.msg, "--trace");
    MENTIONS(err.msg, "same file as --json");
    assert_int_equal(symlink("r.json", at(d, "soft.json")), 0);
    assert_int_equal(cli_outputs_add(s, "--trace", at(d, "soft.json"), &err), -1);
    MENTIONS(err.msg, "same file");
    char relative[1024];
    snprintf(relative, sizeof relative, "%s/../refused/./new.svg", d);
    assert_int_equal(cli_outputs_add(s, "--svg", at(d, "new.svg"), &err), 0);
    assert_int_equal(cli_outputs_add(s, "--html", relative, &err), -1);
    MENTIONS(err.msg, "same file as --svg");
    assert_int_equal(cli_outputs_add(s, "--timeline", "-", &err), 0);
    assert_int_equal(cli_outputs_add(s, "--trace", "-", &err), -1);
    MENTIONS(err.msg, "same file as --timeline -");
    assert_int_equal(cli_outputs_add(s, "--trace", "/dev/stdout", &err), -1);
    MENTIONS(err.msg, "same file as --timeline -");
    // An output on one of the run's inputs, whichever is declared first.
    put(at(d, "w.safetensors"), "weights");
    assert_int_equal(cli_outputs_input(s, "--weights", at(d, "w.safetensors"), &err), 0);
    assert_int_equal(cli_outputs_add(s, "--save-weights", at(d, "w.safetensors"), &err), -1);
    MENTIONS(err.msg, "--save-weights");
    MENTIONS(err.msg, "--weights");
    assert_int_equal(cli_outputs_input(s, "--config", at(d, "hard.json"), &err), -1);
    MENTIONS(err.msg, "--json");
    MENTIONS(err.msg, "--config");
    assert_int_equal(cli_outputs_input(s, "--prompt-file", at(d, "missing.txt"), &err), 0);
    assert_int_equal(cli_outputs_input(s, "--config", NULL, &err), 0);
    assert_int_equal(cli_outputs_add(s, "--dump-grads", NULL, &err), 0); // not asked for
    // A block device is never written over, even by root.
    if (geteuid() == 0) {
        assert_int_equal(mknod(at(d, "disk"), S_IFBLK | 0600, makedev(240, 0)), 0);
        assert_int_equal(cli_outputs_add(s, "--dump-grads", at(d, "disk"), &err), -1);
        MENTIONS(err.msg, "block device");
        unlink(at(d, "disk"));
    }
    // Writing what was never declared is a mistake of the caller's.
    assert_int_equal(cli_outputs_write(s, "--csv", text_writer, "x", &err), -1);
    MENTIONS(err.msg, "--csv");
    cli_outputs_free(s);
    assert_string_equal(get(at(d, "r.json")), "precious");
    assert_int_equal(temporaries(d), 0);
}

// Several outputs: a writer that fails means none is replaced.
static void test_all_or_none_when_a_writer_fails(void **state) {
    (void)state;
    const char *d = sub("writer_fails");
    ag_err err = {{0}};
    put(at(d, "r.json"), "precious json");
    put(at(d, "c.svg"), "precious svg");
    cli_outputs *s = cli_outputs_new();
    assert_int_equal(cli_outputs_add(s, "--json", at(d, "r.json"), &err), 0);
    assert_int_equal(cli_outputs_add(s, "--svg", at(d, "c.svg"), &err), 0);
    assert_int_equal(cli_outputs_add(s, "--timeline", at(d, "t.csv"), &err), 0);
    assert_int_equal(cli_outputs_write(s, "--json", text_writer, "new json", &err), 0);
    assert_int_equal(cli_outputs_write(s, "--timeline", text_writer, "new csv", &err), 0);
    // Not every output written yet: nothing to commit.
    assert_int_equal(cli_outputs_commit(s, &err), -1);
    MENTIONS(err.msg, "--svg");
    MENTIONS(err.msg, "never written");
    assert_int_equal(cli_outputs_write(s, "--svg", failing_writer, NULL, &err), -1);
    MENTIONS(err.msg, "--svg");
    MENTIONS(err.msg, "the chart could not be drawn");
    assert_int_equal(cli_outputs_write(s, "--svg", text_writer, "again", &err), -1);
    assert_int_equal(cli_outputs_commit(s, &err), -1);
    cli_outputs_free(s);
    assert_string_equal(get(at(d, "r.json")), "precious json");
    assert_string_equal(get(at(d, "c.svg")), "precious svg");
    assert_int_equal(access(at(d, "t.csv"), F_OK), -1);
    assert_int_equal(entries(d), 2);
}

// A folder that disappears before the commit: the outputs already renamed are put back.
static void test_all_or_none_when_a_folder_goes(void **state) {
    (void)state;
    const char *d1 = sub("gone1"), *d2 = sub("gone2");
    ag_err err = {{0}};
    put(at(d1, "r.json"), "precious json");
    put(at(d1, "w.safetensors"), "precious weights");
    cli_outputs *s = cli_outputs_new();
    assert_int_equal(cli_outputs_add(s, "--json", at(d1, "r.json"), &err), 0);
    assert_int_equal(cli_outputs_add(s, "--save-weights", at(d1, "w.safetensors"), &err), 0);
    assert_int_equal(cli_outputs_add(s, "--svg", at(d2, "c.svg"), &err), 0);
    assert_int_equal(cli_outputs_write(s, "--json", text_writer, "new json", &err), 0);
    assert_int_equal(cli_outputs_write(s, "--save-weights", text_writer, "new weights", &err), 0);
    assert_int_equal(cli_outputs_write(s, "--svg", text_writer, "<svg/>", &err), 0);
#ifdef CLI_OUTPUTS_NO_TMPFILE
    assert_int_equal(temporaries(d1), 2);
    assert_int_equal(temporaries(d2), 1);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -f '%s'/.membill-*", d2);
    assert_int_equal(system(cmd), 0);
#else
    assert_int_equal(temporaries(d1) + temporaries(d2), 0); // unnamed until the commit
#endif
    assert_int_equal(rmdir(d2), 0);
    assert_int_equal(cli_outputs_commit(s, &err), -1);
    MENTIONS(err.msg, "--svg");
    MENTIONS(err.msg, "no output was replaced");
    assert_string_equal(get(at(d1, "r.json")), "precious json");
    assert_string_equal(get(at(d1, "w.safetensors")), "precious weights");
    assert_int_equal(cli_outputs_commit(s, &err), -1); // no second try on what is gone
    cli_outputs_free(s);
    assert_string_equal(get(at(d1, "r.json")), "precious json");
    assert_int_equal(entries(d1), 2);
}

// Checks in a child process that has given up root, so that permissions bite; each returns 0
// or the line that failed.
#define CHECK(c)                                                                                                       \
    do {                                                                                                               \
        if (!(c)) return __LINE__;                                                                                     \
    } while (0)

static int unwritable_folders(const char *d1, const char *d2, const char *ro) {
    ag_err err = {{0}};
    cli_outputs *s = cli_outputs_new();
    // A folder that cannot be written is refused when declared.
    CHECK(cli_outputs_add(s, "--trace", at(ro, "t.json"), &err) == -1);
    CHECK(strstr(err.msg, "--trace") && strstr(err.msg, strerror(EACCES)));
    // A read-only file too.
    CHECK(cli_outputs_add(s, "--html", at(d1, "locked.html"), &err) == -1);
    CHECK(strstr(err.msg, "--html") && strstr(err.msg, strerror(EACCES)));
    // One that becomes unwritable during the run fails the commit; nothing is replaced.
    CHECK(cli_outputs_add(s, "--json", at(d1, "r.json"), &err) == 0);
    CHECK(cli_outputs_add(s, "--svg", at(d2, "c.svg"), &err) == 0);
    CHECK(cli_outputs_write(s, "--json", text_writer, "new json", &err) == 0);
    CHECK(cli_outputs_write(s, "--svg", text_writer, "<svg/>", &err) == 0);
    CHECK(chmod(d2, 0500) == 0);
    CHECK(cli_outputs_commit(s, &err) == -1);
    CHECK(strstr(err.msg, "--svg") && strstr(err.msg, strerror(EACCES)));
    CHECK(strcmp(get(at(d1, "r.json")), "precious json") == 0);
    CHECK(chmod(d2, 0700) == 0); // (a named temporary in it can only go once it is writable again)
    cli_outputs_free(s);
    CHECK(temporaries(d1) == 0 && temporaries(d2) == 0);
    CHECK(access(at(d2, "c.svg"), F_OK) == -1);
    return 0;
}

static void test_unwritable_folders(void **state) {
    (void)state;
    const char *d1 = sub("perm1"), *d2 = sub("perm2"), *ro = sub("perm_ro");
    put(at(d1, "r.json"), "precious json");
    put(at(d1, "locked.html"), "locked");
    assert_int_equal(chmod(at(d1, "locked.html"), 0444), 0);
    assert_int_equal(chmod(ro, 0500), 0);
    uid_t nobody = 65534;
    if (geteuid() == 0) { // give the folders to an unprivileged user and become it
        assert_int_equal(chmod(dir, 0755), 0);
        const char *own[] = {d1, d2, ro, at(d1, "r.json"), at(d1, "locked.html")};
        for (size_t i = 0; i < 5; i++) assert_int_equal(chown(own[i], nobody, nobody), 0);
    }
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (geteuid() == 0 && (setgid(nobody) != 0 || setuid(nobody) != 0)) _exit(1);
        int line = unwritable_folders(d1, d2, ro);
        if (line) fprintf(stderr, "unwritable_folders: the check at line %d failed\n", line);
        _exit(line ? 1 : 0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_string_equal(get(at(d1, "r.json")), "precious json");
    assert_int_equal(chmod(ro, 0700), 0);
}

// Temporaries: a short name of their own whatever the target's, never one that an earlier
// run could have left (same pid in a container), and never left behind.
static void test_long_names_and_stale_temporaries(void **state) {
    (void)state;
    const char *d = sub("names");
    ag_err err = {{0}};
    char name[256];
    memset(name, 'n', 250);
    strcpy(name + 250, ".json"); // 255 characters: NAME_MAX itself
    assert_int_equal(write_one("--json", at(d, name), "long", &err), 0);
    assert_string_equal(get(at(d, name)), "long");
    name[250] = '\0';
    put(at(d, name), "precious");
    assert_int_equal(write_one("--json", at(d, name), "longer", &err), 0);
    assert_string_equal(get(at(d, name)), "longer");

    char stale[64];
    snprintf(stale, sizeof stale, "r.json.tmp-%ld", (long)getpid());
    put(at(d, stale), "stale");
    put(at(d, "r.json.tmp-1"), "stale");
    put(at(d, ".membill-AAAAAA"), "stale");
    assert_int_equal(write_one("--json", at(d, "r.json"), "ok", &err), 0);
    assert_string_equal(get(at(d, "r.json")), "ok");
    assert_string_equal(get(at(d, stale)), "stale"); // another run's files are not ours to remove
    assert_int_equal(temporaries(d), 1);
    assert_int_equal(entries(d), 6);

    // Many outputs in one folder, two sets at once: no temporary collides with another.
    cli_outputs *a = cli_outputs_new(), *b = cli_outputs_new();
    char opt[16], file[32];
    for (int i = 0; i < 12; i++) {
        snprintf(opt, sizeof opt, "--o%d", i);
        snprintf(file, sizeof file, "many%d.txt", i);
        assert_int_equal(cli_outputs_add(i % 2 ? a : b, opt, at(d, file), &err), 0);
        assert_int_equal(cli_outputs_write(i % 2 ? a : b, opt, text_writer, file, &err), 0);
    }
#ifdef CLI_OUTPUTS_NO_TMPFILE
    assert_int_equal(temporaries(d), 13);
#endif
    assert_int_equal(cli_outputs_commit(a, &err), 0);
    assert_int_equal(cli_outputs_commit(b, &err), 0);
    assert_int_equal(cli_outputs_commit(b, &err), 0); // done already: nothing more to do
    cli_outputs_free(a);
    cli_outputs_free(b);
    for (int i = 0; i < 12; i++) {
        snprintf(file, sizeof file, "many%d.txt", i);
        assert_string_equal(get(at(d, file)), file);
    }
    assert_int_equal(temporaries(d), 1);
}

// A run stopped by a signal (or killed outright, where O_TMPFILE is at hand) leaves no
// temporary and the user's file as it was.
static void killed_run(const char *d, int sig) {
    put(at(d, "r.json"), "precious");
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        ag_err err = {{0}};
        cli_outputs *s = cli_outputs_new();
        if (cli_outputs_add(s, "--json", at(d, "r.json"), &err) != 0 ||
            cli_outputs_add(s, "--svg", at(d, "c.svg"), &err) != 0 ||
            cli_outputs_write(s, "--json", big_writer, NULL, &err) != 0)
            _exit(1);
        if (write(ready[1], "x", 1) != 1) _exit(1);
        for (;;) pause(); // the run goes on until the signal
    }
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
#ifdef CLI_OUTPUTS_NO_TMPFILE
    assert_int_equal(temporaries(d), 2);
#else
    assert_int_equal(temporaries(d), 0);
#endif
    assert_int_equal(kill(pid, sig), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), sig); // the signal's own end, after the clean-up
    assert_int_equal(temporaries(d), 0);
    assert_string_equal(get(at(d, "r.json")), "precious");
    assert_int_equal(entries(d), 1);
    close(ready[0]);
    close(ready[1]);
}

static void test_signals_remove_temporaries(void **state) {
    (void)state;
    killed_run(sub("sigterm"), SIGTERM);
    killed_run(sub("sigint"), SIGINT);
#ifndef CLI_OUTPUTS_NO_TMPFILE
    killed_run(sub("sigkill"), SIGKILL);
#endif
}

// "-" is standard output, in place and in order.
static void test_standard_output(void **state) {
    (void)state;
    const char *d = sub("stdout");
    ag_err err = {{0}};
    fflush(stdout);
    int saved = dup(1), fd = open(at(d, "out.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(saved >= 0 && fd >= 0);
    assert_int_equal(dup2(fd, 1), 1);
    printf("the bill\n");
    cli_outputs *s = cli_outputs_new();
    int add = cli_outputs_add(s, "--json", "-", &err);
    int same = cli_outputs_add(s, "--svg", at(d, "out.txt"), &err); // what stdout is
    ag_err same_err = err;
    int wr = cli_outputs_write(s, "--json", text_writer, "{}\n", &err);
    int commit = cli_outputs_commit(s, &err);
    cli_outputs_free(s);
    fflush(stdout);
    assert_int_equal(dup2(saved, 1), 1);
    close(saved);
    close(fd);
    assert_int_equal(add, 0);
    assert_int_equal(same, -1);
    MENTIONS(same_err.msg, "same file as --json -");
    assert_int_equal(wr, 0);
    assert_int_equal(commit, 0);
    assert_string_equal(get(at(d, "out.txt")), "the bill\n{}\n");
}

// The model's safetensors as an output: staged mid-run, replaced only by a complete run.
static void test_model_files(void **state) {
    (void)state;
    const char *d = sub("model");
    mp_options mo = {0};
    assert_int_equal(mp_init(&mo), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    llama_config c;
    ag_err err = {{0}};
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s/tiny_tied/config.json", MEMBILL_GOLDEN_DIR);
    assert_int_equal(llama_config_load(&c, cfg, &err), 0);
    llama_model *m = NULL;
    assert_int_equal(llama_model_new(&m, ctx, &c, &err), 0);
    llama_model_init_random(m, 3);

    put(at(d, "g.safetensors"), "precious grads");
    put(at(d, "w.safetensors"), "precious weights");
    cli_outputs *s = cli_outputs_new();
    assert_int_equal(cli_outputs_add(s, "--dump-grads", at(d, "g.safetensors"), &err), 0);
    assert_int_equal(cli_outputs_add(s, "--save-weights", at(d, "w.safetensors"), &err), 0);
    assert_int_equal(cli_outputs_add(s, "--json", at(d, "r.json"), &err), 0);
    // No backward ran: the writer says which tensor has no gradient.
    assert_int_equal(cli_outputs_write(s, "--dump-grads", cli_model_writer, &(cli_model_file){m, true}, &err), -1);
    MENTIONS(err.msg, "--dump-grads");
    MENTIONS(err.msg, "model.embed_tokens.weight has no gradient");
    cli_outputs_free(s);
    assert_string_equal(get(at(d, "g.safetensors")), "precious grads");

    // Weights staged mid-run, then the run fails (out of budget, say): nothing replaced.
    s = cli_outputs_new();
    assert_int_equal(cli_outputs_add(s, "--save-weights", at(d, "w.safetensors"), &err), 0);
    assert_int_equal(cli_outputs_add(s, "--json", at(d, "r.json"), &err), 0);
    assert_int_equal(cli_outputs_write(s, "--save-weights", cli_model_writer, &(cli_model_file){m, false}, &err), 0);
    cli_outputs_free(s);
    assert_string_equal(get(at(d, "w.safetensors")), "precious weights");
    assert_int_equal(entries(d), 2);

    // A complete run: the file is a safetensors file of every parameter.
    s = cli_outputs_new();
    assert_int_equal(cli_outputs_add(s, "--save-weights", at(d, "w.safetensors"), &err), 0);
    assert_int_equal(cli_outputs_add(s, "--json", at(d, "r.json"), &err), 0);
    assert_int_equal(cli_outputs_write(s, "--save-weights", cli_model_writer, &(cli_model_file){m, false}, &err), 0);
    assert_int_equal(cli_outputs_write(s, "--json", text_writer, "{}", &err), 0);
    assert_int_equal(cli_outputs_commit(s, &err), 0);
    cli_outputs_free(s);
    llama_st_file *st = NULL;
    assert_int_equal(llama_st_open(&st, at(d, "w.safetensors"), &err), 0);
    llama_st_close(st);
    llama_model *back = NULL;
    assert_int_equal(llama_model_new(&back, ctx, &c, &err), 0);
    assert_int_equal(llama_model_load(back, at(d, "w.safetensors"), &err), 0);
    assert_memory_equal(back->embed->data, m->embed->data, (size_t)m->embed->numel * 4);
    llama_model_free(back);
    llama_model_free(m);
    ag_ctx_free(ctx);
    mp_shutdown();
    assert_int_equal(temporaries(d), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_and_replaced_files),
        cmocka_unit_test(test_devices_are_written_in_place),
        cmocka_unit_test(test_fifo_with_a_reader),
        cmocka_unit_test(test_symbolic_links),
        cmocka_unit_test(test_refused_before_the_run),
        cmocka_unit_test(test_all_or_none_when_a_writer_fails),
        cmocka_unit_test(test_all_or_none_when_a_folder_goes),
        cmocka_unit_test(test_unwritable_folders),
        cmocka_unit_test(test_long_names_and_stale_temporaries),
        cmocka_unit_test(test_signals_remove_temporaries),
        cmocka_unit_test(test_standard_output),
        cmocka_unit_test(test_model_files),
    };
#ifdef CLI_OUTPUTS_NO_TMPFILE
    const char *name = "output files (named temporaries)";
#else
    const char *name = "output files";
#endif
    return cmocka_run_group_tests_name(name, tests, make_dir, remove_dir);
}
