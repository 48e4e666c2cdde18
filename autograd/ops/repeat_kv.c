// repeat_kv: transformers' repeat_kv before a kernel that takes no grouped heads: x[B, T, Hkv*D]
// to y[B, T, Hkv*rep*D], query head g*rep + r reading key-value head g (expand + reshape, a copy;
// the bytes of transformers' [B, Hq, T, D]). Saves nothing: dx[g] = the sum of dy over g's heads.
#include "ag_ops.h"

static void repeat_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_repeat_kv_state *st = &n->state.repeat_kv;
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || !d.needed || mp_is_meta()) return;
    const ag_buf dy = {(void *)dout, n->grad_dtype}, dx = ag_dst_buf(&d);
    const int64_t D = st->D;
    for (int64_t row = 0; row < st->rows; row++)
        for (int g = 0; g < st->hkv; g++)
            for (int r = 0; r < st->rep; r++)
                ag_vec_acc(ag_buf_at(dx, (row * st->hkv + g) * D), d.fresh && r == 0,
                           ag_buf_at(dy, ((row * st->hkv + g) * st->rep + r) * D), D);
}

static const ag_op repeat_op = {.name = "repeat_kv", .backward = repeat_backward};

ag_tensor *ag_repeat_kv(ag_ctx *ctx, const char *site, ag_tensor *x, int hkv, int rep, int D) {
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "repeat_kv", site, 1, ins, (const char *[]){"x"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (hkv < 1 || rep < 1 || D < 1 || x->ndim != 3 || x->shape[2] != (int64_t)hkv * D) {
        ag_fail(ctx, AG_ERR_SHAPE, "repeat_kv %s: x does not hold %d heads of %d", s.base, hkv, D);
        return NULL;
    }
    ag_tensor *y = ag_tensor_new_bits(ctx, 3, (int64_t[]){x->shape[0], x->shape[1], (int64_t)hkv * rep * D},
                                      MP_ACTIVATION, s.out, x->bits);
    if (!y) return NULL;
    const int64_t rows = x->shape[0] * x->shape[1];
    if (!mp_is_meta())
        for (int64_t row = 0; row < rows; row++)
            for (int g = 0; g < hkv; g++)
                for (int r = 0; r < rep; r++)
                    ag_vec_copy(ag_buf_at(ag_buf_of(y), ((row * hkv + g) * rep + r) * D),
                                ag_buf_at(ag_buf_of(x), (row * hkv + g) * D), D);
    if (!ag_any_needs_grad(ctx, 1, ins)) return y;
    ag_node *n = ag_record(ctx, &repeat_op, s.base, y, 1, ins);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    n->state.repeat_kv = (ag_repeat_kv_state){.rows = rows, .hkv = hkv, .rep = rep, .D = D};
    return y;
}
