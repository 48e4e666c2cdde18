// --model org/name[@revision]: the model's files from the Hugging Face cache, else the Hub
// (model.h's llama_hub_*), pointed at by the options the rest of the command already reads:
// --config (the snapshot's config.json), the tokenizer and generation_config.json beside it, and
// --weights (the snapshot's checkpoint) once the weights are in the cache. The checkpoint's
// headers say its dtypes and size to plan and to --weight-dtype auto; --download fetches the
// weights, saying their size first, with a progress bar on stderr.
#include "cli.h"

#include <jansson.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct cli_hub {
    llama_hub hub;
    llama_hub_repo repo;
    char config[LLAMA_HUB_PATH_MAX], weights[LLAMA_HUB_PATH_MAX];
    char name[LLAMA_HUB_ID_MAX + LLAMA_HUB_REV_MAX + 2];
    bool have_ckpt; // the checkpoint's headers were read: what follows is known
    llama_ckpt_stats stats;
    size_t files;
    uint64_t bytes, missing; // every file's bytes, and those not in the cache
    const char *command;
};

const char *cli_hub_name(const cli_hub *h) { return h->name; }

// ---------------------------------------------------------------------------------------------
// The download's progress bar: on a terminal one line redrawn at most ten times a second; with
// --progress elsewhere a line at each tenth.

static struct {
    bool tty, on;
    double last;
    int tenth;
} bar;

