// The profiler's counters, peaks, cross-check, meta mode, budget and reports.
#include "profiler.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#ifndef MEMBILL_SYSTEM_ALLOC
#include <jemalloc/jemalloc.h>
#else
#include <malloc.h>
#endif

static int setup(void **state) {
    (void)state;
    mp_options o = {.keep_timeline = true, .track_other = true};
    return mp_init(&o) == MP_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    mp_shutdown();
    return 0;
}

static void test_counters_and_peak_composition(void **state) {
    (void)state;
    mp_block a, b, c;
    assert_int_equal(mp_alloc(&a, 1000, MP_WEIGHT, "w"), MP_OK);
    mp_set_phase(MP_PHASE_FORWARD);
    assert_int_equal(mp_alloc(&b, 5000, MP_ACTIVATION, "act.b"), MP_OK);
    mp_set_phase(MP_PHASE_BACKWARD);
    mp_free(&b);
    assert_null(b.data);
    assert_int_equal(mp_alloc(&c, 3000, MP_ACTIVATION, "act.c"), MP_OK);

    mp_counter w = mp_get_counter(MP_WEIGHT), act = mp_get_counter(MP_ACTIVATION);
    assert_int_equal(w.live, 1000);
    assert_int_equal(w.peak, 1000);
    assert_int_equal(act.live, 3000);
    assert_int_equal(act.peak, 5000);
    assert_int_equal(act.allocations, 2);
    assert_int_equal(act.frees, 1);

    mp_moment pk = mp_peak();
    assert_int_equal(pk.bytes[MP_WEIGHT], 1000);
    assert_int_equal(pk.bytes[MP_ACTIVATION], 5000);
    assert_int_equal(pk.phase, MP_PHASE_FORWARD);
    assert_string_equal(mp_site_name(pk.site), "act.b");
    assert_int_equal(pk.total, 6000 + pk.bytes[MP_OTHER]);

    mp_phase_stats fw = mp_get_phase_stats(MP_PHASE_FORWARD);
    mp_phase_stats bw = mp_get_phase_stats(MP_PHASE_BACKWARD);
    assert_int_equal(fw.at_peak.bytes[MP_ACTIVATION], 5000);
    // A phase's peak counts what was live when it began (5000 of activations then).
    assert_int_equal(bw.at_peak.bytes[MP_ACTIVATION], 5000);
    assert_int_equal(fw.entries, 1);
    mp_block d;
    assert_int_equal(mp_alloc(&d, 4000, MP_ACTIVATION, "act.d"), MP_OK);
    bw = mp_get_phase_stats(MP_PHASE_BACKWARD);
    assert_int_equal(bw.at_peak.bytes[MP_ACTIVATION], 7000);
    assert_string_equal(mp_site_name(bw.at_peak.site), "act.d");
    assert_int_equal(mp_peak().bytes[MP_ACTIVATION], 7000);
    mp_free(&d);

    mp_free(&a);
    mp_free(&c);
    for (int k = 0; k < MP_OTHER; k++) {
        assert_int_equal(mp_get_counter(k).live, 0);
        assert_int_equal(mp_get_counter(k).live_usable, 0);
    }
}

static void test_usable_is_allocator_size_class(void **state) {
    (void)state;
    size_t sizes[] = {1, 13, 100, 4097, 70000, 3 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        mp_block b;
        assert_int_equal(mp_alloc(&b, sizes[i], MP_CACHE, "kv"), MP_OK);
#ifndef MEMBILL_SYSTEM_ALLOC
        assert_int_equal(b.usable, sallocx(b.data, 0));
#else
        assert_int_equal(b.usable, malloc_usable_size(b.data));
#endif
        assert_true(b.usable >= sizes[i]);
        assert_int_equal(mp_get_counter(MP_CACHE).live_usable, b.usable);
        assert_int_equal(mp_get_counter(MP_CACHE).live, sizes[i]);
        mp_free(&b);
    }
}

static void test_jemalloc_crosscheck(void **state) {
    (void)state;
    mp_block blocks[40];
    for (int i = 0; i < 40; i++)
        assert_int_equal(mp_alloc(&blocks[i], (size_t)(i * 7919 + 24), (mp_category)(i % MP_OTHER), "x"), MP_OK);
    for (int i = 0; i < 40; i += 3) mp_free(&blocks[i]);
    mp_crosscheck x = mp_crosscheck_jemalloc(MP_WEIGHT, 0);
    if (strcmp(mp_backend(), "jemalloc") == 0) {
        assert_true(x.available);
        assert_true(x.agrees);
        for (int c = 0; c < MP_OTHER; c++) {
            assert_int_equal(x.difference[c], 0);
            assert_int_equal(x.jemalloc_bytes[c], mp_get_counter(c).live_usable);
        }
        // A planted error of 16 bytes in the gradient counter must be seen.
        mp_crosscheck bad = mp_crosscheck_jemalloc(MP_GRADIENT, 16);
        assert_false(bad.agrees);
        assert_int_equal(bad.difference[MP_GRADIENT], -16);
        assert_int_equal(bad.difference[MP_WEIGHT], 0);
    } else {
        assert_false(x.available);
    }
    for (int i = 0; i < 40; i++) mp_free(&blocks[i]);
}

