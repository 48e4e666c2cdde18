// membill plan's simulated rank under every sharding path with LoRA and QLoRA, ZeRO-3 with
// checkpointing, FSDP, offload and gradient accumulation; --gpus auto, the settings that fit,
// --device-memory in GiB; the refusals. (The real runs on MPI ranks: test_zero.c.)
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"

#define dir cli_run_dir
#define TINY "--config " MEMBILL_GOLDEN_DIR "/tiny_tied/config.json --seq-len 16 --batch 2"

static json_int_t jget(json_t *o, const char *a, const char *b, const char *c) {
    json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    if (c) v = json_object_get(v, c);
    if (!json_is_integer(v)) fail_msg("%s.%s.%s is not an integer", a, b ? b : "", c ? c : "");
    return json_integer_value(v);
}

static const char *const strategies[] = {"--zero 0", "--zero 1",          "--zero 2",
                                         "--zero 3", "--fsdp full-shard", "--fsdp shard-grad-op"};

// LoRA on 2 ranks: the rank's gradients and optimizer state are the adapters' (stage 0 whole, the
// others about half), never the frozen base's; the base is whole (stages 0 to 2) or sharded in
// its own dtype (3, FSDP; an NF4 base much smaller than the bf16 one).
static void test_lora_every_strategy(void **state) {
    (void)state;
    char a[1024];
    for (size_t k = 0; k < sizeof strategies / sizeof strategies[0]; k++) {
        snprintf(a, sizeof a, "plan --model llama-2-7b --dtype bf16 --lora-rank 8 --gpus 2 %s --seq-len 256",
                 strategies[k]);
        json_t *root = cli_run_json(a);
        json_int_t A = jget(root, "lora", "trainable_params", NULL), P = jget(root, "model", "parameters", NULL);
        json_t *own = json_object_get(json_object_get(root, "per_gpu"), "own_peak");
        json_int_t g = jget(own, "gradient", NULL, NULL), o = jget(own, "optimizer", NULL, NULL),
                   w = jget(own, "weight", NULL, NULL);
        // PEFT's float32 adapters beside the bf16 base: Adam's 4 + 4 bytes of state an adapter
        // element, gradients 4 bytes (ZeRO-2 and up: a rank's shard).
        if (k == 0) {
            assert_int_equal(o, 8 * A);
        } else {
            assert_true(o >= 8 * A / 2 && o <= 8 * A / 2 + 8 * 256); // ceil(numel / 2) of each of 128 adapters
        }
        assert_true(g > 0 && g <= 4 * A);
        if (k >= 2) assert_true(g <= 4 * A * 53 / 100);
        if (k < 3) assert_true(w >= 2 * P);            // whole
        if (k == 3) assert_true(w < 2 * P * 58 / 100); // half, and the blocks gathered
        // FSDP: the root (embedding and head) whole for the whole step; shard-grad-op keeps every
        // block gathered from its forward to its backward: the whole model beside the shards.
        if (k == 4) assert_true(w > 2 * P * 58 / 100 && w < 2 * P * 62 / 100);
        if (k == 5) assert_true(w > 2 * P * 3 / 2);
        // The ZeRO paper's line counts the adapters and the frozen base's bytes.
        json_int_t paper = jget(root, "per_gpu", "zero_paper", "bytes");
        assert_true(paper <= (k < 3 ? 2 * P + 16 * A : P + 16 * A));
        json_decref(root);
    }
    // QLoRA: ZeRO-3 shards the NF4 base (about 0.5 bytes a parameter) and gathers it block by block.
    json_t *q = cli_run_json("plan --model llama-2-7b --dtype bf16 --lora-rank 8 --base-dtype nf4 --gpus 2 --zero 3 "
                             "--seq-len 256");
    json_int_t wq = jget(q, "per_gpu", "own_peak", "weight"), P = jget(q, "model", "parameters", NULL);
    assert_true(wq < P * 4 / 10); // 0.25 bytes a parameter of shard, the embedding's bf16 shard, one block gathered
    assert_true(wq > P / 4);
    json_decref(q);
}

