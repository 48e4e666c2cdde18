// The CUDA caching allocator replay against PyTorch's rules (c10/cuda/CUDACachingAllocator.cpp),
// one rule a test, each figure worked out by hand from the source in the comment above it.
#include "profiler.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#define KiB 1024ULL
#define MiB (1024ULL * 1024ULL)

static mp_cuda *make(const mp_cuda_conf *c) {
    mp_cuda *d = NULL;
    assert_int_equal(mp_cuda_new(&d, c), MP_OK);
    return d;
}

static mp_cuda *make_conf(const char *text) {
    mp_cuda_conf c;
    mp_cuda_conf_default(&c);
    char err[256];
    assert_true(mp_cuda_parse_conf(text, &c, err, sizeof err));
    return make(&c);
}

static uint32_t next_serial = 1;

static uint32_t alloc(mp_cuda *d, uint64_t bytes) {
    uint32_t s = next_serial++;
    assert_int_equal(mp_cuda_malloc(d, s, bytes, MP_ACTIVATION, 0, 0), MP_OK);
    return s;
}

// round_size: at least 512, else a multiple of 512.
static void test_rounding(void **state) {
    (void)state;
    mp_cuda_conf c;
    mp_cuda_conf_default(&c);
    assert_int_equal(mp_cuda_round_size(&c, 1), 512);
    assert_int_equal(mp_cuda_round_size(&c, 512), 512);
    assert_int_equal(mp_cuda_round_size(&c, 513), 1024);
    assert_int_equal(mp_cuda_round_size(&c, MiB + 1), MiB + 512);
    mp_cuda *d = make(NULL);
    alloc(d, 1);
    assert_int_equal(mp_cuda_get_stats(d).allocated, 512);
    assert_int_equal(mp_cuda_get_stats(d).requested, 1);
    mp_cuda_delete(d);
}

// get_allocation_size: up to 1 MiB a 2 MiB segment, below 10 MiB a 20 MiB one, else the rounded
// size up to a multiple of 2 MiB.
static void test_segment_sizes(void **state) {
    (void)state;
    assert_int_equal(mp_cuda_segment_size(512), 2 * MiB);
    assert_int_equal(mp_cuda_segment_size(MiB), 2 * MiB);
    assert_int_equal(mp_cuda_segment_size(MiB + 512), 20 * MiB);
    assert_int_equal(mp_cuda_segment_size(10 * MiB - 512), 20 * MiB);
    assert_int_equal(mp_cuda_segment_size(10 * MiB), 10 * MiB);
    assert_int_equal(mp_cuda_segment_size(12000256), 12 * MiB);
}

// The small pool: two 1000-byte tensors share one 2 MiB segment; 1024 + 1024 allocated; the rest
// of the segment is an inactive split block (2 MiB - 2048).
static void test_small_pool(void **state) {
    (void)state;
    mp_cuda *d = make(NULL);
    alloc(d, 1000);
    mp_cuda_stats s = mp_cuda_get_stats(d);
    assert_int_equal(s.allocated, 1024);
    assert_int_equal(s.reserved, 2 * MiB);
    assert_int_equal(s.inactive_split, 2 * MiB - 1024);
    alloc(d, 1000);
    s = mp_cuda_get_stats(d);
    assert_int_equal(s.allocated, 2048);
    assert_int_equal(s.reserved, 2 * MiB);
    assert_int_equal(s.segments, 1);
    assert_int_equal(s.inactive_split, 2 * MiB - 2048);
    mp_cuda_delete(d);
}

// The large pool: 12,000,000 bytes (12,000,256 rounded) take a 12 MiB segment of their own, not
// split (582,656 left <= 1 MiB), so the whole block counts as allocated, as max_memory_allocated
// says; 1.5 MiB then takes a 20 MiB segment, split (18.5 MiB left > 1 MiB).
static void test_large_pool(void **state) {
    (void)state;
    mp_cuda *d = make(NULL);
    alloc(d, 12000000);
    mp_cuda_stats s = mp_cuda_get_stats(d);
    assert_int_equal(s.allocated, 12 * MiB);
    assert_int_equal(s.reserved, 12 * MiB);
    assert_int_equal(s.inactive_split, 0);
    alloc(d, 3 * MiB / 2);
    s = mp_cuda_get_stats(d);
    assert_int_equal(s.allocated, 3 * MiB / 2 + 12 * MiB);
    assert_int_equal(s.requested, 3 * MiB / 2 + 12000000);
    assert_int_equal(s.reserved, 32 * MiB);
    assert_int_equal(s.inactive_split, 20 * MiB - 3 * MiB / 2);
    mp_cuda_delete(d);
}

