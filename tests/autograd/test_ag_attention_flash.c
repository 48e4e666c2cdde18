// Flash attention (op_attention_flash.c) against the eager op: the output and every gradient
// within 1e-5 relative on causal GQA (1, 2 and 3 query heads per key-value head, batch 2, odd
// lengths, lengths past one tile and past eager's causal blocks, fewer queries than keys), with the AVX-512 loops and
// the portable ones; finite differences on a tiny case; what it saves and allocates (q + k + v + out
// + lse, never a T x T block), meta against real to the byte, the sdpa path under PYTORCH
// semantics, and the cached attention's FLASH path against its eager one.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ag_kernels.h"
#include "ag_test_util.h"

typedef struct {
    int64_t B, Tq, Tk;
    int Hq, Hkv, D;
} att_case;

static const char *SITE = "layers.0.self_attn";

static ag_tensor *g_attention(ag_ctx *ctx, ag_tensor **in, const void *arg) {
    const att_case *c = arg;
    return ag_attention(ctx, SITE, in[0], in[1], in[2], c->Hq, c->Hkv, c->D);
}

// Activations needing gradients, as the projections' outputs would be.
static void make_inputs(ag_ctx *ctx, const att_case *c, ag_tensor **in) {
    in[0] = ag_test_const(ctx, 3, (int64_t[]){c->B, c->Tq, (int64_t)c->Hq * c->D}, "q", 31);
    in[1] = ag_test_const(ctx, 3, (int64_t[]){c->B, c->Tk, (int64_t)c->Hkv * c->D}, "k", 32);
    in[2] = ag_test_const(ctx, 3, (int64_t[]){c->B, c->Tk, (int64_t)c->Hkv * c->D}, "v", 33);
    ag_fill(in[0], 31, -2.0f, 2.0f); // scores large enough for a far from uniform softmax
    ag_fill(in[1], 32, -2.0f, 2.0f);
    for (int i = 0; i < 3; i++) in[i]->requires_grad = true;
}

// Output, dq, dk and dv of one forward and backward under the given framework and attention.
static void run_case(ag_ctx *ctx, const att_case *c, ag_framework f, ag_attention_kind kind, float *res[4]) {
    ag_ctx_set_framework(ctx, f);
    ag_ctx_set_attention(ctx, kind);
    ag_tensor *in[3];
    make_inputs(ctx, c, in);
    ag_output_and_grads(ctx, g_attention(ctx, in, c), in, 3, res);
    ag_ctx_set_framework(ctx, AG_FRAMEWORK_LEAN);
    ag_ctx_set_attention(ctx, AG_ATTENTION_EAGER);
}

static const att_case CASES[] = {
    {2, 5, 5, 2, 2, 3},       // 1 query head per key-value head
    {2, 7, 7, 4, 2, 3},       // 2
    {2, 9, 9, 3, 1, 5},       // 3
    {2, 3, 11, 6, 2, 4},      // Tq < Tk
    {2, 70, 70, 6, 2, 16},    // past one tile of queries and keys
    {2, 131, 131, 3, 1, 64},  // threaded, three tiles
    {1, 67, 200, 4, 2, 32},   // Tq < Tk over several key tiles
    {2, 129, 129, 9, 3, 20},  // SmolLM2's groups, a head size that is not a multiple of 16
    {1, 257, 257, 2, 1, 130}, // a head wider than one panel of 64
    // Eager's products run in causal blocks of 256 rows and keys (PYTORCH semantics):
    {2, 520, 520, 3, 1, 8},  // three blocks, the last one short
    {1, 300, 700, 2, 1, 16}, // fewer queries than keys: blocks of keys that every query sees
};

static void matches_eager(ag_framework f) {
    for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++) {
        const att_case *c = &CASES[k];
        ag_ctx *ctx = ag_ctx_new();
        float *eager[4], *flash[4];
        run_case(ctx, c, f, AG_ATTENTION_EAGER, eager);
        run_case(ctx, c, f, AG_ATTENTION_FLASH, flash);
        int64_t n[4] = {c->B * c->Tq * c->Hq * c->D, c->B * c->Tq * c->Hq * c->D, c->B * c->Tk * c->Hkv * c->D,
                        c->B * c->Tk * c->Hkv * c->D};
        for (int i = 0; i < 4; i++) {
            double r = ag_rel_diff(flash[i], eager[i], n[i]);
            if (!(r < 1e-5))
                fail_msg("case %zu (B %lld, Tq %lld, Tk %lld, Hq %d, Hkv %d, D %d): %s differs by %g relative", k,
                         (long long)c->B, (long long)c->Tq, (long long)c->Tk, c->Hq, c->Hkv, c->D,
                         (const char *[]){"output", "dq", "dk", "dv"}[i], r);
            free(eager[i]);
            free(flash[i]);
        }
        ag_ctx_free(ctx);
    }
}

