// The tiny golden model's tokenizer.json, written by the tests that need text in and out (cmocka
// and jansson before this header).
#pragma once

#include <stdbool.h>

#define EOT 255 // <|endoftext|>: the template's BOS and the tokenizer's special token

// GPT-2's byte-level alphabet (bytes 0..249 are ids 0..249; no test text uses the others).
static inline void byte_char(int b, char out[3]) {
    int cp = b, k = 0;
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    for (int c = 0; c < b && !printable; c++) k += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
    if (!printable) cp = 256 + k;
    if (cp < 0x80)
        out[0] = (char)cp, out[1] = 0;
    else
        out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
}

// The tiny model's whole vocabulary (256 ids): 250 bytes, 5 merges, and <|endoftext|> at 255,
// which the template puts first (as Llama-3 puts its BOS). extra_id >= 0 adds "<x>" there.
static inline void write_tokenizer(const char *path, int extra_id) {
    json_t *vocab = json_object(), *merges = json_pack("[s, s, s, s, s]", "h e", "l l", "he ll", "\xc4\xa0 w", "o r");
    for (int b = 0; b < 250; b++) {
        char c[3];
        byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    const char *merged[] = {"he", "ll", "hell", "\xc4\xa0w", "or"};
    for (int i = 0; i < 5; i++) json_object_set_new(vocab, merged[i], json_integer(250 + i));
    json_t *added = json_pack("[{s:i, s:s, s:b}]", "id", EOT, "content", "<|endoftext|>", "special", 1);
    if (extra_id >= 0)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b}", "id", extra_id, "content", "<x>", "special", 1));
    json_t *root = json_pack(
        "{s:{s:s, s:o, s:o}, s:o, s:{s:s, s:b, s:b}, s:{s:s, s:[{s:{s:s}}, {s:{s:s}}], s:{s:{s:s, s:[i]}}}, s:{s:s}}",
        "model", "type", "BPE", "vocab", vocab, "merges", merges, "added_tokens", added, "pre_tokenizer", "type",
        "ByteLevel", "add_prefix_space", 0, "use_regex", 1, "post_processor", "type", "TemplateProcessing", "single",
        "SpecialToken", "id", "<|endoftext|>", "Sequence", "id", "A", "special_tokens", "<|endoftext|>", "id",
        "<|endoftext|>", "ids", EOT, "decoder", "type", "ByteLevel");
    assert_int_equal(json_dump_file(root, path, 0), 0);
    json_decref(root);
}
