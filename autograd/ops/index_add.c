// index_add: acc[rows[i]] += src[i] in place, as PyTorch's index_add_ (the experts' outputs summed
// into zeros, one expert after another). The result takes over acc's storage: no new block.
// Backward: acc's gradient is dy itself (passed on); src's is dy's rows (index_select).
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

static void index_add_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_index_add_state *st = &n->state.index_add;
    const int64_t C = st->C;
    ag_buf dy = {(void *)dout, n->grad_dtype};
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 1, &d)) return;
    if (d.needed && !mp_is_meta()) {
        float ob[C], ib[C];
        ag_buf g = ag_dst_buf(&d);
        for (int64_t i = 0; i < st->n; i++) {
            const float *v = ag_rd(dy, st->rows[i] * C, C, ib);
            float *o = d.fresh ? ag_wr(g, i * C, ob) : ag_rw(g, i * C, C, ob);
            for (int64_t j = 0; j < C; j++) o[j] = d.fresh ? v[j] : o[j] + v[j];
            ag_wr_end(g, i * C, C, o);
        }
    }
    if (ag_grad_pass(n, 0) || !ag_grad_get(ctx, n, 0, &d)) return;
    if (d.needed && !mp_is_meta()) ag_vec_acc(ag_dst_buf(&d), d.fresh, dy, n->numel);
}

static void index_add_release(ag_op_state *s) { free(s->index_add.rows); }

static const ag_op index_add_op = {
    .name = "index_add", .backward = index_add_backward, .nsaved = AG_NSAVED(index_add), .release = index_add_release};

// A tensor that takes over acc's storage (acc is left without one).
static ag_tensor *take(ag_ctx *ctx, ag_tensor *acc) {
    ag_tensor *y = calloc(1, sizeof *y);
    if (!y) {
        ag_fail(ctx, AG_ERR_NOMEM, "index_add: out of memory");
        return NULL;
    }
    y->ndim = acc->ndim;
    memcpy(y->shape, acc->shape, sizeof y->shape);
    y->numel = acc->numel;
    y->block = acc->block, y->data = acc->data;
    y->refcount = 1;
    y->bits = acc->bits, y->dtype = acc->dtype, y->site = acc->site;
    acc->block = (mp_block){0}, acc->data = NULL;
    return y;
}

ag_tensor *ag_index_add(ag_ctx *ctx, const char *site, ag_tensor *acc, const int64_t *rows, int64_t n, ag_tensor *src,
                        ag_tensor *index) {
    ag_tensor *ins[] = {acc, src};
    if (!ag_check_inputs(ctx, "index_add", site, 2, ins, (const char *[]){"acc", "src"})) {
        ag_release(acc);
        return NULL;
    }
    ag_site s;
    ag_site_parse(&s, site);
    const int64_t C = acc->shape[acc->ndim - 1], R = acc->numel / C;
    bool ok = src->numel == n * C && n >= 1 && (mp_is_meta() || rows);
    for (int64_t i = 0; ok && rows && i < n; i++) ok = rows[i] >= 0 && rows[i] < R;
    if (!ok) {
        ag_fail(ctx, AG_ERR_SHAPE, "index_add %s: %lld rows of %s into %lld rows of %lld", s.base, (long long)n,
                ag_tensor_name(src), (long long)R, (long long)C);
        ag_release(acc);
        return NULL;
    }
    if (!mp_is_meta()) {
        float ob[C], ib[C];
        for (int64_t i = 0; i < n; i++) {
            float *o = ag_rw(ag_buf_of(acc), rows[i] * C, C, ob);
            const float *v = ag_rd(ag_buf_of(src), i * C, C, ib);
            for (int64_t j = 0; j < C; j++) o[j] += v[j];
            ag_wr_end(ag_buf_of(acc), rows[i] * C, C, o);
        }
    }
    ag_tensor *y = take(ctx, acc);
    ag_node *node = y && ag_any_needs_grad(ctx, 2, ins) ? ag_record(ctx, &index_add_op, s.base, y, 2, ins) : NULL;
    int64_t *copy = node && rows ? malloc((size_t)n * sizeof *copy) : NULL;
    ag_release(acc);
    if (!y || (node && rows && !copy) || (!node && ctx->status != AG_OK)) {
        free(copy);
        ag_release(y);
        return NULL;
    }
    if (copy) memcpy(copy, rows, (size_t)n * sizeof *copy);
    if (node) // IndexAddBackward keeps the source (for its shape) and the index
        node->state.index_add =
            (ag_index_add_state){.src = ag_retain(AG_FW(ctx->fw, moe) == AG_MOE_HF_EAGER ? src : NULL),
                                 .index = ag_retain(index),
                                 .R = R,
                                 .C = C,
                                 .n = n,
                                 .rows = copy};
    return y;
}
