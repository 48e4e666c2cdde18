// Memory bandwidth of this machine, measured over buffers the size of SmolLM2-135M's weights
// (538,060,032 bytes), so that a training step can be compared with the floor it cannot beat.
// Usage: bench_bandwidth [threads] [reps] [bytes] (bytes: each buffer's size, by default the
// weights'; a decode step's floor takes the read rate over its own weights' size, which may fit
// the last-level cache). Prints one JSON object:
//   read_gbs: bytes read per second (a sum over one buffer, in 64-byte loads on AVX-512 CPUs);
//   copy_gbs: bytes moved per second, reads plus writes, by memcpy between two buffers;
//   write_gbs: bytes written per second by memset;
//   update_gbs: bytes moved per second, reads plus writes, by the optimizer's pattern: four
//   buffers read, three of them written back in place (Adam's w, g, m, v and w, m, v). Where
//   the memory system reads and writes at once (one link each way, as on AMD's chiplets) this
//   moves more bytes a second than a copy, and a floor taken at the copy rate alone is one the
//   optimizer beats;
//   fma_gflops: the peak float32 multiply-add rate of all threads (AVX-512 where the CPU has
//   it, else AVX2, else 0), in GFLOP/s (one multiply-add = 2 flops): the compute floor of the
//   matrix products, which at 25 tokens can cost more than their memory traffic;
//   blas_core: the kernels OpenBLAS runs float32 products with (ag_get_blas_core);
//   blas_core_by: who chose them ("OpenBLAS", "OPENBLAS_CORETYPE" or "CPU features");
//   blas_core_forced: true when OPENBLAS_CORETYPE named them;
//   products: what runs the large float32 products, "OpenBLAS" or "AVX-512 tiles" (membill's own,
//   where OpenBLAS's kernels are not AVX-512 ones on an AVX-512 CPU).
// Each figure is the best of `reps` passes (the machine is shared: the best pass is the one
// least disturbed). GB is 10^9 bytes.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "kernels/ag_kernels.h"
#include "autograd.h"
#include "bench_util.h"

#define BENCH_BYTES ((size_t)538060032)

// Eight independent sums so the loop is bound by loads, not by one add chain.
static float sum_portable(const float *p, size_t n) {
    float s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += p[i + j];
    for (; i < n; i++) s[0] += p[i];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

// Read as the kernels read weights: 64-byte loads into four sums. On an AVX-512 CPU the
// portable loop's narrower loads leave the read probe below what those kernels stream (8 against
// 13 GB/s on one Emerald Rapids core), and then it is no floor.
__attribute__((target("avx512f"))) static float sum_avx512(const float *p, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(p + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(p + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(p + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_loadu_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3))) +
           sum_portable(p + i, n - i);
}

static float sum_range(const float *p, size_t n) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? sum_avx512(p, n) : sum_portable(p, n);
}

// One pass over a buffer, split in one range per thread on membill's own pool.
typedef struct {
    float *dst;
    const float *src;
    size_t n;
    int op, threads, value; // op: 0 read, 1 copy, 2 write, 3 multiply-adds, 4 update in place
    long fma_n;
    float *state[3]; // op 4: the buffers written back
    float sums[256];
} pass_args;

static float fma_chains(long n);

// u[0..2] = u[0..2] / 2 + g: three streams read and written back, one read only.
static void update_portable(float *const u[3], const float *g, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < 3; j++) u[j][i] = 0.5f * u[j][i] + g[i];
}

// 64-byte loads and stores, as the optimizer's kernel streams its state.
__attribute__((target("avx512f"))) static void update_avx512(float *const u[3], const float *g, size_t n) {
    const __m512 h = _mm512_set1_ps(0.5f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gi = _mm512_loadu_ps(g + i);
        for (int j = 0; j < 3; j++) _mm512_storeu_ps(u[j] + i, _mm512_fmadd_ps(h, _mm512_loadu_ps(u[j] + i), gi));
    }
    float *rest[3] = {u[0] + i, u[1] + i, u[2] + i};
    update_portable(rest, g + i, n - i);
}

static void update_range(float *const u[3], const float *g, size_t n) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        update_avx512(u, g, n);
    else
        update_portable(u, g, n);
}

static void pass_part(void *p, int64_t lo, int64_t hi, int thread) {
    pass_args *a = p;
    for (int64_t t = lo; t < hi; t++) {
        size_t b = a->n * (size_t)t / (size_t)a->threads, e = a->n * (size_t)(t + 1) / (size_t)a->threads;
        if (a->op == 0) a->sums[thread] += sum_range(a->src + b, e - b);
        if (a->op == 1) memcpy(a->dst + b, a->src + b, (e - b) * sizeof(float));
        if (a->op == 2) memset(a->dst + b, a->value, (e - b) * sizeof(float));
        if (a->op == 3) a->sums[thread] += fma_chains(a->fma_n);
        if (a->op == 4) {
            float *u[3] = {a->state[0] + b, a->state[1] + b, a->state[2] + b};
            update_range(u, a->src + b, e - b);
        }
    }
}

static double run_pass(pass_args *a, float *sink) {
    memset(a->sums, 0, sizeof a->sums);
    double t0 = bench_now();
    ag_parallel_for(a->threads, 1, pass_part, a);
    double t = bench_now() - t0;
    for (int i = 0; i < a->threads; i++) *sink += a->sums[i];
    return t;
}

