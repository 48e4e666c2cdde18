// Text in, text out: --prompt and --prompt-file through a tiny tokenizer.json made here, on the
// tiny golden model; end-of-text from config.json and generation_config.json; the refusals.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"
#include "tiny_tokenizer.h"
#include "tok.h"

#define dir cli_run_dir

// A model folder: the tiny golden model's config (eos_token_id set unless eos < 0) and weights,
// the tokenizer, and a generation_config.json when gen_eos >= 0.
static void make_folder(const char *name, int eos, int gen_eos) {
    char path[512], cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/%s && ln -sf %s/tiny_tied/model.safetensors %s/%s/model.safetensors", dir,
             name, MEMBILL_GOLDEN_DIR, dir, name);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/tiny_tied/config.json", MEMBILL_GOLDEN_DIR);
    json_t *cfg = json_load_file(path, 0, NULL);
    assert_non_null(cfg);
    if (eos >= 0) json_object_set_new(cfg, "eos_token_id", json_integer(eos));
    snprintf(path, sizeof path, "%s/%s/config.json", dir, name);
    assert_int_equal(json_dump_file(cfg, path, 0), 0);
    json_decref(cfg);
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", dir, name);
    write_tokenizer(path, -1);
    if (gen_eos < 0) return;
    json_t *gen = json_pack("{s:[i, i]}", "eos_token_id", gen_eos, gen_eos); // a repeat counts once
    snprintf(path, sizeof path, "%s/%s/generation_config.json", dir, name);
    assert_int_equal(json_dump_file(gen, path, 0), 0);
    json_decref(gen);
}

static void ids_of(json_t *row, int32_t *out, size_t n) {
    assert_int_equal(json_array_size(row), n);
    for (size_t i = 0; i < n; i++) out[i] = (int32_t)json_integer_value(json_array_get(row, i));
}

// "hello world": <|endoftext|>, hell, o, Ġw, or, l, d
static const int32_t hello[] = {EOT, 252, 'o', 253, 254, 'l', 'd'};

// "membill infer --weights DIR/folder --prompt 'hello world' --new-tokens N extra" into a.
static const char *hello_args(char *a, size_t len, const char *folder, int new_tokens, const char *extra) {
    snprintf(a, len, "infer --weights %s/%s --prompt 'hello world' --new-tokens %d %s", dir, folder, new_tokens, extra);
    return a;
}

static void test_prompt_in_text_out(void **state) {
    (void)state;
    make_folder("plain", -1, -1);
    char a[1024];
    json_t *root = cli_run_json(hello_args(a, sizeof a, "plain", 6, ""));
    int32_t got[7], gen[6];
    ids_of(json_array_get(json_object_get(root, "prompt_ids"), 0), got, 7);
    assert_memory_equal(got, hello, sizeof hello);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(root, "run"), "seq_len")), 7);
    ids_of(json_array_get(json_object_get(root, "generated"), 0), gen, 6);
    // the generated text is the tokenizer's decoding of the generated ids, special tokens left out
    char path[512], *text;
    size_t len;
    tok_err err;
    snprintf(path, sizeof path, "%s/plain/tokenizer.json", dir);
    char *file = NULL;
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(getdelim(&file, &len, 0, f) > 0, 1);
    fclose(f);
    tok_tokenizer *t = tok_parse(file, strlen(file), path, &err);
    free(file);
    assert_non_null(t);
    assert_int_equal(tok_decode(t, gen, 6, true, &text, &len, &err), 0);
    assert_string_equal(json_string_value(json_array_get(json_object_get(root, "generated_text"), 0)), text);
    free(text);
    tok_free(t);
    json_decref(root);
    // the same ids given as --tokens generate the same ids
    snprintf(a, sizeof a, "infer --weights %s/plain --tokens %d,252,111,253,254,108,100 --new-tokens 6", dir, EOT);
    root = cli_run_json(a);
    int32_t same[6];
    ids_of(json_array_get(json_object_get(root, "generated"), 0), same, 6);
    assert_memory_equal(same, gen, sizeof gen);
    assert_null(json_object_get(root, "prompt_ids"));
    json_decref(root);
    // the text report: the prompt's token count and each row's text
    run_result r;
    membill(&r, hello_args(a, sizeof a, "plain", 6, ""));
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "prompt: 7 tokens through "));
    assert_non_null(strstr(r.out, "  row 0 text: "));
}

// The index of the first generated id that equals the k-th one (where an eos there stops).
static size_t first_of(const int32_t *gen, size_t k) {
    size_t i = 0;
    while (gen[i] != gen[k]) i++;
    return i;
}

