// Models by Hub id: the settings (huggingface_hub's environment variables), the id, and the
// Hugging Face cache as huggingface_hub lays it out (file_download.py): refs, snapshots of
// symlinks, blobs named by ETag. Reads trust nothing in the cache (a dangling symlink, one that
// leads outside the cache, a ref that is not a hash are each refused, naming the entry); writes
// are atomic and never replace what is there.
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hub_internal.h"

#include <stdarg.h>

bool hub_path(char *dst, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(dst, len, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < len;
}

// ---------------------------------------------------------------------------------------------
// Settings

static bool env_true(const char *name) {
    const char *v = getenv(name);
    if (!v) return false;
    static const char *const yes[] = {"1", "ON", "YES", "TRUE"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        if (strcasecmp(v, yes[i]) == 0) return true;
    return false;
}

// A path setting with "~/" expanded; false when it does not fit.
static bool set_path(char *dst, size_t len, const char *v) {
    const char *home = getenv("HOME");
    int n = v[0] == '~' && (v[1] == '/' || !v[1]) && home ? snprintf(dst, len, "%s%s", home, v + 1)
                                                          : snprintf(dst, len, "%s", v);
    return n >= 0 && (size_t)n < len;
}

// The stored token: the file's text, blanks around it removed ("" when there is none).
static void read_token_file(llama_hub *h) {
    char *text = NULL;
    size_t n = 0;
    ag_err ignored; // none there, or not a regular file: no token
    if (llama_read_file(h->token_file, "a token file", sizeof h->token - 1, &text, &n, &ignored) != 0) return;
    memcpy(h->token, text, n + 1);
    free(text);
    char *s = h->token;
    while (*s && isspace((unsigned char)*s)) s++;
    memmove(h->token, s, strlen(s) + 1);
    for (n = strlen(h->token); n && isspace((unsigned char)h->token[n - 1]);) h->token[--n] = 0;
    if (h->token[0]) h->token_from = h->token_file;
}

static int settings_paths(llama_hub *h, ag_err *err) {
    const char *v, *home = getenv("HOME");
    bool ok = true;
    char xdg[LLAMA_HUB_PATH_MAX];
    if ((v = getenv("HF_HOME")) && *v)
        ok = set_path(h->home, sizeof h->home, v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v)
        ok = set_path(xdg, sizeof xdg, v) &&
             snprintf(h->home, sizeof h->home, "%s/huggingface", xdg) < (int)sizeof h->home;
    else if (home && *home)
        ok = snprintf(h->home, sizeof h->home, "%s/.cache/huggingface", home) < (int)sizeof h->home;
    if ((v = getenv("HF_HUB_CACHE")) && *v)
        ok = ok && set_path(h->cache, sizeof h->cache, v);
    else if ((v = getenv("HUGGINGFACE_HUB_CACHE")) && *v)
        ok = ok && set_path(h->cache, sizeof h->cache, v);
    else if (h->home[0])
        ok = ok && snprintf(h->cache, sizeof h->cache, "%s/hub", h->home) < (int)sizeof h->cache;
    if ((v = getenv("HF_TOKEN_PATH")) && *v)
        ok = ok && set_path(h->token_file, sizeof h->token_file, v);
    else if (h->home[0])
        ok = ok && snprintf(h->token_file, sizeof h->token_file, "%s/token", h->home) < (int)sizeof h->token_file;
    if (!ok) {
        ag_err_set(err, "the Hugging Face cache's path (HF_HUB_CACHE, HF_HOME or HOME) is longer than %d bytes",
                   LLAMA_HUB_PATH_MAX - 1);
        return -1;
    }
    if (!h->cache[0]) {
        ag_err_set(err, "no Hugging Face cache folder: set HF_HUB_CACHE (or HF_HOME, or HOME)");
        return -1;
    }
    return 0;
}

int llama_hub_init(llama_hub *h, ag_err *err) {
    memset(h, 0, sizeof *h);
    if (settings_paths(h, err) != 0) return -1;
    const char *v = getenv("HF_ENDPOINT");
    if (snprintf(h->endpoint, sizeof h->endpoint, "%s", v && *v ? v : "https://huggingface.co") >=
        (int)sizeof h->endpoint) {
        ag_err_set(err, "HF_ENDPOINT is longer than %zu bytes", sizeof h->endpoint - 1);
        return -1;
    }
    for (size_t n = strlen(h->endpoint); n && h->endpoint[n - 1] == '/';) h->endpoint[--n] = 0;
    static const char *const token_vars[] = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"};
    for (size_t i = 0; i < 2 && !h->token[0]; i++)
        if ((v = getenv(token_vars[i])) && *v && strlen(v) < sizeof h->token) {
            snprintf(h->token, sizeof h->token, "%s", v);
            h->token_from = token_vars[i];
        }
    if (!h->token[0]) read_token_file(h);
    for (const char *p = h->token; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f) { // it goes into an HTTP header line
            ag_err_set(err, "the token from %s holds a blank or a control character", h->token_from);
            return -1;
        }
    h->offline = env_true("HF_HUB_OFFLINE") || env_true("TRANSFORMERS_OFFLINE");
    h->timeout_s = 10;
    if ((v = getenv("HF_HUB_DOWNLOAD_TIMEOUT")) && *v) {
        char *end;
        long t = strtol(v, &end, 10);
        if (*end || t < 1 || t > 86400) {
            ag_err_set(err, "HF_HUB_DOWNLOAD_TIMEOUT: expected whole seconds from 1 to 86400, not '%s'", v);
            return -1;
        }
        h->timeout_s = t;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// The id

bool llama_hub_is_id(const char *name) { return name && strchr(name, '/') != NULL; }

static bool word_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

// One part of an id: [A-Za-z0-9_.-]{1,96}, a letter, digit or '_' at both ends.
static bool id_part(const char *s, size_t n) {
    if (n < 1 || n > 96 || !word_char(s[0]) || !word_char(s[n - 1])) return false;
    for (size_t i = 0; i < n; i++)
        if (!word_char(s[i]) && s[i] != '-' && s[i] != '.') return false;
    return true;
}

// A branch, a tag or a commit: printable, no blank, no "..", no leading or doubled '/'.
static bool revision_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= LLAMA_HUB_REV_MAX || s[0] == '/' || s[n - 1] == '/' || strstr(s, "..") || strstr(s, "//"))
        return false;
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f || *p == '\\') return false;
    return true;
}

static bool is_commit(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (!isxdigit((unsigned char)s[n]) || isupper((unsigned char)s[n])) return false;
    return n == 40;
}

// The commit of the revision from refs/REVISION, when the cache has it; -1 if it is not a hash.
static int read_ref(llama_hub_repo *r, ag_err *err) {
    char path[LLAMA_HUB_PATH_MAX + LLAMA_HUB_REV_MAX + 8], text[64];
    snprintf(path, sizeof path, "%s/refs/%s", r->dir, r->revision);
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) return 0; // not cached: the Hub will name the commit
    char *got = NULL;
    size_t len = 0;
    ag_err ignored; // a FIFO, a device or a file too long there: "not a commit hash" below
    ssize_t n = llama_read_file(path, "a ref", sizeof text - 1, &got, &len, &ignored) == 0 ? (ssize_t)len : -1;
    if (got) memcpy(text, got, len + 1);
    free(got);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ')) n--; // an editor's newline
    text[n > 0 ? n : 0] = 0;
    if (!is_commit(text)) {
        ag_err_set(err,
                   "%s: not a commit hash (40 hex digits expected): a damaged cache entry; delete it to fetch "
                   "the revision again",
                   path);
        return -1;
    }
    return hub_set_commit(r, text, err);
}