// ZeRO-3 takes checkpointing: the activations shrink as on one device; each block gathered for the
// forward and again for its recomputation (twice the all-gathers of the blocks' weights).
static void test_zero3_checkpointing(void **state) {
    (void)state;
    json_t *a = cli_run_json("plan --model smollm2-135m --gpus 2 --zero 3 --seq-len 512 --prefetch-layers 0");
    json_t *b = cli_run_json("plan --model smollm2-135m --gpus 2 --zero 3 --seq-len 512 --prefetch-layers 0 "
                             "--checkpointing");
    assert_true(jget(b, "per_gpu", "own_peak", "activation") < jget(a, "per_gpu", "own_peak", "activation") / 3);
    json_t *ca = json_object_get(json_object_get(json_object_get(a, "per_gpu"), "collectives_per_step"), "all_gather");
    json_t *cb = json_object_get(json_object_get(json_object_get(b, "per_gpu"), "collectives_per_step"), "all_gather");
    // Without checkpointing each of the 30 blocks' 9 tensors is gathered for the forward and the
    // backward; with it, the recomputation's gather serves the backward too: as many.
    assert_int_equal(json_integer_value(json_object_get(cb, "calls")),
                     json_integer_value(json_object_get(ca, "calls")));
    // (the tied embedding: once for its forward, with the norm for the head's forward and backward,
    // once for its backward)
    assert_int_equal(json_integer_value(json_object_get(ca, "calls")), 1 + 2 + 2 * 30 * 9 + 2 + 1);
    json_decref(a);
    json_decref(b);
}

// FSDP: one all-gather per unit (the root once a step, each block twice), padded shards; with
// offload the optimizer, its float32 shards and the gradient shards are host memory, the same
// category keys as own_peak, and the device column holds none of it.
static void test_fsdp_and_offload(void **state) {
    (void)state;
    json_t *f = cli_run_json("plan --model smollm2-135m --gpus 2 --fsdp full-shard --seq-len 128");
    json_t *c = json_object_get(json_object_get(json_object_get(f, "per_gpu"), "collectives_per_step"), "all_gather");
    assert_int_equal(json_integer_value(json_object_get(c, "calls")), 1 + 2 * 30);
    assert_string_equal(json_string_value(json_object_get(json_object_get(f, "per_gpu"), "strategy")),
                        "FSDP full-shard");
    json_t *o = cli_run_json("plan --model smollm2-135m --gpus 2 --fsdp full-shard --seq-len 128 --offload "
                             "optimizer+params");
    json_t *host = json_object_get(json_object_get(o, "per_gpu"), "host");
    json_t *own = json_object_get(json_object_get(f, "per_gpu"), "own_peak");
    assert_int_equal(json_object_size(host), json_object_size(own));
    assert_int_equal(jget(o, "per_gpu", "own_peak", "optimizer"), 0);
    assert_int_equal(jget(host, "optimizer", NULL, NULL), jget(own, "optimizer", NULL, NULL));
    assert_true(jget(host, "weight", NULL, NULL) > 0 && jget(host, "gradient", NULL, NULL) > 0);
    assert_true(jget(o, "per_gpu", "total_bytes", NULL) < jget(f, "per_gpu", "total_bytes", NULL));
    json_decref(f);
    json_decref(o);
    // ZeRO-Offload: a float32 master of the shards (4 bytes) and Adam's state (8) on the host.
    json_t *z = cli_run_json("plan --model smollm2-135m --gpus 2 --zero 2 --seq-len 128 --dtype bf16-mixed --offload "
                             "optimizer");
    json_int_t P = jget(z, "model", "parameters", NULL), ho = jget(z, "per_gpu", "host", "optimizer");
    assert_true(ho >= 12 * P / 2 && ho < 12 * P / 2 + 12 * 300);
    assert_int_equal(jget(z, "per_gpu", "own_peak", "optimizer"), 0);
    json_decref(z);
}

