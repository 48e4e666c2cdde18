// The KV cache's bill to the byte: 2 x layers x kv_heads x head_dim x tokens x batch x 4 after
// the prefill and after each decode step, read from the profiler's cache counter, from each
// layer's cache, and from the step callback; the claims' SmolLM2-135M figures in meta mode
// (K1-K5, A2); everything but the weights given back at the end; bad input refused.
#include "infer_util.h"

// 2 x layers x kv_heads x head_dim x 4: the bytes of one token of one row, from the config.
static uint64_t per_token(const llama_config *c) {
    return 2ull * (uint64_t)c->layers * (uint64_t)c->kv_heads * (uint64_t)c->head_dim * 4ull;
}

// What the step callback sees, checked against each layer's own cache.
typedef struct {
    const llama_config *c;
    int64_t B, T;
    int64_t calls;
    uint64_t cache_live; // mp's counter read inside the callback
} watch;

static void on_step(void *user, const llama_generate_step *s) {
    watch *w = user;
    assert_int_equal(s->step, w->calls);
    w->calls++;
    w->cache_live = it_live(MP_CACHE);
    assert_int_equal(s->cache_bytes, w->cache_live);
    if (!s->cache) {
        assert_int_equal(w->cache_live, 0);
        assert_int_equal(s->positions, w->T + s->step);
        return;
    }
    assert_int_equal(s->positions, s->step == 0 ? w->T : 1);
    uint64_t sum = 0, usable = 0;
    for (int64_t i = 0; i < w->c->layers; i++) {
        int64_t shape[4];
        ag_kv_cache_shape(s->cache[i], shape);
        assert_int_equal(shape[0], w->B);
        assert_int_equal(shape[1], w->c->kv_heads);
        assert_int_equal(shape[2], w->T + s->step);
        assert_int_equal(shape[3], w->c->head_dim);
        assert_int_equal(ag_kv_cache_chunks(s->cache[i]), s->step + 1); // one chunk per forward
        uint64_t u;
        sum += ag_kv_cache_bytes(s->cache[i], &u);
        usable += u;
    }
    assert_int_equal(sum, w->cache_live);
    assert_int_equal(usable, mp_get_counter(MP_CACHE).live_usable);
    assert_int_equal(s->cache_usable, usable);
    assert_true(usable >= sum);
}

