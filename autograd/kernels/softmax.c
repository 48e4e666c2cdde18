// Softmax rows: the exponentials and their sum, a row's backward, a row's log-sum-exp (the
// eager attention's softmax, the cached attention's, the losses').
#include <math.h>

#include "ag_kernels.h"

// logsumexp of one row: max, then Σ e^(x - max) summed in double.
static float row_lse(const float *x, int64_t V) {
    float mx = x[0];
    for (int64_t j = 1; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    double sum = 0.0;
    for (int64_t j = 0; j < V; j++) sum += expf(x[j] - mx);
    return mx + (float)log(sum);
}

#if defined(__x86_64__)
// The same, 16 lanes at a time (the exponentials of a 49152-wide vocabulary dominate the op).
AG_AVX512 static float row_lse_avx512(const float *x, int64_t V) {
    __m512 mx = _mm512_set1_ps(x[0]);
    for (int64_t j = 0; j < V; j += 16) {
        __mmask16 mk = ag_mask16(V - j);
        mx = _mm512_mask_max_ps(mx, mk, _mm512_maskz_loadu_ps(mk, x + j), mx);
    }
    __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t j = 0; j < V; j += 16) {
        __mmask16 mk = ag_mask16(V - j);
        __m512 e = ag_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + j), m));
        e = _mm512_maskz_mov_ps(mk, e); // lanes past the row add nothing
        __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1));
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(hi));
    }
    return _mm512_cvtss_f32(m) + (float)log(_mm512_reduce_add_pd(_mm512_add_pd(s0, s1)));
}

#endif

float ag_row_logsumexp(const float *x, int64_t V) {
#if defined(__x86_64__)
    if (ag_has_avx512()) return row_lse_avx512(x, V);
#endif
    return row_lse(x, V);
}

#if defined(__x86_64__)
// 16 lanes of floats into two sums of 8 doubles.
AG_AVX512 static inline void add_pd16(__m512d *s0, __m512d *s1, __m512 v) {
    *s0 = _mm512_add_pd(*s0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    *s1 = _mm512_add_pd(*s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

AG_AVX512 static double exp_sum_avx512(float *y, const float *x, int64_t n, float mx, const int32_t *keep) {
    const __m512 m = _mm512_set1_ps(mx);
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 mk = ag_mask16(n - j), on = mk;
        if (keep)
            on = _mm512_mask_cmpneq_epi32_mask(mk, _mm512_maskz_loadu_epi32(mk, keep + j), _mm512_setzero_si512());
        __m512 e = _mm512_maskz_mov_ps(on, ag_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + j), m)));
        _mm512_mask_storeu_ps(y + j, mk, e);
        add_pd16(&s0, &s1, e);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

// Σ p dp in double, 16 lanes at a time (a product of two floats is exact in double, so fused
// or not, each term adds the same).
AG_AVX512 static double dot_avx512(const float *p, const float *dp, int64_t n) {
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 mk = ag_mask16(n - j);
        __m512 a = _mm512_maskz_loadu_ps(mk, p + j), b = _mm512_maskz_loadu_ps(mk, dp + j);
        __m256 alo = _mm512_castps512_ps256(a), blo = _mm512_castps512_ps256(b);
        __m256 ahi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
        __m256 bhi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(b), 1));
        s0 = _mm512_fmadd_pd(_mm512_cvtps_pd(alo), _mm512_cvtps_pd(blo), s0);
        s1 = _mm512_fmadd_pd(_mm512_cvtps_pd(ahi), _mm512_cvtps_pd(bhi), s1);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}
#endif

double ag_softmax_exp(float *y, const float *x, int64_t n, float mx, const int32_t *keep) {
#if defined(__x86_64__)
    if (ag_has_avx512()) return exp_sum_avx512(y, x, n, mx, keep);
#endif
    double sum = 0.0;
    for (int64_t j = 0; j < n; j++) sum += (y[j] = (!keep || keep[j]) ? expf(x[j] - mx) : 0.0f);
    return sum;
}

double ag_dot_f64(const float *a, const float *b, int64_t n) {
#if defined(__x86_64__)
    if (ag_has_avx512()) return dot_avx512(a, b, n);
#endif
    double dot = 0.0;
    for (int64_t j = 0; j < n; j++) dot += (double)a[j] * b[j];
    return dot;
}

void ag_softmax_backward_row(float *ds, const float *dp, const float *p, int64_t n) {
    double dot = ag_dot_f64(p, dp, n);
    for (int64_t j = 0; j < n; j++) ds[j] = p[j] * (dp[j] - (float)dot);
}
