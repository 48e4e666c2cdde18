// moe_experts_stacked: gpt_oss's experts (transformers' GptOssExperts) as one grouped dispatch:
// the weights stacked along the experts, gate_up [E, H, 2I] (gate and up interleaved: columns
// 0, 2, 4, .. the gate, 1, 3, 5, .. the up), down [E, Im, H], each with a bias, and the clamped
// SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit), m = (u + 1) g sigmoid(alpha g).
// The node keeps each pair's gate_up output and recomputes the rest in backward.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"
#include "kernels/ag_moe.h"

// m[c, Im] of gu[c, 2I], the clamped SwiGLU.
static void glu_forward(ag_buf m, ag_buf gu, int64_t c, int64_t Im, const ag_moe_glu *f) {
    float gb[2 * Im], ob[Im];
    for (int64_t i = 0; i < c; i++) {
        const float *x = ag_rd(gu, i * 2 * Im, 2 * Im, gb);
        float *o = ag_wr(m, i * Im, ob);
        for (int64_t j = 0; j < Im; j++) {
            float g = fminf(x[2 * j], f->limit), u = fmaxf(fminf(x[2 * j + 1], f->limit), -f->limit);
            o[j] = (u + 1.0f) * (g / (1.0f + expf(-f->alpha * g)));
        }
        ag_wr_end(m, i * Im, Im, o);
    }
}

// dgu[c, 2I] from dm[c, Im] and gu: clamp passes the gradient where its input is within bounds
// (bounds included, as torch.clamp's backward).
static void glu_backward(ag_buf dgu, ag_buf dm, ag_buf gu, int64_t c, int64_t Im, const ag_moe_glu *f) {
    float gb[2 * Im], db[Im], ob[2 * Im];
    for (int64_t i = 0; i < c; i++) {
        const float *x = ag_rd(gu, i * 2 * Im, 2 * Im, gb), *d = ag_rd(dm, i * Im, Im, db);
        float *o = ag_wr(dgu, i * 2 * Im, ob);
        for (int64_t j = 0; j < Im; j++) {
            float gx = x[2 * j], ux = x[2 * j + 1];
            float g = fminf(gx, f->limit), u = fmaxf(fminf(ux, f->limit), -f->limit);
            float s = 1.0f / (1.0f + expf(-f->alpha * g));
            o[2 * j] = gx <= f->limit ? d[j] * (u + 1.0f) * (s + f->alpha * g * s * (1.0f - s)) : 0.0f;
            o[2 * j + 1] = ux >= -f->limit && ux <= f->limit ? d[j] * g * s : 0.0f;
        }
        ag_wr_end(dgu, i * 2 * Im, 2 * Im, o);
    }
}

typedef struct {
    ag_tensor *gu_w, *gu_b, *d_w, *d_b; // stacked weights and biases (biases may be NULL)
    int64_t H, Im;
} stacked;

static ag_buf slice(const ag_tensor *t, int e, int64_t per) { return ag_buf_at(ag_buf_of(t), e * per); }

// Expert e's rows: GU = xp Wgu + bgu (kept), M, Y = M Wd + bd.
static bool expert_forward(const stacked *w, int e, int64_t c, ag_buf xp, ag_buf GU, ag_buf M, ag_buf Y,
                           const ag_moe_glu *f) {
    const int64_t H = w->H, Im = w->Im;
    if (!ag_gemm_buf(CblasNoTrans, CblasNoTrans, c, 2 * Im, H, 1.0f, xp, H, slice(w->gu_w, e, H * 2 * Im), 2 * Im, 0.0f,
                     GU, 2 * Im))
        return false;
    if (w->gu_b) ag_linear_bias_forward(GU, slice(w->gu_b, e, 2 * Im), c, 2 * Im);
    glu_forward(M, GU, c, Im, f);
    if (!ag_gemm_buf(CblasNoTrans, CblasNoTrans, c, H, Im, 1.0f, M, Im, slice(w->d_w, e, Im * H), H, 0.0f, Y, H))
        return false;
    if (w->d_b) ag_linear_bias_forward(Y, slice(w->d_b, e, H), c, H);
    return true;
}

// ------------------------------------------------------------------------------------------------
// Backward

// The gradient of stacked input i (zeroed first when fresh: experts without tokens get zeros, as
// the whole parameter's gradient does in PyTorch); .needed false when none is wanted.
static bool stacked_grad(ag_ctx *ctx, ag_node *n, int i, const ag_tensor *t, ag_grad_dst *d) {
    if (!ag_grad_get(ctx, n, i, d)) return false;
    if (d->needed && d->fresh && d->data) memset(d->data, 0, (size_t)t->numel * (d->dtype == AG_F32 ? 4 : 2));
    return true;
}

