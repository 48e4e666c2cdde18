// Counters, peaks, phases, site labels, the timeline and process figures.
#include "mp_internal.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

static const char *const category_names[MP_NCATEGORIES] = {"weight", "gradient",  "optimizer", "activation",
                                                           "cache",  "temporary", "other"};
static const char *const phase_names[MP_NPHASES] = {"setup",     "load",    "zero_grad", "forward", "backward",
                                                    "optimizer", "prefill", "decode",    "teardown"};

const char *mp_category_name(mp_category c) { return (unsigned)c < MP_NCATEGORIES ? category_names[c] : "?"; }

const char *mp_phase_name(mp_phase p) { return (unsigned)p < MP_NPHASES ? phase_names[p] : "?"; }

// What is live now. A moment made by plain malloc is charged to the last tensor allocated before
// it: "malloc" names no tensor, and the report must say which tensor work the peak came in.
static mp_moment moment_now(mp_category cat, uint32_t site) {
    mp_moment m;
    memset(&m, 0, sizeof m);
    for (int c = 0; c < MP_NCATEGORIES; c++) m.bytes[c] = mp_g.counters[c].live;
    m.total = mp_g.live_total;
    m.phase = mp_g.phase;
    m.by_malloc = cat == MP_OTHER;
    m.site = m.by_malloc ? mp_g.last_tensor_site : site;
    m.seconds = mp_now() - mp_g.t0;
    m.events = mp_g.timeline.count;
    return m;
}

static mp_event *event_at(const mp_timeline *t, size_t i) {
    return &t->chunks[i >> MP_CHUNK_SHIFT][i & (MP_CHUNK_EVENTS - 1)];
}

const mp_event *mp_event_at_locked(size_t i) { return event_at(&mp_g.timeline, i); }

static void timeline_push(mp_category cat, int64_t delta, uint32_t site, uint32_t detail, uint32_t serial) {
    mp_timeline *t = &mp_g.timeline;
    if (t->count == t->nchunks * MP_CHUNK_EVENTS) {
        // One more chunk; only the small table of chunk pointers is ever copied.
        if (t->nchunks == t->chunks_cap) {
            size_t ncap = t->chunks_cap ? t->chunks_cap * 2 : 16;
            mp_event **c = mp_raw_realloc(t->chunks, ncap * sizeof *c);
            if (!c) { // counted and reported, never silent
                t->dropped++;
                return;
            }
            t->chunks = c;
            t->chunks_cap = ncap;
        }
        mp_event *chunk = mp_raw_malloc(MP_CHUNK_EVENTS * sizeof *chunk);
        if (!chunk) {
            t->dropped++;
            return;
        }
        t->chunks[t->nchunks++] = chunk;
    }
    mp_event *e = event_at(t, t->count++);
    e->seconds = mp_now() - mp_g.t0;
    e->bytes = delta;
    e->site = site;
    e->detail = detail;
    e->serial = serial;
    e->category = (uint8_t)cat;
    e->phase = (uint8_t)mp_g.phase;
}

void mp_count_locked(mp_category cat, int64_t delta, int64_t delta_usable, uint32_t site, uint32_t detail,
                     uint32_t serial) {
    mp_counter *k = &mp_g.counters[cat];
    k->live = (uint64_t)((int64_t)k->live + delta);
    k->live_usable = (uint64_t)((int64_t)k->live_usable + delta_usable);
    mp_g.live_total = (uint64_t)((int64_t)mp_g.live_total + delta);
    // Recorded before the peaks, so that a moment's event count includes the event that made it.
    if (mp_g.opt.keep_timeline) timeline_push(cat, delta, site, detail, serial);
    if (delta < 0 || (delta == 0 && delta_usable < 0)) {
        k->frees++;
        return;
    }
    k->allocations++;
    if (cat != MP_OTHER) mp_g.last_tensor_site = site;
    if (k->live > k->peak) {
        k->peak = k->live;
        k->peak_events = mp_g.timeline.count;
    }
    if (k->live_usable > k->peak_usable) k->peak_usable = k->live_usable;
    if (mp_g.live_total > mp_g.peak.total) mp_g.peak = moment_now(cat, site);
    mp_phase_stats *ps = &mp_g.phases[mp_g.phase];
    if (mp_g.live_total > ps->peak) {
        ps->peak = mp_g.live_total;
        ps->at_peak = moment_now(cat, site);
    }
}

