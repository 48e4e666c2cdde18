// head_slice: columns [off, off + width) of each head of x[.., nh*stride] as y[.., nh*width]
// (torch.split along the head dimension, made contiguous), optionally de-interleaved: y's column
// j reads the slice's column 2j (j < width/2) or 2(j - width/2) + 1, DeepSeek's
// view(.., d/2, 2).transpose(-1, -2).reshape(.., d) before its RoPE. Saves nothing: dx is dy
// scattered back into zeros.
#include <string.h>

#include "ag_ops.h"

// The slice's column that y's column j reads.
static int64_t src_col(const ag_head_slice_state *st, int64_t j) {
    if (!st->deinterleave) return j;
    const int64_t half = st->width / 2;
    return j < half ? 2 * j : 2 * (j - half) + 1;
}

static void head_slice_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_head_slice_state *st = &n->state.head_slice;
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || !d.needed || mp_is_meta()) return;
    const int64_t rows = st->rows * st->nh;
    if (d.fresh) memset(d.data, 0, (size_t)(rows * st->stride) * (size_t)(ag_type_traits_of(d.dtype)->bits / 8));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < st->width; j++) {
            const int64_t at = r * st->stride + st->off + src_col(st, j);
            ag_set(d.data, d.dtype, at, ag_get(d.data, d.dtype, at) + ag_get(dout, n->grad_dtype, r * st->width + j));
        }
}

static const ag_op head_slice_op = {.name = "head_slice", .backward = head_slice_backward};

ag_tensor *ag_head_slice(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int stride, int off, int width,
                         bool deinterleave) {
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "head_slice", site, 1, ins, (const char *[]){"x"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (nh < 1 || width < 1 || off < 0 || off + width > stride || (deinterleave && width % 2) ||
        x->shape[x->ndim - 1] != (int64_t)nh * stride) {
        char sh[64];
        ag_fail(ctx, AG_ERR_SHAPE, "head_slice %s: x %s does not hold %d heads of %d with columns %d to %d%s", s.base,
                ag_shape_str(x, sh), nh, stride, off, off + width, deinterleave ? " (an even count)" : "");
        return NULL;
    }
    int64_t shape[AG_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape[0] * (size_t)x->ndim);
    shape[x->ndim - 1] = (int64_t)nh * width;
    ag_tensor *y = ag_tensor_new_bits(ctx, x->ndim, shape, MP_ACTIVATION, s.out, x->bits);
    if (!y) return NULL;
    ag_head_slice_state st = {.rows = x->numel / ((int64_t)nh * stride),
                              .nh = nh,
                              .stride = stride,
                              .off = off,
                              .width = width,
                              .deinterleave = deinterleave};
    if (!mp_is_meta())
        for (int64_t r = 0; r < st.rows * nh; r++)
            for (int64_t j = 0; j < width; j++)
                ag_set(y->data, y->dtype, r * width + j, ag_get(x->data, x->dtype, r * stride + off + src_col(&st, j)));
    if (!ag_any_needs_grad(ctx, 1, ins)) return y;
    ag_node *n = ag_record(ctx, &head_slice_op, s.base, y, 1, ins);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    n->state.head_slice = st;
    return y;
}
