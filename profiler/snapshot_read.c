// A memory snapshot read back (see mp_snapshot_parse in profiler.h): the segment list gives the
// end state; device_traces, walked backwards from it, every state before.
#include "mp_internal.h"
#include "pickle.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BYTES ((int64_t)1 << 50) // a size past this is not a device's
#define MAX_DEVICES 64

typedef struct {
    uint64_t addr, bytes;
    const pk_value *frames;
} live_block;

typedef struct {
    mp_snapshot_device fig;
    uint64_t *req, *res; // after each trace entry
    int64_t *time_us;
    size_t n;
    live_block *largest; // at the requested peak, largest first
    size_t nlargest, live_at_peak;
    char (*where)[200];
} device_view;

struct mp_snapshot {
    device_view dev[MAX_DEVICES];
    size_t ndev;
};

typedef struct {
    char *err;
    size_t errlen;
} ctx;

static bool fail(ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->errlen, fmt, ap);
    va_end(ap);
    return false;
}

// A whole number from 0 to 2^50 under key k of dict d (where: its path, for the message).
static bool size_of(ctx *c, const pk_value *d, const char *k, const char *where, uint64_t *out, bool optional) {
    const pk_value *v = pk_get(d, k);
    if (!v && optional) {
        *out = 0;
        return true;
    }
    if (!v) return fail(c, "%s has no '%s'", where, k);
    if (v->type != PK_INT) return fail(c, "%s: '%s' is not a whole number", where, k);
    if (v->i < 0 || v->i > MAX_BYTES) return fail(c, "%s: '%s' is %lld, not a size a device has", where, k, (long long)v->i);
    *out = (uint64_t)v->i;
    return true;
}

static const char *str_of(const pk_value *d, const char *k) {
    const pk_value *v = pk_get(d, k);
    return v && v->type == PK_STR ? v->s : NULL;
}

static int device_of(const pk_value *seg) {
    const pk_value *v = pk_get(seg, "device");
    return v && v->type == PK_INT && v->i >= 0 && v->i < MAX_DEVICES ? (int)v->i : -1;
}

static device_view *view_for(mp_snapshot *s, int device) {
    for (size_t i = 0; i < s->ndev; i++)
        if (s->dev[i].fig.device == device) return &s->dev[i];
    device_view *v = &s->dev[s->ndev++];
    v->fig.device = device;
    v->fig.requested_peak_entry = v->fig.reserved_peak_entry = SIZE_MAX;
    return v;
}

// ---- live blocks by address: open addressing, linear probing, backward-shift deletion ----

typedef struct {
    live_block *v;
    bool *used;
    size_t n, cap;
} live_map;

static size_t slot(uint64_t a, size_t cap) {
    a ^= a >> 33;
    a *= 0xff51afd7ed558ccdULL;
    a ^= a >> 33;
    return (size_t)a & (cap - 1);
}

static bool live_put(live_map *m, live_block b) {
    if ((m->n + 1) * 2 > m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 1024;
        live_block *v = mp_raw_malloc(ncap * sizeof *v);
        bool *used = mp_raw_malloc(ncap);
        if (!v || !used) {
            mp_raw_free(v);
            mp_raw_free(used);
            return false;
        }
        memset(used, 0, ncap);
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->used[i]) continue;
            size_t j = slot(m->v[i].addr, ncap);
            while (used[j]) j = (j + 1) & (ncap - 1);
            used[j] = true;
            v[j] = m->v[i];
        }
        mp_raw_free(m->v);
        mp_raw_free(m->used);
        m->v = v;
        m->used = used;
        m->cap = ncap;
    }
    size_t j = slot(b.addr, m->cap);
    while (m->used[j] && m->v[j].addr != b.addr) j = (j + 1) & (m->cap - 1);
    if (!m->used[j]) m->n++;
    m->used[j] = true;
    m->v[j] = b;
    return true;
}

