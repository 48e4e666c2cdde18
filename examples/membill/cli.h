// The membill command: options, the run's setup, and the output files.
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model.h"
#include "optim.h"
#include "profiler.h"

struct json_t;
typedef struct cli_device cli_device; // device.c

// Exit codes (DESIGN.md): 0 success, 1 the run failed, 2 usage error.
enum { EXIT_RUN_FAILED = 1, EXIT_USAGE = 2 };

// The subcommands, as bits of an option's set of commands.
typedef enum {
    CLI_TRAIN = 1,
    CLI_INFER = 2,
    CLI_COMPARE = 4,
    CLI_PLAN = 8,
    CLI_CHECK = 16,
    CLI_SNAPSHOT = 32
} cli_command_bit;

typedef struct {
    const char *name;
    cli_command_bit bit;
    const char *summary, *description;
} cli_command;

const cli_command *cli_find_command(const char *name); // NULL if unknown
size_t cli_command_count(void);
const cli_command *cli_command_at(size_t i);
const char *cli_command_name(size_t i); // NULL past the end

// "Did you mean" (suggest.c): of the count names name(i) gives, the one closest to typed (a few
// edits at most, case aside: --seqlen, trian, llama3-8b), else NULL; and that as
// " (did you mean NAME?)" in buf, else "".
const char *cli_suggest(const char *typed, const char *(*name)(size_t i), size_t count);
const char *cli_did_you_mean(char *buf, size_t len, const char *typed, const char *(*name)(size_t i), size_t count);

#define CLI_MAX_OPTIONS 96

typedef struct cli_hub cli_hub;

// Every option's value after parsing, the table's defaults applied (options.c). A field of an
// option the subcommand does not take stays zero.
typedef struct {
    const char *command;
    cli_command_bit cmd;
    const char *model, *config, *weights, *tokens, *prompt, *prompt_file, *tokenizer;
    long batch, seq_len, steps, threads, new_tokens, gpus, zero, group_size, bucket_mb, prefetch_layers, grad_accum, ep;
    const char *fsdp, *offload; // NULL: none
    uint64_t seed, budget, device_memory, overhead;
    const char *optimizer, *adam_impl, *dtype, *weight_dtype, *framework, *attention;
    double lr;
    bool meta, help, quiet, explain, checkpointing, no_cache, no_speed, list, infer, progress, ignore_eos;
    const char *json, *timeline, *dump_grads, *save_weights, *svg, *trace, *html;
    long lora_rank;
    double lora_alpha, lora_dropout;
    const char *lora_targets, *base_dtype, *adapter, *save_adapter, *adapter_dtype;
    bool lora;
    const char *routing, *routing_out;
    const char *mla_cache; // --mla-cache: "expanded" or "latent"
    const char *device, *gpu, *cuda_alloc_conf, *seq_lens, *snapshot, *against;
    double memory_fraction;
    bool list_gpus;
    const char *input; // membill snapshot's FILE
    bool download, offline;
    cli_hub *hub; // --model org/name: what the cache and the Hub gave (hub_cli.c); NULL for a preset
    unsigned char given[CLI_MAX_OPTIONS]; // by table row: the user named it
    int argc;                             // the command line parsed (argv[2..] are the options)
    char *const *argv;
} cli_options;

