// The kernels by element type (autograd/kernels/ag_kernels.h): conversions against independent
// references over every 16-bit pattern, each 16-bit product path at awkward shapes against
// double, the int8 linear against exact integer sums and PyTorch's quantize_dynamic outputs
// (tests/golden/quant, from tests/reference/make_quant_golden.py), the int4 quantiser and linear.
#include "ag_test_util.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ag_kernels.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rnd_unit(void) { return (float)(rnd32() >> 8) / 16777216.0f * 2.0f - 1.0f; } // [-1, 1)

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Both paths of a conversion row function: the vector one (where the CPU has it) and portable.
typedef void (*to_fn)(const void *, float *, int64_t);
typedef void (*from_fn)(const float *, void *, int64_t);

// ---- references, written independently of the library's bit tricks ----

// bfloat16 by comparing the two neighbours' distances in double; ties to the even one.
static uint16_t ref_bf16(float f) {
    if (isnan(f)) return 0x7FC0;
    uint32_t u = bits_of(f), lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
    double dl = fabs((double)f - (double)float_of(lo));
    if ((lo & 0x7FFFFFFFu) == 0x7F7F0000u && (u & 0xFFFFu) >= 0x8000u) return (uint16_t)((lo >> 16) + 1); // to inf
    if ((lo & 0x7F800000u) == 0x7F800000u) return (uint16_t)(lo >> 16);                                   // inf
    double dh = fabs((double)float_of(hi) - (double)f);
    if (dl < dh) return (uint16_t)(lo >> 16);
    if (dh < dl) return (uint16_t)(hi >> 16);
    return (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

// The value of a half from its fields (ldexp, no bit tricks).
static double ref_f16_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

// Nearest half by bisection over the ordered positive patterns; ties to the even pattern.
static uint16_t ref_f16(float f) {
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7C00;
    uint16_t lo = 0, hi = 0x7BFF;
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (ref_f16_value(mid) <= a)
            lo = mid;
        else
            hi = mid;
    }
    if (ref_f16_value(hi) <= a) lo = hi;
    uint16_t up = (uint16_t)(lo + 1);
    double dl = a - ref_f16_value(lo), du = up <= 0x7C00 ? (up == 0x7C00 ? 65536.0 : ref_f16_value(up)) - a : 1e300;
    uint16_t r = dl < du ? lo : du < dl ? up : (lo & 1) ? up : lo;
    return sign | r;
}

static void test_traits(void **state) {
    (void)state;
    const char *names[] = {"float32", "bfloat16", "float16", "int8", "int4", "nf4"};
    int bits[] = {32, 16, 16, 8, 4, 4};
    for (int t = 0; t < AG_NDTYPES; t++) {
        const ag_type_traits *tr = ag_type_traits_of((ag_dtype)t);
        assert_non_null(tr);
        assert_string_equal(tr->name, names[t]);
        assert_int_equal(tr->bits, bits[t]);
        assert_int_equal(tr->quantised, t >= AG_Q8);
        assert_int_equal(tr->to_f32 == NULL, t >= AG_Q8);
        assert_int_equal(tr->from_f32 == NULL, t >= AG_Q8);
    }
    assert_null(ag_type_traits_of(AG_NDTYPES));
    assert_null(ag_type_traits_of((ag_dtype)-1));
    float in[3] = {1.5f, -0.0f, 3e38f}, out[3];
    ag_type_traits_of(AG_F32)->from_f32(in, out, 3);
    assert_memory_equal(in, out, sizeof in);
}

// Every pattern to float32 and back, on both paths; float32 inputs (random bits, ties, the
// boundaries) to 16 bits on both paths, against the reference.
static void check_type(ag_dtype t, uint16_t (*ref_from)(float)) {
    const ag_type_traits *tr = ag_type_traits_of(t);
    enum { NRAND = 1 << 18 };
    uint16_t *h = malloc(65536 * sizeof *h), *back = malloc(65536 * sizeof *back), *o16 = malloc(NRAND * 2);
    float *f = malloc(65536 * sizeof *f), *fr = malloc(NRAND * sizeof *fr);
    uint16_t *o16p = malloc(NRAND * 2);
    float *fp = malloc(65536 * sizeof *fp);
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    for (int i = 0; i < NRAND; i++) {
        uint32_t u = rnd32();
        switch (i % 4) {
        case 0: fr[i] = float_of(u); break;
        case 1: fr[i] = float_of((u & 0xFFFF0000u) | (t == AG_BF16 ? 0x8000u : (u & 0xE000u) | 0x1000u)); break; // ties
        case 2: fr[i] = ldexpf((float)(u & 0xFFFFFF) / 16777216.0f, (int)(u >> 24) % 48 - 30); break;
        default: fr[i] = float_of((u & 0x807FFFFFu) | ((uint32_t)(100 + (u >> 24) % 50) << 23)); break;
        }
    }
    fr[0] = 65504.0f, fr[1] = 65519.99f, fr[2] = 65520.0f, fr[3] = -0.0f, fr[4] = INFINITY, fr[5] = -NAN;
    fr[6] = FLT_MAX, fr[7] = 0x1p-25f, fr[8] = 0x1p-24f, fr[9] = 0x1.8p-25f, fr[10] = 0x1p-14f, fr[11] = 0x1.ffcp-15f;
    for (int pass = 0; pass < 2; pass++) {
        ag_kernels_force_portable(pass == 1);
        tr->to_f32(h, pass ? fp : f, 65536);
        tr->from_f32(fr, pass ? o16p : o16, NRAND);
    }
    ag_kernels_force_portable(false);
    for (int i = 0; i < 65536; i++) {
        uint16_t v = (uint16_t)i;
        bool nan = t == AG_BF16 ? (v & 0x7FFF) > 0x7F80 : (v & 0x7FFF) > 0x7C00;
        double want = t == AG_BF16 ? (double)float_of((uint32_t)v << 16) : ref_f16_value(v);
        if (nan) {
            assert_true(isnan(f[i]));
            if (t == AG_F16) assert_true(bits_of(f[i]) & 0x400000u); // quiet, as F16C makes it
        } else if ((v & 0x7FFF) == (t == AG_BF16 ? 0x7F80 : 0x7C00)) {
            assert_true(isinf(f[i]) && !!signbit(f[i]) == !!(v & 0x8000));
        } else {
            assert_true((double)f[i] == want && !!signbit(f[i]) == !!(v & 0x8000));
        }
        assert_int_equal(bits_of(f[i]), bits_of(fp[i])); // vector and portable: the same bits
    }
    // Non-NaN patterns come back unchanged.
    tr->from_f32(f, back, 65536);
    for (int i = 0; i < 65536; i++)
        if (!isnan(f[i])) assert_int_equal(back[i], i);
    for (int i = 0; i < NRAND; i++) {
        if (!isnan(fr[i])) assert_int_equal(o16[i], ref_from(fr[i]));
        assert_int_equal(o16[i], o16p[i]);
    }
    // Scalar forms (the kernels' tails and the products' stores) against the row forms.
    for (int i = 0; i < NRAND; i += 7)
        assert_int_equal(t == AG_BF16 ? ag_bf16_from_f32(fr[i]) : ag_f16_from_f32(fr[i]), o16[i]);
    free(h), free(back), free(o16), free(f), free(fr), free(o16p), free(fp);
}

static void test_bf16_conversions(void **state) {
    (void)state;
    check_type(AG_BF16, ref_bf16);
    assert_int_equal(ag_bf16_from_f32(NAN), 0x7FC0);
    assert_int_equal(ag_bf16_from_f32(-NAN), 0x7FC0);                  // c10::BFloat16 drops the sign too
    assert_int_equal(ag_bf16_from_f32(float_of(0x3F808000u)), 0x3F80); // tie to even: down
    assert_int_equal(ag_bf16_from_f32(float_of(0x3F818000u)), 0x3F82); // tie to even: up
}

static void test_f16_conversions(void **state) {
    (void)state;
    check_type(AG_F16, ref_f16);
    assert_int_equal(ag_f16_from_f32(65520.0f), 0x7C00);
    assert_int_equal(ag_f16_from_f32(0x1p-25f), 0x0000);   // half the smallest subnormal: tie to 0
    assert_int_equal(ag_f16_from_f32(0x1.8p-24f), 0x0002); // 1.5 subnormal steps: tie to even 2
    // NaN: quiet, the top of the payload kept (as F16C converts).
    assert_int_equal(ag_f16_from_f32(float_of(0x7F802000u)), 0x7E01);
    assert_int_equal(bits_of(ag_f16_to_f32(0x7C01)), 0x7FC02000u);
}

// ---- 16-bit products ----

typedef struct {
    int64_t M, N, K;
    bool ta, tb;
} shape;

static void fill16(ag_dtype t, uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = t == AG_BF16 ? ag_bf16_from_f32(rnd_unit()) : ag_f16_from_f32(rnd_unit());
}
static double v16(ag_dtype t, uint16_t h) { return t == AG_BF16 ? ag_bf16_to_f32(h) : ag_f16_to_f32(h); }

// One product on the current path, float32 and 16-bit C, against double. Each 16-bit product is
// exact in float32 (8 or 11 significant bits twice), so only the float32 sums round: K - 1
// additions of relative error 2^-24 each bound the error by (K + 1) 2^-24 Σ |a b| (the sums of
// magnitudes, before alpha), plus one rounding of alpha's and beta's terms. The 16-bit C adds its
// own rounding, half a step: 2^-8 relative for bfloat16 (8 significant bits), 2^-11 for float16.
static double gemm_case(ag_dtype t, shape s, float *Cout) {
    int64_t M = s.M, N = s.N, K = s.K;
    int64_t lda = (s.ta ? M : K) + 3, ldb = (s.tb ? K : N) + 1, ldc = N + 2; // strides wider than rows
    int64_t arows = s.ta ? K : M, brows = s.tb ? N : K;
    uint16_t *A = malloc((size_t)(arows * lda) * 2), *B = malloc((size_t)(brows * ldb) * 2);
    uint16_t *D = malloc((size_t)(M * ldc) * 2);
    float *C = malloc((size_t)(M * ldc) * sizeof(float));
    fill16(t, A, arows * lda);
    fill16(t, B, brows * ldb);
    for (int64_t i = 0; i < M * ldc; i++) C[i] = rnd_unit();
    fill16(t, D, M * ldc);
    float alpha = 0.75f, beta = (M + N) % 2 ? 0.5f : 0.0f;
    float *C0 = malloc((size_t)(M * ldc) * sizeof(float));
    uint16_t *D0 = malloc((size_t)(M * ldc) * 2);
    memcpy(C0, C, (size_t)(M * ldc) * sizeof(float));
    memcpy(D0, D, (size_t)(M * ldc) * 2);
    ag_gemm_16(t, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb,
               beta, C, ldc);
    ag_gemm_16_out(t, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
                   ldb, beta, D, ldc);
    double worst = 0, round16 = t == AG_BF16 ? 0x1p-8 : 0x1p-11;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double sum = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = v16(t, s.ta ? A[k * lda + i] : A[i * lda + k]);
                double b = v16(t, s.tb ? B[j * ldb + k] : B[k * ldb + j]);
                sum += a * b, mag += fabs(a * b);
            }
            double ref = alpha * sum + beta * (double)C0[i * ldc + j];
            double tol = (double)(K + 1) * 0x1p-24 * mag * alpha + 0x1p-23 * (fabs(ref) + fabs(beta * C0[i * ldc + j]));
            tol += 1e-30;
            double err = fabs((double)C[i * ldc + j] - ref);
            worst = err / tol > worst ? err / tol : worst;
            double ref16 = alpha * sum + beta * v16(t, D0[i * ldc + j]);
            double err16 = fabs(v16(t, D[i * ldc + j]) - ref16);
            double tol16 = tol + round16 * fabs(ref16) + 0x1p-24; // a subnormal half's step, at worst
            if (err16 > tol16) worst = 1e9;
        }
    // Columns past N of each row are not written.
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = N; j < ldc; j++) {
            assert_true(bits_of(C[i * ldc + j]) == bits_of(C0[i * ldc + j]));
            assert_int_equal(D[i * ldc + j], D0[i * ldc + j]);
        }
    if (Cout)
        for (int64_t i = 0; i < M; i++) memcpy(Cout + i * N, C + i * ldc, (size_t)N * sizeof(float));
    free(A), free(B), free(C), free(D), free(C0), free(D0);
    return worst;
}

