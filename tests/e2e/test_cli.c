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

#include "cli_run.h"

#define dir cli_run_dir

static json_int_t cat_peak(json_t *root, const char *cat) {
    return json_integer_value(json_object_get(json_object_get(json_object_get(root, "categories"), cat), "peak_bytes"));
}

static void assert_all_live_zero(json_t *root) {
    const char *cats[] = {"weight", "gradient", "optimizer", "activation", "cache", "temporary"};
    for (int i = 0; i < 6; i++) {
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
    const char *cats[] = {"weight", "gradient", "optimizer", "activation", "cache", "temporary"};
    for (int i = 0; i < 6; i++) assert_int_equal(cat_peak(meta, cats[i]), cat_peak(real, cats[i]));
    // The default for-loop Adam: the embedding's sqrt and denominator (2 x 49152 x 576 x 4 bytes)
    // on top of the four copies at the total peak.
    assert_int_equal(cat_peak(real, "temporary"), 2 * 113246208);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(meta, "peak"), "total_bytes")),
                     2152240128LL + 2 * 113246208);
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
    ag_err err;
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

// --checkpointing on a real run: the same loss and gradients, a lower activation peak, and the
// report says so.
static void test_train_checkpointing(void **state) {
    (void)state;
    json_t *root[2];
    float *grads[2] = {NULL, NULL};
    size_t n[2] = {0, 0};
    for (int ck = 0; ck < 2; ck++) {
        run_result r;
        char args[2048], path[512];
        snprintf(args, sizeof args,
                 "train --weights %s/tiny_tied --tokens 5,9,17,33,65,129,250 --batch 2 --json %s/c%d.json "
                 "--dump-grads %s/c%d.safetensors%s",
                 MEMBILL_GOLDEN_DIR, dir, ck, dir, ck, ck ? " --checkpointing" : "");
        membill(&r, args);
        if (r.code != 0) print_error("%s: %s\n", args, r.err);
        assert_int_equal(r.code, 0);
        assert_int_equal(
            strstr(r.out, "checkpointing: each block's input kept, activations recomputed in backward") != NULL, ck);
        snprintf(path, sizeof path, "%s/c%d.json", dir, ck);
        root[ck] = json_load_file(path, 0, NULL);
        assert_non_null(root[ck]);
        assert_int_equal(json_is_true(json_object_get(json_object_get(root[ck], "run"), "checkpointing")), ck);
        assert_all_live_zero(root[ck]);
        llama_st_file *f = NULL;
        ag_err err;
        snprintf(path, sizeof path, "%s/c%d.safetensors", dir, ck);
        assert_int_equal(llama_st_open(&f, path, &err), 0);
        for (size_t i = 0; i < llama_st_count(f); i++) n[ck] += llama_st_get(f, i)->numel;
        grads[ck] = malloc(n[ck] * sizeof(float));
        assert_non_null(grads[ck]);
        for (size_t i = 0, off = 0; i < llama_st_count(f); off += llama_st_get(f, i)->numel, i++)
            assert_int_equal(llama_st_read_f32(f, llama_st_get(f, i), grads[ck] + off, llama_st_get(f, i)->numel, &err),
                             0);
        llama_st_close(f);
    }
    double l0 = json_real_value(json_object_get(root[0], "loss")),
           l1 = json_real_value(json_object_get(root[1], "loss"));
    assert_true(l0 > 0);
    assert_true(fabs(l0 - l1) <= 1e-6 * l0);
    assert_int_equal(n[0], n[1]);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n[0]; i++) {
        worst = fmax(worst, fabs((double)grads[0][i] - grads[1][i]));
        scale = fmax(scale, fabs((double)grads[0][i]));
    }
    assert_true(scale > 0);
    assert_true(worst <= 1e-6 * scale);
    assert_true(cat_peak(root[1], "activation") < cat_peak(root[0], "activation"));
    assert_int_equal(cat_peak(root[1], "gradient"), cat_peak(root[0], "gradient"));
    for (int ck = 0; ck < 2; ck++) {
        json_decref(root[ck]);
        free(grads[ck]);
    }
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
    expect_failure("train --model gpt-5", 2, "gpt-5");
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
    expect_failure(a, 1, "id 300, past the model's 256 ids");
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --tokens 1,x,3", MEMBILL_GOLDEN_DIR);
    expect_failure(a, 2, "--tokens");
    write_file("bad.safetensors", "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":1}");
    snprintf(a, sizeof a, "train --config %s/tiny_tied/config.json --weights %s/bad.safetensors", MEMBILL_GOLDEN_DIR,
             dir);
    expect_failure(a, 1, "bad.safetensors");
    expect_failure("train --meta --dump-grads x.safetensors", 2, "--meta");

    // A failed run leaves the user's files as they were.
    write_file("keep.json", "precious");
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --tokens 1,2,300 --json %s/keep.json", MEMBILL_GOLDEN_DIR, dir);
    expect_failure(a, 1, "id 300");
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

static json_t *cli_run_json(const char *args);

static json_t *plan_json(const char *args) {
    char a[2048];
    snprintf(a, sizeof a, "plan %s", args);
    return cli_run_json(a);
}

static json_int_t jint(json_t *root, const char *obj, const char *key) {
    return json_integer_value(json_object_get(json_object_get(root, obj), key));
}