// A freed block is cached, merged with its free neighbours, and reused: 4 MiB freed leaves one
// whole 20 MiB block (nothing inactive), which an 8 MiB request takes without a new segment.
static void test_reuse_of_cached_block(void **state) {
    (void)state;
    mp_cuda *d = make(NULL);
    uint32_t a = alloc(d, 4 * MiB);
    mp_cuda_release(d, a, 0);
    mp_cuda_stats s = mp_cuda_get_stats(d);
    assert_int_equal(s.allocated, 0);
    assert_int_equal(s.reserved, 20 * MiB);
    assert_int_equal(s.inactive_split, 0);
    alloc(d, 8 * MiB);
    s = mp_cuda_get_stats(d);
    assert_int_equal(s.reserved, 20 * MiB);
    assert_int_equal(s.segment_allocs, 1);
    assert_int_equal(s.allocated, 8 * MiB);
    mp_cuda_delete(d);
}

// Best fit: cached 12 MiB and 16 MiB segments; 11 MiB takes the 12 MiB one, whole (1 MiB left is
// not more than 1 MiB), 10 MiB then the 16 MiB one, split (6 MiB left).
static void test_best_fit_and_split_threshold(void **state) {
    (void)state;
    mp_cuda *d = make(NULL);
    uint32_t a = alloc(d, 12 * MiB), b = alloc(d, 16 * MiB);
    mp_cuda_release(d, a, 0);
    mp_cuda_release(d, b, 0);
    alloc(d, 11 * MiB);
    mp_cuda_stats s = mp_cuda_get_stats(d);
    assert_int_equal(s.allocated, 12 * MiB);
    assert_int_equal(s.inactive_split, 0);
    alloc(d, 10 * MiB);
    s = mp_cuda_get_stats(d);
    assert_int_equal(s.allocated, 22 * MiB);
    assert_int_equal(s.inactive_split, 6 * MiB);
    assert_int_equal(s.reserved, 28 * MiB);
    assert_int_equal(s.segment_allocs, 2);
    mp_cuda_delete(d);
}

// max_split_size_mb:20: a cached 30 MiB block is too big to split for a 4 MiB request (a new 20 MiB
// segment instead), serves a 24 MiB one whole (within 20 MiB of it), and a 40 MiB block does not
// serve 20 MiB (40 >= 20 + 20).
static void test_max_split_size(void **state) {
    (void)state;
    mp_cuda *d = make(NULL);
    mp_cuda_release(d, alloc(d, 30 * MiB), 0);
    alloc(d, 4 * MiB);
    assert_int_equal(mp_cuda_get_stats(d).reserved, 30 * MiB); // default: split
    mp_cuda_delete(d);

    d = make_conf("max_split_size_mb:20");
    mp_cuda_release(d, alloc(d, 30 * MiB), 0);
    uint32_t small = alloc(d, 4 * MiB);
    assert_int_equal(mp_cuda_get_stats(d).reserved, 50 * MiB);
    mp_cuda_release(d, small, 0);
    alloc(d, 24 * MiB);
    mp_cuda_stats s = mp_cuda_get_stats(d);
    assert_int_equal(s.reserved, 50 * MiB);
    assert_int_equal(s.allocated, 30 * MiB); // the whole oversize block
    mp_cuda_delete(d);

    d = make_conf("max_split_size_mb:20");
    mp_cuda_release(d, alloc(d, 40 * MiB), 0);
    alloc(d, 20 * MiB);
    assert_int_equal(mp_cuda_get_stats(d).reserved, 60 * MiB);
    mp_cuda_delete(d);
}

