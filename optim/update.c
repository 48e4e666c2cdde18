// The fused per-element updates, one loop per parameter (SGD, and Adam's fused implementation);
// Adam's for-loop and foreach implementations are in unfused.c.
#include "optim_internal.h"

#include <math.h>
#include <stdint.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

// Adam and AdamW (torch.optim.Adam / AdamW, amsgrad off, maximize off). A fresh state starts
// from zeros, so its first update writes (1-b)·g directly and saves a pass of memset.
typedef optim_adam_consts adam_consts;

optim_adam_consts optim_adam_consts_of(const optim_config *c, const optim_slot *s) {
    const double bc1 = 1.0 - pow(c->beta1, (double)s->step);
    const double bc2 = 1.0 - pow(c->beta2, (double)s->step);
    return (optim_adam_consts){.b1 = c->beta1,
                               .b2 = c->beta2,
                               .eps = c->eps,
                               .step_size = (float)(c->lr / bc1),
                               .bc2_sqrt = (float)sqrt(bc2),
                               .wd = c->weight_decay,
                               .decay = 1.0f - c->lr * c->weight_decay,
                               .decoupled = c->kind == OPTIM_ADAMW,
                               .fresh = s->fresh};
}

static inline void adam_scalar(const adam_consts *k, float *w, const float *g, float *m, float *v, size_t lo,
                               size_t hi) {
    const float b1 = k->b1, b2 = k->b2;
    for (size_t i = lo; i < hi; i++) {
        float gi = g[i], wi = w[i];
        if (k->decoupled)
            wi *= k->decay;
        else
            gi += k->wd * wi;
        float mi = k->fresh ? (1.0f - b1) * gi : m[i] + (gi - m[i]) * (1.0f - b1); // lerp, as torch
        float vi = k->fresh ? (1.0f - b2) * gi * gi : v[i] * b2 + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] = wi - k->step_size * (mi / (sqrtf(vi) / k->bc2_sqrt + k->eps));
    }
}

#if defined(__x86_64__)
#define ADAM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

typedef struct {
    __m512 c1, c2, b2, eps, ss, bc2, wd, decay;
} adam_vec;

ADAM_AVX512 static inline adam_vec adam_vec_of(const adam_consts *k) {
    return (adam_vec){_mm512_set1_ps(1.0f - k->b1), _mm512_set1_ps(1.0f - k->b2), _mm512_set1_ps(k->b2),
                      _mm512_set1_ps(k->eps),       _mm512_set1_ps(k->step_size), _mm512_set1_ps(k->bc2_sqrt),
                      _mm512_set1_ps(k->wd),        _mm512_set1_ps(k->decay)};
}

// The same operations in the same order as adam_scalar, sixteen lanes at a time: every lane
// rounds exactly as the scalar loop (IEEE sqrt and division, no fused multiply-add), so results
// are bit-identical. Updates m[i..] and v[i..] (lanes mk) and returns the new weights.
ADAM_AVX512 static inline __m512 adam16(const adam_consts *k, const adam_vec *c, __m512 gi, __m512 wi, float *m,
                                        float *v, __mmask16 mk) {
    if (k->decoupled)
        wi = _mm512_mul_ps(wi, c->decay);
    else
        gi = _mm512_add_ps(gi, _mm512_mul_ps(c->wd, wi));
    __m512 g2 = _mm512_mul_ps(_mm512_mul_ps(c->c2, gi), gi), mi, vi;
    if (k->fresh) {
        mi = _mm512_mul_ps(c->c1, gi);
        vi = g2;
    } else {
        mi = _mm512_maskz_loadu_ps(mk, m);
        vi = _mm512_maskz_loadu_ps(mk, v);
        mi = _mm512_add_ps(mi, _mm512_mul_ps(_mm512_sub_ps(gi, mi), c->c1));
        vi = _mm512_add_ps(_mm512_mul_ps(vi, c->b2), g2);
    }
    _mm512_mask_storeu_ps(m, mk, mi);
    _mm512_mask_storeu_ps(v, mk, vi);
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), c->bc2), c->eps);
    return _mm512_sub_ps(wi, _mm512_mul_ps(c->ss, _mm512_div_ps(mi, denom)));
}

// The scalar loop runs at a few cycles per element for its divisions and square root, slower
// than memory delivers the seven streams it touches; this one keeps up with memory.
ADAM_AVX512 static void adam_avx512(const adam_consts *k, float *w, const float *g, float *m, float *v, size_t lo,
                                    size_t hi) {
    const adam_vec c = adam_vec_of(k);
    for (size_t i = lo; i < hi; i += 16) {
        __mmask16 mk = hi - i >= 16 ? 0xFFFF : (__mmask16)((1u << (hi - i)) - 1);
        // Seven streams per thread are more than the hardware prefetcher keeps ahead of: asking
        // for the four read streams 2 KB early makes the pass ~10% faster.
        _mm_prefetch((const char *)(g + i + 512), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + i + 512), _MM_HINT_T0);
        _mm_prefetch((const char *)(m + i + 512), _MM_HINT_T0);
        _mm_prefetch((const char *)(v + i + 512), _MM_HINT_T0);
        __m512 wi = adam16(k, &c, _mm512_maskz_loadu_ps(mk, g + i), _mm512_maskz_loadu_ps(mk, w + i), m + i, v + i, mk);
        _mm512_mask_storeu_ps(w + i, mk, wi);
    }
}

