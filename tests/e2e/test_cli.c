// The membill command end to end: the bill of a real run, and bad input turned away cleanly.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model.h"

static char dir[64];

static int make_dir(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/membill_cli_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

typedef struct {
    int code;
    char out[16384], err[4096];
} run_result;

static void slurp(const char *path, char *buf, size_t n) {
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t k = fread(buf, 1, n - 1, f);
    buf[k] = 0;
    fclose(f);
}

// Runs membill with the arguments; captures its exit code, stdout and stderr.
static void membill(run_result *r, const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s >%s/out 2>%s/err", MEMBILL_BIN, args, dir, dir);
    int st = system(cmd);
    r->code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    char p[512];
    snprintf(p, sizeof p, "%s/out", dir);
    slurp(p, r->out, sizeof r->out);
    snprintf(p, sizeof p, "%s/err", dir);
    slurp(p, r->err, sizeof r->err);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static json_int_t cat_peak(json_t *root, const char *cat) {
    return json_integer_value(json_object_get(json_object_get(json_object_get(root, "categories"), cat), "peak_bytes"));
}

static void assert_all_live_zero(json_t *root) {
    const char *cats[] = {"weight", "gradient", "optimizer", "activation", "cache"};
    for (int i = 0; i < 5; i++) {
        json_t *c = json_object_get(json_object_get(root, "categories"), cats[i]);
        assert_int_equal(json_integer_value(json_object_get(c, "live_bytes")), 0);
    }
    assert_true(json_is_true(json_object_get(root, "teardown_all_zero")));
}

static void test_smollm2_training_step_bill(void **state) {
    (void)state;
    run_result r;
    char args[2048];
    snprintf(args, sizeof args, "train --json %s/real.json --quiet", dir);
    membill(&r, args);
    assert_int_equal(r.code, 0);
    char path[512];
    snprintf(path, sizeof path, "%s/real.json", dir);
    json_t *real = json_load_file(path, 0, NULL);
    assert_non_null(real);
    // The four copies, to the byte (134,515,008 parameters x 4 bytes).
    assert_int_equal(cat_peak(real, "weight"), 538060032);
    assert_int_equal(cat_peak(real, "gradient"), 538060032);
    assert_int_equal(cat_peak(real, "optimizer"), 1076120064);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(real, "four_copies"), "total_bytes")),
                     2152240128LL);
    assert_true(cat_peak(real, "activation") > 4915200); // at least the logits
    double loss = json_real_value(json_object_get(real, "loss"));
    assert_true(fabs(loss - log(49152.0)) < 0.5);
    assert_true(json_is_true(json_object_get(json_object_get(real, "jemalloc"), "agrees")));
    assert_all_live_zero(real);

    // Meta mode runs the same code on shapes alone: the same bill, to the byte.
    snprintf(args, sizeof args, "train --meta --json %s/meta.json --quiet", dir);
    membill(&r, args);
    assert_int_equal(r.code, 0);
    snprintf(path, sizeof path, "%s/meta.json", dir);
    json_t *meta = json_load_file(path, 0, NULL);
    assert_non_null(meta);
    const char *cats[] = {"weight", "gradient", "optimizer", "activation", "cache"};
    for (int i = 0; i < 5; i++) assert_int_equal(cat_peak(meta, cats[i]), cat_peak(real, cats[i]));
    json_decref(real);
    json_decref(meta);
}

static void test_tiny_model_outputs(void **state) {
    (void)state;
    run_result r;
    char args[2048];
    snprintf(args, sizeof args,
             "train --weights %s/tiny_tied --tokens 5,9,17,33,65,129,250 --steps 2 --json %s/t.json "
             "--dump-grads %s/g.safetensors --save-weights %s/w.safetensors --timeline %s/t.csv",
             MEMBILL_GOLDEN_DIR, dir, dir, dir, dir);
    membill(&r, args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "four copies"));
    char path[512];
    snprintf(path, sizeof path, "%s/t.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    assert_int_equal(json_array_size(json_object_get(json_object_get(root, "timing"), "steps")), 2);
    assert_all_live_zero(root);
    json_decref(root);

    llama_config cfg;
    llama_err err;
    snprintf(path, sizeof path, "%s/tiny_tied/config.json", MEMBILL_GOLDEN_DIR);
    assert_int_equal(llama_config_load(&cfg, path, &err), 0);
    const char *files[] = {"g.safetensors", "w.safetensors"};
    for (int i = 0; i < 2; i++) {
        llama_st_file *f = NULL;
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        assert_int_equal(llama_st_open(&f, path, &err), 0);
        assert_int_equal(llama_st_check_params(f, &cfg, false, &err), 0);
        llama_st_close(f);
    }
    // The timeline's rows end with every category back at zero.
    snprintf(path, sizeof path, "%s/t.csv", dir);
    char csv[1 << 14];
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char line[1024], last[1024] = "";
    fgets(csv, sizeof csv, fp);
    assert_non_null(strstr(csv, "weight_live"));
    while (fgets(line, sizeof line, fp)) strcpy(last, line);
    fclose(fp);
    assert_non_null(strstr(last, ",0,0,0,0,0,"));
}

