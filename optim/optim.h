// optim: Adam, AdamW, SGD and SGD with momentum, with PyTorch's semantics.
//
// State (Adam's exp_avg and exp_avg_sq, SGD's momentum_buffer) is allocated at the first step,
// as torch.optim does, for every parameter before any update, billed to the optimizer category.
// Parameters whose .grad is none are skipped. SGD, and Adam with adam_impl fused, update each
// parameter in one fused pass with no parameter-sized temporaries. Adam's for-loop and foreach
// implementations allocate, compute and free the temporaries torch.optim's do, in its order,
// billed to the temporary category (see optim_adam_impl).
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "autograd.h"

typedef enum { OPTIM_ADAM, OPTIM_ADAMW, OPTIM_SGD, OPTIM_SGD_MOMENTUM, OPTIM_NONE } optim_kind;

// How Adam and AdamW run a step, as torch.optim runs them (amsgrad, maximize, capturable off).
// Each temporary is billed to MP_TEMPORARY at the element size of the state (the dtype of the
// tensor torch.optim steps on: the parameter's, or a mixed-precision master copy's), labelled
// "<param>:sqrt", "<param>:denom" or "<param>:grad_wd", and freed within the step. With b_k the
// bytes of the k-th parameter that has a gradient and W their sum, the temporaries peak at:
//   fused     none: one pass per parameter (torch's fused=True keeps none either).
//   for-loop  _single_tensor_adam, torch's CPU default: per parameter in turn sqrt(exp_avg_sq)
//             (b_k), its quotient by sqrt(1 - beta2^t) (the "denom", b_k, while the sqrt is
//             alive), the sqrt freed, eps added in place, param.addcdiv_. The denom is a local
//             that lives until the next parameter's denom replaces it: max_k (b_{k-1} + 2 b_k)
//             (2 x the largest when it comes first, as a Llama's embedding does). Adam with L2
//             weight decay adds grad + wd x param (b_k, alive until the next parameter's):
//             max_k (b_{k-1} + 3 b_k).
//   foreach   _multi_tensor_adam, torch's accelerator default: _foreach_sqrt of every
//             exp_avg_sq at once (W), divided and eps added in place: W. Adam with L2 weight
//             decay first makes grad + wd x param for every parameter (W, freed before the sqrt).
//             Under a framework whose adam_foreach is AG_FOREACH_113, PyTorch 1.13's: the eps sum is out of place, a
//             second list (2W), L2 weight decay is added into .grad in place (no temporary; here .grad is left alone),
//             and exp_avg is updated as exp_avg·b1 + (1-b1)·g instead of lerp_. AG_FOREACH_20, PyTorch 2.0's:
//             the same, but L2 weight decay makes grad + wd x param a list of its own (W), alive to the end (3W).
// All compute the update from their temporaries in torch's order of operations; the results
// equal the fused pass's to float32 rounding (w + (-lr/bc1·m)/denom against w - lr/bc1·(m/denom)).
typedef enum { OPTIM_ADAM_FUSED = 0, OPTIM_ADAM_FOR_LOOP, OPTIM_ADAM_FOREACH } optim_adam_impl;

typedef struct {
    optim_kind kind;
    float lr;
    float beta1, beta2, eps; // Adam, AdamW
    float weight_decay;      // Adam: added to the gradient; AdamW: decoupled
    float momentum, dampening;
    bool nesterov;
    // What the state is kept in. state_bits 16 keeps exp_avg / exp_avg_sq / momentum_buffer in a 16-bit parameter's
    // dtype, as torch.optim does; master adds a float32 copy of every parameter ("<param>:master", as mixed precision
    // keeps beside 16-bit weights), billed as optimizer state.
    int state_bits;  // 32 (0 means 32) or 16
    bool state_fp16; // 16-bit state is float16 rather than bfloat16
    bool master;
    optim_adam_impl adam_impl; // Adam and AdamW; fused (0) unless asked
    ag_framework framework;    // whose torch.optim: its row's adam_foreach (LEAN, 0: current PyTorch's)
} optim_config;

typedef struct optim optim;

// PyTorch's defaults for the kind (lr 1e-3; AdamW weight_decay 0.01; SGD momentum 0.9 for
// sgd-momentum, which PyTorch leaves to the caller); adam_impl fused.
optim_config optim_defaults(optim_kind kind);
// "adam", "adamw", "sgd", "sgd-momentum", "none". Returns false for anything else.
bool optim_parse_kind(const char *name, optim_kind *out);
const char *optim_kind_name(optim_kind kind);
// "fused", "for-loop", "foreach". Returns false for anything else (*out untouched).
bool optim_parse_adam_impl(const char *name, optim_adam_impl *out);
const char *optim_adam_impl_name(optim_adam_impl impl);
// Bytes of state per parameter element once allocated: 8 (Adam), 4 (momentum) or 0.
size_t optim_state_bytes_per_element(optim_kind kind);
// The same for a whole setting: the states at state_bits, plus 4 for a master copy (a kind
// without a step, none, keeps nothing).
size_t optim_state_bytes(const optim_config *cfg);

// The optimizer refers to the parameters (it does not own them). Returns NULL on bad
// arguments or out of memory, with a message in err naming the setting at fault. As in
// torch.optim: lr, eps, weight_decay >= 0, betas in [0, 1); sgd takes no momentum and
// sgd-momentum a positive one; nesterov needs sgd-momentum with zero dampening. Parameters,
// gradients and state of 16 bits are read into float32 a block at a time, updated there and
// rounded once; with a master copy the step runs on it and the parameter becomes its rounding.
optim *optim_new(const optim_config *cfg, ag_tensor *const *params, size_t n, ag_err *err);
void optim_free(optim *o); // frees the state
// One step over every parameter that has a gradient. Returns 0, or -1 with a message naming
// the state or temporary that could not be allocated: past the budget, the step then changed
// nothing (no weight moved, no state kept, no step counted), so it may be retried. A step's
// temporaries are checked against the budget before anything changes; when they do not fit,
// they are asked for in torch's order, changing nothing, so that the profiler's out-of-budget
// record names the one that crossed. Only an allocation the budget did not foretell (the
// allocator itself out of memory, or plain malloc from another thread taking the room during
// the step) can stop a step part way. The for-loop then leaves the parameters before the one
// that failed stepped (step counted, state and weight updated) and the others untouched; the
// L2 foreach, failing at its sqrt list, leaves every step count, exp_avg and exp_avg_sq
// updated and no weight moved, as torch.optim would. Such a step keeps the state it made (the
// untouched parameters' still fresh) and counts no step in optim_steps_taken; a step stopped
// before it changed anything (every other case) changes nothing, as past the budget.
int optim_step(optim *o, ag_err *err);
// Sets every parameter's gradient to none (frees it), as zero_grad(set_to_none=True).
void optim_zero_grad(optim *o);
long optim_steps_taken(const optim *o);
