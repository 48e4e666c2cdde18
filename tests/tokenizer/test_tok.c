// The tokenizer on small tokenizer.json files made here: BPE ranks and ties, ignore_merges, the
// pre-tokenizers' splits (seen through merges that would cross them), added tokens, templates,
// decoding, and malformed files refused with one line.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tok.h"

// GPT-2's byte-level alphabet, written out again here (not taken from the library under test).
static void byte_char(int b, char out[3]) {
    int cp = b, k = 0;
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    if (!printable) {
        for (int c = 0; c < b; c++) k += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
    }
}

// A byte-level BPE: the 256 bytes as ids 0..255, then each merge's result in order. Merges are
// written with "_" for the byte-level space (Ġ).
static json_t *bpe(const char *const *merges) {
    json_t *vocab = json_object(), *list = json_array();
    for (int b = 0; b < 256; b++) {
        char c[3];
        byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    for (int i = 0; merges && merges[i]; i++) {
        char m[64], joined[64];
        size_t j = 0, k = 0;
        for (const char *p = merges[i]; *p; p++)
            j += (size_t)snprintf(m + j, sizeof m - j, *p == '_' ? "\xc4\xa0" : "%c", *p);
        for (const char *p = m; *p; p++)
            if (*p != ' ') joined[k++] = *p;
        joined[k] = 0;
        json_object_set_new(vocab, joined, json_integer(256 + i));
        json_array_append_new(list, json_string(m));
    }
    json_t *root = json_object();
    json_object_set_new(root, "model", json_pack("{s:s, s:o, s:o}", "type", "BPE", "vocab", vocab, "merges", list));
    json_object_set_new(root, "decoder", json_pack("{s:s}", "type", "ByteLevel"));
    return root;
}

static json_t *byte_level_pre(bool regex) {
    return json_pack("{s:s, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "use_regex", regex);
}

static tok_tokenizer *build(json_t *root) {
    char *text = json_dumps(root, 0);
    tok_err err;
    tok_tokenizer *t = tok_parse(text, strlen(text), "test.json", &err);
    if (!t) fail_msg("%s", err.msg);
    free(text);
    json_decref(root);
    return t;
}

// The tokens of text, joined by '|', byte-level spaces shown as '_'.
static const char *pieces(const tok_tokenizer *t, const char *text, bool special) {
    static char out[4096];
    int32_t *ids;
    size_t n;
    tok_err err;
    assert_int_equal(tok_encode(t, text, strlen(text), special, &ids, &n, &err), 0);
    out[0] = 0;
    for (size_t i = 0; i < n; i++) {
        if (i) strcat(out, "|");
        for (const char *p = tok_token(t, ids[i]); *p; p++)
            if ((unsigned char)p[0] == 0xc4 && (unsigned char)p[1] == 0xa0)
                strcat(out, "_"), p++;
            else
                out[strlen(out) + 1] = 0, out[strlen(out)] = *p;
    }
    free(ids);
    return out;
}

static void test_merges_by_rank_and_leftmost(void **state) {
    (void)state;
    const char *m1[] = {"l o", "l l", NULL}, *m2[] = {"l l", "l o", NULL}, *m3[] = {"a a", NULL};
    json_t *r = bpe(m1);
    tok_tokenizer *t = build(r);
    assert_string_equal(pieces(t, "hello", false), "h|e|l|lo"); // "l o" ranks first
    tok_free(t);
    t = build(bpe(m2));
    assert_string_equal(pieces(t, "hello", false), "h|e|ll|o");
    tok_free(t);
    t = build(bpe(m3));
    assert_string_equal(pieces(t, "aaa", false), "aa|a"); // a tie goes to the leftmost pair
    assert_string_equal(pieces(t, "aaaa", false), "aa|aa");
    tok_free(t);
}

static void test_ignore_merges(void **state) {
    (void)state;
    const char *m[] = {"h e", "l l", "he ll", "hell o", NULL};
    json_t *r = bpe(m);
    json_t *model = json_object_get(r, "model");
    json_object_set_new(json_object_get(model, "vocab"), "hlo", json_integer(300)); // no merge makes it
    json_object_set_new(model, "ignore_merges", json_true());
    tok_tokenizer *t = build(r);
    assert_string_equal(pieces(t, "hlo", false), "hlo");
    assert_string_equal(pieces(t, "hello", false), "hello");
    tok_free(t);
    r = bpe(m);
    json_object_set_new(json_object_get(json_object_get(r, "model"), "vocab"), "hlo", json_integer(300));
    t = build(r);
    assert_string_equal(pieces(t, "hlo", false), "h|l|o");
    tok_free(t);
}

static void test_byte_level_regex(void **state) {
    (void)state;
    const char *m[] = {"o _", "_ w", "_w o", "1 2", "12 3", "' s", NULL};
    json_t *r = bpe(m);
    json_object_set_new(r, "pre_tokenizer", byte_level_pre(true));
    tok_tokenizer *t = build(r);
    // the regex keeps "o" and " w" apart: "o Ġ" never merges across words
    assert_string_equal(pieces(t, "wo wo", false), "w|o|_wo");
    assert_string_equal(pieces(t, "x123 it's", false), "x|123|_|i|t|'s");
    assert_string_equal(pieces(t, "a  wo", false), "a|_|_wo"); // \s+(?!\S): the last space joins the word
    tok_free(t);
    // U+0085 is white space to the library (Oniguruma's \s), not punctuation: " " and it apart
    const char *nel[] = {"_ \xc3\x82", NULL};
    r = bpe(nel);
    json_object_set_new(r, "pre_tokenizer", byte_level_pre(true));
    t = build(r);
    assert_string_equal(pieces(t,
                               "a \xc2\x85"
                               "b",
                               false),
                        "a|_|\xc3\x82|\xc4\xa7|b");
    assert_string_equal(pieces(t, "a \xc2\xa9", false), "a|_\xc3\x82|\xc2\xa9"); // (c) is punctuation: " (c)"
    tok_free(t);
    r = bpe(m);
    json_object_set_new(r, "pre_tokenizer", byte_level_pre(false));
    t = build(r);
    assert_string_equal(pieces(t, "wo wo", false), "w|o_|w|o"); // one piece: merges cross words
    tok_free(t);
}

static const char *split_with(const char *behavior, bool invert, const char *text) {
    const char *m[] = {"a -", "- b", "- -", "- c", "b -", NULL};
    json_t *r = bpe(m);
    json_object_set_new(r, "pre_tokenizer",
                        json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "String", "-", "behavior",
                                  behavior, "invert", invert));
    tok_tokenizer *t = build(r);
    static char out[256];
    snprintf(out, sizeof out, "%s", pieces(t, text, false));
    tok_free(t);
    return out;
}

static void test_split_behaviors(void **state) {
    (void)state;
    // with no split at all these merges would give a-|b-|-c
    assert_string_equal(split_with("Isolated", false, "a-b--c"), "a|-|b|-|-|c");
    assert_string_equal(split_with("Removed", false, "a-b--c"), "a|b|c");
    assert_string_equal(split_with("MergedWithPrevious", false, "a-b--c"), "a-|b-|-|c");
    assert_string_equal(split_with("MergedWithNext", false, "a-b--c"), "a|-b|-|-c");
    assert_string_equal(split_with("Contiguous", false, "a-b--c"), "a|-|b|--|c");
    // inverted, the text between the dashes is the delimiter: removed, only the dashes stay, each
    // match its own piece
    assert_string_equal(split_with("Removed", true, "a-b--c"), "-|-|-");
}

static void test_regex_split_and_digits(void **state) {
    (void)state;
    const char *m[] = {"1 2", "12 3", "a b", NULL};
    json_t *r = bpe(m);
    json_t *seq = json_pack("[{s:s, s:b}, o]", "type", "Digits", "individual_digits", 1, byte_level_pre(true));
    json_object_set_new(r, "pre_tokenizer", json_pack("{s:s, s:o}", "type", "Sequence", "pretokenizers", seq));
    tok_tokenizer *t = build(r);
    assert_string_equal(pieces(t, "ab123", false), "ab|1|2|3");
    tok_free(t);
    r = bpe(m);
    json_object_set_new(r, "pre_tokenizer", json_pack("{s:s, s:b}", "type", "Digits", "individual_digits", 0));
    t = build(r);
    assert_string_equal(pieces(t, "ab123a", false), "ab|123|a");
    tok_free(t);
    // Llama-3's way: a Unicode regex (case-insensitive group, \p classes) isolates the pieces
    r = bpe(m);
    json_object_set_new(r, "pre_tokenizer",
                        json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "Regex",
                                  "(?i:'s|'t)|\\p{L}+|\\p{N}{1,2}|\\s+", "behavior", "Isolated"));
    t = build(r);
    assert_string_equal(pieces(t, "ab12312", false), "ab|12|3|1|2"); // \p{N}{1,2}: 12, 31, 2
    tok_free(t);
}

