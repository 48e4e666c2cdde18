// membill plan's steady state: its headline is the total peak of a second training step (the
// optimizer's state kept from the first, the gradients set to none), the same figure as
// `membill train --meta --steps 2` for the same setting, for every preset; one device alone is
// that step replayed, and on several devices or under ZeRO a simulated rank.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"

#define dir cli_run_dir
#define NCATS 7 // the timeline's *_live columns: weight .. temporary, other

static const char *const cats[NCATS] = {"weight", "gradient", "optimizer", "activation", "cache", "temporary", "other"};

static json_int_t jget(json_t *o, const char *a, const char *b) {
    json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

static json_int_t step_peak(json_t *train, size_t i) {
    json_t *s = json_array_get(json_object_get(train, "steps"), i);
    assert_non_null(s);
    return jget(s, "peak_bytes", NULL);
}

// The presets as `membill plan --list` names them.
static int presets(char names[][32], int cap) {
    static run_result r;
    membill(&r, "plan --list");
    assert_int_equal(r.code, 0);
    int n = 0;
    char *save = NULL;
    char *line = strtok_r(r.out, "\n", &save); // the header
    while ((line = strtok_r(NULL, "\n", &save)) && n < cap)
        if (sscanf(line, "%31s", names[n]) == 1) n++;
    return n;
}

static void test_headline_is_train_step_2_for_every_preset(void **state) {
    (void)state;
    char names[32][32];
    int n = presets(names, 32);
    assert_true(n >= 10);
    // --adam-impl foreach: plan's default (train's is for-loop).
    const char *settings[] = {
        "--adam-impl foreach",
        "--seq-len 256 --batch 2 --dtype bf16-mixed --optimizer adamw --checkpointing --adam-impl "
        "foreach",
        "--seq-len 64 --dtype bf16 --optimizer sgd-momentum", "--optimizer none"};
    for (int p = 0; p < n; p++)
        for (size_t k = 0; k < sizeof settings / sizeof *settings; k++) {
            char a[512];
            // gpt-oss and deepseek-v3 run under the lean framework alone (docs/models.md)
            const char *fw =
                strncmp(names[p], "gpt-oss", 7) == 0 || strncmp(names[p], "deepseek", 8) == 0 ? " --framework lean" : "";
            assert_true(snprintf(a, sizeof a, "plan --model %s %s%s", names[p], settings[k], fw) < (int)sizeof a);
            json_t *plan = cli_run_json(a);
            assert_true(snprintf(a, sizeof a, "train --meta --steps 2 --model %s %s%s", names[p], settings[k], fw) <
                        (int)sizeof a);
            json_t *train = cli_run_json(a);
            json_int_t headline = jget(plan, "total_peak_bytes", NULL),
                       first = jget(plan, "first_step_peak_bytes", NULL);
            if (headline != step_peak(train, 1) || first != step_peak(train, 0))
                print_error("%s %s: plan %lld / %lld, train steps %lld / %lld\n", names[p], settings[k],
                            (long long)headline, (long long)first, (long long)step_peak(train, 1),
                            (long long)step_peak(train, 0));
            assert_int_equal(headline, step_peak(train, 1));
            assert_int_equal(headline, jget(train, "peak", "total_bytes"));
            assert_int_equal(first, step_peak(train, 0));
            assert_true(first <= headline);
            assert_int_equal(jget(plan, "peak", "total_bytes"), jget(train, "peak", "total_bytes"));
            for (int c = 0; c < NCATS; c++) {
                json_t *pc = json_object_get(json_object_get(plan, "categories"), cats[c]),
                       *tc = json_object_get(json_object_get(train, "categories"), cats[c]);
                assert_int_equal(jget(pc, "peak_bytes", NULL), jget(tc, "peak_bytes", NULL));
            }
            assert_true(jget(json_object_get(plan, "categories"), "temporary", "peak_bytes") >= 0);
            // One device, whole: the steady-state peak and the overhead allowance.
            json_t *g = json_object_get(plan, "per_gpu");
            assert_int_equal(jget(g, "total_bytes", NULL), headline + jget(g, "overhead", NULL));
            json_decref(plan);
            json_decref(train);
        }
}

// Phi-3-mini (the every-preset test above plans it too): the class, the count to the unit, and LoRA
// r 16 on all-linear, which on phi3 is the fused qkv_proj and gate_up_proj with o_proj and
// down_proj: PEFT's print_trainable_parameters for it says 25,165,824 of 3,846,245,376.
static void test_phi3_mini(void **state) {
    (void)state;
    json_t *plan = cli_run_json("plan --model phi-3-mini --seq-len 256 --lora-rank 16 --lora-targets all-linear");
    assert_string_equal(json_string_value(json_object_get(json_object_get(plan, "model"), "class")), "Phi3ForCausalLM");
    assert_int_equal(jget(plan, "model", "parameters"), 3821079552LL);
    assert_int_equal(jget(plan, "lora", "trainable_params"), 25165824LL);
    assert_int_equal(jget(plan, "lora", "all_params"), 3846245376LL);
    assert_string_equal(json_string_value(json_object_get(json_object_get(plan, "lora"), "targets")),
                        "o_proj,down_proj,qkv_proj,gate_up_proj");
    // the adapters' float32 gradients alone: none for the frozen base
    assert_int_equal(jget(json_object_get(plan, "categories"), "gradient", "peak_bytes"), 4 * 25165824LL);
    json_decref(plan);
}

// A ZeRO device's share of a category's live bytes, rounded up.
static uint64_t share(long long live, int c, int zero, long gpus) {
    bool sharded = (c == 0 && zero >= 3) || (c == 1 && zero >= 2) || (c == 2 && zero >= 1);
    return sharded ? ((uint64_t)live + (uint64_t)gpus - 1) / (uint64_t)gpus : (uint64_t)live;
}

typedef struct {
    uint64_t peak, at[NCATS];
} replayed;

// Step 2 of a --steps 2 timeline replayed by this test on its own: from the first row after
// step 1's optimizer phase to the teardown, each category at the device's share.
static replayed replay_csv(const char *path, int zero, long gpus) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char line[4096];
    assert_non_null(fgets(line, sizeof line, f)); // header
    long long live[NCATS] = {0};
    replayed out = {0};
    int state = 0; // 0 step 1, 1 in step 1's optimizer, 2 step 2, 3 done
    while (state < 3 && fgets(line, sizeof line, f)) {
        char *fields[5 + NCATS], *save = NULL;
        int nf = 0;
        for (char *t = strtok_r(line, ",\n", &save); t && nf < 5 + NCATS; t = strtok_r(NULL, ",\n", &save))
            fields[nf++] = t;
        assert_int_equal(nf, 5 + NCATS);
        const char *phase = fields[1];
        if (state == 0 && strcmp(phase, "optimizer") == 0) state = 1;
        if (state == 1 && strcmp(phase, "optimizer") != 0) {
            state = 2; // what was live as step 2 began
            for (int c = 0; c < NCATS; c++) out.at[c] = share(live[c], c, zero, gpus), out.peak += out.at[c];
        }
        if (state == 2 && strcmp(phase, "teardown") == 0) state = 3;
        if (state == 3) break;
        for (int c = 0; c < NCATS; c++) live[c] = atoll(fields[5 + c]);
        if (state != 2) continue;
        uint64_t t = 0, at[NCATS];
        for (int c = 0; c < NCATS; c++) t += at[c] = share(live[c], c, zero, gpus);
        if (t > out.peak) {
            out.peak = t;
            memcpy(out.at, at, sizeof at);
        }
    }
    fclose(f);
    assert_true(state == 3);
    return out;
}

