// LoRA and QLoRA on the command line: the options into a setting, the frozen base's storage,
// and the report's parts (PEFT's trainable-parameter line, the adapters' bill by site, the four
// copies of what trains).
#include "cli.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int cli_lora_from_options(const cli_options *o, cli_lora *l, ag_err *err) {
    memset(l, 0, sizeof *l);
    l->base_dtype = o->base_dtype;
    l->cfg.alpha = o->lora_alpha;
    l->cfg.dropout = o->lora_dropout;
    l->cfg.rank = o->lora_rank;
    // PEFT upcasts float16 and bfloat16 adapters to float32 (a float32 base's are float32 anyway);
    // a mixed-precision engine (DeepSpeed's, Megatron's) casts the whole module, adapters too, to
    // 16 bits and keeps the float32 master copy itself.
    cli_dtype dt;
    bool engine_cast = cli_parse_dtype(o->dtype, &dt) && dt.master && !cli_given(o, "--adapter-dtype");
    l->cfg.adapter_bits = !engine_cast && (!o->adapter_dtype || strcmp(o->adapter_dtype, "float32") == 0) ? 32 : 0;
    if (o->cmd == CLI_COMPARE && !cli_given(o, "--lora-rank")) l->cfg.rank = 8;
    if (o->lora_targets && llama_lora_parse_targets(o->lora_targets, &l->cfg.targets, err) != 0) return EXIT_USAGE;
    if (!o->lora_targets) l->cfg.targets = LLAMA_LORA_DEFAULT_TARGETS;
    if (o->adapter) {
        llama_lora_config file;
        char base[LLAMA_NAME_MAX];
        if (llama_adapter_read_config(o->adapter, &file, base, sizeof base, err) != 0) return EXIT_RUN_FAILED;
        snprintf(l->adapter, sizeof l->adapter, "%s", o->adapter);
        // What the options do not say comes from the file; what they say is checked against it
        // when the tensors are read (a rank of another size names the first tensor at fault).
        if (!cli_given(o, "--lora-rank")) l->cfg.rank = file.rank;
        if (!cli_given(o, "--lora-alpha")) l->cfg.alpha = file.alpha;
        if (!cli_given(o, "--lora-targets")) l->cfg.targets = file.targets;
        if (!cli_given(o, "--lora-dropout")) l->cfg.dropout = file.dropout;
    }
    if (l->cfg.rank > 0 && llama_lora_validate(&l->cfg, err) != 0) return o->adapter ? EXIT_RUN_FAILED : EXIT_USAGE;
    return 0;
}

bool cli_lora_base_dtype(const cli_lora *l, const cli_dtype *d, ag_precision *out) {
    if (!l->base_dtype) return false;
    *out = cli_precision(d);
    out->group = 0, out->scale_bytes = 0, out->nf4 = false;
    if (strcmp(l->base_dtype, "nf4") == 0) {
        out->weight_bits = 4, out->nf4 = true;
    } else if (strcmp(l->base_dtype, "int4") == 0) { // symmetric int4, an fp16 scale per 64 of a row
        out->weight_bits = 4, out->group = 64, out->scale_bytes = 2;
    } else { // LLM.int8's layout: int8 elements and a float32 scale per row (SCB)
        out->weight_bits = 8, out->group = (int64_t)1 << 40, out->scale_bytes = 4;
    }
    return true;
}

const char *cli_lora_text(const llama_config *cfg, const cli_lora *l, char *buf, size_t len) {
    char t[128];
    int n = snprintf(buf, len, "LoRA r %lld, alpha %g (scale %g), dropout %g, targets %s", (long long)l->cfg.rank,
                     l->cfg.alpha, l->cfg.alpha / (double)l->cfg.rank, l->cfg.dropout,
                     llama_lora_targets_text(llama_lora_targets_of(cfg, l->cfg.targets), t, sizeof t));
    if (l->base_dtype && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, "; frozen base's linear weights in %s", l->base_dtype);
    return buf;
}

