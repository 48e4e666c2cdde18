// ZeRO's stages over a communicator: shards, gradient buckets, stage 3's gathered units.
#include "parallel_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ag_tensor *p;
    size_t numel, stride, lo, hi; // this rank's shard [lo, hi) of ceil(numel / N) = stride
    int bucket;
    bool ready;            // its gradient is final in this backward
    ag_tensor view;        // stages 1 to 3: what the optimizer steps on
    ag_tensor view_grad;   // stage 1: a view of .grad over the shard
    ag_tensor *grad_shard; // stages 2 and 3 (owned)
    mp_block shard;        // stage 3: this rank's weights
    int gathered;          // stage 3: units holding the whole parameter
    int units[2], nunits;  // stage 3: the units it belongs to
} zslot;

typedef struct {
    size_t *slots, n; // in bucket order
    size_t elems, pending;
    mp_block buf;
} zbucket;

typedef struct {
    size_t *slots, n;
    bool held;
} zunit;

struct par_zero {
    par_zero_config cfg;
    par_comm *comm;
    ag_ctx *ctx;
    int N, rank;
    size_t grad_bytes, weight_bytes; // of an element
    zslot *slots;
    size_t n, last;
    zbucket *buckets;
    size_t nbuckets;
    zunit *units;
    size_t nunits;
    long bw_unit; // stage 3: the unit the backward is in; -1 before it
    ag_tensor **opt;
    size_t nopt;
    size_t *counts, *displs; // [N] scratch for the collectives (real runs only)
};

static size_t clip(size_t v, size_t hi) { return v < hi ? v : hi; }

// Rank q's part [q s, (q + 1) s) of a slot, clipped to the parameter.
static size_t part_lo(const zslot *s, int q) { return clip((size_t)q * s->stride, s->numel); }
static size_t part_len(const zslot *s, int q) { return clip(part_lo(s, q) + s->stride, s->numel) - part_lo(s, q); }

static bool real(const par_zero *z) { return !par_is_simulated(z->comm) && z->N > 1; }

static long find_slot(par_zero *z, const ag_tensor *p) {
    for (size_t k = 0; k < z->n; k++) { // gradients come in near-reverse order: look from the last hit down
        size_t i = (z->last + z->n - k) % z->n;
        if (z->slots[i].p == p) return (long)(z->last = i);
    }
    return -1;
}

