// The seeded random init: normal(0, 0.02) matrices, norms at 1, the same values for the same
// seed whatever the thread count, different values for another seed.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

static llama_model *make(ag_ctx *ctx, uint64_t seed) {
    llama_config c;
    ag_err err;
    assert_int_equal(llama_config_preset(&c, "smollm2-135m", &err), 0);
    c.layers = 2; // keeps the test quick; the shapes are the real ones
    llama_model *m = NULL;
    assert_int_equal(llama_model_new(&m, ctx, &c, &err), 0);
    llama_model_init_random(m, seed);
    return m;
}

static void test_init_statistics(void **state) {
    (void)state;
    mp_options o = {0};
    assert_int_equal(mp_init(&o), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    ag_set_num_threads(2);
    llama_model *m = make(ctx, 7);
    double sum = 0, sq = 0, beyond3 = 0;
    int64_t n = m->embed->numel;
    for (int64_t i = 0; i < n; i++) {
        double v = ag_f32(m->embed)[i];
        sum += v;
        sq += v * v;
        beyond3 += fabs(v) > 3 * 0.02;
    }
    double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
    assert_true(fabs(mean) < 1e-4);
    assert_true(fabs(sd - 0.02) < 2e-4);
    assert_true(fabs(beyond3 / (double)n - 0.0027) < 0.0005); // a normal's tails, not a uniform's
    for (int64_t i = 0; i < m->norm->numel; i++) assert_true(ag_f32(m->norm)[i] == 1.0f);

    // Same seed, another thread count: the same values; another seed: different ones.
    ag_set_num_threads(1);
    llama_model *same = make(ctx, 7), *other = make(ctx, 8);
    ag_set_num_threads(2);
    assert_memory_equal(same->layers[1].down->data, m->layers[1].down->data, (size_t)m->layers[1].down->numel * 4);
    assert_true(memcmp(other->embed->data, m->embed->data, 4096) != 0);
    llama_model_free(m);
    llama_model_free(same);
    llama_model_free(other);
    ag_ctx_free(ctx);
    for (int c = 0; c < MP_OTHER; c++) assert_int_equal(mp_get_counter(c).live, 0);
    mp_shutdown();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_init_statistics)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