static void live_remove(live_map *m, uint64_t addr) {
    if (!m->cap) return;
    size_t j = slot(addr, m->cap);
    while (m->used[j] && m->v[j].addr != addr) j = (j + 1) & (m->cap - 1);
    if (!m->used[j]) return;
    m->used[j] = false;
    m->n--;
    for (size_t k = (j + 1) & (m->cap - 1); m->used[k]; k = (k + 1) & (m->cap - 1)) {
        size_t home = slot(m->v[k].addr, m->cap);
        bool stays = (j <= k) ? (home > j && home <= k) : (home > j || home <= k);
        if (stays) continue;
        m->v[j] = m->v[k];
        m->used[j] = true;
        m->used[k] = false;
        j = k;
    }
}

static void live_free(live_map *m) {
    mp_raw_free(m->v);
    mp_raw_free(m->used);
    memset(m, 0, sizeof *m);
}

// ---- the end state: the segment list ----

static bool read_segments(ctx *c, mp_snapshot *s, const pk_value *segs, live_map *live) {
    char where[96];
    for (size_t i = 0; i < segs->n; i++) {
        const pk_value *seg = segs->items[i];
        snprintf(where, sizeof where, "segments[%zu]", i);
        if (seg->type != PK_DICT) return fail(c, "%s is not a dict", where);
        int dev = device_of(seg);
        if (dev < 0) return fail(c, "%s: 'device' is missing or not 0 to %d", where, MAX_DEVICES - 1);
        device_view *v = view_for(s, dev);
        uint64_t total = 0, addr;
        if (!size_of(c, seg, "total_size", where, &total, false)) return false;
        const pk_value *a = pk_get(seg, "address");
        if (!a || a->type != PK_INT || a->i < 0) return fail(c, "%s: 'address' is missing or negative", where);
        addr = (uint64_t)a->i;
        const pk_value *blocks = pk_get(seg, "blocks");
        if (!blocks || blocks->type != PK_LIST) return fail(c, "%s has no list of 'blocks'", where);
        v->fig.segments++;
        v->fig.reserved_bytes += total;
        uint64_t sum = 0;
        for (size_t k = 0; k < blocks->n; k++) {
            const pk_value *b = blocks->items[k];
            char bw[128];
            snprintf(bw, sizeof bw, "%s.blocks[%zu]", where, k);
            if (b->type != PK_DICT) return fail(c, "%s is not a dict", bw);
            uint64_t size = 0, req = 0;
            const char *state = str_of(b, "state");
            if (!size_of(c, b, "size", bw, &size, false) || !size_of(c, b, "requested_size", bw, &req, true))
                return false;
            if (!state) return fail(c, "%s has no 'state'", bw);
            bool active = strcmp(state, "active_allocated") == 0 || strcmp(state, "active_pending_free") == 0;
            if (active) {
                if (!req) req = size; // legacy snapshots: no requested_size
                v->fig.requested_bytes += req;
                if (strcmp(state, "active_allocated") == 0) v->fig.allocated_bytes += size;
                if (!live_put(&live[v - s->dev], (live_block){addr + sum, req, pk_get(b, "frames")}))
                    return fail(c, "out of memory");
            }
            sum += size;
        }
        if (sum != total) return fail(c, "%s: its blocks add up to %llu bytes, not its total_size %llu", where,
                                      (unsigned long long)sum, (unsigned long long)total);
    }
    return true;
}

// ---- the trace, backwards ----

typedef enum { A_ALLOC, A_FREE_COMPLETED, A_SEGMENT_GROWS, A_SEGMENT_SHRINKS, A_OTHER } action_kind;