// One device alone (no --gpus, no --zero) is step 2 of train's own timeline, replayed here:
// per_gpu's total and each category at that moment; own_peak each category's own peak. On
// several devices or under a ZeRO stage, the device is a simulated rank (its own run, compared
// with real ranks to the byte in test_zero): its rows add up to its total, and each stage holds
// less of the state it shards than the whole model does.
static void test_device_share_is_step_2_replayed(void **state) {
    (void)state;
    const char *models[] = {"smollm2-135m", "llama-3-8b"};
    const char *keys[] = {"weight", "gradient", "optimizer", "activation", "cache", "temporary"};
    for (int m = 0; m < 2; m++)
        for (int z = -1; z <= 3; z++) {
            char a[2048], csv[512];
            snprintf(csv, sizeof csv, "%s/steps.csv", dir);
            snprintf(a, sizeof a, "train --meta --steps 2 --adam-impl foreach --model %s --seq-len 512 --timeline %s",
                     models[m], csv);
            json_t *train = cli_run_json(a);
            if (z < 0)
                snprintf(a, sizeof a, "plan --model %s --seq-len 512", models[m]);
            else
                snprintf(a, sizeof a, "plan --model %s --seq-len 512 --gpus 8 --zero %d", models[m], z);
            json_t *plan = cli_run_json(a);
            replayed whole = replay_csv(csv, 0, 1);
            assert_int_equal(whole.peak, jget(plan, "total_peak_bytes", NULL));
            json_t *g = json_object_get(plan, "per_gpu");
            assert_int_equal(json_is_true(json_object_get(g, "simulated_rank")), z >= 0);
            json_int_t sum = jget(g, "overhead", NULL);
            for (int c = 0; c < 6; c++) sum += jget(g, keys[c], NULL);
            assert_int_equal(sum, jget(g, "total_bytes", NULL));
            assert_int_equal(jget(g, "step", NULL), 2);
            for (int c = 0; c < 6; c++) {
                json_int_t own =
                    jget(json_object_get(json_object_get(train, "categories"), keys[c]), "peak_bytes", NULL);
                if (z < 0) {
                    assert_int_equal(jget(g, keys[c], NULL), (json_int_t)whole.at[c]);
                    assert_int_equal(jget(g, "own_peak", keys[c]), own);
                }
                bool sharded = (c == 0 && z >= 3) || (c == 1 && z >= 2) || (c == 2 && z >= 1);
                if (sharded) assert_true(jget(g, "own_peak", keys[c]) < own);
                if (c == 2 && z == 0) assert_int_equal(jget(g, "own_peak", keys[c]), own);
            }
            if (z < 0)
                assert_int_equal(jget(g, "total_bytes", NULL), (json_int_t)whole.peak + jget(g, "overhead", NULL));
            json_decref(train);
            json_decref(plan);
        }
}

