// membill: how much memory training a Llama-family model takes, and where it goes.
#include "cli.h"

#include <string.h>

static void usage(FILE *f) {
    fputs("usage: membill COMMAND [options]\n\n"
          "  train    one real training step (forward, loss, backward, optimizer), billed byte by byte\n"
          "  infer    generation (prefill + greedy decode with a KV cache), billed the same way\n"
          "  compare  the training step and inference of the same model side by side\n"
          "  check    every claim of the lessons that a run can measure: pass or fail\n"
          "  plan     the same bill for any model and setting, on shapes alone, with the closed form\n\n"
          "membill COMMAND --help describes a command's options.\n",
          f);
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("membill %s\n", MEMBILL_VERSION);
        return 0;
    }
    cli_options o;
    memset(&o, 0, sizeof o);
    o.command = argv[1];
    static const struct {
        const char *name;
        int (*run)(const cli_options *);
    } commands[] = {{"train", cmd_train}, {"infer", cmd_infer}, {"compare", cmd_compare}, {"check", cmd_check}, {"plan", cmd_plan}};
    int (*run)(const cli_options *) = NULL;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(o.command, commands[i].name) == 0) run = commands[i].run;
    if (!run) {
        fprintf(stderr, "membill: unknown command '%s' (see membill --help)\n", o.command);
        return EXIT_USAGE;
    }
    if (!cli_parse(&o, argc, argv)) return EXIT_USAGE;
    return run(&o);
}
