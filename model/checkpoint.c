// A checkpoint: one safetensors file, or the shards that a model.safetensors.index.json names
// (Hugging Face's sharded layout: {"metadata": {...}, "weight_map": {tensor: shard file}}).
// Every shard is opened and checked as a single file is (llama_st_open); then the index and
// the shards must agree: each tensor of the weight map in the shard it names, each tensor of a
// shard in the weight map, no tensor in two shards. Only then are the parameters checked
// against the config, over the tensors of every shard as one set.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "model_internal.h"

// An index is a few hundred kB for the largest published models.
#define INDEX_MAX_BYTES (64u << 20)

typedef struct {
    const llama_st_tensor *t;
    const llama_st_file *f;
} entry;

struct llama_ckpt {
    char *path; // the file, or the index
    llama_st_file **files;
    size_t nfiles;
    bool owns; // false: a view of one file that the caller owns
    entry *by_name;
    size_t n;
};

bool llama_ckpt_is_index(const char *path) {
    size_t n = strlen(path);
    return n >= 5 && strcmp(path + n - 5, ".json") == 0;
}

void llama_ckpt_close(llama_ckpt *c) {
    if (!c) return;
    for (size_t i = 0; c->owns && i < c->nfiles; i++) llama_st_close(c->files[i]);
    free(c->files);
    free(c->by_name);
    free(c->path);
    free(c);
}

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const entry *)a)->t->name, ((const entry *)b)->t->name);
}

// Every tensor of every file, sorted by name.
static int index_tensors(llama_ckpt *c, ag_err *err) {
    size_t n = 0;
    for (size_t i = 0; i < c->nfiles; i++) n += llama_st_count(c->files[i]);
    c->by_name = calloc(n ? n : 1, sizeof *c->by_name);
    if (!c->by_name) {
        ag_err_set(err, "%s: out of memory", c->path);
        return -1;
    }
    for (size_t i = 0; i < c->nfiles; i++)
        for (size_t j = 0; j < llama_st_count(c->files[i]); j++)
            c->by_name[c->n++] = (entry){llama_st_get(c->files[i], j), c->files[i]};
    qsort(c->by_name, c->n, sizeof *c->by_name, entry_cmp);
    return 0;
}

static llama_ckpt *ckpt_new(const char *path, size_t nfiles, bool owns, ag_err *err) {
    llama_ckpt *c = calloc(1, sizeof *c);
    if (c) {
        c->path = strdup(path);
        c->files = calloc(nfiles ? nfiles : 1, sizeof *c->files);
        c->owns = owns;
    }
    if (!c || !c->path || !c->files) {
        llama_ckpt_close(c);
        ag_err_set(err, "%s: out of memory", path);
        return NULL;
    }
    return c;
}

// ---------------------------------------------------------------------------------------------
// The index

static int str_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

// The folder of the index, with its slash ("" when the path has none).
static void folder_of(char *dir, size_t len, const char *index) {
    const char *slash = strrchr(index, '/');
    size_t k = slash ? (size_t)(slash - index) + 1 : 0;
    if (k >= len) k = 0;
    memcpy(dir, index, k);
    dir[k] = '\0';
}

// A shard is named by a file name inside the index's folder: no path separator, no "." or "..".
static bool plain_name(const char *s) { return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0; }

// One entry of the weight map names a file in the index's folder; else the message.
static bool entry_ok(const char *path, const char *key, const json_t *v, ag_err *err) {
    const char *file = json_string_value(v);
    if (file && plain_name(file)) return true;
    char shown[256] = "";
    if (!file) {
        ag_err_set(err, "%s: weight_map entry %s is not a string (expected a shard's file name)", path, key);
        return false;
    }
    ag_escape(shown, sizeof shown, file);
    ag_err_set(err,
               "%s: weight_map puts tensor %s in \"%s\": expected the name of a file in the index's folder (a "
               "path could lead outside it)",
               path, key, shown);
    return false;
}

