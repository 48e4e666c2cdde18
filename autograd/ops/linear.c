// linear: y[M, out] = x[M, in] · w[out, in]ᵀ (+ b[out]), M the product of x's leading dimensions.
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

// dx = dy · w needs w; dw = dyᵀ · x needs x. Each is kept only when the other side wants its
// gradient, so a frozen weight saves no activation at all.
// Under autocast: MmBackward's 16-bit gradients of the two casts, then each ToCopyBackward's
// float32 one into the input's and the weight's gradient.
static void linear_backward_autocast(ag_ctx *ctx, ag_node *n, ag_buf dy) {
    const ag_linear_state *st = &n->state.linear;
    const char *base = mp_site_name(n->site);
    const bool real = !mp_is_meta();
    const ag_dtype h = dy.t;
    int64_t M = st->rows, in = st->in, out = st->out;
    char l[AG_LABEL_MAX];
    mp_block dx16 = {0}, dw16 = {0}, db16 = {0};
    bool want_x = ag_wants_grad(n, 0), want_w = ag_wants_grad(n, 1);
    ag_label(l, base, "dx_bf16");
    if (want_x && !ag_alloc_exact(ctx, &dx16, (size_t)(st->rows * st->in) * 2, MP_ACTIVATION, l)) return;
    if (want_x && real)
        ag_gemm_buf(CblasNoTrans, CblasNoTrans, M, in, out, 1.0f, dy, out, ag_buf_of(st->w), in, 0.0f,
                    (ag_buf){dx16.data, h}, in);
    ag_label(l, base, "dw_bf16");
    if (want_w && !ag_alloc_exact(ctx, &dw16, (size_t)(st->out * st->in) * 2, MP_ACTIVATION, l)) goto done;
    if (want_w && real)
        ag_gemm_buf(CblasTrans, CblasNoTrans, out, in, M, 1.0f, dy, out, ag_buf_of(st->x), in, 0.0f,
                    (ag_buf){dw16.data, h}, in);
    ag_grad_dst d;
    if (want_x && ag_grad_get(ctx, n, 0, &d)) {
        if (real) ag_vec_acc(ag_dst_buf(&d), d.fresh, (ag_buf){dx16.data, h}, M * in);
        mp_free(&dx16);
    }
    if (want_w && ag_grad_get(ctx, n, 1, &d) && real)
        ag_vec_acc(ag_dst_buf(&d), d.fresh, (ag_buf){dw16.data, h}, out * in);
    ag_label(l, base, "db_bf16");
    if (st->bias && ag_wants_grad(n, 2) && ag_alloc_exact(ctx, &db16, (size_t)st->out * 2, MP_ACTIVATION, l) &&
        ag_grad_get(ctx, n, 2, &d) && real) {
        ag_linear_bias_backward((ag_buf){db16.data, h}, true, dy, M, out);
        ag_vec_acc(ag_dst_buf(&d), d.fresh, (ag_buf){db16.data, h}, out);
    }
done:
    mp_free(&dx16);
    mp_free(&dw16);
    mp_free(&db16);
}

static bool all_f32(ag_buf a, ag_buf b, ag_buf c) { return a.t == AG_F32 && b.t == AG_F32 && c.t == AG_F32; }

