// One GET on libcurl: redirects followed (at most 10), a stall or a connection that does not come
// up in HF_HUB_DOWNLOAD_TIMEOUT seconds given up, the body into a file or a bounded buffer, and
// the Hub's own headers kept from whichever response of the redirects carried them.
//
// libcurl is loaded when the Hub is first asked (dlopen), not linked: with it and the thirty
// libraries it brings, every membill process takes twice as long to start, which no run that
// reads no Hub file should pay.
#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "hub_internal.h"

#define MAX_REDIRECTS 10

bool llama_hub_has_http(void) { return true; }

static struct {
    CURLcode (*global_init)(long);
    CURL *(*easy_init)(void);
    CURLcode (*setopt)(CURL *, CURLoption, ...);
    CURLcode (*perform)(CURL *);
    void (*cleanup)(CURL *);
    const char *(*strerror)(CURLcode);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
    bool ready;
} cu;

static int load_curl(ag_err *err) {
    static const struct {
        const char *name;
        size_t offset;
    } symbols[] = {
        {"curl_global_init", offsetof(__typeof__(cu), global_init)},
        {"curl_easy_init", offsetof(__typeof__(cu), easy_init)},
        {"curl_easy_setopt", offsetof(__typeof__(cu), setopt)},
        {"curl_easy_perform", offsetof(__typeof__(cu), perform)},
        {"curl_easy_cleanup", offsetof(__typeof__(cu), cleanup)},
        {"curl_easy_strerror", offsetof(__typeof__(cu), strerror)},
        {"curl_slist_append", offsetof(__typeof__(cu), slist_append)},
        {"curl_slist_free_all", offsetof(__typeof__(cu), slist_free_all)},
    };
    if (cu.ready) return 0;
    void *lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; lib && i < sizeof symbols / sizeof symbols[0]; i++) {
        void *fn = dlsym(lib, symbols[i].name);
        if (!fn) {
            ag_err_set(err, "libcurl.so.4 lacks %s: reinstall libcurl4", symbols[i].name);
            return -1;
        }
        memcpy((char *)&cu + symbols[i].offset, &fn, sizeof fn);
    }
    if (!lib) {
        ag_err_set(err, "libcurl cannot be loaded (%s): apt-get install libcurl4 to reach the Hub", dlerror());
        return -1;
    }
    if (cu.global_init(CURL_GLOBAL_DEFAULT) != 0) {
        ag_err_set(err, "libcurl did not start");
        return -1;
    }
    cu.ready = true;
    return 0;
}

// One response's headers, until its blank line.
typedef struct {
    long status;
    char commit[48], etag[160], linked_etag[160], error_code[64], error_message[160];
    bool has_linked_size, has_length, has_range;
    uint64_t linked_size, length, range_start, range_total;
} response;

typedef struct {
    const llama_hub *h;
    hub_get *g;
    response cur;
    bool hub_seen;   // a response with X-Repo-Commit has been kept
    bool overflow;   // more body than asked for
    int write_errno; // a write to the file failed
    bool started;    // the final response's body has begun
    char agent[64], range[64], detail[CURL_ERROR_SIZE];
} transfer;

// "name: value" into value (trimmed), when the line is that header.
static bool header_is(const char *line, size_t n, const char *name, char *value, size_t len) {
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) != 0 || line[k] != ':') return false;
    const char *v = line + k + 1, *end = line + n;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
    snprintf(value, len, "%.*s", (int)(end - v), v);
    return true;
}

// W/"abc" or "abc" -> abc, as huggingface_hub's _normalize_etag.
static void normalise_etag(char *e) {
    char *s = e;
    if (s[0] == 'W' && s[1] == '/') s += 2;
    while (*s == '"') s++;
    memmove(e, s, strlen(s) + 1);
    for (size_t n = strlen(e); n && e[n - 1] == '"';) e[--n] = 0;
}

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') return false;
    *out = v;
    return true;
}

