// Inference attention over a key-value cache (kv_cache.c), chunk by chunk. No tape: a no-grad
// operation.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

// Chunks smaller than this (in tokens) are read by plain loops: a decode step holds one chunk
// per generated token, and one sgemm call per token and head would cost more than its product.
#define SGEMM_MIN_TOKENS 16

typedef struct {
    int64_t B, Tq, Tk;
    int Hq, Hkv, D;
    const int32_t *mask; // [B, ld] or NULL
    int64_t ld;
    bool threaded;      // heads split between threads: chunk products by ag_sgemm_small only
    int64_t window;     // 0: none; else keys window or more cache slots back are hidden
    float scale;        // on q kᵀ (0: 1 / sqrt(D))
    float softcap;      // the scores capped as softcap tanh(s / softcap) before the softmax (0: none)
    const float *sinks; // gpt_oss: [Hq], one more logit in each row's denominator; NULL: none
} cat_dims;

static float cat_scale(const cat_dims *a) { return a->scale > 0.0f ? a->scale : 1.0f / sqrtf((float)a->D); }

// Eight partial sums, so that the compiler may keep them in vector registers.
static float dot(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[d + l] * b[d + l];
    float s = 0.0f;
    for (; d < n; d++) s += a[d] * b[d];
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

#if defined(__x86_64__)
// The plain loops of small chunks in 16 lanes: a decode step of a batch of 8 runs them for 72
// (row, head) pairs times every cached token in each of the 30 blocks, where the portable loops
// (built for SSE2) cost milliseconds a step.
AG_AVX512 static void small_scores16(float *p, const float *q, int64_t ldq, const float *kc, int64_t t, int64_t off,
                                     const cat_dims *a, float scale) {
    for (int64_t i = 0; i < a->Tq; i++)
        for (int64_t s = 0; s < t; s++) {
            __m512 acc = _mm512_setzero_ps();
            for (int d = 0; d < a->D; d += 16) {
                __mmask16 mk = ag_lanes16(a->D - d);
                acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, q + i * ldq + d),
                                      _mm512_maskz_loadu_ps(mk, kc + s * a->D + d), acc);
            }
            p[i * a->Tk + off + s] = scale * _mm512_reduce_add_ps(acc);
        }
}

AG_AVX512 static void small_values16(float *o, int64_t ldo, const float *p, const float *vc, int64_t t, int64_t off,
                                     const cat_dims *a, bool first) {
    for (int64_t i = 0; i < a->Tq; i++)
        for (int d = 0; d < a->D; d += 16) {
            __mmask16 mk = ag_lanes16(a->D - d);
            float *od = o + i * ldo + d;
            __m512 acc = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk, od);
            for (int64_t s = 0; s < t; s++)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(p[i * a->Tk + off + s]),
                                      _mm512_maskz_loadu_ps(mk, vc + s * a->D + d), acc);
            _mm512_mask_storeu_ps(od, mk, acc);
        }
}
#endif

// p[Tq, Tk] (row stride Tk) of one (batch, query head), columns off .. off+t from one chunk's
// keys kc[t, D]: p = scale q kcᵀ, q rows strided by ldq.
static void chunk_scores(float *p, const float *q, int64_t ldq, const float *kc, int64_t t, int64_t off,
                         const cat_dims *a, float scale) {
    if (t >= SGEMM_MIN_TOKENS) {
        if (!a->threaded)
            ag_sgemm(CblasNoTrans, CblasTrans, a->Tq, t, a->D, scale, q, ldq, kc, a->D, 0.0f, p + off, a->Tk);
        else
            ag_sgemm_small(CblasNoTrans, CblasTrans, a->Tq, t, a->D, scale, q, ldq, kc, a->D, 0.0f, p + off, a->Tk);
        return;
    }
#if defined(__x86_64__)
    if (ag_has_avx512()) {
        small_scores16(p, q, ldq, kc, t, off, a, scale);
        return;
    }
#endif
    for (int64_t i = 0; i < a->Tq; i++)
        for (int64_t s = 0; s < t; s++) p[i * a->Tk + off + s] = scale * dot(q + i * ldq, kc + s * a->D, a->D);
}

