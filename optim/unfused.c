// Adam's for-loop and foreach implementations as torch.optim runs them: the same temporaries,
// allocated, computed and freed in torch's order (billed to the temporary category), and the
// update done from them, op by op, in torch's order of operations.
//
// What torch allocates, and when (amsgrad, maximize, capturable and differentiable off):
// - for-loop, PyTorch 1.13 torch/optim/adam.py _single_tensor_adam: l. 354 `grad =
//   grad.add(param, alpha=weight_decay)` (L2 only: a new tensor, alive until `grad` is bound
//   again at the next parameter), l. 363-364 the moments in place, l. 410 `denom =
//   (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)` (sqrt() makes one tensor, the
//   division a second while the first is alive, the first is freed, add_ is in place, and
//   binding `denom` frees the previous parameter's), l. 412 `param.addcdiv_(exp_avg, denom,
//   value=-step_size)`; adamw.py _single_tensor_adamw l. 270 `param.mul_(1 - lr * weight_decay)`,
//   l. 316-318 the same denom. PyTorch 2.x is the same but for exp_avg.lerp_(grad, 1 - beta1)
//   (pytorch/pytorch c15fcf4, adamw.py _single_tensor_adamw; dc80ccd, adam.py).
// - foreach, PyTorch 2.x torch/optim/adam.py _multi_tensor_adam (pytorch/pytorch dc80ccd), the
//   branch without capturable: `device_grads = torch._foreach_add(device_grads, device_params,
//   alpha=weight_decay)` (L2 only: a new list), _foreach_lerp_ / _foreach_mul_ /
//   _foreach_addcmul_ in place, `del device_grads`, `exp_avg_sq_sqrt =
//   torch._foreach_sqrt(device_exp_avg_sqs)` (one new tensor per parameter),
//   `torch._foreach_div_(exp_avg_sq_sqrt, bias_correction2_sqrt)`,
//   `torch._foreach_add_(exp_avg_sq_sqrt, eps)` (in place), `torch._foreach_addcdiv_(
//   device_params, device_exp_avgs, exp_avg_sq_sqrt, step_size)`, the list freed on return;
//   adamw.py _multi_tensor_adamw (c15fcf4): `torch._foreach_mul_(device_params, 1 - lr *
//   weight_decay)`, then the same sqrt, div_, add_ and addcdiv_.
// - foreach, PyTorch 1.13 adam.py _multi_tensor_adam: l. 456 `torch._foreach_add_(grads,
//   params, alpha=weight_decay)` (into .grad, in place: no temporary; here the sum is formed on
//   the fly and .grad is left alone), l. 459-463 the moments as mul_ then add_ / addcmul_, l. 519
//   `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`, l. 520 `torch._foreach_div_(
//   exp_avg_sq_sqrt, bias_correction2_sqrt)`, l. 521 `denom = torch._foreach_add(
//   exp_avg_sq_sqrt, eps)` (out of place: a second list), l. 523 `torch._foreach_addcdiv_(
//   params_, exp_avgs, denom, step_size)`, both lists freed on return; adamw.py
//   _multi_tensor_adamw l. 355 `torch._foreach_mul_(params, 1 - lr * weight_decay)`, l. 418-422.
// - foreach, PyTorch 2.0 adam.py _multi_tensor_adam (v2.0.0; as S-Lab-System-Group/Hydro's
//   hydro/optim/adam.py copies it): `device_grads = torch._foreach_add(device_grads,
//   device_params, alpha=weight_decay)` (L2 only: a new list, no `del`: alive to the return), the
//   moments as mul_ then add_ / addcmul_, `exp_avg_sq_sqrt = torch._foreach_sqrt(...)`, `_foreach_div_`,
//   `denom = torch._foreach_add(exp_avg_sq_sqrt, eps)` (out of place, as 1.13), `_foreach_addcdiv_(
//   device_params, device_exp_avgs, denom, step_size)`; adamw.py _multi_tensor_adamw (the
//   Trainer's adamw_torch): `torch._foreach_mul_(device_params, 1 - lr * weight_decay)`, the same
//   moments, sqrt, div_ and out-of-place denom: 2W at the addcdiv_, 3W for Adam with L2.
// On the CPU each _foreach_ op loops over the tensors (its slow path), so a new list's tensors
// are made in parameter order; a list is freed from its last tensor to its first (CPython's
// list_dealloc). The 0-dim step tensors and bias-correction scalars torch makes on the way are
// not billed (see alloc_state in optim.c).
//
// The ops that allocate nothing (the moments, div_, add_) may move across an allocation
// without changing the sequence of allocations and frees; so each parameter's temporaries, and
// a foreach list, are asked for before the state they derive from changes, and a step that
// cannot get them changes nothing. The one exception is the L2 foreach's sqrt list, which
// comes after the moments, as in torch. Before any of it, a count-only pass of the same
// sequence says whether it will cross the budget; if so, the allocations are made in order
// without computing or changing anything, until the profiler refuses the one that crosses.
#include "optim_internal.h"

