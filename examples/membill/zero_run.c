// One rank's training run under ZeRO or FSDP (parallel.h): the model built sharded for stage 3
// (unit by unit, as zero.Init), its adapters too with LoRA (the frozen base sharded in its own
// dtype), each step's forward with stage 3's gathers around each part, backward with the
// gradients reduced in buckets, the optimizer on this rank's shards, the weights gathered back.
// membill train --zero / --fsdp runs it on every rank; membill plan on a simulated one.
#include "cli.h"
#include "parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void cli_zero_from_options(const cli_options *o, cli_zero *z) {
    memset(z, 0, sizeof *z);
    z->stage = o->fsdp ? 3 : (int)o->zero;
    z->prefetch = (int)o->prefetch_layers;
    z->bucket_bytes = (size_t)o->bucket_mb << 20;
    z->fsdp = !o->fsdp ? PAR_FSDP_NONE : !strcmp(o->fsdp, "full-shard") ? PAR_FSDP_FULL_SHARD : PAR_FSDP_SHARD_GRAD_OP;
    z->offload = !o->offload                        ? PAR_OFFLOAD_NONE
                 : !strcmp(o->offload, "optimizer") ? PAR_OFFLOAD_OPTIMIZER
                                                    : PAR_OFFLOAD_OPTIMIZER_PARAMS;
}

// FSDP over 16-bit weights with a float32 master (mixed precision) is MixedPrecisionPolicy(
// param_dtype=16-bit, reduce_dtype=float32) over float32 shards.
static par_zero_config config_of(const train_run *r, const cli_zero *zc) {
    par_zero_config c = {.stage = zc->stage,
                         .fsdp = (par_fsdp)zc->fsdp,
                         .bucket_bytes = zc->bucket_bytes,
                         .prefetch = zc->prefetch,
                         .offload = (par_offload)zc->offload,
                         // an expert no token reached adds zeros (find_unused_parameters)
                         .find_unused = r->cfg.moe.experts > 0,
                         // plan --ep: this rank's experts sharded over their expert-data-parallel group
                         .ep = r->cfg.moe.ep > 1 ? (int)r->cfg.moe.ep : 0};
    if (zc->fsdp && r->dtype.master) c.shard_bits = c.reduce_bits = 32;
    return c;
}

// Each parameter's group of ranks: a routed expert's (this rank's own, under --ep) is
// partitioned over its expert-data-parallel group, everything else over every rank (the
// adapters are the dense projections': LoRA does not reach the experts).
static par_group_kind *groups_of(const llama_model *m, ag_err *err) {
    par_group_kind *g = calloc(m->nparams + m->nadapters + 1, sizeof *g);
    if (!g) ag_err_set(err, "out of memory");
    for (size_t i = 0; g && i < m->nparams; i++) {
        llama_param_info info;
        if (llama_param_info_of(&m->cfg, i, &info) == 0 && info.expert >= 0) g[i] = PAR_GROUP_EXPERT_DATA;
    }
    return g;
}

// The model's modules, one unit per part of the forward. ZeRO-3: the embedding, each block with
// its adapters, the final norm with the head (a tied head is the embedding again). FSDP: the
// root first (the embedding, the final norm and the head, gathered for the whole step), the
// blocks, and nothing for the last part.
typedef struct {
    par_unit *units;
    size_t n;
    ag_tensor **list; // the units' parameters back to back
} model_units;

