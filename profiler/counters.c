// Counters, peaks, phases, site labels, the timeline and process figures.
#include "mp_internal.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

static const char *const category_names[MP_NCATEGORIES] = {
    "weight", "gradient", "optimizer", "activation", "cache", "other"};
static const char *const phase_names[MP_NPHASES] = {
    "setup", "load", "forward", "backward", "optimizer", "prefill", "decode", "teardown"};

const char *mp_category_name(mp_category c) {
    return (unsigned)c < MP_NCATEGORIES ? category_names[c] : "?";
}

const char *mp_phase_name(mp_phase p) {
    return (unsigned)p < MP_NPHASES ? phase_names[p] : "?";
}

static mp_moment moment_now(uint32_t site) {
    mp_moment m;
    for (int c = 0; c < MP_NCATEGORIES; c++) m.bytes[c] = mp_g.counters[c].live;
    m.total = mp_g.live_total;
    m.phase = mp_g.phase;
    m.site = site;
    m.seconds = mp_now() - mp_g.t0;
    m.events = mp_g.timeline.count;
    return m;
}

static void timeline_push(mp_category cat, int64_t delta, uint32_t site) {
    mp_timeline *t = &mp_g.timeline;
    if (t->count == t->cap) {
        // Grows by doubling: no cap, no silently dropped events.
        size_t ncap = t->cap ? t->cap * 2 : 4096;
        mp_event *ev = mp_raw_realloc(t->events, ncap * sizeof *ev);
        if (!ev) { // counted and reported, never silent
            t->dropped++;
            return;
        }
        t->events = ev;
        t->cap = ncap;
    }
    mp_event *e = &t->events[t->count++];
    e->seconds = mp_now() - mp_g.t0;
    e->bytes = delta;
    e->site = site;
    e->category = (uint8_t)cat;
    e->phase = (uint8_t)mp_g.phase;
}

void mp_count_locked(mp_category cat, int64_t delta, int64_t delta_usable, uint32_t site) {
    mp_counter *k = &mp_g.counters[cat];
    k->live = (uint64_t)((int64_t)k->live + delta);
    k->live_usable = (uint64_t)((int64_t)k->live_usable + delta_usable);
    mp_g.live_total = (uint64_t)((int64_t)mp_g.live_total + delta);
    // Recorded before the peaks, so that a moment's event count includes the event that made it.
    if (mp_g.opt.keep_timeline) timeline_push(cat, delta, site);
    if (delta < 0 || (delta == 0 && delta_usable < 0)) {
        k->frees++;
        return;
    }
    k->allocations++;
    if (k->live > k->peak) {
        k->peak = k->live;
        k->peak_events = mp_g.timeline.count;
    }
    if (k->live_usable > k->peak_usable) k->peak_usable = k->live_usable;
    if (mp_g.live_total > mp_g.peak.total) mp_g.peak = moment_now(site);
    mp_phase_stats *ps = &mp_g.phases[mp_g.phase];
    if (mp_g.live_total > ps->peak) {
        ps->peak = mp_g.live_total;
        ps->at_peak = moment_now(site);
    }
}

// Replays the timeline's first `events` events into per-site live bytes.
size_t mp_sites_live_at(size_t events, mp_category cat, mp_site_bytes *out, size_t cap) {
    if (!mp_g.active || events > mp_g.timeline.count) return 0;
    size_t nsites = mp_g.sites.count;
    int64_t *live = mp_raw_malloc(nsites * MP_NCATEGORIES * sizeof *live);
    if (!live) return 0;
    memset(live, 0, nsites * MP_NCATEGORIES * sizeof *live);
    for (size_t i = 0; i < events; i++) {
        const mp_event *e = &mp_g.timeline.events[i];
        if (e->site < nsites) live[(size_t)e->site * MP_NCATEGORIES + e->category] += e->bytes;
    }
    size_t n = 0;
    for (size_t i = 0; i < nsites * MP_NCATEGORIES; i++) {
        int c = (int)(i % MP_NCATEGORIES);
        if (live[i] <= 0 || (cat != MP_NCATEGORIES && c != (int)cat)) continue;
        mp_site_bytes sb = {(uint32_t)(i / MP_NCATEGORIES), (uint8_t)c, (uint64_t)live[i]};
        // Insertion into the top `cap`, largest first.
        size_t j = n < cap ? n : cap;
        while (j > 0 && out[j - 1].bytes < sb.bytes) {
            if (j < cap) out[j] = out[j - 1];
            j--;
        }
        if (j < cap) out[j] = sb;
        n++;
    }
    mp_raw_free(live);
    return n;
}

// ---- site labels ----

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ULL; // FNV-1a
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static bool sites_reindex(mp_sites *s, size_t ncap) {
    uint32_t *idx = mp_raw_malloc(ncap * sizeof *idx);
    if (!idx) return false;
    memset(idx, 0, ncap * sizeof *idx);
    for (size_t i = 0; i < s->count; i++) {
        size_t j = hash_str(s->names[i]) & (ncap - 1);
        while (idx[j]) j = (j + 1) & (ncap - 1);
        idx[j] = (uint32_t)i + 1;
    }
    mp_raw_free(s->index);
    s->index = idx;
    s->index_cap = ncap;
    return true;
}

