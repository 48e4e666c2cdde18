// Private to membill plan: the setting, the meta bill, a device's share, and the report.
#pragma once

#include "cli.h"
#include "parallel.h"

#include <jansson.h>

// Training's meta run is two steps (plan.c): per-step figures of the simulated rank's collectives
// are its totals over them divided by this.
#define PLAN_STEPS_BILLED 2

// The meta bill. Training runs two steps: the second is the steady state (the optimizer's state
// kept from the first, the gradients set to none), and its total peak is the headline.
typedef struct {
    uint64_t peak[MP_NCATEGORIES];    // each category's own peak over the run
    uint64_t total;                   // training: step 2's total peak; a generation: its total peak
    uint64_t first_step;              // training: step 1's total peak
    uint64_t at_peak[MP_NCATEGORIES]; // what each category held at the headline's moment
    size_t peak_events;               // timeline events up to it (the main run keeps a timeline)
    mp_phase peak_phase;
    // Training: one device's steady-state peak, step 2 replayed with each category at the
    // device's share (ZeRO's shards), and each category's share at that moment.
    uint64_t device_peak, device_at[MP_NCATEGORIES];
    mp_phase device_phase;
    // Each category's own peak on the device. With several devices or a ZeRO stage, the device
    // is a simulated rank (rank 0 of --gpus, membill train --zero's own code with the collectives
    // skipped): its figures are that run's, and comm what its collectives would move (two steps).
    uint64_t device_own[MP_NCATEGORIES];
    uint64_t device_host[MP_NCATEGORIES]; // offload: each category's peak in the rank's host memory
    bool simulated_rank;
    const char *strategy; // the simulated rank's ("ZeRO-3", "FSDP full-shard", ...)
    par_stats comm;
    // --device cuda: the device's run through the caching allocator (its phases dropped: the
    // report replays its own run again for them); dev_oom: an allocation did not fit the card
    cli_device_result dev;
    bool dev_oom;
    // --snapshot of a simulated rank: its snapshot, written while its run was the profiler's (the
    // caller frees it; NULL unless asked by plan_setting.rank_snapshot)
    char *snapshot;
    size_t snapshot_len;
} plan_bill;

typedef struct {
    llama_config cfg;
    long batch, seq_len, gpus, zero; // gpus 0: --gpus auto, not yet resolved
    int fsdp, offload;               // parallel.h's par_fsdp, par_offload
    long grad_accum;                 // micro-batches a step
    long ep;                         // --ep: the experts split over this many of the gpus (0 or 1: none)
    long bucket_mb, prefetch;        // the simulated rank's buckets and stage 3's prefetch
    optim_config ocfg;
    uint64_t overhead;
    cli_dtype dt;
    bool infer;
    long new_tokens;    // --infer: tokens generated after the prompt (the cache ends at seq + new - 1)
    bool checkpointing; // training: every block recomputed in backward
    bool rank_snapshot; // the simulated rank's run writes its snapshot into the bill (--snapshot)
    ag_framework framework;
    ag_attention_kind attention;
    ag_device device;
    cli_lora lora;       // rank 0: every parameter trains
    cli_routing routing; // a mixture of experts' (the plan's own)
    cli_device dev;
    long nsteps;    // training steps billed: 2, or --seq-lens' lengths twice
    long *seq_lens; // --seq-lens repeated (NULL: every step seq_len)
    long nlens;     // --seq-lens' own count
} plan_setting;

// One device's share: model states as ZeRO shards them (stage 1 the optimizer state, 2 also
// the gradients, 3 also the weights), its own activations and temporaries (and, generating, its
// KV cache), and the framework overhead. Training: each category's share at the moment of the
// device's steady-state peak (step 2 replayed at these shares), so that they add up to it; a
// generation: each category's own peak added. own_peak: each category's own peak at the
// device's share (the model states there are what ZeRO's formula counts).
typedef struct {
    uint64_t weights, gradients, optimizer, activations, cache, temporary, overhead, total;
    uint64_t own_peak[MP_NCATEGORIES];
    uint64_t host[MP_NCATEGORIES], host_total; // offload: the rank's host memory, apart from total
    mp_phase phase;                            // training: the phase of that moment
} gpu_share;

