// Non-finite values (NaN, infinities) in a real run: an error naming where they are, instead of a
// loss of "nan" reported as a result. The checks on every step look at what costs next to
// nothing beside it (the logits, the loss, the gradients that sum a whole step's backward); once
// one fails, the search for where the first non-finite value appeared walks the tape.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

int64_t llama_first_nonfinite(const float *x, int64_t n) {
    // Blocks of exponent maxima (a loop the compiler vectorises), the element found only in a
    // block whose maximum is all ones: NaN or an infinity.
    enum { BLOCK = 4096 };
    for (int64_t lo = 0; lo < n; lo += BLOCK) {
        int64_t hi = n - lo < BLOCK ? n : lo + BLOCK;
        uint32_t most = 0;
        for (int64_t i = lo; i < hi; i++) {
            uint32_t b;
            memcpy(&b, x + i, sizeof b);
            b &= 0x7F800000u;
            most = b > most ? b : most;
        }
        if (most == 0x7F800000u)
            for (int64_t i = lo; i < hi; i++)
                if (!isfinite(x[i])) return i;
    }
    return -1;
}

// The first non-finite element of t from element `from` of row r0 to row r1 (exclusive), any
// dtype (through float32 rows); -1 when none, or when t has no data.
static int64_t rows_nonfinite(const ag_tensor *t, int64_t r0, int64_t r1, float *value) {
    if (!t || !t->data || t->numel == 0) return -1;
    int64_t cols = t->shape[t->ndim - 1];
    if (t->dtype == AG_F32) {
        int64_t at = llama_first_nonfinite((const float *)t->data + r0 * cols, (r1 - r0) * cols);
        if (at >= 0) *value = ((const float *)t->data)[r0 * cols + at];
        return at < 0 ? -1 : r0 * cols + at;
    }
    float *row = malloc((size_t)cols * sizeof *row);
    int64_t found = -1;
    for (int64_t r = r0; row && r < r1 && found < 0; r++) {
        ag_tensor_row_f32(t, r, row);
        int64_t at = llama_first_nonfinite(row, cols);
        if (at >= 0) *value = row[at], found = r * cols + at;
    }
    free(row);
    return found;
}

int64_t llama_tensor_nonfinite(const ag_tensor *t, float *value) {
    return t && t->ndim > 0 ? rows_nonfinite(t, 0, t->numel / t->shape[t->ndim - 1], value) : -1;
}

// Where the forward's first non-finite value is: the first tensor the tape saved, in the order
// the ops ran, that holds one, and the first weight that does (the adapters included). Appended
// to buf as "; ...".
static void origin(const ag_ctx *ctx, const llama_model *m, char *buf, size_t len) {
    size_t n = ag_tape_size(ctx), used = strlen(buf);
    float v;
    bool found = false;
    for (size_t i = 0; i < n && !found; i++) {
        ag_node_info info;
        if (!ag_tape_node(ctx, i, &info)) continue;
        for (int j = 0; j < info.nsaved && !found; j++) {
            const ag_tensor *s = info.saved[j];
            if (s->is_param || llama_tensor_nonfinite(s, &v) < 0) continue;
            used += (size_t)snprintf(buf + used, len - used, "; the first op that saved one is %s at %s (%s holds %g)",
                                     info.op, info.site, ag_tensor_name(s), v);
            found = true;
        }
    }
    for (size_t k = 0; k < 2 && used < len; k++) {
        ag_tensor *const *list = k ? m->adapters : m->params;
        for (size_t i = 0; i < (k ? m->nadapters : m->nparams); i++)
            if (llama_tensor_nonfinite(list[i], &v) >= 0) {
                snprintf(buf + used, len - used, "; the weight %s holds %g", ag_tensor_name(list[i]), v);
                return;
            }
    }
}

int llama_check_logits(const ag_ctx *ctx, const llama_model *m, const ag_tensor *logits, const ag_tensor *loss,
                       ag_err *err) {
    float v = 0;
    int64_t at = llama_tensor_nonfinite(logits, &v);
    char msg[sizeof err->msg];
    if (at >= 0) {
        int64_t V = logits->shape[logits->ndim - 1];
        snprintf(msg, sizeof msg, "non-finite logits: %g at position %lld, id %lld (lm_head)", v, (long long)(at / V),
                 (long long)(at % V));
    } else if (llama_tensor_nonfinite(loss, &v) >= 0) {
        snprintf(msg, sizeof msg, "non-finite loss: %g (cross_entropy)", v);
    } else {
        return 0;
    }
    origin(ctx, m, msg, sizeof msg);
    ag_err_set(err, "%s", msg);
    return -1;
}

// A gradient holds a non-finite value (rows [r0, r1) of it).
static int grad_fault(const ag_tensor *p, int64_t r0, int64_t r1, ag_err *err) {
    float v;
    int64_t at = rows_nonfinite(p->grad, r0, r1, &v);
    if (at < 0) return 0;
    ag_err_set(err, "non-finite gradient: the gradient of %s holds %g at element %lld", ag_tensor_name(p), v,
               (long long)at);
    return -1;
}

int llama_check_grads(const llama_model *m, const int32_t *ids, size_t n, ag_err *err) {
    // Backward order: the last parameters' gradients are made first, nearest the fault.
    for (size_t k = m->ntrainable; k-- > 0;) {
        const ag_tensor *p = m->trainable[k];
        if (!p->grad || !p->grad->data || p->grad->numel != p->numel) continue; // none, or a shard of it
        if (p == m->embed) {
            for (size_t i = 0; i < n; i++)
                if (grad_fault(p, ids[i], ids[i] + 1, err) != 0) return -1;
        } else if (p->ndim == 1 || m->adapters) {
            if (grad_fault(p, 0, p->numel / p->shape[p->ndim - 1], err) != 0) return -1;
        }
    }
    return 0;
}
