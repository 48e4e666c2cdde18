// The pictures and breakdowns stand on the same numbers as the JSON report.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];
static json_t *report;

// Every category, "other" last; the first NTENSOR are the tensor categories.
static const char *const cats[] = {"weight", "gradient", "optimizer", "activation", "cache", "temporary", "other"};
#define NCATS 7
#define NTENSOR 6

static char *slurp(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (buf) buf[n] = 0;
    fclose(f);
    return buf;
}

static json_int_t peak_of(const char *cat) {
    return json_integer_value(
        json_object_get(json_object_get(json_object_get(report, "categories"), cat), "peak_bytes"));
}

static int run_once(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/membill_out_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s train --weights %s/tiny_tied --steps 2 --explain --json %s/r.json --svg %s/c.svg --trace %s/t.json "
             "--timeline %s/t.csv --html %s/p.html > %s/out.txt 2>&1",
             MEMBILL_BIN, MEMBILL_GOLDEN_DIR, dir, dir, dir, dir, dir, dir);
    if (system(cmd) != 0) return -1;
    snprintf(cmd, sizeof cmd, "%s/r.json", dir);
    report = json_load_file(cmd, 0, NULL);
    return report ? 0 : -1;
}

static int clean_up(void **state) {
    (void)state;
    json_decref(report);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_svg(void **state) {
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v xmllint >/dev/null || exit 77; xmllint --noout %s/c.svg", dir);
    int rc = system(cmd);
    if (WEXITSTATUS(rc) == 77) skip();
    assert_int_equal(rc, 0); // well-formed XML
    char *svg = slurp("c.svg");
    assert_non_null(svg);
    const char *p = strstr(svg, "data-plotted-peak-bytes=\"");
    assert_non_null(p);
    long long plotted = atoll(p + strlen("data-plotted-peak-bytes=\""));
    assert_int_equal(plotted, json_integer_value(json_object_get(json_object_get(report, "peak"), "total_bytes")));
    for (int c = 0; c < NCATS; c++) assert_non_null(strstr(svg, cats[c])); // the legend
    assert_non_null(strstr(svg, "forward"));                               // a phase label
    assert_non_null(strstr(svg, "viewBox=\"0 0 "));                        // a fixed aspect
    assert_non_null(strstr(svg, "width=\"100%\""));                        // scaling to the page
    free(svg);
}

// One of the run's JSON outputs, parsed.
static json_t *load_output(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return json_load_file(path, 0, NULL);
}

static void test_trace(void **state) {
    (void)state;
    json_t *t = load_output("t.json");
    assert_non_null(t);
    json_t *ev = json_object_get(t, "traceEvents");
    assert_true(json_array_size(ev) > 10);
    json_int_t maxc[NCATS] = {0};
    bool track[NCATS] = {false};
    int phases = 0, peaks = 0;
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph")),
                   *name = json_string_value(json_object_get(e, "name"));
        assert_non_null(ph);
        assert_non_null(name);
        if (strcmp(ph, "C") == 0) {
            json_int_t b = json_integer_value(json_object_get(json_object_get(e, "args"), "bytes"));
            for (int c = 0; c < NCATS; c++)
                if (strcmp(name, cats[c]) == 0) {
                    track[c] = true;
                    if (b > maxc[c]) maxc[c] = b;
                }
        } else if (strcmp(ph, "X") == 0) {
            phases += strcmp(name, "forward") == 0 || strcmp(name, "backward") == 0 || strcmp(name, "optimizer") == 0;
        } else if (strcmp(ph, "i") == 0) {
            peaks++;
            assert_int_equal(json_integer_value(json_object_get(json_object_get(e, "args"), "bytes")),
                             json_integer_value(json_object_get(json_object_get(report, "peak"), "total_bytes")));
        }
    }
    for (int c = 0; c < NCATS; c++) assert_true(track[c]);                         // a track per category
    for (int c = 0; c < NTENSOR; c++) assert_int_equal(maxc[c], peak_of(cats[c])); // each reaches its peak
    assert_true(phases >= 6);                                                      // two steps of three phases
    assert_int_equal(peaks, 1);
    json_decref(t);
}

static int cat_index(const char *name) {
    for (int c = 0; c < NCATS; c++)
        if (name && strcmp(name, cats[c]) == 0) return c;
    return -1;
}

