// Safetensors: writing and reading back, dtype conversion, integer tensors, parameters against
// a config, failed writes, and --weights resolution.
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>

#include "model.h"
#include "test_util.h"

// ---------------------------------------------------------------------------------------------
// Round trip through the writer

static void test_roundtrip(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[8192];
    tu_path(path, sizeof path, dir, "w.safetensors");
    float a[6] = {1.5f, -0.0f, INFINITY, 1e-45f, -3.25e38f, NAN};
    float b[5] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
    float s[1] = {42.0f};
    const char *names[] = {"a", "b.weight", "scalar", "empty"};
    const int ndims[] = {2, 1, 0, 2};
    const int64_t shapes[][4] = {{2, 3}, {5}, {0}, {0, 4}};
    const float *data[] = {a, b, s, NULL};
    ag_err err = {{0}};
    assert_int_equal(tu_write_f32(path, 4, names, ndims, shapes, data, &err), 0);
    assert_int_equal(tu_count_entries(dir), 1); // no temporary file left

    // layout: header length a multiple of 8, then exactly the data
    size_t len;
    unsigned char *raw = tu_read(path, &len);
    uint64_t hlen = tu_get_le(raw, 8);
    assert_int_equal(hlen % 8, 0);
    assert_int_equal(len, 8 + hlen + 4 * (6 + 5 + 1));
    free(raw);

    llama_st_file *f;
    assert_int_equal(llama_st_open(&f, path, &err), 0);
    assert_string_equal(llama_st_path(f), path);
    assert_int_equal(llama_st_count(f), 4);
    const llama_st_tensor *t = llama_st_find(f, "a");
    assert_non_null(t);
    assert_int_equal(t->dtype, LLAMA_ST_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->numel, 6);
    assert_int_equal(t->nbytes, 24);
    float back[6];
    assert_int_equal(llama_st_read_f32(f, t, back, 6, &err), 0);
    assert_memory_equal(back, a, sizeof a); // bit for bit, -0 and NaN included
    t = llama_st_find(f, "b.weight");
    assert_non_null(t);
    assert_int_equal(llama_st_read_f32(f, t, back, 5, &err), 0);
    assert_memory_equal(back, b, sizeof b);
    t = llama_st_find(f, "scalar");
    assert_non_null(t);
    assert_int_equal(t->ndim, 0);
    assert_int_equal(t->numel, 1);
    assert_int_equal(llama_st_read_f32(f, t, back, 1, &err), 0);
    assert_true(back[0] == 42.0f);
    t = llama_st_find(f, "empty");
    assert_non_null(t);
    assert_int_equal(t->numel, 0);
    assert_int_equal(llama_st_read_f32(f, t, NULL, 0, &err), 0);
    assert_null(llama_st_find(f, "__metadata__"));
    assert_null(llama_st_find(f, "c"));
    assert_null(llama_st_get(f, 4));
    // listed in data order
    for (size_t i = 1; i < llama_st_count(f); i++)
        assert_true(llama_st_get(f, i - 1)->offset <= llama_st_get(f, i)->offset);
    // a wrong destination size is refused, naming the tensor
    assert_int_equal(llama_st_read_f32(f, llama_st_find(f, "a"), back, 5, &err), -1);
    TU_MENTIONS(err.msg, "w.safetensors", "tensor a", "6 elements");
    llama_st_close(f);

    // overwriting an existing file replaces it
    const float *data2[] = {b};
    const int64_t shapes2[][4] = {{5}};
    const int nd2[] = {1};
    assert_int_equal(tu_write_f32(path, 1, names + 1, nd2, shapes2, data2, &err), 0);
    assert_int_equal(llama_st_open(&f, path, &err), 0);
    assert_int_equal(llama_st_count(f), 1);
    llama_st_close(f);
    tu_rmtree(dir);
}

// ---------------------------------------------------------------------------------------------
// Dtype conversion on files built byte by byte

