// Parameters: a weight tensor that wants a gradient, and parameters whose storage comes and goes
// (ZeRO-3's sharded weights: made without storage, gathered before use, freed after).
#include <stdlib.h>

#include "ag_internal.h"

// A parameter of that shape and name without storage (ag_ctx_defer_params).
static ag_tensor *deferred_param(ag_ctx *ctx, int ndim, const int64_t *shape, const char *name, int own_bits) {
    if (ctx->status != AG_OK) return NULL;
    const char *label = name && *name ? name : "anon";
    if (ndim < 1 || ndim > AG_MAX_DIMS || !shape) {
        ag_fail(ctx, AG_ERR_SHAPE, "parameter %s: %d dimensions, expected 1 to %d", label, ndim, AG_MAX_DIMS);
        return NULL;
    }
    ag_tensor *t = ag_tensor_header(ctx, ndim, shape, "parameter", label);
    if (!t) return NULL;
    // What ag_tensor_new would make of it now (its dtype, and the bytes its storage takes), so
    // that its storage is billed as made, whatever the context's dtype is when it comes.
    t->bits = own_bits                                   ? own_bits
              : ctx->dtype.weight_bits < 16 && ndim == 1 ? ctx->dtype.act_bits
                                                         : ctx->dtype.weight_bits;
    t->dtype = ag_dtype_of_bits(t->bits, ctx->dtype.fp16);
    if (t->dtype == AG_Q4 && ctx->dtype.nf4) t->dtype = AG_NF4;
    if (t->dtype == AG_Q4 || t->dtype == AG_Q8) t->q_group = ctx->dtype.group;
    t->storage_bytes =
        own_bits ? (uint64_t)t->numel * (uint64_t)own_bits / 8 : ag_billed_bytes(ctx, ndim, shape, MP_WEIGHT, label);
    t->own_bits = own_bits != 0;
    t->site = mp_site_id(label);
    t->requires_grad = true;
    t->is_param = true;
    return t;
}

ag_tensor *ag_param_new(ag_ctx *ctx, int ndim, const int64_t *shape, const char *name) {
    ag_tensor *t = ctx && ctx->defer_params ? deferred_param(ctx, ndim, shape, name, 0)
                                            : ag_tensor_new(ctx, ndim, shape, MP_WEIGHT, name);
    if (t) {
        t->requires_grad = true;
        t->is_param = true;
    }
    return t;
}

ag_tensor *ag_param_new_bits(ag_ctx *ctx, int ndim, const int64_t *shape, const char *name, int bits) {
    if (bits != 32 && bits != 16) {
        if (ctx) ag_fail(ctx, AG_ERR_ARG, "parameter %s: %d bits, expected 32 or 16", name ? name : "anon", bits);
        return NULL;
    }
    ag_tensor *t = ctx && ctx->defer_params ? deferred_param(ctx, ndim, shape, name, bits)
                                            : ag_tensor_new_bits(ctx, ndim, shape, MP_WEIGHT, name, bits);
    if (t) {
        t->requires_grad = true;
        t->is_param = true;
        t->own_bits = true;
    }
    return t;
}

void ag_ctx_defer_params(ag_ctx *ctx, bool defer) {
    if (ctx) ctx->defer_params = defer;
}

bool ag_param_has_storage(const ag_tensor *param) { return param && param->block.bytes != 0; }

uint64_t ag_param_storage_bytes(const ag_tensor *param) {
    return param->block.bytes ? param->block.bytes : param->storage_bytes;
}

bool ag_param_alloc_storage(ag_ctx *ctx, ag_tensor *param) {
    if (!ctx || ctx->status != AG_OK || !param) return false;
    if (ag_param_has_storage(param)) return true;
    const char *name = ag_tensor_name(param);
    uint64_t bytes = ag_param_storage_bytes(param);
    char detail[AG_LABEL_MAX];
    ag_describe_like(detail, sizeof detail, param, param->bits, ctx->dtype.fp16);
    mp_status st = mp_alloc_described(&param->block, (size_t)bytes, MP_WEIGHT, name, detail);
    if (st != MP_OK)
        return ag_fail(ctx, st == MP_ERR_BUDGET ? AG_ERR_BUDGET : AG_ERR_NOMEM,
                       "cannot allocate %s (%llu bytes, weight): %s", name, (unsigned long long)bytes,
                       st == MP_ERR_BUDGET ? "over the memory budget" : "out of memory");
    param->data = param->block.data;
    return true;
}

void ag_param_free_storage(ag_tensor *param) {
    if (!param) return;
    if (param->block.bytes) param->storage_bytes = param->block.bytes; // for the next time
    mp_free(&param->block);
    param->data = NULL;
}
