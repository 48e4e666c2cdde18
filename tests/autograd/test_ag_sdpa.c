// PyTorch's SDPA kernels on CUDA (autograd/sdpa.c's rows) under the pytorch framework: each one
// computes what membill's own fused attention computes (output and every gradient, grouped heads
// included), and keeps and allocates what its PyTorch code does, to the byte:
//   flash (flash_api.cpp):   out = empty_like(q) in [B, T, H, D] (no transposed copy), softmax_lse
//                            [B, H, T] float32; backward softmax_d [B, H, round(T, 128)] and dq_accum
//                            [B, round(T, 128), H, round(D, 32)] float32, dk_expanded and
//                            dv_expanded [B, Tk, Hq, D] when the heads are grouped;
//   efficient:               logsumexp [B, H, ceil(T / 32) * 32] float32; no grouped heads, so k and v
//                            come through repeat_kv ([B, Tk, Hq*D] each); backward delta [B, H, T];
//   cudnn:                   softmaxstats [B, H, T, 1] float32 and a seed and an offset, int64 [1]
//                            each, on the device, kept by the node.
// Meta mode allocates what a real run does, and a device without the kernel refuses it.
#include <stdlib.h>
#include <string.h>

#include "ag_test_util.h"

typedef struct {
    int64_t B, T;
    int Hq, Hkv, D;
} att_case;

static const char *SITE = "layers.0.self_attn";
// T past one block of 32 and short of 128, D short of 32: every rounding shows.
static const att_case C = {2, 37, 4, 2, 20};

static ag_tensor *g_attention(ag_ctx *ctx, ag_tensor **in, const void *arg) {
    const att_case *c = arg;
    return ag_attention(ctx, SITE, in[0], in[1], in[2], c->Hq, c->Hkv, c->D);
}

static void make_inputs(ag_ctx *ctx, const att_case *c, ag_tensor **in) {
    in[0] = ag_test_const(ctx, 3, (int64_t[]){c->B, c->T, (int64_t)c->Hq * c->D}, "q", 31);
    in[1] = ag_test_const(ctx, 3, (int64_t[]){c->B, c->T, (int64_t)c->Hkv * c->D}, "k", 32);
    in[2] = ag_test_const(ctx, 3, (int64_t[]){c->B, c->T, (int64_t)c->Hkv * c->D}, "v", 33);
    ag_fill(in[0], 31, -2.0f, 2.0f);
    ag_fill(in[1], 32, -2.0f, 2.0f);
    for (int i = 0; i < 3; i++) in[i]->requires_grad = true;
}

static void use(ag_ctx *ctx, ag_framework f, ag_device d, ag_attention_kind a) {
    ag_ctx_set_framework(ctx, f);
    ag_ctx_set_device(ctx, d);
    ag_ctx_set_attention(ctx, a);
}

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

static const ag_attention_kind KERNELS[] = {AG_ATTENTION_FLASH, AG_ATTENTION_EFFICIENT, AG_ATTENTION_CUDNN};

// Each CUDA kernel's output and gradients are the fused attention's (efficient's through
// repeat_kv's forward copies and backward sums).
static void test_match_fused(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    const int64_t n[4] = {C.B * C.T * C.Hq * C.D, C.B * C.T * C.Hq * C.D, C.B * C.T * C.Hkv * C.D,
                          C.B * C.T * C.Hkv * C.D};
    float *ref[4], *got[4];
    ag_tensor *in[3];
    use(ctx, AG_FRAMEWORK_LEAN, AG_DEVICE_CPU, AG_ATTENTION_FLASH);
    make_inputs(ctx, &C, in);
    ag_output_and_grads(ctx, g_attention(ctx, in, &C), in, 3, ref);
    for (size_t k = 0; k < 3; k++) {
        use(ctx, AG_FRAMEWORK_PYTORCH, AG_DEVICE_CUDA, KERNELS[k]);
        make_inputs(ctx, &C, in);
        ag_output_and_grads(ctx, g_attention(ctx, in, &C), in, 3, got);
        for (int i = 0; i < 4; i++) {
            assert_true(ag_rel_diff(got[i], ref[i], n[i]) < 1e-5);
            free(got[i]);
        }
    }
    for (int i = 0; i < 4; i++) free(ref[i]);
    use(ctx, AG_FRAMEWORK_LEAN, AG_DEVICE_CPU, AG_ATTENTION_EAGER);
}

