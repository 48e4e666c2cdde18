// What comes from the Hub: small files whole (config.json, tokenizer.json, the index), each
// safetensors file's header alone (two range requests), and the weights on request, resumable.
// Everything lands in the cache's layout (hub.c) only once it is whole and checked.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "hub_internal.h"

// The largest file fetched whole without --download (tokenizer.json runs to tens of MB).
#define SMALL_FILE_MAX (1ULL << 30)
// safetensors' own limit on a header (huggingface_hub's SAFETENSORS_MAX_HEADER_LENGTH).
#define HEADER_MAX 25000000ULL
#define HEADERS_DIR ".membill_headers"

// A fetch that failed leaves no folder it made empty behind: a repo folder without snapshots/
// is a corrupt entry to huggingface_hub's scan_cache_dir. rmdir removes empty folders only.
static void tidy(const llama_hub_repo *r) {
    char blobs[LLAMA_HUB_PATH_MAX + 8];
    hub_path(blobs, sizeof blobs, "%s/blobs", r->dir);
    rmdir(blobs);
    rmdir(r->dir);
}

static int make_temp(const llama_hub_repo *r, char *tmp, size_t len, ag_err *err) {
    snprintf(tmp, len, "%s/blobs/membill.XXXXXX.incomplete", r->dir);
    if (hub_make_parents(tmp, err) != 0) return -1;
    int fd = mkstemps(tmp, 11);
    if (fd < 0)
        ag_err_set(err, "%s/blobs: cannot write: %s", r->dir, strerror(errno));
    else if (fchmod(fd, 0644) != 0) {
        ag_err_set(err, "%s: cannot set its mode: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return -1;
    }
    return fd;
}

// The Hub's headers a file is filed under: the commit and the ETag.
static int answer_ok(const llama_hub *h, llama_hub_repo *r, const char *file, const hub_get *g, ag_err *err) {
    if (!g->commit[0]) {
        ag_err_set(err, "%s answered %s without X-Repo-Commit: not the Hub's API (check HF_ENDPOINT)", h->endpoint,
                   file);
        return -1;
    }
    if (!g->etag[0]) {
        ag_err_set(err, "%s: the Hub answered %s without an ETag", r->id, file);
        return -1;
    }
    return hub_set_commit(r, g->commit, err);
}

// A 404 that means the file is not in the repo, recorded as huggingface_hub records it.
static bool entry_not_found(const hub_get *g, llama_hub_repo *r, const char *file) {
    if (g->status != 404 || strcmp(g->error_code, "EntryNotFound") != 0) return false;
    if (g->commit[0] && hub_set_commit(r, g->commit, NULL) == 0) {
        char path[2 * LLAMA_HUB_PATH_MAX];
        // a hint for later runs (failing to write it changes nothing), in a repo folder that
        // has its snapshots/ folder, as every repo folder of the cache must
        if (hub_path(path, sizeof path, "%s/snapshots/", r->dir) && hub_make_parents(path, NULL) == 0 &&
            hub_path(path, sizeof path, "%s/.no_exist/%s/%s", r->dir, r->commit, file))
            hub_write_atomic(path, "", 0, NULL);
    }
    return true;
}

int hub_fetch_small(const llama_hub *h, llama_hub_repo *r, const char *file, char *path, size_t len, ag_err *err) {
    char url[4096], tmp[LLAMA_HUB_PATH_MAX + 64];
    if (hub_url(h, r, file, url, sizeof url, err) != 0) return -1;
    int fd = make_temp(r, tmp, sizeof tmp, err);
    if (fd < 0) return -1;
    hub_get g = {.url = url, .fd = fd, .cap = SMALL_FILE_MAX, .file = file};
    int rc = hub_http_get(h, &g, err);
    if (rc != 0 && g.unreachable) rc = LLAMA_HUB_NOT_CACHED;
    if (close(fd) != 0 && rc == 0) {
        ag_err_set(err, "%s: cannot write: %s", tmp, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && entry_not_found(&g, r, file))
        rc = LLAMA_HUB_ABSENT;
    else if (rc == 0 && g.status != 200)
        hub_status_error(h, r, file, &g, err), rc = -1;
    else if (rc == 0 && answer_ok(h, r, file, &g, err) != 0)
        rc = -1;
    else if (rc == 0 && g.has_size && g.received != g.size) {
        ag_err_set(err, "%s: %s came with %llu bytes of the %llu announced", r->id, file,
                   (unsigned long long)g.received, (unsigned long long)g.size);
        rc = -1;
    }
    if (rc != 0) {
        unlink(tmp);
        tidy(r);
        return rc;
    }
    r->fetched = true;
    if (hub_commit_file(r, file, g.etag, tmp, err) != 0) return -1;
    snprintf(path, len, "%s/%s", r->snapshot, file);
    return LLAMA_HUB_FOUND;
}

// ---------------------------------------------------------------------------------------------
// Headers of safetensors files: a record of "membill-header SIZE ETAG\n", then the file's first
// 8 + N bytes (its header length and header), by commit and file name.

typedef struct {
    uint64_t size;
    char etag[160];
    uint8_t *bytes; // 8 + header length
    size_t len;
} header_record;

static void record_path(const llama_hub_repo *r, const char *file, char *path, size_t len) {
    snprintf(path, len, "%s/" HEADERS_DIR "/%s/%s", r->dir, r->commit, file);
}

// 0 read, 1 none, -1 damaged.
static int read_record(const llama_hub_repo *r, const char *file, header_record *rec, ag_err *err) {
    char path[2 * LLAMA_HUB_PATH_MAX];
    if (!r->commit[0]) return 1;
    record_path(r, file, path, sizeof path);
    if (access(path, F_OK) != 0) return 1;
    char *text;
    size_t len;
    if (llama_read_file(path, "a header record", HEADER_MAX + 512, &text, &len, err) != 0) return -1;
    char *nl = memchr(text, '\n', len);
    unsigned long long size = 0;
    int used = 0;
    if (nl) *nl = 0;
    bool ok = nl && sscanf(text, "membill-header %llu %159s%n", &size, rec->etag, &used) == 2 && text + used == nl;
    if (ok) {
        rec->size = size;
        rec->len = len - (size_t)(nl + 1 - text);
        memmove(text, nl + 1, rec->len);
        rec->bytes = (uint8_t *)text;
        return 0;
    }
    free(text);
    ag_err_set(err, "%s: a damaged header record: delete it to fetch the header again", path);
    return -1;
}

static int write_record(const llama_hub_repo *r, const char *file, const header_record *rec, ag_err *err) {
    char path[2 * LLAMA_HUB_PATH_MAX], head[256];
    record_path(r, file, path, sizeof path);
    int k = snprintf(head, sizeof head, "membill-header %llu %s\n", (unsigned long long)rec->size, rec->etag);
    char *all = malloc((size_t)k + rec->len);
    if (!all) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    memcpy(all, head, (size_t)k);
    memcpy(all + k, rec->bytes, rec->len);
    int rc = hub_write_atomic(path, all, (size_t)k + rec->len, err);
    free(all);
    return rc;
}

// One range of a file into mem (len bytes exactly): 0, LLAMA_HUB_ABSENT, or -1.
static int get_range(const llama_hub *h, llama_hub_repo *r, const char *file, uint64_t from, size_t len, void *mem,
                     hub_get *g, ag_err *err) {
    char url[4096];
    if (hub_url(h, r, file, url, sizeof url, err) != 0) return -1;
    *g = (hub_get){
        .url = url, .range = true, .from = from, .to = from + len - 1, .fd = -1, .mem = mem, .cap = len, .file = file};
    if (hub_http_get(h, g, err) != 0) return g->unreachable ? LLAMA_HUB_NOT_CACHED : -1;
    if (entry_not_found(g, r, file)) return LLAMA_HUB_ABSENT;
    if (g->status != 206 && g->status != 200) {
        hub_status_error(h, r, file, g, err);
        return -1;
    }
    if (answer_ok(h, r, file, g, err) != 0) return -1;
    if (!g->has_size) {
        ag_err_set(err, "%s: the Hub did not say the size of %s", r->id, file);
        return -1;
    }
    if (g->received != len || (g->status == 206 && g->range_start != from)) {
        ag_err_set(err, "%s: %s: asked for bytes %llu to %llu, got %llu bytes%s", r->id, file, (unsigned long long)from,
                   (unsigned long long)(from + len - 1), (unsigned long long)g->received,
                   g->status == 206 && g->range_start != from ? " from elsewhere in the file" : "");
        return -1;
    }
    return 0;
}

// The header of a safetensors file of the repo: from its record, else fetched (unless offline).
static int file_header(const llama_hub *h, llama_hub_repo *r, const char *file, header_record *rec, ag_err *err) {
    memset(rec, 0, sizeof *rec);
    int rc = read_record(r, file, rec, err);
    if (rc <= 0) return rc;
    if (h->offline) {
        ag_err_set(err, "%s: the header of %s is not in the cache and the Hub is not to be asked (offline)", r->id,
                   file);
        return LLAMA_HUB_NOT_CACHED;
    }
    uint8_t len8[8];
    hub_get g;
    if ((rc = get_range(h, r, file, 0, 8, len8, &g, err)) != 0) return rc;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    if (n > g.size - 8 || n > HEADER_MAX) {
        ag_err_set(err, "%s: %s: header length %llu goes past the end of the file (%llu bytes)%s", r->id, file,
                   (unsigned long long)n, (unsigned long long)g.size, n > HEADER_MAX ? " or past 25 MB" : "");
        return -1;
    }
    rec->size = g.size;
    snprintf(rec->etag, sizeof rec->etag, "%s", g.etag);
    rec->len = 8 + (size_t)n;
    if (!(rec->bytes = malloc(rec->len))) {
        ag_err_set(err, "out of memory for a header of %llu bytes", (unsigned long long)n);
        return -1;
    }
    memcpy(rec->bytes, len8, 8);
    if (n && (rc = get_range(h, r, file, 8, (size_t)n, rec->bytes + 8, &g, err)) != 0) {
        free(rec->bytes);
        rec->bytes = NULL;
        return rc == LLAMA_HUB_ABSENT ? -1 : rc;
    }
    r->fetched = true;
    // A header that does not parse is not kept: the next run asks again.
    llama_st_file *f;
    char name[600];
    snprintf(name, sizeof name, "%s/%s", r->id, file); // named by its file's name, as in a folder
    if (llama_st_open_header(&f, name, rec->bytes, rec->len, rec->size, err) != 0) return -1;
    llama_st_close(f);
    return write_record(r, file, rec, err);
}

// ---------------------------------------------------------------------------------------------
// The checkpoint

typedef struct {
    const llama_hub *h;
    llama_hub_repo *r;
    llama_hub_weights *w;
    int not_cached; // a file's header could not be had offline
} opener_state;

static int add_shard(llama_hub_weights *w, const char *name, uint64_t size, const char *etag, bool cached) {
    llama_hub_shard *grown = realloc(w->files, (w->n + 1) * sizeof *grown);
    if (!grown) return -1;
    w->files = grown;
    llama_hub_shard *s = &w->files[w->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->etag, sizeof s->etag, "%s", etag);
    s->size = size;
    s->cached = cached;
    w->bytes += size;
    w->missing_bytes += cached ? 0 : size;
    return 0;
}

// A file of the checkpoint: the cached file itself, else its header.
static int open_shard(void *arg, const char *name, llama_st_file **out, ag_err *err) {
    opener_state *s = arg;
    char path[LLAMA_HUB_PATH_MAX * 2];
    int rc = hub_cached(s->h, s->r, name, path, sizeof path, err);
    if (rc < 0) return -1;
    if (rc == LLAMA_HUB_FOUND) {
        struct stat st;
        if (llama_st_open(out, path, err) != 0 || stat(path, &st) != 0) return -1;
        return add_shard(s->w, name, (uint64_t)st.st_size, "", true) == 0 ? 0 : (ag_err_set(err, "out of memory"), -1);
    }
    header_record rec;
    rc = file_header(s->h, s->r, name, &rec, err);
    if (rc == LLAMA_HUB_NOT_CACHED) s->not_cached = 1;
    if (rc == LLAMA_HUB_ABSENT) ag_err_set(err, "the Hub has no such file (404)");
    if (rc != 0) return -1;
    char shown[600];
    snprintf(shown, sizeof shown, "%s/%s", s->r->id, name); // an index names its shards by file name
    rc = llama_st_open_header(out, shown, rec.bytes, rec.len, rec.size, err);
    if (rc == 0 && add_shard(s->w, name, rec.size, rec.etag, false) != 0) {
        ag_err_set(err, "out of memory");
        rc = -1;
    }
    free(rec.bytes);
    return rc;
}

static const char single[] = "model.safetensors", index_file[] = "model.safetensors.index.json";

// Which layout the repo has: 0 one file, 1 an index, else LLAMA_HUB_NOT_CACHED or -1.
static int which_layout(const llama_hub *h, llama_hub_repo *r, ag_err *err) {
    char path[LLAMA_HUB_PATH_MAX * 2];
    int rc = hub_cached(h, r, single, path, sizeof path, err);
    if (rc == LLAMA_HUB_FOUND || rc < 0) return rc;
    if (rc == LLAMA_HUB_ABSENT) return 1;
    if ((rc = hub_cached(h, r, index_file, path, sizeof path, err)) < 0) return rc;
    if (rc == LLAMA_HUB_FOUND) return 1;
    header_record rec;
    rc = file_header(h, r, single, &rec, err);
    free(rec.bytes);
    return rc == LLAMA_HUB_ABSENT ? 1 : rc;
}

int llama_hub_weights_open(const llama_hub *h, llama_hub_repo *r, llama_hub_weights *w, ag_err *err) {
    memset(w, 0, sizeof *w);
    int layout = which_layout(h, r, err);
    if (layout != 0 && layout != 1) return layout;
    if (!r->commit[0]) { // an earlier file fixes the commit; on its own, ask for the index first
        ag_err_set(err, "%s: no commit known for revision %s", r->id, r->revision);
        return -1;
    }
    hub_path(w->path, sizeof w->path, "%s/%s", r->snapshot, layout ? index_file : single);
    if (layout) {
        int rc = llama_hub_file(h, r, index_file, true, w->path, sizeof w->path, err);
        if (rc == LLAMA_HUB_ABSENT)
            ag_err_set(err, "%s has no safetensors weights (neither %s nor %s)", r->id, single, index_file);
        if (rc != 0) return rc;
    }
    opener_state s = {h, r, w, 0};
    if (llama_ckpt_open_with(&w->ckpt, w->path, open_shard, &s, err) != 0) {
        llama_hub_weights_close(w);
        return s.not_cached ? LLAMA_HUB_NOT_CACHED : -1;
    }
    return LLAMA_HUB_FOUND;
}

void llama_hub_weights_close(llama_hub_weights *w) {
    llama_ckpt_close(w->ckpt);
    free(w->files);
    memset(w, 0, sizeof *w);
}

// ---------------------------------------------------------------------------------------------
// Downloads

// huggingface_hub's lock of a blob (filelock's flock on CACHE/.locks/models--org--name/ETAG.lock),
// so that it and membill never write one blob at once.
static int lock_blob(const llama_hub *h, const llama_hub_repo *r, const char *etag, ag_err *err) {
    char path[LLAMA_HUB_PATH_MAX * 2];
    const char *folder = strrchr(r->dir, '/');
    hub_path(path, sizeof path, "%s/.locks/%s/%s.lock", h->cache, folder ? folder + 1 : r->dir, etag);
    if (hub_make_parents(path, err) != 0) return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0664);
    // another process downloading the blob (another rank of the job, huggingface_hub): wait for it;
    // a file system without flock goes on unlocked, as huggingface_hub's soft lock would
    while (fd >= 0 && flock(fd, LOCK_EX) != 0 && errno == EINTR) continue;
    if (fd < 0) ag_err_set(err, "%s: %s", path, strerror(errno));
    return fd;
}

static int enough_space(const char *dir, uint64_t need, ag_err *err) {
    struct statvfs v;
    if (statvfs(dir, &v) != 0 || (uint64_t)v.f_bavail * v.f_frsize >= need) return 0;
    ag_err_set(err, "%s: %llu bytes to download, %llu free on its disk", dir, (unsigned long long)need,
               (unsigned long long)((uint64_t)v.f_bavail * v.f_frsize));
    return -1;
}

// The rest of a file into fd, which holds its first `have` bytes: a range request from there (a
// 200 in answer starts the file over). 0 once fd holds the whole file.
static int fetch_rest(const llama_hub *h, const llama_hub_repo *r, const llama_hub_shard *s, int fd, uint64_t have,
                      const char *part, ag_err *err) {
    char url[4096];
    if (hub_url(h, r, s->name, url, sizeof url, err) != 0) return -1;
    hub_get g = {.url = url,
                 .range = have > 0,
                 .from = have,
                 .to = UINT64_MAX,
                 .fd = fd,
                 .fd_base = have,
                 .cap = s->size,
                 .file = s->name};
    struct stat st;
    int rc = hub_http_get(h, &g, err);
    if (rc != 0 && fstat(fd, &st) == 0 && st.st_size) {
        ag_err cut = *err;
        ag_err_set(err, "%s; the %llu bytes of %s received are kept: run again to resume", cut.msg,
                   (unsigned long long)st.st_size, s->name);
    }
    if (rc != 0) return -1;
    if (g.status != 200 && g.status != 206) {
        hub_status_error(h, r, s->name, &g, err);
        return -1;
    }
    if (g.etag[0] && strcmp(g.etag, s->etag) != 0) {
        ag_err_set(err, "%s: %s changed on the Hub (ETag %s, its header's %s)", r->id, s->name, g.etag, s->etag);
        return -1;
    }
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != s->size) {
        ag_err_set(err, "%s: %s stopped at %llu of %llu bytes (%s is kept: run again to resume)", r->id, s->name,
                   (unsigned long long)st.st_size, (unsigned long long)s->size, part);
        return -1;
    }
    if (fsync(fd) != 0) {
        ag_err_set(err, "%s: %s", part, strerror(errno));
        return -1;
    }
    return 0;
}

