// The key-value cache of inference. The cache of one layer is a list of chunks, one per forward
// call (the prefill's T tokens, then one token per decode step), each laid out [B, Hkv, t, D] as
// Hugging Face's cache is. Appending never copies what is already cached, so the bytes billed to
// the cache are exactly 2 x B x Hkv x D x tokens x 4 at every moment.
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

// Nothing here records a node: in grad mode a caller would silently get no gradient.
bool ag_kv_no_grad(ag_ctx *ctx, const char *op, const char *base) {
    if (!ctx->grad_enabled) return true;
    return ag_fail(ctx, AG_ERR_STATE,
                   "%s %s: inference only, turn grad mode off first "
                   "(ag_set_grad_enabled(ctx, false))",
                   op, base);
}

ag_kv_cache *ag_kv_cache_new(ag_ctx *ctx, const char *site, mp_category cat, int64_t B, int Hkv, int D) {
    if (!ctx || ctx->status != AG_OK) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (B < 1 || Hkv < 1 || D < 1 || (int)cat < 0 || (int)cat >= MP_NCATEGORIES ||
        B * Hkv > ((int64_t)1 << (mp_is_meta() ? 48 : 40)) / D) {
        ag_fail(ctx, AG_ERR_ARG,
                "kv cache %s: batch %lld, %d key-value heads of dimension %d "
                "(expected each >= 1) in category %d",
                s.base, (long long)B, Hkv, D, (int)cat);
        return NULL;
    }
    ag_kv_cache *c = calloc(1, sizeof *c);
    if (!c) {
        ag_fail(ctx, AG_ERR_NOMEM, "kv cache %s: out of memory", s.base);
        return NULL;
    }
    c->B = B, c->Hkv = Hkv, c->D = D, c->Dv = D, c->cat = cat;
    c->t = ag_dtype_of_bits(ctx->dtype.act_bits, ctx->dtype.fp16);
    bool cache = cat == MP_CACHE;
    ag_label(c->k_label, s.base, cache ? "k_cache" : "keys");
    ag_label(c->v_label, s.base, cache ? "v_cache" : "values");
    return c;
}

ag_kv_cache *ag_kv_cache_new_dv(ag_ctx *ctx, const char *site, mp_category cat, int64_t B, int Hkv, int D, int Dv) {
    ag_kv_cache *c = ag_kv_cache_new(ctx, site, cat, B, Hkv, D > Dv ? D : Dv);
    if (c) c->D = D, c->Dv = Dv < 0 ? 0 : Dv;
    return c;
}

void ag_kv_cache_free(ag_kv_cache *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) {
        mp_free(&c->chunks[i].k);
        mp_free(&c->chunks[i].v);
    }
    free(c->chunks);
    free(c);
}

static bool append_shapes(ag_ctx *ctx, const ag_kv_cache *c, const ag_tensor *k, const ag_tensor *v) {
    char sk[64], sv[64];
    if (c->Dv == 0 && !v && k->ndim == 3 && k->shape[0] == c->B && k->shape[2] == (int64_t)c->Hkv * c->D)
        return true; // keys alone (DeepSeek's latent cache)
    if (!v) return ag_fail(ctx, AG_ERR_ARG, "kv cache append %s: v is NULL", c->k_label);
    bool ok = k->ndim == 3 && v->ndim == 3 && k->shape[0] == c->B && k->shape[2] == (int64_t)c->Hkv * c->D &&
              v->shape[0] == k->shape[0] && v->shape[1] == k->shape[1] && v->shape[2] == (int64_t)c->Hkv * c->Dv;
    if (!ok && c->Dv == c->D)
        ag_fail(ctx, AG_ERR_SHAPE, "kv cache append %s: k %s, v %s (expected both [%lld, t, %lld])", c->k_label,
                ag_shape_str(k, sk), ag_shape_str(v, sv), (long long)c->B, (long long)c->Hkv * c->D);
    else if (!ok)
        ag_fail(ctx, AG_ERR_SHAPE, "kv cache append %s: k %s, v %s (expected [%lld, t, %lld] and [%lld, t, %lld])",
                c->k_label, ag_shape_str(k, sk), ag_shape_str(v, sv), (long long)c->B, (long long)c->Hkv * c->D,
                (long long)c->B, (long long)c->Hkv * c->Dv);
    return ok;
}

// dst[B, Hkv, t0 + t, D] = cat(old[B, Hkv, t0, D], new[B, t, Hkv*D] as heads), along the tokens.
static void cat_heads(void *dst, const void *old, int64_t t0, const ag_tensor *add, int64_t t, const ag_kv_cache *c) {
    ag_buf d = {dst, c->t}, a = ag_buf_of(add);
    for (int64_t b = 0; b < c->B; b++)
        for (int g = 0; g < c->Hkv; g++) {
            ag_buf o = ag_buf_at(d, (b * c->Hkv + g) * (t0 + t) * c->D);
            ag_copy_elems(o.p, c->t, ag_buf_at((ag_buf){(void *)old, c->t}, (b * c->Hkv + g) * t0 * c->D).p, c->t,
                          t0 * c->D);
            for (int64_t s = 0; s < t; s++)
                ag_copy_elems(ag_buf_at(o, (t0 + s) * c->D).p, c->t, ag_buf_at(a, ((b * t + s) * c->Hkv + g) * c->D).p,
                              a.t, c->D);
        }
}

