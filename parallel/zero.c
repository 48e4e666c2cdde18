// A sharded run over a communicator: the parameters' slots and shards, stage 3's units, the
// optimizer's views, construction (zero.Init) and teardown.
#include "zero_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t clip(size_t v, size_t hi) { return v < hi ? v : hi; }

size_t par_part_lo(const zslot *s, int q) { return clip((size_t)q * s->stride, s->numel); }
size_t par_part_len(const zslot *s, int q) { return clip(par_part_lo(s, q) + s->stride, s->numel) - par_part_lo(s, q); }
size_t par_part_cap(const par_zero *z, const zslot *s, int q) {
    return !z->st->dim0 ? par_part_len(s, q) : q < s->grp->size ? s->stride : 0;
}

bool par_real(const par_zero *z) { return !par_is_simulated(z->comm) && z->N > 1; }

long par_find_slot(par_zero *z, const ag_tensor *p) {
    for (size_t k = 0; k < z->n; k++) { // gradients come in near-reverse order: look from the last hit down
        size_t i = (z->last + z->n - k) % z->n;
        if (z->slots[i].p == p) return (long)(z->last = i);
    }
    return -1;
}

int par_alloc(mp_block *b, size_t bytes, mp_category cat, const ag_tensor *p, const char *what, bool host,
              ag_err *err) {
    char label[256];
    snprintf(label, sizeof label, "%s:%s", ag_tensor_name(p), what);
    bool was = mp_set_host(host);
    mp_status st = mp_alloc(b, bytes, cat, label);
    mp_set_host(was);
    if (st == MP_OK) return 0;
    ag_err_set(err, "cannot allocate %s (%zu bytes, %s%s): %s", label, bytes, host ? "host memory, " : "",
               mp_category_name(cat), st == MP_ERR_BUDGET ? "over the memory budget" : "out of memory");
    return -1;
}

// A slot's geometry: its elements (a quantised weight's storage bytes), their sizes gathered and
// in the shard, a rank's part of it over its group (a rank past the group's size has none).
static void shape_slot(par_zero *z, zslot *s, ag_tensor *p, const par_group *grp) {
    bool bytes = p->bits < 16 && p->ndim > 1;
    s->p = p;
    s->grp = grp;
    s->trains = p->requires_grad;
    s->bucket = -1;
    s->numel = bytes ? (size_t)ag_param_storage_bytes(p) : (size_t)p->numel;
    s->gsize = bytes ? 1 : (size_t)p->bits / 8;
    s->ssize = s->trains && z->cfg.shard_bits ? (size_t)z->cfg.shard_bits / 8 : s->gsize;
    size_t N = (size_t)grp->size, rows = bytes ? s->numel : (size_t)p->shape[0], per = rows ? s->numel / rows : 1;
    s->stride = z->st->dim0 ? (rows + N - 1) / N * per : (s->numel + N - 1) / N;
    s->lo = par_part_lo(s, grp->rank);
    s->hi = s->lo + par_part_len(s, grp->rank);
    s->held = par_part_cap(z, s, grp->rank);
}

static int make_units(par_zero *z, const par_unit *units, size_t nunits, ag_err *err) {
    z->units = calloc(nunits ? nunits : 1, sizeof *z->units);
    if (!z->units) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    z->nunits = nunits;
    for (size_t u = 0; u < nunits; u++) {
        zunit *U = &z->units[u];
        U->slots = calloc(units[u].n ? units[u].n : 1, sizeof *U->slots);
        if (!U->slots) {
            ag_err_set(err, "out of memory");
            return -1;
        }
        for (size_t j = 0; j < units[u].n; j++) {
            long i = par_find_slot(z, units[u].params[j]);
            if (i < 0 || z->slots[i].nunits == 2) {
                ag_err_set(err, "zero: unit %zu names %s, %s", u, ag_tensor_name(units[u].params[j]),
                           i < 0 ? "which is not one of the parameters" : "a parameter of two units already");
                return -1;
            }
            U->slots[U->n++] = (size_t)i;
            z->slots[i].units[z->slots[i].nunits++] = (int)u;
        }
    }
    for (size_t i = 0; i < z->n; i++)
        if (!z->slots[i].nunits) {
            ag_err_set(err, "zero: %s belongs to no unit (stage 3 gathers parameters by unit)",
                       ag_tensor_name(z->slots[i].p));
            return -1;
        }
    return 0;
}

// The optimizer's view of a shard: a tensor that owns nothing, named as its parameter.
static void make_view(ag_tensor *v, const ag_tensor *p, void *data, size_t n, int bits) {
    memset(v, 0, sizeof *v);
    v->ndim = 1;
    v->shape[0] = (int64_t)n;
    v->numel = (int64_t)n;
    v->data = data;
    v->refcount = 1;
    v->bits = bits;
    v->dtype = bits == 32 ? AG_F32 : p->dtype;
    v->site = p->site;
    v->requires_grad = v->is_param = true;
    v->own_bits = p->own_bits; // its state of its own dtype too
}