int llama_hub_repo_init(const llama_hub *h, const char *text, llama_hub_repo *r, ag_err *err) {
    memset(r, 0, sizeof *r);
    const char *at = strchr(text, '@'), *slash = strchr(text, '/');
    size_t idlen = at ? (size_t)(at - text) : strlen(text);
    bool ok = slash && slash < text + idlen && id_part(text, (size_t)(slash - text)) &&
              id_part(slash + 1, idlen - (size_t)(slash + 1 - text));
    if (ok) {
        snprintf(r->id, sizeof r->id, "%.*s", (int)idlen, text);
        ok = !strstr(r->id, "--") && !strstr(r->id, "..") && !(idlen >= 4 && strcmp(r->id + idlen - 4, ".git") == 0);
    }
    if (!ok) {
        ag_err_set(err,
                   "--model %s: not a Hub id (org/name[@revision]: letters, digits, '-', '_' and '.', at most 96 "
                   "a part, no '--' or '..'; a local folder is --weights)",
                   text);
        return -1;
    }
    snprintf(r->revision, sizeof r->revision, "%s", at ? at + 1 : "main");
    if (!revision_ok(r->revision)) {
        ag_err_set(err, "--model %s: '%s' is not a revision (a branch, tag or commit: no blanks, '..' or '\\\\')", text,
                   r->revision);
        return -1;
    }
    // models--org--name: the id's '/' as "--" (which no part may hold)
    int org = (int)(slash - text);
    if (!hub_path(r->dir, sizeof r->dir - 512, "%s/models--%.*s--%s", h->cache, org, r->id, r->id + org + 1)) {
        ag_err_set(err, "%s: the cache path is too long", h->cache);
        return -1;
    }
    if (is_commit(r->revision)) return hub_set_commit(r, r->revision, err);
    return read_ref(r, err);
}