static action_kind kind_of(const char *a, mp_snapshot_device *f) {
    if (!strcmp(a, "alloc")) return f->allocs++, A_ALLOC;
    if (!strcmp(a, "free_completed")) return f->frees++, A_FREE_COMPLETED;
    if (!strcmp(a, "segment_alloc") || !strcmp(a, "segment_map")) return f->segment_allocs++, A_SEGMENT_GROWS;
    if (!strcmp(a, "segment_free") || !strcmp(a, "segment_unmap")) return f->segment_frees++, A_SEGMENT_SHRINKS;
    if (!strcmp(a, "oom")) f->ooms++;
    return A_OTHER; // free_requested (the block is still active), oom, snapshot, user annotations
}

// Walks the trace back from the end state: req/res[i] after entry i, [n] before the first. The
// live blocks are then undone back to the requested peak.
static bool read_trace(ctx *c, device_view *v, const pk_value *tr, live_map *live) {
    size_t n = tr->n;
    v->n = n;
    v->fig.trace_entries = n;
    v->req = mp_raw_malloc((n + 1) * sizeof *v->req);
    v->res = mp_raw_malloc((n + 1) * sizeof *v->res);
    v->time_us = mp_raw_malloc((n + 1) * sizeof *v->time_us);
    if (!v->req || !v->res || !v->time_us) return fail(c, "out of memory");
    uint64_t rq = v->fig.requested_bytes, rs = v->fig.reserved_bytes;
    v->fig.requested_peak_bytes = rq; // the end state counts: "after the last entry"
    v->fig.reserved_peak_bytes = rs;
    v->fig.requested_peak_entry = v->fig.reserved_peak_entry = n ? n - 1 : SIZE_MAX;
    char where[96];
    for (size_t i = n; i-- > 0;) {
        const pk_value *e = tr->items[i];
        snprintf(where, sizeof where, "device_traces[%d][%zu]", v->fig.device, i);
        if (e->type != PK_DICT) return fail(c, "%s is not a dict", where);
        const char *a = str_of(e, "action");
        if (!a) return fail(c, "%s has no 'action'", where);
        const pk_value *t = pk_get(e, "time_us");
        v->time_us[i] = t && t->type == PK_INT ? t->i : 0;
        v->req[i] = rq;
        v->res[i] = rs;
        // walking back, an equal state moves the peak to the first moment it was reached
        if (rq >= v->fig.requested_peak_bytes) v->fig.requested_peak_bytes = rq, v->fig.requested_peak_entry = i;
        if (rs >= v->fig.reserved_peak_bytes) v->fig.reserved_peak_bytes = rs, v->fig.reserved_peak_entry = i;
        action_kind k = kind_of(a, &v->fig);
        if (k == A_OTHER) continue;
        uint64_t size = 0;
        if (!size_of(c, e, "size", where, &size, false)) return false;
        if (k == A_ALLOC) {
            if (size > rq) return fail(c, "%s: an allocation of %llu bytes when the segment list and the later entries leave %llu", where, (unsigned long long)size, (unsigned long long)rq);
            rq -= size;
        } else if (k == A_FREE_COMPLETED) {
            rq += size;
        } else if (k == A_SEGMENT_GROWS) {
            if (size > rs) return fail(c, "%s: a segment of %llu bytes when the segment list and the later entries leave %llu reserved", where, (unsigned long long)size, (unsigned long long)rs);
            rs -= size;
        } else {
            rs += size;
        }
    }
    v->req[n] = rq;
    v->res[n] = rs;
    v->time_us[n] = n ? v->time_us[0] : 0;
    if (rq > v->fig.requested_peak_bytes) v->fig.requested_peak_bytes = rq, v->fig.requested_peak_entry = SIZE_MAX;
    if (rs > v->fig.reserved_peak_bytes) v->fig.reserved_peak_bytes = rs, v->fig.reserved_peak_entry = SIZE_MAX;
    // the live blocks back to the requested peak: undo every entry after it
    size_t stop = v->fig.requested_peak_entry == SIZE_MAX ? 0 : v->fig.requested_peak_entry + 1;
    for (size_t i = n; i-- > stop;) {
        const pk_value *e = tr->items[i];
        const char *a = str_of(e, "action");
        const pk_value *addr = pk_get(e, "addr"), *size = pk_get(e, "size");
        if (!addr || addr->type != PK_INT || !size || size->type != PK_INT) continue;
        if (!strcmp(a, "alloc"))
            live_remove(live, (uint64_t)addr->i);
        else if (!strcmp(a, "free_completed") &&
                 !live_put(live, (live_block){(uint64_t)addr->i, (uint64_t)size->i, pk_get(e, "frames")}))
            return fail(c, "out of memory");
    }
    return true;
}

