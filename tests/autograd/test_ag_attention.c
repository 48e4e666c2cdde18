// Causal grouped-query attention: forward against a plain reference, backward against finite
// differences with 1, 2 and 3 query heads per key-value head, batch 2, and a query block that
// sits after earlier keys (Tk > Tq, as a cache would give).
#include <math.h>
#include <string.h>

#include "ag_test_util.h"

typedef struct {
    int64_t B, Tq, Tk;
    int Hq, Hkv, D;
} att_case;

static ag_tensor *g_attention(ag_ctx *ctx, ag_tensor **in, const void *arg) {
    const att_case *c = arg;
    return ag_attention(ctx, "layers.0.self_attn", in[0], in[1], in[2], c->Hq, c->Hkv, c->D);
}

// out[b, i, h*D + d] = Σ_{j <= i + Tk - Tq} softmax_j(q·k / sqrt(D)) v[b, j, g*D + d]
static void attention_reference(double *out, const float *q, const float *k, const float *v, const att_case *c) {
    int rep = c->Hq / c->Hkv;
    for (int64_t b = 0; b < c->B; b++)
        for (int h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Tq; i++) {
                int g = h / rep;
                int64_t n = i + c->Tk - c->Tq + 1;
                double s[16], mx = -INFINITY, z = 0.0;
                const float *qi = q + ((b * c->Tq + i) * c->Hq + h) * c->D;
                for (int64_t j = 0; j < n; j++) {
                    const float *kj = k + ((b * c->Tk + j) * c->Hkv + g) * c->D;
                    s[j] = 0.0;
                    for (int d = 0; d < c->D; d++) s[j] += (double)qi[d] * kj[d];
                    s[j] /= sqrt((double)c->D);
                    mx = fmax(mx, s[j]);
                }
                for (int64_t j = 0; j < n; j++) z += (s[j] = exp(s[j] - mx));
                double *o = out + ((b * c->Tq + i) * c->Hq + h) * c->D;
                for (int d = 0; d < c->D; d++) {
                    o[d] = 0.0;
                    for (int64_t j = 0; j < n; j++) o[d] += s[j] / z * v[((b * c->Tk + j) * c->Hkv + g) * c->D + d];
                }
            }
}

static void make_inputs(ag_ctx *ctx, const att_case *c, ag_tensor **in) {
    in[0] = ag_test_param(ctx, 3, (int64_t[]){c->B, c->Tq, c->Hq * c->D}, "q", 21);
    in[1] = ag_test_param(ctx, 3, (int64_t[]){c->B, c->Tk, c->Hkv * c->D}, "k", 22);
    in[2] = ag_test_param(ctx, 3, (int64_t[]){c->B, c->Tk, c->Hkv * c->D}, "v", 23);
    ag_fill(in[0], 21, -2.0f, 2.0f); // scores large enough for a far from uniform softmax
    ag_fill(in[1], 22, -2.0f, 2.0f);
}

static void check_case(ag_ctx *ctx, const att_case *c) {
    ag_tensor *in[3];
    make_inputs(ctx, c, in);
    ag_tensor *o = g_attention(ctx, in, c);
    assert_non_null(o);
    double ref[512];
    attention_reference(ref, in[0]->data, in[1]->data, in[2]->data, c);
    assert_true(ag_max_diff(o->data, ref, o->numel) < 1e-5);
    ag_release(o);
    ag_tape_clear(ctx);
    ag_fd_check(ctx, g_attention, c, 3, in);
    for (int i = 0; i < 3; i++) ag_release(in[i]);
}

