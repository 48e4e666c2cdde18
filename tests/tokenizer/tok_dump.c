// The oracle test's C side: every text of a JSON list through a tokenizer.json, as
// {"ids": [[...], ...], "decoded": ["...", ...]}: ids with the post-processor's tokens, as
// tokenizer(text) gives them; decoded, the text encoded without them and decoded back (special
// tokens of the text kept), which must be the text. Exit 1 with one line when a text or the file
// is refused.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "tok.h"

static int dump(const tok_tokenizer *t, json_t *texts, json_t *out) {
    json_t *all = json_array(), *decoded = json_array();
    json_object_set_new(out, "ids", all);
    json_object_set_new(out, "decoded", decoded);
    for (size_t i = 0; i < json_array_size(texts); i++) {
        json_t *s = json_array_get(texts, i);
        int32_t *ids = NULL, *plain = NULL;
        size_t n, k, len;
        char *text = NULL;
        tok_err err;
        if (tok_encode(t, json_string_value(s), json_string_length(s), true, &ids, &n, &err) != 0 ||
            tok_encode(t, json_string_value(s), json_string_length(s), false, &plain, &k, &err) != 0 ||
            tok_decode(t, plain, k, false, &text, &len, &err) != 0) {
            fprintf(stderr, "tok_dump: text %zu: %s\n", i, err.msg);
            free(ids), free(plain);
            return -1;
        }
        free(plain);
        json_t *row = json_array();
        for (size_t k = 0; k < n; k++) json_array_append_new(row, json_integer(ids[k]));
        json_array_append_new(all, row);
        json_array_append_new(decoded, json_stringn(text, len));
        free(ids);
        free(text);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: tok_dump TOKENIZER.json TEXTS.json OUT.json\n");
        return 2;
    }
    tok_err err = {""};
    FILE *f = fopen(argv[1], "rb");
    static char buf[64 << 20]; // the oracle's tokenizer files are a few MB
    size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
    tok_tokenizer *t = f && !ferror(f) && len < sizeof buf ? tok_parse(buf, len, argv[1], &err) : NULL;
    if (f) fclose(f);
    if (!t && !err.msg[0]) snprintf(err.msg, sizeof err.msg, "%s: cannot be read (or larger than 64 MiB)", argv[1]);
    if (!t) {
        fprintf(stderr, "tok_dump: %s\n", err.msg);
        return 1;
    }
    json_error_t je;
    json_t *texts = json_load_file(argv[2], 0, &je), *out = json_object();
    int rc = json_is_array(texts) ? dump(t, texts, out) : -1;
    if (!json_is_array(texts)) fprintf(stderr, "tok_dump: %s: not a JSON list of texts\n", argv[2]);
    if (rc == 0 && json_dump_file(out, argv[3], JSON_COMPACT) != 0) {
        fprintf(stderr, "tok_dump: %s: could not be written\n", argv[3]);
        rc = -1;
    }
    json_decref(texts);
    json_decref(out);
    tok_free(t);
    return rc == 0 ? 0 : 1;
}
