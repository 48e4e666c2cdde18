// membill train --zero across MPI ranks: every stage's weights after a step on 2 ranks of batch B
// against one process's step on 2 x B rows; each rank's category peaks against membill plan's
// simulated rank, to the byte; every rank's teardown at zero. Without the MPI build, --zero is
// refused (exit 2) and plan's simulated rank still runs; MEMBILL_REQUIRE_MPI=1 (CI) makes a
// build without MPI a failure rather than a skip.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"

#include "cli_run.h"

#define dir cli_run_dir
#define TINY MEMBILL_GOLDEN_DIR "/tiny_tied/config.json"

#ifdef MEMBILL_MPIEXEC
static const char *const cats[] = {"weight", "gradient", "optimizer", "activation", "cache", "temporary"};

static json_int_t jpath(json_t *o, const char *a, const char *b, const char *c) {
    json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    if (c) v = json_object_get(v, c);
    if (!json_is_integer(v)) fail_msg("%s.%s.%s is not an integer", a, b ? b : "", c ? c : "");
    return json_integer_value(v);
}

// mpirun with 2 ranks on however many cores there are, as root too, never hanging: a rank that
// waits past the limit ends the job.
static void mpirun(run_result *r, int ranks, int limit_s, const char *args) {
    char a[8192];
    snprintf(a, sizeof a, "%s", args);
    char cmd[9000], p[512];
    snprintf(cmd, sizeof cmd, "timeout -k 5 %d %s %s--oversubscribe -np %d %s %s >%s/out 2>%s/err </dev/null", limit_s,
             MEMBILL_MPIEXEC, geteuid() == 0 ? "--allow-run-as-root " : "", ranks, MEMBILL_BIN, a, dir, dir);
    int st = system(cmd);
    r->code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    snprintf(p, sizeof p, "%s/out", dir);
    slurp(p, r->out, sizeof r->out);
    snprintf(p, sizeof p, "%s/err", dir);
    slurp(p, r->err, sizeof r->err);
}

static json_t *mpirun_json(int ranks, int limit_s, const char *args) {
    static run_result r;
    char a[4096], path[512];
    snprintf(path, sizeof path, "%s/zero.json", dir);
    snprintf(a, sizeof a, "%s --json %s --quiet", args, path);
    mpirun(&r, ranks, limit_s, a);
    if (r.code != 0) print_error("mpirun %s: exit %d: %s\n", a, r.code, r.err);
    assert_int_equal(r.code, 0);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    return root;
}

// The largest difference between two weight files, and the largest step from a third.
// Adam's first step is lr g / (|g| + eps) whatever |g| is: for a gradient within a few float32
// roundings of zero, the order of the sum over rows (two ranks' halves, or one process's rows)
// moves it by a sizeable part of lr. Such elements (0 < |g| < GRAD_MIN in one process's SGD step)
// are left out of Adam's comparison, and must be few.
#define GRAD_MIN 1e-6

// The largest |a - b| and |b - init| over every tensor; with sgd (the weights after one process's
// SGD step of lr_sgd from init) not where that step's gradient is nonzero and below GRAD_MIN, the
// elements left out counted in *skipped.
static void weight_diff(const char *a, const char *b, const char *init, const char *sgd, double lr_sgd, double *diff,
                        double *step, size_t *skipped, size_t *total) {
    llama_st_file *f[4];
    const char *paths[4] = {a, b, init, sgd};
    const int nf = sgd ? 4 : 3;
    ag_err err;
    for (int k = 0; k < nf; k++) assert_int_equal(llama_st_open(&f[k], paths[k], &err), 0);
    assert_int_equal(llama_st_count(f[0]), llama_st_count(f[1]));
    *diff = *step = 0;
    *skipped = *total = 0;
    for (size_t i = 0; i < llama_st_count(f[0]); i++) {
        const llama_st_tensor *t = llama_st_get(f[0], i);
        size_t n = t->numel;
        float *x[4];
        for (int k = 0; k < nf; k++) {
            const llama_st_tensor *u = llama_st_find(f[k], t->name);
            assert_non_null(u);
            assert_int_equal(u->numel, n);
            x[k] = malloc(n * sizeof(float));
            assert_int_equal(llama_st_read_f32(f[k], u, x[k], n, &err), 0);
        }
        for (size_t j = 0; j < n; j++) {
            *total += 1;
            double g = sgd ? ((double)x[2][j] - x[3][j]) / lr_sgd : 1.0; // 0: no gradient, no step in either
            if (g != 0 && fabs(g) < GRAD_MIN) {
                *skipped += 1;
                continue;
            }
            *diff = fmax(*diff, fabs((double)x[0][j] - x[1][j]));
            *step = fmax(*step, fabs((double)x[1][j] - x[2][j]));
        }
        for (int k = 0; k < nf; k++) free(x[k]);
    }
    for (int k = 0; k < nf; k++) llama_st_close(f[k]);
}

