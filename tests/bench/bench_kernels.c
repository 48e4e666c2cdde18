// The kernels by element type at SmolLM2-135M's shapes (hidden 576, intermediate 1536, 30
// layers, vocab 49152). Usage: bench_kernels [reps] [threads...] (default 3 reps, 1 and 2 threads).
//   training: GFLOP/s of float32 sgemm (ag_sgemm) and the bfloat16 and float16 products
//     (ag_gemm_16) for each linear's forward x·wᵀ, dx = dy·w and dw = dyᵀ·x at 128 and 512
//     tokens, and their ratios to float32;
//   decode: one token (M = 1) through every linear weight of the model (7 per layer, then the
//     lm_head) in float32 (the skinny kernel), bfloat16, int8 (dynamic) and int4 (groups of 32
//     and of 128), each against its weight-read floor: the weight's bytes over the read bandwidth
//     measured here.
// First it says which kernels run: OpenBLAS's core and who chose it, and whether bfloat16 tiles
// run vdpbf16ps (its timed rate against FMA's). Each figure is the best of reps (the machine may
// be shared); every ratio comes from this run.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ag_kernels.h"
#include "bench_util.h"

enum { HID = 576, INTER = 1536, KV = 192, LAYERS = 30, VOCAB = 49152, GROUP = 32, GROUP_WIDE = 128 };

typedef struct {
    int64_t out, in;
} lin_shape;
static const lin_shape layer_linears[] = {{HID, HID},   {KV, HID},    {KV, HID},   {HID, HID},
                                          {INTER, HID}, {INTER, HID}, {HID, INTER}};
static const lin_shape train_linears[] = {{HID, HID}, {INTER, HID}, {HID, INTER}, {VOCAB, HID}};

static void *xmalloc(size_t n) {
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_kernels: cannot allocate %zu bytes\n", n);
        exit(1);
    }
    return p;
}

static float *rand_f32(int64_t n, float scale) {
    float *p = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = scale * (bench_uniform() - 0.5f);
    return p;
}

static uint16_t *to_bf16(const float *x, int64_t n) {
    uint16_t *p = xmalloc((size_t)n * 2);
    ag_type_traits_of(AG_BF16)->from_f32(x, p, n);
    return p;
}

// ---- training products ----

typedef struct {
    const char *name;
    CBLAS_TRANSPOSE ta, tb;
    int64_t M, N, K, lda, ldb;
    const float *A, *B;
    const uint16_t *A16, *B16;
    float *C;
} product;

// t: AG_F32 (ag_sgemm), AG_BF16 or AG_F16 (ag_gemm_16; the float16 operands are the same bits
// reinterpreted: the time does not depend on the values).
static double time_product(const product *p, ag_dtype t, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) { // the first call warms caches and the pool
        double t0 = bench_now();
        if (t != AG_F32)
            ag_gemm_16(t, p->ta, p->tb, p->M, p->N, p->K, 1.0f, p->A16, p->lda, p->B16, p->ldb, 0.0f, p->C, p->N);
        else
            ag_sgemm(p->ta, p->tb, p->M, p->N, p->K, 1.0f, p->A, p->lda, p->B, p->ldb, 0.0f, p->C, p->N);
        double t = bench_now() - t0;
        if (r > 0 && t < best) best = t;
    }
    return best;
}

// float32 on one path: force 0 OpenBLAS, 1 the AVX-512 tiles (ag_sgemm_tiles_force).
static double time_f32_on(const product *p, int force, int reps) {
    ag_sgemm_tiles_force(force);
    double t = time_product(p, AG_F32, reps);
    ag_sgemm_tiles_force(-1);
    return t;
}

// Forward, dx and dw of one linear at T tokens; adds each dtype's seconds to t32, t16[bf16, f16],
// and float32's on each path to paths[OpenBLAS, tiles].
static void bench_linear_train(int64_t T, lin_shape s, int reps, double *t32, double t16[2], double paths[2],
                               double *flops) {
    float *x = rand_f32(T * s.in, 1), *w = rand_f32(s.out * s.in, 0.1f), *dy = rand_f32(T * s.out, 1);
    uint16_t *x16 = to_bf16(x, T * s.in), *w16 = to_bf16(w, s.out * s.in), *dy16 = to_bf16(dy, T * s.out);
    int64_t cmax = T * (s.out > s.in ? s.out : s.in) > s.out * s.in ? T * (s.out > s.in ? s.out : s.in) : s.out * s.in;
    float *C = xmalloc((size_t)cmax * sizeof(float));
    product ps[3] = {
        {"fwd x.wT", CblasNoTrans, CblasTrans, T, s.out, s.in, s.in, s.in, x, w, x16, w16, C},
        {"dx dy.w", CblasNoTrans, CblasNoTrans, T, s.in, s.out, s.out, s.in, dy, w, dy16, w16, C},
        {"dw dyT.x", CblasTrans, CblasNoTrans, s.out, s.in, T, s.out, s.in, dy, x, dy16, x16, C},
    };
    for (int i = 0; i < 3; i++) {
        double a = time_product(&ps[i], AG_F32, reps), b = time_product(&ps[i], AG_BF16, reps);
        double h = time_product(&ps[i], AG_F16, reps);
        double o = ag_cpu_avx512() ? time_f32_on(&ps[i], 0, reps) : a,
               u = ag_cpu_avx512() ? time_f32_on(&ps[i], 1, reps) : a;
        double f = 2.0 * (double)ps[i].M * (double)ps[i].N * (double)ps[i].K;
        printf("  T=%-4lld [%5lld x %5lld] %-9s M=%-5lld N=%-5lld K=%-5lld f32 %6.1f (OpenBLAS %6.1f, tiles %6.1f)  "
               "bf16 %6.1f (x%.2f)  f16 %6.1f (x%.2f) GFLOP/s\n",
               (long long)T, (long long)s.out, (long long)s.in, ps[i].name, (long long)ps[i].M, (long long)ps[i].N,
               (long long)ps[i].K, f / a / 1e9, f / o / 1e9, f / u / 1e9, f / b / 1e9, a / b, f / h / 1e9, a / h);
        t32[0] += a, t16[0] += b, t16[1] += h, paths[0] += o, paths[1] += u, *flops += f;
    }
    free(x), free(w), free(dy), free(x16), free(w16), free(dy16), free(C);
}

