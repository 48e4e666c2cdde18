// int8 dynamic linear: PyTorch's nn.quantized.dynamic.Linear (quantize_dynamic, qint8 weights).
//
// The activation's zero point enters only through the weight's row sums: Σ (xq - zp) wq =
// Σ xq wq - zp Σ wq, and vpdpbusd multiplies unsigned xq by signed wq, so the sums are taken in
// the same sweep (one more vpdpbusd of ones against each weight vector) and the weight is read
// once per call. The weight is stored in blocks of 4 rows, each block's rows interleaved 64 bytes
// at a time (ag_q8_offset): a kernel sweeping 4 rows at once reads one sequential stream.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ag_kernels.h"

#define Q8_SMALL_SCALE 6.1e-5f // PyTorch's SMALL_SCALE_THRESHOLD
#define Q8_BLOCK_ROWS 4        // the weight's rows interleaved in blocks of this many
#define Q8_CHUNK 64            // bytes of a row at a time
#define Q8_AHEAD_BYTES 4096    // the weight's prefetch distance (farther streamed slower from memory)

size_t ag_q8_offset(int64_t N, int64_t K, int64_t n, int64_t k) {
    int64_t b = n / Q8_BLOCK_ROWS, r = N - b * Q8_BLOCK_ROWS < Q8_BLOCK_ROWS ? N - b * Q8_BLOCK_ROWS : Q8_BLOCK_ROWS;
    int64_t c = k / Q8_CHUNK, wc = K - c * Q8_CHUNK < Q8_CHUNK ? K - c * Q8_CHUNK : Q8_CHUNK;
    return (size_t)(b * Q8_BLOCK_ROWS * K + c * Q8_CHUNK * r + (n % Q8_BLOCK_ROWS) * wc + k % Q8_CHUNK);
}

void ag_q8_pack_weight(const int8_t *q, int64_t N, int64_t K, int8_t *packed) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t k0 = 0; k0 < K; k0 += Q8_CHUNK) {
            int64_t wc = K - k0 < Q8_CHUNK ? K - k0 : Q8_CHUNK;
            memcpy(packed + ag_q8_offset(N, K, n, k0), q + n * K + k0, (size_t)wc);
        }
}

void ag_q8_unpack_row(const int8_t *packed, int64_t N, int64_t K, int64_t n, int8_t *row) {
    for (int64_t k0 = 0; k0 < K; k0 += Q8_CHUNK) {
        int64_t wc = K - k0 < Q8_CHUNK ? K - k0 : Q8_CHUNK;
        memcpy(row + k0, packed + ag_q8_offset(N, K, n, k0), (size_t)wc);
    }
}

// packed: q in ag_q8_offset's order, else row-major.
static void quantize_weight(const float *w, int64_t N, int64_t K, int8_t *q, float *scale, bool packed) {
    // MinMaxObserver, per_tensor_symmetric: max(-min(w, 0), max(w, 0)) / ((127 - -128) / 2).
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < N * K; i++) {
        lo = w[i] < lo ? w[i] : lo;
        hi = w[i] > hi ? w[i] : hi;
    }
    float amax = -lo > hi ? -lo : hi, s = amax / 127.5f;
    s = s > FLT_EPSILON ? s : FLT_EPSILON;
    float inv = 1.0f / s; // quantize_val multiplies by the float reciprocal
    for (int64_t n = 0; n < N; n++)
        for (int64_t k0 = 0; k0 < K; k0 += Q8_CHUNK) {
            int64_t wc = K - k0 < Q8_CHUNK ? K - k0 : Q8_CHUNK;
            int8_t *d = q + (packed ? ag_q8_offset(N, K, n, k0) : (size_t)(n * K + k0));
            for (int64_t k = 0; k < wc; k++) {
                float r = nearbyintf(w[n * K + k0 + k] * inv);
                d[k] = (int8_t)(r < -128.0f ? -128 : r > 127.0f ? 127 : r);
            }
        }
    *scale = s;
}

void ag_q8_quantize_weight(const float *w, int64_t N, int64_t K, int8_t *q, float *scale) {
    quantize_weight(w, N, K, q, scale, false);
}

void ag_q8_quantize_weight_packed(const float *w, int64_t N, int64_t K, int8_t *q, float *scale) {
    quantize_weight(w, N, K, q, scale, true);
}

