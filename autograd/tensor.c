// Tensors: shape, a billed block of float32, a reference count.
#include <stdlib.h>

#include "ag_internal.h"

static const char *status_text(mp_status st)
{
    switch (st) {
    case MP_ERR_BUDGET: return "over the memory budget";
    case MP_ERR_NOMEM: return "out of memory";
    case MP_ERR_INVALID: return "invalid request";
    case MP_ERR_STATE: return "profiler not initialised";
    default: return "failed";
    }
}

bool ag_alloc_block(ag_ctx *ctx, mp_block *b, size_t bytes, mp_category cat, const char *label)
{
    mp_status st = mp_alloc(b, bytes, cat, label);
    if (st == MP_OK)
        return true;
    ag_status code = st == MP_ERR_BUDGET ? AG_ERR_BUDGET
                     : st == MP_ERR_NOMEM ? AG_ERR_NOMEM
                     : st == MP_ERR_STATE ? AG_ERR_STATE
                                          : AG_ERR_ARG;
    return ag_fail(ctx, code, "cannot allocate %s (%zu bytes, %s): %s", label, bytes,
                   mp_category_name(cat), status_text(st));
}

static bool shape_ok(ag_ctx *ctx, int ndim, const int64_t *shape, const char *label,
                     int64_t *numel)
{
    if (ndim < 1 || ndim > AG_MAX_DIMS || !shape)
        return ag_fail(ctx, AG_ERR_SHAPE, "tensor %s: %d dimensions, expected 1 to %d", label,
                       ndim, AG_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        // The bound keeps numel * 4 far from overflow.
        if (shape[i] < 1 || shape[i] > ((int64_t)1 << 40) / n)
            return ag_fail(ctx, AG_ERR_SHAPE, "tensor %s: dimension %d is %lld, expected 1 to %lld",
                           label, i, (long long)shape[i], (long long)(((int64_t)1 << 40) / n));
        n *= shape[i];
    }
    *numel = n;
    return true;
}

ag_tensor *ag_tensor_new(ag_ctx *ctx, int ndim, const int64_t *shape, mp_category cat,
                         const char *site)
{
    if (!ctx || ctx->status != AG_OK)
        return NULL;
    const char *label = site && *site ? site : "anon";
    int64_t numel = 0;
    if (!shape_ok(ctx, ndim, shape, label, &numel))
        return NULL;
    ag_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        ag_fail(ctx, AG_ERR_NOMEM, "out of memory for tensor %s", label);
        return NULL;
    }
    if (!ag_alloc_block(ctx, &t->block, (size_t)numel * sizeof(float), cat, label)) {
        free(t);
        return NULL;
    }
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->numel = numel;
    t->data = t->block.data;
    t->refcount = 1;
    t->site = t->block.site;
    return t;
}

ag_tensor *ag_tensor_like(ag_ctx *ctx, const ag_tensor *t, mp_category cat, const char *label)
{
    return ag_tensor_new(ctx, t->ndim, t->shape, cat, label);
}

ag_tensor *ag_param_new(ag_ctx *ctx, int ndim, const int64_t *shape, const char *name)
{
    ag_tensor *t = ag_tensor_new(ctx, ndim, shape, MP_WEIGHT, name);
    if (t) {
        t->requires_grad = true;
        t->is_param = true;
    }
    return t;
}

ag_tensor *ag_retain(ag_tensor *t)
{
    if (t)
        t->refcount++;
    return t;
}

void ag_release(ag_tensor *t)
{
    if (!t || --t->refcount > 0)
        return;
    if (t->node)
        t->node->out = NULL;
    ag_release(t->grad);
    mp_free(&t->block);
    free(t);
}

void ag_zero_grad(ag_tensor *param)
{
    if (!param)
        return;
    ag_release(param->grad);
    param->grad = NULL;
}

const char *ag_tensor_name(const ag_tensor *t) { return mp_site_name(t->site); }
