// The per-element updates, one fused loop per parameter (torch.optim's single-tensor path).
#include "optim_internal.h"

#include <math.h>

// Adam and AdamW (torch.optim.Adam / AdamW, amsgrad off, maximize off). A fresh state starts
// from zeros, so its first update writes (1-b)·g directly and saves a pass of memset.
static void adam_update(const optim_config *c, optim_slot *s, float *w, const float *g, size_t n) {
    float *m = s->state[0].data, *v = s->state[1].data;
    const float b1 = c->beta1, b2 = c->beta2, eps = c->eps, lr = c->lr;
    const double bc1 = 1.0 - pow(b1, (double)s->step);
    const double bc2 = 1.0 - pow(b2, (double)s->step);
    const float step_size = (float)(lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const bool decoupled = c->kind == OPTIM_ADAMW;
    const float wd = c->weight_decay, decay = 1.0f - lr * wd;
    const bool fresh = s->fresh;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i], wi = w[i];
        if (decoupled) wi *= decay;
        else gi += wd * wi;
        float mi = fresh ? (1.0f - b1) * gi : m[i] + (gi - m[i]) * (1.0f - b1); // lerp, as torch
        float vi = fresh ? (1.0f - b2) * gi * gi : v[i] * b2 + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] = wi - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    }
}

// SGD, with momentum when c->momentum > 0: the first step's buffer is a copy of the gradient.
static void sgd_update(const optim_config *c, optim_slot *s, float *w, const float *g, size_t n) {
    float *buf = s->state[0].data;
    const float lr = c->lr, wd = c->weight_decay, mom = c->momentum, damp = 1.0f - c->dampening;
    const bool fresh = s->fresh, nesterov = c->nesterov;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] + wd * w[i];
        if (buf) {
            float bi = fresh ? gi : mom * buf[i] + damp * gi;
            buf[i] = bi;
            gi = nesterov ? gi + mom * bi : bi;
        }
        w[i] -= lr * gi;
    }
}

void optim_update(const optim_config *c, optim_slot *s, float *w, const float *g, size_t n) {
    if (c->kind == OPTIM_ADAM || c->kind == OPTIM_ADAMW) adam_update(c, s, w, g, n);
    else if (c->kind == OPTIM_SGD || c->kind == OPTIM_SGD_MOMENTUM) sgd_update(c, s, w, g, n);
}
