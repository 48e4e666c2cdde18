// optim against torch.optim's documented algorithms (single-tensor path, maximize and amsgrad
// off), recomputed here in double precision; the state's bill (lazy, exact bytes, category
// optimizer); parameters without a gradient; zero_grad; meta mode; the memory budget; names
// and settings; Adam's for-loop and foreach implementations: their temporaries to the byte and
// in torch's order, their results against the fused pass, a step whose temporaries do not fit.
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "optim.h"

#define N 8 // elements of the main test parameter
#define STEPS 3

// |got - want| <= TOL x max(1, |want|). The worst seen is ~1e-7 (float32 rounding of values
// of order 1); a wrong formula moves the result by a sizeable fraction of lr (0.1 here).
#define TOL 2e-6

static double worst_seen, worst_vs_fused;

// ---------------------------------------------------------------------------------------------
// Fault injection: the test links with -Wl,--wrap=mp_alloc,--wrap=mp_alloc_described, so every
// allocation the libraries ask the profiler for comes here; one labelled fail_site fails as if
// the allocator were out of memory (what the budget cannot foretell).

mp_status __real_mp_alloc(mp_block *out, size_t bytes, mp_category cat, const char *site);
mp_status __real_mp_alloc_described(mp_block *out, size_t bytes, mp_category cat, const char *site, const char *detail);
static const char *fail_site;

static bool injected(mp_block *out, const char *site) {
    if (!fail_site || !site || strcmp(site, fail_site) != 0) return false;
    memset(out, 0, sizeof *out);
    return true;
}

mp_status __wrap_mp_alloc(mp_block *out, size_t bytes, mp_category cat, const char *site) {
    return injected(out, site) ? MP_ERR_NOMEM : __real_mp_alloc(out, bytes, cat, site);
}

mp_status __wrap_mp_alloc_described(mp_block *out, size_t bytes, mp_category cat, const char *site,
                                    const char *detail) {
    return injected(out, site) ? MP_ERR_NOMEM : __real_mp_alloc_described(out, bytes, cat, site, detail);
}

// ---------------------------------------------------------------------------------------------
// Fixture

