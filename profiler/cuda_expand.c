// expandable_segments:True (Note [Expandable Segments] in CUDACachingAllocator.cpp): one segment
// per pool whose address range covers the card (1 1/8 of its memory), backed by physical pages
// only where blocks need them (2 MiB pages in the small pool, 20 MiB in the large), so that
// blocks of slightly different sizes tile one range instead of leaving slivers in many
// segments. Reserved bytes are the mapped pages.
#include "cuda_internal.h"

#define NO_TOTAL (1ULL << 40) // the address range when the card's memory is not known

static uint64_t page_of(bool small) { return small ? CU_SMALL_BUFFER : CU_LARGE_BUFFER; }

// Whether the free and unmapped blocks from b on hold `size` bytes together.
static bool has_room(const cu_block *b, uint64_t size) {
    uint64_t bytes = 0;
    for (; b && bytes < size && !b->allocated; b = b->next) bytes += b->size;
    return bytes >= size;
}

// find_expandable_block: the lowest address where `size` fits in free and unmapped space, or a
// new segment's whole unmapped range.
static cu_block *find_room(mp_cuda *d, cu_pool *p, uint64_t size, uint32_t site, uint8_t category) {
    for (size_t i = 0; i < p->unmapped.n; i++) {
        cu_block *c = p->unmapped.v[i];
        if (c->prev && !c->prev->allocated) c = c->prev;
        if (has_room(c, size)) return c;
    }
    uint64_t page = page_of(p->small), total = d->conf.total_bytes ? d->conf.total_bytes : NO_TOTAL;
    uint64_t range = (total + total / 8 + page - 1) / page * page;
    cu_seg *s = cu_seg_new(d, range, p->small, true, site, category);
    if (!s) return NULL;
    s->page = page;
    cu_block *b = cu_block_new(s, s->addr, range, false);
    if (!b || !cu_set_insert(&p->unmapped, b)) {
        mp_raw_free(b);
        cu_seg_delete(d, s);
        return NULL;
    }
    return b;
}

// map_block: the pages under [b, b + size) backed; b becomes a free mapped block (merged with its
// free neighbours), the rest of its range stays unmapped. False when the device has no room.
static bool map_block(mp_cuda *d, cu_pool *p, cu_block *b, uint64_t size) {
    cu_seg *s = b->seg;
    uint64_t first = (b->addr - s->addr) / s->page, end = (b->addr + size - s->addr + s->page - 1) / s->page;
    uint64_t mapped = (end - first) * s->page;
    if (!cu_device_has(d, mapped)) return false;
    cu_set_erase(&p->unmapped, b);
    b->mapped = true;
    if (mapped < b->size) {
        cu_block *rest = cu_block_new(s, b->addr + mapped, b->size - mapped, false);
        if (!rest) return false;
        rest->prev = b;
        rest->next = b->next;
        if (b->next) b->next->prev = rest;
        b->next = rest;
        b->size = mapped;
        cu_set_insert(&p->unmapped, rest);
    }
    cu_record(d, CU_SEGMENT_MAP, b->addr, mapped, s->site, s->category);
    cu_merge(d, b, b->prev, p);
    cu_merge(d, b, b->next, p);
    cu_pool_insert(p, b);
    cu_reserved_add(d, (int64_t)mapped);
    d->st.segment_allocs++;
    return true;
}

// try_allocate_expandable_block
cu_block *cu_expandable_alloc(mp_cuda *d, cu_pool *p, uint64_t size, uint32_t site, uint8_t category) {
    cu_block *c = find_room(d, p, size, site, category);
    if (!c) return NULL;
    if (!c->mapped && !map_block(d, p, c, c->size < size ? c->size : size)) return NULL;
    while (c->size < size) { // a free block, then unmapped space: map what is missing
        uint64_t missing = size - c->size;
        cu_block *next = c->next;
        if (!map_block(d, p, next, missing < next->size ? missing : next->size)) return NULL;
        c = next; // it took c in
    }
    cu_set_erase(&p->blocks, c);
    return c;
}

// unmap_block and release_expandable_segment: the whole pages of a free block handed back (the
// partial pages at its ends stay mapped as free blocks), and the segment once none is mapped.
void cu_unmap_free(mp_cuda *d, cu_pool *p, cu_block *b) {
    cu_seg *s = b->seg;
    uint64_t first = (b->addr - s->addr + s->page - 1) / s->page, end = (b->addr + b->size - s->addr) / s->page;
    if (first >= end) return;
    uint64_t at = s->addr + first * s->page, bytes = (end - first) * s->page;
    cu_set_erase(&p->blocks, b);
    uint64_t before = at - b->addr, after = b->size - before - bytes;
    if (before) {
        cu_block *f = cu_block_new(s, b->addr, before, true);
        if (!f) return;
        f->prev = b->prev;
        if (b->prev) b->prev->next = f;
        f->next = b;
        b->prev = f;
        cu_pool_insert(p, f);
    }
    if (after) {
        cu_block *f = cu_block_new(s, at + bytes, after, true);
        if (!f) return;
        f->prev = b;
        f->next = b->next;
        if (b->next) b->next->prev = f;
        b->next = f;
        cu_pool_insert(p, f);
    }
    b->addr = at;
    b->size = bytes;
    b->mapped = false;
    cu_merge(d, b, b->prev, p);
    cu_merge(d, b, b->next, p);
    cu_set_insert(&p->unmapped, b);
    cu_reserved_add(d, -(int64_t)bytes);
    d->st.segment_frees++;
    cu_record(d, CU_SEGMENT_UNMAP, at, bytes, s->site, s->category);
    if (b->prev || b->next) return;
    cu_set_erase(&p->unmapped, b);
    cu_seg_delete(d, s);
    mp_raw_free(b);
}
