// Memory behaviour of the tape on a tiny Llama-like model: what forward keeps is exactly what
// the ops declare they saved, backward gives it all back and leaves only parameter gradients,
// meta mode allocates the same bytes, no-grad mode keeps nothing. Errors and budgets.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_test_util.h"

enum { B = 2, T = 5, H = 8, HQ = 2, HKV = 1, HD = 4, I = 12, V = 11, L = 2 };
enum { NPARAMS = 2 + 9 * L };

typedef struct {
    ag_tensor *p[NPARAMS]; // embed, final norm, then per layer: ln1 q k v o ln2 gate up down
} tiny;

static const int32_t ids[B * T] = {3, 7, 1, 9, 10, 0, 7, 7, 2, 5};

static ag_tensor *param(ag_ctx *ctx, int64_t r, int64_t c, const char *name, uint64_t seed, float lo, float hi) {
    ag_tensor *t = c ? ag_param_new(ctx, 2, (int64_t[]){r, c}, name) : ag_param_new(ctx, 1, (int64_t[]){r}, name);
    assert_non_null(t);
    ag_fill(t, seed, lo, hi);
    return t;
}

static void tiny_new(ag_ctx *ctx, tiny *m) {
    m->p[0] = param(ctx, V, H, "model.embed_tokens.weight", 1, -1.0f, 1.0f);
    m->p[1] = param(ctx, H, 0, "model.norm.weight", 2, 0.5f, 1.5f);
    static const char *names[] = {"input_layernorm",  "self_attn.q_proj", "self_attn.k_proj",
                                  "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
                                  "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    const int64_t rows[] = {H, HQ * HD, HKV * HD, HKV * HD, H, H, I, I, H};
    const int64_t cols[] = {0, H, H, H, HQ * HD, 0, H, H, I};
    for (int l = 0; l < L; l++)
        for (int j = 0; j < 9; j++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, names[j]);
            bool norm = cols[j] == 0;
            m->p[2 + 9 * l + j] =
                param(ctx, rows[j], cols[j], name, (uint64_t)(10 + 9 * l + j), norm ? 0.5f : -0.6f, norm ? 1.5f : 0.6f);
        }
}

static void tiny_free(tiny *m) {
    for (int i = 0; i < NPARAMS; i++) ag_release(m->p[i]);
}

static uint64_t param_bytes(const tiny *m) {
    uint64_t n = 0;
    for (int i = 0; i < NPARAMS; i++) n += m->p[i]->block.bytes;
    return n;
}

// Releases a and returns b: model code drops each intermediate once the next op made its own.
static ag_tensor *step(ag_tensor *a, ag_tensor *b) {
    ag_release(a);
    return b;
}

static ag_tensor *block(ag_ctx *ctx, ag_tensor **w, int l, ag_tensor *h) {
    char s[8][64];
    const char *fmt[] = {"layers.%d.input_layernorm",
                         "layers.%d.self_attn.q_proj",
                         "layers.%d.self_attn.k_proj",
                         "layers.%d.self_attn.v_proj",
                         "layers.%d.self_attn",
                         "layers.%d.self_attn.o_proj",
                         "layers.%d.post_attention_layernorm",
                         "layers.%d.mlp"};
    for (int i = 0; i < 8; i++) snprintf(s[i], sizeof s[i], fmt[i], l);
    ag_tensor *x = ag_rmsnorm(ctx, s[0], h, w[0], 1e-5f);
    ag_tensor *q = ag_linear(ctx, s[1], x, w[1], NULL);
    ag_tensor *k = ag_linear(ctx, s[2], x, w[2], NULL);
    ag_tensor *v = ag_linear(ctx, s[3], x, w[3], NULL);
    ag_release(x);
    q = step(q, ag_rope(ctx, s[1], q, HQ, HD, 10000.0f, 0));
    k = step(k, ag_rope(ctx, s[2], k, HKV, HD, 10000.0f, 0));
    ag_tensor *a = ag_attention(ctx, s[4], q, k, v, HQ, HKV, HD);
    ag_release(q);
    ag_release(k);
    ag_release(v);
    a = step(a, ag_linear(ctx, s[5], a, w[4], NULL));
    ag_tensor *h1 = ag_add(ctx, s[4], h, a);
    ag_release(a);
    x = ag_rmsnorm(ctx, s[6], h1, w[5], 1e-5f);
    ag_tensor *g = ag_linear(ctx, s[7], x, w[6], NULL);
    ag_tensor *u = ag_linear(ctx, s[7], x, w[7], NULL);
    ag_release(x);
    g = step(g, ag_silu(ctx, s[7], g));
    g = step(g, ag_mul(ctx, s[7], g, u));
    ag_release(u);
    g = step(g, ag_linear(ctx, s[7], g, w[8], NULL));
    ag_tensor *h2 = ag_add(ctx, s[7], h1, g);
    ag_release(h1);
    ag_release(g);
    return h2;
}