// The weight map, checked: an object of tensor name -> shard file name. *shards gets the distinct
// file names, sorted (borrowed from root).
static const json_t *weight_map(const json_t *root, const char *path, const char ***shards, size_t *n, ag_err *err) {
    const json_t *map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(map) || json_object_size(map) == 0) {
        ag_err_set(err, "%s: expected a JSON object with a non-empty object weight_map (tensor name -> shard file)",
                   path);
        return NULL;
    }
    const char **names = calloc(json_object_size(map), sizeof *names);
    if (!names) {
        ag_err_set(err, "%s: out of memory", path);
        return NULL;
    }
    const char *key;
    const json_t *v;
    size_t k = 0, u = 0;
    json_object_foreach((json_t *)map, key, v) {
        if (!entry_ok(path, key, v, err)) {
            free(names);
            return NULL;
        }
        names[k++] = json_string_value(v);
    }
    qsort(names, k, sizeof *names, str_cmp);
    for (size_t i = 0; i < k; i++)
        if (u == 0 || strcmp(names[u - 1], names[i]) != 0) names[u++] = names[i];
    *shards = names;
    *n = u;
    return map;
}

// The shard the weight map names for each tensor holds it, and every tensor of every shard is
// in the weight map, in the shard it names; two shards holding one tensor are caught here too
// (the map names one of them only).
static int check_map(const llama_ckpt *c, const json_t *map, ag_err *err) {
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)map, key, v) {
        const llama_st_tensor *t = NULL;
        for (size_t i = 0; !t && i < c->nfiles; i++) {
            const char *base = strrchr(llama_st_path(c->files[i]), '/');
            if (strcmp(base ? base + 1 : llama_st_path(c->files[i]), json_string_value(v)) == 0)
                t = llama_st_find(c->files[i], key);
        }
        if (!t) {
            ag_err_set(err, "%s: weight_map puts tensor %s in %s, which does not hold it", c->path, key,
                       json_string_value(v));
            return -1;
        }
    }
    for (size_t i = 0; i < c->n; i++) {
        const entry *e = &c->by_name[i];
        if (i + 1 < c->n && strcmp(e->t->name, c->by_name[i + 1].t->name) == 0) {
            ag_err_set(err, "%s: tensor %s is in two shards, %s and %s", c->path, e->t->name, llama_st_path(e->f),
                       llama_st_path(c->by_name[i + 1].f));
            return -1;
        }
        if (!json_object_get(map, e->t->name)) {
            ag_err_set(err, "%s: shard %s holds tensor %s, which weight_map does not name", c->path,
                       llama_st_path(e->f), e->t->name);
            return -1;
        }
    }
    return 0;
}

typedef struct {
    llama_st_opener open;
    void *arg;
} opener;

// Opens every shard the index names.
static int open_shards(llama_ckpt *c, const char **shards, size_t n, const opener *op, ag_err *err) {
    for (size_t i = 0; i < n; i++) {
        ag_err e;
        if (op->open(op->arg, shards[i], &c->files[c->nfiles], &e) != 0) {
            ag_err_set(err, "%s: shard %s: %s", c->path, shards[i], e.msg);
            return -1;
        }
        c->nfiles++;
    }
    return 0;
}

static int open_index(llama_ckpt **out, const char *path, const opener *op, ag_err *err) {
    char *text;
    size_t len;
    if (llama_read_file(path, "a model.safetensors.index.json", INDEX_MAX_BYTES, &text, &len, err) != 0)
        return -1;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root) {
        ag_err_set(err, "%s: not valid JSON (line %d, column %d: %s)", path, jerr.line, jerr.column, jerr.text);
        return -1;
    }
    const char **shards = NULL;
    size_t n = 0;
    const json_t *map = weight_map(root, path, &shards, &n, err);
    llama_ckpt *c = map ? ckpt_new(path, n, true, err) : NULL;
    int rc = c && open_shards(c, shards, n, op, err) == 0 && index_tensors(c, err) == 0 && check_map(c, map, err) == 0
                 ? 0
                 : -1;
    free(shards);
    json_decref(root);
    if (rc != 0) {
        llama_ckpt_close(c);
        return -1;
    }
    *out = c;
    return 0;
}

