// The report's writers for cli_outputs_write (outputs.h), and its shared JSON parts.
#include "cli.h"
#include "outputs.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int cli_json_writer(FILE *f, void *json_root, ag_err *err) {
    (void)err;
    int rc = json_dumpf((json_t *)json_root, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    fputc('\n', f);
    return rc;
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
    json_object_set_new(m, "model_type", json_string(llama_family_name(c->family)));
    json_object_set_new(m, "class", json_string(llama_family_class(c->family)));
    if (c->moe.experts > 0) { // a mixture of experts: what a token's forward reads
        json_object_set_new(m, "experts", json_integer(c->moe.experts));
        json_object_set_new(m, "experts_per_token", json_integer(c->moe.top_k));
        json_object_set_new(m, "active_parameters", json_integer((json_int_t)llama_active_param_count(c)));
    }
    json_object_set_new(m, "sliding_window", json_integer(c->sliding_window)); // 0: none
    json_object_set_new(m, "rope_scaling", json_string(llama_rope_type_name(c->rope.type)));
    return m;
}
