// softcap: y = c tanh(x / c), Gemma 2's logit soft-capping (the final logits; the attention
// scores' is inside the attention ops). LEAN keeps y (dx = dy (1 - (y/c)²)), which the loss keeps
// anyway. Under the PyTorch frameworks, transformers' three ops: x / c (freed once tanh has it),
// tanh (its output kept by TanhBackward) and * c.
#include <math.h>

#include "ag_ops.h"

typedef struct {
    ag_buf out, in, t; // t: y, or tanh's output (PYTORCH); in: x (forward) or dy (backward)
    float c, mul;      // forward: out = c tanh(in / c), or mul tanh(in / c) (the tanh alone: 1)
    bool backward, fresh;
} softcap_args;

static void softcap_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const softcap_args *a = p;
    float ib[AG_BLK], tb[AG_BLK], ob[AG_BLK];
    for (int64_t i = lo; i < hi; i += AG_BLK) {
        int64_t n = hi - i < AG_BLK ? hi - i : AG_BLK;
        const float *in = ag_rd(a->in, i, n, ib), *t = a->backward ? ag_rd(a->t, i, n, tb) : NULL;
        float *o = a->backward && !a->fresh ? ag_rw(a->out, i, n, ob) : ag_wr(a->out, i, ob);
        for (int64_t j = 0; j < n; j++) {
            float v;
            if (a->backward) {
                float u = t[j] / a->c; // tanh's output, from y = c tanh (or tanh itself: c = 1)
                v = in[j] * a->mul * (1.0f - u * u);
            } else {
                v = a->mul * tanhf(in[j] / a->c);
            }
            o[j] = a->backward && !a->fresh ? o[j] + v : v;
        }
        ag_wr_end(a->out, i, n, o);
    }
}

static void softcap_run(softcap_args a, int64_t n) { ag_parallel_for(n, AG_PAR_GRAIN_EXP, softcap_part, &a); }

// dx = dy (1 - u²), u = y / c or tanh's output. PyTorch's chain (MulBackward, TanhBackward,
// DivBackward) holds two gradients of x's size at a time, as dy and dx here do.
static void softcap_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    const ag_softcap_state *st = &n->state.softcap;
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || !d.needed || mp_is_meta()) return;
    ag_buf g = {(void *)dy, n->grad_dtype};
    const ag_tensor *t = st->tanh ? st->tanh : st->y;
    softcap_run((softcap_args){ag_dst_buf(&d), g, ag_buf_of(t), st->tanh ? 1.0f : st->c, 1.0f, true, d.fresh},
                n->numel);
}

static const ag_op softcap_op = {.name = "softcap", .backward = softcap_backward, .nsaved = AG_NSAVED(softcap)};

ag_tensor *ag_softcap(ag_ctx *ctx, const char *site, ag_tensor *x, float c) {
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "softcap", site, 1, ins, (const char *[]){"x"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!(c > 0.0f)) {
        ag_fail(ctx, AG_ERR_ARG, "softcap %s: the cap (%g) must be positive", s.base, (double)c);
        return NULL;
    }
    const bool pt = AG_FW(ctx->fw, typed_tensors), meta = mp_is_meta(), rec = ag_any_needs_grad(ctx, 1, ins);
    ag_tensor *t = NULL;
    if (pt) { // x / c, then tanh of it (the quotient freed once tanh has it)
        char l[2][AG_LABEL_MAX];
        ag_label(l[0], s.base, "div");
        ag_label(l[1], s.base, "tanh");
        ag_tensor *q = ag_tensor_like(ctx, x, MP_ACTIVATION, l[0]);
        t = q ? ag_tensor_like(ctx, x, MP_ACTIVATION, l[1]) : NULL;
        if (t && !meta) softcap_run((softcap_args){ag_buf_of(t), ag_buf_of(x), {0}, c, 1.0f, false, true}, x->numel);
        ag_release(q);
        if (!t) return NULL;
    }
    ag_tensor *y = ag_tensor_like(ctx, x, MP_ACTIVATION, s.out);
    if (y && !meta) softcap_run((softcap_args){ag_buf_of(y), ag_buf_of(x), {0}, c, c, false, true}, x->numel);
    ag_node *n = y && rec ? ag_record(ctx, &softcap_op, s.base, y, 1, ins) : NULL;
    if (!y || (rec && !n)) {
        ag_release(t), ag_release(y);
        return NULL;
    }
    if (n)
        n->state.softcap = (ag_softcap_state){.y = pt ? NULL : ag_retain(y), .tanh = t, .c = c};
    else
        ag_release(t);
    return y;
}