// --grad-accum K: the real run's bill is meta mode's, K micro-batches of the batch a step; under
// DDP (no_sync) and stage 1 the gradients are whole from the first micro-batch's backward on.
static void test_grad_accum_real_equals_meta(void **state) {
    (void)state;
    const char *const runs[] = {"train " TINY " --grad-accum 2 --threads 1",
                                "train " TINY " --grad-accum 3 --lora-rank 4 --threads 1 --steps 2"};
    static const char *const cats[] = {"weight", "gradient", "optimizer", "activation", "temporary"};
    for (int k = 0; k < 2; k++) {
        char a[1024];
        json_t *real = cli_run_json(runs[k]);
        snprintf(a, sizeof a, "%s --meta", runs[k]);
        json_t *meta = cli_run_json(a);
        for (int c = 0; c < 5; c++)
            assert_int_equal(jget(real, "categories", cats[c], "peak_bytes"),
                             jget(meta, "categories", cats[c], "peak_bytes"));
        assert_int_equal(jget(real, "run", "grad_accum", NULL), k ? 3 : 2);
        assert_true(json_real_value(json_object_get(real, "loss")) > 0);
        json_decref(real);
        json_decref(meta);
    }
    json_t *one = cli_run_json("plan " TINY " --gpus 2 --zero 2");
    json_t *two = cli_run_json("plan " TINY " --gpus 2 --zero 2 --grad-accum 2");
    assert_int_equal(jget(two, "run", "grad_accum", NULL), 2);
    // The gradient shards accumulate: held through the second micro-batch's forward.
    assert_true(jget(two, "per_gpu", "total_bytes", NULL) > jget(one, "per_gpu", "total_bytes", NULL));
    json_decref(one);
    json_decref(two);
}

// --gpus auto: the fewest GPUs whose rank fits; N fits and N - 1 does not.
static void test_gpus_auto(void **state) {
    (void)state;
    json_t *root = cli_run_json("plan --model llama-2-7b --dtype bf16-mixed --zero 3 --attention flash "
                                "--checkpointing --seq-len 1024 --gpus auto --device-memory 24GB");
    json_int_t n = jget(root, "fit", "min_gpus", NULL);
    assert_true(n > 1);
    assert_int_equal(jget(root, "run", "gpus", NULL), n);
    assert_true(json_is_true(json_object_get(json_object_get(root, "fit"), "fits")));
    json_decref(root);
    for (int less = 0; less < 2; less++) {
        char a[512];
        snprintf(a, sizeof a,
                 "plan --model llama-2-7b --dtype bf16-mixed --zero 3 --attention flash --checkpointing "
                 "--seq-len 1024 --gpus %lld --device-memory 24GiB",
                 (long long)(n - less));
        json_t *r = cli_run_json(a);
        assert_int_equal(json_is_true(json_object_get(json_object_get(r, "fit"), "fits")), less == 0);
        assert_int_equal(jget(r, "per_gpu", "total_bytes", NULL) <= 24LL << 30, less == 0);
        json_decref(r);
    }
    // Nothing fits a tiny device: min_gpus is null, and the text says so in its first lines.
    root = cli_run_json("plan --model llama-2-7b --gpus auto --device-memory 1GB");
    assert_true(json_is_null(json_object_get(json_object_get(root, "fit"), "min_gpus")));
    json_decref(root);
    static run_result r;
    membill(&r, "plan --model llama-2-7b --zero 3 --gpus auto --device-memory 40GB");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "--gpus auto: "));
    assert_true(strstr(r.out, "--gpus auto: ") < strstr(r.out, "category"));
}

// A setting that does not fit gets up to five that do, each applied fitting: the options
// replace the asked ones.
static void test_every_suggestion_fits(void **state) {
    (void)state;
    const char *base = "plan --model llama-3-8b --lora-rank 8 --seq-len 2048 --batch 2 --device-memory 24GB";
    json_t *root = cli_run_json(base);
    json_t *fit = json_object_get(root, "fit"), *sug = json_object_get(fit, "suggestions");
    assert_true(json_is_false(json_object_get(fit, "fits")));
    assert_true(json_array_size(sug) >= 1 && json_array_size(sug) <= 5);
    for (size_t i = 0; i < json_array_size(sug); i++) {
        json_t *opts = json_object_get(json_array_get(sug, i), "options");
        char a[1024];
        size_t at = (size_t)snprintf(a, sizeof a, "plan --model llama-3-8b --lora-rank 8 --device-memory 24GB");
        bool batch = false, seq = false;
        for (size_t k = 0; k < json_array_size(opts); k++) {
            const char *t = json_string_value(json_array_get(opts, k));
            batch = batch || !strcmp(t, "--batch");
            seq = seq || !strcmp(t, "--seq-len");
            at += (size_t)snprintf(a + at, sizeof a - at, " %s", t);
        }
        at += (size_t)snprintf(a + at, sizeof a - at, "%s%s", batch ? "" : " --batch 2", seq ? "" : " --seq-len 2048");
        json_t *r = cli_run_json(a);
        assert_true(json_is_true(json_object_get(json_object_get(r, "fit"), "fits")));
        assert_int_equal(jget(r, "per_gpu", "total_bytes", NULL),
                         jget(json_array_get(sug, i), "total_bytes", NULL, NULL));
        json_decref(r);
    }
    json_decref(root);
    static run_result r;
    membill(&r, base);
    assert_non_null(strstr(r.out, "what would fit"));
}

