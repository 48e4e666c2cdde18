// Skinny linear kernels: few rows (tokens) against a big weight.
#include <stdint.h>
#include <string.h>

#include "ag_kernels.h"

#if defined(__x86_64__)
// ---- skinny linear kernels: few rows (tokens) against a big weight ----
//
// With M = 25 rows each weight element meets only M rows of x. OpenBLAS packs the weight into
// panels before multiplying (an extra pass over it, which M rows do not repay) and, for the
// backward, reads the weight for dx and writes dw in two separate calls. These kernels touch
// the weight once per pass: the forward reads it once; the backward reads it once for dx and
// writes dw once, in the same sweep (each chunk of the pool owns a slice of the input columns, so dx and
// dw need no reduction between threads), dw with streaming stores. What is left is the
// multiply-adds themselves: on a 2-core AVX-512 machine they run at ~90% of the measured FMA
// rate (tests/bench/bench_bandwidth), faster than the weight's bytes need. They run where
// AVX-512 is available; elsewhere the callers use sgemm.

#define SK_MR 6 // forward tile: rows of x
#define SK_NR 4 // forward tile: rows of w
#define SK_BR 8 // backward tile: rows of w

bool ag_skinny_available(int64_t M) { return ag_has_avx512() && M >= 1 && M <= AG_SKINNY_MAX_M; }

bool ag_skinny_forward_available(int64_t M) { return ag_has_avx512() && M >= 1 && M <= AG_SKINNY_FWD_MAX_M; }

// y[mr, nr] = x[mr, K] · w[nr, K]ᵀ with y's rows ldy apart.
AG_AVX512_INLINE void fwd_tile(int mr, int nr, const float *x, const float *w, int64_t K, float *y, int64_t ldy) {
    __m512 acc[SK_MR][SK_NR];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        __mmask16 mk = ag_lanes16(K - k);
        __m512 wv[SK_NR];
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            wv[j] = _mm512_maskz_loadu_ps(mk, w + j * K + k);
            // The next block into L2 only: in L1 it would take fill buffers that the hardware
            // prefetcher's streams need (8 rows: 22 ms a decode step's linears, 26 into L1).
            _mm_prefetch((const char *)(w + (j + SK_NR) * K + k), _MM_HINT_T1);
        }
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m512 xv = _mm512_maskz_loadu_ps(mk, x + i * K + k);
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (nr == 4) {
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) _mm_storeu_ps(y + i * ldy, hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        return;
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);
}

// One block of nr weight rows against all M rows of x, SK_MR rows at a time.
AG_AVX512_INLINE void fwd_rows(int nr, const float *x, const float *w, int64_t M, int64_t K, float *y, int64_t N) {
    int64_t i = 0;
    for (; i + SK_MR <= M; i += SK_MR) fwd_tile(SK_MR, nr, x + i * K, w, K, y + i * N, N);
    switch (M - i) {
    case 5: fwd_tile(5, nr, x + i * K, w, K, y + i * N, N); break;
    case 4: fwd_tile(4, nr, x + i * K, w, K, y + i * N, N); break;
    case 3: fwd_tile(3, nr, x + i * K, w, K, y + i * N, N); break;
    case 2: fwd_tile(2, nr, x + i * K, w, K, y + i * N, N); break;
    case 1: fwd_tile(1, nr, x + i * K, w, K, y + i * N, N); break;
    default: break;
    }
}

// Rows of x per pass over w: each block of 4 weight rows meets every row of the block from a
// core's L2, so the block is kept within half of it (1 MB: 168 rows at K = 1536, 450 at 576);
// more rows take several passes over w, which is in the last-level cache by then.
#define SK_XBLOCK_BYTES ((int64_t)1 << 20)

// Rows per pass: the fewest passes, rows split evenly between them in whole tiles.
static int64_t fwd_block_rows(int64_t M, int64_t K) {
    int64_t cap = SK_XBLOCK_BYTES / (K * (int64_t)sizeof(float)) / SK_MR * SK_MR;
    cap = cap < SK_MR ? SK_MR : cap;
    int64_t passes = (M + cap - 1) / cap;
    int64_t rows = (M + passes - 1) / passes;
    return (rows + SK_MR - 1) / SK_MR * SK_MR;
}

// The least weight bytes a chunk of a parallel pass streams.
#define SK_CHUNK_BYTES ((int64_t)1 << 17)

typedef struct {
    const float *x, *w, *dy;
    float *y, *dx, *dw;
    int64_t M, N, K;
    bool dx_fresh, dw_fresh, aligned;
} skinny_args;

