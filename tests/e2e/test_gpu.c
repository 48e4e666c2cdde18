// --device cuda, --gpu, --seq-lens, --snapshot and membill snapshot through the command: the
// device's figures beside an unchanged CPU bill, plan and train agreeing, snapshots read back with
// the figures they were written with (and as PyTorch 1.13 read them: tests/golden/snapshot), bad
// input refused in one line with nothing written.
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

#include "cli_run.h"

#define dir cli_run_dir

static json_int_t jint(json_t *o, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *v = o;
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); k; k = strtok_r(NULL, ".", &save))
        v = json_object_get(v, k);
    if (!json_is_integer(v)) fail_msg("%s is not an integer", path);
    return json_integer_value(v);
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

// The CPU bill does not move with the device (the same Adam: on CUDA its default is foreach); the
// device's figures hold together.
static void test_device_beside_the_bill(void **state) {
    (void)state;
    const char *run = "train --meta --steps 2 --seq-len 64 --adam-impl foreach";
    char args[512];
    json_t *cpu = cli_run_json(run);
    snprintf(args, sizeof args, "%s --device cuda", run);
    json_t *gpu = cli_run_json(args);
    assert_int_equal(jint(cpu, "peak.total_bytes"), jint(gpu, "peak.total_bytes"));
    assert_null(json_object_get(cpu, "device"));
    json_t *d = json_object_get(gpu, "device");
    assert_string_equal(json_string_value(json_object_get(d, "kind")), "cuda");
    json_int_t alloc = jint(d, "allocated_peak_bytes"), res = jint(d, "reserved_peak_bytes"),
               req = jint(d, "requested_peak_bytes");
    // the tensors' peak, and the cuBLAS workspaces of the forward's and autograd's threads
    assert_true(req >= jint(gpu, "peak.total_bytes") - jint(gpu, "categories.other.peak_bytes"));
    assert_true(req <= jint(gpu, "peak.total_bytes") + 2 * jint(d, "cublas_workspace_bytes"));
    assert_true(alloc >= req && res >= alloc);
    // load, then zero_grad, forward, backward, optimizer for each of the 2 steps
    assert_int_equal(json_array_size(json_object_get(d, "phases")), 9);
    json_t *ph = json_array_get(json_object_get(json_array_get(json_object_get(gpu, "steps"), 1), "phases"), 2);
    assert_string_equal(json_string_value(json_object_get(ph, "name")), "backward");
    assert_true(jint(ph, "reserved_bytes") >= jint(ph, "allocated_bytes"));
    json_decref(cpu);
    json_decref(gpu);
}

// membill plan's device is train --meta --steps 2's: the same two steps through the same allocator
// (both with foreach Adam, CUDA's default).
static void test_plan_agrees_with_train(void **state) {
    (void)state;
    json_t *plan = cli_run_json("plan --seq-len 96 --batch 2 --device cuda");
    json_t *train = cli_run_json("train --meta --steps 2 --seq-len 96 --batch 2 --device cuda");
    assert_int_equal(jint(plan, "device.reserved_peak_bytes"), jint(train, "device.reserved_peak_bytes"));
    assert_int_equal(jint(plan, "device.allocated_peak_bytes"), jint(train, "device.allocated_peak_bytes"));
    assert_int_equal(jint(plan, "device.requested_peak_bytes"), jint(train, "device.requested_peak_bytes"));
    json_decref(plan);
    json_decref(train);
}

// A named GPU: its memory and context in the report, the fit on reserved + context against it.
static void test_named_gpu(void **state) {
    (void)state;
    run_result r;
    membill(&r, "plan --list-gpus");
    assert_int_equal(r.code, 0);
    const char *names[] = {"a100-40gb", "a100-80gb", "h100-80gb", "h200", "l4",  "l40s",
                           "rtx-3090",  "rtx-4090",  "rtx-5090",  "t4",   "h20", "mi300x"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) assert_non_null(strstr(r.out, names[i]));
    json_t *p = cli_run_json("plan --gpu a100-40gb --seq-len 128");
    assert_int_equal(jint(p, "device.total_bytes"), 42298834944LL);
    assert_true(json_is_true(json_object_get(json_object_get(p, "device"), "fits")));
    assert_int_equal(jint(p, "device.need_bytes"),
                     jint(p, "device.reserved_peak_bytes") + jint(p, "device.context_bytes"));
    assert_true(jint(p, "fit.largest_batch") > 1);
    json_decref(p);
    // too big for a T4: the run fails as it would there, naming the tensor that did not fit
    membill(&r, "train --meta --model smollm2-1.7b --seq-len 1024 --gpu t4");
    assert_int_equal(r.code, 1);
    assert_int_equal(count_lines(r.err), 1);
    assert_non_null(strstr(r.err, "out of memory on the t4"));
    p = cli_run_json("plan --model smollm2-1.7b --seq-len 1024 --gpu t4");
    assert_true(json_is_false(json_object_get(json_object_get(p, "device"), "fits")));
    assert_true(json_is_object(json_object_get(json_object_get(p, "device"), "oom")));
    // the replay stopped at the failure: the device's total is the run's need, not the card's reserve then
    assert_true(jint(p, "per_gpu.total_bytes") >= jint(p, "peak.total_bytes") + jint(p, "device.context_bytes"));
    json_decref(p);
}

