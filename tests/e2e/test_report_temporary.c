// The temporary category through the report's parts (the step replay, the four-copies line, the
// text and JSON bill, the breakdown, the CSV timeline, the trace, the chart, the HTML page and
// the teardown check), from a step made here with mp_alloc: nothing in the model makes one yet.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "outputs.h"

// What fn(f, arg) prints, malloc'd.
typedef void (*print_fn)(FILE *f, void *arg);

static char *capture(print_fn fn, void *arg) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    fn(f, arg);
    fclose(f);
    return buf;
}

static void print_report(FILE *f, void *arg) {
    (void)arg;
    mp_report_text(f);
}
static void print_csv(FILE *f, void *arg) {
    ag_err e;
    assert_int_equal(cli_csv_writer(f, arg, &e), 0);
}
static void print_trace(FILE *f, void *arg) {
    ag_err e;
    assert_int_equal(cli_trace_writer(f, arg, &e), 0);
}
static void print_svg(FILE *f, void *arg) { assert_int_equal(cli_svg_scaled(f, arg, 0), 0); }
static void text_none(FILE *f, const void *arg) {
    (void)arg;
    fputs("bill", f);
}
static void print_html(FILE *f, void *arg) {
    ag_err e;
    cli_html_page page = {arg, text_none, NULL, NULL, NULL, 0};
    assert_int_equal(cli_html_writer(f, &page, &e), 0);
}

typedef struct {
    uint64_t peak, four;
    uint64_t at[MP_NCATEGORIES];
    size_t events;
} above_args;

static void print_above(FILE *f, void *arg) {
    const above_args *a = arg;
    cli_above_four_copies_text(f, "", a->peak, a->at, a->four, a->events);
}

