// moe_experts: the routed experts' SwiGLU as one grouped dispatch (LEAN): the (token, choice)
// pairs sorted by expert, one product per expert and projection over its rows, the outputs
// scaled by the routing weights and summed into their tokens' rows. The node keeps each pair's
// gate and up outputs; backward gathers the inputs again and recomputes the product.
// Under the PyTorch frameworks ag_moe_experts is transformers' eager loop (moe_eager.c).
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"
#include "kernels/ag_moe.h"

// m = silu(g) * u over n elements (the SwiGLU product).
static void swiglu(ag_buf m, ag_buf g, ag_buf u, int64_t n) {
    float gb[AG_BLK], ub[AG_BLK], ob[AG_BLK];
    for (int64_t i = 0; i < n; i += AG_BLK) {
        int64_t c = n - i < AG_BLK ? n - i : AG_BLK;
        const float *gv = ag_rd(g, i, c, gb), *uv = ag_rd(u, i, c, ub);
        float *o = ag_wr(m, i, ob);
        for (int64_t j = 0; j < c; j++) o[j] = gv[j] / (1.0f + expf(-gv[j])) * uv[j];
        ag_wr_end(m, i, c, o);
    }
}

// One expert's rows [c, in] through w [out, in] into y [c, out] (beta 0), or y (+)= x · w.
static bool product(ag_buf y, ag_buf x, const ag_tensor *w, int64_t c, bool trans_w, float beta) {
    int64_t out = w->shape[0], in = w->shape[1];
    if (ag_type_traits_of(w->dtype)->quantised) // a quantised base: its rows dequantised a tile at a time
        return trans_w ? beta == 0.0f && ag_qgemm_tiles(y, x, w, c) : ag_qgemm_tiles_dx(y, beta == 0.0f, x, w, c);
    if (trans_w) return ag_gemm_buf(CblasNoTrans, CblasTrans, c, out, in, 1.0f, x, in, ag_buf_of(w), in, beta, y, out);
    return ag_gemm_buf(CblasNoTrans, CblasNoTrans, c, in, out, 1.0f, x, out, ag_buf_of(w), in, beta, y, in);
}

typedef struct {
    ag_tensor *const *gate, *const *up, *const *down;
    const ag_moe_groups *g;
    int64_t H, inter;
} experts_ref;

// The forward's products over every expert's rows: G, U (kept), M, Y.
static bool forward_products(const experts_ref *x, ag_buf xp, ag_buf G, ag_buf U, ag_buf M, ag_buf Y, int E) {
    bool ok = true;
    for (int e = 0; ok && e < E; e++) {
        int64_t o = x->g->off[e], c = x->g->off[e + 1] - o;
        if (c == 0) continue;
        ok = product(ag_buf_at(G, o * x->inter), ag_buf_at(xp, o * x->H), x->gate[e], c, true, 0.0f) &&
             product(ag_buf_at(U, o * x->inter), ag_buf_at(xp, o * x->H), x->up[e], c, true, 0.0f);
        if (!ok) break;
        swiglu(ag_buf_at(M, o * x->inter), ag_buf_at(G, o * x->inter), ag_buf_at(U, o * x->inter), c * x->inter);
        ok = product(ag_buf_at(Y, o * x->H), ag_buf_at(M, o * x->inter), x->down[e], c, true, 0.0f);
    }
    return ok;
}

// ------------------------------------------------------------------------------------------------
// Backward

typedef struct {
    ag_ctx *ctx;
    ag_node *n;
    const ag_moe_experts_state *st;
    const ag_moe_groups *g;
    ag_buf dy;
} back_ctx;

// The gradient buffer of input i when it wants one; NULL data in meta mode. false: an error.
static bool grad_of(back_ctx *b, int i, ag_grad_dst *d) { return ag_grad_get(b->ctx, b->n, i, d); }