// A file holding one 1-D tensor "x" of the given dtype and n 16-bit values.
static void write_16bit(const char *path, const char *dtype, const uint16_t *v, size_t n) {
    char header[256];
    snprintf(header, sizeof header,
             "{\"__metadata__\":{\"format\":\"pt\"},\"x\":{\"dtype\":\"%s\",\"shape\":[%zu],"
             "\"data_offsets\":[0,%zu]}}",
             dtype, n, 2 * n);
    unsigned char *bytes = malloc(2 * n);
    assert_non_null(bytes);
    for (size_t i = 0; i < n; i++) tu_put_le(bytes + 2 * i, v[i], 2);
    tu_write_st(path, strlen(header), header, bytes, 2 * n);
    free(bytes);
}

static float *read_x(const char *path, size_t n) {
    llama_st_file *f;
    ag_err err = {{0}};
    assert_int_equal(llama_st_open(&f, path, &err), 0);
    const llama_st_tensor *t = llama_st_find(f, "x");
    assert_non_null(t);
    float *out = malloc(n * sizeof *out);
    assert_non_null(out);
    assert_int_equal(llama_st_read_f32(f, t, out, n, &err), 0);
    llama_st_close(f);
    return out;
}

static void test_known_values(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[8192];
    tu_path(path, sizeof path, dir, "h.safetensors");
    // IEEE half: 1, -2, 65504 (largest), 2^-24 (smallest subnormal), 1023 * 2^-24 (largest
    // subnormal), 2^-14 (smallest normal), 0x3555 = 1365/4096, -0
    const uint16_t h[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x03FF, 0x0400, 0x3555, 0x8000};
    const float hf[] = {1.0f, -2.0f, 65504.0f, 0x1p-24f, 1023 * 0x1p-24f, 0x1p-14f, 1365.0f / 4096.0f, -0.0f};
    write_16bit(path, "F16", h, 8);
    float *got = read_x(path, 8);
    assert_memory_equal(got, hf, sizeof hf);
    free(got);
    // bfloat16: 1, pi rounded (3.140625), -123.5, -0
    const uint16_t bf[] = {0x3F80, 0x4049, 0xC2F7, 0x8000};
    const float bff[] = {1.0f, 3.140625f, -123.5f, -0.0f};
    write_16bit(path, "BF16", bf, 4);
    got = read_x(path, 4);
    assert_memory_equal(got, bff, sizeof bff);
    free(got);
    tu_rmtree(dir);
}

// Every half value against the definition: (-1)^s 2^(e-15) (1 + m/1024), subnormals
// (-1)^s 2^-14 (m/1024).
static void test_f16_exhaustive(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[8192];
    tu_path(path, sizeof path, dir, "h.safetensors");
    uint16_t *v = malloc(65536 * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < 65536; i++) v[i] = (uint16_t)i;
    write_16bit(path, "F16", v, 65536);
    float *got = read_x(path, 65536);
    for (size_t i = 0; i < 65536; i++) {
        int sign = (int)(i >> 15), e = (int)((i >> 10) & 31), m = (int)(i & 1023);
        double want = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
        if (e == 31) {
            assert_true(m ? isnan(got[i]) : isinf(got[i]));
        } else {
            if (got[i] != (sign ? -want : want)) fail_msg("half 0x%04zx: %g", i, (double)got[i]);
        }
        assert_int_equal(!!signbit(got[i]), sign);
    }
    free(got);
    free(v);
    tu_rmtree(dir);
}

// Every bfloat16 against the definition: (-1)^s 2^(e-127) (1 + m/128), subnormals
// (-1)^s 2^-126 (m/128).
static void test_bf16_exhaustive(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[8192];
    tu_path(path, sizeof path, dir, "b.safetensors");
    uint16_t *v = malloc(65536 * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < 65536; i++) v[i] = (uint16_t)i;
    write_16bit(path, "BF16", v, 65536);
    float *got = read_x(path, 65536);
    for (size_t i = 0; i < 65536; i++) {
        int sign = (int)(i >> 15), e = (int)((i >> 7) & 255), m = (int)(i & 127);
        double want = e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
        if (e == 255) {
            assert_true(m ? isnan(got[i]) : isinf(got[i]));
        } else {
            if (got[i] != (sign ? -want : want)) fail_msg("bf16 0x%04zx: %g", i, (double)got[i]);
        }
        assert_int_equal(!!signbit(got[i]), sign);
    }
    free(got);
    free(v);
    tu_rmtree(dir);
}