static const int64_t Ms[] = {1, 2, 3, 7, 17, 64, 65, 129, 513}, NKs[] = {1, 15, 17, 33, 513};

static void gemm_all(ag_dtype t, bool portable) {
    ag_kernels_force_portable(portable);
    ag_kernels_force_bf16_dot(1); // the vdpbf16ps tiles wherever the CPU has them, paying or not
    for (int im = 0; im < 9; im++)
        for (int in = 0; in < 5; in++)
            for (int tr = 0; tr < 4; tr++) {
                shape s = {Ms[im], NKs[in], NKs[(im + in + tr) % 5], tr & 1, tr >> 1};
                if (s.M * s.N * s.K > 40000000) s.K = 33; // keep the double reference quick
                double w = gemm_case(t, s, NULL);
                if (w > 1)
                    print_error("%s %s M=%lld N=%lld K=%lld ta=%d tb=%d: %g of the bound\n",
                                portable ? "portable" : "fast", t == AG_BF16 ? "bf16" : "f16", (long long)s.M,
                                (long long)s.N, (long long)s.K, s.ta, s.tb, w);
                assert_true(w <= 1);
            }
    ag_kernels_force_portable(false);
    ag_kernels_force_bf16_dot(-1);
}

// The bfloat16 tiles' path: vdpbf16ps where it runs at least AG_BF16_DOT_PAYS of float32 FMA's
// multiply-adds, widened to float32 otherwise; the choice the same each time it is asked.
static void test_bf16_dot_choice(void **state) {
    (void)state;
    double r = ag_cpu_bf16_dot_ratio();
    if (!ag_cpu_avx512_bf16()) {
        assert_true(r == 0 && !ag_cpu_bf16_dot_pays());
        return;
    }
    assert_true(r > 0.05 && r < 20); // two instructions' rates, timed: a ratio, not noise
    assert_true(ag_cpu_bf16_dot_pays() == (r >= AG_BF16_DOT_PAYS));
    assert_true(ag_cpu_bf16_dot_ratio() == r);
    ag_kernels_force_bf16_dot(0);
    assert_false(ag_cpu_bf16_dot_pays());
    ag_kernels_force_bf16_dot(1);
    assert_true(ag_cpu_bf16_dot_pays());
    ag_kernels_force_bf16_dot(-1);
    printf("vdpbf16ps: %.2f of FMA's multiply-adds a second: bfloat16 tiles %s\n", r,
           ag_cpu_bf16_dot_pays() ? "run it" : "widened to float32");
}

