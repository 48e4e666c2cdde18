// One rank's training run under ZeRO (parallel.h): the model built sharded for stage 3 (unit by
// unit, as zero.Init), each step's forward with stage 3's gathers around each part, backward
// with the gradients reduced in buckets, the optimizer on this rank's shards, the weights
// gathered back. membill train --zero runs it on every rank; membill plan on a simulated one.
#include "cli.h"
#include "parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// The model's modules as ZeRO-3 gathers them: the embedding, each block, the final norm with the
// head (a tied head is the embedding again).
typedef struct {
    par_unit *units;
    size_t n;
    ag_tensor *head[2];
} model_units;

static int make_units(llama_model *m, model_units *mu, ag_err *err) {
    size_t L = (size_t)m->cfg.layers;
    mu->n = L + 2;
    mu->units = calloc(mu->n, sizeof *mu->units);
    if (!mu->units) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    mu->units[0] = (par_unit){m->params, 1};
    for (size_t i = 0; i < L; i++)
        mu->units[i + 1] = (par_unit){m->params + llama_layer_first_param(&m->cfg, (int64_t)i),
                                      llama_layer_param_count(&m->cfg, (int64_t)i)};
    mu->head[0] = m->norm;
    mu->head[1] = m->lm_head;
    mu->units[L + 1] = (par_unit){mu->head, 2};
    return 0;
}

typedef struct {
    train_run *r;
    llama_model *m;
} fill_arg;

// Every parameter that has its storage now: the seeded init (each parameter's values depend on
// its index alone) or the checkpoint's tensors.
static int fill(void *user, ag_err *err) {
    fill_arg *a = user;
    if (!a->r->st_path[0]) {
        llama_model_init_random(a->m, a->r->seed);
        return 0;
    }
    return llama_model_load(a->m, a->r->st_path, err);
}

static int build(train_run *r, cli_zero *zc, ag_ctx *ctx, llama_model **m, par_zero **z, model_units *mu, ag_err *err) {
    // a mixture of experts: an expert no token reached adds zeros (find_unused_parameters)
    par_zero_config zcfg = {zc->stage, zc->bucket_bytes, zc->prefetch, r->cfg.moe.experts > 0};
    if (zc->stage < 3) {
        if (cli_model_build(ctx, &r->cfg, &r->dtype, r->st_path, r->seed, m, err) != 0) return -1;
        cli_routing_attach(&r->routing, *m);
        if (make_units(*m, mu, err) != 0) return -1;
        return par_zero_new(z, &zcfg, zc->comm, ctx, (*m)->params, (*m)->nparams, mu->units, mu->n, err);
    }
    ag_precision md = cli_precision(&r->dtype);
    if (!ag_ctx_set_precision(ctx, &md)) {
        ag_err_set(err, "%s", ag_ctx_error(ctx));
        return -1;
    }
    ag_ctx_defer_params(ctx, true);
    int rc = llama_model_new(m, ctx, &r->cfg, err);
    ag_ctx_defer_params(ctx, false);
    if (rc == 0) cli_routing_attach(&r->routing, *m);
    if (rc == 0) rc = make_units(*m, mu, err);
    if (rc == 0) rc = par_zero_new(z, &zcfg, zc->comm, ctx, (*m)->params, (*m)->nparams, mu->units, mu->n, err);
    fill_arg fa = {r, *m};
    if (rc == 0) rc = par_zero_materialize(*z, fill, &fa, err);
    return rc;
}

// ZeRO's hooks in train_run.c's step: zero_grad on the shards too, the part hook in forward, the
// buckets' last reductions after backward, the weights gathered after the update.
static void zero_grad_hook(void *u) { par_zero_zero_grad(u); }
static int after_backward_hook(void *u, ag_err *err) { return par_zero_after_backward(u, err); }
static int after_step_hook(void *u, ag_err *err) { return par_zero_after_step(u, err); }

static int zero_step(train_run *r, cli_zero *zc, ag_ctx *ctx, llama_model *m, par_zero *z, optim *opt, long s,
                     ag_err *err) {
    double c0 = par_comm_seconds(zc->comm);
    const cli_step_hooks h = {zero_grad_hook, par_zero_on_part, after_backward_hook, after_step_hook, z};
    if (cli_train_step(r, ctx, m, opt, s, &h, err) != 0) return -1;
    if (zc->comm_s) zc->comm_s[s] = par_comm_seconds(zc->comm) - c0;
    return 0;
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
    mp_set_phase(MP_PHASE_LOAD);
    cli_progress("building the model, sharded");
    if (build(r, zc, ctx, &m, &z, &mu, err) != 0) goto done;
    optim_config oc = r->ocfg;
    oc.torch_113_foreach = r->framework == AG_FRAMEWORK_PYTORCH_113;
    size_t nopt;
    ag_tensor *const *op = par_zero_opt_params(z, &nopt);
    if (!(opt = optim_new(&oc, op, nopt, err))) goto done;
    for (long s = 0; s < r->nsteps; s++)
        if (zero_step(r, zc, ctx, m, z, opt, s, err) != 0) goto done;
    if (r->save_weights) { // stage 3 gathers every unit on every rank; rank 0 writes
        if (par_zero_gather_all(z, err) != 0) goto done;
        int src = r->save ? r->save(r->save_arg, m, false, err) : 0;
        par_zero_release_all(z);
        if (src != 0) goto done;
    }
    rc = 0;
done:
    mp_set_phase(MP_PHASE_TEARDOWN);
    optim_free(opt);
    par_zero_free(z);
    llama_model_free(m);
    free(mu.units);
    ag_ctx_free(ctx);
    return cli_run_end(rc, &r->torn_down_clean, err);
}
