// Private state shared by the profiler's files.
#pragma once

#include "profiler.h"

#include <pthread.h>

// The interned site labels: a growing array plus an open-addressing index, so that interning
// stays constant time per label however many layers a config has.
typedef struct {
    char **names;
    uint64_t *hashes; // per id: the label's hash, so a resize never rehashes the strings
    size_t count, cap;
    uint32_t *index; // slot -> id + 1 (0: empty)
    size_t index_cap;
    uint64_t lookups, probes; // probes: slots examined past the first (a test checks they stay few)
} mp_sites;

// Events live in fixed chunks that never move, so a pointer from mp_timeline_get stays valid
// while other threads keep recording.
#define MP_CHUNK_SHIFT 12
#define MP_CHUNK_EVENTS ((size_t)1 << MP_CHUNK_SHIFT)
typedef struct {
    mp_event **chunks;
    size_t nchunks, chunks_cap;
    size_t count;
    size_t dropped; // events lost because the timeline could not grow (out of memory)
} mp_timeline;

// Pointers that plain malloc handed out since the hooks went in, with their usable sizes, so
// that a free of memory allocated before the hooks is not billed.
typedef struct {
    uintptr_t *keys;
    size_t *sizes;
    size_t count, tombs, cap; // live keys, deleted slots, slots
} mp_ptrset;

typedef struct {
    bool active;
    mp_options opt;
    double t0;
    // The hooks can fire on any thread: every counter, the peaks, the sites, the timeline and the
    // budget are read and written under this lock.
    pthread_mutex_t lock;

    mp_counter counters[MP_NCATEGORIES];
    bool host_mode;                  // mp_set_host
    mp_counter host[MP_NCATEGORIES]; // host memory, apart from the device's bill
    uint64_t live_total;
    mp_moment peak;
    mp_phase phase;
    double phase_started;
    mp_phase_stats phases[MP_NPHASES];
    mp_oom_record oom;
    bool over_budget;          // plain malloc went past the budget: every later mp_alloc is refused
    uint32_t last_tensor_site; // the site a peak made by plain malloc is charged to
    uint32_t next_serial;      // the last tensor allocation's serial
    mp_process proc_peak;

    mp_sites sites;
    mp_sites details; // what a block is (a tensor's shape and dtype), per allocation event
    mp_timeline timeline;

    // jemalloc backend
    unsigned arena[MP_NCATEGORIES];
    bool hooks_installed;
    void *hooks_handle;
    mp_ptrset other_ptrs;
} mp_state;

extern mp_state mp_g;

double mp_now(void);
// Counters: a change of `delta` requested / `delta_usable` usable bytes in `cat`, with the site.
// detail: an interned description (mp_detail_id_locked), 0 for none.
void mp_count_locked(mp_category cat, int64_t delta, int64_t delta_usable, uint32_t site, uint32_t detail,
                     uint32_t serial);
// The timeline's event i (i < count), under the lock.
const mp_event *mp_event_at_locked(size_t i);
// The same for a host block: its category's host counter alone.
void mp_count_host_locked(mp_category cat, int64_t delta, int64_t delta_usable);
uint32_t mp_detail_id_locked(const char *detail);
// Whether `bytes` more would take the live total past the budget.
bool mp_over_budget_locked(uint64_t bytes);
// Fills the out-of-memory record: what asked, and what was live before it.
void mp_record_oom_locked(mp_category cat, uint32_t site, uint64_t bytes);
uint32_t mp_site_id_locked(const char *label);
void mp_sites_free(mp_sites *s);
void mp_timeline_free(mp_timeline *t);
void mp_checkpoint_process(void);

// The profiler's lock; while it is held the hooks ignore this thread's allocations.
void mp_lock(void);
void mp_unlock(void);

// Raw allocation that the hooks ignore (the profiler's own bookkeeping).
void *mp_raw_malloc(size_t n);
void *mp_raw_realloc(void *p, size_t n);
void mp_raw_free(void *p);

// Backend: per-category allocation and the allocator's own view.
int mp_backend_init(void);
void mp_backend_shutdown(void);
void *mp_backend_alloc(size_t bytes, mp_category cat, size_t *usable);
void mp_backend_free(void *p);
void mp_jemalloc_figures(uint64_t *resident, uint64_t *allocated);
