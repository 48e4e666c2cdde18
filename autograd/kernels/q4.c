// int4 weight-only linear: int4 weights with a float16 scale per group of a row, float32 x and y.
//
// Decode (few rows): the packed weight is streamed once, each 64-byte load giving 128 weights,
// dequantised in registers (a shift and a table pick a weight) and multiplied by x, whose blocks
// were put once per call in the order the nibbles come in, so the weights need no reordering.
// More rows, or groups the fast path does not take: tiles dequantised to float32 for sgemm.
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
    const float *x; // as given, or (fast path) in the kernel's planes
    const uint8_t *q;
    const uint8_t *sc; // float16 scales, unaligned
    const float *bias;
    float *y;
    int64_t M, N, K, group, G;
    int64_t ahead;    // fast path: rows the prefetch runs ahead (Q4_AHEAD_BYTES and a tile)
    int64_t nsc;      // fast path: the scales a block's lanes use (up to 4)
    int32_t sidx[16]; // fast path: lane d's scale among them, 8 d / group
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
#define Q4_MR 2
#define Q4_NR 4
#define Q4_BLOCK 128 // elements a block: 16 lanes of 8 nibbles each
#define Q4_AHEAD_BYTES 16384
// K rounded up to whole blocks: the length of a row of x in planes.
static inline int64_t q4_padded(int64_t K) { return (K + Q4_BLOCK - 1) / Q4_BLOCK * Q4_BLOCK; }
#define Q4_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))
#define Q4_INLINE static inline __attribute__((always_inline)) Q4_TARGET

// y[mr, nr] = x'[mr, K] · dequant(w[nr, K])ᵀ (+ bias), a block of 128 k a step. A block of a
// row is one 64-byte load of 16 lanes; plane p is each lane shifted right by 4 p, and vpermps
// picks from the 16 values an int4 can take by its low 4 bits, so a weight costs a shift, a
// pick and a multiply-add. Lane d of plane p is element 8 d + p of the block, the order x' was
// put in. A lane's 8 elements lie in one group, so its products are summed first and scaled once
// a block (the lane's scale picked by sidx).
Q4_INLINE void q4_tile(const q4_args *a, int mr, int nr, int64_t m0, int64_t n0) {
    const int64_t K = a->K, kp = q4_padded(K), blocks = kp / Q4_BLOCK;
    const int chains = mr == 1 ? 2 : 1; // multiply-add chains per output: enough to keep the units busy
    const __m512 base = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
    const __m512i sidx = _mm512_loadu_si512(a->sidx);
    const uint8_t *q[Q4_NR];
    const uint8_t *sc[Q4_NR];
#pragma GCC unroll 4
    for (int j = 0; j < nr; j++) q[j] = a->q + (n0 + j) * K / 2, sc[j] = a->sc + 2 * (n0 + j) * a->G;
    const float *x[Q4_MR];
#pragma GCC unroll 2
    for (int i = 0; i < mr; i++) x[i] = a->x + (m0 + i) * kp;
    __m512 acc[Q4_MR][Q4_NR];
#pragma GCC unroll 2
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps();
    // The scales of the rows ahead: their own stream, which the hardware does not fetch in time.
    _mm_prefetch((const char *)(sc[0] + 2 * a->ahead * a->G), _MM_HINT_T0);
    _mm_prefetch((const char *)(sc[0] + 2 * (a->ahead + nr) * a->G - 1), _MM_HINT_T0);
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t left = K - b * Q4_BLOCK, g0 = b * Q4_BLOCK / a->group;
        const __mmask16 lanes = ag_lanes16(left / 8);
        const __mmask8 smask = (__mmask8)ag_lanes16(a->G - g0 < a->nsc ? a->G - g0 : a->nsc);
        __m512i v[Q4_NR];
        __m512 s[Q4_NR];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            v[j] = left >= Q4_BLOCK ? _mm512_loadu_si512(q[j] + Q4_BLOCK / 2 * b)
                                    : _mm512_maskz_loadu_epi32(lanes, q[j] + Q4_BLOCK / 2 * b);
            _mm_prefetch((const char *)(q[j] + a->ahead * K / 2 + Q4_BLOCK / 2 * b), _MM_HINT_T0);
            __m128 s4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(smask, sc[j] + 2 * g0));
            s[j] = _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(s4));
        }
        __m512 sum[Q4_MR][Q4_NR][2];
#pragma GCC unroll 2
        for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++) sum[i][j][0] = sum[i][j][1] = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) {
            __m512 xp[Q4_MR];
#pragma GCC unroll 2
            for (int i = 0; i < mr; i++) xp[i] = _mm512_loadu_ps(x[i] + Q4_BLOCK * b + 16 * p);
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++) {
                __m512 w = _mm512_permutexvar_ps(v[j], base);
                v[j] = _mm512_srli_epi32(v[j], 4);
#pragma GCC unroll 2
                for (int i = 0; i < mr; i++) sum[i][j][p % chains] = _mm512_fmadd_ps(xp[i], w, sum[i][j][p % chains]);
            }
        }
