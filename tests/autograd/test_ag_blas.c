// OpenBLAS's kernels for the float32 products (autograd/blas.c): where OpenBLAS fell back to
// Prescott's for a CPU model it does not know, the kernels the CPU's features run; a core the
// user names in OPENBLAS_CORETYPE kept; and the products right under either.
//
//   test_ag_blas auto          (run with OPENBLAS_CORETYPE unset)
//   test_ag_blas forced NAME   (run with OPENBLAS_CORETYPE=NAME)
#include "ag_test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ag_internal.h"
#include "profiler.h"

static const char *mode = "auto", *forced_name = "";

static void test_core(void **state) {
    (void)state;
    uint64_t before = mp_get_counter(MP_OTHER).allocations;
    ag_blas_core c = ag_get_blas_core();
    assert_non_null(c.core);
    // Choosing allocates nothing the bill would show ("other": plain malloc), so a bill does not
    // depend on whether OpenBLAS knew the CPU.
    if (mp_other_available()) assert_int_equal(mp_get_counter(MP_OTHER).allocations, before);
    if (!strcmp(mode, "forced")) {
        assert_string_equal(c.chosen_by, "OPENBLAS_CORETYPE");
        assert_int_equal(strcasecmp(c.core, forced_name), 0);
        return;
    }
    // Asked again without leaving the name in the environment of what membill starts.
    assert_null(getenv("OPENBLAS_CORETYPE"));
    assert_true(!strcmp(c.chosen_by, "OpenBLAS") || !strcmp(c.chosen_by, "CPU features"));
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        if (strcasecmp(c.core, "Prescott") == 0) fail_msg("an AVX2 CPU is left with Prescott's kernels");
        if (!strcmp(c.chosen_by, "CPU features")) {
            bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512cd");
            const char *want = avx512 && __builtin_cpu_supports("avx512bf16") ? "Cooperlake"
                               : avx512                                       ? "SkylakeX"
                                                                              : "Haswell";
            assert_int_equal(strcasecmp(c.core, want), 0);
        }
    }
#endif
    printf("OpenBLAS kernels %s, chosen by %s\n", c.core, c.chosen_by);
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 16777216.0f * 2.0f - 1.0f;
}

// Products big enough to reach OpenBLAS (past AG_SMALL_GEMM_MAX), every transpose, against double.
static void test_products(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{97, 131, 67}, {256, 96, 130}, {33, 300, 577}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            bool ta = t & 1, tb = t & 2;
            float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N),
                  *C = malloc(sizeof(float) * M * N);
            assert_non_null(A), assert_non_null(B), assert_non_null(C);
            for (int64_t i = 0; i < M * K; i++) A[i] = rnd();
            for (int64_t i = 0; i < K * N; i++) B[i] = rnd();
            for (int64_t i = 0; i < M * N; i++) C[i] = rnd();
            float *C0 = malloc(sizeof(float) * M * N);
            assert_non_null(C0);
            memcpy(C0, C, sizeof(float) * M * N);
            ag_sgemm(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 0.5f, A, ta ? M : K, B,
                     tb ? K : N, 2.0f, C, N);
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double sum = 0.0, mag = 0.0;
                    for (int64_t k = 0; k < K; k++) {
                        double p = (double)(ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
                        sum += p, mag += fabs(p);
                    }
                    double want = 0.5 * sum + 2.0 * C0[i * N + j];
                    // float32 accumulation over K terms: K ulps of the magnitudes summed, at most.
                    double tol = (double)K * 6e-8 * (0.5 * mag + 2.0 * fabs(C0[i * N + j])) + 1e-6;
                    if (fabs(C[i * N + j] - want) > tol)
                        fail_msg("%lldx%lldx%lld ta %d tb %d at (%lld, %lld): %g, want %g", (long long)M, (long long)N,
                                 (long long)K, ta, tb, (long long)i, (long long)j, C[i * N + j], want);
                }
            free(A), free(B), free(C), free(C0);
        }
}

int main(int argc, char **argv) {
    if (argc >= 2) mode = argv[1];
    if (argc >= 3) forced_name = argv[2];
    if (strcmp(mode, "auto") && (strcmp(mode, "forced") || argc < 3)) {
        fprintf(stderr, "usage: test_ag_blas auto | forced NAME\n");
        return 2;
    }
    mp_options o = {.track_other = true};
    if (mp_init(&o) != MP_OK) return 1;
    ag_set_num_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_core),
        cmocka_unit_test(test_products),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    mp_shutdown();
    return failed;
}
