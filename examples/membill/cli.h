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
    const char *json, *timeline, *dump_grads, *save_weights, *svg, *trace, *html;
    bool explain;
    bool checkpointing; // membill train and plan: full activation recomputation
    // membill plan
    long gpus, zero;
    // membill infer
    long new_tokens;
    bool no_cache;
    // membill check
    bool no_speed;
    uint64_t device_memory, overhead;
    bool overhead_given, list;
    // --dtype, and for inference the weights' own (--weight-dtype, --group-size)
    const char *dtype, *weight_dtype;
    long group_size;
    bool infer;
} cli_options;

// What each category is billed at. Real runs compute in float32; the others are bills of
// meta mode (the same code, allocations at these element sizes).
typedef struct {
    const char *name;      // as --dtype names it: "fp32", "bf16", "bf16-mixed", ...
    const char *long_name; // for reports: "float32", "bfloat16", ...
    int act_bits, weight_bits, grad_bits; // activations and cache, parameters, .grad
    int state_bits;                       // optimizer state elements
    bool master;                          // a float32 master copy of the weights (mixed precision)
    int64_t group;                        // weights under 16 bits: elements of a row per scale
    int scale_bytes;                      // bytes of one such scale (fp16: 2)
    const char *weight_name;              // --weight-dtype ("int4", ...); NULL: as name
} cli_dtype;

// fp32, bf16, fp16, bf16-mixed, fp16-mixed, bf16-mixed-fp32-grads; NULL is fp32. False for
// anything else.
bool cli_parse_dtype(const char *name, cli_dtype *out);
// --weight-dtype fp32|bf16|fp16|int8|int4 over d (int4: one fp16 scale per group of
// group_size, 0 for the default 32). False for anything else.
bool cli_parse_weight_dtype(const char *name, long group_size, cli_dtype *d);
bool cli_dtype_is_f32(const cli_dtype *d);
ag_meta_dtype cli_meta_dtype(const cli_dtype *d);
// The optimizer state as the dtype keeps it (16-bit states in a pure 16-bit run, a master copy
// in mixed precision).
void cli_dtype_optim(const cli_dtype *d, optim_config *c);
// The sum of the state of one parameter element, "2 + 2 + 4 + 4 + 4" style, into buf.
const char *cli_dtype_bytes_text(const cli_dtype *d, optim_kind kind, char *buf, size_t len);

// Parses argv[2..]; on a usage error prints one line and returns false.
bool cli_parse(cli_options *o, int argc, char **argv);
void cli_usage_train(FILE *f);
void cli_usage_plan(FILE *f);

// The config from --model / --config / --weights (a folder's config.json).
// After a run that succeeded: plain malloc past the budget cannot be refused when it happens, so
// the run fails here (mp_oom()). Returns 0, or -1 with the message in err.
int cli_budget_check(ag_err *err);
int cli_load_config(const cli_options *o, llama_config *cfg, char *st_path, size_t st_len,
                    ag_err *err);
// "1,2,3" -> ids (malloc'd); a malformed list names the item at fault.
int cli_parse_tokens(const char *text, int32_t **out, long *n, ag_err *err);
// Token ids [batch * seq_len]: --tokens repeated over the batch, or seeded random ids.
int32_t *cli_make_tokens(const cli_options *o, const llama_config *cfg, long *batch, long *seq_len,
                         ag_err *err);

// Output files are written whole to a temporary name and renamed into place ("-": stdout).
typedef int (*cli_writer)(FILE *f, void *arg);
int cli_write_file(const char *path, cli_writer fn, void *arg, char *err, size_t errlen);
int cli_write_svg(const char *path, const char *title, char *err, size_t errlen);
int cli_svg_to(FILE *f, void *title);
int cli_svg_scaled(FILE *f, const char *title, double scale);
typedef void (*cli_text_fn)(FILE *f, const void *arg);
int cli_write_html(const char *path, const char *title, cli_text_fn text, const void *arg, char *err, size_t errlen);
// Every output file the options ask for, after a successful run; the first failure is returned.
int cli_write_outputs(const cli_options *o, struct json_t *root, const char *title, cli_text_fn text,
                      const void *arg, char *err, size_t errlen);
int cli_write_trace(const char *path, char *err, size_t errlen);
void cli_xml_escape(FILE *f, const char *s);
int cli_write_json(const char *path, struct json_t *root, char *err, size_t errlen);
int cli_write_timeline_csv(const char *path, char *err, size_t errlen);

// The shared parts of a report.
struct json_t *cli_model_json(const llama_config *cfg);
// A report's first keys: membill_version and model.
struct json_t *cli_report_root(const llama_config *cfg);

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
    cli_dtype dtype;      // name NULL: float32 (meta mode needed for anything else)
} train_run;

int cli_train_run(const cli_options *o, train_run *r, ag_err *err);

// Which tensors held the memory at a moment of the timeline, summed across blocks.
#define CLI_KIND_MAX 112
typedef struct {
    char kind[CLI_KIND_MAX]; // the site label with the block number as "*"
    uint8_t category;
    uint64_t bytes;
    size_t sites;
} cli_site_row;
size_t cli_breakdown(size_t events, mp_category cat, cli_site_row *rows, size_t cap, uint64_t *per_block,
                     long layers);
void cli_breakdown_text(FILE *f, long layers);
struct json_t *cli_breakdown_json(long layers);

// --explain: each category's formula worked out for this model, and the lessons' claims.
void cli_explain_train(FILE *f, const llama_config *cfg, long batch, long seq_len, optim_kind kind);

// One generation (build or load the model, prefill and greedy decode, teardown) inside an
// initialised profiler.
typedef struct {
    llama_config cfg;
    char st_path[4096];
    int32_t *ids, *mask; // batch x seq_len prompts, left-padded (mask 0 on pads)
    long batch, seq_len, new_tokens;
    bool use_cache;
    int32_t *out; // batch x new_tokens
    llama_generate_stats stats;
    bool torn_down_clean;
    cli_dtype dtype; // name NULL: float32 (meta mode needed for anything else)
} infer_run;

int cli_infer_prepare(const cli_options *o, infer_run *r, ag_err *err);
int cli_infer_run(const cli_options *o, infer_run *r, ag_err *err);
// --dtype (fp32, bf16, fp16: activations and cache) and --weight-dtype / --group-size of a
// generation into *d; a usage error fills msg and returns -1. Anything but float32 needs meta.
int cli_infer_dtype(const cli_options *o, bool meta, cli_dtype *d, char *msg, size_t len);
void cli_infer_free(infer_run *r);
void cli_usage_infer(FILE *f);

int cmd_train(const cli_options *o);
int cmd_infer(const cli_options *o);
int cmd_compare(const cli_options *o);
int cmd_check(const cli_options *o);
int cmd_plan(const cli_options *o);