static void assert_rank_clean(json_t *rank) {
    for (int c = 0; c < 6; c++) assert_int_equal(jpath(rank, "categories", cats[c], "live_bytes"), 0);
    assert_true(json_is_true(json_object_get(rank, "teardown_all_zero")));
}

// Each rank's category peaks are the plan's simulated rank's, to the byte.
static void assert_ranks_equal_plan(json_t *job, const char *plan_args) {
    json_t *plan = cli_run_json(plan_args);
    json_t *pg = json_object_get(plan, "per_gpu");
    assert_true(json_is_true(json_object_get(pg, "simulated_rank")));
    json_t *ranks = json_object_get(job, "ranks");
    for (size_t k = 0; k < json_array_size(ranks); k++)
        for (int c = 0; c < 6; c++) {
            json_int_t got = jpath(json_array_get(ranks, k), "categories", cats[c], "peak_bytes"),
                       want = jpath(pg, "own_peak", cats[c], NULL);
            if (got != want)
                print_error("%s: rank %zu %s %lld, plan %lld\n", plan_args, k, cats[c], (long long)got,
                            (long long)want);
            assert_int_equal(got, want);
        }
    json_decref(plan);
}

// Every stage: the weights after one step on 2 ranks of 2 rows equal one process's step on the 4
// rows, to float32 reduction; SGD (the update is the gradient itself) and Adam.
static void test_every_stage_matches_one_process(void **state) {
    (void)state;
    const char *opts[] = {"--optimizer sgd --lr 0.5", "--lr 1e-3"};
    const double tol[] = {1e-5, 1e-3}; // of the largest step (Adam: its tiny gradients left out)
    char a[4096], init[512], ref[512], got[512], sgd[512];
    snprintf(init, sizeof init, "%s/init.safetensors", dir);
    snprintf(sgd, sizeof sgd, "%s/ref_sgd.safetensors", dir);
    snprintf(got, sizeof got, "%s/zero.safetensors", dir);
    snprintf(a, sizeof a,
             "train --config %s --seq-len 16 --batch 4 --threads 1 --optimizer sgd --lr 0 --save-weights %s", TINY,
             init);
    json_decref(cli_run_json(a));
    for (int k = 0; k < 2; k++) {
        snprintf(ref, sizeof ref, "%s/ref_%d.safetensors", dir, k);
        snprintf(a, sizeof a, "train --config %s --seq-len 16 --batch 4 --threads 1 %s --save-weights %s", TINY,
                 opts[k], k == 0 ? sgd : ref);
        if (k == 0) snprintf(ref, sizeof ref, "%s", sgd);
        json_t *one = cli_run_json(a);
        for (int z = 0; z <= 3; z++) {
            snprintf(a, sizeof a, "train --zero %d --config %s --seq-len 16 --batch 2 --threads 1 %s --save-weights %s",
                     z, TINY, opts[k], got);
            json_t *job = mpirun_json(2, 120, a);
            double diff, step;
            size_t skipped, total;
            weight_diff(got, ref, init, k == 1 ? sgd : NULL, 0.5, &diff, &step, &skipped, &total);
            if (diff > tol[k] * step || skipped * 100 > total)
                print_error("zero %d %s: weights differ by %g (step %g), %zu of %zu left out\n", z, opts[k], diff, step,
                            skipped, total);
            assert_true(step > 0);
            assert_true(diff <= tol[k] * step);
            assert_true(skipped * 100 <= total); // at most one element in a hundred
            // The job's loss is the mean over the 4 rows: one process's.
            assert_true(fabs(json_real_value(json_object_get(job, "loss")) -
                             json_real_value(json_object_get(one, "loss"))) < 1e-5);
            json_t *ranks = json_object_get(job, "ranks");
            assert_int_equal(json_array_size(ranks), 2);
            for (size_t r = 0; r < 2; r++) {
                assert_rank_clean(json_array_get(ranks, r));
                assert_int_equal(jpath(json_array_get(ranks, r), "zero", "rank", NULL), (json_int_t)r);
            }
            assert_rank_clean(job);
            json_decref(job);
        }
        json_decref(one);
    }
}

