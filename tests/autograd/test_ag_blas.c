// OpenBLAS's kernels for the float32 products (autograd/blas.c): where OpenBLAS fell back to
// Prescott's for a CPU model it does not know, the kernels the CPU's features run; a core the
// user names in OPENBLAS_CORETYPE kept; and the products right under either.
//
//   test_ag_blas auto          (run with OPENBLAS_CORETYPE unset)
//   test_ag_blas forced NAME   (run with OPENBLAS_CORETYPE=NAME)
#include "ag_test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

// Products under the kernels chosen, against double.
static void test_products(void **state) {
    (void)state;
    ag_check_sgemm_shapes();
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
