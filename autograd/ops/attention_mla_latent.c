// attention_mla_latent: DeepSeek-V3's latent attention over its compressed cache, as DeepSeek's own
// inference computes it with kv_b_proj absorbed: the cache holds, a token, the normed compressed kv
// c (kv_lora_rank) and the rotated k_pe (qk_rope); kv_b_proj's rows of head h are W_UK[h]
// (qk_nope x kv_lora_rank) then W_UV[h] (v_head x kv_lora_rank).
//   q_abs = q_nope W_UK          [B, Tq, H, kv_lora]   (a temporary)
//   S_j = scale (q_abs . c_j + q_pe . k_pe_j), P = softmax(S) (causal, masked)
//   o_lat = sum_j P_j c_j        [B, Tq, H, kv_lora]   (a temporary)
//   out = o_lat W_UVᵀ            [B, Tq, H*v_head]
// which equals attention over kv_b_proj's expanded keys and values. Eager, lean, inference only.
#include <math.h>

#include "ag_ops.h"

// Token j's cached row (c_j then k_pe_j) as a buffer into its chunk.
static ag_buf latent_row(const ag_kv_cache *c, int64_t b, int64_t j) {
    for (size_t i = 0; i < c->n; i++) {
        const kv_chunk *ch = &c->chunks[i];
        if (j < ch->t) return ag_buf_at((ag_buf){ch->k.data, c->t}, (b * ch->t + j) * c->D);
        j -= ch->t;
    }
    return (ag_buf){NULL, c->t};
}

typedef struct {
    int H, nope, R, Dv, Lk;
    float scale;
    const int32_t *mask;
    int64_t ld;
} latent_dims;

