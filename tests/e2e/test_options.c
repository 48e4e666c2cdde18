// The command line as a contract: every option of the table against every subcommand, help from
// the same table, exit codes, a failed run's report, the fit refusal, progress, --steps.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_run.h"

#define dir cli_run_dir

static const char *const commands[6] = {"train", "infer", "compare", "check", "plan", "snapshot"};

// A value the option takes, from its value name in the table.
static const char *value_for(const char *opt, const char *value) {
    if (!value) return "";
    if (strcmp(opt, "--model") == 0) return "smollm2-135m";
    if (strcmp(opt, "--optimizer") == 0) return "sgd";
    if (strcmp(opt, "--adam-impl") == 0) return "fused";
    if (strcmp(opt, "--dtype") == 0) return "fp32";
    if (strcmp(opt, "--framework") == 0) return "lean";
    if (strcmp(opt, "--attention") == 0) return "flash";
    if (strcmp(opt, "--adam-impl") == 0) return "fused";
    if (strcmp(opt, "--weight-dtype") == 0) return "int4";
    if (strcmp(opt, "--tokens") == 0) return "1,2,3";
    if (strcmp(opt, "--base-dtype") == 0) return "nf4";
    if (strcmp(opt, "--adapter-dtype") == 0) return "base";
    if (strcmp(opt, "--device") == 0) return "cuda";
    if (strcmp(opt, "--memory-fraction") == 0) return "0.5";
    if (strcmp(opt, "--lora-targets") == 0) return "q_proj";
    if (strcmp(opt, "--fsdp") == 0) return "full-shard";
    if (strcmp(opt, "--offload") == 0) return "optimizer";
    if (strcmp(opt, "--mla-cache") == 0) return "latent";
    if (strcmp(value, "K") == 0) return "2";
    if (strcmp(value, "R") == 0 || strcmp(value, "A") == 0) return "2";
    if (strcmp(value, "P") == 0) return "0.1";
    if (strcmp(value, "SIZE") == 0) return "1GB";
    if (strcmp(value, "X") == 0) return "0.5";
    if (strcmp(value, "N") == 0 || strcmp(value, "B") == 0 || strcmp(value, "S") == 0) return "2";
    return "/tmp/membill_opt_value"; // files and paths: never opened, --help comes first
}

// Each row of `membill help --markdown`: the option, its value name and the commands that take
// it. Parsing refuses an option a command does not take before --help is looked at, so
// `membill CMD OPT VALUE --help` tells acceptance without running anything.
static void test_every_option_against_every_command(void **state) {
    (void)state;
    run_result r, help;
    membill(&r, "help --markdown");
    assert_int_equal(r.code, 0);
    char *table = strdup(r.out), *save = NULL;
    int rows = 0;
    for (char *line = strtok_r(table, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "| `--", 5) != 0) continue;
        char opt[64] = "", value[64] = "";
        sscanf(line + 3, "%63[^ `]", opt);
        const char *sp = line + 3 + strlen(opt);
        if (*sp == ' ') sscanf(sp + 1, "%63[^`]", value);
        const char *cells = strchr(sp, '|');
        assert_non_null(cells);
        rows++;
        for (int c = 0; c < 6; c++) {
            bool takes = strncmp(cells + 1, " x ", 3) == 0;
            cells = strchr(cells + 1, '|');
            assert_non_null(cells);
            if (strcmp(opt, "--help") == 0) continue;
            char args[512];
            snprintf(args, sizeof args, "%s %s %s --help", commands[c], opt, value_for(opt, value[0] ? value : NULL));
            membill(&r, args);
            if (takes != (r.code == 0)) print_error("%s: exit %d, %s\n", args, r.code, r.err);
            assert_int_equal(r.code, takes ? 0 : 2);
            if (takes) continue;
            assert_int_equal(count_lines(r.err), 1);
            assert_non_null(strstr(r.err, "does not apply to"));
            assert_non_null(strstr(r.err, commands[c]));
        }
        // The command's help lists exactly the options it takes.
        cells = strchr(sp, '|');
        for (int c = 0; c < 6; c++) {
            bool takes = strncmp(cells + 1, " x ", 3) == 0;
            cells = strchr(cells + 1, '|');
            char args[64], needle[80];
            snprintf(args, sizeof args, "help %s", commands[c]);
            membill(&help, args);
            snprintf(needle, sizeof needle, "  %s ", opt);
            assert_int_equal(strstr(help.out, needle) != NULL, takes);
        }
    }
    free(table);
    assert_true(rows >= 30);
}