#include <math.h>
#include <stdio.h>

typedef struct {
    optim *o;
    bool dry;     // count only: nothing allocated, nothing changed
    bool apply;   // step the parameters, state and step counts (false: ask for the memory only)
    bool compute; // apply with data (not in meta mode)
    uint64_t base, budget, live;
    bool would_fail; // dry: an allocation would cross the budget
    bool changed;    // apply: something was stepped
    ag_err *err;
} pass;

static const char *const tmp_names[OPTIM_NTMP] = {"sqrt", "denom", "grad_wd"};

// The element size of the state: what torch.optim's temporaries are made of (exp_avg_sq.sqrt()
// has exp_avg_sq's dtype, the parameter's, or a master copy's in mixed precision).
static size_t tmp_bytes(const pass *p, const optim_slot *s) {
    return (size_t)s->param->numel * (size_t)optim_param_state_bits(&p->o->cfg, s->param) / 8;
}

static int take(pass *p, optim_slot *s, int t) {
    size_t bytes = tmp_bytes(p, s);
    if (p->dry) {
        if (p->budget && p->base + p->live + bytes > p->budget) p->would_fail = true;
        p->live += bytes;
        return 0;
    }
    char site[256], detail[128];
    snprintf(site, sizeof site, "%s:%s", ag_tensor_name(s->param), tmp_names[t]);
    ag_describe_like(detail, sizeof detail, s->param, optim_param_state_bits(&p->o->cfg, s->param),
                     p->o->cfg.state_fp16);
    mp_status st = mp_alloc_described(&s->tmp[t], bytes, MP_TEMPORARY, site, detail);
    if (st == MP_OK) return 0;
    ag_err_set(p->err, "optimizer: cannot allocate %s (%zu bytes, a temporary of Adam's %s step): %s", site, bytes,
               optim_adam_impl_name(p->o->cfg.adam_impl),
               st == MP_ERR_BUDGET ? "over the memory budget" : "out of memory");
    return -1;
}

static void give(pass *p, optim_slot *s, int t) {
    if (p->dry)
        p->live -= tmp_bytes(p, s);
    else
        mp_free(&s->tmp[t]);
}

static void begin(pass *p, optim_slot *s) {
    s->step++;
    p->changed = true;
}

// ---------------------------------------------------------------------------------------------
// The ops, each one pass as torch's kernel computes it (float32, no fused multiply-add).

static float *data(mp_block *b) { return b->data; }

enum { K_GRAD_WD, K_MOMENTS, K_SQRT, K_DIV, K_ADD, K_ADDCDIV };

// One pass: out (or w, m, v) from in (or g) and a scalar x, per kind.
typedef struct {
    int kind;
    const optim_adam_consts *k;
    bool mul_add;
    float *out, *m, *v;
    const float *in, *w2;
    float x;
} kpass;

