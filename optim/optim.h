// optim: Adam, AdamW, SGD and SGD with momentum, with PyTorch's semantics.
//
// State (Adam's exp_avg and exp_avg_sq, SGD's momentum_buffer) is allocated at the first step,
// as torch.optim does, billed to the optimizer category, and updated in one fused pass per
// parameter with no parameter-sized temporaries. Parameters whose .grad is none are skipped.
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "autograd.h"

typedef enum { OPTIM_ADAM, OPTIM_ADAMW, OPTIM_SGD, OPTIM_SGD_MOMENTUM, OPTIM_NONE } optim_kind;

typedef struct {
    optim_kind kind;
    float lr;
    float beta1, beta2, eps; // Adam, AdamW
    float weight_decay;      // Adam: added to the gradient; AdamW: decoupled
    float momentum, dampening;
    bool nesterov;
    // What the state is billed as (meta mode only: real runs keep float32 state, no master).
    // state_bits 16 keeps exp_avg / exp_avg_sq / momentum_buffer in a 16-bit parameter's dtype,
    // as torch.optim does; master adds a float32 copy of every parameter ("<param>:master", as
    // mixed precision keeps beside 16-bit weights), billed as optimizer state.
    int state_bits; // 32 (0 means 32) or 16
    bool master;
} optim_config;

typedef struct optim optim;

// PyTorch's defaults for the kind (lr 1e-3; AdamW weight_decay 0.01; SGD momentum 0.9 for
// sgd-momentum, which PyTorch leaves to the caller).
optim_config optim_defaults(optim_kind kind);
// "adam", "adamw", "sgd", "sgd-momentum", "none". Returns false for anything else.
bool optim_parse_kind(const char *name, optim_kind *out);
const char *optim_kind_name(optim_kind kind);
// Bytes of state per parameter element once allocated: 8 (Adam), 4 (momentum) or 0.
size_t optim_state_bytes_per_element(optim_kind kind);
// The same for a whole setting: the states at state_bits, plus 4 for a master copy (a kind
// without a step, none, keeps nothing).
size_t optim_state_bytes(const optim_config *cfg);

// The optimizer refers to the parameters (it does not own them). Returns NULL on bad
// arguments or out of memory, with a message in err naming the setting at fault. As in
// torch.optim: lr, eps, weight_decay >= 0, betas in [0, 1); sgd takes no momentum and
// sgd-momentum a positive one; nesterov needs sgd-momentum with zero dampening. 16-bit state
// or a master copy outside meta mode is refused.
optim *optim_new(const optim_config *cfg, ag_tensor *const *params, size_t n, ag_err *err);
void optim_free(optim *o); // frees the state
// One step over every parameter that has a gradient. Returns 0, or -1 with a message naming
// the state that could not be allocated (out of budget): the step then changed nothing (no
// weight moved, no state kept, no step counted), so it may be retried.
int optim_step(optim *o, ag_err *err);
// Sets every parameter's gradient to none (frees it), as zero_grad(set_to_none=True).
void optim_zero_grad(optim *o);
long optim_steps_taken(const optim *o);
