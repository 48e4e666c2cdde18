// NF4 as bitsandbytes stores it (autograd/kernels/ag_nf4.h): the code values, the dynamic map, the
// quantised bytes and the dequantised values against tests/reference/nf4_ref.py's restatement of
// bitsandbytes' reference kernels; the round trip's error bound; the byte count per tensor; the
// bill of meta mode's NF4 weights.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/ag_nf4.h"
#include "model.h"

#ifndef MEMBILL_GOLDEN_DIR
#error "MEMBILL_GOLDEN_DIR must name the tests/golden folder"
#endif

static void *read_f32(const llama_st_file *g, const char *key, size_t *n) {
    const llama_st_tensor *t = llama_st_find(g, key);
    if (!t) fail_msg("golden lacks %s", key);
    float *v = malloc(t->numel * sizeof *v);
    ag_err err = {{0}};
    if (llama_st_read_f32(g, t, v, t->numel, &err) != 0) fail_msg("%s", err.msg);
    *n = t->numel;
    return v;
}

static int64_t *read_i64(const llama_st_file *g, const char *key, size_t *n) {
    const llama_st_tensor *t = llama_st_find(g, key);
    if (!t) fail_msg("golden lacks %s", key);
    int64_t *v = malloc(t->numel * sizeof *v);
    ag_err err = {{0}};
    if (llama_st_read_i64(g, t, v, t->numel, &err) != 0) fail_msg("%s", err.msg);
    *n = t->numel;
    return v;
}

static llama_st_file *open_golden(void) {
    llama_st_file *g = NULL;
    ag_err err = {{0}};
    if (llama_st_open(&g, MEMBILL_GOLDEN_DIR "/nf4/golden.safetensors", &err) != 0) fail_msg("%s", err.msg);
    return g;
}

// The two code tables, value for value.
static void test_codes(void **s) {
    (void)s;
    llama_st_file *g = open_golden();
    size_t n;
    float *c4 = read_f32(g, "code4", &n), *c2 = read_f32(g, "code2", &n);
    assert_int_equal(n, 256);
    for (int i = 0; i < 16; i++) assert_true(ag_nf4_code[i] == c4[i]);
    float mine[256];
    ag_dynamic_map(mine);
    // torch.linspace's vectorised kernel rounds some fractions an ulp or two away from the plain
    // formula (which values depends on the SIMD width PyTorch runs at): within a few ulps.
    for (int i = 0; i < 256; i++)
        if (fabsf(mine[i] - c2[i]) > 3e-7f * fabsf(c2[i]))
            fail_msg("dynamic map [%d]: %.9g, bitsandbytes %.9g", i, (double)mine[i], (double)c2[i]);
    free(c4), free(c2);
    llama_st_close(g);
}

// Quantised bytes equal bitsandbytes', and so are the values they give back.
static void test_against_bitsandbytes(void **s) {
    (void)s;
    llama_st_file *g = open_golden();
    size_t n, k;
    float *x = read_f32(g, "x", &n);
    ag_nf4_layout l = ag_nf4_layout_of(n);
    int64_t *packed = read_i64(g, "packed", &k);
    assert_int_equal(k, l.packed);
    int64_t *qabs = read_i64(g, "qabsmax", &k);
    assert_int_equal(k, l.blocks);
    float *absmax2 = read_f32(g, "absmax2", &k);
    assert_int_equal(k, l.blocks2);
    float *offset = read_f32(g, "offset", &k), *deq = read_f32(g, "dequantized", &k);
    uint8_t *p = malloc(l.packed), *q = malloc(l.blocks);
    float *a2 = malloc(l.blocks2 * sizeof *a2), off, *back = malloc(n * sizeof *back);
    assert_true(ag_nf4_quantize(x, (int64_t)n, p, q, a2, &off));
    assert_true(fabsf(off - offset[0]) <= 1e-6f * fabsf(offset[0]));
    for (size_t i = 0; i < l.blocks2; i++) assert_true(fabsf(a2[i] - absmax2[i]) <= 1e-6f * fabsf(absmax2[i]));
    size_t bad4 = 0, bad8 = 0;
    for (size_t i = 0; i < l.packed; i++) bad4 += p[i] != (uint8_t)packed[i];
    for (size_t i = 0; i < l.blocks; i++) bad8 += q[i] != (uint8_t)qabs[i];
    if (bad4 || bad8) fail_msg("%zu packed bytes and %zu absmax codes differ from bitsandbytes'", bad4, bad8);
    ag_nf4_dequantize(p, q, a2, off, (int64_t)n, back);
    for (size_t i = 0; i < n; i++)
        if (fabsf(back[i] - deq[i]) > 1e-6f * fabsf(deq[i]) + 1e-12f)
            fail_msg("dequantised [%zu]: %.9g, bitsandbytes %.9g", i, (double)back[i], (double)deq[i]);
    free(x), free(packed), free(qabs), free(absmax2), free(offset), free(deq), free(p), free(q), free(a2), free(back);
    llama_st_close(g);
}