static void test_other_is_plain_malloc(void **state) {
    (void)state;
    if (!mp_other_available()) skip();
    uint64_t before = mp_get_counter(MP_OTHER).live;
    char *p = malloc(100000);
    assert_non_null(p);
    p[0] = 1;
    uint64_t during = mp_get_counter(MP_OTHER).live;
    assert_true(during >= before + 100000);
    p = realloc(p, 300000);
    assert_true(mp_get_counter(MP_OTHER).live >= before + 300000);
    free(p);
    assert_int_equal(mp_get_counter(MP_OTHER).live, before);
}

static uint64_t rss_now(void) { return mp_process_now().rss; }

static void test_meta_counts_without_memory(void **state) {
    (void)state;
    mp_shutdown();
    mp_options o = {.meta = true};
    assert_int_equal(mp_init(&o), MP_OK);
    uint64_t rss0 = rss_now();
    mp_block blocks[100];
    for (int i = 0; i < 100; i++) {
        assert_int_equal(mp_alloc(&blocks[i], 1000000000, MP_OPTIMIZER, "adam"), MP_OK);
        assert_null(blocks[i].data);
    }
    assert_int_equal(mp_get_counter(MP_OPTIMIZER).live, 100000000000ULL);
    assert_int_equal(mp_peak().total, 100000000000ULL);
    assert_true(rss_now() < rss0 + 16 * 1000 * 1000);
    for (int i = 0; i < 100; i++) mp_free(&blocks[i]);
    assert_int_equal(mp_get_counter(MP_OPTIMIZER).live, 0);
    assert_int_equal(mp_get_counter(MP_OPTIMIZER).peak, 100000000000ULL);
}

static void test_budget(void **state) {
    (void)state;
    mp_shutdown();
    mp_options o = {.budget = 10000};
    assert_int_equal(mp_init(&o), MP_OK);
    mp_block a, b, c;
    assert_int_equal(mp_alloc(&a, 6000, MP_WEIGHT, "w"), MP_OK);
    mp_set_phase(MP_PHASE_BACKWARD);
    assert_int_equal(mp_alloc(&b, 5000, MP_GRADIENT, "w:grad"), MP_ERR_BUDGET);
    assert_null(b.data);
    const mp_oom_record *r = mp_oom();
    assert_true(r->happened);
    assert_int_equal(r->category, MP_GRADIENT);
    assert_string_equal(mp_site_name(r->site), "w:grad");
    assert_int_equal(r->requested, 5000);
    assert_int_equal(r->live.bytes[MP_WEIGHT], 6000);
    assert_int_equal(r->live.phase, MP_PHASE_BACKWARD);
    // Counters untouched by the refusal, and what fits still fits.
    assert_int_equal(mp_get_counter(MP_GRADIENT).live, 0);
    assert_int_equal(mp_get_counter(MP_GRADIENT).allocations, 0);
    assert_int_equal(mp_alloc(&c, 4000, MP_GRADIENT, "w:grad"), MP_OK);
    assert_int_equal(mp_live_total(), 10000);
    mp_free(&a);
    mp_free(&c);
    assert_int_equal(mp_live_total(), 0);
}

static void test_bad_requests(void **state) {
    (void)state;
    mp_block b;
    assert_int_equal(mp_alloc(&b, (size_t)1 << 60, MP_WEIGHT, "absurd"), MP_ERR_INVALID);
    assert_int_equal(mp_alloc(&b, 10, MP_OTHER, "not a tensor category"), MP_ERR_INVALID);
    assert_int_equal(mp_alloc(&b, 10, (mp_category)42, "bad"), MP_ERR_INVALID);
    assert_null(b.data);
    mp_free(&b); // a zeroed block is ignored
    mp_options o = {0};
    assert_int_equal(mp_init(&o), MP_ERR_STATE);
}