static void test_gemm_bf16(void **state) {
    (void)state;
    gemm_all(AG_BF16, false);
}
static void test_gemm_bf16_portable(void **state) {
    (void)state;
    gemm_all(AG_BF16, true);
}
static void test_gemm_f16(void **state) {
    (void)state;
    gemm_all(AG_F16, false);
}

// Depth beyond one tile (KC) and M beyond MC with every transpose; and the fast path against the
// portable one on the same inputs: both within the bound, so within twice it of each other. The
// last three: one row tile over many column tiles and three blocks of K (a thread's next tiles
// reuse its packed rows), many row tiles over one block of K, and five blocks (none kept).
static void test_gemm_fast_vs_portable(void **state) {
    (void)state;
    if (!ag_cpu_avx512_bf16()) skip();
    shape shapes[] = {{200, 300, 800, false, true}, {64, 577, 389, false, false}, {25, 96, 770, true, false},
                      {300, 49, 40, true, true},    {5, 1000, 576, false, true},  {150, 1100, 1000, false, false},
                      {900, 100, 300, true, false}, {100, 700, 1700, false, true}};
    ag_kernels_force_bf16_dot(1);
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        shape s = shapes[i];
        float *fast = malloc((size_t)(s.M * s.N) * sizeof(float)), *port = malloc((size_t)(s.M * s.N) * sizeof(float));
        uint64_t seed = rng_state;
        assert_true(gemm_case(AG_BF16, s, fast) <= 1);
        rng_state = seed;
        ag_kernels_force_portable(true);
        assert_true(gemm_case(AG_BF16, s, port) <= 1);
        ag_kernels_force_portable(false);
        double diff = 0, mag = 0;
        for (int64_t j = 0; j < s.M * s.N; j++) {
            diff = fmax(diff, fabs((double)fast[j] - port[j]));
            mag = fmax(mag, fabs((double)port[j]));
        }
        assert_true(diff <= 2.0 * (double)(s.K + 1) * 0x1p-24 * (double)s.K + 1e-6 * mag);
        free(fast), free(port);
    }
    ag_kernels_force_bf16_dot(-1);
}

