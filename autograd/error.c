// The error type shared by autograd, model and optim.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "autograd.h"

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