// Generates n tokens after a prompt of T ids (batch B, id 1 + position) and checks the cache
// bill after every forward; returns the stats (to be freed by the caller).
static void run_checked(it_run *r, bool cache, int64_t B, int64_t T, int64_t n, llama_generate_stats *st) {
    const llama_config *c = &r->m->cfg;
    int32_t *ids = malloc((size_t)(B * T) * sizeof *ids), *out = malloc((size_t)(B * n) * sizeof *out);
    assert_non_null(ids);
    assert_non_null(out);
    for (int64_t i = 0; i < B * T; i++) ids[i] = (int32_t)(1 + i % (c->vocab - 1));
    watch w = {.c = c, .B = B, .T = T};
    llama_generate_opts o = {.use_cache = cache, .on_step = on_step, .user = &w};
    ag_err err = {{0}};
    if (llama_generate(r->ctx, r->m, &o, ids, NULL, B, T, n, out, st, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(w.calls, n);
    assert_int_equal(st->steps, n);
    for (int64_t k = 0; k < n; k++) {
        uint64_t want = cache ? per_token(c) * (uint64_t)((T + k) * B) : 0;
        assert_int_equal(st->cache_bytes[k], want);
        assert_int_equal(st->cache_shape[k][2], cache ? T + k : 0);
        if (k > 0 && cache) assert_int_equal(st->cache_bytes[k] - st->cache_bytes[k - 1], per_token(c) * (uint64_t)B);
    }
    it_assert_only_weights();
    free(ids);
    free(out);
}

static void tiny_config(llama_config *c) {
    char path[4096];
    ag_err err = {{0}};
    it_path(path, sizeof path, "tiny_tied", "config.json");
    if (llama_config_load(c, path, &err) != 0) fail_msg("%s", err.msg);
}

// The tiny model, real mode: 2 x 2 layers x 2 kv heads x 16 x 4 = 512 bytes a token.
static void test_tiny_bytes(void **s) {
    (void)s;
    llama_config c;
    tiny_config(&c);
    assert_int_equal(per_token(&c), 512);
    it_run r;
    it_open_config(&r, &c, false);
    llama_generate_stats st;
    run_checked(&r, true, 1, 7, 5, &st);
    assert_int_equal(st.cache_bytes[0], 3584); // 7 tokens
    llama_generate_stats_free(&st);
    run_checked(&r, true, 3, 7, 4, &st);
    assert_int_equal(st.cache_bytes[3], 512 * 10 * 3);
    llama_generate_stats_free(&st);
    mp_reset_peaks();
    run_checked(&r, false, 2, 5, 4, &st); // no cache: nothing ever billed to it
    assert_int_equal(mp_get_counter(MP_CACHE).peak, 0);
    assert_true(mp_get_counter(MP_ACTIVATION).peak > 0);
    llama_generate_stats_free(&st);
    it_close(&r);
}

static void smollm2(llama_config *c) {
    ag_err err = {{0}};
    if (llama_config_preset(c, "smollm2-135m", &err) != 0) fail_msg("%s", err.msg);
}

// The bytes of the timeline's allocations at `site` in `phase`, summed; *count gets how many.
static uint64_t timeline_allocs(const char *site, mp_phase phase, size_t *count) {
    uint64_t bytes = 0;
    *count = 0;
    for (size_t i = 0; i < mp_timeline_count(); i++) {
        const mp_event *e = mp_timeline_get(i);
        if (e->bytes > 0 && e->phase == phase && strcmp(mp_site_name(e->site), site) == 0) {
            bytes += (uint64_t)e->bytes;
            (*count)++;
        }
    }
    return bytes;
}

// K1-K3 and A2 on SmolLM2-135M (meta mode: the same allocations as a real run).
static void test_smollm2_claims(void **s) {
    (void)s;
    llama_config c;
    smollm2(&c);
    assert_int_equal(per_token(&c), 46080); // K1
    it_run r;
    it_open_config(&r, &c, true);
    llama_generate_stats st;
    run_checked(&r, true, 1, 25, 3, &st);
    assert_int_equal(st.cache_bytes[0], 1152000); // K2
    int64_t k2[4] = {1, 3, 25, 64}, k3[4] = {1, 3, 26, 64};
    assert_memory_equal(st.cache_shape[0], k2, sizeof k2);
    assert_memory_equal(st.cache_shape[1], k3, sizeof k3); // K3
    assert_int_equal(st.cache_bytes[1], 1152000 + 46080);
    assert_int_equal(st.cache_bytes[2], 1152000 + 2 * 46080);
    // A2: the prefill's logits cover every position, (1, 25, 49152) floats, and are the
    // activation at the prefill's peak; decode's cover the last position only.
    size_t n;
    assert_int_equal(timeline_allocs("lm_head:logits", MP_PHASE_PREFILL, &n), 4915200);
    assert_int_equal(n, 1);
    assert_int_equal(timeline_allocs("lm_head:logits", MP_PHASE_DECODE, &n), 2 * 196608);
    assert_int_equal(n, 2);
    // Activations are freed block by block: at the prefill's peak only the final norm's output
    // (A1: 1 x 25 x 576 floats) and the logits are live; at a decode step's, the same for one
    // position.
    mp_phase_stats ps = mp_get_phase_stats(MP_PHASE_PREFILL);
    assert_string_equal(mp_site_name(ps.at_peak.site), "lm_head:logits");
    assert_int_equal(ps.at_peak.bytes[MP_ACTIVATION], 4915200 + 57600);
    assert_int_equal(ps.at_peak.bytes[MP_CACHE], 1152000);
    assert_int_equal(ps.at_peak.bytes[MP_WEIGHT], 538060032);
    ps = mp_get_phase_stats(MP_PHASE_DECODE);
    assert_string_equal(mp_site_name(ps.at_peak.site), "lm_head:logits");
    assert_int_equal(ps.at_peak.bytes[MP_ACTIVATION], (49152 + 576) * 4);
    assert_int_equal(ps.at_peak.bytes[MP_CACHE], 1152000 + 2 * 46080);
    // One chunk per forward and layer, labelled by its block: the prompt's keys of block 29,
    // (1, 3, 25, 64) floats, then one token's, (1, 3, 1, 64).
    assert_int_equal(timeline_allocs("layers.29.self_attn:k_cache", MP_PHASE_PREFILL, &n), 19200);
    assert_int_equal(n, 1);
    assert_int_equal(timeline_allocs("layers.29.self_attn:v_cache", MP_PHASE_DECODE, &n), 2 * 768);
    assert_int_equal(n, 2);
    // Each cache chunk is one allocation: 30 layers x (k, v) x 3 forwards, never a copy.
    assert_int_equal(mp_get_counter(MP_CACHE).allocations, 180);
    assert_int_equal(mp_get_counter(MP_CACHE).peak, 1152000 + 2 * 46080);
    llama_generate_stats_free(&st);
    it_close(&r);
}

// K4: 1,024 tokens, then 8,192 (every position of the preset: the last new token is chosen,
// never run through the model, so a prompt of 8,191 tokens and 2 new tokens fit).
static void test_smollm2_long(void **s) {
    (void)s;
    llama_config c;
    smollm2(&c);
    it_run r;
    it_open_config(&r, &c, true);
    llama_generate_stats st;
    run_checked(&r, true, 1, 1024, 1, &st);
    assert_int_equal(st.cache_bytes[0], 47185920);
    llama_generate_stats_free(&st);
    run_checked(&r, true, 1, 8191, 2, &st);
    assert_int_equal(st.cache_bytes[1], 377487360);
    llama_generate_stats_free(&st);
    it_close(&r);
}

// K5: 9 key-value heads instead of 3 (no GQA) triples the cache.
static void test_smollm2_mha(void **s) {
    (void)s;
    llama_config c;
    smollm2(&c);
    c.kv_heads = 9;
    it_run r;
    it_open_config(&r, &c, true);
    llama_generate_stats st;
    run_checked(&r, true, 1, 25, 2, &st);
    assert_int_equal(st.cache_bytes[1] - st.cache_bytes[0], 138240);
    assert_int_equal(st.cache_bytes[0], 25 * 138240);
    llama_generate_stats_free(&st);
    it_close(&r);
}

// A batch of 2 in meta mode: twice the bytes per token; the phases were entered.
static void test_smollm2_batch(void **s) {
    (void)s;
    llama_config c;
    smollm2(&c);
    it_run r;
    it_open_config(&r, &c, true);
    llama_generate_stats st;
    run_checked(&r, true, 2, 25, 3, &st);
    assert_int_equal(st.cache_bytes[0], 2 * 1152000);
    assert_int_equal(mp_get_phase_stats(MP_PHASE_PREFILL).entries, 1);
    assert_int_equal(mp_get_phase_stats(MP_PHASE_DECODE).entries, 1);
    llama_generate_stats_free(&st);
    it_close(&r);
}

// Bad input: one clear message, nothing allocated, the context still usable.
static void expect_error(it_run *r, const int32_t *ids, const int32_t *mask, int64_t B, int64_t T, int64_t n,
                         const char *needle) {
    int32_t out[256];
    ag_err err = {{0}};
    llama_generate_stats st;
    assert_int_equal(llama_generate(r->ctx, r->m, NULL, ids, mask, B, T, n, out, &st, &err), -1);
    it_mentions(err.msg, needle);
    assert_int_equal(st.steps, 0);
    llama_generate_stats_free(&st);
    it_assert_only_weights();
    assert_int_equal(ag_ctx_status(r->ctx), AG_OK);
}

static void test_bad_input(void **s) {
    (void)s;
    llama_config c;
    tiny_config(&c);
    it_run r;
    it_open_config(&r, &c, false);
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t bad_ids[4] = {1, 2, 256, 3};
    expect_error(&r, bad_ids, NULL, 1, 4, 2, "token id 256 at position 2 is out of range");
    expect_error(&r, ids, NULL, 1, 4, 126, "max_position_embeddings (128)"); // 4 + 125 > 128
    expect_error(&r, ids, NULL, 1, 4, 0, "at least 1 new token");
    int32_t all_pads[8] = {1, 1, 1, 1, 0, 0, 0, 0};
    expect_error(&r, ids, all_pads, 2, 4, 2, "row 1 is all pads");
    int32_t right_pad[4] = {1, 1, 1, 0};
    expect_error(&r, ids, right_pad, 1, 4, 2, "left-padded");
    int32_t two[4] = {0, 2, 1, 1};
    expect_error(&r, ids, two, 1, 4, 2, "column 1: 2, expected 0 (pad) or 1");
    ag_set_grad_enabled(r.ctx, true);
    expect_error(&r, ids, NULL, 1, 4, 2, "grad mode is on");
    ag_set_grad_enabled(r.ctx, false);
    // The same context then runs.
    int32_t out[2];
    ag_err err = {{0}};
    assert_int_equal(llama_generate(r.ctx, r.m, NULL, ids, NULL, 1, 4, 2, out, NULL, &err), 0);
    it_close(&r);
}

// The tokens run through the model (prompt + new tokens - 1) may fill max_position_embeddings.
static void test_max_positions(void **s) {
    (void)s;
    llama_config c;
    tiny_config(&c);
    it_run r;
    it_open_config(&r, &c, false);
    int32_t ids[120], out[10];
    for (int i = 0; i < 120; i++) ids[i] = i + 1;
    ag_err err = {{0}};
    assert_int_equal(llama_generate(r.ctx, r.m, NULL, ids, NULL, 1, 120, 9, out, NULL, &err), 0);
    assert_int_equal(llama_generate(r.ctx, r.m, NULL, ids, NULL, 1, 120, 10, out, NULL, &err), -1);
    it_mentions(err.msg, "max_position_embeddings (128)");
    it_close(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_bytes),    cmocka_unit_test(test_smollm2_claims),
        cmocka_unit_test(test_smollm2_long),  cmocka_unit_test(test_smollm2_mha),
        cmocka_unit_test(test_smollm2_batch), cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_max_positions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
