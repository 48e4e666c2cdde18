// mul: y = a * b, elementwise, same shapes.
#include "ag_ops.h"

// da = dy * b needs b; db = dy * a needs a: each is kept only when the other side wants its
// gradient.
static void mul_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    ag_buf dy = {(void *)dout, n->grad_dtype};
    const ag_mul_state *st = &n->state.mul;
    ag_grad_dst d[2];
    if (!ag_grad_get_all(ctx, n, d) || mp_is_meta()) return;
    if (d[0].needed) ag_vec_mul_into(ag_dst_buf(&d[0]), d[0].fresh, dy, ag_buf_of(st->b), n->numel);
    if (d[1].needed) ag_vec_mul_into(ag_dst_buf(&d[1]), d[1].fresh, dy, ag_buf_of(st->a), n->numel);
}

static const ag_op mul_op = {.name = "mul", .backward = mul_backward, .nsaved = AG_NSAVED(mul)};

ag_tensor *ag_mul(ag_ctx *ctx, const char *site, ag_tensor *a, ag_tensor *b) {
    ag_tensor *ins[] = {a, b};
    if (!ag_check_inputs(ctx, "mul", site, 2, ins, (const char *[]){"a", "b"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!ag_same_shape(ctx, "mul", s.base, a, b)) return NULL;
    ag_tensor *y = ag_tensor_promoted(ctx, a, b, s.out);
    if (!y) return NULL;
    if (!mp_is_meta()) ag_vec_mul_into(ag_buf_of(y), true, ag_buf_of(a), ag_buf_of(b), a->numel);
    if (!ag_any_needs_grad(ctx, 2, ins)) return y;
    ag_node *n = ag_record(ctx, &mul_op, s.base, y, 2, ins);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    n->state.mul.a = ag_retain(ag_wants_grad(n, 1) ? a : NULL);
    n->state.mul.b = ag_retain(ag_wants_grad(n, 0) ? b : NULL);
    return y;
}
