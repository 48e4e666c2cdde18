#include "ag_test_util.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ag_kernels.h"

static int setup(void **state, bool meta) {
    mp_options opt = {.meta = meta};
    if (mp_init(&opt) != MP_OK) return -1;
    ag_fixture *fx = calloc(1, sizeof *fx);
    fx->ctx = ag_ctx_new();
    *state = fx;
    return fx->ctx ? 0 : -1;
}

int ag_setup(void **state) { return setup(state, false); }
int ag_setup_meta(void **state) { return setup(state, true); }

// The first category (other than "other", not tracked here) still holding bytes, or -1.
static int leaking_category(uint64_t *bytes) {
    for (int c = 0; c < MP_NCATEGORIES; c++) {
        *bytes = mp_get_counter((mp_category)c).live;
        if (c != MP_OTHER && *bytes != 0) return c;
    }
    return -1;
}

void ag_assert_all_zero(void) {
    uint64_t bytes;
    int c = leaking_category(&bytes);
    if (c >= 0)
        fail_msg("category %s still holds %llu bytes", mp_category_name((mp_category)c), (unsigned long long)bytes);
}

// Shuts the profiler down even after a leak, so that the next test starts clean.
int ag_teardown(void **state) {
    ag_fixture *fx = *state;
    ag_ctx_free(fx->ctx);
    free(fx);
    uint64_t bytes;
    int c = leaking_category(&bytes);
    if (c >= 0)
        print_error("category %s still holds %llu bytes\n", mp_category_name((mp_category)c),
                    (unsigned long long)bytes);
    mp_shutdown();
    return c >= 0 ? -1 : 0;
}

ag_ctx *ag_fixture_ctx(void **state) { return ((ag_fixture *)*state)->ctx; }

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void ag_fill(ag_tensor *t, uint64_t seed, float lo, float hi) {
    if (!t->data) return;
    for (int64_t i = 0; i < t->numel; i++) {
        double u = (double)(splitmix(seed * 1000003ull + (uint64_t)i) >> 11) / 9007199254740992.0;
        ag_f32(t)[i] = lo + (hi - lo) * (float)u;
    }
}

ag_tensor *ag_test_param(ag_ctx *ctx, int ndim, const int64_t *shape, const char *name, uint64_t seed) {
    ag_tensor *t = ag_param_new(ctx, ndim, shape, name);
    assert_non_null(t);
    ag_fill(t, seed, -1.0f, 1.0f);
    return t;
}

ag_tensor *ag_test_const(ag_ctx *ctx, int ndim, const int64_t *shape, const char *name, uint64_t seed) {
    ag_tensor *t = ag_tensor_new(ctx, ndim, shape, MP_ACTIVATION, name);
    assert_non_null(t);
    ag_fill(t, seed, -1.0f, 1.0f);
    return t;
}

ag_tensor *ag_test_ones(ag_ctx *ctx, const ag_tensor *like) {
    ag_tensor *t = ag_tensor_new(ctx, like->ndim, like->shape, MP_ACTIVATION, "test:ones");
    assert_non_null(t);
    for (int64_t i = 0; t->data && i < t->numel; i++) ag_f32(t)[i] = 1.0f;
    return t;
}

// Σ out · dout in double; dout NULL means the output is a scalar loss.
static double objective(ag_ctx *ctx, ag_graph_fn f, const void *arg, ag_tensor **in, const float *dout) {
    bool was = ag_set_grad_enabled(ctx, false);
    ag_tensor *out = f(ctx, in, arg);
    ag_set_grad_enabled(ctx, was);
    assert_non_null(out);
    double l = 0.0;
    for (int64_t i = 0; i < out->numel; i++) l += (double)ag_f32(out)[i] * (dout ? dout[i] : 1.0);
    ag_release(out);
    return l;
}

// Runs backward once; returns d(out) (NULL for a scalar) for the objective.
static ag_tensor *analytic(ag_ctx *ctx, ag_graph_fn f, const void *arg, int nin, ag_tensor **in) {
    for (int i = 0; i < nin; i++) ag_zero_grad(in[i]);
    ag_tensor *out = f(ctx, in, arg);
    if (!out) fail_msg("graph failed: %s", ag_ctx_error(ctx));
    ag_tensor *dout = NULL;
    if (out->numel == 1) {
        assert_int_equal(ag_backward(ctx, out), AG_OK);
    } else {
        dout = ag_tensor_new(ctx, out->ndim, out->shape, MP_ACTIVATION, "test:dout");
        assert_non_null(dout);
        ag_fill(dout, 777, -1.0f, 1.0f);
        assert_int_equal(ag_backward_grad(ctx, out, dout), AG_OK);
    }
    ag_release(out);
    assert_int_equal(ag_tape_size(ctx), 0);
    return dout;
}