static json_t *event_named(json_t *ev, const char *ph, const char *name) {
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "ph")), ph) == 0 &&
            (!name || strcmp(json_string_value(json_object_get(e, "name")), name) == 0))
            return e;
    }
    return NULL;
}

// A tensor's slice says its shape and dtype, and they make its bytes; weights, gradients and
// optimizer state always say them (plain malloc never does).
static void check_shape(json_t *e) {
    json_t *args = json_object_get(e, "args"), *shape = json_object_get(args, "shape"), *d;
    const char *cat = json_string_value(json_object_get(e, "cat"));
    if (!strcmp(cat, "weight") || !strcmp(cat, "gradient") || !strcmp(cat, "optimizer")) assert_non_null(shape);
    if (!strcmp(cat, "other")) assert_null(shape);
    if (!shape) return;
    json_int_t numel = 1;
    size_t i;
    json_array_foreach(shape, i, d) numel *= json_integer_value(d);
    const char *dtype = json_string_value(json_object_get(args, "dtype"));
    assert_non_null(dtype);
    assert_string_equal(dtype, "float32"); // a real run
    assert_int_equal(numel * 4, json_integer_value(json_object_get(args, "bytes")));
}

// Sums into sum, by category, the bytes of the tensor slices live at timestamp at (begun at or
// before it, ended after it), checking each slice on the way (a tensor category's, on the one
// named thread); returns how many slices there are.
static size_t live_slices_at(json_t *ev, double at, json_int_t *sum) {
    json_t *begins = json_object(), *e;
    size_t i, slices = 0;
    json_array_foreach(ev, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        char id[32];
        snprintf(id, sizeof id, "%lld", (long long)json_integer_value(json_object_get(e, "id")));
        if (strcmp(ph, "b") == 0) {
            assert_true(json_integer_value(json_object_get(json_object_get(e, "args"), "bytes")) > 0);
            check_shape(e);
            int c = cat_index(json_string_value(json_object_get(e, "cat")));
            assert_true(c >= 0 && c < NTENSOR); // plain malloc is its counter track alone
            assert_int_equal(json_integer_value(json_object_get(e, "tid")), 1);
            assert_null(json_object_get(begins, id)); // ids are unique
            json_object_set(begins, id, e);
        } else if (strcmp(ph, "e") == 0) {
            json_t *b = json_object_get(begins, id);
            assert_non_null(b); // an end has its begin, with the same name
            assert_string_equal(json_string_value(json_object_get(b, "name")),
                                json_string_value(json_object_get(e, "name")));
            double t0 = json_number_value(json_object_get(b, "ts")), t1 = json_number_value(json_object_get(e, "ts"));
            if (t0 <= at && at < t1)
                sum[cat_index(json_string_value(json_object_get(b, "cat")))] +=
                    json_integer_value(json_object_get(json_object_get(b, "args"), "bytes"));
            slices++;
        }
    }
    assert_int_equal(slices, json_object_size(begins)); // every slice ends
    json_decref(begins);
    return slices;
}

// The value of counter track `name` at timestamp at (its last sample at or before it).
static json_int_t counter_at(json_t *ev, const char *name, double at) {
    json_int_t v = -1;
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "C") == 0 &&
            strcmp(json_string_value(json_object_get(e, "name")), name) == 0 &&
            json_number_value(json_object_get(e, "ts")) <= at)
            v = json_integer_value(json_object_get(json_object_get(e, "args"), "bytes"));
    }
    return v;
}

