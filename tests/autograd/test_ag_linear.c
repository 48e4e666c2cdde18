// The linear op at every awkward shape its kernels meet: the skinny kernels (few rows, tiles of
// 6 x 4 and 8, 16-lane tails), the forward's mid-size rows (65 to 512, in passes of rows when
// x is large) and the sgemm path, forward and both gradients, against double.
#include "ag_test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

// ag_linear_group against ag_linear: with grad mode off, each output bit for bit what the single
// linear gives, for every weight type the group kernels take (float32, bfloat16, int8, int4),
// rows 1 to 64, widths with tails, with and without biases; and the same bytes billed.
static float *random_f32(int64_t n, uint64_t seed) {
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        v[i] = (float)((double)(seed >> 40) / (double)(1 << 24) - 0.5);
    }
    return v;
}

static void group_case(ag_ctx *ctx, int act_bits, int weight_bits, int64_t M, int64_t K, bool bias) {
    enum { NW = 3 };
    ag_precision p = ag_precision_f32();
    p.act_bits = p.grad_bits = act_bits, p.weight_bits = weight_bits;
    if (weight_bits == 4) p.group = 32, p.scale_bytes = 2;
    assert_true(ag_ctx_set_precision(ctx, &p));
    const int64_t N[NW] = {13, 64, 50};
    const char *sites[NW] = {"g.a", "g.b", "g.c"};
    ag_tensor *x = ag_tensor_new(ctx, 2, (int64_t[]){M, K}, MP_ACTIVATION, "x"), *w[NW], *b[NW], *one[NW], *grp[NW];
    assert_non_null(x);
    float *xv = random_f32(M * K, 7 + (uint64_t)M);
    ag_tensor_from_f32(x, xv);
    for (int i = 0; i < NW; i++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", i);
        w[i] = ag_param_new(ctx, 2, (int64_t[]){N[i], K}, name);
        assert_non_null(w[i]);
        float *wv = random_f32(N[i] * K, 100 + (uint64_t)(i * 31 + K));
        ag_tensor_from_f32(w[i], wv);
        free(wv);
        b[i] = NULL;
        if (bias && i != 1) { // one without: a group may mix them
            snprintf(name, sizeof name, "b%d", i);
            b[i] = ag_param_new(ctx, 1, (int64_t[]){N[i]}, name);
            float *bv = random_f32(N[i], 300 + (uint64_t)i);
            ag_tensor_from_f32(b[i], bv);
            free(bv);
        }
    }
    uint64_t before = mp_get_counter(MP_ACTIVATION).live;
    for (int i = 0; i < NW; i++) assert_non_null(one[i] = ag_linear(ctx, sites[i], x, w[i], b[i]));
    uint64_t singles = mp_get_counter(MP_ACTIVATION).live - before;
    assert_true(ag_linear_group(ctx, NW, sites, x, w, b, grp));
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live - before, 2 * singles);
    for (int i = 0; i < NW; i++) {
        assert_int_equal(grp[i]->dtype, one[i]->dtype);
        assert_string_equal(ag_tensor_name(grp[i]), ag_tensor_name(one[i]));
        if (memcmp(grp[i]->data, one[i]->data, one[i]->block.bytes) != 0)
            fail_msg("%s weights, %s activations, M %lld K %lld: output %d differs from ag_linear's",
                     ag_type_traits_of(w[0]->dtype)->name, ag_type_traits_of(x->dtype)->name, (long long)M,
                     (long long)K, i);
        ag_release(one[i]), ag_release(grp[i]), ag_release(w[i]), ag_release(b[i]);
    }
    ag_release(x);
    free(xv);
}