// A setting that fits where the asked one does not: the options that change, and its total.
#define PLAN_SUGGESTIONS 5
typedef struct {
    char options[12][32];
    int n;
    uint64_t total;
} plan_suggestion;

typedef struct {
    const plan_setting *s;
    const plan_bill *b;
    const llama_closed_form *cf;
    const gpu_share *g;
    uint64_t device;
    long max_batch, max_seq;
    bool batch_capped, seq_capped; // the search's own cap, the model's positions
    uint64_t smallest;             // nothing fits: one device's total at batch 1, the shortest length
    const plan_bill *other;        // training: the same plan with the other --attention; NULL: none
    const cli_device_result *devr; // --device cuda: the report's own replay (its phases); NULL: none
    bool searched;                 // the largest batch and longest length were searched
    const cli_hub *hub;            // --model org/name: its commit and checkpoint; NULL: none
    bool gpus_auto;                // --gpus auto: min_gpus is its answer (0: none up to PLAN_MAX_GPUS)
    long min_gpus;
    const plan_suggestion *suggestions; // the run does not fit: settings that do
    int nsuggestions;
} plan_view;

#define PLAN_MAX_GPUS 4096

// The fit search's answer.
typedef struct {
    long max_batch, max_seq;
    bool batch_capped, seq_capped;
    uint64_t smallest;
} plan_fit_result;

// The device's bill at batch B and length T (plan.c), and its share on one device.
int plan_measure_device(const plan_setting *s, long B, long T, plan_bill *b, ag_err *err);
gpu_share plan_per_gpu(const plan_setting *s, const plan_bill *b);
// plan_fit.c: the largest batch and longest sequence that fit; the fewest GPUs whose rank fits
// (*out 0: none up to PLAN_MAX_GPUS); up to PLAN_SUGGESTIONS settings that fit, the smallest
// change first.
int plan_fit(const plan_setting *s, uint64_t device, plan_fit_result *f, ag_err *err);
int plan_min_gpus(const plan_setting *s, uint64_t device, long *out, ag_err *err);
// What a number of GPUs is a multiple of: --ep's ranks (an expert-parallel group each), else 1.
static inline long plan_gpus_step(const plan_setting *s) { return s->ep > 1 ? s->ep : 1; }
int plan_suggest(const plan_setting *s, uint64_t device, plan_suggestion *out, int *n, ag_err *err);

llama_dtype_bytes plan_dtype_bytes(const plan_setting *s);
void plan_lora_closed_form(const plan_setting *s, llama_lora_closed_form *lf);
void plan_lora_act_form(const plan_setting *s, llama_lora_act_form *af);
// The strategy's name for reports ("ZeRO-2", "FSDP full-shard", "DDP").
const char *plan_strategy_name(const plan_setting *s);
// A device's size as cards are sold and in bytes: "24 GiB (25.77 GB)".
const char *plan_device_text(char *buf, size_t len, uint64_t bytes);
// Whether one device is a simulated rank (training on several devices, or under a ZeRO stage).
bool plan_simulates_rank(const plan_setting *s);
long plan_cache_tokens(const plan_setting *s);
const char *plan_weight_dtype_name(const cli_dtype *d);
void plan_report_text(FILE *out, const void *arg);
json_t *plan_report_json(const plan_view *v);

// The attention a plan sets beside its own: eager beside a fused kernel, flash beside eager.
static inline ag_attention_kind plan_other_attention(ag_attention_kind a) {
    return a == AG_ATTENTION_EAGER ? AG_ATTENTION_FLASH : AG_ATTENTION_EAGER;
}

// Expert parallelism: the bytes a rank's all-to-alls send in a training step (plan_report.c).
uint64_t plan_all_to_all_bytes(const plan_setting *s);
