// Private to optim/.
#pragma once

#include "optim.h"

typedef struct {
    ag_tensor *param;
    mp_block state[2]; // Adam: exp_avg, exp_avg_sq; SGD momentum: momentum_buffer
    mp_block master;   // float32 copy of a 16-bit parameter (meta mode billing only)
    long step;         // per parameter, as torch.optim's state["step"]
    bool fresh;        // state just allocated: its first update overwrites instead of reading
} optim_slot;

struct optim {
    optim_config cfg;
    optim_slot *slots;
    size_t n;
    long steps;
};

// One fused pass over a parameter: w and g of n elements.
void optim_update(const optim_config *c, optim_slot *s, float *w, const float *g, size_t n);
