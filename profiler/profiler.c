// Allocation through the profiler: one jemalloc arena per category (or, in the sanitizer
// build, the system allocator with the same accounting), and jemalloc's hooks for "other".
#include "mp_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MEMBILL_SYSTEM_ALLOC
#include <jemalloc/jemalloc.h>
#include <sys/types.h>
#else
#include <malloc.h>
#endif

mp_state mp_g;

// Set while the profiler itself allocates, so the hooks do not bill its own bookkeeping.
// volatile: the compiler knows malloc touches no user variable and would drop the ++/-- around it.
static _Thread_local volatile int mp_in_profiler;

double mp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// While the lock is held, this thread's allocations are the profiler's own: a hook that fired on
// a malloc inside (libc may allocate anywhere) would otherwise wait on the lock this thread holds.
void mp_lock(void) {
    pthread_mutex_lock(&mp_g.lock);
    mp_in_profiler++;
}

void mp_unlock(void) {
    mp_in_profiler--;
    pthread_mutex_unlock(&mp_g.lock);
}

void *mp_raw_malloc(size_t n) {
    mp_in_profiler++;
    void *p = malloc(n);
    mp_in_profiler--;
    return p;
}

void *mp_raw_realloc(void *p, size_t n) {
    mp_in_profiler++;
    void *q = realloc(p, n);
    mp_in_profiler--;
    return q;
}

void mp_raw_free(void *p) {
    mp_in_profiler++;
    free(p);
    mp_in_profiler--;
}

#ifndef MEMBILL_SYSTEM_ALLOC

const char *mp_backend(void) { return "jemalloc"; }

// ---- the set of malloc'd pointers billed to "other" (open addressing, linear probing) ----

static size_t ptr_slot(uintptr_t k, size_t cap) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

// Rebuilds the table without its deleted slots: at twice the size when live keys fill a
// quarter, else at the same size, so the table follows what is live, not every malloc ever seen.
static bool ptrset_rebuild(mp_ptrset *s) {
    size_t ncap = !s->cap ? 4096 : (s->count + 1) * 4 > s->cap ? s->cap * 2 : s->cap;
    uintptr_t *keys = mp_raw_malloc(ncap * sizeof *keys);
    size_t *sizes = mp_raw_malloc(ncap * sizeof *sizes);
    if (!keys || !sizes) {
        mp_raw_free(keys);
        mp_raw_free(sizes);
        return false;
    }
    memset(keys, 0, ncap * sizeof *keys);
    for (size_t i = 0; i < s->cap; i++) {
        if (!s->keys[i] || s->keys[i] == 1) continue; // empty or deleted
        size_t j = ptr_slot(s->keys[i], ncap);
        while (keys[j]) j = (j + 1) & (ncap - 1);
        keys[j] = s->keys[i];
        sizes[j] = s->sizes[i];
    }
    mp_raw_free(s->keys);
    mp_raw_free(s->sizes);
    s->keys = keys;
    s->sizes = sizes;
    s->cap = ncap;
    s->tombs = 0;
    return true;
}

static size_t *ptrset_find(mp_ptrset *s, uintptr_t k);

// Deleted slots hold 1 (no real pointer is 1). Live and deleted slots together stay under half
// the table, so a probe sequence always ends at an empty slot.
static void ptrset_put(mp_ptrset *s, uintptr_t k, size_t usable) {
    size_t *have = ptrset_find(s, k);
    if (have) {
        *have = usable;
        return;
    }
    if ((s->count + s->tombs + 1) * 2 > s->cap && !ptrset_rebuild(s)) return;
    size_t j = ptr_slot(k, s->cap);
    while (s->keys[j] && s->keys[j] != 1) j = (j + 1) & (s->cap - 1);
    if (s->keys[j] == 1) s->tombs--;
    s->count++;
    s->keys[j] = k;
    s->sizes[j] = usable;
}

static size_t *ptrset_find(mp_ptrset *s, uintptr_t k) {
    if (!s->cap) return NULL;
    size_t j = ptr_slot(k, s->cap);
    for (size_t n = 0; s->keys[j] && n < s->cap; n++, j = (j + 1) & (s->cap - 1))
        if (s->keys[j] == k) return &s->sizes[j];
    return NULL;
}

