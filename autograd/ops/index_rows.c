// index_rows: y[n, C] = rows of src viewed as [R, C], as PyTorch's advanced indexing copies them
// (x[None, top_x], routing_weights[top_x, idx, None]). Backward: IndexBackward's new_zeros of
// src's size with the rows' gradients accumulated into it (index_put_), handed to src's gradient.
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

static void index_rows_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_index_rows_state *st = &n->state.index_rows;
    const int64_t R = st->R, C = st->C;
    ag_buf dy = {(void *)dout, n->grad_dtype};
    if (n->in[0].kind == AG_EDGE_NONE) return;
    ag_grad_dst d = {0};
    mp_block part = {0};
    ag_buf g;
    if (AG_FW(ctx->fw, moe) == AG_MOE_HF_EAGER) { // new_zeros [R, C], handed over
        const ag_node *to = n->in[0].kind == AG_EDGE_NODE ? n->in[0].node : NULL;
        char l[AG_LABEL_MAX];
        ag_label(l, mp_site_name(n->site), "grad_zeros");
        int bits = to ? ag_type_traits_of(to->grad_dtype)->bits : ctx->dtype.grad_bits;
        if (!to) {
            if (!ag_grad_get(ctx, n, 0, &d)) return;
            g = ag_dst_buf(&d);
        } else if (!ag_alloc_shaped(ctx, &part, 2, (int64_t[]){R, C}, bits, l)) {
            return;
        } else {
            g = (ag_buf){part.data, to->grad_dtype}, d.fresh = true;
        }
    } else {
        if (!ag_grad_get(ctx, n, 0, &d)) return;
        g = ag_dst_buf(&d);
    }
    if (!mp_is_meta()) {
        if (d.fresh) memset(g.p, 0, (size_t)(R * C) * (g.t == AG_F32 ? 4 : 2));
        float ob[C], ib[C];
        for (int64_t i = 0; i < st->n; i++) {
            float *o = ag_rw(g, st->rows[i] * C, C, ob);
            const float *v = ag_rd(dy, i * C, C, ib);
            for (int64_t j = 0; j < C; j++) o[j] += v[j];
            ag_wr_end(g, st->rows[i] * C, C, o);
        }
    }
    if (part.bytes) ag_grad_hand_over(ctx, n, 0, &part);
}

static void index_rows_release(ag_op_state *s) { free(s->index_rows.rows); }

static const ag_op index_rows_op = {.name = "index_rows",
                                    .backward = index_rows_backward,
                                    .nsaved = AG_NSAVED(index_rows),
                                    .release = index_rows_release};

ag_tensor *ag_index_rows(ag_ctx *ctx, const char *site, ag_tensor *src, int64_t C, const int64_t *rows, int64_t n,
                         ag_tensor *index) {
    ag_tensor *ins[] = {src};
    if (!ag_check_inputs(ctx, "index_rows", site, 1, ins, (const char *[]){"src"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (C < 1 || src->numel % C != 0 || n < 1 || (!mp_is_meta() && !rows)) {
        ag_fail(ctx, AG_ERR_SHAPE, "index_rows %s: %lld rows of %lld from %s's %lld elements", s.base, (long long)n,
                (long long)C, ag_tensor_name(src), (long long)src->numel);
        return NULL;
    }
    const int64_t R = src->numel / C;
    for (int64_t i = 0; rows && i < n; i++)
        if (rows[i] < 0 || rows[i] >= R) {
            ag_fail(ctx, AG_ERR_ARG, "index_rows %s: row %lld of %lld", s.base, (long long)rows[i], (long long)R);
            return NULL;
        }
    ag_tensor *y = AG_FW(ctx->fw, typed_tensors)
                       ? ag_tensor_new_bits(ctx, 2, (int64_t[]){n, C}, MP_ACTIVATION, s.out, src->bits)
                       : ag_tensor_new(ctx, 2, (int64_t[]){n, C}, MP_ACTIVATION, s.out);
    if (!y) return NULL;
    const size_t ys = y->dtype == AG_F32 ? 4 : 2, ss = src->dtype == AG_F32 ? 4 : 2;
    for (int64_t i = 0; !mp_is_meta() && i < n; i++)
        ag_copy_elems((char *)y->data + (size_t)(i * C) * ys, y->dtype, (char *)src->data + (size_t)(rows[i] * C) * ss,
                      src->dtype, C);
    if (!ag_any_needs_grad(ctx, 1, ins)) return y;
    ag_node *node = ag_record(ctx, &index_rows_op, s.base, y, 1, ins);
    int64_t *copy = node && rows ? malloc((size_t)n * sizeof *copy) : NULL;
    if (!node || (rows && !copy)) {
        if (node) ag_fail(ctx, AG_ERR_NOMEM, "index_rows %s: out of memory", s.base);
        ag_release(y);
        return NULL;
    }
    if (copy) memcpy(copy, rows, (size_t)n * sizeof *copy);
    node->state.index_rows = (ag_index_rows_state){.index = ag_retain(index), .R = R, .C = C, .n = n, .rows = copy};
    return y;
}