static void linear_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_linear_state *st = &n->state.linear;
    int64_t M = st->rows, in = st->in, out = st->out;
    ag_buf dy = {(void *)dout, n->grad_dtype};
    if (ag_is_quantised(st->w)) { // a frozen quantised base: dx through its dequantised weight
        ag_qlinear_backward(ctx, n, dy);
        return;
    }
    if (ag_autocast(ctx) && st->cast) { // 16-bit operands autocast left as they were: a plain product
        linear_backward_autocast(ctx, n, dy);
        return;
    }
    ag_grad_dst d[3];
    if (!ag_grad_get_all(ctx, n, d) || mp_is_meta()) return;
    ag_buf x = ag_buf_of(st->x), w = ag_buf_of(st->w), dx = ag_dst_buf(&d[0]), dw = ag_dst_buf(&d[1]);
    if (st->bias && d[2].needed) ag_linear_bias_backward(ag_dst_buf(&d[2]), d[2].fresh, dy, M, out);
    if (d[0].needed && d[1].needed && d[0].data != d[1].data && ag_skinny_available(M) && all_f32(dy, x, w) &&
        all_f32(dx, dw, dy)) {
        ag_skinny_backward(dy.p, x.p, w.p, dx.p, dw.p, M, out, in, d[0].fresh, d[1].fresh);
        return;
    }
    bool ok = true;
    if (d[0].needed) // dx[M, in] = dy[M, out] · w[out, in]
        ok =
            ag_gemm_buf(CblasNoTrans, CblasNoTrans, M, in, out, 1.0f, dy, out, w, in, d[0].fresh ? 0.0f : 1.0f, dx, in);
    if (ok && d[1].needed) // dw[out, in] = dy[M, out]ᵀ · x[M, in]
        ok = ag_gemm_buf(CblasTrans, CblasNoTrans, out, in, M, 1.0f, dy, out, x, in, d[1].fresh ? 0.0f : 1.0f, dw, in);
    if (!ok) ag_fail(ctx, AG_ERR_NOMEM, "linear %s backward: out of memory for a conversion", mp_site_name(n->site));
}

static const ag_op linear_op = {.name = "linear", .backward = linear_backward, .nsaved = AG_NSAVED(linear)};

// y[M, out] = x[M, in] · w[out, in]ᵀ with a quantised w: int8 as quantize_dynamic computes it
// (x quantised per call, integer products), int4 dequantised tile by tile (ag_kernels.h). A 16-bit
// x is read as float32 and y rounded back.
static bool linear_quantised(ag_buf y, ag_buf x, const ag_tensor *w, int64_t M, int64_t out, int64_t in) {
    float *xf = x.t == AG_F32 ? x.p : malloc((size_t)(M * in) * sizeof(float));
    float *yf = y.t == AG_F32 ? y.p : malloc((size_t)(M * out) * sizeof(float));
    bool ok = xf && yf;
    if (ok && xf != x.p) ag_type_traits_of(x.t)->to_f32(x.p, xf, M * in);
    if (ok && w->dtype == AG_Q8) ok = ag_q8_linear(xf, M, in, w->data, w->q_scale, out, NULL, yf);
    if (ok && w->dtype == AG_Q4) ok = ag_q4_linear(xf, M, in, w->data, w->q_group, out, NULL, yf);
    if (ok && yf != y.p) ag_type_traits_of(y.t)->from_f32(yf, y.p, M * out);
    if (xf != x.p) free(xf);
    if (yf != y.p) free(yf);
    return ok;
}

// y[M, out] = x[M, in] · w[out, in]ᵀ
static bool linear_forward(ag_buf y, ag_buf x, const ag_tensor *w, int64_t M, int64_t out, int64_t in) {
    if (ag_type_traits_of(w->dtype)->quantised) return linear_quantised(y, x, w, M, out, in);
    if (!all_f32(y, x, ag_buf_of(w)))
        return ag_gemm_buf(CblasNoTrans, CblasTrans, M, out, in, 1.0f, x, in, ag_buf_of(w), in, 0.0f, y, out);
    if (ag_skinny_forward_available(M))
        ag_skinny_forward(x.p, w->data, y.p, M, out, in);
    else
        ag_sgemm(CblasNoTrans, CblasTrans, M, out, in, 1.0f, x.p, in, w->data, in, 0.0f, y.p, out);
    return true;
}

// The forward's product and bias into y (a real run), or the error set.
static bool linear_compute(ag_ctx *ctx, const ag_site *s, ag_tensor *y, ag_tensor *x, ag_tensor *w, ag_tensor *b) {
    // A QLoRA base (NF4, or LLM.int8's row scales): dequantised in the compute dtype; bills in meta
    // mode too.
    if (w->dtype == AG_NF4 || (w->dtype == AG_Q8 && w->q_group > 0))
        return ag_qlinear_forward(ctx, s->base, y, x, w, b);
    if (mp_is_meta()) return true;
    int64_t in = w->shape[1], out = w->shape[0], M = x->numel / in;
    if (!linear_forward(ag_buf_of(y), ag_buf_of(x), w, M, out, in))
        return ag_fail(ctx, AG_ERR_NOMEM, "linear %s: out of memory for a conversion", s->base);
    if (b) ag_linear_bias_forward(ag_buf_of(y), ag_buf_of(b), M, out);
    return true;
}