static int make_units(llama_model *m, bool fsdp, model_units *mu, ag_err *err) {
    size_t L = (size_t)m->cfg.layers, apl = m->nadapters / (L ? L : 1);
    mu->n = L + 2;
    mu->units = calloc(mu->n, sizeof *mu->units);
    mu->list = calloc(m->nparams + m->nadapters + 4, sizeof *mu->list);
    if (!mu->units || !mu->list) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    ag_tensor **at = mu->list;
    ag_tensor *head[3] = {m->norm, m->cfg.tied ? NULL : m->lm_head, NULL};
    mu->units[0] = (par_unit){at, 1};
    *at++ = m->embed;
    for (int k = 0; fsdp && head[k]; k++) *at++ = head[k], mu->units[0].n++;
    for (size_t i = 0; i < L; i++) { // a sparse layer holds more tensors than a dense one
        size_t per = llama_layer_param_count(&m->cfg, (int64_t)i);
        mu->units[i + 1] = (par_unit){at, per + apl};
        memcpy(at, m->params + llama_layer_first_param(&m->cfg, (int64_t)i), per * sizeof *at);
        if (apl) memcpy(at + per, m->adapters + i * apl, apl * sizeof *at);
        at += per + apl;
    }
    ag_tensor *zero_head[2] = {m->norm, m->lm_head};
    mu->units[L + 1] = (par_unit){at, fsdp ? 0 : 2};
    if (!fsdp) memcpy(at, zero_head, sizeof zero_head);
    return 0;
}

typedef struct {
    train_run *r;
    llama_model *m;
} fill_arg;

// Every parameter that has its storage now: the seeded init (each parameter's values depend on
// its index alone) or the checkpoint's tensors; the adapters' init or the adapter's tensors.
static int fill(void *user, ag_err *err) {
    fill_arg *a = user;
    const cli_lora *l = &a->r->lora;
    if (!a->r->st_path[0])
        llama_model_init_random(a->m, a->r->seed);
    else if (llama_model_load(a->m, a->r->st_path, err) != 0)
        return -1;
    if (!l->cfg.rank) return 0;
    if (l->adapter[0] && !mp_is_meta()) return llama_adapter_load(a->m, l->adapter, err);
    llama_lora_init(a->m, a->r->seed);
    return 0;
}

// Stage 3: every parameter made without storage (the frozen base under its own dtype), then
// filled unit by unit.
static int build_deferred(train_run *r, ag_ctx *ctx, llama_model **m, ag_err *err) {
    ag_precision md = cli_precision(&r->dtype), base;
    if (!ag_ctx_set_precision(ctx, &md)) {
        ag_err_set(err, "%s", ag_ctx_error(ctx));
        return -1;
    }
    bool quantised = cli_lora_base_dtype(&r->lora, &r->dtype, &base);
    ag_ctx_defer_params(ctx, true);
    int rc = llama_model_new_proj_dtype(m, ctx, &r->cfg, quantised ? &base : NULL, err);
    if (rc == 0 && r->lora.cfg.rank) rc = llama_model_add_lora(*m, ctx, &r->lora.cfg, r->seed, err);
    ag_ctx_defer_params(ctx, false);
    return rc;
}

static int build(train_run *r, cli_zero *zc, ag_ctx *ctx, llama_model **m, par_zero **z, model_units *mu, ag_err *err) {
    par_zero_config zcfg = config_of(r, zc);
    int rc = zcfg.stage < 3 ? cli_model_build_lora(ctx, &r->cfg, &r->dtype, &r->lora, r->st_path, r->seed, m, err)
                            : build_deferred(r, ctx, m, err);
    if (rc == 0) cli_routing_attach(&r->routing, *m);
    if (rc == 0) rc = make_units(*m, zcfg.fsdp != PAR_FSDP_NONE, mu, err);
    // Every parameter, the frozen ones first as the model holds them, then the adapters.
    ag_tensor **all = rc == 0 ? malloc(((*m)->nparams + (*m)->nadapters + 1) * sizeof *all) : NULL;
    if (rc == 0 && !all) ag_err_set(err, "out of memory"), rc = -1;
    par_group_kind *groups = rc == 0 ? groups_of(*m, err) : NULL;
    if (rc == 0 && !groups) rc = -1;
    if (rc == 0) {
        memcpy(all, (*m)->params, (*m)->nparams * sizeof *all);
        if ((*m)->nadapters) memcpy(all + (*m)->nparams, (*m)->adapters, (*m)->nadapters * sizeof *all);
        rc = par_zero_new(z, &zcfg, zc->comm, ctx, all, (*m)->nparams + (*m)->nadapters, groups, mu->units, mu->n, err);
    }
    free(groups);
    free(all);
    fill_arg fa = {r, *m};
    if (rc == 0) rc = par_zero_materialize(*z, fill, &fa, err);
    return rc;
}