// A mixture of experts whose ranks route to different experts (8 experts, 2 a token, 16 pairs a
// rank: some experts get none): an expert a rank's tokens never reached adds zeros to the reduction, as DDP's
// find_unused_parameters; every stage's SGD step equals one process's on all the rows.
static void test_experts_unused_by_a_rank(void **state) {
    (void)state;
    const char *cfg = MEMBILL_GOLDEN_DIR "/tiny_qwen3_moe/config.json";
    char a[4096], init[512], ref[512], got[512];
    snprintf(init, sizeof init, "%s/moe_init.safetensors", dir);
    snprintf(ref, sizeof ref, "%s/moe_ref.safetensors", dir);
    snprintf(got, sizeof got, "%s/moe_zero.safetensors", dir);
    snprintf(a, sizeof a,
             "train --config %s --seq-len 4 --batch 4 --threads 1 --optimizer sgd --lr 0 --save-weights %s", cfg, init);
    json_decref(cli_run_json(a));
    snprintf(a, sizeof a,
             "train --config %s --seq-len 4 --batch 4 --threads 1 --optimizer sgd --lr 0.5 --save-weights %s", cfg,
             ref);
    json_decref(cli_run_json(a));
    for (int z = 0; z <= 3; z++) {
        snprintf(a, sizeof a,
                 "train --zero %d --config %s --seq-len 4 --batch 2 --threads 1 --optimizer sgd --lr 0.5 "
                 "--save-weights %s",
                 z, cfg, got);
        json_decref(mpirun_json(2, 120, a));
        double diff, step;
        size_t skipped, total;
        weight_diff(got, ref, init, NULL, 0.5, &diff, &step, &skipped, &total);
        if (diff > 1e-5 * step) print_error("zero %d: weights differ by %g (step %g)\n", z, diff, step);
        assert_true(step > 0 && diff <= 1e-5 * step);
    }
}

// Each rank's bill is the plan's simulated rank, category by category, to the byte; the model
// states shrink stage by stage as each shards one more of them.
static void test_ranks_equal_plan(void **state) {
    (void)state;
    json_int_t prev[3] = {0};
    for (int z = 0; z <= 3; z++) {
        char a[1024], p[1024];
        const char *common = "--config " TINY " --seq-len 16 --batch 2 --adam-impl for-loop --bucket-mb 1";
        snprintf(a, sizeof a, "train --zero %d %s --threads 1", z, common);
        json_t *job = mpirun_json(2, 120, a);
        snprintf(p, sizeof p, "plan --gpus 2 --zero %d %s", z, common);
        assert_ranks_equal_plan(job, p);
        json_t *r0 = json_array_get(json_object_get(job, "ranks"), 0);
        // Stage 1 shards the optimizer state, 2 the gradients too: each drops.
        if (z == 1) assert_true(jpath(r0, "categories", "optimizer", "peak_bytes") < prev[2]);
        if (z == 2) assert_true(jpath(r0, "categories", "gradient", "peak_bytes") < prev[1]);
        for (int c = 0; c < 3; c++) prev[c] = jpath(r0, "categories", cats[c], "peak_bytes");
        // DDP all-reduces; the other stages reduce-scatter and all-gather.
        json_t *zr = json_object_get(r0, "zero");
        assert_int_equal(jpath(zr, "collectives", "all_reduce", "bytes") > 0, z == 0);
        assert_int_equal(jpath(zr, "collectives", "reduce_scatter", "bytes") > 0, z > 0);
        assert_int_equal(jpath(zr, "collectives", "all_gather", "bytes") > 0, z > 0);
        json_decref(job);
    }
}

// Each rank's bill equals the plan's simulated rank's (its host memory too), and its teardown is clean.
static void assert_job_is_plan(json_t *job, const char *common) {
    char p[4096];
    snprintf(p, sizeof p, "plan --gpus 2 %.4000s", common);
    assert_ranks_equal_plan(job, p);
    json_t *plan = cli_run_json(p), *ranks = json_object_get(job, "ranks");
    for (size_t k = 0; k < json_array_size(ranks); k++) {
        json_t *r = json_array_get(ranks, k);
        assert_rank_clean(r);
        for (int c = 0; c < 6; c++)
            assert_int_equal(jpath(json_object_get(r, "zero"), "host", cats[c], NULL),
                             jpath(plan, "per_gpu", "host", cats[c]));
    }
    json_decref(plan);
}