// The end of a response's headers: the Hub's (the first with X-Repo-Commit) kept; the error
// headers of any.
static void end_of_headers(transfer *t) {
    response *c = &t->cur;
    hub_get *g = t->g;
    if (c->error_code[0]) snprintf(g->error_code, sizeof g->error_code, "%s", c->error_code);
    if (c->error_message[0]) snprintf(g->error_message, sizeof g->error_message, "%s", c->error_message);
    if (c->commit[0] && !t->hub_seen) {
        t->hub_seen = true;
        snprintf(g->commit, sizeof g->commit, "%s", c->commit);
        snprintf(g->etag, sizeof g->etag, "%s", c->linked_etag[0] ? c->linked_etag : c->etag);
        normalise_etag(g->etag);
        if (c->has_linked_size)
            g->has_size = true, g->size = c->linked_size;
        else if (c->status == 200 && c->has_length)
            g->has_size = true, g->size = c->length;
    }
    if (c->has_range && !g->has_size) g->has_size = true, g->size = c->range_total;
    g->status = c->status;
    g->partial = c->status == 206 && c->has_range;
    g->range_start = c->range_start;
}

static size_t on_header(char *line, size_t size, size_t count, void *arg) {
    transfer *t = arg;
    size_t n = size * count;
    response *c = &t->cur;
    char v[64];
    if (n >= 5 && strncmp(line, "HTTP/", 5) == 0) {
        memset(c, 0, sizeof *c);
        const char *sp = memchr(line, ' ', n);
        c->status = sp ? strtol(sp + 1, NULL, 10) : 0;
    } else if (n <= 2 && (line[0] == '\r' || line[0] == '\n')) {
        end_of_headers(t);
    } else if (header_is(line, n, "X-Repo-Commit", c->commit, sizeof c->commit) ||
               header_is(line, n, "X-Linked-Etag", c->linked_etag, sizeof c->linked_etag) ||
               header_is(line, n, "ETag", c->etag, sizeof c->etag) ||
               header_is(line, n, "X-Error-Code", c->error_code, sizeof c->error_code) ||
               header_is(line, n, "X-Error-Message", c->error_message, sizeof c->error_message)) {
    } else if (header_is(line, n, "X-Linked-Size", v, sizeof v)) {
        c->has_linked_size = parse_u64(v, &c->linked_size);
    } else if (header_is(line, n, "Content-Length", v, sizeof v)) {
        c->has_length = parse_u64(v, &c->length);
    } else if (header_is(line, n, "Content-Range", v, sizeof v)) {
        unsigned long long a, b, total;
        c->has_range = sscanf(v, "bytes %llu-%llu/%llu", &a, &b, &total) == 3;
        c->range_start = a, c->range_total = total;
    }
    return n;
}

static size_t on_body(char *data, size_t size, size_t count, void *arg) {
    transfer *t = arg;
    hub_get *g = t->g;
    size_t n = size * count;
    if (t->cur.status < 200 || t->cur.status >= 300) return n; // an error page: read, not kept
    if (!t->started) {
        t->started = true;
        // a 200 answering a range request: the whole file from its first byte
        if (g->range && t->cur.status == 200) {
            if (g->fd < 0) {
                t->overflow = true;
                return 0;
            }
            g->fd_base = 0;
            if (ftruncate(g->fd, 0) != 0) return t->write_errno = errno, 0;
        }
    }
    if (g->cap && g->received + n > g->cap) {
        t->overflow = true;
        return 0;
    }
    if (g->fd < 0) {
        memcpy(g->mem + g->received, data, n);
    } else {
        for (size_t done = 0; done < n;) {
            ssize_t k = pwrite(g->fd, data + done, n - done, (off_t)(g->fd_base + g->received + done));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) return t->write_errno = k < 0 ? errno : ENOSPC, 0;
            done += (size_t)k;
        }
    }
    g->received += n;
    return n;
}

static int on_progress(void *arg, curl_off_t total, curl_off_t now, curl_off_t ut, curl_off_t un) {
    (void)ut, (void)un;
    transfer *t = arg;
    hub_get *g = t->g;
    if (t->h->progress && g->fd >= 0 && t->started)
        t->h->progress(t->h->progress_arg, g->file, g->fd_base + (uint64_t)now,
                       total > 0 ? g->fd_base + (uint64_t)total : 0);
    return 0;
}