// ---------------------------------------------------------------------------------------------
// Integer tensors (token ids of the golden files)

static void test_int_tensors(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[8192];
    tu_path(path, sizeof path, dir, "ids.safetensors");
    const char header[] = "{\"input_ids\":{\"dtype\":\"I64\",\"shape\":[2,3],\"data_offsets\":[0,48]},"
                          "\"lens\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[48,60]},"
                          "\"__metadata__\":{\"source\":\"test\"},"
                          "\"loss\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[60,64]}}";
    const int64_t ids[6] = {1, 49151, 0, -7, 5000000000LL, INT64_MIN};
    const int32_t lens[3] = {25, -1, INT32_MAX};
    unsigned char data[64];
    for (int i = 0; i < 6; i++) tu_put_le(data + 8 * i, (uint64_t)ids[i], 8);
    for (int i = 0; i < 3; i++) tu_put_le(data + 48 + 4 * i, (uint32_t)lens[i], 4);
    tu_put_le(data + 60, 0x412E0000u, 4); // 10.875f
    tu_write_st(path, strlen(header), header, data, sizeof data);

    llama_st_file *f;
    ag_err err = {{0}};
    assert_int_equal(llama_st_open(&f, path, &err), 0);
    assert_int_equal(llama_st_count(f), 3);
    assert_string_equal(llama_st_get(f, 0)->name, "input_ids"); // data order
    assert_string_equal(llama_st_get(f, 2)->name, "loss");
    int64_t got[6];
    const llama_st_tensor *t = llama_st_find(f, "input_ids");
    assert_int_equal(t->dtype, LLAMA_ST_I64);
    assert_int_equal(llama_st_read_i64(f, t, got, 6, &err), 0);
    assert_memory_equal(got, ids, sizeof ids);
    t = llama_st_find(f, "lens");
    assert_int_equal(llama_st_read_i64(f, t, got, 3, &err), 0);
    for (int i = 0; i < 3; i++) assert_int_equal(got[i], lens[i]);
    float loss;
    assert_int_equal(llama_st_read_f32(f, llama_st_find(f, "loss"), &loss, 1, &err), 0);
    assert_true(loss == 10.875f);
    // each reader refuses the other kind, naming tensor and dtype
    float fl[6];
    assert_int_equal(llama_st_read_f32(f, llama_st_find(f, "input_ids"), fl, 6, &err), -1);
    TU_MENTIONS(err.msg, "ids.safetensors", "input_ids", "I64");
    assert_int_equal(llama_st_read_i64(f, llama_st_find(f, "loss"), got, 1, &err), -1);
    TU_MENTIONS(err.msg, "loss", "F32");
    assert_string_equal(llama_st_dtype_name(LLAMA_ST_BF16), "BF16");
    llama_st_close(f);
    tu_rmtree(dir);
}

// ---------------------------------------------------------------------------------------------
// Parameters against a config

static const llama_config tiny = {
    .name = "tiny",
    .hidden = 8,
    .intermediate = 12,
    .layers = 2,
    .heads = 2,
    .kv_heads = 1,
    .head_dim = 4,
    .vocab = 16,
    .max_positions = 32,
    .rope_theta = 10000.0,
    .rms_eps = 1e-5,
    .tied = true,
};

enum { DROP_NONE = -1 };

