// A fused projection and its parts (Phi-3's qkv_proj, gate_up_proj): ag_linear_parts and ag_part
// against central differences under every framework and every kind of part; what each kind bills
// in backward (PyTorch's SliceBackward: a gradient as large as the fused output, summed by the
// engine in place, or out of place under 1.13); a view keeping its base alive.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_test_util.h"

enum { M = 5, H = 6, P = 3 }; // rows, input features, features of each of the three parts

// in[0] x [M, H], in[1] w [3P, H]: q, k, v = parts of x · wᵀ; out = q * k + v.
static ag_tensor *parts_graph(ag_ctx *ctx, ag_tensor **in, const void *arg) {
    const ag_part_kind kind = *(const ag_part_kind *)arg;
    ag_tensor *y = ag_linear_parts(ctx, "qkv", in[0], in[1], 3, (const int64_t[]){P, P, P});
    ag_tensor *q = ag_part(ctx, "q", y, 0, 2, (const int64_t[]){M, P}, kind);
    ag_tensor *k = ag_part(ctx, "k", y, M * P, 2, (const int64_t[]){M, P}, kind);
    ag_tensor *v = ag_part(ctx, "v", y, 2 * M * P, 2, (const int64_t[]){M, P}, kind);
    ag_release(y);
    ag_tensor *qk = ag_mul(ctx, "qk", q, k);
    ag_tensor *out = ag_add(ctx, "out", qk, v);
    ag_release(q), ag_release(k), ag_release(v), ag_release(qk);
    return out;
}

static void test_parts_fd(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    for (ag_framework fw = AG_FRAMEWORK_LEAN; fw <= AG_FRAMEWORK_PYTORCH_113; fw++)
        for (ag_part_kind kind = AG_PART_VIEW; kind <= AG_PART_COPY; kind++) {
            ag_ctx_set_framework(ctx, fw);
            ag_tensor *in[2] = {ag_test_param(ctx, 2, (int64_t[]){M, H}, "x", 1),
                                ag_test_param(ctx, 2, (int64_t[]){3 * P, H}, "w", 2)};
            ag_fd_check(ctx, parts_graph, &kind, 2, in);
            ag_release(in[0]), ag_release(in[1]);
        }
}

// The checker catches a wrong gradient of the fused weight.
static void test_parts_fd_catches(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    ag_part_kind kind = AG_PART_SLICE;
    ag_ctx_set_framework(ctx, AG_FRAMEWORK_PYTORCH);
    ag_tensor *in[2] = {ag_test_param(ctx, 2, (int64_t[]){M, H}, "x", 1),
                        ag_test_param(ctx, 2, (int64_t[]){3 * P, H}, "w", 2)};
    assert_true(ag_fd_worst(ctx, parts_graph, &kind, 2, in, 1e-2, 1e-3, 1e-2, 0.05f) > 1);
    ag_release(in[0]), ag_release(in[1]);
}

// The activation peak of one forward and backward of the graph.
static uint64_t backward_peak(ag_ctx *ctx, ag_framework fw, ag_part_kind kind) {
    ag_ctx_set_framework(ctx, fw);
    ag_tensor *in[2] = {ag_test_param(ctx, 2, (int64_t[]){M, H}, "x", 1),
                        ag_test_param(ctx, 2, (int64_t[]){3 * P, H}, "w", 2)};
    mp_reset_peaks();
    ag_tensor *out = parts_graph(ctx, in, &kind);
    ag_tensor *ones = ag_test_ones(ctx, out);
    assert_int_equal(ag_backward_grad(ctx, out, ones), AG_OK);
    uint64_t peak = mp_get_counter(MP_ACTIVATION).peak;
    ag_release(out), ag_release(ones), ag_release(in[0]), ag_release(in[1]);
    return peak;
}

// SliceBackward's base-sized gradients, to the byte (a part is [M, P], 60 bytes; the fused
// output [M, 3P], 180). Views writing into one gradient peak in the product's backward: the fused
// output (kept by the views q and k that it saves), out and the seed, d(out) handed to q * k, d(v),
// dq, dk: 180 + 6 x 60 = 540. Slices peak at k's slice: out, the seed, dq, dk, the fused output's
// gradient (v's slice, handed over) and k's own base-sized one, 4 x 60 + 2 x 180 = 600; under
// 1.13 the engine sums the two out of place, a third: 780.
static void test_slice_bill(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    const uint64_t part = 4 * M * P, fused = 3 * part;
    for (ag_framework fw = AG_FRAMEWORK_PYTORCH; fw <= AG_FRAMEWORK_PYTORCH_113; fw++) {
        assert_int_equal(backward_peak(ctx, fw, AG_PART_VIEW), fused + 6 * part);
        assert_int_equal(backward_peak(ctx, fw, AG_PART_SLICE),
                         4 * part + (fw == AG_FRAMEWORK_PYTORCH ? 2 : 3) * fused);
    }
    ag_assert_all_zero();
}

// A view keeps its base: the base's block lives while the view does, and goes with it.
static void test_view_keeps_base(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    ag_tensor *y = ag_tensor_new(ctx, 2, (int64_t[]){M, 3 * P}, MP_ACTIVATION, "y");
    ag_fill(y, 3, -1, 1);
    ag_tensor *v = ag_part(ctx, "v", y, 2 * M * P, 2, (const int64_t[]){M, P}, AG_PART_VIEW);
    ag_tensor *c = ag_part(ctx, "c", y, 2 * M * P, 2, (const int64_t[]){M, P}, AG_PART_COPY);
    assert_memory_equal(v->data, c->data, sizeof(float) * M * P);
    assert_ptr_equal(v->data, ag_f32(y) + 2 * M * P);
    ag_release(y);
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live, 4 * M * 3 * P + 4 * M * P); // y kept by v, and c
    ag_release(v);
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live, 4 * M * P);
    ag_release(c);
    // a part past its base's elements is refused, naming it
    y = ag_tensor_new(ctx, 2, (int64_t[]){M, 3 * P}, MP_ACTIVATION, "y");
    assert_null(ag_part(ctx, "bad", y, 2 * M * P + 1, 2, (const int64_t[]){M, P}, AG_PART_VIEW));
    assert_non_null(strstr(ag_ctx_error(ctx), "do not lie in y"));
    ag_release(y);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_parts_fd, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_parts_fd_catches, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_slice_bill, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_view_keeps_base, ag_setup, ag_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
