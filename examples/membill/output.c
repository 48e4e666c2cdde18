// The report's writers, and the path-at-a-time output functions of cli.h on top of outputs.c.
#include "cli.h"
#include "outputs.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

// A cli_writer (no message of its own) as a cli_output_writer.
typedef struct {
    cli_writer fn;
    void *arg;
} plain_writer;

static int call_plain(FILE *f, void *arg, ag_err *err) {
    (void)err;
    const plain_writer *p = arg;
    return p->fn(f, p->arg);
}

// Declares, writes and commits a list of outputs (path NULL: skipped); all or none replaced.
typedef struct {
    const char *option, *path;
    cli_output_writer fn;
    void *arg;
} output_job;

static int write_jobs(const output_job *jobs, size_t n, char *err, size_t errlen) {
    ag_err e = {{0}};
    cli_outputs *s = cli_outputs_new();
    int rc = s ? 0 : -1;
    if (!s) ag_err_set(&e, "out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++) rc = cli_outputs_add(s, jobs[i].option, jobs[i].path, &e);
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (jobs[i].path) rc = cli_outputs_write(s, jobs[i].option ? jobs[i].option : jobs[i].path, jobs[i].fn, jobs[i].arg, &e);
    if (rc == 0) rc = cli_outputs_commit(s, &e);
    cli_outputs_free(s);
    if (rc != 0) snprintf(err, errlen, "%s", e.msg);
    return rc;
}

int cli_write_file(const char *path, cli_writer fn, void *arg, char *err, size_t errlen) {
    plain_writer p = {fn, arg};
    output_job job = {NULL, path, call_plain, &p};
    return write_jobs(&job, 1, err, errlen);
}

int cli_json_writer(FILE *f, void *json_root, ag_err *err) {
    (void)err;
    int rc = json_dumpf((json_t *)json_root, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    fputc('\n', f);
    return rc;
}

int cli_write_json(const char *path, json_t *root, char *err, size_t errlen) {
    output_job job = {NULL, path, cli_json_writer, root};
    return write_jobs(&job, 1, err, errlen);
}

int cli_csv_writer(FILE *f, void *unused, ag_err *err) {
    (void)unused;
    (void)err;
    // One row per event, with each category's live bytes after it, for plots.
    int64_t live[MP_NCATEGORIES] = {0};
    fprintf(f, "seconds,phase,site,category,bytes");
    for (int c = 0; c < MP_NCATEGORIES; c++) fprintf(f, ",%s_live", mp_category_name(c));
    fprintf(f, "\n");
    for (size_t i = 0; i < mp_timeline_count(); i++) {
        const mp_event *e = mp_timeline_get(i);
        live[e->category] += e->bytes;
        fprintf(f, "%.6f,%s,%s,%s,%lld", e->seconds, mp_phase_name(e->phase), mp_site_name(e->site),
                mp_category_name(e->category), (long long)e->bytes);
        for (int c = 0; c < MP_NCATEGORIES; c++) fprintf(f, ",%lld", (long long)live[c]);
        fprintf(f, "\n");
    }
    return 0;
}

int cli_write_timeline_csv(const char *path, char *err, size_t errlen) {
    output_job job = {NULL, path, cli_csv_writer, NULL};
    return write_jobs(&job, 1, err, errlen);
}

json_t *cli_report_root(const llama_config *c) {
    json_t *root = json_object();
    json_object_set_new(root, "membill_version", json_string(MEMBILL_VERSION));
    json_object_set_new(root, "model", cli_model_json(c));
    return root;
}

json_t *cli_model_json(const llama_config *c) {
    json_t *m = json_object();
    json_object_set_new(m, "name", json_string(c->name));
    json_object_set_new(m, "parameters", json_integer((json_int_t)llama_param_count(c)));
    json_object_set_new(m, "layers", json_integer(c->layers));
    json_object_set_new(m, "hidden", json_integer(c->hidden));
    json_object_set_new(m, "intermediate", json_integer(c->intermediate));
    json_object_set_new(m, "heads", json_integer(c->heads));
    json_object_set_new(m, "kv_heads", json_integer(c->kv_heads));
    json_object_set_new(m, "head_dim", json_integer(c->head_dim));
    json_object_set_new(m, "vocab", json_integer(c->vocab));
    json_object_set_new(m, "max_positions", json_integer(c->max_positions));
    json_object_set_new(m, "tied", json_boolean(c->tied));
    return m;
}

int cli_write_outputs(const cli_options *o, json_t *root, const char *title, cli_text_fn text,
                      const void *arg, char *err, size_t errlen) {
    cli_html_page page = {title, text, arg};
    const output_job jobs[] = {
        {"--json", o->json, cli_json_writer, root},
        {"--timeline", o->timeline, cli_csv_writer, NULL},
        {"--svg", o->svg, cli_svg_writer, (void *)title},
        {"--trace", o->trace, cli_trace_writer, NULL},
        {"--html", o->html, cli_html_writer, &page},
    };
    return write_jobs(jobs, sizeof jobs / sizeof *jobs, err, errlen);
}