void mp_count_host_locked(mp_category cat, int64_t delta, int64_t delta_usable) {
    mp_counter *k = &mp_g.host[cat];
    k->live = (uint64_t)((int64_t)k->live + delta);
    k->live_usable = (uint64_t)((int64_t)k->live_usable + delta_usable);
    if (delta < 0) {
        k->frees++;
        return;
    }
    k->allocations++;
    if (k->live > k->peak) k->peak = k->live;
    if (k->live_usable > k->peak_usable) k->peak_usable = k->live_usable;
}

// The same comparison for a tensor (before it is allocated) and for plain malloc (seen by a hook
// after the fact), against the same total the peak is taken from.
bool mp_over_budget_locked(uint64_t bytes) { return mp_g.opt.budget && mp_g.live_total + bytes > mp_g.opt.budget; }

void mp_record_oom_locked(mp_category cat, uint32_t site, uint64_t bytes) {
    mp_oom_record *r = &mp_g.oom;
    r->happened = true;
    r->category = cat;
    r->site = site;
    r->requested = bytes;
    r->budget = mp_g.opt.budget;
    r->live = moment_now(cat, site);
}

// Largest first; ties by site, then category, so the order never depends on the sort.
static bool goes_before(const mp_site_bytes *x, const mp_site_bytes *y) {
    if (x->bytes != y->bytes) return x->bytes > y->bytes;
    if (x->site != y->site) return x->site < y->site;
    return x->category < y->category;
}

static void sift_down(mp_site_bytes *a, size_t i, size_t n) {
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && goes_before(&a[c], &a[c + 1])) c++;
        if (!goes_before(&a[i], &a[c])) return;
        mp_site_bytes t = a[i];
        a[i] = a[c];
        a[c] = t;
        i = c;
    }
}

// Heapsort rather than qsort: glibc's qsort may malloc, and under the lock a hook on this
// thread would wait for the lock forever.
static void sort_site_bytes(mp_site_bytes *a, size_t n) {
    for (size_t i = n / 2; i-- > 0;) sift_down(a, i, n);
    for (size_t end = n; end > 1; end--) {
        mp_site_bytes t = a[0];
        a[0] = a[end - 1];
        a[end - 1] = t;
        sift_down(a, 0, end - 1);
    }
}

// Replays the timeline's first `events` events into per-site live bytes, then sorts once: linear
// in the events plus n log n in the sites, for any cap (a report asks for every site).
size_t mp_sites_live_at(size_t events, mp_category cat, mp_site_bytes *out, size_t cap) {
    if (!mp_g.active) return 0;
    mp_lock();
    size_t n = 0;
    const mp_timeline *t = &mp_g.timeline;
    size_t nsites = mp_g.sites.count;
    int64_t *live = events <= t->count ? mp_raw_malloc(nsites * MP_NCATEGORIES * sizeof *live) : NULL;
    if (!live) goto out;
    memset(live, 0, nsites * MP_NCATEGORIES * sizeof *live);
    for (size_t i = 0; i < events; i++) {
        const mp_event *e = event_at(t, i);
        if (e->site < nsites) live[(size_t)e->site * MP_NCATEGORIES + e->category] += e->bytes;
    }
    for (size_t i = 0; i < nsites * MP_NCATEGORIES; i++) {
        int c = (int)(i % MP_NCATEGORIES);
        if (live[i] <= 0 || (cat != MP_NCATEGORIES && c != (int)cat)) continue;
        n++;
    }
    if (out && cap) {
        mp_site_bytes *all = mp_raw_malloc((n ? n : 1) * sizeof *all);
        if (!all) {
            n = 0;
            goto out;
        }
        size_t k = 0;
        for (size_t i = 0; i < nsites * MP_NCATEGORIES; i++) {
            int c = (int)(i % MP_NCATEGORIES);
            if (live[i] <= 0 || (cat != MP_NCATEGORIES && c != (int)cat)) continue;
            all[k++] = (mp_site_bytes){(uint32_t)(i / MP_NCATEGORIES), (uint8_t)c, (uint64_t)live[i]};
        }
        sort_site_bytes(all, n);
        memcpy(out, all, (n < cap ? n : cap) * sizeof *all);
        mp_raw_free(all);
    }
out:
    mp_raw_free(live);
    mp_unlock();
    return n;
}

// ---- site labels ----

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ULL; // FNV-1a
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    // FNV's low bits, the ones a power-of-two table uses, mix poorly: finish with murmur's fmix64.
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

static bool sites_reindex(mp_sites *s, size_t ncap) {
    uint32_t *idx = mp_raw_malloc(ncap * sizeof *idx);
    if (!idx) return false;
    memset(idx, 0, ncap * sizeof *idx);
    for (size_t i = 0; i < s->count; i++) {
        size_t j = s->hashes[i] & (ncap - 1);
        while (idx[j]) j = (j + 1) & (ncap - 1);
        idx[j] = (uint32_t)i + 1;
    }
    mp_raw_free(s->index);
    s->index = idx;
    s->index_cap = ncap;
    return true;
}