// argv[2..] into *o; a usage error prints one line ("membill train: ...") and returns false.
bool cli_parse(cli_options *o, const cli_command *cmd, int argc, char **argv);
bool cli_given(const cli_options *o, const char *name); // the user named the option
// The options that only make sense together, checked in one place; false after one line.
bool cli_check_combinations(const cli_options *o);
// A sharded data-parallel run: --zero or --fsdp given.
bool cli_sharded(const cli_options *o);
void cli_usage(FILE *f, const cli_command *cmd);
void cli_usage_all(FILE *f);
void cli_options_markdown(FILE *f);
// "membill <command>: <message>" on stderr, control characters escaped.
void cli_usage_error(const cli_options *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// --framework: "pytorch", "pytorch-1.13", "pytorch-2.0", "lean" (NULL is pytorch). False for anything else.
bool cli_parse_framework(const char *name, ag_framework *out);
const char *cli_framework_name(ag_framework f);
// One line for reports: the name and what it means.
// The framework line: the row's text, with the family's transformers class for the PyTorch
// ones ("MixtralForCausalLM"), into buf.
const char *cli_framework_text(ag_framework f, llama_family family, char *buf, size_t len);
// --framework's choices ("pytorch|pytorch-1.13|lean", the default first) and help, from the rows.
const char *cli_framework_choices(void);
const char *cli_framework_help(void);
// membill help frameworks [--markdown]: every field of every row, in words (the default row
// first), as text or as a Markdown table (a line a field, a column a framework); as text, the
// devices and their SDPA kernels after it.
void cli_frameworks_help(FILE *f, bool markdown);
// The same table for any rows: n rows, their names as the labels.
void cli_frameworks_table(FILE *f, const ag_framework_row *const rows[], int n, bool markdown);
void cli_devices_help(FILE *f); // the devices and their SDPA kernels (membill help frameworks)
// The framework a run bills when --framework is not given.
#define CLI_DEFAULT_FRAMEWORK AG_FRAMEWORK_PYTORCH
// --attention: "eager", "flash" (NULL is eager). False for anything else.
bool cli_parse_attention(const char *name, ag_attention_kind *out);
// CUDA's kernels under --device cuda or --gpu, the CPU's otherwise.
ag_device cli_device_kind(const cli_options *o);
const char *cli_attention_name(ag_attention_kind a);
const char *cli_attention_text(ag_attention_kind a);

// What each category is billed at. Real runs compute in float32; the others are bills of
// meta mode (the same code, allocations at these element sizes).
typedef struct {
    const char *name;                     // as --dtype names it: "fp32", "bf16", "bf16-mixed", ...
    const char *long_name;                // for reports: "float32", "bfloat16", ...
    int act_bits, weight_bits, grad_bits; // activations and cache, parameters, .grad
    int state_bits;                       // optimizer state elements
    bool master;                          // a float32 master copy of the weights (mixed precision)
    int64_t group;                        // weights under 16 bits: elements of a row per scale
    int scale_bytes;                      // bytes of one such scale (fp16: 2)
    const char *weight_name;              // --weight-dtype ("int4", ...); NULL: as name
    bool autocast;                        // float32 parameters under torch.autocast(bfloat16)
} cli_dtype;

// fp32, bf16, fp16, bf16-mixed, fp16-mixed, bf16-mixed-fp32-grads; NULL is fp32. False for
// anything else.
bool cli_parse_dtype(const char *name, cli_dtype *out);
// --weight-dtype fp32|bf16|fp16|int8|int4 over d (int4: one fp16 scale per group of
// group_size, 0 for the default 32). False for anything else.
bool cli_parse_weight_dtype(const char *name, long group_size, cli_dtype *d);
bool cli_dtype_is_f32(const cli_dtype *d);
ag_precision cli_precision(const cli_dtype *d);
// The optimizer state as the dtype keeps it (16-bit states in a pure 16-bit run, a master copy
// in mixed precision).
void cli_dtype_optim(const cli_dtype *d, optim_config *c);
// The sum of the state of one parameter element, "2 + 2 + 4 + 4 + 4" style, into buf.
const char *cli_dtype_bytes_text(const cli_dtype *d, optim_kind kind, char *buf, size_t len);

// --model org/name[@revision] (hub_cli.c): config.json from the Hugging Face cache, else the Hub,
// and what the command needs beside it (tokenizer.json for a prompt, generation_config.json for a
// generation, the checkpoint's headers for plan and --weight-dtype auto, the weights with
// --download), pointed at by o->config and o->weights; o->hub keeps the rest. An exit code, after
// its one line on stderr.
int cli_hub_prepare(cli_options *o);
// --weight-dtype auto: the checkpoint's dtype (the Hub id's, or --weights'); an exit code.
int cli_weight_dtype_auto(cli_options *o);
const char *cli_hub_name(const cli_hub *h);    // "org/name[@revision]"
void cli_hub_text(FILE *f, const cli_hub *h);  // "checkpoint: ..." when its headers were read
struct json_t *cli_hub_json(const cli_hub *h); // {"id", "revision", "commit", "snapshot", "checkpoint"}

// What a run is made of (setup.c). These return an exit code (docs/cli.md): 0, EXIT_USAGE when
// the command line alone shows the fault (an unknown preset, a malformed id list) or
// EXIT_RUN_FAILED when an input does (a file that cannot be read, an id or a length the model
// does not have), with the message in *err.
int cli_load_config(const cli_options *o, llama_config *cfg, char *st_path, size_t st_len, ag_err *err);
// The end of a run, after its teardown: whether every tensor category is back at zero, and, for
// a run that succeeded, plain malloc past the budget (which cannot be refused when it happens)
// failing it now. Returns rc, or -1 with the message in err.
int cli_run_end(int rc, bool *clean, ag_err *err);
// --seq-lens "512,2048" -> lengths (malloc'd), each from min to max; a malformed list names the
// item at fault (EXIT_USAGE).
int cli_parse_seq_lens(const char *text, long min, long max, long **out, long *n, ag_err *err);
// "1,2,3" -> ids (malloc'd). Returns 0, EXIT_USAGE for a malformed list or an id past any
// vocabulary (LLAMA_MAX_VOCAB), EXIT_RUN_FAILED for an id past vocab (0: not checked), the
// message naming the item at fault.
int cli_parse_tokens(const char *text, int64_t vocab, int32_t **out, long *n, ag_err *err);

// Text in and out (prompt.c): the tokenizer, the prompt's ids, the ids a generation stops at.
typedef struct {
    struct tok_tokenizer *tok; // NULL: neither --prompt, --prompt-file nor --tokenizer
    char tokenizer_path[4096];
    int32_t *ids; // the prompt's ids, one row (NULL without a prompt)
    long n;
    llama_eos eos; // infer: eos_token_id of config.json and generation_config.json (none: --ignore-eos, meta)
} cli_text;
// An exit code, with the message in *err; cfg is the run's model (its vocabulary bounds the
// end-of-text ids).
int cli_text_prepare(const cli_options *o, const llama_config *cfg, cli_text *t, ag_err *err);
void cli_text_free(cli_text *t);
bool cli_text_is_eos(const cli_text *t, int32_t id);
struct json_t *cli_prompt_ids_json(const cli_text *t, long batch);    // the prompt per batch row
char *cli_text_decode(const cli_text *t, const int32_t *ids, long n); // malloc'd; NULL without a tokenizer
void cli_text_line(FILE *f, const cli_text *t);                       // "prompt: N tokens through FILE"

// Token ids [batch * seq_len]: the prompt's ids (text->ids), --tokens, repeated over the batch,
// or seeded random ids. In meta mode no ids are made (*ids NULL): a bill of shapes takes no
// memory per token.
int cli_make_tokens(const cli_options *o, const llama_config *cfg, const cli_text *text, bool meta, int32_t **ids,
                    long *batch, long *seq_len, ag_err *err);

// The timeline as a stacked-area SVG of fixed aspect (CLI_SVG_W x CLI_SVG_H, scaling to the page):
// scale is the highest total the vertical axis must hold (0: this run's own peak), so that two
// charts can share one; normalised puts the share of the run on the horizontal axis instead of
// seconds (or events, in meta mode), so that runs of different lengths share one axis too.
#define CLI_SVG_W 1080
#define CLI_SVG_H 620
int cli_svg_chart(FILE *f, const char *title, double scale, bool normalised);
int cli_svg_scaled(FILE *f, const char *title, double scale);
typedef void (*cli_text_fn)(FILE *f, const void *arg);
void cli_xml_escape(FILE *f, const char *s);
// 1234567 -> "1,234,567" in buf.
const char *cli_commas(char *buf, size_t len, uint64_t v);

// The shared parts of a report.
struct json_t *cli_model_json(const llama_config *cfg);
// A report's first keys: membill_version and model.
struct json_t *cli_report_root(const llama_config *cfg);

// The roles of saved tensors, as tests/reference names PyTorch's (roles.c).
enum {
    CLI_ROLE_AUTOCAST_WEIGHT_CAST,
    CLI_ROLE_EMBED,
    CLI_ROLE_NORM,
    CLI_ROLE_RESIDUAL,
    CLI_ROLE_ATTN_QKV,
    CLI_ROLE_ATTN_ROPE,
    CLI_ROLE_ATTN_REPEAT_KV,
    CLI_ROLE_ATTN_PROBS,
    CLI_ROLE_ATTN_CONTEXT,
    CLI_ROLE_MLP,
    CLI_ROLE_FINAL_NORM,
    CLI_ROLE_LOGITS,
    CLI_ROLE_LOSS,
    CLI_ROLE_ROPE_COS_SIN,
    CLI_ROLE_LORA,  // an adapter's own tensors (its input dropped out, A's output)
    CLI_ROLE_CACHE, // k and v that the DynamicCache holds and the attention keeps as they are
    CLI_ROLE_MASK,  // the causal mask and the positions (checkpointed layers keep them)
    CLI_ROLE_MOE,   // a sparse block's router, routing and experts
    CLI_ROLE_OTHER,
    CLI_NROLES
};
const char *cli_role_name(int role);
// The activation bytes the tape saves, each tensor once, by role; -1 if out of memory.
int cli_saved_by_role(const ag_ctx *ctx, uint64_t bytes[CLI_NROLES]);

// One training run (load or init, N steps, teardown) inside an initialised profiler.
typedef struct {
    double zero_grad_s, forward_s, backward_s, optimizer_s, step_s, loss;
    int phases_done;  // 0 to 3: forward, backward, optimizer finished
    size_t events[4]; // the timeline's length at the step's start and after each phase
    // PYTORCH frameworks: the timeline's length before and after the zero_grad that opens the
    // step (events[0] is then the forward's start); zeros when the step has none.
    size_t zero_grad_events[2];
    bool zero_grad;                     // the step opened with zero_grad
    uint64_t saved_by_role[CLI_NROLES]; // what the tape saved when the forward ended
} step_record;

// Writes --dump-grads (grads) or --save-weights of the model; NULL: the run writes neither.
typedef int (*cli_save_fn)(void *arg, const llama_model *m, bool grads, ag_err *err);

// LoRA and QLoRA (lora_cli.c): the adapters, the frozen base's storage, an adapter to load.
typedef struct {
    llama_lora_config cfg;  // rank 0: every parameter trains
    const char *base_dtype; // NULL: the base as --dtype; "nf4", "int4", "int8" (meta mode only)
    char adapter[4096];     // --adapter DIR, "" for none
} cli_lora;

// --lora-* and --adapter into *l (an adapter's adapter_config.json fills what was not given);
// an exit code with the message in *err.
int cli_lora_from_options(const cli_options *o, cli_lora *l, ag_err *err);
// The frozen base's linear weights under base_dtype over the run's dtype; false for none.
bool cli_lora_base_dtype(const cli_lora *l, const cli_dtype *d, ag_precision *out);
// "LoRA r 8, alpha 16 (scale 2), dropout 0, targets q_proj,v_proj" (and the base's dtype).
const char *cli_lora_text(const llama_config *cfg, const cli_lora *l, char *buf, size_t len);
// PEFT's print_trainable_parameters line and the frozen share, for a model of cfg under l.
void cli_lora_params_text(FILE *f, const llama_config *cfg, const cli_lora *l);
// The adapters' weights, gradients and optimizer state by site (each category at its own peak),
// the frozen base beside them, and the four copies restated for what trains; after a run.
void cli_lora_bill_text(FILE *f, const llama_config *cfg, const cli_lora *l);
struct json_t *cli_lora_json(const llama_config *cfg, const cli_lora *l);

// --routing and --routing-out (routing_cli.c): how a meta run routes the tokens of a mixture of
// experts, and where a real run records its routers' choices.
typedef struct {
    llama_routing *assume; // --routing (NULL: balanced)
    llama_routing *record; // --routing-out
} cli_routing;
// From the options, for a model of config c; an exit code with the message in *err.
int cli_routing_prepare(const cli_options *o, const llama_config *c, cli_routing *r, ag_err *err);
// The model's sparse layers route as r says: a meta run bills the assumption, a real run records.
void cli_routing_attach(const cli_routing *r, llama_model *m);
void cli_routing_free(cli_routing *r);
// The report's routing line ("routing: balanced (...)") for a mixture of experts; nothing else.
void cli_routing_text(FILE *f, const llama_config *c, const cli_routing *r, bool meta);
// deepseek_v3's num_nextn_predict_layers, not billed: a line of the report (cli_routing_text
// prints it), and run.mtp_layers_not_billed in the JSON; nothing when the config has none.
void cli_mtp_text(FILE *f, const llama_config *c);
void cli_mtp_json(struct json_t *run, const llama_config *c);
// deepseek_v3's generation cache (--mla-cache): a line of an inference report and run.mla_cache;
// nothing for other families.
void cli_mla_cache_text(FILE *f, const llama_config *c);
void cli_mla_cache_json(struct json_t *run, const llama_config *c);
// "balanced", "worst", "file" or "measured", for the JSON report.
const char *cli_routing_name(const cli_routing *r, bool meta);
int cli_routing_writer(FILE *f, void *routing, ag_err *err); // arg: the llama_routing to write

typedef struct {
    llama_config cfg;
    char st_path[4096]; // "" for random init
    int32_t *ids;       // batch * seq_len (with seq_lens: each step's batch x length, one after another)
    long batch, seq_len;
    const long *seq_lens; // --seq-lens: step s runs seq_lens[s] tokens (NULL: every step seq_len)
    long *owned_lens;     // the list when cli_train_prepare made it
    cli_text text;        // a prompt's tokenizer and ids
    optim_config ocfg;
    step_record *steps; // nsteps of them
    long nsteps;
    long grad_accum;      // micro-batches a step (1: none); ids holds grad_accum x batch rows
    bool torn_down_clean; // every tensor category back at zero afterwards
    cli_dtype dtype;      // anything but float32 needs meta
    ag_framework framework;
    ag_attention_kind attention;
    ag_device device; // whose kernels: --device cuda or --gpu
    bool meta, checkpointing;
    uint64_t seed;
    bool dump_grads, save_weights; // through save, after the last backward / optimizer step
    bool saves_adapter;            // --save-adapter (a sharded run's every rank gathers for it)
    cli_save_fn save;
    void *save_arg;
    cli_lora lora;
    // --save-adapter: after the last optimizer step (NULL: none)
    int (*save_adapter)(void *arg, const llama_model *m, ag_err *err);
    cli_routing routing; // a mixture of experts' (owned by the caller of cli_train_prepare)
} train_run;

// The model of a run in its context: built at the dtype's sizes, then loaded from st_path
// ("" for the seeded random init). On failure *out may hold a model to free.
int cli_model_build(ag_ctx *ctx, const llama_config *cfg, const cli_dtype *dtype, const char *st_path, uint64_t seed,
                    llama_model **out, ag_err *err);
// The same with adapters (l NULL or rank 0: none): the base built (its linear weights under the
// base dtype) and loaded, frozen, then the adapters added, initialised, or loaded from l->adapter.
int cli_model_build_lora(ag_ctx *ctx, const llama_config *cfg, const cli_dtype *dtype, const cli_lora *l,
                         const char *st_path, uint64_t seed, llama_model **out, ag_err *err);
// The settings of a training run from the options (ids and steps allocated); an exit code.
int cli_train_prepare(const cli_options *o, train_run *r, ag_err *err);
void cli_train_free(train_run *r);
int cli_train_run(train_run *r, ag_err *err);
// One step of r (step s): zero_grad, forward, backward, the optimizer, timed and recorded, with
// hooks around them (NULL: none), as a sharded run adds them.
typedef struct {
    void (*zero_grad)(void *user);                                       // instead of optim_zero_grad
    bool (*on_part)(void *user, int64_t part, bool before, ag_err *err); // llama_forward_opts.on_part
    void (*set_sync)(void *user, bool last);                             // before each micro-batch
    int (*after_backward)(void *user, ag_err *err);                      // after each micro-batch's
    void (*before_step)(void *user);
    int (*after_step)(void *user, ag_err *err);
    void *user;
} cli_step_hooks;
int cli_train_step(train_run *r, ag_ctx *ctx, llama_model *m, optim *opt, long s, const cli_step_hooks *h, ag_err *err);
long cli_micro_batches(const train_run *r); // grad_accum, at least 1

// What the timeline says of one step (train.c): its total peak and the moment of it, and per
// phase the peak and what each category held at the phase's end.
typedef struct {
    uint64_t peak, phase_peak[3];
    uint64_t at_peak[MP_NCATEGORIES]; // what each category held at the step's peak
    size_t peak_events;               // timeline events up to that moment (mp_sites_live_at)
    mp_phase peak_phase;
    int64_t end_live[3][MP_NCATEGORIES];
    bool zero_grad; // the step opened with zero_grad (PYTORCH frameworks): its own phase
    uint64_t zero_grad_peak;
    int64_t zero_grad_end[MP_NCATEGORIES];
} step_figures;
// The timeline (keep_timeline) replayed step by step into out[r->nsteps]. With `divide`, each
// category's live bytes count as one device's share, ceil(live / divide[c]) (ZeRO's shards; 1:
// whole), at every event; NULL counts every category whole.
void cli_replay_steps(const train_run *r, const uint64_t *divide, step_figures *out);
// bytes as mp_format_bytes writes them, without the exact count in parentheses.
const char *cli_short_bytes(char *buf, size_t n, uint64_t bytes);
// One line, when the total peak goes past the four copies (weights + gradients + optimizer
// state, each at its own peak): by how much, and what the other categories held at the peak's
// moment (the largest site of the largest of them, when the timeline has it); nothing otherwise.
void cli_above_four_copies_text(FILE *f, const char *indent, uint64_t peak, const uint64_t at_peak[MP_NCATEGORIES],
                                uint64_t four, size_t events);

// Which tensors held the memory at a moment of the timeline, summed across blocks.
#define CLI_KIND_MAX 112
typedef struct {
    char kind[CLI_KIND_MAX]; // the site label with the block number as "*"
    uint8_t category;
    uint64_t bytes;
    size_t sites;
} cli_site_row;
size_t cli_breakdown(size_t events, mp_category cat, cli_site_row *rows, size_t cap, uint64_t *per_block, long layers);
void cli_breakdown_text(FILE *f, long layers);
struct json_t *cli_breakdown_json(long layers);

// --explain: each category's formula worked out for this model, and the lessons' claims.
// The activation formula is --framework lean's saved set, said so beside another framework's
// measured figure; the temporaries' line gives the optimizer's part (--adam-impl) and what held
// them at their peak.
void cli_explain_train(FILE *f, const llama_config *cfg, long batch, long seq_len, const optim_config *oc,
                       ag_framework fw, ag_attention_kind attention);

// check's Q and B claims (check_dtype.c): the distributions of the next token along float32's
// greedy text (prompt[T], ref_new[N]) under float32 and under dt, from the same weights (st_path,
// "" for the seeded random init), and where dt's own greedy text (new_ids[N]) parts from float32's.
typedef struct {
    double top1;     // share of the N positions whose most likely token is float32's
    double kl;       // mean KL(float32 || dt) over the positions, in nats
    double p_ref, p; // the probability of float32's first new token under float32 and under dt
    long diverge;    // the first new token that differs (-1: none of the N)
} cli_dtype_outcome;
int cli_dtype_compare(const llama_config *c, const char *st_path, long T, long N, const cli_dtype *dt,
                      const int32_t *prompt, const int32_t *ref_new, const int32_t *new_ids, cli_dtype_outcome *out,
                      ag_err *err);

// One generation (build or load the model, prefill and greedy decode, teardown) inside an
// initialised profiler.
typedef struct {
    llama_config cfg;
    char st_path[4096];
    int32_t *ids, *mask; // batch x seq_len prompts, left-padded (mask 0 on pads)
    long batch, seq_len, new_tokens;
    bool use_cache;
    int32_t *out;  // batch x new_tokens
    long *out_len; // [batch]: the ids each row generated, up to and with its end-of-text
    cli_text text; // the prompt's tokenizer and ids, the end-of-text ids
    llama_generate_stats stats;
    bool torn_down_clean;
    cli_dtype dtype; // anything but float32 needs meta
    ag_framework framework;
    ag_attention_kind attention;
    ag_device device; // whose kernels: --device cuda or --gpu
    bool meta;
    uint64_t seed;
    cli_lora lora;       // --adapter: generation through the adapters
    cli_routing routing; // a mixture of experts'
} infer_run;

// An exit code, as cli_load_config.
int cli_infer_prepare(const cli_options *o, infer_run *r, ag_err *err);
int cli_infer_run(infer_run *r, ag_err *err);
// --dtype (fp32, bf16, fp16: activations and cache) and --weight-dtype / --group-size of a
// generation into *d; false after filling *err.
bool cli_infer_dtype(const cli_options *o, cli_dtype *d, ag_err *err);
void cli_infer_free(infer_run *r);
// A copy of r for its bill in meta mode (the same prompt and tokenizer, its own outputs, no
// end-of-text), and the outputs of its run freed.
infer_run cli_infer_meta_copy(const infer_run *r);
void cli_infer_meta_free(infer_run *m);

// One command's run inside the shared skeleton (job.c): outputs declared and checked before
// anything runs, the fit check, the profiler, the run, the report of what was measured (also
// when it failed), the outputs committed together, teardown.
typedef struct {
    void *arg;
    int (*run)(void *arg, ag_err *err);                  // inside an initialised profiler
    uint64_t (*meta_peak)(void *arg, ag_err *err);       // the same run in meta mode (NULL: none)
    void (*text)(FILE *f, const void *arg, bool failed); // the text report
    struct json_t *(*json)(const void *arg, bool failed);
    int (*svg)(FILE *f, void *arg, ag_err *err); // NULL: the profiler's timeline as a chart
    void *svg_arg;
    const char *const *html_runs; // as in cli_report
    int html_nruns;
    const char *title;
    struct cli_outputs *outs; // set by cli_job_main before run: where --dump-grads goes
    const cli_device *device; // --snapshot's device (NULL: none)
} cli_job;
int cli_job_main(const cli_options *o, cli_job *j);
// The outputs the options name, declared (paths checked, inputs noted) before a run; and after
// it, the report's outputs written and every output committed together.
struct cli_outputs;
typedef struct {
    const char *title;
    cli_text_fn text;
    const void *arg;
    int (*svg)(FILE *f, void *arg, ag_err *err); // NULL: the timeline chart
    void *svg_arg;
    const char *const *html_runs; // the page's runs (cli_html_run_data); NULL: the timeline now
    int html_nruns;
    const cli_device *device; // --snapshot: the device whose history it writes
} cli_report;
int cli_outputs_declare(const cli_options *o, struct cli_outputs **outs, ag_err *err);
int cli_outputs_finish(const cli_options *o, struct cli_outputs *outs, struct json_t *root, const cli_report *rep,
                       ag_err *err);
// The profiler as the options ask for it.
int cli_profiler_start(const cli_options *o, bool meta);
// The run's progress on stderr (progress.c): shown when stderr is a terminal or --progress.
void cli_progress_begin(const cli_options *o);
void cli_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_progress_end(void);
// Where the command is, without a progress line ("writing the outputs"): what Ctrl-C reports.
void cli_progress_where(const char *text);
// SIGINT, SIGTERM, SIGHUP and SIGQUIT (where they have the default action) remove the output
// temporaries and say in one line where the command stopped and that nothing was written,
// then end it as the signal would (a shell sees 130 for Ctrl-C).
void cli_catch_interrupts(const cli_options *o);

// The report of a training run (train.c), text and JSON, as membill train prints and writes it.
void cli_train_text(FILE *f, const cli_options *o, const train_run *r, bool failed);
struct json_t *cli_train_json(const cli_options *o, const train_run *r, bool failed);

// Sharded data parallelism (zero_run.c): one rank's training run of r over a communicator, ZeRO's
// stage sharding the model states (parallel.h); membill plan runs it on a simulated rank.
struct par_comm;
typedef struct {
    int stage, prefetch;
    size_t bucket_bytes;
    int fsdp, offload; // parallel.h's par_fsdp and par_offload (0: none)
    struct par_comm *comm;
    double *comm_s; // [r->nsteps]: seconds in collectives per step (the caller's)
    // After the run: each category's peak in host memory (offload), and the strategy's name.
    uint64_t host_peak[MP_NCATEGORIES];
    const char *strategy;
} cli_zero;
// The options of a sharded run into *z (comm and comm_s left to the caller).
void cli_zero_from_options(const cli_options *o, cli_zero *z);
int cli_zero_train_run(train_run *r, cli_zero *z, ag_err *err);
// membill train --zero S (zero.c): this process's rank of the job, the report gathered on rank 0.
int cli_train_zero(const cli_options *o);

int cmd_train(const cli_options *o);
int cmd_infer(const cli_options *o);
int cmd_compare(const cli_options *o);
int cmd_check(const cli_options *o);
int cmd_plan(const cli_options *o);

// ---- the device (device.c, gpus.c): --device cuda, --gpu, PyTorch's caching allocator ----

// A named GPU (membill plan --list-gpus): what torch.cuda.get_device_properties(0).total_memory
// says of it and the CUDA context a PyTorch process holds there, each with its source.
typedef struct {
    const char *name, *product;
    uint64_t total_bytes;
    const char *total_source;
    uint64_t context_bytes;
    const char *context_source;
    bool total_reported; // a reported figure; false: an estimate, its source says how
    bool sm90;           // Hopper (compute capability 9.0): cuBLAS's larger default workspace
} cli_gpu;
size_t cli_gpu_count(void);
const cli_gpu *cli_gpu_at(size_t i);
const cli_gpu *cli_gpu_find(const char *name); // NULL if unknown
const char *cli_gpu_names(char *buf, size_t len);
void cli_gpu_list(FILE *f);

// NCCL's buffers on each rank of a data-parallel job (see device.c).
uint64_t cli_nccl_bytes(long gpus);

// The device a run is billed on: --device, --gpu, the allocator's settings and what the card
// holds besides the allocator. cuda false: the CPU bill alone, as before.
struct cli_device {
    bool cuda;
    const cli_gpu *gpu; // NULL: no card named
    mp_cuda_conf conf;  // conf.capacity: what the allocator can reserve (0: no card, no limit)
    char conf_text[512];
    const char *conf_from; // "--cuda-alloc-conf", "PYTORCH_CUDA_ALLOC_CONF", NULL: PyTorch's defaults
    uint64_t total, context, nccl, overhead;
    uint64_t cublas_workspace; // one per cuBLAS handle and stream, through the caching allocator
    long gpus;
    // A snapshot already written (a simulated rank's, whose run is no longer the profiler's): what
    // --snapshot writes instead of replaying the profiler's timeline. NULL: replay it.
    const char *snapshot;
    size_t snapshot_len;
};
// From the options (and PYTORCH_CUDA_ALLOC_CONF); an exit code, the message in err.
int cli_device_prepare(const cli_options *o, long gpus, cli_device *d, ag_err *err);
// The ranks the device is one of (NCCL's buffers with more than one), and what that leaves the allocator.
void cli_device_set_gpus(cli_device *d, long gpus);

// Where a replay reads figures: the end of a phase (an event index of the timeline).
typedef struct {
    size_t end;
    long step; // 1-based; 0: outside the steps (loading the model)
    const char *phase;
    long seq_len; // the step's length (0: none)
} cli_device_mark;

typedef struct {
    long step;
    const char *phase;
    long seq_len;
    uint64_t allocated, reserved, requested, inactive_split; // at its end
    uint64_t allocated_peak, reserved_peak;                  // while it ran
} cli_device_phase;

#define CLI_DEVICE_GAPS 6
typedef struct {
    bool done;
    mp_cuda_stats st;
    mp_cuda_oom oom;
    cli_device_phase *phases;
    size_t nphases;
    // the free space split segments held when reserved reached its peak, and what took it there
    mp_cuda_gap gaps[CLI_DEVICE_GAPS];
    size_t ngaps, ngaps_all;
    uint32_t peak_site;
    uint8_t peak_category;
    long peak_step;
    const char *peak_phase;
    // training: reserved at its highest over the steps after the first (the steady state; with
    // --seq-lens, over the lengths' second pass), and at the first step's end
    uint64_t steady_reserved_peak, first_step_reserved;
    bool steady;
} cli_device_result;

// The timeline (events up to the last mark) through the allocator; 0, or 1 when an allocation did
// not fit the card (out->oom). out is freed with cli_device_result_free.
int cli_device_replay(const cli_device *d, const cli_device_mark *marks, size_t n, long steady_from,
                      cli_device_result *out);
void cli_device_result_free(cli_device_result *r);
// After a real or meta run: cli_device_replay over marks (taken: freed here); a card the run does
// not fit fails it (-1, the reason in err), as it would have failed there.
int cli_device_after_run(const cli_device *d, cli_device_mark *marks, size_t n, long steady_from,
                         cli_device_result *out, ag_err *err);
// Marks: a training run's phases (its step records); the timeline's own phase changes (generation).
size_t cli_device_marks_train(const train_run *r, cli_device_mark **out);
size_t cli_device_marks_phases(cli_device_mark **out);
// What the card must hold: reserved at its peak + context + NCCL + the overhead allowance.
uint64_t cli_device_need(const cli_device *d, const cli_device_result *r);
bool cli_device_fits(const cli_device *d, const cli_device_result *r);
struct json_t *cli_device_json(const cli_device *d, const cli_device_result *r);
void cli_device_text(FILE *f, const cli_device *d, const cli_device_result *r);
// The device's figures beside each phase of a training report's "steps" (allocated_bytes,
// reserved_bytes at the phase's end).
void cli_device_annotate_steps(struct json_t *steps, const cli_device_result *r);
// One line: why a run does not fit the card (the allocation that failed, as PyTorch says it).
void cli_device_oom_message(const cli_device *d, const cli_device_result *r, char *buf, size_t len);
// --snapshot: the whole timeline replayed into a fresh allocator, pickled; arg is a cli_device.
int cli_snapshot_writer(FILE *f, void *device, ag_err *err);

// membill snapshot FILE (snapshot.c).
int cmd_snapshot(const cli_options *o);