static void test_matches_eager(void **state) {
    (void)state;
    matches_eager(AG_FRAMEWORK_LEAN);
}

static void test_matches_eager_portable(void **state) {
    (void)state;
    ag_flash_force_portable(true);
    matches_eager(AG_FRAMEWORK_LEAN);
    ag_flash_force_portable(false);
}

static void test_matches_eager_pytorch(void **state) {
    (void)state;
    matches_eager(AG_FRAMEWORK_PYTORCH);
}

// One thread: the same numbers as two (dQ's locked sums aside, within rounding).
static void test_one_thread(void **state) {
    (void)state;
    int was = ag_num_threads();
    ag_set_num_threads(1);
    matches_eager(AG_FRAMEWORK_LEAN);
    ag_set_num_threads(was);
}

static void fd_case(void **state, bool portable) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    ag_flash_force_portable(portable);
    ag_ctx_set_attention(ctx, AG_ATTENTION_FLASH);
    const att_case cases[] = {{2, 4, 4, 4, 2, 3}, {2, 3, 6, 3, 1, 2}, {1, 5, 5, 6, 2, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ag_tensor *in[3];
        make_inputs(ctx, &cases[i], in);
        ag_fd_check(ctx, g_attention, &cases[i], 3, in);
        for (int j = 0; j < 3; j++) ag_release(in[j]);
    }
    ag_flash_force_portable(false);
}

static void test_finite_differences(void **state) { fd_case(state, false); }
static void test_finite_differences_portable(void **state) { fd_case(state, true); }

// q, k and v the same tensor (Hq = Hkv, Tq = Tk): every gradient lands in one buffer.
static void test_shared_input(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    const att_case c = {2, 70, 70, 2, 2, 8};
    ag_tensor *x = ag_test_const(ctx, 3, (int64_t[]){2, 70, 16}, "x", 41);
    x->requires_grad = true;
    float *g[2];
    for (int a = 0; a < 2; a++) {
        ag_ctx_set_attention(ctx, a ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER);
        ag_tensor *o = ag_attention(ctx, SITE, x, x, x, c.Hq, c.Hkv, c.D);
        ag_tensor *dout = ag_tensor_new(ctx, 3, o->shape, MP_ACTIVATION, "test:dout");
        ag_fill(dout, 5, -1.0f, 1.0f);
        assert_int_equal(ag_backward_grad(ctx, o, dout), AG_OK);
        g[a] = ag_copy_of(x->grad);
        ag_zero_grad(x);
        ag_release(dout);
        ag_release(o);
    }
    assert_true(ag_rel_diff(g[1], g[0], x->numel) < 1e-5);
    free(g[0]), free(g[1]);
    ag_release(x);
}

static uint64_t bytes_of(const att_case *c, int64_t T, int H) { return (uint64_t)(c->B * T * H * c->D) * 4; }