static void ptrset_remove(mp_ptrset *s, uintptr_t k) {
    size_t *sz = ptrset_find(s, k);
    if (!sz) return;
    s->keys[sz - s->sizes] = 1;
    s->count--;
    s->tombs++;
}

// ---- hooks: plain malloc from anywhere in the process is "other" ----

static uint32_t other_site;

// Plain malloc cannot be refused: the hook sees it once it happened. Past the budget, the first
// such allocation is recorded and the run is over budget for good (mp_alloc refuses from then on).
static void other_budget_locked(size_t bytes) {
    if (mp_g.over_budget || !mp_over_budget_locked(bytes)) return;
    mp_record_oom_locked(MP_OTHER, other_site, bytes);
    mp_g.over_budget = true;
}

static void hook_alloc(void *extra, int type, void *result, uintptr_t result_raw, uintptr_t args_raw[3]) {
    (void)extra, (void)type, (void)result_raw, (void)args_raw;
    if (mp_in_profiler || !result) return;
    mp_in_profiler++;
    size_t u = sallocx(result, 0);
    mp_lock();
    if (mp_g.active) {
        other_budget_locked(u);
        ptrset_put(&mp_g.other_ptrs, (uintptr_t)result, u);
        mp_count_locked(MP_OTHER, (int64_t)u, (int64_t)u, other_site, 0, 0);
    }
    mp_unlock();
    mp_in_profiler--;
}

static void hook_dalloc(void *extra, int type, void *address, uintptr_t args_raw[3]) {
    (void)extra, (void)type, (void)args_raw;
    if (mp_in_profiler || !address) return;
    mp_in_profiler++;
    mp_lock();
    size_t *sz = mp_g.active ? ptrset_find(&mp_g.other_ptrs, (uintptr_t)address) : NULL;
    if (sz) {
        int64_t u = (int64_t)*sz;
        ptrset_remove(&mp_g.other_ptrs, (uintptr_t)address);
        mp_count_locked(MP_OTHER, -u, -u, other_site, 0, 0);
    }
    mp_unlock();
    mp_in_profiler--;
}

static void hook_expand(void *extra, int type, void *address, size_t old_usize, size_t new_usize, uintptr_t result_raw,
                        uintptr_t args_raw[4]) {
    (void)extra, (void)type, (void)result_raw, (void)args_raw;
    if (mp_in_profiler || !address) return;
    mp_in_profiler++;
    mp_lock();
    size_t *sz = mp_g.active ? ptrset_find(&mp_g.other_ptrs, (uintptr_t)address) : NULL;
    if (sz) {
        int64_t d = (int64_t)new_usize - (int64_t)old_usize;
        if (d > 0) other_budget_locked((size_t)d);
        *sz = new_usize;
        mp_count_locked(MP_OTHER, d, d, other_site, 0, 0);
    }
    mp_unlock();
    mp_in_profiler--;
}

// jemalloc 5.3's layout of the experimental hooks (internal/hook.h); newer versions removed
// the mallctl, which then answers ENOENT and "other" is reported as not tracked.
typedef struct {
    void (*alloc_hook)(void *, int, void *, uintptr_t, uintptr_t[3]);
    void (*dalloc_hook)(void *, int, void *, uintptr_t[3]);
    void (*expand_hook)(void *, int, void *, size_t, size_t, uintptr_t, uintptr_t[4]);
    void *extra;
} mp_je_hooks;

static void hooks_install(void) {
    static mp_je_hooks hooks = {hook_alloc, hook_dalloc, hook_expand, NULL};
    void *handle = NULL;
    size_t sz = sizeof handle;
    other_site = mp_site_id("malloc");
    if (mallctl("experimental.hooks.install", &handle, &sz, &hooks, sizeof hooks) == 0 && handle) {
        mp_g.hooks_handle = handle;
        mp_g.hooks_installed = true;
    }
}