static void moments(const kpass *a, size_t lo, size_t hi) {
    const optim_adam_consts *k = a->k;
    const float b1 = k->b1, b2 = k->b2, c1 = 1.0f - k->b1, c2 = 1.0f - k->b2, decay = k->decay, l2 = a->x;
    const bool fresh = k->fresh, decoupled = k->decoupled, mul_add = a->mul_add;
    float *w = a->out, *m = a->m, *v = a->v;
    const float *g = a->in;
    for (size_t i = lo; i < hi; i++) {
        float gi = l2 != 0 ? g[i] + l2 * w[i] : g[i];
        if (decoupled) w[i] *= decay;
        if (fresh) { // from zeros: 0·b + (1-b)·x is (1-b)·x exactly
            m[i] = c1 * gi;
            v[i] = c2 * gi * gi;
        } else {
            m[i] = mul_add ? m[i] * b1 + c1 * gi : m[i] + (gi - m[i]) * c1;
            v[i] = v[i] * b2 + c2 * gi * gi;
        }
    }
}

static void kpass_part(void *p, int64_t b, int64_t e, int thread) {
    (void)thread;
    const kpass *a = p;
    float *out = a->out, x = a->x;
    const float *in = a->in;
    size_t lo = (size_t)b, hi = (size_t)e;
    switch (a->kind) {
    case K_GRAD_WD: // grad.add(param, alpha=wd)
        for (size_t i = lo; i < hi; i++) out[i] = in[i] + x * a->w2[i];
        break;
    case K_MOMENTS: moments(a, lo, hi); break;
    case K_SQRT:
        for (size_t i = lo; i < hi; i++) out[i] = sqrtf(in[i]);
        break;
    case K_DIV:
        for (size_t i = lo; i < hi; i++) out[i] = in[i] / x;
        break;
    case K_ADD:
        for (size_t i = lo; i < hi; i++) out[i] = in[i] + x;
        break;
    case K_ADDCDIV: // param.addcdiv_(exp_avg, denom, value): w + value·m / d, ATen's order
        for (size_t i = lo; i < hi; i++) out[i] = out[i] + x * in[i] / a->w2[i];
        break;
    }
}

static void run_pass(kpass a, size_t n) { ag_parallel_for((int64_t)n, OPTIM_PAR_GRAIN, kpass_part, &a); }

// grad.add(param, alpha=wd): g + wd·w.
static void k_grad_wd(float *out, const float *g, const float *w, float wd, size_t n) {
    run_pass((kpass){.kind = K_GRAD_WD, .out = out, .in = g, .w2 = w, .x = wd}, n);
}

// AdamW's param.mul_(1 - lr·wd) and the moments in place: exp_avg.lerp_(g, 1 - b1) (PyTorch
// 2.x) or, with mul_add, exp_avg.mul_(b1).add_(g, alpha=1 - b1) (1.13's foreach), and
// exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2). l2: the L2 term added to g on the fly.
static void k_moments(const optim_adam_consts *k, bool mul_add, float *w, const float *g, float l2, float *m, float *v,
                      size_t n) {
    run_pass((kpass){.kind = K_MOMENTS, .k = k, .mul_add = mul_add, .out = w, .m = m, .v = v, .in = g, .x = l2}, n);
}

static void k_sqrt(float *out, const float *v, size_t n) { run_pass((kpass){.kind = K_SQRT, .out = out, .in = v}, n); }

static void k_div(float *out, const float *in, float d, size_t n) {
    run_pass((kpass){.kind = K_DIV, .out = out, .in = in, .x = d}, n);
}

static void k_add(float *out, const float *in, float e, size_t n) {
    run_pass((kpass){.kind = K_ADD, .out = out, .in = in, .x = e}, n);
}

static void k_addcdiv(float *w, const float *m, const float *d, float value, size_t n) {
    run_pass((kpass){.kind = K_ADDCDIV, .out = w, .in = m, .w2 = d, .x = value}, n);
}

// ---------------------------------------------------------------------------------------------
// The three sequences

#define EACH(s)                                                                                                        \
    for (optim_slot *s = o->slots; s < o->slots + o->n; s++)                                                           \
        if (s->param->grad)
#define EACH_REVERSED(s)                                                                                               \
    for (optim_slot *s = o->slots + o->n; s > o->slots && (--s, true);)                                                \
        if (s->param->grad)

static bool l2_decay(const optim_config *c) { return c->kind == OPTIM_ADAM && c->weight_decay != 0; }