// The loss of the tied model on `ids`; every intermediate is released as soon as possible.
static ag_tensor *tiny_loss(ag_ctx *ctx, ag_tensor **w) {
    ag_tensor *h = ag_embedding(ctx, "embed_tokens", ids, B, T, w[0]);
    for (int l = 0; l < L; l++) h = step(h, block(ctx, w + 2 + 9 * l, l, h));
    h = step(h, ag_rmsnorm(ctx, "norm", h, w[1], 1e-5f));
    h = step(h, ag_linear(ctx, "lm_head:logits", h, w[0], NULL));
    return step(h, ag_cross_entropy(ctx, "loss", h, ids));
}

static ag_tensor *g_tiny(ag_ctx *ctx, ag_tensor **in, const void *arg) {
    (void)arg;
    return tiny_loss(ctx, in);
}

// What the ops declare they save, from the shapes alone, in floats.
static uint64_t expected_saved_bytes(void) {
    uint64_t bt = B * T;
    uint64_t layer = bt * H * 4                       // ln1 input, q/k/v input, ln2 input, mlp input
                     + bt * 2                         // two rstd
                     + bt * HQ * HD * 2               // rotated q for attention, o_proj input
                     + bt * HKV * HD * 2              // rotated k, v
                     + (uint64_t)B * HQ * T * T       // probabilities
                     + bt * I * 4;                    // silu input, mul inputs, down_proj input
    uint64_t head = bt * H * 2 + bt                   // final norm input + rstd, lm_head input
                    + bt * V + (uint64_t)B * (T - 1); // logits, logsumexp
    return (L * layer + head) * sizeof(float);
}

typedef struct {
    uint64_t forward_peak, forward_live, saved, backward_peak, grad_live, act_allocs;
    size_t tape;
    float loss;
} chain_stats;

// One forward and backward of the tiny model, with the counters read along the way.
static chain_stats run_chain(ag_ctx *ctx, tiny *m) {
    chain_stats st = {0};
    mp_reset_peaks();
    ag_tensor *loss = tiny_loss(ctx, m->p);
    if (!loss) fail_msg("forward failed: %s", ag_ctx_error(ctx));
    st.tape = ag_tape_size(ctx);
    st.saved = ag_tape_saved_bytes(ctx);
    st.forward_live = mp_get_counter(MP_ACTIVATION).live;
    st.forward_peak = mp_get_counter(MP_ACTIVATION).peak;
    st.loss = loss->data ? ag_f32(loss)[0] : NAN;
    mp_reset_peaks();
    assert_int_equal(ag_backward(ctx, loss), AG_OK);
    st.backward_peak = mp_get_counter(MP_ACTIVATION).peak;
    assert_int_equal(ag_tape_size(ctx), 0);
    assert_false(loss->requires_grad);
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live, loss->block.bytes);
    ag_release(loss);
    st.grad_live = mp_get_counter(MP_GRADIENT).live;
    st.act_allocs = mp_get_counter(MP_ACTIVATION).allocations;
    return st;
}

static void test_chain_memory(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    tiny m;
    tiny_new(ctx, &m);
    chain_stats st = run_chain(ctx, &m);
    // Forward keeps exactly the saved tensors (plus the loss the caller holds), and they are
    // the top of the activation curve.
    assert_int_equal(st.saved, expected_saved_bytes());
    assert_int_equal(st.forward_live, st.saved + sizeof(float));
    assert_int_equal(st.forward_peak, st.saved + sizeof(float));
    // Backward: activations all gone, one gradient per parameter (the tied table has one).
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live, 0);
    assert_int_equal(st.grad_live, param_bytes(&m));
    for (int i = 0; i < NPARAMS; i++) {
        assert_non_null(m.p[i]->grad);
        assert_int_equal(m.p[i]->grad->block.category, MP_GRADIENT);
    }
    char label[128];
    snprintf(label, sizeof label, "%s:grad", ag_tensor_name(m.p[0]));
    assert_string_equal(ag_tensor_name(m.p[0]->grad), label);
    // The backward peak: saved tensors are dropped as fast as gradients appear.
    assert_true(st.backward_peak <= st.forward_peak + 2 * B * T * V * sizeof(float));
    for (int i = 0; i < NPARAMS; i++) ag_zero_grad(m.p[i]);
    assert_int_equal(mp_get_counter(MP_GRADIENT).live, 0);
    assert_int_equal(mp_get_counter(MP_WEIGHT).live, param_bytes(&m));
    tiny_free(&m);
}