// ---- decode ----

typedef struct {
    int64_t n;
    lin_shape *s;
    float **w32;
    uint16_t **w16;
    int8_t **w8;
    float *s8;
    void **w4, **w4w; // int4 with groups of GROUP and of GROUP_WIDE
    double bytes[5];  // weight bytes of each dtype
} model_weights;

static void make_model(model_weights *m) {
    m->n = LAYERS * 7 + 1;
    m->s = xmalloc((size_t)m->n * sizeof *m->s);
    m->w32 = xmalloc((size_t)m->n * sizeof(float *));
    m->w16 = xmalloc((size_t)m->n * sizeof(uint16_t *));
    m->w8 = xmalloc((size_t)m->n * sizeof(int8_t *));
    m->s8 = xmalloc((size_t)m->n * sizeof(float));
    m->w4 = xmalloc((size_t)m->n * sizeof(void *));
    m->w4w = xmalloc((size_t)m->n * sizeof(void *));
    memset(m->bytes, 0, sizeof m->bytes);
    for (int64_t i = 0; i < m->n; i++) {
        lin_shape s = i < LAYERS * 7 ? layer_linears[i % 7] : (lin_shape){VOCAB, HID};
        int64_t e = s.out * s.in;
        m->s[i] = s;
        m->w32[i] = rand_f32(e, 0.1f);
        m->w16[i] = to_bf16(m->w32[i], e);
        m->w8[i] = xmalloc((size_t)e);
        ag_q8_quantize_weight_packed(m->w32[i], s.out, s.in, m->w8[i], &m->s8[i]);
        m->w4[i] = xmalloc(ag_q4_bytes(s.out, s.in, GROUP));
        ag_q4_quantize_weight(m->w32[i], s.out, s.in, GROUP, m->w4[i]);
        m->w4w[i] = xmalloc(ag_q4_bytes(s.out, s.in, GROUP_WIDE));
        ag_q4_quantize_weight(m->w32[i], s.out, s.in, GROUP_WIDE, m->w4w[i]);
        m->bytes[0] += 4.0 * (double)e, m->bytes[1] += 2.0 * (double)e, m->bytes[2] += (double)e;
        m->bytes[3] += (double)ag_q4_bytes(s.out, s.in, GROUP);
        m->bytes[4] += (double)ag_q4_bytes(s.out, s.in, GROUP_WIDE);
    }
}

static void free_model(model_weights *m) {
    for (int64_t i = 0; i < m->n; i++)
        free(m->w32[i]), free(m->w16[i]), free(m->w8[i]), free(m->w4[i]), free(m->w4w[i]);
    free(m->s), free(m->w32), free(m->w16), free(m->w8), free(m->s8), free(m->w4), free(m->w4w);
}

// One token through every weight (each linear's input its own random row: the time is the
// weight's, not the chain's).
static double decode_pass(const model_weights *m, int dtype, const float *x, const uint16_t *x16, float *y) {
    double t0 = bench_now();
    for (int64_t i = 0; i < m->n; i++) {
        lin_shape s = m->s[i];
        switch (dtype) {
        case 0:
            if (ag_skinny_forward_available(1))
                ag_skinny_forward(x, m->w32[i], y, 1, s.out, s.in);
            else
                ag_sgemm(CblasNoTrans, CblasTrans, 1, s.out, s.in, 1.0f, x, s.in, m->w32[i], s.in, 0.0f, y, s.out);
            break;
        case 1:
            ag_gemm_16(AG_BF16, CblasNoTrans, CblasTrans, 1, s.out, s.in, 1.0f, x16, s.in, m->w16[i], s.in, 0.0f, y,
                       s.out);
            break;
        case 2: ag_q8_linear(x, 1, s.in, m->w8[i], m->s8[i], s.out, NULL, y); break;
        case 3: ag_q4_linear(x, 1, s.in, m->w4[i], GROUP, s.out, NULL, y); break;
        default: ag_q4_linear(x, 1, s.in, m->w4w[i], GROUP_WIDE, s.out, NULL, y); break;
        }
    }
    return bench_now() - t0;
}