static int for_loop(pass *p) {
    optim *o = p->o;
    const bool l2 = l2_decay(&o->cfg);
    optim_slot *prev = NULL;
    EACH(s) {
        if (l2 && prev) give(p, prev, OPTIM_TMP_GRAD); // `grad = grads[i]`: the last sum goes
        if (l2 && take(p, s, OPTIM_TMP_GRAD) != 0) return -1;
        if (take(p, s, OPTIM_TMP_SQRT) != 0 || take(p, s, OPTIM_TMP_DENOM) != 0) return -1;
        if (p->apply) begin(p, s);
        const optim_adam_consts k = optim_adam_consts_of(&o->cfg, s);
        const size_t n = (size_t)s->param->numel;
        float *w = s->param->data, *m = data(&s->state[0]), *v = data(&s->state[1]);
        float *t1 = data(&s->tmp[OPTIM_TMP_SQRT]), *t2 = data(&s->tmp[OPTIM_TMP_DENOM]);
        if (p->compute) {
            const float *g = s->param->grad->data;
            if (l2) {
                k_grad_wd(data(&s->tmp[OPTIM_TMP_GRAD]), g, w, k.wd, n);
                g = data(&s->tmp[OPTIM_TMP_GRAD]);
            }
            k_moments(&k, false, w, g, 0, m, v, n);
            k_sqrt(t1, v, n);
            k_div(t2, t1, k.bc2_sqrt, n);
        }
        give(p, s, OPTIM_TMP_SQRT);
        if (p->compute) k_add(t2, t2, k.eps, n);
        if (prev) give(p, prev, OPTIM_TMP_DENOM); // `denom = ...` drops the last parameter's
        if (p->compute) k_addcdiv(w, m, t2, -k.step_size, n);
        if (p->apply) s->fresh = false;
        prev = s;
    }
    if (prev && l2) give(p, prev, OPTIM_TMP_GRAD); // the function returns
    if (prev) give(p, prev, OPTIM_TMP_DENOM);
    return 0;
}

static int foreach_now(pass *p) {
    optim *o = p->o;
    const bool l2 = l2_decay(&o->cfg);
    const int list = l2 ? OPTIM_TMP_GRAD : OPTIM_TMP_SQRT; // without L2 the sqrt list is the first
    EACH(s) if (take(p, s, list) != 0) return -1;
    if (p->apply) EACH(s) begin(p, s);
    if (p->compute) EACH(s) {
            const optim_adam_consts k = optim_adam_consts_of(&o->cfg, s);
            const size_t n = (size_t)s->param->numel;
            float *w = s->param->data;
            const float *g = s->param->grad->data;
            if (l2) {
                k_grad_wd(data(&s->tmp[OPTIM_TMP_GRAD]), g, w, k.wd, n);
                g = data(&s->tmp[OPTIM_TMP_GRAD]);
            }
            k_moments(&k, false, w, g, 0, data(&s->state[0]), data(&s->state[1]), n);
        }
    if (l2) {
        EACH_REVERSED(s) give(p, s, OPTIM_TMP_GRAD); // del device_grads
        EACH(s) if (take(p, s, OPTIM_TMP_SQRT) != 0) return -1;
    }
    if (p->compute) EACH(s) {
            const optim_adam_consts k = optim_adam_consts_of(&o->cfg, s);
            const size_t n = (size_t)s->param->numel;
            float *t = data(&s->tmp[OPTIM_TMP_SQRT]);
            k_sqrt(t, data(&s->state[1]), n);
            k_div(t, t, k.bc2_sqrt, n);
            k_add(t, t, k.eps, n);
            k_addcdiv(s->param->data, data(&s->state[0]), t, -k.step_size, n);
        }
    EACH_REVERSED(s) give(p, s, OPTIM_TMP_SQRT);
    if (p->apply) EACH(s) s->fresh = false;
    return 0;
}