// LEAN: the node keeps q, k, v, its output and the float32 log-sum-exp [B, Hq, Tq], nothing else.
static void test_saved_lean(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    ag_ctx_set_attention(ctx, AG_ATTENTION_FLASH);
    const att_case c = {2, 70, 90, 6, 2, 16};
    ag_tensor *in[3];
    make_inputs(ctx, &c, in);
    ag_tensor *o = g_attention(ctx, in, &c);
    assert_non_null(o);
    assert_string_equal(ag_tensor_name(o), "layers.0.self_attn:out");
    ag_node_info info;
    assert_int_equal(ag_tape_size(ctx), 1);
    assert_true(ag_tape_node(ctx, 0, &info));
    assert_int_equal(info.nsaved, 5);
    for (int i = 0; i < 3; i++) assert_ptr_equal(info.saved[i], in[i]);
    assert_ptr_equal(info.saved[3], o);
    const ag_tensor *lse = info.saved[4];
    assert_string_equal(ag_tensor_name(lse), "layers.0.self_attn:lse");
    assert_int_equal(lse->ndim, 3);
    assert_true(lse->shape[0] == 2 && lse->shape[1] == 6 && lse->shape[2] == 70);
    uint64_t want = 2 * bytes_of(&c, c.Tq, c.Hq) + 2 * bytes_of(&c, c.Tk, c.Hkv) + 2 * 6 * 70 * 4;
    assert_int_equal(info.saved_bytes, want);
    assert_int_equal(ag_tape_saved_bytes(ctx), want);
    // lse = log Σ_j exp(q·k_j / sqrt(D)) over the visible keys, row 0 of head 0 (position 20).
    double z = 0.0;
    for (int64_t j = 0; j <= 20; j++) {
        double s = 0.0;
        for (int d = 0; d < 16; d++) s += (double)ag_f32(in[0])[d] * ag_f32(in[1])[j * 32 + d];
        z += exp(s / 4.0);
    }
    assert_true(fabs(ag_f32(lse)[0] - log(z)) < 1e-5 * fabs(log(z)) + 1e-6);
    ag_release(o);
    ag_tape_clear(ctx);
    // No grad mode: no node, no log-sum-exp; only the output is left.
    ag_set_grad_enabled(ctx, false);
    uint64_t live = mp_get_counter(MP_ACTIVATION).live;
    o = g_attention(ctx, in, &c);
    assert_int_equal(ag_tape_size(ctx), 0);
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live, live + bytes_of(&c, c.Tq, c.Hq));
    ag_release(o);
    for (int i = 0; i < 3; i++) ag_release(in[i]);
}

// PYTORCH: transformers' sdpa path. SDPA's node keeps q, k, v, its output [B, Hq, Tq, D] and
// the log-sum-exp; the op returns transpose(1, 2).contiguous(), a copy of its own.
static void test_saved_pytorch(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    ag_ctx_set_framework(ctx, AG_FRAMEWORK_PYTORCH);
    ag_ctx_set_attention(ctx, AG_ATTENTION_FLASH);
    const att_case c = {2, 33, 33, 6, 2, 16};
    ag_tensor *in[3];
    make_inputs(ctx, &c, in);
    uint64_t live = mp_get_counter(MP_ACTIVATION).live;
    ag_tensor *o = g_attention(ctx, in, &c);
    assert_non_null(o);
    assert_string_equal(ag_tensor_name(o), "layers.0.self_attn:out");
    ag_node_info info;
    assert_true(ag_tape_node(ctx, 0, &info));
    assert_int_equal(info.nsaved, 5);
    for (int i = 0; i < 3; i++) assert_ptr_equal(info.saved[i], in[i]);
    const ag_tensor *so = info.saved[3];
    assert_true(so != o);
    assert_string_equal(ag_tensor_name(so), "layers.0.self_attn:sdpa_out");
    assert_int_equal(so->ndim, 4);
    assert_true(so->shape[0] == 2 && so->shape[1] == 6 && so->shape[2] == 33 && so->shape[3] == 16);
    for (int i = 0; i < info.nsaved; i++) assert_true(info.saved[i] != o);
    for (int64_t t = 0; t < 33; t++) // the copy is the transpose
        for (int h = 0; h < 6; h++)
            assert_memory_equal(ag_f32(o) + (33 + t) * 96 + h * 16, ag_f32(so) + ((6 + h) * 33 + t) * 16, 16 * 4);
    assert_string_equal(ag_tensor_name(info.saved[4]), "layers.0.self_attn:lse");
    uint64_t want = 2 * bytes_of(&c, c.Tq, c.Hq) + 2 * bytes_of(&c, c.Tk, c.Hkv) + 2 * 6 * 33 * 4;
    assert_int_equal(info.saved_bytes, want);
    // Live now: what the node keeps past its inputs, and the returned copy.
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live, live + 2 * bytes_of(&c, c.Tq, c.Hq) + 2 * 6 * 33 * 4);
    ag_release(o);
    ag_tape_clear(ctx);
    for (int i = 0; i < 3; i++) ag_release(in[i]);
}