static json_t *added(int id, const char *content, bool special, bool lstrip, bool rstrip) {
    return json_pack("{s:i, s:s, s:b, s:b, s:b}", "id", id, "content", content, "special", special, "lstrip", lstrip,
                     "rstrip", rstrip);
}

static void test_added_tokens(void **state) {
    (void)state;
    json_t *r = bpe(NULL);
    json_object_set_new(r, "pre_tokenizer", byte_level_pre(true));
    json_object_set_new(r, "added_tokens",
                        json_pack("[o, o, o]", added(300, "<e>", true, false, false),
                                  added(301, "<e><f>", true, false, false), added(302, "[s]", false, true, true)));
    tok_tokenizer *t = build(r);
    assert_string_equal(pieces(t, "ab<e>c", false), "a|b|<e>|c");     // inside a word too
    assert_string_equal(pieces(t, "<e><f><e>", false), "<e><f>|<e>"); // the longest at one place
    assert_string_equal(pieces(t, "a  [s]  b", false), "a|[s]|b");    // lstrip, rstrip take the spaces
    assert_int_equal(tok_token_id(t, "<e>"), 300);
    assert_true(tok_is_special(t, 300));
    assert_false(tok_is_special(t, 302));
    assert_int_equal(tok_vocab_size(t), 303);
    // decode: special tokens kept or left out; the text comes back
    int32_t ids[] = {'h', 300, 'i', 302};
    char *text;
    size_t len;
    tok_err err;
    assert_int_equal(tok_decode(t, ids, 4, false, &text, &len, &err), 0);
    assert_string_equal(text, "h<e>i[s]");
    free(text);
    assert_int_equal(tok_decode(t, ids, 4, true, &text, &len, &err), 0);
    assert_string_equal(text, "hi[s]");
    free(text);
    tok_free(t);
}

