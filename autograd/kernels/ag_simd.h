// AVX-512 helpers inlined by the kernels and the ops' vector loops: e^x in 16 lanes, lane masks,
// bfloat16 rounding, a 16 x 16 transpose, a tile's result and four sums at once.
#pragma once

#include <stdint.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__x86_64__)
#define AG_AVX512 __attribute__((target("avx512f,fma")))
// e^x in 16 lanes, for loops that call expf per element (softmax, silu): libm's expf is a
// scalar call, about five times slower. Cephes' expf: x = n ln2 + r, |r| <= ln2/2, e^r by a
// degree-7 polynomial, then 2^n by scalef, which also gives inf, 0 and the subnormals where
// expf does; NaN stays NaN. Within 2 ulp of expf (relative error < 2.4e-7).
static inline AG_AVX512 __m512 ag_exp16(__m512 x) {
    // Clamped only for r: beyond +-104 the result is inf or 0 whatever r is, and n keeps it so.
    __m512 xc = _mm512_min_ps(_mm512_set1_ps(104.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

// Lanes [0, left) of a 16-lane step.
static inline __mmask16 ag_mask16(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

// The same, with none when left <= 0.
static inline __mmask16 ag_lanes16(int64_t left) { return left <= 0 ? 0 : ag_mask16(left); }

#define AG_AVX512_INLINE static inline __attribute__((always_inline)) AG_AVX512

// ag_bf16_from_f32 in 16 lanes: u + 0x7FFF + (bit 16 of u), NaN lanes 0x7FC0.
static inline __attribute__((target("avx512f"))) __m256i ag_bf16_round16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)),
                                 _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
    return _mm512_cvtepi32_epi16(r);
}

// r[i] holds row i's 16 words; afterwards r[c] holds column c's (a 16 x 16 transpose of 32-bit
// words): pairs, then quads within 128-bit lanes, then the lanes themselves.
AG_AVX512_INLINE void ag_transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // u[4 g + e], lane L: rows 4g .. 4g+3 at column 4L + e.
    for (int e = 0; e < 4; e++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88), v1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xDD);
        __m512i w0 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88),
                w1 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xDD);
        r[e] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        r[8 + e] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
        r[4 + e] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        r[12 + e] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
    }
}

// One vector of a kernel's result C = alpha acc (+ C when accumulating a later block of K, else
// + beta C; beta 0 does not read C), the 16 lanes of mask m at cp.
AG_AVX512_INLINE __m512 ag_tile_result(__m512 acc, const float *cp, __mmask16 m, float alpha, float beta,
                                       bool accumulate) {
    __m512 r = _mm512_mul_ps(_mm512_set1_ps(alpha), acc);
    if (accumulate) return _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, cp));
    if (beta != 0.0f) r = _mm512_add_ps(r, _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(m, cp)));
    return r;
}

// The sums of four vectors at once: 5 additions where four reductions would take 16 (the
// additions share the multiply-add unit that bounds these kernels).
AG_AVX512_INLINE __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], then [a, b, c, d] partial sums.
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512 s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 h =
        _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
#endif