static void test_shapes(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    ag_tensor *q = ag_test_const(ctx, 3, (int64_t[]){1, 4, 12}, "q", 1),
              *k = ag_test_const(ctx, 3, (int64_t[]){1, 3, 6}, "k", 2);
    assert_null(ag_attention_flash(ctx, "attn", q, k, k, 2, 1, 6)); // Tk < Tq
    assert_int_equal(ag_ctx_status(ctx), AG_ERR_SHAPE);
    assert_non_null(strstr(ag_ctx_error(ctx), "attention attn: q [1, 4, 12], k [1, 3, 6]"));
    ag_ctx_clear_error(ctx);
    assert_null(ag_attention_flash(ctx, "attn", q, NULL, k, 2, 1, 6));
    assert_int_equal(ag_ctx_status(ctx), AG_ERR_ARG);
    ag_ctx_clear_error(ctx);
    ag_release(q);
    ag_release(k);
    assert_int_equal(ag_ctx_attention(ctx), AG_ATTENTION_EAGER);
}

// ---------------------------------------------------------------------------------------------
// The bill: under a profiler of our own (timeline kept, meta or real).

typedef struct {
    uint64_t peak[MP_NCATEGORIES];
    size_t events;
    int64_t *bytes;   // each event's
    uint32_t *labels; // site ids (the same in both runs: labels are interned in order)
} bill;

static void bill_free(bill *b) { free(b->bytes), free(b->labels); }