// llama_ckpt_open's opener: the file of that name in the checkpoint's folder (arg).
static int open_in_folder(void *arg, const char *name, llama_st_file **out, ag_err *err) {
    char p[8192];
    snprintf(p, sizeof p, "%s%s", (const char *)arg, name);
    return llama_st_open(out, p, err);
}

int llama_ckpt_open_with(llama_ckpt **out, const char *path, llama_st_opener open, void *arg, ag_err *err) {
    *out = NULL;
    const opener op = {open, arg};
    if (llama_ckpt_is_index(path)) return open_index(out, path, &op, err);
    llama_ckpt *c = ckpt_new(path, 1, true, err);
    if (!c) return -1;
    const char *slash = strrchr(path, '/');
    if (op.open(op.arg, slash ? slash + 1 : path, &c->files[0], err) != 0 ||
        (c->nfiles = 1, index_tensors(c, err) != 0)) {
        llama_ckpt_close(c);
        return -1;
    }
    *out = c;
    return 0;
}

int llama_ckpt_open(llama_ckpt **out, const char *path, ag_err *err) {
    char dir[4096];
    folder_of(dir, sizeof dir, path);
    return llama_ckpt_open_with(out, path, open_in_folder, dir, err);
}

void llama_ckpt_stats_of(const llama_ckpt *c, bool tied, llama_ckpt_stats *s) {
    memset(s, 0, sizeof *s);
    for (size_t i = 0; i < c->n; i++) {
        const llama_st_tensor *t = c->by_name[i].t;
        s->elements[t->dtype] += t->numel;
        s->bytes += t->nbytes;
        if (!(tied && strcmp(t->name, "lm_head.weight") == 0)) s->params += t->numel;
    }
}

llama_st_dtype llama_ckpt_stats_dtype(const llama_ckpt_stats *s) {
    static const llama_st_dtype floats[] = {LLAMA_ST_F32, LLAMA_ST_BF16, LLAMA_ST_F16};
    llama_st_dtype best = LLAMA_ST_F32;
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
        if (s->elements[floats[i]] > s->elements[best]) best = floats[i];
    return best;
}

const char *llama_ckpt_path(const llama_ckpt *c) { return c->path; }
size_t llama_ckpt_files(const llama_ckpt *c) { return c->nfiles; }
const llama_st_file *llama_ckpt_file(const llama_ckpt *c, size_t i) { return i < c->nfiles ? c->files[i] : NULL; }

