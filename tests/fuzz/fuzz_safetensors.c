// The safetensors reader on arbitrary files: llama_st_open, then every tensor read (all must
// succeed on an intact file), the parameter check against a small config, and every read again
// after the file is cut in half while open (each fails with a message or succeeds, by where
// its bytes lie; never a crash).
#include "fuzz_util.h"
#include "model.h"

static const llama_config tiny = {
    .name = "tiny",
    .hidden = 8,
    .intermediate = 12,
    .layers = 1,
    .heads = 2,
    .kv_heads = 1,
    .head_dim = 4,
    .vocab = 16,
    .max_positions = 32,
    .rope_theta = 10000.0,
    .rms_eps = 1e-5,
    .tied = true,
};

static bool is_float(llama_st_dtype d) { return d == LLAMA_ST_F32 || d == LLAMA_ST_BF16 || d == LLAMA_ST_F16; }

// Reads t with the reader of its kind: 0 or -1; the other reader and a wrong count must fail.
static int read_tensor(const llama_st_file *f, const llama_st_tensor *t, const char *path) {
    ag_err err = {{0}};
    size_t n = (size_t)t->numel;
    // a non-empty tensor's bytes lie in the file, so n is at most the file's size
    void *dst = malloc(n ? n * 8 : 1);
    FZ_REQUIRE(dst);
    int rc;
    if (is_float(t->dtype)) {
        rc = llama_st_read_f32(f, t, dst, n, &err);
        FZ_REQUIRE(llama_st_read_i64(f, t, dst, n, NULL) == -1);
    } else {
        rc = llama_st_read_i64(f, t, dst, n, &err);
        FZ_REQUIRE(llama_st_read_f32(f, t, dst, n, NULL) == -1);
    }
    if (rc != 0) fz_check_message(err.msg, path);
    ag_err wrong = {{0}};
    FZ_REQUIRE(llama_st_read_f32(f, t, dst, n + 1, &wrong) == -1);
    fz_check_message(wrong.msg, path);
    free(dst);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static fz_file file;
    fz_file_write(&file, data, size);
    llama_st_file *f = (llama_st_file *)1;
    ag_err err = {{0}};
    if (llama_st_open(&f, file.path, &err) != 0) {
        FZ_REQUIRE(f == NULL);
        fz_check_message(err.msg, file.path);
        return 0;
    }
    FZ_REQUIRE(size >= 8);
    uint64_t hlen = 0;
    for (int b = 0; b < 8; b++) hlen |= (uint64_t)data[b] << (8 * b);
    uint64_t data_start = 8 + hlen, data_len = size - data_start;
    size_t n = llama_st_count(f);
    FZ_REQUIRE(llama_st_get(f, n) == NULL);
    for (size_t i = 0; i < n; i++) {
        const llama_st_tensor *t = llama_st_get(f, i);
        FZ_REQUIRE(t && t->name && t->name[0]);
        FZ_REQUIRE(llama_st_find(f, t->name) == t);
        FZ_REQUIRE(t->ndim >= 0 && t->ndim <= LLAMA_ST_MAX_DIMS);
        FZ_REQUIRE(t->offset <= data_len && t->nbytes <= data_len - t->offset);
        if (i) FZ_REQUIRE(llama_st_get(f, i - 1)->offset <= t->offset);
        FZ_REQUIRE(read_tensor(f, t, file.path) == 0);
    }
    FZ_REQUIRE(llama_st_find(f, "__metadata__") == NULL);
    for (int allow = 0; allow < 2; allow++) {
        llama_config c = tiny;
        c.tied = allow;
        ag_err cerr = {{0}};
        if (llama_st_check_params(f, &c, allow, &cerr) != 0) fz_check_message(cerr.msg, file.path);
    }
    // cut the data section in half while the file is open
    uint64_t cut = data_start + data_len / 2;
    FZ_REQUIRE(ftruncate(file.fd, (off_t)cut) == 0);
    for (size_t i = 0; i < n; i++) {
        const llama_st_tensor *t = llama_st_get(f, i);
        int rc = read_tensor(f, t, file.path);
        bool intact = t->nbytes == 0 || data_start + t->offset + t->nbytes <= cut;
        FZ_REQUIRE(rc == (intact ? 0 : -1));
    }
    llama_st_close(f);
    return 0;
}