// One file into blobs/ETAG.incomplete from where it stopped, then into place.
static int download_one(const llama_hub *h, llama_hub_repo *r, llama_hub_shard *s, ag_err *err) {
    char part[LLAMA_HUB_PATH_MAX + 200], blobs[LLAMA_HUB_PATH_MAX + 8];
    hub_path(blobs, sizeof blobs, "%s/blobs", r->dir);
    hub_path(part, sizeof part, "%s/%s.incomplete", blobs, s->etag);
    int lock = lock_blob(h, r, s->etag, err);
    if (lock < 0) return -1;
    char blob[LLAMA_HUB_PATH_MAX + 200];
    hub_path(blob, sizeof blob, "%s/%s", blobs, s->etag);
    if (access(blob, F_OK) == 0) { // the process that held the lock brought it
        int rc = hub_commit_file(r, s->name, s->etag, part, err);
        close(lock);
        return rc;
    }
    int fd = hub_make_parents(part, err) == 0 ? open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
    struct stat st;
    int rc = -1;
    if (fd < 0 || fstat(fd, &st) != 0) {
        ag_err_set(err, "%s: cannot write: %s", part, strerror(errno));
    } else {
        uint64_t have = (uint64_t)st.st_size;
        if (have > s->size && ftruncate(fd, 0) == 0) have = 0; // not a part of this file: start over
        if (have > s->size)
            ag_err_set(err, "%s: cannot start it over: %s", part, strerror(errno));
        else if (have == s->size || enough_space(blobs, s->size - have, err) == 0)
            rc = have == s->size ? 0 : fetch_rest(h, r, s, fd, have, part, err);
    }
    if (fd >= 0) close(fd);
    if (rc == 0) rc = hub_commit_file(r, s->name, s->etag, part, err);
    close(lock);
    return rc;
}

int llama_hub_download(const llama_hub *h, llama_hub_repo *r, llama_hub_weights *w, ag_err *err) {
    if (h->offline && w->missing_bytes) {
        ag_err_set(err, "%s: the weights are not all in the cache and the Hub is not to be asked (offline)", r->id);
        return -1;
    }
    for (size_t i = 0; i < w->n; i++) {
        llama_hub_shard *s = &w->files[i];
        if (s->cached) continue;
        if (download_one(h, r, s, err) != 0) return -1;
        s->cached = true;
        w->missing_bytes -= s->size;
        r->fetched = true;
    }
    return 0;
}