// Each bad input: the expected exit code, one line on stderr naming the culprit, and nothing
// written in place of what the user had.
static void expect_failure(const char *args, int code, const char *needle) {
    run_result r;
    membill(&r, args);
    if (r.code != code || count_lines(r.err) != 1 || !strstr(r.err, needle))
        print_error("args: %s\nexit %d\nstderr: %s\n", args, r.code, r.err);
    assert_int_equal(r.code, code);
    assert_int_equal(count_lines(r.err), 1);
    assert_non_null(strstr(r.err, needle));
}

static void write_file(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void test_bad_input(void **state) {
    (void)state;
    char a[2048];
    expect_failure("train --frobnicate", 2, "--frobnicate");
    expect_failure("train --steps 0", 2, "--steps");
    expect_failure("train --seq-len many", 2, "--seq-len");
    expect_failure("train --optimizer lion", 2, "lion");
    expect_failure("train --budget lots", 2, "--budget");
    expect_failure("fly", 2, "fly");
    expect_failure("train --model gpt-5", 1, "gpt-5");
    expect_failure("train --config /nonexistent/config.json", 1, "/nonexistent/config.json");
    write_file("broken.json", "{\"model_type\": \"llama\", \"hidden_size\": ");
    snprintf(a, sizeof a, "train --config %s/broken.json", dir);
    expect_failure(a, 1, "broken.json");
    write_file("nokv.json", "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                            " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 3,"
                            " \"vocab_size\": 100}");
    snprintf(a, sizeof a, "train --config %s/nokv.json", dir);
    expect_failure(a, 1, "num_key_value_heads");
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --tokens 1,2,300", MEMBILL_GOLDEN_DIR);
    expect_failure(a, 1, "token id 300");
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --tokens 1,x,3", MEMBILL_GOLDEN_DIR);
    expect_failure(a, 1, "--tokens");
    write_file("bad.safetensors", "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":1}");
    snprintf(a, sizeof a, "train --config %s/tiny_tied/config.json --weights %s/bad.safetensors", MEMBILL_GOLDEN_DIR, dir);
    expect_failure(a, 1, "bad.safetensors");
    expect_failure("train --meta --dump-grads x.safetensors", 2, "--meta");

    // A failed run leaves the user's files as they were.
    write_file("keep.json", "precious");
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --tokens 1,2,300 --json %s/keep.json", MEMBILL_GOLDEN_DIR, dir);
    expect_failure(a, 1, "token id");
    char path[512], buf[64];
    snprintf(path, sizeof path, "%s/keep.json", dir);
    slurp(path, buf, sizeof buf);
    assert_string_equal(buf, "precious");
    // An output that cannot be written: a clear line, no partial file.
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --json /nonexistent/out.json", MEMBILL_GOLDEN_DIR);
    expect_failure(a, 1, "/nonexistent/out.json");
}

static void test_budget_stops_the_run(void **state) {
    (void)state;
    run_result r;
    char a[2048];
    // The tiny tied model's weights are 410,880 bytes; a 500 kB budget fits them, not training.
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --budget 500kB --json %s/b.json", MEMBILL_GOLDEN_DIR, dir);
    membill(&r, a);
    assert_int_equal(r.code, 1);
    assert_int_equal(count_lines(r.err), 1);
    assert_non_null(strstr(r.out, "OUT OF BUDGET"));
    char path[512];
    snprintf(path, sizeof path, "%s/b.json", dir);
    assert_int_equal(access(path, F_OK), -1);
}

static json_t *plan_json(const char *args) {
    run_result r;
    char a[2048], path[512];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    snprintf(a, sizeof a, "plan %s --json %s", args, path);
    membill(&r, a);
    if (r.code != 0) print_error("plan %s: exit %d: %s\n", args, r.code, r.err);
    assert_int_equal(r.code, 0);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    return root;
}

static json_int_t jint(json_t *root, const char *obj, const char *key) {
    return json_integer_value(json_object_get(json_object_get(root, obj), key));
}

// The closed form follows the meta bill within 1% from the smallest preset to 405B and from
// 25 to 8,192 tokens; weights, gradients and Adam state exactly.
static void test_plan_closed_form_sweep(void **state) {
    (void)state;
    const char *models[] = {"smollm2-135m", "smollm2-360m", "llama-2-7b", "mistral-7b", "llama-3-70b", "llama-3.1-405b"};
    const char *lens[] = {"25", "1024", "4096", "8192"};
    for (int m = 0; m < 6; m++)
        for (int l = 0; l < 4; l++) {
            char a[256];
            if (l == 3 && m == 2) continue; // Llama-2 has 4,096 positions
            snprintf(a, sizeof a, "--model %s --seq-len %s --batch 2", models[m], lens[l]);
            json_t *root = plan_json(a);
            json_int_t p = jint(root, "closed_form", "parameters");
            assert_int_equal(cat_peak(root, "weight"), 4 * p);
            assert_int_equal(cat_peak(root, "gradient"), 4 * p);
            assert_int_equal(cat_peak(root, "optimizer"), 8 * p);
            double meta = (double)cat_peak(root, "activation"), closed = (double)jint(root, "closed_form", "activation");
            if (fabs(closed / meta - 1) > 0.01) print_error("%s: closed %g meta %g\n", a, closed, meta);
            assert_true(fabs(closed / meta - 1) <= 0.01);
            json_decref(root);
        }
}

static void test_plan_zero_and_fit(void **state) {
    (void)state;
    json_t *root = plan_json("--model llama-2-70b --gpus 8 --zero 3");
    json_int_t w = 4 * 68976648192LL;
    assert_int_equal(cat_peak(root, "weight"), w);
    assert_int_equal(jint(root, "per_gpu", "weight"), (w + 7) / 8);
    assert_int_equal(jint(root, "per_gpu", "optimizer"), (2 * w + 7) / 8);
    json_decref(root);
    root = plan_json("--model llama-2-70b --gpus 8 --zero 1");
    assert_int_equal(jint(root, "per_gpu", "weight"), w);
    assert_int_equal(jint(root, "per_gpu", "gradient"), w);
    assert_int_equal(jint(root, "per_gpu", "optimizer"), (2 * w + 7) / 8);
    json_decref(root);

    // The largest batch that fits 8 GB does fit, and one more does not.
    root = plan_json("--model smollm2-135m --device-memory 8GB");
    json_int_t best = jint(root, "fit", "largest_batch");
    assert_true(best > 1);
    json_decref(root);
    char a[128];
    snprintf(a, sizeof a, "--model smollm2-135m --device-memory 8GB --batch %lld", (long long)best);
    root = plan_json(a);
    assert_true(jint(root, "per_gpu", "total_bytes") <= 8000000000LL);
    json_decref(root);
    snprintf(a, sizeof a, "--model smollm2-135m --device-memory 8GB --batch %lld", (long long)best + 1);
    root = plan_json(a);
    assert_true(jint(root, "per_gpu", "total_bytes") > 8000000000LL);
    assert_true(json_is_false(json_object_get(json_object_get(root, "fit"), "fits")));
    json_decref(root);
}

// The golden greedy tokens of the PyTorch reference, and the prompt they came from.
static void golden_tokens(const char *key, int64_t *out, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/tiny_tied/golden.safetensors", MEMBILL_GOLDEN_DIR);
    llama_st_file *f = NULL;
    llama_err err;
    assert_int_equal(llama_st_open(&f, path, &err), 0);
    const llama_st_tensor *t = llama_st_find(f, key);
    assert_non_null(t);
    assert_true(t->numel >= n);
    int64_t *all = calloc(t->numel, sizeof *all);
    assert_int_equal(llama_st_read_i64(f, t, all, t->numel, &err), 0);
    memcpy(out, all, n * sizeof *out);
    free(all);
    llama_st_close(f);
}

static json_t *json_run(const char *args) {
    run_result r;
    char a[2048], path[512];
    snprintf(path, sizeof path, "%s/run.json", dir);
    snprintf(a, sizeof a, "%s --json %s --quiet", args, path);
    membill(&r, a);
    if (r.code != 0) print_error("%s: exit %d: %s\n", args, r.code, r.err);
    assert_int_equal(r.code, 0);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    return root;
}

static void test_infer_matches_reference(void **state) {
    (void)state;
    int64_t ids[14], greedy[8], batch[16];
    golden_tokens("input_ids", ids, 14);
    golden_tokens("greedy", greedy, 8);
    golden_tokens("greedy_batch", batch, 16);
    char prompt[256] = "", second[256] = "", a[1024];
    for (int i = 0; i < 7; i++) snprintf(prompt + strlen(prompt), 16, "%s%lld", i ? "," : "", (long long)ids[i]);
    for (int i = 0; i < 4; i++) snprintf(second + strlen(second), 16, "%s%lld", i ? "," : "", (long long)ids[7 + i]);
    const char *modes[] = {"", "--no-cache"};
    for (int m = 0; m < 2; m++) {
        snprintf(a, sizeof a, "infer --weights %s/tiny_tied --tokens %s --new-tokens 8 %s", MEMBILL_GOLDEN_DIR, prompt, modes[m]);
        json_t *root = json_run(a);
        json_t *row = json_array_get(json_object_get(root, "generated"), 0);
        assert_int_equal(json_array_size(row), 8);
        for (int t = 0; t < 8; t++) assert_int_equal(json_integer_value(json_array_get(row, t)), greedy[t]);
        assert_true(json_is_true(json_object_get(root, "teardown_all_zero")));
        json_decref(root);
    }
    // Two prompts of different lengths, left-padded into one batch.
    snprintf(a, sizeof a, "infer --weights %s/tiny_tied --tokens '%s;%s' --new-tokens 8", MEMBILL_GOLDEN_DIR, prompt, second);
    json_t *root = json_run(a);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 8; t++)
            assert_int_equal(json_integer_value(json_array_get(json_array_get(json_object_get(root, "generated"), b), t)),
                             batch[b * 8 + t]);
    json_decref(root);
}