// PyTorch 1.13's and 2.0's: the eps sum out of place (a second list); 2.0 also makes Adam's L2
// sum a list of its own (grad_list), where 1.13 adds it into .grad in place.
static int foreach_eps_out_of_place(pass *p, bool grad_list) {
    optim *o = p->o;
    const bool l2 = l2_decay(&o->cfg), own_grads = l2 && grad_list;
    if (own_grads) EACH(s) if (take(p, s, OPTIM_TMP_GRAD) != 0) return -1;
    EACH(s) if (take(p, s, OPTIM_TMP_SQRT) != 0) return -1;
    EACH(s) if (take(p, s, OPTIM_TMP_DENOM) != 0) return -1;
    if (p->apply) EACH(s) begin(p, s);
    if (p->compute) EACH(s) {
            const optim_adam_consts k = optim_adam_consts_of(&o->cfg, s);
            const size_t n = (size_t)s->param->numel;
            float *w = s->param->data, *m = data(&s->state[0]), *v = data(&s->state[1]);
            float *t = data(&s->tmp[OPTIM_TMP_SQRT]), *d = data(&s->tmp[OPTIM_TMP_DENOM]);
            const float *g = s->param->grad->data;
            if (own_grads) {
                k_grad_wd(data(&s->tmp[OPTIM_TMP_GRAD]), g, w, k.wd, n);
                g = data(&s->tmp[OPTIM_TMP_GRAD]);
            }
            k_moments(&k, true, w, g, l2 && !own_grads ? k.wd : 0, m, v, n);
            k_sqrt(t, v, n);
            k_div(t, t, k.bc2_sqrt, n);
            k_add(d, t, k.eps, n);
            k_addcdiv(w, m, d, -k.step_size, n);
        }
    // the locals go in the order they were bound: device_grads, exp_avg_sq_sqrt, denom
    if (own_grads) EACH_REVERSED(s) give(p, s, OPTIM_TMP_GRAD);
    EACH_REVERSED(s) give(p, s, OPTIM_TMP_SQRT);
    EACH_REVERSED(s) give(p, s, OPTIM_TMP_DENOM);
    if (p->apply) EACH(s) s->fresh = false;
    return 0;
}

static int foreach_113(pass *p) { return foreach_eps_out_of_place(p, false); }

static int foreach_20(pass *p) { return foreach_eps_out_of_place(p, true); }

static void free_temporaries(optim *o) {
    for (size_t i = 0; i < o->n; i++)
        for (int t = 0; t < OPTIM_NTMP; t++) mp_free(&o->slots[i].tmp[t]);
}

int optim_adam_unfused(optim *o, bool *changed, ag_err *err) {
    static int (*const foreach[])(pass *) = {[AG_FOREACH_CURRENT] = foreach_now, [AG_FOREACH_113] = foreach_113,
                                             [AG_FOREACH_20] = foreach_20};
    int (*seq)(pass *) = o->cfg.adam_impl == OPTIM_ADAM_FOR_LOOP
                             ? for_loop
                             : foreach[AG_FW(ag_framework_row_of(o->cfg.framework), adam_foreach)];
    *changed = false;
    pass dry = {.o = o, .dry = true, .base = mp_live_total(), .budget = mp_budget(), .err = err};
    seq(&dry);
    if (dry.would_fail) {
        // In torch's order, changing nothing, until the profiler refuses the one past the budget.
        pass ask = {.o = o, .err = err};
        int rc = seq(&ask);
        free_temporaries(o);
        if (rc != 0) return -1;
        // Room came back meanwhile (another thread freed memory): the step runs after all.
    }
    // Not all float32: the sequence's memory as it is, its arithmetic by the typed fused update.
    bool typed = false;
    for (size_t i = 0; i < o->n; i++) typed = typed || (o->slots[i].param->grad && optim_update_is_typed(&o->slots[i]));
    pass run = {.o = o, .apply = true, .compute = !mp_is_meta() && !typed, .err = err};
    for (size_t i = 0; typed && !mp_is_meta() && i < o->n; i++)
        if (o->slots[i].param->grad) {
            o->slots[i].step++;
            optim_update_typed(&o->cfg, &o->slots[i]);
            o->slots[i].step--; // the sequence counts it
        }
    int rc = seq(&run);
    free_temporaries(o); // all already freed unless the sequence stopped part way
    *changed = run.changed;
    return rc;
}
