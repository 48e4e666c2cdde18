// scale: y = s x, a constant factor (LoRA's alpha / r). Saves nothing: dx = s dy.
#include "ag_internal.h"

// Any dtype: each element read into float32, scaled there and rounded once.
static void scale_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || !d.needed || mp_is_meta()) return;
    const float s = n->state.scale.s;
    for (int64_t i = 0; i < n->numel; i++) {
        float v = s * ag_get(dy, n->grad_dtype, i);
        ag_set(d.data, d.dtype, i, d.fresh ? v : ag_get(d.data, d.dtype, i) + v);
    }
}

static const ag_op scale_op = {.name = "scale", .backward = scale_backward};

ag_tensor *ag_scale(ag_ctx *ctx, const char *site, ag_tensor *x, float s) {
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "scale", site, 1, ins, (const char *[]){"x"})) return NULL;
    ag_site st;
    ag_site_parse(&st, site);
    ag_tensor *y = ag_tensor_like(ctx, x, MP_ACTIVATION, st.out);
    if (!y) return NULL;
    if (!mp_is_meta())
        for (int64_t i = 0; i < x->numel; i++) ag_set(y->data, y->dtype, i, s * ag_get(x->data, x->dtype, i));
    if (!ag_any_needs_grad(ctx, 1, ins)) return y;
    ag_node *n = ag_record(ctx, &scale_op, st.base, y, 1, ins);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    n->state.scale.s = s;
    return y;
}
