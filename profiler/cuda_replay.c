// The run's own allocations, from the timeline, through the simulated caching allocator.
#include "cuda_internal.h"
#include "mp_internal.h"

mp_status mp_cuda_replay_to(mp_cuda *d, size_t end) {
    if (!d || !mp_g.active) return MP_ERR_STATE;
    if (d->failed) return MP_ERR_BUDGET;
    mp_status st = MP_OK;
    mp_lock();
    if (end > mp_g.timeline.count) end = mp_g.timeline.count;
    for (; d->cursor < end; d->cursor++) {
        const mp_event *e = mp_event_at_locked(d->cursor);
        // plain malloc is host memory; a zero-byte tensor takes no block
        if (e->category == MP_OTHER || !e->bytes || !e->serial) continue;
        if (e->bytes < 0) {
            mp_cuda_release(d, e->serial, e->seconds);
            continue;
        }
        st = mp_cuda_malloc(d, e->serial, (uint64_t)e->bytes, (mp_category)e->category, e->site, e->seconds);
        if (st != MP_OK) break;
    }
    mp_unlock();
    return st;
}

size_t mp_cuda_cursor(const mp_cuda *d) { return d ? d->cursor : 0; }
