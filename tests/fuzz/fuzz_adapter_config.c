// PEFT's adapter_config.json reader on arbitrary text: llama_adapter_parse_config, and the same
// bytes from a folder's file through llama_adapter_read_config. An accepted config is one
// llama_lora_validate accepts (so its scale alpha / r is finite and positive) with a base name
// that fits; a refusal leaves one line naming the input.
#include <math.h>

#include "fuzz_util.h"
#include "model.h"

#define ORIGIN "fuzz/adapter_config.json"

static void check_lora(const llama_lora_config *l, const char *base) {
    ag_err err = {{0}};
    FZ_REQUIRE(llama_lora_validate(l, &err) == 0);
    double scale = l->alpha / (double)l->rank;
    FZ_REQUIRE(isfinite(scale) && scale > 0 && isfinite((float)scale) && (float)scale > 0);
    FZ_REQUIRE(strnlen(base, LLAMA_NAME_MAX) < LLAMA_NAME_MAX);
}

static char dir[64], link_path[128];

static void remove_dir(void) {
    unlink(link_path);
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    llama_lora_config a, b;
    char base_a[LLAMA_NAME_MAX], base_b[LLAMA_NAME_MAX];
    ag_err err = {{0}}, lerr = {{0}};
    int rc = llama_adapter_parse_config((const char *)data, size, ORIGIN, &a, base_a, sizeof base_a, &err);
    if (rc == 0)
        check_lora(&a, base_a);
    else
        fz_check_message(err.msg, ORIGIN ": ");
    // from a folder's adapter_config.json (a link to the in-memory file): the same verdict and
    // the same settings
    static fz_file file;
    fz_file_write(&file, data, size);
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/membill-fuzz-adapter-XXXXXX");
        FZ_REQUIRE(mkdtemp(dir) != NULL);
        snprintf(link_path, sizeof link_path, "%s/" LLAMA_ADAPTER_CONFIG, dir);
        FZ_REQUIRE(symlink(file.path, link_path) == 0);
        atexit(remove_dir);
    }
    int lrc = llama_adapter_read_config(dir, &b, base_b, sizeof base_b, &lerr);
    FZ_REQUIRE(lrc == rc);
    if (rc == 0)
        FZ_REQUIRE(a.rank == b.rank && a.alpha == b.alpha && a.dropout == b.dropout && a.targets == b.targets &&
                   strcmp(base_a, base_b) == 0);
    else
        fz_check_message(lerr.msg, dir);
    return 0;
}
