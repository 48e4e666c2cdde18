// Tensors: shape, a billed block of elements of one dtype, a reference count.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_internal.h"
#include "kernels/ag_kernels.h"
#include "kernels/ag_nf4.h"

static const char *status_text(mp_status st) {
    switch (st) {
    case MP_ERR_BUDGET: return "over the memory budget";
    case MP_ERR_NOMEM: return "out of memory";
    case MP_ERR_INVALID: return "invalid request";
    case MP_ERR_STATE: return "profiler not initialised";
    default: return "failed";
    }
}

ag_precision ag_precision_f32(void) { return (ag_precision){.act_bits = 32, .weight_bits = 32, .grad_bits = 32}; }

ag_precision ag_ctx_precision(const ag_ctx *ctx) { return ctx->dtype; }

bool ag_ctx_set_precision(ag_ctx *ctx, const ag_precision *d) {
    if (!ctx || ctx->status != AG_OK) return false;
    bool ok = d && (d->act_bits == 32 || d->act_bits == 16) && (d->grad_bits == 32 || d->grad_bits == 16) &&
              (d->weight_bits == 32 || d->weight_bits == 16 || d->weight_bits == 8 || d->weight_bits == 4) &&
              d->group >= 0 && d->scale_bytes >= 0 && (d->group == 0 || d->weight_bits < 16) &&
              (!d->nf4 || (d->weight_bits == 4 && d->group == 0));
    if (!ok)
        return ag_fail(ctx, AG_ERR_ARG,
                       "dtype: activations %d, weights %d, gradients %d bits, "
                       "group %lld (expected 32 or 16 bits, weights also 8 or 4, a group only "
                       "for weights under 16 bits)",
                       d ? d->act_bits : 0, d ? d->weight_bits : 0, d ? d->grad_bits : 0,
                       d ? (long long)d->group : 0LL);
    ctx->dtype = *d;
    return true;
}

static int category_bits(const ag_ctx *ctx, mp_category cat) {
    switch (cat) {
    case MP_WEIGHT: return ctx->dtype.weight_bits;
    case MP_GRADIENT: return ctx->dtype.grad_bits;
    case MP_ACTIVATION:
    case MP_CACHE: return ctx->dtype.act_bits;
    default: return 32;
    }
}

uint64_t ag_billed_bytes(const ag_ctx *ctx, int ndim, const int64_t *shape, mp_category cat, const char *label) {
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= (uint64_t)shape[i];
    (void)label;
    int bits = category_bits(ctx, cat);
    if (cat == MP_WEIGHT && bits < 16 && ndim == 1) bits = ctx->dtype.act_bits; // norm weights are not quantised
    if (cat != MP_WEIGHT || bits >= 16) return numel * (uint64_t)bits / 8;
    if (ctx->dtype.nf4) return ag_nf4_layout_of(numel).total;
    // Quantised matrix: packed elements, then one scale per group of each row.
    uint64_t cols = (uint64_t)shape[ndim - 1], rows = numel / cols, g = (uint64_t)ctx->dtype.group;
    uint64_t bytes = (numel * (uint64_t)bits + 7) / 8;
    if (g) bytes += rows * ((cols + g - 1) / g) * (uint64_t)ctx->dtype.scale_bytes;
    return bytes;
}

static bool alloc_described(ag_ctx *ctx, mp_block *b, size_t bytes, mp_category cat, const char *label,
                            const char *detail) {
    mp_status st = mp_alloc_described(b, bytes, cat, label, detail);
    if (st == MP_OK) return true;
    ag_status code = st == MP_ERR_BUDGET  ? AG_ERR_BUDGET
                     : st == MP_ERR_NOMEM ? AG_ERR_NOMEM
                     : st == MP_ERR_STATE ? AG_ERR_STATE
                                          : AG_ERR_ARG;
    return ag_fail(ctx, code, "cannot allocate %s (%zu bytes, %s): %s", label, bytes, mp_category_name(cat),
                   status_text(st));
}

static bool alloc_billed(ag_ctx *ctx, mp_block *b, size_t bytes, mp_category cat, const char *label) {
    return alloc_described(ctx, b, bytes, cat, label, NULL);
}

bool ag_alloc_exact(ag_ctx *ctx, mp_block *b, size_t bytes, mp_category cat, const char *label) {
    return !ctx || ctx->status != AG_OK ? false : alloc_billed(ctx, b, bytes, cat, label);
}

