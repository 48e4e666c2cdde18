// The config.json parser on arbitrary text: llama_config_parse, and the same bytes through
// llama_config_load from a file. A config that parses must validate, with a clean name and a
// parameter list that adds up; a refusal leaves one line naming the input.
#include <jansson.h>
#include <math.h>

#include "fuzz_util.h"
#include "model.h"

#define ORIGIN "fuzz/config.json"

static void check_config(const llama_config *c) {
    ag_err err = {{0}};
    FZ_REQUIRE(llama_config_validate(c, &err) == 0);
    size_t len = strnlen(c->name, LLAMA_NAME_MAX);
    FZ_REQUIRE(len < LLAMA_NAME_MAX);
    for (size_t i = 0; i < len; i++) FZ_REQUIRE((unsigned char)c->name[i] >= 0x20 && c->name[i] != 0x7f);
    json_t *s = json_stringn(c->name, len); // valid UTF-8
    FZ_REQUIRE(s);
    json_decref(s);
    uint64_t total = llama_param_count(c);
    FZ_REQUIRE(total > 0 && total <= LLAMA_MAX_PARAMS);
    // the first tensors, one block's worth, and the last ones (a config may have 10^5 layers)
    size_t n = llama_param_count_tensors(c);
    for (size_t i = 0; i < n; i = (i == 2 * llama_layer_param_count(c, 0) && n > i + 4) ? n - 4 : i + 1) {
        char name[LLAMA_PARAM_NAME_MAX];
        int nd;
        int64_t shape[LLAMA_PARAM_MAX_DIMS];
        FZ_REQUIRE(llama_param_spec(c, i, name, sizeof name, &nd, shape) == 0);
        FZ_REQUIRE((nd == 1 || nd == 2) && shape[0] > 0 && shape[1] > 0);
    }
    // an accepted rope_scaling gives frequencies every rope op takes: positive and finite
    llama_config r = *c;
    llama_rope_prepare(&r);
    ag_rope_freqs f = llama_rope_freqs(&r);
    FZ_REQUIRE(f.scale > 0.0f && isfinite(f.scale));
    for (int64_t i = 0; f.inv_freq && i < c->head_dim / 2; i++)
        FZ_REQUIRE(f.inv_freq[i] > 0.0f && isfinite(f.inv_freq[i]));
}

static bool same_shape(const llama_config *a, const llama_config *b) {
    return a->hidden == b->hidden && a->intermediate == b->intermediate && a->layers == b->layers &&
           a->heads == b->heads && a->kv_heads == b->kv_heads && a->head_dim == b->head_dim && a->vocab == b->vocab &&
           a->max_positions == b->max_positions && a->rope_theta == b->rope_theta && a->rms_eps == b->rms_eps &&
           a->tied == b->tied;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    llama_config c, d;
    ag_err err = {{0}}, lerr = {{0}};
    int rc = llama_config_parse(&c, (const char *)data, size, ORIGIN, &err);
    if (rc == 0)
        check_config(&c);
    else
        fz_check_message(err.msg, ORIGIN ": ");
    // from a file: the same verdict and the same config
    static fz_file file;
    fz_file_write(&file, data, size);
    int lrc = llama_config_load(&d, file.path, &lerr);
    FZ_REQUIRE(lrc == rc);
    if (lrc == 0)
        FZ_REQUIRE(same_shape(&c, &d));
    else
        fz_check_message(lerr.msg, file.path);
    return 0;
}