// o[Tq, D] (rows strided by ldo) += p[:, off .. off+t] vc[t, D]; the first chunk writes.
static void chunk_values(float *o, int64_t ldo, const float *p, const float *vc, int64_t t, int64_t off,
                         const cat_dims *a, bool first) {
    if (t >= SGEMM_MIN_TOKENS) {
        if (!a->threaded)
            ag_sgemm(CblasNoTrans, CblasNoTrans, a->Tq, a->D, t, 1.0f, p + off, a->Tk, vc, a->D, first ? 0.0f : 1.0f, o,
                     ldo);
        else
            ag_sgemm_small(CblasNoTrans, CblasNoTrans, a->Tq, a->D, t, 1.0f, p + off, a->Tk, vc, a->D,
                           first ? 0.0f : 1.0f, o, ldo);
        return;
    }
#if defined(__x86_64__)
    if (ag_has_avx512()) {
        small_values16(o, ldo, p, vc, t, off, a, first);
        return;
    }
#endif
    for (int64_t i = 0; i < a->Tq; i++) {
        float *oi = o + i * ldo;
        if (first) memset(oi, 0, (size_t)a->D * sizeof(float));
        for (int64_t s = 0; s < t; s++) {
            float w = p[i * a->Tk + off + s];
            const float *vs = vc + s * a->D;
            for (int d = 0; d < a->D; d++) oi[d] += w * vs[d];
        }
    }
}

// In place over one row of scores: query i of row b sees keys up to its own position
// (Tk - Tq + i) that the mask does not hide. Hidden keys get probability 0; a query that sees
// no key at all (a pad whose earlier keys are all pads) gets a row of zeros, so its output is
// 0 rather than NaN, and it is never read by a real query, whose mask hides it.
// A sliding window counts cache slots, as transformers' masks do: the pads come first in a row,
// so between real tokens that is their distance in positions.
// A sink (query head h's, when the op has them) joins the denominator and attends to nothing.
static void masked_softmax_row(float *row, int64_t b, int64_t i, int h, const cat_dims *a) {
    int64_t n = a->Tk - a->Tq + i + 1, lo = ag_window_first(n - 1, a->window);
    const int32_t *m = a->mask ? a->mask + b * a->ld : NULL;
    if (a->softcap > 0.0f)
        for (int64_t j = lo; j < n; j++) row[j] = a->softcap * tanhf(row[j] / a->softcap);
    float mx = -INFINITY;
    for (int64_t j = lo; j < n; j++)
        if ((!m || m[j]) && row[j] > mx) mx = row[j];
    const float *sink = a->sinks ? a->sinks + h : NULL;
    if (sink && *sink > mx) mx = *sink;
    double sum = ag_softmax_exp(row + lo, row + lo, n - lo, mx, m ? m + lo : NULL) + (sink ? exp(*sink - mx) : 0.0);
    float inv = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;
    for (int64_t j = lo; j < n; j++) row[j] *= inv;
    for (int64_t j = 0; j < lo; j++) row[j] = 0.0f;
    for (int64_t j = n; j < a->Tk; j++) row[j] = 0.0f;
}

// Scores p[Tq, Tk] of row b, query head h, over every chunk.
static void head_scores(float *p, const float *q, const ag_kv_cache *c, const cat_dims *a, int64_t b, int h) {
    int rep = a->Hq / a->Hkv;
    int64_t ldq = (int64_t)a->Hq * a->D, off = 0;
    float scale = cat_scale(a);
    const float *qh = q + b * a->Tq * ldq + (int64_t)h * a->D;
    for (size_t i = 0; i < c->n; i++) {
        const kv_chunk *ch = &c->chunks[i];
        const float *kc = (const float *)ch->k.data + (b * a->Hkv + h / rep) * ch->t * a->D;
        chunk_scores(p, qh, ldq, kc, ch->t, off, a, scale);
        off += ch->t;
    }
}

// Output of row b, query head h, from its probabilities p[Tq, Tk] and every chunk's values.
static void head_values(float *o, const float *p, const ag_kv_cache *c, const cat_dims *a, int64_t b, int h) {
    int rep = a->Hq / a->Hkv;
    int64_t ldq = (int64_t)a->Hq * a->D, off = 0;
    float *oh = o + b * a->Tq * ldq + (int64_t)h * a->D;
    for (size_t i = 0; i < c->n; i++) {
        const kv_chunk *ch = &c->chunks[i];
        const float *vc = (const float *)ch->v.data + (b * a->Hkv + h / rep) * ch->t * a->D;
        chunk_values(oh, ldq, p, vc, ch->t, off, a, i == 0);
        off += ch->t;
    }
}

// Heads are split between threads when every chunk product fits ag_sgemm_small (a decode step,
// a short prompt) and the products add up to enough work: a decode step of 8 rows over 45
// tokens makes 72 heads x 45 tokens x 64 x 2 multiply-adds a block, which one thread runs in
// about a tenth of a millisecond, 30 blocks a step.
#define THREADED_MIN_MACS ((int64_t)1 << 17)

