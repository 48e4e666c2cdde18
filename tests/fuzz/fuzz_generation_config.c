// The end-of-text reader (generation_config.json, and config.json's eos_token_id) on arbitrary
// text: llama_eos_parse, and the same bytes through llama_eos_load from a file. The first byte
// sets the vocabulary (1 to 256 ids), the rest is the file. Accepted ids are in the vocabulary,
// distinct and at most LLAMA_MAX_EOS; a refusal leaves one line naming the input.
#include "fuzz_util.h"
#include "model.h"

#define ORIGIN "fuzz/generation_config.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int64_t vocab = (int64_t)data[0] + 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    llama_eos a = {.n = 0}, b = {.n = 0};
    ag_err err = {{0}}, lerr = {{0}};
    int rc = llama_eos_parse(text, len, ORIGIN, vocab, &a, &err);
    FZ_REQUIRE(a.n >= 0 && a.n <= LLAMA_MAX_EOS);
    if (rc == 0) {
        for (int i = 0; i < a.n; i++) {
            FZ_REQUIRE(a.ids[i] >= 0 && a.ids[i] < vocab);
            for (int j = 0; j < i; j++) FZ_REQUIRE(a.ids[j] != a.ids[i]);
        }
    } else {
        FZ_REQUIRE(rc == -1);
        fz_check_message(err.msg, ORIGIN ": ");
    }
    // from a file: the same verdict and the same ids
    static fz_file file;
    fz_file_write(&file, (const uint8_t *)text, len);
    int lrc = llama_eos_load(file.path, vocab, &b, &lerr);
    FZ_REQUIRE(lrc == rc);
    if (rc == 0) FZ_REQUIRE(a.n == b.n && memcmp(a.ids, b.ids, (size_t)a.n * sizeof a.ids[0]) == 0);
    if (rc != 0) fz_check_message(lerr.msg, file.path);
    return 0;
}
