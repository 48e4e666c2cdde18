// The pictures and breakdowns stand on the same numbers as the JSON report.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
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
    free(svg);
}

static void test_trace(void **state) {
    (void)state;
    char path[256];
    snprintf(path, sizeof path, "%s/t.json", dir);
    json_t *t = json_load_file(path, 0, NULL);
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
    int equal = 0;
    for (const char *p = e; (p = strstr(p, "(equal)")); p++) equal++;
    assert_int_equal(equal, 3);
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

static void test_html(void **state) {
    (void)state;
    char *html = slurp("p.html");
    assert_non_null(html);
    assert_non_null(strstr(html, "<svg"));
    assert_non_null(strstr(html, "four copies"));
    assert_non_null(strstr(html, "held at the total peak"));
    assert_non_null(strstr(html, "Reading the bill"));
    assert_non_null(strstr(html, "<b>temporary</b>"));
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