// The closed form follows the meta bill within 1% from the smallest preset to 405B and from
// 25 to 8,192 tokens; weights, gradients and Adam state exactly.
// The same with --checkpointing, where the activation peak is the kept block inputs plus the
// head or one recomputed block, whichever is larger.
static void test_plan_closed_form_sweep(void **state) {
    (void)state;
    // the tiny configs first (128 positions), then Qwen2 (biases), Qwen3 (q/k norms), Mistral's
    // window, Llama 3.1's rope_scaling, then the presets
    enum { TINY = 11 };
    static const char *const tiny_names[TINY] = {"tiny_tied",    "tiny_mha",     "tiny_qwen2",     "tiny_qwen3",
                                                 "tiny_mistral", "tiny_mixtral", "tiny_qwen2_moe", "tiny_qwen3_moe",
                                                 "tiny_gemma2",  "tiny_gemma3",  "tiny_phi3"};
    static const char *const configs[] = {"qwen2.5-0.5b", "qwen3-0.6b", "llama-3.1-8b"};
    char tiny[TINY + 3][256];
    for (int i = 0; i < TINY; i++)
        snprintf(tiny[i], sizeof tiny[i], "--config %s/%s/config.json", MEMBILL_GOLDEN_DIR, tiny_names[i]);
    for (int i = 0; i < 3; i++)
        snprintf(tiny[TINY + i], sizeof tiny[i], "--config %s/../model/configs/%s.json", MEMBILL_GOLDEN_DIR,
                 configs[i]);
    const char *models[] = {tiny[0],
                            tiny[1],
                            tiny[2],
                            tiny[3],
                            tiny[4],
                            tiny[5],
                            tiny[6],
                            tiny[7],
                            tiny[8],
                            tiny[9],
                            tiny[10],
                            tiny[11],
                            tiny[12],
                            tiny[13],
                            "--model smollm2-135m",
                            "--model phi-3-mini",
                            "--model gemma-2-9b",
                            "--model gemma-3-1b",
                            "--model mixtral-8x7b",
                            "--model qwen3-30b-a3b",
                            "--model smollm2-360m",
                            "--model llama-2-7b",
                            "--model mistral-7b",
                            "--model llama-3-70b",
                            "--model llama-3.1-405b"};
    const int nmodels = (int)(sizeof models / sizeof *models);
    const char *lens[] = {"25", "1024", "4096", "8192"};
    for (int ck = 0; ck < 2; ck++)
        for (int m = 0; m < nmodels; m++)
            for (int l = 0; l < 4; l++) {
                char a[512];
                if (m < TINY && l > 0) continue;                       // the tiny configs have 128 positions
                if (ck && strstr(models[m], "tiny_mixtral")) continue; // its aux loss refuses checkpointing
                if (l == 3 && (!strcmp(models[m], "--model llama-2-7b") || !strcmp(models[m], "--model phi-3-mini")))
                    continue; // Llama-2 and Phi-3-mini have 4,096
                // The closed form is the lean framework's (what fused kernels keep).
                snprintf(a, sizeof a, "%s --seq-len %s --batch 2%s --framework lean", models[m], lens[l],
                         ck ? " --checkpointing" : "");
                json_t *root = plan_json(a);
                assert_true(json_is_boolean(json_object_get(json_object_get(root, "run"), "checkpointing")));
                assert_int_equal(json_is_true(json_object_get(json_object_get(root, "run"), "checkpointing")), ck);
                json_int_t p = jint(root, "closed_form", "parameters");
                assert_int_equal(cat_peak(root, "weight"), 4 * p);
                assert_int_equal(cat_peak(root, "gradient"), 4 * p);
                assert_int_equal(cat_peak(root, "optimizer"), 8 * p);
                if (ck && json_object_get(json_object_get(root, "closed_form"), "sparse_blocks")) {
                    // a sparse block's recomputation is not closed: said, not guessed
                    assert_true(json_is_null(json_object_get(json_object_get(root, "closed_form"), "activation")));
                    json_decref(root);
                    continue;
                }
                double meta = (double)cat_peak(root, "activation"),
                       closed = (double)jint(root, "closed_form", "activation");
                if (fabs(closed / meta - 1) > 0.01) print_error("%s: closed %g meta %g\n", a, closed, meta);
                assert_true(fabs(closed / meta - 1) <= 0.01);
                // In float32 the closed form names every tensor live at the peak: equal to the byte.
                assert_true(fabs(closed - meta) <= 4);
                json_decref(root);
            }
}

// Qwen (v1)'s loss (--framework pytorch-2.0-qwen) in plan's closed form: the head's moment (its
// log_softmax and two gradients in the logits' dtype) and the forward's end (the shifted copies
// at batch 2) against the meta bill, to the byte, float32 and bf16.
static void test_plan_closed_form_qwen_loss(void **state) {
    (void)state;
    static const char *const runs[] = {"", "--batch 2", "--dtype bf16", "--dtype bf16 --batch 2"};
    for (int r = 0; r < 4; r++) {
        char a[256];
        snprintf(a, sizeof a, "--seq-len 64 --lora-rank 8 --framework pytorch-2.0-qwen %s", runs[r]);
        json_t *root = plan_json(a);
        assert_int_equal(jint(root, "closed_form", "activation"), cat_peak(root, "activation"));
        json_decref(root);
    }
}

// gpt_oss's closed form (the router's float32 softmax over the k it chose, the stacked experts'
// gate_up gradient) against the meta bill, under the lean framework, eager and flash.
static void test_plan_closed_form_gpt_oss(void **state) {
    (void)state;
    char tiny[256], a[512];
    snprintf(tiny, sizeof tiny, "--config %s/tiny_gpt_oss/config.json --seq-len 25", MEMBILL_GOLDEN_DIR);
    const char *runs[] = {tiny, "--model gpt-oss-20b --seq-len 25", "--model gpt-oss-20b --seq-len 2048",
                          "--model gpt-oss-120b --seq-len 1024",
                          "--model gpt-oss-20b --seq-len 2048 --attention flash"};
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        snprintf(a, sizeof a, "%s --batch 2 --framework lean", runs[r]);
        json_t *root = plan_json(a);
        json_int_t p = jint(root, "closed_form", "parameters");
        assert_int_equal(cat_peak(root, "weight"), 4 * p);
        assert_int_equal(cat_peak(root, "optimizer"), 8 * p);
        double meta = (double)cat_peak(root, "activation"), closed = (double)jint(root, "closed_form", "activation");
        if (fabs(closed - meta) > 4) fail_msg("%s: closed %g meta %g", a, closed, meta);
        json_decref(root);
    }
}

// deepseek_v3's closed form (the latent attention's saved set, the sigmoid router's float32
// scores, the shared experts, the bias buffers billed as weight) against the meta bill, under the
// lean framework; with checkpointing a sparse block is not closed (null).
static void test_plan_closed_form_deepseek_v3(void **state) {
    (void)state;
    char tiny[256], a[512];
    snprintf(tiny, sizeof tiny, "--config %s/tiny_deepseek_v3/config.json --seq-len 25", MEMBILL_GOLDEN_DIR);
    const char *runs[] = {tiny, "--model deepseek-v3 --seq-len 25", "--model deepseek-v3 --seq-len 1024"};
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++)
        for (int ck = 0; ck < 2; ck++) {
            snprintf(a, sizeof a, "%s --batch 2 --framework lean%s", runs[r], ck ? " --checkpointing" : "");
            json_t *root = plan_json(a);
            json_int_t p = jint(root, "closed_form", "parameters");
            assert_int_equal(cat_peak(root, "weight"), jint(root, "closed_form", "weight"));
            assert_true(cat_peak(root, "weight") > 4 * p); // the e_score_correction_bias buffers
            if (ck) {
                assert_true(json_is_null(json_object_get(json_object_get(root, "closed_form"), "activation")));
            } else {
                double meta = (double)cat_peak(root, "activation"),
                       closed = (double)jint(root, "closed_form", "activation");
                if (fabs(closed - meta) > 4) fail_msg("%s: closed %g meta %g", a, closed, meta);
            }
            json_decref(root);
        }
}

// num_nextn_predict_layers (DeepSeek-V3's multi-token prediction) is not billed, and the report
// says so in one line and in run.mtp_layers_not_billed; a config without it says nothing.
static void test_deepseek_v3_mtp_said(void **state) {
    (void)state;
    char tiny[512];
    snprintf(tiny, sizeof tiny, "plan --framework lean --config %s/tiny_deepseek_v3/config.json", MEMBILL_GOLDEN_DIR);
    const char *runs[] = {"plan --framework lean --model deepseek-v3", tiny};
    for (int i = 0; i < 2; i++) {
        run_result r;
        membill(&r, runs[i]);
        assert_int_equal(r.code, 0);
        const char *line = strstr(r.out, "mtp: num_nextn_predict_layers 1 (the multi-token-prediction module) is not "
                                         "billed\n");
        assert_true(i == 0 ? line != NULL : line == NULL && !strstr(r.out, "mtp:"));
        json_t *root = plan_json(runs[i] + 5);
        const json_t *n = json_object_get(json_object_get(root, "run"), "mtp_layers_not_billed");
        assert_true(i == 0 ? json_integer_value(n) == 1 : n == NULL);
        json_decref(root);
    }
}

