// The context: grad mode, the frameworks' choices, the dtype; its tape (node.c) and its sticky
// error (error.c).
#include <stdlib.h>

#include "ag_internal.h"

ag_ctx *ag_ctx_new(void) {
    ag_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx) {
        ctx->grad_enabled = true;
        ctx->dtype = ag_precision_f32();
        ctx->fw = ag_framework_row_of(AG_FRAMEWORK_LEAN);
        ctx->dev = ag_device_row_of(AG_DEVICE_CPU);
    }
    return ctx;
}

void ag_ctx_free(ag_ctx *ctx) {
    if (!ctx) return;
    ag_tape_clear(ctx);
    ag_autocast_cache_clear(ctx);
    free(ctx->casts);
    free(ctx->tape);
    free(ctx->held);
    free(ctx);
}

bool ag_set_grad_enabled(ag_ctx *ctx, bool on) {
    bool was = ctx->grad_enabled;
    ctx->grad_enabled = on;
    return was;
}

bool ag_is_grad_enabled(const ag_ctx *ctx) { return ctx->grad_enabled; }

void ag_ctx_set_framework(ag_ctx *ctx, ag_framework f) {
    if (ctx && ag_framework_row_of(f)) ctx->fw = ag_framework_row_of(f);
}

const ag_framework_row *ag_ctx_framework_row(const ag_ctx *ctx) {
    return ctx ? ctx->fw : ag_framework_row_of(AG_FRAMEWORK_LEAN);
}

ag_framework ag_ctx_framework(const ag_ctx *ctx) {
    return ctx ? (ag_framework)(ctx->fw - ag_framework_row_of(AG_FRAMEWORK_LEAN)) : AG_FRAMEWORK_LEAN;
}

void ag_ctx_set_attention(ag_ctx *ctx, ag_attention_kind a) {
    if (ctx && (unsigned)a < AG_NATTENTION) ctx->attention = a;
}

ag_attention_kind ag_ctx_attention(const ag_ctx *ctx) { return ctx ? ctx->attention : AG_ATTENTION_EAGER; }

ag_tensor *ag_autocast_weight(ag_ctx *ctx, ag_tensor *w, const char *label) {
    // cached_cast's test: a float32 leaf that requires grad (a parameter; frozen ones are cast anew)
    const bool cacheable = w->bits == 32 && w->is_param && w->requires_grad;
    for (size_t i = 0; cacheable && i < ctx->ncasts; i++)
        if (ctx->casts[i].leaf == w) return ag_retain(ctx->casts[i].cast);
    ag_tensor *c = ag_tensor_new_bits(ctx, w->ndim, w->shape, MP_ACTIVATION, label, 16);
    if (!c) return NULL;
    if (!mp_is_meta()) ag_vec_copy(ag_buf_of(c), ag_buf_of(w), w->numel);
    if (!cacheable) return c;
    if (ctx->ncasts == ctx->capcasts) {
        size_t cap = ctx->capcasts ? 2 * ctx->capcasts : 64;
        struct ag_cast_entry *m = realloc(ctx->casts, cap * sizeof *m);
        if (!m) {
            ag_release(c);
            ag_fail(ctx, AG_ERR_NOMEM, "autocast: out of memory for the cast cache");
            return NULL;
        }
        ctx->casts = m, ctx->capcasts = cap;
    }
    ctx->casts[ctx->ncasts++] = (struct ag_cast_entry){ag_retain(w), ag_retain(c)};
    return c;
}

void ag_autocast_cache_clear(ag_ctx *ctx) {
    if (!ctx) return;
    for (size_t i = ctx->ncasts; i-- > 0;) { // newest first, as the map's entries go
        ag_release(ctx->casts[i].cast);
        ag_release(ctx->casts[i].leaf);
    }
    ctx->ncasts = 0;
}
