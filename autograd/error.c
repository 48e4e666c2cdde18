// The error type shared by autograd, model and optim.
#include <stdarg.h>
#include <stdio.h>

#include "autograd.h"

void ag_err_set(ag_err *err, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}