// quant_utils::ChooseQuantizationParams(min, max, 0, 255, preserve_sparsity false, power of two
// false, reduce_range true), double where PyTorch computes in double.
static ag_q8_act_params choose(float min, float max) {
    const int32_t qmin = 0, qmax = 255 / 2;
    min = min < 0.0f ? min : 0.0f;
    max = max > 0.0f ? max : 0.0f;
    double scale = ((double)max - min) / (qmax - qmin);
    if ((float)scale == 0.0f || isinf(1.0f / (float)scale)) scale = 0.1;
    if (scale < Q8_SMALL_SCALE) {
        float org = (float)scale;
        scale = Q8_SMALL_SCALE;
        if (min == 0.0f)
            max = Q8_SMALL_SCALE * (float)(qmax - qmin);
        else if (max == 0.0f)
            min = -Q8_SMALL_SCALE * (float)(qmax - qmin);
        else {
            float amp = Q8_SMALL_SCALE / org;
            min *= amp;
            max *= amp;
        }
    }
    // The zero point from the end whose terms are smaller (less rounding), nudged to an integer.
    double from_min = qmin - min / scale, from_max = qmax - max / scale;
    double err_min = abs(qmin) - fabs(min / scale), err_max = abs(qmax) - fabs(max / scale);
    double z = err_min < err_max ? from_min : from_max;
    int32_t zp = z < qmin ? qmin : z > qmax ? qmax : (int32_t)nearbyint(z);
    return (ag_q8_act_params){(float)scale, zp, qmax};
}

#if defined(__x86_64__)
// The same min and max in 16 lanes: min_ps(x, lo) keeps lo when x is NaN, as the loop below.
__attribute__((target("avx512f"))) static void min_max_avx512(const float *x, int64_t n, float *lo, float *hi) {
    __m512 l = _mm512_set1_ps(x[0]), h = l;
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = ag_lanes16(n - i);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        l = _mm512_mask_min_ps(l, m, v, l);
        h = _mm512_mask_max_ps(h, m, v, h);
    }
    float ls[16], hs[16];
    _mm512_storeu_ps(ls, l);
    _mm512_storeu_ps(hs, h);
    *lo = ls[0], *hi = hs[0];
    for (int k = 1; k < 16; k++) {
        *lo = ls[k] < *lo ? ls[k] : *lo;
        *hi = hs[k] > *hi ? hs[k] : *hi;
    }
}
#endif

ag_q8_act_params ag_q8_choose_act_params(const float *x, int64_t n) {
    float lo = 0.0f, hi = 0.0f; // an empty input: PyTorch's min = max = 0
    if (n > 0) lo = hi = x[0];
#if defined(__x86_64__)
    if (n > 0 && ag_cpu_avx512()) {
        min_max_avx512(x, n, &lo, &hi);
        return choose(lo, hi);
    }
#endif
    for (int64_t i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    return choose(lo, hi);
}

// x * (1 / scale) + zp in float32 (two roundings, no fused multiply-add), then to nearest even.
static inline uint8_t quant1(float x, float inv, float zp, float qmax) {
    float r = nearbyintf(x * inv + zp);
    return (uint8_t)(r < 0.0f ? 0.0f : r > qmax ? qmax : r);
}

#if defined(__x86_64__)
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define VNNI_INLINE static inline __attribute__((always_inline)) VNNI_TARGET

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void quantize_avx512(const float *x, int64_t n, float inv,
                                                                                 float zp, float qmax, uint8_t *q) {
    __m512 vi = _mm512_set1_ps(inv), vz = _mm512_set1_ps(zp), vmax = _mm512_set1_ps(qmax);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = ag_lanes16(n - i);
        __m512 t = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vi), vz);
        t = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        t = _mm512_min_ps(_mm512_max_ps(t, _mm512_setzero_ps()), vmax);
        _mm_mask_storeu_epi8(q + i, m, _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(t)));
    }
}
#endif

void ag_q8_quantize_act(const float *x, int64_t n, ag_q8_act_params p, uint8_t *q) {
    float inv = 1.0f / p.scale, zp = (float)p.zero_point, qmax = (float)p.qmax;
#if defined(__x86_64__)
    if (ag_cpu_avx512()) return quantize_avx512(x, n, inv, zp, qmax, q);
#endif
    for (int64_t i = 0; i < n; i++) q[i] = quant1(x[i], inv, zp, qmax);
}