// The cases seen accepted and ignored before the table.
static void test_refused_not_ignored(void **state) {
    (void)state;
    const char *cases[] = {"train --gpus 4",
                           "train --zero 2",
                           "train --no-cache",
                           "train --list",
                           "train --device-memory 80GB",
                           "plan --budget 1GB",
                           "plan --explain",
                           "infer --checkpointing",
                           "infer --lr 0.5",
                           "check --weights X",
                           "check --model llama-2-7b",
                           "compare --steps 3",
                           "plan --device-memory 80",
                           "train --seed ' -1'",
                           "train --json --quiet",
                           "train --svg - --json -",
                           "plan --infer --group-size 8",
                           "train --lr 0.1 --optimizer none",
                           "train --steps 2 --steps 3",
                           "train --meta=1",
                           "train stray"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_result r;
        membill(&r, cases[i]);
        if (r.code != 2 || count_lines(r.err) != 1) print_error("%s: exit %d, %s\n", cases[i], r.code, r.err);
        assert_int_equal(r.code, 2);
        assert_int_equal(count_lines(r.err), 1);
        char cmd[16];
        sscanf(cases[i], "%15s", cmd);
        char prefix[32];
        snprintf(prefix, sizeof prefix, "membill %s: ", cmd);
        assert_int_equal(strncmp(r.err, prefix, strlen(prefix)), 0);
    }
    // Usage (the command line alone shows it): an unknown preset. A failed run (the model shows
    // it, docs/cli.md): a length past the model's positions, in every subcommand alike.
    const struct {
        const char *args;
        int code;
    } verdicts[] = {{"train --model nope", 2},
                    {"infer --model nope", 2},
                    {"plan --model nope", 2},
                    {"compare --model nope", 2},
                    {"train --seq-len 9000 --meta", 1},
                    {"infer --seq-len 9000 --meta", 1},
                    {"compare --seq-len 9000 --meta", 1},
                    {"plan --seq-len 9000", 1},
                    {"infer --seq-len 8190 --new-tokens 5 --meta", 1}};
    for (size_t i = 0; i < sizeof verdicts / sizeof verdicts[0]; i++) {
        run_result r;
        membill(&r, verdicts[i].args);
        if (r.code != verdicts[i].code) print_error("%s: exit %d, %s\n", verdicts[i].args, r.code, r.err);
        assert_int_equal(r.code, verdicts[i].code);
        assert_int_equal(count_lines(r.err), 1);
    }
    run_result r;
    membill(&r, "plan --device-memory 80B --quiet");
    assert_int_equal(r.code, 0); // plainly bytes
    membill(&r, "plan --device-memory 80");
    assert_non_null(strstr(r.err, "GiB")); // says which units exist
}

static void test_help_from_the_table(void **state) {
    (void)state;
    for (int c = 0; c < 5; c++) {
        run_result a, b;
        char args[64];
        snprintf(args, sizeof args, "help %s", commands[c]);
        membill(&a, args);
        snprintf(args, sizeof args, "%s --help", commands[c]);
        membill(&b, args);
        assert_int_equal(a.code, 0);
        assert_int_equal(b.code, 0);
        assert_string_equal(a.out, b.out);
        assert_non_null(strstr(a.out, "(default"));
    }
    run_result r;
    membill(&r, "help train");
    assert_non_null(strstr(r.out, "--threads N")); // defaults printed once, from the table
    assert_non_null(strstr(r.out, "compute threads (default 2)"));
    assert_non_null(strstr(r.out, "learning rate (default 1e-5)"));
    membill(&r, "help check");
    assert_non_null(strstr(r.out, "few minutes"));
    membill(&r, "help nope");
    assert_int_equal(r.code, 2);
}

// The README's option list is the table's own output.
static void test_readme_lists_every_option(void **state) {
    (void)state;
    run_result r;
    membill(&r, "help --markdown");
    static char readme[1 << 17];
    slurp(MEMBILL_SOURCE_DIR "/README.md", readme, sizeof readme);
    if (!strstr(readme, r.out)) fail_msg("README.md does not hold the output of `membill help --markdown`");
}