bool ag_alloc_block(ag_ctx *ctx, mp_block *b, size_t bytes, mp_category cat, const char *label) {
    uint64_t billed = (uint64_t)bytes / sizeof(float) * (uint64_t)category_bits(ctx, cat) / 8;
    return alloc_billed(ctx, b, bytes % sizeof(float) ? bytes : (size_t)billed, cat, label);
}

static bool shape_ok(ag_ctx *ctx, int ndim, const int64_t *shape, const char *label, int64_t *numel) {
    if (ndim < 1 || ndim > AG_MAX_DIMS || !shape)
        return ag_fail(ctx, AG_ERR_SHAPE, "tensor %s: %d dimensions, expected 1 to %d", label, ndim, AG_MAX_DIMS);
    // A real tensor past 2^40 elements (4 TB) is a mistake; meta mode bills up to 2^48 (a
    // petabyte) so that a plan can say what does not fit. Both keep the byte sums far from
    // overflow.
    const int bits = mp_is_meta() ? 48 : 40;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1)
            return ag_fail(ctx, AG_ERR_SHAPE, "tensor %s: dimension %d is %lld, expected at least 1", label, i,
                           (long long)shape[i]);
        if (shape[i] > ((int64_t)1 << bits) / n)
            return ag_fail(ctx, AG_ERR_SHAPE,
                           "tensor %s: more than 2^%d elements (dimension %d is %lld "
                           "after %lld elements in the others): too large for one tensor",
                           label, bits, i, (long long)shape[i], (long long)n);
        n *= shape[i];
    }
    *numel = n;
    return true;
}

static const char *dtype_name(int bits, bool fp16) {
    switch (bits) {
    case 32: return "float32";
    case 16: return fp16 ? "float16" : "bfloat16";
    case 8: return "int8";
    case 4: return "int4";
    default: return "?";
    }
}

// "[25, 576] float32": what the trace shows beside a tensor's bytes.
static void describe(char *out, size_t cap, int ndim, const int64_t *shape, int bits, bool fp16) {
    size_t n = ag_str_put(out, cap, 0, "[");
    for (int i = 0; i < ndim && n < cap; i++) {
        if (i) n = ag_str_put(out, cap, n, ", ");
        n = ag_str_put_i64(out, cap, n, (long long)shape[i]);
    }
    if (n < cap) n = ag_str_put(out, cap, ag_str_put(out, cap, n, "] "), dtype_name(bits, fp16));
}

void ag_describe_like(char *out, size_t cap, const ag_tensor *like, int bits, bool fp16) {
    describe(out, cap, like->ndim, like->shape, bits, fp16);
}

bool ag_alloc_shaped(ag_ctx *ctx, mp_block *b, int ndim, const int64_t *shape, int bits, const char *label) {
    if (!ctx || ctx->status != AG_OK) return false;
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= (uint64_t)shape[i];
    char detail[AG_LABEL_MAX];
    describe(detail, sizeof detail, ndim, shape, bits, ctx->dtype.fp16);
    return alloc_described(ctx, b, (size_t)(numel * (uint64_t)bits / 8), MP_ACTIVATION, label, detail);
}

ag_tensor *ag_tensor_header(ag_ctx *ctx, int ndim, const int64_t *shape, const char *what, const char *label) {
    ag_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        ag_fail(ctx, AG_ERR_NOMEM, "out of memory for %s %s", what, label);
        return NULL;
    }
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i], t->numel *= shape[i];
    t->refcount = 1;
    return t;
}

// fp32: billed at 4 bytes an element whatever the dtype (statistics autocast keeps in float32).
// bits 0: the category's size under the context's dtype (ag_billed_bytes).
static ag_tensor *tensor_new(ag_ctx *ctx, int ndim, const int64_t *shape, mp_category cat, const char *site, int bits) {
    if (!ctx || ctx->status != AG_OK) return NULL;
    const char *label = site && *site ? site : "anon";
    int64_t numel = 0;
    if (!shape_ok(ctx, ndim, shape, label, &numel)) return NULL;
    ag_tensor *t = ag_tensor_header(ctx, ndim, shape, "tensor", label);
    if (!t) return NULL;
    uint64_t bytes = bits ? (uint64_t)numel * (uint64_t)bits / 8 : ag_billed_bytes(ctx, ndim, shape, cat, label);
    char detail[AG_LABEL_MAX];
    int ebits = bits ? bits : category_bits(ctx, cat);
    if (!bits && cat == MP_WEIGHT && ebits < 16 && ndim == 1) ebits = ctx->dtype.act_bits; // as billed
    describe(detail, sizeof detail, ndim, shape, ebits, ctx->dtype.fp16);
    if (!alloc_described(ctx, &t->block, (size_t)bytes, cat, label, detail)) {
        free(t);
        return NULL;
    }
    t->data = t->block.data;
    t->bits = ebits;
    t->dtype = ag_dtype_of_bits(t->bits, ctx->dtype.fp16);
    if (t->dtype == AG_Q4 && ctx->dtype.nf4) t->dtype = AG_NF4; // billed at its layout above
    if (t->dtype == AG_Q4 || t->dtype == AG_Q8) t->q_group = ctx->dtype.group;
    t->site = t->block.site;
    return t;
}

