// rmsnorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x², last dim) + eps), as HF LlamaRMSNorm.
// Any dtype: each row is read into float32, computed there, and rounded once to its output's dtype.
#include <math.h>
#include <string.h>

#include "ag_ops.h"

// The operands of one of the row loops below; each runs over rows [lo, hi) of the pool.
typedef struct {
    ag_buf out, out2; // what the loop writes
    float *rstd;
    ag_buf x, w, dy;
    const float *rs;
    int64_t H, rows;
    float eps, off; // off: the weight applied as off + w
    bool fresh;
} rms_args;

static int64_t rows_grain(int64_t H) { return AG_PAR_GRAIN / H + 1; }

// The weight as the rows use it: off + w (Gemma's 1 + w in float32), else w itself.
static const float *weight(const rms_args *a, float *buf) {
    const float *w = ag_rd(a->w, 0, a->H, buf);
    if (a->off == 0.0f) return w;
    for (int64_t j = 0; j < a->H; j++) buf[j] = a->off + w[j];
    return buf;
}

// Σ x² of one row, in double (H can be 8192).
static double sum_squares(const float *x, int64_t H) { return ag_dot_f64(x, x, H); }

static void forward_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const rms_args *a = p;
    int64_t H = a->H;
    float xb[H], wb[H], yb[H];
    const float *w = weight(a, wb);
    for (int64_t r = lo; r < hi; r++) {
        const float *x = ag_rd(a->x, r * H, H, xb);
        float *y = ag_wr(a->out, r * H, yb);
        float rs = 1.0f / sqrtf((float)(sum_squares(x, H) / (double)H) + a->eps);
        for (int64_t j = 0; j < H; j++) y[j] = w[j] * (x[j] * rs); // HF's order: weight * (x * rstd)
        ag_wr_end(a->out, r * H, H, y);
        if (a->rstd) a->rstd[r] = rs;
    }
}

static void rmsnorm_forward(ag_buf y, float *rstd, ag_buf x, ag_buf w, int64_t rows, int64_t H, float eps, float off) {
    rms_args a = {.out = y, .rstd = rstd, .x = x, .w = w, .H = H, .eps = eps, .off = off};
    ag_parallel_for(rows, rows_grain(H), forward_part, &a);
}

// dx_j = r w_j dy_j - x_j r³/H Σ_i dy_i w_i x_i
static void dx_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const rms_args *a = p;
    int64_t H = a->H;
    float xb[H], wb[H], gb[H], ob[H];
    const float *w = weight(a, wb);
    for (int64_t r = lo; r < hi; r++) {
        const float *xr = ag_rd(a->x, r * H, H, xb), *g = ag_rd(a->dy, r * H, H, gb);
        float *o = a->fresh ? ag_wr(a->out, r * H, ob) : ag_rw(a->out, r * H, H, ob);
        double dot = 0.0;
        for (int64_t j = 0; j < H; j++) dot += (double)g[j] * w[j] * xr[j];
        float rs = a->rs[r], c = (float)(dot * rs * rs * rs / (double)H);
        for (int64_t j = 0; j < H; j++) {
            float v = rs * w[j] * g[j] - c * xr[j];
            o[j] = a->fresh ? v : o[j] + v;
        }
        ag_wr_end(a->out, r * H, H, o);
    }
}

static void rmsnorm_dx(ag_buf dx, bool fresh, ag_buf dy, ag_buf x, const float *rstd, ag_buf w, int64_t rows, int64_t H,
                       float off) {
    rms_args a = {.out = dx, .x = x, .w = w, .dy = dy, .rs = rstd, .H = H, .fresh = fresh, .off = off};
    ag_parallel_for(rows, rows_grain(H), dx_part, &a);
}

