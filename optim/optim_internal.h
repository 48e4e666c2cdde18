// Private to optim/.
#pragma once

#include "optim.h"

// Elements: a chunk of an update pass gets at least this many (below, one thread does it).
#define OPTIM_PAR_GRAIN (1 << 16)

enum { OPTIM_TMP_SQRT, OPTIM_TMP_DENOM, OPTIM_TMP_GRAD, OPTIM_NTMP };

typedef struct {
    ag_tensor *param;
    mp_block state[2];        // Adam: exp_avg, exp_avg_sq; SGD momentum: momentum_buffer
    mp_block master;          // float32 copy of a 16-bit parameter (mixed precision)
    mp_block tmp[OPTIM_NTMP]; // Adam for-loop / foreach: this step's temporaries (MP_TEMPORARY)
    long step;                // per parameter, as torch.optim's state["step"]
    bool fresh;               // state just allocated: its first update overwrites instead of reading
} optim_slot;

struct optim {
    optim_config cfg;
    optim_slot *slots;
    size_t n;
    long steps;
};

static inline int optim_state_bits(const optim_config *c) { return c->state_bits ? c->state_bits : 32; }
// A parameter's state: the configuration's dtype, or a parameter's own (ag_param_new_bits), as
// torch.optim makes exp_avg with zeros_like(param).
static inline int optim_param_state_bits(const optim_config *c, const ag_tensor *param) {
    return param->own_bits ? param->bits : optim_state_bits(c);
}

// Adam's scalars for one parameter at its step count (s->step already counts this step).
typedef struct {
    float b1, b2, eps, step_size, bc2_sqrt, wd, decay;
    bool decoupled, fresh;
} optim_adam_consts;
optim_adam_consts optim_adam_consts_of(const optim_config *c, const optim_slot *s);

// One fused pass over a parameter: w and g of n elements.
void optim_update(const optim_config *c, optim_slot *s, float *w, const float *g, size_t n);

// The same for a parameter, gradient or state not all float32, or with a master copy (which the
// step updates, the parameter then its rounding).
bool optim_update_is_typed(const optim_slot *s);
void optim_update_typed(const optim_config *c, optim_slot *s);

// Adam's for-loop or foreach step over every slot with a gradient, its state already there
// (unfused.c). Returns 0, or -1 with the message in err, every temporary freed; *changed tells
// whether any parameter, state or step count was updated before the failure.
int optim_adam_unfused(optim *o, bool *changed, ag_err *err);