#pragma GCC unroll 2
        for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++) {
                __m512 t = chains == 2 ? _mm512_add_ps(sum[i][j][0], sum[i][j][1]) : sum[i][j][0];
                acc[i][j] = _mm512_fmadd_ps(t, s[j], acc[i][j]);
            }
    }
#pragma GCC unroll 2
    for (int i = 0; i < mr; i++) {
        float out[Q4_NR];
        if (nr == Q4_NR)
            _mm_storeu_ps(out, hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        else
            for (int j = 0; j < nr; j++) out[j] = _mm512_reduce_add_ps(acc[i][j]);
        for (int j = 0; j < nr; j++) a->y[(m0 + i) * a->N + n0 + j] = out[j] + (a->bias ? a->bias[n0 + j] : 0.0f);
    }
}

Q4_TARGET static void q4_rows(const q4_args *a, int nr, int64_t n0) {
    int64_t m = 0;
    for (; m + Q4_MR <= a->M; m += Q4_MR) q4_tile(a, Q4_MR, nr, m, n0);
    if (m < a->M) q4_tile(a, 1, nr, m, n0);
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

// x's rows in blocks of 128 as 8 planes of 16 (plane p lane d: element 8 d + p), the order the
// kernel's lanes hold the weights in; rows padded with zeros to whole blocks.
static void to_planes(const float *x, int64_t M, int64_t K, float *out) {
    const int64_t kp = q4_padded(K);
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < kp; b += Q4_BLOCK)
            for (int p = 0; p < 8; p++)
                for (int d = 0; d < 16; d++) {
                    int64_t k = b + 8 * d + p;
                    out[m * kp + b + 16 * p + d] = k < K ? x[m * K + k] : 0.0f;
                }
}

// The fused kernel's groups: a block's lanes in at most 4 groups (group 32 or 64) or all in one.
static bool fused_group(int64_t group) { return group == 32 || group == 64 || group % Q4_BLOCK == 0; }
#endif

// The fields both paths share; the fast path adds its own.
static q4_args args_of(const float *x, int64_t M, int64_t K, const ag_q4_weight *w, float *y) {
    return (q4_args){.x = x,
                     .q = w->block,
                     .sc = scales_of(w->block, w->N, K),
                     .bias = w->bias,
                     .y = y,
                     .M = M,
                     .N = w->N,
                     .K = K,
                     .group = w->group,
                     .G = groups_of(K, w->group)};
}

bool ag_q4_linear_group(const float *x, int64_t M, int64_t K, int n, const ag_q4_weight *w, float *const y[]) {
    if (n < 1 || n > AG_JOBS_MAX) return false;
#if defined(__x86_64__)
    bool fused = ag_cpu_avx512() && ag_cpu_f16c() && M >= 1 && M <= AG_SKINNY_MAX_M && K % 32 == 0;
    for (int i = 0; i < n; i++) fused = fused && fused_group(w[i].group);
    if (fused) {
        double t0 = ag_blas_clock(), flops = 0;
        const int64_t kp = q4_padded(K);
        float small[AG_KERNEL_STACK_BYTES / sizeof(float)];
        float *xs =
            M * kp <= (int64_t)(sizeof small / sizeof *small) ? small : malloc((size_t)(M * kp) * sizeof(float));
        if (!xs) return false;
        to_planes(x, M, K, xs); // once for all the weights
        q4_args a[AG_JOBS_MAX];
        ag_job jobs[AG_JOBS_MAX];
        for (int i = 0; i < n; i++) {
            const int64_t N = w[i].N, g = w[i].group;
            const int64_t ahead = Q4_AHEAD_BYTES / (K / 2) + Q4_NR;
            a[i] = args_of(xs, M, K, &w[i], y[i]);
            a[i].ahead = ahead, a[i].nsc = g < Q4_BLOCK ? Q4_BLOCK / g : 1;
            for (int d = 0; d < 16; d++) a[i].sidx[d] = (int32_t)(8 * d / g);
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
        q4_args a = args_of(x, M, K, &w[i], y[i]);
        ag_blas_init();
        if (M > 0) ag_parallel_for((N + AG_Q4_TILE_ROWS - 1) / AG_Q4_TILE_ROWS, 1, tiled_part, &a);
        ag_blas_account(t0, 1, 2.0 * (double)M * (double)N * (double)K);
    }
    return true;
}

bool ag_q4_linear(const float *x, int64_t M, int64_t K, const void *block, int64_t group, int64_t N, const float *bias,
                  float *y) {
    return ag_q4_linear_group(x, M, K, 1, &(ag_q4_weight){block, group, N, bias}, &y);
}
