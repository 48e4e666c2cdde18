// Sharded checkpoints (model.safetensors.index.json): the tiny models split into 2 and 3 shards,
// the tensors dealt across them, give the same bill, loss, gradients and generated tokens as the
// single file; every broken index is refused with one line and exit code 1; a folder's
// config.json beside --model or --config is refused as a usage error.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <sys/stat.h>

#include "cli_run.h"
#include "model.h"
#include "shards_util.h"

static const char *const models[] = {"tiny_tied", "tiny_untied"};
#define TOKENS "5,9,17,33,65,129,250"

static int64_t peak(const json_t *root, const char *cat) {
    return json_integer_value(json_object_get(json_object_get(json_object_get(root, "categories"), cat), "peak_bytes"));
}

// train on the weights: the JSON report; the gradients in grads.
static json_t *train(const char *weights, const char *grads) {
    run_result r;
    char args[4096], json[1024];
    snprintf(json, sizeof json, "%s/t.json", cli_run_dir);
    snprintf(args, sizeof args, "train --weights %s --tokens " TOKENS " --steps 2 --json %s --dump-grads %s", weights,
             json, grads);
    membill(&r, args);
    if (r.code != 0) fail_msg("%s: %s", args, r.err);
    json_t *root = json_load_file(json, 0, NULL);
    assert_non_null(root);
    return root;
}

static void assert_same_files(const char *a, const char *b) {
    size_t na, nb;
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    assert_non_null(fa);
    assert_non_null(fb);
    static char ba[1 << 22], bb[1 << 22];
    na = fread(ba, 1, sizeof ba, fa);
    nb = fread(bb, 1, sizeof bb, fb);
    fclose(fa);
    fclose(fb);
    assert_true(na > 1000);
    assert_int_equal(na, nb);
    assert_memory_equal(ba, bb, na);
}

static void test_same_as_merged(void **state) {
    (void)state;
    const char *cats[] = {"weight", "gradient", "optimizer", "activation", "cache", "temporary"};
    for (size_t m = 0; m < 2; m++) {
        char merged[1024], g0[1024], g1[1024], dir[1024], p[1024];
        snprintf(merged, sizeof merged, "%s/%s", MEMBILL_GOLDEN_DIR, models[m]);
        json_t *want = train(merged, at(g0, cli_run_dir, "g0.safetensors"));
        for (int shards = 2; shards <= 3; shards++) {
            snprintf(dir, sizeof dir, "%s/%s_%d", cli_run_dir, models[m], shards);
            make_sharded(models[m], dir, shards, NULL);
            // the folder, and the index itself beside its config
            for (int how = 0; how < 2; how++) {
                char weights[4096];
                if (how == 0)
                    snprintf(weights, sizeof weights, "%s", dir);
                else
                    snprintf(weights, sizeof weights, "%s --config %s", at(p, dir, "model.safetensors.index.json"),
                             at(g1, dir, "config.json"));
                json_t *got = train(weights, at(g1, cli_run_dir, "g1.safetensors"));
                for (size_t c = 0; c < 6; c++) assert_int_equal(peak(got, cats[c]), peak(want, cats[c]));
                assert_true(json_equal(json_object_get(got, "loss"), json_object_get(want, "loss")));
                assert_true(json_real_value(json_object_get(got, "loss")) > 1.0);
                assert_int_equal(json_integer_value(json_object_get(json_object_get(got, "peak"), "total_bytes")),
                                 json_integer_value(json_object_get(json_object_get(want, "peak"), "total_bytes")));
                assert_same_files(g0, at(p, cli_run_dir, "g1.safetensors"));
                json_decref(got);
            }
        }
        json_decref(want);
    }
}