// --device-memory as GPU memory is sold: 24GB is 24 GiB, printed in both units; help says so.
static void test_device_memory_in_gib(void **state) {
    (void)state;
    json_t *a = cli_run_json("plan --device-memory 24GB"), *b = cli_run_json("plan --device-memory 24GiB");
    assert_int_equal(jget(a, "fit", "device_memory_bytes", NULL), 24LL << 30);
    assert_int_equal(jget(b, "fit", "device_memory_bytes", NULL), 24LL << 30);
    json_decref(a);
    json_decref(b);
    static run_result r;
    membill(&r, "plan --device-memory 24GB");
    assert_non_null(strstr(r.out, "24 GiB (25.77 GB"));
    membill(&r, "plan --help");
    assert_non_null(strstr(r.out, "in GiB: 80GB and 80GiB are both"));
}

// Bad input: one line each, exit 2.
static void test_refusals(void **state) {
    (void)state;
    const char *const bad[] = {"plan --gpus 2 --zero 2 --fsdp full-shard",
                               "train --zero 3 --fsdp shard-grad-op " TINY,
                               "plan --offload optimizer",
                               "plan --zero 1 --offload optimizer",
                               "plan --zero 2 --offload optimizer+params",
                               "plan --fsdp full-shard --offload optimizer",
                               "plan --grad-accum 0",
                               "plan --grad-accum 65537",
                               "train --grad-accum 0 " TINY,
                               "plan --gpus auto",
                               "plan --gpus many --device-memory 8GB",
                               "plan --infer --grad-accum 2",
                               "train --fsdp full-shard --dump-grads g.st " TINY};
    static run_result r;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        membill(&r, bad[i]);
        if (r.code != 2 || count_lines(r.err) != 1) print_error("%s: exit %d: %s\n", bad[i], r.code, r.err);
        assert_int_equal(r.code, 2);
        assert_int_equal(count_lines(r.err), 1);
    }
    membill(&r, "plan --gpus auto");
    assert_non_null(strstr(r.err, "--device-memory"));
    membill(&r, "plan --zero 1 --offload optimizer");
    assert_non_null(strstr(r.err, "--zero 2"));
}

// PEFT's published multi-GPU runs (tests/reference/peft_multi_gpu.json): the plan of each run
// bills less than the GPU showed (nvidia-smi holds the CUDA context and the allocator's reserve
// too) and more than half of it; a LoRA billed as a full fine-tune, or a frozen base counted
// with gradients and optimizer state, is several times past it.
static void test_public_measurements(void **state) {
    (void)state;
    json_error_t e;
    json_t *ref = json_load_file(MEMBILL_REFERENCE_DIR "/peft_multi_gpu.json", 0, &e);
    if (!ref) fail_msg("peft_multi_gpu.json: %s", e.text);
    json_t *runs = json_object_get(ref, "runs");
    assert_true(json_array_size(runs) >= 5);
    for (size_t i = 0; i < json_array_size(runs); i++) {
        json_t *r = json_array_get(runs, i);
        char a[1024];
        snprintf(a, sizeof a, "plan %s", json_string_value(json_object_get(r, "plan")));
        json_t *root = cli_run_json(a);
        double total = (double)jget(root, "per_gpu", "total_bytes", NULL) / 1e9,
               pub = json_number_value(json_object_get(r, "public_gb_per_gpu"));
        if (!(total <= pub && total >= pub / 2))
            print_error("%s: membill %.2f GB a GPU, published %.1f GB\n", json_string_value(json_object_get(r, "name")),
                        total, pub);
        assert_true(total <= pub && total >= pub / 2);
        json_decref(root);
    }
    json_decref(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lora_every_strategy),
        cmocka_unit_test(test_zero3_checkpointing),
        cmocka_unit_test(test_fsdp_and_offload),
        cmocka_unit_test(test_grad_accum_real_equals_meta),
        cmocka_unit_test(test_gpus_auto),
        cmocka_unit_test(test_every_suggestion_fits),
        cmocka_unit_test(test_device_memory_in_gib),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_public_measurements),
    };
    return cmocka_run_group_tests_name("parallel", tests, cli_run_make_dir, cli_run_remove_dir);
}
