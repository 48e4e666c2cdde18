// Matrix products of any float dtype: C = alpha op(A) op(B) + beta C, accumulated in float32 and
// rounded once to C's dtype. Float32 operands go to ag_sgemm; 16-bit ones of one dtype to the
// 16-bit kernels (ag_kernels.h); operands of two dtypes are widened to float32 copies.
#include <stdlib.h>
#include <string.h>

#include "ag_kernels.h"

// A float32 copy of rows x cols elements with leading dimension ld (plain malloc: a kernel's
// workspace, billed as "other").
static float *widen(ag_buf b, int64_t rows, int64_t cols, int64_t ld) {
    float *f = malloc((size_t)(rows * cols) * sizeof(float));
    if (!f) return NULL;
    for (int64_t r = 0; r < rows; r++)
        ag_type_traits_of(b.t)->to_f32((const uint16_t *)b.p + r * ld, f + r * cols, cols);
    return f;
}

bool ag_gemm_buf(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha, ag_buf A,
                 int64_t lda, ag_buf B, int64_t ldb, float beta, ag_buf C, int64_t ldc) {
    if (A.t == AG_F32 && B.t == AG_F32 && C.t == AG_F32) {
        ag_sgemm(ta, tb, M, N, K, alpha, A.p, lda, B.p, ldb, beta, C.p, ldc);
        return true;
    }
    bool half = (A.t == AG_BF16 || A.t == AG_F16) && B.t == A.t;
    if (half && C.t == AG_F32) {
        ag_gemm_16(A.t, ta, tb, M, N, K, alpha, A.p, lda, B.p, ldb, beta, C.p, ldc);
        return true;
    }
    if (half && C.t == A.t) {
        ag_gemm_16_out(A.t, ta, tb, M, N, K, alpha, A.p, lda, B.p, ldb, beta, C.p, ldc);
        return true;
    }
    // Operands of two dtypes (rare: a float32 statistic against a 16-bit tensor): both widened.
    int64_t ar = ta == CblasNoTrans ? M : K, ac = ta == CblasNoTrans ? K : M;
    int64_t br = tb == CblasNoTrans ? K : N, bc = tb == CblasNoTrans ? N : K;
    float *a = A.t == AG_F32 ? A.p : widen(A, ar, ac, lda), *b = B.t == AG_F32 ? B.p : widen(B, br, bc, ldb);
    float *c = C.t == AG_F32 ? C.p : malloc((size_t)(M * N) * sizeof(float));
    bool ok = a && b && c;
    if (ok) {
        if (C.t != AG_F32 && beta != 0.0f) {
            for (int64_t r = 0; r < M; r++)
                ag_type_traits_of(C.t)->to_f32((const uint16_t *)C.p + r * ldc, c + r * N, N);
        }
        ag_sgemm(ta, tb, M, N, K, alpha, a, A.t == AG_F32 ? lda : ac, b, B.t == AG_F32 ? ldb : bc, beta, c,
                 C.t == AG_F32 ? ldc : N);
        if (C.t != AG_F32)
            for (int64_t r = 0; r < M; r++) ag_type_traits_of(C.t)->from_f32(c + r * N, (uint16_t *)C.p + r * ldc, N);
    }
    if (a != A.p) free(a);
    if (b != B.p) free(b);
    if (c != C.p) free(c);
    return ok;
}