// --mla-cache latent on a family without latent attention is a usage error naming the option.
static void test_mla_cache_refused(void **state) {
    (void)state;
    expect_failure("infer --meta --model smollm2-135m --mla-cache latent", 2, "--mla-cache latent");
    expect_failure("infer --meta --model smollm2-135m --mla-cache compressed", 2, "--mla-cache");
}

// Gemma 2 under LoRA: its norms and soft-caps are not walked by the LoRA closed form, which says so
// (null) rather than guessing.
static void test_plan_gemma2_lora_not_closed(void **state) {
    (void)state;
    json_t *root = plan_json("--model gemma-2-9b --seq-len 64 --lora-rank 8 --framework lean");
    assert_true(json_is_null(json_object_get(json_object_get(root, "closed_form"), "activation")));
    assert_true(cat_peak(root, "activation") > 0);
    json_decref(root);
}

// An expert no token reached gets no gradient and no optimizer state: the closed form counts
// the parameters each routing reaches, as the meta run bills them.
static void test_plan_closed_form_routing(void **state) {
    (void)state;
    static const struct {
        const char *args;
        bool idle; // some expert gets no token
    } runs[] = {
        {"--model qwen3-30b-a3b --seq-len 64 --routing worst", true},
        {"--model qwen3-30b-a3b --seq-len 64", false},
        {"--model qwen3-30b-a3b --seq-len 8", true}, // balanced, 8 x 8 pairs for 128 experts
        {"--model qwen3-30b-a3b --seq-len 8 --grad-accum 2", true},
        {"--model mixtral-8x7b --seq-len 16 --routing worst --dtype bf16-mixed", true},
        {"--model qwen1.5-moe-a2.7b --seq-len 16 --routing worst --optimizer sgd-momentum", true},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        char a[256];
        snprintf(a, sizeof a, "%s --framework lean", runs[i].args);
        json_t *root = plan_json(a);
        json_int_t p = jint(root, "closed_form", "parameters"),
                   g = jint(root, "closed_form", "parameters_with_gradient"),
                   st = jint(root, "closed_form", "parameters_with_state");
        assert_int_equal(cat_peak(root, "gradient"), jint(root, "closed_form", "gradient"));
        assert_int_equal(cat_peak(root, "optimizer"), jint(root, "closed_form", "optimizer"));
        assert_true(g <= st && st <= p);
        assert_int_equal(st < p, runs[i].idle);
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

    // The largest batch that fits 8 GiB (8GB, as GPU memory is sold) does fit, and one more does not.
    root = plan_json("--model smollm2-135m --device-memory 8GB");
    json_int_t best = jint(root, "fit", "largest_batch");
    assert_true(best > 1);
    json_decref(root);
    char a[128];
    snprintf(a, sizeof a, "--model smollm2-135m --device-memory 8GB --batch %lld", (long long)best);
    root = plan_json(a);
    assert_true(jint(root, "per_gpu", "total_bytes") <= 8LL << 30); // 8GB of a GPU: 8 GiB
    json_decref(root);
    snprintf(a, sizeof a, "--model smollm2-135m --device-memory 8GB --batch %lld", (long long)best + 1);
    root = plan_json(a);
    assert_true(jint(root, "per_gpu", "total_bytes") > 8LL << 30);
    assert_true(json_is_false(json_object_get(json_object_get(root, "fit"), "fits")));
    json_decref(root);
}

// Bytes a parameter of each dtype and optimizer, from the meta run: weights and gradients at
// the dtype's element size, the optimizer's states in the parameters' dtype for pure 16-bit
// runs, float32 beside a float32 master copy in mixed precision. The totals are the published
// counts: 16 (float32 Adam, the lesson), 8 (pure bf16 Adam), 16 (DeepSpeed's mixed-precision
// Adam, 2 + 2 + 12), 18 (Megatron-LM's float32 main_grad, 2 + 4 + 12).
static void test_plan_dtype_bytes_per_param(void **state) {
    (void)state;
    const struct {
        const char *dtype;
        int w, g, state, master;
    } dt[] = {{"fp32", 4, 4, 4, 0},       {"bf16", 2, 2, 2, 0},       {"fp16", 2, 2, 2, 0},
              {"bf16-mixed", 2, 2, 4, 4}, {"fp16-mixed", 2, 2, 4, 4}, {"bf16-mixed-fp32-grads", 2, 4, 4, 4}};
    const struct {
        const char *name;
        int states;
        bool steps;
    } opt[] = {{"adam", 2, true}, {"adamw", 2, true}, {"sgd", 0, true}, {"sgd-momentum", 1, true}, {"none", 0, false}};
    for (size_t d = 0; d < sizeof dt / sizeof dt[0]; d++)
        for (size_t k = 0; k < sizeof opt / sizeof opt[0]; k++) {
            char a[256];
            snprintf(a, sizeof a, "--model smollm2-135m --dtype %s --optimizer %s", dt[d].dtype, opt[k].name);
            json_t *root = plan_json(a);
            json_int_t p = jint(root, "closed_form", "parameters");
            assert_int_equal(p, 134515008);
            json_int_t per_opt = opt[k].steps ? dt[d].master + opt[k].states * dt[d].state : 0;
            assert_int_equal(cat_peak(root, "weight"), dt[d].w * p);
            assert_int_equal(cat_peak(root, "gradient"), dt[d].g * p);
            assert_int_equal(cat_peak(root, "optimizer"), per_opt * p);
            assert_int_equal(jint(root, "closed_form", "optimizer"), per_opt * p);
            double total = json_real_value(json_object_get(json_object_get(root, "bytes_per_parameter"), "total"));
            assert_true(fabs(total - (double)(dt[d].w + dt[d].g + per_opt)) < 1e-9);
            json_decref(root);
        }
    const struct {
        const char *dtype;
        double per;
    } published[] = {{"fp32", 16}, {"bf16", 8}, {"bf16-mixed", 16}, {"bf16-mixed-fp32-grads", 18}};
    for (int i = 0; i < 4; i++) {
        char a[256];
        snprintf(a, sizeof a, "--model llama-3-70b --dtype %s", published[i].dtype);
        json_t *root = plan_json(a);
        double total = json_real_value(json_object_get(json_object_get(root, "bytes_per_parameter"), "total"));
        assert_true(fabs(total - published[i].per) < 1e-9);
        json_decref(root);
    }
    // Mixed precision bills the master copy as optimizer state, one per parameter.
    run_result r;
    char a[1024], path[512];
    snprintf(path, sizeof path, "%s/mixed.json", dir);
    snprintf(a, sizeof a, "train --meta --dtype bf16-mixed --model smollm2-135m --json %s --quiet", path);
    membill(&r, a);
    assert_int_equal(r.code, 0);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(json_object_get(root, "run"), "dtype")), "bf16-mixed");
    assert_int_equal(cat_peak(root, "optimizer"), 12LL * 134515008);
    assert_int_equal(cat_peak(root, "weight"), 2LL * 134515008);
    bool master = false;
    json_t *rows = json_object_get(json_object_get(root, "breakdown"), "at_total_peak");
    for (size_t i = 0; rows && i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i);
        const char *site = json_string_value(json_object_get(row, "site"));
        if (site && strstr(site, ":master") && json_integer_value(json_object_get(row, "bytes")) > 0 &&
            strcmp(json_string_value(json_object_get(row, "category")), "optimizer") == 0)
            master = true;
    }
    if (!master) print_error("no :master site in the optimizer at the total peak\n");
    assert_true(master);
    assert_all_live_zero(root);
    json_decref(root);
}

