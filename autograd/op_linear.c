// linear: y[M, out] = x[M, in] · w[out, in]ᵀ (+ b[out]), M the product of x's leading dimensions.
#include <string.h>

#include "ag_internal.h"

// db[out] (+)= the sum over the M rows of dy[M, out]: the bias needs nothing saved.
static void bias_backward(float *db, bool fresh, const float *dy, int64_t M, int64_t out) {
    if (fresh) memset(db, 0, (size_t)out * sizeof *db);
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = 0; j < out; j++) db[j] += dy[r * out + j];
}

// y[r, :] += b for every row (nn.Linear's addmm).
static void bias_forward(float *y, const float *b, int64_t M, int64_t out) {
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = 0; j < out; j++) y[r * out + j] += b[j];
}

// dx = dy · w needs w; dw = dyᵀ · x needs x. Each is kept only when the other side wants its
// gradient, so a frozen weight saves no activation at all.
// Under autocast (meta mode only): MmBackward's 16-bit gradients of the two casts, then each
// ToCopyBackward's float32 one into the input's and the weight's gradient.
static void linear_backward_autocast(ag_ctx *ctx, ag_node *n) {
    const ag_linear_state *st = &n->state.linear;
    const char *base = mp_site_name(n->site);
    char l[AG_LABEL_MAX];
    mp_block dx16 = {0}, dw16 = {0}, db16 = {0};
    bool want_x = ag_wants_grad(n, 0), want_w = ag_wants_grad(n, 1);
    ag_label(l, base, "dx_bf16");
    if (want_x && !ag_alloc_exact(ctx, &dx16, (size_t)(st->rows * st->in) * 2, MP_ACTIVATION, l)) return;
    ag_label(l, base, "dw_bf16");
    if (want_w && !ag_alloc_exact(ctx, &dw16, (size_t)(st->out * st->in) * 2, MP_ACTIVATION, l)) goto done;
    ag_grad_dst d;
    if (want_x && ag_grad_get(ctx, n, 0, &d)) mp_free(&dx16);
    if (want_w) ag_grad_get(ctx, n, 1, &d);
    ag_label(l, base, "db_bf16");
    if (st->bias && ag_wants_grad(n, 2) && ag_alloc_exact(ctx, &db16, (size_t)st->out * 2, MP_ACTIVATION, l))
        ag_grad_get(ctx, n, 2, &d);
done:
    mp_free(&dx16);
    mp_free(&dw16);
    mp_free(&db16);
}

static void linear_backward(ag_ctx *ctx, ag_node *n, const float *dy) {
    const ag_linear_state *st = &n->state.linear;
    int64_t M = st->rows, in = st->in, out = st->out;
    if (ctx->dtype.autocast && ag_is_pytorch(ctx)) {
        linear_backward_autocast(ctx, n);
        return;
    }
    ag_grad_dst d[3];
    if (!ag_grad_get_all(ctx, n, d) || mp_is_meta()) return;
    if (st->bias && d[2].needed) bias_backward(d[2].data, d[2].fresh, dy, M, out);
    if (d[0].needed && d[1].needed && d[0].data != d[1].data && ag_skinny_available(M)) {
        ag_skinny_backward(dy, st->x->data, st->w->data, d[0].data, d[1].data, M, out, in, d[0].fresh, d[1].fresh);
        return;
    }
    if (d[0].needed) // dx[M, in] = dy[M, out] · w[out, in]
        ag_sgemm(CblasNoTrans, CblasNoTrans, M, in, out, 1.0f, dy, out, st->w->data, in, d[0].fresh ? 0.0f : 1.0f,
                 d[0].data, in);
    if (d[1].needed) // dw[out, in] = dy[M, out]ᵀ · x[M, in]
        ag_sgemm(CblasTrans, CblasNoTrans, out, in, M, 1.0f, dy, out, st->x->data, in, d[1].fresh ? 0.0f : 1.0f,
                 d[1].data, in);
}

static const ag_op linear_op = {.name = "linear", .backward = linear_backward, .nsaved = AG_NSAVED(linear)};