int hub_set_commit(llama_hub_repo *r, const char *commit, ag_err *err) {
    if (!is_commit(commit)) {
        ag_err_set(err, "%s: the Hub named commit '%.60s', which is not a commit hash", r->id, commit);
        return -1;
    }
    if (r->commit[0] && strcmp(r->commit, commit) != 0) {
        ag_err_set(err, "%s: the Hub answered with commit %s for files of commit %s", r->id, commit, r->commit);
        return -1;
    }
    snprintf(r->commit, sizeof r->commit, "%s", commit);
    hub_path(r->snapshot, sizeof r->snapshot, "%s/snapshots/%s", r->dir, commit); // dir leaves room
    return 0;
}

bool hub_plain_file(const char *file) {
    if (!file[0] || file[0] == '/' || strstr(file, "..") || strlen(file) > 200) return false;
    for (const char *p = file; *p; p++)
        if ((unsigned char)*p < ' ' || *p == 0x7f || *p == '\\') return false;
    return true;
}

// ---------------------------------------------------------------------------------------------
// Reading the cache

// A snapshot entry: 0 a file (through its symlink), 1 none, -1 a broken one.
static int check_entry(const llama_hub *h, const char *path, ag_err *err) {
    struct stat st;
    if (lstat(path, &st) != 0) return 1;
    if (S_ISLNK(st.st_mode)) {
        char target[PATH_MAX], cache[PATH_MAX];
        if (!realpath(path, target)) {
            char link[PATH_MAX];
            ssize_t n = readlink(path, link, sizeof link - 1);
            link[n > 0 ? n : 0] = 0;
            ag_err_set(err, "%s: a dangling symlink (to %s, which is missing): delete it to fetch the file again", path,
                       link);
            return -1;
        }
        size_t n = realpath(h->cache, cache) ? strlen(cache) : 0;
        if (!n || strncmp(target, cache, n) != 0 || target[n] != '/') {
            ag_err_set(err, "%s: a symlink that leads outside the cache (to %s): refused", path, target);
            return -1;
        }
        if (stat(path, &st) != 0) return 1;
    }
    if (!S_ISREG(st.st_mode)) {
        ag_err_set(err, "%s: not a file (a cache entry is a file or a symlink to a blob)", path);
        return -1;
    }
    return 0;
}

static int known_absent(const llama_hub_repo *r, const char *file) {
    char path[2 * LLAMA_HUB_PATH_MAX];
    snprintf(path, sizeof path, "%s/.no_exist/%s/%s", r->dir, r->commit, file);
    return access(path, F_OK) == 0;
}

// The cache's answer for a file of the repo's commit (none known: not cached).
int hub_cached(const llama_hub *h, const llama_hub_repo *r, const char *file, char *path, size_t len, ag_err *err) {
    if (!r->commit[0]) return LLAMA_HUB_NOT_CACHED;
    if (snprintf(path, len, "%s/%s", r->snapshot, file) >= (int)len) {
        ag_err_set(err, "%s: path too long", r->snapshot);
        return -1;
    }
    int rc = check_entry(h, path, err);
    if (rc <= 0) return rc;
    return known_absent(r, file) ? LLAMA_HUB_ABSENT : LLAMA_HUB_NOT_CACHED;
}