static void test_infer_cache_bill(void **state) {
    (void)state;
    json_t *root = json_run("infer --meta --new-tokens 2");
    json_t *cache = json_object_get(root, "cache");
    assert_int_equal(json_integer_value(json_object_get(cache, "bytes_per_token")), 46080);
    assert_int_equal(json_integer_value(json_object_get(cache, "after_prefill_bytes")), 1152000);
    assert_int_equal(json_integer_value(json_object_get(cache, "final_bytes")), 1152000 + 46080);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(cache, "shape_final"), 2)), 26);
    assert_int_equal(cat_peak(root, "weight"), 538060032);
    assert_int_equal(cat_peak(root, "gradient"), 0);
    assert_int_equal(cat_peak(root, "optimizer"), 0);
    assert_int_equal(cat_peak(root, "cache"), 1152000 + 46080);
    json_decref(root);
}

static void test_compare(void **state) {
    (void)state;
    json_t *root = json_run("compare --meta --svg /dev/null");
    json_t *tr = json_object_get(json_object_get(root, "train"), "categories");
    json_t *in = json_object_get(json_object_get(root, "infer"), "categories");
    assert_int_equal(json_integer_value(json_object_get(tr, "optimizer")), 1076120064);
    assert_int_equal(json_integer_value(json_object_get(in, "optimizer")), 0);
    assert_int_equal(json_integer_value(json_object_get(in, "weight")), 538060032);
    assert_true(json_integer_value(json_object_get(in, "cache")) > 0);
    double ratio = json_real_value(json_object_get(root, "ratio"));
    assert_true(ratio > 3.5 && ratio < 4.1); // four copies against one, plus what each adds
    json_decref(root);
}