// Columns [lo, hi) of dw, summed in float32; rows in order, so that the sum does not depend on
// the threads.
static void dw_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const rms_args *a = p;
    int64_t H = a->H, rows = a->rows, n = hi - lo;
    float acc[n], xb[n], gb[n], ob[n];
    if (a->fresh)
        memset(acc, 0, sizeof acc);
    else
        memcpy(acc, ag_rd(a->out, lo, n, ob), sizeof acc);
    for (int64_t r = 0; r < rows; r++) {
        const float *x = ag_rd(a->x, r * H + lo, n, xb), *g = ag_rd(a->dy, r * H + lo, n, gb);
        for (int64_t j = 0; j < n; j++) acc[j] += g[j] * x[j] * a->rs[r];
    }
    float *o = ag_wr(a->out, lo, ob);
    memcpy(o, acc, sizeof acc);
    ag_wr_end(a->out, lo, n, o);
}

// dw_j = Σ_rows dy_j x_j r
static void rmsnorm_dw(ag_buf dw, bool fresh, ag_buf dy, ag_buf x, const float *rstd, int64_t rows, int64_t H) {
    rms_args a = {.out = dw, .x = x, .dy = dy, .rs = rstd, .H = H, .rows = rows, .fresh = fresh};
    ag_parallel_for(H, AG_PAR_GRAIN / rows + 16, dw_part, &a);
}

// Backward needs x and rstd (one float per row, cheaper to keep than to recompute from x
// with another pass) for both gradients, and w for dx. The output is not needed.
static void rmsnorm_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_rmsnorm_state *st = &n->state.rmsnorm;
    int64_t rows = st->rows, H = st->hidden;
    ag_grad_dst d[2];
    if (!ag_grad_get_all(ctx, n, d) || mp_is_meta()) return;
    ag_buf x = ag_buf_of(st->x), dy = {(void *)dout, n->grad_dtype};
    const float *rstd = st->rstd->data;
    if (d[0].needed) rmsnorm_dx(ag_dst_buf(&d[0]), d[0].fresh, dy, x, rstd, ag_buf_of(st->w), rows, H, st->offset);
    if (d[1].needed) rmsnorm_dw(ag_dst_buf(&d[1]), d[1].fresh, dy, x, rstd, rows, H);
}

static const ag_op rmsnorm_op = {.name = "rmsnorm", .backward = rmsnorm_backward, .nsaved = AG_NSAVED(rmsnorm)};

// HF's LlamaRMSNorm as PyTorch runs it, op by op: sq = x.pow(2); rstd = rsqrt(sq.mean(-1) + eps);
// h = x * rstd; y = w * h. sq is freed after the mean (1.13: kept by MeanBackward1); h and
// rstd are kept by the two muls, x by pow and the first mul. The [rows] transients (the mean
// and mean + eps) are left out: one float a row each.
static void squares_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const rms_args *a = p;
    int64_t H = a->H;
    float xb[H], sb[H];
    for (int64_t r = lo; r < hi; r++) {
        const float *x = ag_rd(a->x, r * H, H, xb);
        float *sq = ag_wr(a->out, r * H, sb);
        double ss = 0.0;
        for (int64_t j = 0; j < H; j++) {
            sq[j] = x[j] * x[j];
            ss += sq[j];
        }
        ag_wr_end(a->out, r * H, H, sq);
        a->rstd[r] = 1.0f / sqrtf((float)(ss / (double)H) + a->eps);
    }
}

static void rms_squares(ag_buf sq, float *rstd, ag_buf x, int64_t rows, int64_t H, float eps) {
    rms_args a = {.out = sq, .rstd = rstd, .x = x, .H = H, .eps = eps};
    ag_parallel_for(rows, rows_grain(H), squares_part, &a);
}