static bool can_thread(const ag_kv_cache *c, const cat_dims *a) {
    if (!ag_has_avx512() || a->B * a->Hq * a->Tq * a->Tk * a->D < THREADED_MIN_MACS) return false;
    for (size_t i = 0; i < c->n; i++)
        if (c->chunks[i].t >= SGEMM_MIN_TOKENS && a->Tq * c->chunks[i].t * a->D > AG_SMALL_GEMM_MAX) return false;
    return true;
}

typedef struct {
    float *o, *probs;
    const float *q;
    const ag_kv_cache *c;
    const cat_dims *a;
} cached_args;

#if defined(__x86_64__)
// One query row against every chunk in one sweep, nd x 16 = D: the scores four keys at a time
// (their lanes summed together), the output summed in registers over all the cached tokens. A
// decode step's cache is a chunk per generated token, and a call per chunk and head (its output
// stored and reloaded each time) cost more than the products.
AG_AVX512_INLINE void decode_head_nd(float *o, float *pr, const float *qh, const ag_kv_cache *c, const cat_dims *a,
                                     int64_t b, int h, int g, const int nd) {
    const float scale = 1.0f / sqrtf((float)a->D);
    __m512 qv[8], acc[8];
    for (int d = 0; d < nd; d++) qv[d] = _mm512_loadu_ps(qh + 16 * d), acc[d] = _mm512_setzero_ps();
    __m512 t[4]; // four keys' partial sums, reduced together
    int64_t off = 0, np = 0;
    for (size_t i = 0; i < c->n; i++) {
        const kv_chunk *ch = &c->chunks[i];
        const float *kc = (const float *)ch->k.data + (b * a->Hkv + g) * ch->t * a->D;
        for (int64_t s = 0; s < ch->t; s++) {
            t[np] = _mm512_setzero_ps();
            for (int d = 0; d < nd; d++) t[np] = _mm512_fmadd_ps(qv[d], _mm512_loadu_ps(kc + s * a->D + 16 * d), t[np]);
            if (++np == 4) {
                _mm_storeu_ps(pr + off + s - 3, _mm_mul_ps(_mm_set1_ps(scale), hsum4(t[0], t[1], t[2], t[3])));
                np = 0;
            }
        }
        off += ch->t;
    }
    for (int64_t k = 0; k < np; k++) pr[off - np + k] = scale * _mm512_reduce_add_ps(t[k]);
    masked_softmax_row(pr, b, 0, h, a);
    off = 0;
    for (size_t i = 0; i < c->n; i++) {
        const kv_chunk *ch = &c->chunks[i];
        const float *vc = (const float *)ch->v.data + (b * a->Hkv + g) * ch->t * a->D;
        for (int64_t s = 0; s < ch->t; s++) {
            __m512 w = _mm512_set1_ps(pr[off + s]);
            for (int d = 0; d < nd; d++) acc[d] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vc + s * a->D + 16 * d), acc[d]);
        }
        off += ch->t;
    }
    for (int d = 0; d < nd; d++) _mm512_storeu_ps(o + 16 * d, acc[d]);
}

AG_AVX512 static void decode_head(const cached_args *x, int64_t bh) {
    const cat_dims *a = x->a;
    int64_t b = bh / a->Hq, ldq = (int64_t)a->Hq * a->D;
    int h = (int)(bh % a->Hq), g = h / (a->Hq / a->Hkv);
    const float *qh = x->q + b * ldq + (int64_t)h * a->D;
    float *o = x->o + b * ldq + (int64_t)h * a->D, *pr = x->probs + bh * a->Tk;
    if (a->D == 64)
        decode_head_nd(o, pr, qh, x->c, a, b, h, g, 4);
    else
        decode_head_nd(o, pr, qh, x->c, a, b, h, g, 8);
}
#endif

// The sweep above: one query row a head, float32, D 64 or 128, the plain scale and no cap.
static bool decode_sweep(const cat_dims *a) {
#if defined(__x86_64__)
    return a->Tq == 1 && (a->D == 64 || a->D == 128) && a->scale == 0.0f && a->softcap == 0.0f && ag_has_avx512();
#else
    (void)a;
    return false;
#endif
}