static void test_gemm_stats_and_zero_depth(void **state) {
    (void)state;
    ag_reset_blas_stats();
    uint16_t a[6], b[6];
    float c[4] = {1, 2, 3, 4};
    fill16(AG_BF16, a, 6), fill16(AG_BF16, b, 6);
    ag_gemm_16(AG_BF16, CblasNoTrans, CblasTrans, 2, 2, 3, 1.0f, a, 3, b, 3, 0.0f, c, 2);
    ag_blas_stats st = ag_get_blas_stats();
    assert_int_equal(st.calls, 1);
    assert_true(st.flops == 24.0);
    // K = 0: C = beta C.
    float d[4] = {1, 2, 3, 4};
    ag_gemm_16(AG_BF16, CblasNoTrans, CblasNoTrans, 2, 2, 0, 1.0f, a, 1, b, 2, 0.5f, d, 2);
    assert_true(d[0] == 0.5f && d[3] == 2.0f);
    void *w1 = ag_kernel_ws(100), *w2 = ag_kernel_ws(50);
    assert_non_null(w1);
    assert_ptr_equal(w1, w2);
    assert_int_equal((uintptr_t)w1 % 64, 0);
    assert_non_null(ag_kernel_ws(1 << 20));
}

// ---- int8 ----

static void test_q8_quantize_weight(void **state) {
    (void)state;
    enum { N = 7, K = 33 };
    float w[N * K];
    int8_t q[N * K];
    for (int i = 0; i < N * K; i++) w[i] = rnd_unit() * 0.3f;
    w[5] = -0.9f; // the largest magnitude, negative: -0.9 / s is -127.5 up to rounding
    float s;
    ag_q8_quantize_weight(w, N, K, q, &s);
    assert_true(s == 0.9f / 127.5f);
    assert_true(q[5] == -128 || q[5] == -127);
    for (int i = 0; i < N * K; i++) {
        double want = nearbyint((double)(w[i] * (1.0f / s)));
        assert_int_equal(q[i], (int)want);
        // within half a step, give or take the rounding of w / s (up to 127.5 steps, 2^-23 relative)
        assert_true(fabs((double)q[i] * s - w[i]) <= (0.5 + 2e-5) * s);
    }
    float z[4] = {0};
    ag_q8_quantize_weight(z, 1, 4, q, &s);
    assert_true(s == FLT_EPSILON); // all zero: the observer's eps
    assert_int_equal(q[0], 0);
}