// Buckets in reverse parameter order, each closed once it reaches the cap (DDP's assignment).
static int make_buckets(par_zero *z, ag_err *err) {
    z->buckets = calloc(z->n ? z->n : 1, sizeof *z->buckets);
    size_t *order = calloc(z->n ? z->n : 1, sizeof *order);
    if (!z->buckets || !order) {
        free(order);
        ag_err_set(err, "out of memory");
        return -1;
    }
    size_t bytes = 0, start = 0;
    for (size_t k = 0; k < z->n; k++) {
        size_t i = z->n - 1 - k;
        order[k] = i;
        z->slots[i].bucket = (int)z->nbuckets;
        bytes += z->slots[i].numel * z->grad_bytes;
        if (bytes >= z->cfg.bucket_bytes || k == z->n - 1) {
            zbucket *b = &z->buckets[z->nbuckets++];
            b->n = k + 1 - start;
            b->slots = malloc(b->n * sizeof *b->slots);
            if (!b->slots) {
                free(order);
                ag_err_set(err, "out of memory");
                return -1;
            }
            memcpy(b->slots, order + start, b->n * sizeof *b->slots);
            for (size_t j = 0; j < b->n; j++) b->elems += z->slots[b->slots[j]].numel;
            start = k + 1;
            bytes = 0;
        }
    }
    free(order);
    return 0;
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
            long i = find_slot(z, units[u].params[j]);
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
static void make_view(ag_tensor *v, const ag_tensor *p, float *data, size_t n) {
    memset(v, 0, sizeof *v);
    v->ndim = 1;
    v->shape[0] = (int64_t)n;
    v->numel = (int64_t)n;
    v->data = data;
    v->refcount = 1;
    v->bits = p->bits;
    v->site = p->site;
    v->requires_grad = v->is_param = true;
}

static bool before_backward(void *user, ag_tensor *leaf, ag_err *err);
static bool grad_ready(void *user, ag_tensor *leaf, ag_err *err);

static int setup(par_zero *z, ag_tensor *const *params, size_t n, const par_unit *units, size_t nunits, ag_err *err) {
    z->slots = calloc(n ? n : 1, sizeof *z->slots);
    z->opt = calloc(n ? n : 1, sizeof *z->opt);
    // The per-rank counts of a real collective (a simulated rank of many never needs them).
    if (real(z)) z->counts = calloc(2 * (size_t)z->N, sizeof *z->counts);
    if (!z->slots || !z->opt || (real(z) && !z->counts)) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    z->displs = z->counts ? z->counts + z->N : NULL;
    z->n = n;
    for (size_t i = 0; i < n; i++) {
        zslot *s = &z->slots[i];
        s->p = params[i];
        s->numel = (size_t)params[i]->numel;
        s->stride = (s->numel + (size_t)z->N - 1) / (size_t)z->N;
        s->lo = part_lo(s, z->rank);
        s->hi = s->lo + part_len(s, z->rank);
        if (z->cfg.stage == 3 && ag_param_has_storage(s->p)) {
            ag_err_set(err, "zero stage 3: %s has its storage already (make the parameters deferred)",
                       ag_tensor_name(s->p));
            return -1;
        }
    }
    if (make_buckets(z, err) != 0) return -1;
    if (z->cfg.stage == 3 && make_units(z, units, nunits, err) != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        zslot *s = &z->slots[i];
        if (z->cfg.stage == 0) {
            z->opt[z->nopt++] = s->p;
        } else if (s->hi > s->lo) {
            make_view(&s->view, s->p, z->cfg.stage < 3 && s->p->data ? ag_f32(s->p) + s->lo : NULL, s->hi - s->lo);
            z->opt[z->nopt++] = &s->view;
        }
    }
    ag_leaf_hooks h = {before_backward, grad_ready, z};
    ag_ctx_set_leaf_hooks(z->ctx, &h);
    return 0;
}

int par_zero_new(par_zero **out, const par_zero_config *cfg, par_comm *c, ag_ctx *ctx, ag_tensor *const *params,
                 size_t n, const par_unit *units, size_t nunits, ag_err *err) {
    *out = NULL;
    if (!cfg || cfg->stage < 0 || cfg->stage > 3 || cfg->prefetch < 0 || !cfg->bucket_bytes || !c || !ctx) {
        ag_err_set(err,
                   "zero: stage %d, prefetch %d, bucket %zu bytes: expected stage 0 to 3, prefetch >= 0 and a "
                   "bucket of at least 1 byte",
                   cfg ? cfg->stage : -1, cfg ? cfg->prefetch : -1, cfg ? cfg->bucket_bytes : 0);
        return -1;
    }
    // The shards, buckets and gathers move float32; other dtypes are a bill of meta mode only.
    for (size_t i = 0; !mp_is_meta() && i < n; i++)
        if (params[i] && params[i]->dtype != AG_F32) {
            ag_err_set(err, "zero: %s is %s: the shards of a real run are float32 (other dtypes: --meta, or plan)",
                       ag_tensor_name(params[i]), ag_type_traits_of(params[i]->dtype)->name);
            return -1;
        }
    par_zero *z = calloc(1, sizeof *z);
    if (!z) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    z->cfg = *cfg;
    z->comm = c;
    z->ctx = ctx;
    z->N = par_size(c);
    z->rank = par_rank(c);
    ag_precision d = ag_ctx_precision(ctx);
    z->grad_bytes = (size_t)d.grad_bits / 8;
    z->weight_bytes = (size_t)d.weight_bits / 8;
    z->bw_unit = -1;
    if (setup(z, params, n, units, nunits, err) != 0) {
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
        if (z->cfg.stage == 3) ag_param_free_storage(s->p);
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

ag_tensor *const *par_zero_opt_params(const par_zero *z, size_t *n) {
    *n = z->nopt;
    return z->opt;
}

// ---- stage 3: units gathered and freed ---------------------------------------------------------

static void set_parts(par_zero *z, const zslot *s) {
    for (int q = 0; q < z->N; q++) z->counts[q] = part_len(s, q), z->displs[q] = part_lo(s, q);
}

static int gather_slot(par_zero *z, zslot *s, ag_err *err) {
    if (s->gathered++) return 0;
    if (!ag_param_alloc_storage(z->ctx, s->p)) {
        s->gathered--;
        ag_err_set(err, "%s", ag_ctx_error(z->ctx));
        return -1;
    }
    if (s->p->data && s->shard.data) memcpy(ag_f32(s->p) + s->lo, s->shard.data, (s->hi - s->lo) * sizeof(float));
    if (!real(z)) { // a simulated rank counts what a real one would move
        par_count(z->comm, PAR_ALL_GATHER, (uint64_t)s->numel * z->weight_bytes, 0);
        return 0;
    }
    set_parts(z, s);
    return par_all_gather(z->comm, s->p->data, z->counts, z->displs, z->weight_bytes, err);
}

static void release_slot(zslot *s) {
    if (s->gathered > 0 && --s->gathered == 0) ag_param_free_storage(s->p);
}

static int hold(par_zero *z, long u, ag_err *err) {
    if (u < 0 || (size_t)u >= z->nunits || z->units[u].held) return 0;
    zunit *U = &z->units[u];
    for (size_t j = 0; j < U->n; j++)
        if (gather_slot(z, &z->slots[U->slots[j]], err) != 0) {
            while (j-- > 0) release_slot(&z->slots[U->slots[j]]);
            return -1;
        }
    U->held = true;
    return 0;
}

static void let_go(par_zero *z, long u) {
    if (u < 0 || (size_t)u >= z->nunits || !z->units[u].held) return;
    zunit *U = &z->units[u];
    for (size_t j = 0; j < U->n; j++) release_slot(&z->slots[U->slots[j]]);
    U->held = false;
}

bool par_zero_on_part(void *user, int64_t part, bool before, ag_err *err) {
    par_zero *z = user;
    if (z->cfg.stage != 3) return true;
    if (part < 0 || (size_t)part >= z->nunits) {
        ag_err_set(err, "zero: the forward ran part %lld, past the %zu units", (long long)part, z->nunits);
        return false;
    }
    if (!before) {
        let_go(z, (long)part);
        return true;
    }
    for (long k = 0; k <= z->cfg.prefetch; k++)
        if (hold(z, (long)part + k, err) != 0) return false;
    return true;
}

static bool in_unit(const zslot *s, long u) {
    for (int k = 0; k < s->nunits; k++)
        if (s->units[k] == u) return true;
    return false;
}

// Before a node's backward reaches a parameter: the unit the backward has moved into (the last
// one in forward order below the current that holds it), gathered with the next ones it will
// reach; every unit above it freed.
static bool before_backward(void *user, ag_tensor *leaf, ag_err *err) {
    par_zero *z = user;
    if (z->cfg.stage != 3) return true;
    long i = find_slot(z, leaf);
    if (i < 0) return true; // not one of ours
    zslot *s = &z->slots[i];
    if (z->bw_unit >= 0 && in_unit(s, z->bw_unit)) return true;
    long u = -1;
    for (int k = 0; k < s->nunits; k++)
        if ((z->bw_unit < 0 || s->units[k] < z->bw_unit) && s->units[k] > u) u = s->units[k];
    if (u < 0) u = s->units[0];
    for (long w = (long)z->nunits - 1; w > u; w--) let_go(z, w);
    z->bw_unit = u;
    for (long k = 0; k <= z->cfg.prefetch; k++)
        if (hold(z, u - k, err) != 0) return false;
    return true;
}

// ---- gradients: buckets ------------------------------------------------------------------------

// Where slot j's part of rank q sits in a bucket laid out rank by rank (stages 1 to 3), or the
// slot's offset in a flat one (stage 0).
static size_t bucket_offset(const par_zero *z, const zbucket *b, size_t j, int q) {
    size_t at = 0;
    if (z->cfg.stage == 0) {
        for (size_t k = 0; k < j; k++) at += z->slots[b->slots[k]].numel;
        return at;
    }
    for (int r = 0; r < q; r++)
        for (size_t k = 0; k < b->n; k++) at += part_len(&z->slots[b->slots[k]], r);
    for (size_t k = 0; k < j; k++) at += part_len(&z->slots[b->slots[k]], q);
    return at;
}

static void copy_in(const par_zero *z, const zbucket *b, size_t j, const zslot *s) {
    float *dst = b->buf.data;
    const float *g = s->p->grad ? s->p->grad->data : NULL;
    if (!dst) return;
    if (z->cfg.stage == 0) {
        if (g)
            memcpy(dst + bucket_offset(z, b, j, 0), g, s->numel * sizeof(float));
        else // an unused parameter's zeros
            memset(dst + bucket_offset(z, b, j, 0), 0, s->numel * sizeof(float));
        return;
    }
    for (int q = 0; q < z->N; q++) {
        if (g)
            memcpy(dst + bucket_offset(z, b, j, q), g + part_lo(s, q), part_len(s, q) * sizeof(float));
        else
            memset(dst + bucket_offset(z, b, j, q), 0, part_len(s, q) * sizeof(float));
    }
}

static void scale_into(float *dst, const float *src, size_t n, float f) {
    if (!dst || !src) return;
    for (size_t i = 0; i < n; i++) dst[i] = src[i] * f;
}

// A parameter this rank's backward did not reach (find_unused) gets its .grad from the reduction,
// as DDP's reducer defines it from the bucket for a parameter another rank used.
static bool give_grad(par_zero *z, zslot *s, ag_err *err) {
    if (s->p->grad || !z->cfg.find_unused) return true;
    char label[256];
    snprintf(label, sizeof label, "%s:grad", ag_tensor_name(s->p));
    s->p->grad = ag_tensor_new(z->ctx, s->p->ndim, s->p->shape, MP_GRADIENT, label);
    if (!s->p->grad) ag_err_set(err, "%s", ag_ctx_error(z->ctx));
    return s->p->grad != NULL;
}

// Every gradient of the bucket final: the reduction, this rank's results into place, the bucket freed.
static int reduce_bucket(par_zero *z, zbucket *b, ag_err *err) {
    const float inv = 1.0f / (float)z->N;
    float *buf = b->buf.data;
    int rc;
    if (z->cfg.stage == 0) {
        rc = par_all_reduce_sum(z->comm, buf, b->elems, z->grad_bytes, err);
        for (size_t j = 0, at = 0; rc == 0 && j < b->n; at += z->slots[b->slots[j]].numel, j++) {
            zslot *s = &z->slots[b->slots[j]];
            if (!give_grad(z, s, err)) {
                rc = -1;
                break;
            }
            scale_into(s->p->grad ? s->p->grad->data : NULL, buf ? buf + at : NULL, s->numel, inv);
        }
    } else {
        if (real(z)) {
            for (int q = 0; q < z->N; q++) {
                z->counts[q] = 0;
                for (size_t j = 0; j < b->n; j++) z->counts[q] += part_len(&z->slots[b->slots[j]], q);
            }
            rc = par_reduce_scatter_sum(z->comm, buf, z->counts, z->grad_bytes, err);
        } else { // counted whole, as a real bucket's reduce-scatter moves it
            par_count(z->comm, PAR_REDUCE_SCATTER, (uint64_t)b->elems * z->grad_bytes, 0);
            rc = 0;
        }
        for (size_t j = 0, at = 0; rc == 0 && j < b->n; j++) {
            zslot *s = &z->slots[b->slots[j]];
            size_t len = s->hi - s->lo;
            if (z->cfg.stage == 1) {
                if (!give_grad(z, s, err)) {
                    rc = -1;
                    break;
                }
                scale_into(s->p->grad ? ag_f32(s->p->grad) + s->lo : NULL, buf ? buf + at : NULL, len, inv);
            } else if (len) {
                char label[256];
                snprintf(label, sizeof label, "%s:grad_shard", ag_tensor_name(s->p));
                ag_release(s->grad_shard);
                s->grad_shard = ag_tensor_new(z->ctx, 1, (int64_t[]){(int64_t)len}, MP_GRADIENT, label);
                if (!s->grad_shard) {
                    ag_err_set(err, "%s", ag_ctx_error(z->ctx));
                    rc = -1;
                    break;
                }
                scale_into(s->grad_shard->data, buf ? buf + at : NULL, len, inv);
            }
            at += len;
        }
    }
    mp_free(&b->buf);
    return rc;
}

static bool grad_ready(void *user, ag_tensor *leaf, ag_err *err) {
    par_zero *z = user;
    long i = find_slot(z, leaf);
    if (i < 0 || z->slots[i].ready) return true;
    zslot *s = &z->slots[i];
    zbucket *b = &z->buckets[s->bucket];
    if (!b->buf.bytes) {
        char label[64];
        snprintf(label, sizeof label, "zero.bucket.%d", s->bucket);
        mp_status st = mp_alloc(&b->buf, b->elems * z->grad_bytes, MP_TEMPORARY, label);
        if (st != MP_OK) {
            ag_err_set(err, "cannot allocate %s (%zu bytes, temporary): %s", label, b->elems * z->grad_bytes,
                       st == MP_ERR_BUDGET ? "over the memory budget" : "out of memory");
            return false;
        }
        b->pending = b->n;
    }
    size_t j = 0;
    while (b->slots[j] != (size_t)i) j++;
    copy_in(z, b, j, s);
    s->ready = true;
    if (z->cfg.stage >= 2) ag_zero_grad(s->p); // the bucket holds it now
    return --b->pending > 0 || reduce_bucket(z, b, err) == 0;
}

int par_zero_after_backward(par_zero *z, ag_err *err) {
    for (size_t i = 0; i < z->n; i++)
        if (!z->slots[i].ready && z->cfg.find_unused) {
            if (!grad_ready(z, z->slots[i].p, err)) return -1;
        } else if (!z->slots[i].ready) {
            ag_err_set(err,
                       "zero: %s got no gradient in backward (every parameter must take part, as DDP "
                       "without find_unused_parameters)",
                       ag_tensor_name(z->slots[i].p));
            return -1;
        }
    for (long u = (long)z->nunits - 1; u >= 0; u--) let_go(z, u);
    z->bw_unit = -1;
    for (size_t i = 0; i < z->n; i++) {
        zslot *s = &z->slots[i];
        s->ready = false;
        if (z->cfg.stage == 1 && s->hi > s->lo && s->p->grad) {
            make_view(&s->view_grad, s->p->grad, s->p->grad->data ? ag_f32(s->p->grad) + s->lo : NULL, s->hi - s->lo);
            s->view.grad = &s->view_grad;
        } else if (z->cfg.stage >= 2) {
            s->view.grad = s->grad_shard;
        }
    }
    return 0;
}

int par_zero_after_step(par_zero *z, ag_err *err) {
    if (z->cfg.stage != 1 && z->cfg.stage != 2) return 0;
    for (size_t i = 0; i < z->n; i++) {
        zslot *s = &z->slots[i];
        int rc = 0;
        if (real(z)) {
            set_parts(z, s);
            rc = par_all_gather(z->comm, s->p->data, z->counts, z->displs, z->weight_bytes, err);
        } else {
            par_count(z->comm, PAR_ALL_GATHER, (uint64_t)s->numel * z->weight_bytes, 0);
        }
        if (rc != 0) return -1;
    }
    return 0;
}

void par_zero_zero_grad(par_zero *z) {
    for (size_t i = 0; i < z->n; i++) {
        zslot *s = &z->slots[i];
        ag_zero_grad(s->p);
        s->view.grad = NULL;
        ag_release(s->grad_shard);
        s->grad_shard = NULL;
    }
}

// ---- stage 3: construction and saving ----------------------------------------------------------

int par_zero_materialize(par_zero *z, par_fill_fn fill, void *user, ag_err *err) {
    if (z->cfg.stage != 3) return 0;
    for (size_t u = 0; u < z->nunits; u++) {
        zunit *U = &z->units[u];
        int rc = 0;
        for (size_t j = 0; rc == 0 && j < U->n; j++) {
            zslot *s = &z->slots[U->slots[j]];
            if (!s->shard.bytes && s->hi > s->lo && !ag_param_alloc_storage(z->ctx, s->p)) rc = -1;
        }
        if (rc != 0) ag_err_set(err, "%s", ag_ctx_error(z->ctx));
        if (rc == 0 && fill) rc = fill(user, err);
        for (size_t j = 0; j < U->n; j++) {
            zslot *s = &z->slots[U->slots[j]];
            if (rc == 0 && ag_param_has_storage(s->p)) {
                char label[256];
                snprintf(label, sizeof label, "%s:shard", ag_tensor_name(s->p));
                mp_status st = mp_alloc(&s->shard, (s->hi - s->lo) * z->weight_bytes, MP_WEIGHT, label);
                if (st != MP_OK) {
                    ag_err_set(err, "cannot allocate %s (%zu bytes, weight): %s", label,
                               (s->hi - s->lo) * z->weight_bytes,
                               st == MP_ERR_BUDGET ? "over the memory budget" : "out of memory");
                    rc = -1;
                } else if (s->shard.data && s->p->data) {
                    memcpy(s->shard.data, ag_f32(s->p) + s->lo, (s->hi - s->lo) * sizeof(float));
                }
                s->view.data = s->shard.data;
            }
            ag_param_free_storage(s->p);
        }
        if (rc != 0) return -1;
    }
    return 0;
}

int par_zero_gather_all(par_zero *z, ag_err *err) {
    for (size_t u = 0; z->cfg.stage == 3 && u < z->nunits; u++)
        if (hold(z, (long)u, err) != 0) return -1;
    return 0;
}

void par_zero_release_all(par_zero *z) {
    for (size_t u = 0; u < z->nunits; u++) let_go(z, (long)u);
}
