// PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator)
// replayed: the same rounding, pools, segment sizes, best fit, splitting and merging, the same
// order of retries when the device is full, and the same statistics (allocated_bytes counts
// whole blocks, reserved_bytes whole segments, inactive_split_bytes the free parts of split
// segments). One stream, no CUDA graphs: a training step's tensors as one process makes them.
#include "cuda_internal.h"

#include <stdlib.h>
#include <string.h>

#define CU_FIRST_ADDRESS 0x7f0000000000ULL // where the simulated device's addresses begin

void mp_cuda_conf_default(mp_cuda_conf *c) {
    memset(c, 0, sizeof *c);
    c->max_split_size = UINT64_MAX;
    c->max_non_split_rounding = CU_LARGE_BUFFER;
}

// ---- ordered sets of blocks ----

static bool goes_before(const cu_set *s, const cu_block *a, uint64_t size, uint64_t addr) {
    if (!s->by_address && a->size != size) return a->size < size;
    return a->addr < addr;
}

size_t cu_set_lower_bound(const cu_set *s, uint64_t size, uint64_t addr) {
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (goes_before(s, s->v[mid], size, addr))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool cu_set_insert(cu_set *s, cu_block *b) {
    if (s->n == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 64;
        cu_block **v = mp_raw_realloc(s->v, ncap * sizeof *v);
        if (!v) return false;
        s->v = v;
        s->cap = ncap;
    }
    size_t i = cu_set_lower_bound(s, b->size, b->addr);
    memmove(s->v + i + 1, s->v + i, (s->n - i) * sizeof *s->v);
    s->v[i] = b;
    s->n++;
    return true;
}

void cu_set_erase(cu_set *s, const cu_block *b) {
    size_t i = cu_set_lower_bound(s, b->size, b->addr);
    if (i >= s->n || s->v[i] != b) return;
    memmove(s->v + i, s->v + i + 1, (s->n - i - 1) * sizeof *s->v);
    s->n--;
}

void cu_set_free(cu_set *s) {
    mp_raw_free(s->v);
    memset(s, 0, sizeof *s);
}

bool cu_pool_insert(cu_pool *p, cu_block *b) {
    b->gc_base = p->searches;
    return cu_set_insert(&p->blocks, b);
}

// ---- allocated blocks by serial ----

static size_t slot_of(uint32_t k, size_t cap) { return (size_t)(k * 2654435761u) & (cap - 1); }

static bool active_grow(mp_cuda *d) {
    size_t ncap = d->cap_active ? d->cap_active * 2 : 1024;
    uint32_t *keys = mp_raw_malloc(ncap * sizeof *keys);
    cu_block **vals = mp_raw_malloc(ncap * sizeof *vals);
    if (!keys || !vals) {
        mp_raw_free(keys);
        mp_raw_free(vals);
        return false;
    }
    memset(keys, 0, ncap * sizeof *keys);
    for (size_t i = 0; i < d->cap_active; i++) {
        if (!d->keys[i]) continue;
        size_t j = slot_of(d->keys[i], ncap);
        while (keys[j]) j = (j + 1) & (ncap - 1);
        keys[j] = d->keys[i];
        vals[j] = d->vals[i];
    }
    mp_raw_free(d->keys);
    mp_raw_free(d->vals);
    d->keys = keys;
    d->vals = vals;
    d->cap_active = ncap;
    return true;
}

static size_t active_find(const mp_cuda *d, uint32_t k) {
    if (!d->cap_active || !k) return SIZE_MAX;
    for (size_t j = slot_of(k, d->cap_active);; j = (j + 1) & (d->cap_active - 1)) {
        if (d->keys[j] == k) return j;
        if (!d->keys[j]) return SIZE_MAX;
    }
}

static bool active_put(mp_cuda *d, uint32_t k, cu_block *b) {
    if ((d->nactive + 1) * 2 > d->cap_active && !active_grow(d)) return false;
    size_t j = slot_of(k, d->cap_active);
    while (d->keys[j]) j = (j + 1) & (d->cap_active - 1);
    d->keys[j] = k;
    d->vals[j] = b;
    d->nactive++;
    return true;
}

// Linear probing's deletion: the entries after the hole that belong before it move back.
static void active_remove(mp_cuda *d, size_t j) {
    size_t cap = d->cap_active, i = j;
    d->keys[i] = 0;
    d->nactive--;
    for (size_t k = (i + 1) & (cap - 1); d->keys[k]; k = (k + 1) & (cap - 1)) {
        size_t home = slot_of(d->keys[k], cap);
        bool stays = (i <= k) ? (home > i && home <= k) : (home > i || home <= k);
        if (stays) continue;
        d->keys[i] = d->keys[k];
        d->vals[i] = d->vals[k];
        d->keys[k] = 0;
        i = k;
    }
}

// ---- trace and statistics ----

void cu_record(mp_cuda *d, int action, uint64_t addr, uint64_t size, uint32_t site, uint8_t category) {
    if (d->trace_failed || !d->conf.record_history) return;
    if (d->ntrace == d->cap_trace) {
        size_t ncap = d->cap_trace ? d->cap_trace * 2 : 4096;
        cu_trace *t = mp_raw_realloc(d->trace, ncap * sizeof *t);
        if (!t) {
            d->trace_failed = true;
            return;
        }
        d->trace = t;
        d->cap_trace = ncap;
    }
    d->trace[d->ntrace++] = (cu_trace){addr, size, d->now, site, (uint8_t)action, category};
}

static void raise_peaks(mp_cuda *d) {
    mp_cuda_stats *s = &d->st;
    if (s->allocated > s->allocated_peak) s->allocated_peak = s->allocated;
    if (s->requested > s->requested_peak) s->requested_peak = s->requested;
    if (s->inactive_split > s->inactive_split_peak) s->inactive_split_peak = s->inactive_split;
    if (s->allocated > s->window_allocated_peak) s->window_allocated_peak = s->allocated;
    if (s->requested > s->window_requested_peak) s->window_requested_peak = s->requested;
    if (s->reserved > s->window_reserved_peak) s->window_reserved_peak = s->reserved;
}

void cu_reserved_add(mp_cuda *d, int64_t bytes) {
    d->st.reserved = (uint64_t)((int64_t)d->st.reserved + bytes);
    if (d->st.reserved > d->st.reserved_peak) {
        d->st.reserved_peak = d->st.reserved;
        d->st.reserved_peak_event = d->cursor;
    }
    raise_peaks(d);
}

static void inactive_add(mp_cuda *d, const cu_block *b, int64_t bytes) {
    // Free pages of an expandable segment can always be handed back: they are not counted.
    if (!b->seg->expandable) d->st.inactive_split = (uint64_t)((int64_t)d->st.inactive_split + bytes);
}

bool cu_device_has(const mp_cuda *d, uint64_t bytes) {
    const mp_cuda_conf *c = &d->conf;
    return !c->capacity || d->st.reserved + bytes <= c->capacity;
}

// ---- segments ----

cu_seg *cu_seg_new(mp_cuda *d, uint64_t size, bool small, bool expandable, uint32_t site, uint8_t category) {
    if (d->nsegs == d->cap_segs) {
        size_t ncap = d->cap_segs ? d->cap_segs * 2 : 64;
        cu_seg **v = mp_raw_realloc(d->segs, ncap * sizeof *v);
        if (!v) return NULL;
        d->segs = v;
        d->cap_segs = ncap;
    }
    cu_seg *s = mp_raw_malloc(sizeof *s);
    if (!s) return NULL;
    memset(s, 0, sizeof *s);
    s->addr = d->next_addr;
    s->size = size;
    s->small = small;
    s->expandable = expandable;
    s->site = site;
    s->category = category;
    d->next_addr += (size + CU_ROUND_LARGE - 1) / CU_ROUND_LARGE * CU_ROUND_LARGE;
    d->segs[d->nsegs++] = s;
    return s;
}

void cu_seg_delete(mp_cuda *d, cu_seg *s) {
    for (size_t i = 0; i < d->nsegs; i++)
        if (d->segs[i] == s) {
            d->segs[i] = d->segs[--d->nsegs];
            break;
        }
    mp_raw_free(s);
}

bool cu_is_split(const cu_block *b) { return b->prev || b->next; }

cu_block *cu_block_new(cu_seg *seg, uint64_t addr, uint64_t size, bool mapped) {
    cu_block *b = mp_raw_malloc(sizeof *b);
    if (!b) return NULL;
    memset(b, 0, sizeof *b);
    b->seg = seg;
    b->addr = addr;
    b->size = size;
    b->mapped = mapped;
    if (!seg->any) seg->any = b;
    return b;
}

// try_merge_blocks: src, a free neighbour of dst (mapped alike), joins dst; returns its size.
size_t cu_merge(mp_cuda *d, cu_block *dst, cu_block *src, cu_pool *p) {
    (void)d;
    if (!src || src->allocated || dst->mapped != src->mapped) return 0;
    if (dst->prev == src) {
        dst->addr = src->addr;
        dst->prev = src->prev;
        if (dst->prev) dst->prev->next = dst;
    } else {
        dst->next = src->next;
        if (dst->next) dst->next->prev = dst;
    }
    size_t subsumed = src->size;
    // src leaves its set under its own key, before dst's size changes anything
    cu_set_erase(src->mapped ? &p->blocks : &p->unmapped, src);
    dst->size += subsumed;
    if (src->seg->any == src) src->seg->any = dst;
    mp_raw_free(src);
    return subsumed;
}

// ---- the rules ----

static uint32_t divisions_for(const mp_cuda_conf *c, uint64_t size) {
    int log = 63 - __builtin_clzll(size);
    int i = log - 20; // the intervals start at 1 MiB
    if (i < 0) i = 0;
    if (i > MP_CUDA_ROUNDUP_INTERVALS - 1) i = MP_CUDA_ROUNDUP_INTERVALS - 1;
    return c->roundup_power2_divisions[i];
}

// roundup_power2_next_division: the next of `div` equal steps between two powers of two.
static uint64_t next_division(uint64_t size, uint64_t div) {
    if ((size & (size - 1)) == 0) return size;
    uint64_t floor2 = 1ULL << (63 - __builtin_clzll(size));
    uint64_t step = floor2 >> (63 - __builtin_clzll(div));
    if (!step) return floor2 << 1;
    uint64_t down = size & ~(step - 1);
    return down == size ? size : down + step;
}

uint64_t mp_cuda_round_size(const mp_cuda_conf *c, uint64_t bytes) {
    if (bytes < CU_MIN_BLOCK) return CU_MIN_BLOCK;
    uint32_t div = divisions_for(c, bytes);
    if (div > 1 && bytes > CU_MIN_BLOCK * div) return next_division(bytes, div);
    return (bytes + CU_MIN_BLOCK - 1) / CU_MIN_BLOCK * CU_MIN_BLOCK;
}

uint64_t mp_cuda_segment_size(uint64_t rounded) {
    if (rounded <= CU_SMALL_SIZE) return CU_SMALL_BUFFER;
    if (rounded < CU_MIN_LARGE_ALLOC) return CU_LARGE_BUFFER;
    return (rounded + CU_ROUND_LARGE - 1) / CU_ROUND_LARGE * CU_ROUND_LARGE;
}

static bool gc_on(const mp_cuda_conf *c) { return c->memory_fraction > 0 && c->garbage_collection_threshold > 0; }

static uint64_t allowed_maximum(const mp_cuda_conf *c) {
    return (uint64_t)(c->memory_fraction * (double)c->total_bytes);
}

// get_free_block: the smallest cached block that holds `size`, within max_split_size's limits.
static cu_block *get_free_block(mp_cuda *d, cu_pool *p, uint64_t size) {
    const mp_cuda_conf *c = &d->conf;
    if (gc_on(c)) p->searches++;
    size_t i = cu_set_lower_bound(&p->blocks, size, 0);
    if (i >= p->blocks.n) return NULL;
    if (p->blocks.v[i]->seg->expandable) {
        // A block with unmapped space after it counts as what it could grow to: a smaller
        // block further on goes first.
#define EXPANDABLE_SIZE(b) ((b)->size + ((b)->next && !(b)->next->mapped ? (b)->next->size : 0))
        while (p->blocks.v[i]->seg->expandable && i + 1 < p->blocks.n &&
               EXPANDABLE_SIZE(p->blocks.v[i + 1]) < EXPANDABLE_SIZE(p->blocks.v[i]))
            i++;
#undef EXPANDABLE_SIZE
    }
    cu_block *b = p->blocks.v[i];
    if (size < c->max_split_size && b->size >= c->max_split_size) return NULL; // no oversize block for it
    if (size >= c->max_split_size && b->size >= size + c->max_non_split_rounding) return NULL;
    cu_set_erase(&p->blocks, b);
    return b;
}

// release_block: a whole cached segment back to the device.
static void release_block(mp_cuda *d, cu_pool *p, cu_block *b) {
    cu_record(d, CU_SEGMENT_FREE, b->addr, b->size, b->seg->site, b->seg->category);
    cu_set_erase(&p->blocks, b);
    cu_reserved_add(d, -(int64_t)b->size);
    d->st.segments--;
    d->st.segment_frees++;
    cu_seg_delete(d, b->seg);
    mp_raw_free(b);
}

// A copy of the pool's free blocks, to walk while releasing some of them.
static cu_block **blocks_copy(const cu_pool *p) {
    cu_block **v = mp_raw_malloc((p->blocks.n ? p->blocks.n : 1) * sizeof *v);
    if (v && p->blocks.n) memcpy(v, p->blocks.v, p->blocks.n * sizeof *v);
    return v;
}

// garbage_collect_cached_blocks: under a memory fraction, once reserved passes the threshold,
// whole cached segments of the large pool go back, the least recently reused first.
static void garbage_collect(mp_cuda *d) {
    cu_pool *p = &d->large;
    uint64_t threshold = (uint64_t)(d->conf.garbage_collection_threshold * (double)allowed_maximum(&d->conf));
    if (d->st.reserved <= threshold) return;
    uint64_t target = d->st.reserved - threshold, reclaimed = 0;
    uint64_t total_age = 0;
    int count = 0;
    for (size_t i = 0; i < p->blocks.n; i++)
        if (!cu_is_split(p->blocks.v[i])) {
            total_age += (uint64_t)(p->searches - p->blocks.v[i]->gc_base);
            count++;
        }
    bool freed = true;
    while (reclaimed < target && freed && count > 0) {
        double age_threshold = (double)total_age / count;
        freed = false;
        cu_block **v = blocks_copy(p);
        size_t n = p->blocks.n;
        for (size_t i = 0; v && i < n; i++) {
            cu_block *b = v[i];
            uint64_t age = (uint64_t)(p->searches - b->gc_base);
            if (cu_is_split(b) || b->seg->expandable || (double)age < age_threshold) continue;
            freed = true;
            reclaimed += b->size;
            total_age -= age;
            count--;
            release_block(d, p, b);
        }
        mp_raw_free(v);
        if (!v) return;
    }
}

// alloc_block: a new segment (or, expandable, more of the segment mapped) for the request.
static cu_block *alloc_block(mp_cuda *d, cu_pool *p, uint64_t size, uint64_t alloc_size, bool retry, uint32_t site,
                             uint8_t category) {
    const mp_cuda_conf *c = &d->conf;
    if (retry) d->st.alloc_retries++;
    if (c->memory_fraction > 0 && d->st.reserved + alloc_size > allowed_maximum(c)) return NULL;
    if (c->expandable_segments) return cu_expandable_alloc(d, p, size, site, category);
    if (!cu_device_has(d, alloc_size)) return NULL; // cudaMalloc: out of memory
    cu_seg *s = cu_seg_new(d, alloc_size, p->small, false, site, category);
    cu_block *b = s ? cu_block_new(s, s->addr, alloc_size, true) : NULL;
    if (!b) {
        if (s) cu_seg_delete(d, s);
        return NULL;
    }
    d->st.segments++;
    d->st.segment_allocs++;
    cu_record(d, CU_SEGMENT_ALLOC, b->addr, alloc_size, site, category);
    cu_reserved_add(d, (int64_t)alloc_size);
    return b;
}

// release_available_cached_blocks: with max_split_size set, oversize cached segments go back,
// one large enough, else the largest until enough is freed.
static bool release_available(mp_cuda *d, cu_pool *p, uint64_t size) {
    uint64_t limit = d->conf.max_split_size;
    if (limit == UINT64_MAX) return false;
    uint64_t want = size < limit ? limit : size;
    size_t i = cu_set_lower_bound(&p->blocks, want, 0);
    if (i < p->blocks.n) {
        cu_block *b = p->blocks.v[i];
        if (cu_is_split(b) || b->seg->expandable) return false;
        release_block(d, p, b);
        return true;
    }
    if (!p->blocks.n) return false;
    uint64_t released = 0;
    for (size_t k = p->blocks.n; k-- > 0 && released < want;) {
        cu_block *b = p->blocks.v[k];
        if (b->size < limit || cu_is_split(b) || b->seg->expandable) break;
        released += b->size;
        release_block(d, p, b);
    }
    return released >= want;
}

// release_cached_blocks: every cached segment that holds no block, both pools; expandable
// segments hand back their free pages.
static void release_pool(mp_cuda *d, cu_pool *p) {
    cu_block **v = blocks_copy(p);
    size_t n = p->blocks.n;
    for (size_t i = 0; v && i < n; i++) {
        cu_block *b = v[i];
        if (b->seg->expandable)
            cu_unmap_free(d, p, b);
        else if (!cu_is_split(b))
            release_block(d, p, b);
    }
    mp_raw_free(v);
}

static void release_cached(mp_cuda *d) {
    release_pool(d, &d->large);
    release_pool(d, &d->small);
}

void mp_cuda_empty_cache(mp_cuda *d, double seconds) {
    if (!d) return;
    d->now = seconds;
    release_cached(d);
}

static bool should_split(const mp_cuda *d, const cu_block *b, uint64_t size) {
    uint64_t remaining = b->size - size;
    if (b->seg->small || d->conf.expandable_segments) return remaining >= CU_MIN_BLOCK;
    return size < d->conf.max_split_size && remaining > CU_SMALL_SIZE;
}

// alloc_found_block: the block handed out, split when what remains is worth keeping apart.
static cu_block *take_block(mp_cuda *d, cu_pool *p, cu_block *b, uint64_t size) {
    bool already_split = cu_is_split(b);
    if (should_split(d, b, size)) {
        cu_block *rest = b;
        cu_block *nb = cu_block_new(b->seg, b->addr, size, true);
        if (!nb) return NULL;
        nb->prev = rest->prev;
        if (nb->prev) nb->prev->next = nb;
        nb->next = rest;
        rest->prev = nb;
        rest->addr += size;
        rest->size -= size;
        if (!cu_pool_insert(p, rest)) return NULL;
        inactive_add(d, nb, already_split ? -(int64_t)size : (int64_t)rest->size);
        return nb;
    }
    if (already_split) inactive_add(d, b, -(int64_t)b->size);
    return b;
}

static void note_oom(mp_cuda *d, uint64_t bytes, uint64_t seg_bytes, mp_category cat, uint32_t site) {
    d->oom = (mp_cuda_oom){true, bytes, seg_bytes, (uint8_t)cat, site, d->cursor, d->st.allocated, d->st.reserved};
    d->st.ooms++;
    d->failed = true;
    cu_record(d, CU_OOM, 0, bytes, site, (uint8_t)cat);
}

mp_status mp_cuda_malloc(mp_cuda *d, uint32_t serial, uint64_t bytes, mp_category cat, uint32_t site, double seconds) {
    if (!d || !serial || active_find(d, serial) != SIZE_MAX) return MP_ERR_INVALID;
    if (d->failed) return MP_ERR_BUDGET;
    if (!bytes) return MP_OK;
    d->now = seconds;
    uint64_t size = mp_cuda_round_size(&d->conf, bytes), alloc_size = mp_cuda_segment_size(size);
    cu_pool *p = size <= CU_SMALL_SIZE ? &d->small : &d->large;
    uint64_t peak_before = d->st.reserved_peak;
    cu_block *b = get_free_block(d, p, size);
    if (!b) {
        if (gc_on(&d->conf)) garbage_collect(d);
        b = alloc_block(d, p, size, alloc_size, false, site, (uint8_t)cat);
        if (!b && release_available(d, p, size)) b = alloc_block(d, p, size, alloc_size, false, site, (uint8_t)cat);
        if (!b) {
            release_cached(d);
            b = alloc_block(d, p, size, alloc_size, true, site, (uint8_t)cat);
        }
    }
    if (!b) {
        note_oom(d, bytes, alloc_size, cat, site);
        return MP_ERR_BUDGET;
    }
    cu_block *got = take_block(d, p, b, size);
    if (!got || !active_put(d, serial, got)) return MP_ERR_NOMEM;
    got->allocated = true;
    got->requested = bytes;
    got->serial = serial;
    got->site = site;
    got->category = (uint8_t)cat;
    cu_record(d, CU_ALLOC, got->addr, bytes, site, (uint8_t)cat);
    d->st.allocated += got->size;
    d->st.requested += bytes;
    d->st.active_blocks++;
    raise_peaks(d);
    // the moment reserved reached its peak is this allocation's, once it is placed
    if (d->st.reserved_peak > peak_before) d->st.inactive_split_at_reserved_peak = d->st.inactive_split;
    return MP_OK;
}

// free_block: the block cached again, merged with its free neighbours.
static void free_block(mp_cuda *d, cu_block *b) {
    cu_pool *p = b->seg->small ? &d->small : &d->large;
    cu_record(d, CU_FREE_COMPLETED, b->addr, b->requested, b->site, b->category);
    int64_t net = 0;
    cu_block *neighbours[2] = {b->prev, b->next};
    for (int k = 0; k < 2; k++) net -= (int64_t)cu_merge(d, b, neighbours[k], p);
    if (cu_is_split(b)) net += (int64_t)b->size;
    inactive_add(d, b, net);
    cu_pool_insert(p, b);
    raise_peaks(d);
}

void mp_cuda_release(mp_cuda *d, uint32_t serial, double seconds) {
    size_t j = d ? active_find(d, serial) : SIZE_MAX;
    if (j == SIZE_MAX) return;
    cu_block *b = d->vals[j];
    active_remove(d, j);
    d->now = seconds;
    b->allocated = false;
    d->st.allocated -= b->size;
    d->st.requested -= b->requested;
    d->st.active_blocks--;
    cu_record(d, CU_FREE_REQUESTED, b->addr, b->requested, b->site, b->category);
    free_block(d, b);
}

// ---- life cycle and figures ----

mp_status mp_cuda_new(mp_cuda **out, const mp_cuda_conf *conf) {
    *out = NULL;
    mp_cuda *d = mp_raw_malloc(sizeof *d);
    if (!d) return MP_ERR_NOMEM;
    memset(d, 0, sizeof *d);
    if (conf)
        d->conf = *conf;
    else
        mp_cuda_conf_default(&d->conf);
    d->small.small = true;
    d->small.unmapped.by_address = d->large.unmapped.by_address = true;
    d->next_addr = CU_FIRST_ADDRESS;
    *out = d;
    return MP_OK;
}

// Every block of a segment from its head: the blocks are freed, then the segment.
static void seg_free_all(cu_seg *s) {
    cu_block *b = s->any;
    while (b && b->prev) b = b->prev;
    while (b) {
        cu_block *n = b->next;
        mp_raw_free(b);
        b = n;
    }
    mp_raw_free(s);
}

void mp_cuda_delete(mp_cuda *d) {
    if (!d) return;
    for (size_t i = 0; i < d->nsegs; i++) seg_free_all(d->segs[i]);
    mp_raw_free(d->segs);
    cu_set_free(&d->small.blocks);
    cu_set_free(&d->small.unmapped);
    cu_set_free(&d->large.blocks);
    cu_set_free(&d->large.unmapped);
    mp_raw_free(d->keys);
    mp_raw_free(d->vals);
    mp_raw_free(d->trace);
    mp_raw_free(d);
}

mp_cuda_stats mp_cuda_get_stats(const mp_cuda *d) {
    mp_cuda_stats s;
    memset(&s, 0, sizeof s);
    return d ? d->st : s;
}

const mp_cuda_oom *mp_cuda_get_oom(const mp_cuda *d) { return &d->oom; }

void mp_cuda_window(mp_cuda *d) {
    d->st.window_allocated_peak = d->st.allocated;
    d->st.window_reserved_peak = d->st.reserved;
    d->st.window_requested_peak = d->st.requested;
}

// The free blocks of split segments, with the tensors on either side.
size_t mp_cuda_gaps(const mp_cuda *d, mp_cuda_gap *out, size_t cap) {
    size_t n = 0;
    const cu_pool *pools[2] = {&d->large, &d->small};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < pools[k]->blocks.n; i++) {
            const cu_block *b = pools[k]->blocks.v[i];
            if (!cu_is_split(b) || b->seg->expandable) continue;
            mp_cuda_gap g;
            memset(&g, 0, sizeof g);
            g.bytes = b->size;
            if (b->prev && b->prev->allocated) {
                g.before = true;
                g.before_site = b->prev->site;
                g.before_category = b->prev->category;
            }
            if (b->next && b->next->allocated) {
                g.after = true;
                g.after_site = b->next->site;
                g.after_category = b->next->category;
            }
            // insertion into the largest `cap`, largest first
            size_t at = n < cap ? n : cap;
            while (at > 0 && out[at - 1].bytes < g.bytes) {
                if (at < cap) out[at] = out[at - 1];
                at--;
            }
            if (at < cap) out[at] = g;
            n++;
        }
    return n;
}