typedef struct {
    ag_grad_dst dgw, dgb, ddw, ddb;
} stacked_grads;

// dy rows of expert e (scaled by their weights in place), dw of each pair, and the weights'
// gradients; dxp its rows' input gradient.
static bool expert_backward(const ag_moe_stacked_state *st, const stacked *w, const stacked_grads *g,
                            const ag_moe_groups *grp, int e, ag_buf xp, ag_buf dyp, ag_buf M, ag_buf dM, ag_buf dGU,
                            ag_buf dxp, float *dw, const ag_moe_glu *f) {
    const int64_t o = grp->off[e], c = grp->off[e + 1] - o, H = w->H, Im = w->Im;
    ag_buf xe = ag_buf_at(xp, o * H), de = ag_buf_at(dyp, o * H), me = ag_buf_at(M, o * Im),
           dme = ag_buf_at(dM, o * Im), gue = ag_buf_at(ag_buf_of(st->gu), o * 2 * Im),
           dgue = ag_buf_at(dGU, o * 2 * Im), dxe = ag_buf_at(dxp, o * H);
    glu_forward(me, gue, c, Im, f);
    // the weight's gradient <dy, M Wd + bd> = <dy Wdᵀ, M> + <dy, bd>; dM unscaled first
    if (!ag_gemm_buf(CblasNoTrans, CblasTrans, c, Im, H, 1.0f, de, H, slice(w->d_w, e, Im * H), H, 0.0f, dme, Im))
        return false;
    float mb[Im], db[Im], yb[H], bb[H];
    const float *bd = w->d_b ? ag_rd(slice(w->d_b, e, H), 0, H, bb) : NULL;
    for (int64_t i = 0; i < c; i++) {
        int64_t p = grp->pair[o + i];
        float wt = ag_get(st->w->data, st->w->dtype, p);
        const float *m = ag_rd(me, i * Im, Im, mb);
        float *d = ag_rw(dme, i * Im, Im, db), *dy = ag_rw(de, i * H, H, yb);
        double dot = 0.0;
        for (int64_t j = 0; j < Im; j++) dot += (double)d[j] * m[j], d[j] *= wt;
        for (int64_t h = 0; bd && h < H; h++) dot += (double)dy[h] * bd[h];
        for (int64_t h = 0; h < H; h++) dy[h] *= wt;
        ag_wr_end(dme, i * Im, Im, d);
        ag_wr_end(de, i * H, H, dy);
        if (dw) dw[p] = (float)dot;
    }
    bool ok = true;
    if (g->ddw.needed) // dWd[Im, H] += Mᵀ (w dy)
        ok = ag_gemm_buf(CblasTrans, CblasNoTrans, Im, H, c, 1.0f, me, Im, de, H, 1.0f,
                         ag_buf_at(ag_dst_buf(&g->ddw), e * Im * H), H);
    if (g->ddb.needed) ag_linear_bias_backward(ag_buf_at(ag_dst_buf(&g->ddb), e * H), false, de, c, H);
    glu_backward(dgue, dme, gue, c, Im, f);
    if (ok && g->dgw.needed) // dWgu[H, 2I] += xpᵀ dGU
        ok = ag_gemm_buf(CblasTrans, CblasNoTrans, H, 2 * Im, c, 1.0f, xe, H, dgue, 2 * Im, 1.0f,
                         ag_buf_at(ag_dst_buf(&g->dgw), e * H * 2 * Im), 2 * Im);
    if (g->dgb.needed) ag_linear_bias_backward(ag_buf_at(ag_dst_buf(&g->dgb), e * 2 * Im), false, dgue, c, 2 * Im);
    // dx = dGU Wguᵀ
    return ok && ag_gemm_buf(CblasNoTrans, CblasTrans, c, H, 2 * Im, 1.0f, dgue, 2 * Im, slice(w->gu_w, e, H * 2 * Im),
                             2 * Im, 0.0f, dxe, H);
}