// Every tensor an async slice from allocation to free, with its shape and dtype; the slices live
// at the total peak's timestamp hold the report's composition of the peak, category by
// category, to the byte, and plain malloc's counter track the rest. Every thread the trace names
// carries slices of its own (async slices are the process's: they are on no thread's track).
static void test_trace_slices(void **state) {
    (void)state;
    json_t *t = load_output("t.json");
    assert_non_null(t);
    json_t *ev = json_object_get(t, "traceEvents");
    assert_non_null(event_named(ev, "M", "process_name"));
    size_t i, named = 0;
    json_t *e;
    json_array_foreach(ev, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "name")), "thread_name") != 0) continue;
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        size_t j, own = 0;
        json_t *s;
        json_array_foreach(ev, j, s) own += !strcmp(json_string_value(json_object_get(s, "ph")), "X") &&
                                            json_integer_value(json_object_get(s, "tid")) == tid;
        assert_true(own > 0);
        named++;
    }
    assert_int_equal(named, 1); // "phases"
    json_t *peak = json_object_get(report, "peak");
    double at = json_number_value(json_object_get(event_named(ev, "i", "total peak"), "ts"));
    assert_true(fabs(at - json_number_value(json_object_get(peak, "seconds")) * 1e6) < 1); // the same moment
    json_int_t sum[NCATS] = {0};
    assert_true(live_slices_at(ev, at, sum) > 100);
    sum[NCATS - 1] = counter_at(ev, "other", at);
    for (int c = 0; c < NCATS; c++)
        assert_int_equal(sum[c], json_integer_value(json_object_get(json_object_get(peak, "composition"), cats[c])));
    json_decref(t);
}

static void test_timeline_csv(void **state) {
    (void)state;
    char *csv = slurp("t.csv");
    assert_non_null(csv);
    long long maxc[NCATS] = {0}, last[NCATS] = {0};
    char *line = strtok(csv, "\n"); // header
    assert_non_null(strstr(line, "activation_live"));
    assert_non_null(strstr(line, ",temporary_live,other_live"));
    while ((line = strtok(NULL, "\n"))) {
        char *p = line;
        for (int k = 0; k < 5; k++) p = strchr(p, ',') + 1; // past seconds, phase, site, category, bytes
        for (int c = 0; c < NCATS; c++) {
            last[c] = strtoll(p, &p, 10);
            if (last[c] > maxc[c]) maxc[c] = last[c];
            if (*p == ',') p++;
        }
    }
    for (int c = 0; c < NTENSOR; c++) {
        assert_int_equal(maxc[c], peak_of(cats[c]));
        assert_int_equal(last[c], 0);
    }
    free(csv);
}

static void test_text_breakdown_and_explain(void **state) {
    (void)state;
    char *out = slurp("out.txt");
    assert_non_null(out);
    assert_non_null(strstr(out, "held at the total peak"));
    assert_non_null(strstr(out, "layers.*.self_attn:probs"));
    assert_non_null(strstr(out, "loss:log_softmax")); // kept by --framework pytorch's loss
    // --explain: the formulas of weight, gradient and Adam state equal the measured bytes.
    const char *e = strstr(out, "explained");
    assert_non_null(e);
    const char *states[] = {"  weight     measured", "  gradient   measured", "  optimizer  measured"};
    for (int k = 0; k < 3; k++) {
        const char *at = strstr(e, states[k]), *formula = at ? strstr(at, "formula") : NULL;
        assert_non_null(formula);
        const char *eol = strchr(formula, '\n');
        assert_true(eol && eol - 7 >= formula && strncmp(eol - 7, "(equal)", 7) == 0);
    }
    // under --framework pytorch it says whose saved set the activation formula is, and it
    // explains the temporaries (for-loop Adam's, the engine's sums) with their measured peak
    assert_non_null(
        strstr(e, "the formula is --framework lean's (the tensors membill's fused ops save); this run bills"));
    const char *t = strstr(e, "  temporary  measured ");
    assert_non_null(t);
    char digits[32], bytes[64], line[256];
    int nd = snprintf(digits, sizeof digits, "%lld", (long long)peak_of("temporary")), k = 0;
    for (int i = 0; i < nd; i++) {
        if (i && (nd - i) % 3 == 0) bytes[k++] = ','; // 131,072
        bytes[k++] = digits[i];
    }
    bytes[k] = 0;
    snprintf(line, sizeof line, "%.*s", (int)(strchr(t, '\n') - t), t);
    if (!strstr(line, bytes)) fail_msg("'%s' does not hold the temporary peak %s", line, bytes);
    assert_non_null(strstr(t, "for-loop Adam: a parameter's sqrt and denom beside the previous one's denom"));
    assert_non_null(strstr(t, "at the total peak it held"));
    // The breakdown in the JSON report sums to the activation peak.
    json_t *rows = json_object_get(json_object_get(report, "breakdown"), "activation_by_op");
    json_int_t sum = 0;
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) sum += json_integer_value(json_object_get(r, "bytes"));
    assert_int_equal(sum, peak_of("activation"));
    free(out);
}