// Each node's declared saved bytes add up to the tape's total, which counts a tensor shared by
// several nodes (the input of q, k and v) once.
static void test_saved_per_node(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    tiny m;
    tiny_new(ctx, &m);
    ag_tensor *loss = tiny_loss(ctx, m.p);
    uint64_t sum = 0, probs = 0;
    ag_node_info info;
    for (size_t i = 0; ag_tape_node(ctx, i, &info); i++) {
        sum += info.saved_bytes;
        for (int j = 0; j < info.nsaved; j++) {
            const char *name = ag_tensor_name(info.saved[j]);
            size_t n = strlen(name);
            if (n > 6 && strcmp(name + n - 6, ":probs") == 0) probs += info.saved[j]->block.bytes;
        }
    }
    // k and v re-read q's input, up re-reads gate's input: three extra copies per layer.
    uint64_t shared = L * (3 * B * T * H) * sizeof(float);
    assert_int_equal(sum, ag_tape_saved_bytes(ctx) + shared);
    assert_int_equal(probs, L * B * HQ * T * T * sizeof(float));
    ag_release(loss);
    ag_tape_clear(ctx);
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live, 0);
    tiny_free(&m);
}

static void test_chain_gradients(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    tiny m;
    tiny_new(ctx, &m);
    // Two layers deep the loss curves enough that h = 1e-2 leaves a truncation error near the
    // tolerance; h = 2.5e-3 sits where truncation and float32 rounding are both small.
    double worst = ag_fd_worst(ctx, g_tiny, NULL, NPARAMS, m.p, 2.5e-3, 2e-3, 1e-2, 0.0f);
    if (!(worst < 1.0)) fail_msg("gradient differs from central differences: worst error ratio %g", worst);
    tiny_free(&m);
}

// Meta mode: no data, the same allocations and the same bill as a real run.
static void test_meta_matches_real(void **state) {
    (void)state;
    chain_stats st[2];
    for (int meta = 0; meta < 2; meta++) {
        assert_int_equal(mp_init(&(mp_options){.meta = meta}), MP_OK);
        assert_int_equal(mp_is_meta(), meta);
        ag_ctx *ctx = ag_ctx_new();
        tiny m;
        tiny_new(ctx, &m);
        assert_true(meta ? m.p[0]->data == NULL : m.p[0]->data != NULL);
        st[meta] = run_chain(ctx, &m);
        tiny_free(&m);
        ag_ctx_free(ctx);
        ag_assert_all_zero();
        mp_shutdown();
    }
    assert_int_equal(st[1].forward_peak, st[0].forward_peak);
    assert_int_equal(st[1].forward_live, st[0].forward_live);
    assert_int_equal(st[1].saved, st[0].saved);
    assert_int_equal(st[1].backward_peak, st[0].backward_peak);
    assert_int_equal(st[1].grad_live, st[0].grad_live);
    assert_int_equal(st[1].act_allocs, st[0].act_allocs);
    assert_int_equal(st[1].tape, st[0].tape);
    assert_true(isnan(st[1].loss) && isfinite(st[0].loss));
}

// Inference: nothing recorded, nothing saved, the same loss.
static void test_no_grad(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    tiny m;
    tiny_new(ctx, &m);
    chain_stats st = run_chain(ctx, &m);
    for (int i = 0; i < NPARAMS; i++) ag_zero_grad(m.p[i]);
    assert_true(ag_set_grad_enabled(ctx, false));
    mp_reset_peaks();
    ag_tensor *loss = tiny_loss(ctx, m.p);
    assert_non_null(loss);
    assert_int_equal(ag_tape_size(ctx), 0);
    assert_null(loss->node);
    assert_false(loss->requires_grad);
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live, sizeof(float));
    assert_true(mp_get_counter(MP_ACTIVATION).peak < st.forward_peak / 2);
    assert_true(ag_f32(loss)[0] == st.loss);
    assert_int_equal(ag_backward(ctx, loss), AG_ERR_STATE);
    assert_non_null(strstr(ag_ctx_error(ctx), "no graph"));
    ag_release(loss);
    assert_int_equal(mp_get_counter(MP_GRADIENT).live, 0);
    tiny_free(&m);
}