static int setup(par_zero *z, ag_tensor *const *params, size_t n, const par_group_kind *groups, const par_unit *units,
                 size_t nunits, ag_err *err) {
    z->slots = calloc(n ? n : 1, sizeof *z->slots);
    z->opt = calloc(n ? n : 1, sizeof *z->opt);
    z->counts = par_real(z) ? calloc(2 * (size_t)z->N, sizeof *z->counts) : NULL;
    if (!z->slots || !z->opt || (par_real(z) && !z->counts)) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    z->displs = z->counts ? z->counts + z->N : NULL;
    for (size_t i = 0; i < n; i++) {
        if (z->st->stage < 3 && !params[i]->requires_grad) continue; // a frozen weight stays whole
        if (z->st->stage == 3 && ag_param_has_storage(params[i])) {
            ag_err_set(err, "zero stage 3: %s has its storage already (make the parameters deferred)",
                       ag_tensor_name(params[i]));
            return -1;
        }
        par_group_kind g = groups && z->cfg.ep > 1 ? groups[i] : PAR_GROUP_DATA;
        shape_slot(z, &z->slots[z->n++], params[i], &z->groups[g]);
    }
    if (z->st->stage == 3 && make_units(z, units, nunits, err) != 0) return -1;
    if (par_make_buckets(z, err) != 0) return -1; // FSDP's follow the units
    for (size_t i = 0; i < z->n; i++) {
        zslot *s = &z->slots[i];
        if (!s->trains) continue;
        if (z->st->stage == 0) {
            z->opt[z->nopt++] = s->p;
        } else if (s->hi > s->lo) {
            void *at = z->st->stage < 3 && s->p->data ? (char *)s->p->data + s->lo * s->gsize : NULL;
            make_view(&s->view, s->p, at, s->hi - s->lo, (int)s->ssize * 8);
            z->opt[z->nopt++] = &s->view;
        }
    }
    ag_leaf_hooks h = {par_before_backward, par_grad_ready, z};
    ag_ctx_set_leaf_hooks(z->ctx, &h);
    return z->st->stage < 3 ? par_offload_setup(z, err) : 0;
}

// What a setting may ask: a stage that exists, FSDP over stage 3, offload over what it needs.
static bool config_ok(const par_zero_config *c, ag_err *err) {
    const char *bad = NULL;
    if (!c->bucket_bytes || c->prefetch < 0)
        bad = "expected a bucket of at least 1 byte and prefetch >= 0";
    else if (!par_strategy_of(c->stage, c->fsdp) || (c->fsdp && c->stage != 3))
        bad = "expected stage 0 to 3 (FSDP: 3)";
    else if (c->offload && c->stage < 2)
        bad = "offload needs stage 2 or 3 (or FSDP)";
    else if (c->offload == PAR_OFFLOAD_OPTIMIZER_PARAMS && c->stage != 3)
        bad = "the parameters offload with stage 3 (or FSDP)";
    else if (c->fsdp && c->offload == PAR_OFFLOAD_OPTIMIZER)
        bad = "FSDP's CPUOffloadPolicy moves the parameters with the optimizer (optimizer+params)";
    else if (c->ep < 0 || (c->ep > 1 && c->fsdp))
        bad = "expert parallelism shards the experts over their data-parallel group under ZeRO (FSDP's is not "
              "modelled)";
    if (bad)
        ag_err_set(err, "zero: stage %d, FSDP %s, offload %s, prefetch %d, bucket %zu bytes: %s", c->stage,
                   par_fsdp_name(c->fsdp), par_offload_name(c->offload), c->prefetch, c->bucket_bytes, bad);
    return !bad;
}

// The shards, buckets and gathers of a real run move float32, and a frozen quantised base as
// bytes; other dtypes are a bill of meta mode only.
static bool real_dtypes_ok(ag_tensor *const *params, size_t n, ag_err *err) {
    for (size_t i = 0; !mp_is_meta() && i < n; i++) {
        const ag_tensor *p = params[i];
        if (p->dtype == AG_F32 || (!p->requires_grad && p->bits < 16)) continue;
        ag_err_set(err, "zero: %s is %s: the shards of a real run are float32 (other dtypes: --meta, or plan)",
                   ag_tensor_name(p), ag_type_traits_of(p->dtype)->name);
        return false;
    }
    return true;
}