// Under --gpus, per_gpu.device has the simulated rank's device figures: ZeRO-2's shards make its
// reserve smaller than one GPU's whole run, and its need adds NCCL's buffers.
static void test_per_rank_device(void **state) {
    (void)state;
    json_t *one = cli_run_json("plan --seq-len 64 --device cuda");
    json_t *two = cli_run_json("plan --seq-len 64 --device cuda --gpus 2 --zero 2");
    assert_null(json_object_get(json_object_get(one, "per_gpu"), "device"));
    assert_int_equal(jint(two, "per_gpu.device.rank"), 0);
    const char *keys[] = {"allocated_peak_bytes", "reserved_peak_bytes", "context_bytes", "nccl_bytes", "need_bytes"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char a[96], b[96];
        snprintf(a, sizeof a, "per_gpu.device.%s", keys[i]);
        snprintf(b, sizeof b, "device.%s", keys[i]);
        assert_int_equal(jint(two, a), jint(two, b));
    }
    assert_true(jint(two, "per_gpu.device.reserved_peak_bytes") < jint(one, "device.reserved_peak_bytes"));
    assert_true(jint(two, "per_gpu.device.allocated_peak_bytes") < jint(one, "device.allocated_peak_bytes"));
    assert_true(jint(two, "per_gpu.device.nccl_bytes") > 0);
    assert_int_equal(jint(two, "per_gpu.device.need_bytes"), jint(two, "per_gpu.device.reserved_peak_bytes") +
                                                                 jint(two, "per_gpu.device.context_bytes") +
                                                                 jint(two, "per_gpu.device.nccl_bytes"));
    json_decref(one);
    json_decref(two);
}

// Bad input: one line, exit 2, nothing written.
static void test_bad_input(void **state) {
    (void)state;
    char args[512], json[300];
    snprintf(json, sizeof json, "%s/never.json", dir);
    const struct {
        const char *args, *needle;
    } cases[] = {
        {"plan --gpu nope", "unknown GPU 'nope'"},
        {"train --meta --device cuda --cuda-alloc-conf max_split_size_mb:10", "--cuda-alloc-conf: max_split_size_mb"},
        {"train --meta --cuda-alloc-conf expandable_segments:True", "add --device cuda"},
        {"train --meta --gpu t4 --device cpu", "--device cpu"},
        {"train --meta --device cuda --seq-lens 64,x", "--seq-lens: item 2"},
        {"plan --device cuda --seq-lens 64,128 --seq-len 10", "give one"},
        {"snapshot", "which snapshot"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "%s --json %s", cases[i].args, json);
        run_result r;
        membill(&r, args);
        if (r.code != 2 || !strstr(r.err, cases[i].needle))
            fail_msg("%s: exit %d, '%s' (expected 2 and '%s')", args, r.code, r.err, cases[i].needle);
        assert_int_equal(count_lines(r.err), 1);
        assert_false(exists(json));
    }
    // the environment's PYTORCH_CUDA_ALLOC_CONF, as PyTorch reads it
    run_result r;
    snprintf(args, sizeof args, "--json %s", json);
    setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:yes", 1);
    membill(&r, "train --meta --device cuda");
    unsetenv("PYTORCH_CUDA_ALLOC_CONF");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "PYTORCH_CUDA_ALLOC_CONF: expandable_segments expects True or False"));
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

// membill writes, membill reads: the same peaks; --against sets the report beside it.
static void test_snapshot_round_trip(void **state) {
    (void)state;
    char snap[300], rep[300], args[1024];
    snprintf(snap, sizeof snap, "%s/run.pickle", dir);
    snprintf(rep, sizeof rep, "%s/report.json", dir);
    snprintf(args, sizeof args, "train --meta --steps 2 --seq-len 48 --device cuda --snapshot %s --json %s --quiet",
             snap, rep);
    run_result r;
    membill(&r, args);
    assert_int_equal(r.code, 0);
    json_t *report = json_load_file(rep, 0, NULL);
    assert_non_null(report);
    snprintf(args, sizeof args, "snapshot %s --against %s", snap, rep);
    json_t *s = cli_run_json(args);
    json_t *d = json_array_get(json_object_get(s, "devices"), 0);
    assert_int_equal(jint(d, "reserved_peak_bytes"), jint(report, "device.reserved_peak_bytes"));
    assert_int_equal(jint(d, "requested_peak_bytes"), jint(report, "device.requested_peak_bytes"));
    assert_int_equal(jint(s, "against.reserved_peak.difference_bytes"), 0);
    assert_int_equal(jint(s, "against.requested_peak.difference_bytes"), 0);
    // the largest block at the peak names its tensor and category: the tied embedding or its state
    const char *where =
        json_string_value(json_object_get(json_array_get(json_object_get(d, "largest_at_peak"), 0), "where"));
    assert_non_null(where);
    assert_non_null(strstr(where, "model.embed_tokens.weight"));
    json_decref(s);
    json_decref(report);
}