// Two backward passes without zero_grad add up, as in PyTorch; zero_grad frees.
static void test_grad_accumulates(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    tiny m;
    tiny_new(ctx, &m);
    run_chain(ctx, &m);
    uint64_t grad_bytes = mp_get_counter(MP_GRADIENT).live;
    int64_t n = m.p[0]->numel;
    float *first = malloc((size_t)n * sizeof *first);
    memcpy(first, m.p[0]->grad->data, (size_t)n * sizeof *first);
    run_chain(ctx, &m);
    assert_int_equal(mp_get_counter(MP_GRADIENT).live, grad_bytes);
    for (int64_t i = 0; i < n; i++) {
        float twice = 2.0f * first[i];
        assert_true(fabsf(ag_f32(m.p[0]->grad)[i] - twice) <= 1e-5f * (1.0f + fabsf(twice)));
    }
    free(first);
    for (int i = 0; i < NPARAMS; i++) {
        ag_zero_grad(m.p[i]);
        assert_null(m.p[i]->grad);
    }
    assert_int_equal(mp_get_counter(MP_GRADIENT).live, 0);
    tiny_free(&m);
}

// A branch the loss does not use: its parameter gets no gradient, its node never runs, and
// everything is freed by backward all the same. The tape also grows past its first size.
static void test_unused_branch_and_long_tape(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    ag_tensor *x = ag_test_param(ctx, 2, (int64_t[]){3, 4}, "x", 31);
    ag_tensor *w1 = ag_test_param(ctx, 2, (int64_t[]){2, 4}, "w1", 32);
    ag_tensor *w2 = ag_test_param(ctx, 2, (int64_t[]){2, 4}, "w2", 33);
    ag_tensor *c = ag_test_const(ctx, 2, (int64_t[]){3, 2}, "c", 34);
    ag_tensor *unused = ag_linear(ctx, "unused", x, w2, NULL);
    ag_tensor *y = ag_linear(ctx, "used", x, w1, NULL);
    for (int i = 0; i < 1000; i++) // d(y + c)/dy = 1: the gradient reaches w1 unchanged
        y = step(y, ag_add(ctx, "chain", y, c));
    assert_int_equal(ag_tape_size(ctx), 1002);
    ag_release(unused);
    ag_tensor *ones = ag_test_ones(ctx, y);
    assert_int_equal(ag_backward_grad(ctx, y, ones), AG_OK);
    assert_null(w2->grad);
    for (int o = 0; o < 2; o++) // dw1[o, i] = Σ_rows x[r, i]
        for (int i = 0; i < 4; i++) {
            float want = ag_f32(x)[i] + ag_f32(x)[4 + i] + ag_f32(x)[8 + i];
            assert_true(fabsf(ag_f32(w1->grad)[o * 4 + i] - want) < 1e-6f);
        }
    ag_release(ones);
    ag_release(y);
    ag_release(c);
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live, 0);
    ag_release(x);
    ag_release(w1);
    ag_release(w2);
    assert_int_equal(mp_get_counter(MP_GRADIENT).live, 0); // released with their parameters
}

static void expect_error(ag_ctx *ctx, ag_status st, const char *part) {
    assert_int_equal(ag_ctx_status(ctx), st);
    if (!strstr(ag_ctx_error(ctx), part)) fail_msg("error \"%s\" does not mention \"%s\"", ag_ctx_error(ctx), part);
    ag_ctx_clear_error(ctx);
    assert_null(ag_ctx_error(ctx));
}