static void test_templates(void **state) {
    (void)state;
    json_t *r = bpe(NULL);
    json_object_set_new(
        r, "added_tokens",
        json_pack("[o, o]", added(300, "<s>", true, false, false), added(301, "</s>", true, false, false)));
    json_t *tp =
        json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i]}, s:{s:s, s:[i]}}}",
                  "type", "TemplateProcessing", "single", "SpecialToken", "id", "<s>", "type_id", 0, "Sequence", "id",
                  "A", "type_id", 0, "SpecialToken", "id", "</s>", "type_id", 0, "special_tokens", "<s>", "id", "<s>",
                  "ids", 300, "</s>", "id", "</s>", "ids", 301);
    json_object_set_new(r, "post_processor",
                        json_pack("{s:s, s:[{s:s}, o]}", "type", "Sequence", "processors", "type", "ByteLevel", tp));
    tok_tokenizer *t = build(r);
    assert_string_equal(pieces(t, "hi", true), "<s>|h|i|</s>");
    assert_string_equal(pieces(t, "hi", false), "h|i");
    assert_string_equal(pieces(t, "", true), "<s>|</s>");
    tok_free(t);
    r = bpe(NULL);
    json_object_set_new(
        r, "post_processor",
        json_pack("{s:s, s:[s, i], s:[s, i]}", "type", "RobertaProcessing", "cls", "x", 'x', "sep", "y", 'y'));
    t = build(r);
    assert_string_equal(pieces(t, "a", true), "x|a|y");
    tok_free(t);
}