// LoRA (and QLoRA's NF4 base) under every sharding path, with and without checkpointing, with
// offload and gradient accumulation: the adapters after two SGD steps on 2 ranks of 2 rows (the
// first moves B, which starts at zero; the second A too) equal one process's two steps on the 4
// rows, and each rank's bill is the plan's to the byte.
static void test_lora_every_path_matches_one_process(void **state) {
    (void)state;
    static const char *const paths[] = {"--zero 1",
                                        "--zero 1 --checkpointing",
                                        "--zero 2",
                                        "--zero 2 --checkpointing",
                                        "--zero 3",
                                        "--zero 3 --checkpointing --prefetch-layers 0", // the recomputation gathers
                                        "--fsdp full-shard",
                                        "--fsdp full-shard --checkpointing --prefetch-layers 0",
                                        "--zero 3 --base-dtype nf4",
                                        "--zero 3 --base-dtype nf4 --checkpointing --prefetch-layers 0",
                                        "--zero 3 --offload optimizer+params --checkpointing",
                                        "--fsdp shard-grad-op --offload optimizer+params",
                                        "--zero 2 --offload optimizer --grad-accum 2 --batch 1",
                                        "--zero 3 --grad-accum 2 --batch 1 --checkpointing"};
    const char *lora = "--lora-rank 4 --lora-targets all-linear --optimizer sgd";
    char a[4096], c[2048], ref[512], init[512], got[512];
    for (int q = 0; q < 2; q++) { // float32 and NF4 bases
        snprintf(init, sizeof init, "%s/init_%d", dir, q);
        snprintf(ref, sizeof ref, "%s/one_%d", dir, q);
        const char *base = q ? " --base-dtype nf4" : "";
        snprintf(a, sizeof a, "train --config %s --seq-len 16 --batch 4 --threads 1 %s%s --lr 0 --save-adapter %s",
                 TINY, lora, base, init);
        json_decref(cli_run_json(a));
        snprintf(a, sizeof a,
                 "train --config %s --seq-len 16 --batch 4 --threads 1 %s%s --lr 0.5 --steps 2 "
                 "--save-adapter %s",
                 TINY, lora, base, ref);
        json_decref(cli_run_json(a));
    }
    for (size_t k = 0; k < sizeof paths / sizeof paths[0]; k++) {
        int q = strstr(paths[k], "nf4") != NULL;
        snprintf(c, sizeof c, "--config %s --seq-len 16 %s%s %s --bucket-mb 1", TINY,
                 strstr(paths[k], "--batch") ? "" : "--batch 2 ", paths[k], lora);
        snprintf(got, sizeof got, "%s/got_%zu", dir, k);
        // The bill without saving (stage 3 gathers every unit to save), then the adapters saved.
        snprintf(a, sizeof a, "train %s --threads 1 --lr 0.5 --steps 2", c);
        json_t *job = mpirun_json(2, 120, a);
        assert_job_is_plan(job, c);
        json_decref(job);
        snprintf(a, sizeof a, "train %s --threads 1 --lr 0.5 --steps 2 --save-adapter %s", c, got);
        job = mpirun_json(2, 120, a);
        char fa[600], fr[600], fi[600];
        snprintf(fa, sizeof fa, "%s/adapter_model.safetensors", got);
        snprintf(fr, sizeof fr, "%s/one_%d/adapter_model.safetensors", dir, q);
        snprintf(fi, sizeof fi, "%s/init_%d/adapter_model.safetensors", dir, q);
        double diff, step;
        size_t skipped, total;
        weight_diff(fa, fr, fi, NULL, 0, &diff, &step, &skipped, &total);
        if (diff > 1e-5 * step) print_error("%s: adapters differ by %g (step %g)\n", paths[k], diff, step);
        assert_true(step > 0);
        assert_true(diff <= 1e-5 * step);
        json_decref(job);
    }
}

// Ranks started with different options (mpirun's MPMD form): one line from rank 0 naming the
// option, every rank exits 1, no output written.
static void test_ranks_disagree(void **state) {
    (void)state;
    static run_result r;
    char a[2048], out[512];
    snprintf(out, sizeof out, "%s/disagree.json", dir);
    snprintf(a, sizeof a,
             "train --zero 2 --config %s --seq-len 16 --lora-rank 8 --json %s : -np 1 %s train --zero 2 --config %s "
             "--seq-len 16 --lora-rank 4 --json %s",
             TINY, out, MEMBILL_BIN, TINY, out);
    mpirun(&r, 1, 60, a);
    assert_int_equal(r.code, 1);
    int lines = 0;
    for (const char *p = r.err; (p = strstr(p, "membill train: ")); p++) lines++;
    assert_int_equal(lines, 1);
    assert_non_null(strstr(r.err, "rank 0 has '--lora-rank 8', rank 1 '--lora-rank 4'"));
    assert_int_equal(access(out, F_OK), -1);
}

