// --routing and --routing-out: how a mixture of experts' tokens are routed in a meta run, and the
// file in which a real run records its routers' choices, so that a meta run of the same setting
// bills what the real one allocated, byte for byte.
#include "cli.h"

#include <jansson.h>
#include <string.h>

int cli_routing_prepare(const cli_options *o, const llama_config *c, cli_routing *r, ag_err *err) {
    memset(r, 0, sizeof *r);
    bool moe = c->moe.experts > 0;
    if (!moe && (cli_given(o, "--routing") || o->routing_out)) {
        ag_err_set(err, "%s: %s has no mixture of experts to route",
                   cli_given(o, "--routing") ? "--routing" : "--routing-out", c->name);
        return EXIT_USAGE;
    }
    if (!moe) return 0;
    const char *how = o->routing ? o->routing : "balanced";
    int rc = 0;
    if (!strcmp(how, "balanced"))
        rc = llama_routing_new(&r->assume, LLAMA_ROUTING_BALANCED, err);
    else if (!strcmp(how, "worst"))
        rc = llama_routing_new(&r->assume, LLAMA_ROUTING_WORST, err);
    else {
        ag_err why;
        if (llama_routing_load(&r->assume, how, c, &why) != 0) {
            ag_err_set(err, "--routing: %s", why.msg);
            return EXIT_RUN_FAILED;
        }
    }
    if (rc == 0 && o->routing_out) rc = llama_routing_new(&r->record, LLAMA_ROUTING_MEASURED, err);
    return rc == 0 ? 0 : EXIT_RUN_FAILED;
}

void cli_routing_attach(const cli_routing *r, llama_model *m) {
    m->moe.assume = r->assume;
    m->moe.record = mp_is_meta() ? NULL : r->record;
}

void cli_routing_free(cli_routing *r) {
    llama_routing_free(r->assume);
    llama_routing_free(r->record);
    memset(r, 0, sizeof *r);
}

const char *cli_routing_name(const cli_routing *r, bool meta) {
    if (!meta) return "measured";
    switch (llama_routing_kind_of(r->assume)) {
    case LLAMA_ROUTING_WORST: return "worst";
    case LLAMA_ROUTING_FILE: return "file";
    default: return "balanced";
    }
}

void cli_routing_text(FILE *f, const llama_config *c, const cli_routing *r, bool meta) {
    if (c->moe.experts <= 0) return;
    char b[400], active[32], all[32];
    fprintf(f, "routing: %s; %lld experts, %lld a token (%s of the %s parameters active a token)\n",
            meta ? llama_routing_describe(r->assume, b, sizeof b) : "measured (the routers' own choices)",
            (long long)c->moe.experts, (long long)c->moe.top_k,
            cli_commas(active, sizeof active, llama_active_param_count(c)),
            cli_commas(all, sizeof all, llama_param_count(c)));
    cli_mtp_text(f, c);
}

// deepseek_v3's num_nextn_predict_layers: the multi-token-prediction layers a checkpoint may hold,
// which transformers' DeepseekV3ForCausalLM does not build (nor membill bill); said either way.
void cli_mtp_text(FILE *f, const llama_config *c) {
    if (c->mla.nextn_layers > 0)
        fprintf(f, "mtp: num_nextn_predict_layers %lld (the multi-token-prediction module) is not billed\n",
                (long long)c->mla.nextn_layers);
}

void cli_mtp_json(struct json_t *run, const llama_config *c) {
    if (c->mla.nextn_layers > 0)
        json_object_set_new(run, "mtp_layers_not_billed", json_integer((json_int_t)c->mla.nextn_layers));
}

void cli_mla_cache_text(FILE *f, const llama_config *c) {
    if (c->mla.kv_lora_rank <= 0) return;
    if (c->mla.latent_cache)
        fprintf(f, "cache: latent (DeepSeek's own: kv_lora_rank %lld + qk_rope_head_dim %lld a token and layer, "
                   "kv_b_proj absorbed)\n",
                (long long)c->mla.kv_lora_rank, (long long)c->mla.qk_rope);
    else
        fprintf(f, "cache: expanded (transformers' DynamicCache: every head's keys at %lld and values at %lld; "
                   "--mla-cache latent for DeepSeek's own)\n",
                (long long)(c->mla.qk_nope + c->mla.qk_rope), (long long)c->mla.v_head);
}

void cli_mla_cache_json(struct json_t *run, const llama_config *c) {
    if (c->mla.kv_lora_rank > 0)
        json_object_set_new(run, "mla_cache", json_string(c->mla.latent_cache ? "latent" : "expanded"));
}

int cli_routing_writer(FILE *f, void *routing, ag_err *err) { return llama_routing_write(routing, f, err); }