static void hooks_remove(void) {
    if (!mp_g.hooks_installed) return;
    void *h = mp_g.hooks_handle;
    mallctl("experimental.hooks.remove", NULL, NULL, &h, sizeof h);
    mp_g.hooks_installed = false;
    mp_raw_free(mp_g.other_ptrs.keys);
    mp_raw_free(mp_g.other_ptrs.sizes);
    memset(&mp_g.other_ptrs, 0, sizeof mp_g.other_ptrs);
}

#if defined(MEMBILL_BARE_ALLOC)
#define BARE_ALLOC 1 // no hooks on plain malloc either
#else
#define BARE_ALLOC 0
#endif

static bool no_merge(extent_hooks_t *h, void *a, size_t size_a, void *b, size_t size_b, bool committed,
                     unsigned arena) {
    (void)h, (void)a, (void)size_a, (void)b, (void)size_b, (void)committed, (void)arena;
    return true; // the two extents stay distinct
}

// A training step frees and asks again for the same blocks every step: activations in
// forward, gradients (set to none after each step) in backward, the temporaries (a tied
// weight's gradient sums, the for-loop Adam's sqrt and denom). With jemalloc's default decay
// the freed pages are returned to the kernel over a few seconds and come back as fresh zeroed
// pages, faulted in one by one: at 512 tokens about 600k page faults a step, a quarter of its
// time. So no arena of the profiler ever purges: the next step reuses the pages. The bill is
// unchanged (it counts live blocks); the process keeps, per category, what that category held
// at its peak, so pages no longer move from one category to another (SmolLM2-135M at 512
// tokens: 4.5% more resident). The price: a process whose shapes change (a second, bigger
// model) keeps the old pages as well.
static void never_purge(unsigned arena) {
    ssize_t never = -1;
    char name[64];
    snprintf(name, sizeof name, "arena.%u.dirty_decay_ms", arena);
    mallctl(name, NULL, NULL, &never, sizeof never);
    snprintf(name, sizeof name, "arena.%u.muzzy_decay_ms", arena);
    mallctl(name, NULL, NULL, &never, sizeof never);
}

// Gradients and temporaries come back in the same sizes in the same order. Their freed extents
// are kept apart (no merge): jemalloc does not carve a request out of a free extent more than
// 64 times its size, so merged, the freed gradients would form one extent too big for the
// smaller ones, which would then take new pages and grow the process (by 250 MB in that run).
// Kept apart, each request finds its own extent of the last step. (Activations and the cache
// do merge: a growing KV cache asks for a slightly larger block every token.)
//
// The weights', gradients' and optimizer state's arenas ask for 2 MB pages on the memory they map
// (madvise MADV_HUGEPAGE, before the pages are first touched): the kernels stream those whole,
// and on 4 KB pages a stream changes page, and TLB entry, every 4 KB (an int8 decode step, whose
// weights stream at the machine's read bandwidth, took a sixth longer). Their blocks are written
// whole, so the large pages cost little resident memory; activations, the cache and the
// temporaries, partly touched and reused, keep 4 KB pages. Where transparent_hugepage is "never"
// the advice does nothing; the bill never changes.
static extent_alloc_t *default_alloc;

#define MP_HUGE_PAGE ((uintptr_t)2 << 20)