static void test_linear_group(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    ag_set_grad_enabled(ctx, false);
    const int64_t Ms[] = {1, 3, 8, 64};
    for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++)
        for (int bias = 0; bias < 2; bias++) {
            group_case(ctx, 32, 32, Ms[m], 100, bias);
            group_case(ctx, 16, 16, Ms[m], 100, bias);
            group_case(ctx, 32, 8, Ms[m], 100, bias);
            group_case(ctx, 32, 4, Ms[m], 96, bias); // K a multiple of 32: int4's fused kernel
            group_case(ctx, 32, 4, Ms[m], 40, bias); // otherwise its tiles
        }
    // One input wants a gradient: the linears run one by one, and record.
    ag_set_grad_enabled(ctx, true);
    ag_precision f32 = ag_precision_f32();
    assert_true(ag_ctx_set_precision(ctx, &f32));
    ag_tensor *x = ag_test_param(ctx, 2, (int64_t[]){2, 16}, "x", 3), *w[2], *out[2];
    w[0] = ag_test_param(ctx, 2, (int64_t[]){4, 16}, "w0", 4),
    w[1] = ag_test_param(ctx, 2, (int64_t[]){5, 16}, "w1", 5);
    assert_true(ag_linear_group(ctx, 2, (const char *[]){"r.a", "r.b"}, x, w, (ag_tensor *[]){NULL, NULL}, out));
    ag_tensor *ref = ag_linear(ctx, "r.c", x, w[1], NULL);
    assert_memory_equal(out[1]->data, ref->data, 2 * 5 * sizeof(float));
    ag_tensor *dy = ag_tensor_new(ctx, 2, (int64_t[]){2, 5}, MP_ACTIVATION, "dy");
    ag_fill(dy, 9, -1, 1);
    assert_int_equal(ag_backward_grad(ctx, out[1], dy), AG_OK);
    assert_non_null(w[1]->grad);
    // A group that cannot be had fails whole: every output NULL.
    assert_false(ag_linear_group(ctx, 0, NULL, x, w, NULL, out));
    ag_release(dy), ag_release(ref), ag_release(out[0]), ag_release(out[1]);
    ag_release(x), ag_release(w[0]), ag_release(w[1]);
    ag_assert_all_zero();
}

// torch.autocast's cast cache (autocast_mode.cpp cached_cast): a float32 leaf that wants a
// gradient is cast once and the copy kept until the region exits, even under no_grad (a
// checkpointed forward); a frozen weight is cast anew each time and its copy goes with its use;
// backward starts outside the region, so the cache is dropped there.
static void test_autocast_cast_cache(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    ag_precision p = ag_precision_f32();
    p.autocast = true;
    assert_true(ag_ctx_set_precision(ctx, &p));
    ag_ctx_set_framework(ctx, AG_FRAMEWORK_PYTORCH);
    const int64_t M = 3, N = 6, K = 16;
    ag_tensor *x = ag_test_param(ctx, 2, (int64_t[]){M, K}, "x", 3);
    ag_tensor *w = ag_test_param(ctx, 2, (int64_t[]){N, K}, "w", 4);
    ag_tensor *f = ag_test_param(ctx, 2, (int64_t[]){N, K}, "f", 5);
    f->requires_grad = false;
    const int64_t before = mp_get_counter(MP_ACTIVATION).live;
    ag_set_grad_enabled(ctx, false);
    ag_release(ag_linear(ctx, "a", x, w, NULL));
    ag_release(ag_linear(ctx, "b", x, f, NULL));
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live - before, N * K * 2);
    ag_tensor *y = ag_linear(ctx, "c", x, w, NULL); // the cached copy: nothing cast again
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live - before, N * K * 2 + M * N * 2);
    ag_release(y);
    ag_set_grad_enabled(ctx, true);
    y = ag_linear(ctx, "d", x, w, NULL);
    ag_tensor *dy = ag_tensor_new(ctx, 2, (int64_t[]){M, N}, MP_ACTIVATION, "dy");
    ag_fill(dy, 9, -1, 1);
    assert_int_equal(ag_backward_grad(ctx, y, dy), AG_OK);
    ag_release(y), ag_release(dy);
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live, before);
    assert_non_null(w->grad);
    ag_release(x), ag_release(w), ag_release(f);
    ag_assert_all_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_linear_shapes, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_linear_mid_rows, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_linear_group, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_autocast_cast_cache, ag_setup, ag_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
