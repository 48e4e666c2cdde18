// attention_mla_cached: the latent attention of q[B, Tq, H*D] over a cache made by
// ag_kv_cache_new_dv (keys [B, H, t, D] at nope + rope, values [B, H, t, Dv]), eager, the lean
// framework's way (the cached attention's: the probabilities [B, H, Tq, tokens] a temporary freed
// before returning). Query i sits at position tokens - Tq + i and sees the keys up to it that
// key_mask does not hide; a query that sees none gets zeros.
#include <math.h>
#include <stdlib.h>

#include "ag_ops.h"

// Key j of (b, h) as a pointer into its chunk, with the chunk's element type.
static ag_buf cached_row(const ag_kv_cache *c, bool values, int64_t b, int h, int64_t j) {
    const int64_t w = values ? c->Dv : c->D;
    for (size_t i = 0; i < c->n; i++) {
        const kv_chunk *ch = &c->chunks[i];
        if (j < ch->t)
            return ag_buf_at((ag_buf){values ? ch->v.data : ch->k.data, c->t}, ((b * c->Hkv + h) * ch->t + j) * w);
        j -= ch->t;
    }
    return (ag_buf){NULL, c->t};
}

static void mla_cached_forward(ag_tensor *o, ag_tensor *probs, const ag_tensor *q, const ag_kv_cache *c,
                               const int32_t *mask, int64_t ld, float scale) {
    const int64_t B = q->shape[0], Tq = q->shape[1], Tk = c->tokens, D = c->D, Dv = c->Dv;
    const int H = c->Hkv;
    float qr[D], kr[D > Dv ? D : Dv], pb[Tk]; // pb: a row of 16-bit probabilities as float32
    for (int64_t b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int64_t i = 0; i < Tq; i++) {
                const int64_t off = ((b * H + h) * Tq + i) * Tk;
                float *p = ag_wr(ag_buf_of(probs), off, pb);
                const float *qv = ag_rd(ag_buf_of(q), (b * Tq + i) * H * D + (int64_t)h * D, D, qr);
                const int64_t seen = Tk - Tq + i + 1;
                float mx = -INFINITY;
                for (int64_t j = 0; j < Tk; j++) {
                    p[j] = -INFINITY;
                    if (j >= seen || (mask && !mask[b * ld + j])) continue;
                    const float *k = ag_rd(cached_row(c, false, b, h, j), 0, D, kr);
                    double s = 0.0;
                    for (int64_t d = 0; d < D; d++) s += (double)qv[d] * k[d];
                    p[j] = (float)s * scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                double z = 0.0;
                for (int64_t j = 0; j < Tk; j++)
                    z += (p[j] = mx == -INFINITY || p[j] == -INFINITY ? 0.0f : expf(p[j] - mx));
                double acc[Dv];
                for (int64_t d = 0; d < Dv; d++) acc[d] = 0.0;
                for (int64_t j = 0; z > 0.0 && j < Tk; j++) {
                    if (p[j] == 0.0f) continue;
                    p[j] = (float)(p[j] / z);
                    const float *v = ag_rd(cached_row(c, true, b, h, j), 0, Dv, kr);
                    for (int64_t d = 0; d < Dv; d++) acc[d] += (double)p[j] * v[d];
                }
                for (int64_t d = 0; d < Dv; d++)
                    ag_set(o->data, o->dtype, (b * Tq + i) * H * Dv + (int64_t)h * Dv + d, (float)acc[d]);
                ag_wr_end(ag_buf_of(probs), off, Tk, p);
            }
}

ag_tensor *ag_attention_mla_cached(ag_ctx *ctx, const char *site, ag_tensor *q, const ag_kv_cache *cache,
                                   const int32_t *key_mask, int64_t mask_ld, float scale) {
    ag_tensor *ins[] = {q};
    if (!ag_check_inputs(ctx, "attention_mla_cached", site, 1, ins, (const char *[]){"q"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!ag_kv_no_grad(ctx, "attention_mla_cached", s.base)) return NULL;
    char sq[64];
    if (!cache || q->ndim != 3 || q->shape[0] != cache->B || q->shape[2] != (int64_t)cache->Hkv * cache->D ||
        q->shape[1] > cache->tokens || !(scale > 0.0f) || (key_mask && mask_ld < cache->tokens)) {
        ag_fail(ctx, AG_ERR_SHAPE, "attention_mla_cached %s: q %s over a cache of %lld tokens, %d heads of %d", s.base,
                ag_shape_str(q, sq), cache ? (long long)cache->tokens : 0LL, cache ? cache->Hkv : 0,
                cache ? cache->D : 0);
        return NULL;
    }
    if (ctx->attention != AG_ATTENTION_EAGER || AG_FW(ctx->fw, attention) != AG_ATTENTION_OPS_FUSED) {
        ag_fail(ctx, AG_ERR_ARG,
                "attention_mla_cached %s: a value head size of its own runs as the lean framework's eager attention "
                "only (--attention eager --framework lean)",
                s.base);
        return NULL;
    }
    const int64_t B = q->shape[0], Tq = q->shape[1], H = cache->Hkv;
    char label[AG_LABEL_MAX];
    ag_label(label, s.base, "probs");
    ag_tensor *o = ag_tensor_new_bits(ctx, 3, (int64_t[]){B, Tq, H * cache->Dv}, MP_ACTIVATION, s.out, q->bits);
    ag_tensor *probs = o ? ag_tensor_new(ctx, 4, (int64_t[]){B, H, Tq, cache->tokens}, MP_ACTIVATION, label) : NULL;
    if (!probs) {
        ag_release(o);
        return NULL;
    }
    if (!mp_is_meta()) mla_cached_forward(o, probs, q, cache, key_mask, mask_ld, scale);
    ag_release(probs);
    return o;
}