// Writes the parameters of c (except tensor `drop`; tensor `reshape` gets one more row), plus
// `extra` when not NULL, with shape (1).
static void write_params(const char *path, const llama_config *c, int drop, int reshape, const char *extra) {
    size_t n = llama_param_count_tensors(c), m = 0;
    char(*names)[LLAMA_PARAM_NAME_MAX] = calloc(n + 1, sizeof *names);
    const char **np = calloc(n + 1, sizeof *np);
    int *nd = calloc(n + 1, sizeof *nd);
    int64_t(*shapes)[4] = calloc(n + 1, sizeof *shapes);
    const float **data = calloc(n + 1, sizeof *data);
    float *zeros = calloc(4096, sizeof *zeros);
    assert_true(names && np && nd && shapes && data && zeros);
    for (size_t i = 0; i < n; i++) {
        if ((int)i == drop) continue;
        int64_t sh[LLAMA_PARAM_MAX_DIMS];
        assert_int_equal(llama_param_spec(c, i, names[m], LLAMA_PARAM_NAME_MAX, &nd[m], sh), 0);
        shapes[m][0] = sh[0] + ((int)i == reshape);
        shapes[m][1] = sh[1];
        assert_true(shapes[m][0] * shapes[m][1] <= 4096);
        np[m] = names[m];
        data[m++] = zeros;
    }
    if (extra) {
        np[m] = extra, nd[m] = 1, shapes[m][0] = 1, data[m++] = zeros;
    }
    ag_err err = {{0}};
    assert_int_equal(tu_write_f32(path, m, np, nd, (const int64_t(*)[4])shapes, data, &err), 0);
    free(names), free(np), free(nd), free(shapes), free(data), free(zeros);
}

static int check(const char *path, const llama_config *c, bool allow_extra, ag_err *err) {
    llama_st_file *f;
    assert_int_equal(llama_st_open(&f, path, err), 0);
    int rc = llama_st_check_params(f, c, allow_extra, err);
    llama_st_close(f);
    return rc;
}

static void test_check_params(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[8192];
    tu_path(path, sizeof path, dir, "model.safetensors");
    ag_err err = {{0}};
    llama_config untied = tiny;
    untied.tied = false;

    write_params(path, &tiny, DROP_NONE, DROP_NONE, NULL);
    assert_int_equal(check(path, &tiny, false, &err), 0);
    // an untied config needs lm_head.weight
    assert_int_equal(check(path, &untied, false, &err), -1);
    TU_MENTIONS(err.msg, "model.safetensors", "lm_head.weight", "missing");

    // a tied config accepts lm_head.weight when it has the embedding's shape
    write_params(path, &untied, DROP_NONE, DROP_NONE, NULL);
    assert_int_equal(check(path, &untied, false, &err), 0);
    assert_int_equal(check(path, &tiny, false, &err), 0);
    write_params(path, &untied, DROP_NONE, 2 + 9 * 2, NULL); // lm_head one row too many
    assert_int_equal(check(path, &tiny, false, &err), -1);
    TU_MENTIONS(err.msg, "lm_head.weight", "[17, 8]", "[16, 8]");

    write_params(path, &tiny, 3, DROP_NONE, NULL); // layers.0 k_proj missing
    assert_int_equal(check(path, &tiny, true, &err), -1);
    TU_MENTIONS(err.msg, "model.layers.0.self_attn.k_proj.weight", "missing");
    assert_null(strstr(err.msg, "more"));

    write_params(path, &tiny, DROP_NONE, 2, NULL); // q_proj [9, 8] instead of [8, 8]
    assert_int_equal(check(path, &tiny, false, &err), -1);
    TU_MENTIONS(err.msg, "model.layers.0.self_attn.q_proj.weight", "[9, 8]", "[8, 8]");

    // the same file against a config one layer deeper: q_proj's fault and 9 missing tensors
    llama_config deeper = tiny;
    deeper.layers = 3;
    assert_int_equal(check(path, &deeper, false, &err), -1);
    TU_MENTIONS(err.msg, "model.layers.0.self_attn.q_proj.weight", "and 9 more");

    write_params(path, &tiny, DROP_NONE, DROP_NONE, "model.layers.0.self_attn.rotary_emb.inv_freq");
    assert_int_equal(check(path, &tiny, false, &err), -1);
    TU_MENTIONS(err.msg, "unexpected tensor", "model.layers.0.self_attn.rotary_emb.inv_freq");
    assert_int_equal(check(path, &tiny, true, &err), 0);

    // phi3: the fused qkv_proj [(heads + 2 kv_heads) x head_dim, hidden] one row too many, named with
    // both shapes; a Llama checkpoint (q_proj, k_proj...) is not a phi3 one
    llama_config phi = tiny;
    phi.family = LLAMA_FAMILY_PHI3, phi.fused_proj = true;
    write_params(path, &phi, DROP_NONE, DROP_NONE, NULL);
    assert_int_equal(check(path, &phi, false, &err), 0);
    write_params(path, &phi, DROP_NONE, 2, NULL);
    assert_int_equal(check(path, &phi, false, &err), -1);
    TU_MENTIONS(err.msg, "model.layers.0.self_attn.qkv_proj.weight", "[17, 8]", "[16, 8]");
    assert_null(strchr(err.msg, '\n'));
    write_params(path, &tiny, DROP_NONE, DROP_NONE, NULL);
    assert_int_equal(check(path, &phi, false, &err), -1);
    TU_MENTIONS(err.msg, "qkv_proj.weight", "missing");

    // an invalid config is refused before any lookup
    llama_config bad = tiny;
    bad.kv_heads = 3;
    assert_int_equal(check(path, &bad, true, &err), -1);
    TU_MENTIONS(err.msg, "num_key_value_heads");
    tu_rmtree(dir);
}