// A simulated rank's model states against the ZeRO paper's formulas for mixed-precision Adam
// (K = 12): stage 0 (2+2+K)Psi, 1 2Psi+2Psi+KPsi/N, 2 2Psi+(2+K)Psi/N, 3 (2+2+K)Psi/N; and the
// float32 counterparts (4+4+8); and DeepSpeed's estimators, 4P + 16P/N (stages 1 and 2) and
// 4 x largest layer + 18P/N (stage 3).
static void test_plan_zero_formulas(void **state) {
    (void)state;
    const struct {
        const char *dtype;
        double w, g, k;
    } dt[] = {{"bf16-mixed", 2, 2, 12}, {"fp32", 4, 4, 8}};
    const long gpus[] = {8, 3};
    for (int d = 0; d < 2; d++)
        for (int n = 0; n < 2; n++)
            for (int z = 0; z <= 3; z++) {
                char a[256];
                snprintf(a, sizeof a, "--model llama-2-7b --dtype %s --gpus %ld --zero %d", dt[d].dtype, gpus[n], z);
                json_t *root = plan_json(a);
                double P = (double)jint(root, "closed_form", "parameters"), N = (double)gpus[n];
                double w = dt[d].w, g = dt[d].g, K = dt[d].k;
                double formula = z == 0   ? (w + g + K) * P
                                 : z == 1 ? w * P + g * P + K * P / N
                                 : z == 2 ? w * P + (g + K) * P / N
                                          : (w + g + K) * P / N;
                // The simulated rank holds at least what ZeRO's formula counts (each model state at
                // its own peak; gathered blocks and transient whole gradients on top), and its
                // optimizer state is the formula's share but for each tensor's shard rounding up.
                json_t *pg = json_object_get(root, "per_gpu"), *own = json_object_get(pg, "own_peak");
                double opt = (double)json_integer_value(json_object_get(own, "optimizer"));
                double states = (double)(json_integer_value(json_object_get(own, "weight")) +
                                         json_integer_value(json_object_get(own, "gradient"))) +
                                opt;
                if (states < formula - 3) print_error("%s: per device %.0f, formula %.0f\n", a, states, formula);
                assert_true(states >= formula - 3);
                double kshare = z ? K * P / N : K * P;
                assert_true(opt >= kshare - 3 && opt <= kshare + K * 291); // 291 tensors in llama-2-7b
                json_int_t zf = json_integer_value(
                    json_object_get(json_object_get(root, "bytes_per_parameter"), "zero_formula_bytes"));
                assert_true(fabs((double)zf - formula) <= 3);
                assert_int_equal(json_integer_value(json_object_get(json_object_get(pg, "zero_paper"), "bytes")), zf);
                // DeepSpeed's estimators, in their fp16 mixed-precision terms whatever the dtype.
                json_t *ds = json_object_get(json_object_get(pg, "deepspeed"), "bytes");
                long long p = (long long)P, ranks = gpus[n], largest = 32000LL * 4096;
                if (z == 0) assert_true(json_is_null(json_object_get(pg, "deepspeed")));
                if (z == 1 || z == 2) assert_int_equal(json_integer_value(ds), 4 * p + 16 * p / ranks);
                if (z == 3) assert_int_equal(json_integer_value(ds), 4 * largest + 18 * p / ranks);
                json_decref(root);
            }
}

// The closed form against the meta bill for the 16-bit dtypes: weights, gradients and
// optimizer exactly, activations within 1% (rstd and log-sum-exp rows stay float32 in both).
static void test_plan_closed_form_dtypes(void **state) {
    (void)state;
    const char *models[] = {"smollm2-135m", "llama-2-7b", "llama-3-70b"};
    const char *lens[] = {"25", "1024", "4096"};
    const char *dtypes[] = {"bf16", "fp16", "bf16-mixed", "bf16-mixed-fp32-grads"};
    for (int m = 0; m < 3; m++)
        for (int l = 0; l < 3; l++)
            for (int d = 0; d < 4; d++) {
                char a[256];
                snprintf(a, sizeof a, "--model %s --seq-len %s --batch 2 --dtype %s --framework lean", models[m],
                         lens[l], dtypes[d]);
                json_t *root = plan_json(a);
                const char *cats[] = {"weight", "gradient", "optimizer"};
                for (int c = 0; c < 3; c++)
                    assert_int_equal(cat_peak(root, cats[c]), jint(root, "closed_form", cats[c]));
                double meta = (double)cat_peak(root, "activation"),
                       closed = (double)jint(root, "closed_form", "activation");
                if (fabs(closed / meta - 1) > 0.01) print_error("%s: closed %g meta %g\n", a, closed, meta);
                assert_true(fabs(closed / meta - 1) <= 0.01);
                json_decref(root);
            }
    // 16-bit activations are half the float32 ones but for the float32 statistics (lean; under
    // --framework pytorch a bf16 model keeps float32 copies in RMSNorm, softmax and the loss).
    json_t *f32 = plan_json("--model smollm2-135m --seq-len 512 --framework lean");
    json_t *b16 = plan_json("--model smollm2-135m --seq-len 512 --dtype bf16 --framework lean");
    double ratio = (double)cat_peak(b16, "activation") / (double)cat_peak(f32, "activation");
    assert_true(ratio > 0.5 && ratio < 0.51);
    json_decref(f32);
    json_decref(b16);
}

