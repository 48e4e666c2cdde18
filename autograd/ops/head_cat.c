// head_cat: each head's columns of a[.., nh*da] then b's, y[.., nh*(da + db)] (torch.cat along the
// head dimension); b holds nh heads, or one that every head reads (DeepSeek's k_rot.expand).
// Saves nothing: dy split back, a broadcast b's gradient summed over the heads.
#include <string.h>

#include "ag_ops.h"

static void head_cat_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_head_cat_state *st = &n->state.head_cat;
    ag_grad_dst d[2];
    if (!ag_grad_get_all(ctx, n, d) || mp_is_meta()) return;
    const ag_buf dy = {(void *)dout, n->grad_dtype};
    const int64_t w = st->da + st->db, hb = st->b_heads;
    for (int64_t r = 0; r < st->rows; r++)
        for (int64_t h = 0; h < st->nh; h++) {
            const ag_buf row = ag_buf_at(dy, (r * st->nh + h) * w);
            if (d[0].needed)
                ag_vec_acc(ag_buf_at(ag_dst_buf(&d[0]), (r * st->nh + h) * st->da), d[0].fresh, row, st->da);
            if (d[1].needed)
                ag_vec_acc(ag_buf_at(ag_dst_buf(&d[1]), (r * hb + (hb == 1 ? 0 : h)) * st->db),
                           d[1].fresh && (hb > 1 || h == 0), ag_buf_at(row, st->da), st->db);
        }
}

static const ag_op head_cat_op = {.name = "head_cat", .backward = head_cat_backward};

ag_tensor *ag_head_cat(ag_ctx *ctx, const char *site, ag_tensor *a, ag_tensor *b, int nh, int da, int db) {
    ag_tensor *ins[] = {a, b};
    if (!ag_check_inputs(ctx, "head_cat", site, 2, ins, (const char *[]){"a", "b"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    const int64_t cb = b->shape[b->ndim - 1];
    const int64_t rows = nh >= 1 && da >= 1 ? a->numel / ((int64_t)nh * da) : 0;
    if (nh < 1 || da < 1 || db < 1 || a->shape[a->ndim - 1] != (int64_t)nh * da ||
        (cb != (int64_t)nh * db && cb != db) || b->numel != rows * cb) {
        char sa[64], sb[64];
        ag_fail(ctx, AG_ERR_SHAPE, "head_cat %s: a %s and b %s are not %d heads of %d and of %d (or one of %d)", s.base,
                ag_shape_str(a, sa), ag_shape_str(b, sb), nh, da, db, db);
        return NULL;
    }
    int64_t shape[AG_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape[0] * (size_t)a->ndim);
    shape[a->ndim - 1] = (int64_t)nh * (da + db);
    ag_tensor *y = ag_tensor_new_bits(ctx, a->ndim, shape, MP_ACTIVATION, s.out, ag_max_bits(a->bits, b->bits));
    if (!y) return NULL;
    const int hb = cb == db ? 1 : nh;
    if (!mp_is_meta())
        for (int64_t r = 0; r < rows; r++)
            for (int h = 0; h < nh; h++) {
                const ag_buf out = ag_buf_at(ag_buf_of(y), (r * nh + h) * (int64_t)(da + db));
                ag_vec_copy(out, ag_buf_at(ag_buf_of(a), (r * nh + h) * (int64_t)da), da);
                ag_vec_copy(ag_buf_at(out, da), ag_buf_at(ag_buf_of(b), (r * hb + (hb == 1 ? 0 : h)) * (int64_t)db),
                            db);
            }
    if (!ag_any_needs_grad(ctx, 2, ins)) return y;
    ag_node *n = ag_record(ctx, &head_cat_op, s.base, y, 2, ins);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    n->state.head_cat = (ag_head_cat_state){.rows = rows, .nh = nh, .da = da, .db = db, .b_heads = hb};
    return y;
}