// Heads [lo, hi) of B x Hq, each whole: scores, softmax, values.
static void heads_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const cached_args *x = p;
    const cat_dims *a = x->a;
    for (int64_t bh = lo; bh < hi; bh++) {
#if defined(__x86_64__)
        if (decode_sweep(a)) {
            decode_head(x, bh);
            continue;
        }
#endif
        float *pr = x->probs + bh * a->Tq * a->Tk;
        head_scores(pr, x->q, x->c, a, bh / a->Hq, (int)(bh % a->Hq));
        for (int64_t i = 0; i < a->Tq; i++) masked_softmax_row(pr + i * a->Tk, bh / a->Hq, i, (int)(bh % a->Hq), a);
        head_values(x->o, pr, x->c, a, bh / a->Hq, (int)(bh % a->Hq));
    }
}

static void softmax_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const cached_args *x = p;
    const cat_dims *a = x->a;
    for (int64_t r = lo; r < hi; r++)
        masked_softmax_row(x->probs + r * a->Tk, r / (a->Hq * a->Tq), r % a->Tq, (int)(r / a->Tq % a->Hq), a);
}

// o[B, Tq, Hq*D]; probs [B, Hq, Tq, Tk]; q[B, Tq, Hq*D]; keys and values from the chunks.
static void cached_forward(float *o, float *probs, const float *q, const ag_kv_cache *c, cat_dims *a) {
    int64_t heads = a->B * a->Hq, rows = heads * a->Tq;
    cached_args x = {o, probs, q, c, a};
    a->threaded = can_thread(c, a);
    if (a->threaded || decode_sweep(a)) {
        double t0 = ag_blas_clock();
        if (a->threaded)
            ag_parallel_for(heads, 1, heads_part, &x);
        else
            heads_part(&x, 0, heads, 0);
        // The products' time is the region's (softmax included), their count one per chunk.
        ag_blas_account(t0, (int)(2 * heads * (int64_t)c->n), 4.0 * (double)rows * (double)a->Tk * (double)a->D);
        return;
    }
    for (int64_t bh = 0; bh < heads; bh++)
        head_scores(probs + bh * a->Tq * a->Tk, q, c, a, bh / a->Hq, (int)(bh % a->Hq));
    ag_parallel_for(rows, AG_PAR_GRAIN_EXP / a->Tk + 1, softmax_part, &x);
    for (int64_t bh = 0; bh < heads; bh++)
        head_values(o, probs + bh * a->Tq * a->Tk, c, a, bh / a->Hq, (int)(bh % a->Hq));
}

static bool cached_shapes(ag_ctx *ctx, const char *base, const ag_tensor *q, const ag_kv_cache *c, int Hq,
                          int64_t mask_ld) {
    char sq[64];
    bool ok = Hq >= 1 && Hq % c->Hkv == 0 && q->ndim == 3 && q->shape[0] == c->B && q->shape[2] == (int64_t)Hq * c->D &&
              c->tokens >= q->shape[1];
    if (!ok)
        return ag_fail(ctx, AG_ERR_SHAPE,
                       "attention_cached %s: q %s does not fit %d query heads "
                       "over a cache of %lld rows, %d key-value heads of dimension %d and %lld "
                       "tokens (expected q[%lld, Tq, %lld], Tq <= cached tokens, key-value heads "
                       "dividing query heads)",
                       base, ag_shape_str(q, sq), Hq, (long long)c->B, c->Hkv, c->D, (long long)c->tokens,
                       (long long)c->B, (long long)Hq * c->D);
    if (mask_ld < c->tokens)
        return ag_fail(ctx, AG_ERR_ARG,
                       "attention_cached %s: key mask rows of %lld entries, "
                       "expected at least the %lld cached tokens",
                       base, (long long)mask_ld, (long long)c->tokens);
    return true;
}

