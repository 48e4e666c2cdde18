// The linear op at every awkward shape its kernels meet: the skinny kernels (few rows, tiles of
// 6 x 4 and 8, 16-lane tails), the forward's mid-size rows (65 to 512, in passes of rows when
// x is large) and the sgemm path, forward and both gradients, against double.
#include "ag_test_util.h"

#include <math.h>
#include <stdlib.h>

static void check_shape(ag_ctx *ctx, int64_t M, int64_t N, int64_t K) {
    ag_tensor *x = ag_test_param(ctx, 2, (int64_t[]){M, K}, "x", 11 + (uint64_t)(M * 1000 + N * 10 + K));
    ag_tensor *w = ag_test_param(ctx, 2, (int64_t[]){N, K}, "w", 17 + (uint64_t)(M + N * 100 + K * 7));
    ag_tensor *y = ag_linear(ctx, "lin", x, w, NULL);
    assert_non_null(y);
    ag_tensor *dy = ag_tensor_new(ctx, 2, (int64_t[]){M, N}, MP_ACTIVATION, "dy");
    ag_fill(dy, 5 + (uint64_t)M, -1, 1);
    double *ref = calloc((size_t)(M * N), sizeof *ref), *dx = calloc((size_t)(M * K), sizeof *dx),
           *dw = calloc((size_t)(N * K), sizeof *dw);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++)
            for (int64_t k = 0; k < K; k++) {
                double xv = ag_f32(x)[i * K + k], wv = ag_f32(w)[j * K + k], g = ag_f32(dy)[i * N + j];
                ref[i * N + j] += xv * wv;
                dx[i * K + k] += g * wv;
                dw[j * K + k] += g * xv;
            }
    double tol = 1e-5 * sqrt((double)K + (double)M);
    if (ag_max_diff(y->data, ref, M * N) > tol)
        print_error("forward M=%lld N=%lld K=%lld\n", (long long)M, (long long)N, (long long)K);
    assert_true(ag_max_diff(y->data, ref, M * N) <= tol);
    assert_int_equal(ag_backward_grad(ctx, y, dy), AG_OK);
    assert_true(ag_max_diff(x->grad->data, dx, M * K) <= tol);
    assert_true(ag_max_diff(w->grad->data, dw, N * K) <= tol);
    // A second pass accumulates into the gradients it finds (beta 1, not a fresh write).
    ag_release(y);
    y = ag_linear(ctx, "lin", x, w, NULL);
    assert_int_equal(ag_backward_grad(ctx, y, dy), AG_OK);
    for (int64_t i = 0; i < M * K; i++) dx[i] *= 2;
    for (int64_t i = 0; i < N * K; i++) dw[i] *= 2;
    assert_true(ag_max_diff(x->grad->data, dx, M * K) <= 2 * tol);
    assert_true(ag_max_diff(w->grad->data, dw, N * K) <= 2 * tol);
    free(ref);
    free(dx);
    free(dw);
    ag_release(dy);
    ag_release(y);
    ag_release(x);
    ag_release(w);
}

static void test_linear_shapes(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    const int64_t Ms[] = {1, 2, 5, 6, 7, 13, 25, 64, 65, 130};
    const int64_t Ns[] = {1, 3, 4, 5, 9, 33};
    const int64_t Ks[] = {1, 15, 16, 17, 40, 100};
    for (size_t a = 0; a < sizeof Ms / sizeof Ms[0]; a++)
        for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
            for (size_t c = 0; c < sizeof Ks / sizeof Ks[0]; c++) check_shape(ctx, Ms[a], Ns[b], Ks[c]);
    ag_assert_all_zero();
}

// Mid-size rows: the skinny forward up to 512 rows (the backward goes to sgemm above 64), then
// sgemm beyond. K = 1100 makes x larger than one pass's block of rows (234 rows of 1100 floats)
// from 235 rows on: several passes over w, with an uneven last pass.
static void test_linear_mid_rows(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    const int64_t Ms[] = {65, 71, 96, 130, 199, 200, 257, 300, 512, 513};
    const int64_t Ns[] = {1, 5, 33};
    const int64_t Ks[] = {17, 100};
    for (size_t a = 0; a < sizeof Ms / sizeof Ms[0]; a++)
        for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
            for (size_t c = 0; c < sizeof Ks / sizeof Ks[0]; c++) check_shape(ctx, Ms[a], Ns[b], Ks[c]);
    const int64_t big[][3] = {{234, 9, 1100}, {235, 9, 1100}, {300, 7, 1100}, {481, 4, 1100}, {512, 6, 1100}};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) check_shape(ctx, big[i][0], big[i][1], big[i][2]);
    ag_assert_all_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_linear_shapes, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_linear_mid_rows, ag_setup, ag_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
