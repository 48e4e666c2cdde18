// int4 weight-only linear: int4 weights with a float16 scale per group of a row, float32 x and y.
//
// Decode (few rows): the packed weight is streamed once, each 64-byte load giving 128 weights,
// dequantised in registers by a shift and a table lookup and multiplied by x, put once per call
// in the order the nibbles come in. More rows: tiles of the weight dequantised to float32 for sgemm.
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
    const float *x; // as given, or (fast path) each row's chunks of 128 in the nibbles' order
    const uint8_t *q;
    const uint8_t *sc; // float16 scales, unaligned
    const float *bias;
    float *y;
    int64_t M, N, K, group, G;
    int64_t xstride;           // fast path: floats per row of x (whole chunks, zero padded)
    const int32_t *lane_group; // fast path: 16 a chunk, the group of each lane's elements
    int64_t ahead;             // fast path: rows the prefetch runs ahead (4 KB and a tile)
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
#define Q4_CHUNK 128 // elements of a row in one 64-byte load
#define Q4_AHEAD_BYTES 4096
#define Q4_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))
#define Q4_INLINE static inline __attribute__((always_inline)) Q4_TARGET

static int64_t chunks_of(int64_t K) { return (K + Q4_CHUNK - 1) / Q4_CHUNK; }

// y[mr, nr] = x'[mr, K] · dequant(w[nr, K])ᵀ (+ bias). A row's 64 bytes at k hold elements k to
// k + 127 with lane L's 32 bits elements k + 8L to k + 8L + 7, nibble r at bits 4r: shifting by
// 4r brings element k + 8L + r to the low 4 bits of every lane, where vpermps looks up its value
// in one fixed table of the 16 int4 values. x' holds x in that order (x'[k + 16r + L] =
// x[k + 8L + r]), so the weights are never interleaved: per 16 weights a shift, a lookup and the
// multiply-add. Each lane lies in one group (group % 8 == 0); the group scales, looked up per
// lane, multiply one row's sums of a chunk (one row of x) or the weights (more rows, which share them).

Q4_INLINE void q4_tile(const q4_args *a, int mr, int nr, int64_t m0, int64_t n0) {
    const int64_t K = a->K, nc = chunks_of(K);
    const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
    const uint8_t *q[Q4_NR];
    const uint8_t *sc[Q4_NR];
#pragma GCC unroll 4
    for (int j = 0; j < nr; j++) q[j] = a->q + (n0 + j) * K / 2, sc[j] = a->sc + 2 * (n0 + j) * a->G;
    __m512 acc[Q4_MR][Q4_NR];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps();
    // The scales of the rows ahead: their own stream, which the hardware does not fetch in time.
    _mm_prefetch((const char *)(sc[0] + 2 * a->ahead * a->G), _MM_HINT_T0);
    _mm_prefetch((const char *)(sc[0] + 2 * (a->ahead + nr) * a->G - 1), _MM_HINT_T0);
    for (int64_t c = 0; c < nc; c++) {
        const int64_t k = c * Q4_CHUNK, lanes = (K - k) / 8 < 16 ? (K - k) / 8 : 16;
        const int32_t *lg = a->lane_group + 16 * c;
        const __mmask16 lm = ag_lanes16(lanes), sm = ag_lanes16(lg[lanes - 1] - lg[0] + 1);
        const __m512i idx = _mm512_sub_epi32(_mm512_loadu_si512(lg), _mm512_set1_epi32(lg[0]));
        __m512i d[Q4_NR];
        __m512 s[Q4_NR];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            d[j] = _mm512_maskz_loadu_epi32(lm, q[j] + k / 2);
            __m512 g = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(sm, sc[j] + 2 * lg[0]));
            s[j] = _mm512_permutexvar_ps(idx, g);
            _mm_prefetch((const char *)(q[j] + a->ahead * K / 2 + k / 2), _MM_HINT_T0);
        }
        if (mr == 1) { // two chains a row, scaled once a chunk
            const float *x = a->x + m0 * a->xstride + k;
            __m512 t0[Q4_NR], t1[Q4_NR];
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++) t0[j] = t1[j] = _mm512_setzero_ps();
#pragma GCC unroll 4
            for (int r = 0; r < 8; r += 2) {
                __m512 xe = _mm512_loadu_ps(x + 16 * r), xo = _mm512_loadu_ps(x + 16 * r + 16);
#pragma GCC unroll 4
                for (int j = 0; j < nr; j++) {
                    t0[j] = _mm512_fmadd_ps(xe, _mm512_permutexvar_ps(_mm512_srli_epi32(d[j], 4 * r), lut), t0[j]);
                    t1[j] = _mm512_fmadd_ps(xo, _mm512_permutexvar_ps(_mm512_srli_epi32(d[j], 4 * r + 4), lut), t1[j]);
                }
            }
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++) acc[0][j] = _mm512_fmadd_ps(_mm512_add_ps(t0[j], t1[j]), s[j], acc[0][j]);
            continue;
        }
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            __m512 w[Q4_NR];
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++)
                w[j] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(d[j], 4 * r), lut), s[j]);