// The text names both figures; a generation keeps its one run and its headline.
// Each report answers its question before the detail: the line starting "answer: " comes before
// the table of categories and says what the JSON says (the fit, the first setting that would, the
// four copies, training over inference).
static const char *answer_line(const char *out) {
    const char *a = strstr(out, "\nanswer: "), *table = strstr(out, "\n  category");
    assert_non_null(a);
    assert_non_null(table);
    assert_true(a < table);
    return a + 1;
}

static void test_answer_first(void **state) {
    (void)state;
    static run_result r;
    const char *fit = "plan --model llama-3-8b --lora-rank 8 --seq-len 2048 --device-memory 24GB";
    membill(&r, fit);
    assert_int_equal(r.code, 0);
    const char *a = answer_line(r.out);
    const char *want = "answer: 72.22 GB on one device: does NOT fit a 24 GiB device; what would: ";
    assert_true(!strncmp(a, want, strlen(want)));
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s --dtype bf16 --checkpointing", fit);
    json_t *root = cli_run_json(cmd);
    assert_true(json_is_true(json_object_get(json_object_get(root, "fit"), "fits")));
    json_decref(root);
    assert_non_null(strstr(a, "what would: --dtype bf16 --checkpointing ("));
    membill(&r, "plan --model smollm2-360m --seq-len 256 --gpus 4 --zero 2 --device-memory 16GB");
    assert_true(!strncmp(answer_line(r.out), "answer: ", 8));
    assert_non_null(strstr(answer_line(r.out), "on each of 4 devices: fits a 16 GiB device\n"));
    membill(&r, "train --meta --seq-len 64");
    assert_int_equal(r.code, 0);
    a = answer_line(r.out);
    want = "answer: weights + gradients + optimizer state = 2.15 GB, 4.000 x the weights; total peak ";
    assert_true(!strncmp(a, want, strlen(want)));
    membill(&r, "compare --meta --seq-len 64 --new-tokens 4");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(answer_line(r.out), "answer: training's peak "));
}

