// ag_checkpoint: a chain of blocks run under it gives the same output and gradients as without,
// keeps only each block's input through forward, recomputes in backward (activation peak
// lower, back at zero afterwards), and bills the same bytes in meta mode as in a real run.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ag_test_util.h"

enum { B = 2, T = 6, H = 8, I = 24, NBLOCKS = 3 };
enum {
    P_IN,
    P_NORM0,
    P_UP0 = P_NORM0 + NBLOCKS,
    P_GATE0 = P_UP0 + NBLOCKS,
    P_DOWN0 = P_GATE0 + NBLOCKS,
    NPARAMS = P_DOWN0 + NBLOCKS
};

// What a block needs: its weights (owned by the chain) and its number.
typedef struct {
    ag_tensor *norm, *up, *gate, *down;
    int i;
} block_arg;

static ag_tensor *step(ag_tensor *a, ag_tensor *b) {
    ag_release(a);
    return b;
}

// x[B, T, H] -> x + down(silu(gate(norm(x))) * up(norm(x))); takes ownership of x.
static ag_tensor *block(ag_ctx *ctx, const void *arg, ag_tensor *x) {
    const block_arg *a = arg;
    char s[5][48];
    const char *what[] = {"norm", "up", "gate", "act", "mul"};
    for (int k = 0; k < 5; k++) snprintf(s[k], sizeof s[k], "b.%d.%s", a->i, what[k]);
    ag_tensor *h = ag_rmsnorm(ctx, s[0], x, a->norm, 1e-5f);
    ag_tensor *u = ag_linear(ctx, s[1], h, a->up, NULL);
    ag_tensor *g = step(h, ag_linear(ctx, s[2], h, a->gate, NULL));
    g = step(g, ag_silu(ctx, s[3], g));
    ag_tensor *m = ag_mul(ctx, s[4], g, u);
    ag_release(g);
    ag_release(u);
    ag_tensor *d = step(m, ag_linear(ctx, "b.down", m, a->down, NULL));
    ag_tensor *y = ag_add(ctx, "b.residual", x, d);
    ag_release(x);
    ag_release(d);
    return y;
}

typedef struct {
    ag_tensor *p[NPARAMS];
} chain;

static void chain_new(ag_ctx *ctx, chain *c) {
    char name[32];
    c->p[P_IN] = ag_test_param(ctx, 3, (int64_t[]){B, T, H}, "x0", 1);
    for (int i = 0; i < NBLOCKS; i++) {
        snprintf(name, sizeof name, "norm%d", i);
        c->p[P_NORM0 + i] = ag_test_param(ctx, 1, (int64_t[]){H}, name, 10 + (uint64_t)i);
        snprintf(name, sizeof name, "up%d", i);
        c->p[P_UP0 + i] = ag_test_param(ctx, 2, (int64_t[]){I, H}, name, 20 + (uint64_t)i);
        snprintf(name, sizeof name, "gate%d", i);
        c->p[P_GATE0 + i] = ag_test_param(ctx, 2, (int64_t[]){I, H}, name, 30 + (uint64_t)i);
        snprintf(name, sizeof name, "down%d", i);
        c->p[P_DOWN0 + i] = ag_test_param(ctx, 2, (int64_t[]){H, I}, name, 40 + (uint64_t)i);
        for (int k = P_UP0; k < NPARAMS; k += NBLOCKS) // small enough for finite differences
            ag_fill(c->p[k + i], 50 + (uint64_t)(k + i), -0.3f, 0.3f);
    }
}

static void chain_free(chain *c) {
    for (int i = 0; i < NPARAMS; i++) ag_release(c->p[i]);
}

static block_arg arg_of(ag_tensor *const *p, int i) {
    return (block_arg){p[P_NORM0 + i], p[P_UP0 + i], p[P_GATE0 + i], p[P_DOWN0 + i], i};
}

// The chain on x0: a plain op first (so the first block's input has a producer on the tape),
// then the blocks, each under ag_checkpoint or not.
static ag_tensor *chain_forward(ag_ctx *ctx, ag_tensor *const *p, bool ckpt) {
    ag_tensor *x = ag_silu(ctx, "pre", p[P_IN]);
    for (int i = 0; i < NBLOCKS && x; i++) {
        block_arg a = arg_of(p, i); // a local: ag_checkpoint keeps its own copy
        if (ckpt) {
            char site[16];
            snprintf(site, sizeof site, "b.%d", i);
            x = step(x, ag_checkpoint(ctx, site, block, &a, sizeof a, x));
        } else {
            x = block(ctx, &a, x);
        }
    }
    return x;
}

