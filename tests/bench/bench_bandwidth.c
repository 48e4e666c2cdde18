// Memory bandwidth of this machine, measured over buffers the size of SmolLM2-135M's weights
// (538,060,032 bytes), so that a training step can be compared with the floor it cannot beat.
// Usage: bench_bandwidth [threads] [reps]. Prints one JSON object:
//   read_gbs: bytes read per second (a sum over one buffer);
//   copy_gbs: bytes moved per second, reads plus writes, by memcpy between two buffers;
//   write_gbs: bytes written per second by memset;
//   fma_gflops: float32 multiply-add throughput of all threads (AVX-512 where the CPU has it,
//   else AVX2, else 0), in GFLOP/s (one multiply-add = 2 flops): the compute floor of the
//   matrix products, which at 25 tokens can cost more than their memory traffic.
// Each figure is the best of `reps` passes (the machine is shared: the best pass is the one
// least disturbed). GB is 10^9 bytes.
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_BYTES ((size_t)538060032)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Eight independent sums so the loop is bound by loads, not by one add chain.
static float sum_range(const float *p, size_t n) {
    float s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += p[i + j];
    for (; i < n; i++) s[0] += p[i];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static double read_pass(const float *a, size_t n, float *sink) {
    double t0 = now();
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t lo = n * (size_t)t / (size_t)nt, hi = n * (size_t)(t + 1) / (size_t)nt;
        total += sum_range(a + lo, hi - lo);
    }
    *sink += total;
    return now() - t0;
}

static double copy_pass(float *dst, const float *src, size_t n) {
    double t0 = now();
#pragma omp parallel
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t lo = n * (size_t)t / (size_t)nt, hi = n * (size_t)(t + 1) / (size_t)nt;
        memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
    }
    return now() - t0;
}

static double write_pass(float *dst, size_t n, int value) {
    double t0 = now();
#pragma omp parallel
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t lo = n * (size_t)t / (size_t)nt, hi = n * (size_t)(t + 1) / (size_t)nt;
        memset(dst + lo, value, (hi - lo) * sizeof(float));
    }
    return now() - t0;
}

// 24 independent multiply-add chains of 16 lanes: bound by the FMA units, not by latency.
#define FMA_CHAINS 24
__attribute__((target("avx512f,fma"))) static float fma_avx512(long n) {
    __m512 a[FMA_CHAINS], b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
    for (int i = 0; i < FMA_CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < n; k++) {
        for (int i = 0; i < FMA_CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
        __asm__ volatile("" : "+v"(a[0])); // keeps the loop from being folded
    }
    for (int i = 1; i < FMA_CHAINS; i++) a[0] = _mm512_add_ps(a[0], a[i]);
    return _mm512_reduce_add_ps(a[0]);
}

__attribute__((target("avx2,fma"))) static float fma_avx2(long n) {
    __m256 a[FMA_CHAINS], b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
    for (int i = 0; i < FMA_CHAINS; i++) a[i] = _mm256_set1_ps((float)i);
    for (long k = 0; k < n; k++) {
        for (int i = 0; i < FMA_CHAINS; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
        __asm__ volatile("" : "+x"(a[0]));
    }
    for (int i = 1; i < FMA_CHAINS; i++) a[0] = _mm256_add_ps(a[0], a[i]);
    float o[8];
    _mm256_storeu_ps(o, a[0]);
    return o[0] + o[1] + o[2] + o[3] + o[4] + o[5] + o[6] + o[7];
}

// Best of reps: flops per second over all threads, each running its own chains.
static double fma_gflops(int reps, float *sink) {
    __builtin_cpu_init();
    int lanes = __builtin_cpu_supports("avx512f") ? 16 : __builtin_cpu_supports("avx2") ? 8 : 0;
    if (!lanes) return 0;
    const long n = 20000000;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        float total = 0;
#pragma omp parallel reduction(+ : total)
        total += lanes == 16 ? fma_avx512(n) : fma_avx2(n);
        double t = now() - t0;
        best = t < best ? t : best;
        *sink += total;
    }
    return 2.0 * lanes * FMA_CHAINS * (double)n * omp_get_max_threads() / best / 1e9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (threads < 1 || reps < 1) {
        fprintf(stderr, "usage: bench_bandwidth [threads >= 1] [reps >= 1]\n");
        return 2;
    }
    omp_set_num_threads(threads);
    size_t n = BENCH_BYTES / sizeof(float);
    float *a = aligned_alloc(64, BENCH_BYTES), *b = aligned_alloc(64, BENCH_BYTES);
    if (!a || !b) {
        fprintf(stderr, "bench_bandwidth: cannot allocate 2 x %zu bytes\n", BENCH_BYTES);
        free(a);
        free(b);
        return 1;
    }
    // Touch every page first: the passes time memory, not page faults.
    write_pass(a, n, 0);
    write_pass(b, n, 0);
    for (size_t i = 0; i < n; i += 1024) a[i] = (float)((i >> 10) & 7);
    double best_read = 1e30, best_copy = 1e30, best_write = 1e30;
    float sink = 0;
    for (int r = 0; r < reps; r++) {
        double t = read_pass(a, n, &sink);
        best_read = t < best_read ? t : best_read;
        t = copy_pass(b, a, n);
        best_copy = t < best_copy ? t : best_copy;
        t = write_pass(b, n, r & 1);
        best_write = t < best_write ? t : best_write;
    }
    double gb = (double)BENCH_BYTES / 1e9, gflops = fma_gflops(reps, &sink);
    printf("{\"bytes\": %zu, \"threads\": %d, \"reps\": %d, \"read_gbs\": %.3f, "
           "\"copy_gbs\": %.3f, \"write_gbs\": %.3f, \"fma_gflops\": %.1f, \"checksum\": %g}\n",
           BENCH_BYTES, threads, reps, gb / best_read, 2.0 * gb / best_copy, gb / best_write, gflops, (double)sink);
    free(a);
    free(b);
    return 0;
}
