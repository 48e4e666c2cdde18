// LoRA and QLoRA on the command line, on the tiny untied model: --save-adapter writes PEFT's two
// files, --adapter trains on them (the loaded adapters go on where the saved run stopped) and
// generates with them, compare --lora runs its four sides for real, a real QLoRA run bills what
// its meta run bills, and every refusal is one line with its exit code.
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

#include "cli_run.h"

#define TINY                                                                                                           \
    "--config " MEMBILL_GOLDEN_DIR "/tiny_untied/config.json --weights " MEMBILL_GOLDEN_DIR                            \
    "/tiny_untied/model.safetensors"
#define LORA "--lora-rank 4 --lora-alpha 8 --lora-targets all-linear"

static run_result r;

static double loss_of_step(json_t *root, size_t k) {
    json_t *st = json_array_get(json_object_get(root, "steps"), k);
    assert_non_null(st);
    return json_real_value(json_object_get(st, "loss"));
}

static json_int_t peak_of(json_t *cats, const char *cat) {
    return json_integer_value(json_object_get(json_object_get(cats, cat), "peak_bytes"));
}

// Saved after one step, loaded by a second run: that run's first loss is the loss of a
// two-step run's second step (the same tokens, the adapters where the first step left them).
static void test_save_then_train_on(void **s) {
    (void)s;
    char args[2048], path[512];
    snprintf(args, sizeof args, "train " TINY " " LORA " --steps 2");
    json_t *two = cli_run_json(args);
    snprintf(args, sizeof args, "train " TINY " " LORA " --save-adapter %s/ad", cli_run_dir);
    json_decref(cli_run_json(args));
    snprintf(path, sizeof path, "%s/ad/adapter_model.safetensors", cli_run_dir);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size > 0);
    snprintf(path, sizeof path, "%s/ad/adapter_config.json", cli_run_dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    assert_non_null(cfg);
    assert_int_equal(json_integer_value(json_object_get(cfg, "r")), 4);
    assert_true(json_number_value(json_object_get(cfg, "lora_alpha")) == 8.0);
    assert_int_equal(json_array_size(json_object_get(cfg, "target_modules")), 7);
    assert_string_equal(json_string_value(json_object_get(cfg, "peft_type")), "LORA");
    json_decref(cfg);
    // rank, alpha and targets from the file
    snprintf(args, sizeof args, "train " TINY " --adapter %s/ad", cli_run_dir);
    json_t *on = cli_run_json(args);
    json_t *lora = json_object_get(on, "lora");
    assert_int_equal(json_integer_value(json_object_get(lora, "rank")), 4);
    assert_int_equal(json_integer_value(json_object_get(lora, "trainable_params")),
                     json_integer_value(json_object_get(json_object_get(two, "lora"), "trainable_params")));
    double want = loss_of_step(two, 1), got = loss_of_step(on, 0);
    if (!(fabs(got - want) <= 1e-6 * fabs(want))) fail_msg("loss on the saved adapter %.9g, step 2 %.9g", got, want);
    assert_true(loss_of_step(two, 0) != want); // the step moved the adapters
    json_decref(on);
    json_decref(two);
}

// Generating with an adapter: a non-zero B (the golden adapter) changes what the model says.
static void test_infer_with_adapter(void **s) {
    (void)s;
    json_t *plain = cli_run_json("infer " TINY " --new-tokens 12");
    json_t *adapted = cli_run_json("infer " TINY " --new-tokens 12 --adapter " MEMBILL_GOLDEN_DIR "/tiny_lora");
    json_t *a = json_object_get(plain, "generated"), *b = json_object_get(adapted, "generated");
    assert_non_null(a);
    assert_non_null(b);
    assert_false(json_equal(a, b));
    json_t *lora = json_object_get(adapted, "lora");
    if (lora) assert_int_equal(json_integer_value(json_object_get(lora, "rank")), 4);
    json_decref(plain);
    json_decref(adapted);
}

// compare --lora: four real sides; gradients and Adam state of the adapters alone on both LoRA
// sides, the QLoRA base smaller than LoRA's float32 one.
static void test_compare_lora(void **s) {
    (void)s;
    json_t *root = cli_run_json("compare " TINY " --lora " LORA);
    const char *const keys[] = {"full", "lora_train", "qlora_train", "infer"};
    json_t *side[4];
    for (int k = 0; k < 4; k++) {
        side[k] = json_object_get(root, keys[k]);
        assert_non_null(side[k]);
    }
    json_int_t ad = json_integer_value(json_object_get(json_object_get(root, "lora"), "trainable_params"));
    assert_true(ad > 0);
    for (int k = 1; k <= 2; k++) {
        json_t *c = json_object_get(side[k], "categories");
        assert_int_equal(json_integer_value(json_object_get(c, "gradient")), 4 * ad);
        assert_int_equal(json_integer_value(json_object_get(c, "optimizer")), 8 * ad);
    }
    json_t *full = json_object_get(side[0], "categories"), *lo = json_object_get(side[1], "categories"),
           *q = json_object_get(side[2], "categories");
    assert_true(json_integer_value(json_object_get(q, "weight")) < json_integer_value(json_object_get(lo, "weight")));
    assert_true(json_integer_value(json_object_get(full, "gradient")) >
                json_integer_value(json_object_get(lo, "gradient")));
    json_decref(root);
    membill(&r, "compare " TINY " --lora " LORA " --base-dtype int8");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "QLoRA: the same adapters on a int8 base"));
    assert_null(strstr(r.out, "meta"));
}