// One query (b, i) of head h: its scores into p [tokens], the output row into out.
static void latent_query(const latent_dims *d, const ag_tensor *qn, const ag_tensor *qp, const ag_tensor *w,
                         const ag_kv_cache *c, int64_t b, int64_t i, int h, float *p, double *qa, double *ol,
                         ag_tensor *out) {
    const int64_t Tq = qn->shape[1], Tk = c->tokens, seen = Tk - Tq + i + 1, row = (int64_t)d->nope + d->Dv;
    const int64_t qo = (b * Tq + i) * d->H;
    for (int l = 0; l < d->Lk; l++) qa[l] = 0.0;
    for (int e = 0; e < d->nope; e++) {
        const double q = ag_get(qn->data, qn->dtype, (qo + h) * d->nope + e);
        for (int l = 0; l < d->Lk; l++) qa[l] += q * ag_get(w->data, w->dtype, ((int64_t)h * row + e) * d->Lk + l);
    }
    float rb[d->Lk + d->R];
    float mx = -INFINITY;
    for (int64_t j = 0; j < Tk; j++) {
        p[j] = -INFINITY;
        if (j >= seen || (d->mask && !d->mask[b * d->ld + j])) continue;
        const float *cj = ag_rd(latent_row(c, b, j), 0, d->Lk + d->R, rb);
        double s = 0.0;
        for (int l = 0; l < d->Lk; l++) s += qa[l] * cj[l];
        for (int r = 0; r < d->R; r++) s += (double)ag_get(qp->data, qp->dtype, (qo + h) * d->R + r) * cj[d->Lk + r];
        p[j] = (float)s * d->scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    double z = 0.0;
    for (int64_t j = 0; j < Tk; j++) z += (p[j] = mx == -INFINITY || p[j] == -INFINITY ? 0.0f : expf(p[j] - mx));
    for (int l = 0; l < d->Lk; l++) ol[l] = 0.0;
    for (int64_t j = 0; z > 0.0 && j < Tk; j++) {
        if (p[j] == 0.0f) continue;
        p[j] = (float)(p[j] / z);
        const float *cj = ag_rd(latent_row(c, b, j), 0, d->Lk + d->R, rb);
        for (int l = 0; l < d->Lk; l++) ol[l] += (double)p[j] * cj[l];
    }
    for (int e = 0; e < d->Dv; e++) {
        double acc = 0.0;
        for (int l = 0; l < d->Lk; l++)
            acc += ol[l] * ag_get(w->data, w->dtype, ((int64_t)h * row + d->nope + e) * d->Lk + l);
        ag_set(out->data, out->dtype, (qo + h) * d->Dv + e, (float)acc);
    }
}

ag_tensor *ag_attention_mla_latent(ag_ctx *ctx, const char *site, ag_tensor *q_nope, ag_tensor *q_pe,
                                   const ag_kv_cache *cache, ag_tensor *kv_b, int H, int v_head,
                                   const int32_t *key_mask, int64_t mask_ld, float scale) {
    ag_tensor *ins[] = {q_nope, q_pe, kv_b};
    if (!ag_check_inputs(ctx, "attention_mla_latent", site, 3, ins, (const char *[]){"q_nope", "q_pe", "kv_b"}))
        return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!ag_kv_no_grad(ctx, "attention_mla_latent", s.base)) return NULL;
    const int64_t B = q_nope->shape[0], Tq = q_nope->ndim == 3 ? q_nope->shape[1] : 0;
    const int nope = H > 0 ? (int)(q_nope->shape[q_nope->ndim - 1] / H) : 0;
    const int R = H > 0 ? (int)(q_pe->shape[q_pe->ndim - 1] / H) : 0, Lk = cache ? cache->D - R : 0;
    char a[64], b[64], w[64];
    if (!cache || H < 1 || v_head < 1 || nope < 1 || R < 1 || Lk < 1 || cache->Hkv != 1 || cache->Dv != 0 ||
        q_nope->ndim != 3 || q_pe->ndim != 3 || q_pe->shape[0] != B || q_pe->shape[1] != Tq || cache->B != B ||
        Tq > cache->tokens || kv_b->ndim != 2 || kv_b->shape[0] != (int64_t)H * (nope + v_head) ||
        kv_b->shape[1] != Lk || kv_b->bits < 16 || !(scale > 0.0f) || (key_mask && mask_ld < cache->tokens)) {
        ag_fail(ctx, AG_ERR_SHAPE,
                "attention_mla_latent %s: q_nope %s, q_pe %s, kv_b %s over a latent cache of %lld tokens of %d do not "
                "fit %d heads with values of %d",
                s.base, ag_shape_str(q_nope, a), ag_shape_str(q_pe, b), ag_shape_str(kv_b, w),
                cache ? (long long)cache->tokens : 0LL, cache ? cache->D : 0, H, v_head);
        return NULL;
    }
    if (ctx->attention != AG_ATTENTION_EAGER || AG_FW(ctx->fw, attention) != AG_ATTENTION_OPS_FUSED) {
        ag_fail(ctx, AG_ERR_ARG,
                "attention_mla_latent %s: the latent cache's attention runs as the lean framework's eager attention "
                "only (--attention eager --framework lean)",
                s.base);
        return NULL;
    }
    char l[3][AG_LABEL_MAX];
    ag_label(l[0], s.base, "q_absorbed");
    ag_label(l[1], s.base, "probs");
    ag_label(l[2], s.base, "latent_out");
    ag_tensor *qa = ag_tensor_new(ctx, 4, (int64_t[]){B, Tq, H, Lk}, MP_ACTIVATION, l[0]);
    ag_tensor *probs = qa ? ag_tensor_new(ctx, 4, (int64_t[]){B, H, Tq, cache->tokens}, MP_ACTIVATION, l[1]) : NULL;
    ag_tensor *ol = probs ? ag_tensor_new(ctx, 4, (int64_t[]){B, Tq, H, Lk}, MP_ACTIVATION, l[2]) : NULL;
    ag_tensor *o =
        ol ? ag_tensor_new_bits(ctx, 3, (int64_t[]){B, Tq, (int64_t)H * v_head}, MP_ACTIVATION, s.out, q_nope->bits)
           : NULL;
    if (o && !mp_is_meta()) {
        const latent_dims d = {H, nope, R, v_head, Lk, scale, key_mask, mask_ld};
        double qd[Lk], od[Lk];
        float pb[cache->tokens]; // a row of 16-bit probabilities as float32
        for (int64_t bb = 0; bb < B; bb++)
            for (int64_t i = 0; i < Tq; i++)
                for (int h = 0; h < H; h++) {
                    const int64_t off = ((bb * H + h) * Tq + i) * cache->tokens;
                    float *p = ag_wr(ag_buf_of(probs), off, pb);
                    latent_query(&d, q_nope, q_pe, kv_b, cache, bb, i, h, p, qd, od, o);
                    ag_wr_end(ag_buf_of(probs), off, cache->tokens, p);
                }
    }
    ag_release(qa), ag_release(probs), ag_release(ol);
    return o;
}
