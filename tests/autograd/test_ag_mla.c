// DeepSeek-V3's pieces: the heads' column slice (de-interleaved or not) and cat (with a broadcast
// head), the latent attention with a value head of its own, and the sigmoid router with
// group-limited top-k: values against double references, gradients against central differences;
// the frameworks and attentions that are not modelled refused by name.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_test_util.h"

enum { B = 2, T = 5, NH = 3, NOPE = 4, ROPE = 4, DV = 6, DQ = NOPE + ROPE, LK = 5 };

// q[B, T, NH*DQ] -> cat(slice nope, de-interleaved slice rope) and kv_a[B, T, LK + ROPE] -> its k_pe
// broadcast to every head: the MLA block's column moves, without the products.
static ag_tensor *g_heads(ag_ctx *ctx, ag_tensor **in, const void *arg) {
    const bool deint = *(const bool *)arg;
    ag_tensor *a = ag_head_slice(ctx, "t.q_pass", in[0], NH, DQ, 0, NOPE, false);
    ag_tensor *b = ag_head_slice(ctx, "t.k_rot", in[1], 1, LK + ROPE, LK, ROPE, deint);
    ag_tensor *y = ag_head_cat(ctx, "t.key", a, b, NH, NOPE, ROPE);
    ag_release(a), ag_release(b);
    return y;
}

static void test_head_ops(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    for (int d = 0; d < 2; d++) {
        const bool deint = d == 1;
        ag_tensor *in[2] = {ag_test_param(ctx, 3, (int64_t[]){B, T, NH * DQ}, "q", 3),
                            ag_test_param(ctx, 3, (int64_t[]){B, T, LK + ROPE}, "kv_a", 5)};
        ag_tensor *y = g_heads(ctx, in, &deint);
        assert_non_null(y);
        const float *q = in[0]->data, *kv = in[1]->data, *o = y->data;
        for (int64_t r = 0; r < B * T; r++)
            for (int h = 0; h < NH; h++)
                for (int j = 0; j < DQ; j++) {
                    const int pe = j - NOPE, src = deint ? (pe < ROPE / 2 ? 2 * pe : 2 * (pe - ROPE / 2) + 1) : pe;
                    const float want = j < NOPE ? q[r * NH * DQ + h * DQ + j] : kv[r * (LK + ROPE) + LK + src];
                    assert_true(o[(r * NH + h) * DQ + j] == want);
                }
        ag_release(y);
        ag_fd_check(ctx, g_heads, &deint, 2, in);
        // a wrong gradient is caught (the checker itself)
        assert_true(ag_fd_worst(ctx, g_heads, &deint, 2, in, 1e-2, 1e-3, 1e-2, 0.5f) > 1.0);
        ag_release(in[0]), ag_release(in[1]);
    }
    // shapes that do not fit are refused, naming the op
    ag_tensor *x = ag_test_const(ctx, 3, (int64_t[]){B, T, 10}, "x", 1);
    assert_null(ag_head_slice(ctx, "t.bad", x, 3, 3, 0, 2, false));
    assert_non_null(strstr(ag_ctx_error(ctx), "head_slice t.bad"));
    ag_release(x);
}

static ag_tensor *g_mla(ag_ctx *ctx, ag_tensor **in, const void *arg) {
    (void)arg;
    return ag_attention_mla(ctx, "t.self_attn", in[0], in[1], in[2], NH, DQ, DV, 0.3f);
}

// Causal attention in double: out[b, t, h*DV].
static void reference_mla(double *out, const float *q, const float *k, const float *v, float scale) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                double s[T], mx = -1e300, z = 0.0;
                for (int j = 0; j <= i; j++) {
                    s[j] = 0.0;
                    for (int d = 0; d < DQ; d++)
                        s[j] += (double)q[(b * T + i) * NH * DQ + h * DQ + d] * k[(b * T + j) * NH * DQ + h * DQ + d];
                    s[j] *= scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j <= i; j++) z += (s[j] = exp(s[j] - mx));
                for (int d = 0; d < DV; d++) {
                    double acc = 0.0;
                    for (int j = 0; j <= i; j++) acc += s[j] / z * v[(b * T + j) * NH * DV + h * DV + d];
                    out[(b * T + i) * NH * DV + h * DV + d] = acc;
                }
            }
}

static void mla_inputs(ag_ctx *ctx, ag_tensor **in, bool param) {
    ag_tensor *(*mk)(ag_ctx *, int, const int64_t *, const char *, uint64_t) = param ? ag_test_param : ag_test_const;
    in[0] = mk(ctx, 3, (int64_t[]){B, T, NH * DQ}, "q", 11);
    in[1] = mk(ctx, 3, (int64_t[]){B, T, NH * DQ}, "k", 13);
    in[2] = mk(ctx, 3, (int64_t[]){B, T, NH * DV}, "v", 17);
}