// "name (filename:line)" of the innermost frame; membill's own: "site (category)".
static void describe(const pk_value *frames, char *out, size_t len) {
    const pk_value *f = frames && frames->type == PK_LIST && frames->n ? frames->items[0] : NULL;
    const char *name = str_of(f, "name"), *file = str_of(f, "filename");
    const pk_value *line = pk_get(f, "line");
    if (!name || !file) {
        snprintf(out, len, "(no frames recorded)");
        return;
    }
    if (!strncmp(file, "membill/", 8)) {
        snprintf(out, len, "%s (%s)", name, file + 8);
        return;
    }
    snprintf(out, len, "%s (%s:%lld)", name, file, line && line->type == PK_INT ? (long long)line->i : 0LL);
}

static int larger_first(const void *a, const void *b) {
    const live_block *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return (x->addr > y->addr) - (x->addr < y->addr);
}

#define KEEP_LARGEST 64

static bool keep_largest(ctx *c, device_view *v, const live_map *live) {
    v->live_at_peak = live->n;
    live_block *all = mp_raw_malloc((live->n ? live->n : 1) * sizeof *all);
    if (!all) return fail(c, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < live->cap; i++)
        if (live->used[i]) all[k++] = live->v[i];
    qsort(all, k, sizeof *all, larger_first);
    v->nlargest = k < KEEP_LARGEST ? k : KEEP_LARGEST;
    v->where = mp_raw_malloc((v->nlargest ? v->nlargest : 1) * sizeof *v->where);
    if (!v->where) {
        mp_raw_free(all);
        return fail(c, "out of memory");
    }
    for (size_t i = 0; i < v->nlargest; i++) describe(all[i].frames, v->where[i], sizeof v->where[i]);
    v->largest = all;
    return true;
}

mp_snapshot *mp_snapshot_parse(const uint8_t *data, size_t n, char *err, size_t errlen) {
    char scratch[8];
    ctx c = {err && errlen ? err : scratch, err && errlen ? errlen : sizeof scratch};
    c.err[0] = 0;
    pk_doc *doc = pk_parse(data, n, c.err, c.errlen);
    if (!doc) return NULL;
    mp_snapshot *s = mp_raw_malloc(sizeof *s);
    live_map *live = mp_raw_malloc(MAX_DEVICES * sizeof *live);
    bool ok = s && live;
    if (ok) {
        memset(s, 0, sizeof *s);
        memset(live, 0, MAX_DEVICES * sizeof *live);
    } else {
        fail(&c, "out of memory");
    }
    const pk_value *root = pk_root(doc), *segs = pk_get(root, "segments"), *traces = pk_get(root, "device_traces");
    if (ok && (!root || root->type != PK_DICT)) ok = fail(&c, "the pickle holds a %s, not a snapshot's dict", root && root->type == PK_LIST ? "list" : "value");
    if (ok && (!segs || segs->type != PK_LIST)) ok = fail(&c, "no list of 'segments': not a torch.cuda.memory._snapshot()");
    if (ok && traces && traces->type != PK_LIST) ok = fail(&c, "'device_traces' is not a list");
    if (ok) ok = read_segments(&c, s, segs, live);
    for (size_t d = 0; ok && traces && d < traces->n; d++) {
        const pk_value *tr = traces->items[d];
        bool known = false;
        for (size_t i = 0; i < s->ndev; i++) known |= s->dev[i].fig.device == (int)d;
        if (tr->type != PK_LIST) {
            ok = fail(&c, "device_traces[%zu] is not a list", d);
        } else if (tr->n || known) {
            if (d >= MAX_DEVICES) {
                ok = fail(&c, "more than %d devices", MAX_DEVICES);
                break;
            }
            device_view *v = view_for(s, (int)d);
            ok = read_trace(&c, v, tr, &live[v - s->dev]);
        }
    }
    for (size_t i = 0; ok && i < s->ndev; i++) {
        device_view *v = &s->dev[i];
        if (!v->req) { // no trace: the end state alone
            v->fig.requested_peak_bytes = v->fig.requested_bytes;
            v->fig.reserved_peak_bytes = v->fig.reserved_bytes;
        }
        ok = keep_largest(&c, v, &live[i]);
    }
    for (size_t i = 0; live && i < MAX_DEVICES; i++) live_free(&live[i]);
    mp_raw_free(live);
    pk_doc_free(doc); // the frames were described while the document lived
    if (!ok) {
        mp_snapshot_free(s);
        return NULL;
    }
    return s;
}

