// The one door to sgemm, so that benchmarks and reports can tell the time spent in it.
#include <omp.h>
#include <time.h>

#include "ag_internal.h"

static ag_blas_stats stats;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ag_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
              float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
              float *C, int64_t ldc)
{
    double t0 = now();
    cblas_sgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, alpha, A,
                (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
    stats.seconds += now() - t0;
    stats.calls++;
    stats.flops += 2.0 * (double)M * (double)N * (double)K;
}

ag_blas_stats ag_get_blas_stats(void) { return stats; }

void ag_reset_blas_stats(void) { stats = (ag_blas_stats){0}; }

void ag_set_num_threads(int n)
{
    if (n < 1)
        return;
    openblas_set_num_threads(n);
    omp_set_num_threads(n);
}