#pragma GCC unroll 4
            for (int i = 0; i < mr; i++) {
                __m512 xr = _mm512_loadu_ps(a->x + (m0 + i) * a->xstride + k + 16 * r);
#pragma GCC unroll 4
                for (int j = 0; j < nr; j++) acc[i][j] = _mm512_fmadd_ps(xr, w[j], acc[i][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        float sum[Q4_NR];
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
    // A chunk of rows starts cold: its first rows are fetched before the loop's prefetch takes over.
    const uint8_t *q0 = a->q + b0 * Q4_NR * a->K / 2;
    for (int64_t o = 0; o < a->ahead * a->K / 2; o += 64) _mm_prefetch((const char *)(q0 + o), _MM_HINT_T0);
    for (int64_t b = b0; b < b1; b++) {
        int64_t n0 = b * Q4_NR;
        if (n0 + Q4_NR <= a->N)
            q4_rows(a, Q4_NR, n0);
        else
            for (int64_t n = n0; n < a->N && n < n0 + Q4_NR; n++) q4_rows(a, 1, n);
    }
}

// x's rows in the nibbles' order, each chunk of 128 as 8 vectors (vector r, lane L: element 8L + r),
// the last chunk zero padded.
Q4_TARGET static void x_in_nibble_order(const float *x, int64_t M, int64_t K, float *out) {
    const __m512i lane8 = _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k += Q4_CHUNK) {
            __mmask16 lm = ag_lanes16((K - k) / 8);
            for (int r = 0; r < 8; r++) {
                __m512i at = _mm512_add_epi32(lane8, _mm512_set1_epi32(r));
                __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lm, at, x + m * K + k, 4);
                _mm512_storeu_ps(out + m * chunks_of(K) * Q4_CHUNK + k + 16 * r, v);
            }
        }
}

// Each lane's group, 16 a chunk (a tail's unused lanes repeat its last group); no division per lane.
static void lane_groups(int64_t K, int64_t group, int32_t *lg) {
    int32_t g = 0;
    for (int64_t e = 0, left = group; e < chunks_of(K) * Q4_CHUNK; e += 8) {
        if (e < K && left == 0) g++, left = group;
        lg[e / 8] = g;
        if (e < K) left -= 8;
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
        const int64_t xstride = chunks_of(K) * Q4_CHUNK, nlg = 16 * chunks_of(K);
        const size_t bytes = (size_t)(M * xstride) * sizeof(float) + (size_t)(n * nlg) * sizeof(int32_t);
        _Alignas(64) float small[AG_KERNEL_STACK_BYTES / sizeof(float)];
        float *xs = bytes <= sizeof small ? small : malloc(bytes);
        if (!xs) return false;
        int32_t *lg = (int32_t *)(xs + M * xstride);
        x_in_nibble_order(x, M, K, xs); // once for all the weights
        q4_args a[AG_JOBS_MAX];
        ag_job jobs[AG_JOBS_MAX];
        for (int i = 0; i < n; i++) {
            const int64_t N = w[i].N, g = w[i].group;
            lane_groups(K, g, lg + i * nlg);
            a[i] = (q4_args){
                xs,      w[i].block,   scales_of(w[i].block, N, K),     w[i].bias, y[i], M, N, K, g, groups_of(K, g),
                xstride, lg + i * nlg, Q4_AHEAD_BYTES / (K / 2) + Q4_NR};
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
                     K, w[i].group, groups_of(K, w[i].group),    K,         NULL, 0};
        if (M > 0) ag_parallel_for((N + AG_Q4_TILE_ROWS - 1) / AG_Q4_TILE_ROWS, 1, tiled_part, &a);
        ag_blas_account(t0, 1, 2.0 * (double)M * (double)N * (double)K);
    }
    return true;
}

bool ag_q4_linear(const float *x, int64_t M, int64_t K, const void *block, int64_t group, int64_t N, const float *bias,
                  float *y) {
    return ag_q4_linear_group(x, M, K, 1, &(ag_q4_weight){block, group, N, bias}, &y);
}
