// rope_cs: HF's LlamaRotaryEmbedding and apply_rotary_pos_emb as PyTorch runs them. The
// tables cos, sin [1, T, hd] (emb = cat(freqs, freqs)) are made once per forward and kept by
// every layer's products; y = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1).
#include <math.h>
#include <string.h>

#include "ag_ops.h"

bool ag_rope_tables(ag_ctx *ctx, const char *site, int64_t T, int hd, float theta, int64_t pos0, ag_tensor **cos_t,
                    ag_tensor **sin_t) {
    return ag_rope_tables_f(ctx, site, T, hd, &(ag_rope_freqs){theta, NULL, 1.0f}, pos0, cos_t, sin_t);
}

bool ag_rope_tables_f(ag_ctx *ctx, const char *site, int64_t T, int hd, const ag_rope_freqs *f, int64_t pos0,
                      ag_tensor **cos_t, ag_tensor **sin_t) {
    *cos_t = *sin_t = NULL;
    if (!ctx || ctx->status != AG_OK) return false;
    ag_site s;
    ag_site_parse(&s, site);
    if (T < 1 || hd < 2 || hd % 2 || hd > AG_ROPE_MAX_HEAD_DIM || !ag_rope_freqs_ok(f, hd))
        return ag_fail(ctx, AG_ERR_SHAPE,
                       "rope tables %s: %lld positions of dimension %d (expected an even dimension "
                       "of at most %d, theta and frequencies > 0)",
                       s.base, (long long)T, hd, AG_ROPE_MAX_HEAD_DIM);
    char lc[AG_LABEL_MAX], ls[AG_LABEL_MAX];
    ag_label(lc, s.base, "cos");
    ag_label(ls, s.base, "sin");
    int64_t shape[3] = {1, T, hd};
    // Computed in float32 (autocast is off inside), then `.to(x.dtype)`: a 16-bit model keeps the
    // casts, the float32 tables going with the forward of the rotary embedding.
    ag_tensor *cf = NULL, *sf = NULL;
    if (ctx->dtype.act_bits < 32) {
        cf = ag_tensor_new_bits(ctx, 3, shape, MP_ACTIVATION, lc, 32);
        sf = ag_tensor_new_bits(ctx, 3, shape, MP_ACTIVATION, ls, 32);
    }
    *cos_t = ag_tensor_new(ctx, 3, shape, MP_ACTIVATION, lc);
    *sin_t = ag_tensor_new(ctx, 3, shape, MP_ACTIVATION, ls);
    ag_release(cf), ag_release(sf);
    if (!*cos_t || !*sin_t) {
        ag_release(*cos_t), ag_release(*sin_t);
        *cos_t = *sin_t = NULL;
        return false;
    }
    if (mp_is_meta()) return true;
    int half = hd / 2;
    const float scale = ag_rope_scale(f);
    void *cd = (*cos_t)->data, *sd = (*sin_t)->data;
    ag_dtype dt = (*cos_t)->dtype;
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < half; i++) { // angles in float32, as the ag_rope kernel and HF form them
            float a = (float)(pos0 + t) * ag_rope_freq_at(f, i, hd);
            float c = (float)cos((double)a) * scale, sn = (float)sin((double)a) * scale;
            ag_set(cd, dt, t * hd + i, c), ag_set(cd, dt, t * hd + half + i, c);
            ag_set(sd, dt, t * hd + i, sn), ag_set(sd, dt, t * hd + half + i, sn);
        }
    return true;
}

// y (+)= x * cos + rotate_half(x) * (sign * sin); sign -1 is the transpose, the backward.
typedef struct {
    ag_buf y, x, cs, sn;
    int64_t T;
    int nh, hd;
    float sign;
    bool accumulate;
} rotate_args;

static void rotate_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const rotate_args *ra = p;
    const int half = ra->hd / 2;
    const int64_t width = (int64_t)ra->nh * ra->hd, T = ra->T;
    float cb[ra->hd], sb[ra->hd], xb[width], yb[width];
    for (int64_t r = lo; r < hi; r++) {
        const float *c = ag_rd(ra->cs, (r % T) * ra->hd, ra->hd, cb), *s = ag_rd(ra->sn, (r % T) * ra->hd, ra->hd, sb);
        float *y = ra->accumulate ? ag_rw(ra->y, r * width, width, yb) : ag_wr(ra->y, r * width, yb);
        ag_rope_row(y, ag_rd(ra->x, r * width, width, xb), c, s, c + half, s + half, ra->nh, ra->hd, ra->sign,
                    ra->accumulate);
        ag_wr_end(ra->y, r * width, width, y);
    }
}