// Each value comes back within half the widest gap of the NF4 table times its block's absmax
// (0.152 x absmax: between -1 and -0.696), plus what the 8-bit absmax loses (a block's absmax is
// off by at most half a step of the dynamic map near 1, times the block-of-256's absmax).
static void test_round_trip_bound(void **s) {
    (void)s;
    const int64_t n = 64 * 1000 + 5;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    uint64_t st = 12345;
    for (int64_t i = 0; i < n; i++) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        x[i] = ((float)(st >> 40) * 0x1p-24f - 0.5f) * (i % 64 == 3 ? 1.0f : 0.05f);
    }
    ag_nf4_layout l = ag_nf4_layout_of((uint64_t)n);
    uint8_t *p = malloc(l.packed), *q = malloc(l.blocks);
    float *a2 = malloc(l.blocks2 * sizeof *a2), off;
    assert_true(ag_nf4_quantize(x, n, p, q, a2, &off));
    ag_nf4_dequantize(p, q, a2, off, n, y);
    double worst = 0;
    for (int64_t b0 = 0; b0 < n; b0 += 64) {
        float am = 0;
        int64_t e = b0 + 64 < n ? b0 + 64 : n;
        for (int64_t i = b0; i < e; i++) am = fmaxf(am, fabsf(x[i]));
        const double bound = 0.1520 * am + 0.0081 * a2[(b0 / 64) / 256] * 1.0001;
        for (int64_t i = b0; i < e; i++) worst = fmax(worst, fabs(x[i] - y[i]) / bound);
    }
    assert_true(worst <= 1.0);
    assert_true(worst > 0.3); // the bound is not loose to the point of proving nothing
    free(x), free(y), free(p), free(q), free(a2);
}

// The bytes per tensor: 4 bits a value, a byte per 64, a float per 64 x 256, and the QuantState's
// own tensors; the paper's 4.127 bits a parameter for a large tensor.
static void test_layout_bytes(void **s) {
    (void)s;
    ag_nf4_layout l = ag_nf4_layout_of(4096ULL * 4096ULL);
    assert_int_equal(l.packed, 8388608);
    assert_int_equal(l.blocks, 262144);
    assert_int_equal(l.blocks2, 1024);
    assert_int_equal(l.absmax2, 4096);
    assert_int_equal(l.total, 8388608 + 262144 + 4096 + 4 + 64 + 1024);
    double bits = 8.0 * (double)l.paper / (4096.0 * 4096.0);
    assert_true(fabs(bits - 4.127) < 0.0005);
    ag_nf4_layout odd = ag_nf4_layout_of(64 * 257 + 1); // a partial block at both levels
    assert_int_equal(odd.packed, (64 * 257 + 2) / 2);
    assert_int_equal(odd.blocks, 258);
    assert_int_equal(odd.blocks2, 2);
}

// Meta mode bills an NF4 weight matrix at that layout's bytes, a vector at the activations' size.
static void test_meta_bill(void **s) {
    (void)s;
    assert_int_equal(mp_init(&(mp_options){.meta = true}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    ag_precision d = ag_precision_f32();
    d.weight_bits = 4, d.nf4 = true, d.act_bits = 16;
    assert_true(ag_ctx_set_precision(ctx, &d));
    ag_tensor *w = ag_param_new(ctx, 2, (int64_t[]){576, 1536}, "w");
    ag_tensor *v = ag_param_new(ctx, 1, (int64_t[]){576}, "v");
    assert_int_equal(mp_get_counter(MP_WEIGHT).live, ag_nf4_layout_of(576 * 1536).total + 576 * 2);
    ag_release(w), ag_release(v);
    d.group = 64; // NF4 has its own blocks
    assert_false(ag_ctx_set_precision(ctx, &d));
    ag_ctx_free(ctx);
    mp_shutdown();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codes),
        cmocka_unit_test(test_against_bitsandbytes),
        cmocka_unit_test(test_round_trip_bound),
        cmocka_unit_test(test_layout_bytes),
        cmocka_unit_test(test_meta_bill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
