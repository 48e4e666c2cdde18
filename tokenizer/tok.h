// Hugging Face tokenizer.json, byte-level BPE: text to token ids and back, as the `tokenizers`
// library does for the GPT-2, SmolLM2 and Llama-3 families. It knows nothing of tensors or models.
//
// What it reads: the BPE model (vocab, merges as "a b" or ["a", "b"], ignore_merges, unk_token,
// byte_fallback, continuing_subword_prefix, end_of_word_suffix); the pre-tokenizers ByteLevel
// (with its GPT-2 regex), Split (a regex or a string, every behavior, invert), Digits and
// Sequence; the added tokens (special or not, lstrip, rstrip, single_word); the post-processors
// TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing and Sequence; the ByteLevel
// decoder. Regexes are Unicode, through PCRE2. Anything else (a normalizer, another model or
// decoder) is refused when the file is loaded, with one line naming it.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// A function that can fail returns -1 and leaves one printable line in msg, starting with the
// name of the input at fault (the file, or "text").
typedef struct {
    char msg[512];
} tok_err;

typedef struct tok_tokenizer tok_tokenizer;

// A tokenizer.json from its text (len bytes, no NUL needed); origin names it in messages. Reading
// the file is the caller's (membill reads every input through model.h's llama_read_file).
tok_tokenizer *tok_parse(const char *json, size_t len, const char *origin, tok_err *err);
void tok_free(tok_tokenizer *t); // NULL is ignored

// text (len bytes of UTF-8) into *ids (malloc'd, *n of them; an empty text gives *n = 0 and a
// non-NULL *ids). With add_special the post-processor adds its tokens (Llama-3's BOS), as
// tokenizer(text) does in transformers. Invalid UTF-8 is refused, naming the byte.
int tok_encode(const tok_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n,
               tok_err *err);
// ids back into *text (malloc'd, NUL-terminated, *len bytes, always valid UTF-8: bytes that do not
// form UTF-8 become U+FFFD, as the library's lossy decoding does). skip_special leaves out the
// special tokens. An id the tokenizer does not have is refused.
int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **text, size_t *len,
               tok_err *err);

// One past the largest id of the vocabulary and the added tokens.
int32_t tok_vocab_size(const tok_tokenizer *t);
// The token's string (byte-level form, as in the file); NULL for an id it does not have.
const char *tok_token(const tok_tokenizer *t, int32_t id);
// The id of a token string (vocabulary or added token); -1 if none.
int32_t tok_token_id(const tok_tokenizer *t, const char *token);
bool tok_is_special(const tok_tokenizer *t, int32_t id);
