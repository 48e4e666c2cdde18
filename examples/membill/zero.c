// membill train --zero S under mpirun: this process is one rank of a data-parallel job. Each
// rank trains on its own rows of the batch (rank r: rows r x B .. (r + 1) x B - 1 of the N x B
// that one process would take), bills its own process, and sends its report to rank 0, which
// prints and writes the job's: a column per rank, the collectives, compute against
// communication.
#include "cli.h"
#include "parallel.h"
#include "outputs.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const cli_options *o;
    train_run r;
    cli_zero z;
    par_comm *comm;
    struct cli_outputs *outs;
    json_t *ranks; // rank 0: every rank's report
    bool running;  // past the checks every rank shares: a failure now may leave others waiting
} zero_cmd;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median over the steady-state steps (the second onward), as train's timings.
static double steady(const double *v, long n) {
    long first = n >= 2 ? 1 : 0, k = n - first;
    double *c = malloc((size_t)(k > 0 ? k : 1) * sizeof *c);
    if (!c || k < 1) {
        free(c);
        return 0;
    }
    memcpy(c, v + first, (size_t)k * sizeof *c);
    qsort(c, (size_t)k, sizeof *c, cmp_double);
    double m = k % 2 ? c[k / 2] : 0.5 * (c[k / 2 - 1] + c[k / 2]);
    free(c);
    return m;
}

static json_t *collectives_json(const par_stats *st) {
    json_t *o = json_object();
    for (int k = 0; k < PAR_NCOLLECTIVES; k++) {
        json_t *c = json_object();
        json_object_set_new(c, "calls", json_integer((json_int_t)st->calls[k]));
        json_object_set_new(c, "bytes", json_integer((json_int_t)st->bytes[k]));
        json_object_set_new(c, "sent_bytes", json_integer((json_int_t)st->sent_bytes[k]));
        json_object_set_new(c, "seconds", json_real(st->seconds[k]));
        json_object_set_new(o, par_collective_name(k), c);
    }
    return o;
}

// This rank's part of the job: its place, its collectives, its step split into compute and
// communication.
static json_t *zero_json(const zero_cmd *t) {
    const train_run *r = &t->r;
    json_t *o = json_object(), *steps = json_array();
    json_object_set_new(o, "stage", json_integer(t->z.stage));
    json_object_set_new(o, "strategy", json_string(par_strategy_of(t->z.stage, t->z.fsdp)->name));
    json_object_set_new(o, "fsdp", t->z.fsdp ? json_string(par_fsdp_name(t->z.fsdp)) : json_null());
    json_object_set_new(o, "offload", t->z.offload ? json_string(par_offload_name(t->z.offload)) : json_null());
    json_t *host = json_object();
    for (int c = 0; c < MP_OTHER; c++)
        json_object_set_new(host, mp_category_name(c), json_integer((json_int_t)t->z.host_peak[c]));
    json_object_set_new(o, "host", host);
    json_object_set_new(o, "rank", json_integer(par_rank(t->comm)));
    json_object_set_new(o, "ranks", json_integer(par_size(t->comm)));
    json_object_set_new(o, "batch_per_rank", json_integer(r->batch));
    json_object_set_new(o, "bucket_bytes", json_integer((json_int_t)t->z.bucket_bytes));
    json_object_set_new(o, "prefetch_layers", json_integer(t->z.prefetch));
    par_stats st = par_get_stats(t->comm);
    json_object_set_new(o, "collectives", collectives_json(&st));
    double *step = malloc((size_t)r->nsteps * sizeof *step);
    for (long s = 0; step && s < r->nsteps; s++) {
        step[s] = r->steps[s].step_s;
        json_t *e = json_object();
        json_object_set_new(e, "step_s", json_real(step[s]));
        json_object_set_new(e, "comm_s", json_real(t->z.comm_s[s]));
        json_object_set_new(e, "compute_s", json_real(step[s] - t->z.comm_s[s]));
        json_array_append_new(steps, e);
    }
    double ss = step ? steady(step, r->nsteps) : 0, cs = steady(t->z.comm_s, r->nsteps);
    json_object_set_new(o, "step_s", json_real(ss));
    json_object_set_new(o, "comm_s", json_real(cs));
    json_object_set_new(o, "compute_s", json_real(ss - cs));
    json_object_set_new(o, "comm_share", json_real(ss > 0 ? cs / ss : 0));
    json_object_set_new(o, "steps", steps);
    free(step);
    return o;
}