// y[M, out] = x[M, in] · w[out, in]ᵀ
static void linear_forward(float *y, const float *x, const float *w, int64_t M, int64_t out, int64_t in) {
    if (ag_skinny_forward_available(M))
        ag_skinny_forward(x, w, y, M, out, in);
    else
        ag_sgemm(CblasNoTrans, CblasTrans, M, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

// Under PYTORCH semantics the output has the input's dtype; under autocast the matmul casts a
// float32 input and the weight to 16 bits (new tensors, kept for backward as its operands) and
// returns 16 bits.
static ag_tensor *linear_pt(ag_ctx *ctx, const ag_site *s, ag_tensor *x, ag_tensor *w, ag_tensor *b,
                            const int64_t *shape) {
    ag_tensor *ins[] = {x, w, b};
    const int nin = b ? 3 : 2;
    int64_t in = w->shape[1], out = w->shape[0], M = x->numel / in;
    const bool cast = ctx->dtype.autocast;
    char l[AG_LABEL_MAX];
    ag_tensor *xc = ag_retain(x), *wc = ag_retain(w);
    if (cast && x->bits > 16) {
        ag_label(l, s->base, "input_bf16");
        ag_release(xc);
        xc = ag_tensor_new_bits(ctx, x->ndim, x->shape, MP_ACTIVATION, l, 16);
    }
    if (cast && w->bits > 16) {
        ag_label(l, s->base, "weight_bf16");
        ag_release(wc);
        wc = ag_tensor_new_bits(ctx, 2, w->shape, MP_ACTIVATION, l, 16);
    }
    ag_tensor *bc = NULL;
    if (cast && b && b->bits > 16) {
        ag_label(l, s->base, "bias_bf16");
        bc = ag_tensor_new_bits(ctx, 1, b->shape, MP_ACTIVATION, l, 16);
    }
    ag_tensor *y =
        xc && wc ? ag_tensor_new_bits(ctx, x->ndim, shape, MP_ACTIVATION, s->out, cast ? 16 : x->bits) : NULL;
    if (y && !mp_is_meta()) linear_forward(y->data, x->data, w->data, M, out, in); // real: xc, wc are x, w
    if (y && b && !mp_is_meta()) bias_forward(y->data, b->data, M, out);
    ag_node *n = y && ag_any_needs_grad(ctx, nin, ins) ? ag_record(ctx, &linear_op, s->base, y, nin, ins) : NULL;
    if (n)
        n->state.linear = (ag_linear_state){
            .x = ag_retain(ag_wants_grad(n, 1) ? xc : NULL),
            .w = ag_retain(ag_wants_grad(n, 0) ? wc : NULL),
            .bc = ag_retain(bc),
            .rows = M,
            .in = in,
            .out = out,
            .bias = b != NULL,
        };
    ag_release(xc), ag_release(wc), ag_release(bc);
    if (y && !n && ctx->status != AG_OK) ag_release(y), y = NULL;
    return y;
}

// x fits w[out, in] and b, when given, is [out]; else the error is set.
static bool linear_shapes_fit(ag_ctx *ctx, const ag_site *s, const ag_tensor *x, const ag_tensor *w,
                              const ag_tensor *b) {
    char sx[64], sw[64];
    if (w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1])
        return ag_fail(ctx, AG_ERR_SHAPE,
                       "linear %s: x %s does not fit weight %s %s (expected "
                       "x[..., in] and w[out, in])",
                       s->base, ag_shape_str(x, sx), ag_tensor_name(w), ag_shape_str(w, sw));
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return ag_fail(ctx, AG_ERR_SHAPE, "linear %s: bias %s %s does not fit weight %s %s (expected b[out])", s->base,
                       ag_tensor_name(b), ag_shape_str(b, sx), ag_tensor_name(w), ag_shape_str(w, sw));
    return true;
}

ag_tensor *ag_linear(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, ag_tensor *b) {
    ag_tensor *ins[] = {x, w, b};
    const int nin = b ? 3 : 2;
    if (!ag_check_inputs(ctx, "linear", site, 2, ins, (const char *[]){"x", "w"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!linear_shapes_fit(ctx, &s, x, w, b)) return NULL;
    int64_t in = w->shape[1], out = w->shape[0], M = x->numel / in;
    int64_t shape[AG_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[x->ndim - 1] = out;
    if (ag_is_pytorch(ctx)) return linear_pt(ctx, &s, x, w, b, shape);
    ag_tensor *y = ag_tensor_new(ctx, x->ndim, shape, MP_ACTIVATION, s.out);
    if (!y) return NULL;
    if (!mp_is_meta()) linear_forward(y->data, x->data, w->data, M, out, in);
    if (b && !mp_is_meta()) bias_forward(y->data, b->data, M, out);
    if (!ag_any_needs_grad(ctx, nin, ins)) return y;
    ag_node *n = ag_record(ctx, &linear_op, s.base, y, nin, ins);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    n->state.linear = (ag_linear_state){
        .x = ag_retain(ag_wants_grad(n, 1) ? x : NULL),
        .w = ag_retain(ag_wants_grad(n, 0) ? w : NULL),
        .rows = M,
        .in = in,
        .out = out,
        .bias = b != NULL,
    };
    return y;
}
