// Inputs at their limits, on the command line and in files: non-finite values in a real run,
// sizes past the maximum, options that do not go together, a weights file whose config comes
// from elsewhere, a checkpoint of more shards than the open-file limit, "did you mean", Ctrl-C.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_run.h"
#include "model.h"

#define dir cli_run_dir

static void expect(const char *args, int code, const char *needle) {
    run_result r;
    membill(&r, args);
    if (r.code != code || !strstr(r.err, needle) || count_lines(r.err) != (code ? 1 : 0))
        fail_msg("%s: exit %d, stderr '%s' (expected %d and '%s')", args, r.code, r.err, code, needle);
}

// Sets float32 element i of tensor `name` in a safetensors file to v (every element for i < 0;
// i >= 0 with `row` set: every element of row i).
static void patch(const char *path, const char *name, int64_t i, bool row, float v) {
    llama_st_file *f = NULL;
    ag_err err;
    assert_int_equal(llama_st_open(&f, path, &err), 0);
    const llama_st_tensor *t = llama_st_find(f, name);
    assert_non_null(t);
    assert_int_equal(t->dtype, LLAMA_ST_F32);
    FILE *w = fopen(path, "r+b");
    uint8_t len8[8];
    assert_int_equal(fread(len8, 1, 8, w), 8);
    uint64_t start = 8;
    for (int k = 0; k < 8; k++) start += (uint64_t)len8[k] << (8 * k);
    int64_t cols = t->shape[t->ndim - 1],
            lo = i < 0 ? 0
                 : row ? i * cols
                       : i,
            hi = i < 0 ? (int64_t)t->numel
                 : row ? lo + cols
                       : i + 1;
    assert_int_equal(fseek(w, (long)(start + t->offset + 4 * (uint64_t)lo), SEEK_SET), 0);
    for (int64_t k = lo; k < hi; k++) assert_int_equal(fwrite(&v, 4, 1, w), 1);
    fclose(w);
    llama_st_close(f);
}

// A copy of a golden model's weights in the test's folder.
static const char *weights_copy(char *buf, size_t len, const char *model, const char *name) {
    snprintf(buf, len, "%s/%s", dir, name);
    sh("cp %s/%s/model.safetensors %s", MEMBILL_GOLDEN_DIR, model, buf);
    return buf;
}

// A NaN in a weight, an infinite gradient behind a finite loss, weights that SGD drives to
// infinity in the first step, an adapter's lora_alpha of 1e300: each a failed run (exit 1)
// naming the step, the phase and where; never a loss of "nan" reported as a result.
static void test_non_finite_values(void **state) {
    (void)state;
    char w[512], a[2048];
    weights_copy(w, sizeof w, "tiny_tied", "nan.safetensors");
    patch(w, "model.layers.0.mlp.down_proj.weight", 40, false, NAN);
    const char *tied = MEMBILL_GOLDEN_DIR "/tiny_tied/config.json";
    const char *frameworks[] = {"pytorch", "lean"};
    for (int k = 0; k < 2; k++) {
        snprintf(a, sizeof a, "train --config %s --weights %s --framework %s --json %s/nan.json", tied, w,
                 frameworks[k], dir);
        expect(a, 1, "step 1, forward: non-finite logits: nan at position 0");
        expect(a, 1, "the weight model.layers.0.mlp.down_proj.weight holds nan");
        expect(a, 1, "the first op that saved one is rmsnorm at layers.1.input_layernorm");
    }
    snprintf(a, sizeof a, "infer --config %s --weights %s --new-tokens 3", tied, w);
    expect(a, 1, "generate, prefill 0: non-finite logits: nan in row 0 at id 0 (lm_head)");
    snprintf(a, sizeof a, "compare --config %s --weights %s --new-tokens 3", tied, w);
    expect(a, 1, "non-finite logits");
    // The final norm's weight 0 and lm_head's row 5 near float32's largest: all ids 5, the
    // logits are 0 and the loss log(256), finite, but the norm's gradient overflows.
    const char *untied = MEMBILL_GOLDEN_DIR "/tiny_untied/config.json";
    weights_copy(w, sizeof w, "tiny_untied", "inf_grad.safetensors");
    patch(w, "model.norm.weight", -1, false, 0.0f);
    patch(w, "lm_head.weight", 5, true, 3.4e38f);
    snprintf(a, sizeof a, "train --config %s --weights %s --tokens 5,5,5,5,5,5,5,5", untied, w);
    expect(a, 1, "step 1, backward: non-finite gradient: the gradient of model.norm.weight holds -inf");
    // lm_head's row 5 at 1e30 instead: every gradient finite, but SGD's step at lr 1e6 lifts the
    // norm's weight to ~1e36, and the second forward's logits overflow.
    patch(w, "lm_head.weight", 5, true, 1e30f);
    snprintf(a, sizeof a, "train --config %s --weights %s --tokens 5,5,5,5,5,5,5,5 --optimizer sgd --lr 1e6 --steps 3",
             untied, w);
    expect(a, 1, "step 2, forward: non-finite logits: inf");
    // the same weights for one step: finite throughout
    snprintf(a, sizeof a, "train --config %s --weights %s --tokens 5,5,5,5,5,5,5,5 --optimizer sgd --lr 1e6 --quiet",
             untied, w);
    expect(a, 0, "");
    // an adapter whose lora_alpha the command line would refuse (above 1e9)
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --lora-rank 2 --save-adapter %s/adapter --quiet",
             MEMBILL_GOLDEN_DIR, dir);
    expect(a, 0, "");
    char path[512];
    snprintf(path, sizeof path, "%s/adapter/adapter_config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    assert_non_null(cfg);
    json_object_set_new(cfg, "lora_alpha", json_real(1e300));
    assert_int_equal(json_dump_file(cfg, path, 0), 0);
    json_decref(cfg);
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --adapter %s/adapter", MEMBILL_GOLDEN_DIR, dir);
    expect(a, 1, "adapter_config.json: LoRA alpha 1e+300: expected a number from 1e-09 to 1e+09");
    snprintf(a, sizeof a, "infer --weights %s/tiny_tied --adapter %s/adapter", MEMBILL_GOLDEN_DIR, dir);
    expect(a, 1, "adapter_config.json: LoRA alpha 1e+300");
    // the same alpha from the command line is a usage error, with the same bounds
    expect("train --lora-rank 2 --lora-alpha 1e300 --meta", 2, "--lora-alpha expects a number from 1e-09 to 1e+09");
}