static void test_q8_act_params(void **state) {
    (void)state;
    float x[4] = {-1.0f, 3.0f, 0.5f, 2.0f};
    ag_q8_act_params p = ag_q8_choose_act_params(x, 4);
    // scale 4 / 127; zero point from min: 1 / scale = 31.75, nudged to 32 (min's terms are smaller).
    assert_true(p.scale == (float)(4.0 / 127.0));
    assert_int_equal(p.zero_point, 32);
    assert_int_equal(p.qmax, 127);
    float pos[3] = {0.5f, 2.0f, 1.0f}, neg[3] = {-0.5f, -2.0f, -1.0f}, zero[3] = {0};
    p = ag_q8_choose_act_params(pos, 3);
    assert_true(p.scale == (float)(2.0 / 127.0) && p.zero_point == 0);
    p = ag_q8_choose_act_params(neg, 3);
    assert_true(p.scale == (float)(2.0 / 127.0) && p.zero_point == 127);
    p = ag_q8_choose_act_params(zero, 3);
    assert_true(p.scale == 0.1f && p.zero_point == 0); // degenerate range: PyTorch's 0.1
    float tiny[2] = {0.0f, 1e-4f};
    p = ag_q8_choose_act_params(tiny, 2);
    assert_true(p.scale == 6.1e-5f && p.zero_point == 0); // below SMALL_SCALE_THRESHOLD
    uint8_t q[4];
    p = ag_q8_choose_act_params(x, 4);
    ag_q8_quantize_act(x, 4, p, q);
    assert_int_equal(q[0], 0);   // -1 -> 0
    assert_int_equal(q[1], 127); // 3 -> 127
    assert_int_equal(q[2], (int)nearbyintf(0.5f * (1.0f / p.scale) + 32.0f));
}

// The vector min / max (AVX-512) picks what the portable loop picks: every length with a tail,
// NaN and infinities anywhere, a NaN first (which both keep, as PyTorch's loop does).
static void test_q8_act_params_vector(void **state) {
    (void)state;
    float x[1536];
    for (int64_t n = 1; n <= 1536; n += n < 70 ? 1 : 733) {
        for (int kind = 0; kind < 4; kind++) {
            for (int64_t i = 0; i < n; i++) x[i] = rnd_unit() * 3.0f + 0.5f;
            if (kind == 1) x[n / 2] = NAN;
            if (kind == 2) x[n - 1] = -INFINITY, x[0] = 1e30f;
            if (kind == 3) x[0] = NAN;
            ag_q8_act_params v = ag_q8_choose_act_params(x, n);
            ag_kernels_force_portable(true);
            ag_q8_act_params p = ag_q8_choose_act_params(x, n);
            ag_kernels_force_portable(false);
            if (bits_of(v.scale) != bits_of(p.scale) || v.zero_point != p.zero_point)
                fail_msg("n %lld, case %d: scale %g / %g, zero point %d / %d", (long long)n, kind, v.scale, p.scale,
                         v.zero_point, p.zero_point);
        }
    }
}

// ag_argmax against the plain loop: ties (the first wins), NaN (never greater; first: 0),
// infinities, every tail of 16 lanes, a vocabulary's length.
static void test_argmax(void **state) {
    (void)state;
    enum { V = 49152 };
    float *x = malloc(V * sizeof(float));
    assert_non_null(x);
    for (int64_t n = 1; n <= V; n += n < 80 ? 1 : 16381) {
        for (int kind = 0; kind < 5; kind++) {
            for (int64_t i = 0; i < n; i++) x[i] = kind == 1 ? (float)(rnd32() % 5) : rnd_unit();
            if (kind == 2) x[rnd32() % n] = NAN, x[rnd32() % n] = 7.0f, x[rnd32() % n] = 7.0f;
            if (kind == 3) x[0] = NAN;
            if (kind == 4)
                for (int64_t i = 0; i < n; i++) x[i] = -INFINITY;
            int64_t want = 0;
            if (x[0] == x[0])
                for (int64_t j = 1; j < n; j++)
                    if (x[j] > x[want]) want = j;
            int64_t got = ag_argmax(x, n);
            if (got != want)
                fail_msg("n %lld, case %d: %lld, expected %lld", (long long)n, kind, (long long)got, (long long)want);
        }
    }
    assert_int_equal(ag_argmax(x, 0), 0);
    free(x);
}

