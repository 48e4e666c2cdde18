// What a run is made of: the config, where the weights come from, and the token ids.
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int cli_budget_check(ag_err *err) {
    const mp_oom_record *r = mp_oom();
    if (!r->happened) return 0;
    ag_err_set(err, "over the memory budget of %llu bytes: %s %s took %llu bytes in phase %s",
               (unsigned long long)r->budget, r->category == MP_OTHER ? "plain malloc after" : "tensor",
               r->category == MP_OTHER ? mp_site_name(r->live.site) : mp_site_name(r->site),
               (unsigned long long)r->requested, mp_phase_name(r->live.phase));
    return -1;
}

int cli_load_config(const cli_options *o, llama_config *cfg, char *st_path, size_t st_len,
                    ag_err *err) {
    char cfg_from_weights[4096] = "";
    st_path[0] = 0;
    if (o->weights &&
        llama_weights_resolve(o->weights, cfg_from_weights, st_path, st_len, err) != 0)
        return -1;
    const char *cfg_file = o->config ? o->config : (cfg_from_weights[0] ? cfg_from_weights : NULL);
    if (o->config && o->model) {
        ag_err_set(err, "--model and --config both name a model: give one");
        return -1;
    }
    if (cfg_file) return llama_config_load(cfg, cfg_file, err);
    return llama_config_preset(cfg, o->model ? o->model : "smollm2-135m", err);
}

// "1,2,3" -> ids; a malformed list names the item at fault.
int cli_parse_tokens(const char *text, int32_t **out, long *n, ag_err *err) {
    long cap = 16, count = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    const char *p = text;
    while (ids) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            ag_err_set(err, "--tokens: item %ld is not a token id (expected comma-separated ids such as 1,2,3)", count + 1);
            free(ids);
            return -1;
        }
        if (count == cap) {
            int32_t *grown = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!grown) break;
            ids = grown;
        }
        ids[count++] = (int32_t)v;
        if (!*end) {
            *out = ids;
            *n = count;
            return 0;
        }
        p = end + 1;
    }
    free(ids);
    ag_err_set(err, "--tokens: out of memory");
    return -1;
}

int32_t *cli_make_tokens(const cli_options *o, const llama_config *cfg, long *batch, long *seq_len,
                         ag_err *err) {
    int32_t *row = NULL;
    long B = o->batch ? o->batch : 1, T = o->seq_len ? o->seq_len : 25;
    if (o->tokens) {
        if (cli_parse_tokens(o->tokens, &row, &T, err) != 0) return NULL;
        if (o->seq_len && o->seq_len != T) {
            ag_err_set(err, "--tokens gives %ld ids but --seq-len says %ld", T, o->seq_len);
            free(row);
            return NULL;
        }
    }
    if (T > cfg->max_positions) {
        ag_err_set(err, "%ld tokens exceed the model's %lld positions (max_position_embeddings)", T,
                      (long long)cfg->max_positions);
        free(row);
        return NULL;
    }
    if ((uint64_t)B * (uint64_t)T > ((uint64_t)1 << 31) / sizeof(int32_t)) {
        ag_err_set(err, "--batch %ld x --seq-len %ld is too many tokens", B, T);
        free(row);
        return NULL;
    }
    int32_t *ids = malloc((size_t)(B * T) * sizeof *ids);
    if (!ids) {
        free(row);
        ag_err_set(err, "out of memory for %ld x %ld token ids", B, T);
        return NULL;
    }
    uint64_t s = o->seed * 0x9e3779b97f4a7c15ULL + 12345;
    for (long i = 0; i < B * T; i++) {
        if (row) {
            ids[i] = row[i % T];
        } else { // xorshift: any fixed, seeded sequence of ids in range will do
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            ids[i] = (int32_t)(s % (uint64_t)cfg->vocab);
        }
    }
    free(row);
    if (llama_check_tokens(cfg, ids, (size_t)(B * T), err) != 0) {
        free(ids);
        return NULL;
    }
    *batch = B;
    *seq_len = T;
    return ids;
}