// h = x * rstd in h's dtype, then y = w * h from h as rounded (HF casts h before the weight's mul).
static void scale_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const rms_args *a = p;
    int64_t H = a->H;
    float xb[H], wb[H], hb[H], yb[H];
    const float *w = weight(a, wb);
    for (int64_t r = lo; r < hi; r++) {
        const float *x = ag_rd(a->x, r * H, H, xb);
        float *h = ag_wr(a->out2, r * H, hb), *y = ag_wr(a->out, r * H, yb);
        for (int64_t j = 0; j < H; j++) h[j] = x[j] * a->rs[r];
        ag_wr_end(a->out2, r * H, H, h);
        h = (float *)ag_rd(a->out2, r * H, H, hb);
        for (int64_t j = 0; j < H; j++) y[j] = w[j] * h[j];
        ag_wr_end(a->out, r * H, H, y);
    }
}

static void rms_scale(ag_buf y, ag_buf h, ag_buf x, const float *rstd, ag_buf w, int64_t rows, int64_t H, float off) {
    rms_args a = {.out = y, .out2 = h, .x = x, .w = w, .rs = rstd, .H = H, .off = off};
    ag_parallel_for(rows, rows_grain(H), scale_part, &a);
}

// In a 16-bit model, `hidden_states.to(torch.float32)` first: the float32 copy is what pow and the
// first mul keep (the 16-bit input is kept by nobody), h is float32 and freed once cast back to
// the model's dtype, and that cast is what the weight's mul keeps. Gemma's norm (an offset) casts
// after the weight's mul instead: h stays float32 (kept), y is float32 and its cast is the output
// (its [H] 1 + w, kept by the mul, is left out as the [rows] transients are).
static ag_tensor *rmsnorm_pt(ag_ctx *ctx, const ag_site *s, ag_tensor *x, ag_tensor *w, float eps, float off,
                             bool rec) {
    ag_tensor *ins[] = {x, w};
    int64_t H = w->shape[0], rows = x->numel / H;
    const bool keep_sq = AG_FW(ctx->fw, rmsnorm) == AG_RMSNORM_HF_SQUARES && rec, half = x->bits < 32,
               cast_h = half && off == 0.0f;
    char l[5][AG_LABEL_MAX];
    ag_label(l[0], s->base, "float");
    ag_label(l[1], s->base, "pow");
    ag_label(l[2], s->base, "rstd");
    ag_label(l[3], s->base, cast_h ? "normed_float" : "normed");
    ag_label(l[4], s->base, "normed");
    ag_tensor *xf = half ? ag_tensor_new_bits(ctx, x->ndim, x->shape, MP_ACTIVATION, l[0], 32) : ag_retain(x);
    ag_tensor *sq = ag_tensor_new_bits(ctx, x->ndim, x->shape, MP_ACTIVATION, l[1], 32);
    ag_tensor *rstd = ag_tensor_new_f32(ctx, 1, &rows, MP_ACTIVATION, l[2]);
    if (xf && half && !mp_is_meta()) ag_vec_copy(ag_buf_of(xf), ag_buf_of(x), x->numel);
    if (sq && rstd && !mp_is_meta()) rms_squares(ag_buf_of(sq), rstd->data, ag_buf_of(x), rows, H, eps);
    if (!keep_sq) ag_release(sq), sq = NULL;
    ag_tensor *h = ag_tensor_new_bits(ctx, x->ndim, x->shape, MP_ACTIVATION, l[3], 32);
    if (cast_h) { // h.to(input_dtype): the cast is kept, the float32 h goes
        ag_tensor *hb = ag_tensor_new_bits(ctx, x->ndim, x->shape, MP_ACTIVATION, l[4], x->bits);
        ag_release(h);
        h = hb;
    }
    char l32[AG_LABEL_MAX];
    ag_label(l32, s->base, "scaled_float");
    ag_tensor *y32 = h && half && !cast_h ? ag_tensor_new_bits(ctx, x->ndim, x->shape, MP_ACTIVATION, l32, 32) : NULL;
    ag_tensor *y = h ? ag_tensor_new_bits(ctx, x->ndim, x->shape, MP_ACTIVATION, s->out,
                                          half && !cast_h ? x->bits : ag_max_bits(w->bits, h->bits))
                     : NULL;
    ag_release(y32); // Gemma's float32 product, freed once type_as(x) has it
    ag_node *n = y && xf && rstd && rec ? ag_record(ctx, &rmsnorm_op, s->base, y, 2, ins) : NULL;
    if (!y || !xf || !rstd || (rec && !n) || (keep_sq && !sq)) {
        ag_release(xf), ag_release(sq), ag_release(rstd), ag_release(h), ag_release(y);
        return NULL;
    }
    if (!mp_is_meta()) rms_scale(ag_buf_of(y), ag_buf_of(h), ag_buf_of(x), rstd->data, ag_buf_of(w), rows, H, off);
    if (!n) {
        ag_release(xf), ag_release(rstd), ag_release(h);
        return y;
    }
    // The weight's mul keeps h only for the weight's own gradient (a frozen norm keeps none).
    if (!ag_wants_grad(n, 1)) ag_release(h), h = NULL;
    n->state.rmsnorm = (ag_rmsnorm_state){
        .x = xf, // the node takes these references over
        .rstd = rstd,
        .w = ag_retain(ag_wants_grad(n, 0) ? w : NULL),
        .h = h,
        .sq = sq,
        .rows = rows,
        .hidden = H,
        .offset = off,
    };
    return y;
}