// A step: weights, an activation in forward, the gradient in backward, Adam's state and a
// temporary of 600 bytes in the optimizer step: the total peak, 4,600 bytes, is 600 above the
// four copies (1,000 + 1,000 + 2,000).
static void test_temporary_through_the_report(void **state) {
    (void)state;
    mp_options mo = {.keep_timeline = true};
    assert_int_equal(mp_init(&mo), MP_OK);
    step_record rec;
    memset(&rec, 0, sizeof rec);
    train_run r;
    memset(&r, 0, sizeof r);
    r.steps = &rec;
    r.nsteps = 1;
    mp_block w, a, g, o, t;
    mp_set_phase(MP_PHASE_LOAD);
    assert_int_equal(mp_alloc(&w, 1000, MP_WEIGHT, "model.w"), MP_OK);
    rec.events[0] = mp_timeline_count();
    mp_set_phase(MP_PHASE_FORWARD);
    assert_int_equal(mp_alloc(&a, 300, MP_ACTIVATION, "layers.0.act:out"), MP_OK);
    rec.events[1] = mp_timeline_count();
    mp_set_phase(MP_PHASE_BACKWARD);
    assert_int_equal(mp_alloc(&g, 1000, MP_GRADIENT, "model.w:grad"), MP_OK);
    mp_free(&a);
    rec.events[2] = mp_timeline_count();
    mp_set_phase(MP_PHASE_OPTIMIZER);
    assert_int_equal(mp_alloc(&o, 2000, MP_OPTIMIZER, "model.w:exp_avg"), MP_OK);
    assert_int_equal(mp_alloc(&t, 600, MP_TEMPORARY, "model.w:adam_tmp"), MP_OK);
    mp_free(&t);
    mp_free(&g);
    rec.events[3] = mp_timeline_count();
    rec.phases_done = 3;

    mp_moment pk = mp_peak();
    assert_int_equal(pk.total, 4600);
    assert_int_equal(pk.bytes[MP_TEMPORARY], 600);
    mp_counter k = mp_get_counter(MP_TEMPORARY);
    assert_int_equal(k.peak, 600);
    assert_int_equal(k.live, 0);
    assert_int_equal(k.allocations, 1);

    // The step replayed: whole, and as one of two devices sharding the optimizer state.
    step_figures fig;
    cli_replay_steps(&r, NULL, &fig);
    assert_int_equal(fig.peak, 4600);
    assert_int_equal(fig.phase_peak[1], 2300);
    assert_int_equal(fig.at_peak[MP_TEMPORARY], 600);
    assert_int_equal(fig.peak_events, pk.events);
    assert_int_equal(fig.peak_phase, MP_PHASE_OPTIMIZER);
    assert_int_equal(fig.end_live[2][MP_TEMPORARY], 0);
    uint64_t div[MP_NCATEGORIES] = {1, 1, 2, 1, 1, 1, 1};
    cli_replay_steps(&r, div, &fig);
    assert_int_equal(fig.peak, 3600);
    assert_int_equal(fig.at_peak[MP_OPTIMIZER], 1000);
    assert_int_equal(fig.at_peak[MP_TEMPORARY], 600);

    // The four-copies line: what lifted the peak, its largest site; nothing at or below them.
    above_args ab = {pk.total, 4000, {0}, pk.events};
    memcpy(ab.at, pk.bytes, sizeof ab.at);
    char *s = capture(print_above, &ab);
    assert_string_equal(s, "total peak 4.60 kB is 0.60 kB above the four copies: 0.60 kB temporary (largest "
                           "model.w:adam_tmp, 0.60 kB) held then\n");
    free(s);
    above_args shortfall = {4400, 4000, {1000, 500, 2000, 100, 0, 800, 0}, 0};
    s = capture(print_above, &shortfall);
    assert_string_equal(s, "total peak 4.40 kB is 0.40 kB above the four copies: 0.80 kB temporary, 0.10 kB "
                           "activation held then, with the model states 0.50 kB short of the four copies\n");
    free(s);
    above_args none = {4000, 4000, {1000, 1000, 2000, 0, 0, 0, 0}, 0};
    s = capture(print_above, &none);
    assert_string_equal(s, "");
    free(s);

    // The text and JSON bill, and the breakdown at the total peak.
    s = capture(print_report, NULL);
    assert_non_null(strstr(s, "\n  temporary   0.60 kB (600 bytes)"));
    assert_non_null(strstr(s, "      temporary   0.60 kB (600 bytes)\n")); // held at the total peak
    free(s);
    json_t *root = json_object();
    assert_int_equal(mp_report_json(root), 0);
    json_t *cats = json_object_get(root, "categories"), *tmp = json_object_get(cats, "temporary");
    assert_non_null(tmp);
    assert_int_equal(json_object_size(tmp), json_object_size(json_object_get(cats, "weight")));
    assert_int_equal(json_integer_value(json_object_get(tmp, "peak_bytes")), 600);
    json_t *comp = json_object_get(json_object_get(root, "peak"), "composition");
    assert_int_equal(json_integer_value(json_object_get(comp, "temporary")), 600);
    json_decref(root);
    json_t *bd = cli_breakdown_json(1);
    json_t *rows = json_object_get(bd, "at_total_peak");
    bool found = false;
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i);
        if (strcmp(json_string_value(json_object_get(row, "category")), "temporary") == 0) {
            assert_string_equal(json_string_value(json_object_get(row, "site")), "model.w:adam_tmp");
            assert_int_equal(json_integer_value(json_object_get(row, "bytes")), 600);
            found = true;
        }
    }
    assert_true(found);
    json_decref(bd);

    // The files: a CSV column, a trace counter track, the chart's band and legend, the page.
    s = capture(print_csv, NULL);
    assert_non_null(strstr(s, ",cache_live,temporary_live,other_live\n"));
    assert_non_null(strstr(s, ",optimizer,model.w:adam_tmp,temporary,600,1000,1000,2000,0,0,600,0\n"));
    assert_non_null(strstr(s, ",optimizer,model.w:adam_tmp,temporary,-600,1000,1000,2000,0,0,0,0\n"));
    free(s);
    s = capture(print_trace, NULL);
    assert_non_null(strstr(s, "{\"name\":\"temporary\",\"ph\":\"C\""));
    assert_non_null(strstr(s, "\"name\":\"temporary\",\"ph\":\"C\",\"ts\":"));
    free(s);
    s = capture(print_svg, "t");
    assert_non_null(strstr(s, "data-plotted-peak-bytes=\"4600\""));
    assert_non_null(strstr(s, "fill=\"#edc948\""));
    assert_non_null(strstr(s, ">temporary 0.60 kB (600 bytes)</text>")); // legible for tiny runs
    free(s);
    s = capture(print_html, "t");
    assert_non_null(strstr(s, "<b>temporary</b>"));
    free(s);

    // A temporary left live fails the teardown check; freed, the run is clean.
    bool clean = true;
    ag_err err = {""};
    assert_int_equal(mp_alloc(&t, 64, MP_TEMPORARY, "left"), MP_OK);
    mp_free(&o);
    mp_free(&w);
    assert_int_equal(cli_run_end(0, &clean, &err), 0);
    assert_false(clean);
    mp_free(&t);
    assert_int_equal(cli_run_end(0, &clean, &err), 0);
    assert_true(clean);
    mp_shutdown();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_temporary_through_the_report),
    };
    return cmocka_run_group_tests_name("report_temporary", tests, NULL, NULL);
}