// The float result against double sums of the same quantised integers: the integer sums are
// exact, so only the dequantisation rounds (a few ulp of the output).
static void q8_check(int64_t M, int64_t K, int64_t N, bool bias) {
    float *x = malloc((size_t)(M * K) * 4), *w = malloc((size_t)(N * K) * 4), *b = malloc((size_t)N * 4);
    float *y = malloc((size_t)(M * N) * 4), *yp = malloc((size_t)(M * N) * 4);
    int8_t *q = malloc((size_t)(N * K));
    uint8_t *xq = malloc((size_t)(M * K));
    for (int64_t i = 0; i < M * K; i++) x[i] = rnd_unit() * 2.0f + 0.3f;
    for (int64_t i = 0; i < N * K; i++) w[i] = rnd_unit() * 0.1f;
    for (int64_t i = 0; i < N; i++) b[i] = rnd_unit();
    float ws, wsp;
    ag_q8_quantize_weight(w, N, K, q, &ws);
    // The packed layout: the same bytes, each at ag_q8_offset, quantised straight into it or packed.
    int8_t *qp = malloc((size_t)(N * K)), *qp2 = malloc((size_t)(N * K)), *row = malloc((size_t)K);
    ag_q8_quantize_weight_packed(w, N, K, qp, &wsp);
    ag_q8_pack_weight(q, N, K, qp2);
    assert_true(wsp == ws);
    assert_memory_equal(qp, qp2, (size_t)(N * K));
    for (int64_t n = 0; n < N; n++) {
        ag_q8_unpack_row(qp, N, K, n, row);
        assert_memory_equal(row, q + n * K, (size_t)K);
        for (int64_t k = 0; k < K; k++) assert_int_equal(qp[ag_q8_offset(N, K, n, k)], q[n * K + k]);
    }
    assert_true(ag_q8_linear(x, M, K, qp, ws, N, bias ? b : NULL, y));
    ag_kernels_force_portable(true);
    assert_true(ag_q8_linear(x, M, K, qp, ws, N, bias ? b : NULL, yp));
    ag_kernels_force_portable(false);
    free(qp), free(qp2), free(row);
    ag_q8_act_params p = ag_q8_choose_act_params(x, M * K);
    ag_q8_quantize_act(x, M * K, p, xq);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            int64_t acc = 0;
            for (int64_t k = 0; k < K; k++) acc += ((int64_t)xq[m * K + k] - p.zero_point) * q[n * K + k];
            double s = (double)(p.scale * ws), ref = (double)acc * s + (bias ? b[n] : 0.0);
            double tol = 4 * 0x1p-24 * (fabs((double)acc * s) + (bias ? fabs(b[n]) : 0)) + 1e-30;
            assert_true(fabs(y[m * N + n] - ref) <= tol);
            assert_true(bits_of(y[m * N + n]) == bits_of(yp[m * N + n])); // VNNI and portable agree exactly
        }
    free(x), free(w), free(b), free(y), free(yp), free(q), free(xq);
}