// PYTORCH semantics: what transformers' eager attention allocates over the cache besides the
// probabilities and the output: repeat_kv's copies of the whole cache at every query head when
// the heads are grouped (made here from the one chunk DynamicCache keeps; the row's kv_heads), the
// scores, scaled and masked (two at a time), and the context before its transpose. The products
// themselves run over the chunk.
static bool eager_transients(ag_ctx *ctx, const char *base, const ag_kv_cache *c, const cat_dims *a) {
    const size_t kv = (size_t)(a->B * a->Hq * a->Tk * a->D) * sizeof(float),
                 sc = (size_t)(a->B * a->Hq * a->Tq * a->Tk) * sizeof(float),
                 cx = (size_t)(a->B * a->Hq * a->Tq * a->D) * sizeof(float);
    mp_block kr = {0}, vr = {0}, s1 = {0}, s2 = {0}, cb = {0};
    char l[5][AG_LABEL_MAX];
    ag_label(l[0], base, "k_repeated");
    ag_label(l[1], base, "v_repeated");
    ag_label(l[2], base, "scores");
    ag_label(l[3], base, "scores_scaled");
    ag_label(l[4], base, "context");
    const bool copies = ag_eager_kv_layout(ctx->fw, a->B, a->Hq, a->Hkv) == AG_KV_REPEATED;
    bool ok = !copies ||
              (ag_alloc_block(ctx, &kr, kv, MP_ACTIVATION, l[0]) && ag_alloc_block(ctx, &vr, kv, MP_ACTIVATION, l[1]));
    int rep = a->Hq / a->Hkv;
    if (ok && copies && !mp_is_meta() && c->n == 1)
        for (int64_t b = 0; b < a->B; b++)
            for (int h = 0; h < a->Hq; h++) {
                size_t n = (size_t)(a->Tk * a->D), src = (size_t)((b * a->Hkv + h / rep) * a->Tk * a->D);
                ag_buf K = {c->chunks[0].k.data, c->t}, V = {c->chunks[0].v.data, c->t};
                ag_copy_elems(ag_buf_at((ag_buf){kr.data, c->t}, (b * a->Hq + h) * (int64_t)n).p, c->t,
                              ag_buf_at(K, (int64_t)src).p, c->t, (int64_t)n);
                ag_copy_elems(ag_buf_at((ag_buf){vr.data, c->t}, (b * a->Hq + h) * (int64_t)n).p, c->t,
                              ag_buf_at(V, (int64_t)src).p, c->t, (int64_t)n);
            }
    ok = ok && ag_alloc_block(ctx, &s1, sc, MP_ACTIVATION, l[2]) && ag_alloc_block(ctx, &s2, sc, MP_ACTIVATION, l[3]);
    mp_free(&s1); // the scores go once scaled; the masked scores then take their place
    ok = ok && ag_alloc_block(ctx, &s1, sc, MP_ACTIVATION, l[3]);
    mp_free(&s2);
    ok = ok && ag_alloc_block(ctx, &cb, cx, MP_ACTIVATION, l[4]);
    mp_free(&cb), mp_free(&s1), mp_free(&vr), mp_free(&kr);
    return ok;
}

// FLASH: every (row, query head, block of queries) walks the chunks' keys in tiles with an online
// softmax (kernels/flash.c), in one bounded workspace; no probabilities. Under the PyTorch
// frameworks this is transformers' sdpa path over the cache: SDPA takes the key-value heads as
// they are (enable_gqa, no repeat_kv) and makes no scores; its output [B, Hq, Tq, D] is a
// temporary until transpose(1, 2).contiguous() copies it into the returned tensor.
typedef struct {
    ag_buf o, q;
    float *ws;
    int64_t sb, sh, st;
    const ag_kv_cache *c;
    const cat_dims *a;
} cflash_args;

// o[D] *= e^(lse - log(e^lse + e^sink)): a row normalised over its keys, rescaled for the sink.
static void sink_scale(float *o, int D, float lse, float sink) {
    if (lse == -INFINITY) return; // no key seen: the row is zeros already
    const double m = lse > sink ? lse : sink, total = m + log(exp(lse - m) + exp(sink - m));
    const float keep = (float)exp(lse - total);
    for (int d = 0; d < D; d++) o[d] *= keep;
}