// Ids are 32-bit and 0 doubles as "(none)" on failure: the table stops short of that.
#define MP_MAX_SITES ((size_t)UINT32_MAX - 1)

static uint32_t intern_locked(mp_sites *s, const char *label) {
    // Load at most one half: a lookup then examines under two slots on average.
    if ((s->count + 1) * 2 > s->index_cap && !sites_reindex(s, s->index_cap ? s->index_cap * 2 : 256)) return 0;
    uint64_t h = hash_str(label);
    size_t j = h & (s->index_cap - 1);
    s->lookups++;
    while (s->index[j]) {
        uint32_t id = s->index[j] - 1;
        if (s->hashes[id] == h && strcmp(s->names[id], label) == 0) return id;
        j = (j + 1) & (s->index_cap - 1);
        s->probes++;
    }
    if (s->count >= MP_MAX_SITES) return 0;
    if (s->count == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 256;
        char **n = mp_raw_realloc(s->names, ncap * sizeof *n);
        if (!n) return 0;
        s->names = n;
        uint64_t *hs = mp_raw_realloc(s->hashes, ncap * sizeof *hs);
        if (!hs) return 0;
        s->hashes = hs;
        s->cap = ncap;
    }
    size_t len = strlen(label) + 1;
    char *copy = mp_raw_malloc(len);
    if (!copy) return 0;
    memcpy(copy, label, len);
    s->names[s->count] = copy;
    s->hashes[s->count] = h;
    uint32_t id = (uint32_t)s->count++;
    s->index[j] = id + 1;
    return id;
}

uint32_t mp_site_id_locked(const char *label) { return intern_locked(&mp_g.sites, label); }

// Descriptions are interned apart from the sites (no report lists them); 0 is none.
uint32_t mp_detail_id_locked(const char *detail) {
    return detail && *detail ? intern_locked(&mp_g.details, detail) + 1 : 0;
}

const char *mp_detail_name(uint32_t id) {
    if (!mp_g.active || !id) return NULL;
    mp_lock();
    const char *name = id - 1 < mp_g.details.count ? mp_g.details.names[id - 1] : NULL;
    mp_unlock();
    return name;
}

uint32_t mp_site_id(const char *label) {
    if (!mp_g.active || !label) return 0;
    mp_lock();
    uint32_t id = mp_site_id_locked(label);
    mp_unlock();
    return id;
}

// The names array may move while another thread interns a label; the string itself never does.
const char *mp_site_name(uint32_t id) {
    if (!mp_g.active) return "(none)";
    mp_lock();
    const char *name = id < mp_g.sites.count ? mp_g.sites.names[id] : "(none)";
    mp_unlock();
    return name;
}

void mp_sites_free(mp_sites *s) {
    for (size_t i = 0; i < s->count; i++) mp_raw_free(s->names[i]);
    mp_raw_free(s->names);
    mp_raw_free(s->hashes);
    mp_raw_free(s->index);
    memset(s, 0, sizeof *s);
}

// ---- timeline ----

void mp_timeline_free(mp_timeline *t) {
    for (size_t i = 0; i < t->nchunks; i++) mp_raw_free(t->chunks[i]);
    mp_raw_free(t->chunks);
    memset(t, 0, sizeof *t);
}

size_t mp_timeline_count(void) {
    if (!mp_g.active) return 0;
    mp_lock();
    size_t n = mp_g.timeline.count;
    mp_unlock();
    return n;
}

size_t mp_timeline_dropped(void) {
    if (!mp_g.active) return 0;
    mp_lock();
    size_t n = mp_g.timeline.dropped;
    mp_unlock();
    return n;
}

const mp_event *mp_timeline_get(size_t i) {
    if (!mp_g.active) return NULL;
    mp_lock();
    const mp_event *e = i < mp_g.timeline.count ? event_at(&mp_g.timeline, i) : NULL;
    mp_unlock();
    return e;
}

// ---- phases and peaks ----

void mp_set_phase(mp_phase p) {
    if (!mp_g.active || (unsigned)p >= MP_NPHASES) return;
    mp_lock();
    double now = mp_now();
    mp_g.phases[mp_g.phase].seconds += now - mp_g.phase_started;
    mp_g.phase = p;
    mp_g.phase_started = now;
    mp_phase_stats *ps = &mp_g.phases[p];
    ps->entries++;
    if (mp_g.live_total > ps->peak || ps->entries == 1) {
        ps->peak = mp_g.live_total;
        ps->at_peak = moment_now(MP_NCATEGORIES, 0);
    }
    mp_unlock();
    mp_checkpoint_process();
}