static void expert_backward(back_ctx *b, int e, ag_buf xp, ag_buf dyp, ag_buf M, ag_buf dM, ag_buf dU, ag_buf dxp,
                            float *dw) {
    const ag_moe_experts_state *st = b->st;
    const int64_t o = b->g->off[e], c = b->g->off[e + 1] - o, H = st->H, Im = st->inter, E = st->E;
    ag_tensor *const *W = st->weights;
    ag_grad_dst dg, du, dd;
    if (!grad_of(b, 2 + (int)e, &dg) || !grad_of(b, 2 + (int)(E + e), &du) || !grad_of(b, 2 + (int)(2 * E + e), &dd))
        return;
    if (mp_is_meta()) return;
    ag_buf Gs = ag_buf_at(ag_buf_of(st->g), o * Im), Us = ag_buf_at(ag_buf_of(st->u), o * Im);
    ag_buf xe = ag_buf_at(xp, o * H), de = ag_buf_at(dyp, o * H), me = ag_buf_at(M, o * Im),
           dme = ag_buf_at(dM, o * Im), due = ag_buf_at(dU, o * Im), dxe = ag_buf_at(dxp, o * H);
    // dM unscaled = dy · Wd; the weight's gradient <dy, Y> = <dM unscaled, M>; then dM = w dM
    product(dme, de, W[2 * E + e], c, false, 0.0f);
    float mb[Im], db[Im], gb[Im], ub[Im], yb[H];
    for (int64_t i = 0; i < c; i++) {
        int64_t p = b->g->pair[o + i];
        float wt = ag_get(st->w->data, st->w->dtype, p);
        const float *m = ag_rd(me, i * Im, Im, mb);
        float *d = ag_rw(dme, i * Im, Im, db);
        double dot = 0.0;
        for (int64_t j = 0; j < Im; j++) dot += (double)d[j] * m[j], d[j] *= wt;
        ag_wr_end(dme, i * Im, Im, d);
        if (dw) dw[p] = (float)dot;
        float *ds = ag_rw(de, i * H, H, yb); // dy scaled by the weight, for down's gradient
        for (int64_t h = 0; h < H; h++) ds[h] *= wt;
        ag_wr_end(de, i * H, H, ds);
    }
    if (dd.needed) // dWd[H, Im] (+)= (w dy)ᵀ · M
        ag_gemm_buf(CblasTrans, CblasNoTrans, H, Im, c, 1.0f, de, H, me, Im, dd.fresh ? 0.0f : 1.0f, ag_dst_buf(&dd),
                    Im);
    for (int64_t i = 0; i < c; i++) { // dG = dM u silu'(g) (into dM), dU = dM silu(g)
        const float *g = ag_rd(Gs, i * Im, Im, gb), *u = ag_rd(Us, i * Im, Im, ub);
        float *d = ag_rw(dme, i * Im, Im, db), *du_ = ag_wr(due, i * Im, mb);
        for (int64_t j = 0; j < Im; j++) {
            float s = 1.0f / (1.0f + expf(-g[j]));
            du_[j] = d[j] * g[j] * s;
            d[j] = d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
        }
        ag_wr_end(dme, i * Im, Im, d);
        ag_wr_end(due, i * Im, Im, du_);
    }
    if (dg.needed) // dWg[Im, H] (+)= dGᵀ · x
        ag_gemm_buf(CblasTrans, CblasNoTrans, Im, H, c, 1.0f, dme, Im, xe, H, dg.fresh ? 0.0f : 1.0f, ag_dst_buf(&dg),
                    H);
    if (du.needed)
        ag_gemm_buf(CblasTrans, CblasNoTrans, Im, H, c, 1.0f, due, Im, xe, H, du.fresh ? 0.0f : 1.0f, ag_dst_buf(&du),
                    H);
    product(dxe, dme, W[e], c, false, 0.0f); // dx = dG · Wg + dU · Wu
    product(dxe, due, W[E + e], c, false, 1.0f);
}

static void experts_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_moe_experts_state *st = &n->state.moe_experts;
    const int64_t N = st->N, H = st->H, Im = st->inter, Nk = N * st->k;
    const char *base = mp_site_name(n->site);
    ag_moe_routing r = {.tokens = N, .k = st->k, .experts = st->E, .expert = st->sel, .count = st->count};
    ag_moe_groups g;
    if (!ag_moe_group(&r, &g)) {
        ag_fail(ctx, AG_ERR_NOMEM, "moe_experts %s backward: out of memory", base);
        return;
    }
    ag_moe_scratch xp, dyp, M, dM, dU, dxp;
    float *dw = mp_is_meta() ? NULL : calloc((size_t)Nk, sizeof *dw);
    bool ok = (mp_is_meta() || dw) && ag_moe_scratch_new(ctx, &xp, base, "gathered", Nk * H) &&
              ag_moe_scratch_new(ctx, &dyp, base, "grad_gathered", Nk * H) &&
              ag_moe_scratch_new(ctx, &M, base, "product", Nk * Im) &&
              ag_moe_scratch_new(ctx, &dM, base, "grad_product", Nk * Im) &&
              ag_moe_scratch_new(ctx, &dU, base, "grad_up", Nk * Im) &&
              ag_moe_scratch_new(ctx, &dxp, base, "grad_input", Nk * H);
    if (ok && !mp_is_meta()) {
        ag_moe_gather(xp.v, ag_buf_of(st->x), g.pair, Nk, st->k, H);
        ag_moe_gather(dyp.v, (ag_buf){(void *)dout, n->grad_dtype}, g.pair, Nk, st->k, H);
        swiglu(M.v, ag_buf_of(st->g), ag_buf_of(st->u), Nk * Im);
    }
    back_ctx b = {ctx, n, st, &g, {(void *)dout, n->grad_dtype}};
    for (int e = 0; ok && e < st->E; e++)
        if (st->count[e] > 0) expert_backward(&b, e, xp.v, dyp.v, M.v, dM.v, dU.v, dxp.v, dw);
    ag_grad_dst dx, dwd;
    if (ok && ag_grad_get(ctx, n, 0, &dx) && dx.needed && !mp_is_meta())
        ag_moe_scatter_add(ag_dst_buf(&dx), dx.fresh, dxp.v, &g, N, st->k, H);
    if (ok && ag_grad_get(ctx, n, 1, &dwd) && dwd.needed && dw)
        for (int64_t p = 0; p < Nk; p++)
            ag_set(dwd.data, dwd.dtype, p, dwd.fresh ? dw[p] : ag_get(dwd.data, dwd.dtype, p) + dw[p]);
    free(dw);
    mp_free(&xp.b), mp_free(&dyp.b), mp_free(&M.b), mp_free(&dM.b), mp_free(&dU.b), mp_free(&dxp.b);
    ag_moe_groups_free(&g);
}