static void test_text_and_infer(void **state) {
    (void)state;
    static run_result r;
    membill(&r, "plan --model llama-3-70b --seq-len 4096");
    assert_int_equal(r.code, 0);
    assert_int_equal(count_lines(r.err), 0);
    assert_non_null(strstr(r.out, "step 2, the steady state"));
    assert_non_null(strstr(r.out, "step 1 peak"));
    assert_non_null(strstr(r.out, "above the four copies:"));
    assert_non_null(strstr(r.out, "\n  temporary   "));
    json_t *root = cli_run_json("plan --infer --model smollm2-135m");
    assert_null(json_object_get(root, "first_step_peak_bytes"));
    assert_int_equal(jget(root, "total_peak_bytes", NULL), jget(root, "peak", "total_bytes"));
    json_t *g = json_object_get(root, "per_gpu");
    assert_int_equal(jget(g, "temporary", NULL), 0);
    assert_int_equal(jget(root, "inference", "temporary_bytes"), 0);
    assert_int_equal(jget(g, "total_bytes", NULL), jget(g, "weight", NULL) + jget(g, "cache", NULL) +
                                                       jget(g, "activation", NULL) + jget(g, "temporary", NULL) +
                                                       jget(g, "overhead", NULL));
    json_decref(root);
    // The largest batch that fits does, on the steady state's figure; one more does not.
    root = cli_run_json("plan --model smollm2-360m --seq-len 256 --gpus 4 --zero 2 --device-memory 16GB");
    json_int_t best = jget(root, "fit", "largest_batch");
    assert_true(best >= 1);
    json_decref(root);
    char a[256];
    for (int extra = 0; extra < 2; extra++) {
        snprintf(a, sizeof a,
                 "plan --model smollm2-360m --seq-len 256 --gpus 4 --zero 2 --device-memory 16GB --batch %lld",
                 (long long)best + extra);
        root = cli_run_json(a);
        assert_int_equal(jget(root, "per_gpu", "total_bytes") <= 16LL << 30, extra == 0);
        assert_int_equal(json_is_true(json_object_get(json_object_get(root, "fit"), "fits")), extra == 0);
        json_decref(root);
    }
}

// The framework line and the JSON name the family's own transformers class.
static void test_class_named(void **state) {
    (void)state;
    static run_result r;
    membill(&r, "plan --model mistral-7b --framework pytorch-1.13 --seq-len 64");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "transformers' MistralForCausalLM on PyTorch 1.13"));
    assert_null(strstr(r.out, "LlamaForCausalLM"));
    json_t *root = cli_run_json("plan --model llama-2-7b --seq-len 64");
    assert_string_equal(json_string_value(json_object_get(json_object_get(root, "model"), "class")),
                        "LlamaForCausalLM");
    json_decref(root);
}

