// scale: y = s x, a constant factor (LoRA's alpha / r). Saves nothing: dx = s dy.
#include "ag_ops.h"

// y (+)= s x over n elements of any dtype, a block at a time through float32, rounded once.
static void scale_into(ag_buf y, bool fresh, ag_buf x, float s, int64_t n) {
    float xb[AG_BLK], yb[AG_BLK];
    for (int64_t i = 0; i < n; i += AG_BLK) {
        int64_t m = n - i < AG_BLK ? n - i : AG_BLK;
        const float *xv = ag_rd(x, i, m, xb);
        float *yv = fresh ? ag_wr(y, i, yb) : ag_rw(y, i, m, yb);
        for (int64_t j = 0; j < m; j++) yv[j] = fresh ? s * xv[j] : yv[j] + s * xv[j];
        ag_wr_end(y, i, m, yv);
    }
}

static void scale_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || !d.needed || mp_is_meta()) return;
    scale_into(ag_dst_buf(&d), d.fresh, (ag_buf){(void *)dy, n->grad_dtype}, n->state.scale.s, n->numel);
}

static const ag_op scale_op = {.name = "scale", .backward = scale_backward};

ag_tensor *ag_scale(ag_ctx *ctx, const char *site, ag_tensor *x, float s) {
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "scale", site, 1, ins, (const char *[]){"x"})) return NULL;
    ag_site st;
    ag_site_parse(&st, site);
    ag_tensor *y = ag_tensor_like(ctx, x, MP_ACTIVATION, st.out);
    if (!y) return NULL;
    if (!mp_is_meta()) scale_into(ag_buf_of(y), true, ag_buf_of(x), s, x->numel);
    if (!ag_any_needs_grad(ctx, 1, ins)) return y;
    ag_node *n = ag_record(ctx, &scale_op, st.base, y, 1, ins);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    n->state.scale.s = s;
    return y;
}