static void test_check_memory_claims(void **state) {
    (void)state;
    json_t *root = json_run("check --no-speed");
    json_t *rows = json_object_get(root, "claims");
    assert_int_equal(json_array_size(rows), 18);
    assert_int_equal(json_integer_value(json_object_get(root, "failed")), 0);
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) assert_true(json_is_true(json_object_get(row, "pass")));
    json_decref(root);
}

// The whole check, speed claims included (real runs of SmolLM2-135M).
static void test_check_all_claims(void **state) {
    (void)state;
    json_t *root = json_run("check");
    assert_int_equal(json_array_size(json_object_get(root, "claims")), 21);
    assert_int_equal(json_integer_value(json_object_get(root, "failed")), 0);
    json_decref(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_model_outputs),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_budget_stops_the_run),
        cmocka_unit_test(test_plan_closed_form_sweep),
        cmocka_unit_test(test_plan_zero_and_fit),
        cmocka_unit_test(test_infer_matches_reference),
        cmocka_unit_test(test_infer_cache_bill),
        cmocka_unit_test(test_compare),
        cmocka_unit_test(test_check_memory_claims),
    };
    const struct CMUnitTest heavy[] = {
        cmocka_unit_test(test_smollm2_training_step_bill),
        cmocka_unit_test(test_check_all_claims),
    };
    int only_heavy = getenv("MEMBILL_HEAVY") != NULL;
    return only_heavy ? cmocka_run_group_tests_name("smollm2", heavy, make_dir, remove_dir)
                      : cmocka_run_group_tests_name("cli", tests, make_dir, remove_dir);
}