static void test_gqa_groups(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    const att_case cases[] = {
        {2, 4, 4, 2, 2, 3}, // 1 query head per key-value head
        {2, 4, 4, 4, 2, 3}, // 2
        {2, 4, 4, 3, 1, 3}, // 3
        {1, 5, 5, 6, 2, 2}, // 3, two groups
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_case(ctx, &cases[i]);
}

static void test_query_after_keys(void **state) {
    const att_case c = {2, 2, 5, 3, 1, 2};
    check_case(ag_fixture_ctx(state), &c);
}

// A later key or value never changes an earlier output; the probabilities above the diagonal
// are exact zeros.
static void test_causal_mask(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    const att_case c = {2, 5, 5, 4, 2, 3};
    ag_tensor *in[3];
    make_inputs(ctx, &c, in);
    ag_set_grad_enabled(ctx, false);
    ag_tensor *before = g_attention(ctx, in, &c);
    const int64_t j = 3; // perturb key and value at position 3 of both rows
    for (int64_t b = 0; b < 2; b++)
        for (int e = 0; e < 6; e++) {
            ag_f32(in[1])[(b * 5 + j) * 6 + e] += 1.0f;
            ag_f32(in[2])[(b * 5 + j) * 6 + e] -= 1.0f;
        }
    ag_tensor *after = g_attention(ctx, in, &c);
    const int64_t row = 4 * 3; // one position, all heads
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = 0; i < 5; i++) {
            const float *x = ag_f32(before) + (b * 5 + i) * row, *y = ag_f32(after) + (b * 5 + i) * row;
            if (i < j)
                assert_memory_equal(x, y, row * sizeof(float));
            else
                assert_memory_not_equal(x, y, row * sizeof(float));
        }
    ag_release(before);
    ag_release(after);
    ag_set_grad_enabled(ctx, true);
    ag_tensor *o = g_attention(ctx, in, &c);
    ag_node_info info;
    assert_true(ag_tape_node(ctx, 0, &info));
    const ag_tensor *p = info.saved[3];
    for (int64_t s = 0; s < 2 * 4; s++)
        for (int64_t i = 0; i < 5; i++) {
            double total = 0.0;
            for (int64_t k = 0; k < 5; k++) {
                float pk = ag_f32(p)[(s * 5 + i) * 5 + k];
                if (k > i)
                    assert_true(pk == 0.0f);
                else
                    assert_true(pk > 0.0f);
                total += pk;
            }
            assert_true(fabs(total - 1.0) < 1e-6);
        }
    ag_release(o);
    for (int i = 0; i < 3; i++) ag_release(in[i]);
}

// Eager attention keeps q, k, v and the probabilities [B, Hq, Tq, Tk], labelled ":probs".
static void test_saved_tensors(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    const att_case c = {2, 4, 4, 6, 2, 3};
    // Activations needing gradients, as the projections' outputs would be.
    ag_tensor *in[] = {ag_test_const(ctx, 3, (int64_t[]){2, 4, 18}, "q", 24),
                       ag_test_const(ctx, 3, (int64_t[]){2, 4, 6}, "k", 25),
                       ag_test_const(ctx, 3, (int64_t[]){2, 4, 6}, "v", 26)};
    for (int i = 0; i < 3; i++) in[i]->requires_grad = true;
    ag_tensor *o = g_attention(ctx, in, &c);
    ag_node_info info;
    assert_true(ag_tape_node(ctx, 0, &info));
    assert_int_equal(info.nsaved, 4);
    const ag_tensor *p = info.saved[3];
    assert_string_equal(ag_tensor_name(p), "layers.0.self_attn:probs");
    assert_int_equal(p->ndim, 4);
    int64_t want[] = {2, 6, 4, 4};
    for (int i = 0; i < 4; i++) assert_int_equal(p->shape[i], want[i]);
    for (int i = 0; i < 3; i++) assert_ptr_equal(info.saved[i], in[i]);
    uint64_t bytes = (2 * 4 * 18 + 2 * 2 * 4 * 6 + 2 * 6 * 4 * 4) * sizeof(float);
    assert_int_equal(info.saved_bytes, bytes);
    assert_int_equal(ag_tape_saved_bytes(ctx), bytes);
    ag_release(o);
    ag_tape_clear(ctx);
    // Only v wants a gradient: dV = Pᵀ dO needs P alone.
    in[0]->requires_grad = in[1]->requires_grad = false;
    o = g_attention(ctx, in, &c);
    assert_true(ag_tape_node(ctx, 0, &info));
    assert_int_equal(info.nsaved, 1);
    assert_string_equal(ag_tensor_name(info.saved[0]), "layers.0.self_attn:probs");
    ag_fd_check(ctx, g_attention, &c, 3, in);
    ag_release(o);
    ag_tape_clear(ctx);
    for (int i = 0; i < 3; i++) ag_release(in[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gqa_groups, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_query_after_keys, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_causal_mask, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_saved_tensors, ag_setup, ag_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
