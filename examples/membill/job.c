// The skeleton every command runs in: outputs declared and checked before any work, a real run
// that cannot fit this machine refused before it starts, the profiler, the run, the report of
// what was measured (a failed run's too), every output committed together, teardown.
#include "cli.h"
#include "outputs.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int cli_profiler_start(const cli_options *o, bool meta) {
    mp_options mo = {.meta = meta, .budget = o->budget, .track_other = !meta, .keep_timeline = true};
    return mp_init(&mo) == MP_OK ? 0 : -1;
}

// An --adapter folder's two files are inputs; --save-adapter DIR (made if absent, as PEFT's
// save_pretrained does) declares its two files as outputs.
static int declare_adapter(const cli_options *o, cli_outputs *outs, ag_err *err) {
    char path[4200];
    const char *const files[2] = {LLAMA_ADAPTER_WEIGHTS, LLAMA_ADAPTER_CONFIG};
    for (int k = 0; o->adapter && k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s", o->adapter, files[k]);
        if (cli_outputs_input(outs, "--adapter", path, err) != 0) return -1;
    }
    if (!o->save_adapter) return 0;
    if (mkdir(o->save_adapter, 0777) != 0 && errno != EEXIST) {
        ag_err_set(err, "--save-adapter %s: cannot make the folder: %s", o->save_adapter, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/%s", o->save_adapter, files[0]);
    if (cli_outputs_add(outs, "--save-adapter", path, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/%s", o->save_adapter, files[1]);
    return cli_outputs_add(outs, "--save-adapter " LLAMA_ADAPTER_CONFIG, path, err);
}

int cli_outputs_declare(const cli_options *o, cli_outputs **outs, ag_err *err) {
    const struct {
        const char *name, *path;
    } list[] = {{"--json", o->json},
                {"--timeline", o->timeline},
                {"--svg", o->svg},
                {"--trace", o->trace},
                {"--html", o->html},
                {"--dump-grads", o->dump_grads},
                {"--save-weights", o->save_weights},
                {"--routing-out", o->routing_out},
                {"--snapshot", o->snapshot}},
      inputs[] = {{"--routing",
                   o->routing && strcmp(o->routing, "balanced") && strcmp(o->routing, "worst") ? o->routing : NULL},
                  {"--config", o->config},
                  {"--weights", o->weights},
                  {"--tokenizer", o->tokenizer},
                  {"--prompt-file", o->prompt_file}};
    *outs = cli_outputs_new();
    if (!*outs) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
        if (inputs[i].path && cli_outputs_input(*outs, inputs[i].name, inputs[i].path, err) != 0) return -1;
    // A --weights folder is read through its files: no output may land on them either.
    char cfg[4096], st[4096];
    ag_err ignored;
    if (o->weights && llama_weights_resolve(o->weights, cfg, st, sizeof st, &ignored) == 0)
        for (int k = 0; k < 2; k++)
            if ((k ? st : cfg)[0] && cli_outputs_input(*outs, "--weights", k ? st : cfg, err) != 0) return -1;
    // ... nor on the shards of an index (one that does not open fails the run later, naming why)
    llama_ckpt *ck = NULL;
    if (o->weights && st[0] && llama_ckpt_is_index(st) && llama_ckpt_open(&ck, st, &ignored) == 0) {
        int rc = 0;
        for (size_t i = 0; rc == 0 && i < llama_ckpt_files(ck); i++)
            rc = cli_outputs_input(*outs, "--weights", llama_st_path(llama_ckpt_file(ck, i)), err);
        llama_ckpt_close(ck);
        if (rc != 0) return -1;
    }
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)
        if (list[i].path && cli_outputs_add(*outs, list[i].name, list[i].path, err) != 0) return -1;
    return declare_adapter(o, *outs, err);
}

int cli_outputs_finish(const cli_options *o, cli_outputs *outs, json_t *root, const cli_report *rep, ag_err *err) {
    cli_html_page html = {rep->title, rep->text, rep->arg, root, rep->html_runs, rep->html_nruns};
    if (o->json && cli_outputs_write(outs, "--json", cli_json_writer, root, err) != 0) return -1;
    if (o->timeline && cli_outputs_write(outs, "--timeline", cli_csv_writer, NULL, err) != 0) return -1;
    if (o->svg && cli_outputs_write(outs, "--svg", rep->svg ? rep->svg : cli_svg_writer,
                                    rep->svg ? rep->svg_arg : (void *)rep->title, err) != 0)
        return -1;
    if (o->trace && cli_outputs_write(outs, "--trace", cli_trace_writer, (void *)rep->title, err) != 0) return -1;
    if (o->html && cli_outputs_write(outs, "--html", cli_html_writer, &html, err) != 0) return -1;
    if (o->snapshot && cli_outputs_write(outs, "--snapshot", cli_snapshot_writer, (void *)rep->device, err) != 0)
        return -1;
    return cli_outputs_commit(outs, err);
}

// MemAvailable of /proc/meminfo, in bytes; 0 when it cannot be read.
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb * 1024;
}

// The meta bill of the same run takes milliseconds: a run it says cannot fit is refused now,
// rather than killed by the kernel minutes later.
static int fit_check(const cli_options *o, cli_job *j, ag_err *err) {
    if (o->meta || !j->meta_peak) return 0;
    uint64_t need = j->meta_peak(j->arg, err), have = mem_available();
    if (!need) return err->msg[0] ? -1 : 0;
    if (have && need > have) {
        char a[80], b[80];
        ag_err_set(err,
                   "this run needs at least %s at its peak (its bill in meta mode) and this machine has %s available: "
                   "--meta bills it without running it, and membill plan sizes it for another machine",
                   mp_format_bytes(a, sizeof a, need), mp_format_bytes(b, sizeof b, have));
        return -1;
    }
    return 0;
}

static void text_ok(FILE *f, const void *arg) {
    const cli_job *j = arg;
    j->text(f, j->arg, false);
}

// A failed run's JSON on stdout: what was measured, and the error.
static void failed_json(const cli_options *o, cli_job *j, const char *msg) {
    json_t *root = j->json(j->arg, true), *e = json_object();
    const mp_oom_record *oom = mp_oom();
    json_object_set_new(e, "message", json_string(msg));
    if (oom->happened) {
        json_object_set_new(e, "category", json_string(mp_category_name(oom->category)));
        // A site names a tensor: for plain malloc, the tensor allocated last before it.
        bool by_malloc = oom->category == MP_OTHER;
        json_object_set_new(e, "site", json_string(mp_site_name(by_malloc ? oom->live.site : oom->site)));
        if (by_malloc) json_object_set_new(e, "crossed_by_malloc", json_true());
        json_object_set_new(e, "bytes", json_integer((json_int_t)oom->requested));
        json_object_set_new(e, "live_bytes", json_integer((json_int_t)oom->live.total));
    }
    json_object_set_new(root, "error", e);
    if (strcmp(o->json, "-") == 0) cli_json_writer(stdout, root, NULL);
    json_decref(root);
}

int cli_job_main(const cli_options *o, cli_job *j) {
    ag_err err = {""};
    cli_outputs *outs = NULL;
    int rc = 0;
    bool to_stdout = o->json && strcmp(o->json, "-") == 0, profiling = false;
    if (cli_outputs_declare(o, &outs, &err) != 0 || fit_check(o, j, &err) != 0) rc = EXIT_RUN_FAILED;
    if (rc == 0 && cli_profiler_start(o, o->meta) != 0) {
        ag_err_set(&err, "cannot start the profiler");
        rc = EXIT_RUN_FAILED;
    }
    if (rc == 0) {
        profiling = true;
        j->outs = outs;
        ag_set_num_threads((int)o->threads);
        cli_progress_begin(o);
        int run = j->run(j->arg, &err);
        cli_progress_end();
        if (run != 0) {
            // A budget stop has a bill to show; a file that could not be read has none.
            if (!o->quiet && !to_stdout && mp_oom()->happened) j->text(stdout, j->arg, true);
            if (o->json) failed_json(o, j, err.msg);
            rc = EXIT_RUN_FAILED;
        } else {
            cli_progress_where("writing the report and the outputs");
            if (!o->quiet && !to_stdout) j->text(stdout, j->arg, false);
            json_t *root = j->json(j->arg, false);
            cli_report rep = {j->title, text_ok, j, j->svg, j->svg_arg, j->html_runs, j->html_nruns, j->device};
            if (cli_outputs_finish(o, outs, root, &rep, &err) != 0) rc = EXIT_RUN_FAILED;
            json_decref(root);
        }
    }
    if (profiling) mp_shutdown();
    cli_outputs_free(outs);
    if (rc) fprintf(stderr, "membill %s: %s\n", o->command, err.msg);
    return rc;
}