// The same generated tokens from a sharded folder.
static void test_infer_sharded(void **state) {
    (void)state;
    char dir[1024], args[4096];
    snprintf(dir, sizeof dir, "%s/infer_3", cli_run_dir);
    make_sharded("tiny_untied", dir, 3, NULL);
    run_result a, b;
    snprintf(args, sizeof args, "infer --weights %s/tiny_untied --tokens " TOKENS " --new-tokens 6",
             MEMBILL_GOLDEN_DIR);
    membill(&a, args);
    snprintf(args, sizeof args, "infer --weights %s --tokens " TOKENS " --new-tokens 6", dir);
    membill(&b, args);
    assert_int_equal(a.code, 0);
    assert_int_equal(b.code, 0);
    const char *ga = strstr(a.out, "row 0:"), *gb = strstr(b.out, "row 0:");
    assert_non_null(ga);
    assert_non_null(gb);
    assert_true(strcspn(ga, "\n") > 8);
    assert_memory_equal(ga, gb, strcspn(ga, "\n") + 1);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

// The index's text, edited: `from` replaced by `to` (once).
static void edit_text(const char *dir, const char *from, const char *to) {
    char p[1024];
    FILE *f = fopen(at(p, dir, "model.safetensors.index.json"), "rb");
    assert_non_null(f);
    static char text[1 << 16], out[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    char *hit = strstr(text, from);
    if (!hit) fail_msg("index lacks %s", from);
    snprintf(out, sizeof out, "%.*s%s%s", (int)(hit - text), text, to, hit + strlen(from));
    write_text(p, out);
}

static void expect_refused(const char *weights, const char *what, const char *const mention[3]) {
    run_result r;
    char args[4096];
    snprintf(args, sizeof args, "train --weights %s --tokens " TOKENS, weights);
    membill(&r, args);
    if (r.code != 1) fail_msg("%s: exit %d (%s)", what, r.code, r.err);
    assert_int_equal(count_lines(r.err), 1);
    for (int i = 0; i < 3 && mention[i]; i++)
        if (!strstr(r.err, mention[i])) fail_msg("%s: '%s' does not mention %s", what, r.err, mention[i]);
}

#define NORM "model.norm.weight"
#define SHARD2 "model-00002-of-00003.safetensors"

// An edit of the weight map (a jansson object), or of the index's text when from is set.
typedef struct {
    const char *what;
    const char *key;                   // the tensor whose entry changes; NULL: none
    json_t *(*value)(const char *old); // its new value (NULL: the entry goes)
    const char *from, *to;
    const char *mention[3];
} bad_case;

static json_t *outside(const char *old) {
    char buf[256];
    snprintf(buf, sizeof buf, "../%s", old);
    return json_string(buf);
}
static json_t *absolute(const char *old) { return (void)old, json_string("/etc/passwd"); }
static json_t *absent(const char *old) { return (void)old, json_string("model-00009-of-00003.safetensors"); }
static json_t *number(const char *old) { return (void)old, json_integer(7); }
static json_t *empty_name(const char *old) { return (void)old, json_string(""); }
static json_t *other_shard(const char *old) {
    return json_string(strcmp(old, SHARD2) == 0 ? "model-00001-of-00003.safetensors" : SHARD2);
}

static void apply(const char *dir, const bad_case *c) {
    if (c->from) return edit_text(dir, c->from, c->to);
    char p[1024];
    json_t *index = json_load_file(at(p, dir, "model.safetensors.index.json"), 0, NULL);
    assert_non_null(index);
    json_t *map = json_object_get(index, "weight_map");
    if (!c->key) {
        json_object_clear(map);
    } else if (c->value) {
        json_t *v = c->value(json_string_value(json_object_get(map, c->key)));
        json_object_set_new(map, c->key, v);
    } else {
        json_object_del(map, c->key);
    }
    assert_int_equal(json_dump_file(index, p, JSON_INDENT(2)), 0);
    json_decref(index);
}

static void test_broken_index(void **state) {
    (void)state;
    const bad_case cases[] = {
        {"outside the folder", NORM, outside, NULL, NULL, {"index.json", "../model-0000", "folder"}},
        {"an absolute path", NORM, absolute, NULL, NULL, {"/etc/passwd", "folder"}},
        {"an empty name", NORM, empty_name, NULL, NULL, {NORM, "folder"}},
        {"a missing shard", NORM, absent, NULL, NULL, {"shard model-00009-of-00003.safetensors", "No such file"}},
        {"a number for a file", NORM, number, NULL, NULL, {NORM, "not a string"}},
        {"a tensor in the wrong shard", NORM, other_shard, NULL, NULL, {NORM, "does not hold it"}},
        {"a tensor the map does not name", NORM, NULL, NULL, NULL, {NORM, "weight_map does not name"}},
        {"an empty weight map", NULL, NULL, NULL, NULL, {"index.json", "weight_map"}},
        {"a duplicated key",
         NULL,
         NULL,
         "\"weight_map\": {",
         "\"weight_map\": {\"" NORM "\": \"a\", ",
         {"index.json", "not valid JSON", "duplicate"}},
        {"no weight map", NULL, NULL, "\"weight_map\"", "\"weightmap\"", {"index.json", "weight_map"}},
        {"not JSON", NULL, NULL, "{", "[", {"index.json", "not valid JSON"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/bad_%zu", cli_run_dir, i);
        make_sharded("tiny_untied", dir, 3, NULL);
        apply(dir, &cases[i]);
        expect_refused(dir, cases[i].what, cases[i].mention);
    }
    // a parameter in no shard and not in the map
    char dir[1024], p[1024], q[1024];
    snprintf(dir, sizeof dir, "%s/bad_none", cli_run_dir);
    make_sharded("tiny_untied", dir, 3, NORM);
    expect_refused(dir, "a tensor in no shard", (const char *const[3]){NORM, "missing", "no shard"});
    // a tensor held by two shards: the first shard rewritten with one of the second's as well
    snprintf(dir, sizeof dir, "%s/bad_two", cli_run_dir);
    make_sharded("tiny_untied", dir, 2, NULL);
    llama_st_file *f = NULL, *g = NULL;
    ag_err err;
    assert_int_equal(llama_st_open(&f, at(p, dir, "model-00001-of-00002.safetensors"), &err), 0);
    assert_int_equal(llama_st_open(&g, at(q, dir, "model-00002-of-00002.safetensors"), &err), 0);
    const llama_st_tensor *list[64];
    const llama_st_file *from[64];
    size_t n = llama_st_count(f);
    for (size_t i = 0; i < n; i++) list[i] = llama_st_get(f, i), from[i] = f;
    list[n] = llama_st_get(g, 0), from[n] = g;
    char dup[256];
    snprintf(dup, sizeof dup, "%s", list[n]->name);
    write_tensors(at(q, dir, "new.safetensors"), list, from, n + 1);
    llama_st_close(g);
    llama_st_close(f);
    assert_int_equal(rename(q, p), 0);
    expect_refused(dir, "a tensor in two shards", (const char *const[3]){dup, "two shards"});
    // a shard that is not a safetensors file: named as a single file's fault is
    snprintf(dir, sizeof dir, "%s/bad_shard", cli_run_dir);
    make_sharded("tiny_untied", dir, 2, NULL);
    write_text(at(p, dir, "model-00002-of-00002.safetensors"), "1234");
    expect_refused(dir, "a short shard", (const char *const[3]){"model-00002-of-00002.safetensors", "too short"});
}

// A folder brings its config.json: naming the model again is a conflict, not a choice.
static void test_config_conflict(void **state) {
    (void)state;
    const char *extra[] = {"--model smollm2-135m", "--config " MEMBILL_GOLDEN_DIR "/tiny_tied/config.json"};
    for (int i = 0; i < 2; i++) {
        run_result r;
        char args[4096];
        snprintf(args, sizeof args, "train --weights %s/tiny_tied %s --tokens " TOKENS, MEMBILL_GOLDEN_DIR, extra[i]);
        membill(&r, args);
        assert_int_equal(r.code, 2);
        assert_int_equal(count_lines(r.err), 1);
        assert_non_null(strstr(r.err, "config.json"));
        assert_non_null(strstr(r.err, i ? "--config" : "--model"));
    }
    // a single file and --config: no conflict
    run_result r;
    char args[4096];
    snprintf(args, sizeof args,
             "train --weights %s/tiny_tied/model.safetensors --config %s/tiny_tied/config.json --tokens " TOKENS,
             MEMBILL_GOLDEN_DIR, MEMBILL_GOLDEN_DIR);
    membill(&r, args);
    assert_int_equal(r.code, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_as_merged),
        cmocka_unit_test(test_infer_sharded),
        cmocka_unit_test(test_broken_index),
        cmocka_unit_test(test_config_conflict),
    };
    return cmocka_run_group_tests(tests, cli_run_make_dir, cli_run_remove_dir);
}