static int setup(void **state) {
    assert_int_equal(mp_init(&(mp_options){.keep_timeline = true}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    assert_non_null(ctx);
    *state = ctx;
    return 0;
}

static void assert_all_zero(void) {
    for (int c = 0; c < MP_OTHER; c++)
        if (mp_get_counter((mp_category)c).live != 0)
            fail_msg("%s still holds %llu bytes", mp_category_name((mp_category)c),
                     (unsigned long long)mp_get_counter((mp_category)c).live);
}

// Shuts the profiler down even when something is left, so that one failure does not spoil the
// tests after it.
static int teardown(void **state) {
    ag_ctx_free(*state);
    int left = -1;
    for (int c = 0; c < MP_OTHER; c++)
        if (mp_get_counter((mp_category)c).live != 0) left = c;
    mp_shutdown();
    if (left >= 0) fail_msg("%s: bytes left at the end of the test", mp_category_name((mp_category)left));
    return 0;
}

static uint64_t live(mp_category c) { return mp_get_counter(c).live; }

static ag_tensor *param(ag_ctx *ctx, const char *name, int64_t n, const float *init) {
    ag_tensor *p = ag_param_new(ctx, 1, (int64_t[]){n}, name);
    assert_non_null(p);
    if (p->data && init) memcpy(p->data, init, (size_t)n * sizeof(float));
    return p;
}

// Gives p the gradient g through a real backward (y = p + 0, d(y) = g), as a training step
// does. In meta mode g is ignored.
static void give_grad(ag_ctx *ctx, ag_tensor *p, const float *g) {
    ag_tensor *zero = ag_tensor_new(ctx, p->ndim, p->shape, MP_ACTIVATION, "zero");
    ag_tensor *dy = ag_tensor_new(ctx, p->ndim, p->shape, MP_ACTIVATION, "dy");
    assert_non_null(zero);
    assert_non_null(dy);
    if (zero->data) {
        memset(zero->data, 0, (size_t)p->numel * sizeof(float));
        memcpy(dy->data, g, (size_t)p->numel * sizeof(float));
    }
    ag_tensor *y = ag_add(ctx, "give_grad", p, zero);
    assert_non_null(y);
    assert_int_equal(ag_backward_grad(ctx, y, dy), AG_OK);
    ag_release(y);
    ag_release(zero);
    ag_release(dy);
    assert_non_null(p->grad);
    if (p->grad->data) assert_memory_equal(p->grad->data, g, (size_t)p->numel * sizeof(float));
}

// ---------------------------------------------------------------------------------------------
// The reference: torch.optim (1.13) Adam, AdamW and SGD, per parameter, in double

typedef struct {
    double w[N], m[N], v[N], buf[N];
    long step; // Adam's state["step"]: counts the steps that saw a gradient
    bool has_buf;
    int n;
} ref_param;

static void ref_init(ref_param *r, const float *w, int n) {
    memset(r, 0, sizeof *r);
    r->n = n;
    for (int i = 0; i < n; i++) r->w[i] = w[i];
}

static void ref_adam(const optim_config *c, ref_param *r, const float *g) {
    const double lr = c->lr, b1 = c->beta1, b2 = c->beta2, eps = c->eps, wd = c->weight_decay;
    r->step++;
    const double bc1 = 1 - pow(b1, (double)r->step), bc2 = 1 - pow(b2, (double)r->step);
    for (int i = 0; i < r->n; i++) {
        double gi = g[i];
        if (c->kind == OPTIM_ADAMW)
            r->w[i] *= 1 - lr * wd; // decoupled: param.mul_(1 - lr*wd)
        else
            gi += wd * r->w[i];                      // L2: grad.add(param, alpha=wd)
        r->m[i] += (gi - r->m[i]) * (1 - b1);        // exp_avg.lerp_(grad, 1 - beta1)
        r->v[i] = r->v[i] * b2 + (1 - b2) * gi * gi; // exp_avg_sq.mul_(b2).addcmul_(..)
        double denom = sqrt(r->v[i]) / sqrt(bc2) + eps;
        r->w[i] -= lr / bc1 * r->m[i] / denom;
    }
}

// damp_first: a deliberately wrong variant (dampening applied to the first buffer), used to
// show that the tests tell it apart.
static void ref_sgd(const optim_config *c, ref_param *r, const float *g, bool damp_first) {
    const double lr = c->lr, wd = c->weight_decay, mom = c->momentum, damp = c->dampening;
    for (int i = 0; i < r->n; i++) {
        double d = g[i] + wd * r->w[i];
        if (mom != 0) {
            if (!r->has_buf)
                r->buf[i] = damp_first ? (1 - damp) * d : d; // torch.clone(d_p)
            else
                r->buf[i] = mom * r->buf[i] + (1 - damp) * d;
            d = c->nesterov ? d + mom * r->buf[i] : r->buf[i];
        }
        r->w[i] -= lr * d;
    }
    if (mom != 0) r->has_buf = true;
    r->step++;
}

static void ref_step(const optim_config *c, ref_param *r, const float *g) {
    if (c->kind == OPTIM_ADAM || c->kind == OPTIM_ADAMW)
        ref_adam(c, r, g);
    else if (c->kind == OPTIM_SGD || c->kind == OPTIM_SGD_MOMENTUM)
        ref_sgd(c, r, g, false);
}

static double ref_worst(const float *got, const ref_param *r) {
    double e = 0;
    for (int i = 0; i < r->n; i++) {
        double d = fabs((double)got[i] - r->w[i]) / fmax(1.0, fabs(r->w[i]));
        if (!(d <= e)) e = d; // NaN wins
    }
    return e;
}

static void assert_matches(const float *got, const ref_param *r, const char *what, int step) {
    double e = ref_worst(got, r);
    if (e > worst_seen) worst_seen = e;
    if (!(e <= TOL)) {
        for (int i = 0; i < r->n; i++) print_message("  [%d] got %.9g want %.9g\n", i, got[i], r->w[i]);
        fail_msg("%s, step %d: error %.3g x max(1, |w|), tolerance %g", what, step, e, TOL);
    }
}

static double ref_distance(const ref_param *a, const ref_param *b) {
    double e = 0;
    for (int i = 0; i < a->n; i++) e = fmax(e, fabs(a->w[i] - b->w[i]) / fmax(1.0, fabs(b->w[i])));
    return e;
}

// ---------------------------------------------------------------------------------------------
// Data: weights of order 1, and per step a gradient with a zero element, one far below eps
// (where eps decides the step), mixed signs, one large element, and signs that flip between
// steps so that the moving averages matter.

static const float w0[N] = {0.5f, -1.25f, 0.75f, 2.0f, -0.3f, 1.1f, -0.9f, 0.05f};

static void grad_at(int step, float g[N]) {
    for (int i = 0; i < N; i++) g[i] = (float)(0.8 * sin(1.3 * i + 2.1 * step) * (1 + i % 3));
    g[0] = 0.0f;
    g[1] = 3e-9f * (float)(step + 1);
    g[2] = step % 2 ? -4.0f : 6.0f;
}

// Runs STEPS steps of cfg on one parameter and checks every step against the reference.
static void run_against_ref(ag_ctx *ctx, const optim_config *cfg, const char *what) {
    ag_tensor *p = param(ctx, "p", N, w0);
    ag_err e_ = {""};
    char *err = e_.msg;
    (void)err;
    optim *o = optim_new(cfg, &p, 1, &e_);
    if (!o) fail_msg("%s: %s", what, err);
    ref_param r;
    ref_init(&r, w0, N);
    for (int s = 0; s < STEPS; s++) {
        float g[N];
        grad_at(s, g);
        give_grad(ctx, p, g);
        assert_int_equal(optim_step(o, &e_), 0);
        ref_step(cfg, &r, g);
        assert_matches(p->data, &r, what, s + 1);
        optim_zero_grad(o);
    }
    assert_int_equal(optim_steps_taken(o), STEPS);
    optim_free(o);
    ag_release(p);
}

static optim_config cfg_of(optim_kind kind, float lr) {
    optim_config c = optim_defaults(kind);
    c.lr = lr;
    return c;
}

// ---------------------------------------------------------------------------------------------
// Formulas

static void test_defaults(void **state) {
    (void)state;
    optim_config a = optim_defaults(OPTIM_ADAM);
    assert_true(a.lr == 1e-3f && a.beta1 == 0.9f && a.beta2 == 0.999f && a.eps == 1e-8f);
    assert_true(a.weight_decay == 0.0f && a.momentum == 0.0f);
    optim_config w = optim_defaults(OPTIM_ADAMW);
    assert_true(w.weight_decay == 0.01f && w.beta1 == 0.9f && w.beta2 == 0.999f);
    assert_true(optim_defaults(OPTIM_SGD).momentum == 0.0f);
    optim_config m = optim_defaults(OPTIM_SGD_MOMENTUM);
    assert_true(m.momentum == 0.9f && m.dampening == 0.0f && !m.nesterov);
}

static void test_adam(void **state) {
    optim_config c = cfg_of(OPTIM_ADAM, 0.1f);
    run_against_ref(*state, &c, "adam");
    c.beta1 = 0.5f, c.beta2 = 0.75f, c.eps = 1e-2f; // eps and betas that weigh in every element
    run_against_ref(*state, &c, "adam, betas 0.5 0.75, eps 1e-2");
}

static void test_adam_l2_vs_adamw_decoupled(void **state) {
    optim_config adam = cfg_of(OPTIM_ADAM, 0.1f), adamw = cfg_of(OPTIM_ADAMW, 0.1f);
    adam.weight_decay = adamw.weight_decay = 0.5f;
    run_against_ref(*state, &adam, "adam, weight_decay 0.5 (L2)");
    run_against_ref(*state, &adamw, "adamw, weight_decay 0.5 (decoupled)");
    // The two references part by far more than the tolerance: a swap would be caught.
    ref_param a, w;
    ref_init(&a, w0, N);
    ref_init(&w, w0, N);
    for (int s = 0; s < STEPS; s++) {
        float g[N];
        grad_at(s, g);
        ref_step(&adam, &a, g);
        ref_step(&adamw, &w, g);
    }
    assert_true(ref_distance(&a, &w) > 1000 * TOL);
}

static void test_sgd(void **state) {
    optim_config c = cfg_of(OPTIM_SGD, 0.1f);
    run_against_ref(*state, &c, "sgd");
    c.weight_decay = 0.25f;
    run_against_ref(*state, &c, "sgd, weight_decay 0.25");
}

static void test_sgd_momentum(void **state) {
    optim_config c = cfg_of(OPTIM_SGD_MOMENTUM, 0.1f);
    run_against_ref(*state, &c, "sgd-momentum 0.9");
    c.momentum = 0.6f, c.dampening = 0.5f, c.weight_decay = 0.1f;
    run_against_ref(*state, &c, "sgd-momentum 0.6, dampening 0.5, weight_decay 0.1");
    // torch clones the first gradient into the buffer, undamped: the damped variant is far off.
    ref_param good, bad;
    ref_init(&good, w0, N);
    ref_init(&bad, w0, N);
    for (int s = 0; s < STEPS; s++) {
        float g[N];
        grad_at(s, g);
        ref_sgd(&c, &good, g, false);
        ref_sgd(&c, &bad, g, true);
    }
    assert_true(ref_distance(&good, &bad) > 1000 * TOL);
}

static void test_sgd_nesterov(void **state) {
    optim_config c = cfg_of(OPTIM_SGD_MOMENTUM, 0.1f);
    c.nesterov = true;
    run_against_ref(*state, &c, "sgd-momentum 0.9, nesterov");
    c.weight_decay = 0.2f;
    run_against_ref(*state, &c, "sgd-momentum 0.9, nesterov, weight_decay 0.2");
}

// A 2-D parameter large enough for the pool to split the update (results are elementwise, so
// they equal the reference whatever the thread count).
static void test_large_parameter(void **state) {
    ag_ctx *ctx = *state;
    enum { R = 64, C = 1000 };
    ag_tensor *p = ag_param_new(ctx, 2, (int64_t[]){R, C}, "big");
    assert_non_null(p);
    float *g = malloc(R * C * sizeof(float));
    assert_non_null(g);
    for (int i = 0; i < R * C; i++) {
        ag_f32(p)[i] = (float)cos(0.01 * i);
        g[i] = (float)sin(0.37 * i);
    }
    double w_first = ag_f32(p)[0], w_last = ag_f32(p)[R * C - 1];
    optim_config c = cfg_of(OPTIM_ADAMW, 0.1f);
    ag_err e_ = {""};
    char *err = e_.msg;
    (void)err;
    optim *o = optim_new(&c, &p, 1, &e_);
    assert_non_null(o);
    give_grad(ctx, p, g);
    assert_int_equal(optim_step(o, &e_), 0);
    // First step of AdamW: m̂ = g, sqrt(v̂) = |g|, so w·(1 - lr·wd) - lr·g/(|g| + eps); where g
    // is 0, the decay alone.
    for (int i = 0; i < R * C; i++) {
        double gi = g[i];
        double want = (double)(float)cos(0.01 * i) * (1 - 0.1 * 0.01) - 0.1 * gi / (fabs(gi) + 1e-8);
        if (!(fabs(ag_f32(p)[i] - want) <= TOL)) fail_msg("element %d: %.9g, want %.9g", i, ag_f32(p)[i], want);
    }
    assert_true(g[0] == 0 && ag_f32(p)[0] < (float)w_first); // decayed without a gradient
    assert_true(ag_f32(p)[R * C - 1] != (float)w_last);
    free(g);
    optim_free(o);
    ag_release(p);
}

// ---------------------------------------------------------------------------------------------
// State: lazy, billed to optimizer, exact bytes

// The optimizer allocations recorded in the timeline since event `from`: their count, and
// whether each of the `n` site names appeared with `bytes` bytes.
static size_t optimizer_events(size_t from, const char *const *sites, size_t n, int64_t bytes) {
    size_t count = 0;
    bool seen[4] = {false};
    for (size_t i = from; i < mp_timeline_count(); i++) {
        const mp_event *e = mp_timeline_get(i);
        if (e->category != MP_OPTIMIZER) continue;
        count++;
        for (size_t j = 0; j < n; j++)
            if (e->bytes == bytes && strcmp(mp_site_name(e->site), sites[j]) == 0) seen[j] = true;
    }
    for (size_t j = 0; j < n; j++)
        if (!seen[j]) fail_msg("no optimizer allocation of %lld bytes at %s", (long long)bytes, sites[j]);
    return count;
}

static void lazy_state(ag_ctx *ctx, optim_kind kind, size_t per_elem, const char *const *sites, size_t nsites) {
    assert_int_equal(optim_state_bytes_per_element(kind), per_elem);
    ag_tensor *p[2] = {param(ctx, "layers.0.a", N, w0), param(ctx, "layers.0.b", 3, w0)};
    optim_config c = optim_defaults(kind);
    ag_err e_ = {""};
    char *err = e_.msg;
    (void)err;
    optim *o = optim_new(&c, p, 2, &e_);
    assert_non_null(o);
    assert_int_equal(live(MP_OPTIMIZER), 0); // nothing before the first step
    float g[N];
    grad_at(0, g);
    give_grad(ctx, p[0], g);
    give_grad(ctx, p[1], g);
    assert_int_equal(live(MP_OPTIMIZER), 0);
    size_t from = mp_timeline_count();
    assert_int_equal(optim_step(o, &e_), 0);
    assert_int_equal(live(MP_OPTIMIZER), per_elem * (N + 3));
    assert_int_equal(mp_get_counter(MP_OPTIMIZER).allocations, 2 * nsites);
    assert_int_equal(optimizer_events(from, sites, nsites, (int64_t)(4 * N)), 2 * nsites);
    assert_int_equal(live(MP_WEIGHT), 4 * (N + 3));
    assert_int_equal(live(MP_GRADIENT), 4 * (N + 3));
    assert_int_equal(live(MP_ACTIVATION), 0); // no temporaries left behind
    // Later steps reuse the state.
    optim_zero_grad(o);
    give_grad(ctx, p[0], g);
    give_grad(ctx, p[1], g);
    assert_int_equal(optim_step(o, &e_), 0);
    assert_int_equal(mp_get_counter(MP_OPTIMIZER).allocations, 2 * nsites);
    assert_int_equal(live(MP_OPTIMIZER), per_elem * (N + 3));
    optim_free(o);
    assert_int_equal(live(MP_OPTIMIZER), 0);
    ag_release(p[0]);
    ag_release(p[1]);
}

static void test_state_adam(void **state) {
    const char *sites[] = {"layers.0.a:exp_avg", "layers.0.a:exp_avg_sq"};
    lazy_state(*state, OPTIM_ADAM, 8, sites, 2);
}
static void test_state_adamw(void **state) {
    const char *sites[] = {"layers.0.a:exp_avg", "layers.0.a:exp_avg_sq"};
    lazy_state(*state, OPTIM_ADAMW, 8, sites, 2);
}
static void test_state_momentum(void **state) {
    const char *sites[] = {"layers.0.a:momentum_buffer"};
    lazy_state(*state, OPTIM_SGD_MOMENTUM, 4, sites, 1);
}
static void test_state_sgd(void **state) { lazy_state(*state, OPTIM_SGD, 0, NULL, 0); }

static void test_none(void **state) {
    ag_ctx *ctx = *state;
    assert_int_equal(optim_state_bytes_per_element(OPTIM_NONE), 0);
    ag_tensor *p = param(ctx, "p", N, w0);
    optim_config c = optim_defaults(OPTIM_NONE);
    ag_err e_ = {""};
    char *err = e_.msg;
    (void)err;
    optim *o = optim_new(&c, &p, 1, &e_);
    assert_non_null(o);
    float g[N];
    grad_at(0, g);
    give_grad(ctx, p, g);
    assert_int_equal(optim_step(o, &e_), 0);
    assert_memory_equal(p->data, w0, sizeof w0);
    assert_int_equal(live(MP_OPTIMIZER), 0);
    optim_zero_grad(o);
    assert_null(p->grad);
    optim_free(o);
    ag_release(p);
}

// ---------------------------------------------------------------------------------------------
// Parameters without a gradient are skipped: no state, no update, no step counted

static void test_skip_without_grad(void **state) {
    ag_ctx *ctx = *state;
    ag_tensor *p[2] = {param(ctx, "a", N, w0), param(ctx, "b", N, w0)};
    optim_config c = cfg_of(OPTIM_ADAM, 0.1f);
    ag_err e_ = {""};
    char *err = e_.msg;
    (void)err;
    optim *o = optim_new(&c, p, 2, &e_);
    assert_non_null(o);
    ref_param ra, rb;
    ref_init(&ra, w0, N);
    ref_init(&rb, w0, N);
    // Which parameter has a gradient at each step: a alone, both, b alone, both.
    const bool has[4][2] = {{true, false}, {true, true}, {false, true}, {true, true}};
    const uint64_t state_after[4] = {8 * N, 16 * N, 16 * N, 16 * N};
    for (int s = 0; s < 4; s++) {
        float g[N];
        grad_at(s, g);
        float gb[N];
        for (int i = 0; i < N; i++) gb[i] = -0.5f * g[N - 1 - i];
        float before_a[N], before_b[N];
        memcpy(before_a, p[0]->data, sizeof before_a);
        memcpy(before_b, p[1]->data, sizeof before_b);
        if (has[s][0]) give_grad(ctx, p[0], g);
        if (has[s][1]) give_grad(ctx, p[1], gb);
        assert_int_equal(optim_step(o, &e_), 0);
        assert_int_equal(live(MP_OPTIMIZER), state_after[s]);
        if (has[s][0])
            ref_step(&c, &ra, g);
        else
            assert_memory_equal(p[0]->data, before_a, sizeof before_a);
        if (has[s][1])
            ref_step(&c, &rb, gb);
        else
            assert_memory_equal(p[1]->data, before_b, sizeof before_b);
        // Each parameter's bias correction follows its own step count (3 for both at the end).
        assert_matches(p[0]->data, &ra, "a", s + 1);
        assert_matches(p[1]->data, &rb, "b", s + 1);
        optim_zero_grad(o);
    }
    assert_int_equal(ra.step, 3);
    assert_int_equal(rb.step, 3);
    optim_free(o);
    ag_release(p[0]);
    ag_release(p[1]);
}

static void test_zero_grad_frees(void **state) {
    ag_ctx *ctx = *state;
    ag_tensor *p[2] = {param(ctx, "a", N, w0), param(ctx, "b", 5, w0)};
    optim_config c = optim_defaults(OPTIM_SGD);
    ag_err e_ = {""};
    char *err = e_.msg;
    (void)err;
    optim *o = optim_new(&c, p, 2, &e_);
    assert_non_null(o);
    optim_zero_grad(o); // no gradient yet: nothing to do
    assert_int_equal(live(MP_GRADIENT), 0);
    float g[N];
    grad_at(1, g);
    give_grad(ctx, p[0], g);
    give_grad(ctx, p[1], g);
    assert_int_equal(live(MP_GRADIENT), 4 * (N + 5));
    assert_int_equal(optim_step(o, &e_), 0);
    assert_int_equal(live(MP_GRADIENT), 4 * (N + 5)); // the step leaves gradients alone
    optim_zero_grad(o);
    assert_int_equal(live(MP_GRADIENT), 0);
    assert_null(p[0]->grad);
    assert_null(p[1]->grad);
    optim_zero_grad(NULL);
    optim_free(o);
    ag_release(p[0]);
    ag_release(p[1]);
}

// ---------------------------------------------------------------------------------------------
// Meta mode: the same state bytes, no data

static void meta_run(optim_kind kind) {
    assert_int_equal(mp_init(&(mp_options){.meta = true}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    assert_non_null(ctx);
    enum { BIG = 1 << 20 }; // a real run would touch 4 MiB per buffer
    ag_tensor *p[2] = {param(ctx, "a", BIG, NULL), param(ctx, "b", 7, NULL)};
    assert_null(p[0]->data);
    optim_config c = optim_defaults(kind);
    ag_err e_ = {""};
    char *err = e_.msg;
    (void)err;
    optim *o = optim_new(&c, p, 2, &e_);
    assert_non_null(o);
    give_grad(ctx, p[0], NULL);
    assert_null(p[0]->grad->data);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(optim_step(o, &e_), 0); // b has no gradient: skipped
        assert_int_equal(live(MP_OPTIMIZER), optim_state_bytes_per_element(kind) * BIG);
    }
    assert_int_equal(optim_steps_taken(o), 2);
    assert_int_equal(live(MP_WEIGHT), 4 * (BIG + 7));
    assert_int_equal(live(MP_GRADIENT), 4 * BIG);
    assert_true(mp_get_counter(MP_OPTIMIZER).peak_usable ==
                mp_get_counter(MP_OPTIMIZER).peak); // meta: usable = requested
    optim_zero_grad(o);
    optim_free(o);
    ag_release(p[0]);
    ag_release(p[1]);
    ag_ctx_free(ctx);
    assert_all_zero();
    mp_shutdown();
}

static void test_meta(void **state) {
    (void)state;
    meta_run(OPTIM_ADAM);
    meta_run(OPTIM_ADAMW);
    meta_run(OPTIM_SGD_MOMENTUM);
    meta_run(OPTIM_SGD);
}

// Other dtypes in meta mode: weights and gradients at the context's element size, the state at
// state_bits, the master copy at 4 bytes (site "<param>:master"); refused in a real run.
static void dtype_run(optim_kind kind, int state_bits, bool master, uint64_t per_elem) {
    assert_int_equal(mp_init(&(mp_options){.meta = true, .keep_timeline = true}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    assert_non_null(ctx);
    ag_precision d = {.act_bits = 16, .weight_bits = 16, .grad_bits = 16};
    assert_true(ag_ctx_set_precision(ctx, &d));
    enum { BIG = 1 << 20 };
    ag_tensor *p = param(ctx, "a", BIG, NULL);
    optim_config c = optim_defaults(kind);
    c.state_bits = state_bits;
    c.master = master;
    assert_int_equal(optim_state_bytes(&c), per_elem);
    ag_err e_ = {""};
    char *err = e_.msg;
    (void)err;
    optim *o = optim_new(&c, &p, 1, &e_);
    assert_non_null(o);
    give_grad(ctx, p, NULL);
    assert_int_equal(optim_step(o, &e_), 0);
    assert_int_equal(live(MP_WEIGHT), 2 * BIG);
    assert_int_equal(live(MP_GRADIENT), 2 * BIG);
    assert_int_equal(live(MP_OPTIMIZER), per_elem * BIG);
    bool seen = false;
    for (size_t i = 0; i < mp_timeline_count(); i++) {
        const mp_event *e = mp_timeline_get(i);
        if (e->bytes > 0 && strcmp(mp_site_name(e->site), "a:master") == 0)
            seen = e->bytes == 4 * BIG && e->category == MP_OPTIMIZER;
    }
    assert_true(seen == master);
    optim_free(o);
    ag_release(p);
    ag_ctx_free(ctx);
    assert_all_zero();
    mp_shutdown();
}

static void test_meta_dtypes(void **state) {
    (void)state;
    dtype_run(OPTIM_ADAM, 16, false, 4);         // bf16 Adam: exp_avg 2 + exp_avg_sq 2
    dtype_run(OPTIM_ADAMW, 32, true, 12);        // mixed precision: master 4 + 4 + 4
    dtype_run(OPTIM_SGD_MOMENTUM, 16, false, 2); // momentum_buffer 2
    dtype_run(OPTIM_SGD, 32, true, 4);           // the master copy alone
    optim_config none = optim_defaults(OPTIM_NONE);
    none.master = true;
    assert_int_equal(optim_state_bytes(&none), 0); // no step, nothing kept
}

// A real run in 16 bits: the step computed in float32 and rounded once into each tensor (bf16
// state), and with a master copy the float32 step on the master, the weight its rounding.
static void test_bf16_real_steps(void **state) {
    ag_ctx *ctx = *state;
    ag_precision d = {.act_bits = 16, .weight_bits = 16, .grad_bits = 16};
    assert_true(ag_ctx_set_precision(ctx, &d));
    float w0[N], g0[N], got[N];
    for (int i = 0; i < N; i++) w0[i] = 0.5f - 0.03f * (float)i, g0[i] = 0.01f * (float)((i * 7) % 11) - 0.05f;
    for (int master = 0; master < 2; master++) {
        ag_tensor *p = ag_param_new(ctx, 1, (int64_t[]){N}, "w");
        assert_non_null(p);
        assert_int_equal(p->dtype, AG_BF16);
        assert_int_equal(p->block.bytes, 2 * N);
        ag_tensor_from_f32(p, w0);
        p->grad = ag_tensor_new(ctx, 1, (int64_t[]){N}, MP_GRADIENT, "w:grad");
        ag_tensor_from_f32(p->grad, g0);
        float wr[N], gr[N];
        ag_tensor_to_f32(p, wr);
        ag_tensor_to_f32(p->grad, gr);
        optim_config c = optim_defaults(OPTIM_ADAM);
        c.state_bits = master ? 32 : 16;
        c.master = master;
        ag_err e = {""};
        optim *o = optim_new(&c, &p, 1, &e);
        assert_non_null(o);
        assert_int_equal(optim_step(o, &e), 0);
        ag_tensor_to_f32(p, got);
        ref_param r;
        ref_init(&r, wr, N);
        ref_step(&c, &r, gr);
        for (int i = 0; i < N; i++) { // one bfloat16 rounding of the float32 step: 2^-8 relative
            assert_true(fabsf(got[i] - (float)r.w[i]) <= 0x1p-8f * fabsf((float)r.w[i]) + 1e-7f);
            uint32_t u;
            memcpy(&u, &got[i], sizeof u);
            assert_int_equal(u & 0xffffu, 0); // the weight holds bfloat16 values
        }
        optim_free(o);
        ag_release(p);
    }
}

// bfloat16 of x, nearest even (x is never NaN here).
static float bf16_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

// bf16-mixed over a length with a tail (the pass runs 16 lanes at a time, with streaming stores
// where the weight's lines allow): after each of three steps the bfloat16 weight is, bit for bit,
// the rounding of a float32 run of the same update from the same values (the master copy).
static void test_bf16_mixed_matches_float32(void **state) {
    ag_ctx *ctx = *state;
    enum { NM = 16 * 67 + 13 };
    float *w0 = malloc(NM * sizeof(float)), *g = malloc(NM * sizeof(float)), *got = malloc(NM * sizeof(float));
    assert_true(w0 && g && got);
    for (int i = 0; i < NM; i++) w0[i] = bf16_of((float)cos(0.37 * i));
    for (optim_kind kind = OPTIM_ADAM; kind <= OPTIM_ADAMW; kind++) {
        optim_config c = optim_defaults(kind), cm = c;
        c.weight_decay = cm.weight_decay = 0.01f;
        cm.master = true;
        ag_precision f32 = ag_precision_f32(), b16 = {.act_bits = 16, .weight_bits = 16, .grad_bits = 16};
        assert_true(ag_ctx_set_precision(ctx, &f32));
        ag_tensor *p32 = param(ctx, "w32", NM, w0);
        assert_true(ag_ctx_set_precision(ctx, &b16));
        ag_tensor *p16 = ag_param_new(ctx, 1, (int64_t[]){NM}, "w16");
        assert_non_null(p16);
        assert_int_equal(p16->dtype, AG_BF16);
        ag_tensor_from_f32(p16, w0);
        ag_err e = {""};
        optim *o32 = optim_new(&c, &p32, 1, &e), *o16 = optim_new(&cm, &p16, 1, &e);
        assert_true(o32 && o16);
        for (int step = 0; step < 3; step++) {
            for (int i = 0; i < NM; i++) g[i] = bf16_of(0.05f * (float)sin(1.3 * i + step));
            assert_true(ag_ctx_set_precision(ctx, &f32));
            ag_release(p32->grad);
            p32->grad = ag_tensor_new(ctx, 1, (int64_t[]){NM}, MP_GRADIENT, "w32:grad");
            ag_tensor_from_f32(p32->grad, g);
            assert_true(ag_ctx_set_precision(ctx, &b16));
            ag_release(p16->grad);
            p16->grad = ag_tensor_new(ctx, 1, (int64_t[]){NM}, MP_GRADIENT, "w16:grad");
            ag_tensor_from_f32(p16->grad, g);
            assert_int_equal(optim_step(o32, &e), 0);
            assert_int_equal(optim_step(o16, &e), 0);
            ag_tensor_to_f32(p16, got);
            const float *want = ag_f32(p32);
            for (int i = 0; i < NM; i++)
                if (got[i] != bf16_of(want[i]))
                    fail_msg("%s step %d element %d: %a, expected %a (the rounding of %a)", optim_kind_name(kind), step,
                             i, got[i], bf16_of(want[i]), want[i]);
        }
        optim_free(o32);
        optim_free(o16);
        ag_release(p32);
        ag_release(p16);
    }
    free(w0), free(g), free(got);
}

// ---------------------------------------------------------------------------------------------
// Budget: a step whose state does not fit fails, naming the parameter, and changes nothing

// One step from fresh state of n elements (any n), checked N elements at a time.
static void check_chunks(const optim_config *c, const float *got, const float *w, const float *g, int n,
                         const char *what) {
    for (int i = 0; i < n; i += N) {
        ref_param r;
        ref_init(&r, w + i, n - i < N ? n - i : N);
        ref_step(c, &r, g + i);
        assert_matches(got + i, &r, what, 1);
    }
}

static void budget_run(optim_kind kind) {
    enum { NA = 1024, NB = 256 };
    const size_t per = optim_state_bytes_per_element(kind);
    // Room for the parameters and gradients, and while giving a gradient, its temporaries.
    const uint64_t budget = 4 * 2 * (NA + NB) + 5 * 4 * NA;
    assert_int_equal(mp_init(&(mp_options){.budget = budget}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    assert_non_null(ctx);
    float *wa = malloc(NA * sizeof(float)), *ga = malloc(NA * sizeof(float));
    float wb[NB], gb[NB];
    assert_non_null(wa);
    assert_non_null(ga);
    for (int i = 0; i < NA; i++) wa[i] = (float)cos(i), ga[i] = (float)sin(i);
    for (int i = 0; i < NB; i++) wb[i] = (float)cos(3 * i), gb[i] = (float)sin(5 * i);
    ag_tensor *p[2] = {param(ctx, "layers.0.first", NA, wa), param(ctx, "layers.1.second", NB, wb)};
    give_grad(ctx, p[0], ga);
    give_grad(ctx, p[1], gb);
    // Ballast leaves room for the first parameter's state and a part of the second's.
    const uint64_t room = per * NA + per * NB - 4;
    mp_block ballast;
    assert_int_equal(mp_alloc(&ballast, budget - mp_live_total() - room, MP_ACTIVATION, "ballast"), MP_OK);
    optim_config c = cfg_of(kind, 0.1f);
    ag_err e_ = {""};
    char *err = e_.msg;
    (void)err;
    optim *o = optim_new(&c, p, 2, &e_);
    assert_non_null(o);

    uint64_t before[MP_NCATEGORIES];
    for (int k = 0; k < MP_NCATEGORIES; k++) before[k] = live((mp_category)k);
    assert_int_equal(optim_step(o, &e_), -1);
    if (!strstr(err, "layers.1.second") || strstr(err, "layers.0.first") || !strstr(err, "budget"))
        fail_msg("message does not name the parameter and the budget: \"%s\"", err);
    const mp_oom_record *oom = mp_oom();
    assert_true(oom->happened);
    assert_int_equal(oom->category, MP_OPTIMIZER);
    assert_true(strncmp(mp_site_name(oom->site), "layers.1.second:", 16) == 0);
    // Nothing changed: no state kept, no weight moved, no step counted.
    for (int k = 0; k < MP_NCATEGORIES; k++)
        if (live((mp_category)k) != before[k])
            fail_msg("%s: %llu bytes live after the failed step, %llu before", mp_category_name((mp_category)k),
                     (unsigned long long)live((mp_category)k), (unsigned long long)before[k]);
    uint64_t sum = 0;
    for (int k = 0; k < MP_NCATEGORIES; k++) sum += live((mp_category)k);
    assert_int_equal(sum, mp_live_total());
    assert_memory_equal(p[0]->data, wa, NA * sizeof(float));
    assert_memory_equal(p[1]->data, wb, NB * sizeof(float));
    assert_int_equal(optim_steps_taken(o), 0);

    // With room again the same step runs, as a first step.
    mp_free(&ballast);
    assert_int_equal(optim_step(o, &e_), 0);
    assert_int_equal(live(MP_OPTIMIZER), per * (NA + NB));
    assert_int_equal(optim_steps_taken(o), 1);
    check_chunks(&c, p[0]->data, wa, ga, NA, "first, after the retried step");
    check_chunks(&c, p[1]->data, wb, gb, NB, "second, after the retried step");
    optim_zero_grad(o);
    optim_free(o);
    ag_release(p[0]);
    ag_release(p[1]);
    ag_ctx_free(ctx);
    free(wa);
    free(ga);
    assert_all_zero();
    mp_shutdown();
}

static void test_budget(void **state) {
    (void)state;
    budget_run(OPTIM_ADAM);
    budget_run(OPTIM_ADAMW);
    budget_run(OPTIM_SGD_MOMENTUM);
}

// ---------------------------------------------------------------------------------------------
// Adam's implementations: for-loop and foreach allocate torch.optim's temporaries (category
// temporary), in its order, and compute the update from them; fused keeps none

typedef struct {
    optim_adam_impl impl;
    ag_framework fw; // whose torch.optim
    const char *name;
} impl_case;

static const impl_case impls[] = {{OPTIM_ADAM_FUSED, AG_FRAMEWORK_PYTORCH, "fused"},
                                  {OPTIM_ADAM_FOR_LOOP, AG_FRAMEWORK_PYTORCH, "for-loop"},
                                  {OPTIM_ADAM_FOREACH, AG_FRAMEWORK_PYTORCH, "foreach"},
                                  {OPTIM_ADAM_FOREACH, AG_FRAMEWORK_PYTORCH_113, "foreach (1.13)"},
                                  {OPTIM_ADAM_FOREACH, AG_FRAMEWORK_PYTORCH_20, "foreach (2.0)"}};
#define NIMPLS (sizeof impls / sizeof impls[0])

static optim_config impl_cfg(optim_kind kind, const impl_case *ic) {
    optim_config c = cfg_of(kind, 0.1f);
    c.adam_impl = ic->impl;
    c.framework = ic->fw;
    return c;
}

// A gradient of n elements for step s, with the data of grad_at spread over it.
static float *grad_n(int64_t n, int s, float scale) {
    float *g = malloc((size_t)n * sizeof(float));
    assert_non_null(g);
    for (int64_t i = 0; i < n; i++) g[i] = scale * (float)(0.8 * sin(1.3 * (double)i + 2.1 * s) * (1 + i % 3));
    if (n > 2) g[0] = 0.0f, g[1] = 3e-9f, g[2] = s % 2 ? -4.0f : 6.0f;
    return g;
}

static ag_tensor *param_n(ag_ctx *ctx, const char *name, int64_t n, float phase) {
    ag_tensor *p = ag_param_new(ctx, 1, (int64_t[]){n}, name);
    assert_non_null(p);
    for (int64_t i = 0; p->data && i < n; i++) ag_f32(p)[i] = (float)cos(0.37 * (double)i + phase);
    return p;
}

static void grads_for(ag_ctx *ctx, ag_tensor *const *p, int np, int s) {
    for (int i = 0; i < np; i++) {
        float *g = mp_is_meta() ? NULL : grad_n(p[i]->numel, s + 7 * i, 1.0f);
        give_grad(ctx, p[i], g);
        free(g);
    }
}

// The temporaries' allocations and frees since timeline event `from`: "+a:sqrt +a:denom -a:sqrt".
static const char *tmp_events(size_t from, char *buf, size_t len) {
    size_t k = 0;
    buf[0] = 0;
    for (size_t i = from; i < mp_timeline_count(); i++) {
        const mp_event *e = mp_timeline_get(i);
        if (e->category != MP_TEMPORARY) continue;
        k += (size_t)snprintf(buf + k, k < len ? len - k : 0, "%s%c%s", k ? " " : "", e->bytes > 0 ? '+' : '-',
                              mp_site_name(e->site));
    }
    return buf;
}

// Three parameters a, b, c of the sizes given, two steps (the first makes the state): after each,
// the temporaries' peak (in elements of 4 bytes, or of `elem` bytes), the step's total peak
// (what was live + the state made + the temporaries' peak), torch's sequence of temporaries and
// none left over.
static void impl_peak_run(bool meta, optim_kind kind, const impl_case *ic, float wd, const int64_t sz[3],
                          uint64_t want_elems, const char *want_events) {
    assert_int_equal(mp_init(&(mp_options){.meta = meta, .keep_timeline = true}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    assert_non_null(ctx);
    ag_tensor *p[3] = {param_n(ctx, "a", sz[0], 0), param_n(ctx, "b", sz[1], 1), param_n(ctx, "c", sz[2], 2)};
    optim_config c = impl_cfg(kind, ic);
    if (wd >= 0) c.weight_decay = wd;
    ag_err e_ = {""};
    optim *o = optim_new(&c, p, 3, &e_);
    assert_non_null(o);
    for (int s = 0; s < 2; s++) {
        grads_for(ctx, p, 3, s);
        uint64_t before = mp_live_total(), state_before = live(MP_OPTIMIZER);
        mp_reset_peaks();
        size_t from = mp_timeline_count();
        if (optim_step(o, &e_) != 0) fail_msg("%s: %s", ic->name, e_.msg);
        uint64_t state_made = live(MP_OPTIMIZER) - state_before;
        assert_int_equal(state_made, s == 0 ? 8 * (uint64_t)(sz[0] + sz[1] + sz[2]) : 0);
        assert_int_equal(live(MP_TEMPORARY), 0); // back at zero after the step
        if (mp_get_counter(MP_TEMPORARY).peak != 4 * want_elems)
            fail_msg("%s%s, step %d: temporaries peak at %llu bytes, want %llu", ic->name, meta ? " (meta)" : "", s + 1,
                     (unsigned long long)mp_get_counter(MP_TEMPORARY).peak, (unsigned long long)(4 * want_elems));
        assert_int_equal(mp_peak().total, before + state_made + 4 * want_elems);
        char ev[1024];
        if (strcmp(tmp_events(from, ev, sizeof ev), want_events) != 0)
            fail_msg("%s%s, step %d: temporaries\n  %s\nwant\n  %s", ic->name, meta ? " (meta)" : "", s + 1, ev,
                     want_events);
        optim_zero_grad(o);
    }
    assert_int_equal(optim_steps_taken(o), 2);
    optim_free(o);
    for (int i = 0; i < 3; i++) ag_release(p[i]);
    ag_ctx_free(ctx);
    assert_all_zero();
    mp_shutdown();
}

// With b_k the k-th parameter's elements and W their sum: for-loop max_k (b_{k-1} + 2 b_k), the
// last denom living until the next one replaces it (2 x the largest when it comes first);
// foreach W; PyTorch 1.13's and 2.0's foreach 2W; fused none. Adam's L2 weight decay adds grad +
// wd x param: for-loop one b_k more (b_{k-1} + 3 b_k), foreach a list W freed before the sqrt
// list, 2.0's foreach a list W kept to the return (3W).
static void test_impl_temporaries(void **state) {
    (void)state;
    const int64_t largest_first[3] = {1000, 8, 300}, largest_second[3] = {8, 1000, 3};
    const char *const seq[NIMPLS] = {
        "", "+a:sqrt +a:denom -a:sqrt +b:sqrt +b:denom -b:sqrt -a:denom +c:sqrt +c:denom -c:sqrt -b:denom -c:denom",
        "+a:sqrt +b:sqrt +c:sqrt -c:sqrt -b:sqrt -a:sqrt",
        "+a:sqrt +b:sqrt +c:sqrt +a:denom +b:denom +c:denom -c:sqrt -b:sqrt -a:sqrt -c:denom -b:denom -a:denom",
        "+a:sqrt +b:sqrt +c:sqrt +a:denom +b:denom +c:denom -c:sqrt -b:sqrt -a:sqrt -c:denom -b:denom -a:denom"};
    const uint64_t first[NIMPLS] = {0, 2 * 1000, 1308, 2 * 1308, 2 * 1308};
    const uint64_t second[NIMPLS] = {0, 8 + 2 * 1000, 1011, 2 * 1011, 2 * 1011};
    for (int meta = 0; meta < 2; meta++)
        for (size_t k = 0; k < NIMPLS; k++) {
            impl_peak_run(meta, OPTIM_ADAM, &impls[k], -1, largest_first, first[k], seq[k]);
            impl_peak_run(meta, OPTIM_ADAM, &impls[k], -1, largest_second, second[k], seq[k]);
            impl_peak_run(meta, OPTIM_ADAMW, &impls[k], 0.5f, largest_second, second[k], seq[k]); // decay in place
        }
    // Adam with L2 weight decay: grad.add(param, alpha=wd) is a new tensor (1.13's foreach adds it
    // into .grad in place instead).
    const char *const seq_l2[NIMPLS] = {
        "",
        "+a:grad_wd +a:sqrt +a:denom -a:sqrt -a:grad_wd +b:grad_wd +b:sqrt +b:denom -b:sqrt -a:denom -b:grad_wd "
        "+c:grad_wd +c:sqrt +c:denom -c:sqrt -b:denom -c:grad_wd -c:denom",
        "+a:grad_wd +b:grad_wd +c:grad_wd -c:grad_wd -b:grad_wd -a:grad_wd +a:sqrt +b:sqrt +c:sqrt -c:sqrt -b:sqrt "
        "-a:sqrt",
        seq[3],
        "+a:grad_wd +b:grad_wd +c:grad_wd +a:sqrt +b:sqrt +c:sqrt +a:denom +b:denom +c:denom -c:grad_wd -b:grad_wd "
        "-a:grad_wd -c:sqrt -b:sqrt -a:sqrt -c:denom -b:denom -a:denom"};
    const uint64_t l2[NIMPLS] = {0, 8 + 3 * 1000, 1011, 2 * 1011, 3 * 1011};
    for (int meta = 0; meta < 2; meta++)
        for (size_t k = 0; k < NIMPLS; k++)
            impl_peak_run(meta, OPTIM_ADAM, &impls[k], 0.5f, largest_second, l2[k], seq_l2[k]);
}

// The temporaries take the element size of the state (exp_avg_sq.sqrt() has its dtype): 2 bytes
// in a pure 16-bit run, 4 with a float32 master copy.
static void test_impl_temporaries_dtypes(void **state) {
    (void)state;
    for (int master = 0; master < 2; master++) {
        assert_int_equal(mp_init(&(mp_options){.meta = true}), MP_OK);
        ag_ctx *ctx = ag_ctx_new();
        ag_precision d = {.act_bits = 16, .weight_bits = 16, .grad_bits = 16};
        assert_true(ag_ctx_set_precision(ctx, &d));
        enum { BIG = 1 << 20 };
        ag_tensor *p = param(ctx, "a", BIG, NULL);
        optim_config c = impl_cfg(OPTIM_ADAMW, &impls[1]);
        c.state_bits = master ? 32 : 16;
        c.master = master;
        ag_err e_ = {""};
        optim *o = optim_new(&c, &p, 1, &e_);
        assert_non_null(o);
        give_grad(ctx, p, NULL);
        assert_int_equal(optim_step(o, &e_), 0);
        assert_int_equal(mp_get_counter(MP_TEMPORARY).peak, 2 * (master ? 4 : 2) * (uint64_t)BIG);
        assert_int_equal(live(MP_TEMPORARY), 0);
        optim_free(o);
        ag_release(p);
        ag_ctx_free(ctx);
        assert_all_zero();
        mp_shutdown();
    }
}

// SGD takes no notice of adam_impl; the default is fused.
static void test_impl_sgd_and_default(void **state) {
    for (int k = 0; k <= OPTIM_NONE; k++) {
        optim_config d = optim_defaults((optim_kind)k);
        assert_int_equal(d.adam_impl, OPTIM_ADAM_FUSED);
        assert_int_equal(d.framework, AG_FRAMEWORK_LEAN);
    }
    optim_config c = cfg_of(OPTIM_SGD_MOMENTUM, 0.1f);
    c.adam_impl = OPTIM_ADAM_FOREACH;
    run_against_ref(*state, &c, "sgd-momentum, adam_impl foreach");
    assert_int_equal(mp_get_counter(MP_TEMPORARY).allocations, 0);
}

// Every implementation against the double-precision reference, and against the fused pass
// within a few float32 roundings (they differ only in how the last operations round:
// w + (-lr/bc1·m)/denom against w - lr/bc1·(m/denom), and 1.13's exp_avg·b1 + (1-b1)·g against
// exp_avg + (g - exp_avg)·(1-b1)), over several steps, on a parameter large enough for the
// passes to run on several threads. The temporary category is back at zero after every step.
#define FUSED_ULPS 8

static void impl_vs_fused(ag_ctx *ctx, optim_kind kind, float wd, const impl_case *ic) {
    enum { NP = 2, STEPS_F = 5 };
    const int64_t sz[NP] = {70000, 5};
    ag_tensor *pf[NP], *pi[NP];
    for (int i = 0; i < NP; i++) pf[i] = param_n(ctx, "f", sz[i], (float)i), pi[i] = param_n(ctx, "i", sz[i], (float)i);
    optim_config cf = impl_cfg(kind, &impls[0]), ci = impl_cfg(kind, ic);
    if (wd >= 0) cf.weight_decay = ci.weight_decay = wd;
    ag_err e_ = {""};
    optim *of = optim_new(&cf, pf, NP, &e_), *oi = optim_new(&ci, pi, NP, &e_);
    assert_non_null(of);
    assert_non_null(oi);
    for (int s = 0; s < STEPS_F; s++) {
        for (int i = 0; i < NP; i++) {
            float *g = grad_n(sz[i], s + 3 * i, 1.0f);
            give_grad(ctx, pf[i], g);
            give_grad(ctx, pi[i], g);
            free(g);
        }
        assert_int_equal(optim_step(of, &e_), 0);
        assert_int_equal(optim_step(oi, &e_), 0);
        assert_int_equal(live(MP_TEMPORARY), 0);
        for (int i = 0; i < NP; i++)
            for (int64_t j = 0; j < sz[i]; j++) {
                double a = ag_f32(pi[i])[j], b = ag_f32(pf[i])[j], scale = fmax(1.0, fabs(b));
                double ulps = fabs(a - b) / (FLT_EPSILON * scale);
                if (ulps > worst_vs_fused) worst_vs_fused = ulps;
                if (!(ulps <= FUSED_ULPS))
                    fail_msg("%s %s wd %g, step %d, element %lld of %lld: %.9g, fused %.9g (%.1f ulps of max(1, |w|))",
                             ic->name, optim_kind_name(kind), (double)ci.weight_decay, s + 1, (long long)j,
                             (long long)sz[i], a, b, ulps);
            }
        optim_zero_grad(of);
        optim_zero_grad(oi);
    }
    optim_free(of);
    optim_free(oi);
    for (int i = 0; i < NP; i++) ag_release(pf[i]), ag_release(pi[i]);
}

static void test_impl_numerics(void **state) {
    ag_ctx *ctx = *state;
    for (size_t k = 1; k < NIMPLS; k++) {
        impl_vs_fused(ctx, OPTIM_ADAM, -1, &impls[k]);
        impl_vs_fused(ctx, OPTIM_ADAMW, -1, &impls[k]);
        impl_vs_fused(ctx, OPTIM_ADAM, 0.25f, &impls[k]); // L2
        char what[64];
        optim_config c = impl_cfg(OPTIM_ADAM, &impls[k]);
        snprintf(what, sizeof what, "adam %s", impls[k].name);
        run_against_ref(ctx, &c, what);
        c.beta1 = 0.5f, c.beta2 = 0.75f, c.eps = 1e-2f;
        run_against_ref(ctx, &c, what);
        c = impl_cfg(OPTIM_ADAM, &impls[k]);
        c.weight_decay = 0.5f;
        snprintf(what, sizeof what, "adam %s, weight_decay 0.5 (L2)", impls[k].name);
        run_against_ref(ctx, &c, what);
        c = impl_cfg(OPTIM_ADAMW, &impls[k]);
        c.weight_decay = 0.5f;
        snprintf(what, sizeof what, "adamw %s, weight_decay 0.5", impls[k].name);
        run_against_ref(ctx, &c, what);
    }
    assert_int_equal(live(MP_TEMPORARY), 0);
}

// A step whose temporaries do not fit the budget fails and changes nothing, in every
// implementation, at the first step (the state it made is given back) and at a later one (the
// state keeps its values): the refused allocation is the one that crosses, named with the
// budget; everything is back as before; with room again the same step runs. a is smaller than
// b, so that a's temporaries fit and b's do not: a step that did not check first would have
// updated a already.
static void impl_budget_run(bool meta, optim_kind kind, const impl_case *ic, float wd, bool later, uint64_t peak_elems,
                            const char *refused) {
    enum { NA = 256, NB = 1024 };
    const uint64_t budget = 1u << 20;
    assert_int_equal(mp_init(&(mp_options){.meta = meta, .budget = budget}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    assert_non_null(ctx);
    ag_tensor *p[2] = {param_n(ctx, "a", NA, 0), param_n(ctx, "b", NB, 1)};
    optim_config c = impl_cfg(kind, ic);
    if (wd >= 0) c.weight_decay = wd;
    ag_err e_ = {""};
    char *err = e_.msg;
    optim *o = optim_new(&c, p, 2, &e_);
    assert_non_null(o);
    ref_param ra[NB / N], rb[NB / N]; // the reference, N elements at a time
    for (int i = 0; i < NA / N; i++) ref_init(&ra[i], meta ? w0 : ag_f32(p[0]) + i * N, N);
    for (int i = 0; i < NB / N; i++) ref_init(&rb[i], meta ? w0 : ag_f32(p[1]) + i * N, N);
    float *g[2] = {grad_n(NA, 0, 1.0f), grad_n(NB, 1, 1.0f)};
    if (later) { // one step first, so that the state holds values
        give_grad(ctx, p[0], meta ? NULL : g[0]);
        give_grad(ctx, p[1], meta ? NULL : g[1]);
        assert_int_equal(optim_step(o, &e_), 0);
        for (int i = 0; i < NA / N; i++) ref_step(&c, &ra[i], g[0] + i * N);
        for (int i = 0; i < NB / N; i++) ref_step(&c, &rb[i], g[1] + i * N);
        optim_zero_grad(o);
    }
    give_grad(ctx, p[0], meta ? NULL : g[0]);
    give_grad(ctx, p[1], meta ? NULL : g[1]);
    // Room for the state (at the first step) and all but 4 bytes of the temporaries' peak.
    const uint64_t room = (later ? 0 : 8 * (NA + NB)) + 4 * peak_elems - 4;
    mp_block ballast;
    assert_int_equal(mp_alloc(&ballast, budget - mp_live_total() - room, MP_ACTIVATION, "ballast"), MP_OK);
    uint64_t before[MP_NCATEGORIES];
    for (int k = 0; k < MP_NCATEGORIES; k++) before[k] = live((mp_category)k);
    float wa[NA], wb[NB];
    if (!meta) memcpy(wa, p[0]->data, sizeof wa), memcpy(wb, p[1]->data, sizeof wb);
    long steps = optim_steps_taken(o);

    assert_int_equal(optim_step(o, &e_), -1);
    if (!strstr(err, refused) || !strstr(err, "budget"))
        fail_msg("%s: the message does not name %s and the budget: \"%s\"", ic->name, refused, err);
    const mp_oom_record *oom = mp_oom();
    assert_true(oom->happened);
    assert_int_equal(oom->category, MP_TEMPORARY);
    assert_string_equal(mp_site_name(oom->site), refused);
    for (int k = 0; k < MP_NCATEGORIES; k++)
        if (live((mp_category)k) != before[k])
            fail_msg("%s: %s holds %llu bytes after the failed step, %llu before", ic->name,
                     mp_category_name((mp_category)k), (unsigned long long)live((mp_category)k),
                     (unsigned long long)before[k]);
    if (!meta) {
        assert_memory_equal(p[0]->data, wa, sizeof wa);
        assert_memory_equal(p[1]->data, wb, sizeof wb);
    }
    assert_int_equal(optim_steps_taken(o), steps);

    // With room again the same step runs, from the state as it was.
    mp_free(&ballast);
    assert_int_equal(optim_step(o, &e_), 0);
    assert_int_equal(live(MP_OPTIMIZER), 8 * (NA + NB));
    assert_int_equal(live(MP_TEMPORARY), 0);
    assert_int_equal(optim_steps_taken(o), steps + 1);
    for (int i = 0; !meta && i < NA / N; i++) {
        ref_step(&c, &ra[i], g[0] + i * N);
        assert_matches(ag_f32(p[0]) + i * N, &ra[i], "a, after the retried step", later ? 2 : 1);
    }
    for (int i = 0; !meta && i < NB / N; i++) {
        ref_step(&c, &rb[i], g[1] + i * N);
        assert_matches(ag_f32(p[1]) + i * N, &rb[i], "b, after the retried step", later ? 2 : 1);
    }
    optim_zero_grad(o);
    optim_free(o);
    ag_release(p[0]);
    ag_release(p[1]);
    ag_ctx_free(ctx);
    free(g[0]);
    free(g[1]);
    assert_all_zero();
    mp_shutdown();
}

static void test_impl_budget(void **state) {
    (void)state;
    // a 1 KiB, b 4 KiB: for-loop a:sqrt a:denom, a:sqrt goes, b:sqrt b:denom = 1 + 4 + 4 KiB;
    // foreach 1 + 4; 1.13 2 x (1 + 4); L2 for-loop 1 + 3 x 4, L2 foreach its grad list 1 + 4, L2
    // 2.0 foreach 3 x (1 + 4).
    for (int meta = 0; meta < 2; meta++)
        for (int later = 0; later < 2; later++) {
            impl_budget_run(meta, OPTIM_ADAM, &impls[1], -1, later, 256 + 2 * 1024, "b:denom");
            impl_budget_run(meta, OPTIM_ADAMW, &impls[2], -1, later, 256 + 1024, "b:sqrt");
            impl_budget_run(meta, OPTIM_ADAM, &impls[3], -1, later, 2 * (256 + 1024), "b:denom");
            impl_budget_run(meta, OPTIM_ADAM, &impls[1], 0.25f, later, 256 + 3 * 1024, "b:denom");
            impl_budget_run(meta, OPTIM_ADAM, &impls[2], 0.25f, later, 256 + 1024, "b:grad_wd");
            impl_budget_run(meta, OPTIM_ADAM, &impls[4], 0.25f, later, 3 * (256 + 1024), "b:denom");
        }
}

// An allocation the budget did not foretell (the allocator out of memory) stopping a step part
// way: the for-loop leaves a (before the failure) stepped and b untouched, its state kept and its
// temporaries freed, no step counted; a retry steps a again and b for the first time. foreach
// asks for its whole list first and changes nothing, state included; foreach with L2 weight
// decay fails at its sqrt list after the moments, leaving them (and the step counts) updated and
// no weight moved.
static void test_impl_unforeseen_failure(void **state) {
    ag_ctx *ctx = *state;
    enum { NA = 16, NB = 8 };
    for (int k = 0; k < 3; k++) {
        const impl_case *ic = &impls[k == 0 ? 1 : 2];
        ag_tensor *p[2] = {param_n(ctx, "a", NA, 0), param_n(ctx, "b", NB, 1)};
        optim_config c = impl_cfg(OPTIM_ADAM, ic);
        if (k == 2) c.weight_decay = 0.25f;
        ag_err e_ = {""};
        optim *o = optim_new(&c, p, 2, &e_);
        assert_non_null(o);
        ref_param ra[NA / N], rb;
        for (int i = 0; i < NA / N; i++) ref_init(&ra[i], ag_f32(p[0]) + i * N, N);
        ref_init(&rb, p[1]->data, NB);
        float *g[2] = {grad_n(NA, 0, 1.0f), grad_n(NB, 1, 1.0f)};
        float wa[NA], wb[NB];
        memcpy(wa, p[0]->data, sizeof wa);
        memcpy(wb, p[1]->data, sizeof wb);
        give_grad(ctx, p[0], g[0]);
        give_grad(ctx, p[1], g[1]);
        fail_site = "b:sqrt";
        assert_int_equal(optim_step(o, &e_), -1);
        fail_site = NULL;
        if (!strstr(e_.msg, "b:sqrt") || !strstr(e_.msg, "out of memory"))
            fail_msg("%s: \"%s\" does not name b:sqrt and the allocator", ic->name, e_.msg);
        assert_int_equal(live(MP_TEMPORARY), 0);
        assert_int_equal(optim_steps_taken(o), 0);
        assert_memory_equal(p[1]->data, wb, sizeof wb);
        if (k == 1) { // nothing changed
            assert_int_equal(live(MP_OPTIMIZER), 0);
            assert_memory_equal(p[0]->data, wa, sizeof wa);
        } else if (k == 2) { // the moments moved, no weight did
            assert_int_equal(live(MP_OPTIMIZER), 8 * (NA + NB));
            assert_memory_equal(p[0]->data, wa, sizeof wa);
        } else { // a stepped, b untouched
            assert_int_equal(live(MP_OPTIMIZER), 8 * (NA + NB));
            for (int i = 0; i < NA / N; i++) {
                ref_step(&c, &ra[i], g[0] + i * N);
                assert_matches(ag_f32(p[0]) + i * N, &ra[i], "a, stepped before the failure", 1);
            }
        }
        assert_int_equal(optim_step(o, &e_), 0);
        assert_int_equal(live(MP_TEMPORARY), 0);
        assert_int_equal(optim_steps_taken(o), 1);
        if (k < 2) {
            for (int i = 0; i < NA / N; i++) {
                ref_step(&c, &ra[i], g[0] + i * N); // for-loop: a's second step
                assert_matches(ag_f32(p[0]) + i * N, &ra[i], "a, after the retry", k == 0 ? 2 : 1);
            }
            ref_step(&c, &rb, g[1]);
            assert_matches(p[1]->data, &rb, "b, after the retry", 1);
        }
        optim_zero_grad(o);
        optim_free(o);
        ag_release(p[0]);
        ag_release(p[1]);
        free(g[0]);
        free(g[1]);
    }
}

static void test_parse_adam_impl(void **state) {
    (void)state;
    const char *names[] = {"fused", "for-loop", "foreach"};
    for (int k = 0; k < 3; k++) {
        optim_adam_impl i = (optim_adam_impl)-1;
        assert_true(optim_parse_adam_impl(names[k], &i));
        assert_int_equal(i, k);
        assert_string_equal(optim_adam_impl_name(i), names[k]);
    }
    assert_int_equal(OPTIM_ADAM_FUSED, 0);
    const char *bad[] = {"", "for_loop", "forloop", "Foreach", "fused ", "multi-tensor", NULL};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        optim_adam_impl k = OPTIM_ADAM_FOREACH;
        assert_false(optim_parse_adam_impl(bad[i], &k));
        assert_int_equal(k, OPTIM_ADAM_FOREACH); // untouched
    }
    assert_string_equal(optim_adam_impl_name((optim_adam_impl)7), "?");
}

// ---------------------------------------------------------------------------------------------
// Names and settings

static void test_parse_kind(void **state) {
    (void)state;
    const struct {
        const char *name;
        optim_kind kind;
    } ok[] = {{"adam", OPTIM_ADAM},
              {"adamw", OPTIM_ADAMW},
              {"sgd", OPTIM_SGD},
              {"sgd-momentum", OPTIM_SGD_MOMENTUM},
              {"none", OPTIM_NONE}};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        optim_kind k = (optim_kind)-1;
        assert_true(optim_parse_kind(ok[i].name, &k));
        assert_int_equal(k, ok[i].kind);
        assert_string_equal(optim_kind_name(k), ok[i].name);
    }
    const char *bad[] = {"", "adam ", "adamax", "sgd_momentum", "momentum", "sgdm", "rmsprop", "adamw2", NULL};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        optim_kind k = OPTIM_SGD;
        assert_false(optim_parse_kind(bad[i], &k));
        assert_int_equal(k, OPTIM_SGD); // untouched
    }
}

static void refused(ag_ctx *ctx, optim_config c, const char *field) {
    ag_tensor *p = param(ctx, "p", N, w0);
    ag_err e_ = {""};
    char *err = e_.msg;
    (void)err;
    optim *o = optim_new(&c, &p, 1, &e_);
    if (o) fail_msg("settings with a bad %s were accepted", field);
    if (!strstr(err, field)) fail_msg("message \"%s\" does not name %s", err, field);
    ag_release(p);
}

static void test_invalid_settings(void **state) {
    ag_ctx *ctx = *state;
    optim_config c = optim_defaults(OPTIM_ADAM);
    c.lr = -1e-3f;
    refused(ctx, c, "lr");
    c = optim_defaults(OPTIM_SGD);
    c.lr = NAN;
    refused(ctx, c, "lr");
    c = optim_defaults(OPTIM_ADAM);
    c.beta1 = 1.0f;
    refused(ctx, c, "beta1");
    c = optim_defaults(OPTIM_ADAMW);
    c.beta2 = 1.0f;
    refused(ctx, c, "beta2");
    c = optim_defaults(OPTIM_ADAM);
    c.beta1 = -0.1f;
    refused(ctx, c, "beta1");
    c = optim_defaults(OPTIM_ADAM);
    c.eps = -1e-8f;
    refused(ctx, c, "eps");
    c = optim_defaults(OPTIM_ADAMW);
    c.weight_decay = -0.01f;
    refused(ctx, c, "weight_decay");
    c = optim_defaults(OPTIM_SGD_MOMENTUM);
    c.momentum = -0.9f;
    refused(ctx, c, "momentum");
    // torch: "Nesterov momentum requires a momentum and zero dampening"
    c = optim_defaults(OPTIM_SGD_MOMENTUM);
    c.nesterov = true;
    c.dampening = 0.1f;
    refused(ctx, c, "nesterov");
    c = optim_defaults(OPTIM_SGD);
    c.nesterov = true;
    refused(ctx, c, "nesterov");
    // Plain sgd would drop a momentum silently; sgd-momentum without one would bill a buffer
    // that torch.optim never allocates.
    c = optim_defaults(OPTIM_SGD);
    c.momentum = 0.9f;
    refused(ctx, c, "momentum");
    c = optim_defaults(OPTIM_SGD_MOMENTUM);
    c.momentum = 0.0f;
    refused(ctx, c, "momentum");
    c = optim_defaults(OPTIM_ADAM);
    c.kind = (optim_kind)42;
    refused(ctx, c, "kind");
    // Valid edge values pass.
    c = optim_defaults(OPTIM_ADAM);
    c.lr = 0.0f, c.beta1 = 0.0f, c.beta2 = 0.0f, c.eps = 0.0f;
    ag_tensor *p = param(ctx, "p", N, w0);
    ag_err e_ = {""};
    char *err = e_.msg;
    (void)err;
    optim *o = optim_new(&c, &p, 1, &e_);
    assert_non_null(o);
    optim_free(o);
    o = optim_new(&c, NULL, 0, &e_); // no parameters: a step does nothing
    assert_non_null(o);
    assert_int_equal(optim_step(o, &e_), 0);
    optim_free(o);
    optim_free(NULL);
    ag_release(p);
    // NULL settings, or parameters missing.
    assert_null(optim_new(NULL, &p, 1, &e_));
    assert_true(err[0] != '\0');
    c = optim_defaults(OPTIM_ADAM);
    err[0] = '\0';
    assert_null(optim_new(&c, NULL, 2, &e_));
    assert_true(err[0] != '\0');
    ag_tensor *holes[2] = {NULL, NULL};
    err[0] = '\0';
    assert_null(optim_new(&c, holes, 2, &e_));
    assert_true(err[0] != '\0');
}

static int print_worst(void **state) {
    (void)state;
    printf("worst error against the double-precision reference: %.3g x max(1, |w|)\n", worst_seen);
    printf("worst for-loop / foreach difference to the fused pass: %.2f float32 epsilons x max(1, |w|)\n",
           worst_vs_fused);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test_setup_teardown(test_adam, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adam_l2_vs_adamw_decoupled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sgd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sgd_momentum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sgd_nesterov, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_parameter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_adam, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_adamw, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_momentum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_sgd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_none, setup, teardown),
        cmocka_unit_test_setup_teardown(test_skip_without_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zero_grad_frees, setup, teardown),
        cmocka_unit_test(test_meta),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_meta_dtypes),
        cmocka_unit_test_setup_teardown(test_bf16_real_steps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bf16_mixed_matches_float32, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_kind, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_settings, setup, teardown),
        cmocka_unit_test(test_impl_temporaries),
        cmocka_unit_test(test_impl_temporaries_dtypes),
        cmocka_unit_test_setup_teardown(test_impl_sgd_and_default, setup, teardown),
        cmocka_unit_test_setup_teardown(test_impl_numerics, setup, teardown),
        cmocka_unit_test(test_impl_budget),
        cmocka_unit_test_setup_teardown(test_impl_unforeseen_failure, setup, teardown),
        cmocka_unit_test(test_parse_adam_impl),
    };
    return cmocka_run_group_tests(tests, NULL, print_worst);
}