// SmolLM2-135M, stage 3 on 2 ranks: each rank's weights are half the model and the blocks in use,
// its bill the plan's, its teardown clean.
static void test_smollm2_stage3(void **state) {
    (void)state;
    json_t *job = mpirun_json(2, 600, "train --zero 3 --threads 1 --adam-impl for-loop");
    assert_ranks_equal_plan(job, "plan --gpus 2 --zero 3 --adam-impl for-loop");
    json_t *ranks = json_object_get(job, "ranks");
    for (size_t k = 0; k < 2; k++) {
        json_t *r = json_array_get(ranks, k);
        assert_rank_clean(r);
        json_int_t w = jpath(r, "categories", "weight", "peak_bytes");
        assert_true(w >= 538060032 / 2 && w < 538060032);
        assert_int_equal(jpath(r, "categories", "optimizer", "peak_bytes"), 1076120064 / 2);
    }
    assert_true(fabs(json_real_value(json_object_get(job, "loss")) - log(49152.0)) < 0.5);
    json_decref(job);
}

// A rank that cannot run stops the job with one line, never a hang: a budget no rank meets.
static void test_bad_input_ends_the_job(void **state) {
    (void)state;
    static run_result r;
    mpirun(&r, 2, 60, "train --zero 2 --config " TINY " --seq-len 16 --threads 1 --budget 100kB --quiet");
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "budget"));
    mpirun(&r, 2, 60, "train --zero 3 --config " TINY " --fsdp full-shard");
    assert_int_equal(r.code, 2);
    mpirun(&r, 2, 60, "train --zero 1 --config /nonexistent/config.json");
    assert_int_not_equal(r.code, 0);
    // One line from membill (rank 0 says what every rank found), beside mpirun's own.
    int lines = 0;
    for (const char *p = r.err; (p = strstr(p, "membill train: ")); p++) lines++;
    assert_int_equal(lines, 1);
    assert_non_null(strstr(r.err, "/nonexistent/config.json"));
}
#else
static void test_without_mpi(void **state) {
    (void)state;
    const char *req = getenv("MEMBILL_REQUIRE_MPI");
    if (req && strcmp(req, "1") == 0) fail_msg("MEMBILL_REQUIRE_MPI=1 but this build has no MPI (-DMEMBILL_MPI=ON)");
    static run_result r;
    membill(&r, "train --zero 2 --config " TINY);
    assert_int_equal(r.code, 2);
    assert_int_equal(count_lines(r.err), 1);
    assert_non_null(strstr(r.err, "MPI build"));
    // plan simulates a rank without MPI.
    json_t *plan = cli_run_json("plan --gpus 2 --zero 3 --config " TINY " --seq-len 16");
    assert_true(json_is_true(json_object_get(json_object_get(plan, "per_gpu"), "simulated_rank")));
    json_decref(plan);
}
#endif

// Options that belong to a sharded step are refused without it.
static void test_zero_options(void **state) {
    (void)state;
    static run_result r;
    membill(&r, "train --bucket-mb 5 --config " TINY);
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "add --zero"));
    membill(&r, "train --zero 1 --dump-grads g.st --config " TINY);
    assert_int_equal(r.code, 2);
    membill(&r, "train --zero 4 --config " TINY);
    assert_int_equal(r.code, 2);
}

// MEMBILL_HEAVY (the heavy entry): SmolLM2-135M's stage 3 alone; otherwise everything else.
int main(void) {
    const struct CMUnitTest tests[] = {
#ifdef MEMBILL_MPIEXEC
        cmocka_unit_test(test_every_stage_matches_one_process),
        cmocka_unit_test(test_ranks_equal_plan),
        cmocka_unit_test(test_experts_unused_by_a_rank),
        cmocka_unit_test(test_lora_every_path_matches_one_process),
        cmocka_unit_test(test_ranks_disagree),
        cmocka_unit_test(test_bad_input_ends_the_job),
#else
        cmocka_unit_test(test_without_mpi),
#endif
        cmocka_unit_test(test_zero_options),
    };
#ifdef MEMBILL_MPIEXEC
    const struct CMUnitTest heavy[] = {cmocka_unit_test(test_smollm2_stage3)};
    if (getenv("MEMBILL_HEAVY"))
        return cmocka_run_group_tests_name("zero_smollm2", heavy, cli_run_make_dir, cli_run_remove_dir);
#endif
    return cmocka_run_group_tests_name("zero", tests, cli_run_make_dir, cli_run_remove_dir);
}
