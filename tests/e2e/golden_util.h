// Reading the golden files of tests/golden (written by tests/reference/*.py) in the end-to-end
// tests: paths, tensors as float32, the batch's ids, and the scaled difference tensors are
// compared by. Include after <cmocka.h> and "model.h"; MEMBILL_GOLDEN_DIR names the folder.
#pragma once

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef MEMBILL_GOLDEN_DIR
#error "MEMBILL_GOLDEN_DIR must name the tests/golden folder"
#endif

static inline void golden_path(char *out, size_t len, const char *folder, const char *file) {
    int k = snprintf(out, len, "%s/%s/%s", MEMBILL_GOLDEN_DIR, folder, file);
    assert_true(k > 0 && (size_t)k < len);
}

static inline llama_st_file *golden_open_file(const char *folder, const char *file) {
    char path[4096];
    golden_path(path, sizeof path, folder, file);
    llama_st_file *f = NULL;
    ag_err err = {{0}};
    if (llama_st_open(&f, path, &err) != 0) fail_msg("%s", err.msg);
    return f;
}

// The tensor `key` as float32 (malloc'd); fails the test if absent.
static inline float *golden_f32(const llama_st_file *g, const char *key, size_t *n) {
    const llama_st_tensor *t = llama_st_find(g, key);
    if (!t) fail_msg("golden file %s lacks %s", llama_st_path(g), key);
    float *v = malloc(t->numel ? t->numel * sizeof(float) : 1);
    assert_non_null(v);
    ag_err err = {{0}};
    if (llama_st_read_f32(g, t, v, t->numel, &err) != 0) fail_msg("%s", err.msg);
    *n = t->numel;
    return v;
}

// input_ids: I64 [B, T] into int32.
static inline void golden_ids_of(const llama_st_file *g, int32_t *ids, int64_t B, int64_t T) {
    const llama_st_tensor *t = llama_st_find(g, "input_ids");
    assert_non_null(t);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], B);
    assert_int_equal(t->shape[1], T);
    int64_t *v = malloc((size_t)(B * T) * sizeof *v);
    assert_non_null(v);
    ag_err err = {{0}};
    if (llama_st_read_i64(g, t, v, (size_t)(B * T), &err) != 0) fail_msg("%s", err.msg);
    for (int64_t i = 0; i < B * T; i++) {
        assert_true(v[i] >= 0 && v[i] <= INT32_MAX);
        ids[i] = (int32_t)v[i];
    }
    free(v);
}

// max|got - want| / max|want| (or the absolute difference when want is all zeros); NaN wins.
static inline double scaled_diff(const float *got, const float *want, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= diff)) diff = d;
        if (fabs((double)want[i]) > scale) scale = fabs((double)want[i]);
    }
    return scale > 0 ? diff / scale : diff;
}
