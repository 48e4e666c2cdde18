// The error type shared by autograd, model and optim, and the context's sticky error.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ag_internal.h"

size_t ag_escape(char *dst, size_t len, const char *src) {
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    if (!len) return 0;
    for (const unsigned char *p = (const unsigned char *)src; *p; p++) {
        char e[5] = {(char)*p, 0};
        if (*p < 0x20 || *p == 0x7f) e[0] = '\\', e[1] = 'x', e[2] = hex[*p >> 4], e[3] = hex[*p & 15];
        size_t k = strlen(e);
        if (n + k >= len) break;
        memcpy(dst + n, e, k);
        n += k;
    }
    dst[n] = 0;
    return n;
}

void ag_err_set(ag_err *err, const char *fmt, ...) {
    if (!err) return;
    char raw[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    ag_escape(err->msg, sizeof err->msg, raw);
}

ag_status ag_ctx_status(const ag_ctx *ctx) { return ctx->status; }

const char *ag_ctx_error(const ag_ctx *ctx) { return ctx->status == AG_OK ? NULL : ctx->msg; }

void ag_ctx_clear_error(ag_ctx *ctx) {
    ctx->status = AG_OK;
    ctx->msg[0] = '\0';
}

bool ag_fail(ag_ctx *ctx, ag_status st, const char *fmt, ...) {
    if (ctx->status != AG_OK) return false;
    ctx->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->msg, sizeof ctx->msg, fmt, ap);
    va_end(ap);
    return false;
}

bool ag_ctx_fail(ag_ctx *ctx, const char *msg) {
    return ag_fail(ctx, mp_oom()->happened ? AG_ERR_BUDGET : AG_ERR_STATE, "%s", msg);
}

bool ag_check_inputs(ag_ctx *ctx, const char *op, const char *site, int n, ag_tensor *const *ins,
                     const char *const *names) {
    if (!ctx || ctx->status != AG_OK) return false;
    for (int i = 0; i < n; i++)
        if (!ins[i]) return ag_fail(ctx, AG_ERR_ARG, "%s %s: input %s is NULL", op, site ? site : "", names[i]);
    return true;
}