typedef struct {
    const uint8_t *xq;
    const int8_t *wq;
    const float *bias;
    float *y;
    int64_t M, N, K;
    int32_t zp;
    float s; // x_scale w_scale
} q8_args;

// The float32 result of one output from its integer sums, as the dequantisation does it.
static inline float q8_out(const q8_args *a, int32_t acc, int32_t rowsum, int64_t n) {
    float v = (float)(acc - a->zp * rowsum) * a->s;
    return a->bias ? v + a->bias[n] : v;
}

static void q8_rows_portable(const q8_args *a, int64_t n0, int64_t n1) {
    const int64_t K = a->K;
    for (int64_t n = n0; n < n1; n++) {
        int32_t rs = 0;
        for (int64_t k0 = 0; k0 < K; k0 += Q8_CHUNK) {
            const int8_t *w = a->wq + ag_q8_offset(a->N, K, n, k0);
            for (int64_t k = 0; k < Q8_CHUNK && k0 + k < K; k++) rs += w[k];
        }
        for (int64_t m = 0; m < a->M; m++) {
            const uint8_t *x = a->xq + m * K;
            int32_t acc = 0;
            for (int64_t k0 = 0; k0 < K; k0 += Q8_CHUNK) {
                const int8_t *w = a->wq + ag_q8_offset(a->N, K, n, k0);
                for (int64_t k = 0; k < Q8_CHUNK && k0 + k < K; k++) acc += (int32_t)x[k0 + k] * (int32_t)w[k];
            }
            a->y[m * a->N + n] = q8_out(a, acc, rs, n);
        }
    }
}

#if defined(__x86_64__)
#define Q8_MR 4
#define Q8_NR Q8_BLOCK_ROWS

// The sums of four vectors of int32 at once (as hsum4 for floats).
VNNI_INLINE __m128i hsum4_epi32(__m512i a, __m512i b, __m512i c, __m512i d) {
    __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// mr rows of xq against nr rows of wq, 64 k a step; the row sums of wq come with the first tile.
// Rows n0.. are rows jb.. of their block of r rows (a whole block: r 4, jb 0).
VNNI_INLINE void q8_tile(const q8_args *a, int mr, int nr, int64_t m0, int64_t n0, int r, int jb, int32_t *rs,
                         bool sums) {
    const int64_t K = a->K;
    const int8_t *block = a->wq + (n0 - jb) * K;
    __m512i acc[Q8_MR][Q8_NR], sv[Q8_NR];
    const __m512i ones = _mm512_set1_epi8(1);
#pragma GCC unroll 4
    for (int j = 0; j < nr; j++) {
        sv[j] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) acc[i][j] = _mm512_setzero_si512();
    }
    for (int64_t k = 0; k < K; k += 64) {
        __mmask64 mk = K - k >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (K - k)) - 1);
        __m512i wv[Q8_NR];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            const int8_t *w = block + k * r + (jb + j) * (K - k < Q8_CHUNK ? K - k : Q8_CHUNK);
            wv[j] = _mm512_maskz_loadu_epi8(mk, w);
            // Into L1, a few KB ahead: farther (or into L2 only) streamed slower from memory here.
            _mm_prefetch((const char *)(w + Q8_AHEAD_BYTES), _MM_HINT_T0);
            if (sums) sv[j] = _mm512_dpbusd_epi32(sv[j], ones, wv[j]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            __m512i xv = _mm512_maskz_loadu_epi8(mk, a->xq + (m0 + i) * K + k);
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], xv, wv[j]);
        }
    }
    if (sums) {
        if (nr == Q8_NR)
            _mm_storeu_si128((__m128i *)rs, hsum4_epi32(sv[0], sv[1], sv[2], sv[3]));
        else
            for (int j = 0; j < nr; j++) rs[j] = _mm512_reduce_add_epi32(sv[j]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        float *y = a->y + (m0 + i) * a->N + n0;
        if (nr == Q8_NR) { // four outputs at once, the same arithmetic as q8_out
            __m128i d = _mm_sub_epi32(hsum4_epi32(acc[i][0], acc[i][1], acc[i][2], acc[i][3]),
                                      _mm_mullo_epi32(_mm_set1_epi32(a->zp), _mm_loadu_si128((const __m128i *)rs)));
            __m128 v = _mm_mul_ps(_mm_cvtepi32_ps(d), _mm_set1_ps(a->s));
            if (a->bias) v = _mm_add_ps(v, _mm_loadu_ps(a->bias + n0));
            _mm_storeu_ps(y, v);
        } else {
            for (int j = 0; j < nr; j++) y[j] = q8_out(a, _mm512_reduce_add_epi32(acc[i][j]), rs[j], n0 + j);
        }
    }
}