// Under PYTORCH semantics the output has the input's dtype; under autocast the matmul casts a
// float32 input and the weight to 16 bits (new tensors, kept for backward as its operands) and
// returns 16 bits.
static ag_tensor *linear_pt(ag_ctx *ctx, const ag_site *s, ag_tensor *x, ag_tensor *w, ag_tensor *b,
                            const int64_t *shape) {
    ag_tensor *ins[] = {x, w, b};
    const int nin = b ? 3 : 2;
    int64_t in = w->shape[1], out = w->shape[0], M = x->numel / in;
    const bool cast = ag_autocast(ctx);
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
        wc = ag_autocast_weight(ctx, w, l);
    }
    ag_tensor *bc = NULL;
    if (cast && b && b->bits > 16) {
        ag_label(l, s->base, "bias_bf16");
        bc = ag_tensor_new_bits(ctx, 1, b->shape, MP_ACTIVATION, l, 16);
    }
    ag_tensor *y =
        xc && wc ? ag_tensor_new_bits(ctx, x->ndim, shape, MP_ACTIVATION, s->out, cast ? 16 : x->bits) : NULL;
    if (!mp_is_meta() && xc != x && xc) ag_vec_copy(ag_buf_of(xc), ag_buf_of(x), x->numel);
    if (!mp_is_meta() && bc) ag_vec_copy(ag_buf_of(bc), ag_buf_of(b), b->numel);
    if (y && !linear_compute(ctx, s, y, xc, wc, bc ? bc : b)) ag_release(y), y = NULL;
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
            .cast = xc != x || wc != w || bc,
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

// What every linear checks first; shape gets y's.
static bool linear_prepare(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, ag_tensor *b, ag_site *s,
                           int64_t *shape) {
    ag_tensor *ins[] = {x, w, b};
    if (!ag_check_inputs(ctx, "linear", site, 2, ins, (const char *[]){"x", "w"})) return false;
    ag_site_parse(s, site);
    if (!linear_shapes_fit(ctx, s, x, w, b)) return false;
    if (ag_is_quantised(w) && ag_needs_grad(ctx, w))
        return ag_fail(ctx, AG_ERR_ARG,
                       "linear %s: weight %s is %s, which gets no gradient (freeze it: a quantised base)", s->base,
                       ag_tensor_name(w), ag_type_traits_of(w->dtype)->name);
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[x->ndim - 1] = w->shape[0];
    return true;
}