// A header for the parameters of c, all BF16 but for `odd`, which gets dtype odd_dtype.
static void write_params_header(const char *path, const llama_config *c, const char *odd, const char *odd_dtype,
                                unsigned odd_size) {
    size_t n = llama_param_count_tensors(c), cap = 64 + n * 160, used = 0;
    char *header = malloc(cap);
    assert_non_null(header);
    uint64_t offset = 0;
    used += (size_t)snprintf(header, cap, "{");
    for (size_t i = 0; i < n; i++) {
        char name[LLAMA_PARAM_NAME_MAX];
        int nd;
        int64_t sh[LLAMA_PARAM_MAX_DIMS];
        assert_int_equal(llama_param_spec(c, i, name, sizeof name, &nd, sh), 0);
        bool is_odd = strcmp(name, odd) == 0;
        uint64_t bytes = (uint64_t)(sh[0] * sh[1]) * (is_odd ? odd_size : 2);
        char shape[64];
        if (nd == 1)
            snprintf(shape, sizeof shape, "[%lld]", (long long)sh[0]);
        else
            snprintf(shape, sizeof shape, "[%lld,%lld]", (long long)sh[0], (long long)sh[1]);
        used += (size_t)snprintf(header + used, cap - used,
                                 "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,"
                                 "\"data_offsets\":[%llu,%llu]}",
                                 i ? "," : "", name, is_odd ? odd_dtype : "BF16", shape, (unsigned long long)offset,
                                 (unsigned long long)(offset + bytes));
        offset += bytes;
        assert_true(used < cap);
    }
    used += (size_t)snprintf(header + used, cap - used, "}");
    tu_write_st(path, strlen(header), header, NULL, (size_t)offset);
    free(header);
}

static void test_check_params_dtype(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[8192];
    tu_path(path, sizeof path, dir, "m.safetensors");
    ag_err err = {{0}};
    write_params_header(path, &tiny, "none", "BF16", 2); // BF16 parameters are fine
    assert_int_equal(check(path, &tiny, false, &err), 0);
    write_params_header(path, &tiny, "model.layers.1.mlp.up_proj.weight", "I64", 8);
    assert_int_equal(check(path, &tiny, false, &err), -1);
    TU_MENTIONS(err.msg, "m.safetensors", "model.layers.1.mlp.up_proj.weight", "I64");
    tu_rmtree(dir);
}

// ---------------------------------------------------------------------------------------------
// Failed writes

