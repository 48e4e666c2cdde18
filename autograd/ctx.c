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
    }
    return ctx;
}

void ag_ctx_free(ag_ctx *ctx) {
    if (!ctx) return;
    ag_tape_clear(ctx);
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
    if (ctx && (a == AG_ATTENTION_EAGER || a == AG_ATTENTION_FLASH)) ctx->attention = a;
}

ag_attention_kind ag_ctx_attention(const ag_ctx *ctx) { return ctx ? ctx->attention : AG_ATTENTION_EAGER; }
