// int4 weight-only linear: int4 weights with a float16 scale per group of a row, float32 x and y.
//
// Decode (few rows): the packed weight is streamed once, each 16-byte load giving 32 weights
// (low nibbles the even elements, high nibbles the odd ones), dequantised in registers and
// multiplied by x whose blocks of 32 were split into even and odd halves once per call, so the
// nibbles need no interleaving. More rows: tiles of the weight dequantised to float32 for sgemm.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ag_kernels.h"

static int64_t groups_of(int64_t K, int64_t group) { return (K + group - 1) / group; }

size_t ag_q4_bytes(int64_t N, int64_t K, int64_t group) {
    uint64_t numel = (uint64_t)N * (uint64_t)K;
    return (size_t)((numel * 4 + 7) / 8 + (uint64_t)N * (uint64_t)groups_of(K, group) * 2);
}

// The scales start right after the nibbles, at any byte: read and written with memcpy.
static const uint8_t *scales_of(const void *block, int64_t N, int64_t K) {
    return (const uint8_t *)block + ((uint64_t)N * (uint64_t)K + 1) / 2;
}
static inline uint16_t scale_at(const uint8_t *sc, int64_t i) {
    uint16_t h;
    memcpy(&h, sc + 2 * i, 2);
    return h;
}

void ag_q4_quantize_weight(const float *w, int64_t N, int64_t K, int64_t group, void *block) {
    uint8_t *q = block;
    int64_t G = groups_of(K, group);
    uint8_t *sc = q + ((uint64_t)N * (uint64_t)K + 1) / 2;
    memset(q, 0, ((size_t)N * (size_t)K + 1) / 2);
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++) {
            int64_t k0 = g * group, k1 = k0 + group < K ? k0 + group : K;
            float amax = 0.0f;
            for (int64_t k = k0; k < k1; k++) amax = fabsf(w[n * K + k]) > amax ? fabsf(w[n * K + k]) : amax;
            uint16_t s16 = ag_f16_from_f32(amax / 7.0f);
            float s = ag_f16_to_f32(s16);
            if (!(s > 0.0f) || isinf(s)) s16 = 0x3C00, s = 1.0f; // all zero (or beyond float16): scale 1
            memcpy(sc + 2 * (n * G + g), &s16, 2);
            for (int64_t k = k0; k < k1; k++) {
                float r = nearbyintf(w[n * K + k] / s);
                int v = r < -8.0f ? -8 : r > 7.0f ? 7 : (int)r;
                uint64_t e = (uint64_t)(n * K + k);
                q[e / 2] |= (uint8_t)((unsigned)(v & 15) << (4 * (e & 1)));
            }
        }
}

void ag_q4_dequantize_rows(const void *block, int64_t N, int64_t K, int64_t group, int64_t n0, int64_t n1, float *w) {
    const uint8_t *q = block;
    const uint8_t *sc = scales_of(block, N, K);
    int64_t G = groups_of(K, group);
    for (int64_t n = n0; n < n1; n++)
        for (int64_t g = 0; g < G; g++) {
            float s = ag_f16_to_f32(scale_at(sc, n * G + g));
            int64_t k1 = (g + 1) * group < K ? (g + 1) * group : K;
            for (int64_t k = g * group; k < k1; k++) {
                uint64_t e = (uint64_t)(n * K + k);
                int v = (q[e / 2] >> (4 * (e & 1))) & 15;
                w[(n - n0) * K + k] = (float)(v >= 8 ? v - 16 : v) * s;
            }
        }
}

typedef struct {
    const float *x; // as given, or (fast path) split into even / odd halves per 32
    const uint8_t *q;
    const uint8_t *sc; // float16 scales, unaligned
    const float *bias;
    float *y;
    int64_t M, N, K, group, G;
    int64_t ahead; // fast path: rows the prefetch runs ahead (4 KB and a tile)
} q4_args;

// ---- tiles dequantised to float32, then sgemm ----

static float q4_at(const q4_args *a, int64_t n, int64_t k) {
    uint64_t e = (uint64_t)(n * a->K + k);
    int v = (a->q[e / 2] >> (4 * (e & 1))) & 15;
    return (float)(v >= 8 ? v - 16 : v) * ag_f16_to_f32(scale_at(a->sc, n * a->G + k / a->group));
}