static void test_timeline(void **state) {
    (void)state;
    size_t n0 = mp_timeline_count();
    mp_block b[3000];
    for (int i = 0; i < 3000; i++) assert_int_equal(mp_alloc(&b[i], 64, MP_ACTIVATION, "t"), MP_OK);
    for (int i = 0; i < 3000; i++) mp_free(&b[i]);
    int64_t sum = 0;
    size_t mine = 0;
    for (size_t i = n0; i < mp_timeline_count(); i++) {
        const mp_event *e = mp_timeline_get(i);
        if (e->category != MP_ACTIVATION) continue;
        mine++;
        sum += e->bytes;
        assert_string_equal(mp_site_name(e->site), "t");
    }
    assert_int_equal(mine, 6000); // nothing dropped past the first chunk
    assert_int_equal(sum, 0);
}

static void test_sites_at_a_moment(void **state) {
    (void)state;
    mp_shutdown(); // without "other", so that no library malloc joins the sites
    mp_options o = {.keep_timeline = true};
    assert_int_equal(mp_init(&o), MP_OK);
    mp_block a, b, c;
    assert_int_equal(mp_alloc(&a, 100, MP_ACTIVATION, "x"), MP_OK);
    assert_int_equal(mp_alloc(&b, 500, MP_ACTIVATION, "y"), MP_OK);
    assert_int_equal(mp_alloc(&c, 200, MP_WEIGHT, "x"), MP_OK);
    mp_free(&b);
    mp_moment pk = mp_peak();
    mp_site_bytes top[4];
    assert_int_equal(mp_sites_live_at(pk.events, MP_NCATEGORIES, top, 4), 3);
    assert_string_equal(mp_site_name(top[0].site), "y");
    assert_int_equal(top[0].bytes, 500);
    assert_int_equal(top[1].bytes, 200);
    assert_int_equal(top[1].category, MP_WEIGHT);
    assert_int_equal(top[2].bytes, 100);
    // The activation category's own peak, and only its sites.
    mp_counter act = mp_get_counter(MP_ACTIVATION);
    assert_int_equal(mp_sites_live_at(act.peak_events, MP_ACTIVATION, top, 1), 2);
    assert_string_equal(mp_site_name(top[0].site), "y");
    // Now: y is gone.
    assert_int_equal(mp_sites_live_at(mp_timeline_count(), MP_ACTIVATION, top, 4), 1);
    assert_string_equal(mp_site_name(top[0].site), "x");
    mp_free(&a);
    mp_free(&c);
}

static void test_parse_and_format_bytes(void **state) {
    (void)state;
    uint64_t v;
    assert_true(mp_parse_bytes("16GB", &v));
    assert_int_equal(v, 16000000000ULL);
    assert_true(mp_parse_bytes("500MiB", &v));
    assert_int_equal(v, 500ULL * 1024 * 1024);
    assert_true(mp_parse_bytes("2.5 gb", &v));
    assert_int_equal(v, 2500000000ULL);
    assert_true(mp_parse_bytes("123", &v));
    assert_int_equal(v, 123);
    assert_false(mp_parse_bytes("abc", &v));
    assert_false(mp_parse_bytes("-5GB", &v));
    assert_false(mp_parse_bytes("5 parsecs", &v));
    assert_false(mp_parse_bytes("1e30", &v));
    char buf[80];
    assert_string_equal(mp_format_bytes(buf, sizeof buf, 538060032), "538.06 MB (538,060,032 bytes)");
}

static void test_json_report(void **state) {
    (void)state;
    mp_block a;
    assert_int_equal(mp_alloc(&a, 4096, MP_WEIGHT, "w"), MP_OK);
    json_t *root = json_object();
    assert_int_equal(mp_report_json(root), 0);
    json_t *w = json_object_get(json_object_get(root, "categories"), "weight");
    assert_int_equal(json_integer_value(json_object_get(w, "peak_bytes")), 4096);
    assert_int_equal(json_integer_value(json_object_get(w, "live_bytes")), 4096);
    assert_non_null(json_object_get(json_object_get(root, "peak"), "composition"));
    assert_true(json_is_array(json_object_get(root, "phases")));
    assert_non_null(json_object_get(json_object_get(root, "process"), "peak_rss_bytes"));
    assert_non_null(json_object_get(json_object_get(root, "jemalloc"), "agrees"));
    json_t *tl = json_object_get(root, "timeline");
    // Building the report itself mallocs ("other" events), so the count can only have grown.
    json_int_t events = json_integer_value(json_object_get(tl, "events"));
    assert_true(events > 0 && events <= (json_int_t)mp_timeline_count());
    assert_int_equal(json_integer_value(json_object_get(tl, "dropped_events")), 0);
    json_decref(root);
    mp_free(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_counters_and_peak_composition, setup, teardown),
        cmocka_unit_test_setup_teardown(test_usable_is_allocator_size_class, setup, teardown),
        cmocka_unit_test_setup_teardown(test_jemalloc_crosscheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_is_plain_malloc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_meta_counts_without_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sites_at_a_moment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_and_format_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json_report, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