// Blocks [lo, hi) of SK_NR weight rows against the M rows of x (one pass).
AG_AVX512 static void fwd_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const skinny_args *a = p;
    for (int64_t b = lo; b < hi; b++)
        fwd_rows(SK_NR, a->x, a->w + b * SK_NR * a->K, a->M, a->K, a->y + b * SK_NR, a->N);
}

AG_AVX512 static void skinny_forward(const float *x, const float *w, float *y, int64_t M, int64_t N, int64_t K) {
    int64_t blocks = N / SK_NR, rows = fwd_block_rows(M, K);
    int64_t grain = SK_CHUNK_BYTES / (SK_NR * K * (int64_t)sizeof(float)) + 1;
    for (int64_t m0 = 0; m0 < M; m0 += rows) {
        skinny_args a = {.x = x + m0 * K, .w = w, .y = y + m0 * N, .M = M - m0 < rows ? M - m0 : rows, .N = N, .K = K};
        ag_parallel_for(blocks, grain, fwd_part, &a);
    }
    for (int64_t n = blocks * SK_NR; n < N; n++) fwd_rows(1, x, w + n * K, M, K, y + n, N);
}

void ag_skinny_forward(const float *x, const float *w, float *y, int64_t M, int64_t N, int64_t K) {
    double t0 = ag_blas_clock();
    skinny_forward(x, w, y, M, N, K);
    ag_blas_account(t0, 1, 2.0 * (double)M * (double)N * (double)K);
}

// Weights that x meets in one pass (its rows within the L2 block) share one loop of the pool.
AG_AVX512 static void skinny_forward_group(const float *x, int64_t M, int64_t K, int n, const float *const w[],
                                           const int64_t N[], float *const y[]) {
    if (n < 1) return;
    if (n > AG_JOBS_MAX || fwd_block_rows(M, K) < M) {
        for (int i = 0; i < n; i++) skinny_forward(x, w[i], y[i], M, N[i], K);
        return;
    }
    skinny_args a[AG_JOBS_MAX];
    ag_job jobs[AG_JOBS_MAX];
    int64_t grain = SK_CHUNK_BYTES / (SK_NR * K * (int64_t)sizeof(float)) + 1;
    for (int i = 0; i < n; i++) {
        a[i] = (skinny_args){.x = x, .w = w[i], .y = y[i], .M = M, .N = N[i], .K = K};
        jobs[i] = (ag_job){fwd_part, &a[i], N[i] / SK_NR, grain};
    }
    ag_parallel_jobs(n, jobs);
    for (int i = 0; i < n; i++)
        for (int64_t r = N[i] / SK_NR * SK_NR; r < N[i]; r++) fwd_rows(1, x, w[i] + r * K, M, K, y[i] + r, N[i]);
}

void ag_skinny_forward_group(const float *x, int64_t M, int64_t K, int n, const float *const w[], const int64_t N[],
                             float *const y[]) {
    double t0 = ag_blas_clock(), flops = 0;
    skinny_forward_group(x, M, K, n, w, N, y);
    for (int i = 0; i < n; i++) flops += 2.0 * (double)M * (double)N[i] * (double)K;
    ag_blas_account(t0, n, flops);
}

// Rows n0 .. n0+nr-1 of w and dw, columns c .. c+15 (mask mk): dw[n, c] = Σ_m dy[m, n] x[m, c]
// and dx[m, c] += Σ_n dy[m, n] w[n, c]. Fresh dw is written without being read; aligned, with
// streaming stores (dw is not read again before the optimizer, and a streaming store skips
// reading the line first).
AG_AVX512_INLINE void bwd_tile(int nr, const float *dy, const float *x, const float *w, float *dx, float *dw, int64_t M,
                               int64_t N, int64_t K, int64_t n0, int64_t c, __mmask16 mk, bool fresh, bool stream) {
    __m512 wv[SK_BR], acc[SK_BR];
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++) {
        wv[j] = _mm512_maskz_loadu_ps(mk, w + (n0 + j) * K + c);
        acc[j] = _mm512_setzero_ps();
        _mm_prefetch((const char *)(w + (n0 + j + SK_BR) * K + c), _MM_HINT_T0);
    }
    for (int64_t m = 0; m < M; m++) {
        const float *g = dy + m * N + n0;
        __m512 xv = _mm512_maskz_loadu_ps(mk, x + m * K + c);
        // One chain through dx: its latency overlaps across the independent rows m.
        __m512 d = _mm512_maskz_loadu_ps(mk, dx + m * K + c);
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            __m512 b = _mm512_set1_ps(g[j]);
            acc[j] = _mm512_fmadd_ps(b, xv, acc[j]);
            d = _mm512_fmadd_ps(b, wv[j], d);
        }
        _mm512_mask_storeu_ps(dx + m * K + c, mk, d);
    }
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++) {
        float *p = dw + (n0 + j) * K + c;
        if (stream)
            _mm512_stream_ps(p, acc[j]);
        else if (fresh)
            _mm512_mask_storeu_ps(p, mk, acc[j]);
        else
            _mm512_mask_storeu_ps(p, mk, _mm512_add_ps(_mm512_maskz_loadu_ps(mk, p), acc[j]));
    }
}