static void *alloc_huge(extent_hooks_t *h, void *addr, size_t size, size_t align, bool *zero, bool *commit,
                        unsigned arena) {
    void *p = default_alloc(h, addr, size, align, zero, commit, arena);
    uintptr_t lo = ((uintptr_t)p + MP_HUGE_PAGE - 1) & ~(MP_HUGE_PAGE - 1);
    uintptr_t hi = ((uintptr_t)p + size) & ~(MP_HUGE_PAGE - 1);
    if (p && hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
    return p;
}

static void set_hooks(unsigned arena, bool huge, bool apart) {
    static extent_hooks_t plain, kept_apart, huge_plain, huge_apart; // jemalloc's defaults but for these
    char name[64];
    extent_hooks_t *def = NULL;
    size_t sz = sizeof def;
    snprintf(name, sizeof name, "arena.%u.extent_hooks", arena);
    if (mallctl(name, &def, &sz, NULL, 0) != 0 || !def) return;
    if (!plain.alloc) {
        default_alloc = def->alloc;
        plain = kept_apart = *def;
        kept_apart.merge = no_merge;
        huge_plain = plain, huge_apart = kept_apart;
        huge_plain.alloc = huge_apart.alloc = alloc_huge;
    }
    extent_hooks_t *mine = huge ? (apart ? &huge_apart : &huge_plain) : (apart ? &kept_apart : &plain);
    if (mine->alloc == def->alloc && mine->merge == def->merge) return; // the defaults: nothing to set
    mallctl(name, NULL, NULL, &mine, sizeof mine);
}

// Arenas are created once per process and reused: jemalloc cannot destroy an arena that a
// thread still has bound, and re-initialising the profiler must not leak arenas.
static unsigned mp_arenas[MP_NCATEGORIES];
static bool mp_arenas_made;

int mp_backend_init(void) {
    if (!mp_arenas_made) {
        for (int c = 0; c < MP_NCATEGORIES; c++) {
            size_t sz = sizeof(unsigned);
            if (mallctl("arenas.create", &mp_arenas[c], &sz, NULL, 0) != 0) return -1;
        }
        for (int c = 0; c < MP_NCATEGORIES; c++) {
            never_purge(mp_arenas[c]);
            set_hooks(mp_arenas[c], c == MP_WEIGHT || c == MP_GRADIENT || c == MP_OPTIMIZER,
                      c == MP_GRADIENT || c == MP_TEMPORARY);
        }
        mp_arenas_made = true;
    }
    memcpy(mp_g.arena, mp_arenas, sizeof mp_arenas);
    if (mp_g.opt.track_other && !BARE_ALLOC) hooks_install();
    return 0;
}

void mp_backend_shutdown(void) { hooks_remove(); }

void *mp_backend_alloc(size_t bytes, mp_category cat, size_t *usable) {
    mp_in_profiler++;
    void *p = mallocx(bytes ? bytes : 1, MALLOCX_ARENA(mp_g.arena[cat]) | MALLOCX_TCACHE_NONE);
    *usable = p ? sallocx(p, 0) : 0;
    mp_in_profiler--;
    return p;
}

void mp_backend_free(void *p) {
    mp_in_profiler++;
    dallocx(p, MALLOCX_TCACHE_NONE);
    mp_in_profiler--;
}

bool mp_other_available(void) { return mp_g.hooks_installed; }

static uint64_t je_u64(const char *name) {
    uint64_t v = 0;
    size_t sz = sizeof(size_t);
    size_t tmp = 0;
    if (mallctl(name, &tmp, &sz, NULL, 0) == 0) v = tmp;
    return v;
}

static void je_refresh(void) {
    uint64_t epoch = 1;
    size_t sz = sizeof epoch;
    mallctl("epoch", &epoch, &sz, &epoch, sz);
}

mp_crosscheck mp_crosscheck_jemalloc(mp_category planted_cat, int64_t planted) {
    mp_crosscheck r;
    memset(&r, 0, sizeof r);
    if (!mp_g.active || mp_g.opt.meta) return r;
    bool stats = false;
    size_t sz = sizeof stats;
    if (mallctl("config.stats", &stats, &sz, NULL, 0) != 0 || !stats) return r;
    // Under the lock: mp_alloc and mp_free change an arena and its counter inside it, so the two
    // are read at one instant.
    mp_lock();
    je_refresh();
    r.available = true;
    r.agrees = true;
    for (int c = 0; c < MP_NCATEGORIES; c++) {
        if (c == MP_OTHER) continue; // "other" lives in jemalloc's automatic arenas
        char name[96];
        snprintf(name, sizeof name, "stats.arenas.%u.small.allocated", mp_g.arena[c]);
        uint64_t small = je_u64(name);
        snprintf(name, sizeof name, "stats.arenas.%u.large.allocated", mp_g.arena[c]);
        uint64_t large = je_u64(name);
        r.jemalloc_bytes[c] = small + large;
        int64_t mine =
            (int64_t)(mp_g.counters[c].live_usable + mp_g.host[c].live_usable) + (c == (int)planted_cat ? planted : 0);
        r.difference[c] = (int64_t)(small + large) - mine;
        if (r.difference[c] != 0) r.agrees = false;
    }
    mp_unlock();
    return r;
}

void mp_jemalloc_figures(uint64_t *resident, uint64_t *allocated) {
    je_refresh();
    *resident = je_u64("stats.resident");
    *allocated = je_u64("stats.allocated");
}

#else // MEMBILL_SYSTEM_ALLOC: the sanitizer build

const char *mp_backend(void) { return "system"; }
int mp_backend_init(void) { return 0; }
void mp_backend_shutdown(void) {}
bool mp_other_available(void) { return false; }

void *mp_backend_alloc(size_t bytes, mp_category cat, size_t *usable) {
    (void)cat;
    mp_in_profiler++;
    void *p = malloc(bytes ? bytes : 1);
    *usable = p ? malloc_usable_size(p) : 0;
    mp_in_profiler--;
    return p;
}

void mp_backend_free(void *p) { mp_raw_free(p); }

mp_crosscheck mp_crosscheck_jemalloc(mp_category planted_cat, int64_t planted) {
    (void)planted_cat, (void)planted;
    mp_crosscheck r;
    memset(&r, 0, sizeof r);
    return r;
}

void mp_jemalloc_figures(uint64_t *resident, uint64_t *allocated) {
    *resident = 0;
    *allocated = 0;
}

#endif

// ---- life cycle and the allocation entry points ----

mp_status mp_init(const mp_options *opt) {
    if (mp_g.active) return MP_ERR_STATE;
    memset(&mp_g, 0, sizeof mp_g);
    if (opt) mp_g.opt = *opt;
    pthread_mutex_init(&mp_g.lock, NULL);
    mp_g.t0 = mp_now();
    mp_g.phase = MP_PHASE_SETUP;
    mp_g.phase_started = mp_g.t0;
    mp_g.phases[MP_PHASE_SETUP].entries = 1;
    mp_g.active = true;
    mp_site_id("(none)"); // id 0
    if (mp_backend_init() != 0) {
        mp_g.active = false;
        return MP_ERR_NOMEM;
    }
    mp_checkpoint_process();
    return MP_OK;
}

void mp_shutdown(void) {
    if (!mp_g.active) return;
    mp_backend_shutdown();
    mp_lock();
    mp_g.active = false;
    mp_unlock();
    mp_sites_free(&mp_g.sites);
    mp_sites_free(&mp_g.details);
    mp_timeline_free(&mp_g.timeline);
    pthread_mutex_destroy(&mp_g.lock);
}

bool mp_active(void) { return mp_g.active; }

bool mp_set_host(bool on) {
    if (!mp_g.active) return false;
    mp_lock();
    bool was = mp_g.host_mode;
    mp_g.host_mode = on && mp_g.active;
    mp_unlock();
    return was;
}

mp_counter mp_get_host_counter(mp_category c) {
    mp_counter k = {0};
    if ((unsigned)c >= MP_NCATEGORIES || !mp_g.active) return k;
    mp_lock();
    k = mp_g.host[c];
    mp_unlock();
    return k;
}
bool mp_is_meta(void) { return mp_g.active && mp_g.opt.meta; }
uint64_t mp_budget(void) { return mp_g.active ? mp_g.opt.budget : 0; } // fixed at mp_init

// Tensors above this are not a real request but a bug or a hostile input (2^50 bytes).
#define MP_MAX_REQUEST ((uint64_t)1 << 50)

#if defined(MEMBILL_BARE_ALLOC)
// The benchmark build that measures the profiler's own cost: every block from its category's
// arena as in the normal build (the same pages, kept the same way), but with no lock, no site,
// no count and no hooks on plain malloc. Its bill is empty; only its times mean something.
mp_status mp_alloc(mp_block *out, size_t bytes, mp_category cat, const char *site) {
    return mp_alloc_described(out, bytes, cat, site, NULL);
}

mp_status mp_alloc_described(mp_block *out, size_t bytes, mp_category cat, const char *site, const char *detail) {
    (void)site, (void)detail;
    memset(out, 0, sizeof *out);
    if (!mp_g.active) return MP_ERR_STATE;
    if ((unsigned)cat >= MP_OTHER || bytes > MP_MAX_REQUEST) return MP_ERR_INVALID;
    size_t usable = bytes;
    if (!mp_g.opt.meta && !(out->data = mp_backend_alloc(bytes, cat, &usable))) return MP_ERR_NOMEM;
    out->bytes = bytes;
    out->usable = usable;
    out->category = (uint8_t)cat;
    return MP_OK;
}

void mp_free(mp_block *b) {
    if (b && b->data) mp_backend_free(b->data);
    if (b) memset(b, 0, sizeof *b);
}
#else
mp_status mp_alloc(mp_block *out, size_t bytes, mp_category cat, const char *site) {
    return mp_alloc_described(out, bytes, cat, site, NULL);
}

// A host block (mp_set_host): no budget, no timeline; unlocks.
static mp_status alloc_host_locked(mp_block *out, size_t bytes, mp_category cat, uint32_t sid) {
    size_t usable = bytes;
    void *p = NULL;
    if (!mp_g.opt.meta && !(p = mp_backend_alloc(bytes, cat, &usable))) {
        mp_unlock();
        return MP_ERR_NOMEM;
    }
    mp_count_host_locked(cat, (int64_t)bytes, (int64_t)usable);
    mp_unlock();
    *out = (mp_block){.data = p, .bytes = bytes, .usable = usable, .site = sid, .category = (uint8_t)cat, .host = true};
    return MP_OK;
}

mp_status mp_alloc_described(mp_block *out, size_t bytes, mp_category cat, const char *site, const char *detail) {
    memset(out, 0, sizeof *out);
    if (!mp_g.active) return MP_ERR_STATE;
    if ((unsigned)cat >= MP_OTHER || bytes > MP_MAX_REQUEST) return MP_ERR_INVALID;
    // The check, the allocation and the count are one step under the lock, so that threads
    // allocating at once can never take the live total past the budget between them. The hooks
    // ignore this thread's allocator calls (mp_in_profiler), so they never wait on it here.
    mp_lock();
    uint32_t sid = mp_site_id_locked(site ? site : "(none)");
    if (mp_g.host_mode) return alloc_host_locked(out, bytes, cat, sid);
    if (mp_g.over_budget) { // plain malloc already went past it: the record names that one
        mp_unlock();
        return MP_ERR_BUDGET;
    }
    if (mp_over_budget_locked(bytes)) {
        mp_record_oom_locked(cat, sid, bytes);
        mp_unlock();
        return MP_ERR_BUDGET;
    }
    size_t usable = bytes;
    void *p = NULL;
    if (!mp_g.opt.meta) {
        p = mp_backend_alloc(bytes, cat, &usable);
        if (!p) {
            mp_unlock();
            return MP_ERR_NOMEM;
        }
    }
    // A description lives on the timeline alone: without one there is nothing to intern.
    uint32_t did = mp_g.opt.keep_timeline ? mp_detail_id_locked(detail) : 0;
    if (!++mp_g.next_serial) mp_g.next_serial = 1; // 0 is plain malloc's
    uint32_t serial = mp_g.next_serial;
    mp_count_locked(cat, (int64_t)bytes, (int64_t)usable, sid, did, serial);
    mp_unlock();
    out->data = p;
    out->bytes = bytes;
    out->usable = usable;
    out->site = sid;
    out->serial = serial;
    out->category = (uint8_t)cat;
    return MP_OK;
}

void mp_free(mp_block *b) {
    if (!b || (!b->data && !b->bytes && !b->usable)) return;
    if (!mp_g.active) {
        if (b->data) mp_backend_free(b->data);
    } else {
        mp_lock();
        if (b->data) mp_backend_free(b->data);
        if (b->host)
            mp_count_host_locked((mp_category)b->category, -(int64_t)b->bytes, -(int64_t)b->usable);
        else
            mp_count_locked((mp_category)b->category, -(int64_t)b->bytes, -(int64_t)b->usable, b->site, 0,
                            b->serial);
        mp_unlock();
    }
    memset(b, 0, sizeof *b);
}
#endif
