// Optimizer state and the step loop; the per-element updates are in update.c.
#include "optim.h"
#include "optim_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

optim_config optim_defaults(optim_kind kind) {
    optim_config c = {.kind = kind, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    if (kind == OPTIM_ADAMW) c.weight_decay = 0.01f;
    if (kind == OPTIM_SGD_MOMENTUM) c.momentum = 0.9f;
    return c;
}

static const char *const kind_names[] = {"adam", "adamw", "sgd", "sgd-momentum", "none"};

bool optim_parse_kind(const char *name, optim_kind *out) {
    for (int k = 0; k <= OPTIM_NONE; k++)
        if (name && strcmp(name, kind_names[k]) == 0) {
            *out = (optim_kind)k;
            return true;
        }
    return false;
}

const char *optim_kind_name(optim_kind kind) { return (unsigned)kind <= OPTIM_NONE ? kind_names[kind] : "?"; }

static const char *const impl_names[] = {"fused", "for-loop", "foreach"};

bool optim_parse_adam_impl(const char *name, optim_adam_impl *out) {
    for (int k = 0; k <= OPTIM_ADAM_FOREACH; k++)
        if (name && strcmp(name, impl_names[k]) == 0) {
            *out = (optim_adam_impl)k;
            return true;
        }
    return false;
}

const char *optim_adam_impl_name(optim_adam_impl impl) {
    return (unsigned)impl <= OPTIM_ADAM_FOREACH ? impl_names[impl] : "?";
}

static bool is_adam(const optim_config *c) { return c->kind == OPTIM_ADAM || c->kind == OPTIM_ADAMW; }

size_t optim_state_bytes_per_element(optim_kind kind) {
    switch (kind) {
    case OPTIM_ADAM:
    case OPTIM_ADAMW: return 2 * sizeof(float);
    case OPTIM_SGD_MOMENTUM: return sizeof(float);
    default: return 0;
    }
}

size_t optim_state_bytes(const optim_config *c) {
    if (!c || c->kind == OPTIM_NONE) return 0;
    size_t states = optim_state_bytes_per_element(c->kind) / sizeof(float);
    return states * (size_t)optim_state_bits(c) / 8 + (c->master ? sizeof(float) : 0);
}

// 16-bit state and master copies are a bill of meta mode: the updates compute in float32.
static bool check_dtype(const optim_config *c, ag_err *err) {
    if (c->state_bits != 0 && c->state_bits != 32 && c->state_bits != 16) {
        ag_err_set(err, "optimizer %s: state_bits is %d, expected 32 or 16", optim_kind_name(c->kind), c->state_bits);
        return false;
    }
    return true;
}

// torch.optim's own checks, one message per setting at fault.
static bool check_config(const optim_config *c, ag_err *err) {
    const char *bad = NULL;
    double v = 0;
    if (!c) {
        ag_err_set(err, "optimizer: no settings given");
        return false;
    }
    if ((unsigned)c->kind > OPTIM_NONE) {
        ag_err_set(err, "optimizer: unknown kind %d", (int)c->kind);
        return false;
    }
    bool adam = is_adam(c);
    if (adam && (unsigned)c->adam_impl > OPTIM_ADAM_FOREACH) {
        ag_err_set(err, "optimizer %s: unknown adam_impl %d", optim_kind_name(c->kind), (int)c->adam_impl);
        return false;
    }
    if (!(c->lr >= 0))
        bad = "lr", v = c->lr;
    else if (!(c->weight_decay >= 0))
        bad = "weight_decay", v = c->weight_decay;
    else if (adam && !(c->eps >= 0))
        bad = "eps", v = c->eps;
    else if (adam && !(c->beta1 >= 0 && c->beta1 < 1))
        bad = "beta1", v = c->beta1;
    else if (adam && !(c->beta2 >= 0 && c->beta2 < 1))
        bad = "beta2", v = c->beta2;
    if (bad) {
        ag_err_set(err, "optimizer %s: %s is %g, expected %s", optim_kind_name(c->kind), bad, v,
                   bad[0] == 'b' ? "0 <= beta < 1" : "a number >= 0");
        return false;
    }
    const char *msg = NULL;
    if (c->kind == OPTIM_SGD && c->momentum != 0)
        msg = "momentum must be 0 (sgd-momentum is SGD with a momentum)";
    else if (c->kind == OPTIM_SGD_MOMENTUM && !(c->momentum > 0))
        msg = "momentum must be > 0";
    else if (c->nesterov && (c->kind != OPTIM_SGD_MOMENTUM || c->dampening != 0))
        msg = "nesterov requires sgd-momentum and zero dampening";
    if (msg) {
        ag_err_set(err, "optimizer %s: %s (momentum %g, dampening %g)", optim_kind_name(c->kind), msg,
                   (double)c->momentum, (double)c->dampening);
        return false;
    }
    return true;
}

optim *optim_new(const optim_config *cfg, ag_tensor *const *params, size_t n, ag_err *err) {
    if (!check_config(cfg, err) || !check_dtype(cfg, err)) return NULL;
    for (size_t i = 0; i < n; i++)
        if (!params || !params[i]) {
            ag_err_set(err, "optimizer: parameter %zu of %zu is missing", i, n);
            return NULL;
        }
    optim *o = calloc(1, sizeof *o);
    if (o) o->slots = calloc(n ? n : 1, sizeof *o->slots);
    if (!o || !o->slots) {
        free(o);
        ag_err_set(err, "optimizer: out of memory");
        return NULL;
    }
    o->cfg = *cfg;
    o->n = n;
    for (size_t i = 0; i < n; i++) o->slots[i].param = params[i];
    return o;
}

void optim_free(optim *o) {
    if (!o) return;
    for (size_t i = 0; i < o->n; i++) {
        mp_free(&o->slots[i].state[0]);
        mp_free(&o->slots[i].state[1]);
        mp_free(&o->slots[i].master);
        for (int t = 0; t < OPTIM_NTMP; t++) mp_free(&o->slots[i].tmp[t]); // none outside a step
    }
    free(o->slots);
    free(o);
}

void optim_zero_grad(optim *o) {
    for (size_t i = 0; o && i < o->n; i++) ag_zero_grad(o->slots[i].param);
}

long optim_steps_taken(const optim *o) { return o ? o->steps : 0; }

static void free_state(optim_slot *s) {
    mp_free(&s->state[0]);
    mp_free(&s->state[1]);
    mp_free(&s->master);
}

// One tensor of param's shape at bits an element.
static int alloc_one(mp_block *b, const ag_tensor *param, const char *what, int bits, bool fp16, ag_err *err) {
    char site[256], detail[128];
    size_t bytes = (size_t)param->numel * (size_t)bits / 8;
    snprintf(site, sizeof site, "%s:%s", ag_tensor_name(param), what);
    ag_describe_like(detail, sizeof detail, param, bits, fp16);
    mp_status st = mp_alloc_described(b, bytes, MP_OPTIMIZER, site, detail);
    if (st == MP_OK) return 0;
    ag_err_set(err, "optimizer: cannot allocate %s (%zu bytes): %s", site, bytes,
               st == MP_ERR_BUDGET ? "over the memory budget" : "out of memory");
    return -1;
}

// Lazily, at the first step that sees a gradient, as torch.optim does (a mixed-precision
// framework makes its master copy at setup; it is billed here with the rest of the state). On
// failure the slot keeps no state at all. torch.optim's state also holds a 0-dim float32
// state["step"] tensor per parameter, P x 4 bytes for P parameter tensors (1,088 for
// SmolLM2-135M's 272): left out, so that the state is exactly Adam's two moments (the four
// copies of the weights).
static int alloc_state(optim_slot *s, const optim_config *c, ag_err *err) {
    static const char *const names[2][2] = {{"exp_avg", "exp_avg_sq"}, {"momentum_buffer", ""}};
    int count = (int)(optim_state_bytes_per_element(c->kind) / sizeof(float));
    const char *const *nm = names[c->kind == OPTIM_SGD_MOMENTUM];
    int rc = c->master && !s->param->own_bits ? alloc_one(&s->master, s->param, "master", 32, false, err) : 0;
    if (rc == 0 && s->master.data) ag_tensor_to_f32(s->param, s->master.data); // made from the weights
    for (int j = 0; j < count && rc == 0; j++)
        rc = alloc_one(&s->state[j], s->param, nm[j], optim_param_state_bits(c, s->param), c->state_fp16, err);
    if (rc != 0) {
        free_state(s);
        return -1;
    }
    s->fresh = true;
    return 0;
}

// Gives back the state this step allocated (a step that failed before changing anything).
static void drop_fresh_state(optim *o) {
    for (size_t j = 0; j < o->n; j++)
        if (o->slots[j].fresh) {
            free_state(&o->slots[j]);
            o->slots[j].fresh = false;
        }
}

// The state of every parameter that has a gradient, before any update (as torch.optim makes
// it in its gathering loop, before the update function runs): a step that cannot get its
// memory gives back what it took and changes nothing, so the caller may retry it.
static int alloc_all_state(optim *o, ag_err *err) {
    if (!optim_state_bytes(&o->cfg)) return 0;
    for (size_t i = 0; i < o->n; i++) {
        optim_slot *s = &o->slots[i];
        if (!s->param->grad || s->state[0].bytes || s->master.bytes) continue;
        if (alloc_state(s, &o->cfg, err) == 0) continue;
        drop_fresh_state(o);
        return -1;
    }
    return 0;
}

int optim_step(optim *o, ag_err *err) {
    if (!o) return -1;
    if (o->cfg.kind == OPTIM_NONE) return 0;
    if (alloc_all_state(o, err) != 0) return -1;
    if (is_adam(&o->cfg) && o->cfg.adam_impl != OPTIM_ADAM_FUSED) {
        bool changed = false;
        if (optim_adam_unfused(o, &changed, err) != 0) {
            if (!changed) drop_fresh_state(o);
            return -1;
        }
        o->steps++;
        return 0;
    }
    o->steps++;
    bool meta = mp_is_meta();
    for (size_t i = 0; i < o->n; i++) {
        optim_slot *s = &o->slots[i];
        ag_tensor *g = s->param->grad;
        if (!g) continue;
        s->step++;
        if (!meta && optim_update_is_typed(s))
            optim_update_typed(&o->cfg, s);
        else if (!meta)
            optim_update(&o->cfg, s, s->param->data, g->data, (size_t)s->param->numel);
        s->fresh = false;
    }
    return 0;
}