// PYTORCH semantics: transformers' DynamicCache.update keeps one tensor per layer and grows it
// with torch.cat, so each append allocates the whole new keys (then values) beside the old,
// copies, and frees the old: for a moment the layer's cache is held twice.
static bool append_cat(ag_ctx *ctx, ag_kv_cache *c, const ag_tensor *k, const ag_tensor *v) {
    kv_chunk *old = &c->chunks[0], ch = {.t = old->t + k->shape[1]};
    size_t bytes = (size_t)(c->B * c->Hkv * ch.t * c->D) * sizeof(float);
    if (!ag_alloc_block(ctx, &ch.k, bytes, c->cat, c->k_label)) return false;
    if (!mp_is_meta()) cat_heads(ch.k.data, old->k.data, old->t, k, k->shape[1], c);
    mp_free(&old->k);
    if (!ag_alloc_block(ctx, &ch.v, bytes, c->cat, c->v_label)) {
        old->k = ch.k; // keep the cache whole: the keys hold the new tokens, the values do not
        return false;
    }
    if (!mp_is_meta()) cat_heads(ch.v.data, old->v.data, old->t, v, v->shape[1], c);
    mp_free(&old->v);
    *old = ch;
    c->tokens = ch.t;
    return true;
}

bool ag_kv_cache_append(ag_ctx *ctx, ag_kv_cache *c, const ag_tensor *k, const ag_tensor *v) {
    if (!ctx || ctx->status != AG_OK) return false;
    if (!c || !k) return ag_fail(ctx, AG_ERR_ARG, "kv cache append: %s is NULL", !c ? "the cache" : "k");
    if (!ag_kv_no_grad(ctx, "kv cache append", c->k_label) || !append_shapes(ctx, c, k, v)) return false;
    if (c->n == c->cap) { // the list of chunks grows, never the chunks
        size_t cap = c->cap ? 2 * c->cap : 64;
        kv_chunk *grown = realloc(c->chunks, cap * sizeof *grown);
        if (!grown) return ag_fail(ctx, AG_ERR_NOMEM, "kv cache %s: out of memory for %zu chunks", c->k_label, cap);
        c->chunks = grown;
        c->cap = cap;
    }
    if (AG_FW(ctx->fw, kv_cache_cat) && c->n > 0) {
        if (c->Dv != c->D)
            return ag_fail(ctx, AG_ERR_ARG,
                           "kv cache %s: values of a head size of their own grow by chunks only "
                           "(torch.cat's growth is not modelled for them)",
                           c->k_label);
        return append_cat(ctx, c, k, v);
    }
    kv_chunk ch = {.t = k->shape[1]};
    if (!ag_alloc_block(ctx, &ch.k, (size_t)k->numel * sizeof(float), c->cat, c->k_label)) return false;
    if (v && !ag_alloc_block(ctx, &ch.v, (size_t)v->numel * sizeof(float), c->cat, c->v_label)) {
        mp_free(&ch.k);
        return false;
    }
    if (!mp_is_meta()) {
        ag_to_heads((ag_buf){ch.k.data, c->t}, ag_buf_of(k), c->B, ch.t, c->Hkv, c->Hkv, c->D);
        if (v) ag_to_heads((ag_buf){ch.v.data, c->t}, ag_buf_of(v), c->B, ch.t, c->Hkv, c->Hkv, c->Dv);
    }
    c->chunks[c->n++] = ch;
    c->tokens += ch.t;
    return true;
}

int64_t ag_kv_cache_tokens(const ag_kv_cache *c) { return c ? c->tokens : 0; }

size_t ag_kv_cache_chunks(const ag_kv_cache *c) { return c ? c->n : 0; }

void ag_kv_cache_shape(const ag_kv_cache *c, int64_t shape[4]) {
    shape[0] = c->B, shape[1] = c->Hkv, shape[2] = c->tokens, shape[3] = c->D;
}

uint64_t ag_kv_cache_bytes(const ag_kv_cache *c, uint64_t *usable) {
    uint64_t req = 0, use = 0;
    for (size_t i = 0; c && i < c->n; i++) {
        req += c->chunks[i].k.bytes + c->chunks[i].v.bytes;
        use += c->chunks[i].k.usable + c->chunks[i].v.usable;
    }
    if (usable) *usable = use;
    return req;
}

bool ag_kv_cache_read(const ag_kv_cache *c, bool values, float *dst) {
    if (!c || !dst || mp_is_meta() || (values && c->Dv == 0)) return false;
    int64_t row = (int64_t)(values ? c->Dv : c->D), off = 0;
    for (size_t i = 0; i < c->n; i++) {
        const kv_chunk *ch = &c->chunks[i];
        ag_buf src = {values ? ch->v.data : ch->k.data, c->t};
        for (int64_t bg = 0; bg < c->B * c->Hkv; bg++)
            ag_copy_elems(dst + (bg * c->tokens + off) * row, AG_F32, ag_buf_at(src, bg * ch->t * row).p, c->t,
                          ch->t * row);
        off += ch->t;
    }
    return true;
}