const llama_st_tensor *llama_ckpt_find(const llama_ckpt *c, const char *name, const llama_st_file **in) {
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int k = strcmp(name, c->by_name[mid].t->name);
        if (k == 0) {
            if (in) *in = c->by_name[mid].f;
            return c->by_name[mid].t;
        }
        if (k < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// Parameters against a config

static bool is_float(llama_st_dtype d) { return d == LLAMA_ST_F32 || d == LLAMA_ST_BF16 || d == LLAMA_ST_F16; }

// The first fault of one expected tensor, or 0 if it is present and right. A missing tensor is
// named against the checkpoint (the index, when sharded); a wrong one against its file.
static int param_fault(const llama_ckpt *c, const char *name, int ndim, const int64_t *shape, char *msg, size_t len) {
    const llama_st_file *f = NULL;
    const llama_st_tensor *t = llama_ckpt_find(c, name, &f);
    if (!t) {
        snprintf(msg, len, "%s: tensor %s missing%s", c->path, name, c->nfiles > 1 ? " (in no shard)" : "");
        return 1;
    }
    bool same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char got[160], want[160];
        llama_format_shape(got, sizeof got, t->shape, t->ndim);
        llama_format_shape(want, sizeof want, shape, ndim);
        snprintf(msg, len, "%s: tensor %s has shape %s, the config expects %s", llama_st_path(f), name, got, want);
        return 1;
    }
    if (!is_float(t->dtype)) {
        snprintf(msg, len, "%s: tensor %s has dtype %s, expected F32, BF16 or F16", llama_st_path(f), name,
                 llama_st_dtype_name(t->dtype));
        return 1;
    }
    return 0;
}

// Tensors of the checkpoint that are not in the sorted list of expected names.
static int check_extras(const llama_ckpt *c, const char **names, size_t n, ag_err *err) {
    const char *first = NULL;
    size_t extra = 0;
    for (size_t i = 0; i < c->n; i++) {
        const char *key = c->by_name[i].t->name;
        if (bsearch(&key, names, n, sizeof *names, str_cmp)) continue;
        if (!first) first = key;
        extra++;
    }
    if (!extra) return 0;
    if (extra == 1)
        ag_err_set(err, "%s: unexpected tensor %s (not a parameter of this config)", c->path, first);
    else
        ag_err_set(err, "%s: unexpected tensor %s (not a parameter of this config) and %zu more", c->path, first,
                   extra - 1);
    return -1;
}

int llama_ckpt_check_params(const llama_ckpt *c, const llama_config *cfg, bool allow_extra, ag_err *err) {
    ag_err verr;
    if (llama_config_validate(cfg, &verr) != 0) {
        ag_err_set(err, "%s: cannot check against an invalid config: %s", c->path, verr.msg);
        return -1;
    }
    // a tied config may still carry lm_head.weight (the embedding's shape): expected if present
    bool tied_head = cfg->tied && llama_ckpt_find(c, "lm_head.weight", NULL);
    size_t n = llama_param_count_tensors(cfg), total = n + (tied_head ? 1 : 0);
    char *store = malloc(total * LLAMA_PARAM_NAME_MAX);
    const char **names = malloc(total * sizeof *names);
    if (!store || !names) {
        free(store);
        free(names);
        ag_err_set(err, "%s: out of memory", c->path);
        return -1;
    }
    size_t faults = 0;
    for (size_t i = 0; i < total; i++) {
        char *name = store + i * LLAMA_PARAM_NAME_MAX;
        int ndim = 2;
        int64_t shape[LLAMA_PARAM_MAX_DIMS] = {cfg->vocab, cfg->hidden, 1};
        if (i < n)
            llama_param_spec(cfg, i, name, LLAMA_PARAM_NAME_MAX, &ndim, shape);
        else
            snprintf(name, LLAMA_PARAM_NAME_MAX, "lm_head.weight");
        names[i] = name;
        char msg[sizeof err->msg];
        if (param_fault(c, name, ndim, shape, msg, sizeof msg) && faults++ == 0) ag_err_set(err, "%s", msg);
    }
    if (faults > 1 && err) {
        size_t used = strlen(err->msg);
        snprintf(err->msg + used, sizeof err->msg - used, " (and %zu more tensors at fault)", faults - 1);
    }
    int rc = faults ? -1 : 0;
    if (rc == 0 && !allow_extra) {
        qsort(names, total, sizeof *names, str_cmp);
        rc = check_extras(c, names, total, err);
    }
    free(store);
    free(names);
    return rc;
}

int llama_st_check_params(const llama_st_file *f, const llama_config *cfg, bool allow_extra, ag_err *err) {
    llama_ckpt *c = ckpt_new(llama_st_path(f), 1, false, err);
    if (!c) return -1;
    c->files[0] = (llama_st_file *)f; // a view: closing it leaves f open
    c->nfiles = 1;
    int rc = index_tensors(c, err) == 0 ? llama_ckpt_check_params(c, cfg, allow_extra, err) : -1;
    llama_ckpt_close(c);
    return rc;
}