// Tasks [lo, hi): one block of queries of one head each, the last blocks (most keys) first.
static void cflash_part(void *p, int64_t lo, int64_t hi, int thread) {
    const cflash_args *x = p;
    const cat_dims *a = x->a;
    const ag_kv_cache *c = x->c;
    const int rep = a->Hq / a->Hkv, D = a->D;
    const bool f32 = x->q.t == AG_F32 && c->t == AG_F32 && x->o.t == AG_F32;
    float qb[f32 ? 1 : AG_FLASH_BR * D], kb[f32 ? 1 : AG_FLASH_BC * D], vb[f32 ? 1 : AG_FLASH_BC * D],
        ob[f32 ? 1 : AG_FLASH_BR * D];
    const int64_t ldq = (int64_t)a->Hq * D, nqb = (a->Tq + AG_FLASH_BR - 1) / AG_FLASH_BR, heads = a->B * a->Hq;
    float *mine = x->ws + (size_t)thread * ag_flash_rows_floats(D);
    for (int64_t t = lo; t < hi; t++) {
        int64_t ib = nqb - 1 - t / heads, b = (t % heads) / a->Hq, r0 = ib * AG_FLASH_BR;
        int h = (int)(t % a->Hq), g = h / rep;
        int64_t nr = a->Tq - r0 < AG_FLASH_BR ? a->Tq - r0 : AG_FLASH_BR, qpos0 = a->Tk - a->Tq + r0,
                klast = qpos0 + nr - 1, off = 0;
        ag_flash_rows w;
        const float *qr = ag_tile_f32(x->q, (b * a->Tq + r0) * ldq + (int64_t)h * D, ldq, nr, D, qb);
        ag_flash_rows_begin(&w, mine, qr, f32 ? ldq : D, nr, D);
        w.window = a->window;
        for (size_t i = 0; i < c->n && off <= klast; off += c->chunks[i++].t) {
            const kv_chunk *ch = &c->chunks[i];
            ag_buf kc = {ch->k.data, c->t}, vc = {ch->v.data, c->t};
            int64_t base = (b * a->Hkv + g) * ch->t * D;
            for (int64_t s0 = 0; s0 < ch->t && off + s0 <= klast; s0 += AG_FLASH_BC) {
                int64_t nk = ch->t - s0 < AG_FLASH_BC ? ch->t - s0 : AG_FLASH_BC;
                if (nk > klast + 1 - off - s0) nk = klast + 1 - off - s0;
                ag_flash_rows_tile(&w, ag_tile_f32(kc, base + s0 * D, D, nk, D, kb), D,
                                   ag_tile_f32(vc, base + s0 * D, D, nk, D, vb), D, nk, off + s0, qpos0,
                                   a->mask ? a->mask + b * a->ld + off + s0 : NULL);
            }
        }
        int64_t at = b * x->sb + h * x->sh + r0 * x->st;
        float lse[AG_FLASH_BR];
        float *out = f32 ? (float *)x->o.p + at : ob;
        const int64_t ld = f32 ? x->st : D;
        ag_flash_rows_end(&w, out, ld, a->sinks ? lse : NULL);
        for (int64_t r = 0; a->sinks && r < nr; r++) // the sink's share of the row leaves the keys
            sink_scale(out + r * ld, D, lse[r], a->sinks[h]);
        if (f32) continue;
        for (int64_t r = 0; r < nr; r++) ag_vec_copy(ag_buf_at(x->o, at + r * x->st), ag_buf_f32(ob + r * D), D);
    }
}

static void cached_flash_run(ag_buf o, int64_t sb, int64_t sh, int64_t st, ag_buf q, const ag_kv_cache *c,
                             const cat_dims *a, float *ws, int nthreads) {
    cflash_args x = {o, q, ws, sb, sh, st, c, a};
    ag_run_tasks(nthreads, a->B * a->Hq * ((a->Tq + AG_FLASH_BR - 1) / AG_FLASH_BR), cflash_part, &x);
}

