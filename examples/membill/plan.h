// Private to membill plan: the setting, the meta bill, a device's share, and the report.
#pragma once

#include "cli.h"

#include <jansson.h>

typedef struct {
    uint64_t peak[MP_NCATEGORIES];
    uint64_t total;
} plan_bill;

typedef struct {
    llama_config cfg;
    long batch, seq_len, gpus, zero;
    optim_config ocfg;
    uint64_t overhead;
    cli_dtype dt;
    bool infer;
    long new_tokens;    // --infer: tokens generated after the prompt (the cache ends at seq + new - 1)
    bool checkpointing; // training: every block recomputed in backward
} plan_setting;

// One device's share: model states as ZeRO shards them (stage 1 the optimizer state, 2 also
// the gradients, 3 also the weights), its own activations (and, generating, its KV cache), and
// the framework overhead. Each category's peak is added: an upper bound, since the activations
// are mostly gone by the optimizer step.
typedef struct {
    uint64_t weights, gradients, optimizer, activations, cache, overhead, total;
} gpu_share;

typedef struct {
    const plan_setting *s;
    const plan_bill *b;
    const llama_closed_form *cf;
    const gpu_share *g;
    uint64_t device;
    long max_batch, max_seq;
    bool batch_capped, seq_capped; // the search's own cap, the model's positions
    uint64_t smallest;             // nothing fits: one device's total at batch 1, the shortest length
} plan_view;

// The fit search's answer.
typedef struct {
    long max_batch, max_seq;
    bool batch_capped, seq_capped;
    uint64_t smallest;
} plan_fit_result;

llama_dtype_bytes plan_dtype_bytes(const plan_setting *s);
long plan_cache_tokens(const plan_setting *s);
const char *plan_weight_dtype_name(const cli_dtype *d);
void plan_report_text(FILE *out, const void *arg);
json_t *plan_report_json(const plan_view *v);
