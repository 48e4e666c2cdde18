// membill: how much memory training a Llama-family model takes, and where it goes.
#include "cli.h"

#include <string.h>

// membill help [COMMAND | frameworks [--markdown] | --markdown]
static int help(int argc, char **argv) {
    if (argc < 3) {
        cli_usage_all(stdout);
        return 0;
    }
    if (strcmp(argv[2], "--markdown") == 0) {
        cli_options_markdown(stdout);
        return 0;
    }
    if (strcmp(argv[2], "frameworks") == 0) {
        const bool markdown = argc == 4 && strcmp(argv[3], "--markdown") == 0;
        if (argc > 3 && !markdown) {
            fprintf(stderr, "membill help frameworks: unexpected argument '%s' (only --markdown)\n", argv[3]);
            return EXIT_USAGE;
        }
        cli_frameworks_help(stdout, markdown);
        return 0;
    }
    const cli_command *c = cli_find_command(argv[2]);
    if (!c || argc > 3) {
        char hint[96];
        fprintf(stderr,
                "membill help: %s '%s'%s (commands: train, infer, compare, check, plan, snapshot; or frameworks)\n",
                c ? "unexpected argument" : "unknown command", argv[c ? 3 : 2],
                c ? "" : cli_did_you_mean(hint, sizeof hint, argv[2], cli_command_name, cli_command_count()));
        return EXIT_USAGE;
    }
    cli_usage(stdout, c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        cli_usage_all(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0)
        return help(strcmp(argv[1], "help") == 0 ? argc : 2, argv);
    if (strcmp(argv[1], "--version") == 0) {
        printf("membill %s\n", MEMBILL_VERSION);
        return 0;
    }
    const cli_command *cmd = cli_find_command(argv[1]);
    if (!cmd) {
        char hint[96];
        const char *mean = cli_did_you_mean(hint, sizeof hint, argv[1], cli_command_name, cli_command_count());
        fprintf(stderr, "membill: unknown command '%s'%s\n", argv[1], *mean ? mean : " (see membill --help)");
        return EXIT_USAGE;
    }
    static cli_options o;
    if (!cli_parse(&o, cmd, argc, argv)) return EXIT_USAGE;
    if (o.help) {
        cli_usage(stdout, cmd);
        return fflush(stdout) == 0 && !ferror(stdout) ? 0 : EXIT_RUN_FAILED;
    }
    if (!cli_check_combinations(&o)) return EXIT_USAGE;
    cli_catch_interrupts(&o);
    int rc = 0;
    if (!o.list && llama_hub_is_id(o.model) && (rc = cli_hub_prepare(&o)) != 0) return rc;
    if ((rc = cli_weight_dtype_auto(&o)) != 0) return rc;
    static int (*const run[])(const cli_options *) = {cmd_train, cmd_infer, cmd_compare,
                                                      cmd_plan,  cmd_check, cmd_snapshot};
    int i = 0;
    while ((1 << i) != (int)cmd->bit) i++;
    rc = run[i](&o);
    // A report nobody could read is a failed run (a full disk, /dev/full, a closed pipe).
    if (fflush(stdout) != 0 || ferror(stdout)) {
        if (rc == 0) fprintf(stderr, "membill %s: stdout: write failed (%m)\n", o.command);
        rc = EXIT_RUN_FAILED;
    }
    return rc;
}