static void test_stops_at_end_of_text(void **state) {
    (void)state;
    make_folder("plain", -1, -1);
    char a[1024];
    json_t *root = cli_run_json(hello_args(a, sizeof a, "plain", 8, ""));
    int32_t gen[8];
    ids_of(json_array_get(json_object_get(root, "generated"), 0), gen, 8);
    json_decref(root);
    size_t stop = first_of(gen, 3); // make the 4th id (or an earlier copy of it) the end of text
    const char *names[] = {"eos_config", "eos_generation"};
    for (int k = 0; k < 2; k++) {
        make_folder(names[k], k == 0 ? gen[3] : -1, k == 1 ? gen[3] : -1);
        root = cli_run_json(hello_args(a, sizeof a, names[k], 8, ""));
        json_t *row = json_array_get(json_object_get(root, "generated"), 0);
        assert_int_equal(json_array_size(row), stop + 1);
        assert_int_equal(json_integer_value(json_array_get(row, stop)), gen[3]);
        json_decref(root);
        root = cli_run_json(hello_args(a, sizeof a, names[k], 8, "--ignore-eos"));
        assert_int_equal(json_array_size(json_array_get(json_object_get(root, "generated"), 0)), 8);
        json_decref(root);
    }
    // the decode phase billed only the steps that ran
    run_result r;
    membill(&r, hello_args(a, sizeof a, "eos_config", 8, ""));
    assert_int_equal(r.code, 0);
    char line[160];
    snprintf(line, sizeof line, "generation stopped after %zu of 8 tokens", stop + 1);
    if (stop + 1 < 8) assert_non_null(strstr(r.out, line));
}

static json_int_t activation_peak(json_t *root) {
    json_t *c = json_object_get(json_object_get(root, "categories"), "activation");
    return json_integer_value(json_object_get(c, "peak_bytes"));
}

static void test_prompt_file_train_and_meta(void **state) {
    (void)state;
    make_folder("plain", -1, -1);
    char a[1024], path[512];
    snprintf(path, sizeof path, "%s/prompt.txt", dir);
    FILE *f = fopen(path, "w");
    fputs("hello world", f);
    fclose(f);
    snprintf(a, sizeof a, "train --weights %s/plain --prompt-file %s --batch 2", dir, path);
    json_t *root = cli_run_json(a);
    json_t *rows = json_object_get(root, "prompt_ids");
    assert_int_equal(json_array_size(rows), 2);
    for (size_t b = 0; b < 2; b++) {
        int32_t got[7];
        ids_of(json_array_get(rows, b), got, 7);
        assert_memory_equal(got, hello, sizeof hello);
    }
    assert_true(json_is_real(json_object_get(root, "loss")));
    json_int_t real_peak = activation_peak(root);
    json_decref(root);
    // meta mode with the config's folder's tokenizer: the same token count, the same bill
    snprintf(a, sizeof a, "train --meta --config %s/plain/config.json --prompt 'hello world' --batch 2", dir);
    root = cli_run_json(a);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(root, "run"), "seq_len")), 7);
    assert_int_equal(json_array_size(json_object_get(root, "prompt_ids")), 2);
    assert_int_equal(activation_peak(root), real_peak);
    json_decref(root);
    snprintf(a, sizeof a, "compare --weights %s/plain --prompt 'hello world' --new-tokens 2", dir);
    root = cli_run_json(a);
    assert_int_equal(json_array_size(json_array_get(json_object_get(root, "prompt_ids"), 0)), 7);
    json_decref(root);
}

static void refused(const char *args, int code, const char *expect) {
    run_result r;
    membill(&r, args);
    if (r.code != code || !strstr(r.err, expect) || count_lines(r.err) != 1)
        fail_msg("%s: exit %d, stderr '%s' (expected %d and '%s')", args, r.code, r.err, code, expect);
}