static void test_q8_linear_exact(void **state) {
    (void)state;
    int64_t shapes[][3] = {{1, 576, 37}, {2, 17, 5}, {3, 64, 4}, {7, 65, 9}, {17, 130, 33}, {65, 127, 6}, {5, 1, 3}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        q8_check(shapes[i][0], shapes[i][1], shapes[i][2], i % 2 == 0);
}

static void read_or_fail(FILE *f, void *p, size_t n) { assert_int_equal(fread(p, 1, n, f), n); }

// PyTorch's own outputs: the weight's integers and scale bit for bit, the activation parameters,
// and y within a few ulp of each output's magnitude (the integer sums are exact on both sides; the
// dequantisation's float steps may be ordered differently).
static void test_q8_against_pytorch(void **state) {
    (void)state;
    FILE *f = fopen(MEMBILL_GOLDEN_DIR "/quant/q8_linear.bin", "rb");
    assert_non_null(f);
    int32_t ncases;
    read_or_fail(f, &ncases, 4);
    assert_true(ncases > 0);
    for (int c = 0; c < ncases; c++) {
        int32_t hdr[4];
        read_or_fail(f, hdr, sizeof hdr);
        int64_t M = hdr[0], K = hdr[1], N = hdr[2];
        float *x = malloc((size_t)(M * K) * 4), *w = malloc((size_t)(N * K) * 4), *b = malloc((size_t)N * 4);
        float *yg = malloc((size_t)(M * N) * 4), *y = malloc((size_t)(M * N) * 4);
        int8_t *qg = malloc((size_t)(N * K)), *q = malloc((size_t)(N * K));
        read_or_fail(f, x, (size_t)(M * K) * 4);
        read_or_fail(f, w, (size_t)(N * K) * 4);
        if (hdr[3]) read_or_fail(f, b, (size_t)N * 4);
        read_or_fail(f, qg, (size_t)(N * K));
        float wsg, xsg, ws;
        int32_t zpg, engine;
        read_or_fail(f, &wsg, 4), read_or_fail(f, &xsg, 4), read_or_fail(f, &zpg, 4);
        read_or_fail(f, yg, (size_t)(M * N) * 4);
        read_or_fail(f, &engine, 4);
        ag_q8_quantize_weight(w, N, K, q, &ws);
        assert_true(ws == wsg);
        assert_memory_equal(q, qg, (size_t)(N * K));
        int8_t *qp = malloc((size_t)(N * K));
        ag_q8_pack_weight(q, N, K, qp);
        ag_q8_act_params p = ag_q8_choose_act_params(x, M * K);
        assert_true(p.scale == xsg);
        assert_int_equal(p.zero_point, zpg);
        for (int path = 0; path < 2; path++) {
            ag_kernels_force_portable(path == 1);
            assert_true(ag_q8_linear(x, M, K, qp, ws, N, hdr[3] ? b : NULL, y));
            for (int64_t i = 0; i < M * N; i++) {
                double tol = 8 * 0x1p-24 * (fabs((double)yg[i]) + (hdr[3] ? fabs(b[i % N]) : 0)) + 1e-30;
                if (fabs((double)y[i] - yg[i]) > tol)
                    print_error("case %d (engine %d) y[%lld] = %.9g, PyTorch %.9g\n", c, engine, (long long)i, y[i],
                                yg[i]);
                assert_true(fabs((double)y[i] - yg[i]) <= tol);
            }
        }
        ag_kernels_force_portable(false);
        free(x), free(w), free(b), free(yg), free(y), free(qg), free(q), free(qp);
    }
    char extra;
    assert_int_equal(fread(&extra, 1, 1, f), 0);
    fclose(f);
}

// ---- int4 ----

// Scale i of a block (they follow the nibbles at any byte).
static uint16_t q4_scale(const void *block, int64_t N, int64_t K, int64_t i) {
    uint16_t h;
    memcpy(&h, (const uint8_t *)block + (N * K + 1) / 2 + 2 * i, 2);
    return h;
}

static void test_q4_layout(void **state) {
    (void)state;
    // ag_billed_bytes' formula for weight_bits 4, scale_bytes 2.
    int64_t dims[][3] = {{576, 576, 32}, {1536, 576, 64}, {3, 5, 2}, {7, 9, 4}, {1, 1, 1}, {49152, 576, 128}};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
        uint64_t N = (uint64_t)dims[i][0], K = (uint64_t)dims[i][1], g = (uint64_t)dims[i][2];
        assert_int_equal(ag_q4_bytes(dims[i][0], dims[i][1], dims[i][2]),
                         (N * K * 4 + 7) / 8 + N * ((K + g - 1) / g) * 2);
    }
    // Known integers: w = q s with s = 0.25 per group (amax 1.75 = 7 s), including an odd N K.
    enum { N = 3, K = 5, G = 2 };
    int qv[N * K] = {7, -8, 1, 0, -3, 2, 7, -1, 5, 0, -7, 3, 6, -2, 7};
    float w[N * K];
    for (int i = 0; i < N * K; i++) w[i] = (float)qv[i] * 0.25f;
    uint8_t block[64];
    memset(block, 0xAA, sizeof block);
    ag_q4_quantize_weight(w, N, K, G, block);
    for (int e = 0; e < N * K; e++) {
        int nib = (block[e / 2] >> (4 * (e % 2))) & 15;
        int expect = qv[e];
        // a group whose largest magnitude is 8 * 0.25 (the -8): scale 2 / 7, so recompute
        int n = e / K, g = (e % K) / G;
        float amax = 0;
        for (int k = g * G; k < (g + 1) * G && k < K; k++) amax = fmaxf(amax, fabsf(w[n * K + k]));
        float s = ag_f16_to_f32(ag_f16_from_f32(amax / 7.0f));
        s = s > 0 ? s : 1.0f; // an all-zero group keeps scale 1
        expect = (int)fmax(-8, fmin(7, nearbyint(w[e] / s)));
        assert_int_equal(nib >= 8 ? nib - 16 : nib, expect);
    }
    assert_int_equal(block[N * K / 2] >> 4, 0); // the last byte's unused nibble is zero
    assert_int_equal(q4_scale(block, N, K, 0), ag_f16_from_f32(0.25f * 8 / 7.0f)); // row 0, group 0: {7, -8} * 0.25
    assert_int_equal(q4_scale(block, N, K, 1), ag_f16_from_f32(0.25f / 7.0f));     // row 0, group 1: {1, 0} * 0.25
}

