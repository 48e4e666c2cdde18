// scale_rows: y[n, C] = x[n, C] * s[n, 1], each row by its own factor (an expert's output by its
// routing weight). Backward: dx = dy s; ds = the row sums of dy x (PyTorch's MulBackward makes dy x
// whole, then sums it to [n, 1]).
#include <string.h>

#include "ag_ops.h"

// In PyTorch's order: s's whole product dy x first, then x's gradient, then the sum to [n, 1].
static void scale_rows_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_scale_rows_state *st = &n->state.scale_rows;
    const int64_t rows = st->n, C = st->C;
    ag_buf dy = {(void *)dout, n->grad_dtype};
    ag_grad_dst dx, ds;
    mp_block whole = {0};
    char l[AG_LABEL_MAX];
    ag_label(l, mp_site_name(n->site), "grad_scale_whole");
    const bool want_s = n->in[1].kind != AG_EDGE_NONE;
    if (want_s && AG_FW(ctx->fw, moe) == AG_MOE_HF_EAGER &&
        !ag_alloc_shaped(ctx, &whole, 2, (int64_t[]){rows, C}, ag_type_traits_of(n->grad_dtype)->bits, l))
        return;
    if (ag_grad_get(ctx, n, 0, &dx) && dx.needed && !mp_is_meta())
        ag_rows_scale(ag_dst_buf(&dx), dx.fresh, dy, ag_buf_of(st->s), rows, C);
    if (want_s && ag_grad_get(ctx, n, 1, &ds) && ds.needed && !mp_is_meta()) {
        for (int64_t i = 0; i < rows; i++) {
            const float sum = ag_row_dot(dy, ag_buf_of(st->x), i, C);
            ag_set(ds.data, ds.dtype, i, ds.fresh ? sum : ag_get(ds.data, ds.dtype, i) + sum);
        }
    }
    mp_free(&whole);
}

static const ag_op scale_rows_op = {
    .name = "scale_rows", .backward = scale_rows_backward, .nsaved = AG_NSAVED(scale_rows)};

ag_tensor *ag_scale_rows(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *s) {
    ag_tensor *ins[] = {x, s};
    if (!ag_check_inputs(ctx, "scale_rows", site, 2, ins, (const char *[]){"x", "s"})) return NULL;
    ag_site st;
    ag_site_parse(&st, site);
    const int64_t C = x->shape[x->ndim - 1], n = x->numel / C;
    if (s->numel != n) {
        char a[64], b[64];
        ag_fail(ctx, AG_ERR_SHAPE, "scale_rows %s: x %s and s %s (expected one factor a row)", st.base,
                ag_shape_str(x, a), ag_shape_str(s, b));
        return NULL;
    }
    ag_tensor *y = ag_tensor_promoted(ctx, x, s, st.out);
    if (!y) return NULL;
    if (!mp_is_meta()) ag_rows_scale(ag_buf_of(y), true, ag_buf_of(x), ag_buf_of(s), n, C);
    if (!ag_any_needs_grad(ctx, 2, ins)) return y;
    ag_node *node = ag_record(ctx, &scale_rows_op, st.base, y, 2, ins);
    if (!node) {
        ag_release(y);
        return NULL;
    }
    // MulBackward keeps each side the other's gradient needs; under LEAN the same two
    node->state.scale_rows = (ag_scale_rows_state){.x = ag_retain(ag_wants_grad(node, 1) ? x : NULL),
                                                   .s = ag_retain(ag_wants_grad(node, 0) ? s : NULL),
                                                   .n = n,
                                                   .C = C};
    return y;
}