static json_int_t jint(json_t *o, const char *a, const char *b, const char *c) {
    json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    if (c) v = json_object_get(v, c);
    return json_integer_value(v);
}

static double jreal(json_t *o, const char *a, const char *b) {
    json_t *v = json_object_get(json_object_get(o, a), b);
    return json_number_value(v);
}

// The job's columns: one per rank, from each rank's own report.
static void text_ranks(FILE *f, const zero_cmd *t) {
    size_t n = json_array_size(t->ranks);
    char b[64];
    fprintf(f, "\n  %-24s", "per rank");
    for (size_t k = 0; k < n; k++) fprintf(f, " %17s%-2zu", "rank ", k);
    fprintf(f, "\n");
    static const char *const cats[] = {"weight", "gradient", "optimizer", "activation", "temporary", "other"};
    for (int c = 0; c < 6; c++) {
        fprintf(f, "  %-24s", cats[c]);
        for (size_t k = 0; k < n; k++)
            fprintf(f, " %19s",
                    cli_commas(b, sizeof b,
                               (uint64_t)jint(json_array_get(t->ranks, k), "categories", cats[c], "peak_bytes")));
        fprintf(f, "\n");
    }
    for (int c = 0; t->z.offload && c < 5; c++) { // what the host holds, apart from the device's bill
        char name[40];
        snprintf(name, sizeof name, "host %s", cats[c]);
        fprintf(f, "  %-24s", name);
        for (size_t k = 0; k < n; k++)
            fprintf(f, " %19s",
                    cli_commas(
                        b, sizeof b,
                        (uint64_t)jint(json_object_get(json_array_get(t->ranks, k), "zero"), "host", cats[c], NULL)));
        fprintf(f, "\n");
    }
    fprintf(f, "  %-24s", "total peak");
    for (size_t k = 0; k < n; k++)
        fprintf(f, " %19s",
                cli_commas(b, sizeof b, (uint64_t)jint(json_array_get(t->ranks, k), "peak", "total_bytes", NULL)));
    fprintf(f, "\n  %-24s", "  in phase");
    for (size_t k = 0; k < n; k++) {
        json_t *ph = json_object_get(json_object_get(json_array_get(t->ranks, k), "peak"), "phase");
        fprintf(f, " %19s", json_is_string(ph) ? json_string_value(ph) : "-");
    }
    fprintf(f, "\n");
    for (int c = 0; c < 6; c++) {
        char name[40];
        snprintf(name, sizeof name, "  %s at the peak", cats[c]);
        fprintf(f, "  %-24s", name);
        for (size_t k = 0; k < n; k++)
            fprintf(
                f, " %19s",
                cli_commas(b, sizeof b, (uint64_t)jint(json_array_get(t->ranks, k), "peak", "composition", cats[c])));
        fprintf(f, "\n");
    }
    for (int c = 0; c < PAR_NCOLLECTIVES; c++) {
        char name[40];
        snprintf(name, sizeof name, "%s bytes", par_collective_name(c));
        fprintf(f, "  %-24s", name);
        for (size_t k = 0; k < n; k++) {
            json_t *z = json_object_get(json_array_get(t->ranks, k), "zero");
            fprintf(f, " %19s",
                    cli_commas(b, sizeof b, (uint64_t)jint(z, "collectives", par_collective_name(c), "bytes")));
        }
        fprintf(f, "\n");
    }
    static const char *const times[] = {"step_s", "compute_s", "comm_s"};
    static const char *const tnames[] = {"step (s)", "  compute (s)", "  communication (s)"};
    for (int i = 0; i < 3; i++) {
        fprintf(f, "  %-24s", tnames[i]);
        for (size_t k = 0; k < n; k++) fprintf(f, " %19.3f", jreal(json_array_get(t->ranks, k), "zero", times[i]));
        fprintf(f, "\n");
    }
}