static void test_q4_roundtrip(void **state) {
    (void)state;
    int64_t N = 9, K = 70, group = 32, G = 3;
    float *w = malloc((size_t)(N * K) * 4), *d = malloc((size_t)(N * K) * 4);
    for (int64_t i = 0; i < N * K; i++) w[i] = rnd_unit();
    for (int64_t k = 0; k < 32; k++) w[2 * K + k] = 0.0f; // a zero group: scale 1
    void *block = malloc(ag_q4_bytes(N, K, group));
    ag_q4_quantize_weight(w, N, K, group, block);
    ag_q4_dequantize_rows(block, N, K, group, 0, N, d);
    assert_int_equal(q4_scale(block, N, K, 2 * G), 0x3C00);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            float s = ag_f16_to_f32(q4_scale(block, N, K, n * G + k / group));
            double q = d[n * K + k] / s;
            assert_true(q == nearbyint(q) && q >= -8 && q <= 7); // an integer times its scale, exactly
            // within half a step, except where the largest magnitude was rounded by the f16 scale
            assert_true(fabs((double)d[n * K + k] - w[n * K + k]) <= 0.5 * s + 7 * s * 0x1p-11);
        }
    // Rows [3, 5) alone give the same values.
    ag_q4_dequantize_rows(block, N, K, group, 3, 5, d);
    float *all = malloc((size_t)(N * K) * 4);
    ag_q4_dequantize_rows(block, N, K, group, 0, N, all);
    assert_memory_equal(d, all + 3 * K, (size_t)(2 * K) * 4);
    free(w), free(d), free(block), free(all);
}

// y against double products of x and the dequantised weight: float32 accumulation only.
static void q4_check(int64_t M, int64_t N, int64_t K, int64_t group, bool portable) {
    float *x = malloc((size_t)(M * K) * 4), *w = malloc((size_t)(N * K) * 4), *b = malloc((size_t)N * 4);
    float *y = malloc((size_t)(M * N) * 4), *d = malloc((size_t)(N * K) * 4);
    for (int64_t i = 0; i < M * K; i++) x[i] = rnd_unit();
    for (int64_t i = 0; i < N * K; i++) w[i] = rnd_unit() * 0.2f;
    for (int64_t i = 0; i < N; i++) b[i] = rnd_unit();
    void *block = malloc(ag_q4_bytes(N, K, group));
    ag_q4_quantize_weight(w, N, K, group, block);
    ag_q4_dequantize_rows(block, N, K, group, 0, N, d);
    ag_kernels_force_portable(portable);
    assert_true(ag_q4_linear(x, M, K, block, group, N, N % 2 ? b : NULL, y));
    ag_kernels_force_portable(false);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = N % 2 ? b[n] : 0, mag = fabs(s);
            for (int64_t k = 0; k < K; k++)
                s += (double)x[m * K + k] * d[n * K + k], mag += fabs(x[m * K + k] * d[n * K + k]);
            double tol = (double)(K + 2) * 0x1p-24 * mag + 1e-30;
            if (fabs(y[m * N + n] - s) > tol)
                print_error("q4 M=%lld N=%lld K=%lld g=%lld %s: %g vs %g\n", (long long)M, (long long)N, (long long)K,
                            (long long)group, portable ? "portable" : "fast", y[m * N + n], s);
            assert_true(fabs(y[m * N + n] - s) <= tol);
        }
    free(x), free(w), free(b), free(y), free(d), free(block);
}

static void test_q4_linear(void **state) {
    (void)state;
    int64_t Mq[] = {1, 2, 3, 5, 17, 64, 65, 130};
    // Blocks of 128 with tails of 32, 64 and 96; groups of 32, 64, 128 and 256 (fast path) and
    // 96, 16 and 5 (tiles dequantised for sgemm).
    int64_t NKg[][3] = {{33, 64, 32}, {7, 96, 32},   {5, 576, 64}, {9, 50, 16},
                        {3, 17, 5},   {6, 160, 128}, {4, 288, 96}, {5, 544, 256}};
    for (int im = 0; im < 8; im++)
        for (int j = 0; j < 8; j++)
            for (int portable = 0; portable < 2; portable++)
                q4_check(Mq[im], NKg[j][0], NKg[j][1], NKg[j][2], portable);
}

int main(void) {
    ag_set_num_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traits),
        cmocka_unit_test(test_bf16_conversions),
        cmocka_unit_test(test_f16_conversions),
        cmocka_unit_test(test_bf16_dot_choice),
        cmocka_unit_test(test_gemm_bf16),
        cmocka_unit_test(test_gemm_bf16_portable),
        cmocka_unit_test(test_gemm_f16),
        cmocka_unit_test(test_gemm_fast_vs_portable),
        cmocka_unit_test(test_gemm_stats_and_zero_depth),
        cmocka_unit_test(test_q8_quantize_weight),
        cmocka_unit_test(test_q8_act_params),
        cmocka_unit_test(test_q8_act_params_vector),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_q8_linear_exact),
        cmocka_unit_test(test_q8_against_pytorch),
        cmocka_unit_test(test_q4_layout),
        cmocka_unit_test(test_q4_roundtrip),
        cmocka_unit_test(test_q4_linear),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