void cli_lora_params_text(FILE *f, const llama_config *cfg, const cli_lora *l) {
    uint64_t base = llama_param_count(cfg), ad = llama_lora_param_count(cfg, &l->cfg), all = base + ad;
    char a[32], b[32], c[32];
    // PEFT's print_trainable_parameters, then what stays frozen
    fprintf(f, "trainable params: %s || all params: %s || trainable%%: %.4f\n", cli_commas(a, sizeof a, ad),
            cli_commas(b, sizeof b, all), all ? 100.0 * (double)ad / (double)all : 0.0);
    fprintf(f, "frozen params: %s (%.4f%%): the base, no gradient and no optimizer state\n",
            cli_commas(c, sizeof c, base), all ? 100.0 * (double)base / (double)all : 0.0);
}

// The adapters' rows of one category at its own peak, "...lora_A.weight:exp_avg" under
// "...lora_A.weight"; the rest of the category (the frozen base's weights) summed into *rest.
typedef struct {
    char site[CLI_KIND_MAX];
    uint64_t bytes[3]; // weight, gradient, optimizer
} lora_row;

#define LORA_ROWS 64

static size_t collect(lora_row *rows, size_t n, int k, mp_category cat, uint64_t *rest) {
    static cli_site_row sites[4096];
    size_t m = cli_breakdown(mp_get_counter(cat).peak_events, cat, sites, 4096, NULL, 0);
    for (size_t i = 0; i < m; i++) {
        char key[CLI_KIND_MAX];
        snprintf(key, sizeof key, "%.*s", (int)sizeof key - 1, sites[i].kind);
        char *colon = strchr(key, ':');
        if (colon) *colon = 0;
        if (!strstr(key, ".lora_")) {
            *rest += sites[i].bytes;
            continue;
        }
        size_t j = 0;
        while (j < n && strcmp(rows[j].site, key) != 0) j++;
        if (j == n && n < LORA_ROWS) snprintf(rows[n++].site, sizeof rows[0].site, "%.*s", (int)sizeof key - 1, key);
        if (j < n) rows[j].bytes[k] += sites[i].bytes;
    }
    return n;
}

static size_t lora_rows(lora_row *rows, uint64_t rest[3]) {
    static const mp_category cats[3] = {MP_WEIGHT, MP_GRADIENT, MP_OPTIMIZER};
    size_t n = 0;
    memset(rows, 0, LORA_ROWS * sizeof *rows);
    for (int k = 0; k < 3; k++) n = collect(rows, n, k, cats[k], &rest[k]);
    return n;
}

void cli_lora_bill_text(FILE *f, const llama_config *cfg, const cli_lora *l) {
    static lora_row rows[LORA_ROWS];
    uint64_t rest[3] = {0, 0, 0}, tot[3] = {0, 0, 0};
    size_t n = lora_rows(rows, rest);
    char a[64], b[64], c[64], t[256];
    fprintf(f, "\n  %s: the adapters by site, each category at its own peak (summed over blocks)\n",
            cli_lora_text(cfg, l, t, sizeof t));
    fprintf(f, "    %-46s %-16s %-16s %-16s\n", "site", "weight", "gradient", "optimizer");
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "    %-46s %-16s %-16s %-16s\n", rows[i].site, cli_commas(a, sizeof a, rows[i].bytes[0]),
                cli_commas(b, sizeof b, rows[i].bytes[1]), cli_commas(c, sizeof c, rows[i].bytes[2]));
        for (int k = 0; k < 3; k++) tot[k] += rows[i].bytes[k];
    }
    fprintf(f, "    %-46s %-16s %-16s %-16s\n", "adapters", cli_commas(a, sizeof a, tot[0]),
            cli_commas(b, sizeof b, tot[1]), cli_commas(c, sizeof c, tot[2]));
    fprintf(f, "    %-46s %-16s %-16s %-16s\n", "frozen base", cli_commas(a, sizeof a, rest[0]),
            cli_commas(b, sizeof b, rest[1]), cli_commas(c, sizeof c, rest[2]));
    uint64_t four = tot[0] + tot[1] + tot[2];
    fprintf(f, "\n  four copies of what trains: adapters + their gradients + their optimizer state = %s\n",
            mp_format_bytes(a, sizeof a, four));
    fprintf(f, "    = %.3f x the adapters (%s); the frozen base adds its weights alone: %s (%.1f x the adapters)\n",
            tot[0] ? (double)four / (double)tot[0] : 0.0, mp_format_bytes(b, sizeof b, tot[0]),
            mp_format_bytes(c, sizeof c, rest[0]), tot[0] ? (double)rest[0] / (double)tot[0] : 0.0);
}