static void rotate(ag_buf y, bool accumulate, ag_buf x, ag_buf cs, ag_buf sn, int64_t B, int64_t T, int nh, int hd,
                   float sign) {
    rotate_args a = {y, x, cs, sn, T, nh, hd, sign, accumulate};
    ag_parallel_for(B * T, AG_PAR_GRAIN / ((int64_t)nh * hd) + 1, rotate_part, &a);
}

// Backward: dy * cos and the sliced gradient of rotate_half(x) * sin, two x-sized tensors,
// summed into dx.
static void rope_cs_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    const ag_rope_cs_state *st = &n->state.rope_cs;
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d)) return;
    mp_block t1 = {0}, t2 = {0};
    char label[AG_LABEL_MAX];
    size_t bytes = (size_t)(st->B * st->T * st->heads * st->head_dim) * sizeof(float);
    ag_label(label, mp_site_name(n->site), "dcos");
    if (!ag_alloc_block(ctx, &t1, bytes, MP_ACTIVATION, label)) return;
    ag_label(label, mp_site_name(n->site), "dsin");
    if (ag_alloc_block(ctx, &t2, bytes, MP_ACTIVATION, label) && !mp_is_meta())
        rotate(ag_dst_buf(&d), !d.fresh, (ag_buf){(void *)dy, n->grad_dtype}, ag_buf_of(st->cos), ag_buf_of(st->sin),
               st->B, st->T, st->heads, st->head_dim, -1.0f);
    mp_free(&t2);
    mp_free(&t1);
}

static const ag_op rope_cs_op = {.name = "rope", .backward = rope_cs_backward, .nsaved = AG_NSAVED(rope_cs)};

// The two passes of the forward's products, over rows of hd elements (one head of one token),
// split over the pool: pass 0 makes x_cos, neg_x2 and rotated; pass 1 rotated_sin.
typedef struct {
    ag_buf x, cs, sn, xc, neg, rot, rs;
    int64_t T, width;
    int hd, pass;
} products_args;

static void products_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const products_args *a = p;
    const int hd = a->hd, half = hd / 2;
    float xb[hd], cb[hd], ob[hd], gb[hd], rb[hd];
    for (int64_t r = lo; r < hi; r++) {
        const int64_t t = (r * hd / a->width) % a->T;
        if (a->pass == 0) {
            const float *xr = ag_rd(a->x, r * hd, hd, xb), *c = ag_rd(a->cs, t * hd, hd, cb);
            float *o = ag_wr(a->xc, r * hd, ob), *ng = ag_wr(a->neg, r * half, gb), *rt = ag_wr(a->rot, r * hd, rb);
            for (int i = 0; i < hd; i++) o[i] = xr[i] * c[i];
            for (int i = 0; i < half; i++) ng[i] = -xr[half + i];
            for (int i = 0; i < half; i++) rt[i] = ng[i], rt[half + i] = xr[i];
            ag_wr_end(a->xc, r * hd, hd, o), ag_wr_end(a->neg, r * half, half, ng), ag_wr_end(a->rot, r * hd, hd, rt);
        } else {
            const float *s = ag_rd(a->sn, t * hd, hd, cb), *rt = ag_rd(a->rot, r * hd, hd, rb);
            float *o = ag_wr(a->rs, r * hd, ob);
            for (int i = 0; i < hd; i++) o[i] = rt[i] * s[i];
            ag_wr_end(a->rs, r * hd, hd, o);
        }
    }
}