// LoRA's and QLoRA's activation peak in closed form equals the meta bill to the byte, for every
// framework and attention, with any targets, dropout or not, in float32, bf16 and bf16-mixed,
// with a plain or an NF4 base; block 0 (no gradient below its first adapter) apart from the
// later blocks. With checkpointing the peak is not closed, but its head moment (the kept block
// inputs and the head) is, and the meta bill never falls below it.
static void test_plan_closed_form_lora(void **state) {
    (void)state;
    const char *models[] = {"smollm2-135m", "llama-3-8b"};
    const char *shapes[] = {"--batch 1 --seq-len 25", "--batch 2 --seq-len 96"};
    const struct {
        const char *fw, *att;
    } fa[] = {
        {"lean", "eager"}, {"lean", "flash"}, {"pytorch", "eager"}, {"pytorch", "flash"}, {"pytorch-1.13", "eager"}};
    const char *targets[] = {"q_proj,v_proj", "all-linear", "down_proj", "gate_proj", "o_proj"};
    const char *dropouts[] = {"0", "0.1"}, *dtypes[] = {"fp32", "bf16", "bf16-mixed"},
               *bases[] = {"", " --base-dtype nf4"};
    int n = 0;
    for (int m = 0; m < 2; m++)
        for (int sh = 0; sh < 2; sh++)
            for (int f = 0; f < 5; f++)
                for (int k = 0; k < 3; k++, n++) {
                    // every target set, dropout, dtype and base meets every framework and attention
                    char a[512];
                    snprintf(a, sizeof a,
                             "--model %s %s --framework %s --attention %s --lora-rank 8 --lora-targets %s "
                             "--lora-dropout %s --dtype %s%s",
                             models[m], shapes[sh], fa[f].fw, fa[f].att, targets[(n + k) % 5], dropouts[n % 2],
                             dtypes[(n / 2 + k) % 3], bases[(n / 6 + k) % 2]);
                    json_t *root = plan_json(a);
                    json_t *cf = json_object_get(root, "closed_form");
                    assert_true(json_is_integer(json_object_get(cf, "activation")));
                    json_int_t meta = cat_peak(root, "activation"), closed = jint(root, "closed_form", "activation");
                    if (closed != meta)
                        print_error("%s: closed %lld meta %lld\n", a, (long long)closed, (long long)meta);
                    assert_int_equal(closed, meta);
                    json_int_t first = jint(root, "closed_form", "activation_first_block"),
                               block = jint(root, "closed_form", "activation_per_block"),
                               head = jint(root, "closed_form", "activation_head");
                    // block 0's input needs no gradient: it keeps less than a block on the residual stream
                    assert_true(first > 0 && first < block);
                    assert_int_equal(closed, first + (jint(root, "model", "layers") - 1) * block + head);
                    json_decref(root);
                    if (k) continue;
                    strncat(a, " --checkpointing", sizeof a - strlen(a) - 1);
                    root = plan_json(a);
                    cf = json_object_get(root, "closed_form");
                    assert_true(json_is_null(json_object_get(cf, "activation")));
                    json_int_t moment = jint(root, "closed_form", "activation_block_inputs") +
                                        jint(root, "closed_form", "activation_head_moment");
                    assert_true(moment > 0 && moment <= cat_peak(root, "activation"));
                    json_decref(root);
                }
    // The PyTorch frameworks' other moments: the forward's end with a small vocabulary (the
    // DynamicCache and the loss's float32 copies), the last block's softmax in forward and its
    // attention backward with long sequences.
    char tiny[512];
    snprintf(tiny, sizeof tiny,
             "--config %s/tiny_mha/config.json --batch 2 --seq-len 100 --lora-targets up_proj --lora-dropout 0.1 "
             "--dtype bf16",
             MEMBILL_GOLDEN_DIR);
    const struct {
        const char *args, *moment;
    } other[] = {
        {tiny, "activation_forward_end"},
        {"--model mistral-7b --seq-len 4096 --dtype bf16", "activation_forward_softmax"},
        {"--model mistral-7b --seq-len 4096 --dtype bf16 --framework pytorch-1.13", "activation_forward_softmax"},
        // multi-head: repeat_kv copies nothing, so the forward's softmax holds no copies of k and v
        {"--model llama-2-7b --seq-len 4096 --dtype bf16", "activation_backward_attention"},
        {"--model mistral-7b --seq-len 4096 --lora-targets all-linear", "activation_backward_attention"},
        {"--model mistral-7b --seq-len 4096 --lora-targets all-linear --framework pytorch-1.13",
         "activation_backward_attention"},
    };
    for (size_t i = 0; i < sizeof other / sizeof *other; i++) {
        char a[768];
        snprintf(a, sizeof a, "%s --lora-rank 64", other[i].args);
        json_t *root = plan_json(a);
        json_int_t meta = cat_peak(root, "activation"), closed = jint(root, "closed_form", "activation");
        if (closed != meta) print_error("%s: closed %lld meta %lld\n", a, (long long)closed, (long long)meta);
        assert_int_equal(closed, meta);
        assert_int_equal(jint(root, "closed_form", other[i].moment), meta);
        // above the head's moment, which is the peak elsewhere
        assert_true(jint(root, "closed_form", "activation_first_block") +
                        (jint(root, "model", "layers") - 1) * jint(root, "closed_form", "activation_per_block") +
                        jint(root, "closed_form", "activation_head") <
                    meta);
        json_decref(root);
    }
}

// Weight bytes of the quantised settings, computed here tensor by tensor from the shapes: 2-D
// weights packed at `bits` plus one 2-byte scale per group of a row, norms at norm_bits.
static json_int_t expected_weights(const char *model, int bits, long group, int norm_bits) {
    llama_config c;
    ag_err err;
    assert_int_equal(llama_config_preset(&c, model, &err), 0);
    json_int_t total = 0;
    for (size_t i = 0; i < llama_param_count_tensors(&c); i++) {
        char name[LLAMA_PARAM_NAME_MAX];
        int ndim;
        int64_t shape[LLAMA_PARAM_MAX_DIMS];
        assert_int_equal(llama_param_spec(&c, i, name, sizeof name, &ndim, shape), 0);
        if (ndim == 1) {
            total += shape[0] * norm_bits / 8;
            continue;
        }
        total += shape[0] * shape[1] * bits / 8;
        if (group) total += shape[0] * ((shape[1] + group - 1) / group) * 2;
    }
    return total;
}

static json_int_t jinf(json_t *root, const char *key) {
    return json_integer_value(json_object_get(json_object_get(root, "inference"), key));
}