static void tiled_part(void *p, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const q4_args *a = p;
    float *w = ag_kernel_ws((size_t)AG_Q4_TILE_ROWS * (size_t)a->K * sizeof(float));
    for (int64_t t = t0; t < t1; t++) {
        int64_t n0 = t * AG_Q4_TILE_ROWS, n1 = n0 + AG_Q4_TILE_ROWS < a->N ? n0 + AG_Q4_TILE_ROWS : a->N;
        if (!w) { // no workspace: one element at a time
            for (int64_t m = 0; m < a->M; m++)
                for (int64_t n = n0; n < n1; n++) {
                    float acc = 0.0f;
                    for (int64_t k = 0; k < a->K; k++) acc += a->x[m * a->K + k] * q4_at(a, n, k);
                    a->y[m * a->N + n] = acc + (a->bias ? a->bias[n] : 0.0f);
                }
            continue;
        }
        ag_q4_dequantize_rows(a->q, a->N, a->K, a->group, n0, n1, w);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)a->M, (blasint)(n1 - n0), (blasint)a->K, 1.0f,
                    a->x, (blasint)a->K, w, (blasint)a->K, 0.0f, a->y + n0, (blasint)a->N);
        if (a->bias)
            for (int64_t m = 0; m < a->M; m++)
                for (int64_t n = n0; n < n1; n++) a->y[m * a->N + n] += a->bias[n];
    }
}

#if defined(__x86_64__)
#define Q4_MR 4
#define Q4_NR 4
#define Q4_SWIN 64 // scales converted at a time
#define Q4_AHEAD_BYTES 4096
#define Q4_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))
#define Q4_INLINE static inline __attribute__((always_inline)) Q4_TARGET

// y[mr, nr] = x'[mr, K] · dequant(w[nr, K])ᵀ (+ bias), 32 k a step. Each group's 16 possible
// weights q s form a table; vpermps picks entries by the low 4 bits of each 32-bit lane, which
// hold a byte's low nibble as loaded and its high nibble after a shift by 4: no sign extension
// or conversion per weight, and q s is exact (int4 times a float16).
Q4_INLINE void q4_tile(const q4_args *a, int mr, int nr, int64_t m0, int64_t n0) {
    const int64_t K = a->K;
    const __m512 base = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
    const uint8_t *q[Q4_NR];
    const uint8_t *sc[Q4_NR];
#pragma GCC unroll 4
    for (int j = 0; j < nr; j++) q[j] = a->q + (n0 + j) * K / 2, sc[j] = a->sc + 2 * (n0 + j) * a->G;
    const float *x[Q4_MR];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) x[i] = a->x + (m0 + i) * K;
    __m512 acc[Q4_MR][Q4_NR], acc2[Q4_MR][Q4_NR]; // even and odd elements: two chains of FMAs
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) acc[i][j] = acc2[i][j] = _mm512_setzero_ps();
    // The scales of the rows ahead: their own stream, which the hardware does not fetch in time.
    _mm_prefetch((const char *)(sc[0] + 2 * a->ahead * a->G), _MM_HINT_T0);
    _mm_prefetch((const char *)(sc[0] + 2 * (a->ahead + nr) * a->G - 1), _MM_HINT_T0);
    float sf[Q4_NR][Q4_SWIN]; // a window of each row's scales as float32, broadcast from memory
    for (int64_t g = 0; g < a->G; g++) {
        if (g % Q4_SWIN == 0) {
            int64_t left = a->G - g < Q4_SWIN ? a->G - g : Q4_SWIN;
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++)
                for (int64_t t = 0; t < left; t += 16) {
                    __mmask16 m = ag_lanes16(left - t);
                    __m256i h = _mm256_maskz_loadu_epi16(m, sc[j] + 2 * (g + t));
                    _mm512_storeu_ps(&sf[j][t], _mm512_cvtph_ps(h));
                }
        }
        __m512 lut[Q4_NR];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) lut[j] = _mm512_mul_ps(base, _mm512_set1_ps(sf[j][g % Q4_SWIN]));
        int64_t k1 = (g + 1) * a->group < K ? (g + 1) * a->group : K;
        for (int64_t k = g * a->group; k < k1; k += 32) {
            __m512 we[Q4_NR], wo[Q4_NR];
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++) {
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q[j] + k / 2)));
                we[j] = _mm512_permutexvar_ps(v, lut[j]);
                wo[j] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut[j]);
                if (k % 128 == 0) _mm_prefetch((const char *)(q[j] + a->ahead * K / 2 + k / 2), _MM_HINT_T0);
            }