// Read bandwidth over a buffer as large as the float32 weights, split over the pool's threads.
typedef struct {
    const float *p;
    int64_t n, parts;
    double sums[256];
} read_args;

static void read_part(void *arg, int64_t lo, int64_t hi, int thread) {
    read_args *a = arg;
    for (int64_t t = lo; t < hi; t++) {
        const float *p = a->p + a->n * t / a->parts;
        int64_t n = a->n * (t + 1) / a->parts - a->n * t / a->parts;
        float s[16] = {0};
        for (int64_t i = 0; i + 16 <= n; i += 16)
            for (int j = 0; j < 16; j++) s[j] += p[i + j];
        for (int j = 0; j < 16; j++) a->sums[thread] += s[j];
    }
}

static double read_gbs(const float *buf, int64_t n, int threads, int reps) {
    read_args a = {.p = buf, .n = n, .parts = threads};
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = bench_now();
        ag_parallel_for(threads, 1, read_part, &a);
        double t = bench_now() - t0;
        if (r > 0 && t < best) best = t;
    }
    if (a.sums[0] == 12345.678) printf(" "); // keeps the sums live
    return 4.0 * (double)n / best / 1e9;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    int threads[8] = {1, 2}, nthreads = 2;
    if (argc > 2) {
        nthreads = 0;
        for (int i = 2; i < argc && nthreads < 8; i++) threads[nthreads++] = atoi(argv[i]);
    }
    for (int i = 0; i < nthreads; i++)
        if (threads[i] < 1) reps = 0;
    if (reps < 1) {
        fprintf(stderr, "usage: bench_kernels [reps >= 1] [threads >= 1 ...]\n");
        return 2;
    }
    printf("kernels: avx512 %d, avx512_bf16 %d, avx512_vnni %d, f16c %d\n", ag_cpu_avx512(), ag_cpu_avx512_bf16(),
           ag_cpu_avx512_vnni(), ag_cpu_f16c());
    ag_blas_core core = ag_get_blas_core();
    printf("float32 products: %s (OpenBLAS's kernels %s, chosen by %s); bfloat16 tiles: ", core.products, core.core,
           core.chosen_by);
    if (ag_cpu_avx512_bf16())
        printf("vdpbf16ps at %.2f of FMA's multiply-adds a second, so %s\n", ag_cpu_bf16_dot_ratio(),
               ag_cpu_bf16_dot_pays() ? "run on it" : "widened to float32 for sgemm");
    else
        printf("widened to float32 for sgemm\n");
    model_weights m;
    make_model(&m);
    float *buf = m.w32[m.n - 1]; // the lm_head's float32 weight is the bandwidth buffer's first part
    int64_t nbuf = (int64_t)VOCAB * HID;
    float *x = rand_f32(INTER, 1), *y = xmalloc((size_t)VOCAB * sizeof(float));
    uint16_t *x16 = to_bf16(x, INTER);
    for (int ti = 0; ti < nthreads; ti++) {
        ag_set_num_threads(threads[ti]);
        printf("\n== %d thread(s) ==\ntraining products (bfloat16 vs float32 sgemm):\n", threads[ti]);
        double total32 = 0, total16[2] = {0, 0}, paths[2] = {0, 0}, flops = 0;
        for (int64_t T = 128; T <= 512; T *= 4)
            for (size_t i = 0; i < sizeof train_linears / sizeof *train_linears; i++)
                bench_linear_train(T, train_linears[i], reps, &total32, total16, paths, &flops);
        printf("  all of the above: f32 %.1f GFLOP/s (OpenBLAS %.1f, tiles %.1f), bf16 %.1f GFLOP/s (x%.2f), f16 %.1f "
               "GFLOP/s (x%.2f)\n",
               flops / total32 / 1e9, flops / paths[0] / 1e9, flops / paths[1] / 1e9, flops / total16[0] / 1e9,
               total32 / total16[0], flops / total16[1] / 1e9, total32 / total16[1]);
        double gbs = read_gbs(buf, nbuf, threads[ti], reps);
        printf("decode, one token through all %lld linear weights (read bandwidth %.2f GB/s):\n", (long long)m.n, gbs);
        const char *names[5] = {"float32", "bfloat16", "int8", "int4 g32", "int4 g128"};
        double t_f32 = 0;
        for (int d = 0; d < 5; d++) {
            double best = 1e30;
            for (int r = 0; r < reps + 1; r++) {
                double t = decode_pass(&m, d, x, x16, y);
                if (r > 0 && t < best) best = t;
            }
            if (d == 0) t_f32 = best;
            double floor = m.bytes[d] / (gbs * 1e9);
            printf("  %-9s %8.2f ms  weights %7.1f MB  floor %7.2f ms  x%.2f of the floor  x%.2f faster than float32\n",
                   names[d], best * 1e3, m.bytes[d] / 1e6, floor * 1e3, best / floor, t_f32 / best);
        }
    }
    free(x), free(y), free(x16);
    free_model(&m);
    return 0;
}
