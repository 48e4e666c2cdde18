// OpenBLAS's set-up, once before its first call: the kernels it runs (asked again by CPU features
// where it fell back to old ones), its own threads off, and whether the large float32 products
// go to autograd's AVX-512 tiles instead (sgemm_tiles.c).
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "ag_kernels.h"

// ---- OpenBLAS's kernels ----
// An OpenBLAS built for many CPUs (Debian's) picks its kernels by CPU model as it loads, and a
// model it does not know gets Prescott's SSE3 kernels (0.3.21 on Emerald Rapids: a third of the
// speed of its AVX-512 ones there). Then it is asked again for the newest kernels the CPU's
// features run. A core named in OPENBLAS_CORETYPE is the user's choice and stays. Weak: a build
// of OpenBLAS for one CPU has no such choice to make, and no such functions.
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));
extern char **environ;

static ag_blas_core blas_core = {"unknown", "OpenBLAS", "OpenBLAS"};
static bool prefer_tiles; // the large float32 products on autograd's tiles (sgemm_tiles.c)

static const char *core_for_features(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
    if (avx512 && __builtin_cpu_supports("avx512bf16")) return "Cooperlake";
    if (avx512) return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

// Every OpenBLAS call runs on the thread that makes it: the pool splits the work instead.
static void blas_setup(void) {
    const char *forced = getenv("OPENBLAS_CORETYPE"), *core = openblas_get_corename();
    const char *want = core_for_features();
    if (forced && *forced) {
        blas_core.chosen_by = "OPENBLAS_CORETYPE";
    } else if (want && core && !strcasecmp(core, "Prescott") && gotoblas_dynamic_init && gotoblas_dynamic_quit) {
        // OpenBLAS reads the name from the environment. It gets one of its own for the call, not
        // setenv's: setenv allocates, plain malloc is billed ("other"), and the bill would then
        // depend on whether OpenBLAS knew the CPU.
        static char entry[64];
        char *env[] = {entry, NULL}, **saved = environ;
        snprintf(entry, sizeof entry, "OPENBLAS_CORETYPE=%s", want);
        environ = env;
        gotoblas_dynamic_quit();
        gotoblas_dynamic_init();
        environ = saved;
        core = openblas_get_corename();
        blas_core.chosen_by = "CPU features";
    }
    if (core) blas_core.core = core;
    static const char *avx512_cores[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    bool wide = false;
    for (size_t i = 0; i < sizeof avx512_cores / sizeof *avx512_cores; i++)
        wide |= core && !strcasecmp(core, avx512_cores[i]);
    prefer_tiles = ag_has_avx512() && !wide;
    if (prefer_tiles) blas_core.products = "AVX-512 tiles";
    openblas_set_num_threads(1);
}

void ag_blas_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, blas_setup);
}

bool ag_blas_prefers_tiles(void) {
    ag_blas_init();
    return prefer_tiles;
}

ag_blas_core ag_get_blas_core(void) {
    ag_blas_init();
    return blas_core;
}