// Every category has the same keys in the report, temporary included;
// the text bill lists it, and says what lifts the total peak past the four copies when it does.
static void test_categories_and_four_copies(void **state) {
    (void)state;
    json_t *cs = json_object_get(report, "categories"), *w = json_object_get(cs, "weight");
    for (int c = 0; c < NCATS; c++) {
        json_t *o = json_object_get(cs, cats[c]);
        assert_non_null(o);
        const char *key;
        json_t *v;
        json_object_foreach(w, key, v) assert_non_null(json_object_get(o, key));
        assert_non_null(json_object_get(json_object_get(json_object_get(report, "peak"), "composition"), cats[c]));
    }
    assert_true(json_is_integer(json_object_get(json_object_get(cs, "temporary"), "peak_bytes")));
    json_t *steps = json_object_get(report, "steps");
    assert_int_equal(json_array_size(steps), 2);
    json_t *end = json_object_get(json_array_get(json_object_get(json_array_get(steps, 0), "phases"), 0), "end_live");
    for (int c = 0; c < NCATS; c++) assert_non_null(json_object_get(end, cats[c]));
    char *out = slurp("out.txt");
    assert_non_null(out);
    assert_non_null(strstr(out, "\n  temporary   "));
    assert_non_null(strstr(out, "cache and temporary back at zero: yes"));
    json_t *four = json_object_get(report, "four_copies");
    json_int_t total = json_integer_value(json_object_get(json_object_get(report, "peak"), "total_bytes")),
               copies = json_integer_value(json_object_get(four, "total_bytes"));
    assert_int_equal(copies, peak_of("weight") + peak_of("gradient") + peak_of("optimizer")); // no temporary
    assert_int_equal(json_integer_value(json_object_get(four, "total_peak_above_bytes")),
                     total > copies ? total - copies : 0);
    const char *line = strstr(out, "above the four copies:");
    assert_int_equal(line != NULL, total > copies);
    free(out);
}

// The page's embedded data (window.MEMBILL = {...};) as JSON.
static json_t *page_data(const char *html) {
    const char *p = strstr(html, "window.MEMBILL="), *end = p ? strstr(p, ";</script>") : NULL;
    if (!end) return NULL;
    p += strlen("window.MEMBILL=");
    return json_loadb(p, (size_t)(end - p), 0, NULL);
}

static void test_html(void **state) {
    (void)state;
    char *html = slurp("p.html");
    assert_non_null(html);
    assert_non_null(strstr(html, "four copies"));
    assert_non_null(strstr(html, "held at the total peak"));
    assert_non_null(strstr(html, "Reading the bill"));
    assert_non_null(strstr(html, "<b>temporary</b>"));
    // Self-contained: nothing fetched, the script inline.
    assert_null(strstr(html, "<link"));
    assert_null(strstr(html, " src="));
    for (const char *h = strstr(html, "http://"); h; h = strstr(h + 1, "http://"))
        assert_memory_equal(h, "http://www.w3.org/2000/svg", 26); // the SVG namespace only
    assert_null(strstr(html, "https://"));
    assert_non_null(strstr(html, "class Chart"));
    // The lifetimes embedded for the page, live at the peak's event, hold the report's composition.
    json_t *d = page_data(html), *run = json_array_get(json_object_get(d, "runs"), 0);
    assert_non_null(run);
    assert_true(json_equal(json_object_get(d, "report"), report));
    json_int_t at = json_integer_value(json_object_get(run, "peak_event")), sum[NCATS] = {0};
    json_t *life = json_object_get(run, "life");
    assert_int_equal(json_array_size(life) % 5, 0);
    for (size_t i = 0; i < json_array_size(life); i += 5) {
        json_int_t cat = json_integer_value(json_array_get(life, i + 1)),
                   bytes = json_integer_value(json_array_get(life, i + 2)),
                   start = json_integer_value(json_array_get(life, i + 3)),
                   end = json_integer_value(json_array_get(life, i + 4));
        if (start <= at && (end < 0 || end > at)) sum[cat] += bytes;
    }
    json_t *comp = json_object_get(json_object_get(report, "peak"), "composition");
    for (int c = 0; c < NCATS; c++) assert_int_equal(sum[c], json_integer_value(json_object_get(comp, cats[c])));
    json_decref(d);
    free(html);
}