static void test_attention_mla(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    ag_tensor *in[3];
    mla_inputs(ctx, in, true);
    ag_tensor *o = g_mla(ctx, in, NULL);
    assert_non_null(o);
    assert_int_equal(o->shape[2], NH * DV);
    double ref[B * T * NH * DV];
    reference_mla(ref, in[0]->data, in[1]->data, in[2]->data, 0.3f);
    assert_true(ag_max_diff(o->data, ref, o->numel) < 1e-5);
    ag_release(o);
    ag_fd_check(ctx, g_mla, NULL, 3, in);
    assert_true(ag_fd_worst(ctx, g_mla, NULL, 3, in, 1e-2, 1e-3, 1e-2, 0.5f) > 1.0);
    for (int i = 0; i < 3; i++) ag_release(in[i]);
    // flash and the PyTorch frameworks' op-by-op attention are refused by name
    for (int c = 0; c < 2; c++) {
        ag_ctx *f = ag_ctx_new();
        if (c == 0)
            ag_ctx_set_attention(f, AG_ATTENTION_FLASH);
        else
            ag_ctx_set_framework(f, AG_FRAMEWORK_PYTORCH);
        mla_inputs(f, in, false);
        assert_null(g_mla(f, in, NULL));
        assert_non_null(strstr(ag_ctx_error(f), "attention_mla t.self_attn"));
        assert_non_null(strstr(ag_ctx_error(f), "--framework lean"));
        for (int i = 0; i < 3; i++) ag_release(in[i]);
        ag_ctx_free(f);
    }
}

enum { N = 6, E = 8, K = 2, G = 4, TG = 2 };
static const float BIAS[E] = {0.05f, -0.1f, 0.2f, 0.0f, -0.05f, 0.15f, -0.2f, 0.1f};

static ag_tensor *g_route(ag_ctx *ctx, ag_tensor **in, const void *arg) {
    const bool renorm = *(const bool *)arg;
    const ag_moe_sigmoid_group grp = {G, TG, 2.5f, BIAS};
    ag_moe_routing r;
    ag_moe_route_opts o = {.top_k = K, .renorm = renorm, .group = &grp};
    ag_tensor *w = ag_moe_route(ctx, "t.mlp.gate", in[0], in[0], &o, &r);
    ag_moe_routing_free(&r);
    return w;
}

// DeepseekV3TopkRouter's choice and weights for one row, in double.
static void reference_route(const float *z, bool renorm, int sel[K], double w[K]) {
    double s[E], choice[E], gs[G];
    for (int e = 0; e < E; e++) choice[e] = (s[e] = 1.0 / (1.0 + exp(-(double)z[e]))) + BIAS[e];
    const int per = E / G;
    for (int g = 0; g < G; g++) { // the sum of the group's two best
        double a = -1e300, b = -1e300;
        for (int j = 0; j < per; j++) {
            double c = choice[g * per + j];
            if (c > a)
                b = a, a = c;
            else if (c > b)
                b = c;
        }
        gs[g] = a + b;
    }
    bool keep[G] = {0};
    for (int t = 0; t < TG; t++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
        keep[best] = true;
    }
    for (int e = 0; e < E; e++)
        if (!keep[e / per]) choice[e] = 0.0;
    bool taken[E] = {0};
    double sum = 1e-20;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
        taken[best] = true, sel[j] = best, sum += (w[j] = s[best]);
    }
    for (int j = 0; j < K; j++) w[j] = (renorm ? w[j] / sum : w[j]) * 2.5;
}

static void test_route_group(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    for (int rn = 0; rn < 2; rn++) {
        const bool renorm = rn == 1;
        ag_tensor *in[1] = {ag_test_param(ctx, 2, (int64_t[]){N, E}, "logits", 23)};
        ag_fill(in[0], 23, -2.0f, 2.0f);
        const ag_moe_sigmoid_group grp = {G, TG, 2.5f, BIAS};
        ag_moe_routing r;
        ag_moe_route_opts o = {.top_k = K, .renorm = renorm, .group = &grp};
        ag_tensor *w = ag_moe_route(ctx, "t.mlp.gate", in[0], in[0], &o, &r);
        assert_non_null(w);
        bool unbiased_differs = false;
        for (int t = 0; t < N; t++) {
            int sel[K];
            double want[K];
            reference_route((const float *)in[0]->data + t * E, renorm, sel, want);
            for (int j = 0; j < K; j++) {
                assert_int_equal(r.expert[t * K + j], sel[j]);
                assert_true(fabs(ag_f32(w)[t * K + j] - want[j]) < 1e-5);
            }
            // the bias moves a choice somewhere: the top-k of the plain scores differs
            const float *z = (const float *)in[0]->data + t * E;
            int best = 0;
            for (int e = 1; e < E; e++) best = z[e] > z[best] ? e : best;
            unbiased_differs |= best != sel[0];
        }
        assert_true(unbiased_differs);
        ag_release(w);
        ag_moe_routing_free(&r);
        ag_fd_check(ctx, g_route, &renorm, 1, in);
        ag_release(in[0]);
    }
    // groups that cannot hold top-k are refused, naming the op
    ag_tensor *z = ag_test_const(ctx, 2, (int64_t[]){N, E}, "logits", 3);
    const ag_moe_sigmoid_group bad = {G, 1, 1.0f, NULL};
    ag_moe_routing r;
    assert_null(ag_moe_route(ctx, "t.bad", z, z, &(ag_moe_route_opts){.top_k = 3, .group = &bad}, &r));
    assert_non_null(strstr(ag_ctx_error(ctx), "moe_route t.bad"));
    ag_release(z);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_head_ops, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_attention_mla, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_route_group, ag_setup, ag_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