// The one line for a transfer that did not end with a whole response.
static void transfer_error(const transfer *t, CURLcode rc, const char *detail, ag_err *err) {
    const hub_get *g = t->g;
    const char *u = g->url;
    long s = t->h->timeout_s;
    if (t->write_errno)
        ag_err_set(err, "%s: writing it to the cache failed: %s", g->file, strerror(t->write_errno));
    else if (t->overflow && g->range && t->cur.status == 200)
        ag_err_set(err, "GET %s: the server ignored the range request (200 for bytes %llu-): not the Hub's API", u,
                   (unsigned long long)g->from);
    else if (t->overflow)
        ag_err_set(err, "GET %s: the body runs past the %llu bytes expected", u, (unsigned long long)g->cap);
    else if (rc == CURLE_TOO_MANY_REDIRECTS)
        ag_err_set(err, "GET %s: a redirect loop (more than %d redirects)", u, MAX_REDIRECTS);
    else if (rc == CURLE_OPERATION_TIMEDOUT)
        ag_err_set(err, "GET %s: no answer for %ld s (the server stalls; HF_HUB_DOWNLOAD_TIMEOUT sets the wait)", u, s);
    else if (rc == CURLE_PARTIAL_FILE || rc == CURLE_RECV_ERROR || rc == CURLE_GOT_NOTHING)
        ag_err_set(err, "GET %s: the connection closed after %llu bytes of the body%s%s", u,
                   (unsigned long long)g->received, detail[0] ? ": " : "", detail);
    else if (rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_PROXY)
        ag_err_set(err,
                   "cannot reach %s (%s): no network, or HF_ENDPOINT is wrong; HF_HUB_OFFLINE=1 reads the cache alone",
                   t->h->endpoint, detail[0] ? detail : cu.strerror(rc));
    else
        ag_err_set(err, "GET %s: %s", u, detail[0] ? detail : cu.strerror(rc));
}

static struct curl_slist *request_headers(const llama_hub *h) {
    char line[1200];
    struct curl_slist *list = cu.slist_append(NULL, "Accept-Encoding: identity"), *next;
    if (list && h->token[0]) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", h->token);
        if ((next = cu.slist_append(list, line))) list = next;
        memset(line, 0, sizeof line);
    }
    return list;
}

// The request's options: the transfer's own buffers (agent, range, curl's message) outlive it.
static void configure(CURL *c, transfer *t, struct curl_slist *headers) {
    const hub_get *g = t->g;
    snprintf(t->agent, sizeof t->agent, "membill/%s", MEMBILL_VERSION);
    cu.setopt(c, CURLOPT_URL, g->url);
    cu.setopt(c, CURLOPT_USERAGENT, t->agent);
    cu.setopt(c, CURLOPT_HTTPHEADER, headers);
#if LIBCURL_VERSION_NUM >= 0x075500
    cu.setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    cu.setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    cu.setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    cu.setopt(c, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    cu.setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    cu.setopt(c, CURLOPT_MAXREDIRS, (long)MAX_REDIRECTS);
    cu.setopt(c, CURLOPT_NOSIGNAL, 1L);
    cu.setopt(c, CURLOPT_CONNECTTIMEOUT, t->h->timeout_s);
    cu.setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L); // a byte a second: anything slower is a stall
    cu.setopt(c, CURLOPT_LOW_SPEED_TIME, t->h->timeout_s);
    cu.setopt(c, CURLOPT_ERRORBUFFER, t->detail);
    cu.setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    cu.setopt(c, CURLOPT_HEADERDATA, t);
    cu.setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    cu.setopt(c, CURLOPT_WRITEDATA, t);
    cu.setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    cu.setopt(c, CURLOPT_XFERINFODATA, t);
    cu.setopt(c, CURLOPT_NOPROGRESS, 0L);
    if (!g->range) return;
    if (g->to == UINT64_MAX)
        snprintf(t->range, sizeof t->range, "%llu-", (unsigned long long)g->from);
    else
        snprintf(t->range, sizeof t->range, "%llu-%llu", (unsigned long long)g->from, (unsigned long long)g->to);
    cu.setopt(c, CURLOPT_RANGE, t->range);
}

int hub_http_get(const llama_hub *h, hub_get *g, ag_err *err) {
    if (load_curl(err) != 0) {
        g->unreachable = true;
        return -1;
    }
    CURL *c = cu.easy_init();
    struct curl_slist *headers = request_headers(h);
    if (!c || !headers) {
        cu.cleanup(c);
        cu.slist_free_all(headers);
        ag_err_set(err, "out of memory for an HTTP request");
        return -1;
    }
    transfer t = {.h = h, .g = g};
    configure(c, &t, headers);
    CURLcode rc = cu.perform(c);
    cu.cleanup(c);
    cu.slist_free_all(headers);
    if (rc != CURLE_OK) {
        g->unreachable =
            rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_PROXY;
        transfer_error(&t, rc, t.detail, err);
        return -1;
    }
    return 0;
}