VNNI_TARGET static void q8_rows_vnni(const q8_args *a, int nr, int64_t n0, int r, int jb) {
    int32_t rs[Q8_NR] = {0};
    int64_t m = 0;
    for (; m + Q8_MR <= a->M; m += Q8_MR) q8_tile(a, Q8_MR, nr, m, n0, r, jb, rs, m == 0);
    bool sums = m == 0;
    switch (a->M - m) {
    case 3: q8_tile(a, 3, nr, m, n0, r, jb, rs, sums); break;
    case 2: q8_tile(a, 2, nr, m, n0, r, jb, rs, sums); break;
    case 1: q8_tile(a, 1, nr, m, n0, r, jb, rs, sums); break;
    default: break;
    }
}

// Each block of the weight's rows is swept once for a block of x rows; x stays in L2.
VNNI_TARGET static void q8_part_vnni(const q8_args *a, int64_t b0, int64_t b1) {
    ag_prefetch_start(a->wq + b0 * Q8_NR * a->K, Q8_AHEAD_BYTES);
    for (int64_t b = b0; b < b1; b++) {
        int64_t n0 = b * Q8_NR;
        if (n0 + Q8_NR <= a->N)
            q8_rows_vnni(a, Q8_NR, n0, Q8_NR, 0);
        else
            for (int64_t n = n0; n < a->N; n++) q8_rows_vnni(a, 1, n, (int)(a->N - n0), (int)(n - n0));
    }
}
#endif

static void q8_part(void *p, int64_t b0, int64_t b1, int thread) {
    (void)thread;
    const q8_args *a = p;
#if defined(__x86_64__)
    if (ag_cpu_avx512_vnni()) return q8_part_vnni(a, b0, b1);
#endif
    q8_rows_portable(a, b0 * Q8_BLOCK_ROWS, b1 * Q8_BLOCK_ROWS < a->N ? b1 * Q8_BLOCK_ROWS : a->N);
}

bool ag_q8_linear_group(const float *x, int64_t M, int64_t K, int n, const ag_q8_weight *w, float *const y[]) {
    if (n < 1 || n > AG_JOBS_MAX) return false;
    // A decode step's few rows stay on the stack: a malloc a linear is a tenth of a small one's time.
    uint8_t small[AG_KERNEL_STACK_BYTES];
    uint8_t *xq = M * K <= (int64_t)sizeof small ? small : malloc((size_t)(M * K));
    if (!xq) return false;
    double t0 = ag_blas_clock(), flops = 0;
    // quantize_dynamic quantises x in each Linear, the same way each time: once serves them all.
    ag_q8_act_params p = ag_q8_choose_act_params(x, M * K);
    ag_q8_quantize_act(x, M * K, p, xq);
    q8_args a[AG_JOBS_MAX];
    ag_job jobs[AG_JOBS_MAX];
    for (int i = 0; i < n; i++) {
        a[i] = (q8_args){xq, w[i].q, w[i].bias, y[i], M, w[i].N, K, p.zero_point, p.scale * w[i].scale};
        // Blocks of 4 weight rows; a chunk streams at least 32 K weights, as the other skinny
        // kernels (a decode's key and value projections, 110 K weights, then still split).
        jobs[i] = (ag_job){q8_part, &a[i], (w[i].N + 3) / 4, ((int64_t)1 << 15) / (4 * K + 1) + 1};
        flops += 2.0 * (double)M * (double)w[i].N * (double)K;
    }
    ag_parallel_jobs(n, jobs);
    ag_blas_account(t0, n, flops);
    if (xq != small) free(xq);
    return true;
}

bool ag_q8_linear(const float *x, int64_t M, int64_t K, const int8_t *wq, float w_scale, int64_t N, const float *bias,
                  float *y) {
    return ag_q8_linear_group(x, M, K, 1, &(ag_q8_weight){wq, w_scale, N, bias}, &y);
}