// The quick start's command line that starts with prefix (inside a ```sh block), into out.
static void readme_command(const char *readme, const char *prefix, const char *contains, char *out, size_t len) {
    for (const char *p = strstr(readme, prefix); p; p = strstr(p + 1, prefix)) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n < len && memmem(p, n, contains, strlen(contains))) {
            memcpy(out, p, n);
            out[n] = 0;
            return;
        }
    }
    fail_msg("README.md has no command starting '%s' with '%s'", prefix, contains);
}

// The README's two quick-start commands configure one build folder alike (the second compiles
// only what the first did not), and CI runs the test command verbatim.
static void test_readme_quick_start(void **state) {
    (void)state;
    static char readme[1 << 17], ci[1 << 14];
    slurp(MEMBILL_SOURCE_DIR "/README.md", readme, sizeof readme);
    slurp(MEMBILL_SOURCE_DIR "/.ci/run", ci, sizeof ci);
    char main_job[512], tests[512];
    readme_command(readme, "bash .ci/deps && cmake", "membill train", main_job, sizeof main_job);
    readme_command(readme, "bash .ci/deps && cmake", "ctest", tests, sizeof tests);
    const char *cfg_end = strstr(main_job, " && cmake --build");
    assert_non_null(cfg_end);
    size_t cfg_len = (size_t)(cfg_end - main_job);
    if (strncmp(main_job, tests, cfg_len) != 0 || strncmp(tests + cfg_len, " && cmake --build", 17) != 0)
        fail_msg("the quick start configures its two commands differently:\n%s\n%s", main_job, tests);
    if (!strstr(ci, tests)) fail_msg(".ci/run does not run the README's test command verbatim: %s", tests);
}

// Every preset plan --list names (its counts with thousands separated, as every report writes
// them) is in the README's list of presets; --version prints it and --help says so.
static void test_presets_and_version(void **state) {
    (void)state;
    static char readme[1 << 17];
    slurp(MEMBILL_SOURCE_DIR "/README.md", readme, sizeof readme);
    const char *list = strstr(readme, "- `--model NAME`: a preset: ");
    assert_non_null(list);
    const char *end = strstr(list, ".\n");
    assert_non_null(end);
    run_result r;
    membill(&r, "plan --list");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "smollm2-135m              134,515,008      576"));
    int n = 0;
    char *save = NULL, *line = strtok_r(r.out, "\n", &save); // the header
    while ((line = strtok_r(NULL, "\n", &save))) {
        char name[32];
        assert_int_equal(sscanf(line, "%31s", name), 1);
        bool found = false; // a whole name: llama-2-7b is not llama-2-70b
        for (const char *at = strstr(list, name); at && at < end && !found; at = strstr(at + 1, name))
            found = at[-1] == ' ' && strchr(",.; ", at[strlen(name)]) != NULL;
        if (!found) fail_msg("the README's preset list leaves out %s", name);
        n++;
    }
    assert_true(n >= 11);
    membill(&r, "--version");
    assert_int_equal(r.code, 0);
    assert_int_equal(strncmp(r.out, "membill ", 8), 0);
    membill(&r, "--help");
    assert_non_null(strstr(r.out, "membill --version"));
}

static json_t *load_json(const char *text) {
    json_error_t e;
    json_t *root = json_loads(text, 0, &e);
    if (!root) fail_msg("not JSON: %s", e.text);
    return root;
}

// A failed run reports only what it measured, in text and in JSON.
static void test_failed_run_report(void **state) {
    (void)state;
    run_result r;
    char a[1024];
    // A budget between the weights and the run's total peak: the weights fit, the step does not.
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --json -", MEMBILL_GOLDEN_DIR);
    membill(&r, a);
    json_t *ok = load_json(r.out);
    json_int_t w =
        json_integer_value(json_object_get(json_object_get(json_object_get(ok, "categories"), "weight"), "peak_bytes"));
    json_int_t total = json_integer_value(json_object_get(json_object_get(ok, "peak"), "total_bytes"));
    json_decref(ok);
    long long budget = (long long)(w + total) / 2;
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --budget %lldB --json -", MEMBILL_GOLDEN_DIR, budget);
    membill(&r, a);
    assert_int_equal(r.code, 1);
    assert_int_equal(count_lines(r.err), 1);
    json_t *root = load_json(r.out), *e = json_object_get(root, "error");
    assert_non_null(e);
    assert_non_null(json_string_value(json_object_get(e, "message")));
    assert_non_null(json_string_value(json_object_get(e, "category")));
    assert_non_null(json_string_value(json_object_get(e, "site")));
    assert_true(json_integer_value(json_object_get(e, "bytes")) > 0);
    assert_true(json_integer_value(json_object_get(e, "live_bytes")) > 0);
    assert_null(json_object_get(root, "timing"));
    assert_null(json_object_get(root, "four_copies"));
    json_decref(root);
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --budget %lldB", MEMBILL_GOLDEN_DIR, budget);
    membill(&r, a);
    assert_int_equal(r.code, 1);
    assert_null(strstr(r.out, "four copies"));
    assert_null(strstr(r.out, "step 1:"));
    assert_null(strstr(r.out, "loss 0.0000"));
    assert_non_null(strstr(r.out, "OUT OF BUDGET"));
}