// The peak multiply-add rate: 12 independent chains, each kept in a register (an array of
// accumulators lets the compiler keep them in memory, and the loop then runs at the speed of
// store forwarding, a third of the peak). Twelve chains cover the FMA latency several times
// over, so the loop is bound by the FMA units alone: the library's ag_fma_chains_avx512 (16
// lanes, the one the bfloat16 probe times too) on AVX-512 CPUs, this 8-lane loop elsewhere.
#define FMA_CHAINS 12
#define FMA_STEP(x) x = _mm256_fmadd_ps(x, b, c);
__attribute__((target("avx2,fma"), noinline)) static float fma_avx2(long n) {
    const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
    __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2), a3 = _mm256_set1_ps(3);
    __m256 a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5), a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7);
    __m256 a8 = _mm256_set1_ps(8), a9 = _mm256_set1_ps(9), a10 = _mm256_set1_ps(10), a11 = _mm256_set1_ps(11);
    for (long k = 0; k < n; k++) {
        FMA_STEP(a0) FMA_STEP(a1) FMA_STEP(a2) FMA_STEP(a3) FMA_STEP(a4) FMA_STEP(a5);
        FMA_STEP(a6) FMA_STEP(a7) FMA_STEP(a8) FMA_STEP(a9) FMA_STEP(a10) FMA_STEP(a11);
        __asm__ volatile(""
                         : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7), "+x"(a8),
                           "+x"(a9), "+x"(a10), "+x"(a11));
    }
    a0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                       _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    a0 = _mm256_add_ps(a0, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float o[8];
    _mm256_storeu_ps(o, a0);
    return o[0] + o[1] + o[2] + o[3] + o[4] + o[5] + o[6] + o[7];
}
#undef FMA_STEP

static int fma_lanes(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 16 : __builtin_cpu_supports("avx2") ? 8 : 0;
}

static float fma_chains(long n) { return fma_lanes() == 16 ? ag_fma_chains_avx512(n) : fma_avx2(n); }

// Best of reps: flops per second over all threads, each running its own chains.
static double fma_gflops(int threads, int reps, float *sink) {
    int lanes = fma_lanes();
    if (!lanes) return 0;
    pass_args a = {.op = 3, .threads = threads, .n = (size_t)threads, .fma_n = 20000000};
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = run_pass(&a, sink);
        best = t < best ? t : best;
    }
    return 2.0 * lanes * FMA_CHAINS * (double)a.fma_n * threads / best / 1e9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    long long want = argc > 3 ? atoll(argv[3]) : (long long)BENCH_BYTES;
    if (threads < 1 || reps < 1 || want < 4096 || want > (1LL << 36)) {
        fprintf(stderr, "usage: bench_bandwidth [threads >= 1] [reps >= 1] [bytes, 4096 to 2^36]\n");
        return 2;
    }
    ag_set_num_threads(threads);
    const size_t bytes = (size_t)want / 256 * 256, n = bytes / sizeof(float);
    // a and b for the read, copy and write probes; b, c and d are the update's state.
    float *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes);
    float *c = aligned_alloc(64, bytes), *d = aligned_alloc(64, bytes);
    if (!a || !b || !c || !d) {
        fprintf(stderr, "bench_bandwidth: cannot allocate 4 x %zu bytes\n", bytes);
        free(a), free(b), free(c), free(d);
        return 1;
    }
    // Touch every page first: the passes time memory, not page faults.
    pass_args w = {.dst = a, .n = n, .op = 2, .threads = threads}, rd = {.src = a, .n = n, .threads = threads};
    pass_args cp = {.dst = b, .src = a, .n = n, .op = 1, .threads = threads};
    pass_args up = {.src = a, .n = n, .op = 4, .threads = threads, .state = {b, c, d}};
    float sink = 0;
    run_pass(&w, &sink);
    for (int i = 0; i < 3; i++) {
        w.dst = up.state[i];
        run_pass(&w, &sink);
    }
    w.dst = b;
    for (size_t i = 0; i < n; i += 1024) a[i] = (float)((i >> 10) & 7);
    double best_read = 1e30, best_copy = 1e30, best_write = 1e30, best_update = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = run_pass(&cp, &sink);
        best_copy = t < best_copy ? t : best_copy;
        t = run_pass(&up, &sink);
        best_update = t < best_update ? t : best_update;
        w.value = r & 1;
        t = run_pass(&w, &sink);
        best_write = t < best_write ? t : best_write;
    }
    // Reads last and back to back, as a decode step reads its weights step after step: a buffer
    // that fits the last-level cache is then read from it.
    for (int r = 0; r < reps + 1; r++) {
        double t = run_pass(&rd, &sink);
        best_read = t < best_read ? t : best_read;
    }
    double gb = (double)bytes / 1e9, gflops = fma_gflops(threads, reps, &sink);
    // Which sgemm kernels membill's products run, and who chose them.
    ag_blas_core core = ag_get_blas_core();
    printf(
        "{\"bytes\": %zu, \"threads\": %d, \"reps\": %d, \"read_gbs\": %.3f, "
        "\"copy_gbs\": %.3f, \"write_gbs\": %.3f, \"update_gbs\": %.3f, \"fma_gflops\": %.1f, \"blas_core\": \"%s\", "
        "\"blas_core_forced\": %s, \"blas_core_by\": \"%s\", \"products\": \"%s\", \"checksum\": %g}\n",
        bytes, threads, reps, gb / best_read, 2.0 * gb / best_copy, gb / best_write, 7.0 * gb / best_update, gflops,
        core.core, strcmp(core.chosen_by, "OPENBLAS_CORETYPE") ? "false" : "true", core.chosen_by, core.products,
        (double)sink);
    free(a), free(b), free(c), free(d);
    return 0;
}
