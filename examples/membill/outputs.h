// Output files that never damage anything (provisional).
#pragma once

#include <stdio.h>

#include "autograd.h"

typedef struct cli_outputs cli_outputs;
cli_outputs *cli_outputs_new(void);
int cli_outputs_add(cli_outputs *s, const char *option, const char *path, ag_err *err);
int cli_outputs_input(cli_outputs *s, const char *option, const char *path, ag_err *err);
int cli_outputs_write(cli_outputs *s, const char *option, int (*fn)(FILE *, void *), void *arg, ag_err *err);
int cli_outputs_commit(cli_outputs *s, ag_err *err);
void cli_outputs_free(cli_outputs *s);

// Writers for cli_outputs_write.
int cli_json_writer(FILE *f, void *json_root);
int cli_csv_writer(FILE *f, void *unused);
int cli_svg_to(FILE *f, void *title);
int cli_trace_writer(FILE *f, void *unused);
typedef struct {
    const char *title;
    void (*text)(FILE *f, const void *arg);
    const void *arg;
} cli_html_args;
int cli_html_writer(FILE *f, void *html_args);
// Old path-based writers, still used by plan and check until they move to cli_outputs.
int cli_write_file(const char *path, int (*fn)(FILE *, void *), void *arg, char *err, size_t errlen);
#include "model.h"
int llama_model_save_file(const llama_model *m, FILE *f, bool grads, ag_err *err);
