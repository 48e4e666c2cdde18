// dropout and scale: values, gradients, and what each keeps for backward under each framework.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "autograd.h"

#define N 4096

static ag_ctx *start(ag_framework fw) {
    assert_int_equal(mp_init(&(mp_options){0}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    ag_ctx_set_framework(ctx, fw);
    return ctx;
}

static void stop(ag_ctx *ctx) {
    ag_ctx_free(ctx);
    for (int c = 0; c < MP_OTHER; c++) assert_int_equal(mp_get_counter(c).live, 0);
    mp_shutdown();
}

static ag_tensor *leaf(ag_ctx *ctx, bool grad) {
    ag_tensor *x =
        grad ? ag_param_new(ctx, 1, (int64_t[]){N}, "x") : ag_tensor_new(ctx, 1, (int64_t[]){N}, MP_ACTIVATION, "x");
    for (int i = 0; i < N; i++) ag_f32(x)[i] = 1.0f + (float)i / N;
    return x;
}

// y = x m / (1 - p): about p of the elements dropped, the rest scaled; the gradient is the mask
// over 1 - p; the same seed draws the same mask.
static void values_as(ag_framework fw) {
    ag_ctx *ctx = start(fw);
    ag_tensor *x = leaf(ctx, true);
    const float p = 0.25f;
    ag_tensor *y = ag_dropout(ctx, "drop", x, p, 42), *y2 = ag_dropout(ctx, "drop2", x, p, 42);
    assert_non_null(y);
    int dropped = 0;
    for (int i = 0; i < N; i++) {
        assert_true(ag_f32(y)[i] == ag_f32(y2)[i]);
        if (ag_f32(y)[i] == 0.0f)
            dropped++;
        else
            assert_float_equal(ag_f32(y)[i], ag_f32(x)[i] / (1 - p), 1e-6);
    }
    assert_true(dropped > N / 4 - 200 && dropped < N / 4 + 200);
    // the PyTorch frameworks keep a one-byte mask per element; LEAN draws it again
    ag_node_info info;
    assert_true(ag_tape_node(ctx, 0, &info));
    assert_int_equal(info.saved_bytes, fw == AG_FRAMEWORK_LEAN ? 0 : N);
    ag_release(y2);
    ag_tensor *g = ag_tensor_new(ctx, 1, (int64_t[]){N}, MP_ACTIVATION, "g");
    for (int i = 0; i < N; i++) ag_f32(g)[i] = 2.0f;
    assert_int_equal(ag_backward_grad(ctx, y, g), AG_OK);
    for (int i = 0; i < N; i++)
        assert_float_equal(ag_f32(x->grad)[i], ag_f32(y)[i] == 0.0f ? 0.0f : 2.0f / (1 - p), 1e-6);
    ag_release(g), ag_release(y), ag_release(x);
    stop(ctx);
}

static void test_dropout_lean(void **s) {
    (void)s;
    values_as(AG_FRAMEWORK_LEAN);
}
static void test_dropout_pytorch(void **s) {
    (void)s;
    values_as(AG_FRAMEWORK_PYTORCH);
}

// An input that needs no gradient: no node, and the mask is freed at once.
static void test_dropout_no_grad(void **s) {
    (void)s;
    ag_ctx *ctx = start(AG_FRAMEWORK_PYTORCH);
    ag_tensor *x = leaf(ctx, false);
    uint64_t before = mp_get_counter(MP_ACTIVATION).live;
    ag_tensor *y = ag_dropout(ctx, "drop", x, 0.5f, 1);
    assert_int_equal(ag_tape_size(ctx), 0);
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live, before + 4 * N);
    assert_null(ag_dropout(ctx, "bad", x, 1.0f, 1)); // p must be below 1
    ag_ctx_clear_error(ctx);
    ag_release(y), ag_release(x);
    stop(ctx);
}

// scale: s x forward, s dy backward, nothing saved.
static void test_scale(void **s) {
    (void)s;
    ag_ctx *ctx = start(AG_FRAMEWORK_PYTORCH);
    ag_tensor *x = leaf(ctx, true), *y = ag_scale(ctx, "sc", x, 2.5f);
    ag_node_info info;
    assert_true(ag_tape_node(ctx, 0, &info));
    assert_int_equal(info.nsaved, 0);
    ag_tensor *g = ag_tensor_new(ctx, 1, (int64_t[]){N}, MP_ACTIVATION, "g");
    for (int i = 0; i < N; i++) ag_f32(g)[i] = 1.0f;
    assert_int_equal(ag_backward_grad(ctx, y, g), AG_OK);
    for (int i = 0; i < N; i++) {
        assert_float_equal(ag_f32(y)[i], 2.5f * ag_f32(x)[i], 1e-6);
        assert_float_equal(ag_f32(x->grad)[i], 2.5f, 1e-6);
    }
    ag_release(g), ag_release(y), ag_release(x);
    stop(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropout_lean),
        cmocka_unit_test(test_dropout_pytorch),
        cmocka_unit_test(test_dropout_no_grad),
        cmocka_unit_test(test_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