mp_phase mp_get_phase(void) {
    if (!mp_g.active) return MP_PHASE_SETUP;
    mp_lock();
    mp_phase p = mp_g.phase;
    mp_unlock();
    return p;
}

mp_counter mp_get_counter(mp_category c) {
    mp_counter k;
    memset(&k, 0, sizeof k);
    if (!mp_g.active || (unsigned)c >= MP_NCATEGORIES) return k;
    mp_lock();
    k = mp_g.counters[c];
    mp_unlock();
    return k;
}

uint64_t mp_live_total(void) {
    if (!mp_g.active) return 0;
    mp_lock();
    uint64_t v = mp_g.live_total;
    mp_unlock();
    return v;
}

mp_moment mp_peak(void) {
    mp_moment m;
    memset(&m, 0, sizeof m);
    if (!mp_g.active) return m;
    mp_lock();
    m = mp_g.peak;
    mp_unlock();
    return m;
}

const mp_oom_record *mp_oom(void) {
    // A copy taken under the lock: a hook on another thread may be writing the record.
    static _Thread_local mp_oom_record snap;
    memset(&snap, 0, sizeof snap);
    if (!mp_g.active) return &snap;
    mp_lock();
    snap = mp_g.oom;
    mp_unlock();
    return &snap;
}

mp_phase_stats mp_get_phase_stats(mp_phase p) {
    mp_phase_stats s;
    memset(&s, 0, sizeof s);
    if (!mp_g.active || (unsigned)p >= MP_NPHASES) return s;
    mp_lock();
    s = mp_g.phases[p];
    if (p == mp_g.phase) s.seconds += mp_now() - mp_g.phase_started;
    mp_unlock();
    return s;
}

void mp_reset_peaks(void) {
    if (!mp_g.active) return;
    mp_lock();
    for (int c = 0; c < MP_NCATEGORIES; c++) {
        mp_g.counters[c].peak = mp_g.counters[c].live;
        mp_g.counters[c].peak_events = mp_g.timeline.count;
        mp_g.counters[c].peak_usable = mp_g.counters[c].live_usable;
    }
    mp_g.peak = moment_now(MP_NCATEGORIES, 0);
    for (int p = 0; p < MP_NPHASES; p++) {
        mp_g.phases[p].peak = p == (int)mp_g.phase ? mp_g.live_total : 0;
        mp_g.phases[p].at_peak = moment_now(MP_NCATEGORIES, 0);
    }
    mp_unlock();
}

// ---- process figures ----

static uint64_t status_kb(const char *buf, const char *key) {
    const char *p = strstr(buf, key);
    return p ? strtoull(p + strlen(key), NULL, 10) * 1024 : 0;
}

mp_process mp_process_now(void) {
    mp_process r;
    memset(&r, 0, sizeof r);
    // open/read rather than stdio: a checkpoint must not itself allocate and move "other".
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        buf[n > 0 ? n : 0] = 0;
        r.rss = status_kb(buf, "VmRSS:");
        r.hwm = status_kb(buf, "VmHWM:");
    }
    mp_jemalloc_figures(&r.jemalloc_resident, &r.jemalloc_allocated);
    r.untracked = r.rss > r.jemalloc_resident ? r.rss - r.jemalloc_resident : 0;
    return r;
}

void mp_checkpoint_process(void) {
    if (!mp_g.active) return;
    mp_process now = mp_process_now(); // outside the lock: it reads /proc and jemalloc
    mp_lock();
    mp_process *pk = &mp_g.proc_peak;
    if (now.rss > pk->rss) pk->rss = now.rss;
    if (now.hwm > pk->hwm) pk->hwm = now.hwm;
    if (now.jemalloc_resident > pk->jemalloc_resident) pk->jemalloc_resident = now.jemalloc_resident;
    if (now.jemalloc_allocated > pk->jemalloc_allocated) pk->jemalloc_allocated = now.jemalloc_allocated;
    if (now.untracked > pk->untracked) pk->untracked = now.untracked;
    mp_unlock();
}

mp_process mp_process_peak(void) {
    mp_process r;
    memset(&r, 0, sizeof r);
    if (!mp_g.active) return r;
    mp_checkpoint_process();
    mp_lock();
    r = mp_g.proc_peak;
    mp_unlock();
    return r;
}