static ag_ctx *start(bool meta) {
    mp_options opt = {.meta = meta, .keep_timeline = true};
    assert_int_equal(mp_init(&opt), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    assert_non_null(ctx);
    return ctx;
}

static void stop(ag_ctx *ctx, bill *b) {
    ag_ctx_free(ctx);
    ag_assert_all_zero();
    if (b) {
        for (int c = 0; c < MP_NCATEGORIES; c++) b->peak[c] = mp_get_counter((mp_category)c).peak;
        b->events = mp_timeline_count();
        b->bytes = malloc(b->events * sizeof *b->bytes);
        b->labels = malloc(b->events * sizeof *b->labels);
        for (size_t i = 0; i < b->events; i++) {
            b->bytes[i] = mp_timeline_get(i)->bytes;
            b->labels[i] = mp_timeline_get(i)->site;
        }
    }
    mp_shutdown();
}

static bool named(const mp_event *e, const char *suffix) {
    const char *n = mp_site_name(e->site);
    size_t a = strlen(n), b = strlen(suffix);
    return a >= b && strcmp(n + a - b, suffix) == 0;
}

// One training step of the op: inputs, forward, backward from a seeded d(out), everything freed.
static void step(ag_ctx *ctx, const att_case *c, ag_framework f) {
    ag_ctx_set_framework(ctx, f);
    ag_ctx_set_attention(ctx, AG_ATTENTION_FLASH);
    ag_tensor *in[3];
    make_inputs(ctx, c, in);
    mp_set_phase(MP_PHASE_FORWARD);
    ag_tensor *o = g_attention(ctx, in, c);
    assert_non_null(o);
    mp_set_phase(MP_PHASE_BACKWARD);
    ag_tensor *dout = ag_tensor_new(ctx, 3, o->shape, MP_ACTIVATION, "test:dout");
    ag_fill(dout, 9, -1.0f, 1.0f);
    assert_int_equal(ag_backward_grad(ctx, o, dout), AG_OK);
    ag_release(dout);
    ag_release(o);
    for (int i = 0; i < 3; i++) ag_release(in[i]);
    mp_set_phase(MP_PHASE_TEARDOWN);
}

// The activation peak, to the byte: the forward holds inputs, output, lse and its workspace; the
// backward the inputs, output and lse, d(out) twice (the caller's and the node's), D and its
// workspace. No allocation of the timeline is B x Hq x Tq x Tk floats, or one head's Tq x Tk.
static void test_peak_and_timeline(void **state) {
    (void)state;
    const att_case c = {1, 300, 300, 4, 2, 32};
    ag_ctx *ctx = start(false);
    step(ctx, &c, AG_FRAMEWORK_LEAN);
    const double macs = (double)c.B * c.Hq * (double)c.Tq * (double)c.Tk * c.D;
    const uint64_t ws_f = (uint64_t)ag_flash_threads(c.B * c.Hq * ((c.Tq + 63) / 64), macs) *
                          ag_flash_rows_floats(c.D) * 4,
                   ws_b = (uint64_t)ag_flash_threads(c.B * c.Hkv * ((c.Tk + 63) / 64), 2.5 * macs) *
                          (4 * (uint64_t)c.D * 64 + 2 * 64 * 64) * 4;
    const uint64_t qo = bytes_of(&c, c.Tq, c.Hq), kv = bytes_of(&c, c.Tk, c.Hkv), rows = c.B * c.Hq * c.Tq * 4;
    const uint64_t fwd = 2 * qo + 2 * kv + rows + ws_f, bwd = 4 * qo + 2 * kv + 2 * rows + ws_b;
    size_t n = mp_timeline_count(), ws_seen = 0, d_seen = 0;
    for (size_t i = 0; i < n; i++) {
        const mp_event *e = mp_timeline_get(i);
        int64_t b = e->bytes < 0 ? -e->bytes : e->bytes;
        assert_true(b != c.B * c.Hq * c.Tq * c.Tk * 4 && b != c.Tq * c.Tk * 4);
        if (named(e, ":flash_workspace") && e->bytes > 0) {
            assert_int_equal(e->category, MP_ACTIVATION);
            assert_int_equal((uint64_t)b, ws_seen++ ? ws_b : ws_f);
        }
        if (named(e, ":flash_d") && e->bytes > 0) assert_int_equal(b, rows), d_seen++;
    }
    assert_int_equal(ws_seen, 2);
    assert_int_equal(d_seen, 1);
    assert_int_equal(mp_get_phase_stats(MP_PHASE_FORWARD).peak, fwd);
    assert_int_equal(mp_get_counter(MP_ACTIVATION).peak, fwd > bwd ? fwd : bwd);
    stop(ctx, NULL);
}

// Meta mode allocates exactly what a real run does: every event, in order, to the byte.
static void meta_equals_real(ag_framework f) {
    const att_case cases[] = {{1, 300, 300, 4, 2, 32}, {2, 3, 11, 6, 2, 4}};
    for (size_t k = 0; k < 2; k++) {
        bill b[2];
        for (int m = 0; m < 2; m++) {
            ag_ctx *ctx = start(m == 1);
            step(ctx, &cases[k], f);
            stop(ctx, &b[m]);
        }
        for (int c = 0; c < MP_NCATEGORIES; c++) assert_int_equal(b[0].peak[c], b[1].peak[c]);
        assert_int_equal(b[0].events, b[1].events);
        assert_memory_equal(b[0].bytes, b[1].bytes, b[0].events * sizeof *b[0].bytes);
        assert_memory_equal(b[0].labels, b[1].labels, b[0].events * sizeof *b[0].labels);
        bill_free(&b[0]), bill_free(&b[1]);
    }
}

static void test_meta_equals_real(void **state) {
    (void)state;
    meta_equals_real(AG_FRAMEWORK_LEAN);
    meta_equals_real(AG_FRAMEWORK_PYTORCH);
}

// A 16-bit meta run bills the log-sum-exp (and D) at 32 bits, the output at 16.
static void test_meta_16_bits(void **state) {
    (void)state;
    ag_ctx *ctx = start(true);
    ag_precision d = ag_precision_f32();
    d.act_bits = 16;
    assert_true(ag_ctx_set_precision(ctx, &d));
    const att_case c = {2, 100, 100, 6, 2, 16};
    step(ctx, &c, AG_FRAMEWORK_LEAN);
    size_t n = mp_timeline_count(), seen = 0;
    for (size_t i = 0; i < n; i++) {
        const mp_event *e = mp_timeline_get(i);
        if (e->bytes <= 0) continue;
        if (named(e, ":lse") || named(e, ":flash_d")) assert_int_equal(e->bytes, 2 * 6 * 100 * 4), seen++;
        if (named(e, "self_attn:out")) assert_int_equal(e->bytes, 2 * 100 * 96 * 2), seen++;
    }
    assert_int_equal(seen, 3);
    stop(ctx, NULL);
}

// torch.autocast (meta, PYTORCH): SDPA runs on 16-bit casts of float32 inputs, which its node keeps.
static void test_meta_autocast(void **state) {
    (void)state;
    ag_ctx *ctx = start(true);
    ag_precision d = ag_precision_f32();
    d.autocast = true;
    assert_true(ag_ctx_set_precision(ctx, &d));
    ag_ctx_set_framework(ctx, AG_FRAMEWORK_PYTORCH);
    ag_ctx_set_attention(ctx, AG_ATTENTION_FLASH);
    const att_case c = {1, 40, 40, 6, 2, 16};
    ag_tensor *in[3];
    make_inputs(ctx, &c, in);
    ag_tensor *o = g_attention(ctx, in, &c);
    assert_non_null(o);
    assert_int_equal(o->bits, 16);
    ag_node_info info;
    assert_true(ag_tape_node(ctx, 0, &info));
    assert_int_equal(info.nsaved, 5);
    assert_string_equal(ag_tensor_name(info.saved[0]), "layers.0.self_attn:q_bf16");
    for (int i = 0; i < 4; i++) assert_int_equal(info.saved[i]->bits, 16);
    assert_int_equal(info.saved[4]->bits, 32);
    ag_release(o);
    ag_tape_clear(ctx);
    for (int i = 0; i < 3; i++) ag_release(in[i]);
    stop(ctx, NULL);
}

// ---------------------------------------------------------------------------------------------
// Inference over the cache

// A prefill of 9 tokens, then two decode steps, the first row left-padded by 3; returns the
// last call's output (Tq queries) for each attention, and checks that FLASH makes no
// probabilities (nor, under PYTORCH, repeat_kv copies or scores).
static void cached_case(ag_framework f, int64_t Tq_last) {
    const int64_t B = 2, D = 16;
    const int Hq = 6, Hkv = 2;
    float *res[2];
    for (int a = 0; a < 2; a++) {
        ag_ctx *ctx = start(false);
        ag_ctx_set_framework(ctx, f);
        ag_ctx_set_attention(ctx, a ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER);
        ag_set_grad_enabled(ctx, false);
        ag_kv_cache *cache = ag_kv_cache_new(ctx, SITE, MP_CACHE, B, Hkv, (int)D);
        const int64_t steps[] = {9, 1, Tq_last}, total = 9 + 1 + Tq_last;
        int32_t *mask = calloc((size_t)(B * total), sizeof *mask);
        for (int64_t j = 0; j < total; j++) mask[j] = j >= 3, mask[total + j] = 1;
        ag_tensor *o = NULL;
        for (int s = 0; s < 3; s++) {
            int64_t t = steps[s];
            ag_tensor *k = ag_test_const(ctx, 3, (int64_t[]){B, t, Hkv * D}, "k", 50 + s),
                      *v = ag_test_const(ctx, 3, (int64_t[]){B, t, Hkv * D}, "v", 60 + s),
                      *q = ag_test_const(ctx, 3, (int64_t[]){B, t, Hq * D}, "q", 70 + s);
            ag_fill(q, 70 + s, -2.0f, 2.0f);
            ag_fill(k, 50 + s, -2.0f, 2.0f);
            assert_true(ag_kv_cache_append(ctx, cache, k, v));
            ag_release(o);
            o = ag_attention_cached(ctx, SITE, q, cache, mask, total, Hq);
            if (!o) fail_msg("attention_cached: %s", ag_ctx_error(ctx));
            ag_release(q), ag_release(k), ag_release(v);
        }
        res[a] = ag_copy_of(o);
        ag_release(o);
        ag_kv_cache_free(cache);
        free(mask);
        size_t n = mp_timeline_count(), ws = 0;
        for (size_t i = 0; i < n && a; i++) {
            const mp_event *e = mp_timeline_get(i);
            assert_false(named(e, ":probs") || named(e, ":k_repeated") || named(e, ":v_repeated") ||
                         named(e, ":scores") || named(e, ":scores_scaled"));
            ws += named(e, ":flash_workspace") && e->bytes > 0;
        }
        if (a) assert_int_equal(ws, 3);
        stop(ctx, NULL);
    }
    assert_true(ag_rel_diff(res[1], res[0], B * Tq_last * Hq * D) < 1e-5);
    free(res[0]), free(res[1]);
}

static void test_cached(void **state) {
    (void)state;
    cached_case(AG_FRAMEWORK_LEAN, 1);
    cached_case(AG_FRAMEWORK_LEAN, 70);
    cached_case(AG_FRAMEWORK_PYTORCH, 1);
    cached_case(AG_FRAMEWORK_PYTORCH, 70);
    ag_flash_force_portable(true);
    cached_case(AG_FRAMEWORK_LEAN, 70);
    ag_flash_force_portable(false);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_matches_eager, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_matches_eager_portable, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_matches_eager_pytorch, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_one_thread, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_finite_differences, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_finite_differences_portable, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_shared_input, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_saved_lean, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_saved_pytorch, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_shapes, ag_setup, ag_teardown),
        cmocka_unit_test(test_peak_and_timeline),
        cmocka_unit_test(test_meta_equals_real),
        cmocka_unit_test(test_meta_16_bits),
        cmocka_unit_test(test_meta_autocast),
        cmocka_unit_test(test_cached),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