// 269.06 MB: the unit that reads at a glance, without the byte count beside it.
static const char *short_size(char *buf, size_t len, uint64_t b) {
    double v = (double)b;
    snprintf(buf, len, "%.2f %s",
             v >= 1e9   ? v / 1e9
             : v >= 1e6 ? v / 1e6
                        : v / 1e3,
             v >= 1e9   ? "GB"
             : v >= 1e6 ? "MB"
                        : "kB");
    return buf;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void draw_bar(void *arg, const char *file, uint64_t done, uint64_t total) {
    const cli_hub *h = arg;
    if (!bar.on || !total) return;
    double t = now_s();
    int tenth = (int)(10 * done / total);
    if (bar.tty ? t - bar.last < 0.1 && done < total : tenth == bar.tenth) return;
    bar.last = t;
    bar.tenth = tenth;
    char a[32], b[32], line[64];
    int width = 30, full = (int)((uint64_t)width * done / total);
    for (int i = 0; i < width; i++) line[i] = i < full ? '#' : '-';
    line[width] = 0;
    fprintf(stderr, bar.tty ? "\r\033[Kmembill %s: %s [%s] %3d%% %s of %s" : "membill %s: %s [%s] %3d%% %s of %s\n",
            h->command, file, line, (int)(100 * done / total), short_size(a, sizeof a, done),
            short_size(b, sizeof b, total));
}

// ---------------------------------------------------------------------------------------------

static int fail(const cli_hub *h, int code, const ag_err *err) {
    fprintf(stderr, "membill %s: %s\n", h->command, err->msg);
    return code;
}

// "model.safetensors 269.06 MB" for up to four files, then how many more.
static void file_list(const llama_hub_weights *w, bool missing_only, char *buf, size_t len) {
    size_t k = 0, shown = 0, left = 0;
    buf[0] = 0;
    for (size_t i = 0; i < w->n; i++) {
        const llama_hub_shard *s = &w->files[i];
        if (missing_only && s->cached) continue;
        if (shown == 4) {
            left++;
            continue;
        }
        char b[32];
        k += (size_t)snprintf(buf + k, k < len ? len - k : 0, "%s%s %s", shown ? ", " : "", s->name,
                              short_size(b, sizeof b, s->size));
        shown++;
    }
    if (left && k < len) snprintf(buf + k, len - k, " and %zu more", left);
}

static int download(cli_hub *h, const cli_options *o, llama_hub_weights *w) {
    char list[600], total[32];
    size_t n = 0;
    for (size_t i = 0; i < w->n; i++) n += !w->files[i].cached;
    file_list(w, true, list, sizeof list);
    fprintf(stderr, "membill %s: downloading %s at %.12s: %zu file%s, %s (%s) into %s\n", h->command, h->repo.id,
            h->repo.commit, n, n == 1 ? "" : "s", mp_format_bytes(total, sizeof total, w->missing_bytes), list,
            h->hub.cache);
    bar.tty = isatty(STDERR_FILENO);
    bar.on = bar.tty || o->progress;
    bar.tenth = -1;
    h->hub.progress = draw_bar;
    h->hub.progress_arg = h;
    ag_err err = {""};
    int rc = llama_hub_download(&h->hub, &h->repo, w, &err);
    if (bar.tty && bar.on) fputs("\r\033[K", stderr);
    h->hub.progress = NULL;
    return rc == 0 ? 0 : fail(h, EXIT_RUN_FAILED, &err);
}

// The checkpoint's dtypes as "BF16" or "BF16 (99.9%), F32" by share of the elements.
static const char *dtypes_text(const llama_ckpt_stats *s, char *buf, size_t len) {
    uint64_t all = 0;
    size_t k = 0;
    for (int d = 0; d < LLAMA_ST_NDTYPES; d++) all += s->elements[d];
    buf[0] = 0;
    for (int d = 0, shown = 0; d < LLAMA_ST_NDTYPES && all; d++) {
        if (!s->elements[d]) continue;
        if (s->elements[d] == all)
            k += (size_t)snprintf(buf + k, len - k, "%s", llama_st_dtype_name((llama_st_dtype)d));
        else
            k += (size_t)snprintf(buf + k, len - k, "%s%s (%.1f%%)", shown ? ", " : "",
                                  llama_st_dtype_name((llama_st_dtype)d), 100.0 * (double)s->elements[d] / (double)all);
        shown++;
        if (k >= len) break;
    }
    return buf;
}

// The checkpoint against its config, one warning line when they disagree.
static void warn_mismatch(const cli_hub *h, const llama_config *cfg, const llama_hub_weights *w) {
    ag_err e = {""};
    char a[32], b[32];
    uint64_t want = llama_param_count(cfg);
    if (llama_ckpt_check_params(w->ckpt, cfg, true, &e) != 0)
        fprintf(stderr, "membill %s: warning: the checkpoint does not match config.json: %s\n", h->command, e.msg);
    else if (h->stats.params != want)
        fprintf(stderr, "membill %s: warning: the checkpoint holds %s parameters, config.json makes %s\n", h->command,
                cli_commas(a, sizeof a, h->stats.params), cli_commas(b, sizeof b, want));
}

// What the run does with the checkpoint: weights in the cache are read; --download fetches the
// rest; otherwise a real run starts from a random init, and says so.
static int checkpoint(cli_hub *h, cli_options *o, const llama_config *cfg) {
    bool real = o->cmd != CLI_PLAN && !o->meta && !o->weights;
    bool wanted = o->cmd == CLI_PLAN || real || (o->weight_dtype && !strcmp(o->weight_dtype, "auto"));
    if (!wanted) return 0;
    llama_hub cache_only = h->hub;
    cache_only.offline = true; // without --download, a real run reads what is cached and fetches no headers
    bool ask = o->cmd == CLI_PLAN || o->download || (o->weight_dtype && !strcmp(o->weight_dtype, "auto"));
    llama_hub_weights w;
    ag_err err = {""};
    int rc = llama_hub_weights_open(ask ? &h->hub : &cache_only, &h->repo, &w, &err);
    bool must = o->download || (o->weight_dtype && !strcmp(o->weight_dtype, "auto"));
    if (rc < 0 || (rc != LLAMA_HUB_FOUND && must)) return fail(h, EXIT_RUN_FAILED, &err);
    if (rc == LLAMA_HUB_FOUND) {
        h->have_ckpt = true;
        llama_ckpt_stats_of(w.ckpt, cfg->tied, &h->stats);
        h->files = w.n;
        h->bytes = w.bytes;
        h->missing = w.missing_bytes;
        if (o->cmd == CLI_PLAN) warn_mismatch(h, cfg, &w);
    }
    int code = rc == LLAMA_HUB_FOUND && real && w.missing_bytes && o->download ? download(h, o, &w) : 0;
    if (rc == LLAMA_HUB_FOUND && real && !w.missing_bytes) {
        snprintf(h->weights, sizeof h->weights, "%s", w.path);
        h->missing = 0;
    }
    if (code == 0 && real && !h->weights[0]) {
        fprintf(stderr, "membill %s: %s: %s: a random init (--download fetches them)\n", h->command, h->repo.id,
                rc == LLAMA_HUB_ABSENT  ? "no safetensors weights"
                : rc == LLAMA_HUB_FOUND ? "the weights are not all in the cache"
                                        : "the weights are not in the cache");
    }
    // plan runs from config.json alone when the checkpoint cannot be had: it says why
    if (rc == LLAMA_HUB_ABSENT && o->cmd == CLI_PLAN)
        fprintf(stderr, "membill plan: %s: no safetensors weights: the checkpoint is not checked\n", h->repo.id);
    else if (rc == LLAMA_HUB_NOT_CACHED && o->cmd == CLI_PLAN)
        fprintf(stderr, "membill plan: the checkpoint is not checked: %s\n", err.msg);
    llama_hub_weights_close(&w);
    return code;
}

// A file beside config.json that the run needs: absent on the Hub is fine (the caller says what
// it lacks); not to be had is the run's end when required.
static int beside(cli_hub *h, const char *file, bool required) {
    char path[LLAMA_HUB_PATH_MAX];
    ag_err err = {""};
    int rc = llama_hub_file(&h->hub, &h->repo, file, true, path, sizeof path, &err);
    if (rc < 0 || (rc == LLAMA_HUB_NOT_CACHED && required)) return fail(h, EXIT_RUN_FAILED, &err);
    return 0;
}

int cli_hub_prepare(cli_options *o) {
    static cli_hub state;
    cli_hub *h = &state;
    memset(h, 0, sizeof *h);
    h->command = o->command;
    ag_err err = {""};
    if (llama_hub_init(&h->hub, &err) != 0) return fail(h, EXIT_USAGE, &err);
    h->hub.offline |= o->offline;
    if (llama_hub_repo_init(&h->hub, o->model, &h->repo, &err) != 0)
        return fail(h, strncmp(err.msg, "--model", 7) == 0 ? EXIT_USAGE : EXIT_RUN_FAILED, &err);
    int rc = llama_hub_file(&h->hub, &h->repo, "config.json", true, h->config, sizeof h->config, &err);
    if (rc == LLAMA_HUB_ABSENT) ag_err_set(&err, "%s has no config.json at revision %s", h->repo.id, h->repo.revision);
    if (rc != 0) return fail(h, EXIT_RUN_FAILED, &err);
    snprintf(h->name, sizeof h->name, "%.199s%s%.255s", h->repo.id, strcmp(h->repo.revision, "main") ? "@" : "",
             strcmp(h->repo.revision, "main") ? h->repo.revision : "");
    o->config = h->config;
    o->hub = h;
    llama_config cfg;
    if (llama_config_load(&cfg, h->config, &err) != 0) return fail(h, EXIT_RUN_FAILED, &err);
    if ((o->prompt || o->prompt_file) && !o->tokenizer && (rc = beside(h, "tokenizer.json", true)) != 0) return rc;
    if (o->cmd == CLI_INFER && !o->ignore_eos && !o->meta && (rc = beside(h, "generation_config.json", false)) != 0)
        return rc;
    if ((rc = checkpoint(h, o, &cfg)) != 0) return rc;
    if (h->weights[0]) o->weights = h->weights;
    return 0;
}

int cli_weight_dtype_auto(cli_options *o) {
    if (!o->weight_dtype || strcmp(o->weight_dtype, "auto") != 0) return 0;
    llama_ckpt_stats s;
    bool known = o->hub && o->hub->have_ckpt;
    if (known) s = o->hub->stats;
    char cfg[4096], st[4096];
    ag_err err = {""};
    llama_ckpt *ck = NULL;
    if (!known && o->weights) {
        if (llama_weights_resolve(o->weights, cfg, st, sizeof st, &err) != 0 || llama_ckpt_open(&ck, st, &err) != 0) {
            cli_usage_error(o, "--weight-dtype auto: %s", err.msg);
            return EXIT_RUN_FAILED;
        }
        llama_ckpt_stats_of(ck, false, &s);
        llama_ckpt_close(ck);
        known = true;
    }
    if (!known) {
        cli_usage_error(o, "--weight-dtype auto takes the checkpoint's dtype: give --weights, or --model org/name "
                           "(its safetensors headers)");
        return EXIT_USAGE;
    }
    llama_st_dtype d = llama_ckpt_stats_dtype(&s);
    o->weight_dtype = d == LLAMA_ST_BF16 ? "bf16" : d == LLAMA_ST_F16 ? "fp16" : "fp32";
    return 0;
}

void cli_hub_text(FILE *f, const cli_hub *h) {
    char p[32], b[32], d[96];
    if (!h->have_ckpt) return;
    fprintf(f, "checkpoint: %s at %.12s, %zu file%s, %s%s: %s parameters in %s\n", h->repo.id, h->repo.commit, h->files,
            h->files == 1 ? "" : "s", mp_format_bytes(b, sizeof b, h->bytes),
            h->missing ? " (headers only in the cache)" : "", cli_commas(p, sizeof p, h->stats.params),
            dtypes_text(&h->stats, d, sizeof d));
}

json_t *cli_hub_json(const cli_hub *h) {
    json_t *j = json_object();
    json_object_set_new(j, "id", json_string(h->repo.id));
    json_object_set_new(j, "revision", json_string(h->repo.revision));
    json_object_set_new(j, "commit", json_string(h->repo.commit));
    json_object_set_new(j, "snapshot", json_string(h->repo.snapshot));
    if (!h->have_ckpt) return j;
    json_t *c = json_object(), *by = json_object();
    json_object_set_new(c, "files", json_integer((json_int_t)h->files));
    json_object_set_new(c, "bytes", json_integer((json_int_t)h->bytes));
    json_object_set_new(c, "cached", json_boolean(h->missing == 0));
    json_object_set_new(c, "parameters", json_integer((json_int_t)h->stats.params));
    for (int d = 0; d < LLAMA_ST_NDTYPES; d++)
        if (h->stats.elements[d])
            json_object_set_new(by, llama_st_dtype_name((llama_st_dtype)d),
                                json_integer((json_int_t)h->stats.elements[d]));
    json_object_set_new(c, "elements_by_dtype", by);
    json_object_set_new(c, "dtype", json_string(llama_st_dtype_name(llama_ckpt_stats_dtype(&h->stats))));
    json_object_set_new(j, "checkpoint", c);
    return j;
}