json_t *cli_lora_json(const llama_config *cfg, const cli_lora *l) {
    static lora_row rows[LORA_ROWS];
    uint64_t rest[3] = {0, 0, 0}, tot[3] = {0, 0, 0};
    size_t n = lora_rows(rows, rest);
    uint64_t base = llama_param_count(cfg), ad = llama_lora_param_count(cfg, &l->cfg);
    char t[128];
    json_t *o = json_object(), *sites = json_array();
    json_object_set_new(o, "rank", json_integer(l->cfg.rank));
    json_object_set_new(o, "alpha", json_real(l->cfg.alpha));
    json_object_set_new(o, "scale", json_real(l->cfg.alpha / (double)l->cfg.rank));
    json_object_set_new(o, "dropout", json_real(l->cfg.dropout));
    json_object_set_new(o, "targets",
                        json_string(llama_lora_targets_text(llama_lora_targets_of(cfg, l->cfg.targets), t, sizeof t)));
    json_object_set_new(o, "base_dtype", l->base_dtype ? json_string(l->base_dtype) : json_null());
    json_object_set_new(o, "adapter_dtype", json_string(l->cfg.adapter_bits == 32 ? "float32" : "base"));
    json_object_set_new(o, "adapter", l->adapter[0] ? json_string(l->adapter) : json_null());
    json_object_set_new(o, "trainable_params", json_integer((json_int_t)ad));
    json_object_set_new(o, "frozen_params", json_integer((json_int_t)base));
    json_object_set_new(o, "all_params", json_integer((json_int_t)(base + ad)));
    json_object_set_new(o, "trainable_percent", json_real(base + ad ? 100.0 * (double)ad / (double)(base + ad) : 0));
    for (size_t i = 0; i < n; i++) {
        json_t *r = json_object();
        json_object_set_new(r, "site", json_string(rows[i].site));
        json_object_set_new(r, "weight_bytes", json_integer((json_int_t)rows[i].bytes[0]));
        json_object_set_new(r, "gradient_bytes", json_integer((json_int_t)rows[i].bytes[1]));
        json_object_set_new(r, "optimizer_bytes", json_integer((json_int_t)rows[i].bytes[2]));
        json_array_append_new(sites, r);
        for (int k = 0; k < 3; k++) tot[k] += rows[i].bytes[k];
    }
    json_object_set_new(o, "by_site", sites);
    json_object_set_new(o, "adapter_weight_bytes", json_integer((json_int_t)tot[0]));
    json_object_set_new(o, "adapter_gradient_bytes", json_integer((json_int_t)tot[1]));
    json_object_set_new(o, "adapter_optimizer_bytes", json_integer((json_int_t)tot[2]));
    json_object_set_new(o, "frozen_weight_bytes", json_integer((json_int_t)rest[0]));
    json_object_set_new(o, "frozen_gradient_bytes", json_integer((json_int_t)rest[1]));
    json_object_set_new(o, "frozen_optimizer_bytes", json_integer((json_int_t)rest[2]));
    return o;
}