uint32_t mp_site_id(const char *label) {
    if (!mp_g.active || !label) return 0;
    pthread_mutex_lock(&mp_g.lock);
    mp_sites *s = &mp_g.sites;
    uint32_t id = 0;
    if ((s->count + 1) * 2 > s->index_cap && !sites_reindex(s, s->index_cap ? s->index_cap * 2 : 256))
        goto out;
    size_t j = hash_str(label) & (s->index_cap - 1);
    while (s->index[j]) {
        if (strcmp(s->names[s->index[j] - 1], label) == 0) {
            id = s->index[j] - 1;
            goto out;
        }
        j = (j + 1) & (s->index_cap - 1);
    }
    if (s->count == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 256;
        char **n = mp_raw_realloc(s->names, ncap * sizeof *n);
        if (!n) goto out;
        s->names = n;
        s->cap = ncap;
    }
    size_t len = strlen(label) + 1;
    char *copy = mp_raw_malloc(len);
    if (!copy) goto out;
    memcpy(copy, label, len);
    s->names[s->count] = copy;
    id = (uint32_t)s->count++;
    s->index[j] = id + 1;
out:
    pthread_mutex_unlock(&mp_g.lock);
    return id;
}

const char *mp_site_name(uint32_t id) {
    if (!mp_g.active || id >= mp_g.sites.count) return "(none)";
    return mp_g.sites.names[id];
}

void mp_sites_free(mp_sites *s) {
    for (size_t i = 0; i < s->count; i++) mp_raw_free(s->names[i]);
    mp_raw_free(s->names);
    mp_raw_free(s->index);
    memset(s, 0, sizeof *s);
}

// ---- timeline ----

void mp_timeline_free(mp_timeline *t) {
    mp_raw_free(t->events);
    memset(t, 0, sizeof *t);
}

size_t mp_timeline_count(void) { return mp_g.active ? mp_g.timeline.count : 0; }

size_t mp_timeline_dropped(void) { return mp_g.active ? mp_g.timeline.dropped : 0; }

const mp_event *mp_timeline_get(size_t i) {
    return (mp_g.active && i < mp_g.timeline.count) ? &mp_g.timeline.events[i] : NULL;
}

// ---- phases and peaks ----

void mp_set_phase(mp_phase p) {
    if (!mp_g.active || (unsigned)p >= MP_NPHASES) return;
    pthread_mutex_lock(&mp_g.lock);
    double now = mp_now();
    mp_g.phases[mp_g.phase].seconds += now - mp_g.phase_started;
    mp_g.phase = p;
    mp_g.phase_started = now;
    mp_phase_stats *ps = &mp_g.phases[p];
    ps->entries++;
    if (mp_g.live_total > ps->peak || ps->entries == 1) {
        ps->peak = mp_g.live_total;
        ps->at_peak = moment_now(0);
    }
    pthread_mutex_unlock(&mp_g.lock);
    mp_checkpoint_process();
}

mp_phase mp_get_phase(void) { return mp_g.phase; }

mp_counter mp_get_counter(mp_category c) {
    mp_counter k;
    memset(&k, 0, sizeof k);
    if (!mp_g.active || (unsigned)c >= MP_NCATEGORIES) return k;
    pthread_mutex_lock(&mp_g.lock);
    k = mp_g.counters[c];
    pthread_mutex_unlock(&mp_g.lock);
    return k;
}

uint64_t mp_live_total(void) { return mp_g.active ? mp_g.live_total : 0; }

mp_moment mp_peak(void) { return mp_g.peak; }

mp_phase_stats mp_get_phase_stats(mp_phase p) {
    mp_phase_stats s;
    memset(&s, 0, sizeof s);
    if (!mp_g.active || (unsigned)p >= MP_NPHASES) return s;
    pthread_mutex_lock(&mp_g.lock);
    s = mp_g.phases[p];
    if (p == mp_g.phase) s.seconds += mp_now() - mp_g.phase_started;
    pthread_mutex_unlock(&mp_g.lock);
    return s;
}

void mp_reset_peaks(void) {
    if (!mp_g.active) return;
    pthread_mutex_lock(&mp_g.lock);
    for (int c = 0; c < MP_NCATEGORIES; c++) {
        mp_g.counters[c].peak = mp_g.counters[c].live;
        mp_g.counters[c].peak_events = mp_g.timeline.count;
        mp_g.counters[c].peak_usable = mp_g.counters[c].live_usable;
    }
    mp_g.peak = moment_now(0);
    for (int p = 0; p < MP_NPHASES; p++) {
        mp_g.phases[p].peak = p == (int)mp_g.phase ? mp_g.live_total : 0;
        mp_g.phases[p].at_peak = moment_now(0);
    }
    pthread_mutex_unlock(&mp_g.lock);
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
    mp_process now = mp_process_now();
    mp_process *pk = &mp_g.proc_peak;
    if (now.rss > pk->rss) pk->rss = now.rss;
    if (now.hwm > pk->hwm) pk->hwm = now.hwm;
    if (now.jemalloc_resident > pk->jemalloc_resident) pk->jemalloc_resident = now.jemalloc_resident;
    if (now.jemalloc_allocated > pk->jemalloc_allocated) pk->jemalloc_allocated = now.jemalloc_allocated;
    if (now.untracked > pk->untracked) pk->untracked = now.untracked;
}

mp_process mp_process_peak(void) {
    mp_checkpoint_process();
    return mp_g.proc_peak;
}
