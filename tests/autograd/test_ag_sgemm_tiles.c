// The float32 tiles (autograd/sgemm_tiles.c) against double: every transpose, alpha and beta, C
// inside a larger matrix, shapes on and off the kernel's 8 x 48 tile and the 192-deep blocks,
// each way of splitting (strips along N or M, the shared operand packed once, a deep product
// split along K), at 1 and 3 threads; and the choice between them and OpenBLAS.
#include "ag_test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ag_kernels.h"
#include "profiler.h"

// C[M, N] (rows ldc apart, ldc > N) = alpha op(A) op(B) + beta C, with A and B inside matrices
// a few columns wider than they need; C's padding must stay as it was.
static void check(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int64_t lda = ac + 3, ldb = bc + 5, ldc = N + 7;
    float *A = malloc(sizeof(float) * (size_t)(ar * lda)), *B = malloc(sizeof(float) * (size_t)(br * ldb));
    float *C = malloc(sizeof(float) * (size_t)(M * ldc)), *C0 = malloc(sizeof(float) * (size_t)(M * ldc));
    for (int64_t i = 0; i < ar * lda; i++) A[i] = (float)((i * 7919) % 13) / 13.0f - 0.5f;
    for (int64_t i = 0; i < br * ldb; i++) B[i] = (float)((i * 104729) % 17) / 17.0f - 0.5f;
    for (int64_t i = 0; i < M * ldc; i++) C0[i] = (float)(i % 11) / 11.0f - 0.5f;
    // beta 0 does not read C (BLAS): a NaN there must not come through.
    if (beta == 0.0f) C0[0] = NAN;
    for (int t = 1; t <= 3; t += 2) {
        ag_set_num_threads(t);
        memcpy(C, C0, sizeof(float) * (size_t)(M * ldc));
        assert_true(ag_sgemm_tiles(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                                   lda, B, ldb, beta, C, ldc));
        double worst = 0;
        for (int64_t i = 0; i < M; i++) {
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
                double want = alpha * s + (beta != 0.0f ? beta * (double)C0[i * ldc + j] : 0.0);
                double d = fabs(want - C[i * ldc + j]);
                worst = d > worst || isnan(d) ? d : worst;
            }
            for (int64_t j = N; j < ldc; j++) assert_true(C[i * ldc + j] == C0[i * ldc + j] || i == M - 1);
        }
        if (!(worst < 1e-5 * (double)K))
            fail_msg("ta %d tb %d M %lld N %lld K %lld alpha %g beta %g threads %d: off by %g", ta, tb, (long long)M,
                     (long long)N, (long long)K, alpha, beta, t, worst);
    }
    free(A), free(B), free(C), free(C0);
}

static void test_shapes(void **state) {
    (void)state;
    const int64_t shapes[][3] = {
        {1, 1, 1},       // one element: masks everywhere
        {7, 47, 15},     // below one tile in every dimension
        {8, 48, 16},     // exactly one tile
        {193, 289, 193}, // one past a block in every dimension
        {40, 1000, 70},  // strips along N, op(A) packed once for all of them
        {1000, 60, 70},  // strips along M, op(B) packed once
        {24, 50, 4000},  // deep: split along K
        {400, 577, 385}, // several blocks each way
    };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) check(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 1.0f, 0.0f);
    check(false, true, 100, 130, 300, -2.0f, 0.5f);
    check(true, false, 130, 100, 300, 0.25f, 1.0f);
    check(false, false, 30, 40, 3000, 1.5f, -1.0f); // deep, with beta
    ag_set_num_threads(2);
}

// The tiles' workspace is mapped, as OpenBLAS's own buffers: a product allocates nothing the
// bill shows, so a float32 bill does not depend on which kernels multiplied.
static void test_no_allocation(void **state) {
    (void)state;
    int64_t M = 300, N = 400, K = 5000;
    float *A = calloc((size_t)(M * K), sizeof(float)), *B = calloc((size_t)(K * N), sizeof(float));
    float *C = calloc((size_t)(M * N), sizeof(float));
    assert_true(ag_sgemm_tiles(CblasNoTrans, CblasNoTrans, M, N, 200, 1.0f, A, K, B, N, 0.0f, C, N)); // warm
    uint64_t before = mp_get_counter(MP_OTHER).allocations;
    assert_true(ag_sgemm_tiles(CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N));
    assert_true(ag_sgemm_tiles(CblasTrans, CblasNoTrans, 60, N, K, 1.0f, A, 60, B, N, 0.0f, C, N));
    if (mp_other_available()) assert_int_equal(mp_get_counter(MP_OTHER).allocations, before);
    free(A), free(B), free(C);
}

// ag_sgemm runs the tiles where OpenBLAS's kernels are not AVX-512 ones, OpenBLAS otherwise.
static void test_choice(void **state) {
    (void)state;
    ag_blas_core c = ag_get_blas_core();
    const char *core = c.core;
    bool wide = !strcasecmp(core, "SkylakeX") || !strcasecmp(core, "Cooperlake") || !strcasecmp(core, "SapphireRapids");
    bool avx512 = ag_cpu_avx512();
    assert_string_equal(c.products, avx512 && !wide ? "AVX-512 tiles" : "OpenBLAS");
    assert_int_equal(ag_sgemm_tiles_pays(128, 576, 576), avx512 && !wide);
    assert_false(ag_sgemm_tiles_pays(4, 576, 576)); // below one tile: OpenBLAS's small path
    ag_sgemm_tiles_force(0);
    float a[16] = {0}, b[16] = {0}, cc[16] = {0};
    assert_false(ag_sgemm_tiles(CblasNoTrans, CblasNoTrans, 4, 4, 4, 1.0f, a, 4, b, 4, 0.0f, cc, 4));
    ag_sgemm_tiles_force(1);
    assert_int_equal(ag_sgemm_tiles_pays(128, 576, 576), avx512);
    ag_sgemm_tiles_force(-1);
    printf("OpenBLAS kernels %s: products on %s\n", core, c.products);
}

int main(void) {
    mp_options o = {.track_other = true};
    if (mp_init(&o) != MP_OK) return 1;
    const struct CMUnitTest all[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_no_allocation),
        cmocka_unit_test(test_choice),
    };
    int failed = 0;
    if (!ag_cpu_avx512()) {
        // Without AVX-512 the tiles never run: only the choice is there to test.
        const struct CMUnitTest choice[] = {cmocka_unit_test(test_choice)};
        failed = cmocka_run_group_tests(choice, NULL, NULL);
    } else {
        failed = cmocka_run_group_tests(all, NULL, NULL);
    }
    mp_shutdown();
    return failed;
}
