// linear_parts: a fused projection, y = x[M, in] · w[out, in]ᵀ with w's rows in parts (Phi-3's
// qkv_proj: q, k, v; gate_up_proj: gate, up), y laid out part after part so that each part is a
// contiguous [M, rows] its consumers view (ag_part). One product in the model's terms; one
// block for y, as nn.Linear's output.
#include "ag_ops.h"

// w's rows [r0, r0 + n) as a buffer (a float dtype: rows are contiguous).
static ag_buf rows_of(const ag_tensor *w, int64_t r0) {
    return (ag_buf){w->data ? (char *)w->data + (size_t)(r0 * w->shape[1]) * (size_t)w->bits / 8 : NULL, w->dtype};
}

static ag_buf part_of(ag_buf y, int64_t at) {
    return (ag_buf){y.p ? (char *)y.p + (size_t)at * (size_t)ag_type_traits_of(y.t)->bits / 8 : NULL, y.t};
}

// dx = Σ_p dy_p · w_p; dw_p = dy_pᵀ · x. x and w as ag_linear keeps them.
static void linear_parts_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_linear_parts_state *st = &n->state.linear_parts;
    ag_grad_dst d[2];
    if (!ag_grad_get_all(ctx, n, d) || mp_is_meta()) return;
    const int64_t M = st->rows, in = st->in;
    ag_buf dy = {(void *)dout, n->grad_dtype};
    bool ok = true;
    int64_t r0 = 0, at = 0;
    for (int p = 0; ok && p < st->nparts; at += M * st->part[p], r0 += st->part[p++]) {
        const int64_t rows = st->part[p];
        ag_buf dyp = part_of(dy, at);
        if (d[0].needed) // dx[M, in] (+)= dy_p[M, rows] · w_p[rows, in]
            ok = ag_gemm_buf(CblasNoTrans, CblasNoTrans, M, in, rows, 1.0f, dyp, rows, rows_of(st->w, r0), in,
                             d[0].fresh && p == 0 ? 0.0f : 1.0f, ag_dst_buf(&d[0]), in);
        if (ok && d[1].needed) { // dw_p[rows, in] = dy_p[M, rows]ᵀ · x[M, in]
            ag_buf dw = {(char *)d[1].data + (size_t)(r0 * in) * (size_t)ag_type_traits_of(d[1].dtype)->bits / 8,
                         d[1].dtype};
            ok = ag_gemm_buf(CblasTrans, CblasNoTrans, rows, in, M, 1.0f, dyp, rows, ag_buf_of(st->x), in,
                             d[1].fresh ? 0.0f : 1.0f, dw, in);
        }
    }
    if (!ok) ag_fail(ctx, AG_ERR_NOMEM, "linear %s backward: out of memory for a conversion", mp_site_name(n->site));
}

static const ag_op linear_parts_op = {
    .name = "linear_parts", .backward = linear_parts_backward, .nsaved = AG_NSAVED(linear_parts)};

static bool parts_fit(ag_ctx *ctx, const ag_site *s, const ag_tensor *x, const ag_tensor *w, int nparts,
                      const int64_t *rows) {
    char sx[64], sw[64];
    if (w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1])
        return ag_fail(ctx, AG_ERR_SHAPE, "linear %s: x %s does not fit weight %s %s (expected x[..., in], w[out, in])",
                       s->base, ag_shape_str(x, sx), ag_tensor_name(w), ag_shape_str(w, sw));
    int64_t sum = 0;
    for (int p = 0; p < nparts && nparts <= AG_LINEAR_MAX_PARTS; p++) sum += rows[p] > 0 ? rows[p] : -w->shape[0];
    if (nparts < 1 || nparts > AG_LINEAR_MAX_PARTS || sum != w->shape[0])
        return ag_fail(ctx, AG_ERR_SHAPE, "linear %s: weight %s %s is not %d parts of the rows given", s->base,
                       ag_tensor_name(w), ag_shape_str(w, sw), nparts);
    if (ag_type_traits_of(w->dtype)->quantised || ag_autocast(ctx))
        return ag_fail(ctx, AG_ERR_ARG, "linear %s: a fused projection of a %s weight%s is not modelled", s->base,
                       ag_type_traits_of(w->dtype)->name, ag_autocast(ctx) ? " under autocast" : "");
    return true;
}

ag_tensor *ag_linear_parts(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, int nparts, const int64_t *rows) {
    ag_tensor *ins[] = {x, w};
    if (!ag_check_inputs(ctx, "linear", site, 2, ins, (const char *[]){"x", "w"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!parts_fit(ctx, &s, x, w, nparts, rows)) return NULL;
    int64_t shape[AG_MAX_DIMS], in = w->shape[1], M = x->numel / in;
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[x->ndim - 1] = w->shape[0];
    ag_tensor *y = AG_FW(ctx->fw, typed_tensors)
                       ? ag_tensor_new_bits(ctx, x->ndim, shape, MP_ACTIVATION, s.out, x->bits)
                       : ag_tensor_new(ctx, x->ndim, shape, MP_ACTIVATION, s.out);
    if (!y) return NULL;
    bool ok = true;
    int64_t r0 = 0, at = 0;
    for (int p = 0; ok && !mp_is_meta() && p < nparts; at += M * rows[p], r0 += rows[p++])
        ok = ag_gemm_buf(CblasNoTrans, CblasTrans, M, rows[p], in, 1.0f, ag_buf_of(x), in, rows_of(w, r0), in, 0.0f,
                         part_of(ag_buf_of(y), at), rows[p]);
    if (!ok) {
        ag_release(y);
        ag_fail(ctx, AG_ERR_NOMEM, "linear %s: out of memory for a conversion", s.base);
        return NULL;
    }
    if (!ag_any_needs_grad(ctx, 2, ins)) return y;
    ag_node *n = ag_record(ctx, &linear_parts_op, s.base, y, 2, ins);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    ag_linear_parts_state *st = &n->state.linear_parts;
    *st = (ag_linear_parts_state){
        .x = ag_retain(ag_wants_grad(n, 1) ? x : NULL),
        .w = ag_retain(ag_wants_grad(n, 0) ? w : NULL),
        .rows = M,
        .in = in,
        .nparts = nparts,
    };
    for (int p = 0; p < nparts; p++) st->part[p] = rows[p];
    return y;
}
