// The one door to sgemm, so that benchmarks and reports can tell the time spent in it, and
// the small products (attention's per-head blocks) that it handles without OpenBLAS.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "ag_kernels.h"

static ag_blas_stats stats;

#define GEMM_BLOCK 32        // rows or columns of C a part of a split product starts on
#define GEMM_MIN_FLOPS 4.0e6 // the least work a part gets (about 50 us)

double ag_blas_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if defined(__x86_64__)

// ---- small products (attention at short lengths: 25 x 25 x 64) ----
// There OpenBLAS's per-call overhead (argument checks, buffer set-up, packing) costs more than
// the arithmetic; these loops do the arithmetic alone. C = alpha op(A) op(B) + beta C, with
// C not read when beta is 0, as BLAS.

// op(B) = B, rows contiguous along N: C[i, j..j+63] accumulated over k.
AG_AVX512 static void small_sgemm_nn(bool ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                                     const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j += 64) {
            __mmask16 mk[4];
            __m512 acc[4];
            for (int q = 0; q < 4; q++) {
                mk[q] = ag_lanes16(N - j - 16 * q);
                acc[q] = _mm512_setzero_ps();
            }
            for (int64_t k = 0; k < K; k++) {
                __m512 a = _mm512_set1_ps(ta ? A[k * lda + i] : A[i * lda + k]);
                const float *b = B + k * ldb + j;
                for (int q = 0; q < 4; q++)
                    acc[q] = _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(mk[q], b + 16 * q), acc[q]);
            }
            float *c = C + i * ldc + j;
            for (int q = 0; q < 4; q++) {
                __m512 r = _mm512_mul_ps(_mm512_set1_ps(alpha), acc[q]);
                if (beta != 0.0f)
                    r = _mm512_add_ps(r, _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mk[q], c + 16 * q)));
                _mm512_mask_storeu_ps(c + 16 * q, mk[q], r);
            }
        }
}

// op(A) = A and op(B) = Bᵀ: C[i, j] is a dot product of two rows, four columns at a time.
AG_AVX512 static void small_sgemm_nt(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                                     const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j += 4) {
            int nr = N - j < 4 ? (int)(N - j) : 4;
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            for (int64_t k = 0; k < K; k += 16) {
                __mmask16 mk = ag_lanes16(K - k);
                __m512 a = _mm512_maskz_loadu_ps(mk, A + i * lda + k);
                for (int q = 0; q < nr; q++)
                    acc[q] = _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(mk, B + (j + q) * ldb + k), acc[q]);
            }
            float sum[4];
            _mm_storeu_ps(sum, hsum4(acc[0], acc[1], acc[2], acc[3]));
            float *c = C + i * ldc + j;
            for (int q = 0; q < nr; q++) c[q] = beta != 0.0f ? alpha * sum[q] + beta * c[q] : alpha * sum[q];
        }
}

// True when it did the product.
static bool small_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                        const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M * N * K > AG_SMALL_GEMM_MAX || !ag_has_avx512()) return false;
    if (tb == CblasNoTrans)
        small_sgemm_nn(ta == CblasTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else if (ta == CblasNoTrans)
        small_sgemm_nt(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
        return false;
    return true;
}
#else
static bool small_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                        const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B;
    (void)ldb, (void)beta, (void)C, (void)ldc;
    return false;
}
#endif

bool ag_sgemm_small(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    return small_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

typedef struct {
    CBLAS_TRANSPOSE ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
    bool by_rows; // split C's rows (A's) rather than its columns (B's)
} gemm_split;

static void sgemm_1(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb,
                beta, C, (blasint)ldc);
}

// Blocks [b, e) of GEMM_BLOCK rows or columns of C.
static void sgemm_part(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const gemm_split *g = arg;
    int64_t lo = b * GEMM_BLOCK, hi = e * GEMM_BLOCK;
    if (g->by_rows) {
        if (hi > g->M) hi = g->M;
        const float *a = g->ta == CblasNoTrans ? g->A + lo * g->lda : g->A + lo;
        sgemm_1(g->ta, g->tb, hi - lo, g->N, g->K, g->alpha, a, g->lda, g->B, g->ldb, g->beta, g->C + lo * g->ldc,
                g->ldc);
    } else {
        if (hi > g->N) hi = g->N;
        const float *bp = g->tb == CblasNoTrans ? g->B + lo : g->B + lo * g->ldb;
        sgemm_1(g->ta, g->tb, g->M, hi - lo, g->K, g->alpha, g->A, g->lda, bp, g->ldb, g->beta, g->C + lo, g->ldc);
    }
}

void ag_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
              int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    ag_blas_init();
    double t0 = ag_blas_clock();
    if (!small_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) &&
        !(ag_sgemm_tiles_pays(M, N, K) && ag_sgemm_tiles(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))) {
        // Split along C's longer side in blocks the pool hands out; each block is one
        // single-threaded sgemm (it repacks the shared operand, a small cost beside its flops).
        gemm_split g = {ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C, M > N};
        int64_t side = g.by_rows ? M : N, blocks = (side + GEMM_BLOCK - 1) / GEMM_BLOCK;
        int64_t grain = (int64_t)(GEMM_MIN_FLOPS / (2.0 * (double)(g.by_rows ? N : M) * (double)K * GEMM_BLOCK)) + 1;
        ag_parallel_for(blocks, grain, sgemm_part, &g);
    }
    ag_blas_account(t0, 1, 2.0 * (double)M * (double)N * (double)K);
}

void ag_blas_account(double t0, int calls, double flops) {
    stats.seconds += ag_blas_clock() - t0;
    stats.calls += (uint64_t)calls;
    stats.flops += flops;
}

ag_blas_stats ag_get_blas_stats(void) { return stats; }

void ag_reset_blas_stats(void) { stats = (ag_blas_stats){0}; }
