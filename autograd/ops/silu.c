// silu: y = x * sigmoid(x).
#include <math.h>

#include "ag_ops.h"

#if defined(__x86_64__)
AG_AVX512 static __m512 neg16(__m512 x) {
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), sign));
}

// The loops below, 16 lanes at a time: the same operations in the same order, ag_exp16 for expf.
AG_AVX512 static void silu_fwd_avx512(float *y, const float *x, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mk = ag_mask16(n - i);
        __m512 xv = _mm512_maskz_loadu_ps(mk, x + i);
        __m512 e = ag_exp16(neg16(xv));
        _mm512_mask_storeu_ps(y + i, mk, _mm512_div_ps(xv, _mm512_add_ps(one, e)));
    }
}

AG_AVX512 static void silu_bwd_avx512(float *dx, const float *dy, const float *x, int64_t n, bool fresh) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mk = ag_mask16(n - i);
        __m512 xv = _mm512_maskz_loadu_ps(mk, x + i);
        __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, ag_exp16(neg16(xv))));
        __m512 t = _mm512_add_ps(one, _mm512_mul_ps(xv, _mm512_sub_ps(one, s)));
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, dy + i), s), t);
        if (!fresh) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, dx + i), v);
        _mm512_mask_storeu_ps(dx + i, mk, v);
    }
}
#endif

static void silu_fwd(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
}

static void silu_bwd(float *dx, const float *dy, const float *x, int64_t n, bool fresh) {
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-x[i]));
        float v = dy[i] * s * (1.0f + x[i] * (1.0f - s));
        dx[i] = fresh ? v : dx[i] + v;
    }
}

typedef struct {
    ag_buf out, x, dy; // dy.p: NULL in forward
    bool fresh;
} silu_args;

static void silu_block(const silu_args *a, float *y, const float *x, const float *dy, int64_t n) {
    bool vec = false;
#if defined(__x86_64__)
    vec = ag_has_avx512();
    if (vec && !dy) silu_fwd_avx512(y, x, n);
    if (vec && dy) silu_bwd_avx512(y, dy, x, n, a->fresh);
#endif
    if (!vec && !dy) silu_fwd(y, x, n);
    if (!vec && dy) silu_bwd(y, dy, x, n, a->fresh);
}

static void silu_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const silu_args *a = p;
    float xb[AG_BLK], gb[AG_BLK], ob[AG_BLK];
    for (int64_t i = lo; i < hi; i += AG_BLK) {
        int64_t n = hi - i < AG_BLK ? hi - i : AG_BLK;
        const float *x = ag_rd(a->x, i, n, xb), *dy = a->dy.p ? ag_rd(a->dy, i, n, gb) : NULL;
        float *o = dy && !a->fresh ? ag_rw(a->out, i, n, ob) : ag_wr(a->out, i, ob);
        silu_block(a, o, x, dy, n);
        ag_wr_end(a->out, i, n, o);
    }
}

// Backward needs x: dy/dx = s (1 + x (1 - s)), s = sigmoid(x). Keeping y instead would not
// spare x's sigmoid, and x is usually kept alive anyway (by the gate projection's output).
static void silu_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || mp_is_meta()) return;
    silu_args a = {ag_dst_buf(&d), ag_buf_of(n->state.silu.x), {(void *)dy, n->grad_dtype}, d.fresh};
    ag_parallel_for(n->numel, AG_PAR_GRAIN_EXP, silu_part, &a);
}

static const ag_op silu_op = {.name = "silu", .backward = silu_backward, .nsaved = AG_NSAVED(silu)};

ag_tensor *ag_silu(ag_ctx *ctx, const char *site, ag_tensor *x) {
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "silu", site, 1, ins, (const char *[]){"x"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    ag_tensor *y = ag_tensor_like(ctx, x, MP_ACTIVATION, s.out);
    if (!y) return NULL;
    if (!mp_is_meta()) {
        silu_args a = {ag_buf_of(y), ag_buf_of(x), {0}, false};
        ag_parallel_for(x->numel, AG_PAR_GRAIN_EXP, silu_part, &a);
    }
    if (!ag_any_needs_grad(ctx, 1, ins)) return y;
    ag_node *n = ag_record(ctx, &silu_op, s.base, y, 1, ins);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    n->state.silu.x = ag_retain(x);
    return y;
}