static void test_decode_bytes(void **state) {
    (void)state;
    const char *m[] = {"_ _", "__ __", NULL};
    json_t *r = bpe(m);
    json_object_set_new(r, "pre_tokenizer", byte_level_pre(true));
    tok_tokenizer *t = build(r);
    const char *texts[] = {"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80", "", "  \n\n\t x  ", "a\0b"};
    size_t lens[] = {strlen(texts[0]), 0, strlen(texts[2]), 3};
    for (int i = 0; i < 4; i++) {
        int32_t *ids;
        size_t n, len;
        char *back;
        tok_err err;
        assert_int_equal(tok_encode(t, texts[i], lens[i], false, &ids, &n, &err), 0);
        assert_int_equal(tok_decode(t, ids, n, false, &back, &len, &err), 0);
        assert_int_equal(len, lens[i]);
        assert_memory_equal(back, texts[i], lens[i]);
        free(ids), free(back);
    }
    // a generation stopped inside a character: its bytes become U+FFFD, the rest stays
    int32_t cut[] = {'a', 0xe6, 0x97, 'b', 0xff};
    char *text;
    size_t len;
    tok_err err;
    assert_int_equal(tok_decode(t, cut, 5, false, &text, &len, &err), 0);
    assert_string_equal(text, "a\xef\xbf\xbd"
                              "b\xef\xbf\xbd");
    free(text);
    int32_t bad[] = {'a', 999};
    assert_int_equal(tok_decode(t, bad, 2, false, &text, &len, &err), -1);
    assert_string_equal(err.msg, "ids: 999 (item 1) is not a token of this tokenizer");
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_encode(t, "a\xc3(", 3, false, &ids, &n, &err), -1);
    assert_string_equal(err.msg, "text: byte 1 is not valid UTF-8");
    tok_free(t);
}

static void test_unknown_characters(void **state) {
    (void)state;
    // no byte-level alphabet: a character outside the vocabulary is the unknown token, fused
    json_t *r = json_pack("{s:{s:s, s:{s:i, s:i, s:i, s:i}, s:[], s:s, s:b}}", "model", "type", "BPE", "vocab", "a", 0,
                          "<unk>", 1, "<0xC3>", 2, "<0xA9>", 3, "merges", "unk_token", "<unk>", "fuse_unk", 1);
    tok_tokenizer *t = build(r);
    assert_string_equal(pieces(t, "axya", false), "a|<unk>|a");
    tok_free(t);
    r = json_pack("{s:{s:s, s:{s:i, s:i, s:i, s:i}, s:[], s:s, s:b}}", "model", "type", "BPE", "vocab", "a", 0, "<unk>",
                  1, "<0xC3>", 2, "<0xA9>", 3, "merges", "unk_token", "<unk>", "byte_fallback", 1);
    t = build(r);
    assert_string_equal(pieces(t, "a\xc3\xa9x", false), "a|<0xC3>|<0xA9>|<unk>");
    tok_free(t);
}