// A bad tensor list is refused before a single byte is written, naming the tensor; a stream
// that fails half way (a file size limit, a full device) is an error, never a short success.
static void test_write_failures(void **state) {
    (void)state;
    float x[4] = {1, 2, 3, 4};
    const float *data[] = {x, x};
    const int nd[] = {1, 1};
    const int64_t shapes[][4] = {{4}, {4}};
    ag_err err = {{0}};
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    assert_non_null(mem);

    const char *dup[] = {"w", "w"};
    assert_int_equal(llama_st_write_f32_file(mem, 2, dup, nd, shapes, data, &err), -1);
    TU_MENTIONS(err.msg, "tensor w", "twice");
    const char *empty[] = {""};
    assert_int_equal(llama_st_write_f32_file(mem, 1, empty, nd, shapes, data, &err), -1);
    TU_MENTIONS(err.msg, "empty");
    const char *one[] = {"w"};
    const int bad_nd[] = {5};
    assert_int_equal(llama_st_write_f32_file(mem, 1, one, bad_nd, shapes, data, &err), -1);
    TU_MENTIONS(err.msg, "tensor w", "ndim 5");
    const int64_t neg[][4] = {{-4}};
    assert_int_equal(llama_st_write_f32_file(mem, 1, one, nd, neg, data, &err), -1);
    TU_MENTIONS(err.msg, "tensor w", "shape");
    const int64_t huge[][4] = {{1LL << 40, 1LL << 40}};
    const int nd2[] = {2};
    assert_int_equal(llama_st_write_f32_file(mem, 1, one, nd2, huge, data, &err), -1);
    TU_MENTIONS(err.msg, "tensor w", "absurd");
    const float *none[] = {NULL};
    assert_int_equal(llama_st_write_f32_file(mem, 1, one, nd, shapes, none, &err), -1);
    TU_MENTIONS(err.msg, "tensor w", "no data");
    assert_int_equal(fflush(mem), 0);
    assert_int_equal(len, 0); // nothing reached the stream
    fclose(mem);
    free(buf);

    FILE *full = fopen("/dev/full", "w");
    if (full) { // a character device on this machine (tu_char_devices says which are)
        assert_int_equal(llama_st_write_f32_file(full, 1, one, nd, shapes, data, &err), -1);
        TU_MENTIONS(err.msg, "write failed", strerror(ENOSPC));
        fclose(full);
    }

    // The disk fills up half way (a file size limit).
    char *dir = tu_tmpdir(), path[8192];
    tu_path(path, sizeof path, dir, "out.safetensors");
    enum { N = 100000 };
    float *big = calloc(N, sizeof *big);
    assert_non_null(big);
    const float *bigdata[] = {big};
    const int64_t bigshape[][4] = {{N}};
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 65536;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = llama_st_write_f32_file(f, 1, one, nd, bigshape, bigdata, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    fclose(f);
    assert_int_equal(rc, -1);
    TU_MENTIONS(err.msg, "write failed");
    free(big);
    tu_rmtree(dir);
}

// ---------------------------------------------------------------------------------------------
// --weights PATH

static void test_weights_resolve(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), cfg[8192], st[8192], p[8192], want[8192];
    ag_err err = {{0}};
    assert_int_equal(llama_weights_resolve(dir, cfg, st, sizeof cfg, &err), -1);
    TU_MENTIONS(err.msg, dir, "config.json");
    tu_path(p, sizeof p, dir, "config.json");
    tu_write(p, "{}", 2);
    assert_int_equal(llama_weights_resolve(dir, cfg, st, sizeof cfg, &err), -1);
    TU_MENTIONS(err.msg, dir, "model.safetensors", "model.safetensors.index.json");
    // the index of a sharded checkpoint when there is no single file, as transformers looks
    char index[8192];
    tu_path(index, sizeof index, dir, "model.safetensors.index.json");
    tu_write(index, "{}", 2);
    assert_int_equal(llama_weights_resolve(dir, cfg, st, sizeof cfg, &err), 0);
    assert_string_equal(st, index);
    assert_true(llama_ckpt_is_index(st));
    tu_path(p, sizeof p, dir, "model.safetensors");
    tu_write(p, "x", 1);
    assert_int_equal(llama_weights_resolve(dir, cfg, st, sizeof cfg, &err), 0);
    tu_path(want, sizeof want, dir, "config.json");
    assert_string_equal(cfg, want);
    assert_string_equal(st, p);
    assert_false(llama_ckpt_is_index(st));
    // the index itself: a file, so no config
    assert_int_equal(llama_weights_resolve(index, cfg, st, sizeof cfg, &err), 0);
    assert_string_equal(st, index);
    assert_string_equal(cfg, "");
    // a file: itself, and no config
    assert_int_equal(llama_weights_resolve(p, cfg, st, sizeof cfg, &err), 0);
    assert_string_equal(st, p);
    assert_string_equal(cfg, "");
    assert_int_equal(llama_weights_resolve(p, cfg, st, 8, &err), -1);
    TU_MENTIONS(err.msg, "too long");
    tu_path(p, sizeof p, dir, "absent.safetensors");
    assert_int_equal(llama_weights_resolve(p, cfg, st, sizeof cfg, &err), -1);
    TU_MENTIONS(err.msg, "absent.safetensors", strerror(ENOENT));
    tu_rmtree(dir);
}