static void stacked_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_moe_stacked_state *st = &n->state.moe_stacked;
    const int64_t N = st->N, H = st->H, Im = st->inter, Nk = N * st->k;
    const char *base = mp_site_name(n->site);
    const stacked w = {st->gu_w, st->gu_b, st->d_w, st->d_b, H, Im};
    ag_moe_routing r = {.tokens = N, .k = st->k, .experts = st->E, .expert = st->sel, .count = st->count};
    ag_moe_groups grp;
    if (!ag_moe_group(&r, &grp)) {
        ag_fail(ctx, AG_ERR_NOMEM, "moe_experts %s backward: out of memory", base);
        return;
    }
    stacked_grads g = {0};
    ag_moe_scratch xp, dyp, M, dM, dGU, dxp;
    float *dw = mp_is_meta() ? NULL : calloc((size_t)Nk, sizeof *dw);
    const int di = st->gu_b ? 4 : 3; // the inputs: x, w, gate_up, its bias, down, its bias
    bool ok = (mp_is_meta() || dw) && stacked_grad(ctx, n, 2, st->gu_w, &g.dgw) &&
              (!st->gu_b || stacked_grad(ctx, n, 3, st->gu_b, &g.dgb)) && stacked_grad(ctx, n, di, st->d_w, &g.ddw) &&
              (!st->d_b || stacked_grad(ctx, n, di + 1, st->d_b, &g.ddb)) &&
              ag_moe_scratch_new(ctx, &xp, base, "gathered", Nk * H) &&
              ag_moe_scratch_new(ctx, &dyp, base, "grad_gathered", Nk * H) &&
              ag_moe_scratch_new(ctx, &M, base, "product", Nk * Im) &&
              ag_moe_scratch_new(ctx, &dM, base, "grad_product", Nk * Im) &&
              ag_moe_scratch_new(ctx, &dGU, base, "grad_gate_up", Nk * 2 * Im) &&
              ag_moe_scratch_new(ctx, &dxp, base, "grad_input", Nk * H);
    if (ok && !mp_is_meta()) {
        ag_moe_gather(xp.v, ag_buf_of(st->x), grp.pair, Nk, st->k, H);
        ag_moe_gather(dyp.v, (ag_buf){(void *)dout, n->grad_dtype}, grp.pair, Nk, st->k, H);
        for (int e = 0; ok && e < st->E; e++)
            if (st->count[e] > 0)
                ok = expert_backward(st, &w, &g, &grp, e, xp.v, dyp.v, M.v, dM.v, dGU.v, dxp.v, dw, &st->glu);
        if (!ok) ag_fail(ctx, AG_ERR_NOMEM, "moe_experts %s backward: out of memory for a conversion", base);
    }
    ag_grad_dst dx, dwd;
    if (ok && ag_grad_get(ctx, n, 0, &dx) && dx.needed && !mp_is_meta())
        ag_moe_scatter_add(ag_dst_buf(&dx), dx.fresh, dxp.v, &grp, N, st->k, H);
    if (ok && ag_grad_get(ctx, n, 1, &dwd) && dwd.needed && dw)
        for (int64_t p = 0; p < Nk; p++)
            ag_set(dwd.data, dwd.dtype, p, dwd.fresh ? dw[p] : ag_get(dwd.data, dwd.dtype, p) + dw[p]);
    free(dw);
    mp_free(&xp.b), mp_free(&dyp.b), mp_free(&M.b), mp_free(&dM.b), mp_free(&dGU.b), mp_free(&dxp.b);
    ag_moe_groups_free(&grp);
}

static void stacked_release(ag_op_state *s) {
    ag_moe_stacked_state *st = &s->moe_stacked;
    free(st->sel);
    free(st->count);
}

static const ag_op stacked_op = {.name = "moe_experts_stacked",
                                 .backward = stacked_backward,
                                 .nsaved = AG_NSAVED(moe_stacked),
                                 .release = stacked_release};

// ------------------------------------------------------------------------------------------------
// Forward

static bool shapes_fit(ag_ctx *ctx, const ag_site *s, const ag_tensor *x, const ag_tensor *w, const ag_moe_routing *r,
                       const stacked *ws) {
    const int64_t H = x->shape[x->ndim - 1], N = x->numel / H, Im = ws->Im;
    const int E = r ? r->experts : 0;
    const ag_tensor *gw = ws->gu_w, *gb = ws->gu_b, *dw = ws->d_w, *db = ws->d_b;
    bool ok = r && r->count && r->tokens == N && w->numel == N * r->k && E >= 1 && gw->ndim == 3 && gw->shape[0] == E &&
              gw->shape[1] == H && gw->shape[2] == 2 * Im && dw->ndim == 3 && dw->shape[0] == E && dw->shape[1] == Im &&
              dw->shape[2] == H && (!gb || gb->numel == E * 2 * Im) && (!db || db->numel == E * H);
    if (!ok)
        ag_fail(ctx, AG_ERR_SHAPE,
                "moe_experts %s: x [%lld, %lld], w %lld elements, a routing of %lld tokens x %d over %d experts: "
                "expected gate_up [%d, %lld, 2 x intermediate], down [%d, intermediate, %lld], biases [%d, ..]",
                s->base, (long long)N, (long long)H, (long long)w->numel, r ? (long long)r->tokens : 0LL, r ? r->k : 0,
                E, E, (long long)H, E, (long long)H, E);
    return ok;
}