ag_tensor *ag_rmsnorm(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, float eps) {
    return ag_rmsnorm_offset(ctx, site, x, w, eps, 0.0f);
}

ag_tensor *ag_rmsnorm_offset(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, float eps, float offset) {
    ag_tensor *ins[] = {x, w};
    if (!ag_check_inputs(ctx, "rmsnorm", site, 2, ins, (const char *[]){"x", "w"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    char sx[64], sw[64];
    // A weight shorter than x's last dimension normalises each slice of its length on its own:
    // Qwen3's q_norm and k_norm over q.view(..., heads, head_dim), the same rows in memory.
    int64_t last = x->shape[x->ndim - 1], H = w->ndim == 1 ? w->shape[0] : 0, rows = H > 0 ? x->numel / H : 0;
    if (w->ndim != 1 || H < 1 || last % H != 0) {
        ag_fail(ctx, AG_ERR_SHAPE,
                "rmsnorm %s: weight %s %s does not fit x %s (expected [%lld], or a length that divides it)", s.base,
                ag_tensor_name(w), ag_shape_str(w, sw), ag_shape_str(x, sx), (long long)last);
        return NULL;
    }
    bool rec = ag_any_needs_grad(ctx, 2, ins);
    if (AG_FW(ctx->fw, rmsnorm) != AG_RMSNORM_X_RSTD) return rmsnorm_pt(ctx, &s, x, w, eps, offset, rec);
    char label[AG_LABEL_MAX];
    ag_label(label, s.base, "rstd");
    ag_tensor *y = ag_tensor_like(ctx, x, MP_ACTIVATION, s.out);
    ag_tensor *rstd = rec ? ag_tensor_new_f32(ctx, 1, &rows, MP_ACTIVATION, label) : NULL;
    ag_node *n = y && rec && rstd ? ag_record(ctx, &rmsnorm_op, s.base, y, 2, ins) : NULL;
    if (!y || (rec && !n)) {
        ag_release(rstd);
        ag_release(y);
        return NULL;
    }
    if (!mp_is_meta())
        rmsnorm_forward(ag_buf_of(y), rstd ? rstd->data : NULL, ag_buf_of(x), ag_buf_of(w), rows, H, eps, offset);
    if (n) {
        n->state.rmsnorm = (ag_rmsnorm_state){
            .x = ag_retain(x),
            .rstd = rstd, // the node takes the reference over
            .w = ag_retain(ag_wants_grad(n, 0) ? w : NULL),
            .rows = rows,
            .hidden = H,
            .offset = offset,
        };
    }
    return y;
}