// What the kernel's node keeps: q, k, v, its own output (the tensor returned: no copy), the
// log-sum-exp at its padded length, and cuDNN's seed and offset.
static void test_saved(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    const uint64_t q = (uint64_t)(C.B * C.T * C.Hq * C.D) * 4, kv = (uint64_t)(C.B * C.T * C.Hkv * C.D) * 4;
    // flash: 2 q (q, out) + 2 kv + lse [2, 4, 37]; efficient: k and v repeated to 4 heads, lse
    // [2, 4, 64]; cudnn: flash's and 8 + 8 bytes.
    const uint64_t want[3] = {2 * q + 2 * kv + C.B * C.Hq * C.T * 4, 4 * q + C.B * C.Hq * round_up(C.T, 32) * 4,
                              2 * q + 2 * kv + C.B * C.Hq * C.T * 4 + 16};
    const int nsaved[3] = {5, 5, 7};
    for (size_t k = 0; k < 3; k++) {
        use(ctx, AG_FRAMEWORK_PYTORCH, AG_DEVICE_CUDA, KERNELS[k]);
        ag_tensor *in[3];
        make_inputs(ctx, &C, in);
        ag_tensor *o = g_attention(ctx, in, &C);
        assert_non_null(o);
        assert_string_equal(ag_tensor_name(o), "layers.0.self_attn:out");
        ag_node_info info;
        size_t last = ag_tape_size(ctx) - 1;
        assert_int_equal(ag_tape_size(ctx), KERNELS[k] == AG_ATTENTION_EFFICIENT ? 3 : 1); // repeat_kv twice
        assert_true(ag_tape_node(ctx, last, &info));
        assert_string_equal(info.op, "flash_attention");
        assert_int_equal(info.nsaved, nsaved[k]);
        assert_ptr_equal(info.saved[3], o);
        assert_int_equal(info.saved_bytes, want[k]);
        if (KERNELS[k] == AG_ATTENTION_EFFICIENT) {
            assert_string_equal(ag_tensor_name(info.saved[1]), "layers.0.self_attn:k_repeated");
            assert_int_equal(info.saved[1]->shape[2], C.Hq * C.D);
            assert_int_equal(info.saved[4]->shape[2], 64);
        } else {
            assert_ptr_equal(info.saved[1], in[1]);
        }
        if (KERNELS[k] == AG_ATTENTION_CUDNN) {
            assert_string_equal(ag_tensor_name(info.saved[5]), "layers.0.self_attn:philox_seed");
            assert_string_equal(ag_tensor_name(info.saved[6]), "layers.0.self_attn:philox_offset");
        }
        ag_release(o);
        ag_tape_clear(ctx);
        for (int i = 0; i < 3; i++) ag_release(in[i]);
    }
    use(ctx, AG_FRAMEWORK_LEAN, AG_DEVICE_CPU, AG_ATTENTION_EAGER);
}

// ---- a step under a profiler of our own, its timeline kept ----

static void start(bool meta) {
    mp_options opt = {.meta = meta, .keep_timeline = true};
    assert_int_equal(mp_init(&opt), MP_OK);
}

static bool named(const mp_event *e, const char *suffix) {
    const char *n = mp_site_name(e->site);
    size_t a = strlen(n), b = strlen(suffix);
    return a >= b && strcmp(n + a - b, suffix) == 0;
}

static void step(ag_attention_kind kind) {
    ag_ctx *ctx = ag_ctx_new();
    assert_non_null(ctx);
    use(ctx, AG_FRAMEWORK_PYTORCH, AG_DEVICE_CUDA, kind);
    ag_tensor *in[3];
    make_inputs(ctx, &C, in);
    ag_tensor *o = g_attention(ctx, in, &C);
    assert_non_null(o);
    ag_tensor *dout = ag_tensor_new(ctx, 3, o->shape, MP_ACTIVATION, "test:dout");
    ag_fill(dout, 9, -1.0f, 1.0f);
    assert_int_equal(ag_backward_grad(ctx, o, dout), AG_OK);
    ag_release(dout), ag_release(o);
    for (int i = 0; i < 3; i++) ag_release(in[i]);
    ag_ctx_free(ctx);
    ag_assert_all_zero();
}

// The first allocation whose label ends with suffix (0: none).
static int64_t first_alloc(const char *suffix) {
    for (size_t i = 0; i < mp_timeline_count(); i++) {
        const mp_event *e = mp_timeline_get(i);
        if (e->bytes > 0 && named(e, suffix)) return e->bytes;
    }
    return 0;
}

