// The element-type table and its row conversions (bfloat16, float16 <-> float32), vectorised
// with AVX-512 / F16C where the CPU has them, bit-exact with the scalar code below.
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ag_kernels.h"

// ---- float16, portable ----

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ag_f16_from_f32(float f) {
    uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu)); // quiet NaN
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);                       // >= 65520: inf
    if (a < 0x38800000u) {
        // Below 2^-14: a subnormal half. Adding 0.5 puts the value's multiples of 2^-24 in the low
        // bits of the sum's mantissa, rounded to nearest even by the addition itself.
        uint32_t s = f32_bits(f32_of(a) + 0.5f) - 0x3F000000u;
        return (uint16_t)(sign | s);
    }
    // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
    uint32_t odd = (a >> 13) & 1u;
    a += ((uint32_t)(15 - 127) << 23) + 0xFFFu + odd;
    return (uint16_t)(sign | (a >> 13));
}

float ag_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1F) return f32_of(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0)); // inf, quiet NaN
    if (e == 0) {
        float v = (float)m * 0x1p-24f; // zero or subnormal: exact
        return sign ? -v : v;
    }
    return f32_of(sign | ((e + 112u) << 23) | (m << 13));
}

// ---- rows ----

static void f32_to_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }
static void f32_from_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

#if defined(__x86_64__)
#define AG_BW __attribute__((target("avx512f,avx512bw,avx512vl")))
#define AG_F16C __attribute__((target("avx512f,f16c")))

AG_BW static void bf16_to_f32_avx512(const uint16_t *s, float *d, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = ag_lanes16(n - i);
        __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i));
        _mm512_mask_storeu_ps(d + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
}

AG_BW static void bf16_from_f32_avx512(const float *s, uint16_t *d, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = ag_lanes16(n - i);
        _mm256_mask_storeu_epi16(d + i, m, ag_bf16_round16(_mm512_maskz_loadu_ps(m, s + i)));
    }
}

AG_F16C static void f16_to_f32_f16c(const uint16_t *s, float *d, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
    for (; i < n; i++) d[i] = _cvtsh_ss(s[i]);
}

AG_F16C static void f16_from_f32_f16c(const float *s, uint16_t *d, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = _cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT);
}

// F16C without AVX-512: 8 lanes.
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c8(const uint16_t *s, float *d, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) d[i] = _cvtsh_ss(s[i]);
}

__attribute__((target("avx,f16c"))) static void f16_from_f32_f16c8(const float *s, uint16_t *d, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = _cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT);
}
#endif

static void bf16_to_f32(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
#if defined(__x86_64__)
    if (ag_cpu_avx512()) return bf16_to_f32_avx512(s, dst, n);
#endif
    for (int64_t i = 0; i < n; i++) dst[i] = ag_bf16_to_f32(s[i]);
}

static void bf16_from_f32(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
#if defined(__x86_64__)
    if (ag_cpu_avx512()) return bf16_from_f32_avx512(src, d, n);
#endif
    for (int64_t i = 0; i < n; i++) d[i] = ag_bf16_from_f32(src[i]);
}

// F16C in 16 lanes where AVX-512 is there too, else in 8.
static void f16_to_f32(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
#if defined(__x86_64__)
    if (ag_cpu_f16c()) return ag_cpu_avx512() ? f16_to_f32_f16c(s, dst, n) : f16_to_f32_f16c8(s, dst, n);
#endif
    for (int64_t i = 0; i < n; i++) dst[i] = ag_f16_to_f32(s[i]);
}

static void f16_from_f32(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
#if defined(__x86_64__)
    if (ag_cpu_f16c()) return ag_cpu_avx512() ? f16_from_f32_f16c(src, d, n) : f16_from_f32_f16c8(src, d, n);
#endif
    for (int64_t i = 0; i < n; i++) d[i] = ag_f16_from_f32(src[i]);
}

static const ag_type_traits traits[AG_NDTYPES] = {
    [AG_F32] = {"float32", 32, false, f32_to_f32, f32_from_f32},
    [AG_BF16] = {"bfloat16", 16, false, bf16_to_f32, bf16_from_f32},
    [AG_F16] = {"float16", 16, false, f16_to_f32, f16_from_f32},
    [AG_Q8] = {"int8", 8, true, NULL, NULL},
    [AG_Q4] = {"int4", 4, true, NULL, NULL},
    [AG_NF4] = {"nf4", 4, true, NULL, NULL},
};

const ag_type_traits *ag_type_traits_of(ag_dtype t) { return (int)t >= 0 && t < AG_NDTYPES ? &traits[t] : NULL; }
