// The profiler's counters, peaks, cross-check, meta mode, budget and reports.
#include "profiler.h"
#include "mp_internal.h" // white-box: probe counts and the pointer set's size

#include <pthread.h>
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

// Every test hands back what it took: each category is at zero when it ends ("other" too,
// where it is tracked: nothing in a test keeps a malloc).
static int teardown(void **state) {
    (void)state;
    int rc = 0;
    for (int c = 0; c < MP_NCATEGORIES; c++) {
        if (c == MP_OTHER && !mp_other_available()) continue;
        if (mp_get_counter(c).live || mp_get_counter(c).live_usable) {
            fprintf(stderr, "teardown: %s still holds %llu bytes\n", mp_category_name(c),
                    (unsigned long long)mp_get_counter(c).live);
            rc = -1;
        }
    }
    mp_shutdown();
    return rc;
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
    // Strict: no space, sign or hex before the number, no fraction of a byte, no silent cap.
    assert_false(mp_parse_bytes(" 1GB", &v));
    assert_false(mp_parse_bytes("+1GB", &v));
    assert_false(mp_parse_bytes("0x10", &v));
    assert_false(mp_parse_bytes("0.4", &v));
    assert_false(mp_parse_bytes("1e-400", &v));
    assert_false(mp_parse_bytes("2e19", &v));
    assert_true(mp_parse_bytes("1e19", &v));
    assert_true(v == 10000000000000000000ULL);
    assert_true(mp_parse_bytes("0", &v));
    assert_int_equal(v, 0);
    assert_false(mp_parse_bytes("5 parsecs", &v));
    assert_false(mp_parse_bytes("1e30", &v));
    char buf[80];
    assert_string_equal(mp_format_bytes(buf, sizeof buf, 538060032), "538.06 MB (538,060,032 bytes)");
    assert_string_equal(mp_format_bytes(buf, sizeof buf, 2152240128ULL), "2.15 GB (2,152,240,128 bytes)");
    assert_string_equal(mp_format_bytes(buf, sizeof buf, 1000000000ULL), "1.00 GB (1,000,000,000 bytes)");
    assert_string_equal(mp_format_bytes(buf, sizeof buf, 999999999ULL), "1000.00 MB (999,999,999 bytes)");
    assert_string_equal(mp_format_bytes(buf, sizeof buf, 1000000), "1.00 MB (1,000,000 bytes)");
    assert_string_equal(mp_format_bytes(buf, sizeof buf, 4096), "4.10 kB (4,096 bytes)");
    assert_string_equal(mp_format_bytes(buf, sizeof buf, 0), "0.00 kB (0 bytes)");
    assert_string_equal(mp_format_bytes(buf, sizeof buf, 1120000000000ULL), "1120.00 GB (1,120,000,000,000 bytes)");
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

// ---- the budget is the peak ----

// One run of a fixed sequence under `budget`: weights, an activation, then either a plain malloc
// or a tensor that makes the peak, then one more tensor. No assert runs inside, so nothing but
// the sequence itself allocates.
typedef struct {
    uint64_t peak;
    mp_status last; // the tensor after the peak
    mp_oom_record oom;
    bool json_exceeded;
    const char *json_category, *json_site, *json_after;
    char names[3][64]; // the oom site, the site before it, the JSON site
} budget_run;

static void run_sequence(uint64_t budget, bool malloc_peak, budget_run *r) {
    memset(r, 0, sizeof *r);
    mp_shutdown();
    mp_options o = {.budget = budget, .track_other = true, .keep_timeline = true};
    if (mp_init(&o) != MP_OK) return;
    mp_block w, a, big, last;
    mp_alloc(&w, 6000, MP_WEIGHT, "w");
    mp_set_phase(MP_PHASE_FORWARD);
    mp_alloc(&a, 2000, MP_ACTIVATION, "act.a");
    memset(&big, 0, sizeof big);
    if (malloc_peak) {
        char *volatile p = malloc(100000);
        if (p) p[0] = 1;
        free(p);
    } else {
        mp_alloc(&big, 90000, MP_ACTIVATION, "act.big");
        mp_free(&big);
    }
    r->last = mp_alloc(&last, 1000, MP_ACTIVATION, "act.last");
    mp_free(&last);
    mp_free(&a);
    mp_free(&w);
    r->peak = mp_peak().total;
    r->oom = *mp_oom();
    snprintf(r->names[0], sizeof r->names[0], "%s", mp_site_name(r->oom.site));
    snprintf(r->names[1], sizeof r->names[1], "%s", mp_site_name(r->oom.live.site));
    json_t *root = json_object();
    mp_report_json(root);
    json_t *b = json_object_get(root, "budget");
    r->json_exceeded = json_is_true(json_object_get(b, "exceeded"));
    snprintf(r->names[2], sizeof r->names[2], "%s", json_string_value(json_object_get(b, "category")) ?: "");
    r->json_category = r->names[2];
    json_decref(root);
}

static void test_budget_is_the_peak_tensor(void **state) {
    (void)state;
    budget_run r;
    run_sequence(0, false, &r);
    uint64_t peak = r.peak;
    assert_true(peak >= 98000); // 6000 + 2000 + 90000, plus whatever "other" held
    run_sequence(peak, false, &r);
    assert_false(r.oom.happened);
    assert_int_equal(r.last, MP_OK);
    assert_int_equal(r.peak, peak);
    assert_false(r.json_exceeded);
    run_sequence(peak - 1, false, &r);
    assert_true(r.oom.happened);
    assert_int_equal(r.oom.category, MP_ACTIVATION);
    assert_string_equal(r.names[0], "act.big");
    assert_int_equal(r.oom.requested, 90000);
    assert_int_equal(r.oom.budget, peak - 1);
    assert_int_equal(r.oom.live.total + r.oom.requested, peak);
    assert_int_equal(r.oom.live.bytes[MP_WEIGHT], 6000);
    assert_int_equal(r.oom.live.bytes[MP_ACTIVATION], 2000);
    assert_int_equal(r.oom.live.phase, MP_PHASE_FORWARD);
    assert_true(r.peak <= peak - 1);
    assert_true(r.json_exceeded);
    assert_string_equal(r.json_category, "activation");
    // A refused tensor was never made: what fits after it still fits.
    assert_int_equal(r.last, MP_OK);
}

static void test_budget_is_the_peak_malloc(void **state) {
    (void)state;
    budget_run r;
    run_sequence(0, true, &r);
    uint64_t peak = r.peak;
    assert_true(peak >= 108000); // 6000 + 2000 + 100000's size class
    run_sequence(peak, true, &r);
    assert_false(r.oom.happened);
    assert_int_equal(r.last, MP_OK);
    assert_int_equal(r.peak, peak);
    assert_false(r.json_exceeded);
    run_sequence(peak - 1, true, &r);
    assert_true(r.oom.happened);
    assert_int_equal(r.oom.category, MP_OTHER);
    assert_string_equal(r.names[0], "malloc");
    assert_true(r.oom.live.by_malloc);
    assert_string_equal(r.names[1], "act.a"); // the tensor allocated last before it
    assert_true(r.oom.requested >= 100000);
    assert_int_equal(r.oom.live.total + r.oom.requested, peak);
    assert_int_equal(r.oom.live.bytes[MP_WEIGHT], 6000);
    assert_int_equal(r.oom.live.bytes[MP_ACTIVATION], 2000);
    assert_int_equal(r.oom.budget, peak - 1);
    // The malloc happened, so the peak went past the budget; the run fails from then on.
    assert_int_equal(r.peak, peak);
    assert_int_equal(r.last, MP_ERR_BUDGET);
    assert_true(r.json_exceeded);
    assert_string_equal(r.json_category, "other");
}

static void test_budget_after_malloc_stays_failed(void **state) {
    (void)state;
    mp_shutdown();
    mp_options o = {.budget = 50000, .track_other = true};
    assert_int_equal(mp_init(&o), MP_OK);
    mp_block a, b;
    assert_int_equal(mp_alloc(&a, 1000, MP_WEIGHT, "w"), MP_OK);
    char *volatile p = malloc(60000);
    assert_non_null(p);
    free(p);
    // Back under the budget, yet the run went past it: every tensor is refused now, and the
    // record still names the malloc.
    assert_true(mp_live_total() < 50000);
    assert_int_equal(mp_alloc(&b, 1, MP_ACTIVATION, "tiny"), MP_ERR_BUDGET);
    assert_int_equal(mp_alloc(&b, 1, MP_ACTIVATION, "tiny"), MP_ERR_BUDGET);
    assert_null(b.data);
    assert_true(mp_oom()->happened);
    assert_int_equal(mp_oom()->category, MP_OTHER);
    assert_string_equal(mp_site_name(mp_oom()->live.site), "w");
    assert_int_equal(mp_get_counter(MP_ACTIVATION).allocations, 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    mp_report_text(f);
    fclose(f);
    bool said = strstr(text, "OUT OF BUDGET: other (plain malloc, not a tensor)") && strstr(text, "after w");
    free(text);
    assert_true(said);
    mp_free(&a);
}

// Threads allocating at once: the check and the count are one step, so the live total, and with
// it the peak, never passes the budget.
#define HAMMER_THREADS 4
#define HAMMER_BUDGET 300000u

typedef struct {
    unsigned seed;
    int ok, refused, bad;
} hammer_arg;

static void *hammer(void *p) {
    hammer_arg *h = p;
    mp_block held[8];
    memset(held, 0, sizeof held);
    for (int i = 0; i < 20000; i++) {
        h->seed = h->seed * 1103515245u + 12345u;
        mp_block *b = &held[(h->seed >> 16) % 8];
        if (b->bytes) {
            mp_free(b);
            continue;
        }
        size_t bytes = 1 + (h->seed >> 8) % 65536;
        mp_status st = mp_alloc(b, bytes, MP_ACTIVATION, (h->seed & 1) ? "hammer.a" : "hammer.b");
        if (st == MP_OK) {
            h->ok++;
            if (mp_live_total() > HAMMER_BUDGET) h->bad++;
        } else if (st == MP_ERR_BUDGET) {
            h->refused++;
        } else {
            h->bad++;
        }
    }
    for (int k = 0; k < 8; k++) mp_free(&held[k]);
    return NULL;
}

static void test_budget_threads(void **state) {
    (void)state;
    mp_shutdown();
    mp_options o = {.budget = HAMMER_BUDGET}; // tensors only: the figure is exact
    assert_int_equal(mp_init(&o), MP_OK);
    pthread_t t[HAMMER_THREADS];
    hammer_arg args[HAMMER_THREADS];
    for (int i = 0; i < HAMMER_THREADS; i++) {
        args[i] = (hammer_arg){.seed = 12345u + 977u * (unsigned)i};
        assert_int_equal(pthread_create(&t[i], NULL, hammer, &args[i]), 0);
    }
    int ok = 0, refused = 0;
    for (int i = 0; i < HAMMER_THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(args[i].bad, 0);
        ok += args[i].ok;
        refused += args[i].refused;
    }
    assert_true(ok > 0);
    assert_true(refused > 0); // 4 threads hold up to 8 blocks of up to 64 kB each
    assert_true(mp_peak().total <= HAMMER_BUDGET);
    assert_true(mp_get_counter(MP_ACTIVATION).peak <= HAMMER_BUDGET);
    assert_int_equal(mp_live_total(), 0);
    mp_counter k = mp_get_counter(MP_ACTIVATION);
    assert_int_equal(k.allocations, (uint64_t)ok);
    assert_int_equal(k.frees, (uint64_t)ok);
    mp_crosscheck x = mp_crosscheck_jemalloc(MP_WEIGHT, 0);
    if (x.available) assert_true(x.agrees);
}

// ---- the peak names a tensor ----

static void test_peak_crossed_by_malloc(void **state) {
    (void)state;
    mp_block w, a;
    assert_int_equal(mp_alloc(&w, 4000, MP_WEIGHT, "w"), MP_OK);
    assert_int_equal(mp_alloc(&a, 3000, MP_ACTIVATION, "act.x"), MP_OK);
    mp_free(&a); // the last tensor allocated, though no longer live
    char *volatile p = malloc(1000000);
    assert_non_null(p);
    mp_moment pk = mp_peak();
    assert_true(pk.by_malloc);
    assert_string_equal(mp_site_name(pk.site), "act.x");
    assert_true(pk.bytes[MP_OTHER] >= 1000000);
    free(p);
    json_t *root = json_object();
    assert_int_equal(mp_report_json(root), 0);
    json_t *jp = json_object_get(root, "peak");
    assert_string_equal(json_string_value(json_object_get(jp, "site")), "act.x");
    assert_true(json_is_true(json_object_get(jp, "crossed_by_malloc")));
    json_decref(root);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    mp_report_text(f);
    fclose(f);
    bool said = strstr(text, "allocating plain malloc (not a tensor), after act.x") != NULL;
    free(text);
    assert_true(said);
    mp_free(&w);
}

static void test_peak_by_tensor_is_not_malloc(void **state) {
    (void)state;
    // Without "other": with it, the report's own mallocs on top of the weights make a new peak.
    mp_shutdown();
    mp_options o = {.keep_timeline = true};
    assert_int_equal(mp_init(&o), MP_OK);
    mp_block w;
    assert_int_equal(mp_alloc(&w, 50000000, MP_WEIGHT, "big.w"), MP_OK);
    mp_moment pk = mp_peak();
    assert_false(pk.by_malloc);
    assert_string_equal(mp_site_name(pk.site), "big.w");
    json_t *root = json_object();
    assert_int_equal(mp_report_json(root), 0);
    assert_true(json_is_false(json_object_get(json_object_get(root, "peak"), "crossed_by_malloc")));
    json_decref(root);
    mp_free(&w);
}

// ---- scale: a million sites ----

static void test_million_sites(void **state) {
    (void)state;
    mp_shutdown();
    mp_options o = {.meta = true, .keep_timeline = true};
    assert_int_equal(mp_init(&o), MP_OK);
    enum { N = 1000000 };
    char label[48];
    uint64_t probes0 = mp_g.sites.probes, lookups0 = mp_g.sites.lookups;
    for (unsigned i = 0; i < N; i++) {
        snprintf(label, sizeof label, "layers.%u.mlp.down_proj:saved_input", i);
        if (mp_site_id(label) != i + 1) fail_msg("site %u got id %u", i, mp_site_id(label));
    }
    for (unsigned i = 0; i < N; i += 7) { // looked up again: the same ids
        snprintf(label, sizeof label, "layers.%u.mlp.down_proj:saved_input", i);
        if (mp_site_id(label) != i + 1) fail_msg("site %u moved", i);
    }
    assert_string_equal(mp_site_name(N), "layers.999999.mlp.down_proj:saved_input");
    uint64_t lookups = mp_g.sites.lookups - lookups0, probes = mp_g.sites.probes - probes0;
    assert_true(lookups >= N);
    // Linear probing at load <= 1/2 examines about one extra slot a lookup; a scan would be
    // N / 2 a lookup, 5 * 10^11 in all.
    assert_true(probes < 2 * lookups);
}

static void test_many_sites_at_a_moment(void **state) {
    (void)state;
    mp_shutdown();
    mp_options o = {.meta = true, .keep_timeline = true};
    assert_int_equal(mp_init(&o), MP_OK);
    // Increasing sizes: the order in which keeping a sorted top list costs the most.
    enum { N = 200000 };
    mp_block *b = calloc(N, sizeof *b);
    assert_non_null(b);
    char label[32];
    for (unsigned i = 0; i < N; i++) {
        snprintf(label, sizeof label, "s%u", i);
        if (mp_alloc(&b[i], 1 + (size_t)i, (i % 2) ? MP_ACTIVATION : MP_WEIGHT, label) != MP_OK) fail();
    }
    size_t events = mp_timeline_count();
    assert_int_equal(mp_sites_live_at(events, MP_NCATEGORIES, NULL, 0), N);
    mp_site_bytes *all = malloc(N * sizeof *all);
    assert_non_null(all);
    assert_int_equal(mp_sites_live_at(events, MP_NCATEGORIES, all, N), N);
    for (size_t i = 0; i < N; i++)
        if (all[i].bytes != N - i) fail_msg("entry %zu holds %llu", i, (unsigned long long)all[i].bytes);
    assert_string_equal(mp_site_name(all[0].site), "s199999");
    mp_site_bytes top[3];
    assert_int_equal(mp_sites_live_at(events, MP_WEIGHT, top, 3), N / 2);
    assert_int_equal(top[0].bytes, N - 1);
    assert_int_equal(top[2].bytes, N - 5);
    assert_int_equal(top[2].category, MP_WEIGHT);
    free(all);
    for (unsigned i = 0; i < N; i++) mp_free(&b[i]);
    free(b);
}

// The set of malloc'd pointers follows what is live, not every malloc the run ever made.
static void test_other_pointer_set_stays_small(void **state) {
    (void)state;
    for (int i = 0; i < 300000; i++) {
        char *volatile p = malloc(32);
        if (!p) fail();
        free(p);
    }
    assert_true(mp_g.other_ptrs.cap <= 16384);
    assert_true(mp_g.other_ptrs.count < 100);
}

// ---- the text report says what it knows ----

static char *report_text_now(void) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    mp_report_text(f);
    fclose(f);
    return text;
}

static void test_text_report_meta(void **state) {
    (void)state;
    mp_shutdown();
    mp_options o = {.meta = true, .keep_timeline = true};
    assert_int_equal(mp_init(&o), MP_OK);
    mp_block w;
    assert_int_equal(mp_alloc(&w, 2152240128ULL, MP_WEIGHT, "w"), MP_OK);
    char *t = report_text_now();
    assert_non_null(t);
    bool meta_other = strstr(t, "other       not tracked in meta mode (no data is allocated)") != NULL;
    bool no_hooks = strstr(t, "no allocation hooks") != NULL;
    bool size_classes = strstr(t, "size classes") != NULL;
    bool cross = strstr(t, "cross-check: not applicable in meta mode") != NULL;
    bool not_available = strstr(t, "not available") != NULL;
    bool gb = strstr(t, "weight      2.15 GB (2,152,240,128 bytes)") != NULL;
    free(t);
    assert_true(meta_other);
    assert_false(no_hooks);
    assert_false(size_classes);
    assert_true(cross);
    assert_false(not_available);
    assert_true(gb);
    mp_free(&w);
}

static void test_text_report_real(void **state) {
    (void)state;
    mp_block w;
    assert_int_equal(mp_alloc(&w, 4096, MP_WEIGHT, "w"), MP_OK);
    char *t = report_text_now();
    assert_non_null(t);
    bool size_classes = strstr(t, "peak (allocator size classes)") != NULL;
    bool meta = strstr(t, "meta mode") != NULL;
    bool resident = strstr(t, "jemalloc resident") != NULL;
    bool explained = strstr(t, "an upper bound, so it can exceed RSS") != NULL;
    bool tracked = strstr(t, "other       not tracked") == NULL;
    free(t);
    assert_true(size_classes);
    assert_false(meta);
    assert_int_equal(explained, resident); // never one without the other
    assert_int_equal(tracked, mp_other_available());
    mp_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_counters_and_peak_composition, setup, teardown),
        cmocka_unit_test_setup_teardown(test_usable_is_allocator_size_class, setup, teardown),
        cmocka_unit_test_setup_teardown(test_jemalloc_crosscheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_meta_counts_without_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sites_at_a_moment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_and_format_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json_report, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_is_the_peak_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peak_by_tensor_is_not_malloc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_million_sites, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_sites_at_a_moment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_text_report_meta, setup, teardown),
        cmocka_unit_test_setup_teardown(test_text_report_real, setup, teardown),
    };
    // Plain malloc is "other" only where jemalloc is the process's malloc: a build under
    // AddressSanitizer replaces malloc, so these run in the release build (where CI runs them).
    const struct CMUnitTest other[] = {
        cmocka_unit_test_setup_teardown(test_other_is_plain_malloc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_is_the_peak_malloc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_after_malloc_stays_failed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peak_crossed_by_malloc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_pointer_set_stays_small, setup, teardown),
    };
    int failed = cmocka_run_group_tests_name("profiler", tests, NULL, NULL);
    bool tracked = setup(NULL) == 0 && mp_other_available();
    mp_shutdown();
    if (!tracked) {
        printf("plain malloc is not jemalloc's in this build: the %zu tests of \"other\" belong to the release build\n",
               sizeof other / sizeof other[0]);
        return failed;
    }
    return failed + cmocka_run_group_tests_name("other", other, NULL, NULL);
}