static void test_prompt_refusals(void **state) {
    (void)state;
    make_folder("plain", -1, -1);
    char path[512], cmd[1200];
    snprintf(path, sizeof path, "%s/broken.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/wide.json", dir);
    write_tokenizer(path, 300); // ids past the model's 256
    snprintf(cmd, sizeof cmd, "ln -sf %s/tiny_tied %s/golden", MEMBILL_GOLDEN_DIR, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "printf 'a\\377b' >%1$s/bad_utf8.txt && : >%1$s/empty.txt", dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/bare.json", dir); // no template: an empty text gives no ids
    f = fopen(path, "w");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", f);
    fclose(f);
    // %1$s: the test's folder
    const struct {
        const char *args;
        int code;
        const char *expect;
    } cases[] = {
        {"infer --weights %1$s/plain --prompt hi --tokens 1,2", 2,
         "--prompt, --prompt-file and --tokens each give the input: give one"},
        {"train --weights %1$s/golden --prompt hi", 1,
         "a prompt needs a tokenizer: --tokenizer FILE, or tokenizer.json in the model folder"},
        {"train --prompt hi", 2, "a prompt needs a tokenizer: --tokenizer FILE, or a --weights folder"},
        {"train --tokenizer %1$s/plain/tokenizer.json", 2, "--tokenizer reads --prompt or --prompt-file"},
        {"train --weights %1$s/plain --tokenizer %1$s/broken.json --prompt hi", 1,
         "broken.json: model.merges[0]: 'a', 'b' or their merge is not in the vocabulary"},
        {"train --weights %1$s/plain --prompt-file %1$s/missing.txt", 1,
         "missing.txt: cannot open: No such file or directory"},
        // the command line alone: an invalid UTF-8 --prompt, as an empty one, is a usage error;
        // the same bytes in a file are bad data
        {"train --weights %1$s/plain --prompt \"$(printf 'a\\377b')\"", 2, "--prompt: byte 1 is not valid UTF-8"},
        {"train --weights %1$s/plain --prompt ''", 2, "--prompt needs a TEXT"},
        {"train --weights %1$s/plain --prompt-file %1$s/bad_utf8.txt", 1,
         "bad_utf8.txt: text: byte 1 is not valid UTF-8"},
        {"train --weights %1$s/plain --prompt-file %1$s/empty.txt --tokenizer %1$s/bare.json", 1,
         "empty.txt: the prompt gives no tokens"},
        {"train --weights %1$s/plain --prompt 'hello world' --seq-len 5", 1,
         "the prompt gives 7 ids but --seq-len says 5"},
        {"train --weights %1$s/plain --tokens 1,2,3 --seq-len 5", 2, "--tokens gives 3 ids but --seq-len says 5"},
        // the same id past the vocabulary, from a prompt or from --tokens, is bad data alike
        {"train --weights %1$s/plain --tokenizer %1$s/wide.json --prompt 'a<x>'", 1,
         "the prompt's token 2 is id 300, past the model's 256 ids (vocab_size)"},
        {"train --weights %1$s/plain --tokens 1,300", 1, "--tokens: item 2 is id 300, past the model's 256 ids"},
        {"infer --weights %1$s/plain --tokens '1;2,300'", 1, "--tokens: item 2 is id 300, past the model's 256 ids"},
        {"train --weights %1$s/plain --tokens 1,2147483647", 2, "item 2 is id 2147483647, past any vocabulary"},
        {"train --weights %1$s/plain --tokens 99999999999", 2, "item 1 is id 99999999999, past any vocabulary"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char a[1024];
        snprintf(a, sizeof a, cases[i].args, dir);
        refused(a, cases[i].code, cases[i].expect);
    }
}

// A file membill reads that is a FIFO with no writer, or a device, is refused at once, naming
// what it is: the model folder's tokenizer.json and generation_config.json, --tokenizer,
// --prompt-file, --config, an adapter's adapter_config.json.
static void test_fifos_and_devices(void **state) {
    (void)state;
    char cmd[2048];
    const char *const kinds[] = {"fifo", "device"};
    for (int k = 0; k < 2; k++) {
        const char *what = k ? "(it is a character device)" : "(it is a FIFO)";
        make_folder(kinds[k], -1, -1);
        // %1$s the test's folder, %2$s the kind's folder
        snprintf(cmd, sizeof cmd,
                 k ? "cd %1$s && ln -sf /dev/zero special && ln -sf /dev/zero %2$s/generation_config.json && mkdir -p "
                     "adapter_%2$s && ln -sf /dev/zero adapter_%2$s/adapter_config.json"
                   : "cd %1$s && rm -f special && mkfifo special %2$s/generation_config.json && mkdir -p adapter_%2$s "
                     "&& mkfifo adapter_%2$s/adapter_config.json",
                 dir, kinds[k]);
        assert_int_equal(system(cmd), 0);
        const struct {
            const char *args, *expect;
        } cases[] = {
            {"infer --weights %1$s/%2$s --new-tokens 2", "%2$s/generation_config.json: not a regular file "},
            {"infer --weights %1$s/%2$s --prompt hi --ignore-eos --tokenizer %1$s/special", "--tokenizer %1$s/special: "
                                                                                            "not a regular file "},
            {"train --weights %1$s/%2$s --prompt-file %1$s/special", "--prompt-file %1$s/special: not a regular file "},
            {"train --config %1$s/special --meta", "%1$s/special: not a regular file "},
            {"train --weights %1$s/%2$s --adapter %1$s/adapter_%2$s", "adapter_%2$s/adapter_config.json: not a "
                                                                      "regular file "},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            char a[1024], e[1024];
            snprintf(a, sizeof a, cases[i].args, dir, kinds[k]);
            snprintf(e, sizeof e, cases[i].expect, dir, kinds[k]);
            strcat(e, what);
            run_result r;
            membill_within(&r, 60, a);
            if (r.code != 1 || !strstr(r.err, e) || count_lines(r.err) != 1)
                fail_msg("%s: exit %d, stderr '%s' (expected 1 and '%s')", a, r.code, r.err, e);
        }
        // the folder's tokenizer.json in place: said to be what it is, not absent
        snprintf(cmd, sizeof cmd, "cd %1$s/%2$s && rm -f tokenizer.json generation_config.json && %3$s", dir, kinds[k],
                 k ? "ln -s /dev/zero tokenizer.json" : "mkfifo tokenizer.json");
        assert_int_equal(system(cmd), 0);
        char a[1024], e[1024];
        snprintf(a, sizeof a, "train --weights %s/%s --prompt hi", dir, kinds[k]);
        snprintf(e, sizeof e, "%s/%s/tokenizer.json: not a regular file %s", dir, kinds[k], what);
        run_result r;
        membill_within(&r, 60, a);
        if (r.code != 1 || !strstr(r.err, e) || strstr(r.err, "has none"))
            fail_msg("%s: exit %d, stderr '%s' (expected 1 and '%s')", a, r.code, r.err, e);
    }
}

// The end-of-text ids of config.json and generation_config.json: anything but ids of the
// vocabulary is refused, naming the file and the field; --ignore-eos reads neither.
static void test_end_of_text_refused(void **state) {
    (void)state;
    make_folder("eos", -1, -1);
    const struct {
        const char *file, *text, *expect;
    } cases[] = {
        {"generation_config.json", "not json", "generation_config.json: not valid JSON (line 1, column"},
        {"generation_config.json", "[2]", "generation_config.json: expected a JSON object"},
        {"generation_config.json", "{\"eos_token_id\": \"2\"}",
         "generation_config.json: field eos_token_id must be a token id or a list of them (it is a string)"},
        {"generation_config.json", "{\"eos_token_id\": -1}",
         "generation_config.json: field eos_token_id (-1) must be a token id from 0 to 255 (vocab_size 256)"},
        {"generation_config.json", "{\"eos_token_id\": 2.0}",
         "generation_config.json: field eos_token_id must be a token id or a list of them (it is a real number)"},
        {"generation_config.json", "{\"eos_token_id\": [1, 256]}",
         "generation_config.json: field eos_token_id[1] (256) must be a token id from 0 to 255"},
        {"generation_config.json", "{\"eos_token_id\": [[1, 2]]}",
         "generation_config.json: field eos_token_id[0] must be a token id, an integer (it is an array)"},
        {"config.json", "{\"eos_token_id\": [1, 2.5]}",
         "config.json: field eos_token_id[1] must be a token id, an integer (it is a real number)"},
        {"config.json", "{\"eos_token_id\": 99999999999}", "config.json: field eos_token_id (99999999999) must be"},
    };
    char path[512], a[1024];
    snprintf(a, sizeof a, "infer --weights %s/eos --new-tokens 2", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        make_folder("eos", -1, -1);
        snprintf(path, sizeof path, "%s/eos/%s", dir, cases[i].file);
        if (!strcmp(cases[i].file, "config.json")) { // the tiny model's config with that field
            json_t *cfg = json_load_file(path, 0, NULL), *extra = json_loads(cases[i].text, 0, NULL);
            assert_non_null(cfg);
            assert_non_null(extra);
            json_object_update(cfg, extra);
            assert_int_equal(json_dump_file(cfg, path, 0), 0);
            json_decref(cfg);
            json_decref(extra);
        } else {
            FILE *f = fopen(path, "w");
            fputs(cases[i].text, f);
            fclose(f);
        }
        refused(a, 1, cases[i].expect);
        char ignored[1100];
        snprintf(ignored, sizeof ignored, "%s --ignore-eos --quiet", a);
        run_result r;
        membill(&r, ignored);
        assert_int_equal(r.code, 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_in_text_out),         cmocka_unit_test(test_stops_at_end_of_text),
        cmocka_unit_test(test_prompt_file_train_and_meta), cmocka_unit_test(test_prompt_refusals),
        cmocka_unit_test(test_fifos_and_devices),          cmocka_unit_test(test_end_of_text_refused),
    };
    return cmocka_run_group_tests(tests, cli_run_make_dir, cli_run_remove_dir);
}