ag_tensor *ag_tensor_new(ag_ctx *ctx, int ndim, const int64_t *shape, mp_category cat, const char *site) {
    return tensor_new(ctx, ndim, shape, cat, site, 0);
}

ag_tensor *ag_tensor_new_bits(ag_ctx *ctx, int ndim, const int64_t *shape, mp_category cat, const char *site,
                              int bits) {
    return tensor_new(ctx, ndim, shape, cat, site, bits);
}

ag_tensor *ag_tensor_new_f32(ag_ctx *ctx, int ndim, const int64_t *shape, mp_category cat, const char *site) {
    return tensor_new(ctx, ndim, shape, cat, site, 32);
}

ag_tensor *ag_tensor_promoted(ag_ctx *ctx, const ag_tensor *a, const ag_tensor *b, const char *label) {
    if (!AG_FW(ctx->fw, typed_tensors)) return ag_tensor_like(ctx, a, MP_ACTIVATION, label);
    return tensor_new(ctx, a->ndim, a->shape, MP_ACTIVATION, label, ag_max_bits(a->bits, b->bits));
}

ag_tensor *ag_tensor_like(ag_ctx *ctx, const ag_tensor *t, mp_category cat, const char *label) {
    if (AG_FW(ctx->fw, typed_tensors) && cat == MP_ACTIVATION && t->block.category == MP_ACTIVATION) // keeps its dtype
        return tensor_new(ctx, t->ndim, t->shape, cat, label, t->bits);
    return ag_tensor_new(ctx, t->ndim, t->shape, cat, label);
}

ag_tensor *ag_retain(ag_tensor *t) {
    if (t) t->refcount++;
    return t;
}

void ag_release(ag_tensor *t) {
    if (!t || --t->refcount > 0) return;
    if (t->node) t->node->out = NULL;
    ag_release(t->grad);
    mp_free(&t->grad_wait);
    mp_free(&t->grad_new);
    mp_free(&t->block);
    ag_release(t->base);
    free(t);
}

void ag_zero_grad(ag_tensor *param) {
    if (!param) return;
    ag_release(param->grad);
    param->grad = NULL;
}

const char *ag_tensor_name(const ag_tensor *t) { return mp_site_name(t->site); }

void ag_prefetch(int n, const ag_tensor *const *t) {
    const void *p[AG_PREFETCH_MAX];
    size_t bytes[AG_PREFETCH_MAX];
    int k = 0;
    for (int i = 0; i < n && k < AG_PREFETCH_MAX; i++)
        if (t[i] && t[i]->data) p[k] = t[i]->data, bytes[k++] = t[i]->block.bytes;
    ag_pool_prefetch(k, p, bytes);
}

bool ag_same_shape(ag_ctx *ctx, const char *op, const char *site, const ag_tensor *a, const ag_tensor *b) {
    bool same = a->ndim == b->ndim;
    for (int i = 0; same && i < a->ndim; i++) same = a->shape[i] == b->shape[i];
    char sa[64], sb[64];
    if (!same)
        ag_fail(ctx, AG_ERR_SHAPE, "%s %s: %s %s and %s %s differ in shape", op, site, ag_tensor_name(a),
                ag_shape_str(a, sa), ag_tensor_name(b), ag_shape_str(b, sb));
    return same;
}

const char *ag_shape_str(const ag_tensor *t, char buf[64]) {
    int len = snprintf(buf, 64, "[");
    for (int i = 0; i < t->ndim && len < 64; i++)
        len += snprintf(buf + len, (size_t)(64 - len), i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (len < 64) snprintf(buf + len, (size_t)(64 - len), "]");
    return buf;
}