// bf16-mixed in one pass: the bfloat16 gradient widened, the step on the float32 master copy and
// state, the bfloat16 parameter written as the master's rounding (nearest even, NaN 0x7FC0, as
// ag_bf16_from_f32) with streaming stores: the weights do not stay in cache, and a plain store
// would first read every line it overwrites.
ADAM_AVX512 static void adam_mixed_avx512(const adam_consts *k, float *w, const uint16_t *g, float *m, float *v,
                                          uint16_t *w16, size_t lo, size_t hi) {
    const adam_vec c = adam_vec_of(k);
    const __m512i half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), qnan = _mm512_set1_epi32(0x7FC0);
    for (size_t i = lo; i < hi; i += 16) {
        __mmask16 mk = hi - i >= 16 ? 0xFFFF : (__mmask16)((1u << (hi - i)) - 1);
        _mm_prefetch((const char *)(g + i + 1024), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + i + 512), _MM_HINT_T0);
        _mm_prefetch((const char *)(m + i + 512), _MM_HINT_T0);
        _mm_prefetch((const char *)(v + i + 512), _MM_HINT_T0);
        __m512i gw = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, g + i)), 16);
        __m512 wi = adam16(k, &c, _mm512_castsi512_ps(gw), _mm512_maskz_loadu_ps(mk, w + i), m + i, v + i, mk);
        _mm512_mask_storeu_ps(w + i, mk, wi);
        __m512i u = _mm512_castps_si512(wi);
        __m512i r = _mm512_srli_epi32(
            _mm512_add_epi32(_mm512_add_epi32(u, half), _mm512_and_si512(_mm512_srli_epi32(u, 16), one)), 16);
        __m256i h = _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(wi, wi, _CMP_UNORD_Q), qnan));
        if (mk == 0xFFFF && ((uintptr_t)(w16 + i) & 31) == 0)
            _mm256_stream_si256((__m256i *)(w16 + i), h);
        else
            _mm256_mask_storeu_epi16(w16 + i, mk, h);
    }
    _mm_sfence();
}

#endif

// AVX-512 F, and BW with VL (16-bit lanes), each checked once.
static bool has_avx512(void) {
#if defined(__x86_64__)
    static int avx512 = -1;
    if (avx512 < 0) {
        __builtin_cpu_init();
        avx512 = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
    return avx512;
#else
    return false;
#endif
}

static bool has_avx512_bw(void) {
#if defined(__x86_64__)
    static int bw = -1;
    if (bw < 0) {
        __builtin_cpu_init();
        bw = has_avx512() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    }
    return bw;
#else
    return false;
#endif
}

static void adam_range(const adam_consts *k, bool avx512, float *w, const float *g, float *m, float *v, size_t lo,
                       size_t hi) {
#if defined(__x86_64__)
    if (avx512) {
        adam_avx512(k, w, g, m, v, lo, hi);
        return;
    }
#endif
    (void)avx512;
    adam_scalar(k, w, g, m, v, lo, hi);
}

typedef struct {
    adam_consts k;
    const optim_config *c;
    bool avx512, fresh;
    float *w, *m, *v;
    const float *g;
    size_t n;
} update_args;

// Lines [lo, hi) of 16 floats.
static void adam_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const update_args *a = p;
    size_t b = (size_t)lo * 16, e = (size_t)hi * 16 < a->n ? (size_t)hi * 16 : a->n;
    adam_range(&a->k, a->avx512, a->w, a->g, a->m, a->v, b, e);
}

static void adam_update(const optim_config *c, optim_slot *s, float *w, const float *g, size_t n) {
    update_args a = {.k = optim_adam_consts_of(c, s), .avx512 = has_avx512(), .w = w, .g = g, .n = n};
    a.m = s->state[0].data, a.v = s->state[1].data;
    ag_parallel_for((int64_t)(n + 15) / 16, OPTIM_PAR_GRAIN / 16, adam_part, &a);
}

// SGD, with momentum when c->momentum > 0: the first step's buffer is a copy of the gradient.
static void sgd_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const update_args *a = p;
    const optim_config *c = a->c;
    float *buf = a->m, *w = a->w;
    const float *g = a->g;
    const float lr = c->lr, wd = c->weight_decay, mom = c->momentum, damp = 1.0f - c->dampening;
    const bool fresh = a->fresh, nesterov = c->nesterov;
    for (size_t i = (size_t)lo; i < (size_t)hi; i++) {
        float gi = g[i] + wd * w[i];
        if (buf) {
            float bi = fresh ? gi : mom * buf[i] + damp * gi;
            buf[i] = bi;
            gi = nesterov ? gi + mom * bi : bi;
        }
        w[i] -= lr * gi;
    }
}