// --budget is the total peak: exactly the peak passes, a byte less fails, in text and JSON.
static void test_budget_is_the_peak(void **state) {
    (void)state;
    run_result r;
    char a[1024];
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --steps 2 --json -", MEMBILL_GOLDEN_DIR);
    membill(&r, a);
    json_t *root = load_json(r.out);
    long long peak = (long long)json_integer_value(json_object_get(json_object_get(root, "peak"), "total_bytes"));
    json_decref(root);
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --steps 2 --budget %lldB --json -", MEMBILL_GOLDEN_DIR, peak);
    membill(&r, a);
    assert_int_equal(r.code, 0);
    root = load_json(r.out);
    assert_true(json_is_false(json_object_get(json_object_get(root, "budget"), "exceeded")));
    json_decref(root);
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --steps 2 --budget %lldB --json -", MEMBILL_GOLDEN_DIR,
             peak - 1);
    membill(&r, a);
    assert_int_equal(r.code, 1);
    assert_int_equal(count_lines(r.err), 1);
    assert_non_null(strstr(r.err, "budget"));
    root = load_json(r.out);
    assert_true(json_is_true(json_object_get(json_object_get(root, "budget"), "exceeded")));
    json_t *e = json_object_get(root, "error");
    assert_non_null(e);
    assert_string_not_equal(json_string_value(json_object_get(e, "site")), "malloc");
    json_decref(root);
    // Meta mode bills the same run, so the same budget stops it.
    membill(&r, "train --meta --budget 1GB --json -");
    assert_int_equal(r.code, 1);
    root = load_json(r.out);
    assert_string_equal(json_string_value(json_object_get(json_object_get(root, "error"), "category")), "gradient");
    json_decref(root);
}

// A real run larger than this machine is refused from its meta bill, before anything runs.
static void test_fit_refusal(void **state) {
    (void)state;
    run_result r;
    char a[1024], p[512];
    snprintf(p, sizeof p, "%s/big.json", dir);
    snprintf(a, sizeof a, "train --model llama-3-8b --json %s", p);
    membill(&r, a);
    assert_int_equal(r.code, 1);
    assert_int_equal(count_lines(r.err), 1);
    assert_non_null(strstr(r.err, "available"));
    assert_non_null(strstr(r.err, "--meta"));
    assert_string_equal(r.out, "");
    assert_int_equal(access(p, F_OK), -1);
    membill(&r, "infer --model llama-2-70b");
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "membill plan"));
}

static void test_progress_only_when_asked(void **state) {
    (void)state;
    run_result r;
    char a[512];
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --steps 2", MEMBILL_GOLDEN_DIR);
    membill(&r, a); // stderr is a file here, not a terminal
    assert_int_equal(r.code, 0);
    assert_string_equal(r.err, "");
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --steps 2 --progress", MEMBILL_GOLDEN_DIR);
    run_result p;
    membill(&p, a);
    assert_int_equal(p.code, 0);
    assert_non_null(strstr(p.err, "membill train: step 2/2: optimizer"));
    snprintf(a, sizeof a, "infer --weights %s/tiny_tied --new-tokens 3 --progress", MEMBILL_GOLDEN_DIR);
    membill(&p, a);
    assert_non_null(strstr(p.err, "membill infer: decode 2/2"));
}

