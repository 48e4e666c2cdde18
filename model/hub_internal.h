// Private to model/hub*.c: one HTTP request (hub_http.c, on libcurl; hub_http_none.c without
// it) and the cache's file operations that hub.c and hub_fetch.c share.
#pragma once

#include "model_internal.h"

// One GET of url. The body goes into fd (written from byte fd_base on; a 200 answering a range
// request starts it over at 0) or, with fd < 0, into mem (at most cap bytes: more is refused).
typedef struct {
    const char *url;
    bool range; // send Range: bytes=from-to (to UINT64_MAX: to the end)
    uint64_t from, to;
    int fd;
    uint64_t fd_base;
    char *mem;
    size_t cap;
    const char *file; // named in the progress callback
    // The answer: the final response's status, and the Hub's headers from whichever response of
    // the redirects carried them (its own, before the redirect to the storage's).
    long status;
    uint64_t received;                       // body bytes
    char commit[48];                         // X-Repo-Commit
    char etag[160];                          // X-Linked-Etag, else ETag, quotes and W/ removed
    char error_code[64], error_message[160]; // X-Error-Code, X-Error-Message
    bool has_size;                           // X-Linked-Size, else the total of Content-Range, else Content-Length
    uint64_t size;
    bool partial;         // 206 with a Content-Range
    bool unreachable;     // no connection came up (no network, a wrong HF_ENDPOINT)
    uint64_t range_start; // its first byte
} hub_get;

// 0 when a response came (whatever its status); -1 when none did or its body was cut (no
// network, a timeout, a redirect loop, a truncated body), with one line in err. Without libcurl,
// or without a connection, g->unreachable is set too.
int hub_http_get(const llama_hub *h, hub_get *g, ag_err *err);

// hub.c: the cache's atomic writes. Each writes a temporary file beside its target and renames
// it over, so that a reader sees the old state or the new one, never half of it.
int hub_write_atomic(const char *path, const void *bytes, size_t len, ag_err *err);
// mkdir -p of the folders above path (path itself not made).
int hub_make_parents(const char *path, ag_err *err);
// A new blob (a finished temporary file) into blobs/ETAG, its snapshot entry pointed at it, the
// revision's ref set to the commit: in that order, so that nothing points at what is not there.
int hub_commit_file(const llama_hub_repo *r, const char *file, const char *etag, const char *tmp, ag_err *err);
// The revision's ref and the snapshot folder once the commit is known (r->commit, r->snapshot).
int hub_set_commit(llama_hub_repo *r, const char *commit, ag_err *err);
// ENDPOINT/org/name/resolve/REVISION/FILE, the revision and the file percent-encoded.
int hub_url(const llama_hub *h, const llama_hub_repo *r, const char *file, char *url, size_t len, ag_err *err);
// A response's status as one line: gated, not found, unknown revision, forbidden...
void hub_status_error(const llama_hub *h, const llama_hub_repo *r, const char *file, const hub_get *g, ag_err *err);
// Whether the name is a plain file name of the repo (no "..", no leading '/', printable).
bool hub_plain_file(const char *file);
// The cache's answer for a file of the repo's known commit: LLAMA_HUB_FOUND (path filled),
// LLAMA_HUB_ABSENT (.no_exist), LLAMA_HUB_NOT_CACHED, or -1 for a broken entry.
int hub_cached(const llama_hub *h, const llama_hub_repo *r, const char *file, char *path, size_t len, ag_err *err);
// A file fetched whole from the Hub into the cache (hub_fetch.c); as llama_hub_file.
int hub_fetch_small(const llama_hub *h, llama_hub_repo *r, const char *file, char *path, size_t len, ag_err *err);
// snprintf into a path buffer: false when it does not fit (paths are checked where they are made).
bool hub_path(char *dst, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
