// Private state shared by the profiler's files.
#pragma once

#include "profiler.h"

#include <pthread.h>

// The interned site labels: a growing array plus an open-addressing index.
typedef struct {
    char **names;
    size_t count, cap;
    uint32_t *index; // slot -> id + 1 (0: empty)
    size_t index_cap;
} mp_sites;

typedef struct {
    mp_event *events;
    size_t count, cap;
    size_t dropped; // events lost because the timeline could not grow (out of memory)
} mp_timeline;

// Pointers that plain malloc handed out since the hooks went in, with their usable sizes, so
// that a free of memory allocated before the hooks is not billed.
typedef struct {
    uintptr_t *keys;
    size_t *sizes;
    size_t count, cap;
} mp_ptrset;

typedef struct {
    bool active;
    mp_options opt;
    double t0;
    pthread_mutex_t lock; // the hooks can fire on any thread

    mp_counter counters[MP_NCATEGORIES];
    uint64_t live_total;
    mp_moment peak;
    mp_phase phase;
    double phase_started;
    mp_phase_stats phases[MP_NPHASES];
    mp_oom_record oom;
    mp_process proc_peak;

    mp_sites sites;
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
void mp_count_locked(mp_category cat, int64_t delta, int64_t delta_usable, uint32_t site);
void mp_sites_free(mp_sites *s);
void mp_timeline_free(mp_timeline *t);
void mp_checkpoint_process(void);

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