static void test_steps_table(void **state) {
    (void)state;
    run_result r;
    char a[512];
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --steps 3 --json -", MEMBILL_GOLDEN_DIR);
    membill(&r, a);
    assert_int_equal(r.code, 0);
    json_t *root = load_json(r.out), *steps = json_object_get(root, "steps");
    assert_int_equal(json_array_size(steps), 3);
    json_int_t total = json_integer_value(json_object_get(json_object_get(root, "peak"), "total_bytes")), most = 0;
    for (size_t i = 0; i < 3; i++) {
        json_t *s = json_array_get(steps, i), *phases = json_object_get(s, "phases");
        assert_int_equal(json_integer_value(json_object_get(s, "step")), (json_int_t)i + 1);
        // The Trainer's loop (--framework pytorch): zero_grad, forward, backward, optimizer.
        assert_int_equal(json_array_size(phases), 4);
        static const char *const names[] = {"zero_grad", "forward", "backward", "optimizer"};
        for (size_t p = 0; p < 4; p++)
            assert_string_equal(json_string_value(json_object_get(json_array_get(phases, p), "name")), names[p]);
        json_int_t peak = json_integer_value(json_object_get(s, "peak_bytes"));
        if (peak > most) most = peak;
        // zero_grad sets the gradients to none; the optimizer step leaves them and the state.
        json_t *zg = json_object_get(json_array_get(phases, 0), "end_live");
        json_t *end = json_object_get(json_array_get(phases, 3), "end_live");
        assert_int_equal(json_integer_value(json_object_get(zg, "gradient")), 0);
        assert_true(json_integer_value(json_object_get(end, "gradient")) > 0);
        assert_true(json_integer_value(json_object_get(end, "optimizer")) > 0);
    }
    assert_int_equal(most, total); // the steps' peaks hold the run's total peak
    json_int_t ps = json_integer_value(json_object_get(json_object_get(root, "peak"), "step"));
    assert_true(ps >= 1 && ps <= 3);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(steps, (size_t)ps - 1), "peak_bytes")), total);
    assert_true(json_real_value(json_object_get(json_object_get(root, "run"), "lr")) == 1e-5);
    json_decref(root);
    snprintf(a, sizeof a, "train --weights %s/tiny_tied --steps 3", MEMBILL_GOLDEN_DIR);
    membill(&r, a);
    assert_non_null(strstr(r.out, "the total peak is in step"));
}

// plan --device-memory: the true cap of a huge device, the positions named when they are the
// limit, and what does not fit even at batch 1; meta mode needs no memory per token.
static void test_plan_fit_limits(void **state) {
    (void)state;
    run_result r;
    membill(&r, "plan --device-memory 1000TB --json -");
    assert_int_equal(r.code, 0);
    json_t *root = load_json(r.out), *fit = json_object_get(root, "fit");
    assert_true(json_integer_value(json_object_get(fit, "largest_batch")) > 1000000);
    assert_true(json_is_false(json_object_get(fit, "largest_batch_is_search_cap")));
    assert_int_equal(json_integer_value(json_object_get(fit, "longest_seq_len")), 8192);
    assert_true(json_is_true(json_object_get(fit, "longest_seq_len_is_positions")));
    json_decref(root);
    membill(&r, "plan --device-memory 1000TB");
    assert_non_null(strstr(r.out, "not memory, are the limit"));
    membill(&r, "plan --model llama-3-8b --device-memory 80GB");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "nothing fits: even batch 1 x 2 tokens needs"));
    // 8 x 10^8 tokens of shapes: no ids are made, so this takes milliseconds and little memory;
    // at 10^11 tokens one hidden state passes what meta mode bills for a tensor, and says so.
    membill(&r, "plan --seq-len 8000 --batch 100000 --quiet");
    assert_int_equal(r.code, 0);
    membill(&r, "plan --model llama-3-8b --seq-len 8000 --batch 12500000 --quiet");
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "too large for one tensor"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_option_against_every_command),
        cmocka_unit_test(test_refused_not_ignored),
        cmocka_unit_test(test_help_from_the_table),
        cmocka_unit_test(test_readme_lists_every_option),
        cmocka_unit_test(test_readme_quick_start),
        cmocka_unit_test(test_presets_and_version),
        cmocka_unit_test(test_failed_run_report),
        cmocka_unit_test(test_budget_is_the_peak),
        cmocka_unit_test(test_fit_refusal),
        cmocka_unit_test(test_progress_only_when_asked),
        cmocka_unit_test(test_steps_table),
        cmocka_unit_test(test_plan_fit_limits),
    };
    return cmocka_run_group_tests(tests, cli_run_make_dir, cli_run_remove_dir);
}
