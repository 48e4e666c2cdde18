// silu: y = x * sigmoid(x).
#include <math.h>

#include "ag_internal.h"

// Backward needs x: dy/dx = s (1 + x (1 - s)), s = sigmoid(x). Keeping y instead would not
// spare x's sigmoid, and x is usually kept alive anyway (by the gate projection's output).
static void silu_backward(ag_ctx *ctx, ag_node *n, const float *dy)
{
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || mp_is_meta())
        return;
    const float *x = n->saved[0]->data;
    float *dx = d.data;
    bool fresh = d.fresh;
#pragma omp parallel for if (n->numel >= AG_OMP_MIN_EXP)
    for (int64_t i = 0; i < n->numel; i++) {
        float s = 1.0f / (1.0f + expf(-x[i]));
        float v = dy[i] * s * (1.0f + x[i] * (1.0f - s));
        dx[i] = fresh ? v : dx[i] + v;
    }
}

ag_tensor *ag_silu(ag_ctx *ctx, const char *site, ag_tensor *x)
{
    ag_tensor *ins[] = {x};
    if (!ag_check_inputs(ctx, "silu", site, 1, ins, (const char *[]){"x"}))
        return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    ag_tensor *y = ag_tensor_like(ctx, x, MP_ACTIVATION, s.out);
    if (!y)
        return NULL;
    if (!mp_is_meta()) {
        const float *xd = x->data;
        float *yd = y->data;
#pragma omp parallel for if (x->numel >= AG_OMP_MIN_EXP)
        for (int64_t i = 0; i < x->numel; i++)
            yd[i] = xd[i] / (1.0f + expf(-xd[i]));
    }
    if (!ag_any_needs_grad(ctx, 1, ins))
        return y;
    ag_node *n = ag_record(ctx, "silu", s.base, y, 1, ins, silu_backward);
    if (!n) {
        ag_release(y);
        return NULL;
    }
    ag_save(n, 0, x);
    return y;
}