ag_tensor *ag_linear(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, ag_tensor *b) {
    ag_tensor *ins[] = {x, w, b};
    const int nin = b ? 3 : 2;
    ag_site s;
    int64_t shape[AG_MAX_DIMS];
    if (!linear_prepare(ctx, site, x, w, b, &s, shape)) return NULL;
    int64_t in = w->shape[1], out = w->shape[0], M = x->numel / in;
    if (AG_FW(ctx->fw, typed_tensors)) return linear_pt(ctx, &s, x, w, b, shape);
    ag_tensor *y = ag_tensor_new(ctx, x->ndim, shape, MP_ACTIVATION, s.out);
    if (!y) return NULL;
    if (!linear_compute(ctx, &s, y, x, w, b)) {
        ag_release(y);
        return NULL;
    }
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

// Whether n linears of x can run as one group: a real run, nothing to record, few rows, weights of
// one kind that a group kernel takes with x's dtype.
static bool groupable(ag_ctx *ctx, int n, ag_tensor *x, ag_tensor *const w[], ag_tensor *const b[]) {
    if (mp_is_meta() || n < 2 || n > AG_JOBS_MAX || !x || !w[0] || ag_autocast(ctx)) return false;
    int64_t K = x->shape[x->ndim - 1], M = x->numel / (K > 0 ? K : 1);
    if (K < 1 || M < 1 || M > AG_SKINNY_MAX_M) return false;
    for (int i = 0; i < n; i++) {
        ag_tensor *ins[] = {x, w[i], b[i]};
        if (!w[i] || w[i]->dtype != w[0]->dtype || ag_any_needs_grad(ctx, b[i] ? 3 : 2, ins)) return false;
    }
    switch (w[0]->dtype) {
    case AG_F32: return x->dtype == AG_F32 && ag_skinny_forward_available(M);
    case AG_BF16: return x->dtype == AG_BF16;
    case AG_Q8: return x->dtype == AG_F32 && w[0]->q_group == 0;
    case AG_Q4: return x->dtype == AG_F32;
    default: return false;
    }
}

// The products of a group into y[i] (outputs of the dtype the kernels write), then the biases.
static void group_compute(int n, ag_tensor *x, ag_tensor *const w[], ag_tensor *const b[], ag_tensor *const y[]) {
    int64_t K = x->shape[x->ndim - 1], M = x->numel / K, N[AG_JOBS_MAX];
    const void *wd[AG_JOBS_MAX];
    void *yd[AG_JOBS_MAX];
    for (int i = 0; i < n; i++) N[i] = w[i]->shape[0], wd[i] = w[i]->data, yd[i] = y[i]->data;
    if (w[0]->dtype == AG_F32) {
        ag_skinny_forward_group(x->data, M, K, n, (const float *const *)wd, N, (float *const *)yd);
    } else if (w[0]->dtype == AG_BF16) {
        ag_gemm_16_linear_group(AG_BF16, M, K, x->data, n, wd, N, yd);
    } else if (w[0]->dtype == AG_Q8) {
        ag_q8_weight q[AG_JOBS_MAX];
        for (int i = 0; i < n; i++) q[i] = (ag_q8_weight){wd[i], w[i]->q_scale, N[i], NULL};
        ag_q8_linear_group(x->data, M, K, n, q, (float *const *)yd);
    } else {
        ag_q4_weight q[AG_JOBS_MAX];
        for (int i = 0; i < n; i++) q[i] = (ag_q4_weight){wd[i], w[i]->q_group, N[i], NULL};
        ag_q4_linear_group(x->data, M, K, n, q, (float *const *)yd);
    }
    for (int i = 0; i < n; i++)
        if (b[i]) ag_linear_bias_forward(ag_buf_of(y[i]), ag_buf_of(b[i]), M, N[i]);
}

bool ag_linear_group(ag_ctx *ctx, int n, const char *const sites[], ag_tensor *x, ag_tensor *const w[],
                     ag_tensor *const b[], ag_tensor *out[]) {
    for (int i = 0; i < n; i++) out[i] = NULL;
    if (!ctx || ctx->status != AG_OK) return false;
    if (n < 1 || n > AG_JOBS_MAX)
        return ag_fail(ctx, AG_ERR_ARG, "linear group: %d linears (expected 1 to %d)", n, AG_JOBS_MAX);
    bool group = groupable(ctx, n, x, w, b), ok = true, kernel_dtype = true;
    ag_site s[AG_JOBS_MAX];
    for (int i = 0; ok && i < n; i++) {
        int64_t shape[AG_MAX_DIMS];
        if (!group) {
            ok = (out[i] = ag_linear(ctx, sites[i], x, w[i], b[i])) != NULL;
        } else if ((ok = linear_prepare(ctx, sites[i], x, w[i], b[i], &s[i], shape))) {
            // Allocated as ag_linear allocates, in the same order; only the products wait.
            out[i] = AG_FW(ctx->fw, typed_tensors)
                         ? ag_tensor_new_bits(ctx, x->ndim, shape, MP_ACTIVATION, s[i].out, x->bits)
                         : ag_tensor_new(ctx, x->ndim, shape, MP_ACTIVATION, s[i].out);
            ok = out[i] != NULL;
            kernel_dtype = kernel_dtype && ok && out[i]->dtype == (w[0]->dtype == AG_BF16 ? AG_BF16 : AG_F32);
        }
    }
    if (ok && group && kernel_dtype) group_compute(n, x, w, b, out);
    for (int i = 0; ok && group && !kernel_dtype && i < n; i++) // outputs the group kernels do not write
        ok = linear_compute(ctx, &s[i], out[i], x, w[i], b[i]);
    if (ok) return true;
    for (int i = 0; i < n; i++) ag_release(out[i]), out[i] = NULL;
    return false;
}