// ZeRO's hooks in train_run.c's step: zero_grad on the shards too, the part hook in forward, the
// micro-batches' sync, the buckets' last reductions after backward, the optimizer's side, the
// weights gathered after the update.
static void zero_grad_hook(void *u) { par_zero_zero_grad(u); }
static void sync_hook(void *u, bool last) { par_zero_set_sync(u, last); }
static int after_backward_hook(void *u, ag_err *err) { return par_zero_after_backward(u, err); }
static void before_step_hook(void *u) { par_zero_before_step(u); }
static int after_step_hook(void *u, ag_err *err) { return par_zero_after_step(u, err); }

static int zero_step(train_run *r, cli_zero *zc, ag_ctx *ctx, llama_model *m, par_zero *z, optim *opt, long s,
                     ag_err *err) {
    double c0 = par_comm_seconds(zc->comm);
    const cli_step_hooks h = {zero_grad_hook,   par_zero_on_part, sync_hook, after_backward_hook,
                              before_step_hook, after_step_hook,  z};
    if (cli_train_step(r, ctx, m, opt, s, &h, err) != 0) return -1;
    if (zc->comm_s) zc->comm_s[s] = par_comm_seconds(zc->comm) - c0;
    return 0;
}

// --save-weights and --save-adapter: stage 3 gathers every unit on every rank; rank 0 writes.
static int save(train_run *r, par_zero *z, llama_model *m, ag_err *err) {
    if (!r->save_weights && !r->saves_adapter) return 0;
    if (par_zero_gather_all(z, err) != 0) return -1;
    int rc = r->save_weights && r->save ? r->save(r->save_arg, m, false, err) : 0;
    if (rc == 0 && r->save_adapter) rc = r->save_adapter(r->save_arg, m, err);
    par_zero_release_all(z);
    return rc;
}

int cli_zero_train_run(train_run *r, cli_zero *zc, ag_err *err) {
    int rc = -1;
    ag_ctx *ctx = ag_ctx_new();
    llama_model *m = NULL;
    par_zero *z = NULL;
    optim *opt = NULL;
    model_units mu = {0};
    if (!ctx) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    ag_ctx_set_framework(ctx, r->framework);
    ag_ctx_set_attention(ctx, r->attention);
    ag_ctx_set_device(ctx, r->device);
    mp_set_phase(MP_PHASE_LOAD);
    cli_progress("building the model, sharded");
    if (build(r, zc, ctx, &m, &z, &mu, err) != 0) goto done;
    zc->strategy = par_zero_strategy(z)->name;
    optim_config oc = r->ocfg;
    oc.framework = r->framework;
    if (par_zero_steps_on_float32(z)) oc.master = false, oc.state_bits = 32; // the float32 copies are the masters
    size_t nopt;
    ag_tensor *const *op = par_zero_opt_params(z, &nopt);
    if (!(opt = optim_new(&oc, op, nopt, err))) goto done;
    for (long s = 0; s < r->nsteps; s++)
        if (zero_step(r, zc, ctx, m, z, opt, s, err) != 0) goto done;
    if (save(r, z, m, err) != 0) goto done;
    rc = 0;
done:
    mp_set_phase(MP_PHASE_TEARDOWN);
    optim_free(opt);
    par_zero_free(z);
    llama_model_free(m);
    free(mu.units);
    free(mu.list);
    ag_ctx_free(ctx);
    for (int c = 0; c < MP_NCATEGORIES; c++) zc->host_peak[c] = mp_get_host_counter(c).peak;
    return cli_run_end(rc, &r->torn_down_clean, err);
}