// --ep: a rank holds its share of every sparse layer's experts (all the rest replicated), routes
// its tokens to the experts' ranks and back; worst routing piles every rank's tokens on rank 0's.
static void test_expert_parallel(void **state) {
    (void)state;
    const json_int_t P = 30532122624LL, routed = 48LL * 128 * 3 * 2048 * 768; // Qwen3-30B-A3B
    json_t *ep = cli_run_json("plan --model qwen3-30b-a3b --gpus 4 --ep 4 --seq-len 256");
    json_t *dp = cli_run_json("plan --model qwen3-30b-a3b --gpus 4 --seq-len 256");
    json_t *worst = cli_run_json("plan --model qwen3-30b-a3b --gpus 4 --ep 4 --seq-len 256 --routing worst");
    json_t *g = json_object_get(ep, "per_gpu");
    assert_int_equal(jget(g, "weight", NULL), 4 * (P - routed / 4 * 3));
    assert_int_equal(jget(g, "gradient", NULL), 4 * (P - routed / 4 * 3)); // every local expert reached
    assert_int_equal(jget(json_object_get(dp, "per_gpu"), "weight", NULL), 4 * P);
    // the same rows through a rank's experts (4 ranks x their share), plus the all-to-all buffers
    json_int_t a_ep = jget(json_object_get(g, "own_peak"), "activation", NULL),
               a_dp = jget(json_object_get(json_object_get(dp, "per_gpu"), "own_peak"), "activation", NULL),
               a_worst = jget(json_object_get(json_object_get(worst, "per_gpu"), "own_peak"), "activation", NULL);
    assert_true(a_ep > a_dp && a_ep < a_dp * 3 / 2);
    assert_true(a_worst > 2 * a_ep); // 8 of rank 0's experts get every rank's tokens
    assert_int_equal(jget(json_object_get(ep, "run"), "ep", NULL), 4);
    assert_int_equal(jget(json_object_get(ep, "run"), "all_to_all_bytes_per_step", NULL),
                     48LL * 4 * 256 * 8 * 2048 * 4 / 4 * 3);
    json_decref(ep), json_decref(dp), json_decref(worst);
    static run_result r;
    membill(&r, "plan --model qwen3-30b-a3b --gpus 4 --ep 3");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "--ep 3"));
    membill(&r, "plan --model llama-2-7b --gpus 4 --ep 4");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "no experts"));
}

// LoRA's closed form walks dense blocks only: over a mixture of experts it gives no activation
// figure and says why, where a dense model's equals the meta bill.
static void test_lora_closed_form_dense_only(void **state) {
    (void)state;
    json_t *moe = cli_run_json("plan --model qwen1.5-moe-a2.7b --lora-rank 8 --seq-len 64");
    json_t *dense = cli_run_json("plan --model mistral-7b --lora-rank 8 --seq-len 64");
    assert_true(json_is_null(json_object_get(json_object_get(moe, "closed_form"), "activation")));
    assert_int_equal(jget(json_object_get(dense, "closed_form"), "activation", NULL),
                     jget(json_object_get(dense, "categories"), "activation", "peak_bytes"));
    json_decref(moe), json_decref(dense);
    static run_result r;
    membill(&r, "plan --model qwen1.5-moe-a2.7b --lora-rank 8 --seq-len 64");
    assert_non_null(strstr(r.out, "a sparse block's router and experts under LoRA are not in the closed form"));
    // the routing line names what a token runs through: Qwen1.5-MoE-A2.7B's 2.7B (4 of 60 experts,
    // the shared one, attention and both embeddings)
    assert_non_null(strstr(r.out, "60 experts, 4 a token (2,689,173,504 of the 14,315,784,192 parameters active"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expert_parallel),
        cmocka_unit_test(test_class_named),
        cmocka_unit_test(test_lora_closed_form_dense_only),
        cmocka_unit_test(test_headline_is_train_step_2_for_every_preset),
        cmocka_unit_test(test_phi3_mini),
        cmocka_unit_test(test_device_share_is_step_2_replayed),
        cmocka_unit_test(test_text_and_infer),
        cmocka_unit_test(test_answer_first),
    };
    return cmocka_run_group_tests_name("plan", tests, cli_run_make_dir, cli_run_remove_dir);
}