static void test_errors(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    ag_tensor *x = ag_test_param(ctx, 2, (int64_t[]){3, 4}, "x", 41);
    ag_tensor *w = ag_test_param(ctx, 2, (int64_t[]){2, 5}, "w", 42);
    assert_null(ag_linear(ctx, "layers.1.mlp.up_proj", x, NULL, NULL));
    expect_error(ctx, AG_ERR_ARG, "input w is NULL");
    assert_null(ag_linear(ctx, "layers.1.mlp.up_proj", x, w, NULL));
    assert_non_null(strstr(ag_ctx_error(ctx), "[3, 4]"));
    // Sticky: a valid op after the error returns NULL too and keeps the first message.
    assert_null(ag_silu(ctx, "s", x));
    expect_error(ctx, AG_ERR_SHAPE, "layers.1.mlp.up_proj");
    assert_null(ag_embedding(ctx, "embed", (int32_t[]){0, 9}, 1, 2, w));
    expect_error(ctx, AG_ERR_ARG, "id 9");
    assert_null(ag_cross_entropy(ctx, "loss", x, (int32_t[]){0, 1, 2}));
    expect_error(ctx, AG_ERR_SHAPE, "cross_entropy");
    assert_null(ag_attention(ctx, "attn", x, x, x, 2, 2, 3));
    expect_error(ctx, AG_ERR_SHAPE, "attention attn");
    assert_null(ag_rope(ctx, "rope", x, 1, 3, 10000.0f, 0));
    expect_error(ctx, AG_ERR_SHAPE, "rope");
    assert_null(ag_mul(ctx, "m", x, w));
    expect_error(ctx, AG_ERR_SHAPE, "[2, 5]");
    ag_tensor *y = ag_silu(ctx, "s", x);
    assert_int_equal(ag_backward(ctx, y), AG_ERR_SHAPE); // 12 elements, not a loss
    expect_error(ctx, AG_ERR_SHAPE, "scalar");
    assert_int_equal(ag_tape_size(ctx), 0); // a failed backward still drops the tape
    assert_null(y->node);
    ag_release(y);
    ag_release(x);
    ag_release(w);
}

// A budget: the op that crosses it fails with the site in the message, and a backward after
// the error gives every byte back.
static void test_budget(void **state) {
    (void)state;
    assert_int_equal(mp_init(&(mp_options){.budget = 4096}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    ag_tensor *x = ag_test_param(ctx, 2, (int64_t[]){8, 32}, "x", 51); // 1024 bytes
    ag_tensor *w = ag_test_param(ctx, 2, (int64_t[]){8, 32}, "w", 52);
    ag_tensor *y = ag_linear(ctx, "small", x, w, NULL); // 256 bytes
    assert_non_null(y);
    ag_tensor *s = ag_silu(ctx, "big", x);                  // 1024: 3328 live
    ag_tensor *too_far = ag_mul(ctx, "layers.7.mlp", s, x); // would make 4352
    assert_null(too_far);
    assert_int_equal(ag_ctx_status(ctx), AG_ERR_BUDGET);
    assert_non_null(strstr(ag_ctx_error(ctx), "layers.7.mlp:out"));
    assert_true(mp_oom()->happened);
    assert_int_equal(ag_backward(ctx, y), AG_ERR_BUDGET);
    assert_int_equal(ag_tape_size(ctx), 0);
    ag_release(s);
    ag_release(y);
    ag_release(x);
    ag_release(w);
    ag_ctx_free(ctx);
    ag_assert_all_zero();
    mp_shutdown();
}

// The label writers give what snprintf gives, cut where it cuts, and return its length.
static void test_label_writers(void **state) {
    (void)state;
    const long long nums[] = {0, 7, -7, 1234567890123LL, LLONG_MIN, LLONG_MAX};
    for (size_t cap = 1; cap < 24; cap++)
        for (size_t k = 0; k < sizeof nums / sizeof *nums; k++) {
            char got[32], want[32];
            memset(got, 'x', sizeof got), memset(want, 'x', sizeof want);
            size_t n = ag_str_put(got, cap, 0, "layers.");
            n = ag_str_put_i64(got, cap, n, nums[k]);
            int w = snprintf(want, cap, "layers.%lld", nums[k]);
            assert_int_equal(n, (size_t)w);
            assert_string_equal(got, want);
            assert_int_equal(got[cap], 'x'); // nothing written past cap
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_label_writers),
        cmocka_unit_test_setup_teardown(test_chain_memory, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_saved_per_node, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_chain_gradients, ag_setup, ag_teardown),
        cmocka_unit_test(test_meta_matches_real),
        cmocka_unit_test_setup_teardown(test_no_grad, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_grad_accumulates, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_unused_branch_and_long_tape, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_errors, ag_setup, ag_teardown),
        cmocka_unit_test(test_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
