// Private to the CUDA caching allocator replay (cuda_alloc.c, cuda_expand.c, cuda_replay.c,
// cuda_snapshot.c): blocks, segments, pools and the trace, as c10/cuda/CUDACachingAllocator.cpp
// keeps them.
#pragma once

#include "mp_internal.h"

#define CU_MIN_BLOCK 512ULL             // every block is a multiple of this
#define CU_SMALL_SIZE (1ULL << 20)      // the largest request of the small pool
#define CU_SMALL_BUFFER (2ULL << 20)    // the small pool's segments
#define CU_LARGE_BUFFER (20ULL << 20)   // the segments of 1 to 10 MiB requests
#define CU_MIN_LARGE_ALLOC (10ULL << 20) // from here a request gets a segment of its own size
#define CU_ROUND_LARGE (2ULL << 20)     // ... rounded up to this

typedef struct cu_seg cu_seg;
typedef struct cu_block cu_block;

struct cu_block {
    uint64_t addr, size, requested;
    cu_block *prev, *next; // neighbours within the segment
    cu_seg *seg;
    uint32_t serial, site; // the tensor it holds (while allocated)
    uint8_t category;
    bool allocated, mapped; // mapped: false for an expandable segment's unbacked address space
    int64_t gc_base;        // the pool's free-block searches when it was cached (garbage collection's age)
};

// A cudaMalloc'd segment, or an expandable segment's whole address range.
struct cu_seg {
    uint64_t addr, size;
    uint64_t page; // expandable: the granule it is mapped in (2 MiB small, 20 MiB large)
    bool small, expandable;
    uint32_t site; // the allocation that made it
    uint8_t category;
    cu_block *any; // one of its blocks: the head is found by walking prev
};

// Blocks kept ordered: free blocks by (size, address) for best fit, unmapped ranges by address.
typedef struct {
    cu_block **v;
    size_t n, cap;
    bool by_address;
} cu_set;

typedef struct {
    bool small;
    cu_set blocks;     // cached free blocks (mapped)
    cu_set unmapped;   // expandable segments' unbacked ranges
    int64_t searches;  // get_free_blocks_call_count: counted while garbage collection is on
} cu_pool;

enum { CU_ALLOC, CU_FREE_REQUESTED, CU_FREE_COMPLETED, CU_SEGMENT_ALLOC, CU_SEGMENT_FREE, CU_SEGMENT_MAP,
       CU_SEGMENT_UNMAP, CU_OOM, CU_NACTIONS };

typedef struct {
    uint64_t addr, size;
    double seconds;
    uint32_t site;
    uint8_t action, category;
} cu_trace;

struct mp_cuda {
    mp_cuda_conf conf;
    cu_pool small, large;
    cu_seg **segs; // live segments
    size_t nsegs, cap_segs;
    // allocated blocks by serial: open addressing, linear probing, key 0 empty
    uint32_t *keys;
    cu_block **vals;
    size_t nactive, cap_active;
    mp_cuda_stats st;
    mp_cuda_oom oom;
    uint64_t next_addr; // where the next segment's addresses start
    cu_trace *trace;
    size_t ntrace, cap_trace;
    bool trace_failed; // the trace could not grow: a snapshot would be incomplete
    double now;        // the time of the call in progress, for the trace
    size_t cursor;     // timeline replays: the next event
    bool failed;       // an allocation did not fit: the run is over
};

bool cu_set_insert(cu_set *s, cu_block *b);
void cu_set_erase(cu_set *s, const cu_block *b);
// The first block not ordered before (size, addr); s->n when none.
size_t cu_set_lower_bound(const cu_set *s, uint64_t size, uint64_t addr);
void cu_set_free(cu_set *s);

void cu_record(mp_cuda *d, int action, uint64_t addr, uint64_t size, uint32_t site, uint8_t category);
bool cu_pool_insert(cu_pool *p, cu_block *b); // into the free blocks, its garbage-collection age starting now
size_t cu_merge(mp_cuda *d, cu_block *dst, cu_block *src, cu_pool *p);
bool cu_is_split(const cu_block *b);
// A block of seg at [addr, addr + size), mapped or not (expandable segments' unbacked range).
cu_block *cu_block_new(cu_seg *seg, uint64_t addr, uint64_t size, bool mapped);
cu_seg *cu_seg_new(mp_cuda *d, uint64_t size, bool small, bool expandable, uint32_t site, uint8_t category);
void cu_seg_delete(mp_cuda *d, cu_seg *s);
void cu_reserved_add(mp_cuda *d, int64_t bytes);
// Whether `bytes` more can be reserved on the device.
bool cu_device_has(const mp_cuda *d, uint64_t bytes);

// Expandable segments (cuda_expand.c): a free block of at least `size` mapped in the pool's
// segment (its blocks merged), or NULL when the device has no room; and the unmapping of a free
// block's whole pages, the segment dropped once nothing of it is mapped.
cu_block *cu_expandable_alloc(mp_cuda *d, cu_pool *p, uint64_t size, uint32_t site, uint8_t category);
void cu_unmap_free(mp_cuda *d, cu_pool *p, cu_block *b);
