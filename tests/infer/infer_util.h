// Helpers shared by the inference tests: a profiler and context in no-grad mode, models built
// from the golden folders or from a preset, golden id tensors, and the bill checks.
#pragma once

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model.h"

#ifndef MEMBILL_GOLDEN_DIR
#error "MEMBILL_GOLDEN_DIR must name the tests/golden folder"
#endif

typedef struct {
    ag_ctx *ctx;
    llama_model *m;
    llama_st_file *g; // the golden file (golden folders only)
} it_run;

static inline uint64_t it_live(mp_category c) { return mp_get_counter(c).live; }

// Every category that holds tensors, weight excepted, is back at zero.
static inline void it_assert_only_weights(void) {
    const mp_category cats[] = {MP_GRADIENT, MP_OPTIMIZER, MP_ACTIVATION, MP_CACHE};
    for (size_t i = 0; i < sizeof cats / sizeof *cats; i++)
        if (it_live(cats[i]) != 0)
            fail_msg("%s still holds %llu bytes", mp_category_name(cats[i]), (unsigned long long)it_live(cats[i]));
}

static inline void it_path(char *out, size_t len, const char *folder, const char *file) {
    int k = snprintf(out, len, "%s/%s/%s", MEMBILL_GOLDEN_DIR, folder, file);
    assert_true(k > 0 && (size_t)k < len);
}

static inline void it_start(it_run *r, const mp_options *opt) {
    memset(r, 0, sizeof *r);
    assert_int_equal(mp_init(opt), MP_OK);
    r->ctx = ag_ctx_new();
    assert_non_null(r->ctx);
    ag_set_grad_enabled(r->ctx, false);
}

// A golden folder's model (real mode) and its golden file.
static inline void it_open_golden(it_run *r, const char *folder) {
    it_start(r, &(mp_options){0});
    char path[4096];
    llama_config cfg;
    ag_err err = {{0}};
    it_path(path, sizeof path, folder, "config.json");
    if (llama_config_load(&cfg, path, &err) != 0) fail_msg("%s", err.msg);
    if (llama_model_new(&r->m, r->ctx, &cfg, &err) != 0) fail_msg("%s", err.msg);
    it_path(path, sizeof path, folder, "model.safetensors");
    if (llama_model_load(r->m, path, &err) != 0) fail_msg("%s", err.msg);
    it_path(path, sizeof path, folder, "golden.safetensors");
    if (llama_st_open(&r->g, path, &err) != 0) fail_msg("%s", err.msg);
}

// A model of cfg in the given profiler mode (meta: shapes only), randomly initialised.
static inline void it_open_config(it_run *r, const llama_config *cfg, bool meta) {
    it_start(r, &(mp_options){.meta = meta, .keep_timeline = true});
    ag_err err = {{0}};
    if (llama_model_new(&r->m, r->ctx, cfg, &err) != 0) fail_msg("%s", err.msg);
    llama_model_init_random(r->m, 1);
}

static inline void it_close(it_run *r) {
    it_assert_only_weights();
    llama_st_close(r->g);
    llama_model_free(r->m);
    ag_ctx_free(r->ctx);
    assert_int_equal(mp_live_total() - it_live(MP_OTHER), 0);
    mp_shutdown();
}

// An I64 golden tensor [rows, cols] as int32 (malloc'd), its shape checked.
static inline int32_t *it_golden_ids(const it_run *r, const char *key, int64_t rows, int64_t cols) {
    const llama_st_tensor *t = llama_st_find(r->g, key);
    if (!t) fail_msg("golden file lacks %s", key);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], rows);
    assert_int_equal(t->shape[1], cols);
    int64_t *v = malloc((size_t)(rows * cols) * sizeof *v);
    int32_t *out = malloc((size_t)(rows * cols) * sizeof *out);
    assert_non_null(v);
    assert_non_null(out);
    ag_err err = {{0}};
    if (llama_st_read_i64(r->g, t, v, (size_t)(rows * cols), &err) != 0) fail_msg("%s", err.msg);
    for (int64_t i = 0; i < rows * cols; i++) {
        assert_true(v[i] >= 0 && v[i] <= INT32_MAX);
        out[i] = (int32_t)v[i];
    }
    free(v);
    return out;
}

// Fails, showing both, unless got[0..n) equals want[0..n).
static inline void it_assert_ids(const int32_t *got, const int32_t *want, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            char g[512] = "", w[512] = "";
            for (int64_t j = 0; j < n && j < 32; j++) {
                snprintf(g + strlen(g), sizeof g - strlen(g), " %d", got[j]);
                snprintf(w + strlen(w), sizeof w - strlen(w), " %d", want[j]);
            }
            fail_msg("%s: got%s, expected%s (first difference at %lld)", what, g, w, (long long)i);
        }
}

// Fails, showing the message, unless msg holds needle.
static inline void it_mentions(const char *msg, const char *needle) {
    if (!strstr(msg, needle)) fail_msg("message \"%s\" does not mention \"%s\"", msg, needle);
}
