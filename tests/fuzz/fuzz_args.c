// The command line's parsers on arbitrary arguments: the options table (cli_parse), the rules
// between options (cli_check_combinations) and the --tokens list (cli_parse_tokens). The first
// byte picks the subcommand, the rest is split at newlines into argv.
#include "cli.h"
#include "fuzz_util.h"

#define MAX_ARGS 64

// What the parsers printed: a refusal is one printable line naming the subcommand.
static void check_refusal(const char *out, size_t len, const char *command) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "membill %s: ", command);
    FZ_REQUIRE(len > 0 && out[len - 1] == '\n');
    FZ_REQUIRE(memchr(out, '\n', len) == out + len - 1);
    char *line = strndup(out, len - 1);
    FZ_REQUIRE(line);
    fz_check_message(line, prefix);
    free(line);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const cli_command *cmd = cli_command_at(data[0] % cli_command_count());
    char *text = malloc(size);
    FZ_REQUIRE(text);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    char *argv[MAX_ARGS + 2] = {"membill", (char *)cmd->name};
    int argc = 2;
    for (char *p = text; argc < MAX_ARGS + 2;) {
        argv[argc++] = p;
        char *nl = strchr(p, '\n');
        if (!nl) break;
        *nl = '\0';
        p = nl + 1;
    }
    // The parsers print refusals on stderr: catch them to check the one-line contract.
    char *out = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&out, &len), *saved = stderr;
    FZ_REQUIRE(mem);
    stderr = mem;
    static cli_options o;
    bool parsed = cli_parse(&o, cmd, argc, argv);
    bool ok = parsed && cli_check_combinations(&o);
    stderr = saved;
    fclose(mem);
    if (!ok)
        check_refusal(out, len, cmd->name);
    else
        FZ_REQUIRE(len == 0 && o.cmd == cmd->bit && (o.threads >= 1 || !(cmd->bit & (CLI_TRAIN | CLI_INFER))));
    free(out);
    // Every argument as an id list: ids on success, one printable line naming --tokens otherwise.
    for (int i = 2; i < argc; i++) {
        int32_t *ids = NULL;
        long n = 0;
        ag_err err = {""};
        int rc = cli_parse_tokens(argv[i], 49152, &ids, &n, &err);
        if (rc == 0) {
            FZ_REQUIRE(n >= 1 && ids);
            for (long k = 0; k < n; k++) FZ_REQUIRE(ids[k] >= 0 && ids[k] < 49152);
            free(ids);
        } else {
            FZ_REQUIRE(rc == EXIT_USAGE || rc == EXIT_RUN_FAILED);
            fz_check_message(err.msg, "--tokens");
        }
    }
    free(text);
    return 0;
}