static void experts_release(ag_op_state *s) {
    ag_moe_experts_state *st = &s->moe_experts;
    for (int i = 0; st->weights && i < 3 * st->E; i++) ag_release(st->weights[i]);
    free(st->weights);
    free(st->sel);
    free(st->count);
}

static const ag_op experts_op = {
    .name = "moe_experts", .backward = experts_backward, .nsaved = AG_NSAVED(moe_experts), .release = experts_release};

// The node's state: x, w, the kept G and U, the weights and the routing, copied.
static bool keep_state(ag_ctx *ctx, const char *base, ag_moe_experts_state *st, ag_tensor *x, ag_tensor *w,
                       const ag_moe_routing *r, ag_tensor *const *W[3], ag_tensor *G, ag_tensor *U) {
    const int E = r->experts;
    st->weights = calloc((size_t)(3 * E), sizeof *st->weights);
    st->count = malloc((size_t)E * sizeof *st->count);
    st->sel = r->expert ? malloc((size_t)(r->tokens * r->k) * sizeof *st->sel) : NULL;
    if (!st->weights || !st->count || (r->expert && !st->sel))
        return ag_fail(ctx, AG_ERR_NOMEM, "moe_experts %s: out of memory", base);
    for (int p = 0; p < 3; p++)
        for (int e = 0; e < E; e++) st->weights[p * E + e] = ag_retain(W[p][e]);
    memcpy(st->count, r->count, (size_t)E * sizeof *st->count);
    if (st->sel) memcpy(st->sel, r->expert, (size_t)(r->tokens * r->k) * sizeof *st->sel);
    st->x = ag_retain(x), st->w = ag_retain(w), st->g = G, st->u = U;
    return true;
}

// The inputs the node records: x, w, then every gate, up and down weight.
static ag_tensor **inputs_of(ag_tensor *x, ag_tensor *w, ag_tensor *const *W[3], int E) {
    ag_tensor **ins = malloc((size_t)(2 + 3 * E) * sizeof *ins);
    if (!ins) return NULL;
    ins[0] = x, ins[1] = w;
    for (int p = 0; p < 3; p++) memcpy(ins + 2 + p * E, W[p], (size_t)E * sizeof *ins);
    return ins;
}

// The experts' weights fit x [.., H]: gate and up [Im, H], down [H, Im], one Im for all.
static bool weights_fit(ag_ctx *ctx, const char *base, int64_t H, ag_tensor *const *W[3], int E, int64_t *Im) {
    *Im = W[0][0] ? W[0][0]->shape[0] : 0;
    for (int e = 0; e < E; e++) {
        const ag_tensor *g = W[0][e], *u = W[1][e], *d = W[2][e];
        if (!g || !u || !d || g->ndim != 2 || u->ndim != 2 || d->ndim != 2 || g->shape[0] != *Im || g->shape[1] != H ||
            u->shape[0] != *Im || u->shape[1] != H || d->shape[0] != H || d->shape[1] != *Im)
            return ag_fail(ctx, AG_ERR_SHAPE,
                           "moe_experts %s: expert %d's weights must be gate and up [%lld, %lld], down [%lld, %lld]",
                           base, e, (long long)*Im, (long long)H, (long long)H, (long long)*Im);
    }
    return true;
}