int llama_hub_file(const llama_hub *h, llama_hub_repo *r, const char *file, bool fetch, char *path, size_t len,
                   ag_err *err) {
    if (!hub_plain_file(file)) {
        ag_err_set(err, "%s: '%s' is not a file name of a repo", r->id, file);
        return -1;
    }
    int rc = hub_cached(h, r, file, path, len, err);
    if (rc != LLAMA_HUB_NOT_CACHED) return rc;
    if (!fetch || h->offline) {
        ag_err_set(err, "%s: %s of revision %s is not in the cache (%s)%s", r->id, file, r->revision, h->cache,
                   h->offline ? " and the Hub is not to be asked (offline)" : "");
        return LLAMA_HUB_NOT_CACHED;
    }
    return hub_fetch_small(h, r, file, path, len, err);
}

// ---------------------------------------------------------------------------------------------
// Writing the cache

int hub_make_parents(const char *path, ag_err *err) {
    char dir[LLAMA_HUB_PATH_MAX * 2];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
            ag_err_set(err, "%s: cannot make the folder: %s", dir, strerror(errno));
            return -1;
        }
        *p = '/';
    }
    return 0;
}

int hub_write_atomic(const char *path, const void *bytes, size_t len, ag_err *err) {
    char tmp[LLAMA_HUB_PATH_MAX * 2 + 16];
    if (hub_make_parents(path, err) != 0) return -1;
    snprintf(tmp, sizeof tmp, "%s.XXXXXX.tmp", path);
    int fd = mkstemps(tmp, 4);
    if (fd < 0) {
        ag_err_set(err, "%s: cannot write: %s", path, strerror(errno));
        return -1;
    }
    size_t done = 0;
    while (done < len) {
        ssize_t k = write(fd, (const char *)bytes + done, len - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        done += (size_t)k;
    }
    int errnum = done == len ? 0 : errno ? errno : EIO;
    if (fchmod(fd, 0644) != 0 && !errnum) errnum = errno;
    if (close(fd) != 0 && !errnum) errnum = errno;
    if (!errnum && rename(tmp, path) != 0) errnum = errno;
    if (errnum) {
        unlink(tmp);
        ag_err_set(err, "%s: cannot write: %s", path, strerror(errnum));
        return -1;
    }
    return 0;
}

// The Hub's ETags are hex digests; anything else could not be a file name of blobs/.
static bool etag_ok(const char *etag) {
    size_t n = strlen(etag);
    if (n == 0 || n > 128 || etag[0] == '.') return false;
    for (const char *p = etag; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.') return false;
    return true;
}

// The snapshot's entry for file: a relative symlink to the blob (../ once per folder level).
static int link_entry(const llama_hub_repo *r, const char *file, const char *etag, ag_err *err) {
    char entry[LLAMA_HUB_PATH_MAX * 2], target[LLAMA_HUB_PATH_MAX];
    snprintf(entry, sizeof entry, "%s/%s", r->snapshot, file);
    size_t k = 0, up = 2;
    for (const char *p = file; *p; p++) up += *p == '/';
    for (size_t i = 0; i < up; i++) k += (size_t)snprintf(target + k, sizeof target - k, "../");
    snprintf(target + k, sizeof target - k, "blobs/%s", etag);
    if (hub_make_parents(entry, err) != 0) return -1;
    if (symlink(target, entry) == 0 || errno == EEXIST) return 0; // EEXIST: another process made it
    ag_err_set(err, "%s: cannot make the symlink: %s", entry, strerror(errno));
    return -1;
}

static int write_ref(const llama_hub_repo *r, ag_err *err) {
    if (strcmp(r->revision, r->commit) == 0) return 0;
    char path[LLAMA_HUB_PATH_MAX + LLAMA_HUB_REV_MAX + 8], text[64] = "";
    snprintf(path, sizeof path, "%s/refs/%s", r->dir, r->revision);
    char *got = NULL;
    size_t len = 0;
    ag_err ignored; // none yet, or not a ref file: written anew
    if (llama_read_file(path, "a ref", sizeof text - 1, &got, &len, &ignored) == 0) memcpy(text, got, len + 1);
    free(got);
    return strcmp(text, r->commit) == 0 ? 0 : hub_write_atomic(path, r->commit, strlen(r->commit), err);
}

int hub_commit_file(const llama_hub_repo *r, const char *file, const char *etag, const char *tmp, ag_err *err) {
    char blob[LLAMA_HUB_PATH_MAX + 256];
    if (!etag_ok(etag)) {
        unlink(tmp);
        ag_err_set(err, "%s: the Hub's ETag for %s, '%.60s', cannot name a blob", r->id, file, etag);
        return -1;
    }
    snprintf(blob, sizeof blob, "%s/blobs/%s", r->dir, etag);
    if (access(blob, F_OK) == 0)
        unlink(tmp); // the same content already there: leave it as it is
    else if (rename(tmp, blob) != 0) {
        ag_err_set(err, "%s: cannot move the download into place: %s", blob, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return link_entry(r, file, etag, err) == 0 ? write_ref(r, err) : -1;
}

// ---------------------------------------------------------------------------------------------
// URLs and the Hub's refusals

static size_t pct_encode(char *dst, size_t len, const char *s, bool keep_slash) {
    size_t k = 0;
    for (; *s && k + 4 < len; s++) {
        unsigned char c = (unsigned char)*s;
        if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/'))
            dst[k++] = (char)c;
        else
            k += (size_t)snprintf(dst + k, len - k, "%%%02X", c);
    }
    dst[k] = 0;
    return *s ? 0 : k;
}

int hub_url(const llama_hub *h, const llama_hub_repo *r, const char *file, char *url, size_t len, ag_err *err) {
    char rev[3 * LLAMA_HUB_REV_MAX], name[1024];
    pct_encode(rev, sizeof rev, r->commit[0] ? r->commit : r->revision, false);
    if (!pct_encode(name, sizeof name, file, true) ||
        snprintf(url, len, "%s/%s/resolve/%s/%s", h->endpoint, r->id, rev, name) >= (int)len) {
        ag_err_set(err, "%s: the URL of %s is too long", r->id, file);
        return -1;
    }
    return 0;
}

// How to pass a token, for the messages of gated and private repos.
static const char *token_hint(const llama_hub *h, char *buf, size_t len) {
    snprintf(buf, len, "pass a token: HF_TOKEN=hf_..., or the token file %s (hf auth login writes it)", h->token_file);
    return buf;
}

void hub_status_error(const llama_hub *h, const llama_hub_repo *r, const char *file, const hub_get *g, ag_err *err) {
    char hint[LLAMA_HUB_PATH_MAX + 96], page[1400];
    snprintf(page, sizeof page, "%s/%s", h->endpoint, r->id);
    const char *code = g->error_code;
    long s = g->status;
    if ((s == 401 || s == 403) && strcmp(code, "GatedRepo") == 0) {
        if (h->token_from)
            ag_err_set(err, "%s is gated and the token from %s has no access to it (%ld): accept its conditions at %s",
                       r->id, h->token_from, s, page);
        else
            ag_err_set(err, "%s is gated (%ld): accept its conditions at %s, then %s", r->id, s, page,
                       token_hint(h, hint, sizeof hint));
    } else if (s == 401 || (s == 404 && strcmp(code, "RepoNotFound") == 0)) {
        if (h->token_from)
            ag_err_set(err, "%s: repository not found (%ld), or private and the token from %s cannot see it", r->id, s,
                       h->token_from);
        else
            ag_err_set(err, "%s: repository not found (%ld); if it is private or gated, %s", r->id, s,
                       token_hint(h, hint, sizeof hint));
    } else if (s == 403)
        ag_err_set(err, "%s: access to %s refused (403%s%s)%s%s", r->id, file, g->error_message[0] ? ": " : "",
                   g->error_message, h->token_from ? "; the token from " : "", h->token_from ? h->token_from : "");
    else if (s == 404 && strcmp(code, "RevisionNotFound") == 0)
        ag_err_set(err, "%s: unknown revision '%s' (404: no such branch, tag or commit)", r->id, r->revision);
    else if (s == 404)
        ag_err_set(err, "%s: %s not found at revision %s (404)", r->id, file, r->revision);
    else if (s == 429 || s >= 500)
        ag_err_set(err, "%s: the Hub answered %ld for %s: try again later", r->id, s, file);
    else
        ag_err_set(err, "%s: the Hub answered HTTP %ld for %s", r->id, s, file);
}