static void report_text(FILE *f, const void *arg) {
    const zero_cmd *t = arg;
    const train_run *r = &t->r;
    int N = par_size(t->comm);
    const par_strategy *st = par_strategy_of(t->z.stage, t->z.fsdp);
    fprintf(f, "membill train, %s: %d rank%s, batch %ld x %ld tokens per rank (%ld rows in all), buckets of %s\n",
            st->name, N, N > 1 ? "s" : "", r->batch, r->seq_len, r->batch * N,
            mp_format_bytes((char[64]){0}, 64, t->z.bucket_bytes));
    fprintf(f, "%s: %s\n", st->name, st->what);
    if (t->z.stage == 3) fprintf(f, "prefetch: %d unit%s ahead\n", t->z.prefetch, t->z.prefetch == 1 ? "" : "s");
    if (r->grad_accum > 1) fprintf(f, "gradient accumulation: %ld micro-batches a step\n", r->grad_accum);
    if (t->z.offload)
        fprintf(f, "offload: %s in host memory (the host rows below; the device's bill leaves them out)\n",
                par_offload_name(t->z.offload));
    json_t *loss = json_object_get(json_array_get(t->ranks, 0), "loss");
    double sum = 0;
    size_t n = json_array_size(t->ranks);
    for (size_t k = 0; k < n && json_is_number(loss); k++)
        sum += json_number_value(json_object_get(json_array_get(t->ranks, k), "loss"));
    if (json_is_number(loss)) fprintf(f, "loss %.4f (the mean of the ranks' losses)\n", sum / (double)n);
    text_ranks(f, t);
    fprintf(f, "\nrank 0's own bill:\n");
    cli_train_text(f, t->o, r, false);
}

static json_t *job_json(const zero_cmd *t) {
    json_t *root = cli_train_json(t->o, &t->r, false);
    json_object_set_new(root, "zero", zero_json(t));
    size_t n = json_array_size(t->ranks);
    double sum = 0;
    bool have = true;
    for (size_t k = 0; k < n; k++) {
        json_t *l = json_object_get(json_array_get(t->ranks, k), "loss");
        have = have && json_is_number(l);
        sum += json_number_value(l);
    }
    // The job's loss: the mean over N x B rows, the mean of the ranks' means (equal batches).
    json_object_set_new(root, "loss", have && n ? json_real(sum / (double)n) : json_null());
    json_object_set(root, "ranks", t->ranks);
    return root;
}

// --save-weights on rank 0 (the others write nothing).
static int save(void *arg, const llama_model *m, bool grads, ag_err *err) {
    const zero_cmd *t = arg;
    cli_model_file file = {m, grads};
    return cli_outputs_write(t->outs, "--save-weights", cli_model_writer, &file, err);
}

static int adapter_weights(FILE *f, void *m, ag_err *err) { return llama_adapter_write_weights(m, f, err); }
static int adapter_config(FILE *f, void *m, ag_err *err) { return llama_adapter_write_config(m, f, err); }

// --save-adapter on rank 0: both files of the folder, committed with the other outputs.
static int save_adapter(void *arg, const llama_model *m, ag_err *err) {
    const zero_cmd *t = arg;
    if (cli_outputs_write(t->outs, "--save-adapter", adapter_weights, (void *)m, err) != 0) return -1;
    return cli_outputs_write(t->outs, "--save-adapter " LLAMA_ADAPTER_CONFIG, adapter_config, (void *)m, err);
}

// Token i of a command line joined with \x1f (NULL past its end), into buf (len bytes).
static const char *token(const char *line, int i, char *buf, size_t len) {
    for (int k = 0; k < i && line; k++) line = (line = strchr(line, '\x1f')) ? line + 1 : NULL;
    if (!line || !*line) return NULL;
    snprintf(buf, len, "%.*s", (int)strcspn(line, "\x1f"), line);
    return buf;
}

// The option (and its value) at token i of a command line, quoted, or "nothing" past its end.
static void option_at(const char *line, int i, char *out, size_t len) {
    char t[200], v[200];
    while (i > 0 && token(line, i, t, sizeof t) && strncmp(t, "--", 2) != 0) i--;
    if (!token(line, i, t, sizeof t)) {
        snprintf(out, len, "nothing more");
        return;
    }
    const char *val = token(line, i + 1, v, sizeof v);
    bool has = val && strncmp(val, "--", 2) != 0;
    snprintf(out, len, "'%.100s%s%.100s'", t, has ? " " : "", has ? val : "");
}

static void first_difference(const char *a, const char *b, char *oa, size_t la, char *ob, size_t lb) {
    char x[200], y[200];
    int i = 0;
    for (;; i++) {
        const char *p = token(a, i, x, sizeof x), *q = token(b, i, y, sizeof y);
        if (!p || !q || strcmp(p, q) != 0) break;
    }
    option_at(a, i, oa, la);
    option_at(b, i, ob, lb);
}