// Runs membill with args (a shell fragment); its exit code, stderr into err.
static int membill(const char *args, char *err, size_t errlen) {
    char cmd[4096], path[256];
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s/err.txt", MEMBILL_BIN, args, dir);
    int st = system(cmd);
    snprintf(path, sizeof path, "%s/err.txt", dir);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(err, 1, errlen - 1, f) : 0;
    err[n] = 0;
    if (f) fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool is_dev_null(void) {
    struct stat st;
    return lstat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 3;
}

// Root may replace anything: every output on the null device must leave it the device.
static void test_dev_null_survives(void **state) {
    (void)state;
    if (geteuid() != 0) skip(); // nobody else can replace it
    char args[2048], err[4096];
    const char *runs[] = {"train --weights %s/tiny_tied --steps 1 --json /dev/null --svg /dev/null --trace /dev/null "
                          "--timeline /dev/null --html /dev/null --dump-grads /dev/null --save-weights /dev/null",
                          "infer --weights %s/tiny_tied --new-tokens 2 --json /dev/null --svg /dev/null",
                          "plan --config %s/tiny_tied/config.json --json /dev/null --svg /dev/null",
                          "compare --config %s/tiny_tied/config.json --meta --json /dev/null --svg /dev/null"};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        assert_true(is_dev_null());
        snprintf(args, sizeof args, runs[i], MEMBILL_GOLDEN_DIR);
        int rc = membill(args, err, sizeof err);
        if (rc != 0) print_error("%s: exit %d: %s\n", args, rc, err);
        assert_int_equal(rc, 0);
        assert_true(is_dev_null());
    }
}

// One output that cannot be written: no output replaces what the user had.
static void test_outputs_all_or_none(void **state) {
    (void)state;
    char args[2048], err[4096], path[256];
    snprintf(path, sizeof path, "%s/keep.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("precious", f);
    fclose(f);
    snprintf(args, sizeof args, "train --weights %s/tiny_tied --json %s --timeline %s/keep.csv --svg %s/nowhere/c.svg",
             MEMBILL_GOLDEN_DIR, path, dir, dir);
    assert_int_equal(membill(args, err, sizeof err), 1);
    assert_non_null(strstr(err, "--svg"));
    assert_non_null(strstr(err, "nowhere"));
    assert_int_equal(strchr(err, '\n') - err + 1, (long)strlen(err)); // one line
    char *kept = slurp("keep.json");
    assert_string_equal(kept, "precious");
    free(kept);
    assert_null(slurp("keep.csv"));
}

// A replaced report keeps its mode, and a link to it stays a link.
static void test_replaced_file_keeps_mode_and_link(void **state) {
    (void)state;
    char args[2048], err[4096], path[256], link_path[256];
    snprintf(path, sizeof path, "%s/private.json", dir);
    snprintf(link_path, sizeof link_path, "%s/latest.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("old", f);
    fclose(f);
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(symlink("private.json", link_path), 0);
    snprintf(args, sizeof args, "train --weights %s/tiny_tied --json %s", MEMBILL_GOLDEN_DIR, link_path);
    assert_int_equal(membill(args, err, sizeof err), 0);
    struct stat st;
    assert_int_equal(lstat(link_path, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    json_t *r = json_load_file(path, 0, NULL);
    assert_non_null(r);
    assert_non_null(json_object_get(r, "categories"));
    json_decref(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_svg),
        cmocka_unit_test(test_trace),
        cmocka_unit_test(test_trace_slices),
        cmocka_unit_test(test_timeline_csv),
        cmocka_unit_test(test_text_breakdown_and_explain),
        cmocka_unit_test(test_categories_and_four_copies),
        cmocka_unit_test(test_html),
        cmocka_unit_test(test_dev_null_survives),
        cmocka_unit_test(test_outputs_all_or_none),
        cmocka_unit_test(test_replaced_file_keeps_mode_and_link),
    };
    return cmocka_run_group_tests_name("outputs", tests, run_once, clean_up);
}