static bool experts_check(ag_ctx *ctx, const ag_site *s, ag_tensor *x, ag_tensor *w, const ag_moe_routing *r,
                          ag_tensor *const *W[3], int64_t *Im) {
    const int64_t H = x->shape[x->ndim - 1], N = x->numel / H;
    if (!r || !r->count || r->tokens != N || w->numel != N * r->k || r->experts < 1)
        return ag_fail(ctx, AG_ERR_SHAPE,
                       "moe_experts %s: x has %lld rows, w %lld elements, the routing %lld tokens x %d", s->base,
                       (long long)N, (long long)w->numel, r ? (long long)r->tokens : 0LL, r ? r->k : 0);
    return weights_fit(ctx, s->base, H, W, r->experts, Im);
}

static ag_tensor *lean_experts(ag_ctx *ctx, const ag_site *s, ag_tensor *x, ag_tensor *w, const ag_moe_routing *r,
                               ag_tensor *const *W[3], int64_t Im) {
    const int E = r->experts, k = r->k;
    const int64_t H = x->shape[x->ndim - 1], N = x->numel / H, Nk = N * k;
    ag_moe_groups g;
    if (!ag_moe_group(r, &g)) {
        ag_fail(ctx, AG_ERR_NOMEM, "moe_experts %s: out of memory", s->base);
        return NULL;
    }
    char l[AG_LABEL_MAX];
    ag_tensor *y = ag_tensor_like(ctx, x, MP_ACTIVATION, s->out), *G = NULL, *U = NULL;
    ag_moe_scratch xp = {0}, M = {0}, Y = {0};
    ag_label(l, s->base, "gate_out");
    if (y) G = ag_tensor_new(ctx, 2, (int64_t[]){Nk, Im}, MP_ACTIVATION, l);
    ag_label(l, s->base, "up_out");
    if (G) U = ag_tensor_new(ctx, 2, (int64_t[]){Nk, Im}, MP_ACTIVATION, l);
    bool ok = U && ag_moe_scratch_new(ctx, &xp, s->base, "gathered", Nk * H) &&
              ag_moe_scratch_new(ctx, &M, s->base, "product", Nk * Im) &&
              ag_moe_scratch_new(ctx, &Y, s->base, "expert_out", Nk * H);
    if (ok && !mp_is_meta()) {
        ag_moe_gather(xp.v, ag_buf_of(x), g.pair, Nk, k, H);
        experts_ref ref = {W[0], W[1], W[2], &g, H, Im};
        ok = forward_products(&ref, xp.v, ag_buf_of(G), ag_buf_of(U), M.v, Y.v, E);
        if (ok) ag_moe_combine(ag_buf_of(y), Y.v, ag_buf_of(w), &g, E, N, k, H);
        if (!ok) ag_fail(ctx, AG_ERR_NOMEM, "moe_experts %s: out of memory for a conversion", s->base);
    }
    mp_free(&xp.b), mp_free(&M.b), mp_free(&Y.b);
    ag_moe_groups_free(&g);
    ag_tensor **ins = ok ? inputs_of(x, w, W, E) : NULL;
    ag_node *n =
        ins && ag_any_needs_grad(ctx, 2 + 3 * E, ins) ? ag_record(ctx, &experts_op, s->base, y, 2 + 3 * E, ins) : NULL;
    free(ins);
    if (n) {
        ag_moe_experts_state *st = &n->state.moe_experts;
        *st = (ag_moe_experts_state){.N = N, .H = H, .inter = Im, .E = E, .k = k};
        if (keep_state(ctx, s->base, st, x, w, r, W, G, U)) return y;
        ag_release(y);
        return NULL;
    }
    ag_release(G), ag_release(U);
    if (ok && ctx->status == AG_OK) return y;
    ag_release(y);
    return NULL;
}

ag_tensor *ag_moe_experts(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, const ag_moe_routing *r,
                          ag_tensor *const *gate, ag_tensor *const *up, ag_tensor *const *down,
                          const ag_moe_eager *hf) {
    ag_tensor *ins[] = {x, w};
    if (!ag_check_inputs(ctx, "moe_experts", site, 2, ins, (const char *[]){"x", "w"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    ag_tensor *const *W[3] = {gate, up, down};
    int64_t Im = 0;
    if (!gate || !up || !down) {
        ag_fail(ctx, AG_ERR_ARG, "moe_experts %s: the experts' weights are NULL", s.base);
        return NULL;
    }
    if (!experts_check(ctx, &s, x, w, r, W, &Im)) return NULL;
    if (AG_FW(ctx->fw, moe) == AG_MOE_HF_EAGER) return ag_moe_eager_experts(ctx, &s, x, w, r, W, hf);
    return lean_experts(ctx, &s, x, w, r, W, Im);
}