// roundup_power2_divisions:4: 5,000,000 bytes lie between 4 and 8 MiB, in steps of 1 MiB: 5 MiB.
static void test_roundup_power2_divisions(void **state) {
    (void)state;
    mp_cuda_conf c;
    mp_cuda_conf_default(&c);
    assert_true(mp_cuda_parse_conf("roundup_power2_divisions:4", &c, NULL, 0));
    assert_int_equal(mp_cuda_round_size(&c, 5000000), 5 * MiB);
    assert_int_equal(mp_cuda_round_size(&c, 4 * MiB), 4 * MiB); // a power of two stays
    assert_int_equal(mp_cuda_round_size(&c, 1200), 1536);       // not above 512 x 4: 512 steps
    // the list form: 1 MiB-2 MiB in 2 steps (1, 1.5 MiB), 64 MiB on in 8; '>' also takes the entry before it
    mp_cuda_conf_default(&c);
    assert_true(mp_cuda_parse_conf("roundup_power2_divisions:[1:2,64:8]", &c, NULL, 0));
    assert_int_equal(c.roundup_power2_divisions[0], 2);
    assert_int_equal(c.roundup_power2_divisions[5], 0);
    assert_int_equal(c.roundup_power2_divisions[6], 8);
    assert_int_equal(mp_cuda_round_size(&c, 1500000), 3 * MiB / 2);
    mp_cuda_conf_default(&c);
    assert_true(mp_cuda_parse_conf("roundup_power2_divisions:[256:1,512:2,>:4]", &c, NULL, 0));
    assert_int_equal(c.roundup_power2_divisions[7], 1);
    assert_int_equal(c.roundup_power2_divisions[8], 1);
    assert_int_equal(c.roundup_power2_divisions[9], 4);
    assert_int_equal(c.roundup_power2_divisions[15], 4);
    mp_cuda *d = make_conf("roundup_power2_divisions:4");
    alloc(d, 5000000);
    assert_int_equal(mp_cuda_get_stats(d).allocated, 5 * MiB);
    mp_cuda_delete(d);
}

// expandable_segments:True: 12, 14 and 16 MiB, each freed before the next, tile one mapped 20 MiB
// page of the large pool's segment (reserved 20 MiB); without it each takes a segment of its own
// size, as none fits the cached ones (12 + 14 + 16 = 42 MiB reserved).
static void test_expandable_segments(void **state) {
    (void)state;
    const char *confs[2] = {"", "expandable_segments:True"};
    const uint64_t want[2] = {42 * MiB, 20 * MiB};
    for (int k = 0; k < 2; k++) {
        mp_cuda *d = make_conf(confs[k]);
        for (uint64_t mb = 12; mb <= 16; mb += 2) mp_cuda_release(d, alloc(d, mb * MiB), 0);
        assert_int_equal(mp_cuda_get_stats(d).reserved, want[k]);
        mp_cuda_delete(d);
    }
    // growing past a page maps the next one onto the same free block: 1.5 MiB then 19 MiB live
    mp_cuda *d = make_conf("expandable_segments:True");
    alloc(d, 3 * MiB / 2);
    uint32_t big = alloc(d, 19 * MiB);
    mp_cuda_stats s = mp_cuda_get_stats(d);
    assert_int_equal(s.reserved, 40 * MiB);
    assert_int_equal(s.allocated, 3 * MiB / 2 + 19 * MiB);
    assert_int_equal(s.inactive_split, 0); // free pages of expandable segments are not counted
    mp_cuda_empty_cache(d, 0);             // the free tail holds no whole page: nothing goes back
    assert_int_equal(mp_cuda_get_stats(d).reserved, 40 * MiB);
    mp_cuda_release(d, big, 0);               // the 19 MiB block: [1.5 MiB, 40 MiB) free
    mp_cuda_empty_cache(d, 0);                  // its whole page [20, 40 MiB) goes back
    assert_int_equal(mp_cuda_get_stats(d).reserved, 20 * MiB);
    mp_cuda_delete(d);
}