// A size with its unit past the maximum says the range, not that it needs a unit.
static void test_sizes_at_their_limits(void **state) {
    (void)state;
    const struct {
        const char *args, *expect;
    } cases[] = {
        {"train --meta --budget 9223372036854775808B",
         "--budget expects a size from 1B to 1000000TB (1,000,000,000,000,000,000 bytes), not '9223372036854775808B'"},
        {"plan --device-memory 9223372036854775808B",
         "--device-memory expects a size from 1B to 1,000,000,000,000,000,000 bytes, not '9223372036854775808B'"},
        {"plan --device-memory 1e30GB", "--device-memory expects a size from 1B to"},
        {"plan --overhead 9223372036854775808B",
         "--overhead expects a size from 0B to 1000TB (1,000,000,000,000,000 bytes)"},
        {"train --meta --budget 1e30GB", "--budget expects a size from 1B to 1000000TB"},
        {"plan --device-memory 0B", "--device-memory expects a size from 1B to"},
        {"train --meta --budget 80", "--budget expects a size with its unit"},
        {"train --meta --budget lots", "--budget expects a size with its unit"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect(cases[i].args, 2, cases[i].expect);
    run_result r;
    membill(&r, "train --meta --budget 1000000TB --quiet");
    assert_int_equal(r.code, 0); // the maximum itself
    membill(&r, "plan --device-memory 1000000000000000000B --quiet");
    assert_int_equal(r.code, 0);
}

// Options that set up something the rest of the command does not have.
static void test_options_that_do_not_go_together(void **state) {
    (void)state;
    const char *cases[] = {"train --zero 1 --prefetch-layers 2", "train --zero 2 --prefetch-layers 0",
                           "train --zero 0 --prefetch-layers 1", "plan --zero 1 --prefetch-layers 2",
                           "plan --gpus 8 --prefetch-layers 2"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect(cases[i], 2,
               "--prefetch-layers gathers the weights of the blocks ahead, which only --zero 3 and --fsdp shard");
    run_result r;
    membill(&r, "plan --gpus 8 --zero 3 --prefetch-layers 2 --quiet");
    assert_int_equal(r.code, 0);
    membill(&r, "plan --gpus 8 --fsdp full-shard --prefetch-layers 2 --quiet");
    assert_int_equal(r.code, 0);
}

// Each tensor of the file `from` in a shard of its own under folder, and their index.
static void one_shard_each(const char *from, const char *folder) {
    llama_st_file *f = NULL;
    ag_err err;
    assert_int_equal(llama_st_open(&f, from, &err), 0);
    json_t *map = json_object();
    for (size_t i = 0; i < llama_st_count(f); i++) {
        const llama_st_tensor *t = llama_st_get(f, i);
        float *data = malloc(t->numel * sizeof(float) + 1);
        assert_int_equal(llama_st_read_f32(f, t, data, t->numel, &err), 0);
        char name[64], path[1024];
        snprintf(name, sizeof name, "model-%05zu.safetensors", i + 1);
        snprintf(path, sizeof path, "%s/%s", folder, name);
        FILE *out = fopen(path, "wb");
        int ndim = t->ndim;
        int64_t shape[1][LLAMA_ST_WRITE_MAX_DIMS] = {{0}};
        memcpy(shape[0], t->shape, sizeof(int64_t) * (size_t)ndim);
        const float *d[1] = {data};
        assert_int_equal(
            llama_st_write_f32_file(out, 1, &t->name, &ndim, (const int64_t(*)[LLAMA_ST_WRITE_MAX_DIMS])shape, d, &err),
            0);
        fclose(out);
        free(data);
        json_object_set_new(map, t->name, json_string(name));
    }
    llama_st_close(f);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", folder);
    json_t *index = json_pack("{s:{}, s:o}", "metadata", "weight_map", map);
    assert_int_equal(json_dump_file(index, path, 0), 0);
    json_decref(index);
}

static double loss_of(const char *args) {
    json_t *root = cli_run_json(args);
    double loss = json_real_value(json_object_get(root, "loss"));
    json_decref(root);
    return loss;
}

// A checkpoint of 1,109 shards (a 123-block model, one tensor a shard) reads under an open-file
// limit of 256, with the same loss as its single file: no descriptor is held per shard.
static void test_more_shards_than_open_files(void **state) {
    (void)state;
    char folder[256], a[2048], cfg[512], single[512];
    snprintf(folder, sizeof folder, "%s/many", dir);
    sh("mkdir -p %s", folder);
    snprintf(cfg, sizeof cfg, "%s/config.json", folder);
    FILE *f = fopen(cfg, "w");
    fputs(
        "{\"model_type\": \"llama\", \"hidden_size\": 8, \"intermediate_size\": 8, \"num_hidden_layers\": 123, "
        "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"vocab_size\": 32, \"max_position_embeddings\": 64, "
        "\"tie_word_embeddings\": true}",
        f);
    fclose(f);
    snprintf(single, sizeof single, "%s/single.safetensors", dir);
    snprintf(a, sizeof a, "train --config %s --optimizer none --save-weights %s --quiet", cfg, single);
    expect(a, 0, "");
    one_shard_each(single, folder);
    snprintf(a, sizeof a, "train --weights %s --config %s --tokens 1,2,3,4 --optimizer none", single, cfg);
    double want = loss_of(a);
    // through a shell that lowers its limit first (the folder holds the config: no --config)
    char cmd[4096], out[512];
    snprintf(out, sizeof out, "%s/many.json", dir);
    snprintf(cmd, sizeof cmd,
             "ulimit -n 256 && %s train --weights %s --tokens 1,2,3,4 --optimizer none --json %s --quiet 2>%s/many.err",
             MEMBILL_BIN, folder, out, dir);
    int st = system(cmd);
    char err[4096], p[600];
    snprintf(p, sizeof p, "%s/many.err", dir);
    slurp(p, err, sizeof err);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("%s: %s", cmd, err);
    json_t *root = json_load_file(out, 0, NULL);
    assert_non_null(root);
    assert_true(json_real_value(json_object_get(root, "loss")) == want);
    json_decref(root);
}

// An index (or a .safetensors file) given alone takes its config from --model or --config, the
// default preset without them; one that does not fit says so, and names the config beside it.
static void test_weights_file_and_its_config(void **state) {
    (void)state;
    char folder[256], a[2048];
    snprintf(folder, sizeof folder, "%s/split", dir);
    sh("mkdir -p %s && cp %s/tiny_tied/config.json %s/", folder, MEMBILL_GOLDEN_DIR, folder);
    char single[512];
    snprintf(single, sizeof single, "%s/tiny_tied/model.safetensors", MEMBILL_GOLDEN_DIR);
    one_shard_each(single, folder);
    snprintf(a, sizeof a, "train --weights %s/model.safetensors.index.json", folder);
    expect(a, 1, "the config expects [49152, 576]");
    expect(a, 1,
           "the config is the default preset smollm2-135m: a weights file takes its config from --model or "
           "--config; the folder's own is --config");
    snprintf(a, sizeof a, "train --weights %s/model.safetensors.index.json --model smollm2-360m", folder);
    expect(a, 1, "; the config is --model smollm2-360m");
    snprintf(a, sizeof a, "infer --weights %s --model llama-2-7b", single);
    expect(a, 1, "the config is --model llama-2-7b");
    snprintf(a, sizeof a, "train --weights %s/model.safetensors.index.json --config %s/config.json --quiet", folder,
             folder);
    expect(a, 0, "");
    snprintf(a, sizeof a, "train --weights %s --quiet", folder); // the folder reads its own config
    expect(a, 0, "");
}

// A typo of an option, a subcommand or a preset gets the name it most likely meant; a word that
// is near nothing gets the usual pointer to the list.
static void test_did_you_mean(void **state) {
    (void)state;
    const struct {
        const char *args, *expect;
    } cases[] = {
        {"train --seqlen 5", "membill train: unknown option '--seqlen' (did you mean --seq-len?)"},
        {"plan --modle x", "unknown option '--modle' (did you mean --model?)"},
        {"infer --new-token 3", "(did you mean --new-tokens?)"},
        {"trian", "membill: unknown command 'trian' (did you mean train?)"},
        {"paln --list", "unknown command 'paln' (did you mean plan?)"},
        {"help infre", "membill help: unknown command 'infre' (did you mean infer?)"},
        {"train --model llama3-8b --meta", "--model: unknown preset 'llama3-8b' (did you mean llama-3-8b?)"},
        {"plan --model smollm-135m", "(did you mean smollm2-135m?)"},
        {"plan --model llama-3.1-450b", "(did you mean llama-3.1-405b?)"},
        {"train --frobnicate", "unknown option '--frobnicate' (see membill train --help)"},
        {"fly", "unknown command 'fly' (see membill --help)"},
        {"plan --model gpt-5", "unknown preset 'gpt-5' (membill plan --list names them)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect(cases[i].args, 2, cases[i].expect);
}

// Ctrl-C in the middle of a run: one line saying where it stopped and that nothing was written,
// the user's file untouched, no temporary left, and the end a shell reports as 130 (the
// process ends by SIGINT, as a caller that stops on it expects).
static void test_interrupted_run(void **state) {
    (void)state;
    char keep[512], out[512], errp[512], grads[512];
    snprintf(keep, sizeof keep, "%s/keep.json", dir);
    snprintf(out, sizeof out, "%s/outs", dir);
    snprintf(grads, sizeof grads, "%s/outs/grads.safetensors", dir);
    snprintf(errp, sizeof errp, "%s/interrupted.err", dir);
    sh("mkdir -p %s && printf precious >%s", out, keep);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGINT, SIG_DFL); // as a terminal's foreground job has it
        FILE *e = freopen(errp, "w", stderr);
        FILE *o = freopen("/dev/null", "w", stdout);
        (void)e, (void)o;
        execl(MEMBILL_BIN, MEMBILL_BIN, "train", "--weights", MEMBILL_GOLDEN_DIR "/tiny_tied", "--steps", "100000",
              "--progress", "--json", keep, "--dump-grads", grads, (char *)NULL);
        _exit(127);
    }
    static char err[1 << 16];
    for (int tries = 0; tries < 600; tries++) { // until its third step is under way
        slurp(errp, err, sizeof err);
        if (strstr(err, "step 3/")) break;
        usleep(50000);
    }
    assert_non_null(strstr(err, "step 3/"));
    kill(pid, SIGINT);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT);
    slurp(errp, err, sizeof err);
    char *last = strstr(err, "membill train: interrupted (step ");
    if (!last) fail_msg("stderr: %s", err);
    assert_non_null(strstr(last, "); nothing was written\n"));
    assert_int_equal(count_lines(last), 1);
    char kept[64];
    slurp(keep, kept, sizeof kept);
    assert_string_equal(kept, "precious");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", out); // no output, no temporary
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_non_finite_values),
        cmocka_unit_test(test_sizes_at_their_limits),
        cmocka_unit_test(test_options_that_do_not_go_together),
        cmocka_unit_test(test_more_shards_than_open_files),
        cmocka_unit_test(test_weights_file_and_its_config),
        cmocka_unit_test(test_did_you_mean),
        cmocka_unit_test(test_interrupted_run),
    };
    return cmocka_run_group_tests(tests, cli_run_make_dir, cli_run_remove_dir);
}
