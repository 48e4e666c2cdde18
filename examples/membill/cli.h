// The membill command: options, the run's setup, and the output files.
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model.h"
#include "optim.h"
#include "profiler.h"

struct json_t;

// Exit codes (DESIGN.md): 0 success, 1 the run failed, 2 usage error.
enum { EXIT_RUN_FAILED = 1, EXIT_USAGE = 2 };

typedef struct {
    const char *command;
    const char *model, *config, *weights, *tokens;
    long batch, seq_len, steps, threads;
    uint64_t seed;
    const char *optimizer;
    double lr;
    bool lr_given, meta, help, quiet;
    uint64_t budget;
    const char *json, *timeline, *dump_grads, *save_weights;
    // membill plan
    long gpus, zero;
    uint64_t device_memory, overhead;
    bool overhead_given, list;
} cli_options;

// Parses argv[2..]; on a usage error prints one line and returns false.
bool cli_parse(cli_options *o, int argc, char **argv);
void cli_usage_train(FILE *f);
void cli_usage_plan(FILE *f);

// The config from --model / --config / --weights (a folder's config.json).
int cli_load_config(const cli_options *o, llama_config *cfg, char *st_path, size_t st_len,
                    llama_err *err);
// Token ids [batch * seq_len]: --tokens repeated over the batch, or seeded random ids.
int32_t *cli_make_tokens(const cli_options *o, const llama_config *cfg, long *batch, long *seq_len,
                         llama_err *err);

// Output files are written whole to a temporary name and renamed into place.
int cli_write_json(const char *path, struct json_t *root, char *err, size_t errlen);
int cli_write_timeline_csv(const char *path, char *err, size_t errlen);

// The shared parts of a report.
struct json_t *cli_model_json(const llama_config *cfg);

// One training run (load or init, N steps, teardown) inside an initialised profiler.
typedef struct {
    double forward_s, backward_s, optimizer_s, step_s, loss;
} step_record;

typedef struct {
    llama_config cfg;
    char st_path[4096]; // "" for random init
    int32_t *ids;       // batch * seq_len
    long batch, seq_len;
    optim_config ocfg;
    step_record *steps; // nsteps of them
    long nsteps;
    bool torn_down_clean; // every tensor category back at zero afterwards
} train_run;

int cli_train_run(const cli_options *o, train_run *r, llama_err *err);

int cmd_train(const cli_options *o);
int cmd_plan(const cli_options *o);