// A real QLoRA step bills what its meta run bills, category by category, for each low-bit base.
static void test_qlora_real_equals_meta(void **s) {
    (void)s;
    const char *const bases[] = {"nf4", "int4", "int8"};
    const char *const cats[] = {"weight", "gradient", "optimizer", "activation", "cache", "temporary"};
    for (int b = 0; b < 3; b++) {
        char args[1024];
        snprintf(args, sizeof args, "train " TINY " " LORA " --base-dtype %s --dtype bf16 --steps 2", bases[b]);
        json_t *real = cli_run_json(args);
        snprintf(args, sizeof args,
                 "train --config " MEMBILL_GOLDEN_DIR "/tiny_untied/config.json " LORA
                 " --base-dtype %s --dtype bf16 --steps 2 --meta",
                 bases[b]);
        json_t *meta = cli_run_json(args);
        assert_true(isfinite(loss_of_step(real, 1)));
        json_t *rc = json_object_get(real, "categories"), *mc = json_object_get(meta, "categories");
        for (int c = 0; c < 6; c++)
            if (peak_of(rc, cats[c]) != peak_of(mc, cats[c]))
                fail_msg("--base-dtype %s: %s real %lld, meta %lld", bases[b], cats[c], (long long)peak_of(rc, cats[c]),
                         (long long)peak_of(mc, cats[c]));
        json_decref(real);
        json_decref(meta);
    }
}

typedef struct {
    const char *args;
    int code;
    const char *says;
} refusal;

static void test_refusals(void **s) {
    (void)s;
    char a[2048];
    snprintf(a, sizeof a, "%s/ad2", cli_run_dir);
    const refusal cases[] = {
        {"train " TINY " --base-dtype nf4", 2, "--base-dtype configures LoRA: add --lora-rank R"},
        {"train " TINY " --save-adapter /tmp/x", 2, "--save-adapter configures LoRA"},
        {"train " TINY " --lora-alpha 16", 2, "--lora-alpha configures LoRA"},
        {"compare " TINY " --lora-rank 4", 2, "--lora-rank in compare sets the LoRA column: add --lora"},
        {"compare " TINY " --lora --lora-rank 0", 2, "compare --lora needs a rank of 1 or more"},
        {"train " TINY " " LORA " --meta --save-adapter /tmp/x", 2, "--meta runs on shapes alone"},
        {"train " TINY " --adapter " MEMBILL_GOLDEN_DIR "/tiny_lora --save-adapter " MEMBILL_GOLDEN_DIR "/tiny_lora", 2,
         "--save-adapter names the --adapter folder"},
        {"train " TINY " --lora-rank 4 --lora-targets q_proj,lm_head", 2, "item 2 'lm_head'"},
        {"train " TINY " --lora-rank 4 --lora-targets q_proj,q_proj", 2, "given twice"},
        {"train " TINY " --lora-rank 4 --lora-dropout 1.5", 2, "--lora-dropout"},
        {"train " TINY " --lora-rank 4 --base-dtype fp8", 2, "--base-dtype must be one of nf4,int4,int8"},
        {"infer " TINY " --base-dtype nf4", 2, "--base-dtype does not apply to infer"},
        {"train " TINY " --adapter /nonexistent/ad", 1, "adapter_config.json: cannot open"},
        {"train " TINY " --adapter " MEMBILL_GOLDEN_DIR "/tiny_lora --lora-rank 8", 1, "expected [8, 160]"},
        {"train " TINY " --adapter " MEMBILL_GOLDEN_DIR "/tiny_lora --lora-targets q_proj,v_proj", 1,
         "is not an adapter of this model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        membill(&r, cases[i].args);
        if (r.code != cases[i].code || !strstr(r.err, cases[i].says) || count_lines(r.err) != 1)
            fail_msg("%s: exit %d (expected %d), stderr '%s' (expected one line with '%s')", cases[i].args, r.code,
                     cases[i].code, r.err, cases[i].says);
    }
    // a refused --save-adapter leaves no folder behind
    struct stat st;
    snprintf(a, sizeof a,
             "train " TINY " --adapter " MEMBILL_GOLDEN_DIR "/tiny_lora --lora-rank 8 --save-adapter %s/ad2",
             cli_run_dir);
    membill(&r, a);
    assert_int_equal(r.code, 1);
    snprintf(a, sizeof a, "%s/ad2/adapter_model.safetensors", cli_run_dir);
    assert_int_not_equal(stat(a, &st), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_then_train_on), cmocka_unit_test(test_infer_with_adapter),
        cmocka_unit_test(test_compare_lora),       cmocka_unit_test(test_qlora_real_equals_meta),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests_name("cli_lora", tests, cli_run_make_dir, cli_run_remove_dir);
}