// Every rank was started with the same options (mpirun's MPMD form can start them apart): rank 0
// compares each rank's command line with its own and names the first option that differs.
static int same_options(zero_cmd *t, ag_err *err) {
    char mine[8192];
    size_t at = 0;
    for (int i = 2; i < t->o->argc && at < sizeof mine; i++)
        at += (size_t)snprintf(mine + at, sizeof mine - at, "%s\x1f", t->o->argv[i]);
    char **all = NULL;
    if (par_gather_text(t->comm, mine, &all, err) != 0) return EXIT_RUN_FAILED;
    int rc = 0;
    for (int k = 1; all && k < par_size(t->comm) && !rc; k++)
        if (strcmp(all[k], all[0]) != 0) {
            char a[256], b[256];
            first_difference(all[0], all[k], a, sizeof a, b, sizeof b);
            ag_err_set(err,
                       "the ranks run different options: rank 0 has %s, rank %d %s (every rank must run the same "
                       "command)",
                       a, k, b);
            rc = EXIT_RUN_FAILED;
        }
    for (int k = 0; all && k < par_size(t->comm); k++) free(all[k]);
    free(all);
    return rc;
}

// This rank's rows of the N x B batch one process would take.
static int prepare(zero_cmd *t, ag_err *err) {
    int N = par_size(t->comm), rank = par_rank(t->comm);
    cli_options all = *t->o;
    if (all.batch > 1000000000000L / N) {
        ag_err_set(err, "--batch %ld on %d ranks is more rows than a run takes", all.batch, N);
        return EXIT_USAGE;
    }
    all.batch *= N;
    int rc = cli_train_prepare(&all, &t->r, err);
    if (rc != 0) return rc;
    long B = t->r.batch / N, T = t->r.seq_len, rows = B * t->r.grad_accum; // this rank's micro-batches
    if (t->r.ids)
        memmove(t->r.ids, t->r.ids + (size_t)rank * (size_t)(rows * T), (size_t)(rows * T) * sizeof *t->r.ids);
    t->r.batch = B;
    cli_zero_from_options(t->o, &t->z);
    t->z.comm = t->comm;
    if (!(t->z.comm_s = calloc((size_t)t->r.nsteps, sizeof *t->z.comm_s))) {
        ag_err_set(err, "out of memory");
        return EXIT_RUN_FAILED;
    }
    if (rank == 0 && t->o->save_weights) t->r.save = save, t->r.save_arg = t;
    if (rank == 0 && t->o->save_adapter) t->r.save_adapter = save_adapter, t->r.save_arg = t;
    return 0;
}

// Every rank's report to rank 0, as parsed JSON.
static int gather_reports(zero_cmd *t, ag_err *err) {
    json_t *mine = cli_train_json(t->o, &t->r, false);
    json_object_set_new(mine, "zero", zero_json(t));
    char *text = json_dumps(mine, JSON_COMPACT);
    json_decref(mine);
    char **all = NULL;
    int rc = text ? par_gather_text(t->comm, text, &all, err) : -1;
    if (!text) ag_err_set(err, "out of memory");
    free(text);
    if (rc != 0 || !all) return rc;
    t->ranks = json_array();
    for (int k = 0; k < par_size(t->comm); k++) {
        json_t *v = json_loads(all[k], 0, NULL);
        if (!v && rc == 0) ag_err_set(err, "the report of rank %d does not parse", k), rc = -1;
        if (v) json_array_append_new(t->ranks, v);
        free(all[k]);
    }
    free(all);
    return rc;
}

static int report(zero_cmd *t, ag_err *err) {
    json_t *root = job_json(t);
    bool to_stdout = t->o->json && strcmp(t->o->json, "-") == 0;
    if (!t->o->quiet && !to_stdout) report_text(stdout, t);
    char title[256];
    snprintf(title, sizeof title, "membill train, %s: %s, %d ranks, batch %ld x %ld tokens per rank",
             par_strategy_of(t->z.stage, t->z.fsdp)->name, t->r.cfg.name, par_size(t->comm), t->r.batch, t->r.seq_len);
    cli_report rep = {title, report_text, t, NULL, NULL, NULL, 0, NULL};
    int rc = cli_outputs_finish(t->o, t->outs, root, &rep, err);
    json_decref(root);
    return rc;
}

// A rank that failed while the others may wait in a collective: its line, then the whole job
// ends (MPI_Abort), so that nothing hangs.
static int fail(zero_cmd *t, int rc, const char *msg) {
    int N = t->comm ? par_size(t->comm) : 1;
    if (N > 1)
        fprintf(stderr, "membill train: rank %d: %s\n", par_rank(t->comm), msg);
    else
        fprintf(stderr, "membill train: %s\n", msg);
    if (N > 1) par_abort(t->comm, rc);
    return rc;
}