int par_zero_new(par_zero **out, const par_zero_config *cfg, par_comm *c, ag_ctx *ctx, ag_tensor *const *params,
                 size_t n, const par_group_kind *groups, const par_unit *units, size_t nunits, ag_err *err) {
    *out = NULL;
    if (!cfg || !c || !ctx) {
        ag_err_set(err, "zero: no setting, communicator or context");
        return -1;
    }
    if (!config_ok(cfg, err) || !real_dtypes_ok(params, n, err)) return -1;
    if (cfg->ep > 1 && (par_size(c) % cfg->ep != 0 || !par_is_simulated(c))) {
        ag_err_set(err, "zero: experts over %d of %d ranks: %s", cfg->ep, par_size(c),
                   par_is_simulated(c) ? "the ranks must be a multiple of it"
                                       : "the expert-data-parallel groups are simulated only (membill plan --ep)");
        return -1;
    }
    for (size_t i = 0; groups && i < n; i++)
        if ((unsigned)groups[i] >= PAR_NGROUPS) {
            ag_err_set(err, "zero: %s has no group of ranks (%d)", ag_tensor_name(params[i]), (int)groups[i]);
            return -1;
        }
    par_zero *z = calloc(1, sizeof *z);
    if (!z) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    z->cfg = *cfg;
    z->st = par_strategy_of(cfg->stage, cfg->fsdp);
    z->comm = c;
    z->ctx = ctx;
    z->N = par_size(c);
    z->rank = par_rank(c);
    z->groups[PAR_GROUP_DATA] = (par_group){z->N, z->rank};
    z->groups[PAR_GROUP_EXPERT_DATA] = par_expert_data_group(c, cfg->ep);
    z->grad_bytes = (size_t)ag_ctx_precision(ctx).grad_bits / 8;
    for (size_t i = 0; i < n; i++) // parameters of their own dtype (float32 adapters): gradients of it
        if (params[i]->requires_grad) {
            if (params[i]->own_bits) z->grad_bytes = (size_t)params[i]->bits / 8;
            break;
        }
    z->reduce_bytes = cfg->reduce_bits ? (size_t)cfg->reduce_bits / 8 : z->grad_bytes;
    z->sync = true;
    z->bw_unit = -1;
    if (setup(z, params, n, groups, units, nunits, err) != 0) {
        par_zero_free(z);
        return -1;
    }
    *out = z;
    return 0;
}

void par_zero_free(par_zero *z) {
    if (!z) return;
    ag_ctx_set_leaf_hooks(z->ctx, NULL);
    for (size_t i = 0; z->slots && i < z->n; i++) {
        zslot *s = &z->slots[i];
        ag_release(s->grad_shard);
        mp_free(&s->shard);
        mp_free(&s->master);
        if (z->st->stage == 3) ag_param_free_storage(s->p);
    }
    for (size_t b = 0; b < z->nbuckets; b++) {
        mp_free(&z->buckets[b].buf);
        free(z->buckets[b].slots);
    }
    for (size_t u = 0; z->units && u < z->nunits; u++) free(z->units[u].slots);
    free(z->units);
    free(z->buckets);
    free(z->slots);
    free(z->opt);
    free(z->counts);
    free(z);
}

const par_strategy *par_zero_strategy(const par_zero *z) { return z->st; }

ag_tensor *const *par_zero_opt_params(const par_zero *z, size_t *n) {
    *n = z->nopt;
    return z->opt;
}

bool par_zero_steps_on_float32(const par_zero *z) {
    return (par_offloads(z) && !z->st->unit_gather) || z->cfg.shard_bits == 32;
}

void par_zero_set_sync(par_zero *z, bool sync) { z->sync = sync; }

// ---- stage 3: construction and saving ----------------------------------------------------------

// This rank's part of a parameter whose storage holds data now, into its shard (padded with zeros).
static int take_shard(par_zero *z, zslot *s, ag_err *err) {
    if (par_alloc(&s->shard, s->held * s->ssize, MP_WEIGHT, s->p, "shard", par_params_on_host(z), err) != 0) return -1;
    if (s->shard.data && s->p->data) {
        memcpy(s->shard.data, (char *)s->p->data + s->lo * s->gsize, (s->hi - s->lo) * s->gsize);
        memset((char *)s->shard.data + (s->hi - s->lo) * s->gsize, 0, (s->held - (s->hi - s->lo)) * s->gsize);
    }
    s->view.data = s->shard.data;
    return 0;
}

int par_zero_materialize(par_zero *z, par_fill_fn fill, void *user, ag_err *err) {
    if (z->st->stage != 3) return 0;
    for (size_t u = 0; u < z->nunits; u++) {
        zunit *U = &z->units[u];
        int rc = 0;
        for (size_t j = 0; rc == 0 && j < U->n; j++) {
            zslot *s = &z->slots[U->slots[j]];
            if (!s->shard.bytes && s->held && !ag_param_alloc_storage(z->ctx, s->p)) rc = -1;
        }
        if (rc != 0) ag_err_set(err, "%s", ag_ctx_error(z->ctx));
        if (rc == 0 && fill) rc = fill(user, err);
        for (size_t j = 0; j < U->n; j++) {
            zslot *s = &z->slots[U->slots[j]];
            if (rc == 0 && ag_param_has_storage(s->p)) rc = take_shard(z, s, err);
            ag_param_free_storage(s->p);
        }
        if (rc != 0) return -1;
    }
    return par_offload_setup(z, err);
}

int par_zero_gather_all(par_zero *z, ag_err *err) {
    for (size_t u = 0; z->st->stage == 3 && u < z->nunits; u++)
        if (par_hold(z, (long)u, err) != 0) return -1;
    return 0;
}

void par_zero_release_all(par_zero *z) {
    for (size_t u = 0; u < z->nunits; u++) par_let_go(z, (long)u);
}
