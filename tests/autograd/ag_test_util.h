// Helpers shared by the autograd tests: profiler set-up, seeded data, finite differences.
#pragma once

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>

#include <cmocka.h>

#include "autograd.h"

// mp_init (real mode, or meta) and a fresh context; teardown checks every category is back
// at zero after the test released what it made.
typedef struct {
    ag_ctx *ctx;
} ag_fixture;
int ag_setup(void **state);
int ag_setup_meta(void **state);
int ag_teardown(void **state);
ag_ctx *ag_fixture_ctx(void **state);
void ag_assert_all_zero(void); // every category's live bytes

// Deterministic uniform values in [lo, hi) (splitmix64 of seed and index).
void ag_fill(ag_tensor *t, uint64_t seed, float lo, float hi);
ag_tensor *ag_test_param(ag_ctx *ctx, int ndim, const int64_t *shape, const char *name, uint64_t seed);
ag_tensor *ag_test_const(ag_ctx *ctx, int ndim, const int64_t *shape, const char *name, uint64_t seed);

// ag_sgemm at awkward shapes (rows or columns split over the pool, past the small-product path),
// every transpose, on 1 and 3 threads, against double; leaves 2 threads set.
void ag_check_sgemm_shapes(void);

// A tensor shaped like `like`, all ones (category activation).
ag_tensor *ag_test_ones(ag_ctx *ctx, const ag_tensor *like);

// A graph under test: builds its output from the inputs (leaves).
typedef ag_tensor *(*ag_graph_fn)(ag_ctx *ctx, ag_tensor **in, const void *arg);

// Runs the graph under grad mode, backward with a seeded random d(out) (or 1 for a one-element
// output), and compares each input's .grad that requires grad with central differences of
// L = Σ out · d(out) in double precision. Returns the worst |analytic - numeric| divided by
// (atol + rtol |numeric|): below 1 passes. `corrupt` is added to one analytic gradient
// element first, so that a test can prove the checker catches a wrong gradient.
double ag_fd_worst(ag_ctx *ctx, ag_graph_fn f, const void *arg, int nin, ag_tensor **in, double h, double atol,
                   double rtol, float corrupt);
// The same, asserting that every gradient passes.
void ag_fd_check(ag_ctx *ctx, ag_graph_fn f, const void *arg, int nin, ag_tensor **in);

// Largest |a - b| over n elements.
double ag_max_diff(const float *a, const double *b, int64_t n);
// max |a - b| / max |b| (a NaN counts as infinite).
double ag_rel_diff(const float *a, const float *b, int64_t n);
// A malloc'd copy of t's data (the caller frees it).
float *ag_copy_of(const ag_tensor *t);
// Backward from o with a seeded random d(o); res[0] gets a copy of o, res[1 + i] of in[i]'s
// gradient; o and the n inputs are released.
void ag_output_and_grads(ag_ctx *ctx, ag_tensor *o, ag_tensor **in, int n, float **res);