// For ag_fd_check: every parameter is an input.
static ag_tensor *graph(ag_ctx *ctx, ag_tensor **in, const void *ckpt) {
    return chain_forward(ctx, in, *(const bool *)ckpt);
}

// One whole run in its own profiler session.
typedef struct {
    float out[B * T * H];
    float *grads[NPARAMS];
    uint64_t act_peak, act_after_forward, tape_saved, act_after_backward;
    size_t tape_after_forward;
    mp_counter counters[MP_NCATEGORIES];
} result;

static void run(bool meta, bool ckpt, result *r) {
    memset(r, 0, sizeof *r);
    assert_int_equal(mp_init(&(mp_options){.meta = meta}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    assert_non_null(ctx);
    chain c;
    chain_new(ctx, &c);
    ag_tensor *y = chain_forward(ctx, c.p, ckpt);
    if (!y) fail_msg("forward: %s", ag_ctx_error(ctx));
    r->act_after_forward = mp_get_counter(MP_ACTIVATION).live;
    r->tape_after_forward = ag_tape_size(ctx);
    r->tape_saved = ag_tape_saved_bytes(ctx);
    if (!meta) memcpy(r->out, y->data, sizeof r->out);
    ag_tensor *dy = ag_tensor_new(ctx, y->ndim, y->shape, MP_ACTIVATION, "test:dy");
    ag_fill(dy, 99, -1.0f, 1.0f);
    assert_int_equal(ag_backward_grad(ctx, y, dy), AG_OK);
    ag_release(dy);
    ag_release(y);
    r->act_after_backward = mp_get_counter(MP_ACTIVATION).live;
    for (int i = 0; i < NPARAMS; i++) {
        assert_non_null(c.p[i]->grad);
        if (meta) continue;
        r->grads[i] = malloc((size_t)c.p[i]->numel * sizeof(float));
        memcpy(r->grads[i], c.p[i]->grad->data, (size_t)c.p[i]->numel * sizeof(float));
    }
    r->act_peak = mp_get_counter(MP_ACTIVATION).peak;
    for (int k = 0; k < MP_NCATEGORIES; k++) r->counters[k] = mp_get_counter((mp_category)k);
    chain_free(&c);
    ag_ctx_free(ctx);
    ag_assert_all_zero();
    mp_shutdown();
}

static void result_free(result *r) {
    for (int i = 0; i < NPARAMS; i++) free(r->grads[i]);
}

static int64_t numel_of(int i) { return i == P_IN ? B * T * H : i < P_UP0 ? H : H * I; }

static void test_same_output_and_gradients(void **state) {
    (void)state;
    result plain, ck;
    run(false, false, &plain);
    run(false, true, &ck);
    double worst = 0.0;
    for (int e = 0; e < B * T * H; e++) worst = fmax(worst, fabs((double)plain.out[e] - ck.out[e]));
    for (int i = 0; i < NPARAMS; i++)
        for (int64_t e = 0; e < numel_of(i); e++) worst = fmax(worst, fabs((double)plain.grads[i][e] - ck.grads[i][e]));
    assert_true(worst <= 1e-6);
    // And they are not zeros that would agree trivially.
    double norm = 0.0;
    for (int64_t e = 0; e < numel_of(P_UP0); e++) norm += fabs((double)ck.grads[P_UP0][e]);
    assert_true(norm > 1e-3);
    result_free(&plain);
    result_free(&ck);
}

// Forward keeps exactly each block's input (and the plain op's saved x0 leaf is a weight); the
// recomputation brings one block's activations back at a time, so the peak is lower.
static void test_keeps_only_block_inputs(void **state) {
    (void)state;
    result plain, ck;
    run(false, false, &plain);
    run(false, true, &ck);
    const uint64_t hidden = B * T * H * sizeof(float);
    assert_int_equal(ck.tape_after_forward, 1 + NBLOCKS); // silu, then one node per block
    assert_int_equal(ck.tape_saved, NBLOCKS * hidden);
    // Live after forward: the block inputs and the chain's output.
    assert_int_equal(ck.act_after_forward, (NBLOCKS + 1) * hidden);
    assert_true(plain.tape_saved > 3 * ck.tape_saved);
    assert_true(ck.act_peak < plain.act_peak);
    assert_int_equal(ck.act_after_backward, 0);
    assert_int_equal(plain.act_after_backward, 0);
    // The recomputation really allocated again: more activation allocations than without.
    assert_true(ck.counters[MP_ACTIVATION].allocations > plain.counters[MP_ACTIVATION].allocations);
    result_free(&plain);
    result_free(&ck);
}

static void test_meta_matches_real(void **state) {
    (void)state;
    result real, meta;
    run(false, true, &real);
    run(true, true, &meta);
    for (int k = 0; k < MP_OTHER; k++) {
        assert_int_equal(meta.counters[k].peak, real.counters[k].peak);
        assert_int_equal(meta.counters[k].allocations, real.counters[k].allocations);
        assert_int_equal(meta.counters[k].frees, real.counters[k].frees);
    }
    assert_int_equal(meta.act_after_forward, real.act_after_forward);
    result_free(&real);
    result_free(&meta);
}

// The checkpointed chain's gradients against central differences (independent of the plain
// chain), and the plain chain passes the same check.
static void test_finite_differences(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    chain c;
    chain_new(ctx, &c);
    for (int ckpt = 0; ckpt < 2; ckpt++) ag_fd_check(ctx, graph, &(bool){ckpt}, NPARAMS, c.p);
    chain_free(&c);
}

// Grad mode off: the block runs as it is, nothing on the tape. An input that needs no gradient
// still gives the block's parameters theirs. A block returning its own input records nothing.
static ag_tensor *identity(ag_ctx *ctx, const void *arg, ag_tensor *x) {
    (void)ctx, (void)arg;
    return x;
}

static void test_no_grad_const_input_identity(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    chain c;
    chain_new(ctx, &c);
    block_arg a = arg_of(c.p, 0);
    ag_tensor *x = ag_test_const(ctx, 3, (int64_t[]){B, T, H}, "const_x", 5);
    ag_set_grad_enabled(ctx, false);
    ag_tensor *y = ag_checkpoint(ctx, "b.0", block, &a, sizeof a, x);
    assert_non_null(y);
    assert_int_equal(ag_tape_size(ctx), 0);
    assert_null(y->node);
    ag_release(y);
    ag_set_grad_enabled(ctx, true);

    y = ag_checkpoint(ctx, "b.0", block, &a, sizeof a, x);
    assert_non_null(y);
    assert_int_equal(ag_tape_size(ctx), 1);
    ag_tensor *dy = ag_test_ones(ctx, y);
    assert_int_equal(ag_backward_grad(ctx, y, dy), AG_OK);
    assert_non_null(a.up->grad);
    assert_non_null(a.norm->grad);
    assert_null(c.p[P_IN]->grad);
    ag_release(dy);
    ag_release(y);

    y = ag_checkpoint(ctx, "id", identity, NULL, 0, x);
    assert_ptr_equal(y, x);
    assert_int_equal(ag_tape_size(ctx), 0);
    ag_release(y);
    ag_release(x);
    assert_int_equal(mp_get_counter(MP_ACTIVATION).live, 0);
    chain_free(&c);
}

// A bad call fails with the error set and leaves nothing behind.
static void test_errors(void **state) {
    ag_ctx *ctx = ag_fixture_ctx(state);
    ag_tensor *x = ag_test_param(ctx, 2, (int64_t[]){2, 3}, "x", 1);
    assert_null(ag_checkpoint(ctx, "c", NULL, NULL, 0, x));
    assert_int_equal(ag_ctx_status(ctx), AG_ERR_ARG);
    assert_non_null(strstr(ag_ctx_error(ctx), "checkpoint c"));
    ag_ctx_clear_error(ctx);
    assert_null(ag_checkpoint(ctx, "c", identity, NULL, 0, NULL));
    assert_int_equal(ag_ctx_status(ctx), AG_ERR_ARG);
    ag_ctx_clear_error(ctx);
    assert_int_equal(ag_tape_size(ctx), 0);
    ag_release(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_output_and_gradients),
        cmocka_unit_test(test_keeps_only_block_inputs),
        cmocka_unit_test(test_meta_matches_real),
        cmocka_unit_test_setup_teardown(test_finite_differences, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_no_grad_const_input_identity, ag_setup, ag_teardown),
        cmocka_unit_test_setup_teardown(test_errors, ag_setup, ag_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
