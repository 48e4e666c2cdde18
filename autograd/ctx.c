// The context: grad mode, the tape, the sticky error.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "ag_internal.h"

ag_ctx *ag_ctx_new(void) {
    ag_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx) {
        ctx->grad_enabled = true;
        ctx->dtype = ag_precision_f32();
    }
    return ctx;
}

void ag_ctx_free(ag_ctx *ctx) {
    if (!ctx) return;
    ag_tape_clear(ctx);
    free(ctx->tape);
    free(ctx);
}

bool ag_set_grad_enabled(ag_ctx *ctx, bool on) {
    bool was = ctx->grad_enabled;
    ctx->grad_enabled = on;
    return was;
}

bool ag_is_grad_enabled(const ag_ctx *ctx) { return ctx->grad_enabled; }

void ag_ctx_set_framework(ag_ctx *ctx, ag_framework f) {
    if (ctx && (unsigned)f <= AG_FRAMEWORK_PYTORCH_113) ctx->framework = f;
}

ag_framework ag_ctx_framework(const ag_ctx *ctx) { return ctx ? ctx->framework : AG_FRAMEWORK_LEAN; }

void ag_ctx_set_attention(ag_ctx *ctx, ag_attention_kind a) {
    if (ctx && (a == AG_ATTENTION_EAGER || a == AG_ATTENTION_FLASH)) ctx->attention = a;
}

ag_attention_kind ag_ctx_attention(const ag_ctx *ctx) { return ctx ? ctx->attention : AG_ATTENTION_EAGER; }

ag_status ag_ctx_status(const ag_ctx *ctx) { return ctx->status; }

const char *ag_ctx_error(const ag_ctx *ctx) { return ctx->status == AG_OK ? NULL : ctx->msg; }

void ag_ctx_clear_error(ag_ctx *ctx) {
    ctx->status = AG_OK;
    ctx->msg[0] = '\0';
}

// Keeps the first error: later ones are usually its consequences.
bool ag_fail(ag_ctx *ctx, ag_status st, const char *fmt, ...) {
    if (ctx->status != AG_OK) return false;
    ctx->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->msg, sizeof ctx->msg, fmt, ap);
    va_end(ap);
    return false;
}

// False (quietly) after an earlier error, or with the error set when an input is NULL.
bool ag_check_inputs(ag_ctx *ctx, const char *op, const char *site, int n, ag_tensor *const *ins,
                     const char *const *names) {
    if (!ctx || ctx->status != AG_OK) return false;
    for (int i = 0; i < n; i++)
        if (!ins[i]) return ag_fail(ctx, AG_ERR_ARG, "%s %s: input %s is NULL", op, site ? site : "", names[i]);
    return true;
}

bool ag_tape_push(ag_ctx *ctx, ag_node *n) {
    if (ctx->ntape == ctx->cap) {
        size_t cap = ctx->cap ? 2 * ctx->cap : 256;
        ag_node **tape = realloc(ctx->tape, cap * sizeof *tape);
        if (!tape) return ag_fail(ctx, AG_ERR_NOMEM, "out of memory growing the tape to %zu nodes", cap);
        ctx->tape = tape;
        ctx->cap = cap;
    }
    n->index = ctx->ntape;
    ctx->tape[ctx->ntape++] = n;
    return true;
}

void ag_tape_clear_to(ag_ctx *ctx, size_t floor) {
    // Newest first, as backward would: a node's saved tensors may be older nodes' outputs.
    while (ctx->ntape > floor) ag_node_free(ctx->tape[--ctx->ntape]);
}

void ag_tape_clear(ag_ctx *ctx) { ag_tape_clear_to(ctx, 0); }

size_t ag_tape_size(const ag_ctx *ctx) { return ctx->ntape; }

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

void ag_ctx_fail(ag_ctx *ctx, const char *msg) {
    if (ctx && ctx->status == AG_OK) ag_fail(ctx, AG_ERR_ARG, "%s", msg ? msg : "failed");
}