// What is not a regular file is refused at once, naming it and what it is: the path itself,
// or the folder's config.json or model.safetensors (alarm: a hang fails the test).
static void test_weights_resolve_special(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), cfg[8192], st[8192], p[8192], q[8192];
    ag_err err = {{0}};
    alarm(20);
    tu_path(p, sizeof p, dir, "pipe");
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(llama_weights_resolve(p, cfg, st, sizeof cfg, &err), -1);
    TU_MENTIONS(err.msg, "pipe", "neither", "FIFO");
    const char *const *devs = tu_char_devices();
    for (const char *const *dev = devs; *dev; dev++) {
        assert_int_equal(llama_weights_resolve(*dev, cfg, st, sizeof cfg, &err), -1);
        TU_MENTIONS(err.msg, *dev, "neither", "character device");
    }

    // a folder whose config.json is a FIFO, then a folder; model.safetensors likewise
    char *w = tu_tmpdir();
    tu_path(p, sizeof p, w, "config.json");
    assert_int_equal(mkfifo(p, 0600), 0);
    tu_path(q, sizeof q, w, "model.safetensors");
    tu_write(q, "x", 1);
    assert_int_equal(llama_weights_resolve(w, cfg, st, sizeof cfg, &err), -1);
    TU_MENTIONS(err.msg, "config.json", "not a regular file", "FIFO");
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(llama_weights_resolve(w, cfg, st, sizeof cfg, &err), -1);
    TU_MENTIONS(err.msg, "config.json", "folder");
    assert_int_equal(rmdir(p), 0);
    tu_write(p, "{}", 2);
    assert_int_equal(llama_weights_resolve(w, cfg, st, sizeof cfg, &err), 0);
    assert_int_equal(unlink(q), 0);
    assert_int_equal(mkfifo(q, 0600), 0);
    assert_int_equal(llama_weights_resolve(w, cfg, st, sizeof cfg, &err), -1);
    TU_MENTIONS(err.msg, "model.safetensors", "FIFO");
    assert_int_equal(unlink(q), 0);
    assert_int_equal(symlink(devs[0], q), 0);
    assert_int_equal(llama_weights_resolve(w, cfg, st, sizeof cfg, &err), -1);
    TU_MENTIONS(err.msg, "model.safetensors", "character device");
    assert_int_equal(unlink(q), 0);
    assert_int_equal(mkdir(q, 0700), 0);
    assert_int_equal(llama_weights_resolve(w, cfg, st, sizeof cfg, &err), -1);
    TU_MENTIONS(err.msg, "model.safetensors", "folder");
    alarm(0);
    tu_rmtree(w);
    tu_rmtree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),          cmocka_unit_test(test_known_values),
        cmocka_unit_test(test_f16_exhaustive),     cmocka_unit_test(test_bf16_exhaustive),
        cmocka_unit_test(test_int_tensors),        cmocka_unit_test(test_check_params),
        cmocka_unit_test(test_check_params_dtype), cmocka_unit_test(test_write_failures),
        cmocka_unit_test(test_weights_resolve),    cmocka_unit_test(test_weights_resolve_special),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