// A device that is full: cached segments go back before the allocation fails (one retry), and a
// request nothing can make room for is out of memory, nothing taken.
static void test_out_of_memory(void **state) {
    (void)state;
    mp_cuda_conf c;
    mp_cuda_conf_default(&c);
    c.capacity = 40 * MiB;
    mp_cuda *d = make(&c);
    mp_cuda_release(d, alloc(d, 30 * MiB), 0);
    alloc(d, 32 * MiB); // 30 + 32 > 40: the cached 30 MiB segment is released, then it fits
    mp_cuda_stats s = mp_cuda_get_stats(d);
    assert_int_equal(s.reserved, 32 * MiB);
    assert_int_equal(s.reserved_peak, 32 * MiB);
    assert_int_equal(s.alloc_retries, 1);
    assert_int_equal(s.segment_frees, 1);
    assert_int_equal(mp_cuda_malloc(d, next_serial++, 20 * MiB, MP_GRADIENT, 7, 0), MP_ERR_BUDGET);
    const mp_cuda_oom *o = mp_cuda_get_oom(d);
    assert_true(o->happened);
    assert_int_equal(o->requested, 20 * MiB);
    assert_int_equal(o->segment_bytes, 20 * MiB);
    assert_int_equal(o->category, MP_GRADIENT);
    assert_int_equal(o->site, 7);
    assert_int_equal(mp_cuda_get_stats(d).allocated, 32 * MiB);
    mp_cuda_delete(d);
}

// garbage_collection_threshold:0.5 under a memory fraction of 0.5 of 100 MiB (50 MiB allowed, the
// threshold 25 MiB): a 40 MiB request past 30 MiB cached frees the cached segment first, with no
// retry; without the threshold it takes the retry.
static void test_garbage_collection(void **state) {
    (void)state;
    const char *confs[2] = {"", "garbage_collection_threshold:0.5"};
    for (int k = 0; k < 2; k++) {
        mp_cuda_conf c;
        mp_cuda_conf_default(&c);
        assert_true(mp_cuda_parse_conf(confs[k], &c, NULL, 0));
        c.total_bytes = 100 * MiB;
        c.memory_fraction = 0.5;
        mp_cuda *d = make(&c);
        mp_cuda_release(d, alloc(d, 30 * MiB), 0);
        alloc(d, 40 * MiB);
        mp_cuda_stats s = mp_cuda_get_stats(d);
        assert_int_equal(s.reserved, 40 * MiB);
        assert_int_equal(s.alloc_retries, k ? 0 : 1);
        mp_cuda_delete(d);
    }
}

// Inactive split blocks and the tensors around them: three 1000-byte tensors in one small
// segment, the middle one freed: a 1024-byte gap between the first and the third, and the
// segment's tail (2 MiB - 3072) after the third.
static void test_gaps(void **state) {
    (void)state;
    mp_cuda *d = make(NULL);
    uint32_t s[3];
    for (int i = 0; i < 3; i++) {
        s[i] = next_serial++;
        assert_int_equal(mp_cuda_malloc(d, s[i], 1000, MP_ACTIVATION, 10 + (uint32_t)i, 0), MP_OK);
    }
    mp_cuda_release(d, s[1], 0);
    mp_cuda_gap g[4];
    assert_int_equal(mp_cuda_gaps(d, g, 4), 2);
    assert_int_equal(g[0].bytes, 2 * MiB - 3072);
    assert_true(g[0].before && !g[0].after);
    assert_int_equal(g[0].before_site, 12);
    assert_int_equal(g[1].bytes, 1024);
    assert_int_equal(g[1].before_site, 10);
    assert_int_equal(g[1].after_site, 12);
    assert_int_equal(mp_cuda_get_stats(d).inactive_split, 2 * MiB - 2048);
    // the first freed too: it merges with the gap after it (2048 inactive there)
    mp_cuda_release(d, s[0], 0);
    assert_int_equal(mp_cuda_get_stats(d).inactive_split, 2 * MiB - 1024);
    mp_cuda_release(d, s[2], 0); // all three merged: one whole segment, nothing inactive
    assert_int_equal(mp_cuda_get_stats(d).inactive_split, 0);
    assert_int_equal(mp_cuda_gaps(d, g, 4), 0);
    mp_cuda_delete(d);
}

