// cast: y = x.to(dtype) (ToCopyBackward): a copy at another element size. Saves nothing: the
// gradient comes back at x's own element size.
#include "ag_ops.h"

static void cast_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || !d.needed || mp_is_meta()) return;
    ag_vec_acc(ag_dst_buf(&d), d.fresh, (ag_buf){(void *)dy, n->grad_dtype}, n->numel);
}

static const ag_op cast_op = {.name = "cast", .backward = cast_backward};

ag_tensor *ag_cast(ag_ctx *ctx, const char *site, ag_tensor *x, int bits) {
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "cast", site, 1, ins, (const char *[]){"x"})) return NULL;
    if (x->bits == bits) return ag_retain(x); // .to() of its own dtype returns the tensor itself
    ag_site s;
    ag_site_parse(&s, site);
    ag_tensor *y = ag_tensor_new_bits(ctx, x->ndim, x->shape, MP_ACTIVATION, s.out, bits);
    if (!y) return NULL;
    if (!mp_is_meta()) ag_vec_copy(ag_buf_of(y), ag_buf_of(x), x->numel);
    if (!ag_any_needs_grad(ctx, 1, ins)) return y;
    if (!ag_record(ctx, &cast_op, s.base, y, 1, ins)) {
        ag_release(y);
        return NULL;
    }
    return y;
}
