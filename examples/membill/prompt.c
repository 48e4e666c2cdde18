// Text in and out of a run: --prompt / --prompt-file through the tokenizer (--tokenizer, or the
// model folder's tokenizer.json), the end-of-text ids a generation stops at, and the generated
// ids back to text.
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tok.h"

// The model folder: the --weights folder, else the folder of --config; "" when there is none
// (or its name does not fit).
#define FOLDER_MAX 4000
static void model_folder(const cli_options *o, char dir[FOLDER_MAX]) {
    struct stat st;
    dir[0] = 0;
    if (o->weights && stat(o->weights, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (snprintf(dir, FOLDER_MAX, "%s", o->weights) >= FOLDER_MAX) dir[0] = 0;
    } else if (o->config) {
        char *copy = strdup(o->config);
        if (copy && snprintf(dir, FOLDER_MAX, "%s", dirname(copy)) >= FOLDER_MAX) dir[0] = 0;
        free(copy);
    }
}

// Files a run reads whole: a tokenizer.json, a prompt file (besides the config.json and the
// generation_config.json the end-of-text ids come from, at most 16 MiB each).
#define TOKENIZER_MAX (512u << 20)
#define PROMPT_FILE_MAX (1u << 30)

// The model folder's tokenizer.json is absent (a FIFO or a device there is not "absent": reading
// it then says what it is).
static bool absent(const char *path) {
    struct stat st;
    return stat(path, &st) != 0 && (errno == ENOENT || errno == ENOTDIR);
}

static int load_tokenizer(const cli_options *o, cli_text *t, ag_err *err) {
    char dir[FOLDER_MAX];
    model_folder(o, dir);
    if (o->tokenizer)
        snprintf(t->tokenizer_path, sizeof t->tokenizer_path, "%s", o->tokenizer);
    else if (dir[0])
        snprintf(t->tokenizer_path, sizeof t->tokenizer_path, "%s/tokenizer.json", dir);
    if (!o->tokenizer && !dir[0]) {
        ag_err_set(err, "a prompt needs a tokenizer: --tokenizer FILE, or a --weights folder holding tokenizer.json");
        return EXIT_USAGE;
    }
    if (!o->tokenizer && absent(t->tokenizer_path)) {
        ag_err_set(err,
                   "a prompt needs a tokenizer: --tokenizer FILE, or tokenizer.json in the model folder (%s has none)",
                   dir);
        return EXIT_RUN_FAILED;
    }
    const char *opt = o->tokenizer ? "--tokenizer " : "";
    char *json = NULL;
    size_t len = 0;
    ag_err e;
    if (llama_read_file(t->tokenizer_path, "a tokenizer.json", TOKENIZER_MAX, &json, &len, &e) != 0) {
        ag_err_set(err, "%s%s", opt, e.msg);
        return EXIT_RUN_FAILED;
    }
    tok_err te;
    t->tok = tok_parse(json, len, t->tokenizer_path, &te);
    free(json);
    if (!t->tok) {
        ag_err_set(err, "%s%s", opt, te.msg);
        return EXIT_RUN_FAILED;
    }
    return 0;
}

// The prompt's bytes: --prompt as given, or the whole --prompt-file.
static int prompt_bytes(const cli_options *o, char **text, size_t *len, ag_err *err) {
    if (o->prompt) {
        *len = strlen(o->prompt);
        *text = strdup(o->prompt);
        return *text ? 0 : (ag_err_set(err, "out of memory"), EXIT_RUN_FAILED);
    }
    ag_err e;
    if (llama_read_file(o->prompt_file, "a prompt file", PROMPT_FILE_MAX, text, len, &e) != 0) {
        ag_err_set(err, "--prompt-file %s", e.msg);
        return EXIT_RUN_FAILED;
    }
    return 0;
}

static int encode_prompt(const cli_options *o, cli_text *t, ag_err *err) {
    char *text = NULL;
    size_t len = 0, n = 0;
    int rc = prompt_bytes(o, &text, &len, err);
    tok_err te;
    if (rc == 0 && tok_encode(t->tok, text, len, true, &t->ids, &n, &te) != 0) {
        ag_err_set(err, "%s: %s", o->prompt ? "--prompt" : o->prompt_file, te.msg);
        rc = EXIT_RUN_FAILED;
    }
    free(text);
    if (rc == 0 && n == 0) {
        ag_err_set(err, "%s: the prompt gives no tokens (an empty text, and a tokenizer that adds none)",
                   o->prompt ? "--prompt" : o->prompt_file);
        rc = EXIT_RUN_FAILED;
    }
    t->n = (long)n;
    return rc;
}

// End of text: the config's eos_token_id and the model folder's generation_config.json (when it
// is there), each id checked against the vocabulary.
static int find_eos(const cli_options *o, int64_t vocab, cli_text *t, ag_err *err) {
    char dir[FOLDER_MAX], path[FOLDER_MAX + 32];
    model_folder(o, dir);
    const char *cfg = o->config;
    if (!cfg && dir[0]) snprintf(path, sizeof path, "%s/config.json", dir), cfg = path;
    if (cfg && llama_eos_load(cfg, vocab, &t->eos, err) != 0) return EXIT_RUN_FAILED;
    if (!dir[0]) return 0;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    return absent(path) || llama_eos_load(path, vocab, &t->eos, err) == 0 ? 0 : EXIT_RUN_FAILED;
}

int cli_text_prepare(const cli_options *o, const llama_config *cfg, cli_text *t, ag_err *err) {
    memset(t, 0, sizeof *t);
    int rc = o->cmd == CLI_INFER && !o->ignore_eos && !o->meta ? find_eos(o, cfg->vocab, t, err) : 0;
    if (rc != 0 || (!o->prompt && !o->prompt_file && !o->tokenizer)) return rc;
    rc = load_tokenizer(o, t, err);
    if (rc == 0 && (o->prompt || o->prompt_file)) rc = encode_prompt(o, t, err);
    return rc;
}

void cli_text_free(cli_text *t) {
    tok_free(t->tok);
    free(t->ids);
    memset(t, 0, sizeof *t);
}

bool cli_text_is_eos(const cli_text *t, int32_t id) {
    for (int k = 0; k < t->eos.n; k++)
        if (t->eos.ids[k] == id) return true;
    return false;
}

json_t *cli_prompt_ids_json(const cli_text *t, long batch) {
    json_t *rows = json_array();
    for (long b = 0; b < batch && t->ids; b++) {
        json_t *row = json_array();
        for (long i = 0; i < t->n; i++) json_array_append_new(row, json_integer(t->ids[i]));
        json_array_append_new(rows, row);
    }
    return rows;
}

char *cli_text_decode(const cli_text *t, const int32_t *ids, long n) {
    char *text = NULL;
    size_t len;
    tok_err te;
    if (!t->tok || tok_decode(t->tok, ids, (size_t)n, true, &text, &len, &te) != 0) return NULL;
    return text;
}

void cli_text_line(FILE *f, const cli_text *t) {
    if (t->ids) fprintf(f, "prompt: %ld tokens through %s\n", t->n, t->tokenizer_path);
}