static void sgd_update(const optim_config *c, optim_slot *s, float *w, const float *g, size_t n) {
    update_args a = {.c = c, .fresh = s->fresh, .w = w, .m = s->state[0].data, .g = g, .n = n};
    ag_parallel_for((int64_t)n, OPTIM_PAR_GRAIN, sgd_part, &a);
}

void optim_update(const optim_config *c, optim_slot *s, float *w, const float *g, size_t n) {
    if (c->kind == OPTIM_ADAM || c->kind == OPTIM_ADAMW)
        adam_update(c, s, w, g, n);
    else if (c->kind == OPTIM_SGD || c->kind == OPTIM_SGD_MOMENTUM)
        sgd_update(c, s, w, g, n);
}

// ---------------------------------------------------------------------------------------------
// Parameters, gradients or state in 16 bits, or a float32 master copy: the same update a block at
// a time, read into float32 and rounded once into each tensor's dtype (as torch's fused Adam
// computes in float32). With a master copy the step runs on it and the parameter becomes its
// rounding.

typedef struct {
    const optim_config *c;
    optim_slot *s;
    optim_adam_consts k;
    ag_buf w, g, m, v, master;
    size_t n;
} typed_args;

enum { BLK = 1024 };

static void typed_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const typed_args *a = p;
    float wb[BLK], gb[BLK], mb[BLK], vb[BLK];
    bool avx = has_avx512(), adam = a->c->kind == OPTIM_ADAM || a->c->kind == OPTIM_ADAMW;
    for (int64_t b = lo; b < hi; b++) {
        int64_t off = b * BLK, n = (int64_t)a->n - off < BLK ? (int64_t)a->n - off : BLK;
        ag_buf wsrc = a->master.p ? a->master : a->w;
        float *w = ag_rw(wsrc, off, n, wb);
        const float *g = ag_rd(a->g, off, n, gb);
        float *m = a->m.p ? (a->s->fresh ? ag_wr(a->m, off, mb) : ag_rw(a->m, off, n, mb)) : NULL;
        float *v = a->v.p ? (a->s->fresh ? ag_wr(a->v, off, vb) : ag_rw(a->v, off, n, vb)) : NULL;
        if (adam) {
            adam_range(&a->k, avx, w, g, m, v, 0, (size_t)n);
        } else {
            update_args u = {.c = a->c, .fresh = a->s->fresh, .w = w, .m = m, .g = g, .n = (size_t)n};
            sgd_part(&u, 0, n, 0);
        }
        ag_wr_end(wsrc, off, n, w);
        if (m) ag_wr_end(a->m, off, n, m);
        if (v) ag_wr_end(a->v, off, n, v);
        if (a->master.p) ag_vec_copy(ag_buf_at(a->w, off), ag_buf_f32(w), n);
    }
}

#if defined(__x86_64__)
// Lines [lo, hi) of 16 elements.
static void mixed_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const typed_args *a = p;
    size_t b = (size_t)lo * 16, e = (size_t)hi * 16 < a->n ? (size_t)hi * 16 : a->n;
    adam_mixed_avx512(&a->k, a->master.p, a->g.p, a->m.p, a->v.p, a->w.p, b, e);
}
#endif

bool optim_update_is_typed(const optim_slot *s) {
    return s->param->dtype != AG_F32 || s->param->grad->dtype != AG_F32 || s->master.bytes ||
           (s->state[0].bytes && s->state[0].bytes != (size_t)s->param->numel * sizeof(float));
}

void optim_update_typed(const optim_config *c, optim_slot *s) {
    const ag_dtype st = optim_param_state_bits(c, s->param) == 16 ? (c->state_fp16 ? AG_F16 : AG_BF16) : AG_F32;
    typed_args a = {.c = c, .s = s, .k = optim_adam_consts_of(c, s), .n = (size_t)s->param->numel};
    a.w = ag_buf_of(s->param), a.g = ag_buf_of(s->param->grad);
    a.m = (ag_buf){s->state[0].data, st}, a.v = (ag_buf){s->state[1].data, st};
    a.master = (ag_buf){s->master.data, AG_F32};
#if defined(__x86_64__)
    if ((c->kind == OPTIM_ADAM || c->kind == OPTIM_ADAMW) && a.master.p && a.w.t == AG_BF16 && a.g.t == AG_BF16 &&
        st == AG_F32 && has_avx512_bw()) {
        ag_parallel_for((int64_t)(a.n + 15) / 16, OPTIM_PAR_GRAIN / 16, mixed_part, &a);
        return;
    }
#endif
    ag_parallel_for((int64_t)(a.n + BLK - 1) / BLK, OPTIM_PAR_GRAIN / BLK, typed_part, &a);
}