// PyTorch 1.13's torch.cuda._memory_viz.stats read this run's segment list (the golden): membill
// reads the same segments, reserved and allocated bytes.
static void test_snapshot_as_torch_113_read_it(void **state) {
    (void)state;
    json_t *golden = json_load_file(MEMBILL_GOLDEN_DIR "/snapshot/stats_113.json", 0, NULL);
    assert_non_null(golden);
    char snap[300], args[1024];
    snprintf(snap, sizeof snap, "%s/golden.pickle", dir);
    snprintf(args, sizeof args, "train --meta --device cuda --steps 2 --seq-len 64 --snapshot %s --quiet", snap);
    run_result r;
    membill(&r, args);
    assert_int_equal(r.code, 0);
    snprintf(args, sizeof args, "snapshot %s", snap);
    json_t *s = cli_run_json(args);
    json_t *d = json_array_get(json_object_get(s, "devices"), 0);
    assert_int_equal(jint(d, "segments"), jint(golden, "segments"));
    assert_int_equal(jint(d, "reserved_bytes"), jint(golden, "total_size"));
    assert_int_equal(jint(d, "allocated_bytes"), jint(golden, "active_allocated"));
    assert_int_equal(jint(d, "reserved_bytes") - jint(d, "allocated_bytes"), jint(golden, "inactive"));
    json_decref(s);
    json_decref(golden);
}

// A pickle that would run code, and one cut short: refused in one line, no report written.
static void test_snapshot_refused(void **state) {
    (void)state;
    char bad[300], json[300], args[1024];
    snprintf(bad, sizeof bad, "%s/bad.pickle", dir);
    snprintf(json, sizeof json, "%s/bad.json", dir);
    static const unsigned char code[] = "\x80\x04\x63os\nsystem\n\x8c\x02ls\x85R.";
    static const unsigned char cut[] = "\x80\x04}\x94(\x8c\x08segments\x94]";
    const struct {
        const unsigned char *p;
        size_t n;
        const char *needle;
    } cases[] = {{code, sizeof code - 1, "GLOBAL"}, {cut, sizeof cut - 1, "truncated"}};
    for (size_t i = 0; i < 2; i++) {
        write_file(bad, cases[i].p, cases[i].n);
        snprintf(args, sizeof args, "snapshot %s --json %s", bad, json);
        run_result r;
        membill(&r, args);
        assert_int_equal(r.code, 1);
        assert_int_equal(count_lines(r.err), 1);
        assert_non_null(strstr(r.err, cases[i].needle));
        assert_false(exists(json));
    }
}

// Steps of varying lengths: each step its own, the steady state the lengths' second pass; the
// reserve grows with the variety, and expandable segments hold it closer to what is allocated.
static void test_seq_lens(void **state) {
    (void)state;
    json_t *t = cli_run_json("train --meta --device cuda --seq-lens 32,96,64");
    json_t *steps = json_object_get(t, "steps");
    assert_int_equal(json_array_size(steps), 3);
    json_t *ph = json_array_get(
        json_object_get(t, "device") ? json_object_get(json_object_get(t, "device"), "phases") : NULL, 5);
    assert_int_equal(jint(ph, "seq_len"), 96);
    json_decref(t);
    const char *lens = "--seq-lens 300,900,600,1200,450";
    char args[512];
    snprintf(args, sizeof args, "plan --device cuda %s", lens);
    json_t *plain = cli_run_json(args);
    snprintf(args, sizeof args, "plan --device cuda %s --cuda-alloc-conf expandable_segments:True", lens);
    json_t *exp = cli_run_json(args);
    json_int_t steady = jint(plain, "device.steady_state_reserved_peak_bytes");
    assert_true(steady > 0 && steady <= jint(plain, "device.reserved_peak_bytes"));
    assert_int_equal(json_array_size(json_object_get(json_object_get(plain, "device"), "phases")), 1 + 10 * 4);
    // the same allocations, so the same requested and allocated... but less reserved
    assert_int_equal(jint(plain, "device.requested_peak_bytes"), jint(exp, "device.requested_peak_bytes"));
    assert_true(jint(exp, "device.reserved_peak_bytes") < jint(plain, "device.reserved_peak_bytes"));
    assert_int_equal(jint(exp, "device.inactive_split_bytes_at_peak"), 0);
    json_decref(plain);
    json_decref(exp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_beside_the_bill),
        cmocka_unit_test(test_plan_agrees_with_train),
        cmocka_unit_test(test_named_gpu),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_per_rank_device),
        cmocka_unit_test(test_snapshot_round_trip),
        cmocka_unit_test(test_snapshot_as_torch_113_read_it),
        cmocka_unit_test(test_snapshot_refused),
        cmocka_unit_test(test_seq_lens),
    };
    return cmocka_run_group_tests(tests, cli_run_make_dir, cli_run_remove_dir);
}