// The end of the run on every rank: they agree on the worst status (each failed the same way,
// as their bills are the same, or one waits in a collective: then the job is ended), and rank 0
// says each different failure once.
#define AGREE_TIMEOUT_S 30.0
static int finish_run(zero_cmd *t, int rc, ag_err *err) {
    int worst = rc;
    ag_err e = {""};
    if (par_agree(t->comm, rc, AGREE_TIMEOUT_S, &worst, &e) != 0)
        return fail(t, rc ? rc : EXIT_RUN_FAILED, rc ? err->msg : e.msg);
    if (!worst) return 0;
    char **all = NULL;
    if (par_gather_text(t->comm, rc ? err->msg : "", &all, &e) != 0) return fail(t, worst, e.msg);
    for (int k = 0; all && k < par_size(t->comm); k++) {
        bool seen = !all[k][0];
        for (int q = 0; q < k && !seen; q++) seen = strcmp(all[q], all[k]) == 0;
        if (!seen && par_size(t->comm) > 1 && strcmp(all[k], all[0]) != 0)
            fprintf(stderr, "membill train: rank %d: %s\n", k, all[k]);
        else if (!seen)
            fprintf(stderr, "membill train: %s\n", all[k]);
    }
    for (int k = 0; all && k < par_size(t->comm); k++) free(all[k]);
    free(all);
    err->msg[0] = 0; // said
    return -worst;
}

static int run_rank(zero_cmd *t, ag_err *err) {
    bool root = par_rank(t->comm) == 0;
    int rc = same_options(t, err), worst = 0;
    ag_err ignored;
    if (par_max_int(t->comm, rc, &worst, rc ? &ignored : err) != 0 && rc == 0) rc = EXIT_RUN_FAILED;
    if (rc || worst) return rc ? rc : -worst; // rank 0 says which option differs
    rc = prepare(t, err);
    // Settings and outputs are checked before anything runs; every rank stops if one cannot start.
    if (rc == 0 && root && cli_outputs_declare(t->o, &t->outs, err) != 0) rc = EXIT_RUN_FAILED;
    if (par_max_int(t->comm, rc, &worst, rc ? &ignored : err) != 0 && rc == 0) rc = EXIT_RUN_FAILED;
    if (rc || worst) return rc ? rc : -worst; // another rank's failure: it says why
    if (cli_profiler_start(t->o, t->o->meta) != 0) {
        ag_err_set(err, "cannot start the profiler");
        return EXIT_RUN_FAILED;
    }
    ag_set_num_threads((int)t->o->threads);
    t->running = true;
    cli_progress_begin(t->o);
    rc = cli_zero_train_run(&t->r, &t->z, err) == 0 ? 0 : EXIT_RUN_FAILED;
    cli_progress_end();
    rc = finish_run(t, rc, err);
    if (rc == 0 && gather_reports(t, err) != 0) rc = EXIT_RUN_FAILED;
    if (rc == 0 && root && report(t, err) != 0) rc = EXIT_RUN_FAILED;
    mp_shutdown();
    return rc;
}

int cli_train_zero(const cli_options *o) {
    zero_cmd t = {.o = o};
    ag_err err = {""};
    if (!par_mpi_built()) {
        fprintf(stderr,
                "membill train: --zero and --fsdp run a sharded step on MPI ranks and need the MPI build: configure "
                "with cmake -DMEMBILL_MPI=ON (Open MPI: apt-get install libopenmpi-dev openmpi-bin), then "
                "mpirun -np N membill train --zero S\n");
        return EXIT_USAGE;
    }
    if (par_comm_world(&t.comm, &err) != 0) return fail(&t, EXIT_RUN_FAILED, err.msg);
    int rc = run_rank(&t, &err);
    if (rc < 0) // another rank could not start and said why; this one stops with it
        rc = -rc;
    else if (rc != 0 && t.running)
        rc = fail(&t, rc, err.msg);
    else if (rc != 0 && par_rank(t.comm) == 0) // the same settings on every rank: one line says it
        fprintf(stderr, "membill train: %s\n", err.msg);
    cli_outputs_free(t.outs);
    json_decref(t.ranks);
    free(t.z.comm_s);
    cli_train_free(&t.r);
    par_comm_free(t.comm);
    return rc;
}