void mp_snapshot_free(mp_snapshot *s) {
    if (!s) return;
    for (size_t i = 0; i < s->ndev; i++) {
        device_view *v = &s->dev[i];
        mp_raw_free(v->req);
        mp_raw_free(v->res);
        mp_raw_free(v->time_us);
        mp_raw_free(v->largest);
        mp_raw_free(v->where);
    }
    mp_raw_free(s);
}

size_t mp_snapshot_devices(const mp_snapshot *s) { return s ? s->ndev : 0; }

const mp_snapshot_device *mp_snapshot_device_at(const mp_snapshot *s, size_t i) {
    return s && i < s->ndev ? &s->dev[i].fig : NULL;
}

size_t mp_snapshot_largest(const mp_snapshot *s, size_t i, mp_snapshot_block *out, size_t cap) {
    if (!s || i >= s->ndev) return 0;
    const device_view *v = &s->dev[i];
    for (size_t k = 0; k < cap && k < v->nlargest; k++) {
        out[k].bytes = v->largest[k].bytes;
        out[k].addr = v->largest[k].addr;
        snprintf(out[k].where, sizeof out[k].where, "%s", v->where[k]);
    }
    return v->live_at_peak;
}

static mp_snapshot_point point(const device_view *v, size_t after) {
    size_t k = after == SIZE_MAX ? v->n : after;
    return (mp_snapshot_point){after, v->time_us[k], v->req[k], v->res[k]};
}

static int by_entry(const void *a, const void *b) {
    size_t x = *(const size_t *)a + 1, y = *(const size_t *)b + 1; // SIZE_MAX (before the trace) first
    return (x > y) - (x < y);
}

size_t mp_snapshot_timeline(const mp_snapshot *s, size_t i, mp_snapshot_point *out, size_t cap) {
    if (!s || i >= s->ndev || !s->dev[i].req || cap < 3) return 0;
    const device_view *v = &s->dev[i];
    size_t *at = mp_raw_malloc(cap * sizeof *at), n = 0, want = cap - 2; // room for the two peaks
    if (!at) return 0;
    if (v->n == 0) at[n++] = SIZE_MAX;
    for (size_t k = 0; k < want && v->n; k++) at[n++] = want > 1 ? k * (v->n - 1) / (want - 1) : v->n - 1;
    at[n++] = v->fig.requested_peak_entry;
    at[n++] = v->fig.reserved_peak_entry;
    qsort(at, n, sizeof *at, by_entry);
    size_t m = 0;
    for (size_t k = 0; k < n; k++)
        if (!m || out[m - 1].entry != at[k]) out[m++] = point(v, at[k]);
    mp_raw_free(at);
    return m;
}
