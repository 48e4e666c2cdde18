// The tokenizer.json reader and the tokenizer on arbitrary files: the input up to its first NUL
// byte is the file (tok_parse, and the same bytes from a file through llama_read_file, as the
// command reads a tokenizer.json), what follows it the text to
// encode (a fixed text without a NUL). A file that loads must encode into ids it has, decode
// them into valid UTF-8, and refuse invalid text; every refusal is one line naming its input.
#include <jansson.h>

#include "fuzz_util.h"
#include "model.h"
#include "tok.h"

#define ORIGIN "fuzz/tokenizer.json"
static const char fixed_text[] = "Hello world, it's 2024: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac  \n\t<|endoftext|>!";

static void check_round(const tok_tokenizer *t, const char *text, size_t len, bool special) {
    int32_t *ids;
    size_t n, out_len;
    char *out;
    tok_err err;
    if (tok_encode(t, text, len, special, &ids, &n, &err) != 0) {
        fz_check_message(err.msg, "text: ");
        return;
    }
    for (size_t i = 0; i < n; i++) FZ_REQUIRE(ids[i] >= 0 && ids[i] < tok_vocab_size(t) && tok_token(t, ids[i]));
    FZ_REQUIRE(tok_decode(t, ids, n, !special, &out, &out_len, &err) == 0);
    FZ_REQUIRE(strlen(out) <= out_len && out[out_len] == 0);
    json_t *s = json_stringn(out, out_len); // NULL unless valid UTF-8
    FZ_REQUIRE(s);
    json_decref(s);
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : fixed_text;
    size_t text_len = nul ? size - json_len - 1 : sizeof fixed_text - 1;
    if (text_len > 256) text_len = 256; // a regex's cost grows with the text; the file is the target
    tok_err err, lerr = {""};
    tok_tokenizer *t = tok_parse((const char *)data, json_len, ORIGIN, &err);
    if (t) {
        check_round(t, text, text_len, true);
        check_round(t, text, text_len, false);
        int32_t bad = tok_vocab_size(t);
        char *out;
        size_t out_len;
        FZ_REQUIRE(tok_decode(t, &bad, 1, false, &out, &out_len, &err) == -1);
        fz_check_message(err.msg, "ids: ");
    } else {
        fz_check_message(err.msg, ORIGIN ": ");
    }
    // from a file: the same verdict
    static fz_file file;
    fz_file_write(&file, data, json_len);
    char *read;
    size_t read_len;
    ag_err rerr;
    FZ_REQUIRE(llama_read_file(file.path, "a tokenizer.json", 1u << 30, &read, &read_len, &rerr) == 0);
    FZ_REQUIRE(read_len == json_len && read[read_len] == 0);
    tok_tokenizer *l = tok_parse(read, read_len, file.path, &lerr);
    free(read);
    FZ_REQUIRE((l != NULL) == (t != NULL));
    if (!l) fz_check_message(lerr.msg, file.path);
    tok_free(l);
    tok_free(t);
    return 0;
}