// plan --infer: the generation's meta bill with the weights quantised and the cache in the
// activation dtype, against the lesson's figures (W2, K1, K2) and the per-tensor count.
static void test_plan_infer(void **state) {
    (void)state;
    const json_int_t P = 134515008;
    json_t *root = plan_json("--infer --model smollm2-135m");
    assert_int_equal(cat_peak(root, "weight"), 4 * P);    // W1
    assert_int_equal(jinf(root, "cache_bytes"), 1152000); // K2: 25 tokens x 46,080
    assert_int_equal(jint(root, "closed_form", "kv_cache"), 1152000);
    assert_int_equal(cat_peak(root, "gradient"), 0);
    json_int_t act = cat_peak(root, "activation");
    assert_int_equal(jint(root, "per_gpu", "total_bytes"), 4 * P + 1152000 + act + 2000000000LL);
    json_decref(root);
    root = plan_json("--infer --model smollm2-135m --dtype bf16");
    assert_int_equal(cat_peak(root, "weight"), 2 * P); // W2: 269 MB
    assert_int_equal(jinf(root, "cache_bytes"), 576000);
    json_decref(root);
    const struct {
        const char *args;
        int bits;
        long group;
        int norm_bits;
    } q[] = {{"--weight-dtype int8", 8, 0, 32},
             {"--weight-dtype int4", 4, 32, 32},
             {"--weight-dtype int4 --group-size 128", 4, 128, 32},
             {"--weight-dtype int4 --dtype bf16", 4, 32, 16}};
    for (int i = 0; i < 4; i++) {
        char a[256];
        snprintf(a, sizeof a, "--infer --model smollm2-135m %s", q[i].args);
        root = plan_json(a);
        json_int_t want = expected_weights("smollm2-135m", q[i].bits, q[i].group, q[i].norm_bits);
        if (cat_peak(root, "weight") != want)
            print_error("%s: weights %lld, expected %lld\n", a, (long long)cat_peak(root, "weight"), (long long)want);
        assert_int_equal(cat_peak(root, "weight"), want);
        assert_int_equal(jinf(root, "weights_closed_form"), want);
        assert_int_equal(jinf(root, "group_size"), q[i].group);
        json_decref(root);
    }
    // W2: int8 about 135 MB, int4 about 67 MB before its scales (P / 32 x 2 bytes of them).
    assert_true(llabs(expected_weights("smollm2-135m", 8, 0, 32) - 134515008) < 1000000);
    assert_true(llabs(expected_weights("smollm2-135m", 4, 32, 32) - (67257504 + 134515008 / 16)) < 1000000);
    // New tokens grow the cache one token each (but the last, which is only chosen).
    root = plan_json("--infer --model smollm2-135m --new-tokens 5 --framework lean");
    assert_int_equal(jinf(root, "cache_bytes"), 46080 * 29);
    json_decref(root);
    // transformers' DynamicCache grows by torch.cat: the last layer's old keys (28 tokens) beside.
    root = plan_json("--infer --model smollm2-135m --new-tokens 5");
    assert_int_equal(jinf(root, "cache_bytes"), 46080 * 29 + 28 * 3 * 64 * 4);
    json_decref(root);
    // Device fit: the largest batch fits, one more does not; the overhead is counted.
    root = plan_json("--infer --model llama-3-8b --dtype bf16 --seq-len 4096 --device-memory 24GB --overhead 1GB");
    json_int_t best = jint(root, "fit", "largest_batch");
    assert_int_equal(jint(root, "fit", "overhead_bytes"), 1000000000);
    assert_true(best >= 1);
    json_decref(root);
    char a[256];
    snprintf(a, sizeof a,
             "--infer --model llama-3-8b --dtype bf16 --seq-len 4096 --device-memory 24GB --overhead 1GB --batch %lld",
             (long long)best);
    root = plan_json(a);
    assert_true(json_is_true(json_object_get(json_object_get(root, "fit"), "fits")));
    json_decref(root);
    snprintf(a, sizeof a,
             "--infer --model llama-3-8b --dtype bf16 --seq-len 4096 --device-memory 24GB --overhead 1GB --batch %lld",
             (long long)best + 1);
    root = plan_json(a);
    assert_true(json_is_false(json_object_get(json_object_get(root, "fit"), "fits")));
    json_decref(root);
}

// Real runs compute every dtype but fp16 training (loss scaling): that one is a bill of meta
// mode, refused in one line.
static void test_dtype_real_or_meta(void **state) {
    (void)state;
    expect_failure("train --dtype fp16", 2, "--dtype fp16 trains in float16, which needs loss scaling");
    expect_failure("train --dtype fp16-mixed", 2, "it needs --meta");
    expect_failure("train --meta --dtype bf17", 2, "bf17");
    expect_failure("plan --dtype e4m3", 2, "--dtype");
    expect_failure("plan --weight-dtype int4", 2, "--infer");
    expect_failure("plan --infer --weight-dtype int3", 2, "int3");
    expect_failure("plan --infer --dtype bf16-mixed", 2, "mixed");
    expect_failure("plan --infer --weight-dtype int8 --group-size 64", 2, "--group-size");
    expect_failure("plan --infer --gpus 8", 2, "--gpus");
    run_result r;
    membill(&r, "train --meta --dtype fp32 --quiet");
    assert_int_equal(r.code, 0);
    membill(&r, "train --meta --dtype fp16 --attention flash --quiet");
    assert_int_equal(r.code, 0);
}

// The golden greedy tokens of the PyTorch reference, and the prompt they came from.
static void golden_tokens(const char *key, int64_t *out, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/tiny_tied/golden.safetensors", MEMBILL_GOLDEN_DIR);
    llama_st_file *f = NULL;
    ag_err err;
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
        snprintf(a, sizeof a, "infer --weights %s/tiny_tied --tokens %s --new-tokens 8 %s", MEMBILL_GOLDEN_DIR, prompt,
                 modes[m]);
        json_t *root = cli_run_json(a);
        json_t *row = json_array_get(json_object_get(root, "generated"), 0);
        assert_int_equal(json_array_size(row), 8);
        for (int t = 0; t < 8; t++) assert_int_equal(json_integer_value(json_array_get(row, t)), greedy[t]);
        assert_true(json_is_true(json_object_get(root, "teardown_all_zero")));
        json_decref(root);
    }
    // Two prompts of different lengths, left-padded into one batch.
    snprintf(a, sizeof a, "infer --weights %s/tiny_tied --tokens '%s;%s' --new-tokens 8", MEMBILL_GOLDEN_DIR, prompt,
             second);
    json_t *root = cli_run_json(a);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 8; t++)
            assert_int_equal(
                json_integer_value(json_array_get(json_array_get(json_object_get(root, "generated"), b), t)),
                batch[b * 8 + t]);
    json_decref(root);
}

static void test_infer_cache_bill(void **state) {
    (void)state;
    json_t *root = cli_run_json("infer --meta --new-tokens 2");
    json_t *cache = json_object_get(root, "cache");
    assert_int_equal(json_integer_value(json_object_get(cache, "bytes_per_token")), 46080);
    assert_int_equal(json_integer_value(json_object_get(cache, "after_prefill_bytes")), 1152000);
    assert_int_equal(json_integer_value(json_object_get(cache, "final_bytes")), 1152000 + 46080);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(cache, "shape_final"), 2)), 26);
    assert_int_equal(cat_peak(root, "weight"), 538060032);
    assert_int_equal(cat_peak(root, "gradient"), 0);
    assert_int_equal(cat_peak(root, "optimizer"), 0);
    // transformers' DynamicCache grows by torch.cat: when the last layer's keys are concatenated,
    // its old keys (25 tokens x 3 heads x 64 x 4) are still there beside the new.
    assert_int_equal(cat_peak(root, "cache"), 1152000 + 46080 + 25 * 3 * 64 * 4);
    json_decref(root);
    root = cli_run_json("infer --meta --new-tokens 2 --framework lean"); // chunks: never copied
    assert_int_equal(cat_peak(root, "cache"), 1152000 + 46080);
    json_decref(root);
}

