// What the CPU offers: AVX-512F for the float32 kernels (ag_has_avx512), the features the
// element-type kernels pick their paths by, and whether vdpbf16ps pays on this CPU.
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "ag_kernels.h"

#if defined(__x86_64__)
bool ag_has_avx512(void) {
    static int avx512 = -1;
    if (avx512 < 0) {
        __builtin_cpu_init();
        avx512 = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
    return avx512;
}

#else
bool ag_has_avx512(void) { return false; }
#endif

static bool portable_only;
void ag_kernels_force_portable(bool on) { portable_only = on; }

#if defined(__x86_64__)
// Each feature once; the compiler's CPU model answers from cpuid.
static int cpu_flag(int *cache, const char *name) {
    if (*cache < 0) {
        __builtin_cpu_init();
        if (!strcmp(name, "avx512"))
            *cache = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl");
        else if (!strcmp(name, "bf16"))
            *cache = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
        else if (!strcmp(name, "vnni"))
            *cache = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
        else { // F16C is CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports has no name for it)
            unsigned a, b, c, d;
            *cache = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
        }
    }
    return *cache;
}
static int has_avx512 = -1, has_bf16 = -1, has_vnni = -1, has_f16c = -1;
bool ag_cpu_avx512(void) { return !portable_only && cpu_flag(&has_avx512, "avx512"); }
bool ag_cpu_avx512_bf16(void) { return ag_cpu_avx512() && cpu_flag(&has_bf16, "bf16"); }
bool ag_cpu_avx512_vnni(void) { return ag_cpu_avx512() && cpu_flag(&has_vnni, "vnni"); }
bool ag_cpu_f16c(void) { return !portable_only && cpu_flag(&has_f16c, "f16c"); }

// vdpbf16ps does 32 multiply-adds to an FMA's 16, but how fast a CPU runs it varies: about twice
// float32's multiply-adds a second on the project's AMD host, half on its Emerald Rapids one,
// where bfloat16 tiles widened to float32 for sgemm are the faster path. So the two are timed
// once, 12 independent chains each (bound by throughput, not latency), best of 5 short runs (a
// run another process interrupts is slow, never fast): well under a millisecond.
#define PROBE_STEPS 4000
#define CHAINS(X) X(a0) X(a1) X(a2) X(a3) X(a4) X(a5) X(a6) X(a7) X(a8) X(a9) X(a10) X(a11)
// Kept in registers and live: an array of sums would run at store forwarding's speed, and an
// unused one would be folded away.
#define KEEP_LIVE                                                                                                      \
    __asm__ volatile(""                                                                                                \
                     : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), "+v"(a8),       \
                       "+v"(a9), "+v"(a10), "+v"(a11))
#define CHAINS_LOOP(X)                                                                                                 \
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,  \
           a10 = a0, a11 = a0;                                                                                         \
    for (long k = 0; k < n; k++) {                                                                                     \
        CHAINS(X)                                                                                                      \
        KEEP_LIVE;                                                                                                     \
    }                                                                                                                  \
    return _mm512_reduce_add_ps(                                                                                       \
        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),                       \
                                    _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),                      \
                      _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));

__attribute__((target("avx512f,fma"), noinline)) float ag_fma_chains_avx512(long n) {
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-6f);
#define FMA(v) v = _mm512_fmadd_ps(v, x, y);
    CHAINS_LOOP(FMA)
#undef FMA
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"), noinline)) static float dot_chains(long n) {
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3F803F80), y = (__m512bh)_mm512_set1_epi32(0x00010001);
#define DOT(v) v = _mm512_dpbf16_ps(v, x, y);
    CHAINS_LOOP(DOT)
#undef DOT
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile float probe_sink;
static double time_of(float (*chains)(long)) {
    double t0 = now_s();
    probe_sink = chains(PROBE_STEPS);
    return now_s() - t0;
}

static double dot_ratio;
static void probe_dot(void) {
    if (!cpu_flag(&has_avx512, "avx512") || !cpu_flag(&has_bf16, "bf16")) return;
    double dot = 1e30, fma = 1e30;
    for (int r = 0; r < 5; r++) {
        double f = time_of(ag_fma_chains_avx512), d = time_of(dot_chains);
        fma = f < fma ? f : fma, dot = d < dot ? d : dot;
    }
    dot_ratio = dot > 0 ? 2.0 * fma / dot : 0; // multiply-adds: 32 an instruction against 16
}

double ag_cpu_bf16_dot_ratio(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, probe_dot);
    return dot_ratio;
}

static int dot_forced = -1;
void ag_kernels_force_bf16_dot(int on) { dot_forced = on; }
bool ag_cpu_bf16_dot_pays(void) {
    if (!ag_cpu_avx512_bf16()) return false;
    return dot_forced >= 0 ? dot_forced : ag_cpu_bf16_dot_ratio() >= AG_BF16_DOT_PAYS;
}
#else
float ag_fma_chains_avx512(long n) { return (float)n; }
double ag_cpu_bf16_dot_ratio(void) { return 0; }
void ag_kernels_force_bf16_dot(int on) { (void)on; }
bool ag_cpu_bf16_dot_pays(void) { return false; }
bool ag_cpu_avx512(void) { return false; }
bool ag_cpu_avx512_bf16(void) { return false; }
bool ag_cpu_avx512_vnni(void) { return false; }
bool ag_cpu_f16c(void) { return false; }
#endif