// The backward's allocations, by kernel, from the sizes worked out in the header.
static void test_backward_bill(void **state) {
    (void)state;
    const int64_t T128 = round_up(C.T, 128), D32 = round_up(C.D, 32), expanded = C.B * C.T * C.Hq * C.D * 4;
    start(false);
    step(AG_ATTENTION_FLASH);
    assert_int_equal(first_alloc(":flash_d"), C.B * C.Hq * T128 * 4);              // softmax_d: 4,096
    assert_int_equal(first_alloc(":flash_dq_float"), C.B * T128 * C.Hq * D32 * 4); // dq_accum: 131,072
    assert_int_equal(first_alloc(":dk_expanded"), expanded);
    assert_int_equal(first_alloc(":dv_expanded"), expanded);
    assert_int_equal(first_alloc(":sdpa_out"), 0);
    mp_shutdown();
    start(false);
    step(AG_ATTENTION_EFFICIENT);
    assert_int_equal(first_alloc(":k_repeated"), expanded);
    assert_int_equal(first_alloc(":v_repeated"), expanded);
    assert_int_equal(first_alloc(":lse"), C.B * C.Hq * 64 * 4);
    assert_int_equal(first_alloc(":flash_d"), C.B * C.Hq * C.T * 4); // delta
    assert_int_equal(first_alloc(":flash_dq_float"), 0);             // float32 dQ: no separate sums
    assert_int_equal(first_alloc(":dk_expanded"), 0);
    mp_shutdown();
    start(false);
    step(AG_ATTENTION_CUDNN);
    assert_int_equal(first_alloc(":philox_seed"), 8);
    assert_int_equal(first_alloc(":philox_offset"), 8);
    assert_int_equal(first_alloc(":lse"), C.B * C.Hq * C.T * 4);
    assert_int_equal(first_alloc(":flash_d"), C.B * C.Hq * C.T * 4);
    mp_shutdown();
}

// Meta mode: the same events, in order, to the byte.
static void test_meta_equals_real(void **state) {
    (void)state;
    for (size_t k = 0; k < 3; k++) {
        int64_t *bytes[2];
        size_t n[2];
        for (int m = 0; m < 2; m++) {
            start(m == 1);
            step(KERNELS[k]);
            n[m] = mp_timeline_count();
            bytes[m] = malloc(n[m] * sizeof *bytes[m]);
            for (size_t i = 0; i < n[m]; i++) bytes[m][i] = mp_timeline_get(i)->bytes;
            mp_shutdown();
        }
        assert_int_equal(n[0], n[1]);
        assert_memory_equal(bytes[0], bytes[1], n[0] * sizeof *bytes[0]);
        free(bytes[0]), free(bytes[1]);
    }
}

// The CPU has no memory-efficient or cuDNN kernel: the op fails, naming the device.
static void test_device_without_kernel(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    use(ctx, AG_FRAMEWORK_PYTORCH, AG_DEVICE_CPU, AG_ATTENTION_EFFICIENT);
    assert_null(ag_ctx_sdpa(ctx));
    ag_tensor *in[3];
    make_inputs(ctx, &C, in);
    assert_null(g_attention(ctx, in, &C));
    assert_int_equal(ag_ctx_status(ctx), AG_ERR_ARG);
    assert_non_null(strstr(ag_ctx_error(ctx), "no such fused kernel on the cpu"));
    ag_ctx_clear_error(ctx);
    for (int i = 0; i < 3; i++) ag_release(in[i]);
    assert_int_equal(ag_ctx_device(ctx), AG_DEVICE_CPU);
    use(ctx, AG_FRAMEWORK_LEAN, AG_DEVICE_CUDA, AG_ATTENTION_CUDNN); // lean's fused attention is its own
    assert_ptr_equal(ag_ctx_sdpa(ctx), &ag_sdpa_fused);
    use(ctx, AG_FRAMEWORK_LEAN, AG_DEVICE_CPU, AG_ATTENTION_EAGER);
    assert_null(ag_ctx_sdpa(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_match_fused, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_saved, ag_setup, ag_teardown),
        cmocka_unit_test(test_backward_bill),
        cmocka_unit_test(test_meta_equals_real),
        cmocka_unit_test_setup_teardown(test_device_without_kernel, ag_setup, ag_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