static void test_compare(void **state) {
    (void)state;
    char a[512], svg[8192];
    snprintf(a, sizeof a, "compare --meta --svg %s/compare.svg", dir);
    json_t *root = cli_run_json(a);
    snprintf(a, sizeof a, "%s/compare.svg", dir);
    slurp(a, svg, sizeof svg);
    assert_non_null(strstr(svg, "<svg"));
    json_t *tr = json_object_get(json_object_get(root, "train"), "categories");
    json_t *in = json_object_get(json_object_get(root, "infer"), "categories");
    assert_int_equal(json_integer_value(json_object_get(tr, "optimizer")), 1076120064);
    assert_int_equal(json_integer_value(json_object_get(in, "optimizer")), 0);
    assert_int_equal(json_integer_value(json_object_get(in, "weight")), 538060032);
    assert_true(json_integer_value(json_object_get(in, "cache")) > 0);
    // The default for-loop Adam peaks at the embedding's two temporaries (49152 x 576 x 4 bytes
    // each) on top of the four copies.
    assert_int_equal(json_integer_value(json_object_get(tr, "temporary")), 2 * 113246208);
    json_int_t train_total = json_integer_value(json_object_get(json_object_get(root, "train"), "total_peak_bytes"));
    json_int_t infer_total = json_integer_value(json_object_get(json_object_get(root, "infer"), "total_peak_bytes"));
    assert_int_equal(train_total, 2152240128 + 2 * 113246208);
    double ratio = json_real_value(json_object_get(root, "ratio"));
    assert_true(fabs(ratio - (double)train_total / (double)infer_total) < 1e-6);
    assert_true(ratio > 4.2 && ratio < 4.5); // four copies and two embeddings against one copy
    json_decref(root);
    root = cli_run_json("compare --meta --adam-impl fused");
    ratio = json_real_value(json_object_get(root, "ratio"));
    assert_true(ratio > 3.5 && ratio < 4.1); // four copies against one, plus what each adds
    assert_int_equal(json_integer_value(json_object_get(json_object_get(root, "train"), "total_peak_bytes")),
                     2152240128);
    json_decref(root);
}

// --adam-impl on SmolLM2-135M in meta mode (W = 538,060,032 bytes of weights, E = 113,246,208 of
// embedding, the largest parameter and the first): the four copies and the state are the same in
// every implementation; for-loop adds two embedding-sized temporaries at its peak, foreach one
// copy of the whole model, fused none (lean; --framework pytorch adds the tied embedding's
// separate gradients in backward). plan defaults to foreach.
static void test_adam_impl(void **state) {
    (void)state;
    const long long W = 538060032, E = 113246208;
    const struct {
        const char *args, *impl;
        long long temporary;
    } cases[] = {{"train --meta --framework lean", "for-loop", 2 * E},
                 {"train --meta --adam-impl for-loop --framework lean", "for-loop", 2 * E},
                 {"train --meta --adam-impl foreach --framework lean", "foreach", W},
                 {"train --meta --adam-impl fused --framework lean", "fused", 0},
                 {"train --meta --optimizer adamw --adam-impl foreach --framework lean", "foreach", W}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *root = cli_run_json(cases[i].args);
        assert_string_equal(json_string_value(json_object_get(json_object_get(root, "run"), "adam_impl")),
                            cases[i].impl);
        assert_int_equal(cat_peak(root, "optimizer"), 2 * W);
        assert_int_equal(cat_peak(root, "temporary"), cases[i].temporary);
        assert_int_equal(json_integer_value(json_object_get(json_object_get(root, "four_copies"), "total_bytes")),
                         4 * W);
        assert_int_equal(json_integer_value(json_object_get(json_object_get(root, "peak"), "total_bytes")),
                         4 * W + cases[i].temporary);
        assert_all_live_zero(root);
        json_decref(root);
    }
    json_t *root = cli_run_json("train --meta --optimizer sgd-momentum");
    assert_true(json_is_null(json_object_get(json_object_get(root, "run"), "adam_impl")));
    // No optimizer temporaries; the tied embedding's two gradients wait apart in backward.
    assert_int_equal(cat_peak(root, "temporary"), 2 * E);
    json_decref(root);
    root = cli_run_json("train --meta --optimizer sgd-momentum --framework lean");
    assert_int_equal(cat_peak(root, "temporary"), 0);
    json_decref(root);
    root = cli_run_json("plan");
    assert_int_equal(cat_peak(root, "temporary"), W);
    json_decref(root);
    run_result r;
    membill(&r, "train --meta --adam-impl foreach");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "tokens, adam (foreach) lr 1e-05, float32"));
    membill(&r, "train --meta --optimizer sgd");
    assert_non_null(strstr(r.out, "tokens, sgd lr 1e-05, float32"));
    expect_failure("train --optimizer sgd --adam-impl fused", 2, "--adam-impl");
    expect_failure("compare --optimizer none --adam-impl foreach", 2, "--optimizer none");
    expect_failure("plan --infer --adam-impl foreach", 2, "--adam-impl");
    expect_failure("train --adam-impl multi-tensor", 2, "for-loop,foreach,fused");
    // A budget one byte under the for-loop's peak stops at the embedding's denominator, before
    // any weight moved.
    char a[256];
    snprintf(a, sizeof a, "train --meta --budget %lldB", 4 * W + 2 * E - 1);
    expect_failure(a, 1, "model.embed_tokens.weight:denom");
    snprintf(a, sizeof a, "train --meta --budget %lldB --json -", 4 * W + 2 * E - 1);
    membill(&r, a);
    assert_int_equal(r.code, 1);
    root = json_loads(r.out, 0, NULL);
    assert_non_null(root);
    json_t *e = json_object_get(root, "error");
    assert_string_equal(json_string_value(json_object_get(e, "category")), "temporary");
    assert_string_equal(json_string_value(json_object_get(e, "site")), "model.embed_tokens.weight:denom");
    json_decref(root);
}

static void test_check_memory_claims(void **state) {
    (void)state;
    json_t *root = cli_run_json("check --no-speed");
    json_t *rows = json_object_get(root, "claims");
    assert_int_equal(json_array_size(rows), 21); // 18 of memory, and Q1, Q3, B1 from real runs
    assert_int_equal(json_integer_value(json_object_get(root, "failed")), 0);
    // Q3 and B1 are claims about trained weights: on random ones they are shown, not judged
    assert_int_equal(json_integer_value(json_object_get(root, "not_measurable")), 2);
    assert_string_equal(json_string_value(json_object_get(root, "weights")), "random");
    size_t i;
    json_t *row;
    int quant = 0;
    json_array_foreach(rows, i, row) {
        const char *id = json_string_value(json_object_get(row, "id"));
        bool trained_only = id && (!strcmp(id, "Q3") || !strcmp(id, "B1"));
        assert_true(trained_only ? json_is_null(json_object_get(row, "pass"))
                                 : json_is_true(json_object_get(row, "pass")));
        assert_int_equal(json_is_true(json_object_get(row, "measurable")), !trained_only);
        if (trained_only)
            assert_non_null(
                strstr(json_string_value(json_object_get(row, "measured_text")), "not measurable on random weights"));
        quant += id && (!strcmp(id, "Q1") || trained_only);
    }
    assert_int_equal(quant, 3);
    json_decref(root);
}