double ag_fd_worst(ag_ctx *ctx, ag_graph_fn f, const void *arg, int nin, ag_tensor **in, double h, double atol,
                   double rtol, float corrupt) {
    ag_tensor *dout = analytic(ctx, f, arg, nin, in);
    const float *dd = dout ? dout->data : NULL;
    double worst = 0.0;
    bool corrupted = false;
    for (int i = 0; i < nin; i++) {
        if (!in[i]->requires_grad) continue;
        if (!in[i]->grad) fail_msg("input %s got no gradient", ag_tensor_name(in[i]));
        float *g = in[i]->grad->data;
        if (!corrupted) {
            g[in[i]->numel / 2] += corrupt;
            corrupted = true;
        }
        for (int64_t e = 0; e < in[i]->numel; e++) {
            float *x = &ag_f32(in[i])[e], x0 = *x;
            *x = x0 + (float)h;
            double hp = (double)*x - x0; // the step float32 really took
            double lp = objective(ctx, f, arg, in, dd);
            *x = x0 - (float)h;
            double hm = x0 - (double)*x;
            double lm = objective(ctx, f, arg, in, dd);
            *x = x0;
            double num = (lp - lm) / (hp + hm);
            double err = fabs((double)g[e] - num) / (atol + rtol * fabs(num));
            if (err > worst) worst = err;
        }
    }
    ag_release(dout);
    for (int i = 0; i < nin; i++) ag_zero_grad(in[i]);
    return worst;
}

void ag_fd_check(ag_ctx *ctx, ag_graph_fn f, const void *arg, int nin, ag_tensor **in) {
    double worst = ag_fd_worst(ctx, f, arg, nin, in, 1e-2, 2e-3, 1e-2, 0.0f);
    if (!(worst < 1.0)) fail_msg("gradient differs from central differences: worst error ratio %g", worst);
}

double ag_max_diff(const float *a, const double *b, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

double ag_rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - b[i]);
        d = isnan(x) || x > d ? (isnan(x) ? INFINITY : x) : d;
        m = fabs(b[i]) > m ? fabs(b[i]) : m;
    }
    return m > 0.0 ? d / m : d;
}

float *ag_copy_of(const ag_tensor *t) {
    float *p = malloc((size_t)t->numel * sizeof(float));
    assert_non_null(p);
    memcpy(p, t->data, (size_t)t->numel * sizeof(float));
    return p;
}

void ag_output_and_grads(ag_ctx *ctx, ag_tensor *o, ag_tensor **in, int n, float **res) {
    if (!o) fail_msg("forward: %s", ag_ctx_error(ctx));
    ag_tensor *dout = ag_tensor_new(ctx, o->ndim, o->shape, MP_ACTIVATION, "test:dout");
    ag_fill(dout, 777, -1.0f, 1.0f);
    assert_int_equal(ag_backward_grad(ctx, o, dout), AG_OK);
    res[0] = ag_copy_of(o);
    for (int i = 0; i < n; i++) {
        assert_non_null(in[i]->grad);
        res[i + 1] = ag_copy_of(in[i]->grad);
    }
    ag_release(dout);
    ag_release(o);
    for (int i = 0; i < n; i++) ag_release(in[i]);
}

// C = A·B (both layouts of each operand) split over 1 and 3 threads against double.
static void check_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K) {
    float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(K * N));
    float *C = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++) A[i] = (float)((i * 7919) % 13) / 13.0f - 0.5f;
    for (int64_t i = 0; i < K * N; i++) B[i] = (float)((i * 104729) % 17) / 17.0f - 0.5f;
    int64_t lda = ta == CblasNoTrans ? K : M, ldb = tb == CblasNoTrans ? N : K;
    for (int t = 1; t <= 3; t += 2) {
        ag_set_num_threads(t);
        memset(C, 0, sizeof(float) * (size_t)(M * N));
        ag_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
        double worst = 0;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) {
                    double a = ta == CblasNoTrans ? A[i * K + k] : A[k * M + i];
                    double b = tb == CblasNoTrans ? B[k * N + j] : B[j * K + k];
                    s += a * b;
                }
                double d = s - C[i * N + j];
                worst = d > worst ? d : (-d > worst ? -d : worst);
            }
        assert_true(worst < 1e-5 * (double)K);
    }
    free(A), free(B), free(C);
    ag_set_num_threads(2);
}

void ag_check_sgemm_shapes(void) {
    const int64_t shapes[][3] = {{1000, 33, 70}, {33, 1000, 70}, {97, 161, 300}, {512, 577, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                check_sgemm(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, shapes[s][0], shapes[s][1],
                            shapes[s][2]);
}