// Input columns [16 lo, 16 hi) of dx and dw over every weight row: each chunk owns its columns,
// so dx and dw need no reduction between threads.
AG_AVX512 static void bwd_part(void *p, int64_t clo, int64_t chi, int thread) {
    (void)thread;
    const skinny_args *a = p;
    const int64_t M = a->M, N = a->N, K = a->K, lo = clo * 16, hi = chi * 16 < K ? chi * 16 : K;
    if (a->dx_fresh)
        for (int64_t m = 0; m < M; m++) memset(a->dx + m * K + lo, 0, (size_t)(hi - lo) * sizeof(float));
    int64_t n0 = 0;
    for (; n0 + SK_BR <= N; n0 += SK_BR)
        for (int64_t c = lo; c < hi; c += 16) {
            __mmask16 mk = ag_lanes16(K - c);
            bwd_tile(SK_BR, a->dy, a->x, a->w, a->dx, a->dw, M, N, K, n0, c, mk, a->dw_fresh,
                     a->aligned && mk == 0xFFFF);
        }
    for (; n0 < N; n0++)
        for (int64_t c = lo; c < hi; c += 16)
            bwd_tile(1, a->dy, a->x, a->w, a->dx, a->dw, M, N, K, n0, c, ag_lanes16(K - c), a->dw_fresh, false);
    if (a->aligned) _mm_sfence(); // the streamed lines are visible before the loop returns
}

AG_AVX512 static void skinny_backward(const float *dy, const float *x, const float *w, float *dx, float *dw, int64_t M,
                                      int64_t N, int64_t K, bool dx_fresh, bool dw_fresh) {
    // Streaming stores need every 16-column chunk 64-byte aligned: the base and K % 16 == 0.
    bool aligned = dw_fresh && K % 16 == 0 && ((uintptr_t)dw & 63) == 0;
    skinny_args a = {x, w, dy, NULL, dx, dw, M, N, K, dx_fresh, dw_fresh, aligned};
    ag_parallel_for((K + 15) / 16, SK_CHUNK_BYTES / (16 * N * (int64_t)sizeof(float)) + 1, bwd_part, &a);
}

void ag_skinny_backward(const float *dy, const float *x, const float *w, float *dx, float *dw, int64_t M, int64_t N,
                        int64_t K, bool dx_fresh, bool dw_fresh) {
    double t0 = ag_blas_clock();
    skinny_backward(dy, x, w, dx, dw, M, N, K, dx_fresh, dw_fresh);
    ag_blas_account(t0, 2, 4.0 * (double)M * (double)N * (double)K);
}
#else // no AVX-512 kernels on this architecture: the callers use sgemm
bool ag_skinny_available(int64_t M) {
    (void)M;
    return false;
}
bool ag_skinny_forward_available(int64_t M) {
    (void)M;
    return false;
}
void ag_skinny_forward(const float *x, const float *w, float *y, int64_t M, int64_t N, int64_t K) {
    ag_sgemm(CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
}
void ag_skinny_forward_group(const float *x, int64_t M, int64_t K, int n, const float *const w[], const int64_t N[],
                             float *const y[]) {
    for (int i = 0; i < n; i++) ag_skinny_forward(x, w[i], y[i], M, N[i], K);
}
void ag_skinny_backward(const float *dy, const float *x, const float *w, float *dx, float *dw, int64_t M, int64_t N,
                        int64_t K, bool dx_fresh, bool dw_fresh) {
    ag_sgemm(CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dy, N, w, K, dx_fresh ? 0.0f : 1.0f, dx, K);
    ag_sgemm(CblasTrans, CblasNoTrans, N, K, M, 1.0f, dy, N, x, K, dw_fresh ? 0.0f : 1.0f, dw, K);
}
#endif