static void test_long_texts(void **state) {
    (void)state;
    const char *m[] = {"_ _", "__ __", "____ ____", "a b", NULL};
    json_t *r = bpe(m);
    json_object_set_new(r, "pre_tokenizer", byte_level_pre(true));
    tok_tokenizer *t = build(r);
    char *text = malloc(100000);
    for (int k = 0; k < 2; k++) {
        // 100 kB of spaces (one word of 10^5 symbols), then of "ab " repeated
        size_t len = k == 0 ? 100000 : 99999;
        for (size_t i = 0; i < len; i++) text[i] = k == 0 ? ' ' : "ab "[i % 3];
        clock_t c0 = clock();
        int32_t *ids;
        size_t n, back_len;
        char *back;
        tok_err err;
        assert_int_equal(tok_encode(t, text, len, false, &ids, &n, &err), 0);
        assert_true((double)(clock() - c0) / CLOCKS_PER_SEC < 5);
        // 8-space tokens; "ab", then " ab" as _|ab, the last space alone
        assert_int_equal(n, k == 0 ? len / 8 : 2 * len / 3);
        assert_int_equal(tok_decode(t, ids, n, false, &back, &back_len, &err), 0);
        assert_int_equal(back_len, len);
        assert_memory_equal(back, text, len);
        free(ids), free(back);
    }
    free(text);
    tok_free(t);
}

// A malformed file: NULL, and one printable line that starts with the file's name.
static void refused(const char *json, const char *expect) {
    tok_err err;
    tok_tokenizer *t = tok_parse(json, strlen(json), "bad.json", &err);
    if (t) fail_msg("accepted: %s", json);
    if (!strstr(err.msg, expect)) fail_msg("'%s' does not say '%s'", err.msg, expect);
    assert_memory_equal(err.msg, "bad.json: ", 10);
    for (const char *p = err.msg; *p; p++) assert_true((unsigned char)*p >= 0x20);
}

#define MODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"

static void test_malformed_files(void **state) {
    (void)state;
    refused("{\"model\": ", "not JSON");
    refused("[1, 2]", "expected a JSON object");
    refused("{}", "model must be BPE");
    refused("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "not 'Unigram'");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}", "'a' must map to an id");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}}}", "id 0 is given to two tokens");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}}",
            "merges[0]: 'a', 'a' or their merge is not in the vocabulary");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}", "merges[0]: expected");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"dropout\": 0.1}}", "dropout");
    refused("{" MODEL ", \"normalizer\": {\"type\": \"NFC\"}}", "normalizer 'NFC' is not supported");
    refused("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Metaspace\"}}", "pre_tokenizer 'Metaspace' is not supported");
    refused("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": "
            "\"Isolated\"}}",
            "the regex does not compile at offset 1");
    refused("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": "
            "\"Sideways\"}}",
            "behavior must be");
    refused("{" MODEL ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
            "{\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {}}}",
            "special token '<s>' needs");
    refused("{" MODEL ", \"decoder\": {\"type\": \"WordPiece\"}}", "decoder 'WordPiece' is not supported");
    refused("{" MODEL ", \"added_tokens\": [{\"id\": 5}]}", "added_tokens[0] needs");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\\n\": 99999999}}}", "'a\\x0a' must map");
}

static void test_runaway_regex_stops(void **state) {
    (void)state;
    json_t *r = bpe(NULL);
    json_object_set_new(
        r, "pre_tokenizer",
        json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "Regex", "(a|aa)+$", "behavior", "Isolated"));
    tok_tokenizer *t = build(r);
    char text[64];
    memset(text, 'a', 60), text[60] = 'b', text[61] = 0;
    int32_t *ids;
    size_t n;
    tok_err err;
    clock_t c0 = clock();
    assert_int_equal(tok_encode(t, text, strlen(text), false, &ids, &n, &err), -1);
    assert_true((double)(clock() - c0) / CLOCKS_PER_SEC < 10);
    assert_non_null(strstr(err.msg, "text: a pre-tokenizer's regex failed"));
    tok_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merges_by_rank_and_leftmost),
        cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_byte_level_regex),
        cmocka_unit_test(test_split_behaviors),
        cmocka_unit_test(test_regex_split_and_digits),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_templates),
        cmocka_unit_test(test_decode_bytes),
        cmocka_unit_test(test_unknown_characters),
        cmocka_unit_test(test_long_texts),
        cmocka_unit_test(test_malformed_files),
        cmocka_unit_test(test_runaway_regex_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
