// all_to_all: expert parallelism's exchange as one rank sees it (meta mode: a simulated rank). Its
// x[n, C] goes to the ranks of the tokens' experts, y[m, C] arrives from them; backward does the
// reverse: y's gradient goes back, x's arrives. Nothing is kept for backward.
#include "ag_ops.h"

static void all_to_all_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    (void)dy;
    ag_grad_dst d;
    ag_grad_get(ctx, n, 0, &d); // x's gradient, as the exchange delivers it
}

static const ag_op all_to_all_op = {.name = "all_to_all", .backward = all_to_all_backward};

ag_tensor *ag_all_to_all(ag_ctx *ctx, const char *site, ag_tensor *x, int64_t m) {
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "all_to_all", site, 1, ins, (const char *[]){"x"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!mp_is_meta() || m < 1) {
        ag_fail(ctx, AG_ERR_ARG, "all_to_all %s: %s", s.base,
                m < 1 ? "no rows arrive" : "an exchange between ranks is billed in meta mode only (a simulated rank)");
        return NULL;
    }
    const int64_t C = x->shape[x->ndim - 1];
    ag_tensor *y = AG_FW(ctx->fw, typed_tensors)
                       ? ag_tensor_new_bits(ctx, 2, (int64_t[]){m, C}, MP_ACTIVATION, s.out, x->bits)
                       : ag_tensor_new(ctx, 2, (int64_t[]){m, C}, MP_ACTIVATION, s.out);
    if (!y || !ag_any_needs_grad(ctx, 1, ins)) return y;
    if (!ag_record(ctx, &all_to_all_op, s.base, y, 1, ins)) {
        ag_release(y);
        return NULL;
    }
    return y;
}