// A trace worked out by hand (no configuration):
//   a = 600 kB (614,400: small pool) -> segment 2 MiB;            allocated 614,400,  reserved 2 MiB
//   b = 3 MB (3,000,000 -> 3,000,320) -> segment 20 MiB, split;   allocated 3,614,720, reserved 22 MiB
//   c = 15 MiB -> from b's segment (17,971,200 free >= 15 MiB), split (2,242,560 left > 1 MiB);
//                                                                 allocated 19,343,360 (peak)
//   free b -> 3,000,320 free before c (inactive 3,000,320 + 2,242,560)
//   d = 2 MB (2,000,000 -> 2,000,384) -> best fit: the 2,242,560 tail, not split (242,176 left);
//                                         allocated 614,400 + 15 MiB + 2,242,560 = 18,585,600
//   e = 25 MiB -> a segment of its own, rounded up to 26 MiB, not split (1 MiB left): reserved
//                22 + 26 = 48 MiB (peak), allocated 18,585,600 + 27,262,976 = 45,848,576 (peak)
static void test_hand_trace(void **state) {
    (void)state;
    mp_cuda *d = make(NULL);
    alloc(d, 614400);
    uint32_t b = alloc(d, 3000000);
    alloc(d, 15 * MiB);
    assert_int_equal(mp_cuda_get_stats(d).allocated, 19343360);
    mp_cuda_release(d, b, 0);
    assert_int_equal(mp_cuda_get_stats(d).inactive_split, 2 * MiB - 614400 + 3000320 + 2242560);
    alloc(d, 2000000);
    assert_int_equal(mp_cuda_get_stats(d).allocated, 18585600);
    alloc(d, 25 * MiB);
    mp_cuda_stats s = mp_cuda_get_stats(d);
    assert_int_equal(s.allocated, 45848576);
    assert_int_equal(s.allocated_peak, 45848576);
    assert_int_equal(s.reserved, 48 * MiB);
    assert_int_equal(s.reserved_peak, 48 * MiB);
    assert_int_equal(s.requested_peak, 614400 + 15 * MiB + 2000000 + 25 * MiB);
    assert_int_equal(s.inactive_split, 2 * MiB - 614400 + 3000320);
    mp_cuda_delete(d);
}

// PYTORCH_CUDA_ALLOC_CONF as PyTorch checks it: one line naming what is wrong.
static void test_conf_errors(void **state) {
    (void)state;
    const char *bad[] = {"max_split_size_mb:10",
                         "max_split_size_mb:abc",
                         "expandable_segments:yes",
                         "garbage_collection_threshold:1.5",
                         "roundup_power2_divisions:3",
                         "roundup_power2_divisions:[3:4]",
                         "roundup_power2_divisions:[1:4",
                         "backend:cudaMallocAsync",
                         "bogus:1",
                         "expandable_segments:True;max_split_size_mb:128",
                         "expandable_segments",
                         ",",
                         NULL};
    for (int i = 0; bad[i]; i++) {
        mp_cuda_conf c;
        mp_cuda_conf_default(&c);
        mp_cuda_conf before = c;
        char err[256] = "";
        assert_false(mp_cuda_parse_conf(bad[i], &c, err, sizeof err));
        assert_true(err[0] != 0 && !strchr(err, '\n'));
        assert_memory_equal(&c, &before, sizeof c); // nothing changed
    }
    mp_cuda_conf c;
    mp_cuda_conf_default(&c);
    assert_true(mp_cuda_parse_conf(" expandable_segments : True , max_split_size_mb:128,", &c, NULL, 0));
    assert_true(c.expandable_segments);
    assert_int_equal(c.max_split_size, 128 * MiB);
    assert_true(mp_cuda_parse_conf("backend:native,release_lock_on_cudamalloc:True", &c, NULL, 0));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rounding),
        cmocka_unit_test(test_segment_sizes),
        cmocka_unit_test(test_small_pool),
        cmocka_unit_test(test_large_pool),
        cmocka_unit_test(test_reuse_of_cached_block),
        cmocka_unit_test(test_best_fit_and_split_threshold),
        cmocka_unit_test(test_max_split_size),
        cmocka_unit_test(test_roundup_power2_divisions),
        cmocka_unit_test(test_expandable_segments),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_garbage_collection),
        cmocka_unit_test(test_gaps),
        cmocka_unit_test(test_hand_trace),
        cmocka_unit_test(test_conf_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