static ag_tensor *cached_flash(ag_ctx *ctx, const ag_site *s, ag_tensor *q, const ag_kv_cache *c, const cat_dims *a) {
    const ag_sdpa_kernel *kr = ag_ctx_sdpa(ctx);
    if (!kr) {
        ag_fail(ctx, AG_ERR_ARG, "attention %s: PyTorch has no such fused kernel on the %s", s->base,
                ctx->dev ? ctx->dev->name : "cpu");
        return NULL;
    }
    const bool heads_first = AG_FW(ctx->fw, flash) == AG_FLASH_SDPA && AG_SDPA(kr, out_heads_first),
               meta = mp_is_meta();
    const int64_t D = a->D, Hq = a->Hq, Tq = a->Tq;
    ag_tensor *o = ag_tensor_like(ctx, q, MP_ACTIVATION, s->out);
    if (!o) return NULL;
    char l[AG_LABEL_MAX];
    mp_block ws = {0}, sdpa = {0}, rep[2] = {{0}};
    // A kernel that takes no grouped heads gets the cache through repeat_kv: k and v at every
    // query head, for the call.
    const bool repeat = a->Hq != a->Hkv && !AG_SDPA(kr, gqa);
    // sizes at the output's bits, billed as they are (ag_alloc_block scales a float32 size)
    const size_t kv_rep = (size_t)(a->B * Hq * a->Tk * D) * (size_t)o->bits / 8;
    bool ok = true;
    for (int i = 0; i < 2 && repeat && ok; i++)
        ok = ag_alloc_exact(ctx, &rep[i], kv_rep, MP_ACTIVATION,
                            (ag_label(l, s->base, i ? "v_repeated" : "k_repeated"), l));
    int nthreads = ag_flash_threads(a->B * Hq * ((Tq + AG_FLASH_BR - 1) / AG_FLASH_BR),
                                    (double)a->B * Hq * (double)Tq * (double)a->Tk * (double)D);
    ag_label(l, s->base, "flash_workspace");
    ok =
        ok && ag_alloc_exact(ctx, &ws, (size_t)nthreads * ag_flash_rows_floats(a->D) * sizeof(float), MP_ACTIVATION, l);
    ag_label(l, s->base, "sdpa_out");
    ok = ok && (!heads_first ||
                ag_alloc_exact(ctx, &sdpa, (size_t)(a->B * Hq * Tq * D) * (size_t)o->bits / 8, MP_ACTIVATION, l));
    if (ok && !meta) {
        if (heads_first) {
            ag_buf src = {sdpa.data, o->dtype};
            cached_flash_run(src, Hq * Tq * D, Tq * D, D, ag_buf_of(q), c, a, ws.data, nthreads);
            for (int64_t b = 0; b < a->B; b++)
                for (int64_t h = 0; h < Hq; h++)
                    for (int64_t t = 0; t < Tq; t++)
                        ag_copy_elems(ag_buf_at(ag_buf_of(o), ((b * Tq + t) * Hq + h) * D).p, o->dtype,
                                      ag_buf_at(src, ((b * Hq + h) * Tq + t) * D).p, o->dtype, D);
        } else {
            cached_flash_run(ag_buf_of(o), Tq * Hq * D, D, Hq * D, ag_buf_of(q), c, a, ws.data, nthreads);
        }
    }
    mp_free(&sdpa);
    mp_free(&ws);
    mp_free(&rep[1]);
    mp_free(&rep[0]);
    if (!ok) ag_release(o), o = NULL;
    return o;
}

// The tiled loop alone into o[B, Tq, Hq*D], its workspace a temporary.
static bool cached_flash_compute(ag_ctx *ctx, const ag_site *s, ag_tensor *o, ag_tensor *q, const ag_kv_cache *c,
                                 const cat_dims *a) {
    const int64_t D = a->D, Hq = a->Hq, Tq = a->Tq;
    int nthreads = ag_flash_threads(a->B * Hq * ((Tq + AG_FLASH_BR - 1) / AG_FLASH_BR),
                                    (double)a->B * Hq * (double)Tq * (double)a->Tk * (double)D);
    char l[AG_LABEL_MAX];
    mp_block ws = {0};
    ag_label(l, s->base, "tile_workspace");
    if (!ag_alloc_exact(ctx, &ws, (size_t)nthreads * ag_flash_rows_floats(a->D) * sizeof(float), MP_TEMPORARY, l))
        return false;
    if (!mp_is_meta()) cached_flash_run(ag_buf_of(o), Tq * Hq * D, D, Hq * D, ag_buf_of(q), c, a, ws.data, nthreads);
    mp_free(&ws);
    return true;
}

ag_tensor *ag_attention_cached(ag_ctx *ctx, const char *site, ag_tensor *q, const ag_kv_cache *cache,
                               const int32_t *key_mask, int64_t mask_ld, int Hq) {
    return ag_attention_cached_window(ctx, site, q, cache, key_mask, mask_ld, Hq, 0);
}

ag_tensor *ag_attention_cached_window(ag_ctx *ctx, const char *site, ag_tensor *q, const ag_kv_cache *cache,
                                      const int32_t *key_mask, int64_t mask_ld, int Hq, int64_t window) {
    return ag_attention_cached_spec(ctx, site, q, cache, key_mask, mask_ld, Hq,
                                    &(ag_attention_spec){window, 0.0f, 0.0f});
}

static ag_tensor *cached_run(ag_ctx *ctx, const char *site, ag_tensor *q, const ag_kv_cache *cache,
                             const int32_t *key_mask, int64_t mask_ld, int Hq, const ag_attention_spec *spec,
                             const ag_tensor *sinks);

ag_tensor *ag_attention_cached_sinks(ag_ctx *ctx, const char *site, ag_tensor *q, const ag_kv_cache *cache,
                                     const int32_t *key_mask, int64_t mask_ld, int Hq, int64_t window,
                                     const ag_tensor *sinks) {
    return cached_run(ctx, site, q, cache, key_mask, mask_ld, Hq, &(ag_attention_spec){window, 0.0f, 0.0f}, sinks);
}

