// add: y = a + b, elementwise, same shapes (residual connections).
#include "ag_ops.h"

// Saves nothing: both gradients are dy. b's is written first; a then takes over dy's buffer
// itself when its gradient does not exist yet (as PyTorch passes the same tensor on), which
// spares a copy and a buffer on every residual connection.
static void add_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    ag_grad_dst d;
    ag_buf g = {(void *)dy, n->grad_dtype};
    if (!ag_grad_get(ctx, n, 1, &d)) return;
    if (d.needed && !mp_is_meta()) ag_vec_acc(ag_dst_buf(&d), d.fresh, g, n->numel);
    if (ag_grad_pass(n, 0) || !ag_grad_get(ctx, n, 0, &d)) return;
    if (d.needed && !mp_is_meta()) ag_vec_acc(ag_dst_buf(&d), d.fresh, g, n->numel);
}

static const ag_op add_op = {.name = "add", .backward = add_backward};

ag_tensor *ag_add(ag_ctx *ctx, const char *site, ag_tensor *a, ag_tensor *b) {
    ag_tensor *ins[] = {a, b};
    if (!ag_check_inputs(ctx, "add", site, 2, ins, (const char *[]){"a", "b"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!ag_same_shape(ctx, "add", s.base, a, b)) return NULL;
    ag_tensor *y = ag_tensor_promoted(ctx, a, b, s.out);
    if (!y) return NULL;
    if (!mp_is_meta()) {
        ag_vec_add(ag_buf_of(y), ag_buf_of(a), ag_buf_of(b), a->numel);
    }
    if (ag_any_needs_grad(ctx, 2, ins) && !ag_record(ctx, &add_op, s.base, y, 2, ins)) {
        ag_release(y);
        return NULL;
    }
    return y;
}
