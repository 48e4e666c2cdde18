// Sharded checkpoints made from the tiny golden models, for the tests that read them (cmocka,
// jansson, model.h and MEMBILL_GOLDEN_DIR before this header).
#pragma once

#include <sys/stat.h>

static inline char *at(char *buf, const char *a, const char *b) {
    int k = snprintf(buf, 1024, "%s/%s", a, b);
    assert_true(k > 0 && k < 1024);
    return buf;
}

static inline void copy_file(const char *from, const char *to) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    assert_int_equal(system(cmd), 0);
}

// Writes the tensors (each read from its file) as one F32 safetensors file.
static inline void write_tensors(const char *path, const llama_st_tensor *const *list, const llama_st_file *const *from,
                                 size_t k) {
    const char *names[64];
    int ndims[64];
    int64_t shapes[64][LLAMA_ST_WRITE_MAX_DIMS];
    float *data[64];
    ag_err err;
    assert_true(k <= 64);
    for (size_t j = 0; j < k; j++) {
        const llama_st_tensor *t = list[j];
        names[j] = t->name;
        ndims[j] = t->ndim;
        memcpy(shapes[j], t->shape, sizeof(int64_t) * (size_t)t->ndim);
        data[j] = malloc(t->numel * sizeof(float) + 1);
        assert_int_equal(llama_st_read_f32(from[j], t, data[j], t->numel, &err), 0);
    }
    FILE *out = fopen(path, "wb");
    assert_non_null(out);
    assert_int_equal(llama_st_write_f32_file(out, k, names, ndims, (const int64_t(*)[LLAMA_ST_WRITE_MAX_DIMS])shapes,
                                             (const float *const *)data, &err),
                     0);
    fclose(out);
    for (size_t j = 0; j < k; j++) free(data[j]);
}

// A folder holding config.json and the model's tensors in `shards` files, tensor i in shard
// i % shards, and their index (skip: a tensor left out of both).
static inline void make_sharded(const char *model, const char *dir, int shards, const char *skip) {
    char p[1024], q[1024], src[1024];
    ag_err err;
    mkdir(dir, 0700);
    snprintf(src, sizeof src, "%s/%s", MEMBILL_GOLDEN_DIR, model);
    copy_file(at(p, src, "config.json"), at(q, dir, "config.json"));
    llama_st_file *f = NULL;
    assert_int_equal(llama_st_open(&f, at(p, src, "model.safetensors"), &err), 0);
    size_t n = llama_st_count(f);
    json_t *map = json_object();
    for (int s = 0; s < shards; s++) {
        const llama_st_tensor *list[64];
        const llama_st_file *from[64];
        size_t k = 0;
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, shards);
        for (size_t i = (size_t)s; i < n; i += (size_t)shards) {
            const llama_st_tensor *t = llama_st_get(f, i);
            if (skip && strcmp(t->name, skip) == 0) continue;
            assert_true(k < 64);
            list[k] = t, from[k++] = f;
            json_object_set_new(map, t->name, json_string(file));
        }
        write_tensors(at(p, dir, file), list, from, k);
    }
    llama_st_close(f);
    json_t *index = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", map);
    assert_int_equal(json_dump_file(index, at(p, dir, "model.safetensors.index.json"), JSON_INDENT(2)), 0);
    json_decref(index);
}