ag_tensor *ag_attention_cached_spec(ag_ctx *ctx, const char *site, ag_tensor *q, const ag_kv_cache *cache,
                                    const int32_t *key_mask, int64_t mask_ld, int Hq, const ag_attention_spec *spec) {
    return cached_run(ctx, site, q, cache, key_mask, mask_ld, Hq, spec, NULL);
}

// Both entries: a spec's scale and soft-cap (eager only), gpt_oss's sinks (lean only; NULL: none).
static ag_tensor *cached_run(ag_ctx *ctx, const char *site, ag_tensor *q, const ag_kv_cache *cache,
                             const int32_t *key_mask, int64_t mask_ld, int Hq, const ag_attention_spec *spec,
                             const ag_tensor *sinks) {
    const int64_t window = spec->window;
    ag_tensor *ins[] = {q};
    if (!ag_check_inputs(ctx, "attention_cached", site, 1, ins, (const char *[]){"q"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    if (!ag_kv_no_grad(ctx, "attention_cached", s.base)) return NULL;
    if (!cache) {
        ag_fail(ctx, AG_ERR_ARG, "attention_cached %s: the cache is NULL", s.base);
        return NULL;
    }
    if (!key_mask) mask_ld = cache->tokens;
    if (!cached_shapes(ctx, s.base, q, cache, Hq, mask_ld)) return NULL;
    const bool flash = ctx->attention != AG_ATTENTION_EAGER; // flash, or another SDPA kernel
    if (sinks && (sinks->numel != Hq || (flash ? AG_FW(ctx->fw, flash) != AG_FLASH_FUSED
                                               : AG_FW(ctx->fw, attention) != AG_ATTENTION_OPS_FUSED))) {
        ag_fail(ctx, AG_ERR_ARG,
                "attention_cached %s: sinks of %lld values for %d heads (one a head, under the lean framework: the "
                "only attention with sinks membill computes)",
                s.base, (long long)sinks->numel, Hq);
        return NULL;
    }
    // The tiled loop (flash, and 16-bit caches) computes the plain scale without a cap
    const bool plain = spec->scale == 0.0f && spec->softcap == 0.0f;
    if (!plain && (flash || (!mp_is_meta() && cache->t != AG_F32))) {
        ag_fail(ctx, AG_ERR_ARG,
                "attention_cached %s: flash attention (or a 16-bit cache) with a scale of its own or a soft-cap of "
                "the scores is not modelled (eager only)",
                s.base);
        return NULL;
    }
    float sv[Hq];
    for (int h = 0; sinks && !mp_is_meta() && h < Hq; h++) sv[h] = ag_get(sinks->data, sinks->dtype, h);
    cat_dims a = {.B = q->shape[0],
                  .Tq = q->shape[1],
                  .Tk = cache->tokens,
                  .Hq = Hq,
                  .Hkv = cache->Hkv,
                  .D = cache->D,
                  .mask = key_mask,
                  .ld = mask_ld,
                  .threaded = false,
                  .window = window < 0 ? 0 : window,
                  .scale = spec->scale,
                  .softcap = spec->softcap,
                  .sinks = sinks && !mp_is_meta() ? sv : NULL};
    if (flash) return cached_flash(ctx, &s, q, cache, &a);
    char label[AG_LABEL_MAX];
    ag_label(label, s.base, "probs");
    ag_tensor *o = ag_tensor_like(ctx, q, MP_ACTIVATION, s.out);
    // The probabilities only live inside the op: a decode step's are [B, Hq, 1, Tk].
    ag_tensor *probs = ag_tensor_new(ctx, 4, (int64_t[]){a.B, Hq, a.Tq, a.Tk}, MP_ACTIVATION, label);
    if (!o || !probs) {
        ag_release(o);
        ag_release(probs);
        return NULL;
    }
    if (AG_FW(ctx->fw, attention) == AG_ATTENTION_OPS_HF_EAGER && !eager_transients(ctx, s.base, cache, &a)) {
        ag_release(o);
        ag_release(probs);
        return NULL;
    }
    // 16-bit keys and values: the same math by the tiled loop of the flash path, which reads them a
    // tile at a time (the probabilities above are billed as eager attention makes them).
    if (cache->t == AG_F32 && q->dtype == AG_F32) {
        if (!mp_is_meta()) cached_forward(o->data, probs->data, q->data, cache, &a);
    } else if (!cached_flash_compute(ctx, &s, o, q, cache, &a)) {
        ag_release(o), o = NULL;
    }
    ag_release(probs);
    return o;
}