// Meta mode and a real run agree to the byte on every tensor category: SmolLM2-360M at 64
// tokens, batch 2 (the 135M model is checked in test_smollm2_training_step_bill).
static void test_meta_equals_real_360m(void **state) {
    (void)state;
    const char *cats[] = {"weight", "gradient", "optimizer", "activation", "cache", "temporary"};
    json_t *real = cli_run_json("train --model smollm2-360m --seq-len 64 --batch 2");
    json_t *meta = cli_run_json("train --model smollm2-360m --seq-len 64 --batch 2 --meta");
    for (int i = 0; i < 6; i++) {
        assert_int_equal(cat_peak(meta, cats[i]), cat_peak(real, cats[i]));
        json_int_t a = json_integer_value(
            json_object_get(json_object_get(json_object_get(real, "categories"), cats[i]), "allocations"));
        json_int_t b = json_integer_value(
            json_object_get(json_object_get(json_object_get(meta, "categories"), cats[i]), "allocations"));
        assert_int_equal(a, b);
    }
    assert_int_equal(cat_peak(real, "weight"), 361821120LL * 4);
    json_decref(real);
    json_decref(meta);
}

// A real run and its meta run, category by category and allocation by allocation.
static void assert_meta_equals_real(const char *args) {
    const char *cats[] = {"weight", "gradient", "optimizer", "activation", "cache", "temporary"};
    char a[1100];
    snprintf(a, sizeof a, "%s", args);
    json_t *real = cli_run_json(a);
    strcat(a, " --meta");
    json_t *meta = cli_run_json(a);
    for (int i = 0; i < 6; i++) {
        json_t *rc = json_object_get(json_object_get(real, "categories"), cats[i]);
        json_t *mc = json_object_get(json_object_get(meta, "categories"), cats[i]);
        if (json_integer_value(json_object_get(rc, "peak_bytes")) !=
                json_integer_value(json_object_get(mc, "peak_bytes")) ||
            json_integer_value(json_object_get(rc, "allocations")) !=
                json_integer_value(json_object_get(mc, "allocations")))
            fail_msg("%s: %s differs between the real run and meta mode", args, cats[i]);
    }
    json_decref(real);
    json_decref(meta);
}

// Every dtype setting a real run computes bills what its meta run bills: training on the tiny
// model under each framework and attention, generation with the cache.
static void test_meta_equals_real_dtypes(void **state) {
    (void)state;
    static const char *const settings[] = {
        "train --dtype bf16 --framework lean",
        "train --dtype bf16 --framework pytorch",
        "train --dtype bf16 --framework pytorch-1.13",
        "train --dtype bf16-mixed --framework pytorch --steps 2",
        "train --dtype bf16-mixed-fp32-grads --framework lean --adam-impl foreach",
        "train --dtype autocast-bf16 --framework pytorch --checkpointing",
        "train --dtype bf16 --attention flash --framework lean",
        "train --dtype bf16-mixed --attention flash --framework pytorch",
        "train --dtype autocast-bf16 --attention flash",
        "infer --dtype bf16 --attention flash --new-tokens 4",
        "infer --dtype bf16 --new-tokens 4",
        "infer --dtype fp16 --new-tokens 4 --framework lean",
        "infer --weight-dtype int8 --new-tokens 4",
        "infer --weight-dtype int4 --group-size 16 --new-tokens 4",
        "infer --dtype bf16 --weight-dtype int4 --new-tokens 4 --framework lean",
    };
    char a[1024];
    for (size_t k = 0; k < sizeof settings / sizeof settings[0]; k++) {
        snprintf(a, sizeof a, "%s --config %s/tiny_tied/config.json", settings[k], MEMBILL_GOLDEN_DIR);
        assert_meta_equals_real(a);
    }
}

// SmolLM2-135M's bf16-mixed step: the same, and its weights at 2 bytes a parameter.
static void test_meta_equals_real_dtypes_smollm2(void **state) {
    (void)state;
    assert_meta_equals_real("train --dtype bf16-mixed --seq-len 25");
    json_t *real = cli_run_json("train --dtype bf16-mixed --seq-len 25");
    assert_int_equal(cat_peak(real, "weight"), 134515008LL * 2);
    json_decref(real);
}

// The whole check, speed claims included (real runs of SmolLM2-135M).
static void test_check_all_claims(void **state) {
    (void)state;
    json_t *root = cli_run_json("check");
    assert_int_equal(json_array_size(json_object_get(root, "claims")), 25);
    assert_int_equal(json_integer_value(json_object_get(root, "failed")), 0);
    json_decref(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_model_outputs),
        cmocka_unit_test(test_meta_equals_real_dtypes),
        cmocka_unit_test(test_train_checkpointing),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_budget_stops_the_run),
        cmocka_unit_test(test_plan_closed_form_sweep),
        cmocka_unit_test(test_plan_closed_form_qwen_loss),
        cmocka_unit_test(test_plan_closed_form_gpt_oss),
        cmocka_unit_test(test_plan_closed_form_deepseek_v3),
        cmocka_unit_test(test_deepseek_v3_mtp_said),
        cmocka_unit_test(test_mla_cache_refused),
        cmocka_unit_test(test_plan_closed_form_routing),
        cmocka_unit_test(test_plan_gemma2_lora_not_closed),
        cmocka_unit_test(test_plan_zero_and_fit),
        cmocka_unit_test(test_plan_dtype_bytes_per_param),
        cmocka_unit_test(test_plan_zero_formulas),
        cmocka_unit_test(test_plan_closed_form_dtypes),
        cmocka_unit_test(test_plan_closed_form_lora),
        cmocka_unit_test(test_plan_infer),
        cmocka_unit_test(test_dtype_real_or_meta),
        cmocka_unit_test(test_infer_matches_reference),
        cmocka_unit_test(test_infer_cache_bill),
        cmocka_unit_test(test_compare),
        cmocka_unit_test(test_adam_impl),
    };
    const struct CMUnitTest heavy[] = {
        cmocka_unit_test(test_smollm2_training_step_bill),
        cmocka_unit_test(test_meta_equals_real_360m),
        cmocka_unit_test(test_check_memory_claims),
        cmocka_unit_test(test_check_all_claims),
        cmocka_unit_test(test_meta_equals_real_dtypes_smollm2),
    };
    int only_heavy = getenv("MEMBILL_HEAVY") != NULL;
    return only_heavy ? cmocka_run_group_tests_name("smollm2", heavy, cli_run_make_dir, cli_run_remove_dir)
                      : cmocka_run_group_tests_name("cli", tests, cli_run_make_dir, cli_run_remove_dir);
}