// The forward as HF writes it, each product a tensor of its own: xc = x * cos, neg = -x2,
// rot = cat(neg, x1) (neg freed), rs = rot * sin (rot freed); the caller then makes y = xc + rs
// and frees xc and rs.
static bool rope_cs_products(ag_ctx *ctx, const char *base, const ag_tensor *x, const ag_tensor *cs,
                             const ag_tensor *sn, int hd, mp_block *xc, mp_block *rs) {
    mp_block neg = {0}, rot = {0};
    // Type promotion: a 16-bit q times float32 cos is float32 (autocast); the rotation keeps x's.
    size_t n = (size_t)x->numel, bytes = n * (size_t)ag_max_bits(x->bits, cs->bits) / 8,
           xbytes = n * (size_t)x->bits / 8;
    const int64_t rows = x->numel / hd, grain = AG_PAR_GRAIN / (4 * hd) + 1;
    char l[4][AG_LABEL_MAX];
    ag_label(l[0], base, "x_cos");
    ag_label(l[1], base, "neg_x2");
    ag_label(l[2], base, "rotated");
    ag_label(l[3], base, "rotated_sin");
    bool ok = ag_alloc_exact(ctx, xc, bytes, MP_ACTIVATION, l[0]) &&
              ag_alloc_exact(ctx, &neg, xbytes / 2, MP_ACTIVATION, l[1]) &&
              ag_alloc_exact(ctx, &rot, xbytes, MP_ACTIVATION, l[2]);
    const ag_dtype pt = ag_dtype_of_bits(ag_max_bits(x->bits, cs->bits), ctx->dtype.fp16);
    products_args a = {.x = ag_buf_of(x),
                       .cs = ag_buf_of(cs),
                       .sn = ag_buf_of(sn),
                       .xc = {xc->data, pt},
                       .neg = {neg.data, x->dtype},
                       .rot = {rot.data, x->dtype},
                       .T = x->shape[1],
                       .width = x->shape[2],
                       .hd = hd};
    if (ok && !mp_is_meta()) ag_parallel_for(rows, grain, products_part, &a);
    mp_free(&neg);
    ok = ok && ag_alloc_exact(ctx, rs, bytes, MP_ACTIVATION, l[3]);
    a.rs = (ag_buf){rs->data, pt}, a.pass = 1;
    if (ok && !mp_is_meta()) ag_parallel_for(rows, grain, products_part, &a);
    mp_free(&rot);
    if (!ok) mp_free(xc), mp_free(rs);
    return ok;
}

ag_tensor *ag_rope_cs(ag_ctx *ctx, const char *site, ag_tensor *x, int nh, int hd, ag_tensor *cos_t, ag_tensor *sin_t) {
    ag_tensor *ins[] = {x, cos_t, sin_t};
    if (!ag_check_inputs(ctx, "rope", site, 3, ins, (const char *[]){"x", "cos", "sin"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    char sx[64], sc[64];
    if (x->ndim != 3 || nh < 1 || hd < 2 || hd % 2 || x->shape[2] != (int64_t)nh * hd || cos_t->ndim != 3 ||
        cos_t->shape[1] != x->shape[1] || cos_t->shape[2] != hd || sin_t->numel != cos_t->numel) {
        ag_fail(ctx, AG_ERR_SHAPE, "rope %s: x %s and cos %s do not fit %d heads of dimension %d", s.base,
                ag_shape_str(x, sx), ag_shape_str(cos_t, sc), nh, hd);
        return NULL;
    }
    int64_t B = x->shape[0], T = x->shape[1];
    mp_block xc = {0}, rs = {0};
    if (!rope_cs_products(ctx, s.base, x, cos_t, sin_t, hd, &xc, &rs)) return NULL;
    ag_tensor *y = ag_tensor_new_bits(ctx, 3, x->shape, MP_ACTIVATION, s.out, ag_max_bits(x->bits, cos_t->bits));
    if (y && !mp_is_meta())
        ag_vec_add(ag_buf_of(y), (ag_buf){xc.data, y->dtype}, (ag_buf){rs.data, y->dtype}, x->numel);
    mp_free(&rs);
    mp_free(&xc);
    if (!y) return NULL;
    if (!ag_needs_grad(ctx, x)) return y;
    ag_node *n = ag_record(ctx, &rope_cs_op, s.base, y, 1, ins);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    n->state.rope_cs = (ag_rope_cs_state){
        .cos = ag_retain(cos_t), .sin = ag_retain(sin_t), .B = B, .T = T, .heads = nh, .head_dim = hd};
    return y;
}