#pragma GCC unroll 4
            for (int i = 0; i < mr; i++) {
                __m512 xe = _mm512_loadu_ps(x[i] + k), xo = _mm512_loadu_ps(x[i] + k + 16);
#pragma GCC unroll 4
                for (int j = 0; j < nr; j++) {
                    acc[i][j] = _mm512_fmadd_ps(xe, we[j], acc[i][j]);
                    acc2[i][j] = _mm512_fmadd_ps(xo, wo[j], acc2[i][j]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        float sum[Q4_NR];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_add_ps(acc[i][j], acc2[i][j]);
        if (nr == Q4_NR)
            _mm_storeu_ps(sum, hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        else
            for (int j = 0; j < nr; j++) sum[j] = _mm512_reduce_add_ps(acc[i][j]);
        for (int j = 0; j < nr; j++) a->y[(m0 + i) * a->N + n0 + j] = sum[j] + (a->bias ? a->bias[n0 + j] : 0.0f);
    }
}

Q4_TARGET static void q4_rows(const q4_args *a, int nr, int64_t n0) {
    int64_t m = 0;
    for (; m + Q4_MR <= a->M; m += Q4_MR) q4_tile(a, Q4_MR, nr, m, n0);
    switch (a->M - m) {
    case 3: q4_tile(a, 3, nr, m, n0); break;
    case 2: q4_tile(a, 2, nr, m, n0); break;
    case 1: q4_tile(a, 1, nr, m, n0); break;
    default: break;
    }
}

static void fused_part(void *p, int64_t b0, int64_t b1, int thread) {
    (void)thread;
    const q4_args *a = p;
    ag_prefetch_start(a->q + b0 * Q4_NR * a->K / 2, (size_t)(a->ahead * a->K / 2));
    for (int64_t b = b0; b < b1; b++) {
        int64_t n0 = b * Q4_NR;
        if (n0 + Q4_NR <= a->N)
            q4_rows(a, Q4_NR, n0);
        else
            for (int64_t n = n0; n < a->N; n++) q4_rows(a, 1, n);
    }
}

// x's blocks of 32 as [16 even elements, 16 odd ones], the order the nibbles come in.
static void split_even_odd(const float *x, int64_t n, float *out) {
    for (int64_t b = 0; b < n; b += 32)
        for (int i = 0; i < 16; i++) {
            out[b + i] = x[b + 2 * i];
            out[b + 16 + i] = x[b + 2 * i + 1];
        }
}
#endif

bool ag_q4_linear_group(const float *x, int64_t M, int64_t K, int n, const ag_q4_weight *w, float *const y[]) {
    if (n < 1 || n > AG_JOBS_MAX) return false;
#if defined(__x86_64__)
    bool fused = ag_cpu_avx512() && ag_cpu_f16c() && M >= 1 && M <= AG_SKINNY_MAX_M && K % 32 == 0;
    for (int i = 0; i < n; i++) fused = fused && w[i].group % 32 == 0;
    if (fused) {
        double t0 = ag_blas_clock(), flops = 0;
        float small[AG_KERNEL_STACK_BYTES / sizeof(float)];
        float *xs = M * K <= (int64_t)(sizeof small / sizeof *small) ? small : malloc((size_t)(M * K) * sizeof(float));
        if (!xs) return false;
        split_even_odd(x, M * K, xs); // once for all the weights
        q4_args a[AG_JOBS_MAX];
        ag_job jobs[AG_JOBS_MAX];
        for (int i = 0; i < n; i++) {
            const int64_t N = w[i].N, g = w[i].group;
            const int64_t ahead = Q4_AHEAD_BYTES / (K / 2) + Q4_NR;
            a[i] = (q4_args){
                xs, w[i].block, scales_of(w[i].block, N, K), w[i].bias, y[i], M, N, K, g, groups_of(K, g), ahead};
            int64_t grain = ((int64_t)1 << 16) / (Q4_NR * K / 2 + 1) + 1;
            jobs[i] = (ag_job){fused_part, &a[i], (N + Q4_NR - 1) / Q4_NR, grain};
            flops += 2.0 * (double)M * (double)N * (double)K;
        }
        ag_parallel_jobs(n, jobs);
        if (xs != small) free(xs);
        ag_blas_account(t0, n, flops);
        return true;
    }
#endif
    for (int i = 0; i < n; i++) {
        double t0 = ag_blas_clock();
        const int64_t N = w[i].N;
        q4_args a = {x, w[i].block, scales_of(w[i].block, N, K), w[i].bias, y[i], M, N,
                     K, w[i].group, groups_of(K, w[i].group),    0};
        if (M > 0) ag_parallel_for((N + AG_Q4_TILE_ROWS - 1) / AG_Q4_TILE_ROWS, 1, tiled_part, &a);
        ag_blas_account(t0, 1, 2.0 * (double)M * (double)N * (double)K);
    }
    return true;
}

bool ag_q4_linear(const float *x, int64_t M, int64_t K, const void *block, int64_t group, int64_t N, const float *bias,
                  float *y) {
    return ag_q4_linear_group(x, M, K, 1, &(ag_q4_weight){block, group, N, bias}, &y);
}
