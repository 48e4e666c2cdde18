// The sharded checkpoint reader on arbitrary index files: a folder made once holds two small
// shards (a.safetensors, b.safetensors) and, each run, the input as its
// model.safetensors.index.json. llama_ckpt_open either refuses with one line naming the index
// or opens a checkpoint in which every tensor of every shard is found, in its own shard; the
// parameter check against a small config then passes or refuses the same way.
#include <stdlib.h>

#include "fuzz_util.h"
#include "model.h"

static const llama_config tiny = {
    .name = "tiny",
    .hidden = 4,
    .intermediate = 4,
    .layers = 1,
    .heads = 2,
    .kv_heads = 1,
    .head_dim = 2,
    .vocab = 4,
    .max_positions = 32,
    .rope_theta = 10000.0,
    .rms_eps = 1e-5,
    .tied = true,
};

static char folder[64], index_path[128];

// The folder goes when the run ends.
static void remove_folder(void) {
    const char *files[] = {"a.safetensors", "b.safetensors", "model.safetensors.index.json"};
    char p[128];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", folder, files[i]);
        unlink(p);
    }
    rmdir(folder);
}

// The tiny config's tensors, the first half in a.safetensors and the rest in b.safetensors.
static void make_folder(void) {
    snprintf(folder, sizeof folder, "/tmp/membill_fuzz_index_XXXXXX");
    FZ_REQUIRE(mkdtemp(folder));
    atexit(remove_folder);
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", folder);
    size_t n = llama_param_count_tensors(&tiny), half = n / 2;
    static float zeros[64];
    for (int s = 0; s < 2; s++) {
        const char *names[16];
        char store[16][LLAMA_PARAM_NAME_MAX];
        int ndims[16];
        int64_t shapes[16][LLAMA_ST_WRITE_MAX_DIMS];
        const float *data[16];
        size_t k = 0;
        for (size_t i = s ? half : 0; i < (s ? n : half); i++, k++) {
            int64_t shape[LLAMA_PARAM_MAX_DIMS];
            FZ_REQUIRE(llama_param_spec(&tiny, i, store[k], LLAMA_PARAM_NAME_MAX, &ndims[k], shape) == 0);
            names[k] = store[k], shapes[k][0] = shape[0], shapes[k][1] = shape[1], data[k] = zeros;
        }
        char p[128];
        snprintf(p, sizeof p, "%s/%s.safetensors", folder, s ? "b" : "a");
        FILE *f = fopen(p, "wb");
        FZ_REQUIRE(f);
        FZ_REQUIRE(llama_st_write_f32_file(f, k, names, ndims, (const int64_t(*)[LLAMA_ST_WRITE_MAX_DIMS])shapes, data,
                                           NULL) == 0);
        FZ_REQUIRE(fclose(f) == 0);
    }
}

static void check_open(const llama_ckpt *c) {
    FZ_REQUIRE(llama_ckpt_files(c) >= 1 && llama_ckpt_files(c) <= 2);
    for (size_t i = 0; i < llama_ckpt_files(c); i++) {
        const llama_st_file *f = llama_ckpt_file(c, i);
        for (size_t j = 0; j < llama_st_count(f); j++) {
            const llama_st_file *in = NULL;
            const llama_st_tensor *t = llama_ckpt_find(c, llama_st_get(f, j)->name, &in);
            FZ_REQUIRE(t == llama_st_get(f, j) && in == f);
        }
    }
    ag_err err = {{0}};
    if (llama_ckpt_check_params(c, &tiny, false, &err) != 0) fz_check_message(err.msg, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!folder[0]) make_folder();
    FILE *f = fopen(index_path, "wb");
    FZ_REQUIRE(f);
    FZ_REQUIRE(fwrite(data, 1, size, f) == size);
    FZ_REQUIRE(fclose(f) == 0);
    llama_ckpt *c = NULL;
    ag_err err = {{0}};
    if (llama_ckpt_open(&c, index_path, &err) == 0)
        check_open(c);
    else
        fz_check_message(err.msg, index_path);
    if (getenv("MEMBILL_FUZZ_VERBOSE")) fprintf(stderr, "%s\n", c ? "opened" : err.msg);
    llama_ckpt_close(c);
    return 0;
}