ag_tensor *ag_moe_experts_stacked(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, const ag_moe_routing *r,
                                  ag_tensor *gate_up, ag_tensor *gate_up_bias, ag_tensor *down, ag_tensor *down_bias,
                                  const ag_moe_glu *glu) {
    ag_tensor *ins[6] = {x, w, gate_up, down};
    if (!ag_check_inputs(ctx, "moe_experts", site, 4, ins, (const char *[]){"x", "w", "gate_up", "down"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!glu || AG_FW(ctx->fw, moe) != AG_MOE_GROUPED) {
        ag_fail(ctx, AG_ERR_ARG,
                "moe_experts %s: stacked experts run as the lean framework's grouped dispatch only (transformers' "
                "GptOssExperts loop is not modelled)",
                s.base);
        return NULL;
    }
    const stacked ws = {gate_up, gate_up_bias, down, down_bias, x->shape[x->ndim - 1], down->shape[1]};
    if (!shapes_fit(ctx, &s, x, w, r, &ws)) return NULL;
    int nin = 2;
    ins[nin++] = gate_up;
    if (gate_up_bias) ins[nin++] = gate_up_bias;
    ins[nin++] = down;
    if (down_bias) ins[nin++] = down_bias;
    const int E = r->experts, k = r->k;
    const int64_t H = ws.H, Im = ws.Im, N = x->numel / H, Nk = N * k;
    ag_moe_groups g;
    if (!ag_moe_group(r, &g)) {
        ag_fail(ctx, AG_ERR_NOMEM, "moe_experts %s: out of memory", s.base);
        return NULL;
    }
    char l[AG_LABEL_MAX];
    ag_label(l, s.base, "gate_up_out");
    ag_tensor *y = ag_tensor_like(ctx, x, MP_ACTIVATION, s.out);
    ag_tensor *GU = y ? ag_tensor_new(ctx, 2, (int64_t[]){Nk, 2 * Im}, MP_ACTIVATION, l) : NULL;
    ag_moe_scratch xp = {0}, M = {0}, Y = {0};
    bool ok = GU && ag_moe_scratch_new(ctx, &xp, s.base, "gathered", Nk * H) &&
              ag_moe_scratch_new(ctx, &M, s.base, "product", Nk * Im) &&
              ag_moe_scratch_new(ctx, &Y, s.base, "expert_out", Nk * H);
    if (ok && !mp_is_meta()) {
        ag_moe_gather(xp.v, ag_buf_of(x), g.pair, Nk, k, H);
        for (int e = 0; ok && e < E; e++) {
            const int64_t o = g.off[e], c = g.off[e + 1] - o;
            if (c > 0)
                ok = expert_forward(&ws, e, c, ag_buf_at(xp.v, o * H), ag_buf_at(ag_buf_of(GU), o * 2 * Im),
                                    ag_buf_at(M.v, o * Im), ag_buf_at(Y.v, o * H), glu);
        }
        if (ok) ag_moe_combine(ag_buf_of(y), Y.v, ag_buf_of(w), &g, E, N, k, H);
        if (!ok) ag_fail(ctx, AG_ERR_NOMEM, "moe_experts %s: out of memory for a conversion", s.base);
    }
    mp_free(&xp.b), mp_free(&M.b), mp_free(&Y.b);
    ag_moe_groups_free(&g);
    ag_node *n = ok && ag_any_needs_grad(ctx, nin, ins) ? ag_record(ctx, &stacked_op, s.base, y, nin, ins) : NULL;
    if (n) {
        ag_moe_stacked_state *st = &n->state.moe_stacked;
        *st = (ag_moe_stacked_state){.x = ag_retain(x),
                                     .w = ag_retain(w),
                                     .gu = GU,
                                     .gu_w = ag_retain(gate_up),
                                     .gu_b = ag_retain(gate_up_bias),
                                     .d_w = ag_retain(down),
                                     .d_b = ag_retain(down_bias),
                                     .N = N,
                                     .H = H,
                                     .inter = Im,
                                     .E = E,
                                     .k = k,
                                     .glu = *glu};
        st->count = malloc((size_t)E * sizeof *st->count);
        st->sel = r->expert ? malloc((size_t)Nk * sizeof *st->sel) : NULL;
        if (!st->count || (r->expert && !st->sel)) {
            ag_fail(ctx, AG_ERR_NOMEM, "moe_experts %s: out of memory", s.base);
            ag_release(y);
            return NULL;
        }
        memcpy(st->count, r->count, (size_t)E * sizeof *st->count);
        if (st->sel) memcpy(st->sel, r->expert, (size_t)Nk * sizeof *st->sel);
        return y;
    }
    ag_release(GU);
    if (ok && ctx->status == AG_OK) return y;
    ag_release(y);
    return NULL;
}
